//! `scale-agent-hub-operations`: the hub's operations. `POST
//! /api/v1/accounts/{name}/operations` turns a JSON request into a
//! [`pb::Operation`](scale_agent_proto::v1::Operation), routes it to a connected replica of
//! the account, waits for its result up to the deadline, retries on another replica when
//! the chosen one leaves before answering (only when that is safe), and keeps the outcome
//! for `GET /api/v1/operations/{id}`.
//!
//! - `request`: the request body and its conversion to the wire operation;
//! - `registry`: attempts in flight and the bodies kept for lookups;
//! - `render`: the typed response bodies;
//! - `submit`: the driver, and [`Driver`], what it works with;
//! - `persist`: the records of client ids in the store;
//! - `metrics`: [`OperationMetrics`].
//!
//! The replica an operation goes to is picked, and the operation queued on its stream, under
//! one registry guard (`scale_agent_hub_state::dispatch`, as the proxy's requests), so a
//! draining agent gets it before the Ack of its UnregisterAccount or is not picked.
//!
//! Read-your-writes: the objects a result carries enter the cache in the same batch as the
//! result (the cache crate's `apply_result_to_cache`, called by the stream), before the
//! waiter is told.
//!
//! Layer L3: depends on the model, state and store crates, and on no crate of the hub above
//! it. What it needs from the rest of the hub is handed over in a [`Driver`] (the live state,
//! the store lock, [`OperationMetrics`] and [`OperationSettings`]); the HTTP API submits
//! through it, and the gRPC streams hand the registry ([`Operations`]) what their agents
//! answer.

use std::time::Duration;

mod metrics;
pub mod persist;
mod registry;
mod render;
mod request;
mod submit;

pub use metrics::OperationMetrics;
pub use registry::{Bounds, Claim, Operations, Outcome, Owner};
pub use render::{Cause, OperationResponse, State, Status, Subject};
pub use request::{OperationRequest, idempotent};
pub use submit::{Driver, deadline_millis, submit};

/// Default time an operation may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest time an operation may take.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the hub waits past the deadline for the agent's own timeout answer.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(2);
/// Replicas tried for one operation.
pub const MAX_ATTEMPTS: usize = 3;
/// Finished operations kept at most (the oldest go first).
pub const MAX_RETAINED: usize = 10_000;
/// Default of `--max-operation-result-bytes`: the largest result (objects and text, all its
/// parts) one operation may return.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 64 * 1024 * 1024;
/// Default of `--max-operation-records-bytes`: the most JSON of operation bodies kept for
/// lookups.
pub const DEFAULT_MAX_RECORDS_BYTES: usize = 256 * 1024 * 1024;

/// The operations' settings besides the registry's [`Bounds`].
#[derive(Clone, Copy, Debug)]
pub struct OperationSettings {
    /// How long finished operations stay visible for lookups, and client ids stay claimed
    /// (`--operation-retention`).
    pub retention: Duration,
}
