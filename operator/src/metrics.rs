//! Prometheus metrics (`scale_agent_operator_*`) and the HTTP listener serving them with
//! health endpoints.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::error::{Error, Result};

/// Labels of a reconcile: which controller (bounded).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `scaleagent` or `agentaccount`.
    pub controller: &'static str,
}

/// Labels of a failed reconcile: controller and error category (both bounded).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// `scaleagent` or `agentaccount`.
    pub controller: &'static str,
    /// [`crate::Error::category`].
    pub error: &'static str,
}

/// Labels of one ScaleAgent's client certificate (one series per ScaleAgent).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabels {
    /// The ScaleAgent's namespace.
    pub namespace: String,
    /// The ScaleAgent's name.
    pub scaleagent: String,
}

/// The operator's metrics.
#[derive(Debug)]
pub struct Metrics {
    /// Reconciles run.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Reconciles failed, by error category.
    pub failures: Family<FailureLabels, Counter>,
    /// Objects applied (created or changed).
    pub writes: Family<ControllerLabels, Counter>,
    /// Reconcile duration in seconds.
    pub duration: Family<ControllerLabels, Histogram>,
    /// The agent client certificate's notAfter, Unix seconds.
    pub certificate_expiry: Family<CertificateLabels, Gauge>,
    /// When the operator renews the agent client certificate (2/3 of its lifetime), Unix
    /// seconds.
    pub certificate_renewal: Family<CertificateLabels, Gauge>,
    registry: Registry,
    /// Whether the controllers run with their caches filled: what `/readyz` answers.
    controllers_running: AtomicBool,
    /// A replica standing by for the Lease: ready too (a rollout must not wait on it).
    standby: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("scale_agent_operator");
        registry.register(
            "build",
            "The operator's version",
            scale_agent_runtime::build_info(),
        );
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let failures = Family::<FailureLabels, Counter>::default();
        let writes = Family::<ControllerLabels, Counter>::default();
        let duration = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
        });
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register(
            "reconcile_failures",
            "Reconciles that failed",
            failures.clone(),
        );
        registry.register("writes", "Objects created or changed", writes.clone());
        registry.register(
            "reconcile_duration_seconds",
            "How long reconciles take",
            duration.clone(),
        );
        let certificate_expiry = Family::<CertificateLabels, Gauge>::default();
        let certificate_renewal = Family::<CertificateLabels, Gauge>::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "When the agent client certificate of a ScaleAgent expires (notAfter), Unix time",
            certificate_expiry.clone(),
        );
        registry.register(
            "certificate_renewal_timestamp_seconds",
            "When the operator renews the agent client certificate of a ScaleAgent, Unix time",
            certificate_renewal.clone(),
        );
        Self {
            reconciles,
            failures,
            writes,
            duration,
            certificate_expiry,
            certificate_renewal,
            registry,
            controllers_running: AtomicBool::new(false),
            standby: AtomicBool::new(false),
        }
    }

    /// Records whether the controllers are running (their first lists are in).
    pub fn set_controllers_running(&self, running: bool) {
        self.controllers_running.store(running, Ordering::Release);
    }

    /// Records whether this replica stands by for the Lease (leader election).
    pub fn set_standby(&self, standby: bool) {
        self.standby.store(standby, Ordering::Release);
    }

    /// Whether this replica stands by for the Lease.
    pub fn standby(&self) -> bool {
        self.standby.load(Ordering::Acquire)
    }

    /// Whether the controllers are running: `/readyz` says ok only then (or on standby).
    pub fn controllers_running(&self) -> bool {
        self.controllers_running.load(Ordering::Acquire)
    }

    /// Records a finished reconcile.
    pub fn reconciled(&self, controller: &'static str, took: Duration) {
        let labels = ControllerLabels { controller };
        self.reconciles.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// Records a failed reconcile.
    pub fn failed(&self, controller: &'static str, error: &Error) {
        self.failures
            .get_or_create(&FailureLabels {
                controller,
                error: error.category(),
            })
            .inc();
    }

    /// Records the client certificate of ScaleAgent `namespace/name`: its notAfter and
    /// renewal time (Unix seconds), or `None` to drop its series (no certificate known, or the
    /// ScaleAgent is gone).
    pub fn certificate(&self, namespace: &str, name: &str, times: Option<(i64, i64)>) {
        let labels = CertificateLabels {
            namespace: namespace.to_owned(),
            scaleagent: name.to_owned(),
        };
        match times {
            Some((not_after, renew_at)) => {
                self.certificate_expiry
                    .get_or_create(&labels)
                    .set(not_after);
                self.certificate_renewal
                    .get_or_create(&labels)
                    .set(renew_at);
            }
            None => {
                self.certificate_expiry.remove(&labels);
                self.certificate_renewal.remove(&labels);
            }
        }
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

async fn metrics(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(),
    )
}

async fn readyz(State(metrics): State<Arc<Metrics>>) -> (StatusCode, &'static str) {
    if metrics.controllers_running() {
        (StatusCode::OK, "ok")
    } else if metrics.standby() {
        (StatusCode::OK, "ok: standing by for the leader Lease")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "controllers not running: starting, or stopped (see the operator's log)",
        )
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` (ok once the controllers run) on `address`
/// until `shutdown` completes.
pub async fn serve(
    address: SocketAddr,
    metrics_registry: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(metrics_registry);
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(Error::Metrics)?;
    tracing::info!(%address, "serving metrics and health");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(Error::Metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_carries_the_version() {
        let line = format!(
            "scale_agent_operator_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        let text = Metrics::new().render();
        assert!(text.contains(&line), "{line} missing in\n{text}");
    }

    #[test]
    fn certificate_times_are_set_and_dropped_per_scale_agent() {
        let metrics = Metrics::new();
        metrics.certificate("team", "prod", Some((2_000, 1_600)));
        metrics.certificate("team", "test", Some((3_000, 2_600)));
        let text = metrics.render();
        for series in [
            "scale_agent_operator_certificate_expiry_timestamp_seconds{namespace=\"team\",scaleagent=\"prod\"} 2000",
            "scale_agent_operator_certificate_renewal_timestamp_seconds{namespace=\"team\",scaleagent=\"prod\"} 1600",
            "scale_agent_operator_certificate_expiry_timestamp_seconds{namespace=\"team\",scaleagent=\"test\"} 3000",
        ] {
            assert!(text.contains(series), "no {series} in {text}");
        }
        metrics.certificate("team", "prod", None);
        let text = metrics.render();
        assert!(!text.contains("scaleagent=\"prod\""), "{text}");
        assert!(text.contains("scaleagent=\"test\""), "{text}");
    }

    #[test]
    fn renders_bounded_series() {
        let metrics = Metrics::new();
        metrics.reconciled("scaleagent", Duration::from_millis(20));
        metrics.failed("scaleagent", &Error::MissingField("x"));
        let text = metrics.render();
        assert!(
            text.contains("scale_agent_operator_reconciles_total{controller=\"scaleagent\"} 1"),
            "{text}"
        );
        assert!(text.contains("error=\"missing_field\""), "{text}");
    }

    /// Every ScaleAgent reconcile runs inside `finalizer()`; its failures are labelled with
    /// what failed inside, not `finalizer`.
    #[test]
    fn finalizer_failures_are_labelled_with_the_inner_category() {
        use kube::runtime::finalizer;
        let metrics = Metrics::new();
        let inner = |error| Error::Finalizer(Box::new(error));
        metrics.failed(
            "scaleagent",
            &inner(finalizer::Error::ApplyFailed(Error::Certificate(
                "no CA".into(),
            ))),
        );
        metrics.failed(
            "scaleagent",
            &inner(finalizer::Error::CleanupFailed(Error::MissingField("x"))),
        );
        let text = metrics.render();
        for category in ["certificate", "missing_field"] {
            let series = format!(
                "scale_agent_operator_reconcile_failures_total{{controller=\"scaleagent\",error=\"{category}\"}} 1"
            );
            assert!(text.contains(&series), "no {series} in {text}");
        }
        assert!(!text.contains("error=\"finalizer\""), "{text}");
    }
}
