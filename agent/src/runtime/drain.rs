//! The stream's graceful end on shutdown (SIGTERM): a rolling update of the agents must lose
//! no operation and no event.
//!
//! The drain uses only messages every hub reads, so it works with older hubs too:
//! 1. every watch stops and the agent sends UnregisterAccount for each account, so the hub
//!    stops routing operations and tunnelled requests to this stream (they go to another
//!    replica of the identity, which a STANDBY one also takes the watches over as STREAMING);
//! 2. once the hub acknowledges the last UnregisterAccount (it has applied it), what it had
//!    already routed here is on the stream ahead of the Ack: the agent finishes those
//!    operations and tunnelled exchanges, sends their results, and keeps its heartbeats;
//! 3. after a short settling wait (for hubs older than the fix described at `SETTLE`), it
//!    closes its side of the stream and waits for the hub to close its side, so nothing
//!    queued is cut.
//!
//! All of it is bounded by `--drain-timeout-seconds`, below the pod's
//! terminationGracePeriodSeconds: what still runs then is cut, as without a drain (the hub
//! resends what is safe to resend to another replica).

use std::time::Duration;

use futures::StreamExt;
use scale_agent_proto::v1::{self, HubMessage, agent_message, hub_message};
use tokio::{sync::mpsc, time::Instant};

use super::{End, Runtime};
use crate::session::Session;

/// The default of `--drain-timeout-seconds`; the operator gives the pod a
/// terminationGracePeriodSeconds of 35 s.
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: u64 = 25;
/// How often the drain looks whether the tunnelled exchanges have finished.
const POLL: Duration = Duration::from_millis(50);
/// How long the drain waits, after the hub's Ack of the last UnregisterAccount and after the
/// last operation or tunnelled request that arrived since, before it closes the stream.
/// The hub picks a replica for a tunnelled request and then queues the request on that
/// replica's stream, so a request it picked this replica for just before it applied the
/// UnregisterAccount can reach the stream behind the Ack (seen on the real node: a
/// `kubectl apply` through the hub answered 503 "disconnected before answering" during a
/// rolling update). Hubs since this release order it: the proxy queues the request under the
/// registry guard it picked with, and the stream sends its Ack only after every tunnel frame
/// queued before the UnregisterAccount has left (`hub/tests/proxy_drain_order.rs`). The wait
/// stays for older hubs; operations are routed through the control queue and are not yet
/// covered by that ordering.
const SETTLE: Duration = Duration::from_secs(1);

impl Runtime {
    /// Drains the stream (see the module's doc) and ends it; always [`End::Shutdown`].
    pub(super) async fn drain(
        &mut self,
        mut session: Session,
        mut inbound: tonic::Streaming<HubMessage>,
        mut results: mpsc::Receiver<v1::OperationResult>,
        period: Duration,
    ) -> End {
        let limit = Duration::from_secs(self.options.drain_timeout_seconds);
        if limit.is_zero() {
            return End::Shutdown;
        }
        let started = Instant::now();
        let deadline = started + limit;
        let names: Vec<String> = self.accounts.keys().cloned().collect();
        for entry in self.accounts.values_mut() {
            // Queued events of the account are dropped with its generation: the hub refuses
            // objects from a stream that no longer streams the account.
            entry.stop_streaming();
        }
        // What is in flight now is what a drain exists for: said, so a rolling update's logs
        // show the work the drain saved (the real-node test reads it). Finished exchanges
        // are forgotten first, so only running ones are counted.
        let _ = session.tunnel.idle();
        tracing::info!(
            accounts = names.len(),
            operations = session.operations.len(),
            exchanges = session.tunnel.len(),
            timeout_seconds = limit.as_secs(),
            "shutting down: unregistering the accounts and finishing the work in flight"
        );
        let mut results_sent = 0_usize;
        for account in names {
            let unregister =
                agent_message::Kind::UnregisterAccount(v1::UnregisterAccount { account });
            if session.send(unregister).await.is_err() {
                return End::Shutdown;
            }
        }
        let unregistered = session.last_seq();
        let mut heartbeat = tokio::time::interval_at(Instant::now() + period, period);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut poll = tokio::time::interval(POLL);
        let mut last_heard = Instant::now();
        // Since when nothing new was routed here, counted from the Ack (see SETTLE).
        let mut settled_since: Option<Instant> = None;
        loop {
            let acknowledged = session.acknowledged(unregistered);
            if acknowledged && settled_since.is_none() {
                settled_since = Some(Instant::now());
            }
            if acknowledged
                && session.operations.is_empty()
                && session.tunnel.idle()
                && settled_since.is_some_and(|since| since.elapsed() >= SETTLE)
            {
                // Every operation task sent its result before it ended.
                while let Ok(result) = results.try_recv() {
                    if send_result(&mut session, result).await.is_err() {
                        return End::Shutdown;
                    }
                    results_sent += 1;
                }
                break;
            }
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(
                        acknowledged = session.acknowledged(unregistered),
                        operations = session.operations.len(),
                        exchanges = session.tunnel.len(),
                        "the drain timed out (--drain-timeout-seconds); ending the stream with this work cut"
                    );
                    return End::Shutdown;
                }
                Some(result) = results.recv() => {
                    if send_result(&mut session, result).await.is_err() {
                        return End::Shutdown;
                    }
                    results_sent += 1;
                }
                Some(_) = session.operations.join_next(), if !session.operations.is_empty() => {}
                message = inbound.next() => {
                    let Some(Ok(message)) = message else {
                        tracing::info!("the hub ended the stream during the drain");
                        return End::Shutdown;
                    };
                    last_heard = Instant::now();
                    // Only what finishes the work routed here: new assignments, accounts
                    // and settings no longer matter.
                    let wanted = matches!(
                        message.kind,
                        Some(
                            hub_message::Kind::Ack(_)
                                | hub_message::Kind::Operation(_)
                                | hub_message::Kind::Tunnel(_)
                        )
                    );
                    let work = matches!(
                        message.kind,
                        Some(hub_message::Kind::Operation(_) | hub_message::Kind::Tunnel(_))
                    );
                    if work && settled_since.is_some() {
                        settled_since = Some(Instant::now());
                    }
                    if wanted && self.handle(message, &mut session).await.is_err() {
                        return End::Shutdown;
                    }
                }
                _ = heartbeat.tick() => {
                    if last_heard.elapsed() > period * 2 {
                        tracing::warn!("the hub sent nothing for two heartbeat periods during the drain; stopping");
                        return End::Shutdown;
                    }
                    if session.heartbeat().await.is_err() {
                        return End::Shutdown;
                    }
                }
                _ = poll.tick() => {}
            }
        }
        // Closing the sending side ends the stream after what is queued; the hub closes its
        // side once it has read it all.
        drop(session);
        let closed = tokio::time::timeout_at(deadline, async {
            while let Some(Ok(_)) = inbound.next().await {}
        })
        .await;
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            results_sent,
            hub_closed = closed.is_ok(),
            "drained"
        );
        End::Shutdown
    }
}

/// Sends an operation's result, in parts below the hub's message limit.
async fn send_result(
    session: &mut Session,
    result: v1::OperationResult,
) -> crate::error::Result<()> {
    for part in crate::operations::split(result, session.max_message_bytes) {
        session
            .send(agent_message::Kind::OperationResult(part))
            .await?;
    }
    Ok(())
}
