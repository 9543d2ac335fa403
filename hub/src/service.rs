//! The gRPC service: one task per agent stream, running the protocol of
//! [`crate::session`] with batching, acknowledgements, heartbeats and promotions.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::FutureExt as _;
use prost::Message as _;
use scale_agent_proto::v1::{
    self as pb, agent_hub_server::AgentHub, agent_message::Kind as Msg, hub_message::Kind as Out,
};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

use crate::{
    Control, GrpcSecurity, Hub, SessionHandle,
    agent_auth::{Authenticated, CertificateOrigin, authenticate},
    agent_tokens::AgentTokenKind,
    commits::AckGate,
    session::{Effects, Session, check_hello, message_type, streaming_assignment},
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
        let peer_certs = match &self.hub.config.security {
            GrpcSecurity::TrustedProxy(proxy) => {
                Some(Arc::new(proxy.trust.request_chain(&request)?))
            }
            _ => request.peer_certs(),
        };
        // Replicas sharing a store: a bearer token or an enrolment made through another
        // replica is looked up there before the stream is judged.
        if let Some(token) = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .map(|(_, token)| token.trim().to_string())
        {
            crate::shared::learn_agent_token(&self.hub.replicas, &self.hub.auth, &token, false)
                .await;
        }
        let mut auth = authenticate(&self.hub.auth, peer_certs.as_deref().map(Vec::as_slice), request.metadata())
            .inspect_err(|status| {
                tracing::warn!(%peer, code = ?status.code(), reason = status.message(), "agent stream refused");
            })?;
        if auth.certificate == Some(crate::agent_auth::CertificateOrigin::Hub)
            && crate::shared::learn_enrolled(&self.hub.replicas, &self.hub.auth, &auth.identity)
                .await
        {
            auth = authenticate(
                &self.hub.auth,
                peer_certs.as_deref().map(Vec::as_slice),
                request.metadata(),
            )?;
        }
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
        tokio::spawn(
            async move {
                if let Err(status) = run_stream(&hub, &auth, inbound, &out).await {
                    tracing::info!(code = ?status.code(), message = status.message(), "agent stream ended");
                    let _ = out.control.send(Err(status)).await;
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
        let peer = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let peer_certs = request.peer_certs();
        let request = request.into_inner();
        // An empty token with a client certificate is a renewal (item 9 of the contract).
        let result = match peer_certs.as_deref().filter(|chain| !chain.is_empty()) {
            Some(chain) if request.token.is_empty() => crate::agent_renewal::renew_by_certificate(
                self.hub.client_certificates().as_deref(),
                self.hub.auth.agent_ca(),
                self.hub.config.agent_cert_lifetime,
                chain,
                &request.csr_pem,
            )
            .map(|issued| issued_certificate(&self.hub, issued)),
            _ => enroll(&self.hub, request).await,
        };
        match &result {
            Ok(issued) => {
                tracing::info!(%peer, identity = %issued.identity, not_after = issued.not_after_unix, "certificate issued (enrolment or renewal by certificate)");
            }
            Err(status) => {
                tracing::warn!(%peer, code = ?status.code(), reason = status.message(), "enrolment or renewal refused");
            }
        }
        result.map(|certificate| {
            Response::new(pb::EnrollResponse {
                certificate: Some(certificate),
            })
        })
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

/// Checks an enrolment token and a CSR, issues the certificate, and marks the token used
/// (stored durably) before answering.
async fn enroll(hub: &Hub, request: pb::EnrollRequest) -> Result<pb::IssuedCertificate, Status> {
    if request.token.is_empty() {
        return Err(Status::unauthenticated(
            "Enroll needs a one-time enrolment token (`scale-agent-hub agent-token create \
             --identity <id> --accounts <pattern> --ttl 1h --once`)",
        ));
    }
    // The store lock is held from the check to the durable commit, so two enrolments with
    // one token cannot both succeed.
    let mut store = hub.store.lock().await;
    // Replicas sharing a store: the token as the store holds it now (issued, used or
    // revoked through another replica).
    crate::shared::learn_agent_token(&hub.replicas, &hub.auth, &request.token, true).await;
    let now = jiff::Timestamp::now().as_second();
    let record = hub
        .agent_tokens()
        .check(&request.token, AgentTokenKind::Enrolment, now)
        .map_err(|r| r.to_status())?
        .clone();
    let issued = hub
        .auth
        .agent_ca()
        .issue(
            &request.csr_pem,
            &record.identity,
            hub.config.agent_cert_lifetime,
        )
        .map_err(Status::invalid_argument)?;
    let ops = hub.agent_tokens().consume(&record.id, now);
    // Once across replicas: the token is marked used in the store only if no replica did
    // first (the store's lock above serializes this replica's enrolments only).
    if let Some(shared) = &hub.replicas.shared {
        let used = ops.iter().find_map(|op| match op {
            crate::store::StoreOp::PutAgentToken { record } => Some(record.clone()),
            _ => None,
        });
        if let Some(used) = used {
            let claimed = shared.claim_enrolment(&used).await.map_err(|e| {
                Status::unavailable(format!(
                    "the hub could not store the enrolment: {}",
                    crate::error::Chain(&e)
                ))
            })?;
            if !claimed {
                return Err(Status::permission_denied(format!(
                    "enrolment token {} was already used through another hub replica (an                      enrolment token works once); ask the hub's admin for a new one                      (`scale-agent-hub agent-token create --once`)",
                    record.id
                )));
            }
        }
    }
    store.commit(ops).await.map_err(|e| {
        Status::internal(format!(
            "the hub could not store the enrolment: {}",
            crate::error::Chain(&e)
        ))
    })?;
    Ok(issued_certificate(hub, issued))
}

fn issued_certificate(hub: &Hub, issued: crate::agent_ca::Issued) -> pb::IssuedCertificate {
    pb::IssuedCertificate {
        certificate_chain_pem: issued.certificate_pem,
        ca_pem: hub.auth.agent_ca().cert_pem().to_string(),
        identity: issued.identity,
        not_after_unix: issued.not_after,
    }
}

/// Answers a RenewCertificate: a certificate for the stream's identity, for a stream that a
/// certificate of the hub authenticated.
fn renew(hub: &Hub, auth: &Authenticated, csr_pem: &str) -> pb::CertificateRenewal {
    if auth.certificate != Some(CertificateOrigin::Hub) {
        return pb::CertificateRenewal {
            certificate: None,
            refused: format!(
                "identity {:?} authenticated with {}, not with a certificate this hub issued: \
                 renewal extends hub-issued certificates only; enrol with a one-time token \
                 (clouddriver.auth.enrolmentTokenFile) to get one",
                auth.identity, auth.via
            ),
        };
    }
    match hub
        .auth
        .agent_ca()
        .issue(csr_pem, &auth.identity, hub.config.agent_cert_lifetime)
    {
        Ok(issued) => {
            tracing::info!(identity = %auth.identity, not_after = issued.not_after, "agent certificate renewed");
            pb::CertificateRenewal {
                certificate: Some(issued_certificate(hub, issued)),
                refused: String::new(),
            }
        }
        Err(reason) => {
            tracing::warn!(identity = %auth.identity, %reason, "certificate renewal refused");
            pb::CertificateRenewal {
                certificate: None,
                refused: reason,
            }
        }
    }
}

/// A random token for a stream's Welcome.
fn session_token() -> Result<String, Status> {
    use base64::Engine as _;
    let bytes = crate::tokens::random_bytes::<32>()
        .map_err(|e| Status::internal(format!("cannot make a session token: {e}")))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

async fn run_stream(
    hub: &Arc<Hub>,
    auth: &Authenticated,
    mut inbound: Streaming<pb::AgentMessage>,
    out: &StreamOut,
) -> Result<(), Status> {
    let identity = auth.identity.as_str();
    let silence = hub.config.heartbeat_period * 2;
    let first = match tokio::time::timeout(silence, inbound.message()).await {
        Err(_) => {
            return Err(Status::deadline_exceeded(format!(
                "no Hello within {silence:?}"
            )));
        }
        Ok(Err(_)) | Ok(Ok(None)) => return Ok(()),
        Ok(Ok(Some(m))) => m,
    };
    hub.metrics
        .received(message_type(&first), first.encoded_len());
    let hello = check_hello(first).map_err(|e| e.to_status())?;
    let tunnel = hello.capabilities.iter().any(|c| c == TUNNEL_CAPABILITY);
    let (ctrl_tx, mut ctrl_rx) = mpsc::channel(CONTROL_BUFFER);
    let token = session_token()?;
    let (id, replaced, promotions) = {
        let mut st = hub.state();
        st.registry
            .may_replace(identity, &hello.replica, &hello.session_token)
            .map_err(Status::permission_denied)?;
        let connected = st
            .registry
            .connect(identity, &hello.replica, &hello.agent_version, now());
        st.registry.set_session_token(connected.0, token.clone());
        connected
    };
    let span = tracing::Span::current();
    span.record("replica", tracing::field::display(&hello.replica));
    span.record("session", id);
    hub.sessions().insert(
        id,
        SessionHandle {
            control: ctrl_tx,
            outbound: out.tunnel.clone(),
            tunnel_window: tunnel.then_some(crate::tunnel::WINDOW_BYTES),
        },
    );
    if let Some(old) = replaced {
        tracing::info!("a newer stream replaces the older one");
        hub.control(
            old,
            Control::Close(Status::aborted(
                "replaced by a newer stream from the same agent identity and replica",
            )),
        );
    }
    hub.deliver(promotions);
    hub.observe_states();
    hub.announce_replicas(identity);
    // After Welcome (the stream's loop sends that first): the dynamic accounts, every time.
    let dynamic = hub.dynamic_accounts().set_for(identity);
    hub.control(id, Control::DynamicAccounts(dynamic));
    tracing::info!(version = %hello.agent_version, "agent connected");

    let session =
        Session::new(id, identity.to_string()).with_account_patterns(auth.account_patterns.clone());
    let period = hub
        .config
        .granted_heartbeat_period(hello.heartbeat_period_seconds);
    if hello.heartbeat_period_seconds > 0
        && period.as_secs() != u64::from(hello.heartbeat_period_seconds)
    {
        tracing::info!(
            requested_seconds = hello.heartbeat_period_seconds,
            granted_seconds = period.as_secs(),
            "heartbeat period asked for is outside --min-heartbeat-period..--max-heartbeat-period; granted the nearest bound"
        );
    }
    let terms = Terms {
        session_token: token,
        period,
    };
    let mut too_large = None;
    let result = serve(
        hub,
        auth,
        session,
        terms,
        &mut inbound,
        &mut ctrl_rx,
        out,
        &mut too_large,
    )
    .await;

    let promotions = hub.state().registry.disconnect(id, now());
    hub.sessions().remove(&id);
    hub.operations.session_ended(id, too_large.as_deref());
    hub.tunnels.session_ended(id);
    // Unless a newer stream of the same replica took this one's place.
    let replica_left = !hub
        .state()
        .registry
        .replicas_of_identity(identity)
        .iter()
        .any(|(_, replica)| *replica == hello.replica);
    if replica_left {
        hub.dynamic_accounts()
            .forget_replica(identity, &hello.replica);
    }
    hub.deliver(promotions);
    hub.observe_states();
    hub.announce_replicas(identity);
    hub.agents_changed();
    result
}

/// The largest AgentMessage the hub decodes: an object of `--max-object-bytes` with room for
/// its envelope. Agents that know it (Welcome.max_message_bytes) split operation results
/// into parts below it.
pub(crate) fn max_message_bytes(config: &crate::Config) -> usize {
    usize::try_from(config.max_object_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(1024 * 1024)
}

/// Why operations in flight on a stream that broke on a message past the decode limit end
/// (an agent too old to split its results): not resent, the next replica would break too.
fn too_large_message(status: &Status) -> Option<String> {
    (status.code() == tonic::Code::OutOfRange && status.message().contains("too large")).then(
        || {
            format!(
                "the agent sent a message larger than the hub decodes ({}), which ended its \
             stream; upgrade the agent (newer agents send large results in parts), narrow \
             the question, or raise the hub's --max-object-bytes (the limit is that plus 1 MiB)",
                status.message()
            )
        },
    )
}

/// What a stream's Welcome tells the agent that is particular to the stream.
struct Terms {
    session_token: String,
    /// The heartbeat period granted.
    period: Duration,
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    hub: &Arc<Hub>,
    auth: &Authenticated,
    mut session: Session,
    terms: Terms,
    inbound: &mut Streaming<pb::AgentMessage>,
    ctrl_rx: &mut mpsc::Receiver<Control>,
    out: &StreamOut,
    too_large: &mut Option<String>,
) -> Result<(), Status> {
    let tx = &out.control;
    let Terms {
        session_token,
        period,
    } = terms;
    let silence = period * 2;
    send(
        tx,
        Out::Welcome(pb::Welcome {
            identity: session.identity.clone(),
            heartbeat_period_seconds: u32::try_from(period.as_secs().max(1)).unwrap_or(u32::MAX),
            max_unacked: hub.config.max_unacked,
            max_object_bytes: hub.config.max_object_bytes,
            hub_version: env!("CARGO_PKG_VERSION").to_string(),
            tunnel_window_bytes: crate::tunnel::WINDOW_BYTES,
            session_token,
            max_objects_per_account: hub.config.max_objects_per_account,
            max_message_bytes: u64::try_from(max_message_bytes(&hub.config)).unwrap_or(u64::MAX),
        }),
    )
    .await?;
    send(tx, Out::Ack(pb::Ack { seq: 1 })).await?;
    // After Welcome: what this hub reads beyond it (agents that do not know it ignore it).
    send(
        tx,
        Out::Capabilities(pb::HubCapabilities {
            capabilities: vec![scale_agent_proto::ACCOUNT_UNAVAILABLE_CAPABILITY.to_string()],
        }),
    )
    .await?;

    let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let shutdown = crate::shutting_down(hub.shutdown.clone());
    tokio::pin!(shutdown);
    let mut last_heard = tokio::time::Instant::now();
    let mut acks = AckGate::default();
    let mut store_progress = hub.commits.subscribe();
    loop {
        tokio::select! {
            () = &mut shutdown => {
                return Err(Status::unavailable("the hub is shutting down"));
            }
            ctrl = ctrl_rx.recv() => match ctrl {
                Some(Control::Close(status)) => return Err(status),
                Some(Control::Operation(mut op, deadline)) => {
                    // The time left now, not when it was submitted: an operation that waited
                    // in a full control queue must not run past its submitter's deadline. One
                    // with no time left is not sent; its submitter answers 504 not executed.
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        tracing::debug!(id = %op.id, "operation not sent: its deadline passed while queued");
                        continue;
                    }
                    op.timeout_millis = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1);
                    op.deadline_unix_millis = crate::operations::deadline_millis(left);
                    let id = op.id.clone();
                    send(tx, Out::Operation(*op)).await?;
                    hub.operations.mark_sent(&id);
                }
                Some(Control::AccountState(state)) => {
                    send(tx, Out::AccountState(state)).await?;
                }
                Some(Control::AgentReplicas(replicas)) => {
                    send(tx, Out::AgentReplicas(replicas)).await?;
                }
                Some(Control::DynamicAccounts(accounts)) => {
                    send(tx, Out::DynamicAccounts(accounts)).await?;
                }
                Some(Control::Promote(account)) => {
                    let assignment = {
                        let st = hub.state();
                        st.registry
                            .is_streaming(session.id, &account)
                            .then(|| streaming_assignment(&st.cache, &account))
                    };
                    if let Some(a) = assignment {
                        tracing::info!(account = %a.account, resume_points = a.resume_points.len(), "standby promoted: STREAMING");
                        hub.metrics.resumes.inc_by(a.resume_points.len() as u64);
                        send(tx, Out::Assignment(a)).await?;
                    }
                }
                None => return Err(Status::aborted("the hub dropped this stream")),
            },
            changed = store_progress.changed(), if acks.owes() => {
                if changed.is_err() {
                    return Err(Status::unavailable("the hub is shutting down"));
                }
                let progress = store_progress.borrow_and_update().clone();
                acknowledge(hub, &mut acks, &progress, tx).await?;
            }
            _ = heartbeat.tick() => {
                // Skipped when the agent is not reading: it has messages to read anyway.
                let _ = tx.try_send(Ok(pb::HubMessage {
                    kind: Some(Out::Heartbeat(pb::Heartbeat { sent_at_unix_millis: jiff::Timestamp::now().as_millisecond() })),
                }));
            }
            _ = tokio::time::sleep_until(last_heard + silence) => {
                return Err(Status::deadline_exceeded(format!(
                    "no message from the agent for {silence:?} (two heartbeat periods)"
                )));
            }
            msg = inbound.message() => {
                let first = match msg {
                    Ok(Some(m)) => m,
                    Ok(None) => return Ok(()),
                    Err(status) => {
                        tracing::debug!(%status, "agent stream broke");
                        *too_large = too_large_message(&status);
                        if let Some(message) = too_large.as_deref() {
                            tracing::warn!(%message, "agent stream ended by an oversized message");
                        }
                        return Ok(());
                    }
                };
                last_heard = tokio::time::Instant::now();
                let mut batch = Vec::new();
                let mut ended = false;
                let mut next = Some(first);
                while let Some(message) = next.take() {
                    // Tunnel frames go to their exchanges at once: they are outside the
                    // sequence numbers and must not wait for a batch to be stored.
                    if message.seq == 0 && matches!(message.kind, Some(Msg::Tunnel(_))) {
                        let size = message.encoded_len();
                        // Moved, not copied: data frames carry up to 64 KiB of body.
                        if let Some(Msg::Tunnel(frame)) = message.kind {
                            deliver_tunnel_frame(hub, session.id, frame, size, &out.tunnel)?;
                        }
                    } else {
                        batch.push(message);
                    }
                    if batch.len() >= MAX_BATCH {
                        break;
                    }
                    match inbound.message().now_or_never() {
                        Some(Ok(Some(m))) => next = Some(m),
                        Some(Ok(None)) => ended = true,
                        Some(Err(status)) => {
                            *too_large = too_large_message(&status);
                            ended = true;
                        }
                        None => {}
                    }
                }
                if !batch.is_empty() {
                    process_batch(hub, auth, &mut session, batch, tx, &mut acks).await?;
                    let progress = store_progress.borrow_and_update().clone();
                    acknowledge(hub, &mut acks, &progress, tx).await?;
                }
                if ended {
                    return Ok(());
                }
            }
        }
    }
}

/// Hands a tunnel frame to its exchange. A frame out of order resets that exchange only; one
/// past the flow-control window ends the stream (`resource_exhausted`), since the window is
/// what bounds the memory the hub spends on the agent's responses.
fn deliver_tunnel_frame(
    hub: &Hub,
    session: crate::registry::SessionId,
    frame: pb::TunnelFrame,
    size: usize,
    tx: &Outbound,
) -> Result<(), Status> {
    hub.metrics.received("tunnel", size);
    let exchange = frame.exchange;
    match hub.tunnels.deliver(session, frame) {
        Ok(None) => Ok(()),
        Ok(Some(reset)) => {
            tracing::warn!(exchange, reset = ?reset, "tunnel exchange broke the protocol; reset");
            crate::tunnel::send_frame_soon(tx, exchange, reset);
            Ok(())
        }
        Err(crate::tunnel::WindowViolation(reason)) => {
            tracing::warn!(exchange, %reason, "agent sent past the tunnel window; ending its stream");
            Err(Status::resource_exhausted(reason))
        }
    }
}

/// Applies a batch under the state lock and queues its changes for the store, then answers
/// (assignments first). The Ack of the batch's last message is sent by [`acknowledge`]
/// once the store allows it.
async fn process_batch(
    hub: &Arc<Hub>,
    auth: &Authenticated,
    session: &mut Session,
    batch: Vec<pb::AgentMessage>,
    tx: &Outbound,
    acks: &mut AckGate,
) -> Result<(), Status> {
    let mut fx = Effects::default();
    let mut protocol_error = None;
    // Replicas sharing a store: the cluster and binding of each account registered here,
    // as another replica may have stored them.
    if hub.replicas.shared.is_some() {
        let registered: Vec<String> = batch
            .iter()
            .filter_map(|m| match &m.kind {
                Some(pb::agent_message::Kind::RegisterAccount(r)) => Some(r.account.clone()),
                _ => None,
            })
            .collect();
        crate::shared::learn_accounts(&hub.replicas, &hub.live, &registered).await;
    }
    let queued = {
        let mut st = hub.state();
        let now = now();
        for msg in batch {
            hub.metrics.received(message_type(&msg), msg.encoded_len());
            if let Err(e) = session.handle(&mut st, &hub.limits, msg, now, &mut fx) {
                protocol_error = Some(e);
                break;
            }
        }
        // Queued in the same critical section as the change to the cache, so that the
        // store commits changes in the order they were made (see [`crate::commits`]).
        hub.commits.enqueue(std::mem::take(&mut fx.ops))
    };
    acks.batch(session.last_seq(), queued);
    // Reads waiting for the cache to reach a resourceVersion look again.
    hub.live.cache_advanced();
    hub.metrics.resumes.inc_by(fx.resumes);
    hub.metrics.relists.inc_by(fx.relists);
    if fx.stale > 0 {
        tracing::debug!(stale = fx.stale, "ignored replayed events");
    }
    hub.deliver(std::mem::take(&mut fx.promotions));
    hub.observe_states();
    if !fx.registered.is_empty() {
        hub.agents_changed();
    }
    if !fx.dynamic_statuses.is_empty() {
        let replica = hub
            .state()
            .registry
            .replicas_of_identity(&session.identity)
            .into_iter()
            .find_map(|(id, replica)| (id == session.id).then_some(replica))
            .unwrap_or_default();
        let mut dynamic = hub.dynamic_accounts();
        for status in std::mem::take(&mut fx.dynamic_statuses) {
            dynamic.report(&session.identity, &replica, status);
        }
    }
    for account in std::mem::take(&mut fx.discovery_changed) {
        tracing::info!(%account, "the cluster's kinds changed; discovery cache dropped");
        hub.discovery
            .invalidate(&account, std::time::Instant::now());
    }
    for result in std::mem::take(&mut fx.results) {
        let id = result.id.clone();
        if !hub.operations.complete(session.id, result) {
            tracing::debug!(%id, "result of an operation nobody waits for (timed out or unknown)");
        }
    }
    for reply in fx.replies {
        if let Some(kind) = reply.kind {
            send(tx, kind).await?;
        }
    }
    // After the assignments: the agent learns its role, then the account's state.
    for state in hub.account_states(&fx.registered) {
        send(tx, Out::AccountState(state)).await?;
    }
    for status in std::mem::take(&mut fx.kind_statuses) {
        send(tx, Out::KindStatus(status)).await?;
    }
    for csr_pem in std::mem::take(&mut fx.renewals) {
        send(tx, Out::CertificateRenewal(renew(hub, auth, &csr_pem))).await?;
    }
    if let Some(e) = protocol_error {
        tracing::warn!(error = ?e, "protocol error; ending the stream");
        return Err(e.to_status());
    }
    Ok(())
}

/// Sends the Ack the stream owes when the store allows it (see [`crate::commits`]).
async fn acknowledge(
    hub: &Hub,
    acks: &mut AckGate,
    progress: &crate::commits::Progress,
    tx: &Outbound,
) -> Result<(), Status> {
    match acks.ready(progress, hub.commits.queued_bytes()) {
        Some(seq) => send(tx, Out::Ack(pb::Ack { seq })).await,
        None => {
            if acks.owes() && !acks.held {
                acks.held = true;
                hub.metrics.acks_held.inc();
                tracing::debug!(
                    failing = progress.failing,
                    "Ack held until the store commits this stream's changes"
                );
            }
            Ok(())
        }
    }
}

/// Keepalive settings of the gRPC server, derived from the heartbeat period.
pub(crate) fn keepalive(period: Duration) -> (Duration, Duration) {
    (period, period * 2)
}
