//! `scale-agent-hub-grpc` (layer 4): the hub's gRPC service, and nothing else. One task per
//! agent stream, running the protocol of [`scale_agent_hub_state::session`] with batching,
//! acknowledgements, heartbeats and promotions, and the Enroll RPC.
//!
//! It depends on the model, state, auth, store, replicas and operations crates, and on no
//! crate of its own layer or above (not the proxy, the API or the hub's facade). What it
//! works with is handed over as a [`GrpcState`]: the live state ([`Live`]), the credentials
//! ([`AuthBook`]), the replicas ([`Replicas`]), the operations in flight ([`Operations`]),
//! the commit queue and the store's lock, the tunnels, its settings ([`StreamSettings`]),
//! its metrics ([`GrpcMetrics`]) and the shutdown signal. The proxy's caches hear of the
//! streams' changes through [`Live`] ([`scale_agent_hub_state::CacheEvents`]).
//!
//! - [`AgentHubService`] (here): the two RPCs; a stream is authenticated here, then served
//!   by a task of its own. It holds a [`GrpcState`], the handles the service works with,
//!   which the hub builds at start;
//! - `stream`: that task (`StreamTask`), from Hello to the stream's end;
//! - `batch`: the agent's messages in batches, applied, queued for the store, answered;
//! - `enrolment`: certificates for agents (Enroll, and RenewCertificate on a stream);
//! - `settings`: what the service reads of the configuration ([`StreamSettings`], built once
//!   by the hub's `start`);
//! - `metrics`: what it records ([`GrpcMetrics`], registered by the hub's `Metrics`).

mod batch;
mod enrolment;
mod metrics;
mod settings;
mod stream;

use std::sync::Arc;

use scale_agent_hub_auth::{
    AuthBook,
    agent_auth::{Authenticated, Presented, authenticate, claimed_identity},
};
use scale_agent_hub_model::time::now;
use scale_agent_hub_operations::Operations;
use scale_agent_hub_replicas::{Replicas, sync};
use scale_agent_hub_state::{Live, tunnel::Tunnels};
use scale_agent_hub_store::{Store, writer::Commits};
use scale_agent_proto::v1::{self as pb, agent_hub_server::AgentHub, hub_message::Kind as Out};
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming, metadata::MetadataMap};
use tracing::Instrument as _;

use self::stream::StreamTask;
pub use self::{
    metrics::GrpcMetrics,
    settings::{HeartbeatBounds, StreamSettings},
};

/// Messages waiting to be sent to one agent.
const OUTBOUND_BUFFER: usize = 64;
/// Control messages (promotions, replacement) waiting for one stream.
pub(crate) const CONTROL_BUFFER: usize = 16;
/// Most messages applied and stored in one transaction: a batch is whatever the agent has
/// already sent when the previous batch is stored, up to this many.
pub const MAX_BATCH: usize = 500;
/// The Hello capability of agents that carry the Kubernetes API proxy's exchanges.
pub const TUNNEL_CAPABILITY: &str = "http-tunnel";

/// What the gRPC service works with, handed over by the hub at start: the live state, the
/// credentials, the replicas, the operations in flight, the commit queue and the store's
/// lock, the tunnels, the streams' settings and metrics, and the shutdown signal.
pub struct GrpcState {
    /// The registry and cache, the streams, the dynamic accounts.
    pub live: Arc<Live>,
    /// Agent tokens and enrolments, the agent CA, the trusted client certificate issuers.
    pub auth: Arc<AuthBook>,
    /// Replicas sharing a store: credentials, enrolments and accounts made through another
    /// replica are looked up there.
    pub replicas: Arc<Replicas>,
    /// Operations in flight: marked sent, completed by results, ended with their stream.
    pub operations: Arc<Operations>,
    /// The queue of the streams' changes for the store, and its writer's progress (which
    /// releases Acks).
    pub commits: Arc<Commits>,
    /// The store, locked by an enrolment from its check to its durable commit (the streams
    /// never take it: they queue their changes in `commits`).
    pub store: Arc<tokio::sync::Mutex<Store>>,
    /// Open exchanges of the Kubernetes API proxy: the agents' tunnel frames go there.
    pub tunnels: Arc<Tunnels>,
    pub settings: StreamSettings,
    pub metrics: GrpcMetrics,
    /// `true` once the hub shuts down: every stream ends.
    pub shutdown: watch::Receiver<bool>,
}

/// The tonic service.
pub struct AgentHubService {
    state: Arc<GrpcState>,
}

impl AgentHubService {
    pub fn new(state: GrpcState) -> Self {
        AgentHubService {
            state: Arc::new(state),
        }
    }
}

