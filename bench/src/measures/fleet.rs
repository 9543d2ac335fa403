//! Measure 12: a fleet on one hub under Clouddriver's read load (issue 26).
//!
//! `--fleet-agents` simulated agents (the protocol-level fake agent of measures 7 and 10,
//! each its own client certificate and account) stream `--fleet-objects` objects each over
//! `--fleet-namespaces` namespaces, in the mix of kinds and sizes of [`fleet_objects`]. Then,
//! for `--fleet-seconds`, at the same time:
//! - churn: `--fleet-churn-percent` of all objects changed per minute, on random objects of
//!   random accounts, each change carrying a new `bench/stamp` annotation;
//! - every account's caching cycle every `--fleet-cycle-secs` (random phase): per
//!   namespace, the eight kinds, LISTs in pages of 500 (Secrets in the metadata-only form);
//! - GETs by name, one per account every `--fleet-get-period-secs` (WaitForManifestStable's
//!   poll), of a random Deployment, ReplicaSet or Service of the account;
//! - watches through the proxy (cluster-wide, six kinds) of `--fleet-watch-accounts`
//!   accounts, each event matched by its stamp to the change that made it.
//!
//! Every read goes through the hub's TLS proxy with the account's own kubeconfig (kube's
//! client, one per account), at most `--fleet-clients` requests in flight over all.
//!
//! The baseline: one account's objects created in the real API server, and the same load of
//! one account (its cycles, GETs, churn as PATCHes, watches) straight to it, with the agent's
//! ServiceAccount token. That is the per-account cost a fleet of real clusters would pay on
//! each of its API servers.
//!
//! [`fleet_objects`]: super::fleet_objects

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use http_body_util::BodyExt as _;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams},
    client::Body,
    core::{WatchEvent, params::PostParams},
};
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
use scale_agent_proto::v1::agent_message::Kind as Msg;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

mod report;
mod trajectory;
use report::{Figures, report};

use super::{
    LONG,
    agent_objects::{AgentObjects, object_event},
    fleet_objects::{self, KINDS, METADATA_ACCEPT},
    proxy::client_for,
    reads::cache_header,
};
use crate::{
    Options,
    env::Env,
    fake::FakeAgent,
    procs::CpuWindow,
    report::{Percentiles, Row, bytes, mib, ms, secs},
};

/// Page size of the caching cycle's LISTs (kubectl's).
const PAGE: u32 = 500;
/// Streams being opened at once while the fleet connects.
const CONNECTING: usize = 64;
/// Churn is sent every tick (the rate spread over them).
const TICK: Duration = Duration::from_millis(100);
/// The baseline's load runs `--fleet-seconds` up to this long: its figures are per request
/// and per cycle of one account, not a trajectory, and a soak's window would double the run.
const BASELINE_WINDOW: Duration = Duration::from_secs(120);
/// The kinds watched (with objects and served in full: not Secrets, not StatefulSets).
fn watched_kinds() -> impl Iterator<Item = usize> {
    (0..KINDS.len()).filter(|k| KINDS[*k].share > 0 && !KINDS[*k].metadata_only())
}

fn api_resource(k: usize) -> ApiResource {
    let info = &KINDS[k];
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(info.group, info.version, info.kind),
        info.plural,
    )
}

/// The sizes of one run (one side).
#[derive(Clone, Copy)]
struct Sizes {
    objects: usize,
    namespaces: usize,
    cycle: Duration,
    get_period: Duration,
    churn_per_minute: f64,
    window: Duration,
    clients: usize,
}

/// Changes made and not yet seen by a watch: (account, stamp) → when the change was issued.
type Issued = Arc<Mutex<HashMap<(usize, u64), Instant>>>;

/// What the load measured on one side.
#[derive(Default)]
struct Measured {
    page_ms: Vec<f64>,
    get_ms: Vec<f64>,
    watch_ms: Vec<f64>,
    cycle_secs: Vec<f64>,
    cycles_late: usize,
    pages: usize,
    page_bytes: usize,
    changes: u64,
    changes_watched: u64,
    headers: BTreeMap<String, usize>,
    errors: Vec<String>,
}

