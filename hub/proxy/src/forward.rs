//! Carrying a request to an agent of the account and its answer back: one exchange on the
//! agent's stream ([`scale_agent_hub_state::tunnel`]). [`forward`] picks a connected agent replica, sends the
//! request head, streams the request body within the agent's credit, waits for the response
//! head (trying another replica when the agent leaves first and the request can be sent
//! again), and answers with the response body streamed as the client reads it, or, after the
//! API server's 101, hands the connection to [`super::upgrade`].

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use axum::{
    body::Body,
    http::{HeaderMap, Method, StatusCode},
    response::Response,
};
use bytes::Bytes;
use futures::Stream;
use http_body_util::BodyExt as _;
use prometheus_client::metrics::counter::Counter;
use scale_agent_hub_auth::credential_sessions::Lease;
use scale_agent_hub_state::{
    Live, dispatch,
    registry::SessionId,
    tunnel::{self, AgentSender, BodyEvent, HeadError, OpenExchange, Tunnels},
};
use scale_agent_proto::v1::{self as pb, tunnel_frame::Frame};
use tokio::sync::oneshot;
use tracing::Instrument as _;

use super::{
    MAX_ATTEMPTS, Proxy, RESPONSE_HEAD_TIMEOUT, headers, status::Status, upgrade::Upgraded,
};

/// What came of picking a replica for a request and queueing its head.
enum Queued {
    /// The head is queued on the replica's stream, ahead of anything the hub answers to a
    /// later UnregisterAccount of that replica.
    Head {
        session: SessionId,
        tx: AgentSender,
        window: u32,
        exchange: OpenExchange,
    },
    /// No connected replica of the account can tunnel (besides those tried).
    NoAgent,
    /// The replica picked has no stream any more.
    Gone(SessionId),
}

/// Picks a replica of `account` that can tunnel, round-robin with the operations, opens the
/// exchange and queues the request head on the replica's stream, all under the registry's
/// read guard that the pick used ([`dispatch::pick_and_queue`], which the operations use
/// too): a draining agent gets the head before the Ack of its UnregisterAccount, or is not
/// picked (issue 27).
async fn pick_and_queue(
    proxy: &Proxy,
    account: &str,
    tried: &[SessionId],
    ends_cleanly: bool,
    head: &pb::HttpRequestHead,
) -> Queued {
    let pick = dispatch::Pick {
        account,
        tried,
        tunnel_only: true,
    };
    let queued = dispatch::pick_and_queue(&proxy.live, pick, |picked| {
        let Some(window) = picked.tunnel_window else {
            // Not picked: the pick takes only replicas that tunnel.
            return Err(());
        };
        let exchange = proxy
            .state
            .tunnels
            .open(picked.session, window, ends_cleanly);
        let message = tunnel::frame_message(exchange.id, Frame::Request(head.clone()));
        Ok((Ok(message), (window, exchange)))
    })
    .await;
    match queued {
        dispatch::Queued::Sent {
            session,
            tx,
            made: (window, exchange),
        } => Queued::Head {
            session,
            tx,
            window,
            exchange,
        },
        dispatch::Queued::NoAgent => Queued::NoAgent,
        dispatch::Queued::Gone(session) | dispatch::Queued::Declined(session, ()) => {
            Queued::Gone(session)
        }
    }
}

/// How an exchange behaves besides its request.
#[derive(Default)]
pub(crate) struct Exchange {
    /// A watch or log follow (or an upgraded connection): it ends cleanly when its agent
    /// goes away.
    pub(crate) ends_cleanly: bool,
    /// The client's connection, once the API server switches protocols (exec, attach,
    /// port-forward).
    pub(crate) upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// Who called ([`crate::caller`]); `None` for the hub's own requests (discovery).
    pub(crate) caller: Option<pb::ProxyCaller>,
    /// The request id the agent sends the API server as `Audit-ID`; empty: none.
    pub(crate) audit_id: String,
    /// An upgrade's hold on its token: the connection ends when the token is revoked.
    pub(crate) lease: Option<Lease>,
}

