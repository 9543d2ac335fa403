//! Measure 8: the hub's Kubernetes API proxy (`https://<hub>/clusters/<account>/...`), each
//! figure beside the same request sent straight to the API server in the same run.
//!
//! Both sides are the same client code (kube's client on a kubeconfig) acting as the same
//! identity: directly, the agent's own ServiceAccount token; through the proxy, a proxy
//! token from the hub's admin API, which the agent replays as that same ServiceAccount. The
//! hub here serves its HTTP listener over TLS, as in production (the other measures' hubs
//! serve it in plaintext for their pollers), so the proxy side pays TLS to the hub where the
//! direct side pays TLS to the API server, and nothing more: each side keeps one warm
//! keep-alive connection (HTTP/1.1, as kube's client speaks it), so no handshake is timed.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use futures::{AsyncBufReadExt as _, StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{GetParams, ListParams, PostParams, WatchEvent, WatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use scale_agent_e2e::kubectl::Kubectl;
use serde_json::json;

use super::{LONG, Seen, latencies, paced_updates, record, rv_num, wait_delivered};
use crate::{
    Options,
    env::{Env, payload},
    procs::CpuWindow,
    report::{Percentiles, Row, bytes, ms},
};

/// How long one kubectl apply may take before the run fails.
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(120);
/// Requests on each side before timing starts: connections open, TLS handshaken, the
/// API server's token cache and the hub's token check warm.
const WARM_UP: usize = 20;

/// The two clients compared: the same code, through the hub or straight to the API server.
struct Sides {
    proxy: Client,
    direct: Client,
    proxy_kubeconfig: PathBuf,
    direct_kubeconfig: PathBuf,
}

/// Which side a figure is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Side {
    Proxy,
    Direct,
}

impl Sides {
    fn client(&self, side: Side) -> &Client {
        match side {
            Side::Proxy => &self.proxy,
            Side::Direct => &self.direct,
        }
    }

    fn kubeconfig(&self, side: Side) -> &Path {
        match side {
            Side::Proxy => &self.proxy_kubeconfig,
            Side::Direct => &self.direct_kubeconfig,
        }
    }
}

/// Both sides, the first of each pair alternating, so drift in a shared machine's load
/// falls on both alike.
pub(super) fn pair(i: usize) -> [Side; 2] {
    if i.is_multiple_of(2) {
        [Side::Proxy, Side::Direct]
    } else {
        [Side::Direct, Side::Proxy]
    }
}

/// A client for the kubeconfig at `path` (kube's own loading, as any client does).
pub(super) async fn client_for(path: &Path) -> Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("read kubeconfig {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("load kubeconfig {}", path.display()))?;
    Ok(Client::try_from(config)?)
}

/// GET of the object `name` of `collection` (a LIST of it when `None`), reading the whole
/// body as it streams in without keeping it; the body's size in bytes.
async fn read(client: &Client, collection: &str, name: Option<&str>) -> Result<usize> {
    let request = kube::core::Request::new(collection);
    let request = match name {
        Some(name) => request.get(name, &GetParams::default())?,
        None => request.list(&ListParams::default())?,
    };
    let mut body = std::pin::pin!(client.request_stream(request).await?);
    let mut size = 0;
    loop {
        let chunk = body.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(size);
        }
        let len = chunk.len();
        size += len;
        body.consume_unpin(len);
    }
}

/// Which side of the hub answered a read through the proxy: the value of its
/// `x-scale-agent-cache` header (`hit`: the hub's cache; `tunnel`: the agent and the API
/// server), from one untimed request like the timed ones (`watch` for a watch request).
async fn answered_by(
    client: &Client,
    collection: &str,
    name: Option<&str>,
    watch: bool,
) -> Result<String> {
    let request = kube::core::Request::new(collection);
    let request = match (name, watch) {
        (Some(name), _) => request.get(name, &GetParams::default())?,
        (None, false) => request.list(&ListParams::default())?,
        (None, true) => request.watch(&WatchParams::default().timeout(1), "0")?,
    };
    let response = client.send(request.map(kube::client::Body::from)).await?;
    Ok(super::reads::cache_header(&response))
}

