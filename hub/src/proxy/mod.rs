//! The Kubernetes API proxy: `https://<hub>/clusters/<account>/<any Kubernetes API path>`.
//!
//! A kubeconfig whose `server:` is `https://<hub>/clusters/<account>` makes kubectl,
//! client-go, Helm and Clouddriver (which only runs kubectl) reach the account's cluster
//! through the hub. Each request needs a bearer token issued for that account
//! ([`crate::tokens`]); it is carried to a connected agent of the account as one exchange
//! on the agent's existing stream ([`crate::tunnel`]) and replayed there against the API
//! server with the agent's own credentials; upgrades (exec, attach, port-forward) carry the
//! connection's bytes after the API server's 101. Discovery and OpenAPI documents are answered
//! from a per-account cache ([`discovery`]). Every error the hub makes itself is a
//! Kubernetes `Status` ([`status`]).

pub mod audit;
pub mod cached;
pub mod discovery;
pub mod events;
mod metrics;
mod state;
pub use scale_agent_hub_net::{headers, status};

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
    routing::any,
};
use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use http_body_util::BodyExt as _;
use scale_agent_proto::v1::{self as pb, tunnel_frame::Frame};
use tracing::Instrument as _;

use prometheus_client::metrics::counter::Counter;
use scale_agent_hub_auth::AuthBook;
use scale_agent_hub_replicas::Replicas;
use scale_agent_hub_state::Live;

use crate::{
    registry::SessionId,
    tunnel::{self, AgentSender, BodyEvent, HeadError, OpenExchange, Tunnels},
};
pub use metrics::ProxyMetrics;
pub use state::ProxyState;
use status::Status;

/// How long the hub waits for the API server's answer to start (watches and log follows
/// answer at once; the API server's own limit for other requests is 60 s).
pub const RESPONSE_HEAD_TIMEOUT: Duration = Duration::from_secs(120);
/// Replicas tried for a request without a body whose agent left before answering.
pub const MAX_ATTEMPTS: usize = 3;
/// Response header saying who answered: `hit` (the hub's cache), `tunnel` (the API server,
/// through an agent), `hub` (an error of the hub's own); discovery and OpenAPI documents
/// also say `miss` (fetched and kept), `stale` and `revalidated`.
pub const CACHE_HEADER: &str = "x-scale-agent-cache";

/// What the proxy's routes work with: the live state (accounts, their agents' streams, the
/// cache), the credentials, the other replicas, the proxy's own state and metrics, and the
/// shutdown signal (which ends watches served from the cache). The hub builds it from its
/// handles.
pub struct Proxy {
    pub live: Arc<Live>,
    pub auth: Arc<AuthBook>,
    /// Who owns each account, and the forwarder to its owner.
    pub replicas: Arc<Replicas>,
    pub state: Arc<ProxyState>,
    pub metrics: ProxyMetrics,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

/// The proxy's routes, with their state: they merge into a router of any state.
pub fn router<S: Clone + Send + Sync + 'static>(proxy: Arc<Proxy>) -> Router<S> {
    Router::new()
        .route("/clusters/{account}", any(handle))
        .route("/clusters/{account}/", any(handle))
        .route("/clusters/{account}/{*path}", any(handle))
        .with_state(proxy)
}

/// Who answered a request, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// The API server, through an agent.
    Tunnel,
    /// The hub's cache (discovery documents, objects).
    Cache,
    /// The hub itself (an error: no token, no agent, ...).
    Hub,
    /// Another replica of the hub, which owns the account ([`crate::owners::forward`]).
    Owner,
}

impl Served {
    pub fn as_str(self) -> &'static str {
        match self {
            Served::Tunnel => "tunnel",
            Served::Cache => "cache",
            Served::Hub => "hub",
            Served::Owner => "owner",
        }
    }
}