/// How the churn reaches each side: the fake agents' streams, or PATCHes to the API server.
enum Churn {
    Agents {
        agents: Vec<FakeAgent>,
        accounts: Vec<String>,
        rvs: Vec<u64>,
    },
    ApiServer(Client),
}

impl Churn {
    async fn change(
        &mut self,
        account: usize,
        object: usize,
        stamp: u64,
        sizes: &Sizes,
    ) -> Result<()> {
        match self {
            Churn::Agents {
                agents,
                accounts,
                rvs,
            } => {
                rvs[account] += 1;
                let event = object_event(
                    &accounts[account],
                    object,
                    sizes.namespaces,
                    stamp,
                    rvs[account],
                );
                agents[account].send(Msg::Object(event)).await?;
            }
            Churn::ApiServer(client) => {
                let slot = fleet_objects::slot(object, sizes.namespaces);
                let patch =
                    json!({ "metadata": { "annotations": { "bench/stamp": stamp.to_string() } } });
                let request =
                    kube::core::Request::new(KINDS[slot.kind].collection(&slot.namespace)).patch(
                        &slot.name,
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )?;
                let client = client.clone();
                // Not awaited in line: the PATCH's answer would pace the churn.
                tokio::spawn(async move {
                    let _ = client.request::<Value>(request).await;
                });
            }
        }
        Ok(())
    }
}

/// Connects one fake agent, registers its account with every kind WATCHING and sends each
/// kind's snapshot; returns the agent and the JSON bytes it sent.
async fn connect_agent(
    env: &Env,
    hub: std::net::SocketAddr,
    account: &str,
    sizes: &Sizes,
) -> Result<(FakeAgent, usize)> {
    let issued = env.pki.ca.client(&format!("bench-{account}"), &[])?;
    let ca = &env.pki.ca.cert_pem;
    let mut fake =
        FakeAgent::connect(hub, ca, &issued.cert_pem, &issued.key_pem, "fleet-0").await?;
    fake.register(account, &format!("https://{account}.bench:443"))
        .await?;
    let objects = AgentObjects::Mix {
        objects: sizes.objects,
        namespaces: sizes.namespaces,
    };
    let sent = objects.snapshot(&mut fake, account, 1).await?;
    fake.synced(LONG).await?;
    Ok((fake, sent))
}

/// One LIST page: the latency, body bytes, and the continue token.
async fn list_page(
    client: &Client,
    k: usize,
    ns: &str,
    token: Option<&str>,
) -> Result<(f64, usize, Option<String>, String)> {
    let mut params = ListParams::default().limit(PAGE);
    if let Some(token) = token {
        params = params.continue_token(token);
    }
    let mut request = kube::core::Request::new(KINDS[k].collection(ns)).list(&params)?;
    if KINDS[k].metadata_only() {
        request.headers_mut().insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static(METADATA_ACCEPT),
        );
    }
    let started = Instant::now();
    let response = client.send(request.map(Body::from)).await?;
    let status = response.status();
    let header = cache_header(&response);
    let body = response.into_body().collect().await?.to_bytes();
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if !status.is_success() {
        bail!(
            "LIST {} in {ns}: HTTP {status}: {}",
            KINDS[k].plural,
            String::from_utf8_lossy(&body)
        );
    }
    let page: Value = serde_json::from_slice(&body)?;
    let next = page["metadata"]["continue"]
        .as_str()
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    Ok((ms, body.len(), next, header))
}

