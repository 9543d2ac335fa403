//! Scale Agent's wire protocol, `scaleagent.v1`: one bidirectional gRPC stream per agent
//! process. The stream contract is documented in `proto/scaleagent/v1/agent.proto`.
//!
//! The Rust code is generated into `src/gen/` and checked in, so building needs no protobuf
//! compiler; `make proto` regenerates it and a test fails when it is stale.

/// Generated from `proto/scaleagent/v1/agent.proto`.
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used
)]
pub mod v1 {
    include!("gen/scaleagent.v1.rs");
}

/// The HubCapabilities entry of a hub that reads AccountUnavailable (item 11 of the stream
/// contract): agents send it to such hubs only.
pub const ACCOUNT_UNAVAILABLE_CAPABILITY: &str = "account-unavailable";

/// The least time left with which an operation is still sent (hub) or started (agent), item
/// 6 of the stream contract. Less cannot cover a round trip from the agent to its API server:
/// a request started with it would almost surely be cut off in flight, turning a clean "not
/// run" (`executed: false`, safe to retry) into "may have run". Such an operation answers 504
/// with `executed: false`.
pub const MIN_OPERATION_MILLIS: u64 = 20;

impl v1::operation::Op {
    /// The operation's type as the hub's HTTP API and both sides' metrics name it; a bounded
    /// set, fit for a metrics label.
    pub fn name(&self) -> &'static str {
        use v1::operation::Op;
        match self {
            Op::Apply(_) => "apply",
            Op::Create(_) => "create",
            Op::Replace(_) => "replace",
            Op::Delete(_) => "delete",
            Op::Patch(_) => "patch",
            Op::Scale(_) => "scale",
            Op::Rollout(_) => "rollout",
            Op::Get(_) => "get",
            Op::List(_) => "list",
            Op::Events(_) => "events",
            Op::Logs(_) => "logs",
        }
    }
}

/// What both ends of a tunnelled HTTP exchange agree on (item 7 of the stream contract).
pub mod path;

pub mod tunnel {
    /// Largest body chunk in one `TunnelData` frame.
    pub const MAX_FRAME_BYTES: usize = 64 * 1024;
    /// The window of each direction when `Welcome.tunnel_window_bytes` is 0.
    pub const DEFAULT_WINDOW_BYTES: u32 = 1024 * 1024;
    /// Headers that belong to one HTTP connection (RFC 9110 §7.6.1) or that each hop sets
    /// itself: never carried across the tunnel.
    pub const HOP_BY_HOP: &[&str] = &[
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "expect",
    ];

    /// Whether a request header claims who the caller is or where it came from, and so is
    /// never carried to the API server: the caller's credentials (`Authorization`, `Cookie`),
    /// impersonation (`Impersonate-*`), the front-proxy authenticator's identity headers
    /// (`X-Remote-User`, `X-Remote-Group`, `X-Remote-Extra-*`, the API server's defaults for
    /// `--requestheader-*-headers`) and the forwarding chain an authenticating proxy trusts
    /// (`X-Forwarded-*`, `Forwarded`, `X-Real-Ip`). The agent replays every request as its
    /// own identity; if that identity is a front-proxy certificate, or an authenticating
    /// proxy sits before the API server, such headers from a client would be believed.
    /// `name` is compared without regard to case.
    pub fn claims_identity(name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        ["authorization", "cookie", "forwarded", "x-real-ip"].contains(&name.as_str())
            || ["impersonate-", "x-remote-", "x-forwarded-"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
    }

    /// Tunnel frames waiting to be written to one stream, on either side.
    pub const QUEUE: usize = 16;

    /// The outbound side of a stream: the control queue's messages (acknowledgements,
    /// heartbeats, objects, operations) interleaved with the tunnel queue's frames, ending
    /// when the control queue ends. Two queues, so that neither side's control loop ever
    /// waits behind tunnel data, and tunnel data waits only on its own queue.
    pub fn outbound<T: Send + 'static>(
        control: tokio::sync::mpsc::Receiver<T>,
        tunnel: tokio::sync::mpsc::Receiver<T>,
    ) -> impl tokio_stream::Stream<Item = T> + Send + 'static {
        use tokio_stream::{StreamExt as _, wrappers::ReceiverStream};
        // `None` marks the end of the control queue, which ends the whole stream.
        let control = ReceiverStream::new(control)
            .map(Some)
            .chain(tokio_stream::once(None));
        let tunnel = ReceiverStream::new(tunnel).map(Some);
        control
            .merge(tunnel)
            .take_while(Option::is_some)
            .filter_map(|message| message)
    }

    /// The class of an HTTP status code (`2xx`, ...), a bounded metrics label.
    pub fn status_class(code: u16) -> &'static str {
        match code {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        }
    }

    #[cfg(test)]
    mod tests {
        use tokio_stream::StreamExt as _;

        #[tokio::test]
        async fn outbound_interleaves_both_queues_and_ends_with_the_control_queue() {
            let (control_tx, control) = tokio::sync::mpsc::channel(4);
            let (tunnel_tx, tunnel) = tokio::sync::mpsc::channel(4);
            control_tx.send("ack").await.unwrap();
            tunnel_tx.send("data").await.unwrap();
            let mut out = Box::pin(super::outbound(control, tunnel));
            let mut seen = vec![out.next().await.unwrap(), out.next().await.unwrap()];
            seen.sort();
            assert_eq!(seen, ["ack", "data"]);
            // A full tunnel queue does not hold up the control queue.
            for _ in 0..4 {
                tunnel_tx.send("data").await.unwrap();
            }
            control_tx.send("heartbeat").await.unwrap();
            let mut got_heartbeat = false;
            for _ in 0..5 {
                got_heartbeat |= out.next().await == Some("heartbeat");
            }
            assert!(got_heartbeat);
            // The stream ends with the control queue, whatever the tunnel queue holds.
            tunnel_tx.send("late").await.unwrap();
            drop(control_tx);
            let rest: Vec<&str> = out.collect().await;
            assert!(rest.len() <= 1, "{rest:?}");
        }
    }
}
