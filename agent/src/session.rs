//! The stream protocol, sending side: every message the agent sends carries the next
//! sequence number from 1; at most `Welcome.max_unacked` stay unacknowledged, and while at
//! that limit the runtime does not read the watches' bounded channel, so a slow hub slows
//! the watches.

use std::sync::Arc;

use prost::Message as _;
use scale_agent_proto::v1::{self, AgentMessage, agent_message};
use tokio::sync::mpsc;

use crate::{
    error::{Error, Result},
    state::Shared,
    watch::Outbound,
};

/// Capabilities announced in Hello.
pub const CAPABILITIES: &[&str] = &[
    "resume",
    "bookmarks",
    "truncated-objects",
    "secrets-metadata-only",
    "operations",
    "http-tunnel",
];
/// Used when Welcome leaves max_unacked at 0.
pub const DEFAULT_MAX_UNACKED: u64 = 1000;
/// Capacity of the channel from the watches to the session.
pub const EVENT_CHANNEL: usize = 256;

/// Capacity of the channel of messages waiting to be written to the gRPC stream.
const OUTGOING_CHANNEL: usize = 64;

/// The sending half of one stream: sequence numbers and acknowledgements, and the senders
/// that the watches and the operations of this stream write to.
pub(crate) struct Session {
    tx: mpsc::Sender<AgentMessage>,
    seq: u64,
    acked: u64,
    /// Messages that may await an acknowledgement (from Welcome).
    pub(crate) max_unacked: u64,
    /// Largest object the hub keeps whole (from Welcome).
    pub(crate) max_object_bytes: u64,
    /// Largest message the hub decodes (from Welcome; 0: an older hub, results go whole).
    pub(crate) max_message_bytes: u64,
    /// The watches' events for this stream.
    pub(crate) events_tx: mpsc::Sender<Outbound>,
    shared: Arc<Shared>,
    /// Results of operations, sent as they finish.
    pub(crate) results_tx: mpsc::Sender<v1::OperationResult>,
    /// Operations running for this stream; dropped (aborted) with it.
    pub(crate) operations: tokio::task::JoinSet<()>,
    /// Tunnelled HTTP exchanges of the hub's Kubernetes API proxy; dropped (aborted) with
    /// the stream.
    pub(crate) tunnel: crate::tunnel::Tunnel,
    /// Where the tunnel's frames go: a queue of their own, so the control loop never waits
    /// behind a large response.
    tunnel_tx: mpsc::Sender<AgentMessage>,
    /// The hub reads AccountUnavailable (its HubCapabilities said so); an older hub would
    /// end the stream on it.
    pub(crate) hub_reads_unavailable: bool,
    /// account → the reason last sent in AccountUnavailable on this stream.
    pub(crate) reported_unavailable: std::collections::BTreeMap<String, String>,
}

/// The receiving ends of a new [`Session`]'s channels.
pub(crate) struct Receivers {
    /// Messages to write to the gRPC stream, in order (the body of the `Session` call).
    pub(crate) outgoing: mpsc::Receiver<AgentMessage>,
    /// Tunnel frames, merged into the stream beside `outgoing` (see
    /// [`scale_agent_proto::tunnel::outbound`]).
    pub(crate) tunnel_outgoing: mpsc::Receiver<AgentMessage>,
    /// The watches' events, read while the session has room ([`Session::has_room`]).
    pub(crate) events: mpsc::Receiver<Outbound>,
    /// Finished operations' results.
    pub(crate) results: mpsc::Receiver<v1::OperationResult>,
}

impl Session {
    /// A session before Hello, with the default limits until Welcome sets the hub's.
    pub(crate) fn new(shared: Arc<Shared>) -> (Session, Receivers) {
        let (tx, outgoing) = mpsc::channel::<AgentMessage>(OUTGOING_CHANNEL);
        let (tunnel_tx, tunnel_outgoing) =
            mpsc::channel::<AgentMessage>(scale_agent_proto::tunnel::QUEUE);
        let (events_tx, events) = mpsc::channel::<Outbound>(EVENT_CHANNEL);
        let (results_tx, results) =
            mpsc::channel::<v1::OperationResult>(crate::operations::RESULT_QUEUE);
        let session = Session {
            tx,
            seq: 0,
            acked: 0,
            max_unacked: DEFAULT_MAX_UNACKED,
            max_object_bytes: 0,
            max_message_bytes: 0,
            events_tx,
            tunnel: crate::tunnel::Tunnel::new(
                tunnel_tx.clone(),
                crate::tunnel::DEFAULT_WINDOW_BYTES,
                shared.clone(),
            ),
            tunnel_tx,
            shared,
            results_tx,
            operations: tokio::task::JoinSet::new(),
            hub_reads_unavailable: false,
            reported_unavailable: Default::default(),
        };
        let receivers = Receivers {
            outgoing,
            tunnel_outgoing,
            events,
            results,
        };
        (session, receivers)
    }

