//! One agent stream from Hello to its end, as a [`StreamTask`]: Hello read, the stream
//! registered, Welcome sent, then one loop over what the stream waits on (the hub's
//! control messages, the store's progress for Acks, the heartbeat, the agent's silence and
//! the agent's messages, the last in [`super::batch`]), and the stream unregistered.

use std::{ops::ControlFlow, sync::Arc, time::Duration};

use futures::FutureExt as _;
use prost::Message as _;
use scale_agent_hub_auth::{
    agent_auth::Authenticated,
    credential_sessions::{self, Credential, Lease},
};
use scale_agent_hub_model::time::shutting_down;
use scale_agent_hub_state::{
    Control, Hearing, SessionHandle,
    identity_use::StreamShare,
    registry::SessionId,
    session::{Session, check_hello, message_type, streaming_assignment},
    tunnel,
};
use scale_agent_hub_store::writer::{AckGate, Progress};
use scale_agent_proto::v1::{self as pb, hub_message::Kind as Out};
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

use super::{CONTROL_BUFFER, GrpcState, StreamOut, TUNNEL_CAPABILITY, now, send};

/// Whether a stream goes on after a step: `Break` when the agent closed or broke it, which
/// ends the stream with `Ok`; a step's `Err` ends it with that status.
pub(super) type Step = ControlFlow<()>;

/// One agent's stream once Hello is read and the stream registered: the session protocol,
/// what the loop waits on, and what it owes the agent. Its async methods take `&mut self`
/// (the inbound `Streaming` is not `Sync`, and the task must be `Send`).
pub(super) struct StreamTask {
    pub(super) grpc: Arc<GrpcState>,
    pub(super) auth: Authenticated,
    pub(super) inbound: Streaming<pb::AgentMessage>,
    pub(super) out: StreamOut,
    /// The protocol state of this stream (its id, identity, accounts and sequence).
    pub(super) session: Session,
    /// The agent's replica, from Hello.
    replica: String,
    /// The token a newer stream of the same replica presents to replace this one (sent in
    /// Welcome).
    session_token: String,
    /// Promotions, operations, account states, replacement: from the rest of the hub.
    control: mpsc::Receiver<Control>,
    /// The heartbeat period granted to this stream.
    pub(super) period: Duration,
    heartbeat: tokio::time::Interval,
    /// When the agent's last message arrived: two periods of silence end the stream.
    pub(super) last_heard: tokio::time::Instant,
    /// The same, for the rest of the hub (the proxy flags the reads of a silent stream).
    pub(super) hearing: Arc<Hearing>,
    /// The Ack owed, and this stream's changes still queued for the store.
    pub(super) acks: AckGate,
    /// The commit writer's progress, which releases Acks.
    store_progress: watch::Receiver<Progress>,
    shutdown: watch::Receiver<bool>,
    /// Why operations in flight end when the stream broke on a message past the decode
    /// limit (see [`super::batch::too_large_message`]).
    pub(super) too_large: Option<String>,
    /// The stream's hold on the agent bearer token it authenticated with: revoking the
    /// token ends the stream (F17).
    token_lease: Option<Lease>,
}

impl StreamTask {
    /// Serves an authenticated stream until it ends: Hello, registration, the loop, and the
    /// stream's removal (whatever ended the loop). `Ok` when the agent ended it.
    pub(super) async fn run(
        grpc: Arc<GrpcState>,
        auth: Authenticated,
        mut inbound: Streaming<pb::AgentMessage>,
        out: StreamOut,
    ) -> Result<(), Status> {
        let Some(hello) = read_hello(&grpc, &mut inbound).await? else {
            tracing::info!("agent stream closed by the agent before Hello");
            return Ok(());
        };
        let mut task = Self::connect(grpc, auth, inbound, out, &hello)?;
        let result = task.serve().await;
        task.disconnect();
        result
    }

