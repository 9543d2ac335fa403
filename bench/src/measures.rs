//! The seven measures of issue 6 ([`latency`], [`stream`], [`footprint`], [`operations`],
//! [`many_agents`]), the Kubernetes API proxy's ([`proxy`], measure 8) and reads through it
//! as Clouddriver makes them ([`reads`], measure 9).
//! Each appends rows (this system beside its baseline, measured in the same run) to the
//! report. This file keeps what several measures share: the patch pacing and the latency
//! bookkeeping of measures 1, 8 and 9, and the agent's metric names.

pub mod agent_objects;
pub mod fleet;
pub mod fleet_objects;
pub mod footprint;
pub mod latency;
pub mod many_agents;
pub mod operations;
pub mod proxy;
pub mod reads;
pub mod replicas;
pub mod soak;
pub mod stream;

pub use footprint::{idle_footprint, sync_and_resume};
pub use latency::latency;
pub use many_agents::many_agents;
pub use operations::operations;
pub use stream::{StreamCeiling, store_backends, synthetic, throughput};

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Result;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

const LONG: Duration = Duration::from_secs(900);
const BYTES_SENT: &str = "scale_agent_agent_bytes_sent_total";

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

/// For each update (name, rv, issued at): milliseconds until an observation of that name
/// with a resourceVersion at least rv; and how many updates were never seen.
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