/// Carries a request to an agent of `account` and streams its answer back. When the agent
/// leaves before answering, a request that can be sent again goes to another agent replica
/// (at most [`MAX_ATTEMPTS`] in all).
pub(crate) async fn forward(
    proxy: &Proxy,
    account: &str,
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Option<Body>,
    exchange_kind: Exchange,
) -> Result<Response, Status> {
    let Exchange {
        ends_cleanly,
        mut upgrade,
        caller,
        audit_id,
        lease,
    } = exchange_kind;
    let mut body = body;
    let once = body.is_some() || upgrade.is_some();
    let mut tried = Vec::new();
    let mut last_error = None;
    loop {
        let mut request_head = request_head(
            account,
            method,
            path_and_query,
            headers,
            body.is_some(),
            upgrade.is_some(),
        );
        request_head.caller = caller.clone();
        request_head.audit_id = audit_id.clone();
        let (session, tx, window, exchange) =
            match pick_and_queue(proxy, account, &tried, ends_cleanly, &request_head).await {
                Queued::Head {
                    session,
                    tx,
                    window,
                    exchange,
                } => (session, tx, window, exchange),
                Queued::NoAgent => {
                    return Err(last_error.unwrap_or_else(|| no_agent(&proxy.live, account)));
                }
                Queued::Gone(session) => {
                    tried.push(session);
                    if !once && tried.len() < MAX_ATTEMPTS {
                        continue;
                    }
                    return Err(Status::unavailable(format!(
                        "the agent of account {account:?} disconnected before the request was sent"
                    )));
                }
            };
        tried.push(session);
        let guard = ExchangeGuard {
            tunnels: proxy.state.tunnels.clone(),
            id: exchange.id,
            tx: tx.clone(),
        };
        if let Some(body) = body.take() {
            tokio::spawn(
                pump_request_body(
                    body,
                    exchange.id,
                    exchange.request_credit.clone(),
                    tx.clone(),
                )
                .in_current_span(),
            );
        }
        let OpenExchange {
            id,
            head,
            body: events,
            unconsumed,
            request_credit,
        } = exchange;
        let head = match response_head(head, account).await {
            Ok(head) => head,
            Err(HeadFailure::AgentGone(status)) => {
                // Only a request without a body can go to another replica: a body was
                // streamed into the tunnel and is gone.
                if tried.len() < MAX_ATTEMPTS && !once && !headers_carry_body(method) {
                    tracing::info!(
                        exchange = id,
                        "agent left before answering; trying another replica"
                    );
                    last_error = Some(status);
                    continue;
                }
                return Err(status);
            }
            Err(HeadFailure::Final(status)) => return Err(status),
        };
        let answer = Answered {
            events,
            unconsumed,
            request_credit,
            window: u64::from(window),
            guard,
        };
        return Ok(answer.respond(head, upgrade.take(), lease, proxy.metrics.bytes.clone()));
    }
}

/// Why no agent of `account` could take a request.
fn no_agent(live: &Live, account: &str) -> Status {
    let connected = !live.registry_read().replicas(account).is_empty();
    Status::unavailable(if connected {
        format!(
            "the agents connected for account {account:?} are too old for the \
             Kubernetes API proxy (no http-tunnel capability): upgrade them"
        )
    } else {
        format!(
            // troubleshooting: proxy: HTTP 503
            // No agent serves the account right now and the request cannot be answered from the
            // cache (a write, or a kind the agent does not stream). `GET /api/v1/agents` lists the
            // connected agents; the AgentAccount's `Connected` condition in the target cluster says
            // why its agent is away.
            "no agent of account {account:?} is connected to the hub: the cluster \
             is unreachable until one reconnects (check its agent's logs and GET \
             /api/v1/agents on the hub)"
        )
    })
}

