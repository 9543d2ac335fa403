//! The agent's half of tunnelled HTTP exchanges (item 7 of the stream contract in
//! `proto/scaleagent/v1/agent.proto`): the hub's Kubernetes API proxy hands the agent HTTP
//! requests on the stream; the agent replays each against the account's API server with
//! the account's own credentials and streams the answer back.
//!
//! Every exchange runs in its own task. Response bodies are sent in frames of at most
//! [`MAX_FRAME_BYTES`], never more than the hub's credit for that exchange, so a watch, a
//! followed log or a 50 MiB list never stalls the object stream or another exchange, and
//! neither side buffers more than a window per exchange. Request bodies are collected before
//! the replay (at most [`MAX_REQUEST_BODY_BYTES`]; the API server itself accepts 3 MiB)
//! because kube's client sends whole request bodies. Tunnel frames carry seq 0 and bypass the
//! acknowledgement window. When the stream ends, [`Tunnel`] is dropped and its exchanges
//! are aborted.

use std::{collections::HashMap, sync::Arc};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use kube::client::Body;
use scale_agent_proto::{
    tunnel::{HOP_BY_HOP, claims_identity},
    v1::{self as pb, AgentMessage, agent_message, tunnel_frame::Frame},
};
use tokio::{
    sync::{Semaphore, mpsc},
    task::{AbortHandle, JoinSet},
};

use tracing::Instrument as _;

use crate::{callers::Impersonation, state::Shared};

pub use scale_agent_proto::tunnel::{DEFAULT_WINDOW_BYTES, MAX_FRAME_BYTES};
/// Largest request body the agent replays.
pub const MAX_REQUEST_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Request headers never replayed besides the hop-by-hop ones and the caller's credentials
/// and identity claims ([`claims_identity`]: the agent acts as itself): the length hyper
/// sets from the body. The hub drops all of these too; the agent does not rely on it.
const DROPPED_REQUEST_HEADERS: &[&str] = &["content-length"];

/// Whether a request header from the hub may be replayed; for an upgrade (exec, attach,
/// port-forward) `Connection` and `Upgrade` ask the API server to switch protocols.
pub fn replay_request_header(name: &str, upgrade: bool) -> bool {
    let name = name.to_ascii_lowercase();
    if upgrade && (name == "connection" || name == "upgrade") {
        return true;
    }
    !(HOP_BY_HOP.contains(&name.as_str())
        || DROPPED_REQUEST_HEADERS.contains(&name.as_str())
        || claims_identity(&name)
        || name.starts_with("x-scale-agent-"))
}

/// Whether the request asks the API server to switch protocols.
pub fn is_upgrade(head: &pb::HttpRequestHead) -> bool {
    head.headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("upgrade"))
}

/// Whether a tunnelled request changes the cluster, and so runs as the account's
/// impersonated ServiceAccount when it names one: every method but GET, HEAD and OPTIONS,
/// and exec, attach and port-forward, whose WebSocket forms are GETs.
pub fn is_write(head: &pb::HttpRequestHead) -> bool {
    let read_method = ["GET", "HEAD", "OPTIONS"]
        .iter()
        .any(|m| head.method.eq_ignore_ascii_case(m));
    let path = head.path_and_query.split('?').next().unwrap_or_default();
    let into_a_pod = ["exec", "attach", "portforward"]
        .iter()
        .any(|sub| path.trim_end_matches('/').rsplit('/').next() == Some(sub));
    !read_method || into_a_pod || is_upgrade(head)
}

/// The response headers to send back; a 101 keeps `Connection` and `Upgrade`, which the
/// client needs to accept the switch.
pub fn response_headers(headers: &http::HeaderMap, switching: bool) -> Vec<pb::HttpHeader> {
    headers
        .iter()
        .filter(|(name, _)| {
            (switching && (*name == http::header::CONNECTION || *name == http::header::UPGRADE))
                || !HOP_BY_HOP.contains(&name.as_str())
        })
        .map(|(name, value)| pb::HttpHeader {
            name: name.as_str().to_string(),
            value: value.as_bytes().to_vec(),
        })
        .collect()
}

/// A Kubernetes `Status` body, for answers the agent makes up itself.
pub fn status_body(code: u16, reason: &str, message: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    }))
    .unwrap_or_default()
}