type Outbound = mpsc::Sender<Result<pb::HubMessage, Status>>;

#[tonic::async_trait]
impl AgentHub for AgentHubService {
    type SessionStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::HubMessage, Status>> + Send>>;

    async fn session(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let peer = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        // Behind a TLS-terminating proxy the agent's certificate arrives in a header, from a
        // trusted proxy only; it is then verified like one presented directly.
        let (peer_certs, presented) = match &self.state.settings.trusted_proxy {
            Some(trust) => {
                let (chain, presented) = trust.request_chain(&request)?;
                (Some(Arc::new(chain)), presented)
            }
            None => (request.peer_certs(), Presented::Direct),
        };
        let auth = self
            .authenticate(
                peer_certs.as_deref().map(Vec::as_slice),
                presented,
                request.metadata(),
                &peer,
            )
            .await?;
        tracing::debug!(%peer, identity = %auth.identity, via = %auth.via, "agent authenticated");
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(OUTBOUND_BUFFER);
        // Tunnel frames have a queue of their own, merged into the stream, so the stream's
        // loop never waits behind request bodies or window updates.
        let (tunnel_tx, tunnel_rx) = mpsc::channel(scale_agent_proto::tunnel::QUEUE);
        let state = self.state.clone();
        let out = StreamOut {
            control: tx,
            tunnel: tunnel_tx,
        };
        // Every event of the stream (its accounts, batches, operations' results, tunnel
        // frames) is logged inside this span; the replica and session are filled in once
        // Hello is read.
        let span = tracing::info_span!(
            "agent_stream",
            identity = %auth.identity,
            %peer,
            replica = tracing::field::Empty,
            session = tracing::field::Empty,
        );
        let control = out.control.clone();
        tokio::spawn(
            async move {
                if let Err(status) = StreamTask::run(state, auth, inbound, out).await {
                    log_end(&status);
                    let _ = control.send(Err(status)).await;
                }
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(
            scale_agent_proto::tunnel::outbound(rx, tunnel_rx),
        )))
    }

    async fn enroll(
        &self,
        request: Request<pb::EnrollRequest>,
    ) -> Result<Response<pb::EnrollResponse>, Status> {
        enrolment::answer(&self.state, request).await
    }
}

impl AgentHubService {
    /// Who opens a stream: its certificate (`peer_certs`, as `presented`) or bearer token
    /// (`metadata`). Replicas sharing a store look the token up there first, as it may have
    /// been issued through another replica, and read the identity's state and enrolment
    /// as the store holds them now (a failed read refuses the stream).
    async fn authenticate(
        &self,
        peer_certs: Option<&[tonic::transport::CertificateDer<'static>]>,
        presented: Presented,
        metadata: &MetadataMap,
        peer: &str,
    ) -> Result<Authenticated, Status> {
        if let Some(token) = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .map(|(_, token)| token.trim().to_string())
        {
            sync::learn_agent_token(&self.state.replicas, &self.state.auth, &token, false).await;
        }
        let refused = |status: &Status| {
            tracing::warn!(%peer, code = ?status.code(), reason = status.message(), "agent stream refused");
        };
        if let Some(identity) = claimed_identity(&self.state.auth, peer_certs, metadata) {
            enrolment::refresh_identity(&self.state, &identity)
                .await
                .inspect_err(refused)?;
        }
        authenticate(&self.state.auth, peer_certs, metadata, presented).inspect_err(refused)
    }
}

/// Says why the hub ended a stream, at the hub's default level: a replacement, the hub's
/// shutdown or the agent going away are the ordinary course of things (info); anything else
/// (the agent silent for two heartbeat periods, a protocol violation, a refused identity, the
/// store failing) is something an operator looks into (warn), and the agent sees the same
/// status.
fn log_end(status: &Status) {
    use tonic::Code;
    match status.code() {
        Code::Aborted | Code::Unavailable | Code::Cancelled => {
            tracing::info!(code = ?status.code(), reason = status.message(), "agent stream ended by the hub");
        }
        _ => {
            tracing::warn!(code = ?status.code(), reason = status.message(), "agent stream ended by the hub");
        }
    }
}

/// The two queues of a stream's outbound side.
struct StreamOut {
    /// Welcome, acknowledgements, assignments, operations, heartbeats.
    control: Outbound,
    /// Tunnel frames.
    tunnel: Outbound,
}

async fn send(tx: &Outbound, kind: Out) -> Result<(), Status> {
    tx.send(Ok(pb::HubMessage { kind: Some(kind) }))
        .await
        .map_err(|_| Status::cancelled("the agent went away"))
}