/// The path a proxied read took, for a row's note.
fn path_text(answered_by: &str) -> String {
    match answered_by {
        "hit" => {
            "answered from the hub's cache (x-scale-agent-cache: hit): client → hub (TLS) → back"
                .into()
        }
        other => format!(
            "client → hub (TLS) → agent over its gRPC stream → API server → back (x-scale-agent-cache: {other})"
        ),
    }
}

/// Busy and total jiffies of the whole machine (`/proc/stat`), every tenant included.
fn machine_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    // idle and iowait are fields 4 and 5 (user nice system idle iowait irq softirq steal).
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

/// The machine's busy cores over a window, every process counted, not only this run's:
/// on a shared machine, what other tenants take shows here.
struct MachineWindow((u64, u64));

impl MachineWindow {
    fn start() -> Self {
        Self(machine_jiffies())
    }

    /// Busy cores, and "x.xx of N cores busy on the machine".
    fn finish(&self) -> (f64, String) {
        let (busy, total) = machine_jiffies();
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let share =
            busy.saturating_sub(self.0.0) as f64 / total.saturating_sub(self.0.1).max(1) as f64;
        let cores = share * cpus as f64;
        (
            cores,
            format!("{cores:.2} of {cpus} cores busy on the machine"),
        )
    }
}

