//! Stream tests: the hub in-process on 127.0.0.1, fake agents built on the generated client,
//! over real mutual TLS with certificates generated at test time.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use rcgen::ExtendedKeyUsagePurpose;
use scale_agent_hub::{Config, GrpcSecurity, RunningHub, identity::AllowRule};
use scale_agent_proto::v1::{
    self as pb, account_assignment::Role, agent_hub_client::AgentHubClient,
    agent_message::Kind as Msg, hub_message::Kind as Out, kind_status::State as KindState,
    object_event::Type as EventType,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, transport::Endpoint};

#[path = "stream/accounts.rs"]
mod accounts;
#[path = "stream/connect.rs"]
mod connect;
#[path = "stream/operations.rs"]
mod operations;
#[path = "stream/protocol.rs"]
mod protocol;
