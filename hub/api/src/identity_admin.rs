//! The admin levers for a compromised or retired cluster (issue 28, F4/F17): disable an
//! agent identity (and enable it again), deny one of its certificates by serial, and delete
//! an orphaned account, releasing its binding. Disabling or denying ends the identity's live
//! streams on this replica at once (and with them every proxy exchange, watch, exec and
//! port-forward they carry); streams on other replicas sharing the store end at their next
//! heartbeat, which reads the identity's state from the store. Every route needs role admin
//! (the route layer in [`crate::http::router`]) and writes an audit line
//! ([`crate::audit::admin`]).

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{delete, get, post},
};
use serde::{Deserialize, Serialize};

use scale_agent_hub_auth::api_auth::Caller;
use scale_agent_hub_model::{
    error::Chain, names::validate_account_name, records::AgentIdentityState, store_op::StoreOp,
};
use scale_agent_hub_state::Control;

use crate::http::{ApiState, error};

/// The routes.
pub(crate) fn router() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/api/v1/agent-identities", get(list_identities))
        .route("/api/v1/agent-identities/{identity}/disable", post(disable))
        .route("/api/v1/agent-identities/{identity}/enable", post(enable))
        .route(
            "/api/v1/agent-identities/{identity}/deny-certificate",
            post(deny_certificate),
        )
        .route("/api/v1/accounts/{name}/binding", delete(delete_orphan))
}

fn time(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// An agent identity as the admin API shows it: its enrolment, what an admin decided, and
/// its live streams on this replica.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityView {
    pub identity: String,
    /// The account pattern of its enrolment (hub-issued certificates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounts: Option<String>,
    /// When it last enrolled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrolled: Option<String>,
    /// When an admin disabled it; absent: enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Serials of its certificates that are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied_serials: Vec<String>,
    /// Its streams on the replica that answered.
    pub live_streams: usize,
    /// Streams ended by the change that answered (disable, deny-certificate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disconnected: Option<usize>,
}

impl IdentityView {
    fn of(api: &ApiState, identity: &str, state: Option<&AgentIdentityState>) -> Self {
        let enrolled = api.auth.agent_tokens().enrolled(identity).cloned();
        IdentityView {
            identity: identity.to_string(),
            accounts: enrolled.as_ref().map(|e| e.accounts.clone()),
            enrolled: enrolled.map(|e| time(e.enrolled)),
            disabled: state.and_then(|s| s.disabled).map(time),
            reason: state.map(|s| s.reason.clone()).unwrap_or_default(),
            denied_serials: state.map(|s| s.denied_serials.clone()).unwrap_or_default(),
            live_streams: api
                .live
                .registry_read()
                .replicas_of_identity(identity)
                .len(),
            disconnected: None,
        }
    }
}

/// Checks an identity in a path: one identity, no wildcard; the 400 answer when not.
fn check_identity(identity: &str) -> Option<Response> {
    (identity.is_empty() || identity.contains('*') || identity.len() > 253).then(|| {
        error(
            StatusCode::BAD_REQUEST,
            format!("{identity:?} must name one agent identity (no wildcards)"),
        )
    })
}

/// Every identity that enrolled or that an admin decided something about.
async fn list_identities(State(api): State<Arc<ApiState>>) -> Response {
    let states = api.auth.identity_states().list();
    let mut names: std::collections::BTreeSet<String> =
        states.iter().map(|s| s.identity.clone()).collect();
    names.extend(
        api.auth
            .agent_tokens()
            .list()
            .into_iter()
            .filter(|t| t.used.is_some())
            .map(|t| t.identity),
    );
    let list: Vec<IdentityView> = names
        .iter()
        .map(|name| {
            let state = states.iter().find(|s| &s.identity == name);
            IdentityView::of(&api, name, state)
        })
        .collect();
    Json(list).into_response()
}

/// Query of `disable`.
#[derive(Debug, Default, Deserialize)]
pub struct DisableQuery {
    /// Why (shown to the agent in the refusals, and in the listing).
    #[serde(default)]
    pub reason: String,
}

/// Query of `deny-certificate`.
#[derive(Debug, Deserialize)]
pub struct DenyQuery {
    /// The certificate's serial number, hex (`openssl x509 -serial`; colons allowed).
    pub serial: String,
}

/// Stores a changed identity state, then ends the identity's streams on this replica with
/// `why` (their exchanges with them). Answers the identity's view, or 500 when the store
/// failed (the change then holds in memory on this replica only).
async fn store_and_disconnect(
    api: &ApiState,
    caller: &Caller,
    verb: &str,
    change: impl FnOnce(&ApiState, i64) -> (AgentIdentityState, Vec<StoreOp>),
    why: Option<String>,
) -> Response {
    let mut store = api.store.lock().await;
    let (record, ops) = change(api, jiff::Timestamp::now().as_second());
    let identity = record.identity.clone();
    if let Err(e) = store.commit(ops).await {
        crate::audit::admin(caller, verb, &identity, 500);
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the change of identity {identity:?} holds on this replica but could not be \
                 stored (it does not survive a restart, and other replicas do not see it): {}",
                Chain(&e)
            ),
        );
    }
    drop(store);
    let mut disconnected = 0;
    if let Some(why) = why {
        let sessions = api.live.registry_read().replicas_of_identity(&identity);
        for (session, _) in sessions {
            api.live.control(
                session,
                Control::Close(tonic::Status::permission_denied(why.clone())),
            );
            disconnected += 1;
        }
    }
    crate::audit::admin(caller, verb, &identity, 200);
    tracing::info!(%identity, verb, disconnected, "agent identity changed by an admin");
    let mut view = IdentityView::of(api, &identity, Some(&record));
    view.disconnected = Some(disconnected);
    Json(view).into_response()
}

