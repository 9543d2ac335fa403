//! Scale Agent's wire protocol, `scaleagent.v1`: one bidirectional gRPC stream per agent
//! process. The stream contract is documented in `proto/scaleagent/v1/agent.proto`.
//!
//! The Rust code is generated into `src/gen/` and checked in, so building needs no protobuf
//! compiler; `make proto` regenerates it and a test fails when it is stale.

/// Generated from `proto/scaleagent/v1/agent.proto`.
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used
)]
pub mod v1 {
    include!("gen/scaleagent.v1.rs");
}
