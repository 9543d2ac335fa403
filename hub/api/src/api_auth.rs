//! The HTTP API's authentication layer: `require`, the per-route middleware in front of
//! the API's handlers. It first lets the replicas' shared store teach this replica a token
//! issued through another one ([`scale_agent_hub_replicas::sync::learn_bearer`]), then
//! applies the check.
//!
//! The check itself ([`authorize`]), the roles, and the API tokens file are in the auth
//! crate (`scale_agent_hub_auth::api_auth`), re-exported here at their old paths.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
use scale_agent_hub_auth::AuthBook;
pub use scale_agent_hub_auth::api_auth::{
    Caller, FileToken, Refused, Role, Source, TOKENS_FILE_POLL, TokensFile, authorize,
    authorize_request, check, file_entry, parse_tokens_file, scoped_file_entry,
};
use scale_agent_hub_replicas::Replicas;

/// Route layer: refuses requests whose token has less than `needed`, and hands the
/// [`Caller`] to the handler in the request's extensions. It reads the credentials (`auth`)
/// and, for a token this replica does not know, the replicas' shared store (`replicas`). Use
/// with `axum::middleware::from_fn_with_state((auth, replicas, role), require)`.
pub(crate) async fn require(
    State((auth, replicas, needed)): State<(Arc<AuthBook>, Arc<Replicas>, Role)>,
    mut request: Request,
    next: Next,
) -> Response {
    let what = format!("{} {}", request.method(), request.uri().path());
    scale_agent_hub_replicas::sync::learn_bearer(&replicas, &auth, request.headers()).await;
    let account = account_of(request.method(), request.uri().path());
    match authorize_request(&auth, request.headers(), needed, &what, account).await {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(refused) => refused.into_response(),
    }
}

/// Prefixes of the routes that address one account by name in their next segment: the
/// hub's own, and Armory's account routes (`/armory/accounts/<name>`,
/// `/agents/kubernetes/accounts/<name>[/namespaces]`), which read the same accounts.
const ACCOUNT_ROUTES: [&str; 4] = [
    "/api/v1/accounts/",
    "/api/v1/dynamic-accounts/",
    "/armory/accounts/",
    "/agents/kubernetes/accounts/",
];

/// Armory's routes that add and update accounts named in their bodies, not in the path
/// (their handlers check each name against the caller's globs).
const ARMORY_DYNAMIC: &str = "/armory/accounts/dynamic";

/// The account an account route addresses (`/api/v1/accounts/<name>/...`), whose name the
/// caller's account globs must admit.
fn account_of<'p>(method: &axum::http::Method, path: &'p str) -> Option<&'p str> {
    use axum::http::Method;
    // `dynamic` there is a route, not an account: without this a scoped token was refused
    // for not admitting an account named "dynamic".
    if path == ARMORY_DYNAMIC && (*method == Method::POST || *method == Method::PUT) {
        return None;
    }
    ACCOUNT_ROUTES
        .iter()
        .find_map(|prefix| path.strip_prefix(prefix))
        .map(|rest| rest.split('/').next().unwrap_or(rest))
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    fn account_of(path: &str) -> Option<&str> {
        super::account_of(&Method::GET, path)
    }

    #[test]
    fn account_routes_name_their_account() {
        assert_eq!(
            account_of("/api/v1/accounts/prod-eu/operations"),
            Some("prod-eu")
        );
        assert_eq!(account_of("/api/v1/accounts/prod-eu"), Some("prod-eu"));
        assert_eq!(account_of("/api/v1/accounts"), None);
        assert_eq!(account_of("/api/v1/agents"), None);
        assert_eq!(account_of("/armory/accounts/staging-x"), Some("staging-x"));
        assert_eq!(account_of("/api/v1/dynamic-accounts/dyn"), Some("dyn"));
        assert_eq!(account_of("/api/v1/dynamic-accounts"), None);
        assert_eq!(
            account_of("/agents/kubernetes/accounts/staging-x/namespaces"),
            Some("staging-x")
        );
        assert_eq!(account_of("/armory/accounts"), None);
        // Armory's add and update name their accounts in the body; a GET reads "dynamic".
        for method in [Method::POST, Method::PUT] {
            assert_eq!(super::account_of(&method, "/armory/accounts/dynamic"), None);
        }
        assert_eq!(account_of("/armory/accounts/dynamic"), Some("dynamic"));
    }
}
