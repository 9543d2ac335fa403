//! Dynamic accounts (Armory's dynamic accounts API, item 12 of the stream contract): an
//! admin adds, updates and removes accounts of an agent identity through the hub's API; the
//! hub keeps them in its store and sends the identity's whole set to each of its streams
//! when the stream starts and whenever the set changes. The agent reads each account's
//! kubeconfig from a Secret in its own cluster (Infrastructure and SpinnakerService modes),
//! so no kubeconfig ever passes through the hub, and reports how each account fares.
//!
//! Routes (role admin, see `router`): `GET`/`POST /api/v1/dynamic-accounts`,
//! `GET`/`PUT`/`DELETE /api/v1/dynamic-accounts/{name}`. A token limited to account globs
//! reaches only the accounts they admit: the route layer checks the name in the path, the
//! listing leaves the others out, and `POST` checks the name in its body.

use std::sync::Arc;

use axum::{
    Extension, Json, Router,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use serde::{Deserialize, Serialize};

use scale_agent_hub_model::{auth::Caller, error::Chain, store_op::StoreOp};
use scale_agent_hub_state::Live;

use crate::http::{ApiState, error};

pub use scale_agent_hub_model::dynamic_accounts::{
    AgentReport, DEFAULT_SECRET_KEY, DynamicAccountRecord, DynamicAccountSpec, DynamicMode,
    SecretKeyRef, parse_spec,
};
pub use scale_agent_hub_state::dynamic_accounts::DynamicAccounts;
// Sends an identity's set to each of its streams.
use scale_agent_hub_state::dynamic_accounts::push;

/// A dynamic account as the API shows it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DynamicAccountView {
    #[serde(flatten)]
    pub spec: DynamicAccountSpec,
    pub created: String,
    pub updated: String,
    /// Replicas of the agent connected now (they have been sent the account).
    pub connected_replicas: Vec<String>,
    /// What each connected replica reported.
    pub agent_status: Vec<AgentReport>,
    /// The hub's state of the account (`ACTIVE`, `INACTIVE`, `FAILED`, `ORPHANED`), once an
    /// agent registered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_reason: Option<String>,
    /// Armory's INACTIVE (added through `crate::armory` and not activated): kept, not sent
    /// to the agent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inactive: bool,
    /// `clouddriver` or `dynamic` for accounts added through Armory's routes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

fn time(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn view(live: &Live, record: &DynamicAccountRecord) -> DynamicAccountView {
    let name = &record.spec.name;
    let (connected_replicas, state) = {
        let registry = live.registry_read();
        let replicas = registry
            .replicas_of_identity(&record.spec.agent)
            .into_iter()
            .map(|(_, replica)| replica)
            .collect();
        (replicas, registry.states.get(name).cloned())
    };
    DynamicAccountView {
        spec: record.spec.clone(),
        created: time(record.created),
        updated: time(record.updated),
        connected_replicas,
        agent_status: live.dynamic_accounts().reports(name),
        state: state.as_ref().map(|s| s.state.as_str().to_string()),
        state_reason: state.map(|s| s.reason),
        inactive: record.inactive,
        source: record.source.clone(),
    }
}

/// The routes (role admin: the router's layer).
pub(crate) fn router() -> Router<Arc<ApiState>> {
    Router::new()
        .route(
            "/api/v1/dynamic-accounts",
            get(list_accounts).post(create_account),
        )
        .route(
            "/api/v1/dynamic-accounts/{name}",
            get(get_account).put(update_account).delete(delete_account),
        )
}

async fn list_accounts(
    State(api): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let records: Vec<DynamicAccountRecord> = api
        .live
        .dynamic_accounts()
        .list()
        .filter(|record| !caller.refuses_account(&record.spec.name))
        .cloned()
        .collect();
    let views: Vec<DynamicAccountView> = records.iter().map(|r| view(&api.live, r)).collect();
    Json(views).into_response()
}

async fn get_account(State(api): State<Arc<ApiState>>, Path(name): Path<String>) -> Response {
    let record = api.live.dynamic_accounts().get(&name).cloned();
    match record {
        Some(record) => Json(view(&api.live, &record)).into_response(),
        None => not_found(&name),
    }
}

fn not_found(name: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!(
            "no dynamic account {name:?}: add it with POST /api/v1/dynamic-accounts (GET \
             /api/v1/dynamic-accounts lists them)"
        ),
    )
}

async fn create_account(
    State(api): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Response {
    let spec = match parse_spec(&body) {
        Ok(spec) => spec,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    // The name is in the body, where the route layer does not look.
    if let Some(refusal) = crate::armory::out_of_scope(
        &caller,
        "POST /api/v1/dynamic-accounts",
        std::slice::from_ref(&spec.name),
    ) {
        return refusal;
    }
    if api.live.dynamic_accounts().get(&spec.name).is_some() {
        return error(
            StatusCode::CONFLICT,
            format!(
                "dynamic account {:?} exists: change it with PUT /api/v1/dynamic-accounts/{}, \
                 or DELETE it first",
                spec.name, spec.name
            ),
        );
    }
    save(&api, spec, StatusCode::CREATED).await
}

async fn update_account(
    State(api): State<Arc<ApiState>>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let spec = match parse_spec(&body) {
        Ok(spec) => spec,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    if spec.name != name {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "the body names account {:?} but the path {name:?}: an account is renamed by \
                 deleting it and adding the new name",
                spec.name
            ),
        );
    }
    let previous = api.live.dynamic_accounts().get(&name).cloned();
    let Some(previous) = previous else {
        return not_found(&name);
    };
    let moved_from = (previous.spec.agent != spec.agent).then_some(previous.spec.agent);
    let response = save(&api, spec, StatusCode::OK).await;
    if let Some(identity) = moved_from {
        push(&api.live, &identity);
    }
    response
}

/// Checks the binding, stores the account, tells the agent.
async fn save(api: &ApiState, spec: DynamicAccountSpec, status: StatusCode) -> Response {
    if let Err(reason) = api
        .live
        .registry_read()
        .check_binding(&spec.agent, &spec.name)
    {
        return error(
            StatusCode::CONFLICT,
            format!(
                "account {:?} cannot be served by agent {:?}: {reason}",
                spec.name, spec.agent
            ),
        );
    }
    let mut store = api.store.lock().await;
    let record = api
        .live
        .dynamic_accounts()
        .put(spec, jiff::Timestamp::now().as_second());
    let stored = store
        .commit(vec![StoreOp::PutDynamicAccount {
            record: record.clone(),
        }])
        .await;
    drop(store);
    if let Err(e) = stored {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the dynamic account could not be stored: {}", Chain(&e)),
        );
    }
    tracing::info!(account = %record.spec.name, agent = %record.spec.agent, mode = ?record.spec.mode, "dynamic account saved");
    push(&api.live, &record.spec.agent);
    (status, Json(view(&api.live, &record))).into_response()
}

async fn delete_account(State(api): State<Arc<ApiState>>, Path(name): Path<String>) -> Response {
    let mut store = api.store.lock().await;
    let removed = api.live.dynamic_accounts().remove(&name);
    let Some(record) = removed else {
        return not_found(&name);
    };
    let stored = store
        .commit(vec![StoreOp::DeleteDynamicAccount {
            account: name.clone(),
        }])
        .await;
    drop(store);
    if let Err(e) = stored {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the dynamic account is removed in memory but could not be stored: {}",
                Chain(&e)
            ),
        );
    }
    tracing::info!(account = %name, agent = %record.spec.agent, "dynamic account removed");
    push(&api.live, &record.spec.agent);
    (StatusCode::OK, Json(view(&api.live, &record))).into_response()
}
