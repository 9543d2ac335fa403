//! The admin API of agent identities: issuing, listing and revoking agent tokens (one-time
//! enrolment tokens and bearer tokens), and moving an account's identity binding. Every route
//! needs role admin (the route layer in [`crate::http::router`]). A token is shown once, in the answer that issues it, and never logged.

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{delete, get, post},
};
use serde::{Deserialize, Serialize};

use scale_agent_hub_auth::{
    agent_tokens::{AgentTokenKind, AgentTokenRecord},
    api_auth::Caller,
    credential_sessions::Credential,
};
use scale_agent_hub_model::{
    error::Chain, names::validate_account_name, store_op::StoreOp, time::parse_duration,
};
use scale_agent_hub_state::Control;

use crate::{
    admin_api::end_revoked,
    http::{ApiState, error},
};

/// Longest lifetime of an agent token.
const MAX_TTL_SECONDS: i64 = 366 * 24 * 3600;

/// The routes.
pub(crate) fn router() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/api/v1/agent-tokens", post(create_token).get(list_tokens))
        .route("/api/v1/agent-tokens/{id}", delete(revoke_token))
        .route("/api/v1/accounts/{name}/rebind", post(rebind))
        .route("/api/v1/account-bindings", get(list_bindings))
}

fn time(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Query of `POST /api/v1/agent-tokens`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateQuery {
    /// The identity an agent using the token gets (a DNS name: it goes into certificates).
    pub identity: String,
    /// Glob of the account names it may register.
    pub accounts: String,
    /// Lifetime: seconds, or a number with s, m or h.
    pub ttl: String,
    /// A one-time enrolment token (else a bearer token).
    #[serde(default)]
    pub once: bool,
}

/// An agent token as the API shows it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentTokenView {
    pub id: String,
    /// `enrolment` or `bearer`.
    pub kind: String,
    pub identity: String,
    pub accounts: String,
    pub created: String,
    pub expires: String,
    /// When an enrolment token was used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<String>,
    /// Only in the answer that issues it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl From<AgentTokenRecord> for AgentTokenView {
    fn from(r: AgentTokenRecord) -> Self {
        AgentTokenView {
            kind: r.kind.as_str().to_string(),
            created: time(r.created),
            expires: time(r.expires),
            used: r.used.map(time),
            id: r.id,
            identity: r.identity,
            accounts: r.accounts,
            token: None,
        }
    }
}

/// Checks what a token is issued for; the error says what to change.
fn validate(query: &CreateQuery) -> Result<i64, String> {
    let identity = query.identity.trim();
    let dns_name = !identity.is_empty()
        && identity.len() <= 253
        && identity.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if !dns_name {
        return Err(format!(
            "identity {identity:?} must be a lowercase DNS name (letters, digits, '-', '.'), \
             e.g. prod-agent: it becomes the DNS name of the agent's certificate"
        ));
    }
    if query.accounts.trim().is_empty() {
        return Err("accounts must be a pattern of account names, e.g. 'prod-*' or '*'".into());
    }
    let ttl = parse_duration(&query.ttl)?;
    let ttl = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
    if !(1..=MAX_TTL_SECONDS).contains(&ttl) {
        return Err(format!(
            "ttl {:?} must be between 1s and 366 days (8784h)",
            query.ttl
        ));
    }
    Ok(ttl)
}

async fn create_token(
    State(api): State<Arc<ApiState>>,
    Query(query): Query<CreateQuery>,
) -> Response {
    let ttl = match validate(&query) {
        Ok(ttl) => ttl,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let kind = if query.once {
        AgentTokenKind::Enrolment
    } else {
        AgentTokenKind::Bearer
    };
    let mut store = api.store.lock().await;
    let issued = api.auth.agent_tokens().issue(
        kind,
        query.identity.trim(),
        query.accounts.trim(),
        ttl,
        jiff::Timestamp::now().as_second(),
    );
    let (token, record, ops) = match issued {
        Ok(issued) => issued,
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot issue a token: {e}"),
            );
        }
    };
    if let Err(e) = store.commit(ops).await {
        api.auth.agent_tokens().revoke(&record.id);
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot store the token: {}", Chain(&e)),
        );
    }
    drop(store);
    tracing::info!(id = %record.id, kind = record.kind.as_str(), identity = %record.identity, accounts = %record.accounts, expires = %time(record.expires), "issued an agent token");
    let mut view = AgentTokenView::from(record);
    view.token = Some(token);
    (StatusCode::CREATED, Json(view)).into_response()
}

async fn list_tokens(State(api): State<Arc<ApiState>>) -> Response {
    let list: Vec<AgentTokenView> = api
        .auth
        .agent_tokens()
        .list()
        .into_iter()
        .map(AgentTokenView::from)
        .collect();
    Json(list).into_response()
}