/// The header carrying the hub's request id, which the API server takes as its audit id
/// (`Audit-ID`, kube-apiserver's `WithAuditInit`).
pub const AUDIT_ID_HEADER: &str = "Audit-ID";

/// Builds the request to replay: the client's headers the API server may see, the
/// identity the agent asks for when it impersonates the caller ([`crate::callers`]), and the
/// hub's request id as `Audit-ID`.
pub fn build_request(
    head: &pb::HttpRequestHead,
    body: Bytes,
    identity: Option<&Impersonation>,
) -> Result<http::Request<Body>, String> {
    let upgrade = is_upgrade(head);
    if !head.path_and_query.starts_with('/') {
        return Err(format!(
            "the request path {:?} does not start with '/'",
            head.path_and_query
        ));
    }
    let mut builder = http::Request::builder()
        .method(head.method.as_str())
        .uri(head.path_and_query.as_str());
    let hub_audit_id = !head.audit_id.is_empty();
    for header in &head.headers {
        // The hub's id wins over one the client made up, so both audit logs agree.
        let client_audit_id = hub_audit_id && header.name.eq_ignore_ascii_case(AUDIT_ID_HEADER);
        if replay_request_header(&header.name, upgrade) && !client_audit_id {
            builder = builder.header(header.name.as_str(), header.value.as_slice());
        }
    }
    if let Some(identity) = identity {
        for (name, value) in identity.headers() {
            builder = builder.header(name, value);
        }
    }
    if hub_audit_id {
        builder = builder.header(AUDIT_ID_HEADER, head.audit_id.as_str());
    }
    builder
        .body(Body::from(body))
        .map_err(|e| format!("the request cannot be replayed: {e}"))
}

/// What to do with a tunnelled request ([`Tunnel::handle`]).
pub enum Route {
    /// Replay it with this client of the account's API server, as the caller when
    /// `identity` is set (the account impersonates its callers, [`crate::callers`]).
    Replay {
        client: kube::Client,
        identity: Option<Impersonation>,
    },
    /// Answer 503: the account is not served here, or not ready.
    NotServed,
    /// Answer 403 with this message: outside the account's scope.
    Refused(String),
}

/// Where an exchange's frames go: the stream's outbound queue.
#[derive(Clone)]
struct Frames {
    out: mpsc::Sender<AgentMessage>,
    exchange: u64,
    shared: Arc<Shared>,
}

impl Frames {
    /// Sends a frame; Err when the stream is gone (the exchange then stops).
    async fn send(&self, frame: Frame) -> Result<(), Gone> {
        let message = AgentMessage {
            seq: 0,
            kind: Some(agent_message::Kind::Tunnel(pb::TunnelFrame {
                exchange: self.exchange,
                frame: Some(frame),
            })),
        };
        self.shared
            .metrics
            .tunnel_bytes_sent
            .inc_by(prost::Message::encoded_len(&message) as u64);
        self.out.send(message).await.map_err(|_| Gone)
    }

    async fn answer(&self, code: u16, reason: &str, message: &str) -> Result<(), Gone> {
        let body = status_body(code, reason, message);
        self.send(Frame::Response(pb::HttpResponseHead {
            status: u32::from(code),
            headers: vec![pb::HttpHeader {
                name: "content-type".into(),
                value: b"application/json".to_vec(),
            }],
            end_of_body: false,
        }))
        .await?;
        self.send(Frame::Data(pb::TunnelData {
            data: body,
            end_of_body: true,
        }))
        .await
    }
}

/// The stream is gone.
#[derive(Debug)]
struct Gone;

/// What the agent holds of one exchange.
struct ExchangeHandle {
    /// Request body chunks for the exchange's task; `None` once the body ended.
    request_body: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// Credit for response bytes, topped up by the hub's window updates.
    response_credit: Arc<Semaphore>,
    abort: AbortHandle,
}

/// The open exchanges of one stream.
pub struct Tunnel {
    exchanges: HashMap<u64, ExchangeHandle>,
    tasks: JoinSet<u64>,
    out: mpsc::Sender<AgentMessage>,
    window: u32,
    shared: Arc<Shared>,
}