    /// Takes the hub's limits from its Welcome (a `max_unacked` of 0 keeps the default).
    pub(crate) fn welcome(&mut self, welcome: &v1::Welcome) {
        if welcome.max_unacked > 0 {
            self.max_unacked = u64::from(welcome.max_unacked);
        }
        self.max_object_bytes = welcome.max_object_bytes;
        self.max_message_bytes = welcome.max_message_bytes;
        self.tunnel = crate::tunnel::Tunnel::new(
            self.tunnel_tx.clone(),
            welcome.tunnel_window_bytes,
            self.shared.clone(),
        );
    }

    fn unacked(&self) -> u64 {
        self.seq.saturating_sub(self.acked)
    }

    /// Whether another watch event may go out: fewer than `max_unacked` messages await
    /// an acknowledgement.
    pub(crate) fn has_room(&self) -> bool {
        self.unacked() < self.max_unacked
    }

    /// Sends the next message; fails when the stream is gone.
    pub(crate) async fn send(&mut self, kind: agent_message::Kind) -> Result<()> {
        self.seq += 1;
        let message = AgentMessage {
            seq: self.seq,
            kind: Some(kind),
        };
        let metrics = &self.shared.metrics;
        metrics.bytes_sent.inc_by(message.encoded_len() as u64);
        metrics.messages_sent.inc();
        metrics
            .unacked
            .set(i64::try_from(self.unacked()).unwrap_or(i64::MAX));
        self.tx
            .send(message)
            .await
            .map_err(|_| Error::Protocol("the stream to the hub closed".into()))
    }

    /// Sends Hello, the first message of a stream, asking for a heartbeat period of
    /// `heartbeat_seconds` (0: the hub's).
    pub(crate) async fn hello(
        &mut self,
        replica: String,
        session_token: String,
        heartbeat_seconds: u32,
    ) -> Result<()> {
        let hello = agent_message::Kind::Hello(v1::Hello {
            replica,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            capabilities: CAPABILITIES.iter().map(|c| c.to_string()).collect(),
            session_token,
            heartbeat_period_seconds: heartbeat_seconds,
        });
        self.send(hello).await
    }

    /// Sends a heartbeat stamped with the current time.
    pub(crate) async fn heartbeat(&mut self) -> Result<()> {
        let beat = agent_message::Kind::Heartbeat(v1::Heartbeat {
            sent_at_unix_millis: k8s_openapi::jiff::Timestamp::now().as_millisecond(),
        });
        self.send(beat).await
    }

    /// The sequence number of the last message sent (0 before Hello).
    pub(crate) fn last_seq(&self) -> u64 {
        self.seq
    }

    /// Whether the hub acknowledged every message up to `seq`: it has applied them.
    pub(crate) fn acknowledged(&self, seq: u64) -> bool {
        self.acked >= seq
    }

    /// The hub acknowledged every message up to `seq`.
    pub(crate) fn ack(&mut self, seq: u64) {
        self.acked = self.acked.max(seq.min(self.seq));
        self.shared
            .metrics
            .unacked
            .set(i64::try_from(self.unacked()).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sequence_numbers_count_from_one_and_acks_make_room() {
        let (mut session, mut receivers) = Session::new(crate::state::Shared::new());
        session.welcome(&v1::Welcome {
            max_unacked: 2,
            max_object_bytes: 7,
            ..Default::default()
        });
        assert_eq!(session.max_object_bytes, 7);
        session.hello("r".into(), String::new(), 0).await.unwrap();
        assert!(session.has_room());
        session.heartbeat().await.unwrap();
        assert!(!session.has_room(), "two messages await an ack");
        // An ack past what was sent counts only what was sent.
        session.ack(9);
        assert!(session.has_room());
        session.heartbeat().await.unwrap();
        let seqs: Vec<u64> = std::iter::from_fn(|| receivers.outgoing.try_recv().ok())
            .map(|m| m.seq)
            .collect();
        assert_eq!(seqs, [1, 2, 3]);
        // A Welcome without a limit keeps the default.
        let (mut session, _receivers) = Session::new(crate::state::Shared::new());
        session.welcome(&v1::Welcome::default());
        assert_eq!(session.max_unacked, DEFAULT_MAX_UNACKED);
    }
}