/// What limited a side's rate, from the machine's busy cores and this run's processes.
fn limit(machine_busy: f64, cpu: &[(String, f64)], wall: f64) -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64;
    let (top, top_cores) = cpu
        .iter()
        .map(|(n, s)| (n.clone(), s / wall.max(1e-9)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or_default();
    let ours: f64 = cpu.iter().map(|(_, s)| s / wall.max(1e-9)).sum();
    let how = if machine_busy >= 0.9 * cpus {
        "bound by CPU"
    } else if machine_busy >= 0.7 * cpus {
        // Five processes in one pipeline on few cores: each hop may wait for a core.
        "close to the machine's CPU limit"
    } else {
        "not bound by CPU but by the waits between the hops"
    };
    format!(
        "{how} ({machine_busy:.2} of {cpus} cores busy on the machine, {ours:.2} of them this run's; {top} the busiest at {top_cores:.2})"
    )
}

/// A buffer size: whole MiB or KiB when it is one, else bytes.
fn binary_size(b: u64) -> String {
    const KIB: u64 = 1024;
    if b >= KIB * KIB && b.is_multiple_of(KIB * KIB) {
        format!("{} MiB", b / (KIB * KIB))
    } else if b >= KIB && b.is_multiple_of(KIB) {
        format!("{} KiB", b / KIB)
    } else {
        format!("{b} B")
    }
}

/// A difference of milliseconds with its sign.
fn signed_ms(v: f64) -> String {
    format!("{}{}", if v < 0.0 { "-" } else { "+" }, ms(v.abs()))
}

/// CPU cores per process over a window, busiest first, as text.
fn cpu_text(cpu: &[(String, f64)], wall: f64) -> String {
    let mut by_cpu: Vec<_> = cpu.iter().map(|(n, s)| (n.clone(), s / wall)).collect();
    by_cpu.sort_by(|a, b| b.1.total_cmp(&a.1));
    by_cpu
        .iter()
        .map(|(name, cores)| format!("{name} {cores:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// CPU cores per process over a window, as JSON for the report.
fn cores_json(cpu: &[(String, f64)], wall: f64) -> serde_json::Value {
    json!(
        cpu.iter()
            .map(|(n, s)| (n.clone(), s / wall))
            .collect::<HashMap<_, _>>()
    )
}

/// Runs the proxy measures; returns a sentence on what limits the proxy.
pub async fn proxy(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<String> {
    let ns = env.namespace("bench-proxy").await?;
    let k = o.latency_objects.max(1);
    env.create_configmaps(&ns, "watch", k, 16, 4).await?;
    let api = Api::<ConfigMap>::namespaced(env.admin.clone(), &ns);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": { "name": "get-target" },
            "data": { "payload": payload(1, o.object_bytes) },
        }))?,
    )
    .await?;

    let hub = env.tls_hub("proxy-hub").await?;
    let account = "bench-proxy";
    // Objects in a namespace whose ConfigMaps the agent does not watch: the LIST measure's
    // LIST is tunnelled and timed alone, and the agent's object stream stays quiet. The agent
    // tunnels only requests within an account's namespaces, so that namespace has an account
    // of its own, watching a kind it does not hold.
    let list_ns = env.namespace("bench-proxy-list").await?;
    let list_account = "bench-proxy-list";
    // The account streams the namespace's ConfigMaps to the hub's cache, as an account
    // covering what Clouddriver deploys would: the watch measure's changes also go over the
    // same stream as object events, beside the tunnelled watch.
    let mut agent = env
        .agent(
            "proxy-agent",
            &hub,
            json!([
                env.account(account, &ns, &["configmaps"]),
                env.account(list_account, &list_ns, &["secrets"]),
            ]),
        )
        .await?;
    agent.wait_ready(LONG).await?;
    hub.wait_objects(account, k as u64 + 1, LONG).await?;
    let proxy_kubeconfig = env.dir.join("proxy.kubeconfig");
    std::fs::write(&proxy_kubeconfig, hub.kubeconfig(account, "bench").await?)?;
    let sides = Sides {
        proxy: client_for(&proxy_kubeconfig).await?,
        direct: client_for(&env.agent_kubeconfig).await?,
        proxy_kubeconfig,
        direct_kubeconfig: env.agent_kubeconfig.clone(),
    };
    let list_kubeconfig = env.dir.join("proxy-list.kubeconfig");
    std::fs::write(
        &list_kubeconfig,
        hub.kubeconfig(list_account, "bench").await?,
    )?;
    let list_sides = Sides {
        proxy: client_for(&list_kubeconfig).await?,
        direct: client_for(&env.agent_kubeconfig).await?,
        proxy_kubeconfig: list_kubeconfig,
        direct_kubeconfig: env.agent_kubeconfig.clone(),
    };
    let collection = format!("/api/v1/namespaces/{ns}/configmaps");
    // The proxy answers once the hub has the agent's tunnel; the first request proves it.
    crate::procs::wait_for(
        "a GET through the proxy",
        LONG,
        Duration::from_millis(50),
        || async {
            // An error is retried, and reported if it lasts.
            read(&sides.proxy, &collection, Some("get-target"))
                .await
                .map(|_| Some(()))
        },
    )
    .await?;
    let mut pids = env.control_plane_pids();
    pids.push(("hub".into(), hub.pid()));
    pids.push(("agent".into(), agent.pid()));
    pids.push(("bench (clients)".into(), std::process::id()));

    get_one(&sides, o, &collection, rows).await?;
    let concurrent = get_concurrent(&sides, o, &collection, &pids, rows).await?;
    apply(env, &sides, o, &ns, rows).await?;
    watch(env, &sides, o, &ns, k, rows).await?;
    let list = list(env, &list_sides, &list_ns, o, &pids, rows).await?;
    drop(agent);
    drop(hub);
    Ok(format!(
        "Through the Kubernetes API proxy: {concurrent} {list}"
    ))
}

// ------------------------------------------------------------------ GET of one object

async fn get_one(sides: &Sides, o: &Options, collection: &str, rows: &mut Vec<Row>) -> Result<()> {
    let n = o.proxy_requests.max(1);
    let mut size = 0;
    for i in 0..WARM_UP {
        for side in pair(i) {
            size = read(sides.client(side), collection, Some("get-target")).await?;
        }
    }
    let path = path_text(
        &answered_by(
            sides.client(Side::Proxy),
            collection,
            Some("get-target"),
            false,
        )
        .await?,
    );
    let (mut proxy_ms, mut direct_ms) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        for side in pair(i) {
            let started = Instant::now();
            read(sides.client(side), collection, Some("get-target")).await?;
            let elapsed = started.elapsed().as_secs_f64() * 1000.0;
            match side {
                Side::Proxy => proxy_ms.push(elapsed),
                Side::Direct => direct_ms.push(elapsed),
            }
        }
    }
    let (proxy_p, direct_p) = (Percentiles::of(&proxy_ms), Percentiles::of(&direct_ms));
    rows.push(Row {
        id: "proxy-get".into(),
        measure: 8,
        title: format!("GET of one ConfigMap (~{}) through the proxy, {n} sequential requests", bytes(size as f64)),
        system: proxy_p.display_ms(),
        baseline_name: "the same GET straight to the API server, same ServiceAccount".into(),
        baseline: direct_p.display_ms(),
        note: format!(
            "{path}; kube's client on both sides, one persistent HTTPS connection each ({WARM_UP} warm-up requests first, so no TLS handshake is timed), requests alternating between the sides; difference at p50 {}; max {} / {}",
            signed_ms(proxy_p.p50 - direct_p.p50),
            ms(proxy_p.max),
            ms(direct_p.max)
        ),
        values: json!({ "requests": n, "body_bytes": size, "proxy_ms": proxy_p, "direct_ms": direct_p }),
    });
    Ok(())
}