impl Tunnel {
    /// For a stream whose outbound queue is `out`, with the window from Welcome.
    pub fn new(out: mpsc::Sender<AgentMessage>, window: u32, shared: Arc<Shared>) -> Self {
        Tunnel {
            exchanges: HashMap::new(),
            tasks: JoinSet::new(),
            out,
            window: if window == 0 {
                DEFAULT_WINDOW_BYTES
            } else {
                window
            },
            shared,
        }
    }

    /// Number of exchanges running.
    pub fn len(&self) -> usize {
        self.exchanges.len()
    }

    /// Whether no exchange is running.
    pub fn is_empty(&self) -> bool {
        self.exchanges.is_empty()
    }

    /// Whether no exchange is running, once the finished ones are forgotten.
    pub fn idle(&mut self) -> bool {
        self.reap();
        self.is_empty()
    }

    /// Forgets exchanges whose tasks finished.
    fn reap(&mut self) {
        while let Some(done) = self.tasks.try_join_next() {
            if let Ok(id) = done {
                self.exchanges.remove(&id);
            }
        }
    }

    /// Handles a frame from the hub. `route` says what to do with a request head: replay
    /// it with the API server client of the account (for a write, [`is_write`], or a read),
    /// answer 503 (not served here, or its credentials are not loaded yet), or refuse it
    /// (outside the account's scope, [`crate::tunnel_scope`]).
    pub fn handle(
        &mut self,
        frame: pb::TunnelFrame,
        route: impl FnOnce(&pb::HttpRequestHead) -> Route,
    ) {
        self.reap();
        let id = frame.exchange;
        match frame.frame {
            Some(Frame::Request(head)) => self.open(id, head, route),
            Some(Frame::Data(data)) => {
                let Some(exchange) = self.exchanges.get_mut(&id) else {
                    return;
                };
                if let Some(tx) = &exchange.request_body {
                    if data.data.len() > MAX_FRAME_BYTES {
                        exchange.abort.abort();
                        self.exchanges.remove(&id);
                        self.reset_soon(id, "a request body frame larger than 64 KiB");
                        return;
                    }
                    if !data.data.is_empty() {
                        let _ = tx.send(data.data);
                    }
                    if data.end_of_body {
                        exchange.request_body = None;
                    }
                }
            }
            Some(Frame::WindowUpdate(credit)) => {
                if let Some(exchange) = self.exchanges.get(&id) {
                    exchange.response_credit.add_permits(credit as usize);
                }
            }
            Some(Frame::Reset(reset)) => {
                if let Some(exchange) = self.exchanges.remove(&id) {
                    tracing::debug!(exchange = id, reason = %reset.reason, "the hub reset an exchange");
                    exchange.abort.abort();
                }
            }
            Some(Frame::Response(_)) | None => {}
        }
    }

    fn reset_soon(&self, exchange: u64, reason: &str) {
        let frames = Frames {
            out: self.out.clone(),
            exchange,
            shared: self.shared.clone(),
        };
        let reason = reason.to_string();
        tokio::spawn(async move {
            let _ = frames.send(Frame::Reset(pb::TunnelReset { reason })).await;
        });
    }

    fn open(
        &mut self,
        id: u64,
        head: pb::HttpRequestHead,
        route: impl FnOnce(&pb::HttpRequestHead) -> Route,
    ) {
        let frames = Frames {
            out: self.out.clone(),
            exchange: id,
            shared: self.shared.clone(),
        };
        let (body_tx, body_rx) = if head.end_of_body {
            (None, None)
        } else {
            let (tx, rx) = mpsc::unbounded_channel();
            (Some(tx), Some(rx))
        };
        let credit = Arc::new(Semaphore::new(self.window as usize));
        let response_credit = credit.clone();
        let route = route(&head);
        let shared = self.shared.clone();
        // The proxy's per-request span on this side: the account and the exchange.
        let span =
            tracing::debug_span!("tunnelled_request", account = %head.account, exchange = id);
        let abort = self.tasks.spawn(
            async move {
                let account = head.account.clone();
                let method = head.method.clone();
                let result = match route {
                    Route::Replay { client, identity } => {
                        exchange(&frames, head, &client, identity.as_ref(), body_rx, credit).await
                    }
                    Route::Refused(message) => {
                        tracing::info!(%method, path = %head.path_and_query, %message, "tunnelled request refused: outside the account's scope");
                        frames
                            .answer(403, "Forbidden", &message)
                            .await
                            .map(|()| 403)
                    }
                    Route::NotServed => frames
                        .answer(
                            503,
                            "ServiceUnavailable",
                            &format!(
                                "account {account:?} is not ready on this agent (it does not serve \
                             it, or its credentials are still loading)"
                            ),
                        )
                        .await
                        .map(|()| 503),
                };
                match result {
                    Ok(code) => {
                        shared.metrics.proxy_request(&account, code);
                        tracing::debug!(%method, code, "tunnelled request answered");
                    }
                    Err(Gone) => {
                        tracing::debug!("stream gone during a tunnelled request");
                    }
                }
                id
            }
            .instrument(span),
        );
        self.exchanges.insert(
            id,
            ExchangeHandle {
                request_body: body_tx,
                response_credit,
                abort,
            },
        );
    }
}

