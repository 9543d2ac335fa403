//! Measure 9: reads through the Kubernetes API proxy as Clouddriver makes them (issue 18),
//! each beside the same reads straight to the API server in the same run:
//!
//! - a caching cycle of one account (`kubectl get <8 kinds> -o json`, Clouddriver's
//!   command), with the API server's CPU seconds and the LISTs it received during each;
//! - a LIST of many ConfigMaps in `limit=500` pages (kube's client);
//! - `kubectl get` of the same ConfigMaps, a Table the hub prints ([`table`]);
//! - one caching cycle of each of many accounts at once on one hub (real agent process);
//! - a watch's change-to-event latency.
//!
//! The caching-cycle and watch rows run twice: on loopback, and with a round trip added by
//! Toxiproxy latency toxics in front of the API server (the direct side's far hop: the
//! cluster is far from Clouddriver) and in front of the hub's gRPC port (the proxy side's far
//! hop: the agent sits by the cluster, far from the hub). The agent reaches the hub through
//! Toxiproxy in both settings (no toxic on loopback), so the proxy side pays that extra hop
//! on loopback too; the direct side reaches the API server straight on loopback.
//!
//! Every proxy response's `x-scale-agent-cache` header (absent when the tunnel answered
//! without one) is counted per value, so the figures say which path answered.

mod table;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ListParams, PostParams, WatchParams},
    client::Body,
};
use scale_agent_e2e::kubectl::Kubectl;
use serde_json::{Value, json};

use super::{
    LONG, Seen, latencies, paced_updates,
    proxy::{Side, pair},
    record, rv_num, wait_delivered,
};
use crate::{
    Options,
    env::{Env, HubProc, payload},
    procs::{CpuWindow, metric_sum},
    report::{Percentiles, Row, secs},
    toxiproxy::Toxiproxy,
};

/// The proxy's response header naming who answered (set by the hub).
const CACHE_HEADER: &str = "x-scale-agent-cache";
/// Counted for a response without [`CACHE_HEADER`].
const NO_HEADER: &str = "absent";
/// Page size of the paged LIST (Clouddriver's kubectl pages by 500 as well).
const PAGE: u32 = 500;
/// How long one kubectl caching cycle may take before the run fails.
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(600);

/// The eight kinds of a caching cycle: kubectl's resource name, the account's `kinds` entry,
/// and the namespaced collection path (`{ns}` replaced).
const KINDS: [(&str, &str, &str); 8] = [
    (
        "configmaps",
        "configmaps",
        "/api/v1/namespaces/{ns}/configmaps",
    ),
    ("services", "services", "/api/v1/namespaces/{ns}/services"),
    (
        "serviceaccounts",
        "serviceaccounts",
        "/api/v1/namespaces/{ns}/serviceaccounts",
    ),
    ("pods", "pods", "/api/v1/namespaces/{ns}/pods"),
    (
        "deployments.apps",
        "deployments",
        "/apis/apps/v1/namespaces/{ns}/deployments",
    ),
    (
        "replicasets.apps",
        "replicasets",
        "/apis/apps/v1/namespaces/{ns}/replicasets",
    ),
    (
        "statefulsets.apps",
        "statefulsets",
        "/apis/apps/v1/namespaces/{ns}/statefulsets",
    ),
    (
        "daemonsets.apps",
        "daemonsets",
        "/apis/apps/v1/namespaces/{ns}/daemonsets",
    ),
];

fn collection(path: &str, ns: &str) -> String {
    path.replace("{ns}", ns)
}

/// The manifest of object `i` (kind `i % 8`) named `name`: small, valid, and inert (the
/// control plane runs no controllers, so workloads create nothing).
fn manifest(i: usize, name: &str) -> Value {
    let labels = json!({ "app": name, "bench": "reads" });
    let template = json!({
        "metadata": { "labels": labels },
        "spec": { "containers": [{ "name": "web", "image": "registry.example/bench/web:1.0" }] },
    });
    let workload = |kind: &str, replicas: bool| {
        let mut spec = json!({ "selector": { "matchLabels": labels }, "template": template });
        if replicas {
            spec["replicas"] = json!(1);
        }
        json!({ "apiVersion": "apps/v1", "kind": kind, "metadata": { "name": name, "labels": labels }, "spec": spec })
    };
    match i % KINDS.len() {
        0 => {
            json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": name, "labels": labels },
            "data": { "payload": payload(i, 256) } })
        }
        // Headless, so no cluster IP is allocated from the test cluster's small range.
        1 => {
            json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": name, "labels": labels },
            "spec": { "clusterIP": "None", "selector": labels, "ports": [{ "port": 80 }] } })
        }
        2 => {
            json!({ "apiVersion": "v1", "kind": "ServiceAccount", "metadata": { "name": name, "labels": labels } })
        }
        3 => {
            json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name, "labels": labels },
            "spec": template["spec"] })
        }
        4 => workload("Deployment", true),
        5 => workload("ReplicaSet", true),
        6 => workload("StatefulSet", true),
        _ => workload("DaemonSet", false),
    }
}

