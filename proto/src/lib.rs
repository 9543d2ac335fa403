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

impl v1::operation::Op {
    /// The operation's type as the hub's HTTP API and both sides' metrics name it; a bounded
    /// set, fit for a metrics label.
    pub fn name(&self) -> &'static str {
        use v1::operation::Op;
        match self {
            Op::Apply(_) => "apply",
            Op::Create(_) => "create",
            Op::Replace(_) => "replace",
            Op::Delete(_) => "delete",
            Op::Patch(_) => "patch",
            Op::Scale(_) => "scale",
            Op::Rollout(_) => "rollout",
            Op::Get(_) => "get",
            Op::List(_) => "list",
            Op::Events(_) => "events",
            Op::Logs(_) => "logs",
        }
    }
}
