//! The health routes: `/healthz` (the process answers), `/readyz` (the store is open and
//! gRPC listens), `/readyz/store` (the store commits) and `/metrics`. They see the rest of
//! the hub only through [`Health`], which the hub's wiring implements.

use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};

/// What the health routes ask of the hub around the API: whether it is ready, why its store
/// cannot commit, and its metrics. The hub's wiring answers (the facade's `Hub` implements
/// it), so the API reads no readiness flag, store queue or metrics registry itself.
pub trait Health: Send + Sync {
    /// Whether the store is open and gRPC listens.
    fn readiness(&self) -> Readiness;
    /// Why the store cannot commit, in words for people; `None` while it commits.
    fn store_failure(&self) -> Option<String>;
    /// The metrics, gauges refreshed, in the OpenMetrics text format.
    fn metrics(&self) -> String;
}

/// The two conditions of readiness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    pub store_open: bool,
    pub grpc_listening: bool,
}

/// `/healthz`, `/readyz` and `/readyz/store`: open to anyone (probes carry no token).
pub(super) fn probes<S: Clone + Send + Sync + 'static>(health: Arc<dyn Health>) -> Router<S> {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/readyz/store", get(store_ready))
        .with_state(health)
}

/// `/metrics`, alone so that the router can put a role in front of it (or not, with
/// `--metrics-unauthenticated`).
pub(super) fn metrics_route<S: Clone + Send + Sync + 'static>(
    health: Arc<dyn Health>,
) -> Router<S> {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(health)
}

/// Ready while the store is open and gRPC listens. A store that cannot commit (a full
/// volume) does not make the hub unready: it still serves every read from memory and keeps
/// the agents' streams (holding their Acks), and taking it out of its Service would stop
/// those reads too. The body says so, and `/readyz/store` fails.
async fn readyz(State(health): State<Arc<dyn Health>>) -> Response {
    let Readiness {
        store_open: store,
        grpc_listening: grpc,
    } = health.readiness();
    if store && grpc {
        match health.store_failure() {
            None => (StatusCode::OK, "ready\n").into_response(),
            Some(why) => (StatusCode::OK, format!("ready (degraded: {why})\n")).into_response(),
        }
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: store open {store}, gRPC listening {grpc}\n"),
        )
            .into_response()
    }
}

/// 200 while the store commits, 503 (with the reason) while it cannot: for alerts and
/// probes that must see a full volume.
async fn store_ready(State(health): State<Arc<dyn Health>>) -> Response {
    match health.store_failure() {
        None => (StatusCode::OK, "store commits\n").into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn metrics(State(health): State<Arc<dyn Health>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        health.metrics(),
    )
        .into_response()
}
