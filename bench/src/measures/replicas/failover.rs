//! The failover's agents: each agent of a killed hub reconnects (to a survivor, or to the hub
//! restarted) until STREAMING, then resumes or relists each kind; [`Recovery`] sums up what
//! became of them.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use serde_json::json;

use super::RETRY;
use crate::{
    fake::FakeAgent,
    measures::{LONG, agent_objects::AgentObjects, soak::Sim},
    report::{Percentiles, secs},
};

/// What became of one agent whose hub was killed.
pub(super) enum Outcome {
    Streaming {
        /// Seconds from the kill until its stream ended.
        ended: f64,
        /// Seconds from the kill until a hub assigned it STREAMING.
        streaming: f64,
        /// Seconds from the kill until what it sent after the assignment (its kinds
        /// WATCHING, the relists) was acknowledged.
        synced: f64,
        /// Kinds whose assignment carried no resume point (listed again).
        relisted: usize,
    },
    Failed(String),
}

/// Agent `sim`, whose hub was just killed, notices its stream end and reconnects to
/// `addrs` (from `first` on, round the list, every [`RETRY`] while none answers) until an
/// assignment STREAMING, then resumes or relists each kind as the assignment says.
pub(super) async fn recover(
    sim: &mut Sim,
    addrs: &[SocketAddr],
    first: usize,
    ca: &str,
    objects: AgentObjects,
    killed_at: Instant,
    deadline: tokio::time::Instant,
) -> Outcome {
    let Some(old) = sim.fake.take() else {
        return Outcome::Failed(format!("{}: was not connected", sim.account));
    };
    if tokio::time::timeout_at(deadline, old.ended())
        .await
        .is_err()
    {
        return Outcome::Failed(format!(
            "{}: its stream to the killed hub did not end",
            sim.account
        ));
    }
    let ended = killed_at.elapsed().as_secs_f64();
    let token = old.session_token.clone();
    drop(old);
    let (cert, key) = (&sim.cert.0, &sim.cert.1);
    let host = format!("https://{}.bench:443", sim.account);
    let mut last_error = String::from("no attempt");
    for attempt in 0.. {
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        let addr = addrs[(first + attempt) % addrs.len()];
        let connected = tokio::time::timeout_at(
            deadline,
            FakeAgent::reconnect(addr, ca, cert, key, "ha-0", token.clone()),
        )
        .await;
        let mut fake = match connected {
            Ok(Ok(fake)) => fake,
            Ok(Err(e)) => {
                last_error = format!("connect to {addr}: {e:#}");
                tokio::time::sleep(RETRY).await;
                continue;
            }
            Err(_) => break,
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let assignment = match fake.register_streaming(&sim.account, &host, left).await {
            Ok(a) => a,
            Err(e) => {
                last_error = format!("register on {addr}: {e:#}");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let streaming = killed_at.elapsed().as_secs_f64();
        sim.rv += 1;
        let relisted = match objects
            .resume(&mut fake, &sim.account, sim.rv, &assignment)
            .await
        {
            Ok(relisted) => relisted,
            Err(e) => return Outcome::Failed(format!("{}: resume: {e:#}", sim.account)),
        };
        if let Err(e) = fake.synced(LONG).await {
            return Outcome::Failed(format!("{}: after streaming: {e:#}", sim.account));
        }
        sim.fake = Some(fake);
        return Outcome::Streaming {
            ended,
            streaming,
            synced: killed_at.elapsed().as_secs_f64(),
            relisted,
        };
    }
    Outcome::Failed(format!(
        "{}: not streaming {} after the kill (last: {last_error})",
        sim.account,
        secs(killed_at.elapsed().as_secs_f64())
    ))
}

/// The outcomes of one kill, summed up.
pub(super) struct Recovery {
    pub(super) agents: usize,
    streaming: Vec<f64>,
    synced: Vec<f64>,
    pub(super) ended: Vec<f64>,
    /// Agents that listed at least one kind again.
    relists: usize,
    relisted_kinds: usize,
    failures: Vec<String>,
    hub_relists: f64,
}

impl Recovery {
    pub(super) fn of(outcomes: Vec<Outcome>, hub_relists: f64) -> Self {
        let mut r = Recovery {
            agents: outcomes.len(),
            streaming: Vec::new(),
            synced: Vec::new(),
            ended: Vec::new(),
            relists: 0,
            relisted_kinds: 0,
            failures: Vec::new(),
            hub_relists,
        };
        for outcome in outcomes {
            match outcome {
                Outcome::Streaming {
                    ended,
                    streaming,
                    synced,
                    relisted,
                } => {
                    r.ended.push(ended);
                    r.streaming.push(streaming);
                    r.synced.push(synced);
                    r.relists += usize::from(relisted > 0);
                    r.relisted_kinds += relisted;
                }
                Outcome::Failed(e) => r.failures.push(e),
            }
        }
        r
    }

    fn last(&self) -> f64 {
        self.streaming.iter().copied().fold(0.0, f64::max)
    }

    fn last_synced(&self) -> f64 {
        self.synced.iter().copied().fold(0.0, f64::max)
    }

    pub(super) fn text(&self, timeout: Duration) -> String {
        let p = Percentiles::of(&self.streaming);
        let head = if self.failures.is_empty() {
            format!(
                "all {} accounts streaming again {} after the kill (p50 {})",
                self.agents,
                secs(self.last()),
                secs(p.p50)
            )
        } else {
            format!(
                "{} of {} accounts NOT streaming within {} of the kill ({} were, the last after {}; first failure: {})",
                self.failures.len(),
                self.agents,
                secs(timeout.as_secs_f64()),
                self.streaming.len(),
                secs(self.last()),
                self.failures[0]
            )
        };
        format!(
            "{head}, every kind WATCHING or relisted and acknowledged {} after; {} relists (agents given no resume point for {} kinds in all; the hubs counted {} snapshots begun)",
            secs(self.last_synced()),
            self.relists,
            self.relisted_kinds,
            self.hub_relists
        )
    }

    pub(super) fn values(&self) -> serde_json::Value {
        json!({
            "agents": self.agents,
            "streaming_seconds": self.streaming,
            "stream_ended_seconds": self.ended,
            "last_streaming_seconds": self.last(),
            "synced_seconds": self.synced,
            "last_synced_seconds": self.last_synced(),
            "relists": self.relists,
            "relisted_kinds": self.relisted_kinds,
            "hub_relists": self.hub_relists,
            "failures": self.failures,
        })
    }
}
