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

/// 200 when the agent itself works (no account, or at least one account's credentials
/// loaded and its API server answered), whether or not the hub is reachable: the hub's
/// state and the failing accounts are in the body, on `/accounts`, in
/// `scale_agent_agent_hub_connected` and `scale_agent_agent_account_ready`, not in the pod's
/// readiness.
async fn readyz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let view = shared.view();
    let waiting = view.not_prepared();
    if view.ready() {
        let mut notes = Vec::new();
        if !view.hub_connected {
            notes.push(format!(
                "not connected to the hub at {}: see /accounts and scale_agent_agent_hub_connected",
                view.hub
            ));
        }
        if !waiting.is_empty() {
            notes.push(format!(
                "accounts not served, retried with backoff: {}; see /accounts and \
                 scale_agent_agent_account_ready",
                waiting.join(", ")
            ));
        }
        let body = if notes.is_empty() {
            "ready".to_string()
        } else {
            format!("ready ({})", notes.join("; "))
        };
        return (StatusCode::OK, body);
    }
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "no account's credentials are loaded yet: {}",
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
