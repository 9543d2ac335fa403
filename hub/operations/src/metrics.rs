//! The operations' Prometheus metrics: finished operations by type and state, how long they
//! took, and retries on another replica. The hub's metrics registry registers them
//! ([`OperationMetrics::register`]).

use std::time::Duration;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

/// Bucket bounds of the operations' latency histogram, seconds: an apply through a near
/// agent takes tens of milliseconds, a deletecollection or a far cluster seconds, and the
/// longest run to their timeout.
const OPERATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

fn operation_histogram() -> Histogram {
    Histogram::new(OPERATION_BUCKETS)
}

/// The counters the driver ([`super::submit()`]) records (cheap to clone: clones share their
/// values).
#[derive(Clone, Debug)]
pub struct OperationMetrics {
    /// Finished operations by type (apply, delete, ...) and state (succeeded, failed,
    /// timedOut, noAgent).
    pub operations: Family<[(&'static str, &'static str); 2], Counter>,
    /// Operations resent to another replica after the chosen one left.
    pub retries: Counter,
    /// Seconds from an operation's submission until its answer, by type and state.
    pub durations: Family<[(&'static str, &'static str); 2], Histogram>,
}

impl Default for OperationMetrics {
    fn default() -> Self {
        OperationMetrics {
            operations: Family::default(),
            retries: Counter::default(),
            durations: Family::new_with_constructor(operation_histogram),
        }
    }
}

impl OperationMetrics {
    /// Adds the metrics to `registry` (the hub's, prefixed `scale_agent_hub`), as
    /// `operations_total` and `operation_retries_total`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "operations",
            "Operations finished, by type and state",
            self.operations.clone(),
        );
        registry.register(
            "operation_retries",
            "Operations resent to another replica after the chosen one left before answering",
            self.retries.clone(),
        );
        registry.register(
            "operation_duration_seconds",
            "Seconds from an operation's submission until its answer, by type and state",
            self.durations.clone(),
        );
    }

    /// Counts a finished operation (`state` is one of a few fixed names).
    pub fn finished(&self, kind: &'static str, state: &str) {
        self.operations
            .get_or_create(&[("type", kind), ("state", state_label(state))])
            .inc();
    }

    /// Records how long a finished operation took, submission to answer.
    pub fn took(&self, kind: &'static str, state: &str, took: Duration) {
        self.durations
            .get_or_create(&[("type", kind), ("state", state_label(state))])
            .observe(took.as_secs_f64());
    }
}

/// One of a few fixed names, so the labels stay bounded.
fn state_label(state: &str) -> &'static str {
    match state {
        "succeeded" => "succeeded",
        "timedOut" => "timedOut",
        "noAgent" => "noAgent",
        _ => "failed",
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[test]
    fn names() {
        let m = OperationMetrics::default();
        let mut registry = Registry::with_prefix("scale_agent_hub");
        m.register(&mut registry);
        m.finished("apply", "succeeded");
        m.finished("delete", "whatever");
        m.retries.inc();
        m.took("apply", "succeeded", Duration::from_millis(40));
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            "scale_agent_hub_operations_total{type=\"apply\",state=\"succeeded\"} 1",
            "scale_agent_hub_operations_total{type=\"delete\",state=\"failed\"} 1",
            "scale_agent_hub_operation_retries_total 1",
            "scale_agent_hub_operation_duration_seconds_count{type=\"apply\",state=\"succeeded\"} 1",
            "scale_agent_hub_operation_duration_seconds_bucket{le=\"0.025\",type=\"apply\",state=\"succeeded\"} 0",
            "scale_agent_hub_operation_duration_seconds_bucket{le=\"0.05\",type=\"apply\",state=\"succeeded\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
