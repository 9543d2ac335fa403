//! Measure 10: the soak. `--soak-agents` simulated agents (each its own client certificate
//! and account, as measure 7's) stay connected to one hub process for `--soak-seconds`,
//! with churn all along: object updates at `--soak-events-per-second` spread over random
//! agents, and `--soak-reconnects-per-minute` agents dropping their stream and connecting
//! again (a new stream, registration, a snapshot), as pods restarting across a fleet do.
//!
//! Reported: the hub's RSS once every agent had synced (the baseline), sampled through the
//! run, and at the end (growth and peak); the reconnects made, and the streams the hub
//! ended on its own (an agent whose stream was gone when it next sent, each reconnected).
//! Not in the default run (ten minutes); `--measures 10` runs it.

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;
use futures::StreamExt as _;
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
use scale_agent_proto::v1::agent_message::Kind as Msg;
use serde_json::{Value, json};

use super::{LONG, agent_objects::AgentObjects};
use crate::{
    Options,
    env::Env,
    fake::FakeAgent,
    procs::metric_sum,
    report::{Row, mib, secs},
};

/// How often the hub's RSS is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// How often churn is sent (the rate is spread over these ticks).
const TICK: Duration = Duration::from_millis(100);
/// Streams being opened at once while the fleet connects.
pub(crate) const CONNECTING: usize = 64;

/// One simulated agent: its certificate, account, stream and the resourceVersion it is at.
pub(crate) struct Sim {
    pub(crate) cert: Arc<(String, String)>,
    pub(crate) account: String,
    pub(crate) fake: Option<FakeAgent>,
    pub(crate) rv: u64,
}

impl Sim {
    /// `n` simulated agents `<prefix>-<i>`, each its own client certificate (identity
    /// `bench-<prefix>-<i>`) and account, not connected yet.
    pub(crate) fn fleet(env: &Env, prefix: &str, n: usize) -> Result<Vec<Sim>> {
        (0..n)
            .map(|i| {
                let issued = env.pki.ca.client(&format!("bench-{prefix}-{i}"), &[])?;
                Ok(Sim {
                    cert: Arc::new((issued.cert_pem, issued.key_pem)),
                    account: format!("{prefix}-{i}"),
                    fake: None,
                    rv: 1,
                })
            })
            .collect()
    }

    /// Connects (again), registers its account and sends a snapshot of `objects` at a new
    /// resourceVersion.
    pub(crate) async fn connect(
        &mut self,
        hub: SocketAddr,
        ca: &str,
        objects: AgentObjects,
    ) -> Result<()> {
        // The old stream may still look live to the hub: present its token, as an agent
        // reconnecting does.
        let token = self
            .fake
            .take()
            .map(|old| old.session_token.clone())
            .unwrap_or_default();
        let (cert, key) = (&self.cert.0, &self.cert.1);
        let mut fake = FakeAgent::reconnect(hub, ca, cert, key, "soak-0", token).await?;
        fake.register(
            &self.account,
            &format!("https://{}.bench:443", self.account),
        )
        .await?;
        self.rv += 1;
        objects.snapshot(&mut fake, &self.account, self.rv).await?;
        self.fake = Some(fake);
        Ok(())
    }

    /// One update of its object `pick` (modulo the count); false when the hub had ended the
    /// stream.
    pub(crate) async fn update(&mut self, objects: AgentObjects, pick: usize) -> bool {
        let Some(fake) = &mut self.fake else {
            return false;
        };
        self.rv += 1;
        let event = objects.update(&self.account, pick, self.rv);
        fake.send(Msg::Object(event)).await.is_ok()
    }
}

/// Connects a fleet, agent `i` to `hub_of(i)`: [`CONNECTING`] streams at a time (all at
/// once is measure 7's row; a debug build's handshakes would time out), each connect tried
/// again on a transport error, as an agent's backoff would; returns once every agent's
/// snapshot is acknowledged, in the order given (agent `i` is still at index `i`).
pub(crate) async fn connect_fleet(
    sims: Vec<Sim>,
    hub_of: impl Fn(usize) -> SocketAddr,
    ca: &str,
    objects: AgentObjects,
) -> Result<Vec<Sim>> {
    let connected: Vec<Result<Sim>> = futures::stream::iter(sims.into_iter().enumerate())
        .map(|(i, mut sim)| {
            let hub = hub_of(i);
            async move {
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    match sim.connect(hub, ca, objects).await {
                        Ok(()) => break,
                        Err(_) if attempt < 5 => {
                            tokio::time::sleep(Duration::from_millis(500 * attempt)).await;
                        }
                        Err(e) => return Err(e),
                    }
                }
                if let Some(fake) = &sim.fake {
                    fake.synced(LONG).await?;
                }
                Ok(sim)
            }
        })
        // In order, so the caller knows which hub each returned agent is on.
        .buffered(CONNECTING)
        .collect()
        .await;
    connected.into_iter().collect()
}