    /// Registers the stream ([`register`]), grants the heartbeat period and starts the
    /// stream's clocks.
    fn connect(
        grpc: Arc<GrpcState>,
        auth: Authenticated,
        inbound: Streaming<pb::AgentMessage>,
        out: StreamOut,
        hello: &pb::Hello,
    ) -> Result<Self, Status> {
        let identity = auth.identity.as_str();
        let token_lease = lease_token(&grpc, &auth)?;
        let share = join_identity(&grpc, identity, &hello.replica)?;
        let period = granted_period(&grpc, hello);
        let hearing = Arc::new(Hearing::new(period));
        let Registered {
            id,
            control,
            session_token,
        } = register(&grpc, identity, hello, &out, hearing.clone())?;
        tracing::info!(version = %hello.agent_version, "agent connected");

        let session = Session::new(id, identity.to_string())
            .with_grant(auth.grant.clone())
            .with_share(share);
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let store_progress = grpc.commits.subscribe();
        let shutdown = grpc.shutdown.clone();
        Ok(Self {
            grpc,
            auth,
            inbound,
            out,
            session,
            replica: hello.replica.clone(),
            session_token,
            control,
            period,
            heartbeat,
            last_heard: tokio::time::Instant::now(),
            hearing,
            acks: AckGate::default(),
            store_progress,
            shutdown,
            too_large: None,
            token_lease,
        })
    }

    /// Sends Welcome, then runs the loop until the stream ends.
    async fn serve(&mut self) -> Result<(), Status> {
        self.welcome().await?;
        let silence = self.period * 2;
        let revoked = credential_sessions::revoked(self.token_lease.clone());
        tokio::pin!(revoked);
        loop {
            let step = tokio::select! {
                () = shutting_down(self.shutdown.clone()) => {
                    Err(Status::unavailable("the hub is shutting down"))
                }
                () = &mut revoked => Err(token_revoked(self.auth.token_id.as_deref())),
                ctrl = self.control.recv() => self.on_control(ctrl).await,
                changed = self.store_progress.changed(), if self.acks.owes() => {
                    self.on_store_progress(changed).await
                }
                _ = self.heartbeat.tick() => {
                    self.still_admitted().await?;
                    self.send_heartbeat();
                    Ok(Step::Continue(()))
                }
                () = tokio::time::sleep_until(self.last_heard + silence) => {
                    // A hub short of CPU (thousands of agents connecting at once on a busy
                    // machine) wakes this task late, with the timer and the agent's next
                    // message ready together: the message wins, as the agent did speak.
                    match self.inbound.message().now_or_never() {
                        Some(msg) => self.on_message(msg).await,
                        None => Err(Status::deadline_exceeded(format!(
                            "no message from the agent for {silence:?} (two heartbeat periods)"
                        ))),
                    }
                }
                msg = self.inbound.message() => self.on_message(msg).await,
            };
            if step?.is_break() {
                return Ok(());
            }
        }
    }

