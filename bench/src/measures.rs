//! The seven measures of issue 6, the Kubernetes API proxy's ([`proxy`], measure 8) and
//! reads through it as Clouddriver makes them ([`reads`], measure 9).
//! Each appends rows (this system beside its baseline, measured in the same run) to the
//! report.

pub mod fleet;
pub mod fleet_objects;
pub mod proxy;
pub mod reads;
pub mod replicas;
pub mod soak;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
    runtime::watcher,
};
use prost::Message as _;
use rand::Rng as _;
use scale_agent_proto::v1::{self as pb, agent_message::Kind as Msg};
use serde_json::{Value, json};

use crate::{
    Options,
    env::{Env, HubProc, payload},
    fake::{FakeAgent, object_event},
    floor,
    procs::{self, CpuWindow, Proc, proc_stats},
    report::{Percentiles, Row, bytes, mib, ms, secs},
};

const LONG: Duration = Duration::from_secs(900);
const BYTES_SENT: &str = "scale_agent_agent_bytes_sent_total";
const EVENTS_SENT: &str = "scale_agent_agent_events_sent_total";
const LISTS: &str = "scale_agent_agent_lists_total";
const RESUMES: &str = "scale_agent_agent_watch_resumes_total";

/// Observations of (name, resourceVersion) with the instant each was first seen.
type Seen = Arc<Mutex<Vec<(String, u64, Instant)>>>;

fn rv_num(rv: Option<&str>) -> u64 {
    rv.and_then(|r| r.parse().ok()).unwrap_or(0)
}

fn record(seen: &Seen, name: String, rv: u64, at: Instant) {
    if let Ok(mut s) = seen.lock() {
        s.push((name, rv, at));
    }
}

/// For each update (name, rv, issued at): milliseconds until an observation of that name
/// with a resourceVersion at least rv; None when never seen.
/// One update the bench made: the object's name, the resourceVersion the API server gave
/// it, and when the PATCH was issued.
type Update = (String, u64, Instant);

/// Patches `names` round-robin, `n` times at `rate` per second, each patch distinct
/// (`seq: <tag><i>`; a patch that changes nothing makes no event), and returns the updates.
async fn paced_updates(
    api: &Api<ConfigMap>,
    names: &[String],
    n: usize,
    rate: f64,
    tag: &str,
) -> Result<Vec<Update>> {
    let period = Duration::from_secs_f64(1.0 / rate.max(0.1));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        tokio::time::sleep_until((started + period * i as u32).into()).await;
        let api = api.clone();
        let name = names[i % names.len().max(1)].clone();
        let patch = json!({ "data": { "seq": format!("{tag}{i}") } });
        tasks.push(tokio::spawn(async move {
            let issued = Instant::now();
            let cm = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            anyhow::Ok((
                name,
                rv_num(cm.metadata.resource_version.as_deref()),
                issued,
            ))
        }));
    }
    let mut updates = Vec::with_capacity(n);
    for task in tasks {
        updates.push(task.await??);
    }
    Ok(updates)
}

/// Waits until every watch in `seen` has delivered every update, or `timeout` passed.
async fn wait_delivered(updates: &[Update], seen: &[&Seen], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if seen.iter().all(|s| latencies(updates, s).1 == 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn latencies(updates: &[(String, u64, Instant)], seen: &Seen) -> (Vec<f64>, usize) {
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let mut by_name: HashMap<&str, Vec<(u64, Instant)>> = HashMap::new();
    for (name, rv, at) in &seen {
        by_name.entry(name).or_default().push((*rv, *at));
    }
    let mut out = Vec::new();
    let mut missed = 0;
    for (name, rv, issued) in updates {
        let first = by_name.get(name.as_str()).and_then(|obs| {
            obs.iter()
                .filter(|(orv, _)| orv >= rv)
                .map(|(_, at)| *at)
                .min()
        });
        match first {
            Some(at) => out.push(at.saturating_duration_since(*issued).as_secs_f64() * 1000.0),
            None => missed += 1,
        }
    }
    (out, missed)
}

/// A kube-runtime watcher of the namespace's ConfigMaps recording every applied object.
fn spawn_watcher(
    env: &Env,
    namespace: &str,
    seen: Seen,
    synced: Arc<AtomicBool>,
    json_bytes: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let api = Api::<ConfigMap>::namespaced(env.admin.clone(), namespace);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Ok(Some(event)) = stream.try_next().await {
            let now = Instant::now();
            match event {
                watcher::Event::Apply(o) => {
                    json_bytes.fetch_add(
                        serde_json::to_vec(&o).map(|v| v.len()).unwrap_or(0),
                        Ordering::Relaxed,
                    );
                    let rv = rv_num(o.metadata.resource_version.as_deref());
                    record(&seen, o.metadata.name.unwrap_or_default(), rv, now);
                }
                watcher::Event::InitDone => synced.store(true, Ordering::SeqCst),
                _ => {}
            }
        }
    })
}

// ------------------------------------------------------------------ 1. latency