/// The request's head as the agent replays it: the client's headers the API server may see
/// (and, for an upgrade, those that ask for it).
fn request_head(
    account: &str,
    method: &Method,
    path_and_query: &str,
    client_headers: &HeaderMap,
    body_follows: bool,
    upgrade: bool,
) -> pb::HttpRequestHead {
    let mut request_headers = headers::request_headers(client_headers);
    if upgrade {
        request_headers.extend(headers::upgrade_headers(client_headers));
    }
    pb::HttpRequestHead {
        account: account.to_string(),
        method: method.as_str().to_string(),
        path_and_query: path_and_query.to_string(),
        headers: request_headers,
        // An upgrade's client-to-server bytes follow the API server's 101.
        end_of_body: !body_follows && !upgrade,
        ..Default::default()
    }
}

/// Why an exchange has no response head.
enum HeadFailure {
    /// The agent left before answering: another replica may take the request.
    AgentGone(Status),
    /// The agent reset the exchange, or the API server did not answer in time.
    Final(Status),
}

/// Waits up to [`RESPONSE_HEAD_TIMEOUT`] for the response head of an exchange.
async fn response_head(
    head: oneshot::Receiver<Result<pb::HttpResponseHead, HeadError>>,
    account: &str,
) -> Result<pb::HttpResponseHead, HeadFailure> {
    match tokio::time::timeout(RESPONSE_HEAD_TIMEOUT, head).await {
        Ok(Ok(Ok(head))) => Ok(head),
        Ok(Ok(Err(HeadError::AgentGone))) | Ok(Err(_)) => {
            Err(HeadFailure::AgentGone(Status::unavailable(format!(
                "the agent of account {account:?} disconnected before answering"
            ))))
        }
        Ok(Ok(Err(HeadError::Reset(reason)))) => Err(HeadFailure::Final(Status::bad_gateway(
            format!("the agent of account {account:?} could not complete the request: {reason}"),
        ))),
        Err(_) => Err(HeadFailure::Final(Status::timeout(format!(
            "no answer from the API server of account {account:?} within {} s",
            RESPONSE_HEAD_TIMEOUT.as_secs()
        )))),
    }
}

/// An exchange whose response head arrived: what its answer is made of.
struct Answered {
    events: tokio::sync::mpsc::UnboundedReceiver<BodyEvent>,
    unconsumed: Arc<AtomicU64>,
    request_credit: Arc<tokio::sync::Semaphore>,
    window: u64,
    guard: ExchangeGuard,
}

impl Answered {
    /// The client's response: after the API server's 101 (when the client asked for an
    /// upgrade) the connection's bytes are pumped both ways; otherwise the response body
    /// streams as the client reads it, its bytes counted in `bytes_passed`.
    fn respond(
        self,
        head: pb::HttpResponseHead,
        upgrade: Option<hyper::upgrade::OnUpgrade>,
        lease: Option<Lease>,
        bytes_passed: Counter,
    ) -> Response {
        let Answered {
            events,
            unconsumed,
            request_credit,
            window,
            guard,
        } = self;
        let status = StatusCode::from_u16(u16::try_from(head.status).unwrap_or(502))
            .unwrap_or(StatusCode::BAD_GATEWAY);
        if status == StatusCode::SWITCHING_PROTOCOLS
            && let Some(on_upgrade) = upgrade
        {
            let mut response = Response::new(Body::empty());
            *response.status_mut() = status;
            *response.headers_mut() = headers::switching_headers(&head.headers);
            let pump = Upgraded {
                events,
                unconsumed,
                credit: request_credit,
                window,
                guard,
                lease,
            };
            tokio::spawn(pump.run(on_upgrade).in_current_span());
            return response;
        }
        let mut response = if head.end_of_body {
            drop(guard);
            Response::new(Body::empty())
        } else {
            Response::new(Body::from_stream(response_body(
                events,
                unconsumed,
                window,
                guard,
                bytes_passed,
            )))
        };
        *response.status_mut() = status;
        *response.headers_mut() = headers::response_headers(&head.headers);
        response
    }
}

