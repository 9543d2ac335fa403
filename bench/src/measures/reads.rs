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

mod accounts;
mod cycle;
mod list;
mod table;
mod watch;

use accounts::accounts_row;
use cycle::{Floor, cycle_row};
use list::list_row;
use watch::watch_row;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use http_body_util::BodyExt as _;
use kube::{
    Client,
    api::{ListParams, PostParams},
    client::Body,
};
use scale_agent_e2e::kubectl::Kubectl;
use serde_json::{Value, json};

use super::{
    LONG,
    proxy::{Side, pair},
};
use crate::{
    Options,
    env::{Env, HubProc, payload},
    procs::{CpuWindow, metric_sum},
    report::Row,
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

/// Figures of one side over `repeats` caching cycles.
#[derive(Default)]
struct CycleSide {
    secs: Vec<f64>,
    /// kubectl's own user + system CPU seconds per cycle (caching cycles only).
    kubectl_cpu: Vec<f64>,
    load: Load,
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
