//! The admin part of the HTTP API: kubeconfigs for the Kubernetes API proxy, issuing API
//! tokens, and listing and revoking tokens. Every route needs role `admin` (the router puts
//! `api_auth::require` in front of them); `scale-agent-hub kubeconfig` and
//! `scale-agent-hub token` use the admin token file. Tokens are shown once, in the answer
//! that carries them, and never logged.

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{Path, Query, Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{delete, get, post},
};

use scale_agent_hub_auth::{
    api_auth::Caller,
    credential_sessions::Credential,
    tokens::{CLOUDDRIVER_TOKEN, Limits, TokenRecord},
};
use scale_agent_hub_model::{error::Chain, names::validate_account_name};
use serde::{Deserialize, Serialize};

use crate::{
    api_auth::Role,
    http::{ApiState, error},
    kubeconfig::{self, KubeconfigFor},
};

/// The admin routes.
pub(crate) fn router() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/api/v1/accounts/{name}/kubeconfig", post(issue_kubeconfig))
        .route("/api/v1/tokens", get(list_tokens).post(create_token))
        .route("/api/v1/tokens/{id}", delete(revoke_token))
        .merge(crate::dynamic_accounts::router())
}

/// Query of `POST /api/v1/accounts/{name}/kubeconfig`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeconfigQuery {
    /// Who or what the token is for; a token of the same name is replaced. Default
    /// `kubeconfig`. `clouddriver` gives the kubeconfig the hub registers in Clouddriver.
    pub token_name: Option<String>,
    /// For `clouddriver`: make a new token (the old one stops working).
    #[serde(default)]
    pub rotate: bool,
    /// How long the token lasts (`90m`, `12h`; `0s`: no expiry); default `--token-ttl`.
    /// Clouddriver's token never expires.
    pub ttl: Option<String>,
}

/// The expiry (Unix seconds) of a token issued at `now` for `ttl` (the request's, else the
/// hub's `--token-ttl`); `None` for a zero ttl. The error is the 400's message.
pub(crate) fn expiry(api: &ApiState, ttl: Option<&str>, now: i64) -> Result<Option<i64>, String> {
    let ttl = match ttl {
        Some(text) => scale_agent_hub_model::time::parse_duration(text)
            .map_err(|e| format!("ttl {text:?}: {e}"))?,
        None => api.settings.token_ttl,
    };
    let seconds = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
    Ok((seconds > 0).then(|| now.saturating_add(seconds)))
}

/// The URL clients reach the hub's HTTP listener at.
fn public_url(
    api: &ApiState,
    request_headers: &HeaderMap,
    uri: &axum::http::Uri,
) -> Option<String> {
    if let Some(url) = &api.settings.public_url {
        return Some(url.trim_end_matches('/').to_string());
    }
    let host = uri
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            request_headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        })?;
    let scheme = if api.settings.https { "https" } else { "http" };
    Some(format!("{scheme}://{host}"))
}

/// Makes (or, for `clouddriver`, derives) a token for `account` and the kubeconfig around
/// it; stores the token's hash before answering.
pub(crate) async fn kubeconfig_for(
    api: &ApiState,
    account: &str,
    token_name: &str,
    rotate: bool,
    public_url: &str,
    expires: Option<i64>,
) -> scale_agent_hub_model::Result<(String, TokenRecord)> {
    let now = jiff::Timestamp::now().as_second();
    let mut store = api.store.lock().await;
    if token_name == CLOUDDRIVER_TOKEN {
        scale_agent_hub_replicas::sync::refresh_tokens(&api.replicas, &api.auth).await?;
    }
    let (token, record, ops) = {
        let mut tokens = api.auth.tokens();
        if token_name == CLOUDDRIVER_TOKEN && rotate {
            tokens.rotate_derived(account, token_name, now)?
        } else if token_name == CLOUDDRIVER_TOKEN {
            tokens.derived(account, token_name, now)?
        } else {
            tokens.issue(account, token_name, now, expires)?
        }
    };
    store.commit(ops).await?;
    drop(store);
    let yaml = kubeconfig::render(&KubeconfigFor {
        account,
        public_url,
        ca_pem: api.settings.serving_ca_pem.as_deref(),
        token: &token,
    });
    Ok((yaml, record))
}

