//! The hub's half of tunnelled HTTP exchanges (item 7 of the stream contract in
//! `proto/scaleagent/v1/agent.proto`): the table of open exchanges, credit-based flow control
//! per exchange and direction, and the response body handed to the HTTP server.
//!
//! Frames from agents arrive through [`Tunnels::deliver`], which never blocks: a response
//! body's bytes go to an unbounded queue that the agent cannot overfill, because it may only
//! send as much as the hub granted (the window), and the hub grants more only as the HTTP
//! client consumes the body. Frames to agents go straight to the stream's outbound queue
//! ([`AgentSender`]), not through the stream's control loop, so an exchange never waits
//! for a batch of objects to be stored.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
};

use bytes::Bytes;
use scale_agent_proto::v1::{self as pb, hub_message::Kind as Out, tunnel_frame::Frame};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::registry::SessionId;

/// Initial window of each direction of an exchange, sent in Welcome: a window in flight
/// per exchange keeps a loopback or LAN tunnel near its bandwidth while bounding what the
/// hub holds for a slow client.
pub const WINDOW_BYTES: u32 = scale_agent_proto::tunnel::DEFAULT_WINDOW_BYTES;
pub use scale_agent_proto::tunnel::MAX_FRAME_BYTES;

/// What an agent stream's outbound queue carries: a message, or the status that ends it.
pub type OutboundMessage = Result<pb::HubMessage, tonic::Status>;

/// The outbound queue of one agent stream.
pub type AgentSender = mpsc::Sender<OutboundMessage>;

/// Sends a frame of `exchange` to an agent; false when its stream is gone.
pub async fn send_frame(tx: &AgentSender, exchange: u64, frame: Frame) -> bool {
    tx.send(Ok(frame_message(exchange, frame))).await.is_ok()
}

/// The message that carries a frame of `exchange` (for a caller that queues it through a
/// permit it reserved, see the proxy's pick).
pub fn frame_message(exchange: u64, frame: Frame) -> pb::HubMessage {
    pb::HubMessage {
        kind: Some(Out::Tunnel(pb::TunnelFrame {
            exchange,
            frame: Some(frame),
        })),
    }
}

/// Waits until every frame queued on `tx` before the call has been taken off the queue by the
/// stream that writes it, so that whatever the stream's loop queues next on its control queue
/// (an Ack) reaches the agent after those frames, although the two queues are interleaved.
/// The queue hands out its capacity in the order it was asked for and gets a slot back only
/// when a frame is taken off, so holding all of its capacity means it is empty and no frame
/// queued after the call went ahead. Returns at once when the stream is gone.
///
/// Used before acknowledging an UnregisterAccount: a request head the proxy queued before
/// the registry's write lock was taken for the unregistration then reaches the draining
/// agent ahead of the Ack, and the agent counts it in flight (issue 27).
pub async fn flushed(tx: &AgentSender) {
    // The permits go back to the queue as they are dropped, at once.
    let _ = tx.reserve_many(tx.max_capacity()).await;
}

/// Sends a frame without waiting: from `Drop` and from places that must not block. When the
/// queue is full the frame is sent by a task.
pub fn send_frame_soon(tx: &AgentSender, exchange: u64, frame: Frame) {
    match tx.try_send(Ok(frame_message(exchange, frame))) {
        Err(mpsc::error::TrySendError::Full(message)) => {
            let tx = tx.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = tx.send(message).await;
                });
            }
        }
        Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
    }
}

/// What a response body receives.
#[derive(Debug)]
pub enum BodyEvent {
    Data(Bytes),
    /// The body ended normally.
    End,
    /// The body cannot be completed (the agent reset the exchange, or its stream ended in
    /// the middle of a response that is not a watch).
    Failed(String),
}

/// An agent that sent past the flow-control window the hub announced: its stream is ended
/// (the window is what bounds the response bytes the hub holds for slow clients).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowViolation(pub String);

/// Why an exchange ended before its response head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// The agent's stream ended; nothing was answered.
    AgentGone,
    /// The agent reset the exchange, saying why.
    Reset(String),
}

struct Exchange {
    session: SessionId,
    head: Option<oneshot::Sender<Result<pb::HttpResponseHead, HeadError>>>,
    body: mpsc::UnboundedSender<BodyEvent>,
    /// Credit for request body bytes this hub may still send.
    request_credit: Arc<Semaphore>,
    /// Response bytes received and not yet credited back to the agent.
    unconsumed: Arc<AtomicU64>,
    window: u64,
    /// A watch (or a followed log) ends cleanly when the agent's stream ends: the client
    /// sees the end of the stream and starts a new one, as when the API server ends a watch.
    ends_cleanly: bool,
}

