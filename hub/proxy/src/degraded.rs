//! Degraded modes that say what they are. While an account's agent is away (the hub keeps
//! its cache for the grace period), while its streaming agent is silent (its heartbeat
//! overdue: a partition between this replica and its agents, until the stream ends), or
//! while the store cannot commit (PostgreSQL down, a full
//! volume: agents' Acks are held, so the cache stops moving), reads the cache can answer are
//! still answered from it, but flagged: a Kubernetes `Warning` header, which kubectl and
//! client-go print (`Warning: ...`), and [`CACHE_AGE_HEADER`], how old the data may be. Writes
//! answer 503 with the reason instead of reaching the cluster: with no agent there is nobody
//! to run them, and with the store failing the hub could not show their result
//! (read-your-writes) nor keep it.
//!
//! Why serve at all: Clouddriver's caching cycles read every account every 30 s; a 503 for
//! each read while an agent restarts fails them and, after 10 minutes, empties its cache of
//! the account (Spinnaker shows the clusters gone). Data a few seconds or minutes old, said
//! to be so, is the better answer for reads; a write must never act on it.

use std::time::{Duration, Instant};

use axum::{http::HeaderValue, response::Response};
use scale_agent_hub_state::Live;
use scale_agent_hub_store::writer::{Commits, Failing};

use crate::{ProxyMetrics, status::Status};

/// Response header of a degraded answer from the cache: whole seconds since the data may
/// have stopped following the cluster (the agent left, or the store's first failing commit).
pub const CACHE_AGE_HEADER: &str = "x-scale-agent-cache-age";

/// Why an account's cache may no longer follow its cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum Degraded {
    /// No agent serves the account; the hub holds its cache until the grace period ends.
    AgentAway {
        /// Since when (this replica's clock).
        since: Instant,
    },
    /// The agent streaming the account here has sent nothing for half a heartbeat period
    /// longer than its heartbeat: its stream may be cut off (a silent network partition
    /// between this replica and its agents) and the cache may have stopped moving, although
    /// the stream ends only after two periods of silence.
    AgentSilent {
        /// Its last message (this replica's clock).
        since: Instant,
        /// The heartbeat period granted to its stream.
        period: Duration,
    },
    /// The store cannot commit, or the accounts' ownership cannot reach it: agents'
    /// acknowledgements are held or their streams ended, the cache stops moving.
    StoreFailing {
        since: Instant,
        /// Which of the two, for the message.
        what: Failing,
        /// The store's last error.
        reason: String,
    },
}

impl Degraded {
    /// The account's degraded mode now, if any: the store failing first (the cause of the
    /// rest), then the agent being away, then its streaming agent being silent.
    pub fn of(live: &Live, commits: &Commits, account: &str) -> Option<Degraded> {
        // The store first: when it fails, replicas lose the accounts' ownership and their
        // agents stand by, so "no agent" would name the symptom, not the cause.
        let health = commits.health();
        if let Some(reason) = health.failure {
            return Some(Degraded::StoreFailing {
                since: health.failing_since.unwrap_or_else(Instant::now),
                what: health.failing.unwrap_or(Failing::Commits),
                reason,
            });
        }
        let away = {
            live.registry_read()
                .accounts
                .get(account)
                .filter(|a| a.streaming.is_none())
                .map(|a| {
                    a.disconnected_since
                        .map_or_else(Instant::now, |(instant, _)| instant)
                })
        };
        if let Some(since) = away {
            return Some(Degraded::AgentAway { since });
        }
        live.streaming_silent(account)
            .map(|(since, period)| Degraded::AgentSilent { since, period })
    }

    fn since(&self) -> Instant {
        match self {
            Degraded::AgentAway { since }
            | Degraded::AgentSilent { since, .. }
            | Degraded::StoreFailing { since, .. } => *since,
        }
    }

