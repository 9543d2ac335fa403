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

async fn readyz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let view = shared.view();
    if view.ready() {
        (StatusCode::OK, "ready".to_string())
    } else if !view.hub_connected {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not connected to the hub".to_string(),
        )
    } else {
        let waiting: Vec<String> = view
            .accounts
            .iter()
            .filter(|a| {
                a.role == crate::state::ROLE_PENDING
                    || (a.role == crate::state::ROLE_STREAMING && !a.kinds_started)
            })
            .map(|a| a.name.clone())
            .collect();
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("accounts not started yet: {}", waiting.join(", ")),
        )
    }
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
