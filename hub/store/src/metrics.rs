//! The commit writer's Prometheus metrics: whether the store commits, its failures, and what
//! is queued for it. The hub's metrics registry registers them ([`StoreMetrics::register`]).

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Bucket bounds of the commit latency histogram, seconds: a non-durable redb commit takes
/// well under a millisecond, a durable one an fsync, a PostgreSQL one a round trip or more.
const COMMIT_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// The gauges and counter the commit writer ([`crate::writer::Commits::run`]) records
/// (cheap to clone: clones share their values).
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    /// 1 while the store cannot commit (a full disk): agents' Acks are held.
    pub failing: Gauge,
    /// Commits that failed (each retry counts).
    pub commit_failures: Counter,
    /// Changes applied to the cache and queued, not yet committed.
    pub queued_changes: Gauge,
    /// Seconds each commit of a group of changes took (successful or not; the store's lock
    /// wait not counted).
    pub commit_seconds: Histogram,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        StoreMetrics {
            failing: Gauge::default(),
            commit_failures: Counter::default(),
            queued_changes: Gauge::default(),
            commit_seconds: Histogram::new(COMMIT_BUCKETS),
        }
    }
}

impl StoreMetrics {
    /// Adds the metrics to `registry` (the hub's, prefixed `scale_agent_hub`), as
    /// `store_failing`, `store_commit_failures_total` and `store_queued_changes`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_failing",
            "1 while the store cannot commit (for example its volume is full): reads are \
             served from memory, agents' acknowledgements are held, commits are retried",
            self.failing.clone(),
        );
        registry.register(
            "store_commit_failures",
            "Store commits that failed (every retry counts)",
            self.commit_failures.clone(),
        );
        registry.register(
            "store_queued_changes",
            "Changes applied to the cache and queued for the store, not yet committed",
            self.queued_changes.clone(),
        );
        registry.register(
            "store_commit_duration_seconds",
            "Seconds each commit of a group of queued changes took, durable or not, failed or \
             not",
            self.commit_seconds.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[test]
    fn names() {
        let m = StoreMetrics::default();
        let mut registry = Registry::with_prefix("scale_agent_hub");
        m.register(&mut registry);
        m.failing.set(1);
        m.commit_failures.inc();
        m.queued_changes.set(3);
        m.commit_seconds.observe(0.0003);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            "scale_agent_hub_store_failing 1",
            "scale_agent_hub_store_commit_failures_total 1",
            "scale_agent_hub_store_queued_changes 3",
            "scale_agent_hub_store_commit_duration_seconds_count 1",
            "scale_agent_hub_store_commit_duration_seconds_bucket{le=\"0.00025\"} 0",
            "scale_agent_hub_store_commit_duration_seconds_bucket{le=\"0.0005\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
