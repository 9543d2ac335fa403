//! The registrar's Prometheus metrics. Labels are bounded: method (`PUT`, `DELETE`) and a
//! few fixed results; account names are never labels.

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

/// Counters and gauges of the Clouddriver registrar (cheap to clone: they share their
/// values).
#[derive(Clone, Debug, Default)]
pub struct ClouddriverMetrics {
    /// Account Management API requests by method and result: `success`, `retry` (Clouddriver
    /// answered 5xx/409/429), `rejected` (another 4xx: a configuration problem) or
    /// `unreachable` (no answer).
    pub requests: Family<[(&'static str, &'static str); 2], Counter>,
    /// Accounts registered through the API (the ledger's size).
    pub accounts_registered: Gauge,
    /// Accounts whose registration or removal has not succeeded yet, on either target.
    pub accounts_pending: Gauge,
    /// Rewrites of the dynamic-config file by result (`success`, `error`).
    pub file_writes: Family<[(&'static str, &'static str); 1], Counter>,
}

impl ClouddriverMetrics {
    /// Adds the metrics to `registry` (the hub's, prefixed `scale_agent_hub`), as
    /// `clouddriver_requests_total`, `clouddriver_accounts_registered`,
    /// `clouddriver_accounts_pending` and `clouddriver_file_writes_total`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "clouddriver_requests",
            "Requests to Clouddriver's Account Management API, by method and result",
            self.requests.clone(),
        );
        registry.register(
            "clouddriver_accounts_registered",
            "Accounts registered in Clouddriver through the Account Management API",
            self.accounts_registered.clone(),
        );
        registry.register(
            "clouddriver_accounts_pending",
            "Accounts whose registration in Clouddriver (or removal) has not succeeded yet",
            self.accounts_pending.clone(),
        );
        registry.register(
            "clouddriver_file_writes",
            "Rewrites of the Clouddriver dynamic-config accounts file, by result",
            self.file_writes.clone(),
        );
    }

    pub(crate) fn request(&self, method: &'static str, result: &'static str) {
        self.requests
            .get_or_create(&[("method", method), ("result", result)])
            .inc();
    }

    pub(crate) fn file_write(&self, ok: bool) {
        let result = if ok { "success" } else { "error" };
        self.file_writes.get_or_create(&[("result", result)]).inc();
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[test]
    fn names() {
        let m = ClouddriverMetrics::default();
        let mut registry = Registry::with_prefix("scale_agent_hub");
        m.register(&mut registry);
        m.request("PUT", "success");
        m.request("DELETE", "retry");
        m.file_write(true);
        m.accounts_registered.set(2);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            "scale_agent_hub_clouddriver_requests_total{method=\"PUT\",result=\"success\"} 1",
            "scale_agent_hub_clouddriver_requests_total{method=\"DELETE\",result=\"retry\"} 1",
            "scale_agent_hub_clouddriver_accounts_registered 2",
            "scale_agent_hub_clouddriver_accounts_pending 0",
            "scale_agent_hub_clouddriver_file_writes_total{result=\"success\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