pub async fn latency(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let ns = env.namespace("bench-latency").await?;
    let k = o.latency_objects.max(1);
    env.create_configmaps(&ns, "lat", k, 16, 4).await?;
    let hub = env.hub("latency-hub").await?;
    let account = "bench-latency";
    let mut agent = env
        .agent(
            "latency-agent",
            &hub,
            json!([env.account(account, &ns, &["configmaps"])]),
        )
        .await?;
    agent.wait_ready(LONG).await?;
    hub.wait_objects(account, k as u64, LONG).await?;

    let watch_seen: Seen = Arc::default();
    let hub_seen: Seen = Arc::default();
    let synced = Arc::new(AtomicBool::new(false));
    let watch = spawn_watcher(env, &ns, watch_seen.clone(), synced.clone(), Arc::default());
    let stop = Arc::new(AtomicBool::new(false));
    let polls = Arc::new(AtomicUsize::new(0));
    let poller = {
        let (stop, polls, seen) = (stop.clone(), polls.clone(), hub_seen.clone());
        let (addr, path) = (
            hub.http_addr,
            format!("/api/v1/accounts/{account}/objects?kind=configmaps&namespace={ns}"),
        );
        let interval = o.poll_interval;
        tokio::spawn(async move {
            let mut last: HashMap<String, u64> = HashMap::new();
            while !stop.load(Ordering::SeqCst) {
                if let Ok((200, body)) =
                    procs::http_with_token(addr, "GET", &path, None, Some(procs::API_TOKEN)).await
                {
                    let now = Instant::now();
                    polls.fetch_add(1, Ordering::Relaxed);
                    if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                        for item in v["items"].as_array().into_iter().flatten() {
                            let name = item["metadata"]["name"].as_str().unwrap_or_default();
                            let rv = rv_num(item["metadata"]["resourceVersion"].as_str());
                            if last.get(name) != Some(&rv) {
                                last.insert(name.to_string(), rv);
                                record(&seen, name.to_string(), rv, now);
                            }
                        }
                    }
                }
                tokio::time::sleep(interval).await;
            }
        })
    };
    crate::procs::wait_for(
        "the watcher's initial list",
        LONG,
        Duration::from_millis(10),
        || async { Ok(synced.load(Ordering::SeqCst).then_some(())) },
    )
    .await?;

    // A steady stream of updates at a fixed rate, each carrying its timestamp.
    let api = Api::<ConfigMap>::namespaced(env.admin.clone(), &ns);
    let period = Duration::from_secs_f64(1.0 / o.latency_rate.max(0.1));
    let started = Instant::now();
    let poll_started = polls.load(Ordering::Relaxed);
    let mut tasks = Vec::new();
    for i in 0..o.latency_updates {
        tokio::time::sleep_until((started + period * i as u32).into()).await;
        let api = api.clone();
        let name = format!("lat-{}", i % k);
        tasks.push(tokio::spawn(async move {
            let issued = Instant::now();
            let unix_nanos = k8s_openapi::jiff::Timestamp::now().as_nanosecond();
            let patch = json!({ "data": { "seq": i.to_string(), "updatedAtUnixNanos": unix_nanos.to_string() } });
            let cm = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            anyhow::Ok((name, rv_num(cm.metadata.resource_version.as_deref()), issued))
        }));
    }
    let mut updates = Vec::new();
    for t in tasks {
        updates.push(t.await??);
    }
    let sent_secs = started.elapsed().as_secs_f64();
    // Wait until both observers saw every update (or 30 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let (w, wm) = latencies(&updates, &watch_seen);
        let (h, hm) = latencies(&updates, &hub_seen);
        if wm == 0 && hm == 0 && !w.is_empty() && !h.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let observed_secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let _ = poller.await;
    watch.abort();
    let poll_cycle_ms =
        observed_secs * 1000.0 / (polls.load(Ordering::Relaxed) - poll_started).max(1) as f64;
    let (hub_lat, hub_missed) = latencies(&updates, &hub_seen);
    let (watch_lat, watch_missed) = latencies(&updates, &watch_seen);
    let hub_p = Percentiles::of(&hub_lat);
    let watch_p = Percentiles::of(&watch_lat);

    // Clouddriver's way: a full LIST every period, at a random phase. An update shows when
    // the next LIST after it has completed.
    let mut list_ms = Vec::new();
    for _ in 0..5 {
        list_ms.push(env.list_configmaps(&ns).await?.2.as_secs_f64() * 1000.0);
    }
    let list_p = Percentiles::of(&list_ms);
    let period_ms = o.list_period.as_secs_f64() * 1000.0;
    let mut rng = rand::rng();
    let mut poll_lat = Vec::new();
    for _ in 0..200 {
        let phase = rng.random_range(0.0..period_ms);
        for (_, _, issued) in &updates {
            let t = issued.duration_since(started).as_secs_f64() * 1000.0;
            let next = phase + ((t - phase) / period_ms).ceil().max(0.0) * period_ms;
            poll_lat.push(next - t + list_p.p50);
        }
    }
    let poll_p = Percentiles::of(&poll_lat);
    let title = format!(
        "Change-to-hub latency ({} ConfigMap updates at {}/s)",
        o.latency_updates, o.latency_rate
    );
    let values = json!({
        "updates": o.latency_updates, "rate_per_sec": o.latency_rate, "objects": k,
        "sent_seconds": sent_secs,
        "hub_ms": hub_p, "hub_missed": hub_missed,
        "raw_watch_ms": watch_p, "raw_watch_missed": watch_missed,
        "hub_poll_cycle_ms": poll_cycle_ms, "hub_poll_sleep_ms": o.poll_interval.as_secs_f64() * 1000.0,
        "list_every_ms": period_ms, "list_duration_ms": list_p, "list_every_ms_latency": poll_p,
    });
    rows.push(Row {
        id: "latency-watch".into(),
        measure: 1,
        title: title.clone(),
        system: hub_p.display_ms(),
        baseline_name: "raw kube-runtime watcher in the bench process (the floor)".into(),
        baseline: watch_p.display_ms(),
        note: format!(
            "from PATCH issued to the new resourceVersion visible at the hub's HTTP API, polled every {:.1} ms on average (adds about half of that); missed: hub {hub_missed}, watch {watch_missed}",
            poll_cycle_ms
        ),
        values: values.clone(),
    });
    rows.push(Row {
        id: "latency-list".into(),
        measure: 1,
        title,
        system: hub_p.display_ms(),
        baseline_name: format!(
            "Clouddriver-style full LIST every {:.0} s",
            o.list_period.as_secs_f64()
        ),
        baseline: poll_p.display_ms(),
        note: format!(
            "computed from the same update instants: next LIST at a random phase (200 phases) + one measured LIST of the same objects ({}); Clouddriver lists every kind, so this is a lower bound",
            ms(list_p.p50)
        ),
        values,
    });
    drop(agent);
    drop(hub);
    Ok(())
}

// ------------------------------------------------------------------ 2. throughput

