//! The operations' Prometheus metrics: finished operations by type and state, and retries on
//! another replica. The hub's metrics registry registers them ([`OperationMetrics::register`]).

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

/// The counters the driver ([`super::submit()`]) records (cheap to clone: clones share their
/// values).
#[derive(Clone, Debug, Default)]
pub struct OperationMetrics {
    /// Finished operations by type (apply, delete, ...) and state (succeeded, failed,
    /// timedOut, noAgent).
    pub operations: Family<[(&'static str, &'static str); 2], Counter>,
    /// Operations resent to another replica after the chosen one left.
    pub retries: Counter,
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
    }

    /// Counts a finished operation (`state` is one of a few fixed names).
    pub fn finished(&self, kind: &'static str, state: &str) {
        let state = match state {
            "succeeded" => "succeeded",
            "timedOut" => "timedOut",
            "noAgent" => "noAgent",
            _ => "failed",
        };
        self.operations
            .get_or_create(&[("type", kind), ("state", state)])
            .inc();
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
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            "scale_agent_hub_operations_total{type=\"apply\",state=\"succeeded\"} 1",
            "scale_agent_hub_operations_total{type=\"delete\",state=\"failed\"} 1",
            "scale_agent_hub_operation_retries_total 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