/// Requests/s with `o.proxy_clients` clients on each side; returns a sentence on the
/// bottleneck.
async fn get_concurrent(
    sides: &Sides,
    o: &Options,
    collection: &str,
    pids: &[(String, u32)],
    rows: &mut Vec<Row>,
) -> Result<String> {
    let clients = o.proxy_clients.max(1);
    let n = o.proxy_requests.max(clients);
    let answered = answered_by(
        sides.client(Side::Proxy),
        collection,
        Some("get-target"),
        false,
    )
    .await?;
    let mut figures = HashMap::new();
    for side in [Side::Direct, Side::Proxy] {
        let client = sides.client(side);
        // Opens the pool's connections (one per client) before timing.
        let run = |total: usize| async move {
            let next = Arc::new(AtomicUsize::new(0));
            futures::stream::iter(0..clients)
                .map(|_| {
                    let next = next.clone();
                    async move {
                        while next.fetch_add(1, Ordering::Relaxed) < total {
                            read(client, collection, Some("get-target")).await?;
                        }
                        anyhow::Ok(())
                    }
                })
                .buffer_unordered(clients)
                .try_collect::<Vec<_>>()
                .await
        };
        run(WARM_UP * clients).await?;
        let cpu = CpuWindow::start(pids.to_vec());
        let machine = MachineWindow::start();
        let started = Instant::now();
        run(n).await?;
        let secs = started.elapsed().as_secs_f64();
        let (used, wall) = cpu.finish();
        figures.insert(side, (n as f64 / secs, used, wall, machine.finish()));
    }
    let (proxy_rate, proxy_cpu, proxy_wall, (proxy_busy, proxy_machine)) =
        figures.remove(&Side::Proxy).unwrap_or_default();
    let (direct_rate, direct_cpu, direct_wall, (_, direct_machine)) =
        figures.remove(&Side::Direct).unwrap_or_default();
    // CPU of every process of the run per request: what the proxy costs, whatever limited
    // the rate.
    let per_request = |cpu: &[(String, f64)], of: &[&str]| {
        cpu.iter()
            .filter(|(name, _)| of.is_empty() || of.contains(&name.as_str()))
            .map(|(_, s)| s)
            .sum::<f64>()
            * 1000.0
            / n as f64
    };
    let proxy_ms = per_request(&proxy_cpu, &[]);
    let direct_ms = per_request(&direct_cpu, &[]);
    let tunnel_ms = per_request(&proxy_cpu, &["hub", "agent"]);
    let cost = format!(
        "CPU per request, all processes: {proxy_ms:.2} ms through the proxy ({tunnel_ms:.2} ms in hub and agent) against {direct_ms:.2} ms directly"
    );
    rows.push(Row {
        id: "proxy-get-concurrent".into(),
        measure: 8,
        title: format!("GET of one ConfigMap through the proxy, {clients} concurrent clients ({n} requests)"),
        system: format!("{proxy_rate:.0} requests/s"),
        baseline_name: "the same GETs straight to the API server".into(),
        baseline: format!("{direct_rate:.0} requests/s"),
        note: format!(
            "x-scale-agent-cache: {answered}; one kube client per side, a keep-alive connection per concurrent request; {cost}; CPU cores through the proxy: {} ({proxy_machine}); directly: {} ({direct_machine})",
            cpu_text(&proxy_cpu, proxy_wall),
            cpu_text(&direct_cpu, direct_wall)
        ),
        values: json!({ "clients": clients, "requests": n, "proxy_per_sec": proxy_rate, "direct_per_sec": direct_rate,
            "proxy_cpu_cores": cores_json(&proxy_cpu, proxy_wall), "direct_cpu_cores": cores_json(&direct_cpu, direct_wall),
            "proxy_cpu_ms_per_request": proxy_ms, "proxy_hub_agent_cpu_ms_per_request": tunnel_ms, "direct_cpu_ms_per_request": direct_ms }),
    });
    Ok(format!(
        "GETs with {clients} clients reach {proxy_rate:.0}/s against {direct_rate:.0}/s directly, {}; {cost}.",
        limit(proxy_busy, &proxy_cpu, proxy_wall)
    ))
}

