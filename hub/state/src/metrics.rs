//! The metrics [`Live`](crate::Live) records. The hub's `metrics` module registers them in
//! its registry (prefixed `scale_agent_hub`), beside its own.

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

/// Counters of the live state (cheap to clone: clones share their values).
#[derive(Clone, Debug, Default)]
pub struct StreamMetrics {
    /// Account state transitions, by the state entered.
    pub account_transitions: Family<[(&'static str, &'static str); 1], Counter>,
}

impl StreamMetrics {
    /// Adds the metrics to `registry`, as `account_transitions_total`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "account_transitions",
            "Account state transitions, by the state entered",
            self.account_transitions.clone(),
        );
    }
}
