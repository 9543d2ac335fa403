//! The reader routes over agents, accounts and the hub itself: `/api/v1/agents` and
//! `/api/v1/accounts` (this replica's, or every replica's through [`crate::fleet`] when
//! replicas share the store), `/api/v1/accounts/{name}`, `/api/v1/version` and
//! `/api/v1/clouddriver`; and the internal listings other replicas ask this one for.

use std::sync::Arc;

use axum::{
    Json,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::json;

use super::{
    ApiState, error,
    views::{AccountView, AgentView, local_accounts, local_agents, view_of},
};

/// The hub's version (the agents' are in `/api/v1/agents`).
pub(super) async fn version() -> Json<serde_json::Value> {
    Json(json!({ "version": scale_agent_runtime::VERSION }))
}

/// Every agent stream: of every replica when replicas share the store ([`crate::fleet`]),
/// else of this hub.
pub(super) async fn agents(State(api): State<Arc<ApiState>>) -> Response {
    if api.replicas.shared.is_some() && api.replicas.forwarder.is_some() {
        return Json(crate::fleet::agents(&api.replicas, &api.live).await).into_response();
    }
    Json(local_agents(&api.live)).into_response()
}

/// This replica's agent streams (what the others ask for [`crate::fleet`]).
pub(super) async fn replica_agents(State(api): State<Arc<ApiState>>) -> Json<Vec<AgentView>> {
    Json(local_agents(&api.live))
}

/// Every account the hub has a record or a state for (ORPHANED and FAILED ones included):
/// of every replica, with its owner, when replicas share the store ([`crate::fleet`]).
pub(super) async fn accounts(State(api): State<Arc<ApiState>>) -> Response {
    if api.replicas.shared.is_some() && api.replicas.forwarder.is_some() {
        return match crate::fleet::accounts(&api.replicas, &api.live).await {
            Ok(list) => Json(list).into_response(),
            Err(e) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "cannot read the accounts from the shared store: {}",
                    scale_agent_hub_model::error::Chain(&e)
                ),
            ),
        };
    }
    Json(with_store_health(local_accounts(&api.live), &api)).into_response()
}

/// Each view with the store's health (see `AccountView::with_store_health`).
fn with_store_health(views: Vec<AccountView>, api: &ApiState) -> Vec<AccountView> {
    views
        .into_iter()
        .map(|v| v.with_store_health(&api.commits))
        .collect()
}

/// This replica's view of the accounts (what the others ask for [`crate::fleet`]).
pub(super) async fn replica_accounts(State(api): State<Arc<ApiState>>) -> Json<Vec<AccountView>> {
    Json(with_store_health(local_accounts(&api.live), &api))
}

/// One account, as this replica (its owner: the route is forwarded there) sees it.
pub(super) async fn account(
    State(api): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Response {
    let registry = api.live.registry_read();
    match view_of(&registry, api.live.cache(), &name) {
        Some(view) => Json(view.with_store_health(&api.commits)).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no account {name:?}")),
    }
}

/// Where each account's registration in Clouddriver stands (empty when registration is off).
pub(super) async fn clouddriver(
    State(api): State<Arc<ApiState>>,
) -> Json<Vec<scale_agent_hub_clouddriver::RegistrationStatus>> {
    Json(
        api.registrar
            .as_ref()
            .map(|r| r.status())
            .unwrap_or_default(),
    )
}
