//! The gRPC service: one task per agent stream, running the protocol of
//! [`crate::session`] with batching, acknowledgements, heartbeats and promotions, and the
//! Enroll RPC.
//!
//! - [`AgentHubService`] (here): the two RPCs; a stream is authenticated here, then served
//!   by a task of its own;
//! - `stream`: that task (`StreamTask`), from Hello to the stream's end;
//! - `batch`: the agent's messages in batches, applied, queued for the store, answered;
//! - `enrolment`: certificates for agents (Enroll, and RenewCertificate on a stream);
//! - `settings`: what the service reads of the configuration ([`StreamSettings`], built once
//!   by [`crate::start`] and held by `Hub`);
//! - `metrics`: what it records ([`GrpcMetrics`], registered by [`crate::metrics::Metrics`]).

mod batch;
mod enrolment;
mod metrics;
mod settings;
mod stream;

use std::sync::Arc;

use scale_agent_proto::v1::{self as pb, agent_hub_server::AgentHub, hub_message::Kind as Out};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming, metadata::MetadataMap};
use tracing::Instrument as _;

use self::stream::StreamTask;
pub use self::{
    metrics::GrpcMetrics,
    settings::{HeartbeatBounds, StreamSettings},
};
use crate::{
    Hub,
    agent_auth::{Authenticated, CertificateOrigin, authenticate},
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

pub(crate) use scale_agent_hub_model::time::now;

/// The tonic service.
pub(crate) struct AgentHubService {
    pub(crate) hub: Arc<Hub>,
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
        let peer_certs = match &self.hub.stream_settings.trusted_proxy {
            Some(trust) => Some(Arc::new(trust.request_chain(&request)?)),
            None => request.peer_certs(),
        };
        let auth = self
            .authenticate(
                peer_certs.as_deref().map(Vec::as_slice),
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
        let hub = self.hub.clone();
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
                if let Err(status) = StreamTask::run(hub, auth, inbound, out).await {
                    tracing::info!(code = ?status.code(), message = status.message(), "agent stream ended");
                    let _ = control.send(Err(status)).await;
                } else {
                    tracing::info!("agent stream closed by the agent");
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
        enrolment::answer(&self.hub, request).await
    }
}

impl AgentHubService {
    /// Who opens a stream: its certificate (`peer_certs`) or bearer token (`metadata`).
    /// Replicas sharing a store look the token or the enrolment up there first, as it may
    /// have been made through another replica.
    async fn authenticate(
        &self,
        peer_certs: Option<&[tonic::transport::CertificateDer<'static>]>,
        metadata: &MetadataMap,
        peer: &str,
    ) -> Result<Authenticated, Status> {
        if let Some(token) = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .map(|(_, token)| token.trim().to_string())
        {
            crate::shared::learn_agent_token(&self.hub.replicas, &self.hub.auth, &token, false)
                .await;
        }
        let auth = authenticate(&self.hub.auth, peer_certs, metadata).inspect_err(|status| {
            tracing::warn!(%peer, code = ?status.code(), reason = status.message(), "agent stream refused");
        })?;
        if auth.certificate == Some(CertificateOrigin::Hub)
            && crate::shared::learn_enrolled(&self.hub.replicas, &self.hub.auth, &auth.identity)
                .await
        {
            return authenticate(&self.hub.auth, peer_certs, metadata);
        }
        Ok(auth)
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
