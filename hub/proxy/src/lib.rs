//! `scale-agent-hub-proxy` (layer 4): the Kubernetes API proxy,
//! `https://<hub>/clusters/<account>/<any Kubernetes API path>`, and nothing else.
//!
//! A kubeconfig whose `server:` is `https://<hub>/clusters/<account>` makes kubectl,
//! client-go, Helm and Clouddriver (which only runs kubectl) reach the account's cluster
//! through the hub. Each request needs a bearer token issued for that account
//! ([`scale_agent_hub_auth::tokens`]); it is carried to a connected agent of the account as
//! one exchange on the agent's existing stream ([`scale_agent_hub_state::tunnel`]) and
//! replayed there against the API server with the agent's own credentials; upgrades (exec,
//! attach, port-forward) carry the connection's bytes after the API server's 101. Discovery
//! and OpenAPI documents are answered from a per-account cache ([`discovery`]), LIST, GET and
//! WATCH of the kinds the agents stream from the hub's cache ([`cached`]). Every error the
//! hub makes itself is a Kubernetes `Status` ([`status`]).
//!
//! This file is the entry: the routes, authentication, and which answer a request gets
//! (another replica, the discovery documents, the cache, an agent). The rest, by job:
//! - `forward`: one exchange with an agent (pick a replica, send, await the head, retry
//!   elsewhere, stream the body);
//! - `upgrade`: an upgraded connection's bytes both ways after the API server's 101;
//! - `discovery_request`: discovery and OpenAPI requests through [`discovery`]'s documents;
//! - [`cached`]: LIST, GET and WATCH answered from the cache;
//! - [`audit`]: the audit line of every request (reads as `--proxy-audit-reads` says);
//! - [`caller`]: who called, carried to the agent (and to the account's owner replica);
//! - [`path`]: the refusal of paths that are not canonical (`.`, `..`, encoded `/` or `.`);
//! - [`ProxyState`] (what the proxy keeps between requests), its [`events`] from the live
//!   state, and [`ProxyMetrics`].
//!
//! Layer L4: depends on the model, net, cache, state, auth, store (the commit queue's
//! health, for [`degraded`]) and replicas crates, and on no
//! crate of the hub above them (nor on the gRPC service beside it). The routes are built from
//! a [`Proxy`], the handles they work with (the live state, the credentials, the replicas,
//! [`ProxyState`], [`ProxyMetrics`] and the shutdown signal), which the hub makes from its
//! own; the live state tells the proxy's caches of changes through
//! [`CacheEvents`](scale_agent_hub_state::CacheEvents), which [`ProxyState`] implements.

pub mod audit;
pub mod cached;
pub mod caller;
pub mod degraded;
pub mod discovery;
mod discovery_request;
pub mod events;
mod forward;
mod metrics;
pub mod path;
mod revocation;
pub mod secrets;
mod state;
mod upgrade;
pub use scale_agent_hub_net::{headers, status};

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, header},
    response::{IntoResponse, Response},
    routing::any,
};
use scale_agent_hub_auth::{
    AuthBook,
    credential_sessions::{self, Lease},
};
use scale_agent_hub_model::auth::ProxyCaller;
use scale_agent_hub_replicas::Replicas;
use scale_agent_hub_state::Live;

