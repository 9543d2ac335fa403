//! Prometheus metrics, named `scale_agent_agent_<what>`, labelled by account and kind only
//! (both bounded by the config file).

use std::sync::Mutex;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

/// Labels of per-kind metrics. `kind` is `plural.group` (`configmaps`, `deployments.apps`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub account: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AccountLabels {
    pub account: String,
}

/// Labels of the watches-by-state gauge; `state` is starting, watching, forbidden or failing.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchStateLabels {
    pub account: String,
    pub state: String,
}

/// Labels of the operations counter: `type` (apply, delete, ...) and `outcome` (succeeded,
/// failed, timedOut).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub account: String,
    pub r#type: String,
    pub outcome: String,
}

/// Labels of the proxy requests counter: `code` is the status class (2xx, 4xx, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyLabels {
    pub account: String,
    pub code: String,
}

/// The agent's metrics. Cheap to share (`Arc`); reading them back in tests is supported by
/// the accessor methods.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Initial or 410-caused LISTs (one per snapshot, however many pages).
    pub lists: Family<KindLabels, Counter>,
    /// Watches started from a resume point the hub gave, without a LIST.
    pub watch_resumes: Family<KindLabels, Counter>,
    /// Watches that ended with 410 Gone, which forces a relist.
    pub watch_gone: Family<KindLabels, Counter>,
    /// Kinds skipped because RBAC forbids list or watch (counted per attempt).
    pub forbidden: Family<KindLabels, Counter>,
    /// ObjectEvents sent to the hub.
    pub events_sent: Family<AccountLabels, Counter>,
    /// Encoded bytes of every AgentMessage sent to the hub.
    pub bytes_sent: Counter,
    /// Messages sent to the hub.
    pub messages_sent: Counter,
    /// Streams to the hub opened after the first one.
    pub reconnects: Counter,
    /// 1 while a stream to the hub is welcomed.
    pub hub_connected: Gauge,
    /// Messages sent and not yet acknowledged.
    pub unacked: Gauge,
    /// 1 when the hub rejected the account.
    pub account_rejected: Family<AccountLabels, Gauge>,
    /// 1 when this replica streams the account.
    pub account_streaming: Family<AccountLabels, Gauge>,
    /// Watches per account and state, refreshed from the admin view when scraped.
    pub watches: Family<WatchStateLabels, Gauge>,
    /// 1 when the account's credentials are loaded and its API server answered, 0 while
    /// not (the reason on `/accounts`); refreshed from the admin view when scraped.
    pub account_ready: Family<AccountLabels, Gauge>,
    /// Config file reloads that changed the config.
    pub config_reloads: Counter,
    /// Config file problems: a change that does not parse or validate, a file that went
    /// missing or unreadable (each keeps the previous config; counted once until the file is
    /// back), and each unknown key of a config read (ignored).
    pub config_errors: Counter,
    /// Operations executed for the hub, by account, type and outcome.
    pub operations: Family<OperationLabels, Counter>,
    /// Operations running now.
    pub operations_running: Gauge,
    /// Kubernetes API proxy requests replayed for the hub, by account and status class.
    pub proxy_requests: Family<ProxyLabels, Counter>,
    /// Encoded bytes of tunnel frames sent to the hub (not in `bytes_sent`).
    pub tunnel_bytes_sent: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let metrics = Self {
            registry: Mutex::new(Registry::default()),
            lists: Family::default(),
            watch_resumes: Family::default(),
            watch_gone: Family::default(),
            forbidden: Family::default(),
            events_sent: Family::default(),
            bytes_sent: Counter::default(),
            messages_sent: Counter::default(),
            reconnects: Counter::default(),
            hub_connected: Gauge::default(),
            unacked: Gauge::default(),
            account_rejected: Family::default(),
            account_streaming: Family::default(),
            watches: Family::default(),
            account_ready: Family::default(),
            config_reloads: Counter::default(),
            config_errors: Counter::default(),
            operations: Family::default(),
            operations_running: Gauge::default(),
            proxy_requests: Family::default(),
            tunnel_bytes_sent: Counter::default(),
        };
        if let Ok(mut registry) = metrics.registry.lock() {
            let r = &mut *registry;
            r.register(
                "scale_agent_agent_build",
                "The agent's version",
                scale_agent_runtime::build_info(),
            );
            r.register(
                "scale_agent_agent_operations",
                "Operations executed for the hub, by account, type and outcome",
                metrics.operations.clone(),
            );
            r.register(
                "scale_agent_agent_operations_running",
                "Operations running now",
                metrics.operations_running.clone(),
            );
            r.register(
                "scale_agent_agent_proxy_requests",
                "Kubernetes API proxy requests replayed against the API server, by account and \
                 status class",
                metrics.proxy_requests.clone(),
            );
            r.register(
                "scale_agent_agent_tunnel_bytes_sent",
                "Encoded bytes of tunnel frames (proxy responses) sent to the hub",
                metrics.tunnel_bytes_sent.clone(),
            );
            r.register(
                "scale_agent_agent_lists",
                "LISTs issued (one per snapshot), by account and kind",
                metrics.lists.clone(),
            );
            r.register(
                "scale_agent_agent_watch_resumes",
                "Watches started from the hub's resume point without a LIST",
                metrics.watch_resumes.clone(),
            );
            r.register(
                "scale_agent_agent_watch_gone",
                "Watches answered 410 Gone, which forces a relist",
                metrics.watch_gone.clone(),
            );
            r.register(
                "scale_agent_agent_kind_forbidden",
                "Attempts to list or watch a kind that RBAC forbids",
                metrics.forbidden.clone(),
            );
            r.register(
                "scale_agent_agent_events_sent",
                "Object events sent to the hub",
                metrics.events_sent.clone(),
            );
            r.register(
                "scale_agent_agent_bytes_sent",
                "Encoded bytes of messages sent to the hub",
                metrics.bytes_sent.clone(),
            );
            r.register(
                "scale_agent_agent_messages_sent",
                "Messages sent to the hub",
                metrics.messages_sent.clone(),
            );
            r.register(
                "scale_agent_agent_reconnects",
                "Streams to the hub opened after the first",
                metrics.reconnects.clone(),
            );
            r.register(
                "scale_agent_agent_account_ready",
                "1 when the account's credentials are loaded and its API server answered, 0 \
                 while not (the agent stays Ready while at least one account is)",
                metrics.account_ready.clone(),
            );
            r.register(
                "scale_agent_agent_hub_connected",
                "1 while a stream to the hub is established",
                metrics.hub_connected.clone(),
            );
            r.register(
                "scale_agent_agent_unacked_messages",
                "Messages sent to the hub and not yet acknowledged",
                metrics.unacked.clone(),
            );
            r.register(
                "scale_agent_agent_account_rejected",
                "1 when the hub rejected the account",
                metrics.account_rejected.clone(),
            );
            r.register(
                "scale_agent_agent_account_streaming",
                "1 when this replica streams the account",
                metrics.account_streaming.clone(),
            );
            r.register(
                "scale_agent_agent_watches",
                "Watches by account and state (starting, watching, forbidden, failing)",
                metrics.watches.clone(),
            );
            r.register(
                "scale_agent_agent_config_reloads",
                "Config file changes applied",
                metrics.config_reloads.clone(),
            );
            r.register(
                "scale_agent_agent_config_errors",
                "Config file problems: invalid or missing file (the previous config stays), unknown keys (ignored)",
                metrics.config_errors.clone(),
            );
        }
        metrics
    }

    /// The metrics in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(registry) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        }
        out
    }

    fn kind(account: &str, kind: &str) -> KindLabels {
        KindLabels {
            account: account.to_string(),
            kind: kind.to_string(),
        }
    }

    /// LISTs issued for `kind` (`plural` or `plural.group`) of `account`.
    pub fn lists_total(&self, account: &str, kind: &str) -> u64 {
        self.lists.get_or_create(&Self::kind(account, kind)).get()
    }

    /// Watches resumed without a LIST for `kind` of `account`.
    pub fn watch_resumes_total(&self, account: &str, kind: &str) -> u64 {
        self.watch_resumes
            .get_or_create(&Self::kind(account, kind))
            .get()
    }

    /// 410 Gone answers for `kind` of `account`.
    pub fn watch_gone_total(&self, account: &str, kind: &str) -> u64 {
        self.watch_gone
            .get_or_create(&Self::kind(account, kind))
            .get()
    }

    /// Counts a proxy request of `account` answered with `code`.
    pub fn proxy_request(&self, account: &str, code: u16) {
        let class = scale_agent_proto::tunnel::status_class(code);
        self.proxy_requests
            .get_or_create(&ProxyLabels {
                account: account.to_string(),
                code: class.to_string(),
            })
            .inc();
    }

    /// Object events sent for `account`.
    pub fn events_sent_total(&self, account: &str) -> u64 {
        self.events_sent
            .get_or_create(&AccountLabels {
                account: account.to_string(),
            })
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_carries_the_version() {
        let line = format!(
            "scale_agent_agent_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        let text = Metrics::new().encode();
        assert!(text.contains(&line), "{line} missing in\n{text}");
    }

    #[test]
    fn names_carry_the_component_prefix_and_total_suffix() {
        let metrics = Metrics::new();
        metrics
            .lists
            .get_or_create(&Metrics::kind("prod", "configmaps"))
            .inc();
        metrics.reconnects.inc();
        let text = metrics.encode();
        assert!(
            text.contains(r#"scale_agent_agent_lists_total{account="prod",kind="configmaps"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("scale_agent_agent_reconnects_total 1"),
            "{text}"
        );
        assert_eq!(metrics.lists_total("prod", "configmaps"), 1);
        assert_eq!(metrics.watch_resumes_total("prod", "configmaps"), 0);
    }
}
