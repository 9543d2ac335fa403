//! The agent's messages on a stream: gathered into batches (tunnel frames handed to their
//! exchanges at once), each batch applied under the state lock and queued for the store,
//! its effects handed to the rest of the hub, and the agent answered.

use futures::FutureExt as _;
use prost::Message as _;
use scale_agent_hub_cache::{AccountSlot, lock};
use scale_agent_hub_model::store_op::StoreOp;
use scale_agent_hub_replicas::sync;
use scale_agent_hub_state::{
    registry::SessionId,
    session::{self, Effects, ProtocolError, Route, message_type},
    tunnel,
};
use scale_agent_proto::v1::{self as pb, agent_message::Kind as Msg, hub_message::Kind as Out};
use tonic::Status;

use super::{
    GrpcState, MAX_BATCH, Outbound, enrolment, now, send,
    stream::{Step, StreamTask},
};

impl StreamTask {
    /// The agent sent a message, ended the stream (`None`) or broke it (`Err`): the message
    /// and what else the agent has already sent, as one batch.
    pub(super) async fn on_message(
        &mut self,
        msg: Result<Option<pb::AgentMessage>, Status>,
    ) -> Result<Step, Status> {
        let first = match msg {
            Ok(Some(m)) => m,
            Ok(None) => {
                tracing::info!("agent stream closed by the agent");
                return Ok(Step::Break(()));
            }
            Err(status) => {
                self.too_large = too_large_message(&status);
                match self.too_large.as_deref() {
                    Some(message) => {
                        tracing::warn!(%message, "agent stream ended by an oversized message")
                    }
                    // The connection broke under the stream (the agent went away, a
                    // proxy cut it, HTTP/2 keepalive found it dead): said at the default
                    // level, as the agent will reconnect and someone may ask why.
                    None => tracing::info!(%status, "agent stream broke"),
                }
                return Ok(Step::Break(()));
            }
        };
        self.last_heard = tokio::time::Instant::now();
        self.hearing.heard();
        let (batch, ended) = self.gather(first)?;
        if !batch.is_empty() {
            self.process_batch(batch).await?;
            self.acknowledge().await?;
        }
        Ok(if ended {
            Step::Break(())
        } else {
            Step::Continue(())
        })
    }

