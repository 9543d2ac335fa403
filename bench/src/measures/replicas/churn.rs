//! The fleet row's churn: once the fleet synced, `--ha-churn-seconds` of the fleet's churn
//! (`--fleet-churn-percent` of all objects per minute) on the simulated agents' streams, and
//! what the hubs' stores made of it (their commits, acknowledgements held, changes queued).

use std::time::{Duration, Instant};

use anyhow::Result;
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
use serde_json::json;

use super::{COMMITS, QUEUED, metric_over};
use crate::{
    Options,
    env::HubProc,
    measures::{LONG, agent_objects::AgentObjects, soak::Sim},
    report::secs,
};

/// Seconds the hub's store commits took (their count is [`COMMITS`]).
const COMMIT_SECONDS: &str = "scale_agent_hub_store_commit_duration_seconds_sum";
/// Times an agent's acknowledgement waited for the store.
const ACKS_HELD: &str = "scale_agent_hub_acks_held_total";
/// Churn is sent every tick (the rate spread over them).
const TICK: Duration = Duration::from_millis(100);

/// What the hubs' stores took of the fleet's churn.
#[derive(Default)]
pub(super) struct Churned {
    /// Updates per second asked for (`--fleet-churn-percent` of all objects per minute).
    rate: f64,
    window: f64,
    sent: u64,
    /// Updates that found their stream ended by the hub.
    lost: u64,
    /// Seconds from the last update sent until every agent's updates were acknowledged.
    drained: f64,
    commits: f64,
    commit_seconds: f64,
    acks_held: f64,
    /// Most changes queued for the stores at once (sampled every second).
    queued_peak: f64,
}

impl Churned {
    pub(super) fn text(&self) -> String {
        if self.window == 0.0 {
            return "no churn (--ha-churn-seconds 0)".into();
        }
        format!(
            "churn at {:.1} updates/s asked for {}: {} sent ({:.1}/s), all acknowledged {} after the last{}; the stores made {} commits (mean {}), {} acks held for the store, at most {} changes queued",
            self.rate,
            secs(self.window),
            self.sent,
            self.sent as f64 / self.window.max(0.001),
            secs(self.drained),
            if self.lost > 0 {
                format!(", {} updates LOST (stream ended by the hub)", self.lost)
            } else {
                String::new()
            },
            self.commits,
            secs(self.commit_seconds / self.commits.max(1.0)),
            self.acks_held,
            self.queued_peak,
        )
    }

    pub(super) fn values(&self) -> serde_json::Value {
        json!({
            "rate_asked_per_sec": self.rate,
            "seconds": self.window,
            "sent": self.sent,
            "lost": self.lost,
            "sent_per_sec": self.sent as f64 / self.window.max(0.001),
            "drained_seconds": self.drained,
            "commits": self.commits,
            "commit_seconds": self.commit_seconds,
            "acks_held": self.acks_held,
            "queued_peak": self.queued_peak,
        })
    }
}

/// `--ha-churn-seconds` of the fleet's churn (`--fleet-churn-percent` of all objects per
/// minute, random objects of random agents) on `sims`, whose hubs are `hubs`; then waits
/// until every update is acknowledged.
pub(super) async fn churn(
    sims: &mut [Sim],
    objects: AgentObjects,
    o: &Options,
    hubs: &[&HubProc],
) -> Result<Churned> {
    let window = Duration::from_secs(o.ha_churn_seconds);
    let rate = (sims.len() * objects.count()) as f64 * o.fleet_churn_percent / 100.0 / 60.0;
    let mut churned = Churned {
        rate,
        window: window.as_secs_f64(),
        ..Churned::default()
    };
    if window.is_zero() || sims.is_empty() {
        return Ok(churned);
    }
    let (commits, commit_seconds, acks_held) = (
        metric_over(hubs, COMMITS).await?,
        metric_over(hubs, COMMIT_SECONDS).await?,
        metric_over(hubs, ACKS_HELD).await?,
    );
    let mut rng = StdRng::seed_from_u64(11);
    let started = Instant::now();
    let (mut owed, mut next_sample) = (0.0, started);
    while started.elapsed() < window {
        if Instant::now() >= next_sample {
            churned.queued_peak = churned.queued_peak.max(metric_over(hubs, QUEUED).await?);
            next_sample += Duration::from_secs(1);
        }
        owed += rate * TICK.as_secs_f64();
        while owed >= 1.0 {
            owed -= 1.0;
            let (index, pick) = (
                rng.random_range(0..sims.len()),
                rng.random_range(0..objects.count()),
            );
            if sims[index].update(objects, pick).await {
                churned.sent += 1;
            } else {
                churned.lost += 1;
            }
        }
        tokio::time::sleep(TICK).await;
    }
    let last_sent = Instant::now();
    for sim in sims.iter() {
        if let Some(fake) = &sim.fake {
            fake.synced(LONG).await?;
        }
    }
    churned.drained = last_sent.elapsed().as_secs_f64();
    churned.commits = metric_over(hubs, COMMITS).await? - commits;
    churned.commit_seconds = metric_over(hubs, COMMIT_SECONDS).await? - commit_seconds;
    churned.acks_held = metric_over(hubs, ACKS_HELD).await? - acks_held;
    Ok(churned)
}