async fn issue_kubeconfig(
    State(api): State<Arc<ApiState>>,
    Path(name): Path<String>,
    Query(query): Query<KubeconfigQuery>,
    request: Request,
) -> Response {
    if let Err(message) = validate_account_name(&name) {
        return error(StatusCode::BAD_REQUEST, message);
    }
    let token_name = query
        .token_name
        .clone()
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| "kubeconfig".into());
    if token_name.len() > 63 || token_name.chars().any(|c| c.is_control()) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("token name {token_name:?} must be at most 63 printable characters"),
        );
    }
    if query.rotate && token_name != CLOUDDRIVER_TOKEN {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "rotate applies to the {CLOUDDRIVER_TOKEN:?} token only; any other token is \
                 replaced simply by issuing it again"
            ),
        );
    }
    let Some(url) = public_url(&api, request.headers(), request.uri()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "cannot tell the hub's URL from the request: start the hub with --public-url".into(),
        );
    };
    let now = jiff::Timestamp::now().as_second();
    let expires = match expiry(&api, query.ttl.as_deref(), now) {
        Ok(expires) => expires,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    match kubeconfig_for(&api, &name, &token_name, query.rotate, &url, expires).await {
        Ok((yaml, record)) => {
            tracing::info!(account = %name, token = %record.name, id = %record.id, "issued a proxy token and its kubeconfig");
            let mut response = (StatusCode::OK, yaml).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/yaml"),
            );
            response
        }
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot issue a token: {}", Chain(&e)),
        ),
    }
}

/// A token as the API lists it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenView {
    /// For revoking; empty for tokens the hub did not issue (the tokens file, the admin
    /// token file).
    pub id: String,
    /// `proxy` (opens one account's /clusters/ path), `api` (the REST API, with a role) or
    /// `admin` (the admin token file).
    #[serde(default)]
    pub kind: String,
    /// Where it is kept: `hub` (issued, in the store), `file` (--api-tokens-file) or
    /// `admin-token-file`.
    #[serde(default)]
    pub source: String,
    /// The role of an API or admin token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// The account of a proxy token; empty otherwise.
    #[serde(default)]
    pub account: String,
    pub name: String,
    pub created: String,
    /// Derived from the hub's key (the Clouddriver token): the hub can render it again.
    pub derived: bool,
    /// When it stops working (RFC 3339); empty: never.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub expires: String,
    /// API tokens: the account globs it is limited to; empty: every account.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accounts: Vec<String>,
}

impl From<TokenRecord> for TokenView {
    fn from(r: TokenRecord) -> Self {
        TokenView {
            created: jiff::Timestamp::from_second(r.created)
                .map(|t| t.to_string())
                .unwrap_or_default(),
            derived: r.generation.is_some(),
            expires: r
                .expires
                .and_then(|at| jiff::Timestamp::from_second(at).ok())
                .map(|t| t.to_string())
                .unwrap_or_default(),
            kind: r.kind().into(),
            accounts: r.accounts,
            source: "hub".into(),
            role: r.role,
            id: r.id,
            account: r.account,
            name: r.name,
        }
    }
}

/// A token the hub did not issue (no id, no creation time).
fn external_view(kind: &str, source: &str, name: &str, role: Role) -> TokenView {
    TokenView {
        id: String::new(),
        kind: kind.into(),
        source: source.into(),
        role: Some(role),
        account: String::new(),
        name: name.into(),
        created: String::new(),
        derived: false,
        expires: String::new(),
        accounts: Vec::new(),
    }
}

async fn list_tokens(State(api): State<Arc<ApiState>>) -> Response {
    let mut list = Vec::new();
    if api.auth.admin_token().is_some_and(|a| a.present()) {
        list.push(external_view(
            "admin",
            "admin-token-file",
            "admin",
            Role::Admin,
        ));
    }
    if let Some(file) = api.auth.api_tokens_file() {
        list.extend(
            file.list()
                .into_iter()
                .map(|t| external_view("api", "file", &t.name, t.role)),
        );
    }
    list.extend(api.auth.tokens().list().into_iter().map(TokenView::from));
    Json(list).into_response()
}

