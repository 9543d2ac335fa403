//! Prometheus metrics (prometheus-client). Labels are bounded: only the message type.

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use scale_agent_hub_net::limits::ListenerMetrics;
use scale_agent_hub_operations::OperationMetrics;
use scale_agent_hub_state::StreamMetrics;
use scale_agent_hub_store::StoreMetrics;

use crate::{process_metrics::ProcessMetrics, proxy::ProxyMetrics, service::GrpcMetrics};

/// The hub's metrics.
pub struct Metrics {
    registry: std::sync::Mutex<Registry>,
    pub connected_agents: Gauge,
    pub accounts: Gauge,
    /// Accounts by lifecycle state (ACTIVE, INACTIVE, FAILED, ORPHANED).
    pub accounts_by_state: Family<[(&'static str, &'static str); 1], Gauge>,
    /// What the live state records (account state transitions).
    pub stream: StreamMetrics,
    pub objects_cached: Gauge,
    /// Bytes of objects the watch histories hold (against `--watch-history-mib`).
    pub watch_history_bytes: Gauge,
    /// Watch history events dropped for `--watch-history-mib` (not the per-kind limits).
    pub watch_history_evicted: Counter,
    /// Bytes of discovery and OpenAPI documents the proxy keeps (against
    /// `--discovery-cache-mib`).
    pub discovery_cache_bytes: Gauge,
    /// Discovery documents dropped for `--discovery-cache-mib`.
    pub discovery_cache_evicted: Counter,
    /// Bytes the cache holds for objects, all accounts (against `--max-cached-mib`).
    pub cached_object_bytes: Gauge,
    /// Snapshots and objects refused for `--max-cached-mib`.
    pub cached_bytes_refusals: Counter,
    /// What the gRPC service records (messages received, resumes, relists, Acks held):
    /// defined by the service, registered here.
    pub grpc: GrpcMetrics,
    /// Finished operations and retries (`operations_total`, `operation_retries_total`):
    /// defined by the operations crate, registered here.
    pub operations: OperationMetrics,
    /// The Kubernetes API proxy's (`proxy_requests_total`, `proxy_response_bytes_total`,
    /// `proxy_exchanges_open`): defined by the proxy, registered here.
    pub proxy: ProxyMetrics,
    /// The commit writer's (`store_failing`, `store_commit_failures`,
    /// `store_queued_changes`): defined by the store crate, registered here.
    pub store: StoreMetrics,
    /// The process's RSS, CPU seconds, open files and threads, read at each scrape.
    pub process: ProcessMetrics,
    /// Both listeners' open, refused and timed-out connections (`listener_connections`,
    /// `listener_connections_refused_total`, `listener_header_timeouts_total`): defined by
    /// the net crate, registered here.
    pub listeners: ListenerMetrics,
    /// Seconds until the notAfter of each serving certificate file, by listener (grpc,
    /// http) and file; negative once expired. Set at each scrape from
    /// [`Metrics::certificate_not_after`].
    tls_certificate_expiry: Family<[(&'static str, String); 2], Gauge>,
    /// (listener, file) → notAfter (Unix seconds) of the certificate in use, as last loaded.
    certificate_not_after:
        std::sync::Mutex<std::collections::BTreeMap<(&'static str, String), i64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("scale_agent_hub");
        registry.register(
            "build",
            "The hub's version",
            scale_agent_runtime::build_info(),
        );
        let connected_agents = Gauge::default();
        let accounts = Gauge::default();
        let accounts_by_state = Family::default();
        let stream = StreamMetrics::default();
        let objects_cached = Gauge::default();
        let watch_history_bytes = Gauge::default();
        let watch_history_evicted = Counter::default();
        let discovery_cache_bytes = Gauge::default();
        let discovery_cache_evicted = Counter::default();
        let cached_object_bytes = Gauge::default();
        let cached_bytes_refusals = Counter::default();
        let grpc = GrpcMetrics::default();
        let operations = OperationMetrics::default();
        let proxy = ProxyMetrics::default();
        let store = StoreMetrics::default();
        let process = ProcessMetrics::default();
        process.register(&mut registry);
        let listeners = ListenerMetrics::default();
        listeners.register(&mut registry);
        let tls_certificate_expiry = Family::default();
        store.register(&mut registry);
        grpc.register_acks_held(&mut registry);
        registry.register(
            "tls_certificate_expiry_seconds",
            "Seconds until the notAfter of the serving certificate in use, by listener (grpc, \
             http) and certificate file; negative once expired. Updated when the files are \
             reloaded",
            tls_certificate_expiry.clone(),
        );
        proxy.register(&mut registry);
        operations.register(&mut registry);
        registry.register(
            "connected_agents",
            "Agent streams connected",
            connected_agents.clone(),
        );
        registry.register(
            "accounts",
            "Accounts known (connected or within their grace period)",
            accounts.clone(),
        );
        registry.register(
            "accounts_by_state",
            "Accounts by lifecycle state: ACTIVE (streamed), INACTIVE (no agent, within the grace \
             period), FAILED (no agent, and its last registration rejected or a replica \
             reported it cannot serve it; or the API server refuses the streaming replica's \
             credentials), ORPHANED (no agent took \
             over within the grace period)",
            accounts_by_state.clone(),
        );
        stream.register(&mut registry);
        registry.register(
            "objects_cached",
            "Objects in the cache",
            objects_cached.clone(),
        );
        registry.register(
            "watch_history_bytes",
            "Bytes of objects the watch histories of all accounts and kinds hold (the proxy's \
             watches are served from them; bounded by --watch-history-mib)",
            watch_history_bytes.clone(),
        );
        registry.register(
            "watch_history_evicted",
            "Watch history events dropped to stay within --watch-history-mib",
            watch_history_evicted.clone(),
        );
        registry.register(
            "discovery_cache_bytes",
            "Bytes of discovery and OpenAPI documents the Kubernetes API proxy keeps for all \
             accounts (bounded by --discovery-cache-mib)",
            discovery_cache_bytes.clone(),
        );
        registry.register(
            "discovery_cache_evicted",
            "Discovery and OpenAPI documents dropped to stay within --discovery-cache-mib",
            discovery_cache_evicted.clone(),
        );
        registry.register(
            "cached_object_bytes",
            "Bytes the cache holds for objects, all accounts together: packed JSON, names and \
             indexes (bounded by --max-cached-mib)",
            cached_object_bytes.clone(),
        );
        registry.register(
            "cached_bytes_refusals",
            "Snapshots and objects left out of the cache because they would take it past \
             --max-cached-mib (their kind is then OVER_QUOTA for that account)",
            cached_bytes_refusals.clone(),
        );
        grpc.register(&mut registry);
        Metrics {
            registry: std::sync::Mutex::new(registry),
            connected_agents,
            accounts,
            accounts_by_state,
            stream,
            objects_cached,
            watch_history_bytes,
            watch_history_evicted,
            discovery_cache_bytes,
            discovery_cache_evicted,
            cached_object_bytes,
            cached_bytes_refusals,
            grpc,
            operations,
            proxy,
            store,
            process,
            listeners,
            tls_certificate_expiry,
            certificate_not_after: Default::default(),
        }
    }

    /// Records the notAfter (Unix seconds) of the certificate `listener` serves from `file`.
    pub fn certificate_not_after(&self, listener: &'static str, file: String, not_after: i64) {
        self.certificate_not_after
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((listener, file), not_after);
    }

    /// Sets each certificate's seconds until notAfter as of `now` (Unix seconds).
    pub fn refresh_certificate_expiry(&self, now: i64) {
        let not_after = self
            .certificate_not_after
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for ((listener, file), not_after) in not_after {
            self.tls_certificate_expiry
                .get_or_create(&[("listener", listener.to_string()), ("file", file)])
                .set(not_after - now);
        }
    }

    /// Adds the Clouddriver registrar's metrics (made before the hub's).
    pub fn add_clouddriver(&self, metrics: &crate::clouddriver::ClouddriverMetrics) {
        metrics.register(&mut self.registry.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// The text exposition format (the process figures read now).
    pub fn encode(&self) -> String {
        self.process.refresh();
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        if encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_carries_the_version() {
        let line = format!(
            "scale_agent_hub_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        let text = Metrics::new().encode();
        assert!(text.contains(&line), "{line} missing in\n{text}");
    }

    /// Every metric the registry exposes is named in the guide's metrics page, where an SRE
    /// looks for what it means.
    #[test]
    fn every_metric_is_documented_in_the_guide() {
        let page = include_str!("../../docs/src/operations/metrics.md");
        let m = Metrics::new();
        // A family without a series is left out of the text: give each one.
        m.certificate_not_after("grpc", "tls.crt".into(), 0);
        m.refresh_certificate_expiry(0);
        m.accounts_by_state
            .get_or_create(&[("state", "ACTIVE")])
            .set(1);
        m.stream
            .account_transitions
            .get_or_create(&[("state", "ACTIVE")])
            .inc();
        m.grpc.received("object", 10);
        m.operations.finished("apply", "succeeded");
        m.operations
            .took("apply", "succeeded", std::time::Duration::from_millis(40));
        m.proxy.request(
            &http::Method::GET,
            "cache",
            200,
            std::time::Duration::from_micros(400),
        );
        let text = m.encode();
        for family in [
            "proxy_requests",
            "proxy_request_duration_seconds",
            "operation_duration_seconds",
            "accounts_by_state",
            "account_transitions",
            "tls_certificate_expiry_seconds",
        ] {
            assert!(
                text.contains(&format!("# TYPE scale_agent_hub_{family} ")),
                "{family} not in the text, so not checked:\n{text}"
            );
        }
        let undocumented: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|name| !page.contains(name))
            .collect();
        assert!(
            undocumented.is_empty(),
            "metrics not named in docs/src/operations/metrics.md: {undocumented:?}"
        );
    }

    #[test]
    fn names() {
        let m = Metrics::new();
        m.grpc.received("object", 10);
        m.grpc.relists.inc();
        m.operations.finished("apply", "succeeded");
        m.operations.finished("delete", "whatever");
        m.operations
            .took("apply", "succeeded", std::time::Duration::from_millis(40));
        let text = m.encode();
        for name in [
            "scale_agent_hub_connected_agents",
            "scale_agent_hub_accounts",
            "scale_agent_hub_objects_cached",
            "scale_agent_hub_watch_history_bytes 0",
            "scale_agent_hub_watch_history_evicted_total 0",
            "scale_agent_hub_events_received_total{type=\"object\"} 1",
            "scale_agent_hub_bytes_received_total 10",
            "scale_agent_hub_resumes_total 0",
            "scale_agent_hub_relists_total 1",
            "scale_agent_hub_operations_total{type=\"apply\",state=\"succeeded\"} 1",
            "scale_agent_hub_operations_total{type=\"delete\",state=\"failed\"} 1",
            "scale_agent_hub_operation_retries_total 0",
            "scale_agent_hub_store_failing 0",
            "scale_agent_hub_store_commit_failures_total 0",
            "scale_agent_hub_store_queued_changes 0",
            "scale_agent_hub_acks_held_total 0",
            "scale_agent_hub_operation_duration_seconds",
            "scale_agent_hub_store_commit_duration_seconds_count 0",
            "scale_agent_hub_process_cpu_seconds_total",
            "scale_agent_hub_process_open_fds",
            "scale_agent_hub_process_threads",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
        let rss = text
            .lines()
            .find_map(|l| l.strip_prefix("scale_agent_hub_process_resident_memory_bytes "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        assert!(rss > Some(1_048_576.0), "RSS read at the scrape:\n{text}");
    }
}
