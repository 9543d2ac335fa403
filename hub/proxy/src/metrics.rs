//! The Kubernetes API proxy's Prometheus metrics: requests by method, who answered and status
//! class, how long they took by who answered, response bytes passed from agents to clients,
//! and the exchanges open now. The hub's metrics registry registers them
//! ([`ProxyMetrics::register`]).

use std::time::Duration;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Bucket bounds of the proxy's latency histogram, seconds: a cached GET takes a fraction of
/// a millisecond, a tunnelled one to a far cluster tens of milliseconds, a large LIST seconds.
const REQUEST_BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
];

fn request_histogram() -> Histogram {
    Histogram::new(REQUEST_BUCKETS)
}

/// What the proxy records (cheap to clone: clones share their values).
#[derive(Clone, Debug)]
pub struct ProxyMetrics {
    /// Kubernetes API proxy requests by method, who answered (tunnel, cache, hub) and status
    /// class.
    pub requests: Family<[(&'static str, &'static str); 3], Counter>,
    /// Response body bytes the proxy passed from agents to clients.
    pub bytes: Counter,
    /// Tunnelled exchanges open now (set when the gauges are refreshed, from the proxy's
    /// open exchanges).
    pub exchanges_open: Gauge,
    /// Reads answered from a cache that may be stale, by why (`agent_away`, `agent_silent`,
    /// `store_failing`): see [`crate::degraded`].
    pub stale_reads: Family<[(&'static str, &'static str); 1], Counter>,
    /// Writes refused with 503 because the account is degraded, by why.
    pub refused_writes: Family<[(&'static str, &'static str); 1], Counter>,
    /// Seconds from a request's arrival until its response's headers, by who answered
    /// (cache, tunnel, owner, hub). A watch's or a large LIST's body streams after.
    pub durations: Family<[(&'static str, &'static str); 1], Histogram>,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        ProxyMetrics {
            requests: Family::default(),
            bytes: Counter::default(),
            exchanges_open: Gauge::default(),
            stale_reads: Family::default(),
            refused_writes: Family::default(),
            durations: Family::new_with_constructor(request_histogram),
        }
    }
}

impl ProxyMetrics {
    /// Adds the metrics to `registry` (the hub's, prefixed `scale_agent_hub`), as
    /// `proxy_requests_total`, `proxy_response_bytes_total` and `proxy_exchanges_open`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "proxy_requests",
            "Kubernetes API proxy requests, by method, by who answered (tunnel: the cluster \
             through an agent; cache: the hub's discovery cache; hub: an error of the hub's own) \
             and by status class",
            self.requests.clone(),
        );
        registry.register(
            "proxy_response_bytes",
            "Response body bytes the Kubernetes API proxy passed from agents to clients",
            self.bytes.clone(),
        );
        registry.register(
            "proxy_exchanges_open",
            "Tunnelled HTTP exchanges open now (watches and log follows stay open)",
            self.exchanges_open.clone(),
        );
        registry.register(
            "proxy_stale_reads",
            "Reads answered from the hub's cache while it may be stale, with a Warning \
             header, by reason (agent_away: no agent connected, within the grace period; \
             agent_silent: the streaming agent's heartbeat is overdue; store_failing: the store cannot commit, so the agents' streams are held)",
            self.stale_reads.clone(),
        );
        registry.register(
            "proxy_refused_writes",
            "Writes answered 503 because the account's agent is away or silent or the \
             store cannot commit, by reason",
            self.refused_writes.clone(),
        );
        registry.register(
            "proxy_request_duration_seconds",
            "Seconds from a Kubernetes API proxy request's arrival until its response's headers, \
             by who answered (cache: the hub's cache; tunnel: the cluster through an agent; \
             owner: forwarded to the replica that owns the account; hub: refused or an error \
             of the hub's own). A watch's or a LIST's body streams after",
            self.durations.clone(),
        );
    }

    /// Counts a proxy request (labels bounded: known methods, four answerers, five classes)
    /// and records how long it took until its response's headers.
    pub fn request(&self, method: &http::Method, served: &'static str, code: u16, took: Duration) {
        self.durations
            .get_or_create(&[("served", served)])
            .observe(took.as_secs_f64());
        let method = match method.as_str() {
            "GET" => "GET",
            "POST" => "POST",
            "PUT" => "PUT",
            "PATCH" => "PATCH",
            "DELETE" => "DELETE",
            "HEAD" => "HEAD",
            "OPTIONS" => "OPTIONS",
            _ => "other",
        };
        let class = scale_agent_proto::tunnel::status_class(code);
        self.requests
            .get_or_create(&[("method", method), ("served", served), ("code", class)])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[test]
    fn names() {
        let m = ProxyMetrics::default();
        let mut registry = Registry::with_prefix("scale_agent_hub");
        m.register(&mut registry);
        m.request(&http::Method::GET, "tunnel", 200, Duration::from_millis(30));
        m.request(
            &http::Method::from_bytes(b"PROPFIND").unwrap(),
            "hub",
            503,
            Duration::from_micros(300),
        );
        m.bytes.inc_by(7);
        m.exchanges_open.set(2);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            "scale_agent_hub_proxy_requests_total{method=\"GET\",served=\"tunnel\",code=\"2xx\"} 1",
            "scale_agent_hub_proxy_requests_total{method=\"other\",served=\"hub\",code=\"5xx\"} 1",
            "scale_agent_hub_proxy_response_bytes_total 7",
            "scale_agent_hub_proxy_exchanges_open 2",
            "scale_agent_hub_proxy_request_duration_seconds_count{served=\"tunnel\"} 1",
            "scale_agent_hub_proxy_request_duration_seconds_bucket{le=\"0.02\",served=\"tunnel\"} 0",
            "scale_agent_hub_proxy_request_duration_seconds_bucket{le=\"0.05\",served=\"tunnel\"} 1",
            "scale_agent_hub_proxy_request_duration_seconds_bucket{le=\"0.0005\",served=\"hub\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
