//! The reader routes over agents, accounts and the hub itself: `/api/v1/agents` and
//! `/api/v1/accounts` (this replica's, or every replica's through [`crate::fleet`] when
//! replicas share the store), `/api/v1/accounts/{name}`, `/api/v1/version` and
//! `/api/v1/clouddriver`; and the internal listings other replicas ask this one for.
//!
//! A caller limited to some accounts (an API token's or an OIDC rule's `accounts` globs)
//! sees only those in the listings ([`Scope`]): the same accounts its token may address on
//! the account routes, so a token scoped to `prod-*` does not learn which other clusters the
//! hub serves.

use std::sync::Arc;

use axum::{
    Extension, Json,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use scale_agent_hub_model::auth::Caller;
use serde_json::{Value, json};

use super::{
    ApiState, error,
    views::{AccountView, AgentView, local_accounts, local_agents, view_of},
};

/// The hub's version (the agents' are in `/api/v1/agents`).
pub(super) async fn version() -> Json<serde_json::Value> {
    Json(json!({ "version": scale_agent_runtime::VERSION }))
}

/// What of the listings a caller may see: every account, or those its globs admit.
struct Scope<'a>(&'a Caller);

impl Scope<'_> {
    fn unlimited(&self) -> bool {
        self.0.accounts.is_empty()
    }

    fn admits(&self, account: &str) -> bool {
        !self.0.refuses_account(account)
    }

    /// The account views whose `name` the caller's globs admit.
    fn accounts(&self, list: Vec<Value>) -> Vec<Value> {
        list.into_iter()
            .filter(|view| {
                view.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|name| self.admits(name))
            })
            .collect()
    }

    /// The agents serving at least one admitted account, each with only those accounts
    /// listed (an agent's other accounts are other teams' clusters). A replica's
    /// `unreachable` entry, which names no account, stays: it says the list is partial.
    fn agents(&self, list: Vec<Value>) -> Vec<Value> {
        list.into_iter()
            .filter_map(|mut agent| {
                let Some(accounts) = agent.get_mut("accounts").and_then(Value::as_array_mut) else {
                    return agent.get("unreachable").is_some().then_some(agent);
                };
                accounts.retain(|a| {
                    a.get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|name| self.admits(name))
                });
                (!accounts.is_empty()).then_some(agent)
            })
            .collect()
    }
}

/// A listing as JSON values, to filter by scope.
fn values<T: serde::Serialize>(list: Vec<T>) -> Vec<Value> {
    list.into_iter()
        .filter_map(|v| serde_json::to_value(v).ok())
        .collect()
}

/// Every agent stream: of every replica when replicas share the store ([`crate::fleet`]),
/// else of this hub; for a caller limited to some accounts, the agents serving them.
pub(super) async fn agents(
    State(api): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let scope = Scope(&caller);
    let list = if api.replicas.shared.is_some() && api.replicas.forwarder.is_some() {
        crate::fleet::agents(&api.replicas, &api.live).await
    } else if scope.unlimited() {
        return Json(local_agents(&api.live)).into_response();
    } else {
        values(local_agents(&api.live))
    };
    if scope.unlimited() {
        return Json(list).into_response();
    }
    Json(scope.agents(list)).into_response()
}

/// This replica's agent streams (what the others ask for [`crate::fleet`]).
pub(super) async fn replica_agents(State(api): State<Arc<ApiState>>) -> Json<Vec<AgentView>> {
    Json(local_agents(&api.live))
}

/// Every account the hub has a record or a state for (ORPHANED and FAILED ones included):
/// of every replica, with its owner, when replicas share the store ([`crate::fleet`]); for a
/// caller limited to some accounts, those.
pub(super) async fn accounts(
    State(api): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let scope = Scope(&caller);
    if api.replicas.shared.is_some() && api.replicas.forwarder.is_some() {
        return match crate::fleet::accounts(&api.replicas, &api.live).await {
            Ok(list) if scope.unlimited() => Json(list).into_response(),
            Ok(list) => Json(scope.accounts(list)).into_response(),
            Err(e) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "cannot read the accounts from the shared store: {}",
                    scale_agent_hub_model::error::Chain(&e)
                ),
            ),
        };
    }
    let list = with_store_health(local_accounts(&api.live), &api);
    if scope.unlimited() {
        return Json(list).into_response();
    }
    Json(scope.accounts(values(list))).into_response()
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

/// Where each account's registration in Clouddriver stands (empty when registration is off);
/// for a caller limited to some accounts, those.
pub(super) async fn clouddriver(
    State(api): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
) -> Json<Vec<scale_agent_hub_clouddriver::RegistrationStatus>> {
    let mut list = api
        .registrar
        .as_ref()
        .map(|r| r.status())
        .unwrap_or_default();
    list.retain(|status| !caller.refuses_account(&status.account));
    Json(list)
}
