//! `scale-agent-hub-net`: the hub's network edge, with no knowledge of what is served. The
//! listeners' TLS options and configurations ([`tls`], [`serve`]), the HTTP server loop and
//! its handshake logging ([`serve`]), the answers the hub's routers share (the REST API's
//! JSON error in [`http`], Kubernetes `Status` errors in [`status`]), refusals that wait for
//! their request's body ([`refusals`]), which headers cross
//! the Kubernetes API proxy's tunnel ([`headers`]), the HTTPS clients' set-up
//! ([`https`]), and what a connection may cost each listener: connection caps and the
//! header-read timeout ([`limits`], the gRPC listener's accept loop in [`incoming`]).
//!
//! Layer L1: it depends on `scale-agent-hub-model` (and the protocol crate) only; every crate
//! above that serves or calls HTTP may depend on it.

pub mod headers;
pub mod http;
pub mod https;
pub mod incoming;
pub mod limits;
pub mod refusals;
pub mod serve;
pub mod status;
pub mod tls;