/// One proxied request; its span names the account of the URL (empty when the path has
/// none), so every event of the request, its body pump and its upgraded connection carry it.
#[tracing::instrument(name = "proxy", skip_all, fields(account = split_path(request.uri().path()).map_or("", |(account, _)| account)))]
async fn handle(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let discovery_path = split_path(request.uri().path())
        .is_some_and(|(_, path)| discovery::is_discovery(&method, path));
    let upgrade = headers::is_upgrade(request.headers());
    // Replicas sharing a store: a token issued through another replica is looked up there
    // before it is judged (and named in the audit).
    crate::shared::learn_bearer(&proxy.replicas, &proxy.auth, request.headers()).await;
    // Writes are audited: who (the token's name), what, and how it ended.
    let audit = self::audit::is_proxy_write(&method, upgrade).then(|| {
        let (account, api_path) = split_path(request.uri().path()).unwrap_or_default();
        let who = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::tokens::bearer)
            .and_then(|token| proxy.auth.tokens().verify(token).map(|r| r.name.clone()));
        (account.to_string(), api_path.to_string(), who)
    });
    let (response, served) = match answer(&proxy, request).await {
        Ok(answer) => answer,
        Err(status) => {
            tracing::debug!(
                code = status.code(),
                message = status.message(),
                "proxy refused a request"
            );
            let response = if discovery_path {
                status.into_text_response()
            } else {
                status.into_response()
            };
            (response, Served::Hub)
        }
    };
    let mut response = response;
    if !response.headers().contains_key(CACHE_HEADER) {
        let who = match served {
            Served::Cache => "hit",
            Served::Tunnel | Served::Owner => "tunnel",
            Served::Hub => "hub",
        };
        response
            .headers_mut()
            .insert(CACHE_HEADER, HeaderValue::from_static(who));
    }
    if proxy.replicas.forwarder.is_some()
        && !response
            .headers()
            .contains_key(crate::owners::forward::REPLICA_HEADER)
        && let Ok(replica) = HeaderValue::from_str(proxy.replicas.id())
    {
        response
            .headers_mut()
            .insert(crate::owners::forward::REPLICA_HEADER, replica);
    }
    proxy
        .metrics
        .request(&method, served.as_str(), response.status().as_u16());
    if let Some((account, api_path, who)) = audit {
        self::audit::proxy_write(
            who.as_deref(),
            &account,
            &method,
            &api_path,
            upgrade,
            response.status().as_u16(),
            started.elapsed(),
        );
    }
    response
}

/// `(account, API path)` of a proxy URL path, the API path kept exactly as sent (still
/// percent-encoded), `/` when empty.
pub fn split_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/clusters/")?;
    let (account, api_path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    Some((account, api_path))
}

fn authenticate(auth: &AuthBook, headers: &HeaderMap, account: &str) -> Result<(), Status> {
    let get_one =
        format!("get a kubeconfig for it with `scale-agent-hub kubeconfig --account {account}`");
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(Status::unauthorized(format!(
            "the Scale Agent hub needs a bearer token for account {account:?}: {get_one}"
        )));
    };
    let Some(token) = value.to_str().ok().and_then(crate::tokens::bearer) else {
        return Err(Status::unauthorized(format!(
            "the Authorization header must be `Bearer <token>`: {get_one}"
        )));
    };
    let owner = auth.tokens().verify(token).map(|r| r.account.clone());
    match owner {
        None => Err(Status::unauthorized(format!(
            "the token is not valid here (unknown, revoked, or issued by another hub): {get_one}"
        ))),
        Some(owner) if owner != account => Err(Status::forbidden(format!(
            "this token belongs to account {owner:?} and cannot reach account {account:?}"
        ))),
        Some(_) => Ok(()),
    }
}