    /// Welcome with the stream's terms, the Ack of Hello, and the hub's capabilities.
    async fn welcome(&mut self) -> Result<(), Status> {
        let settings = &self.grpc.settings;
        let tx = &self.out.control;
        send(
            tx,
            Out::Welcome(pb::Welcome {
                identity: self.session.identity.clone(),
                heartbeat_period_seconds: u32::try_from(self.period.as_secs().max(1))
                    .unwrap_or(u32::MAX),
                max_unacked: settings.max_unacked,
                max_object_bytes: settings.limits.max_object_bytes,
                hub_version: env!("CARGO_PKG_VERSION").to_string(),
                tunnel_window_bytes: tunnel::WINDOW_BYTES,
                session_token: self.session_token.clone(),
                max_objects_per_account: settings.limits.max_objects_per_account,
                max_message_bytes: u64::try_from(settings.max_message_bytes()).unwrap_or(u64::MAX),
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
        .await
    }

    /// A control message from the rest of the hub.
    async fn on_control(&mut self, ctrl: Option<Control>) -> Result<Step, Status> {
        let tx = &self.out.control;
        match ctrl {
            Some(Control::Close(status)) => return Err(status),
            Some(Control::AccountState(state)) => {
                send(tx, Out::AccountState(state)).await?;
            }
            Some(Control::AgentReplicas(replicas)) => {
                send(tx, Out::AgentReplicas(replicas)).await?;
            }
            Some(Control::DynamicAccounts(accounts)) => {
                send(tx, Out::DynamicAccounts(accounts)).await?;
            }
            Some(Control::Promote(account)) => self.promote(&account).await?,
            None => return Err(Status::aborted("the hub dropped this stream")),
        }
        Ok(Step::Continue(()))
    }

    /// A standby of `account` on this stream was promoted: its assignment, STREAMING, with
    /// the resume points, if the stream still holds the account.
    async fn promote(&mut self, account: &str) -> Result<(), Status> {
        let assignment = {
            let registry = self.grpc.live.registry_read();
            registry.is_streaming(self.session.id, account).then(|| {
                let cache = self.grpc.live.cache().account(account).unwrap_or_default();
                streaming_assignment(&scale_agent_hub_cache::lock(&cache), account)
            })
        };
        if let Some(a) = assignment {
            tracing::info!(account = %a.account, resume_points = a.resume_points.len(), "standby promoted: STREAMING");
            self.grpc
                .metrics
                .resumes
                .inc_by(a.resume_points.len() as u64);
            send(&self.out.control, Out::Assignment(a)).await?;
        }
        Ok(())
    }

    /// The store committed more: the Ack owed, if it may go now.
    async fn on_store_progress(
        &mut self,
        changed: Result<(), watch::error::RecvError>,
    ) -> Result<Step, Status> {
        if changed.is_err() {
            return Err(Status::unavailable("the hub is shutting down"));
        }
        self.acknowledge().await?;
        Ok(Step::Continue(()))
    }

    /// Sends the Ack the stream owes when the store allows it (see
    /// [`scale_agent_hub_store::writer`]).
    pub(super) async fn acknowledge(&mut self) -> Result<(), Status> {
        let progress = self.store_progress.borrow_and_update().clone();
        match self.acks.ready(&progress, self.grpc.commits.queued_bytes()) {
            Some(seq) => send(&self.out.control, Out::Ack(pb::Ack { seq })).await,
            None => {
                if self.acks.owes() && !self.acks.held {
                    self.acks.held = true;
                    self.grpc.metrics.acks_held.inc();
                    tracing::debug!(
                        failing = progress.failing,
                        "Ack held until the store commits this stream's changes"
                    );
                }
                Ok(())
            }
        }
    }

    /// A heartbeat, skipped when the agent is not reading: it has messages to read anyway.
    /// Whether the stream's identity and certificate are still admitted (an admin may have
    /// disabled the identity or denied the certificate through another replica since the
    /// stream opened; through this one, the stream was closed at once). Checked at every
    /// heartbeat: with a shared store, the identity's state is read from it first; a read
    /// that fails keeps the stream (the decision this replica knows still applies).
    async fn still_admitted(&self) -> Result<(), Status> {
        let identity = &self.auth.identity;
        if let Some(shared) = &self.grpc.replicas.shared {
            match shared.find_identity_state(identity).await {
                Ok(state) => self.grpc.auth.identity_states().learn(identity, state),
                Err(e) => {
                    tracing::warn!(error = %scale_agent_hub_model::error::Chain(&e), "cannot read the identity's state from the shared store; the stream goes on");
                }
            }
        }
        scale_agent_hub_auth::identity_states::check(
            self.grpc.auth.identity_states().get(identity),
            identity,
            self.auth.serial.as_deref(),
        )
        .map_err(Status::permission_denied)
    }

    fn send_heartbeat(&self) {
        let _ = self.out.control.try_send(Ok(pb::HubMessage {
            kind: Some(Out::Heartbeat(pb::Heartbeat {
                sent_at_unix_millis: jiff::Timestamp::now().as_millisecond(),
            })),
        }));
    }

    /// Removes the stream from the registry, the streams, the operations and the tunnels,
    /// and tells the rest of the hub.
    fn disconnect(&self) {
        let grpc = &self.grpc;
        let live = &grpc.live;
        let id = self.session.id;
        let identity = self.auth.identity.as_str();
        let promotions = live.registry().disconnect(id, now());
        live.sessions().remove(&id);
        grpc.operations.session_ended(id, self.too_large.as_deref());
        grpc.tunnels.session_ended(id);
        // Unless a newer stream of the same replica took this one's place.
        let replica_left = !live
            .registry()
            .replicas_of_identity(identity)
            .iter()
            .any(|(_, replica)| *replica == self.replica);
        if replica_left {
            live.dynamic_accounts()
                .forget_replica(identity, &self.replica);
        }
        live.deliver(promotions);
        live.observe_states();
        live.announce_replicas(identity);
        live.agents_changed();
    }
}

/// What [`register`] made of a stream.
struct Registered {
    id: SessionId,
    /// The stream's end of its control queue ([`SessionHandle::control`]).
    control: mpsc::Receiver<Control>,
    /// For Welcome.
    session_token: String,
}

/// Registers the stream of `identity` in the registry and among the streams, replacing an
/// older one of the same replica, and tells the rest of the hub (promotions, accounts'
/// states, the agent's replicas, its dynamic accounts).
/// The stream's place among its identity's streams, within `--max-streams-per-identity`
/// (review F14). A replica reconnecting replaces its own stream, which still counts until
/// it is replaced: that one is let in past the limit.
fn join_identity(grpc: &GrpcState, identity: &str, replica: &str) -> Result<StreamShare, Status> {
    let book = grpc.live.identity_use();
    let max = grpc.settings.max_streams_per_identity;
    let refused = match book.join(identity, max) {
        Ok(share) => return Ok(share),
        Err(refused) => refused,
    };
    if grpc.live.registry_read().has_session(identity, replica) {
        // 0: no limit, so the join cannot be refused.
        if let Ok(share) = book.join(identity, 0) {
            return Ok(share);
        }
    }
    grpc.metrics.identity_limit_refused("streams");
    tracing::warn!(%identity, %replica, open = refused.open, limit = refused.max, "agent stream refused: its identity has as many streams open as --max-streams-per-identity");
    Err(Status::resource_exhausted(format!(
        // troubleshooting: an agent's stream refused by the hub
        // One agent identity may have at most `--max-streams-per-identity` streams open on a
        // hub replica (default 16): each agent pod holds one, so more means more pods than
        // that, or a client making up replica names. The new stream is refused with gRPC
        // `RESOURCE_EXHAUSTED`; the identity's other streams go on.
        "agent identity {identity:?} already has {} streams open on this hub replica, the \
         limit of --max-streams-per-identity {}: each agent pod holds one stream; raise \
         --max-streams-per-identity on the hub if this identity runs more pods, or find what \
         else presents its credential",
        refused.open, refused.max
    )))
}

fn register(
    grpc: &GrpcState,
    identity: &str,
    hello: &pb::Hello,
    out: &StreamOut,
    hearing: Arc<Hearing>,
) -> Result<Registered, Status> {
    let tunnelled = hello.capabilities.iter().any(|c| c == TUNNEL_CAPABILITY);
    let (ctrl_tx, control) = mpsc::channel(CONTROL_BUFFER);
    let token = session_token()?;
    let live = &grpc.live;
    let (id, replaced, promotions) = {
        let mut registry = live.registry();
        registry
            .may_replace(identity, &hello.replica, &hello.session_token)
            .map_err(Status::permission_denied)?;
        let connected = registry.connect(identity, &hello.replica, &hello.agent_version, now());
        registry.set_session_token(connected.0, token.clone());
        connected
    };
    let span = tracing::Span::current();
    span.record("replica", tracing::field::display(&hello.replica));
    span.record("session", id);
    live.sessions().insert(
        id,
        SessionHandle {
            control: ctrl_tx,
            outbound: out.tunnel.clone(),
            tunnel_window: tunnelled.then_some(tunnel::WINDOW_BYTES),
            hearing,
        },
    );
    if let Some(old) = replaced {
        tracing::info!("a newer stream replaces the older one");
        live.control(
            old,
            Control::Close(Status::aborted(
                "replaced by a newer stream from the same agent identity and replica",
            )),
        );
    }
    live.deliver(promotions);
    live.observe_states();
    live.announce_replicas(identity);
    // After Welcome (the stream's loop sends that first): the dynamic accounts, every time.
    let dynamic = live.dynamic_accounts().set_for(identity);
    live.control(id, Control::DynamicAccounts(dynamic));
    Ok(Registered {
        id,
        control,
        session_token: token,
    })
}

/// The stream's lease on the agent bearer token it authenticated with, if any; refused when
/// the token was revoked since (between authentication and now).
fn lease_token(grpc: &GrpcState, auth: &Authenticated) -> Result<Option<Lease>, Status> {
    let Some(id) = &auth.token_id else {
        return Ok(None);
    };
    let lease = grpc
        .auth
        .credential_sessions()
        .open(Credential::AgentToken(id.clone()));
    if !grpc.auth.agent_tokens().holds(id) {
        return Err(token_revoked(Some(id)));
    }
    Ok(Some(lease))
}

/// The end of a stream whose agent bearer token was revoked.
fn token_revoked(id: Option<&str>) -> Status {
    Status::unauthenticated(format!(
        // troubleshooting: an agent's stream ended by the hub: gRPC `UNAUTHENTICATED`
        // The agent bearer token the stream authenticated with was revoked (`scale-agent-hub
        // agent-token revoke`). Give the agent a new token (`scale-agent-hub agent-token create`)
        // or enrol it for a certificate.
        "the agent bearer token {} this stream authenticated with was revoked by the hub's \
         admin; the agent needs a new token (`scale-agent-hub agent-token create`) or a \
         certificate (enrolment)",
        id.unwrap_or("")
    ))
}

/// Waits for Hello (two default heartbeat periods at most) and checks it; `None` when the
/// agent ended the stream first.
async fn read_hello(
    grpc: &GrpcState,
    inbound: &mut Streaming<pb::AgentMessage>,
) -> Result<Option<pb::Hello>, Status> {
    let silence = grpc.settings.heartbeat.default * 2;
    let first = match tokio::time::timeout(silence, inbound.message()).await {
        Err(_) => {
            return Err(Status::deadline_exceeded(format!(
                "no Hello within {silence:?}"
            )));
        }
        Ok(Err(_)) | Ok(Ok(None)) => return Ok(None),
        Ok(Ok(Some(m))) => m,
    };
    grpc.metrics
        .received(message_type(&first), first.encoded_len());
    check_hello(first).map(Some).map_err(|e| e.to_status())
}

/// The heartbeat period granted to the agent of `hello` (logged when it asked for one
/// outside the bounds).
fn granted_period(grpc: &GrpcState, hello: &pb::Hello) -> Duration {
    let period = grpc
        .settings
        .heartbeat
        .grant(hello.heartbeat_period_seconds);
    if hello.heartbeat_period_seconds > 0
        && period.as_secs() != u64::from(hello.heartbeat_period_seconds)
    {
        tracing::info!(
            requested_seconds = hello.heartbeat_period_seconds,
            granted_seconds = period.as_secs(),
            "heartbeat period asked for is outside --min-heartbeat-period..--max-heartbeat-period; granted the nearest bound"
        );
    }
    period
}

/// A random token for a stream's Welcome.
fn session_token() -> Result<String, Status> {
    use base64::Engine as _;
    let bytes = scale_agent_hub_auth::tokens::random_bytes::<32>()
        .map_err(|e| Status::internal(format!("cannot make a session token: {e}")))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}
