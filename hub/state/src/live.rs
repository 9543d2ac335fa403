//! What the rest of the hub holds of the running streams: the messages it sends them
//! ([`Control`]) and the handle of each ([`SessionHandle`]).

use std::time::Instant;

use scale_agent_proto::v1 as pb;
use tokio::sync::mpsc;

use crate::{registry, tunnel};

/// A message to a running stream from elsewhere in the hub.
#[derive(Debug)]
pub enum Control {
    /// This stream now streams the account: send it a STREAMING assignment.
    Promote(String),
    /// End the stream with this status.
    Close(tonic::Status),
    /// Send this operation to the agent, unless its deadline (the submitter's) has passed
    /// by the time it is written: it then carries the time left (see the hub's `service`).
    Operation(Box<pb::Operation>, Instant),
    /// Tell the agent an account's state.
    AccountState(pb::AccountState),
    /// Tell the agent which replicas of its identity are connected.
    AgentReplicas(pb::AgentReplicas),
    /// Send the agent its identity's dynamic accounts.
    DynamicAccounts(pb::DynamicAccounts),
}

/// What the rest of the hub holds of one agent stream.
pub struct SessionHandle {
    /// Promotions, replacement, operations: handled by the stream's loop.
    pub control: mpsc::Sender<Control>,
    /// The stream's outbound queue, for tunnel frames that must not wait for that loop.
    pub outbound: tunnel::AgentSender,
    /// The tunnel window when the agent announced the `http-tunnel` capability.
    pub tunnel_window: Option<u32>,
}

/// An account's state as the wire carries it.
pub fn account_state_message(account: &str, record: &registry::StateRecord) -> pb::AccountState {
    use pb::account_state::State;
    let state = match record.state {
        registry::AccountState::Active => State::Active,
        registry::AccountState::Inactive => State::Inactive,
        registry::AccountState::Failed => State::Failed,
        registry::AccountState::Orphaned => State::Orphaned,
    };
    pb::AccountState {
        account: account.to_string(),
        state: state as i32,
        reason: record.reason.clone(),
        since_unix_millis: jiff::Timestamp::try_from(record.since)
            .map(|t| t.as_millisecond())
            .unwrap_or_default(),
    }
}