/// One exchange as its HTTP handler holds it.
pub struct OpenExchange {
    pub id: u64,
    pub head: oneshot::Receiver<Result<pb::HttpResponseHead, HeadError>>,
    pub body: mpsc::UnboundedReceiver<BodyEvent>,
    pub request_credit: Arc<Semaphore>,
    pub unconsumed: Arc<AtomicU64>,
}

/// The open exchanges of every agent stream.
#[derive(Default)]
pub struct Tunnels {
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Exchange>>,
}

impl Tunnels {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Exchange>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens an exchange on `session` whose agent granted `window` bytes per direction.
    pub fn open(&self, session: SessionId, window: u32, ends_cleanly: bool) -> OpenExchange {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (head_tx, head) = oneshot::channel();
        let (body_tx, body) = mpsc::unbounded_channel();
        let request_credit = Arc::new(Semaphore::new(window as usize));
        let unconsumed = Arc::new(AtomicU64::new(0));
        self.lock().insert(
            id,
            Exchange {
                session,
                head: Some(head_tx),
                body: body_tx,
                request_credit: request_credit.clone(),
                unconsumed: unconsumed.clone(),
                window: u64::from(window),
                ends_cleanly,
            },
        );
        OpenExchange {
            id,
            head,
            body,
            request_credit,
            unconsumed,
        }
    }

    /// Forgets an exchange; true when it was still open (so the agent should hear a reset).
    pub fn close(&self, id: u64) -> bool {
        finish(&mut self.lock(), id).is_some()
    }

    /// Number of open exchanges.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no exchange is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Handles a frame from the agent of `session`. Returns a reset to send back when the
    /// frame broke the exchange's direction, and a [`WindowViolation`] (the stream must end)
    /// when it broke flow control; frames of unknown exchanges (already finished or reset)
    /// are ignored.
    pub fn deliver(
        &self,
        session: SessionId,
        frame: pb::TunnelFrame,
    ) -> Result<Option<Frame>, WindowViolation> {
        let id = frame.exchange;
        let mut open = self.lock();
        let Some(exchange) = open.get_mut(&id).filter(|e| e.session == session) else {
            return Ok(None);
        };
        let violation =
            |message: String| Ok(Some(Frame::Reset(pb::TunnelReset { reason: message })));
        match frame.frame {
            Some(Frame::Response(head)) => {
                let Some(tx) = exchange.head.take() else {
                    let reason = "a second response head".to_string();
                    fail(&mut open, id, &reason);
                    return violation(reason);
                };
                let end = head.end_of_body;
                let _ = tx.send(Ok(head));
                if end {
                    let _ = exchange.body.send(BodyEvent::End);
                    finish(&mut open, id);
                }
                Ok(None)
            }
            Some(Frame::Data(data)) => {
                if exchange.head.is_some() {
                    let reason = "response body data before the response head".to_string();
                    fail(&mut open, id, &reason);
                    return violation(reason);
                }
                let len = data.data.len() as u64;
                let pending = exchange.unconsumed.fetch_add(len, Ordering::AcqRel) + len;
                if pending > exchange.window || data.data.len() > MAX_FRAME_BYTES {
                    let reason = format!(
                        // troubleshooting: an agent's stream ended by the hub: gRPC `RESOURCE_EXHAUSTED`
                        // The agent sent proxied response data past the credit the hub gave it (a
                        // bug in the agent, or an agent of another implementation); the stream
                        // ends, and the proxied request with it.
                        "flow control: the agent sent {pending} response bytes on exchange \
                         {id} not yet consumed, past the window of {} bytes the hub announced \
                         in Welcome (tunnel_window_bytes; frames of at most {MAX_FRAME_BYTES} \
                         bytes); an agent must send only within the credit it was given",
                        exchange.window
                    );
                    fail(&mut open, id, &reason);
                    return Err(WindowViolation(reason));
                }
                if !data.data.is_empty() {
                    let _ = exchange.body.send(BodyEvent::Data(Bytes::from(data.data)));
                }
                if data.end_of_body {
                    let _ = exchange.body.send(BodyEvent::End);
                    finish(&mut open, id);
                }
                Ok(None)
            }
            Some(Frame::WindowUpdate(credit)) => {
                // The hub's credit never exceeds the window: what it holds plus what it sent
                // and was not credited back. More credit than that is not a credit return.
                let available = exchange.request_credit.available_permits() as u64;
                if available + u64::from(credit) > exchange.window {
                    let reason = format!(
                        "flow control: the agent returned {credit} bytes of credit on exchange \
                         {id} while the hub held {available} of a {} byte window; credit \
                         returned may not exceed what the hub sent",
                        exchange.window
                    );
                    fail(&mut open, id, &reason);
                    return Err(WindowViolation(reason));
                }
                exchange.request_credit.add_permits(credit as usize);
                Ok(None)
            }
            Some(Frame::Reset(reset)) => {
                let reason = if reset.reason.is_empty() {
                    "the agent reset the exchange".to_string()
                } else {
                    reset.reason
                };
                fail(&mut open, id, &reason);
                Ok(None)
            }
            Some(Frame::Request(_)) => {
                let reason = "a request head from the agent".to_string();
                fail(&mut open, id, &reason);
                violation(reason)
            }
            None => Ok(None),
        }
    }

