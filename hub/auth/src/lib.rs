//! `scale-agent-hub-auth`: who may do what at the hub. The tokens it issues (the Kubernetes
//! API proxy's and the HTTP API's, [`tokens`]) and agents' tokens and enrolled identities
//! ([`agent_tokens`]); the CA that issues agents' certificates ([`agent_ca`]) and renewal by
//! certificate ([`agent_renewal`]); how an agent stream is authenticated ([`agent_auth`],
//! [`grpc_security`], and [`forwarded`] certificates from a trusted proxy); the HTTP API's
//! roles check and tokens file ([`api_auth`]); OIDC ID tokens of people ([`oidc`]). [`AuthBook`] holds the hub's credentials as
//! one handle, which whatever authenticates or issues takes instead of the whole hub.
//!
//! Layer L2: it depends on `scale-agent-hub-model` and `scale-agent-hub-net` only. The HTTP
//! middleware that also asks the replicas' shared store about unknown tokens stays above it,
//! in the hub's `api_auth`.

pub mod admin_token;
pub mod agent_auth;
pub mod agent_ca;
pub mod agent_renewal;
pub mod agent_tokens;
pub mod api_auth;
pub mod book;
pub mod credential_sessions;
pub mod forwarded;
pub mod grpc_security;
pub mod identity_states;
pub mod oidc;
pub mod tokens;
pub mod watched_file;

pub use book::AuthBook;