// ------------------------------------------------------------------ kubectl apply

/// A Deployment whose image changes with `i`, so each apply is a real patch.
fn deployment(ns: &str, name: &str, i: usize) -> String {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name, "namespace": ns, "labels": { "app": name } },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{
                    "name": "web",
                    "image": format!("registry.example/bench/web:1.0.{i}"),
                    "ports": [{ "containerPort": 8080 }],
                }] },
            },
        },
    })
    .to_string()
}

async fn apply(env: &Env, sides: &Sides, o: &Options, ns: &str, rows: &mut Vec<Row>) -> Result<()> {
    let binary = env.control_plane.binaries().kubectl();
    let kubectl = |side: Side| {
        let home = match side {
            Side::Proxy => "kubectl-home-proxy",
            Side::Direct => "kubectl-home-direct",
        };
        Kubectl::new(binary.clone(), env.dir.join(home))
    };
    let (proxy_kubectl, direct_kubectl) = (kubectl(Side::Proxy), kubectl(Side::Direct));
    let args: Vec<String> = ["apply", "-f", "-"].map(String::from).to_vec();
    let run = |side: Side, i: usize| {
        let kubectl = match side {
            Side::Proxy => &proxy_kubectl,
            Side::Direct => &direct_kubectl,
        };
        let name = match side {
            Side::Proxy => "web-proxy",
            Side::Direct => "web-direct",
        };
        let manifest = deployment(ns, name, i);
        let args = &args;
        async move {
            let started = Instant::now();
            let outcome = kubectl
                .run(
                    sides.kubeconfig(side),
                    args,
                    Some(manifest.as_str()),
                    KUBECTL_TIMEOUT,
                )
                .await?;
            let elapsed = started.elapsed().as_secs_f64() * 1000.0;
            if !outcome.success() {
                bail!(
                    "kubectl apply ({side:?}) failed ({:?}): {}",
                    outcome.code,
                    outcome.messages()
                );
            }
            anyhow::Ok(elapsed)
        }
    };
    // Two applies each first: the first creates the Deployment, and both fill the home's
    // discovery and OpenAPI caches, as in Clouddriver's long-lived pod.
    for i in 0..2 {
        for side in pair(i) {
            run(side, i).await?;
        }
    }
    let n = o.proxy_applies.max(1);
    let (mut proxy_ms, mut direct_ms) = (Vec::new(), Vec::new());
    for i in 0..n {
        for side in pair(i) {
            let elapsed = run(side, i + 2).await?;
            match side {
                Side::Proxy => proxy_ms.push(elapsed),
                Side::Direct => direct_ms.push(elapsed),
            }
        }
    }
    let (proxy_p, direct_p) = (Percentiles::of(&proxy_ms), Percentiles::of(&direct_ms));
    rows.push(Row {
        id: "proxy-apply".into(),
        measure: 8,
        title: format!("`kubectl apply -f -` of a Deployment (new image each time) through the proxy, {n} applies"),
        system: proxy_p.display_ms(),
        baseline_name: "the same `kubectl apply` straight to the API server".into(),
        baseline: direct_p.display_ms(),
        note: format!(
            "one kubectl {} process per apply, manifest on stdin (Clouddriver's way), each side with its own warm HOME (discovery and OpenAPI caches; 2 warm-up applies); includes kubectl's start; difference at p50 {}",
            scale_agent_e2e::KUBERNETES_VERSION,
            signed_ms(proxy_p.p50 - direct_p.p50)
        ),
        values: json!({ "applies": n, "proxy_ms": proxy_p, "direct_ms": direct_p }),
    });
    Ok(())
}

