//! Sending work to one of an account's agent replicas without losing it to a drain (issue
//! 27): the replica is picked and the first message queued on its stream under the one
//! registry read guard, for the proxy's tunnelled requests and for the operations alike.
//!
//! A draining agent unregisters its account under the registry's write lock, and its Ack
//! goes out only after every message queued on the stream's outbound queue before it has
//! been written ([`tunnel::flushed`]). So a message queued under the read guard either
//! precedes the unregistration, and reaches the agent ahead of the Ack (the agent counts it
//! in flight), or follows it, and then the pick no longer sees that replica. A message
//! queued after the guard was dropped (or through the stream's loop, which may handle the
//! UnregisterAccount first) could reach the agent after the Ack, when it believes nothing
//! more will come, and be lost.
//!
//! The guard is a std lock, held across no await: the message is queued through a permit
//! taken without waiting. When the replica's queue is full, its capacity is awaited with
//! the guard dropped, and the pick is done again under the guard, preferring that replica,
//! whose permit then queues the message (another replica is picked when it left).

use tokio::sync::mpsc::{OwnedPermit, error::TrySendError};

use crate::{
    Live,
    registry::{Registry, SessionId},
    tunnel::{AgentSender, OutboundMessage},
};

/// Which replicas a pick considers.
#[derive(Clone, Copy, Debug)]
pub struct Pick<'a> {
    pub account: &'a str,
    /// Replicas already tried for this request: skipped.
    pub tried: &'a [SessionId],
    /// Only replicas that announced the `http-tunnel` capability (the proxy's requests).
    pub tunnel_only: bool,
}

/// The replica picked, as the message's maker sees it under the guard.
pub struct Picked<'a> {
    pub session: SessionId,
    /// The tunnel window, when the replica can tunnel.
    pub tunnel_window: Option<u32>,
    /// The registry as the pick read it.
    pub registry: &'a Registry,
}

/// What came of picking a replica and queueing a message on its stream.
pub enum Queued<T, R> {
    /// The message is queued on the replica's stream, ahead of anything the hub answers to
    /// a later UnregisterAccount of that replica; `made` is what the maker returned with it.
    Sent {
        session: SessionId,
        tx: AgentSender,
        made: T,
    },
    /// The maker declined to send anything to the replica picked (its reason).
    Declined(SessionId, R),
    /// No connected replica of the account (besides those tried) fits the pick.
    NoAgent,
    /// The replica picked has no stream any more.
    Gone(SessionId),
}

/// A connected replica fitting `pick`, round-robin over the account's STREAMING and
/// STANDBY sessions (one rotation for everything sent to agents), except that `prefer` is
/// taken when it is one of them. Reads the registry through the caller's guard.
fn choose(
    live: &Live,
    registry: &Registry,
    pick: Pick<'_>,
    prefer: Option<SessionId>,
) -> Option<(SessionId, AgentSender, Option<u32>)> {
    let candidates = registry.replicas(pick.account);
    let sessions = live.sessions();
    let usable: Vec<(SessionId, AgentSender, Option<u32>)> = candidates
        .into_iter()
        .filter(|s| !pick.tried.contains(s))
        .filter_map(|id| {
            let handle = sessions.get(&id)?;
            (!pick.tunnel_only || handle.tunnel_window.is_some())
                .then(|| (id, handle.outbound.clone(), handle.tunnel_window))
        })
        .collect();
    drop(sessions);
    if let Some(i) = usable.iter().position(|(id, _, _)| Some(*id) == prefer) {
        return usable.into_iter().nth(i);
    }
    if usable.is_empty() {
        return None;
    }
    let i = live.pick(usable.len());
    usable.into_iter().nth(i)
}

/// Picks a replica for `pick` and queues on its outbound queue the message `make` returns,
/// all under the registry's read guard that the pick used (see the module). `make` runs
/// under that guard, once, when a permit for the message is held: it must not block, and
/// may decline (then nothing is queued).
pub async fn pick_and_queue<T, R>(
    live: &Live,
    pick: Pick<'_>,
    make: impl FnOnce(Picked<'_>) -> Result<(OutboundMessage, T), R>,
) -> Queued<T, R> {
    let mut make = Some(make);
    let mut waited: Option<(SessionId, OwnedPermit<OutboundMessage>)> = None;
    loop {
        let full = {
            let registry = live.registry_read();
            let prefer = waited.as_ref().map(|(session, _)| *session);
            let Some((session, tx, tunnel_window)) = choose(live, &registry, pick, prefer) else {
                return Queued::NoAgent;
            };
            let permit = match waited.take() {
                Some((waited_on, permit)) if waited_on == session => Ok(permit),
                _ => tx.clone().try_reserve_owned(),
            };
            match permit {
                Ok(permit) => {
                    let Some(make) = make.take() else {
                        // Unreachable: the loop returns once `make` ran.
                        return Queued::Gone(session);
                    };
                    let picked = Picked {
                        session,
                        tunnel_window,
                        registry: &registry,
                    };
                    return match make(picked) {
                        Ok((message, made)) => {
                            permit.send(message);
                            Queued::Sent { session, tx, made }
                        }
                        Err(why) => Queued::Declined(session, why),
                    };
                }
                Err(TrySendError::Closed(_)) => return Queued::Gone(session),
                Err(TrySendError::Full(tx)) => (session, tx),
            }
        };
        let (session, tx) = full;
        match tx.reserve_owned().await {
            Ok(permit) => waited = Some((session, permit)),
            Err(_) => return Queued::Gone(session),
        }
    }
}