    /// `first` and the messages already received after it, up to [`MAX_BATCH`]; tunnel
    /// frames among them go to their exchanges instead. `true` when the stream ended.
    fn gather(&mut self, first: pb::AgentMessage) -> Result<(Vec<pb::AgentMessage>, bool), Status> {
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
                    deliver_tunnel_frame(
                        &self.grpc,
                        self.session.id,
                        frame,
                        size,
                        &self.out.tunnel,
                    )?;
                }
            } else {
                batch.push(message);
            }
            if batch.len() >= MAX_BATCH {
                break;
            }
            match self.inbound.message().now_or_never() {
                Some(Ok(Some(m))) => next = Some(m),
                Some(Ok(None)) => {
                    tracing::info!("agent stream closed by the agent");
                    ended = true;
                }
                Some(Err(status)) => {
                    self.too_large = too_large_message(&status);
                    match self.too_large.as_deref() {
                        Some(message) => {
                            tracing::warn!(%message, "agent stream ended by an oversized message")
                        }
                        None => tracing::info!(%status, "agent stream broke"),
                    }
                    ended = true;
                }
                None => {}
            }
        }
        Ok((batch, ended))
    }

    /// Applies a batch under the state lock and queues its changes for the store, then
    /// answers (assignments first). The Ack of the batch's last message is sent by
    /// [`StreamTask::acknowledge`] once the store allows it.
    async fn process_batch(&mut self, batch: Vec<pb::AgentMessage>) -> Result<(), Status> {
        learn_registered_accounts(&self.grpc, &batch).await;
        let unregisters = batch
            .iter()
            .any(|m| matches!(m.kind, Some(Msg::UnregisterAccount(_))));
        let (mut fx, protocol_error) = self.apply(batch);
        if unregisters {
            // The Ack of an UnregisterAccount goes after every request head the proxy
            // queued before the unregistration took the registry's write lock: the
            // draining agent counts those in flight (see `tunnel::flushed`). Bounded by
            // the silence that ends a stream: an agent that stops reading is not waited
            // for longer than one that stops talking.
            let silence = self.period * 2;
            if tokio::time::timeout(silence, tunnel::flushed(&self.out.tunnel))
                .await
                .is_err()
            {
                tracing::warn!(
                    waited_s = silence.as_secs(),
                    "the agent did not read its tunnel frames; acknowledging its \
                     UnregisterAccount without them"
                );
            }
        }
        self.propagate(&mut fx);
        self.answer(fx).await?;
        if let Some(e) = protocol_error {
            if matches!(e, ProtocolError::ResourceExhausted(_)) {
                self.grpc.metrics.identity_limit_refused("staged_bytes");
            }
            tracing::warn!(error = ?e, "protocol error; ending the stream");
            return Err(e.to_status());
        }
        Ok(())
    }

    /// Applies the messages in order, up to a protocol error. Each object's JSON is
    /// validated and packed first, outside any lock ([`session::prepare`]). Then a message
    /// that changes the registry takes it exclusively; a run of other messages of one
    /// account takes it shared and that account's lock, so batches of different accounts
    /// and the proxy's reads of other accounts go on at the same time. The changes are
    /// queued for the store before the locks that guarded them are released, so that the
    /// store commits an account's changes in the order they were made (see
    /// [`scale_agent_hub_store::writer`]).
    fn apply(&mut self, batch: Vec<pb::AgentMessage>) -> (Effects, Option<ProtocolError>) {
        let StreamTask {
            grpc,
            session,
            acks,
            ..
        } = self;
        let live = &grpc.live;
        let limits = &grpc.settings.limits;
        let mut fx = Effects::default();
        let now = now();
        let mut queue = |ops: &mut Vec<StoreOp>, seq: u64| {
            if let Some(queued) = grpc.commits.enqueue(std::mem::take(ops)) {
                acks.batch(seq, Some(queued));
            }
        };
        let mut messages = batch
            .into_iter()
            .map(|mut msg| {
                grpc.metrics.received(message_type(&msg), msg.encoded_len());
                let prepared = session::prepare(&mut msg, limits);
                (msg, prepared)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .peekable();
        let protocol_error = 'batch: loop {
            let Some((first, _)) = messages.peek() else {
                break None;
            };
            match session::route(first) {
                Route::Control(account) => {
                    let account = account.to_string();
                    let Some((msg, _)) = messages.next() else {
                        break None;
                    };
                    fx.registry_changed = true;
                    let mut registry = live.registry();
                    let slot = account_slot(live, &registry, session.id, Some(&account));
                    let mut cache = lock(&slot);
                    let mut st = session::Control {
                        registry: &mut registry,
                        cache: &mut cache,
                    };
                    let handled = session.handle_control(&mut st, limits, msg, now, &mut fx);
                    // Whatever the message dropped (a forbidden kind, an unregistered
                    // account) gives its bytes back to the hub-wide budget.
                    live.cache().cached_bytes().settle(st.cache);
                    queue(&mut fx.ops, session.last_seq());
                    if let Err(e) = handled {
                        break Some(e);
                    }
                }
                Route::Data(account) => {
                    let account = account.map(str::to_string);
                    let registry = live.registry_read();
                    let slot = account_slot(live, &registry, session.id, account.as_deref());
                    let mut cache = lock(&slot);
                    let mut st = session::Data {
                        registry: &registry,
                        cache: &mut cache,
                        budget: live.cache().history_budget(),
                        cached_bytes: live.cache().cached_bytes(),
                    };
                    // The run of this account's messages (and messages of no account).
                    while let Some((msg, prepared)) = messages.next_if(|(m, _)| {
                        matches!(session::route(m), Route::Data(a) if a.is_none() || a == account.as_deref())
                    }) {
                        if let Err(e) = session.handle_data(&mut st, limits, msg, prepared, &mut fx) {
                            st.cached_bytes.settle(st.cache);
                            queue(&mut fx.ops, session.last_seq());
                            break 'batch Some(e);
                        }
                    }
                    // Operation results and the proxy's writes change the cache too.
                    st.cached_bytes.settle(st.cache);
                    queue(&mut fx.ops, session.last_seq());
                }
            }
        };
        acks.batch(session.last_seq(), None);
        (fx, protocol_error)
    }

    /// Hands the batch's effects to the rest of the hub: waiting reads, metrics,
    /// promotions and account states, the ownership task, dynamic accounts' statuses, the
    /// discovery cache and the operations waiting for results.
    fn propagate(&self, fx: &mut Effects) {
        let grpc = &self.grpc;
        let live = &grpc.live;
        // Reads waiting for the cache to reach a resourceVersion look again.
        live.cache_advanced();
        grpc.metrics.resumes.inc_by(fx.resumes);
        grpc.metrics.relists.inc_by(fx.relists);
        if fx.stale > 0 {
            tracing::debug!(stale = fx.stale, "ignored replayed events");
        }
        live.deliver(std::mem::take(&mut fx.promotions));
        if fx.registry_changed {
            live.observe_states();
        } else {
            // Only a registry change changes an account's state: a batch of objects spares
            // every other account's batch and read the registry's exclusive lock (and the
            // walk over all accounts). Operations waiting for an agent still look again.
            live.replicas_changed();
        }
        if !fx.registered.is_empty() {
            live.agents_changed();
        }
        if !fx.dynamic_statuses.is_empty() {
            let replica = live
                .registry()
                .replicas_of_identity(&self.session.identity)
                .into_iter()
                .find_map(|(id, replica)| (id == self.session.id).then_some(replica))
                .unwrap_or_default();
            let mut dynamic = live.dynamic_accounts();
            for status in std::mem::take(&mut fx.dynamic_statuses) {
                dynamic.report(&self.session.identity, &replica, status);
            }
        }
        for account in std::mem::take(&mut fx.discovery_changed) {
            tracing::info!(%account, "the cluster's kinds changed; discovery cache dropped");
            live.kinds_changed(&account);
        }
        for result in std::mem::take(&mut fx.results) {
            let id = result.id.clone();
            if !grpc.operations.complete(self.session.id, result) {
                tracing::debug!(%id, "result of an operation nobody waits for (timed out or unknown)");
            }
        }
    }

    /// Answers the batch: replies (assignments first), then the registered accounts'
    /// states, kinds' statuses and certificate renewals.
    async fn answer(&mut self, fx: Effects) -> Result<(), Status> {
        let tx = &self.out.control;
        for reply in fx.replies {
            if let Some(kind) = reply.kind {
                send(tx, kind).await?;
            }
        }
        // After the assignments: the agent learns its role, then the account's state.
        for state in self.grpc.live.account_states(&fx.registered) {
            send(tx, Out::AccountState(state)).await?;
        }
        for status in fx.kind_statuses {
            send(tx, Out::KindStatus(status)).await?;
        }
        for csr_pem in fx.renewals {
            let renewal = enrolment::renew(&self.grpc, &self.auth, &csr_pem).await;
            send(tx, Out::CertificateRenewal(renewal)).await?;
        }
        Ok(())
    }
}

