//! The HTTP API (axum): agents, accounts, cached objects, operations, health, readiness and
//! metrics, the admin routes ([`crate::admin_api`], [`crate::agent_admin`],
//! [`crate::dynamic_accounts`]), and Armory's account routes ([`crate::armory`]). This module is the router: which route, behind which role,
//! forwarded to which replica; each group of routes has its own module. The routes work with
//! an [`ApiState`], the handles the hub's wiring gives them; the Kubernetes API proxy's
//! routes are the proxy's, merged beside these by the wiring (`scale_agent_hub::start`).

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

use scale_agent_hub_auth::AuthBook;
use scale_agent_hub_clouddriver::Registrar;
use scale_agent_hub_replicas::{
    Replicas,
    owners::forward::{INTERNAL_PREFIX, internal_auth, to_owner},
};
use scale_agent_hub_state::Live;
use scale_agent_hub_store::{Store, writer::Commits};

use crate::api_auth::{self, Role};
use listings::{account, accounts, agents, clouddriver, replica_accounts, replica_agents, version};
use objects::objects;
use operations::{account_operation, operation, submit_operation};

pub use health::{Health, Readiness};
pub use objects::{ObjectQuery, kind_matches};
pub use scale_agent_hub_model::time::rfc3339;
/// The API's error body: `{"error": message}` (in the net crate, beside the other answers the
/// hub's routers share).
pub use scale_agent_hub_net::http::error;

/// What the REST API reads of the hub's configuration, taken from it once at start-up
/// (`scale_agent_hub::start`).
#[derive(Clone, Debug)]
pub struct ApiSettings {
    /// The HTTP listener's URL as clients reach it (`https://hub.example:8443`), for the
    /// kubeconfigs the API hands out; `None`: taken from each request's `Host`.
    pub public_url: Option<String>,
    /// Whether the HTTP listener serves TLS: the scheme of a URL taken from `Host`.
    pub https: bool,
    /// PEM of the CA that signed the HTTP serving certificate, put into kubeconfigs.
    pub serving_ca_pem: Option<Vec<u8>>,
    /// Largest body of a REST API request (an operation's manifests).
    pub max_request_bytes: usize,
    /// How long finished operations stay visible at `GET /api/v1/operations/{id}`.
    pub operation_retention: Duration,
    /// Serve `/metrics` without a token.
    pub metrics_unauthenticated: bool,
    /// Default lifetime of the tokens issued for people (`--token-ttl`); zero: no expiry.
    pub token_ttl: Duration,
}

/// What the REST API's routes work with: the handles the hub's wiring builds at start-up
/// (`scale_agent_hub::start`) and hands to [`router`], and nothing else of the hub.
pub struct ApiState {
    /// The registry and cache, the streams, the dynamic accounts.
    pub live: Arc<Live>,
    /// The credentials: proxy and API tokens, the admin token, the API tokens file, agent
    /// tokens.
    pub auth: Arc<AuthBook>,
    /// The store, for what the API commits itself (tokens, dynamic accounts): its lock is
    /// held across the check and the commit. Lock order: store, then state.
    pub store: Arc<tokio::sync::Mutex<Store>>,
    /// The queue of the streams' changes: a binding moved by an admin is queued with them,
    /// in the order of the changes in memory.
    pub commits: Arc<Commits>,
    /// Who owns each account, the forwarder to the owners and the shared store's reads.
    pub replicas: Arc<Replicas>,
    /// The operations: the driver submits them, and its registry answers the lookups.
    pub operations: scale_agent_hub_operations::Driver,
    /// Registers accounts in Clouddriver (its status for `/api/v1/clouddriver`); `None` when
    /// no target is configured.
    pub registrar: Option<Arc<Registrar>>,
    pub settings: ApiSettings,
    /// What the health routes answer from.
    pub health: Arc<dyn Health>,
}

/// The API's routes, each group behind the role it needs ([`crate::api_auth`]), with the
/// routes other replicas forward to this one under [`INTERNAL_PREFIX`]; the health routes
/// answer from `api.health`. Stateless: the caller merges it with the proxy's routes.
pub fn router(api: ApiState) -> Router {
    let api = Arc::new(api);
    let max_request_bytes = api.settings.max_request_bytes;
    let role = |role: Role| {
        axum::middleware::from_fn_with_state(
            (api.auth.clone(), api.replicas.clone(), role),
            api_auth::require,
        )
    };
    let metrics_route = health::metrics_route(api.health.clone());
    let metrics_route = if api.settings.metrics_unauthenticated {
        metrics_route
    } else {
        metrics_route.route_layer(role(Role::Metrics))
    };
    let reader = Router::new()
        .route("/api/v1/agents", get(agents))
        .route("/api/v1/version", get(version))
        .route("/api/v1/accounts", get(accounts))
        .route("/api/v1/clouddriver", get(clouddriver))
        .merge(crate::armory::reads())
        .merge(account_reads(&api))
        .route_layer(role(Role::Reader));
    let operator = Router::new()
        .route(
            "/api/v1/accounts/{name}/operations",
            post(submit_operation).layer(DefaultBodyLimit::max(max_request_bytes)),
        )
        .route("/api/v1/operations/{id}", get(operation))
        .route(
            "/api/v1/accounts/{name}/credential",
            axum::routing::post(crate::credential::issue_credential),
        )
        .merge(account_operations(&api))
        .route_layer(role(Role::Operator));
    let admin = crate::admin_api::router()
        .merge(crate::agent_admin::router())
        .merge(crate::armory::changes())
        .merge(crate::identity_admin::router())
        .route_layer(role(Role::Admin));
    Router::new()
        .merge(health::probes(api.health.clone()))
        .merge(metrics_route)
        .merge(reader)
        .merge(operator)
        .merge(admin)
        .nest(INTERNAL_PREFIX, internal(&api))
        .with_state(api)
}

/// What other replicas forward to this one, the owner of the account
/// ([`scale_agent_hub_replicas::owners::forward`]): operations and the account's reads, behind the replicas'
/// secret (the proxy's routes are nested there too, by the wiring). A request here is never
/// forwarded again.
fn internal(api: &Arc<ApiState>) -> Router<Arc<ApiState>> {
    let max_request_bytes = api.settings.max_request_bytes;
    Router::new()
        .route(
            "/api/v1/accounts/{name}/operations",
            post(submit_operation).layer(DefaultBodyLimit::max(max_request_bytes)),
        )
        .route("/api/v1/agents", get(replica_agents))
        .route("/api/v1/accounts", get(replica_accounts))
        .merge(account_reads(api))
        .merge(account_operations(api))
        .route_layer(axum::middleware::from_fn_with_state(
            api.replicas.clone(),
            internal_auth,
        ))
}

/// An account and its cached objects: kept by its owner, so asked there when another
/// replica owns it.
fn account_reads(api: &ApiState) -> Router<Arc<ApiState>> {
    Router::new()
        .route("/api/v1/accounts/{name}", get(account))
        .route("/api/v1/accounts/{name}/objects", get(objects))
        .merge(crate::armory::account_reads())
        .route_layer(axum::middleware::from_fn_with_state(
            (api.replicas.clone(), api.live.clone()),
            to_owner,
        ))
}

/// An account's operations: kept by the replica that ran them, its owner.
fn account_operations(api: &ApiState) -> Router<Arc<ApiState>> {
    Router::new()
        .route(
            "/api/v1/accounts/{name}/operations/{id}",
            get(account_operation),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            (api.replicas.clone(), api.live.clone()),
            to_owner,
        ))
}