/// One account's reads for the window: caching cycles and GETs by name.
async fn account_reads(
    client: Client,
    account: usize,
    sizes: Sizes,
    until: Instant,
    permits: Arc<Semaphore>,
    out: Arc<Mutex<Measured>>,
) {
    let mut rng = StdRng::seed_from_u64(account as u64);
    let phase = sizes.cycle.mul_f64(rng.random::<f64>());
    let get_phase = sizes.get_period.mul_f64(rng.random::<f64>());
    let cycles = {
        let (client, permits, out) = (client.clone(), permits.clone(), out.clone());
        async move {
            let mut next = Instant::now() + phase;
            while next < until {
                tokio::time::sleep_until(next.into()).await;
                let started = Instant::now();
                for n in 0..sizes.namespaces {
                    let ns = fleet_objects::namespace(n);
                    for k in 0..KINDS.len() {
                        let mut token = None;
                        loop {
                            let Ok(_permit) = permits.acquire().await else {
                                return;
                            };
                            match list_page(&client, k, &ns, token.as_deref()).await {
                                Ok((ms, size, next, header)) => {
                                    let mut m = out.lock().unwrap_or_else(|e| e.into_inner());
                                    m.page_ms.push(ms);
                                    m.pages += 1;
                                    m.page_bytes += size;
                                    *m.headers.entry(header).or_default() += 1;
                                    token = next;
                                }
                                Err(e) => {
                                    let mut m = out.lock().unwrap_or_else(|e| e.into_inner());
                                    m.errors.push(format!("{e:#}"));
                                    token = None;
                                }
                            }
                            if token.is_none() {
                                break;
                            }
                        }
                    }
                }
                let took = started.elapsed();
                let mut m = out.lock().unwrap_or_else(|e| e.into_inner());
                m.cycle_secs.push(took.as_secs_f64());
                if took > sizes.cycle {
                    m.cycles_late += 1;
                }
                drop(m);
                next = (next + sizes.cycle).max(Instant::now());
            }
        }
    };
    // The objects a deploy waits on: Deployments, ReplicaSets, Services.
    let targets: Vec<usize> = (0..sizes.objects)
        .filter(|i| {
            let kind = KINDS[fleet_objects::slot(*i, sizes.namespaces).kind].kind;
            matches!(kind, "Deployment" | "ReplicaSet" | "Service")
        })
        .collect();
    let gets = async move {
        if targets.is_empty() {
            return;
        }
        let mut next = Instant::now() + get_phase;
        while next < until {
            tokio::time::sleep_until(next.into()).await;
            let i = targets[rng.random_range(0..targets.len())];
            let slot = fleet_objects::slot(i, sizes.namespaces);
            let Ok(_permit) = permits.acquire().await else {
                return;
            };
            let result = async {
                let request =
                    kube::core::Request::new(KINDS[slot.kind].collection(&slot.namespace))
                        .get(&slot.name, &Default::default())?;
                let started = Instant::now();
                let response = client.send(request.map(Body::from)).await?;
                let status = response.status();
                let header = cache_header(&response);
                let body = response.into_body().collect().await?.to_bytes();
                let ms = started.elapsed().as_secs_f64() * 1000.0;
                if !status.is_success() {
                    bail!(
                        "GET {}: HTTP {status}: {}",
                        slot.name,
                        String::from_utf8_lossy(&body)
                    );
                }
                anyhow::Ok((ms, header))
            }
            .await;
            let mut m = out.lock().unwrap_or_else(|e| e.into_inner());
            match result {
                Ok((ms, header)) => {
                    m.get_ms.push(ms);
                    *m.headers.entry(format!("get:{header}")).or_default() += 1;
                }
                Err(e) => m.errors.push(format!("{e:#}")),
            }
            drop(m);
            next += sizes.get_period;
        }
    };
    futures::join!(cycles, gets);
}

/// A cluster-wide watch of kind `k` of `account` from now, until `until`; each event's
/// stamp is matched to the change issued with it.
async fn watch_kind(
    client: Client,
    account: usize,
    k: usize,
    until: Instant,
    issued: Issued,
    out: Arc<Mutex<Measured>>,
) -> Result<()> {
    let api: Api<DynamicObject> = Api::all_with(client, &api_resource(k));
    let list = api.list_metadata(&ListParams::default().limit(1)).await?;
    let mut rv = list.metadata.resource_version.unwrap_or_default();
    while Instant::now() < until {
        let params = kube::api::WatchParams::default()
            .timeout((until - Instant::now()).as_secs().clamp(1, 290) as u32);
        let mut stream = std::pin::pin!(api.watch(&params, &rv).await?);
        while let Some(event) = stream.try_next().await? {
            let at = Instant::now();
            let object = match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => o,
                WatchEvent::Bookmark(b) => {
                    rv = b.metadata.resource_version;
                    continue;
                }
                WatchEvent::Deleted(_) => continue,
                WatchEvent::Error(e) => bail!("watch of {}: {e:?}", KINDS[k].plural),
            };
            rv = object.metadata.resource_version.clone().unwrap_or(rv);
            let stamp = object
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("bench/stamp"))
                .and_then(|s| s.parse::<u64>().ok());
            let Some(stamp) = stamp else { continue };
            let sent = issued
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&(account, stamp));
            if let Some(sent) = sent {
                out.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .watch_ms
                    .push(at.duration_since(sent).as_secs_f64() * 1000.0);
            }
        }
    }
    Ok(())
}