/// Replicas sharing a store: the cluster and binding of each account registered in
/// `batch`, as another replica may have stored them.
async fn learn_registered_accounts(grpc: &GrpcState, batch: &[pb::AgentMessage]) {
    if grpc.replicas.shared.is_none() {
        return;
    }
    let registered: Vec<String> = batch
        .iter()
        .filter_map(|m| match &m.kind {
            Some(Msg::RegisterAccount(r)) => Some(r.account.clone()),
            _ => None,
        })
        .collect();
    sync::learn_accounts(&grpc.replicas, &grpc.live, &registered).await;
}

/// Hands a tunnel frame to its exchange. A frame out of order resets that exchange only; one
/// past the flow-control window ends the stream (`resource_exhausted`), since the window is
/// what bounds the memory the hub spends on the agent's responses.
fn deliver_tunnel_frame(
    grpc: &GrpcState,
    session: SessionId,
    frame: pb::TunnelFrame,
    size: usize,
    tx: &Outbound,
) -> Result<(), Status> {
    grpc.metrics.received("tunnel", size);
    let exchange = frame.exchange;
    match grpc.tunnels.deliver(session, frame) {
        Ok(None) => Ok(()),
        Ok(Some(reset)) => {
            tracing::warn!(exchange, reset = ?reset, "tunnel exchange broke the protocol; reset");
            tunnel::send_frame_soon(tx, exchange, reset);
            Ok(())
        }
        Err(tunnel::WindowViolation(reason)) => {
            tracing::warn!(exchange, %reason, "agent sent past the tunnel window; ending its stream");
            Err(Status::resource_exhausted(reason))
        }
    }
}

/// Why operations in flight on a stream that broke on a message past the decode limit end
/// (an agent too old to split its results): not resent, the next replica would break too.
pub(super) fn too_large_message(status: &Status) -> Option<String> {
    (status.code() == tonic::Code::OutOfRange && status.message().contains("too large")).then(
        || {
            format!(
                // troubleshooting: operation: HTTP 413 (an older agent; its stream ends)
                // An agent that does not send large results in parts sent one past the hub's gRPC
                // message limit (`--max-object-bytes` plus 1 MiB); the stream ended, and the
                // operations in flight on it end with this message rather than being resent.
                "the agent sent a message larger than the hub decodes ({}), which ended its \
             stream; upgrade the agent (newer agents send large results in parts), narrow \
             the question, or raise the hub's --max-object-bytes (the limit is that plus 1 MiB)",
                status.message()
            )
        },
    )
}

/// The cache of `account` for a message of this stream: the account's own when it has
/// one or this stream registered it, else a scratch one (the message is refused for its
/// role before it touches it, or needs no cache).
fn account_slot(
    live: &scale_agent_hub_state::Live,
    registry: &scale_agent_hub_state::registry::Registry,
    session: SessionId,
    account: Option<&str>,
) -> AccountSlot {
    let Some(account) = account else {
        return AccountSlot::default();
    };
    if let Some(slot) = live.cache().account(account) {
        return slot;
    }
    if registry.role(session, account).is_some() {
        return live.cache().account_or_create(account);
    }
    AccountSlot::default()
}
