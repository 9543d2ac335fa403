//! The HTTP API (axum): agents, accounts, cached objects, operations, health, readiness and
//! metrics; it mounts the admin routes ([`crate::admin_api`]) and the Kubernetes API proxy
//! ([`crate::proxy`]). This module is the router: which route, behind which role, forwarded
//! to which replica; each group of routes has its own module.

mod health;
mod listings;
mod objects;
mod operations;
pub(crate) mod views;

use std::{sync::Arc, time::Duration};

use axum::{
    Router,
    extract::DefaultBodyLimit,
    routing::{get, post},
};

use crate::{
    Hub,
    api_auth::{self, Role},
};
use listings::{account, accounts, agents, clouddriver, replica_accounts, replica_agents, version};
use objects::objects;
use operations::{account_operation, operation, submit_operation};

pub(crate) use health::{Health, Readiness};
pub use objects::{ObjectQuery, kind_matches};
pub use scale_agent_hub_model::time::rfc3339;
/// The API's error body: `{"error": message}` (in the net crate, beside the other answers the
/// hub's routers share).
pub(crate) use scale_agent_hub_net::http::error;

/// What the REST API reads of the hub's configuration, taken from it once at start-up
/// ([`crate::start`]) and kept by [`Hub`].
#[derive(Clone, Debug)]
pub(crate) struct ApiSettings {
    /// The HTTP listener's URL as clients reach it (`https://hub.example:8443`), for the
    /// kubeconfigs the API hands out; `None`: taken from each request's `Host`.
    pub(crate) public_url: Option<String>,
    /// Whether the HTTP listener serves TLS: the scheme of a URL taken from `Host`.
    pub(crate) https: bool,
    /// PEM of the CA that signed the HTTP serving certificate, put into kubeconfigs.
    pub(crate) serving_ca_pem: Option<Vec<u8>>,
    /// Largest body of a REST API request (an operation's manifests).
    pub(crate) max_request_bytes: usize,
    /// How long finished operations stay visible at `GET /api/v1/operations/{id}`.
    pub(crate) operation_retention: Duration,
    /// Serve `/metrics` without a token.
    pub(crate) metrics_unauthenticated: bool,
}

/// The API's routes, each group behind the role it needs ([`crate::api_auth`]); the health
/// routes answer from `health`.
pub(crate) fn router(hub: Arc<Hub>, health: Arc<dyn Health>) -> Router {
    let max_request_bytes = hub.api_settings.max_request_bytes;
    let role =
        |role: Role| axum::middleware::from_fn_with_state((hub.clone(), role), api_auth::require);
    let metrics_route = health::metrics_route(health.clone());
    let metrics_route = if hub.api_settings.metrics_unauthenticated {
        metrics_route
    } else {
        metrics_route.route_layer(role(Role::Reader))
    };
    let reader = Router::new()
        .route("/api/v1/agents", get(agents))
        .route("/api/v1/version", get(version))
        .route("/api/v1/accounts", get(accounts))
        .route("/api/v1/clouddriver", get(clouddriver))
        .merge(account_reads(hub.clone()))
        .route_layer(role(Role::Reader));
    let operator = Router::new()
        .route(
            "/api/v1/accounts/{name}/operations",
            post(submit_operation).layer(DefaultBodyLimit::max(max_request_bytes)),
        )
        .route("/api/v1/operations/{id}", get(operation))
        .merge(account_operations(hub.clone()))
        .route_layer(role(Role::Operator));
    let admin = crate::admin_api::router()
        .merge(crate::agent_admin::router())
        .route_layer(role(Role::Admin));
    Router::new()
        .merge(health::probes(health))
        .merge(metrics_route)
        .merge(reader)
        .merge(operator)
        .merge(admin)
        .merge(crate::proxy::router(hub.proxy_routes()))
        .nest(
            crate::owners::forward::INTERNAL_PREFIX,
            internal(hub.clone()),
        )
        .with_state(hub)
}

/// What other replicas forward to this one, the owner of the account
/// ([`crate::owners::forward`]): the Kubernetes API proxy and operations, behind the
/// replicas' secret. A request here is never forwarded again.
fn internal(hub: Arc<Hub>) -> Router<Arc<Hub>> {
    let max_request_bytes = hub.api_settings.max_request_bytes;
    Router::new()
        .route(
            "/api/v1/accounts/{name}/operations",
            post(submit_operation).layer(DefaultBodyLimit::max(max_request_bytes)),
        )
        .route("/api/v1/agents", get(replica_agents))
        .route("/api/v1/accounts", get(replica_accounts))
        .merge(crate::proxy::router(hub.proxy_routes()))
        .merge(account_reads(hub.clone()))
        .merge(account_operations(hub.clone()))
        .route_layer(axum::middleware::from_fn_with_state(
            hub.replicas.clone(),
            crate::owners::forward::internal_auth,
        ))
}

/// An account and its cached objects: kept by its owner, so asked there when another
/// replica owns it.
fn account_reads(hub: Arc<Hub>) -> Router<Arc<Hub>> {
    Router::new()
        .route("/api/v1/accounts/{name}", get(account))
        .route("/api/v1/accounts/{name}/objects", get(objects))
        .route_layer(axum::middleware::from_fn_with_state(
            (hub.replicas.clone(), hub.live.clone()),
            crate::owners::forward::to_owner,
        ))
}

/// An account's operations: kept by the replica that ran them, its owner.
fn account_operations(hub: Arc<Hub>) -> Router<Arc<Hub>> {
    Router::new()
        .route(
            "/api/v1/accounts/{name}/operations/{id}",
            get(account_operation),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            (hub.replicas.clone(), hub.live.clone()),
            crate::owners::forward::to_owner,
        ))
}