// ------------------------------------------------------------------ watch

/// Opens a watch of the namespace's ConfigMaps from `rv` on `client` and records each
/// object it delivers; returns once the watch's response has started (the watch is on).
async fn start_watch(
    client: Client,
    ns: &str,
    rv: &str,
    seen: Seen,
) -> Result<tokio::task::JoinHandle<()>> {
    let api = Api::<ConfigMap>::namespaced(client, ns);
    let params = WatchParams::default().timeout(290);
    let stream = api.watch(&params, rv).await?.boxed();
    Ok(tokio::spawn(async move {
        let mut stream = stream;
        while let Some(Ok(event)) = stream.next().await {
            let now = Instant::now();
            if let WatchEvent::Added(o) | WatchEvent::Modified(o) = event {
                let rv = rv_num(o.metadata.resource_version.as_deref());
                record(&seen, o.metadata.name.unwrap_or_default(), rv, now);
            }
        }
    }))
}

async fn watch(
    env: &Env,
    sides: &Sides,
    o: &Options,
    ns: &str,
    k: usize,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let api = Api::<ConfigMap>::namespaced(env.admin.clone(), ns);
    let rv = api
        .list_metadata(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let collection = format!("/api/v1/namespaces/{ns}/configmaps");
    let answered = answered_by(&sides.proxy, &collection, None, true).await?;
    let (proxy_seen, direct_seen): (Seen, Seen) = (Arc::default(), Arc::default());
    let proxy_watch = start_watch(sides.proxy.clone(), ns, &rv, proxy_seen.clone()).await?;
    let direct_watch = start_watch(sides.direct.clone(), ns, &rv, direct_seen.clone()).await?;

    // The same steady stream of updates as measure 1, seen by both watches.
    let n = o.proxy_watch_updates.max(1);
    let names: Vec<String> = (0..k).map(|i| format!("watch-{i}")).collect();
    let machine = MachineWindow::start();
    let started = Instant::now();
    let updates = paced_updates(&api, &names, n, o.proxy_watch_rate, "").await?;
    wait_delivered(
        &updates,
        &[&proxy_seen, &direct_seen],
        Duration::from_secs(30),
    )
    .await;
    let (machine_cores, machine_text) = machine.finish();
    proxy_watch.abort();
    direct_watch.abort();
    let (proxy_lat, proxy_missed) = latencies(&updates, &proxy_seen);
    let (direct_lat, direct_missed) = latencies(&updates, &direct_seen);
    let (proxy_p, direct_p) = (Percentiles::of(&proxy_lat), Percentiles::of(&direct_lat));
    // The per-update difference shows what the tunnel adds to each event, free of the
    // API server's own spread that both watches share.
    let index = |seen: &Seen| {
        let mut first: HashMap<(String, u64), Instant> = HashMap::new();
        for (name, rv, at) in seen.lock().map(|s| s.clone()).unwrap_or_default() {
            first.entry((name, rv)).or_insert(at);
        }
        first
    };
    let (proxy_first, direct_first) = (index(&proxy_seen), index(&direct_seen));
    // (seconds from the first update, extra milliseconds) per update seen by both.
    let timed_extra: Vec<(f64, f64)> = updates
        .iter()
        .filter_map(|(name, rv, issued)| {
            let key = (name.clone(), *rv);
            let (p, d) = (proxy_first.get(&key)?, direct_first.get(&key)?);
            Some((
                issued.duration_since(started).as_secs_f64(),
                p.saturating_duration_since(*d).as_secs_f64() * 1000.0,
            ))
        })
        .collect();
    let extra: Vec<f64> = timed_extra.iter().map(|(_, e)| *e).collect();
    let extra_p = Percentiles::of(&extra);
    // The slowest, with when they happened: periodic ones point at something periodic on
    // the path (the hub's durable store commit every second, a heartbeat).
    let mut slowest = timed_extra.clone();
    slowest.sort_by(|a, b| b.1.total_cmp(&a.1));
    slowest.truncate(10);
    rows.push(Row {
        id: "proxy-watch".into(),
        measure: 8,
        title: format!(
            "Watch of ConfigMaps through the proxy: change-to-event latency ({n} updates at {}/s)",
            o.proxy_watch_rate
        ),
        system: proxy_p.display_ms(),
        baseline_name: "the same watch straight to the API server, same update instants".into(),
        baseline: direct_p.display_ms(),
        note: format!(
            "x-scale-agent-cache on the proxied watch: {answered}; from PATCH issued to the event read by the client; both watches open at once from the same resourceVersion (kube's client, one raw watch each); the agent streams the same changes to the hub's cache on the same gRPC stream; per event the proxy adds p50 {} / p99 {}; {machine_text}; missed: proxy {proxy_missed}, direct {direct_missed}",
            ms(extra_p.p50),
            ms(extra_p.p99)
        ),
        values: json!({ "updates": n, "rate_per_sec": o.proxy_watch_rate, "objects": k,
            "proxy_ms": proxy_p, "direct_ms": direct_p, "proxy_extra_ms": extra_p,
            "proxy_extra_slowest_at_s_ms": slowest, "machine_busy_cores": machine_cores,
            "proxy_missed": proxy_missed, "direct_missed": direct_missed }),
    });
    Ok(())
}

// ------------------------------------------------------------------ large LIST

/// Returns a sentence on what limits the LIST through the proxy.
async fn list(
    env: &Env,
    sides: &Sides,
    ns: &str,
    o: &Options,
    pids: &[(String, u32)],
    rows: &mut Vec<Row>,
) -> Result<String> {
    // `ns`: a namespace whose ConfigMaps the agent does not watch (see `run`).
    let n = o.proxy_list_objects.max(1);
    env.create_configmaps(ns, "big", n, o.proxy_list_object_bytes, o.writers)
        .await?;
    let collection = format!("/api/v1/namespaces/{ns}/configmaps");
    for side in [Side::Direct, Side::Proxy] {
        read(sides.client(side), &collection, None).await?;
    }
    let answered = answered_by(sides.client(Side::Proxy), &collection, None, false).await?;
    let repeats = o.proxy_list_repeats.max(1);
    let mut secs: HashMap<Side, Vec<f64>> = HashMap::new();
    let mut size = 0;
    let mut cpu: HashMap<Side, (Vec<(String, f64)>, f64)> = HashMap::new();
    let mut busy: HashMap<Side, f64> = HashMap::new();
    for i in 0..repeats {
        for side in pair(i) {
            let window = CpuWindow::start(pids.to_vec());
            let machine = MachineWindow::start();
            let started = Instant::now();
            size = read(sides.client(side), &collection, None).await?;
            let (machine_cores, _) = machine.finish();
            *busy.entry(side).or_default() += machine_cores / repeats as f64;
            secs.entry(side)
                .or_default()
                .push(started.elapsed().as_secs_f64());
            let (used, wall) = window.finish();
            let entry = cpu.entry(side).or_insert_with(|| (Vec::new(), 0.0));
            for (name, s) in used {
                match entry.0.iter_mut().find(|(n, _)| *n == name) {
                    Some(slot) => slot.1 += s,
                    None => entry.0.push((name, s)),
                }
            }
            entry.1 += wall;
        }
    }
    // Two LISTs at once per side: if one exchange's window capped the tunnel, two exchanges
    // (two windows) would carry about twice as much; if CPU is the limit, they would not.
    let mut two_at_once = HashMap::new();
    for side in [Side::Proxy, Side::Direct] {
        let client = sides.client(side);
        let started = Instant::now();
        let (a, b) = futures::try_join!(
            read(client, &collection, None),
            read(client, &collection, None)
        )?;
        two_at_once.insert(
            side,
            (a + b) as f64 / 1_000_000.0 / started.elapsed().as_secs_f64().max(1e-9),
        );
    }
    let proxy_two = two_at_once.get(&Side::Proxy).copied().unwrap_or(0.0);
    let direct_two = two_at_once.get(&Side::Direct).copied().unwrap_or(0.0);
    let median = |side: Side| {
        let p = Percentiles::of(secs.get(&side).map(Vec::as_slice).unwrap_or(&[]));
        p.p50
    };
    let (proxy_secs, direct_secs) = (median(Side::Proxy), median(Side::Direct));
    let rate = |s: f64| size as f64 / 1_000_000.0 / s.max(1e-9);
    let (proxy_rate, direct_rate) = (rate(proxy_secs), rate(direct_secs));
    let (proxy_cpu, proxy_wall) = cpu.remove(&Side::Proxy).unwrap_or_default();
    let (direct_cpu, direct_wall) = cpu.remove(&Side::Direct).unwrap_or_default();
    // CPU of every process of the run per MB carried.
    let megabytes = size as f64 * repeats as f64 / 1_000_000.0;
    let per_mb = |cpu: &[(String, f64)], of: &[&str]| {
        cpu.iter()
            .filter(|(name, _)| of.is_empty() || of.contains(&name.as_str()))
            .map(|(_, s)| s)
            .sum::<f64>()
            * 1000.0
            / megabytes.max(1e-9)
    };
    let cost = format!(
        "CPU per MB, all processes: {} through the proxy ({} in hub and agent) against {} directly",
        ms(per_mb(&proxy_cpu, &[])),
        ms(per_mb(&proxy_cpu, &["hub", "agent"])),
        ms(per_mb(&direct_cpu, &[]))
    );
    let proxy_busy = busy.get(&Side::Proxy).copied().unwrap_or(0.0);
    rows.push(Row {
        id: "proxy-list".into(),
        measure: 8,
        title: format!(
            "One LIST of {n} ConfigMaps of ~{} B ({:.1} MB of JSON) through the proxy",
            o.proxy_list_object_bytes,
            size as f64 / 1_000_000.0
        ),
        system: format!("{proxy_rate:.0} MB/s ({})", crate::report::secs(proxy_secs)),
        baseline_name: "the same LIST straight to the API server".into(),
        baseline: format!("{direct_rate:.0} MB/s ({})", crate::report::secs(direct_secs)),
        note: format!(
            "x-scale-agent-cache: {answered}; one unpaginated LIST, body read as it streams; median of {repeats} per side, alternating; the tunnel carries it in frames of at most {} within a {} window per exchange; two LISTs at once: {proxy_two:.0} MB/s in all through the proxy, {direct_two:.0} MB/s directly; {cost}; CPU cores through the proxy: {} ({:.2} busy on the machine); directly: {} ({:.2} busy on the machine)",
            // The hub's figures, so the note follows them if they change.
            binary_size(scale_agent_hub::tunnel::MAX_FRAME_BYTES as u64),
            binary_size(u64::from(scale_agent_hub::tunnel::WINDOW_BYTES)),
            cpu_text(&proxy_cpu, proxy_wall),
            busy.get(&Side::Proxy).copied().unwrap_or(0.0),
            cpu_text(&direct_cpu, direct_wall),
            busy.get(&Side::Direct).copied().unwrap_or(0.0)
        ),
        values: json!({ "objects": n, "object_bytes": o.proxy_list_object_bytes, "body_bytes": size, "repeats": repeats,
            "proxy_seconds": secs.get(&Side::Proxy), "direct_seconds": secs.get(&Side::Direct),
            "proxy_mb_per_sec": proxy_rate, "direct_mb_per_sec": direct_rate,
            "two_at_once_proxy_mb_per_sec": proxy_two, "two_at_once_direct_mb_per_sec": direct_two,
            "proxy_cpu_cores": cores_json(&proxy_cpu, proxy_wall), "direct_cpu_cores": cores_json(&direct_cpu, direct_wall),
            "proxy_cpu_ms_per_mb": per_mb(&proxy_cpu, &[]), "proxy_hub_agent_cpu_ms_per_mb": per_mb(&proxy_cpu, &["hub", "agent"]),
            "direct_cpu_ms_per_mb": per_mb(&direct_cpu, &[]), "proxy_machine_busy_cores": proxy_busy }),
    });
    Ok(format!(
        "A {:.1} MB LIST streams at {proxy_rate:.0} MB/s against {direct_rate:.0} MB/s directly ({proxy_two:.0} against {direct_two:.0} MB/s with two at once), {}; {cost}.",
        size as f64 / 1_000_000.0,
        limit(proxy_busy, &proxy_cpu, proxy_wall)
    ))
}