/// Creates `n` objects `<prefix>-<i>` spread evenly over the eight kinds, `writers` at once.
async fn create_objects(env: &Env, ns: &str, prefix: &str, n: usize, writers: usize) -> Result<()> {
    futures::stream::iter(0..n)
        .map(|i| async move {
            let name = format!("{prefix}-{i}");
            let path = collection(KINDS[i % KINDS.len()].2, ns);
            let body = serde_json::to_vec(&manifest(i, &name))?;
            let request = kube::core::Request::new(path).create(&PostParams::default(), body)?;
            env.admin
                .request::<Value>(request)
                .await
                .with_context(|| format!("create {name} in {ns}"))?;
            anyhow::Ok(())
        })
        .buffer_unordered(writers.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    Ok(())
}

/// Counts of [`CACHE_HEADER`] values, as "value ×count, ..." for a note.
fn header_text(counts: &BTreeMap<String, usize>) -> String {
    if counts.is_empty() {
        return "no responses".into();
    }
    counts
        .iter()
        .map(|(value, n)| format!("{value} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn merge(into: &mut BTreeMap<String, usize>, from: BTreeMap<String, usize>) {
    for (value, n) in from {
        *into.entry(value).or_default() += n;
    }
}

/// The value of [`CACHE_HEADER`] in `response`, or [`NO_HEADER`].
pub(super) fn cache_header<B>(response: &http::Response<B>) -> String {
    response
        .headers()
        .get(CACHE_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_else(|| NO_HEADER.into())
}

/// A page of a LIST: its items (not kept) and its continue token.
#[derive(serde::Deserialize)]
struct Page {
    items: Vec<serde::de::IgnoredAny>,
    #[serde(default)]
    metadata: PageMeta,
}

#[derive(Default, serde::Deserialize)]
struct PageMeta {
    #[serde(rename = "continue", default)]
    continue_token: Option<String>,
}

/// What a paged LIST gave.
#[derive(Default)]
struct Paged {
    objects: usize,
    pages: usize,
    bytes: usize,
    headers: BTreeMap<String, usize>,
}

/// LISTs `collection` in pages of [`PAGE`] with kube's client, following continue tokens.
async fn paged_list(client: &Client, collection: &str) -> Result<Paged> {
    let mut out = Paged::default();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let request = kube::core::Request::new(collection).list(&params)?;
        let response = client.send(request.map(Body::from)).await?;
        let status = response.status();
        *out.headers.entry(cache_header(&response)).or_default() += 1;
        let body = response.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            bail!(
                "LIST {collection}: HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        let page: Page = serde_json::from_slice(&body)
            .with_context(|| format!("a page of LIST {collection}"))?;
        out.objects += page.items.len();
        out.pages += 1;
        out.bytes += body.len();
        match page.metadata.continue_token.filter(|t| !t.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// The same LISTs as a caching cycle of `ns` (every kind, pages of [`PAGE`]) with kube's
/// client, untimed: which path answered them, by [`CACHE_HEADER`] value.
async fn cycle_headers(client: &Client, ns: &str) -> Result<BTreeMap<String, usize>> {
    let mut counts = BTreeMap::new();
    for (_, _, path) in KINDS {
        merge(
            &mut counts,
            paged_list(client, &collection(path, ns)).await?.headers,
        );
    }
    Ok(counts)
}

/// One side of the comparison: a kubeconfig, kube's client on it, and a kubectl with a
/// home of its own (warm discovery cache, as in Clouddriver's long-lived pod).
struct Target {
    kubeconfig: PathBuf,
    client: Client,
    kubectl: Kubectl,
}

impl Target {
    async fn new(env: &Env, kubeconfig: PathBuf, home: &str) -> Result<Self> {
        Ok(Self {
            client: super::proxy::client_for(&kubeconfig).await?,
            kubectl: Kubectl::new(env.control_plane.binaries().kubectl(), env.dir.join(home)),
            kubeconfig,
        })
    }
}

/// `kubectl get <8 kinds> -n <ns> -o json` (kubectl pages by 500); fails unless it printed
/// at least `expected` objects. Returns its seconds.
async fn caching_cycle(
    kubectl: &Kubectl,
    kubeconfig: &Path,
    ns: &str,
    expected: usize,
) -> Result<f64> {
    let kinds: Vec<&str> = KINDS.iter().map(|(resource, _, _)| *resource).collect();
    let args: Vec<String> = vec![
        "get".into(),
        kinds.join(","),
        format!("--namespace={ns}"),
        "-o".into(),
        "json".into(),
    ];
    let started = Instant::now();
    let outcome = kubectl
        .run(kubeconfig, &args, None, KUBECTL_TIMEOUT)
        .await?;
    let elapsed = started.elapsed().as_secs_f64();
    if !outcome.success() {
        bail!(
            "kubectl get {} ({}) failed ({:?}): {}",
            kinds.join(","),
            kubeconfig.display(),
            outcome.code,
            outcome.messages()
        );
    }
    let printed: Page = serde_json::from_str(&outcome.stdout).context("kubectl's JSON output")?;
    if printed.items.len() < expected {
        bail!(
            "kubectl get through {} printed {} objects, not the {expected} of namespace {ns}",
            kubeconfig.display(),
            printed.items.len()
        );
    }
    Ok(elapsed)
}

/// LISTs the API server has answered so far (`apiserver_request_total{verb="LIST"}`).
async fn apiserver_lists(env: &Env) -> Result<f64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = env.admin.request_text(request).await?;
    let lists: String = text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("verb=\"LIST\""))
        .collect::<Vec<_>>()
        .join("\n");
    Ok(metric_sum(&lists, "apiserver_request_total", &[]))
}

/// What the API server (and the hub) did during one side's timed work.
#[derive(Default, Clone, Copy)]
struct Load {
    apiserver_cpu: f64,
    hub_cpu: f64,
    lists: f64,
}

/// Watches the API server's CPU and LIST count (and the hub's CPU) over a window.
struct LoadWindow {
    cpu: CpuWindow,
    lists: f64,
}

impl LoadWindow {
    async fn start(env: &Env, apiserver: u32, hub: u32) -> Result<Self> {
        let lists = apiserver_lists(env).await?;
        Ok(Self {
            cpu: CpuWindow::start(vec![
                ("kube-apiserver".into(), apiserver),
                ("hub".into(), hub),
            ]),
            lists,
        })
    }

    async fn finish(self, env: &Env) -> Result<Load> {
        let (used, _) = self.cpu.finish();
        let of = |name: &str| {
            used.iter()
                .find(|(n, _)| n == name)
                .map(|(_, s)| *s)
                .unwrap_or(0.0)
        };
        Ok(Load {
            apiserver_cpu: of("kube-apiserver"),
            hub_cpu: of("hub"),
            lists: apiserver_lists(env).await? - self.lists,
        })
    }
}

/// The setting a row was measured in.
#[derive(Clone, Copy)]
enum Setting {
    Loopback,
    Far(Duration),
}

impl Setting {
    fn id_suffix(self) -> &'static str {
        match self {
            Setting::Loopback => "",
            Setting::Far(_) => "-far",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Setting::Loopback => "loopback",
            Setting::Far(_) => "far",
        }
    }

    fn title(self) -> String {
        match self {
            Setting::Loopback => "on loopback".into(),
            Setting::Far(rtt) => format!(
                "with {} ms round trip added (Toxiproxy) before the API server and the hub's gRPC port",
                rtt.as_millis()
            ),
        }
    }
}

/// The run's processes and sizes, shared by the rows.
struct World<'a> {
    env: &'a Env,
    o: &'a Options,
    apiserver: u32,
    hub: &'a HubProc,
}

/// Runs measure 9; returns a sentence for the report's summary.
pub async fn reads(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<String> {
    let apiserver = env
        .control_plane_pids()
        .into_iter()
        .find(|(name, _)| name == "kube-apiserver")
        .map(|(_, pid)| pid)
        .context("no kube-apiserver process")?;
    let cycle_ns = env.namespace("bench-reads").await?;
    let list_ns = env.namespace("bench-reads-list").await?;
    let cycle_objects = o.reads_cycle_objects.max(KINDS.len());
    let list_objects = o.reads_list_objects.max(1);
    eprintln!(
        "[bench]          creating {cycle_objects} objects over {} kinds and {list_objects} ConfigMaps",
        KINDS.len()
    );
    create_objects(env, &cycle_ns, "cycle", cycle_objects, o.writers).await?;
    env.create_configmaps(&list_ns, "page", list_objects, 256, o.writers)
        .await?;

    let hub = env.tls_hub("reads-hub").await?;
    let far = (o.reads_round_trip_ms > 0).then(|| Duration::from_millis(o.reads_round_trip_ms));
    let toxiproxy = match far {
        Some(_) => Some(Toxiproxy::start(env.dir.join("toxiproxy.log")).await?),
        None => None,
    };
    let hub_grpc = match &toxiproxy {
        Some(t) => t.proxy("hub-grpc", hub.grpc_addr).await?,
        None => hub.grpc_addr,
    };
    let account = "bench-reads";
    let kinds: Vec<&str> = KINDS.iter().map(|(_, kind, _)| *kind).collect();
    let mut agent = env
        .agent_at(
            "reads-agent",
            hub_grpc,
            json!([{
                "name": account,
                "kubeconfigFile": env.agent_kubeconfig.display().to_string(),
                "namespaces": [cycle_ns, list_ns],
                "kinds": kinds,
            }]),
        )
        .await?;
    agent.wait_ready(LONG).await?;
    hub.wait_objects(account, (cycle_objects + list_objects) as u64, LONG)
        .await?;
    let proxy_kubeconfig = env.dir.join("reads-proxy.kubeconfig");
    std::fs::write(
        &proxy_kubeconfig,
        hub.kubeconfig(account, "bench-reads").await?,
    )?;
    let proxy = Target::new(env, proxy_kubeconfig, "kubectl-home-reads-proxy").await?;
    let direct = Target::new(
        env,
        env.agent_kubeconfig.clone(),
        "kubectl-home-reads-direct",
    )
    .await?;
    let floor = Floor::start(env, &hub, &proxy.kubeconfig).await?;
    let world = World {
        env,
        o,
        apiserver,
        hub: &hub,
    };
    // The proxy answers once the hub has the agent's tunnel.
    let first = format!("/api/v1/namespaces/{cycle_ns}/configmaps");
    crate::procs::wait_for(
        "a LIST through the proxy",
        LONG,
        Duration::from_millis(50),
        || async { paged_list(&proxy.client, &first).await.map(|_| Some(())) },
    )
    .await?;

    let mut summary = Vec::new();
    // Seconds into measure 9 as each row starts, so each row's duration shows.
    let measure_started = Instant::now();
    let step = |what: &str| {
        eprintln!(
            "[bench]          9. {:>6.1} s: {what}",
            measure_started.elapsed().as_secs_f64()
        )
    };
    step("caching cycle, loopback");
    summary.push(
        cycle_row(
            &world,
            &proxy,
            &direct,
            &floor,
            &cycle_ns,
            cycle_objects,
            Setting::Loopback,
            rows,
        )
        .await?,
    );
    step("paged LIST");
    list_row(&world, &proxy, &direct, &list_ns, list_objects, rows).await?;
    step("kubectl get (a Table)");
    table::table_row(&world, &proxy, &direct, &list_ns, list_objects, rows).await?;
    step("watch, loopback");
    watch_row(
        &world,
        &proxy.client,
        &direct.client,
        &cycle_ns,
        Setting::Loopback,
        rows,
    )
    .await?;
    step(&format!("{} accounts at once", o.reads_accounts));
    summary.push(accounts_row(&world, rows).await?);

    if let (Some(toxiproxy), Some(rtt)) = (&toxiproxy, far) {
        let upstream = env
            .control_plane
            .server()
            .strip_prefix("https://")
            .context("the API server's URL is not https://")?
            .parse()?;
        let listen = toxiproxy.proxy("apiserver", upstream).await?;
        let text = std::fs::read_to_string(&env.agent_kubeconfig)?;
        let server = env.control_plane.server();
        anyhow::ensure!(
            text.contains(server),
            "the agent's kubeconfig does not name {server}"
        );
        let far_kubeconfig = env.dir.join("reads-direct-far.kubeconfig");
        std::fs::write(
            &far_kubeconfig,
            text.replace(server, &format!("https://{listen}")),
        )?;
        let direct_far = Target::new(env, far_kubeconfig, "kubectl-home-reads-direct-far").await?;
        toxiproxy.add_round_trip("apiserver", rtt).await?;
        toxiproxy.add_round_trip("hub-grpc", rtt).await?;
        let setting = Setting::Far(rtt);
        step("caching cycle, far");
        summary.push(
            cycle_row(
                &world,
                &proxy,
                &direct_far,
                &floor,
                &cycle_ns,
                cycle_objects,
                setting,
                rows,
            )
            .await?,
        );
        step("watch, far");
        watch_row(
            &world,
            &proxy.client,
            &direct_far.client,
            &cycle_ns,
            setting,
            rows,
        )
        .await?;
    }
    step("done");
    drop(floor);
    drop(agent);
    drop(toxiproxy);
    drop(hub);
    Ok(summary.join(" "))
}

// ------------------------------------------------------------------ the floor

/// The cheapest server of the proxy's bytes: Debian's nginx in front of the hub with
/// `proxy_cache`, so that after one cycle through it every later cycle is answered from
/// nginx's own cache, the same responses (continue tokens included) as the hub gave.
struct Floor {
    nginx: scale_agent_e2e::nginx::Nginx,
    target: Target,
    /// Its log of cache statuses, one line per request.
    log: PathBuf,
    version: String,
}

impl Floor {
    async fn start(env: &Env, hub: &HubProc, proxy_kubeconfig: &Path) -> Result<Self> {
        let dir = env.dir.join("floor-nginx");
        let port = crate::procs::free_port()?;
        let listen: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let log = dir.join("cache-status.log");
        let d = dir.display();
        // One cache entry per request line and the headers that change the answer; the
        // hub's own caching headers are ignored: the floor keeps everything for the run.
        let server = format!(
            "proxy_cache_path {d}/cache levels=1:2 keys_zone=floor:16m max_size=4g inactive=2h use_temp_path=off;\n\
             server {{\n\
             \x20   listen {listen} ssl http2;\n\
             \x20   ssl_certificate {cert};\n\
             \x20   ssl_certificate_key {key};\n\
             \x20   access_log {log} floor;\n\
             \x20   location / {{\n\
             \x20       proxy_pass https://{hub};\n\
             \x20       proxy_http_version 1.1;\n\
             \x20       proxy_cache floor;\n\
             \x20       proxy_cache_key \"$request_uri|$http_accept|$http_accept_encoding\";\n\
             \x20       proxy_cache_valid 200 404 2h;\n\
             \x20       proxy_ignore_headers Cache-Control Expires Set-Cookie Vary X-Accel-Expires;\n\
             \x20       proxy_buffer_size 64k;\n\
             \x20       proxy_buffers 64 64k;\n\
             \x20   }}\n\
             }}\n",
            cert = env.pki.hub_cert.display(),
            key = env.pki.hub_key.display(),
            log = log.display(),
            hub = hub.http_addr,
        );
        let nginx = scale_agent_e2e::nginx::Nginx::start(
            &dir,
            &server,
            "log_format floor '$upstream_cache_status $request_uri';",
            listen,
        )
        .await?;
        let text = std::fs::read_to_string(proxy_kubeconfig)?;
        let hub_url = format!("https://{}", hub.http_addr);
        anyhow::ensure!(
            text.contains(&hub_url),
            "the proxy's kubeconfig does not name {hub_url}"
        );
        let kubeconfig = env.dir.join("reads-floor.kubeconfig");
        std::fs::write(
            &kubeconfig,
            text.replace(&hub_url, &format!("https://{listen}")),
        )?;
        let target = Target::new(env, kubeconfig, "kubectl-home-reads-floor").await?;
        let version = std::process::Command::new(scale_agent_e2e::nginx::binary()?)
            .arg("-v")
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stderr)
                    .trim()
                    .replace("nginx version: ", "")
            })
            .unwrap_or_default();
        Ok(Floor {
            nginx,
            target,
            log,
            version,
        })
    }

    fn log_len(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    /// nginx's cache status of each request logged after the first `skip` lines, counted.
    fn statuses_since(&self, skip: usize) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        for line in text.lines().skip(skip) {
            let status = line.split_whitespace().next().unwrap_or("-");
            *counts.entry(status.to_string()).or_default() += 1;
        }
        counts
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.nginx.stop();
    }
}

// ------------------------------------------------------------------ caching cycle

/// Figures of one side over `repeats` caching cycles.
#[derive(Default)]
struct CycleSide {
    secs: Vec<f64>,
    /// kubectl's own user + system CPU seconds per cycle (caching cycles only).
    kubectl_cpu: Vec<f64>,
    load: Load,
}

#[allow(clippy::too_many_arguments)]
async fn cycle_row(
    w: &World<'_>,
    proxy: &Target,
    direct: &Target,
    floor: &Floor,
    ns: &str,
    objects: usize,
    setting: Setting,
    rows: &mut Vec<Row>,
) -> Result<String> {
    // One cycle each first: kubectl's discovery cache fills, as in Clouddriver's pod (and
    // the floor's nginx stores every response the proxy gave).
    for target in [proxy, direct, &floor.target] {
        caching_cycle(&target.kubectl, &target.kubeconfig, ns, objects).await?;
    }
    let floor_log_start = floor.log_len();
    let repeats = w.o.reads_cycle_repeats.max(1);
    let (mut p, mut d, mut f) = (
        CycleSide::default(),
        CycleSide::default(),
        CycleSide::default(),
    );
    for i in 0..repeats {
        // The floor goes between the two sides, alternating with them.
        let mut order: Vec<Option<Side>> = pair(i).into_iter().map(Some).collect();
        order.insert(1, None);
        for side_of in order {
            let (target, side) = match side_of {
                Some(Side::Proxy) => (proxy, &mut p),
                Some(Side::Direct) => (direct, &mut d),
                None => (&floor.target, &mut f),
            };
            let window = LoadWindow::start(w.env, w.apiserver, w.hub.pid()).await?;
            let cpu_before = crate::procs::ended_children_cpu();
            side.secs
                .push(caching_cycle(&target.kubectl, &target.kubeconfig, ns, objects).await?);
            side.kubectl_cpu
                .push(crate::procs::ended_children_cpu() - cpu_before);
            let load = window.finish(w.env).await?;
            side.load.apiserver_cpu += load.apiserver_cpu / repeats as f64;
            side.load.hub_cpu += load.hub_cpu / repeats as f64;
            side.load.lists += load.lists / repeats as f64;
        }
    }
    let floor_statuses = floor.statuses_since(floor_log_start);
    let headers = cycle_headers(&proxy.client, ns).await?;
    let (ps, ds) = (Percentiles::of(&p.secs).p50, Percentiles::of(&d.secs).p50);
    let fs = Percentiles::of(&f.secs).p50;
    let cpu = |side: &CycleSide| Percentiles::of(&side.kubectl_cpu).p50;
    rows.push(Row {
        id: format!("reads-cycle{}", setting.id_suffix()),
        measure: 9,
        title: format!(
            "Clouddriver caching cycle of one account, {objects} objects over {} kinds (`kubectl get <kinds> -o json`) through the proxy, {}",
            KINDS.len(),
            setting.title()
        ),
        system: format!("{} per cycle; API server {:.2} CPU s, {:.0} LISTs", secs(ps), p.load.apiserver_cpu, p.load.lists),
        baseline_name: "the same kubectl command straight to the API server".into(),
        baseline: format!("{} per cycle; API server {:.2} CPU s, {:.0} LISTs", secs(ds), d.load.apiserver_cpu, d.load.lists),
        note: format!(
            "median of {repeats} cycles per side, alternating, after one warm-up each (kubectl {}, its own warm HOME per side; kubectl pages by 500); API server CPU from /proc/<pid>/stat and LISTs from its apiserver_request_total{{verb=\"LIST\"}}, per cycle (any LIST during the window counts, the agent's included); hub CPU {:.2} s per cycle through the proxy; direct ÷ proxy = {:.2}×; {CACHE_HEADER} on the same LISTs made once more through the proxy with kube's client: {}",
            scale_agent_e2e::KUBERNETES_VERSION,
            p.load.hub_cpu,
            ds / ps.max(1e-9),
            header_text(&headers)
        ),
        values: json!({ "objects": objects, "kinds": KINDS.len(), "repeats": repeats,
            "proxy_seconds": p.secs, "direct_seconds": d.secs,
            "proxy_apiserver_cpu_seconds": p.load.apiserver_cpu, "direct_apiserver_cpu_seconds": d.load.apiserver_cpu,
            "proxy_apiserver_lists": p.load.lists, "direct_apiserver_lists": d.load.lists,
            "proxy_hub_cpu_seconds": p.load.hub_cpu, "cache_header": headers,
            "proxy_kubectl_cpu_seconds": p.kubectl_cpu, "direct_kubectl_cpu_seconds": d.kubectl_cpu }),
    });
    rows.push(Row {
        id: format!("reads-cycle-floor{}", setting.id_suffix()),
        measure: 9,
        title: format!(
            "The same caching cycle ({objects} objects) answered by the cheapest server of the proxy's bytes (the floor), {}: direct / proxy's cache / floor",
            setting.title()
        ),
        system: format!(
            "proxy's cache {}, kubectl {:.2} CPU s",
            secs(ps),
            cpu(&p)
        ),
        baseline_name: "nginx replaying the proxy's responses from its own cache (the floor); and directly".into(),
        baseline: format!(
            "floor {}, kubectl {:.2} CPU s; direct {}, kubectl {:.2} CPU s",
            secs(fs),
            cpu(&f),
            secs(ds),
            cpu(&d)
        ),
        note: format!(
            "the floor is Debian's nginx {} (TLS with the hub's certificate, HTTP/2, on loopback) in front of the hub with proxy_cache: the warm-up cycle stored every response the proxy gave (the same bytes, continue tokens included), the timed cycles are answered from nginx's cache (its cache status per request in the timed cycles: {}); medians of {repeats} cycles per side, alternating with the other two; kubectl CPU is its user + system time (getrusage of the ended child, /proc/self/stat cutime + cstime); the proxy adds {} above the floor, the floor is {:.2}× faster than direct",
            floor.version,
            header_text(&floor_statuses),
            secs((ps - fs).max(0.0)),
            ds / fs.max(1e-9)
        ),
        values: json!({ "objects": objects, "repeats": repeats,
            "floor_seconds": f.secs, "proxy_seconds": p.secs, "direct_seconds": d.secs,
            "floor_kubectl_cpu_seconds": f.kubectl_cpu, "proxy_kubectl_cpu_seconds": p.kubectl_cpu,
            "direct_kubectl_cpu_seconds": d.kubectl_cpu, "floor_cache_status": floor_statuses }),
    });
    Ok(format!(
        "A caching cycle of {objects} objects {} takes {} through the proxy against {} directly ({:.0} against {:.0} LISTs reaching the API server).",
        setting.title(),
        secs(ps),
        secs(ds),
        p.load.lists,
        d.load.lists
    ))
}

// ------------------------------------------------------------------ paged LIST

async fn list_row(
    w: &World<'_>,
    proxy: &Target,
    direct: &Target,
    ns: &str,
    objects: usize,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let collection = format!("/api/v1/namespaces/{ns}/configmaps");
    for target in [proxy, direct] {
        paged_list(&target.client, &collection).await?;
    }
    let repeats = w.o.reads_list_repeats.max(1);
    let (mut p, mut d) = (CycleSide::default(), CycleSide::default());
    let (mut headers, mut direct_headers) = (BTreeMap::new(), BTreeMap::new());
    let mut pages = 0;
    for i in 0..repeats {
        for order in pair(i) {
            let through_proxy = order == Side::Proxy;
            let (target, side) = if through_proxy {
                (proxy, &mut p)
            } else {
                (direct, &mut d)
            };
            let window = LoadWindow::start(w.env, w.apiserver, w.hub.pid()).await?;
            let started = Instant::now();
            let listed = paged_list(&target.client, &collection).await?;
            side.secs.push(started.elapsed().as_secs_f64());
            let load = window.finish(w.env).await?;
            if listed.objects != objects {
                bail!(
                    "a paged LIST {} gave {} ConfigMaps, not {objects}",
                    if through_proxy {
                        "through the proxy"
                    } else {
                        "to the API server"
                    },
                    listed.objects
                );
            }
            pages = listed.pages;
            merge(
                if through_proxy {
                    &mut headers
                } else {
                    &mut direct_headers
                },
                listed.headers,
            );
            side.load.apiserver_cpu += load.apiserver_cpu / repeats as f64;
            side.load.hub_cpu += load.hub_cpu / repeats as f64;
            side.load.lists += load.lists / repeats as f64;
        }
    }
    let (ps, ds) = (Percentiles::of(&p.secs).p50, Percentiles::of(&d.secs).p50);
    rows.push(Row {
        id: "reads-list".into(),
        measure: 9,
        title: format!("LIST of {objects} ConfigMaps in pages of {PAGE} (`limit`/`continue`, kube's client) through the proxy"),
        system: format!("{} ({pages} pages); API server {:.2} CPU s, {:.0} LISTs", secs(ps), p.load.apiserver_cpu, p.load.lists),
        baseline_name: "the same pages straight to the API server".into(),
        baseline: format!("{} ({pages} pages); API server {:.2} CPU s, {:.0} LISTs", secs(ds), d.load.apiserver_cpu, d.load.lists),
        note: format!(
            "median of {repeats} per side, alternating, after one untimed each; every ConfigMap counted once per LIST; hub CPU {:.2} s per LIST through the proxy; {CACHE_HEADER} through the proxy: {}; directly: {}",
            p.load.hub_cpu,
            header_text(&headers),
            header_text(&direct_headers)
        ),
        values: json!({ "objects": objects, "page": PAGE, "pages": pages, "repeats": repeats,
            "proxy_seconds": p.secs, "direct_seconds": d.secs,
            "proxy_apiserver_cpu_seconds": p.load.apiserver_cpu, "direct_apiserver_cpu_seconds": d.load.apiserver_cpu,
            "proxy_apiserver_lists": p.load.lists, "direct_apiserver_lists": d.load.lists,
            "proxy_hub_cpu_seconds": p.load.hub_cpu, "cache_header": headers }),
    });
    Ok(())
}

// ------------------------------------------------------------------ many accounts

/// One caching cycle of each of `o.reads_accounts` accounts at once on one hub, through the
/// proxy, beside the same cycles straight to the API server. The accounts are served by one
/// real agent process (its own, started here, reaching the hub on loopback), all watching
/// the same namespace of `o.reads_account_objects` objects; returns a summary sentence.
async fn accounts_row(w: &World<'_>, rows: &mut Vec<Row>) -> Result<String> {
    let (env, o) = (w.env, w.o);
    let n = o.reads_accounts.max(1);
    let objects = o.reads_account_objects.max(KINDS.len());
    let ns = env.namespace("bench-reads-many").await?;
    create_objects(env, &ns, "acct", objects, o.writers).await?;
    let kinds: Vec<&str> = KINDS.iter().map(|(_, kind, _)| *kind).collect();
    let names: Vec<String> = (0..n).map(|i| format!("bench-reads-{i:03}")).collect();
    let accounts: Vec<Value> = names
        .iter()
        .map(|name| {
            json!({
                "name": name,
                "kubeconfigFile": env.agent_kubeconfig.display().to_string(),
                "namespaces": [ns],
                "kinds": kinds,
            })
        })
        .collect();
    let mut agent = env
        .agent_at("reads-agent-many", w.hub.grpc_addr, json!(accounts))
        .await?;
    agent.wait_ready(LONG).await?;
    let mut kubeconfigs = Vec::with_capacity(n);
    for name in &names {
        w.hub.wait_objects(name, objects as u64, LONG).await?;
        let path = env.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, w.hub.kubeconfig(name, "bench-reads").await?)?;
        kubeconfigs.push(path);
    }
    let binary = env.control_plane.binaries().kubectl();
    // One home per side, as one Clouddriver pod has one (kubectl keys its caches by server).
    let proxy_kubectl = Kubectl::new(binary.clone(), env.dir.join("kubectl-home-many-proxy"));
    let direct_kubectl = Kubectl::new(binary, env.dir.join("kubectl-home-many-direct"));
    let ns = Arc::new(ns);
    let all_at_once = |through_proxy: bool| {
        let (kubectl, ns) = (
            if through_proxy {
                &proxy_kubectl
            } else {
                &direct_kubectl
            },
            ns.clone(),
        );
        let kubeconfigs = &kubeconfigs;
        async move {
            let runs = (0..n).map(|i| {
                let kubeconfig = if through_proxy {
                    kubeconfigs[i].as_path()
                } else {
                    env.agent_kubeconfig.as_path()
                };
                caching_cycle(kubectl, kubeconfig, &ns, objects)
            });
            futures::future::try_join_all(runs).await
        }
    };
    // Warm-up: every account's discovery cache, untimed.
    all_at_once(true).await?;
    all_at_once(false).await?;
    let pids = vec![
        ("kube-apiserver".to_string(), w.apiserver),
        ("hub".to_string(), w.hub.pid()),
        ("agent".to_string(), agent.pid()),
    ];
    let pids = &pids;
    // (seconds in all, load, agent CPU seconds) of one side.
    let timed = |through_proxy: bool| async move {
        let window = LoadWindow::start(env, w.apiserver, w.hub.pid()).await?;
        let cpu = CpuWindow::start(pids.clone());
        let started = Instant::now();
        all_at_once(through_proxy).await?;
        let total = started.elapsed().as_secs_f64();
        let load = window.finish(env).await?;
        let (used, _) = cpu.finish();
        let agent_cpu = used
            .iter()
            .find(|(name, _)| name == "agent")
            .map(|(_, s)| *s)
            .unwrap_or(0.0);
        anyhow::Ok((total, load, agent_cpu))
    };
    let (ps, pl, pa) = timed(true).await?;
    let (ds, dl, _) = timed(false).await?;
    let mut headers = BTreeMap::new();
    for path in &kubeconfigs {
        let client = super::proxy::client_for(path).await?;
        merge(&mut headers, cycle_headers(&client, &ns).await?);
    }
    drop(agent);
    rows.push(Row {
        id: "reads-accounts".into(),
        measure: 9,
        title: format!(
            "{n} accounts × one caching cycle each ({objects} objects over {} kinds per account), all at once on one hub, through the proxy",
            KINDS.len()
        ),
        system: format!("{} in all; hub {:.2} CPU s; API server {:.2} CPU s, {:.0} LISTs", secs(ps), pl.hub_cpu, pl.apiserver_cpu, pl.lists),
        baseline_name: format!("the same {n} kubectl commands straight to the API server"),
        baseline: format!("{} in all; API server {:.2} CPU s, {:.0} LISTs", secs(ds), dl.apiserver_cpu, dl.lists),
        note: format!(
            "{n} kubectl processes at once per side, each as Clouddriver runs it, after one untimed round each; real agents: one agent process serves the {n} accounts (one ServiceAccount, all watching the same namespace, so the direct side loads one API server with every account's cycle), reaching the hub on loopback; agent CPU {pa:.2} s through the proxy; {CACHE_HEADER} on the same LISTs made once more through the proxy with kube's client: {}",
            header_text(&headers)
        ),
        values: json!({ "accounts": n, "objects_per_account": objects,
            "proxy_seconds": ps, "direct_seconds": ds, "proxy_hub_cpu_seconds": pl.hub_cpu, "proxy_agent_cpu_seconds": pa,
            "proxy_apiserver_cpu_seconds": pl.apiserver_cpu, "direct_apiserver_cpu_seconds": dl.apiserver_cpu,
            "proxy_apiserver_lists": pl.lists, "direct_apiserver_lists": dl.lists, "cache_header": headers }),
    });
    Ok(format!(
        "{n} accounts' caching cycles at once take {} through one hub ({:.2} hub CPU s) against {} directly.",
        secs(ps),
        pl.hub_cpu,
        secs(ds)
    ))
}