/// One exchange: collect the request body, replay, stream the answer within the credit.
/// Returns the status code answered.
async fn exchange(
    frames: &Frames,
    head: pb::HttpRequestHead,
    client: &kube::Client,
    identity: Option<&Impersonation>,
    body_rx: Option<mpsc::UnboundedReceiver<Vec<u8>>>,
    credit: Arc<Semaphore>,
) -> Result<u16, Gone> {
    if is_upgrade(&head) {
        return upgraded(frames, head, client, identity, body_rx, credit).await;
    }
    let body = match body_rx {
        None => Bytes::new(),
        Some(mut rx) => {
            let mut body = Vec::new();
            while let Some(chunk) = rx.recv().await {
                let len = chunk.len();
                body.extend_from_slice(&chunk);
                if body.len() > MAX_REQUEST_BODY_BYTES {
                    let message = format!(
                        "the request body is larger than the {} MiB the agent replays (the \
                         API server accepts at most 3 MiB)",
                        MAX_REQUEST_BODY_BYTES / (1024 * 1024)
                    );
                    frames
                        .answer(413, "RequestEntityTooLarge", &message)
                        .await?;
                    return Ok(413);
                }
                // The chunk is consumed (kept here): the hub may send more.
                frames
                    .send(Frame::WindowUpdate(u32::try_from(len).unwrap_or(u32::MAX)))
                    .await?;
            }
            Bytes::from(body)
        }
    };
    match replay(frames, client, &head, body, identity).await? {
        Replayed::Answer(response) => stream_response(frames, response, credit).await,
        Replayed::Refused(code) => Ok(code),
    }
}

/// What replaying a request gave.
enum Replayed {
    /// The API server's answer.
    Answer(http::Response<Body>),
    /// The agent answered itself (a request it cannot replay, an API server it cannot
    /// reach) with this status code.
    Refused(u16),
}

/// Replays the request against the API server; answers 400 or 502 itself when it cannot.
async fn replay(
    frames: &Frames,
    client: &kube::Client,
    head: &pb::HttpRequestHead,
    body: Bytes,
    identity: Option<&Impersonation>,
) -> Result<Replayed, Gone> {
    let request = match build_request(head, body, identity) {
        Ok(request) => request,
        Err(message) => {
            frames.answer(400, "BadRequest", &message).await?;
            return Ok(Replayed::Refused(400));
        }
    };
    match client.send(request).await {
        Ok(response) => Ok(Replayed::Answer(response)),
        Err(error) => {
            let message = format!("the agent could not reach the API server: {error}");
            frames.answer(502, "InternalError", &message).await?;
            Ok(Replayed::Refused(502))
        }
    }
}