/// Answers a request: from another replica that owns the account, the discovery cache, the
/// cache, or an agent; `Err` is the hub's own refusal.
async fn answer(proxy: &Arc<Proxy>, request: Request) -> Result<(Response, Served), Status> {
    let (account, api_path) = split_path(request.uri().path())
        .map(|(a, p)| (a.to_string(), p.to_string()))
        .ok_or_else(|| Status::not_found("not a proxy path: use /clusters/<account>/..."))?;
    let api_path = api_path.as_str();
    crate::session::validate_account_name(&account).map_err(Status::not_found)?;
    // A request another replica forwarded was authenticated there.
    if request
        .extensions()
        .get::<crate::owners::forward::Forwarded>()
        .is_none()
    {
        authenticate(&proxy.auth, request.headers(), &account)?;
    }
    // The account's agents stream to its owner, which also keeps its cache: everything,
    // cached reads included, is served there.
    if let Some(owner) = proxy
        .replicas
        .owner_elsewhere(&proxy.live, &account, request.extensions())
        .await
        && let Some(forwarder) = &proxy.replicas.forwarder
    {
        let ends_cleanly = is_long_running(request.method(), api_path, request.uri().query());
        let response = forwarder.send(&owner, None, request, ends_cleanly).await?;
        return Ok((response, Served::Owner));
    }
    if !proxy.live.state().registry.accounts.contains_key(&account) {
        return Err(Status::not_found(format!(
            "account {account:?} is not known to this hub: no agent has registered it (or it \
             was removed after its grace period); check the agents with GET /api/v1/agents"
        )));
    }
    let path_and_query = match request.uri().query() {
        Some(query) => format!("{api_path}?{query}"),
        None => api_path.to_string(),
    };
    let method = request.method().clone();
    if discovery::is_discovery(&method, api_path) {
        return discovery_request(proxy, &account, &path_and_query, request).await;
    }
    let upgrade_requested = headers::is_upgrade(request.headers());
    if method == Method::GET && !upgrade_requested {
        let query = request.uri().query();
        if let Some(response) =
            cached::watch::watch(proxy, &account, api_path, query, request.headers()).await
        {
            return Ok((response, Served::Cache));
        }
        if let Some(response) = cached::read(
            &proxy.live,
            &proxy.state.cached_reads,
            &account,
            api_path,
            query,
            request.headers(),
        )
        .await
        {
            return Ok((response, Served::Cache));
        }
    }
    let changes_kinds = discovery::changes_kinds(&method, api_path);
    let mut request = request;
    // exec, attach, port-forward: after the API server's 101 the exchange carries the
    // connection's bytes both ways.
    let upgrade = headers::is_upgrade(request.headers()).then(|| hyper::upgrade::on(&mut request));
    let ends_cleanly =
        upgrade.is_some() || is_long_running(&method, api_path, request.uri().query());
    let (parts, body) = request.into_parts();
    let body = (!body_is_empty(&parts.headers, &body)).then_some(body);
    let response = forward(
        proxy,
        &account,
        &parts.method,
        &path_and_query,
        &parts.headers,
        body,
        Exchange {
            ends_cleanly,
            upgrade,
        },
    )
    .await?;
    let response = cached::after_write(
        &proxy.live,
        &proxy.state.cached_reads,
        &account,
        &parts.method,
        api_path,
        response,
    )
    .await;
    if changes_kinds && response.status().is_success() {
        proxy.state.discovery.invalidate(&account, Instant::now());
        tracing::info!(path = %api_path, "kinds changed through the proxy; discovery cache dropped");
    }
    Ok((response, Served::Tunnel))
}

/// A watch or a followed log: its response ends cleanly when the agent goes away, the way
/// the API server ends a watch, and clients start a new one.
pub(crate) fn is_long_running(method: &Method, path: &str, query: Option<&str>) -> bool {
    if method != Method::GET {
        return false;
    }
    let flag = |name: &str| {
        query.unwrap_or("").split('&').any(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            k == name && (v == "true" || v == "1")
        })
    };
    flag("watch") || (path.ends_with("/log") && flag("follow")) || path.contains("/watch/")
}

fn body_is_empty(headers: &HeaderMap, body: &Body) -> bool {
    use http_body::Body as _;
    body.is_end_stream()
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() == "0")
}

/// A connected agent replica of `account` that can tunnel, skipping `tried`; round-robin
/// with the operations (the same rotation as [`crate::operations::pick_replica`]).
fn pick(live: &Live, account: &str, tried: &[SessionId]) -> Option<(SessionId, AgentSender, u32)> {
    let candidates = live.state().registry.replicas(account);
    let sessions = live.sessions();
    let usable: Vec<(SessionId, AgentSender, u32)> = candidates
        .into_iter()
        .filter(|s| !tried.contains(s))
        .filter_map(|id| {
            let handle = sessions.get(&id)?;
            handle
                .tunnel_window
                .map(|window| (id, handle.outbound.clone(), window))
        })
        .collect();
    drop(sessions);
    if usable.is_empty() {
        return None;
    }
    let i = live.pick(usable.len());
    usable.into_iter().nth(i)
}