/// Revokes an agent token; a bearer token's live streams on this replica end at once (F17).
async fn revoke_token(
    State(api): State<Arc<ApiState>>,
    Path(id): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Response {
    let mut store = api.store.lock().await;
    let revoked = api.auth.agent_tokens().revoke(&id);
    let Some((record, ops)) = revoked else {
        crate::audit::revocation(&caller, "revoke-agent-token", &id, 404, 0);
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "no agent token with id {id:?} (`scale-agent-hub agent-token list` shows them)"
            ),
        );
    };
    let stored = store.commit(ops).await;
    drop(store);
    tracing::info!(%id, identity = %record.identity, "revoked an agent token");
    end_revoked(
        &api,
        &caller,
        "revoke-agent-token",
        Credential::AgentToken(id),
        stored,
        AgentTokenView::from(record),
    )
}

/// Query of `POST /api/v1/accounts/{name}/rebind`.
#[derive(Debug, Deserialize)]
pub struct RebindQuery {
    /// The identity the account is bound to from now on.
    pub identity: String,
}

/// An account's binding as the API shows it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingView {
    pub account: String,
    pub identity: String,
    pub since: String,
}

/// Moves an account's binding to another identity. Streams of other identities that serve
/// the account are ended, so they stop receiving its operations at once; when they
/// reconnect, their registration of the account is refused.
async fn rebind(
    State(api): State<Arc<ApiState>>,
    Path(name): Path<String>,
    Query(query): Query<RebindQuery>,
) -> Response {
    if let Err(message) = validate_account_name(&name) {
        return error(StatusCode::BAD_REQUEST, message);
    }
    let identity = query.identity.trim().to_string();
    if identity.is_empty() || identity.contains('*') {
        return error(
            StatusCode::BAD_REQUEST,
            "identity must name one agent identity (no wildcards)".into(),
        );
    }
    let (binding, previous, evicted, ticket) = {
        let mut registry = api.live.registry();
        let previous = registry.bindings.get(&name).map(|b| b.identity.clone());
        let binding = registry.bind(&name, &identity, jiff::Timestamp::now().as_second());
        let evicted = registry.sessions_of_others(&name, &identity);
        // Queued with the streams' changes (a registration may have bound the account a
        // moment ago), so the store keeps the order of the changes in memory.
        let ticket = api.commits.enqueue(vec![StoreOp::PutBinding {
            account: name.clone(),
            binding: binding.clone(),
        }]);
        (binding, previous, evicted, ticket)
    };
    if let Some(queued) = ticket
        && let Err(e) = api.commits.committed_or_failing(queued.ticket).await
    {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the binding changed in memory but is not stored yet (it is retried until the \
                 store commits): {e}"
            ),
        );
    }
    for session in &evicted {
        api.live.control(
            *session,
            Control::Close(tonic::Status::permission_denied(format!(
                // troubleshooting: an agent's stream ended by the hub: gRPC `PERMISSION_DENIED`
                // An admin moved the account to another agent identity (`scale-agent-hub account
                // rebind`); this agent's identity may no longer serve it. Remove the account from
                // this agent's config.
                "account {name:?} was rebound to identity {identity:?} by an admin; this \
                 agent's identity may no longer serve it"
            ))),
        );
    }
    tracing::info!(account = %name, %identity, previous = previous.as_deref().unwrap_or(""), evicted = evicted.len(), "account rebound");
    Json(BindingView {
        account: name,
        identity: binding.identity,
        since: time(binding.since),
    })
    .into_response()
}

async fn list_bindings(State(api): State<Arc<ApiState>>) -> Response {
    let list: Vec<BindingView> = api
        .live
        .registry()
        .bindings
        .iter()
        .map(|(account, b)| BindingView {
            account: account.clone(),
            identity: b.identity.clone(),
            since: time(b.since),
        })
        .collect();
    Json(list).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(identity: &str, accounts: &str, ttl: &str) -> CreateQuery {
        CreateQuery {
            identity: identity.into(),
            accounts: accounts.into(),
            ttl: ttl.into(),
            once: true,
        }
    }

    #[test]
    fn token_requests_are_checked() {
        assert_eq!(validate(&query("prod-agent", "prod-*", "1h")), Ok(3600));
        let err = validate(&query("Prod Agent", "prod-*", "1h")).unwrap_err();
        assert!(err.contains("lowercase DNS name"), "{err}");
        let err = validate(&query("prod-agent", " ", "1h")).unwrap_err();
        assert!(err.contains("pattern"), "{err}");
        let err = validate(&query("prod-agent", "*", "0s")).unwrap_err();
        assert!(err.contains("between 1s"), "{err}");
        assert!(validate(&query("prod-agent", "*", "soon")).is_err());
    }
}
