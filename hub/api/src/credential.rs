//! `POST /api/v1/accounts/{name}/credential`: a fresh, short-lived proxy token for the
//! caller, as the `client.authentication.k8s.io/v1` `ExecCredential` kubectl's exec plugins
//! print. `scale-agent-hub token credential` calls it, so a kubeconfig written with
//! `scale-agent-hub kubeconfig --exec` holds no token, only the command that fetches one.
//!
//! It needs role operator (a proxy token may write through the proxy, which a reader may
//! not), and the caller's account globs must admit the account (the route is an account
//! route). The token is named after the caller, so the proxy and its audit name the person;
//! it lasts the request's `ttl` or `--token-ttl`, never unlimited.

use std::sync::Arc;

use axum::{
    Extension, Json,
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use scale_agent_hub_auth::tokens::{CLOUDDRIVER_TOKEN, DEFAULT_PERSON_TTL_SECONDS};
use scale_agent_hub_model::{error::Chain, names::validate_account_name};
use serde::Deserialize;

use crate::{
    admin_api::expiry,
    api_auth::Caller,
    http::{ApiState, error},
};

/// Query of the route.
#[derive(Debug, Default, Deserialize)]
pub struct CredentialQuery {
    /// How long the token lasts (`1h`); default `--token-ttl`.
    pub ttl: Option<String>,
}

/// The route's handler.
pub(crate) async fn issue_credential(
    State(api): State<Arc<ApiState>>,
    Path(account): Path<String>,
    Query(query): Query<CredentialQuery>,
    Extension(caller): Extension<Caller>,
) -> Response {
    if let Err(message) = validate_account_name(&account) {
        return error(StatusCode::BAD_REQUEST, message);
    }
    if caller.name == CLOUDDRIVER_TOKEN {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "{CLOUDDRIVER_TOKEN:?} names Clouddriver's own token; issue credentials under another name"
            ),
        );
    }
    let now = jiff::Timestamp::now().as_second();
    let expires = match expiry(&api, query.ttl.as_deref(), now) {
        Ok(Some(expires)) => expires,
        // A credential plugin's token always ends: `0s` means the default here.
        Ok(None) => now + DEFAULT_PERSON_TTL_SECONDS,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let mut store = api.store.lock().await;
    let issued = api
        .auth
        .tokens()
        .issue_session(&account, &caller.name, now, expires);
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
        api.auth.tokens().revoke(&record.id);
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot store the token: {}", Chain(&e)),
        );
    }
    drop(store);
    tracing::info!(%account, token = %record.name, id = %record.id, expires, "issued an exec credential");
    let expiration = jiff::Timestamp::from_second(expires)
        .map(|t| t.to_string())
        .unwrap_or_default();
    Json(serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": { "token": token, "expirationTimestamp": expiration },
    }))
    .into_response()
}