/// Runs the load on `clients` (one per account; the first `watched` accounts watched) with
/// `churn`, for the window. Returns what it measured and the churn (its agents kept).
async fn run_load(
    clients: Vec<Client>,
    watched: usize,
    mut churn: Churn,
    sizes: Sizes,
) -> Result<(Measured, Churn)> {
    let out = Arc::new(Mutex::new(Measured::default()));
    let issued: Issued = Arc::default();
    let accounts = clients.len();
    let started = Instant::now();
    let until = started + sizes.window;
    let permits = Arc::new(Semaphore::new(sizes.clients.max(1)));
    let mut watches = Vec::new();
    for (account, client) in clients.iter().enumerate().take(watched) {
        for k in watched_kinds() {
            watches.push(tokio::spawn(watch_kind(
                client.clone(),
                account,
                k,
                until + Duration::from_secs(5),
                issued.clone(),
                out.clone(),
            )));
        }
    }
    // Let the watches start before the first change.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let readers: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(account, client)| {
            tokio::spawn(account_reads(
                client,
                account,
                sizes,
                until,
                permits.clone(),
                out.clone(),
            ))
        })
        .collect();
    let stamps = AtomicU64::new(0);
    let mut rng = StdRng::seed_from_u64(12);
    let per_tick = (accounts * sizes.objects) as f64 * sizes.churn_per_minute / 100.0 / 60.0
        * TICK.as_secs_f64();
    let mut owed = 0.0;
    let (mut changes, mut changes_watched) = (0u64, 0u64);
    while Instant::now() < until {
        owed += per_tick;
        while owed >= 1.0 {
            owed -= 1.0;
            let (account, object) = (
                rng.random_range(0..accounts),
                rng.random_range(0..sizes.objects),
            );
            let stamp = stamps.fetch_add(1, Ordering::Relaxed) + 1;
            let kind = fleet_objects::slot(object, sizes.namespaces).kind;
            if account < watched && watched_kinds().any(|k| k == kind) {
                issued
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert((account, stamp), Instant::now());
                changes_watched += 1;
            }
            churn.change(account, object, stamp, &sizes).await?;
            changes += 1;
        }
        tokio::time::sleep(TICK).await;
    }
    for reader in readers {
        reader.await?;
    }
    // The last changes' events: up to the watches' end.
    for watch in watches {
        if let Err(e) = watch.await? {
            out.lock()
                .unwrap_or_else(|e| e.into_inner())
                .errors
                .push(format!("{e:#}"));
        }
    }
    let mut measured = std::mem::take(&mut *out.lock().unwrap_or_else(|e| e.into_inner()));
    measured.changes = changes;
    measured.changes_watched = changes_watched;
    Ok((measured, churn))
}