/// How an exchange behaves besides its request.
#[derive(Default)]
struct Exchange {
    /// A watch or log follow (or an upgraded connection): it ends cleanly when its agent
    /// goes away.
    ends_cleanly: bool,
    /// The client's connection, once the API server switches protocols (exec, attach,
    /// port-forward).
    upgrade: Option<hyper::upgrade::OnUpgrade>,
}

/// Carries a request to an agent of `account` and streams its answer back.
async fn forward(
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
    } = exchange_kind;
    let mut body = body;
    let once = body.is_some() || upgrade.is_some();
    let mut tried = Vec::new();
    let mut last_error = None;
    loop {
        let Some((session, tx, window)) = pick(&proxy.live, account, &tried) else {
            return Err(last_error.unwrap_or_else(|| {
                let connected = !proxy.live.state().registry.replicas(account).is_empty();
                Status::unavailable(if connected {
                    format!(
                        "the agents connected for account {account:?} are too old for the \
                         Kubernetes API proxy (no http-tunnel capability): upgrade them"
                    )
                } else {
                    format!(
                        "no agent of account {account:?} is connected to the hub: the cluster \
                         is unreachable until one reconnects (check its agent's logs and GET \
                         /api/v1/agents on the hub)"
                    )
                })
            }));
        };
        tried.push(session);
        let exchange = proxy.state.tunnels.open(session, window, ends_cleanly);
        let guard = ExchangeGuard {
            tunnels: proxy.state.tunnels.clone(),
            id: exchange.id,
            tx: tx.clone(),
        };
        let mut request_headers = headers::request_headers(headers);
        if upgrade.is_some() {
            request_headers.extend(headers::upgrade_headers(headers));
        }
        let request_head = pb::HttpRequestHead {
            account: account.to_string(),
            method: method.as_str().to_string(),
            path_and_query: path_and_query.to_string(),
            headers: request_headers,
            // An upgrade's client-to-server bytes follow the API server's 101.
            end_of_body: body.is_none() && upgrade.is_none(),
        };
        if !tunnel::send_frame(&tx, exchange.id, Frame::Request(request_head)).await {
            proxy.state.tunnels.close(exchange.id);
            if !once && tried.len() < MAX_ATTEMPTS {
                continue;
            }
            return Err(Status::unavailable(format!(
                "the agent of account {account:?} disconnected before the request was sent"
            )));
        }
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
        let head = match tokio::time::timeout(RESPONSE_HEAD_TIMEOUT, head).await {
            Ok(Ok(Ok(head))) => head,
            Ok(Ok(Err(HeadError::AgentGone))) | Ok(Err(_)) => {
                let message =
                    format!("the agent of account {account:?} disconnected before answering");
                // Only a request without a body can go to another replica: a body was
                // streamed into the tunnel and is gone.
                if tried.len() < MAX_ATTEMPTS && !once && !headers_carry_body(method) {
                    tracing::info!(
                        exchange = id,
                        "agent left before answering; trying another replica"
                    );
                    last_error = Some(Status::unavailable(message));
                    continue;
                }
                return Err(Status::unavailable(message));
            }
            Ok(Ok(Err(HeadError::Reset(reason)))) => {
                return Err(Status::bad_gateway(format!(
                    "the agent of account {account:?} could not complete the request: {reason}"
                )));
            }
            Err(_) => {
                drop(guard);
                return Err(Status::timeout(format!(
                    "no answer from the API server of account {account:?} within {} s",
                    RESPONSE_HEAD_TIMEOUT.as_secs()
                )));
            }
        };
        let status = StatusCode::from_u16(u16::try_from(head.status).unwrap_or(502))
            .unwrap_or(StatusCode::BAD_GATEWAY);
        if status == StatusCode::SWITCHING_PROTOCOLS
            && let Some(on_upgrade) = upgrade.take()
        {
            let mut response = Response::new(Body::empty());
            *response.status_mut() = status;
            *response.headers_mut() = headers::switching_headers(&head.headers);
            let pump = Upgraded {
                events,
                unconsumed,
                credit: request_credit,
                window: u64::from(window),
                guard,
            };
            tokio::spawn(pump.run(on_upgrade).in_current_span());
            return Ok(response);
        }
        let mut response = if head.end_of_body {
            drop(guard);
            Response::new(Body::empty())
        } else {
            Response::new(Body::from_stream(response_body(
                events,
                unconsumed,
                u64::from(window),
                guard,
                proxy.metrics.bytes.clone(),
            )))
        };
        *response.status_mut() = status;
        *response.headers_mut() = headers::response_headers(&head.headers);
        return Ok(response);
    }
}