async fn disable(
    State(api): State<Arc<ApiState>>,
    Path(identity): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(query): Query<DisableQuery>,
) -> Response {
    if let Some(refusal) = check_identity(&identity) {
        return refusal;
    }
    let reason = query.reason;
    let why = scale_agent_hub_auth::identity_states::check(
        Some(&AgentIdentityState {
            identity: identity.clone(),
            disabled: Some(jiff::Timestamp::now().as_second()),
            reason: reason.clone(),
            ..AgentIdentityState::default()
        }),
        &identity,
        None,
    )
    .err()
    .unwrap_or_default();
    store_and_disconnect(
        &api,
        &caller,
        "disable",
        |api, now| api.auth.identity_states().disable(&identity, &reason, now),
        Some(why),
    )
    .await
}

async fn enable(
    State(api): State<Arc<ApiState>>,
    Path(identity): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Response {
    if let Some(refusal) = check_identity(&identity) {
        return refusal;
    }
    store_and_disconnect(
        &api,
        &caller,
        "enable",
        |api, now| api.auth.identity_states().enable(&identity, now),
        None,
    )
    .await
}

async fn deny_certificate(
    State(api): State<Arc<ApiState>>,
    Path(identity): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(query): Query<DenyQuery>,
) -> Response {
    if let Some(refusal) = check_identity(&identity) {
        return refusal;
    }
    let Some(serial) = AgentIdentityState::normalize_serial(&query.serial) else {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "serial {:?} is not a hexadecimal serial number (as `openssl x509 -noout \
                 -serial` prints it, or the hub's log line `certificate issued`)",
                query.serial
            ),
        );
    };
    // Every stream of the identity ends: the one presenting the denied certificate cannot
    // be told apart cheaply here, and the others reconnect at once with theirs.
    let why = format!(
        "the certificate of serial {serial} of identity {identity:?} was denied by the hub's \
         admin; streams of the identity reconnect, and that certificate is refused"
    );
    store_and_disconnect(
        &api,
        &caller,
        "deny-certificate",
        |api, now| {
            api.auth
                .identity_states()
                .deny_serial(&identity, &serial, now)
        },
        Some(why),
    )
    .await
}

/// An account deleted by [`delete_orphan`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeletedAccountView {
    pub account: String,
    /// The identity the name was bound to (now free to bind again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_identity: Option<String>,
}

/// Deletes an account no agent streams (a retired or squatted cluster): its cached record
/// and its binding, so that the name is free for the first identity that registers it
/// next. Refused while any stream serves the account (disable the identity first).
async fn delete_orphan(
    State(api): State<Arc<ApiState>>,
    Path(name): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Response {
    if let Err(message) = validate_account_name(&name) {
        return error(StatusCode::BAD_REQUEST, message);
    }
    let (released, ticket) = {
        let mut registry = api.live.registry();
        let streams = registry.replicas(&name);
        if !streams.is_empty() {
            crate::audit::admin(&caller, "delete-account", &name, 409);
            let identity = registry
                .bindings
                .get(&name)
                .map(|b| b.identity.clone())
                .unwrap_or_default();
            return error(
                StatusCode::CONFLICT,
                format!(
                    "account {name:?} is served by {} stream(s) of identity {identity:?}; only \
                     an orphaned account is deleted: disable the identity first \
                     (`scale-agent-hub agent disable {identity}`)",
                    streams.len()
                ),
            );
        }
        let released = registry.remove_binding(&name).map(|b| b.identity);
        let known = registry.accounts.contains_key(&name);
        if released.is_none() && !known {
            crate::audit::admin(&caller, "delete-account", &name, 404);
            return error(
                StatusCode::NOT_FOUND,
                format!("no account {name:?} and no binding of it"),
            );
        }
        registry.remove_account(&name);
        api.live.cache().remove_account(&name);
        let ticket = api.commits.enqueue(vec![
            StoreOp::DeleteAccount {
                account: name.clone(),
            },
            StoreOp::DeleteBinding {
                account: name.clone(),
            },
        ]);
        (released, ticket)
    };
    api.live.account_forgotten(&name);
    api.live.observe_states();
    if let Some(queued) = ticket
        && let Err(e) = api.commits.committed_or_failing(queued.ticket).await
    {
        crate::audit::admin(&caller, "delete-account", &name, 500);
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "account {name:?} is deleted in memory but not stored yet (it is retried until \
                 the store commits): {e}"
            ),
        );
    }
    crate::audit::admin(&caller, "delete-account", &name, 200);
    tracing::info!(account = %name, released = released.as_deref().unwrap_or(""), "orphaned account deleted and its binding released by an admin");
    Json(DeletedAccountView {
        account: name,
        released_identity: released,
    })
    .into_response()
}
