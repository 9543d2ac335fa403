//! Test support shared by Scale Agent's tests: the hub's and the agent's integration tests,
//! the end-to-end harness (`scale-agent-e2e`, its tests and its demo) and the bench.
//!
//! Only what is generic lives here; nothing depends on a product crate, so every crate of
//! the workspace can use it (a helper that starts a hub stays in the hub's
//! `tests/common`, one that needs a Kubernetes control plane in `scale-agent-e2e`):
//!
//! - [`pki`]: certificates made at test time (rcgen);
//! - [`tls`]: rustls client and server configurations from PEM;
//! - [`http`]: the one-shot HTTP and HTTPS client ([`http::Call`]), fallible;
//! - [`https`]: a client of one HTTPS server ([`https::Https`]), for tests that panic;
//! - [`wait`]: polling until something holds;
//! - [`metrics`]: reading Prometheus text;
//! - [`contract`]: the Clouddriver contract server (written from Clouddriver's source);
//! - [`oidc`]: a local OIDC issuer (discovery, JWKS over TLS, ES256 ID tokens);
//! - `properties` (feature `proptest`): the property tests' proptest configuration;
//! - [`free_port`].

pub mod contract;
pub mod http;
pub mod https;
pub mod metrics;
pub mod oidc;
pub mod pki;
#[cfg(feature = "proptest")]
pub mod properties;
pub mod tls;
pub mod wait;

/// A TCP port on loopback that is free right now. Another process may take it before it is
/// used; on a test machine that is rare enough to accept.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