/// An upgraded connection (exec, attach, port-forward) carried by an exchange: the client's
/// bytes go to the agent within its credit, the agent's to the client, returning credit as
/// they are written.
struct Upgraded {
    events: tokio::sync::mpsc::UnboundedReceiver<BodyEvent>,
    unconsumed: Arc<AtomicU64>,
    credit: Arc<tokio::sync::Semaphore>,
    window: u64,
    guard: ExchangeGuard,
}

impl Upgraded {
    async fn run(self, on_upgrade: hyper::upgrade::OnUpgrade) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let Upgraded {
            mut events,
            unconsumed,
            credit,
            window,
            guard,
        } = self;
        let io = match on_upgrade.await {
            Ok(upgraded) => hyper_util::rt::TokioIo::new(upgraded),
            Err(error) => {
                tracing::debug!(%error, "the client's connection did not upgrade");
                return;
            }
        };
        let (mut from_client, mut to_client) = tokio::io::split(io);
        let (id, tx) = (guard.id, guard.tx.clone());
        // Client to agent, never beyond the agent's credit.
        let upstream = tokio::spawn(async move {
            let mut buf = vec![0u8; tunnel::MAX_FRAME_BYTES];
            loop {
                // A read error ends the client's side like an end of stream.
                let n: usize = from_client.read(&mut buf).await.unwrap_or_default();
                if n > 0 {
                    let Ok(permits) = credit.acquire_many(n as u32).await else {
                        return;
                    };
                    permits.forget();
                }
                let frame = Frame::Data(pb::TunnelData {
                    data: buf[..n].to_vec(),
                    end_of_body: n == 0,
                });
                if !tunnel::send_frame(&tx, id, frame).await || n == 0 {
                    return;
                }
            }
        });
        // Agent to client; the connection ends when the API server's side does.
        let mut consumed = 0u64;
        while let Some(event) = events.recv().await {
            match event {
                BodyEvent::Data(bytes) => {
                    if to_client.write_all(&bytes).await.is_err() {
                        break;
                    }
                    consumed += bytes.len() as u64;
                    if consumed >= window / 4 {
                        unconsumed.fetch_sub(consumed, Ordering::AcqRel);
                        let update =
                            Frame::WindowUpdate(u32::try_from(consumed).unwrap_or(u32::MAX));
                        consumed = 0;
                        if !tunnel::send_frame(&guard.tx, guard.id, update).await {
                            break;
                        }
                    }
                }
                BodyEvent::End | BodyEvent::Failed(_) => break,
            }
        }
        let _ = to_client.shutdown().await;
        upstream.abort();
        // Dropping the guard resets the exchange if the agent's side is still open.
        drop(guard);
    }
}