// ------------------------------------------------------------------ watch

/// Opens a watch of the namespace's ConfigMaps from `rv` with kube's client and records
/// each object it delivers; returns the response's [`CACHE_HEADER`] once the watch is on.
async fn start_watch(
    client: &Client,
    ns: &str,
    rv: &str,
    seen: Seen,
) -> Result<(String, tokio::task::JoinHandle<()>)> {
    let collection = format!("/api/v1/namespaces/{ns}/configmaps");
    let request =
        kube::core::Request::new(&collection).watch(&WatchParams::default().timeout(290), rv)?;
    let response = client.send(request.map(Body::from)).await?;
    let header = cache_header(&response);
    if !response.status().is_success() {
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        bail!(
            "WATCH {collection}: HTTP {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    let mut body = response.into_body();
    let task = tokio::spawn(async move {
        let mut buffer = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            let now = Instant::now();
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buffer.extend_from_slice(&data);
            while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=end).collect();
                let Ok(event) = serde_json::from_slice::<Value>(&line) else {
                    continue;
                };
                if matches!(event["type"].as_str(), Some("ADDED" | "MODIFIED")) {
                    let meta = &event["object"]["metadata"];
                    let name = meta["name"].as_str().unwrap_or_default().to_string();
                    record(&seen, name, rv_num(meta["resourceVersion"].as_str()), now);
                }
            }
        }
    });
    Ok((header, task))
}

