//! Measure 2 (events per second on one stream: live from the API server, and a synthetic
//! source alone, with what limits it) and measure 11 (the same synthetic source into a hub on
//! PostgreSQL beside one on its embedded store), and measure 5's bytes on the wire.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use prost::Message as _;
use scale_agent_proto::v1::{self as pb, agent_message::Kind as Msg};
use serde_json::json;

use super::{BYTES_SENT, LONG, Seen, latency::spawn_watcher};
use crate::{
    Options,
    env::{Env, HubProc},
    fake::{FakeAgent, object_event},
    procs::CpuWindow,
    report::{Row, bytes},
};

const EVENTS_SENT: &str = "scale_agent_agent_events_sent_total";

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