/// Methods whose request may carry a body; their requests are never resent.
fn headers_carry_body(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Ends an exchange the client abandoned: dropped with the handler or the response body,
/// it tells the agent to stop unless the exchange already finished.
pub(crate) struct ExchangeGuard {
    tunnels: Arc<Tunnels>,
    pub(crate) id: u64,
    pub(crate) tx: AgentSender,
}

impl Drop for ExchangeGuard {
    fn drop(&mut self) {
        if self.tunnels.close(self.id) {
            tunnel::send_frame_soon(
                &self.tx,
                self.id,
                Frame::Reset(pb::TunnelReset {
                    reason: "the client went away".into(),
                }),
            );
        }
    }
}

/// Streams the request body into the tunnel, never more than the agent's credit.
async fn pump_request_body(
    body: Body,
    id: u64,
    credit: Arc<tokio::sync::Semaphore>,
    tx: AgentSender,
) {
    let mut body = body;
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                for chunk in data.chunks(tunnel::MAX_FRAME_BYTES) {
                    let Ok(permits) = credit.acquire_many(chunk.len() as u32).await else {
                        return;
                    };
                    permits.forget();
                    let frame = Frame::Data(pb::TunnelData {
                        data: chunk.to_vec(),
                        end_of_body: false,
                    });
                    if !tunnel::send_frame(&tx, id, frame).await {
                        return;
                    }
                }
            }
            Some(Err(error)) => {
                let reason = format!("the client's request body failed: {error}");
                tunnel::send_frame(&tx, id, Frame::Reset(pb::TunnelReset { reason })).await;
                return;
            }
            None => {
                let end = Frame::Data(pb::TunnelData {
                    data: Vec::new(),
                    end_of_body: true,
                });
                tunnel::send_frame(&tx, id, end).await;
                return;
            }
        }
    }
}

/// The response body as the HTTP server pulls it, returning credit to the agent as the
/// client consumes it.
fn response_body(
    events: tokio::sync::mpsc::UnboundedReceiver<BodyEvent>,
    unconsumed: Arc<AtomicU64>,
    window: u64,
    guard: ExchangeGuard,
    bytes_passed: Counter,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    struct State {
        events: tokio::sync::mpsc::UnboundedReceiver<BodyEvent>,
        unconsumed: Arc<AtomicU64>,
        consumed: u64,
        window: u64,
        guard: ExchangeGuard,
        bytes_passed: Counter,
        done: bool,
    }
    let state = State {
        events,
        unconsumed,
        consumed: 0,
        window,
        guard,
        bytes_passed,
        done: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        match st.events.recv().await {
            Some(BodyEvent::Data(bytes)) => {
                st.consumed += bytes.len() as u64;
                // Credit goes back in quarters of the window: few frames, and the agent
                // never waits for the client to drain the whole window.
                if st.consumed >= st.window / 4 {
                    let credit = st.consumed;
                    st.consumed = 0;
                    st.unconsumed.fetch_sub(credit, Ordering::AcqRel);
                    let update = Frame::WindowUpdate(u32::try_from(credit).unwrap_or(u32::MAX));
                    // When the agent's stream is gone the credit has nowhere to go, but the
                    // body goes on to its last event (End, or Failed for a cut response):
                    // ending here would make a cut response look complete.
                    let _ = tunnel::send_frame(&st.guard.tx, st.guard.id, update).await;
                }
                st.bytes_passed.inc_by(bytes.len() as u64);
                Some((Ok(bytes), st))
            }
            Some(BodyEvent::End) | None => None,
            Some(BodyEvent::Failed(reason)) => {
                st.done = true;
                Some((Err(std::io::Error::other(reason)), st))
            }
        }
    })
}
