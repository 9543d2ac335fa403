//! The HTTP API's authentication layer: [`require`], the per-route middleware in front of
//! the API's handlers. It first lets the replicas' shared store teach this replica a token
//! issued through another one ([`crate::shared::learn_bearer`]), then applies the check.
//!
//! The check itself ([`authorize`]), the roles, and the API tokens file are in the auth
//! crate (`scale_agent_hub_auth::api_auth`), re-exported here at their old paths.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
pub use scale_agent_hub_auth::api_auth::{
    Caller, FileToken, Refused, Role, Source, TOKENS_FILE_POLL, TokensFile, authorize, check,
    file_entry, parse_tokens_file,
};

use crate::Hub;

/// Route layer: refuses requests whose token has less than `needed`, and hands the
/// [`Caller`] to the handler in the request's extensions. Use with
/// `axum::middleware::from_fn_with_state((hub, role), require)`.
pub(crate) async fn require(
    State((hub, needed)): State<(Arc<Hub>, Role)>,
    mut request: Request,
    next: Next,
) -> Response {
    let what = format!("{} {}", request.method(), request.uri().path());
    crate::shared::learn_bearer(&hub.replicas, &hub.auth, request.headers()).await;
    match authorize(&hub.auth, request.headers(), needed, &what) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(refused) => refused.into_response(),
    }
}
