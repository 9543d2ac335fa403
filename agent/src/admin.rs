//! The admin listener, the agent's only one: `/healthz`, `/readyz`, `/metrics`, `/accounts`.

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};

use crate::state::{AgentView, Shared};

/// The admin routes.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/accounts", get(accounts))
        .with_state(shared)
}

/// 200 when the agent itself works (every account's credentials loaded and its API server
/// answered), whether or not the hub is reachable: the hub's state is in the body, on
/// `/accounts` and in `scale_agent_agent_hub_connected`, not in the pod's readiness.
async fn readyz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let view = shared.view();
    if view.ready() {
        let body = if view.hub_connected {
            "ready".to_string()
        } else {
            format!(
                "ready (not connected to the hub at {}: see /accounts and scale_agent_agent_hub_connected)",
                view.hub
            )
        };
        return (StatusCode::OK, body);
    }
    let waiting: Vec<String> = view
        .accounts
        .iter()
        .filter(|a| !a.prepared)
        .map(|a| match &a.error {
            Some(error) => format!("{} ({error})", a.name),
            None => a.name.clone(),
        })
        .collect();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "accounts whose credentials are not loaded yet: {}",
            waiting.join(", ")
        ),
    )
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.encode_metrics(),
    )
}

async fn accounts(State(shared): State<Arc<Shared>>) -> Json<AgentView> {
    Json(shared.view())
}