    /// The agent's stream ended: every exchange on it ends. Waiting handlers hear
    /// [`HeadError::AgentGone`]; watches end cleanly; other bodies fail.
    pub fn session_ended(&self, session: SessionId) {
        let mut open = self.lock();
        let ids: Vec<u64> = open
            .iter()
            .filter(|(_, e)| e.session == session)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(mut exchange) = open.remove(&id) {
                if let Some(head) = exchange.head.take() {
                    let _ = head.send(Err(HeadError::AgentGone));
                } else if exchange.ends_cleanly {
                    let _ = exchange.body.send(BodyEvent::End);
                } else {
                    let _ = exchange.body.send(BodyEvent::Failed(
                        "the agent's stream to the hub ended in the middle of the response".into(),
                    ));
                }
                // Nobody waits for request credit any more.
                exchange.request_credit.close();
            }
        }
    }
}

/// Removes a finished exchange. Its request credit is closed, so a request body still
/// waiting for credit (the API server answered before reading all of it) stops.
fn finish(open: &mut HashMap<u64, Exchange>, id: u64) -> Option<Exchange> {
    let exchange = open.remove(&id)?;
    exchange.request_credit.close();
    Some(exchange)
}

fn fail(open: &mut HashMap<u64, Exchange>, id: u64, reason: &str) {
    if let Some(mut exchange) = open.remove(&id) {
        if let Some(head) = exchange.head.take() {
            let _ = head.send(Err(HeadError::Reset(reason.to_string())));
        } else {
            let _ = exchange.body.send(BodyEvent::Failed(reason.to_string()));
        }
        exchange.request_credit.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Tunnels {
        fn deliver_ok(&self, session: SessionId, frame: pb::TunnelFrame) -> Option<Frame> {
            self.deliver(session, frame).expect("within the window")
        }
    }

    fn frame(exchange: u64, frame: Frame) -> pb::TunnelFrame {
        pb::TunnelFrame {
            exchange,
            frame: Some(frame),
        }
    }

    fn head(status: u32, end: bool) -> Frame {
        Frame::Response(pb::HttpResponseHead {
            status,
            headers: Vec::new(),
            end_of_body: end,
        })
    }

    fn data(bytes: &[u8], end: bool) -> Frame {
        Frame::Data(pb::TunnelData {
            data: bytes.to_vec(),
            end_of_body: end,
        })
    }

    #[test]
    fn head_then_body_then_end() {
        let tunnels = Tunnels::default();
        let mut ex = tunnels.open(7, 100, false);
        assert!(
            tunnels
                .deliver_ok(7, frame(ex.id, head(200, false)))
                .is_none()
        );
        assert_eq!(ex.head.try_recv().unwrap().unwrap().status, 200);
        assert!(
            tunnels
                .deliver_ok(7, frame(ex.id, data(b"abc", false)))
                .is_none()
        );
        assert!(
            tunnels
                .deliver_ok(7, frame(ex.id, data(b"de", true)))
                .is_none()
        );
        assert!(matches!(ex.body.try_recv(), Ok(BodyEvent::Data(b)) if &b[..] == b"abc"));
        assert!(matches!(ex.body.try_recv(), Ok(BodyEvent::Data(b)) if &b[..] == b"de"));
        assert!(matches!(ex.body.try_recv(), Ok(BodyEvent::End)));
        assert!(tunnels.is_empty(), "a finished exchange leaves the table");
        assert_eq!(ex.unconsumed.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn frames_of_another_stream_or_unknown_exchanges_are_ignored() {
        let tunnels = Tunnels::default();
        let mut ex = tunnels.open(7, 100, false);
        assert!(
            tunnels
                .deliver_ok(8, frame(ex.id, head(200, true)))
                .is_none()
        );
        assert!(ex.head.try_recv().is_err(), "another stream cannot answer");
        assert!(tunnels.deliver_ok(7, frame(999, head(200, true))).is_none());
        assert_eq!(tunnels.len(), 1);
    }

    #[test]
    fn a_body_beyond_the_window_cuts_the_agent_off() {
        let tunnels = Tunnels::default();
        let mut greedy = tunnels.open(7, 4, false);
        tunnels.deliver_ok(7, frame(greedy.id, head(200, false)));
        assert!(
            tunnels
                .deliver_ok(7, frame(greedy.id, data(b"abc", false)))
                .is_none()
        );
        let cut = tunnels
            .deliver(7, frame(greedy.id, data(b"de", false)))
            .unwrap_err();
        assert!(cut.0.contains("past the window of 4 bytes"), "{cut:?}");
        assert!(cut.0.contains("tunnel_window_bytes"), "{cut:?}");
        let _ = greedy.body.try_recv();
        assert!(
            matches!(greedy.body.try_recv(), Ok(BodyEvent::Failed(m)) if m.contains("flow control"))
        );
        assert!(tunnels.is_empty());
    }

    #[test]
    fn credit_beyond_what_was_sent_cuts_the_agent_off() {
        let tunnels = Tunnels::default();
        let ex = tunnels.open(7, 10, false);
        let cut = tunnels
            .deliver(7, frame(ex.id, Frame::WindowUpdate(1)))
            .unwrap_err();
        assert!(
            cut.0.contains("may not exceed what the hub sent"),
            "{cut:?}"
        );
        assert!(ex.request_credit.is_closed());
    }

    #[test]
    fn a_finished_or_closed_exchange_stops_its_request_body() {
        let tunnels = Tunnels::default();
        let answered = tunnels.open(7, 10, false);
        tunnels.deliver_ok(7, frame(answered.id, head(413, true)));
        assert!(
            answered.request_credit.is_closed(),
            "answered before the body was read"
        );
        let streamed = tunnels.open(7, 10, false);
        tunnels.deliver_ok(7, frame(streamed.id, head(200, false)));
        tunnels.deliver_ok(7, frame(streamed.id, data(b"ok", true)));
        assert!(streamed.request_credit.is_closed());
        let abandoned = tunnels.open(7, 10, false);
        assert!(tunnels.close(abandoned.id));
        assert!(abandoned.request_credit.is_closed());
        assert!(!tunnels.close(abandoned.id), "closed once");
    }

    #[test]
    fn credit_comes_back_as_window_updates() {
        let tunnels = Tunnels::default();
        let ex = tunnels.open(7, 10, false);
        assert_eq!(ex.request_credit.available_permits(), 10);
        // The hub sends 6 bytes of request body; the agent consumes and credits 5 back.
        ex.request_credit.try_acquire_many(6).unwrap().forget();
        tunnels.deliver_ok(7, frame(ex.id, Frame::WindowUpdate(5)));
        assert_eq!(ex.request_credit.available_permits(), 9);
    }

    #[test]
    fn a_lost_stream_ends_watches_cleanly_and_fails_other_bodies() {
        let tunnels = Tunnels::default();
        let mut waiting = tunnels.open(7, 10, false);
        let mut watch = tunnels.open(7, 10, true);
        let mut list = tunnels.open(7, 10, false);
        let mut elsewhere = tunnels.open(8, 10, false);
        tunnels.deliver_ok(7, frame(watch.id, head(200, false)));
        tunnels.deliver_ok(7, frame(list.id, head(200, false)));
        tunnels.session_ended(7);
        assert_eq!(waiting.head.try_recv().unwrap(), Err(HeadError::AgentGone));
        assert!(matches!(watch.body.try_recv(), Ok(BodyEvent::End)));
        assert!(matches!(list.body.try_recv(), Ok(BodyEvent::Failed(_))));
        assert!(elsewhere.head.try_recv().is_err(), "still waiting");
        assert_eq!(tunnels.len(), 1);
        assert!(waiting.request_credit.is_closed());
    }

    #[test]
    fn an_agent_reset_before_the_head_reaches_the_handler() {
        let tunnels = Tunnels::default();
        let mut ex = tunnels.open(7, 10, false);
        let reset = Frame::Reset(pb::TunnelReset {
            reason: "connection refused".into(),
        });
        assert!(tunnels.deliver_ok(7, frame(ex.id, reset)).is_none());
        assert_eq!(
            ex.head.try_recv().unwrap(),
            Err(HeadError::Reset("connection refused".into()))
        );
        assert!(tunnels.is_empty());
    }

    #[test]
    fn protocol_violations_reset() {
        let tunnels = Tunnels::default();
        let ex = tunnels.open(7, 10, false);
        let reset = tunnels.deliver_ok(7, frame(ex.id, data(b"x", false)));
        assert!(
            matches!(reset, Some(Frame::Reset(r)) if r.reason.contains("before the response head"))
        );
        let ex = tunnels.open(7, 10, false);
        tunnels.deliver_ok(7, frame(ex.id, head(200, false)));
        assert!(
            tunnels
                .deliver_ok(7, frame(ex.id, head(200, false)))
                .is_some()
        );
    }
}