/// Creates the baseline account's objects in the API server (its namespaces first).
async fn create_baseline(env: &Env, sizes: &Sizes) -> Result<()> {
    for n in 0..sizes.namespaces {
        let ns = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": fleet_objects::namespace(n) } });
        let request = kube::core::Request::new("/api/v1/namespaces")
            .create(&PostParams::default(), serde_json::to_vec(&ns)?)?;
        // Already there from an earlier side of the same run: fine.
        let _ = env.admin.request::<Value>(request).await;
    }
    futures::stream::iter(0..sizes.objects)
        .map(|i| async move {
            let slot = fleet_objects::slot(i, sizes.namespaces);
            let body = serde_json::to_vec(&fleet_objects::manifest(i, sizes.namespaces, 0))?;
            let request = kube::core::Request::new(KINDS[slot.kind].collection(&slot.namespace))
                .create(&PostParams::default(), body)?;
            env.admin
                .request::<Value>(request)
                .await
                .with_context(|| format!("create {} in {}", slot.name, slot.namespace))?;
            anyhow::Ok(())
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

fn cpu_of(window: &CpuWindow) -> (BTreeMap<String, f64>, f64) {
    let (per, _) = window.finish();
    let per: BTreeMap<String, f64> = per.into_iter().collect();
    let total = per.values().sum();
    (per, total)
}

pub async fn fleet(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let n = o.fleet_agents.max(1);
    let sizes = Sizes {
        objects: o.fleet_objects.max(1),
        namespaces: o.fleet_namespaces.max(1),
        cycle: Duration::from_secs_f64(o.fleet_cycle_secs.max(0.1)),
        get_period: Duration::from_secs_f64(o.fleet_get_period_secs.max(0.01)),
        churn_per_minute: o.fleet_churn_percent,
        window: Duration::from_secs(o.fleet_seconds.max(1)),
        clients: o.fleet_clients,
    };
    let watched = o.fleet_watch_accounts.clamp(1, n);

    // The fleet on one hub.
    let hub = env.tls_hub("fleet-hub").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let empty = hub.stats()?;
    let accounts: Vec<String> = (0..n).map(|i| format!("fleet-{i}")).collect();
    let started = Instant::now();
    let grpc = hub.grpc_addr;
    let connected: Vec<(FakeAgent, usize)> = futures::stream::iter(accounts.iter())
        .map(|account| connect_agent(env, grpc, account, &sizes))
        .buffered(CONNECTING)
        .try_collect()
        .await
        .with_context(|| hub.log_tail())?;
    let sync_secs = started.elapsed().as_secs_f64();
    let json_bytes: usize = connected.iter().map(|(_, b)| b).sum();
    let agents: Vec<FakeAgent> = connected.into_iter().map(|(a, _)| a).collect();
    let objects_total = n * sizes.objects;
    // Past the store's durable commit (at least every second) and its replay copy's drop.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let synced = hub.stats()?;
    let mut clients = Vec::with_capacity(n);
    for account in &accounts {
        let path = env.dir.join(format!("{account}.kubeconfig"));
        std::fs::write(&path, hub.kubeconfig(account, "fleet").await?)?;
        clients.push(client_for(&path).await?);
    }
    eprintln!(
        "[bench] fleet: {n} agents and {objects_total} objects synced in {}; load for {} s",
        secs(sync_secs),
        sizes.window.as_secs()
    );
    let bench_pid = std::process::id();
    let window = CpuWindow::start(vec![("hub".into(), hub.pid()), ("bench".into(), bench_pid)]);
    let churn = Churn::Agents {
        agents,
        accounts: accounts.clone(),
        rvs: vec![1; n],
    };
    // The hub's RSS through the load, beside it.
    let (done_tx, done) = tokio::sync::watch::channel(false);
    let load = async {
        let result = run_load(clients, watched, churn, sizes).await;
        let _ = done_tx.send(true);
        result
    };
    let (loaded_run, trajectory) = tokio::join!(load, trajectory::sample(&hub, sizes.window, done));
    let (fleet, churn) = loaded_run?;
    eprintln!("[bench] fleet: {}", trajectory.text());
    let (fleet_cpu, _) = cpu_of(&window);
    let loaded = hub.stats()?;
    drop(churn);
    drop(hub);

    // The baseline: one account's objects in the API server, the same load of one account.
    eprintln!("[bench] fleet baseline: one account's objects in the API server");
    create_baseline(env, &sizes).await?;
    let direct_client = client_for(&env.agent_kubeconfig).await?;
    let mut pids = env.control_plane_pids();
    pids.push(("bench".into(), bench_pid));
    let window = CpuWindow::start(pids);
    let direct_sizes = Sizes {
        window: sizes.window.min(BASELINE_WINDOW),
        ..sizes
    };
    let (direct, _) = run_load(
        vec![direct_client.clone()],
        1,
        Churn::ApiServer(direct_client),
        direct_sizes,
    )
    .await?;
    let (direct_cpu, _) = cpu_of(&window);

    report(
        rows,
        o,
        n,
        watched,
        &sizes,
        Figures {
            empty_kib: empty.rss_kib,
            synced_kib: synced.rss_kib,
            loaded_kib: loaded.rss_kib,
            trajectory,
            json_bytes,
            objects_total,
            sync_secs,
            fleet,
            fleet_cpu,
            direct,
            direct_cpu,
            direct_window: direct_sizes.window,
        },
    )
}
