//! `scale-agent-hub-api` (layer 5): the hub's REST API, and nothing else. Its one job is the
//! HTTP routes under `/api/v1/...` (and the health, readiness and metrics routes), each
//! behind the role it needs: the router and its groups of routes ([`http`]), the admin routes
//! for tokens and kubeconfigs ([`admin_api`], rendered by [`kubeconfig`]), for agent tokens
//! and bindings ([`agent_admin`]), for disabling identities, denying certificates and
//! deleting orphaned accounts ([`identity_admin`]) and for dynamic accounts
//! ([`dynamic_accounts`]), Armory's plugin routes for accounts mapped onto them ([`armory`]), the
//! listings of every replica ([`fleet`]), the audit lines of operations ([`audit`]) and the
//! authentication layer in front of the routes ([`api_auth`]).
//!
//! The routes work with an [`ApiState`]: the handles the hub's wiring builds and gives
//! [`router`] (the live state, the credentials, the store's lock and the commit queue, the
//! replicas, the operations' driver, the Clouddriver registrar, [`ApiSettings`]), and a
//! [`Health`] the health routes answer from (the wiring implements it). The router comes back
//! stateless; the wiring merges it with the Kubernetes API proxy's routes, which are the
//! proxy's.
//!
//! It may depend on the model, cache, net, state, auth, store, clouddriver, replicas and
//! operations crates. It does not depend on the proxy or the gRPC service (layer 4 crates
//! beside each other, not below the API in what it uses), nor on the facade.

pub mod admin_api;
pub mod agent_admin;
pub mod api_auth;
pub mod armory;
pub mod audit;
pub mod credential;
pub mod dynamic_accounts;
pub mod fleet;
pub mod http;
pub mod identity_admin;
pub mod kubeconfig;

pub use http::{ApiSettings, ApiState, Health, Readiness, router};
