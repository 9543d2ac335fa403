//! The Kubernetes API proxy's Prometheus metrics: requests by method, who answered and status
//! class, response bytes passed from agents to clients, and the exchanges open now. The hub's
//! metrics registry registers them ([`ProxyMetrics::register`]).

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

/// What the proxy records (cheap to clone: clones share their values).
#[derive(Clone, Debug, Default)]
pub struct ProxyMetrics {
    /// Kubernetes API proxy requests by method, who answered (tunnel, cache, hub) and status
    /// class.
    pub requests: Family<[(&'static str, &'static str); 3], Counter>,
    /// Response body bytes the proxy passed from agents to clients.
    pub bytes: Counter,
    /// Tunnelled exchanges open now (set when the gauges are refreshed, from the proxy's
    /// open exchanges).
    pub exchanges_open: Gauge,
    /// Reads answered from a cache that may be stale, by why (`agent_away`,
    /// `store_failing`): see [`crate::degraded`].
    pub stale_reads: Family<[(&'static str, &'static str); 1], Counter>,
    /// Writes refused with 503 because the account is degraded, by why.
    pub refused_writes: Family<[(&'static str, &'static str); 1], Counter>,
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
             store_failing: the store cannot commit, so the agents' streams are held)",
            self.stale_reads.clone(),
        );
        registry.register(
            "proxy_refused_writes",
            "Writes answered 503 because the account's agent is away or the store cannot \
             commit, by reason",
            self.refused_writes.clone(),
        );
    }

    /// Counts a proxy request (labels bounded: known methods, three answerers, five classes).
    pub fn request(&self, method: &http::Method, served: &'static str, code: u16) {
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
        m.request(&http::Method::GET, "tunnel", 200);
        m.request(&http::Method::from_bytes(b"PROPFIND").unwrap(), "hub", 503);
        m.bytes.inc_by(7);
        m.exchanges_open.set(2);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            "scale_agent_hub_proxy_requests_total{method=\"GET\",served=\"tunnel\",code=\"2xx\"} 1",
            "scale_agent_hub_proxy_requests_total{method=\"other\",served=\"hub\",code=\"5xx\"} 1",
            "scale_agent_hub_proxy_response_bytes_total 7",
            "scale_agent_hub_proxy_exchanges_open 2",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