/// Returns a sentence naming the bottleneck.
pub async fn throughput(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<String> {
    let ns = env.namespace("bench-saturation").await?;
    let hub = env.hub("saturation-hub").await?;
    let account = "bench-saturation";
    let mut agent = env
        .agent(
            "saturation-agent",
            &hub,
            json!([env.account(account, &ns, &["configmaps"])]),
        )
        .await?;
    agent.wait_ready(LONG).await?;
    let seen: Seen = Arc::default();
    let synced = Arc::new(AtomicBool::new(false));
    let json_bytes = Arc::new(AtomicUsize::new(0));
    let watch = spawn_watcher(env, &ns, seen.clone(), synced.clone(), json_bytes.clone());
    crate::procs::wait_for(
        "the watcher's initial list",
        LONG,
        Duration::from_millis(10),
        || async { Ok(synced.load(Ordering::SeqCst).then_some(())) },
    )
    .await?;
    let n = o.saturation_objects;
    let bytes0 = agent.metric(BYTES_SENT).await?;
    let events0 = agent.metric(EVENTS_SENT).await?;
    let mut pids = env.control_plane_pids();
    pids.push(("agent".into(), agent.pid()));
    pids.push(("hub".into(), hub.pid()));
    pids.push((
        "bench (writers, watcher, poller)".into(),
        std::process::id(),
    ));
    let cpu = CpuWindow::start(pids);
    let started = Instant::now();
    let writing = env.create_configmaps(&ns, "sat", n, o.object_bytes, o.writers);
    let (writes, hub_done) = tokio::join!(writing, hub.wait_objects(account, n as u64, LONG));
    let writes = writes?;
    let hub_secs = hub_done?.duration_since(started).as_secs_f64();
    let watch_done =
        crate::procs::wait_for("the watcher", LONG, Duration::from_millis(5), || async {
            let s = seen
                .lock()
                .map(|s| (s.len(), s.iter().map(|x| x.2).max()))
                .unwrap_or((0, None));
            Ok((s.0 >= n).then_some(s.1).flatten())
        })
        .await?;
    let watch_secs = watch_done.duration_since(started).as_secs_f64();
    let (cpu_used, wall) = cpu.finish();
    watch.abort();
    let sent_bytes = agent.metric(BYTES_SENT).await? - bytes0;
    let events = agent.metric(EVENTS_SENT).await? - events0;
    let write_rate = n as f64 / writes.as_secs_f64();
    let hub_rate = n as f64 / hub_secs;
    let watch_rate = n as f64 / watch_secs;
    let mut by_cpu = cpu_used.clone();
    by_cpu.sort_by(|a, b| b.1.total_cmp(&a.1));
    let cpu_text = by_cpu
        .iter()
        .map(|(name, s)| format!("{name} {:.2} cores", s / wall))
        .collect::<Vec<_>>()
        .join(", ");
    let total_cores: f64 = cpu_used.iter().map(|(_, s)| s / wall).sum();
    let (top, top_secs) = by_cpu.first().cloned().unwrap_or_default();
    let bottleneck = if hub_rate >= 0.85 * write_rate {
        format!(
            "at saturation the hub ingests as fast as the API server accepts writes ({hub_rate:.0} vs {write_rate:.0} objects/s): the API server (with etcd) is the bottleneck; {top} used the most CPU ({:.2} of {} cores; all processes {total_cores:.2})",
            top_secs / wall,
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        )
    } else {
        format!(
            "the hub ingests slower than the API server accepts writes ({hub_rate:.0} vs {write_rate:.0} objects/s): the agent/hub path is the bottleneck; {top} used the most CPU ({:.2} cores; all processes {total_cores:.2})",
            top_secs / wall
        )
    };
    let values = json!({
        "objects": n, "object_bytes": o.object_bytes, "writers": o.writers,
        "api_write_per_sec": write_rate, "hub_ingest_per_sec": hub_rate, "raw_watch_per_sec": watch_rate,
        "cpu_cores": cpu_used.iter().map(|(n, s)| (n.clone(), s / wall)).collect::<HashMap<_, _>>(),
        "agent_bytes_sent": sent_bytes, "agent_events_sent": events,
    });
    rows.push(Row {
        id: "throughput-live".into(),
        measure: 2,
        title: format!(
            "Events/s on one stream at saturation ({n} creates of ~{} B, {} writers)",
            o.object_bytes, o.writers
        ),
        system: format!("{hub_rate:.0} events/s into the hub"),
        baseline_name: "raw watch of the same creates".into(),
        baseline: format!("{watch_rate:.0} events/s"),
        note: format!("API server accepted {write_rate:.0} creates/s; CPU: {cpu_text}"),
        values,
    });
    let watch_bytes = json_bytes.load(Ordering::Relaxed) as f64 / n.max(1) as f64;
    rows.push(Row {
        id: "wire-bytes".into(),
        measure: 5,
        title: "Bytes on the wire per event (agent → hub)".into(),
        system: format!("{} per event", bytes(sent_bytes / events.max(1.0))),
        baseline_name: "the object's JSON as the watch delivers it (with managedFields)".into(),
        baseline: format!("{} per object", bytes(watch_bytes)),
        note: format!(
            "agent {BYTES_SENT} (protobuf encoded length of every message; gRPC, HTTP/2 and TLS framing not included) / {EVENTS_SENT} over the saturation run ({events:.0} events); no compression"
        ),
        values: json!({ "agent_bytes": sent_bytes, "agent_events": events, "watch_json_bytes_per_object": watch_bytes }),
    });
    drop(agent);
    drop(hub);
    Ok(bottleneck)
}

/// What limited the synthetic stream, in a sentence.
#[derive(Debug, Default)]
pub struct StreamCeiling {
    pub events_per_sec: f64,
    pub hub_cores: f64,
    pub source_cores: f64,
}

impl StreamCeiling {
    pub fn sentence(&self) -> String {
        let limit = if self.hub_cores >= 0.8 {
            "the hub's CPU (decode, cache apply, redb commit per batch)"
        } else if self.source_cores >= 0.8 {
            "the synthetic source's own CPU (encoding, TLS)"
        } else {
            "the ack round trips (the window of unacknowledged messages), not CPU"
        };
        format!(
            "The agent→hub stream alone (synthetic source) reaches {:.0} events/s, limited by {limit} (hub {:.2} cores, source {:.2} cores).",
            self.events_per_sec, self.hub_cores, self.source_cores
        )
    }
}

/// One run of the synthetic source against `hub`: events/s acknowledged, and the CPU of the
/// hub and of the bench (the fake agent) over it.
struct SyntheticRun {
    events_per_sec: f64,
    max_unacked: u64,
    /// (process, CPU seconds) over `wall` seconds.
    cpu_used: Vec<(String, f64)>,
    wall: f64,
}

impl SyntheticRun {
    fn cores(&self, prefix: &str) -> f64 {
        self.cpu_used
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .map(|(_, s)| s / self.wall)
            .sum::<f64>()
    }

    fn cpu_text(&self) -> String {
        self.cpu_used
            .iter()
            .map(|(name, s)| format!("{name} {:.2} cores", s / self.wall))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn synthetic_events(o: &Options, account: &str) -> Vec<pb::ObjectEvent> {
    let names = 1000.min(o.synthetic_events.max(1));
    (0..o.synthetic_events)
        .map(|i| {
            object_event(
                account,
                &format!("cm-{}", i % names),
                i as u64 + 1,
                o.object_bytes,
            )
        })
        .collect()
}

/// A fake agent (certificate `identity`) registers `account` on `hub` and sends `events`
/// as fast as acks allow.
async fn synthetic_run(
    env: &Env,
    hub: &HubProc,
    identity: &str,
    account: &str,
    events: Vec<pb::ObjectEvent>,
) -> Result<SyntheticRun> {
    let cert = env.pki.ca.client(identity, &[])?;
    let mut fake = FakeAgent::connect(
        hub.grpc_addr,
        &env.pki.ca.cert_pem,
        &cert.cert_pem,
        &cert.key_pem,
        "synthetic-0",
    )
    .await?;
    fake.register(account, "https://synthetic.bench:443")
        .await?;
    fake.synced(LONG).await?;
    let count = events.len();
    let cpu = CpuWindow::start(vec![
        ("hub".into(), hub.pid()),
        ("bench (fake agent)".into(), std::process::id()),
    ]);
    let started = Instant::now();
    for ev in events {
        fake.send(Msg::Object(ev)).await?;
    }
    fake.synced(LONG).await?;
    let secs = started.elapsed().as_secs_f64();
    let (cpu_used, wall) = cpu.finish();
    Ok(SyntheticRun {
        events_per_sec: count as f64 / secs,
        max_unacked: fake.max_unacked,
        cpu_used,
        wall,
    })
}

/// The stream alone: a fake agent sending ObjectEvents as fast as acks allow.
pub async fn synthetic(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<StreamCeiling> {
    let hub = env.hub("synthetic-hub").await?;
    let account = "bench-synthetic";
    let events = synthetic_events(o, account);
    // Baseline: protobuf encoding and decoding of the same messages, in memory.
    let sample = &events[..events.len().min(20_000)];
    let enc_started = Instant::now();
    let mut buf = Vec::with_capacity(4096);
    for (i, ev) in sample.iter().enumerate() {
        buf.clear();
        pb::AgentMessage {
            seq: i as u64,
            kind: Some(Msg::Object(ev.clone())),
        }
        .encode(&mut buf)?;
        let _ = pb::AgentMessage::decode(buf.as_slice())?;
    }
    let codec_rate = sample.len() as f64 / enc_started.elapsed().as_secs_f64();
    let run = synthetic_run(env, &hub, "bench-synthetic", account, events).await?;
    let rate = run.events_per_sec;
    rows.push(Row {
        id: "throughput-synthetic".into(),
        measure: 2,
        title: format!(
            "Stream alone: synthetic source → hub ({} ObjectEvents of ~{} B, max_unacked {})",
            o.synthetic_events, o.object_bytes, run.max_unacked
        ),
        system: format!("{rate:.0} events/s acknowledged"),
        baseline_name: "protobuf encode + decode of the same messages, one thread, in memory".into(),
        baseline: format!("{codec_rate:.0} messages/s"),
        note: format!("fake agent on the generated client over mTLS, hub as a process (cache + redb store in the work directory); CPU: {}", run.cpu_text()),
        values: json!({ "events": o.synthetic_events, "events_per_sec": rate, "codec_per_sec": codec_rate,
            "cpu_cores": run.cpu_used.iter().map(|(n, s)| (n.clone(), s / run.wall)).collect::<HashMap<_, _>>() }),
    });
    drop(hub);
    Ok(StreamCeiling {
        events_per_sec: rate,
        hub_cores: run.cores("hub"),
        source_cores: run.cores("bench"),
    })
}

/// Measure 11: events per second into a hub on PostgreSQL (`--store postgres`, a
/// PostgreSQL from the e2e harness on loopback) beside the same hub on its embedded store,
/// the synthetic source of measure 2 sending the same events to each.
pub async fn store_backends(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let account = "bench-store";
    let embedded = {
        let hub = env.hub("store-embedded-hub").await?;
        synthetic_run(
            env,
            &hub,
            "bench-store-embedded",
            account,
            synthetic_events(o, account),
        )
        .await?
    };
    let postgres = scale_agent_e2e::postgres::PostgresServer::start().await?;
    let on_postgres = {
        let hub = env
            .hub_on_postgres("store-postgres-hub", &postgres.url())
            .await?;
        synthetic_run(
            env,
            &hub,
            "bench-store-postgres",
            account,
            synthetic_events(o, account),
        )
        .await?
    };
    drop(postgres);
    rows.push(Row {
        id: "store-postgres-events".into(),
        measure: 11,
        title: format!(
            "Events into the hub on PostgreSQL (synthetic source, {} ObjectEvents of ~{} B, max_unacked {})",
            o.synthetic_events, o.object_bytes, on_postgres.max_unacked
        ),
        system: format!("{:.0} events/s acknowledged", on_postgres.events_per_sec),
        baseline_name: "the same hub on its embedded store (redb in the work directory)".into(),
        baseline: format!("{:.0} events/s acknowledged", embedded.events_per_sec),
        note: format!(
            "PostgreSQL 15 from the e2e harness on loopback (which runs it with fsync=off: the hub's durable commits do not wait for a disk there, while redb's do), one transaction per group of queued changes; CPU on PostgreSQL (PostgreSQL's own processes not counted): {}; CPU embedded: {}",
            on_postgres.cpu_text(),
            embedded.cpu_text()
        ),
        values: json!({ "events": o.synthetic_events,
            "postgres_events_per_sec": on_postgres.events_per_sec,
            "embedded_events_per_sec": embedded.events_per_sec }),
    });
    Ok(())
}

// ------------------------------------------------------------------ 3, 4, 5: sync, resume, footprint

/// Starts the watch-floor process on `namespace` and waits for its initial lists.
async fn floor_process(
    env: &Env,
    name: &str,
    namespace: &str,
    kinds: &[(&str, &str, &str, &str)],
) -> Result<Proc> {
    let kubeconfig = env.agent_kubeconfig.display().to_string();
    let mut p = Proc::spawn(
        name,
        &env.exe,
        "watch-floor",
        &[],
        &[
            (floor::KUBECONFIG_ENV, kubeconfig),
            (floor::NAMESPACE_ENV, namespace.to_string()),
            (floor::KINDS_ENV, floor::kinds_env(kinds)),
        ],
        env.dir.join(format!("{name}.log")),
    )?;
    let deadline = Instant::now() + LONG;
    loop {
        p.ensure_running()?;
        if std::fs::read_to_string(&p.log)
            .unwrap_or_default()
            .contains(floor::SYNCED_MARKER)
        {
            return Ok(p);
        }
        if Instant::now() > deadline {
            anyhow::bail!("the watch floor did not sync");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// RSS and CPU share of a process over an idle window (CPU time has a resolution of one
/// clock tick, 10 ms).
async fn idle(pid: u32, window: Duration) -> Result<(u64, f64)> {
    let before = proc_stats(pid)?;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let after = proc_stats(pid)?;
    Ok((
        after.rss_kib,
        (after.cpu_secs - before.cpu_secs) / started.elapsed().as_secs_f64(),
    ))
}

fn footprint_text(rss_kib: u64, cpu: f64, window: Duration) -> String {
    if cpu <= 0.0 {
        // Not one 10 ms clock tick in the window.
        format!(
            "RSS {}, CPU < {:.2} %",
            mib(rss_kib),
            1.0 / window.as_secs_f64().max(0.01)
        )
    } else {
        format!("RSS {}, CPU {:.2} %", mib(rss_kib), cpu * 100.0)
    }
}

pub async fn idle_footprint(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let ns = env.namespace("bench-idle").await?;
    env.create_configmaps(&ns, "idle", 10, o.object_bytes, 4)
        .await?;
    let hub = env.hub("idle-hub").await?;
    let kinds: Vec<&str> = floor::TEN_KINDS.iter().map(|k| k.2).collect();
    let mut agent = env
        .agent(
            "idle-agent",
            &hub,
            json!([env.account("bench-idle", &ns, &kinds)]),
        )
        .await?;
    agent.wait_ready(LONG).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let window = Duration::from_secs(o.idle_seconds.max(1));
    let (agent_rss, agent_cpu) = idle(agent.pid(), window).await?;
    let floor = floor_process(env, "idle-floor", &ns, floor::TEN_KINDS).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (floor_rss, floor_cpu) = idle(floor.pid(), window).await?;
    rows.push(Row {
        id: "footprint-idle".into(),
        measure: 5,
        title: "Agent idle, 10 kinds watched (one namespace, 10 ConfigMaps)".into(),
        system: footprint_text(agent_rss, agent_cpu, window),
        baseline_name: "process with kube-runtime reflectors of the same 10 kinds".into(),
        baseline: footprint_text(floor_rss, floor_cpu, window),
        note: format!("agent as a process (RSS from /proc/<pid>/status, CPU over {} s idle)", window.as_secs()),
        values: json!({ "agent_rss_kib": agent_rss, "agent_cpu_share": agent_cpu, "floor_rss_kib": floor_rss, "floor_cpu_share": floor_cpu }),
    });
    drop(floor);
    drop(agent);
    drop(hub);
    Ok(())
}

/// Initial sync of each size; for the largest, also footprint with objects, hub memory per
/// object, and resume versus relist.
pub async fn sync_and_resume(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let mut sizes = o.sync_sizes.clone();
    sizes.sort_unstable();
    let largest = sizes.last().copied().unwrap_or(0);
    // (objects, hub VmRSS and RssAnon growth in KiB) per sync size, for the slope.
    let mut growth: Vec<(usize, u64, u64)> = Vec::new();
    for n in sizes {
        let ns = env.namespace(&format!("bench-sync-{n}")).await?;
        let created = env
            .create_configmaps(&ns, "sync", n, o.object_bytes, o.writers)
            .await?;
        // Baseline: a plain paginated LIST of the same objects (best of two, warm).
        let (count, list_bytes, first) = env.list_configmaps(&ns).await?;
        let (_, _, second) = env.list_configmaps(&ns).await?;
        let list_secs = first.min(second).as_secs_f64();
        anyhow::ensure!(count == n, "listed {count} of {n} ConfigMaps");
        let mut hub = env.hub(&format!("sync-{n}-hub")).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let hub_before = hub.stats()?;
        let account = format!("bench-sync-{n}");
        let started = Instant::now();
        let mut agent = env
            .agent(
                &format!("sync-{n}-agent"),
                &hub,
                json!([env.account(&account, &ns, &["configmaps"])]),
            )
            .await?;
        let done = hub.wait_objects(&account, n as u64, LONG).await?;
        let sync_secs = done.duration_since(started).as_secs_f64();
        rows.push(Row {
            id: format!("sync-{n}"),
            measure: 3,
            title: format!("Initial sync of {n} ConfigMaps of ~{} B (agent start → hub holds all)", o.object_bytes),
            system: format!("{} ({:.0} objects/s)", secs(sync_secs), n as f64 / sync_secs),
            baseline_name: "plain paginated LIST (500 per page) of the same objects".into(),
            baseline: format!("{} ({:.0} objects/s)", secs(list_secs), n as f64 / list_secs),
            note: format!(
                "includes the agent process start, discovery, LIST, stream and hub store; objects created at {:.0}/s",
                n as f64 / created.as_secs_f64()
            ),
            values: json!({ "objects": n, "sync_seconds": sync_secs, "list_seconds": list_secs, "list_json_bytes": list_bytes }),
        });
        agent.wait_ready(LONG).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Hub memory per cached object: 1 s after the sync, and 3 s after, once the hub's
        // store has made the snapshot durable (a durable commit at least every second, made
        // by a task that runs every second) and let go of the copy of its changes it keeps
        // until then.
        let hub_after = hub.stats()?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let hub_settled = hub.stats()?;
        let growth_kib = |after: &crate::procs::ProcStats| {
            (
                after.rss_kib.saturating_sub(hub_before.rss_kib),
                after.rss_anon_kib.saturating_sub(hub_before.rss_anon_kib),
            )
        };
        let (settled_rss, settled_anon) = growth_kib(&hub_settled);
        growth.push((n, settled_rss, settled_anon));
        if n != largest {
            continue;
        }
        let per_object = |kib: u64| kib as f64 * 1024.0 / n as f64;
        let (after_rss, after_anon) = growth_kib(&hub_after);
        let json_per_object = list_bytes as f64 / n as f64;
        let slope = memory_slope(&growth);
        let slope_text = slope
            .map(|(small, rss, anon)| {
                format!(
                    "; 3 s after, slope from {small} to {n} objects: {} per object ({} anonymous)",
                    bytes(rss),
                    bytes(anon)
                )
            })
            .unwrap_or_default();
        rows.push(Row {
            id: "hub-memory".into(),
            measure: 5,
            title: format!("Hub RSS per cached object ({n} ConfigMaps)"),
            system: format!(
                "{} per object 1 s after the sync, {} 3 s after (RSS {} → {} → {}; anonymous {} and {} per object{slope_text})",
                bytes(per_object(after_rss)),
                bytes(per_object(settled_rss)),
                mib(hub_before.rss_kib),
                mib(hub_after.rss_kib),
                mib(hub_settled.rss_kib),
                bytes(per_object(after_anon)),
                bytes(per_object(settled_anon)),
            ),
            baseline_name: "the object's JSON size in a LIST".into(),
            baseline: format!("{} per object", bytes(json_per_object)),
            note: "hub as a process: VmRSS (and RssAnon, without the executable's pages the sync touched) before the agent connected, and 1 s and 3 s after it held all objects (by 3 s the store has made the snapshot durable and dropped the copy of its changes it kept until then), over the objects: the object in memory, redb's page cache of the store, allocator overhead, what the process first touches for an agent; the slope, with two sync sizes, is the difference in growth 3 s after over the difference in objects, without what does not grow with the objects".into(),
            values: json!({ "objects": n, "hub_rss_before_kib": hub_before.rss_kib, "hub_rss_after_kib": hub_after.rss_kib,
                "hub_rss_settled_kib": hub_settled.rss_kib,
                "hub_rss_anon_before_kib": hub_before.rss_anon_kib, "hub_rss_anon_after_kib": hub_after.rss_anon_kib,
                "hub_rss_anon_settled_kib": hub_settled.rss_anon_kib,
                "hub_bytes_per_object": per_object(after_rss), "hub_anon_bytes_per_object": per_object(after_anon),
                "hub_settled_bytes_per_object": per_object(settled_rss), "hub_settled_anon_bytes_per_object": per_object(settled_anon),
                "hub_settled_growth_kib_per_size": growth.iter().map(|(n, rss, anon)| json!({ "objects": n, "rss_kib": rss, "rss_anon_kib": anon })).collect::<Vec<_>>(),
                "hub_slope_bytes_per_object": slope.map(|s| s.1), "hub_anon_slope_bytes_per_object": slope.map(|s| s.2),
                "json_bytes_per_object": json_per_object }),
        });
        // Agent footprint with the objects watched, against the reflector floor.
        let window = Duration::from_secs(o.idle_seconds.max(1));
        let (agent_rss, agent_cpu) = idle(agent.pid(), window).await?;
        let floor_proc =
            floor_process(env, &format!("sync-{n}-floor"), &ns, &floor::TEN_KINDS[..1]).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (floor_rss, floor_cpu) = idle(floor_proc.pid(), window).await?;
        drop(floor_proc);
        rows.push(Row {
            id: "footprint-objects".into(),
            measure: 5,
            title: format!("Agent with {n} ConfigMaps watched, idle"),
            system: footprint_text(agent_rss, agent_cpu, window),
            baseline_name: "process with a kube-runtime reflector of the same ConfigMaps".into(),
            baseline: footprint_text(floor_rss, floor_cpu, window),
            note: format!("CPU over {} s idle after the sync", window.as_secs()),
            values: json!({ "objects": n, "agent_rss_kib": agent_rss, "agent_cpu_share": agent_cpu, "floor_rss_kib": floor_rss, "floor_cpu_share": floor_cpu }),
        });
        resume(env, o, &mut hub, &agent, &ns, &account, n, rows).await?;
    }
    Ok(())
}

/// Hub memory per object between the two largest sync sizes: (the smaller size, VmRSS
/// bytes per object, RssAnon bytes per object), from (objects, VmRSS growth KiB, RssAnon
/// growth KiB) per size, sorted by size; `None` with fewer than two sizes.
fn memory_slope(growth: &[(usize, u64, u64)]) -> Option<(usize, f64, f64)> {
    let [
        ..,
        (small, rss_small, anon_small),
        (large, rss_large, anon_large),
    ] = growth
    else {
        return None;
    };
    let objects = large.checked_sub(*small).filter(|d| *d > 0)? as f64;
    let per_object = |a: u64, b: u64| (b as f64 - a as f64) * 1024.0 / objects;
    Some((
        *small,
        per_object(*rss_small, *rss_large),
        per_object(*anon_small, *anon_large),
    ))
}

/// Whether the hub holds the account's ConfigMaps up to `rv` with `n` objects.
async fn hub_consistent(hub: &HubProc, account: &str, n: usize, rv: u64) -> Result<bool> {
    let Some(view) = hub.account(account).await? else {
        return Ok(false);
    };
    let objects = view["objects"].as_u64().unwrap_or(0);
    let resumed = view["kinds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|k| k["plural"] == "configmaps")
        .flat_map(|k| k["resumePoints"].as_array().cloned().unwrap_or_default())
        .any(|p| rv_num(p["resourceVersion"].as_str()) >= rv);
    Ok(objects == n as u64 && resumed)
}

/// Objects whose resourceVersion at the hub differs from the API server's.
async fn mismatches(env: &Env, hub: &HubProc, account: &str, ns: &str) -> Result<usize> {
    let api = Api::<ConfigMap>::namespaced(env.admin.clone(), ns);
    let truth: HashMap<String, String> = api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|o| {
            (
                o.metadata.name.unwrap_or_default(),
                o.metadata.resource_version.unwrap_or_default(),
            )
        })
        .collect();
    let held = hub
        .get_json(&format!(
            "/api/v1/accounts/{account}/objects?kind=configmaps&namespace={ns}"
        ))
        .await?;
    let held: HashMap<String, String> = held["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    Ok(truth
        .iter()
        .filter(|(k, v)| held.get(*k) != Some(v))
        .count()
        + held.len().abs_diff(truth.len()))
}

#[allow(clippy::too_many_arguments)]
async fn resume(
    env: &Env,
    o: &Options,
    hub: &mut HubProc,
    agent: &crate::env::AgentProc,
    ns: &str,
    account: &str,
    n: usize,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let m = o.resume_changes.min(n);
    let round = |wipe: bool, r: usize| ResumeRound {
        env,
        o,
        agent,
        ns,
        account,
        n,
        m,
        wipe,
        round: r,
    };
    let (rs, rb, rl, rr, rw) = round(false, 1).run(hub).await?;
    let (fs, fb, fl, fr, fw) = round(true, 2).run(hub).await?;
    rows.push(Row {
        id: "resume".into(),
        measure: 4,
        title: format!("Hub restart after {m} changes while it was down ({n} objects)"),
        system: format!("resume: {}, {} sent, {rl:.0} LISTs, {rr:.0} watch resumes", secs(rs), bytes(rb)),
        baseline_name: "full relist of the same cluster (hub restarted without its store)".into(),
        baseline: format!("{}, {} sent, {fl:.0} LISTs, {fr:.0} watch resumes", secs(fs), bytes(fb)),
        note: format!(
            "from hub start to a cache with every change (resume point ≥ last change, all objects); includes the agent's reconnect backoff (200 ms × 1.6, max 1 s); objects differing from the API server afterwards: {rw} / {fw}"
        ),
        values: json!({ "changes": m, "objects": n,
            "resume": { "seconds": rs, "bytes": rb, "lists": rl, "watch_resumes": rr, "mismatches": rw },
            "relist": { "seconds": fs, "bytes": fb, "lists": fl, "watch_resumes": fr, "mismatches": fw } }),
    });
    Ok(())
}

/// One hub restart with `m` changes made while it was down.
struct ResumeRound<'a> {
    env: &'a Env,
    o: &'a Options,
    agent: &'a crate::env::AgentProc,
    ns: &'a str,
    account: &'a str,
    n: usize,
    m: usize,
    /// Restart without the hub's store: a full relist.
    wipe: bool,
    round: usize,
}

impl ResumeRound<'_> {
    /// (seconds, bytes sent, LISTs, watch resumes, objects differing afterwards).
    async fn run(&self, hub: &mut HubProc) -> Result<(f64, f64, f64, f64, usize)> {
        let agent = self.agent;
        let api = Api::<ConfigMap>::namespaced(self.env.admin.clone(), self.ns);
        let b0 = agent.metric(BYTES_SENT).await?;
        let l0 = agent.metric(LISTS).await?;
        let w0 = agent.metric(RESUMES).await?;
        hub.stop();
        let (r, bytes_per_object) = (self.round, self.o.object_bytes);
        let rvs: Vec<u64> = futures::stream::iter(0..self.m)
            .map(|i| {
                let api = api.clone();
                async move {
                    let patch =
                        json!({ "data": { "payload": payload(i + r * 7919, bytes_per_object) } });
                    let cm = api
                        .patch(
                            &format!("sync-{i}"),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await?;
                    anyhow::Ok(rv_num(cm.metadata.resource_version.as_deref()))
                }
            })
            .buffer_unordered(self.o.writers.max(1))
            .try_collect()
            .await?;
        let last = rvs.into_iter().max().unwrap_or(0);
        if self.wipe {
            crate::env::remove(&hub.data_dir);
        }
        let started = Instant::now();
        hub.start().await?;
        let hub_ref = &*hub;
        crate::procs::wait_for(
            "a consistent hub cache",
            LONG,
            Duration::from_millis(10),
            || async {
                Ok(hub_consistent(hub_ref, self.account, self.n, last)
                    .await?
                    .then_some(()))
            },
        )
        .await?;
        let secs = started.elapsed().as_secs_f64();
        let bytes_sent = agent.metric(BYTES_SENT).await? - b0;
        let lists = agent.metric(LISTS).await? - l0;
        let resumes = agent.metric(RESUMES).await? - w0;
        let wrong = mismatches(self.env, hub_ref, self.account, self.ns).await?;
        Ok((secs, bytes_sent, lists, resumes, wrong))
    }
}

// ------------------------------------------------------------------ 6. operations

pub async fn operations(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let ns = env.namespace("bench-ops").await?;
    let kubectl = scale_agent_e2e::Binaries::locate()?.kubectl();
    let kubeconfig = env.control_plane.kubeconfig_path().to_path_buf();
    let manifest = |i: usize, name: &str| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": name, "namespace": ns },
            "data": { "seq": i.to_string() },
        })
    };
    // Baseline: one `kubectl apply --server-side` process per operation.
    let mut kubectl_ms = Vec::new();
    for i in 0..o.operations {
        let file = env.dir.join("kubectl-apply.json");
        std::fs::write(&file, serde_json::to_vec(&manifest(i, "by-kubectl"))?)?;
        let started = Instant::now();
        let out = tokio::process::Command::new(&kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["apply", "--server-side", "--field-manager=bench", "-f"])
            .arg(&file)
            .output()
            .await
            .context("run kubectl")?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl apply failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        kubectl_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let kubectl_p = Percentiles::of(&kubectl_ms);

    // This system: POST the apply to the hub, which relays it to the agent.
    let hub = env.hub("ops-hub").await?;
    let account = "bench-ops";
    let mut agent = env
        .agent(
            "ops-agent",
            &hub,
            json!([env.account(account, &ns, &["configmaps"])]),
        )
        .await?;
    agent.wait_ready(LONG).await?;
    let path = format!("/api/v1/accounts/{account}/operations");
    let mut hub_ms = Vec::new();
    let mut unavailable = None;
    for i in 0..o.operations {
        let body = serde_json::to_vec(&operation_body(&manifest(i, "by-hub")))?;
        let started = Instant::now();
        let (status, reply) = procs::http_with_token(
            hub.http_addr,
            "POST",
            &path,
            Some(&body),
            Some(procs::API_TOKEN),
        )
        .await?;
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        let reply_json = serde_json::from_slice::<Value>(&reply).ok();
        match status {
            200..=299 => hub_ms.push(elapsed),
            // No route at all (a hub without the operations API): an empty 404 or a 405.
            404 | 405 if reply_json.is_none() => {
                unavailable = Some((
                    "not measured: operations API not available".to_string(),
                    format!("HTTP {status} from POST {path}"),
                ));
                break;
            }
            s => {
                unavailable = Some((
                    format!("not measured: operation {i} failed (HTTP {s})"),
                    String::from_utf8_lossy(&reply)
                        .chars()
                        .take(300)
                        .collect::<String>(),
                ));
                break;
            }
        }
    }
    let hub_p = Percentiles::of(&hub_ms);
    let system = match &unavailable {
        Some((system, _)) => system.clone(),
        None => hub_p.display_ms(),
    };
    rows.push(Row {
        id: "operations".into(),
        measure: 6,
        title: format!("Server-side apply round trip ({} operations)", o.operations),
        system,
        baseline_name: "`kubectl apply --server-side` process per operation (Clouddriver's way)".into(),
        baseline: kubectl_p.display_ms(),
        note: match unavailable {
            Some((_, why)) => format!("{why}; kubectl measured against the API server directly"),
            None => "hub HTTP API → agent over the stream → API server → result back; kubectl talks to the API server directly".into(),
        },
        values: json!({ "operations": o.operations, "hub_ms": hub_p, "kubectl_ms": kubectl_p }),
    });
    drop(agent);
    drop(hub);
    Ok(())
}

/// The body of a server-side apply for the hub's operations API.
fn operation_body(manifest: &Value) -> Value {
    json!({
        "type": "apply",
        "manifest": manifest,
        "fieldManager": "bench",
        "force": true,
        "serverSide": true,
        "timeoutSeconds": 30,
    })
}

// ------------------------------------------------------------------ 7. many agents

pub async fn many_agents(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let mut figures = Vec::new();
    for n in [1, o.agents.max(1)] {
        let hub = env.hub(&format!("many-{n}-hub")).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = hub.stats()?;
        let certs: Vec<_> = (0..n)
            .map(|i| env.pki.ca.client(&format!("bench-sim-{n}-{i}"), &[]))
            .collect::<Result<_, _>>()?;
        let ca = Arc::new(env.pki.ca.cert_pem.clone());
        let agent_objects = o.agent_objects;
        let started = Instant::now();
        let tasks: Vec<_> = certs
            .into_iter()
            .enumerate()
            .map(|(i, cert)| {
                let (addr, ca) = (hub.grpc_addr, ca.clone());
                tokio::spawn(async move {
                    let mut fake =
                        FakeAgent::connect(addr, &ca, &cert.cert_pem, &cert.key_pem, "sim-0")
                            .await?;
                    let account = format!("sim-{n}-{i}");
                    fake.register(&account, &format!("https://sim-{i}.bench:443"))
                        .await?;
                    fake.snapshot(&account, agent_objects, 1).await?;
                    fake.synced(LONG).await?;
                    anyhow::Ok(fake)
                })
            })
            .collect();
        let mut agents = Vec::new();
        for t in tasks {
            agents.push(t.await??);
        }
        let secs = started.elapsed().as_secs_f64();
        let registered = hub.stats()?;
        let connected = hub.agents_connected().await?;
        let window = Duration::from_secs(o.idle_seconds.max(1));
        let (rss, idle_cpu) = idle(hub.pid(), window).await?;
        figures.push(json!({
            "agents": n, "connected": connected, "seconds": secs,
            "hub_rss_before_kib": before.rss_kib, "hub_rss_kib": rss,
            "hub_cpu_secs_to_register": registered.cpu_secs - before.cpu_secs, "hub_idle_cpu_share": idle_cpu,
        }));
        drop(agents);
        drop(hub);
    }
    let idle_window = Duration::from_secs(o.idle_seconds.max(1));
    let text = |f: &Value| {
        format!(
            "{} connected in {}; hub RSS {} (from {}), CPU {:.2} s to register, {} idle",
            f["connected"],
            secs(f["seconds"].as_f64().unwrap_or(0.0)),
            mib(f["hub_rss_kib"].as_u64().unwrap_or(0)),
            mib(f["hub_rss_before_kib"].as_u64().unwrap_or(0)),
            f["hub_cpu_secs_to_register"].as_f64().unwrap_or(0.0),
            match f["hub_idle_cpu_share"].as_f64().unwrap_or(0.0) {
                0.0 => format!("CPU < {:.2} %", 1.0 / idle_window.as_secs_f64().max(0.01)),
                share => format!("CPU {:.2} %", share * 100.0),
            },
        )
    };
    let per_agent = match (figures.first(), figures.last()) {
        (Some(one), Some(many)) if o.agents > 1 => {
            let d = many["hub_rss_kib"].as_f64().unwrap_or(0.0)
                - one["hub_rss_kib"].as_f64().unwrap_or(0.0);
            d * 1024.0 / (o.agents - 1) as f64
        }
        _ => 0.0,
    };
    rows.push(Row {
        id: "many-agents".into(),
        measure: 7,
        title: format!(
            "{} simulated agents (mTLS, one account and {} objects each) on one hub",
            o.agents, o.agent_objects
        ),
        system: text(figures.last().unwrap_or(&Value::Null)),
        baseline_name: "the same hub with 1 agent".into(),
        baseline: text(figures.first().unwrap_or(&Value::Null)),
        note: format!(
            "all connect at once; about {} of hub RSS per extra agent; the fake agents' TLS runs in the bench process on the same cores",
            bytes(per_agent)
        ),
        values: json!({ "runs": figures, "hub_bytes_per_extra_agent": per_agent }),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::memory_slope;

    #[test]
    fn the_slope_leaves_out_what_does_not_grow_with_the_objects() {
        assert_eq!(memory_slope(&[(10_000, 12_000, 9_000)]), None, "one size");
        // 2,000 KiB that any sync costs, then 1 KiB per object (0.75 anonymous).
        let growth = [
            (1_000, 2_000 + 1_000, 2_000 + 750),
            (10_000, 2_000 + 10_000, 2_000 + 7_500),
        ];
        assert_eq!(memory_slope(&growth), Some((1_000, 1024.0, 768.0)));
        assert_eq!(
            memory_slope(&[(5, 1, 1), (5, 2, 2)]),
            None,
            "one size twice"
        );
    }
}