pub async fn soak(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let n = o.soak_agents.max(1);
    let objects = AgentObjects::ConfigMaps(o.agent_objects.max(1));
    let hub = env.hub("soak-hub").await?;
    let ca = env.pki.ca.cert_pem.clone();
    let sims = Sim::fleet(env, "soak", n)?;
    let started = Instant::now();
    let grpc = hub.grpc_addr;
    let mut sims = connect_fleet(sims, |_| grpc, &ca, objects).await?;
    let connect_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let baseline = hub.stats()?;

    let mut rng = StdRng::seed_from_u64(10);
    let window = Duration::from_secs(o.soak_seconds.max(1));
    let soak_started = Instant::now();
    let per_tick = o.soak_events_per_second * TICK.as_secs_f64();
    let reconnect_every = Duration::from_secs_f64(60.0 / o.soak_reconnects_per_minute.max(0.001));
    let (mut owed, mut events, mut reconnects, mut ended_by_hub) = (0.0, 0u64, 0u64, 0u64);
    let mut next_reconnect = soak_started + reconnect_every;
    let mut next_sample = soak_started;
    let mut samples: Vec<Value> = Vec::new();
    let mut peak_kib = baseline.rss_kib;
    while soak_started.elapsed() < window {
        let now = Instant::now();
        if now >= next_sample {
            let stats = hub.stats()?;
            peak_kib = peak_kib.max(stats.rss_kib);
            // What the hub holds that may grow with the churn: the watch histories (bounded
            // by --watch-history-mib) and the objects; beside RSS, they say what grew.
            let metrics = hub.metrics().await.unwrap_or_default();
            samples.push(json!({
                "seconds": soak_started.elapsed().as_secs_f64(),
                "hub_rss_kib": stats.rss_kib,
                "hub_rss_anon_kib": stats.rss_anon_kib,
                "hub_cpu_secs": stats.cpu_secs - baseline.cpu_secs,
                "watch_history_bytes": metric_sum(&metrics, "scale_agent_hub_watch_history_bytes", &[]),
                "objects_cached": metric_sum(&metrics, "scale_agent_hub_objects_cached", &[]),
                "open_fds": metric_sum(&metrics, "scale_agent_hub_process_open_fds", &[]),
                "threads": metric_sum(&metrics, "scale_agent_hub_process_threads", &[]),
            }));
            next_sample += SAMPLE_EVERY;
        }
        if now >= next_reconnect {
            let sim = &mut sims[rng.random_range(0..n)];
            sim.connect(hub.grpc_addr, &ca, objects).await?;
            reconnects += 1;
            next_reconnect += reconnect_every;
        }
        owed += per_tick;
        while owed >= 1.0 {
            owed -= 1.0;
            let (index, pick) = (rng.random_range(0..n), rng.random_range(0..objects.count()));
            if sims[index].update(objects, pick).await {
                events += 1;
            } else {
                // The hub ended this stream without being asked: count it and reconnect,
                // as a real agent would.
                ended_by_hub += 1;
                sims[index].connect(hub.grpc_addr, &ca, objects).await?;
            }
        }
        tokio::time::sleep(TICK).await;
    }
    for sim in &sims {
        if let Some(fake) = &sim.fake {
            fake.synced(LONG).await?;
        }
    }
    let soaked = soak_started.elapsed();
    let end = hub.stats()?;
    peak_kib = peak_kib.max(end.rss_kib);
    let connected = hub.agents_connected().await?;
    let growth_kib = end.rss_kib as i64 - baseline.rss_kib as i64;
    let growth = if growth_kib >= 0 {
        format!("+{}", mib(growth_kib.unsigned_abs()))
    } else {
        format!("-{}", mib(growth_kib.unsigned_abs()))
    };
    rows.push(Row {
        id: "soak".into(),
        measure: 10,
        title: format!(
            "soak: {n} simulated agents for {} with {} object updates/s and {} reconnects/min",
            secs(soaked.as_secs_f64()),
            o.soak_events_per_second,
            o.soak_reconnects_per_minute
        ),
        system: format!(
            "hub RSS {} at the end ({growth}; peak {}); {reconnects} reconnects made, {ended_by_hub} streams ended by the hub; {connected} agents connected at the end; {events} updates ({:.0}/s sent), hub CPU {:.1} s",
            mib(end.rss_kib),
            mib(peak_kib),
            events as f64 / soaked.as_secs_f64().max(0.001),
            end.cpu_secs - baseline.cpu_secs,
        ),
        baseline_name: "the same hub once every agent had synced".into(),
        baseline: format!(
            "hub RSS {} ({n} agents connected and synced in {})",
            mib(baseline.rss_kib),
            secs(connect_secs)
        ),
        note: format!(
            "RSS sampled every {} s (in the JSON); growth is end minus baseline; the fake agents run in the bench process on the same cores, one sender, so the updates sent per second fall short of the rate asked when it cannot keep up (reconnects are made in line)",
            SAMPLE_EVERY.as_secs()
        ),
        values: json!({
            "agents": n,
            "objects_per_agent": objects.count(),
            "seconds": soaked.as_secs_f64(),
            "updates": events,
            "reconnects": reconnects,
            "streams_ended_by_hub": ended_by_hub,
            "connected_at_end": connected,
            "hub_rss_baseline_kib": baseline.rss_kib,
            "hub_rss_end_kib": end.rss_kib,
            "hub_rss_peak_kib": peak_kib,
            "hub_rss_growth_kib": growth_kib,
            "hub_cpu_secs": end.cpu_secs - baseline.cpu_secs,
            "samples": samples,
        }),
    });
    Ok(())
}