use self::{
    discovery_request::discovery_request,
    forward::{Exchange, forward},
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
/// Response header naming the request's audit id: the API server's own (which is the hub's
/// request id, the agent sends it) or, for the hub's own answers, the hub's request id.
pub const AUDIT_ID_HEADER: &str = "audit-id";

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
    /// The store's commit queue, whose health says whether the cache still advances
    /// ([`degraded`]).
    pub commits: Arc<scale_agent_hub_store::writer::Commits>,
    /// Which reads get an audit line (`--proxy-audit-reads`); writes always do.
    pub audit_reads: audit::AuditReads,
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
    /// Another replica of the hub, which owns the account ([`scale_agent_hub_replicas::owners::forward`]).
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
async fn handle(State(proxy): State<Arc<Proxy>>, mut request: Request) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let discovery_path = split_path(request.uri().path())
        .is_some_and(|(_, path)| discovery::is_discovery(&method, path));
    let upgrade = headers::is_upgrade(request.headers());
    // Replicas sharing a store: a token issued through another replica is looked up there
    // before it is judged (and named in the audit).
    scale_agent_hub_replicas::sync::learn_bearer(&proxy.replicas, &proxy.auth, request.headers())
        .await;
    // A watch, log follow or upgraded connection holds its token open until it ends, so
    // that revoking the token ends it (F17); taken before authentication, which then
    // refuses a token revoked in between.
    let long_running = upgrade
        || split_path(request.uri().path())
            .is_some_and(|(_, path)| is_long_running(&method, path, request.uri().query()));
    let lease = long_running
        .then(|| revocation::lease(&proxy.auth, request.headers()))
        .flatten();
    if let Some(lease) = &lease {
        request.extensions_mut().insert(lease.clone());
    }
    // A request another replica forwarded keeps the caller and request id it had there.
    let (forwarded_caller, forwarded_id) = caller::take_forwarded(&mut request);
    let request_id = forwarded_id.unwrap_or_else(audit::request_id);
    let (account, path) = split_path(request.uri().path())
        .map(|(account, api_path)| {
            let path = match request.uri().query() {
                Some(query) => format!("{api_path}?{query}"),
                None => api_path.to_string(),
            };
            (account.to_string(), path)
        })
        .unwrap_or_default();
    // Who a refused request's line names: the token's name when it is valid (for another
    // account), the forwarding replica's caller on the owner.
    let token_name = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(scale_agent_hub_auth::tokens::bearer)
        .and_then(|token| proxy.auth.tokens().verify(token).map(|r| r.name.clone()));
    let forwarded_who = request
        .extensions()
        .get::<scale_agent_hub_model::auth::Caller>()
        .map(|c| c.name.clone());
    let mut caller = forwarded_caller;
    // Revoked before its answer began (a tunnelled watch waits for the agent's response
    // head; a read waits for the cache): refused as the next request would be. After it
    // began, the body ends instead (below).
    let mut revoked_before_answer = false;
    let answered = tokio::select! {
        biased;
        answer = answer(&proxy, request, &request_id, &mut caller) => answer,
        () = credential_sessions::revoked(lease.clone()) => {
            revoked_before_answer = true;
            Err(Status::unauthorized(
                "the token was revoked while the request waited for its answer",
            ))
        }
    };
    let (response, served) = match answered {
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
    let mut response = match lease {
        // An upgrade's bytes are carried elsewhere, with a clone of the lease; the refusal
        // of a request revoked before its answer is sent whole.
        Some(lease) if !upgrade && !revoked_before_answer => {
            response.map(|body| Body::new(revocation::EndsOnRevocation::new(body, lease)))
        }
        _ => response,
    };
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
    // The API server's own answers carry it already (the id the agent sent); the hub's
    // answers name the audit line the same way.
    if !response.headers().contains_key(AUDIT_ID_HEADER)
        && let Ok(id) = HeaderValue::from_str(&request_id)
    {
        response.headers_mut().insert(AUDIT_ID_HEADER, id);
    }
    if proxy.replicas.forwarder.is_some()
        && !response
            .headers()
            .contains_key(scale_agent_hub_replicas::owners::forward::REPLICA_HEADER)
        && let Ok(replica) = HeaderValue::from_str(proxy.replicas.id())
    {
        response.headers_mut().insert(
            scale_agent_hub_replicas::owners::forward::REPLICA_HEADER,
            replica,
        );
    }
    proxy.metrics.request(
        &method,
        served.as_str(),
        response.status().as_u16(),
        started.elapsed(),
    );
    let sampled = if audit::is_proxy_write(&method, upgrade) {
        Some(1)
    } else {
        proxy.audit_reads.read_line(&proxy.state.audited_reads)
    };
    let Some(sampled) = sampled else {
        return response;
    };
    let line = audit::ProxyRequest {
        request_id,
        who: caller
            .as_ref()
            .map(|c| c.user.clone())
            .or(forwarded_who)
            .or(token_name),
        person: caller.as_ref().is_some_and(|c| c.person),
        account,
        method,
        path,
        upgrade,
        sampled,
        started,
    };
    let code = response.status().as_u16();
    // The line is written when the body ends (or the client leaves): its bytes and the
    // whole duration of a watch or a download.
    response.map(|body| Body::new(audit::AuditedBody::new(body, line, code, served.as_str())))
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

/// Who presents the request's bearer token, if it opens `account`: a token the hub issued
/// for the account (not expired), or an OIDC ID token whose user or groups `--oidc-access`
/// admits to it. The refusal is the `Status` kubectl prints.
async fn authenticate(
    auth: &AuthBook,
    headers: &HeaderMap,
    account: &str,
) -> Result<ProxyCaller, Status> {
    let get_one =
        format!("get a kubeconfig for it with `scale-agent-hub kubeconfig --account {account}`");
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(Status::unauthorized(format!(
            "the Scale Agent hub needs a bearer token for account {account:?}: {get_one}"
        )));
    };
    let Some(token) = value
        .to_str()
        .ok()
        .and_then(scale_agent_hub_auth::tokens::bearer)
    else {
        return Err(Status::unauthorized(format!(
            "the Authorization header must be `Bearer <token>`: {get_one}"
        )));
    };
    if scale_agent_hub_auth::oidc::looks_like_jwt(token) {
        return authenticate_oidc(auth, token, account).await;
    }
    let record = auth.tokens().verify(token).cloned();
    match record {
        None => Err(Status::unauthorized(format!(
            // troubleshooting: proxy: HTTP 401
            // The kubeconfig's token was revoked, rotated, or comes from another hub. Get a new
            // kubeconfig: `scale-agent-hub kubeconfig --account <account>`.
            "the token is not valid here (unknown, revoked, or issued by another hub): {get_one}"
        ))),
        Some(record) if record.account != account => Err(Status::forbidden(format!(
            "this token belongs to account {:?} and cannot reach account {account:?}",
            record.account
        ))),
        Some(record) if record.expired_at(jiff::Timestamp::now().as_second()) => Err(
            Status::unauthorized(scale_agent_hub_auth::tokens::expired_message(
                &record,
                &format!(
                    "get a new one with `scale-agent-hub kubeconfig --account {account} \
                     --token-name {}`, or write an exec-plugin kubeconfig (`scale-agent-hub \
                     kubeconfig --exec`) that fetches fresh tokens itself",
                    record.name
                ),
            )),
        ),
        Some(record) => Ok(ProxyCaller {
            person: record.name != scale_agent_hub_auth::tokens::CLOUDDRIVER_TOKEN,
            user: record.name,
            groups: Vec::new(),
        }),
    }
}

/// An OIDC ID token: verified against its issuer's keys, then admitted to `account` by the
/// access rules.
async fn authenticate_oidc(
    auth: &AuthBook,
    token: &str,
    account: &str,
) -> Result<ProxyCaller, Status> {
    let Some(oidc) = auth.oidc() else {
        return Err(Status::unauthorized(
            "this hub accepts no OIDC ID tokens: start it with --authentication-config \
             naming the issuer, or use a token the hub issued (`scale-agent-hub kubeconfig`)",
        ));
    };
    let person = oidc
        .authenticate(token)
        .await
        .map_err(|e| Status::unauthorized(format!("the OIDC ID token is refused: {e}")))?;
    match oidc.access().admits(&person, account) {
        Ok(()) => Ok(ProxyCaller {
            user: person.user,
            groups: person.groups,
            person: true,
        }),
        Err(reason) => Err(Status::forbidden(reason)),
    }
}

/// Answers a request: from another replica that owns the account, the discovery cache, the
/// cache, or an agent; `Err` is the hub's own refusal. `caller` is who called: set here once
/// authenticated (already set for a request another replica forwarded); `request_id` goes
/// to the agent for the target's audit log.
async fn answer(
    proxy: &Arc<Proxy>,
    mut request: Request,
    request_id: &str,
    caller: &mut Option<ProxyCaller>,
) -> Result<(Response, Served), Status> {
    let (account, api_path) = split_path(request.uri().path())
        .map(|(a, p)| (a.to_string(), p.to_string()))
        .ok_or_else(|| Status::not_found("not a proxy path: use /clusters/<account>/..."))?;
    let api_path = api_path.as_str();
    scale_agent_hub_model::names::validate_account_name(&account).map_err(Status::not_found)?;
    // A request another replica forwarded was authenticated there.
    if request
        .extensions()
        .get::<scale_agent_hub_replicas::owners::forward::Forwarded>()
        .is_none()
    {
        *caller = Some(authenticate(&proxy.auth, request.headers(), &account).await?);
    }
    // Before anything matches the path (discovery, the cache, the Secret guard) or sends it
    // on: a path something downstream would resolve differently is refused (the caller is
    // known by now, so the audit line names who sent it).
    path::check_canonical(&account, api_path)?;
    // The account's agents stream to its owner, which also keeps its cache: everything,
    // cached reads included, is served there.
    if let Some(owner) = proxy
        .replicas
        .owner_elsewhere(&proxy.live, &account, request.extensions())
        .await
        && proxy.replicas.forwarder.is_some()
    {
        let ends_cleanly = is_long_running(request.method(), api_path, request.uri().query());
        let mut request = request;
        caller::put_for_owner(&mut request, caller.as_ref(), request_id);
        let response = proxy
            .replicas
            .forward(&owner, &account, None, request, ends_cleanly)
            .await?;
        return Ok((response, Served::Owner));
    }
    if !proxy.live.registry_read().accounts.contains_key(&account) {
        return Err(Status::not_found(format!(
            "account {account:?} is not known to this hub: no agent has registered it (or it \
             was removed after its grace period); check the agents with GET /api/v1/agents"
        )));
    }
    // A person on an account that impersonates its callers reads what the target's RBAC
    // lets them: the cache, which holds what the agent sees, does not answer them.
    let as_person =
        caller.as_ref().is_some_and(|c| c.person) && caller::impersonates_callers(proxy, &account);
    // Secret data stays home unless the account opted in.
    if let Some(response) = secrets::guard(
        proxy,
        &account,
        api_path,
        request.method(),
        request.uri().query(),
        request.headers(),
    )
    .await?
    {
        if as_person {
            return Err(Status::forbidden(format!(
                "account {account:?} keeps Secret data in its cluster, where the hub answers \
                 Secrets from its cache, and impersonates its callers: the cache cannot tell \
                 which Secrets you may see, so Secrets are not served to people on this \
                 account (allowSecretData: true on its AgentAccount sends them to the cluster, \
                 whose RBAC then decides)"
            )));
        }
        return Ok((response, Served::Cache));
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
    let degraded = degraded::Degraded::of(&proxy.live, &proxy.commits, &account);
    if method == Method::GET && !upgrade_requested && !as_person {
        let query = request.uri().query();
        if degraded.is_none()
            && let Some(response) =
                cached::watch::watch(proxy, &account, api_path, query, request.headers()).await
        {
            return Ok((response, Served::Cache));
        }
        if let Some(mut response) = cached::read(
            &proxy.live,
            &proxy.state.cached_reads,
            &account,
            api_path,
            query,
            request.headers(),
        )
        .await
        {
            if let Some(degraded) = &degraded {
                degraded.flag(&account, &mut response, &proxy.metrics);
            }
            return Ok((response, Served::Cache));
        }
    }
    if let Some(degraded) = &degraded
        && audit::is_proxy_write(&method, upgrade_requested)
    {
        return Err(degraded.refuse_write(&account, &proxy.metrics));
    }
    let changes_kinds = discovery::changes_kinds(&method, api_path);
    // exec, attach, port-forward: after the API server's 101 the exchange carries the
    // connection's bytes both ways.
    let upgrade = headers::is_upgrade(request.headers()).then(|| hyper::upgrade::on(&mut request));
    let lease = upgrade
        .as_ref()
        .and_then(|_| request.extensions().get::<Lease>().cloned());
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
            caller: caller.as_ref().map(caller::to_proto),
            audit_id: request_id.to_string(),
            lease,
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
