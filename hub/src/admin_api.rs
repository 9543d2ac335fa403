//! The admin part of the HTTP API: kubeconfigs for the Kubernetes API proxy, and listing and
//! revoking the proxy's tokens. Every route needs the admin token (`Authorization: Bearer`),
//! which `scale-agent-hub kubeconfig` and `scale-agent-hub token` read from the admin token
//! file. Tokens are shown once, in the kubeconfig that carries them, and never logged.

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{Path, Query, Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{delete, get, post},
};
use serde::{Deserialize, Serialize};

use crate::{
    Hub,
    config::HttpSecurity,
    kubeconfig::{self, KubeconfigFor},
    tokens::{self, CLOUDDRIVER_TOKEN, TokenRecord},
};

/// The admin routes.
pub(crate) fn router() -> Router<Arc<Hub>> {
    Router::new()
        .route("/api/v1/accounts/{name}/kubeconfig", post(issue_kubeconfig))
        .route("/api/v1/tokens", get(list_tokens))
        .route("/api/v1/tokens/{id}", delete(revoke_token))
}

/// Why the admin API refused a request.
pub(crate) struct Refused(StatusCode, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        crate::http::error(self.0, self.1)
    }
}

/// Checks the admin token.
pub(crate) fn require_admin(hub: &Hub, headers: &HeaderMap) -> Result<(), Refused> {
    let Some(admin) = &hub.admin_token else {
        return Err(Refused(
            StatusCode::FORBIDDEN,
            "this hub has no admin token (it was started without --admin-token-file), so it \
             issues no tokens over HTTP"
                .into(),
        ));
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(tokens::bearer);
    match presented {
        Some(token) if admin.matches(token) => Ok(()),
        Some(_) => Err(Refused(
            StatusCode::FORBIDDEN,
            "this token is not the hub's admin token (the admin token file, by default \
             <data-dir>/admin-token, holds it)"
                .into(),
        )),
        None => Err(Refused(
            StatusCode::UNAUTHORIZED,
            "the admin API needs `Authorization: Bearer <admin token>` (the admin token file, \
             by default <data-dir>/admin-token, holds it)"
                .into(),
        )),
    }
}

/// Unix seconds now.
pub(crate) fn now_unix() -> i64 {
    jiff::Timestamp::now().as_second()
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
}

/// The URL clients reach the hub's HTTP listener at.
fn public_url(hub: &Hub, request_headers: &HeaderMap, uri: &axum::http::Uri) -> Option<String> {
    if let Some(url) = &hub.config.public_url {
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
    let scheme = match hub.config.http_security {
        HttpSecurity::Tls { .. } => "https",
        HttpSecurity::Plaintext => "http",
    };
    Some(format!("{scheme}://{host}"))
}

/// Makes (or, for `clouddriver`, derives) a token for `account` and the kubeconfig around
/// it; stores the token's hash before answering.
pub(crate) async fn kubeconfig_for(
    hub: &Hub,
    account: &str,
    token_name: &str,
    rotate: bool,
    public_url: &str,
) -> crate::Result<(String, TokenRecord)> {
    let now = now_unix();
    let mut store = hub.store.lock().await;
    let (token, record, ops) = {
        let mut tokens = hub.tokens();
        if token_name == CLOUDDRIVER_TOKEN && rotate {
            tokens.rotate_derived(account, token_name, now)?
        } else if token_name == CLOUDDRIVER_TOKEN {
            tokens.derived(account, token_name, now)?
        } else {
            tokens.issue(account, token_name, now)?
        }
    };
    store.commit(ops).await?;
    drop(store);
    let yaml = kubeconfig::render(&KubeconfigFor {
        account,
        public_url,
        ca_pem: hub.config.serving_ca_pem.as_deref(),
        token: &token,
    });
    Ok((yaml, record))
}

async fn issue_kubeconfig(
    State(hub): State<Arc<Hub>>,
    Path(name): Path<String>,
    Query(query): Query<KubeconfigQuery>,
    request: Request,
) -> Response {
    if let Err(refused) = require_admin(&hub, request.headers()) {
        return refused.into_response();
    }
    if let Err(message) = crate::session::validate_account_name(&name) {
        return crate::http::error(StatusCode::BAD_REQUEST, message);
    }
    let token_name = query
        .token_name
        .clone()
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| "kubeconfig".into());
    if token_name.len() > 63 || token_name.chars().any(|c| c.is_control()) {
        return crate::http::error(
            StatusCode::BAD_REQUEST,
            format!("token name {token_name:?} must be at most 63 printable characters"),
        );
    }
    if query.rotate && token_name != CLOUDDRIVER_TOKEN {
        return crate::http::error(
            StatusCode::BAD_REQUEST,
            format!(
                "rotate applies to the {CLOUDDRIVER_TOKEN:?} token only; any other token is \
                 replaced simply by issuing it again"
            ),
        );
    }
    let Some(url) = public_url(&hub, request.headers(), request.uri()) else {
        return crate::http::error(
            StatusCode::BAD_REQUEST,
            "cannot tell the hub's URL from the request: start the hub with --public-url".into(),
        );
    };
    match kubeconfig_for(&hub, &name, &token_name, query.rotate, &url).await {
        Ok((yaml, record)) => {
            tracing::info!(account = %name, token = %record.name, id = %record.id, "issued a proxy token and its kubeconfig");
            let mut response = (StatusCode::OK, yaml).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/yaml"),
            );
            response
        }
        Err(e) => crate::http::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot issue a token: {e}"),
        ),
    }
}

/// A token as the API lists it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenView {
    pub id: String,
    pub account: String,
    pub name: String,
    pub created: String,
    /// Derived from the hub's key (the Clouddriver token): the hub can render it again.
    pub derived: bool,
}

impl From<TokenRecord> for TokenView {
    fn from(r: TokenRecord) -> Self {
        TokenView {
            created: jiff::Timestamp::from_second(r.created)
                .map(|t| t.to_string())
                .unwrap_or_default(),
            derived: r.generation.is_some(),
            id: r.id,
            account: r.account,
            name: r.name,
        }
    }
}

async fn list_tokens(State(hub): State<Arc<Hub>>, headers: HeaderMap) -> Response {
    if let Err(refused) = require_admin(&hub, &headers) {
        return refused.into_response();
    }
    let list: Vec<TokenView> = hub
        .tokens()
        .list()
        .into_iter()
        .map(TokenView::from)
        .collect();
    Json(list).into_response()
}

async fn revoke_token(
    State(hub): State<Arc<Hub>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = require_admin(&hub, &headers) {
        return refused.into_response();
    }
    let mut store = hub.store.lock().await;
    let revoked = hub.tokens().revoke(&id);
    let Some((record, ops)) = revoked else {
        return crate::http::error(StatusCode::NOT_FOUND, format!("no token with id {id:?}"));
    };
    if let Err(e) = store.commit(ops).await {
        return crate::http::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the token is revoked in memory but could not be stored: {e}"),
        );
    }
    tracing::info!(account = %record.account, token = %record.name, %id, "revoked a proxy token");
    Json(TokenView::from(record)).into_response()
}
