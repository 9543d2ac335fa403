//! What the gRPC service records: the agents' messages, resumes and relists, and the Acks
//! it held for the store. Registered in the hub's registry by the hub's `Metrics`.

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

/// The agent streams' counters (cheap to clone: clones share their values).
#[derive(Clone, Debug, Default)]
pub struct GrpcMetrics {
    /// By message type (hello, register_account, object, bookmark, ...).
    pub events_received: Family<[(&'static str, &'static str); 1], Counter>,
    pub bytes_received: Counter,
    pub resumes: Counter,
    pub relists: Counter,
    /// Acks a stream held because the store was behind or failing.
    pub acks_held: Counter,
    /// Streams refused or ended at a limit of their agent identity (review F14), by limit
    /// (`streams`: `--max-streams-per-identity`; `staged_bytes`: `--max-staged-bytes`).
    pub identity_limit_refusals: Family<[(&'static str, &'static str); 1], Counter>,
}

impl GrpcMetrics {
    /// Counts a message received from an agent, of type `kind` and `bytes` encoded.
    pub fn received(&self, kind: &'static str, bytes: usize) {
        self.events_received.get_or_create(&[("type", kind)]).inc();
        self.bytes_received.inc_by(bytes as u64);
    }

    /// Counts a stream refused or ended at its identity's `limit`.
    pub fn identity_limit_refused(&self, limit: &'static str) {
        self.identity_limit_refusals
            .get_or_create(&[("limit", limit)])
            .inc();
    }

    /// Adds `acks_held_total` to `registry` (the hub's, prefixed `scale_agent_hub`). Apart
    /// from [`Self::register`]: `/metrics` lists it after the store's metrics.
    pub fn register_acks_held(&self, registry: &mut Registry) {
        registry.register(
            "acks_held",
            "Times an agent's acknowledgement waited for the store (behind or failing)",
            self.acks_held.clone(),
        );
    }

    /// Adds `events_received_total`, `bytes_received_total`, `resumes_total` and
    /// `relists_total` to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "events_received",
            "Messages received from agents, by type",
            self.events_received.clone(),
        );
        registry.register(
            "bytes_received",
            "Bytes of messages received from agents",
            self.bytes_received.clone(),
        );
        registry.register(
            "resumes",
            "Kinds handed to a streaming replica with a resume point (no relist needed)",
            self.resumes.clone(),
        );
        registry.register(
            "relists",
            "Snapshots started by agents (a kind listed instead of resumed)",
            self.relists.clone(),
        );
        registry.register(
            "agent_identity_limit_refusals",
            "Agent streams refused or ended at a limit of their identity, by limit (streams: \
             --max-streams-per-identity; staged_bytes: --max-staged-bytes)",
            self.identity_limit_refusals.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[test]
    fn names() {
        let m = GrpcMetrics::default();
        let mut registry = Registry::with_prefix("scale_agent_hub");
        m.register_acks_held(&mut registry);
        m.register(&mut registry);
        m.received("object", 10);
        m.received("object", 5);
        m.resumes.inc_by(2);
        m.relists.inc();
        m.acks_held.inc();
        m.identity_limit_refused("streams");
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            "scale_agent_hub_acks_held_total 1",
            "scale_agent_hub_events_received_total{type=\"object\"} 2",
            "scale_agent_hub_bytes_received_total 15",
            "scale_agent_hub_resumes_total 2",
            "scale_agent_hub_relists_total 1",
            "scale_agent_hub_agent_identity_limit_refusals_total{limit=\"streams\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