    /// How old the data may be.
    pub fn age(&self) -> Duration {
        self.since().elapsed()
    }

    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Degraded::AgentAway { .. } => "agent_away",
            Degraded::AgentSilent { .. } => "agent_silent",
            Degraded::StoreFailing { .. } => "store_failing",
        }
    }

    /// Why the data may be stale, for the Warning header and 503 messages.
    fn why(&self, account: &str) -> String {
        let age = self.age().as_secs();
        match self {
            Degraded::AgentAway { .. } => {
                format!("no agent of account {account} has been connected to the hub for {age} s")
            }
            Degraded::AgentSilent { period, .. } => format!(
                "the agent streaming account {account} has sent nothing for {age} s (its \
                 heartbeat is every {} s; the hub ends a stream silent for two periods)",
                period.as_secs()
            ),
            Degraded::StoreFailing { what, reason, .. } => format!(
                "the hub's store {} ({}), so the agents of account {account} cannot stream it \
                 to the hub",
                what.for_seconds(age),
                one_line(reason)
            ),
        }
    }

    /// The `Warning` header's text (RFC 7234 form, code 299 as the API server uses).
    pub fn warning(&self, account: &str) -> String {
        let text = format!(
            // troubleshooting: proxy: a `Warning` header on a read
            // No agent has streamed the account for a while (or the hub's store cannot commit), and
            // the read was answered from the hub's cache. kubectl and client-go print the warning;
            // `x-scale-agent-cache-age` carries the age.
            "{}: this answer is the hub's cache as of {} s ago and may be stale",
            self.why(account),
            self.age().as_secs()
        )
        .replace('"', "'");
        format!("299 - \"{text}\"")
    }

    /// Flags a read answered from the cache (and counts it).
    pub fn flag(&self, account: &str, response: &mut Response, metrics: &ProxyMetrics) {
        metrics
            .stale_reads
            .get_or_create(&[("reason", self.label())])
            .inc();
        let headers = response.headers_mut();
        if let Ok(warning) = HeaderValue::from_str(&self.warning(account)) {
            headers.append(axum::http::header::WARNING, warning);
        }
        headers.insert(CACHE_AGE_HEADER, HeaderValue::from(self.age().as_secs()));
    }

    /// The 503 a write gets, saying why and what to do.
    pub fn refuse_write(&self, account: &str, metrics: &ProxyMetrics) -> Status {
        metrics
            .refused_writes
            .get_or_create(&[("reason", self.label())])
            .inc();
        let what = match self {
            Degraded::AgentAway { .. } => {
                "writes need a connected agent: start or fix the account's agent (GET \
                 /api/v1/agents shows who is connected), then retry"
            }
            Degraded::AgentSilent { .. } => {
                "writes need an agent that answers: retry once its stream ended (the account \
                 then moves to an agent that is heard from)"
            }
            Degraded::StoreFailing { .. } => {
                "writes are refused until the store commits again (their result could be \
                 neither shown nor kept): fix the store (PostgreSQL reachable, volume not \
                 full), then retry"
            }
        };
        Status::unavailable(format!("{}; {what}", self.why(account)))
    }
}

/// Header values hold one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_say_why_and_how_old() {
        let since = Instant::now() - Duration::from_secs(42);
        let away = Degraded::AgentAway { since };
        let warning = away.warning("prod");
        assert!(warning.starts_with("299 - \""), "{warning}");
        assert!(warning.contains("no agent of account prod"), "{warning}");
        assert!(warning.contains("42 s"), "{warning}");
        let store = Degraded::StoreFailing {
            since,
            what: Failing::Commits,
            reason: "connection \"refused\"\n by PostgreSQL".into(),
        };
        let warning = store.warning("prod");
        assert!(
            warning.contains("the hub's store has not committed for 42 s"),
            "{warning}"
        );
        assert!(HeaderValue::from_str(&warning).is_ok(), "{warning}");
        assert!(
            warning.contains("connection 'refused' by PostgreSQL"),
            "{warning}"
        );
        let metrics = ProxyMetrics::default();
        let status = store.refuse_write("prod", &metrics);
        assert_eq!(status.code(), 503);
        assert!(
            status.message().contains("fix the store"),
            "{}",
            status.message()
        );
        let ownership = Degraded::StoreFailing {
            since,
            what: Failing::Ownership,
            reason: "cannot take accounts' ownership: connection refused".into(),
        };
        let warning = ownership.warning("prod");
        assert!(
            warning.contains(
                "the hub's store could not be reached for the accounts' ownership for 42 s \
                 (cannot take accounts' ownership: connection refused)"
            ),
            "{warning}"
        );
        assert!(!warning.contains("committed"), "{warning}");
        let silent = Degraded::AgentSilent {
            since,
            period: Duration::from_secs(15),
        };
        let warning = silent.warning("prod");
        assert!(
            warning.contains("the agent streaming account prod has sent nothing for 42 s"),
            "{warning}"
        );
        assert!(warning.contains("every 15 s"), "{warning}");
        assert_eq!(silent.refuse_write("prod", &metrics).code(), 503);
        let mut response = Response::new(axum::body::Body::empty());
        away.flag("prod", &mut response, &metrics);
        assert_eq!(response.headers()[CACHE_AGE_HEADER], "42");
        assert!(response.headers().contains_key(axum::http::header::WARNING));
    }
}