/// Methods whose request may carry a body; their requests are never resent.
fn headers_carry_body(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Ends an exchange the client abandoned: dropped with the handler or the response body,
/// it tells the agent to stop unless the exchange already finished.
struct ExchangeGuard {
    tunnels: Arc<Tunnels>,
    id: u64,
    tx: AgentSender,
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

/// A discovery, version or OpenAPI request: from the cache when it can, else through the
/// tunnel, keeping the answer.
async fn discovery_request(
    proxy: &Proxy,
    account: &str,
    path_and_query: &str,
    request: Request,
) -> Result<(Response, Served), Status> {
    let key = discovery::Key::new(path_and_query, request.headers());
    let client_etag = request
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut headers = request.headers().clone();
    let cached = match proxy.state.discovery.lookup(account, &key, Instant::now()) {
        discovery::Lookup::Fresh(document) => {
            return Ok((
                document_response(&document, client_etag.as_deref(), "hit"),
                Served::Cache,
            ));
        }
        discovery::Lookup::Revalidate(document) => {
            if let Some(etag) = document
                .etag
                .as_deref()
                .and_then(|e| HeaderValue::from_str(e).ok())
            {
                headers.insert(header::IF_NONE_MATCH, etag);
            }
            Some(document)
        }
        discovery::Lookup::Miss => {
            // The client's own If-None-Match would turn our fetch into a 304 we cannot keep.
            headers.remove(header::IF_NONE_MATCH);
            None
        }
    };
    let response = match forward(
        proxy,
        account,
        &Method::GET,
        path_and_query,
        &headers,
        None,
        Exchange::default(),
    )
    .await
    {
        Ok(response) => response,
        Err(status) if status.code() == 503 => {
            // No agent: the last document the cluster gave still describes its kinds best,
            // and with it kubectl gets as far as the request itself, whose error says why.
            return match proxy.state.discovery.last_known(account, &key) {
                Some(document) => Ok((
                    document_response(&document, client_etag.as_deref(), "stale"),
                    Served::Cache,
                )),
                None => Err(status),
            };
        }
        Err(status) => return Err(status),
    };
    if response.status() == StatusCode::NOT_MODIFIED
        && let Some(document) = cached
    {
        proxy
            .state
            .discovery
            .revalidated(account, &key, Instant::now());
        return Ok((
            document_response(&document, client_etag.as_deref(), "revalidated"),
            Served::Tunnel,
        ));
    }
    if response.status() != StatusCode::OK {
        return Ok((response, Served::Tunnel));
    }
    let (parts, body) = response.into_parts();
    let mut chunks = Vec::new();
    let mut size = 0usize;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            Status::bad_gateway(format!(
                "the agent of account {account:?} failed in the middle of {path_and_query}: {e}"
            ))
        })?;
        size += chunk.len();
        chunks.push(chunk);
        if size > discovery::MAX_ENTRY_BYTES {
            // Too big to keep: hand on what arrived and the rest as it comes.
            let head = futures::stream::iter(chunks.into_iter().map(Ok::<_, axum::Error>));
            let body = Body::from_stream(head.chain(stream));
            return Ok((Response::from_parts(parts, body), Served::Tunnel));
        }
    }
    let mut body = Vec::with_capacity(size);
    for chunk in &chunks {
        body.extend_from_slice(chunk);
    }
    let document = discovery::Document {
        headers: parts
            .headers
            .iter()
            .filter(|(name, _)| discovery::KEPT_HEADERS.contains(&name.as_str()))
            .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
            .collect(),
        etag: parts
            .headers
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        body: Bytes::from(body),
    };
    proxy
        .state
        .discovery
        .store(account, key, document.clone(), Instant::now());
    Ok((
        document_response(&document, client_etag.as_deref(), "miss"),
        Served::Tunnel,
    ))
}

fn document_response(
    document: &discovery::Document,
    client_etag: Option<&str>,
    cache: &'static str,
) -> Response {
    let not_modified = client_etag.is_some_and(|sent| {
        document
            .etag
            .as_deref()
            .is_some_and(|etag| sent.split(',').any(|e| e.trim() == etag))
    });
    let mut response = if not_modified {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        Response::new(Body::from(document.body.clone()))
    };
    for (name, value) in &document.headers {
        if not_modified && name != "etag" && name != "cache-control" {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
        .headers_mut()
        .insert(CACHE_HEADER, HeaderValue::from_static(cache));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_paths_keep_the_api_path_as_sent() {
        assert_eq!(split_path("/clusters/prod"), Some(("prod", "/")));
        assert_eq!(split_path("/clusters/prod/"), Some(("prod", "/")));
        assert_eq!(
            split_path("/clusters/prod/api/v1/namespaces/a%2Fb/pods"),
            Some(("prod", "/api/v1/namespaces/a%2Fb/pods"))
        );
        assert_eq!(split_path("/api/v1"), None);
    }

    #[test]
    fn long_running_requests() {
        let get = Method::GET;
        assert!(is_long_running(
            &get,
            "/api/v1/pods",
            Some("watch=true&resourceVersion=5")
        ));
        assert!(is_long_running(&get, "/api/v1/pods", Some("watch=1")));
        assert!(is_long_running(
            &get,
            "/api/v1/namespaces/x/pods/p/log",
            Some("follow=true")
        ));
        assert!(is_long_running(&get, "/api/v1/watch/pods", None));
        assert!(!is_long_running(&get, "/api/v1/pods", Some("limit=500")));
        assert!(!is_long_running(
            &get,
            "/api/v1/namespaces/x/pods/p/log",
            None
        ));
        assert!(!is_long_running(
            &Method::POST,
            "/api/v1/pods",
            Some("watch=true")
        ));
    }
}
