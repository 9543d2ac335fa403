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
//!
//! This file sets up the two sides and holds what the rows share; each row is a child
//! module: `get` (one object, and many clients at once), `apply`, `watch` and `list`.

mod apply;
mod get;
mod list;
mod watch;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result};
use futures::AsyncBufReadExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{GetParams, ListParams, PostParams, WatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;

use apply::apply;
use get::{get_concurrent, get_one};
use list::list;
use watch::watch;

use super::LONG;
use crate::{
    Options,
    env::{Env, payload},
    report::{Row, ms},
};

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