async fn watch_row(
    w: &World<'_>,
    proxy: &Client,
    direct: &Client,
    ns: &str,
    setting: Setting,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let api = Api::<ConfigMap>::namespaced(w.env.admin.clone(), ns);
    // The cycle's ConfigMaps are objects 0, 8, 16, ...: the updates go round ten of them.
    let names: Vec<String> = (0..w.o.reads_cycle_objects.max(KINDS.len()))
        .step_by(KINDS.len())
        .take(10)
        .map(|i| format!("cycle-{i}"))
        .collect();
    let rv = api
        .list_metadata(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let (proxy_seen, direct_seen): (Seen, Seen) = (Arc::default(), Arc::default());
    let (header, proxy_watch) = start_watch(proxy, ns, &rv, proxy_seen.clone()).await?;
    let (_, direct_watch) = start_watch(direct, ns, &rv, direct_seen.clone()).await?;

    let n = w.o.reads_watch_updates.max(1);
    let tag = format!("{}-", setting.tag());
    let updates = paced_updates(&api, &names, n, w.o.reads_watch_rate, &tag).await?;
    wait_delivered(
        &updates,
        &[&proxy_seen, &direct_seen],
        Duration::from_secs(60),
    )
    .await;
    proxy_watch.abort();
    direct_watch.abort();
    let (proxy_ms, proxy_missed) = latencies(&updates, &proxy_seen);
    let (direct_ms, direct_missed) = latencies(&updates, &direct_seen);
    if proxy_ms.is_empty() || direct_ms.is_empty() {
        bail!(
            "the watches saw none of {n} updates (through the proxy missed {proxy_missed}, directly {direct_missed})"
        );
    }
    let (pp, dp) = (Percentiles::of(&proxy_ms), Percentiles::of(&direct_ms));
    rows.push(Row {
        id: format!("reads-watch{}", setting.id_suffix()),
        measure: 9,
        title: format!(
            "Watch of ConfigMaps through the proxy, change-to-event latency ({n} updates at {}/s), {}",
            w.o.reads_watch_rate,
            setting.title()
        ),
        system: pp.display_ms(),
        baseline_name: "the same watch straight to the API server (the floor)".into(),
        baseline: dp.display_ms(),
        note: format!(
            "from PATCH issued (by the bench, next to the API server) to the event read; both watches opened at once from the same resourceVersion with kube's client; missed: proxy {proxy_missed}, direct {direct_missed}; {CACHE_HEADER} on the proxied watch: {header}"
        ),
        values: json!({ "updates": n, "rate_per_sec": w.o.reads_watch_rate, "proxy_ms": pp, "direct_ms": dp,
            "proxy_missed": proxy_missed, "direct_missed": direct_missed, "cache_header": header }),
    });
    Ok(())
}