/// Body of `POST /api/v1/tokens`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateToken {
    pub name: String,
    pub role: Role,
    /// How long it lasts (`90m`, `12h`; `0s`: no expiry); default `--token-ttl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Globs of the accounts it may address on the account routes; empty: every account.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accounts: Vec<String>,
}

/// Answer of `POST /api/v1/tokens`: the token, shown this once.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedToken {
    pub token: String,
    #[serde(flatten)]
    pub view: TokenView,
}

/// Issues an API token; a token of the same name is replaced (rotation).
async fn create_token(State(api): State<Arc<ApiState>>, body: axum::body::Bytes) -> Response {
    let request: CreateToken = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "the body must be {{\"name\": \"<who>\", \"role\": \"metrics|reader|operator|admin\", \"ttl\": \"12h\", \"accounts\": [\"prod-*\"]}} (ttl and accounts optional): {e}"
                ),
            );
        }
    };
    let name = request.name.trim();
    if name.is_empty() || name.len() > 63 || name.chars().any(|c| c.is_control()) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("token name {name:?} must be 1 to 63 printable characters"),
        );
    }
    if let Some(bad) = request.accounts.iter().find(|a| {
        a.is_empty()
            || a.chars()
                .any(|c| !(c.is_ascii_alphanumeric() || "-_.*".contains(c)))
    }) {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "accounts: {bad:?} is not an account name or glob (letters, digits, - _ . and *)"
            ),
        );
    }
    let now = jiff::Timestamp::now().as_second();
    let expires = match expiry(&api, request.ttl.as_deref(), now) {
        Ok(expires) => expires,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let limits = Limits {
        expires,
        accounts: request.accounts.clone(),
    };
    let mut store = api.store.lock().await;
    let issued = api.auth.tokens().issue_api(name, request.role, now, limits);
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
        // The caller never gets this token: it must not work until the next start either
        // (the agent-token route does the same).
        api.auth.tokens().revoke(&record.id);
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot store the token: {}", Chain(&e)),
        );
    }
    drop(store);
    tracing::info!(token = %record.name, role = %request.role, id = %record.id, "issued an API token");
    Json(CreatedToken {
        token,
        view: TokenView::from(record),
    })
    .into_response()
}

/// Answer of a token's revocation: the token, and how many of the watches and upgraded
/// connections opened with it were ended on the replica that answered.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Revoked<T> {
    #[serde(flatten)]
    pub token: T,
    #[serde(default)]
    pub ended_sessions: usize,
}

/// Revokes a token, and ends what it holds open on this replica (F17): watches, followed
/// logs, exec/attach/port-forward sessions.
async fn revoke_token(
    State(api): State<Arc<ApiState>>,
    Path(id): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Response {
    let mut store = api.store.lock().await;
    let revoked = api.auth.tokens().revoke(&id);
    let Some((record, ops)) = revoked else {
        crate::audit::revocation(&caller, "revoke-token", &id, 404, 0);
        return error(StatusCode::NOT_FOUND, format!("no token with id {id:?}"));
    };
    let stored = store.commit(ops).await;
    drop(store);
    tracing::info!(account = %record.account, token = %record.name, kind = record.kind(), %id, "revoked a token");
    end_revoked(
        &api,
        &caller,
        "revoke-token",
        Credential::Token(id),
        stored,
        TokenView::from(record),
    )
}

/// After a revocation was made in memory and committed (`stored`): ends what the
/// credential holds open on this replica, whether or not the store took the change (it
/// holds in memory here either way), writes the audit line, and answers the token's view
/// with how many it ended.
pub(crate) fn end_revoked<T: Serialize>(
    api: &ApiState,
    caller: &Caller,
    verb: &str,
    credential: Credential,
    stored: scale_agent_hub_model::Result<()>,
    token: T,
) -> Response {
    let ended = api.auth.credential_sessions().end(&credential);
    let id = credential.id();
    if let Err(e) = stored {
        crate::audit::revocation(caller, verb, id, 500, ended);
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the token is revoked in memory but could not be stored: {}",
                Chain(&e)
            ),
        );
    }
    crate::audit::revocation(caller, verb, id, 200, ended);
    tracing::info!(kind = credential.kind(), %id, ended, "what the revoked token held open is ended");
    Json(Revoked {
        token,
        ended_sessions: ended,
    })
    .into_response()
}