/// Sends the API server's answer: its head, then its body within the hub's credit.
async fn stream_response(
    frames: &Frames,
    response: http::Response<Body>,
    credit: Arc<Semaphore>,
) -> Result<u16, Gone> {
    let (parts, mut body) = response.into_parts();
    let code = parts.status.as_u16();
    let end = http_body::Body::is_end_stream(&body);
    frames
        .send(Frame::Response(pb::HttpResponseHead {
            status: u32::from(code),
            headers: response_headers(&parts.headers, false),
            end_of_body: end,
        }))
        .await?;
    if end {
        return Ok(code);
    }
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                for chunk in data.chunks(MAX_FRAME_BYTES) {
                    // Closed only when the exchange is dropped; then the task is aborted too.
                    let Ok(permits) = credit.acquire_many(chunk.len() as u32).await else {
                        return Err(Gone);
                    };
                    permits.forget();
                    frames
                        .send(Frame::Data(pb::TunnelData {
                            data: chunk.to_vec(),
                            end_of_body: false,
                        }))
                        .await?;
                }
            }
            Some(Err(error)) => {
                let reason = format!("the API server's response broke off: {error}");
                frames
                    .send(Frame::Reset(pb::TunnelReset { reason }))
                    .await?;
                return Ok(code);
            }
            None => {
                frames
                    .send(Frame::Data(pb::TunnelData {
                        data: Vec::new(),
                        end_of_body: true,
                    }))
                    .await?;
                return Ok(code);
            }
        }
    }
}

/// An upgrade (exec, attach, port-forward): replayed with an empty body; after the API
/// server's 101 the exchange carries the connection's bytes both ways, the server's within
/// the hub's credit, the client's acknowledged with credit as they are written.
async fn upgraded(
    frames: &Frames,
    head: pb::HttpRequestHead,
    client: &kube::Client,
    identity: Option<&Impersonation>,
    body_rx: Option<mpsc::UnboundedReceiver<Vec<u8>>>,
    credit: Arc<Semaphore>,
) -> Result<u16, Gone> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut response = match replay(frames, client, &head, Bytes::new(), identity).await? {
        Replayed::Answer(response) => response,
        Replayed::Refused(code) => return Ok(code),
    };
    if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        return stream_response(frames, response, credit).await;
    }
    let on_upgrade = hyper::upgrade::on(&mut response);
    frames
        .send(Frame::Response(pb::HttpResponseHead {
            status: 101,
            headers: response_headers(response.headers(), true),
            end_of_body: false,
        }))
        .await?;
    let io = match on_upgrade.await {
        Ok(upgraded) => hyper_util::rt::TokioIo::new(upgraded),
        Err(error) => {
            let reason = format!("the API server's connection did not upgrade: {error}");
            frames
                .send(Frame::Reset(pb::TunnelReset { reason }))
                .await?;
            return Ok(101);
        }
    };
    let (mut from_server, mut to_server) = tokio::io::split(io);
    // Client to API server: what the hub sends, acknowledged as written.
    let up_frames = frames.clone();
    let upstream = tokio::spawn(async move {
        let Some(mut rx) = body_rx else {
            return;
        };
        while let Some(chunk) = rx.recv().await {
            let len = chunk.len();
            if to_server.write_all(&chunk).await.is_err() {
                return;
            }
            let credit = Frame::WindowUpdate(u32::try_from(len).unwrap_or(u32::MAX));
            if up_frames.send(credit).await.is_err() {
                return;
            }
        }
        // The client finished sending.
        let _ = to_server.shutdown().await;
    });
    // API server to client, within the hub's credit; the exchange ends when the server's
    // side closes.
    let mut buf = vec![0u8; MAX_FRAME_BYTES];
    let result = loop {
        let n = match from_server.read(&mut buf).await {
            Ok(n) => n,
            Err(error) => {
                let reason = format!("the API server's connection broke off: {error}");
                break frames.send(Frame::Reset(pb::TunnelReset { reason })).await;
            }
        };
        if n == 0 {
            break frames
                .send(Frame::Data(pb::TunnelData {
                    data: Vec::new(),
                    end_of_body: true,
                }))
                .await;
        }
        let Ok(permits) = credit.acquire_many(n as u32).await else {
            break Err(Gone);
        };
        permits.forget();
        if let Err(gone) = frames
            .send(Frame::Data(pb::TunnelData {
                data: buf[..n].to_vec(),
                end_of_body: false,
            }))
            .await
        {
            break Err(gone);
        }
    };
    upstream.abort();
    result.map(|()| 101)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, value: &str) -> pb::HttpHeader {
        pb::HttpHeader {
            name: name.into(),
            value: value.as_bytes().to_vec(),
        }
    }

    #[test]
    fn replayed_requests_carry_no_caller_credentials() {
        let head = pb::HttpRequestHead {
            account: "a".into(),
            method: "PATCH".into(),
            path_and_query: "/apis/apps/v1/namespaces/x/deployments/web?fieldManager=kubectl"
                .into(),
            headers: vec![
                header("Authorization", "Bearer sat_x"),
                header("Impersonate-User", "admin"),
                header("X-Remote-User", "system:admin"),
                header("X-Remote-Group", "system:masters"),
                header("X-Remote-Extra-Scopes", "all"),
                header("X-Forwarded-For", "10.0.0.1"),
                header("Forwarded", "for=10.0.0.1"),
                header("X-Scale-Agent-Caller-User", "admin"),
                header("Content-Type", "application/strategic-merge-patch+json"),
                header("Connection", "keep-alive"),
                header("Content-Length", "2"),
            ],
            end_of_body: false,
            ..Default::default()
        };
        let request = build_request(&head, Bytes::from_static(b"{}"), None).unwrap();
        assert_eq!(request.method(), "PATCH");
        assert_eq!(
            request.uri(),
            "/apis/apps/v1/namespaces/x/deployments/web?fieldManager=kubectl"
        );
        let names: Vec<&str> = request.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type"]);
        let bad = pb::HttpRequestHead {
            path_and_query: "http://elsewhere/".into(),
            ..head
        };
        assert!(
            build_request(&bad, Bytes::new(), None).is_err(),
            "only paths of this API server"
        );
    }

    #[test]
    fn upgrades_keep_their_connection_headers_both_ways() {
        let head = pb::HttpRequestHead {
            method: "POST".into(),
            path_and_query: "/api/v1/namespaces/x/pods/p/exec?command=true&stdout=true".into(),
            headers: vec![
                header("Connection", "Upgrade"),
                header("Upgrade", "SPDY/3.1"),
                header("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
                header("Authorization", "Bearer sat_x"),
            ],
            ..Default::default()
        };
        assert!(is_upgrade(&head));
        let request = build_request(&head, Bytes::new(), None).unwrap();
        assert_eq!(request.headers()["upgrade"], "SPDY/3.1");
        assert_eq!(request.headers()["connection"], "Upgrade");
        assert!(!request.headers().contains_key("authorization"));

        let mut answer = http::HeaderMap::new();
        answer.insert("connection", http::HeaderValue::from_static("Upgrade"));
        answer.insert("upgrade", http::HeaderValue::from_static("SPDY/3.1"));
        answer.insert(
            "x-stream-protocol-version",
            http::HeaderValue::from_static("v4.channel.k8s.io"),
        );
        assert_eq!(response_headers(&answer, true).len(), 3);
        assert_eq!(response_headers(&answer, false).len(), 1);
    }

    #[test]
    fn writes_are_changes_and_entries_into_pods() {
        let request =
            |method: &str, path: &str, headers: Vec<pb::HttpHeader>| pb::HttpRequestHead {
                method: method.into(),
                path_and_query: path.into(),
                headers,
                ..Default::default()
            };
        let pods = "/api/v1/namespaces/web/pods";
        assert!(!is_write(&request("GET", pods, vec![])));
        assert!(!is_write(&request(
            "GET",
            &format!("{pods}?watch=true"),
            vec![]
        )));
        assert!(!is_write(&request("HEAD", pods, vec![])));
        assert!(!is_write(&request(
            "GET",
            &format!("{pods}/logger/log"),
            vec![]
        )));
        assert!(is_write(&request("POST", pods, vec![])));
        assert!(is_write(&request(
            "PATCH",
            &format!("{pods}/logger"),
            vec![]
        )));
        assert!(is_write(&request(
            "DELETE",
            &format!("{pods}/logger"),
            vec![]
        )));
        assert!(is_write(&request(
            "GET",
            &format!("{pods}/logger/exec?command=sh"),
            vec![]
        )));
        assert!(is_write(&request(
            "GET",
            &format!("{pods}/logger/portforward"),
            vec![header("Upgrade", "websocket")]
        )));
    }

    #[test]
    fn statuses_made_by_the_agent_are_kubernetes_statuses() {
        let body: serde_json::Value = serde_json::from_slice(&status_body(
            502,
            "InternalError",
            "the agent could not reach the API server",
        ))
        .unwrap();
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["code"], 502);
        assert_eq!(body["reason"], "InternalError");
    }
}
