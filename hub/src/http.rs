//! The HTTP API (axum): agents, accounts, cached objects, health, readiness and metrics; it
//! mounts the admin routes ([`crate::admin_api`]) and the Kubernetes API proxy
//! ([`crate::proxy`]).

use std::{
    collections::BTreeMap,
    sync::{Arc, atomic::Ordering},
};

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, FromRequest as _, Path, Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{
    Hub,
    api_auth::{self, Caller, Role},
    cache::{AccountCache, CachedObject, KindCache, KindInfo, KindState},
    operations::{self, OperationRequest, OperationResponse},
    proxy::cached::selector::LabelSelector,
    registry::{Account, ClusterRecord, Registry, SessionId, StateRecord},
    session::HubState,
};

/// The API's routes, each group behind the role it needs ([`crate::api_auth`]).
pub(crate) fn router(hub: Arc<Hub>) -> Router {
    let max_request_bytes = hub.config.max_request_bytes;
    let role =
        |role: Role| axum::middleware::from_fn_with_state((hub.clone(), role), api_auth::require);
    let metrics_route = Router::new().route("/metrics", get(metrics));
    let metrics_route = if hub.config.metrics_unauthenticated {
        metrics_route
    } else {
        metrics_route.route_layer(role(Role::Reader))
    };
    let reader = Router::new()
        .route("/api/v1/agents", get(agents))
        .route("/api/v1/version", get(version))
        .route("/api/v1/accounts", get(accounts))
        .route("/api/v1/clouddriver", get(clouddriver))
        .merge(account_reads(hub.clone()))
        .route_layer(role(Role::Reader));
    let operator = Router::new()
        .route(
            "/api/v1/accounts/{name}/operations",
            post(submit_operation).layer(DefaultBodyLimit::max(max_request_bytes)),
        )
        .route("/api/v1/operations/{id}", get(operation))
        .merge(account_operations(hub.clone()))
        .route_layer(role(Role::Operator));
    let admin = crate::admin_api::router()
        .merge(crate::agent_admin::router())
        .route_layer(role(Role::Admin));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/readyz/store", get(store_ready))
        .merge(metrics_route)
        .merge(reader)
        .merge(operator)
        .merge(admin)
        .merge(crate::proxy::router())
        .nest(
            crate::owners::forward::INTERNAL_PREFIX,
            internal(hub.clone()),
        )
        .with_state(hub)
}

/// What other replicas forward to this one, the owner of the account
/// ([`crate::owners::forward`]): the Kubernetes API proxy and operations, behind the
/// replicas' secret. A request here is never forwarded again.
fn internal(hub: Arc<Hub>) -> Router<Arc<Hub>> {
    let max_request_bytes = hub.config.max_request_bytes;
    Router::new()
        .route(
            "/api/v1/accounts/{name}/operations",
            post(submit_operation).layer(DefaultBodyLimit::max(max_request_bytes)),
        )
        .route("/api/v1/agents", get(replica_agents))
        .route("/api/v1/accounts", get(replica_accounts))
        .merge(crate::proxy::router())
        .merge(account_reads(hub.clone()))
        .merge(account_operations(hub.clone()))
        .route_layer(axum::middleware::from_fn_with_state(
            hub.replicas.clone(),
            crate::owners::forward::internal_auth,
        ))
}

/// An account and its cached objects: kept by its owner, so asked there when another
/// replica owns it.
fn account_reads(hub: Arc<Hub>) -> Router<Arc<Hub>> {
    Router::new()
        .route("/api/v1/accounts/{name}", get(account))
        .route("/api/v1/accounts/{name}/objects", get(objects))
        .route_layer(axum::middleware::from_fn_with_state(
            (hub.replicas.clone(), hub.live.clone()),
            crate::owners::forward::to_owner,
        ))
}

/// An account's operations: kept by the replica that ran them, its owner.
fn account_operations(hub: Arc<Hub>) -> Router<Arc<Hub>> {
    Router::new()
        .route(
            "/api/v1/accounts/{name}/operations/{id}",
            get(account_operation),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            (hub.replicas.clone(), hub.live.clone()),
            crate::owners::forward::to_owner,
        ))
}

/// The API's error body: `{"error": message}` (in the net crate, beside the other answers the
/// hub's routers share).
pub(crate) use scale_agent_hub_net::http::error;

/// A 413 as a Kubernetes `Status` (reason `RequestEntityTooLarge`, what the API server
/// answers), which also carries the API's usual `error` field for clients that read only it.
fn too_large(message: String) -> Response {
    let status = crate::proxy::status::Status::failure(413, "RequestEntityTooLarge", &message);
    let mut body = serde_json::to_value(&status).unwrap_or_else(|_| json!({}));
    body["error"] = json!(message);
    (StatusCode::PAYLOAD_TOO_LARGE, Json(body)).into_response()
}

async fn submit_operation(
    State(hub): State<Arc<Hub>>,
    Path(name): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
    request: axum::extract::Request,
) -> Response {
    let started = std::time::Instant::now();
    // Operations run where the account's agents stream: on its owner.
    if let Some(owner) = hub
        .replicas
        .owner_elsewhere(&hub.live, &name, request.extensions())
        .await
        && let Some(forwarder) = &hub.replicas.forwarder
    {
        let answer = forwarder
            .send(&owner, Some(&caller.name), request, false)
            .await
            .unwrap_or_else(IntoResponse::into_response);
        let subject = crate::audit::OperationSubject::of(None);
        crate::audit::operation(
            &caller,
            &name,
            &subject,
            answer.status().as_u16(),
            started.elapsed(),
        );
        return answer;
    }
    let body = axum::body::Bytes::from_request(request, &()).await;
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let status = rejection.status();
            let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
                format!(
                    "the operation request is larger than the hub's limit of {} bytes \
                     (--max-request-bytes): split the manifests into several operations, or \
                     raise the limit",
                    hub.config.max_request_bytes
                )
            } else {
                format!("cannot read the operation request: {rejection}")
            };
            let subject = crate::audit::OperationSubject::of(None);
            crate::audit::operation(&caller, &name, &subject, status.as_u16(), started.elapsed());
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                return too_large(message);
            }
            return error(status, message);
        }
    };
    let request: OperationRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let body = OperationResponse::bad_request(format!("invalid operation request: {e}"));
            let subject = crate::audit::OperationSubject::of(None);
            crate::audit::operation(&caller, &name, &subject, 400, started.elapsed());
            return (StatusCode::BAD_REQUEST, Json(body)).into_response();
        }
    };
    let subject = crate::audit::OperationSubject::of(Some(&request));
    // Run apart from the request: a client that goes away does not abandon the operation,
    // which still finishes, is recorded for GET /api/v1/operations/{id}, and is audited.
    let task = tokio::spawn(async move {
        let answer = operations::submit(&hub, &name, request).await;
        crate::audit::operation(&caller, &name, &subject, answer.0, started.elapsed());
        answer
    });
    let (code, body) = match task.await {
        Ok(answer) => answer,
        Err(e) => (
            500,
            OperationResponse::task_failed(format!("the operation task failed: {e}")),
        ),
    };
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(body)).into_response()
}

/// An operation by id alone: a hub-made id, or a client id that one account has.
async fn operation(State(hub): State<Arc<Hub>>, Path(id): Path<String>) -> Response {
    let mut found = hub
        .operations
        .lookup(None, &id, hub.config.operation_retention);
    match found.len() {
        0 => operation_not_found(&hub, &id),
        1 => Json(found.remove(0)).into_response(),
        _ => {
            let accounts: Vec<String> = found.into_iter().filter_map(|b| b.account).collect();
            error(
                StatusCode::CONFLICT,
                format!(
                    "operation id {id:?} is used by several accounts ({}): ids are per account, \
                     so ask GET /api/v1/accounts/{{account}}/operations/{id}",
                    accounts.join(", ")
                ),
            )
        }
    }
}

/// An operation of one account (client ids are per account).
async fn account_operation(
    State(hub): State<Arc<Hub>>,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    let mut found = hub
        .operations
        .lookup(Some(&name), &id, hub.config.operation_retention);
    if found.is_empty() {
        return operation_not_found(&hub, &id);
    }
    Json(found.remove(0)).into_response()
}

fn operation_not_found(hub: &Hub, id: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!(
            "no operation {id:?} (unknown, or finished longer ago than the retention of {:?})",
            hub.config.operation_retention
        ),
    )
}

/// Where each account's registration in Clouddriver stands (empty when registration is off).
async fn clouddriver(
    State(hub): State<Arc<Hub>>,
) -> Json<Vec<crate::clouddriver::RegistrationStatus>> {
    Json(
        hub.registrar
            .as_ref()
            .map(|r| r.status())
            .unwrap_or_default(),
    )
}

/// Ready while the store is open and gRPC listens. A store that cannot commit (a full
/// volume) does not make the hub unready: it still serves every read from memory and keeps
/// the agents' streams (holding their Acks), and taking it out of its Service would stop
/// those reads too. The body says so, and `/readyz/store` fails.
async fn readyz(State(hub): State<Arc<Hub>>) -> Response {
    let store = hub.store_open.load(Ordering::SeqCst);
    let grpc = hub.grpc_listening.load(Ordering::SeqCst);
    if store && grpc {
        match store_failure(&hub) {
            None => (StatusCode::OK, "ready\n").into_response(),
            Some(why) => (StatusCode::OK, format!("ready (degraded: {why})\n")).into_response(),
        }
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: store open {store}, gRPC listening {grpc}\n"),
        )
            .into_response()
    }
}

/// Why the store cannot commit, in words for people; `None` while it commits.
fn store_failure(hub: &Hub) -> Option<String> {
    let health = hub.commits.health();
    health.failure.map(|error| match &hub.config.store {
        crate::store::Backend::Embedded => format!(
            "the store cannot commit in data directory {} ({error}); {} changes are queued and \
             retried, agents' acknowledgements are held until they are committed: free space \
             on that volume or grow it",
            hub.config.data_dir.display(),
            health.queued
        ),
        crate::store::Backend::Postgres(_) => format!(
            "the store cannot commit to PostgreSQL ({error}); {} changes are queued and \
             retried, agents' acknowledgements are held until they are committed: check that \
             PostgreSQL is up, reachable and has space",
            health.queued
        ),
    })
}

/// 200 while the store commits, 503 (with the reason) while it cannot: for alerts and
/// probes that must see a full volume.
async fn store_ready(State(hub): State<Arc<Hub>>) -> Response {
    match store_failure(&hub) {
        None => (StatusCode::OK, "store commits\n").into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn metrics(State(hub): State<Arc<Hub>>) -> Response {
    hub.refresh_gauges();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        hub.metrics.encode(),
    )
        .into_response()
}

pub use scale_agent_hub_model::time::rfc3339;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgentView {
    identity: String,
    replica: String,
    agent_version: String,
    connected_since: String,
    accounts: Vec<AgentAccountView>,
}

#[derive(Serialize)]
struct AgentAccountView {
    name: String,
    role: &'static str,
}

/// The hub's version (the agents' are in `/api/v1/agents`).
async fn version() -> Json<serde_json::Value> {
    Json(json!({ "version": scale_agent_runtime::VERSION }))
}

/// Every agent stream: of every replica when replicas share the store ([`crate::fleet`]),
/// else of this hub.
async fn agents(State(hub): State<Arc<Hub>>) -> Response {
    if hub.replicas.shared.is_some() && hub.replicas.forwarder.is_some() {
        return Json(crate::fleet::agents(&hub).await).into_response();
    }
    Json(local_agents(&hub)).into_response()
}

/// This replica's agent streams (what the others ask for [`crate::fleet`]).
async fn replica_agents(State(hub): State<Arc<Hub>>) -> Json<Vec<AgentView>> {
    Json(local_agents(&hub))
}

/// The agent streams connected to this replica.
pub(crate) fn local_agents(hub: &Hub) -> Vec<AgentView> {
    let st = hub.state();
    st.registry
        .sessions
        .values()
        .map(|s| AgentView {
            identity: s.identity.clone(),
            replica: s.replica.clone(),
            agent_version: s.agent_version.clone(),
            connected_since: rfc3339(s.connected_since),
            accounts: st
                .registry
                .accounts_of(s.id)
                .into_iter()
                .map(|(name, role)| AgentAccountView {
                    name,
                    role: role.as_str(),
                })
                .collect(),
        })
        .collect()
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReplicaView {
    identity: String,
    replica: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResumePointView {
    watch_namespace: String,
    resource_version: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KindView {
    group: String,
    version: String,
    kind: String,
    plural: String,
    namespaced: bool,
    objects: usize,
    /// WATCHING, FORBIDDEN, FAILING, STOPPED; null when the agent has not reported it. With
    /// several scopes, the one that most needs attention (FORBIDDEN/FAILING first).
    /// OVER_QUOTA (the hub's own) while the kind is left out of the cache for
    /// `--max-objects-per-account`.
    state: Option<String>,
    message: String,
    namespaces: Vec<String>,
    /// Every scope's own state (namespaces empty: cluster-wide).
    scopes: Vec<KindState>,
    resume_points: Vec<ResumePointView>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AccountView {
    name: String,
    cluster: ClusterRecord,
    namespaces: Vec<String>,
    properties: Value,
    /// "connected" or "disconnected".
    state: &'static str,
    /// ACTIVE, INACTIVE, FAILED or ORPHANED; null until the hub first observed the account.
    account_state: Option<&'static str>,
    /// Why the account entered `accountState`.
    state_reason: String,
    /// When it did (RFC 3339).
    state_since: Option<String>,
    disconnected_since: Option<String>,
    streaming: Option<ReplicaView>,
    standbys: Vec<ReplicaView>,
    objects: usize,
    object_counts: BTreeMap<String, usize>,
    kinds: Vec<KindView>,
}

fn replica(registry: &Registry, id: SessionId) -> Option<ReplicaView> {
    registry.sessions.get(&id).map(|s| ReplicaView {
        identity: s.identity.clone(),
        replica: s.replica.clone(),
    })
}

fn kind_view(k: &KindCache) -> KindView {
    KindView {
        group: k.info.group.clone(),
        version: k.info.version.clone(),
        kind: k.info.kind.clone(),
        plural: k.info.plural.clone(),
        namespaced: k.info.namespaced,
        objects: k.objects.len(),
        state: match &k.over_quota {
            Some(_) => Some("OVER_QUOTA".to_string()),
            None => k.summary_status().map(|s| s.state.clone()),
        },
        message: match &k.over_quota {
            Some(reason) => reason.clone(),
            None => k
                .summary_status()
                .map(|s| s.message.clone())
                .unwrap_or_default(),
        },
        namespaces: k
            .summary_status()
            .map(|s| s.namespaces.clone())
            .unwrap_or_default(),
        scopes: k.statuses.values().cloned().collect(),
        resume_points: k
            .resume
            .iter()
            .map(|(ns, rv)| ResumePointView {
                watch_namespace: ns.clone(),
                resource_version: rv.clone(),
            })
            .collect(),
    }
}

fn account_view(
    registry: &Registry,
    name: &str,
    a: &Account,
    cache: Option<&AccountCache>,
) -> AccountView {
    let connected = a.streaming.is_some() || !a.standbys.is_empty();
    let kinds: Vec<&KindCache> = cache
        .map(|c| c.kinds.values().collect())
        .unwrap_or_default();
    let lifecycle = registry.states.get(name);
    AccountView {
        name: name.to_string(),
        cluster: a.record.cluster.clone(),
        namespaces: a.record.namespaces.clone(),
        properties: a.record.properties.clone(),
        state: if connected {
            "connected"
        } else {
            "disconnected"
        },
        account_state: lifecycle.map(|l| l.state.as_str()),
        state_reason: lifecycle.map(|l| l.reason.clone()).unwrap_or_default(),
        state_since: lifecycle.map(|l| rfc3339(l.since)),
        disconnected_since: a.disconnected_since.map(|(_, t)| rfc3339(t)),
        streaming: a.streaming.and_then(|id| replica(registry, id)),
        standbys: a
            .standbys
            .iter()
            .filter_map(|id| replica(registry, *id))
            .collect(),
        objects: kinds.iter().map(|k| k.objects.len()).sum(),
        object_counts: kinds
            .iter()
            .map(|k| (k.info.key().to_string(), k.objects.len()))
            .collect(),
        kinds: kinds.into_iter().map(kind_view).collect(),
    }
}

/// An account the hub keeps a state for but no record (ORPHANED, or FAILED for a name it
/// never accepted): the last cluster known, no replicas, no objects.
fn stateless_view(name: &str, lifecycle: &StateRecord) -> AccountView {
    let cluster = lifecycle.cluster.clone().unwrap_or(ClusterRecord {
        api_server_host: String::new(),
        ca_fingerprint: String::new(),
        kubernetes_version: String::new(),
    });
    let mut view = agentless_view(name, cluster, lifecycle.state, lifecycle.reason.clone());
    view.state_since = Some(rfc3339(lifecycle.since));
    view
}

/// An account no agent serves here: `cluster`, `state` for `reason`, nothing else.
fn agentless_view(
    name: &str,
    cluster: ClusterRecord,
    state: crate::registry::AccountState,
    reason: String,
) -> AccountView {
    AccountView {
        name: name.to_string(),
        cluster,
        namespaces: Vec::new(),
        properties: Value::Null,
        state: "disconnected",
        account_state: Some(state.as_str()),
        state_reason: reason,
        state_since: None,
        disconnected_since: None,
        streaming: None,
        standbys: Vec::new(),
        objects: 0,
        object_counts: BTreeMap::new(),
        kinds: Vec::new(),
    }
}

fn view_of(st: &HubState, name: &str) -> Option<AccountView> {
    match st.registry.accounts.get(name) {
        Some(a) => Some(account_view(
            &st.registry,
            name,
            a,
            st.cache.accounts.get(name),
        )),
        None => st
            .registry
            .states
            .get(name)
            .map(|l| stateless_view(name, l)),
    }
}

/// Every account the hub has a record or a state for (ORPHANED and FAILED ones included):
/// of every replica, with its owner, when replicas share the store ([`crate::fleet`]).
async fn accounts(State(hub): State<Arc<Hub>>) -> Response {
    if hub.replicas.shared.is_some() && hub.replicas.forwarder.is_some() {
        return match crate::fleet::accounts(&hub).await {
            Ok(list) => Json(list).into_response(),
            Err(e) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "cannot read the accounts from the shared store: {}",
                    crate::error::Chain(&e)
                ),
            ),
        };
    }
    Json(local_accounts(&hub)).into_response()
}

/// This replica's view of the accounts (what the others ask for [`crate::fleet`]).
async fn replica_accounts(State(hub): State<Arc<Hub>>) -> Json<Vec<AccountView>> {
    Json(local_accounts(&hub))
}

/// The accounts this replica has a record or a state for.
pub(crate) fn local_accounts(hub: &Hub) -> Vec<AccountView> {
    let st = hub.state();
    let mut names: Vec<&String> = st
        .registry
        .accounts
        .keys()
        .chain(st.registry.states.keys())
        .collect();
    names.sort();
    names.dedup();
    names.into_iter().filter_map(|n| view_of(&st, n)).collect()
}

/// An account the shared store holds and no replica serves: its stored record, no agent.
pub(crate) fn stored_view(name: &str, record: &crate::registry::AccountRecord) -> AccountView {
    let mut view = agentless_view(
        name,
        record.cluster.clone(),
        crate::registry::AccountState::Inactive,
        "no agent serves it on any replica; its cache is kept in the shared store until the \
         grace period ends"
            .into(),
    );
    view.namespaces = record.namespaces.clone();
    view.properties = record.properties.clone();
    view
}

async fn account(State(hub): State<Arc<Hub>>, Path(name): Path<String>) -> Response {
    let st = hub.state();
    match view_of(&st, &name) {
        Some(view) => Json(view).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no account {name:?}")),
    }
}

/// Query of the objects endpoint.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectQuery {
    /// Kind or plural, case-insensitive, optionally `group/`-qualified (`core/` for the
    /// core group).
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub label_selector: Option<String>,
    /// Most objects to look at for this page (0 or absent: all). The label selector is
    /// applied to them, so a page may hold fewer items than `limit` and still have a
    /// `continue` token.
    pub limit: Option<usize>,
    /// The `continue` token of the previous page.
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
}

/// Objects copied out of the state lock per critical section when no `limit` is given: a
/// read of a large account takes the lock many times, briefly, rather than once for long.
const OBJECTS_CHUNK: usize = 1000;
/// Most objects in one page, whatever `limit` asks: the rest comes with `continue`.
const MAX_OBJECTS_PAGE: usize = 10_000;

/// Where a page of objects ends: the kind and uid of its last object (objects are listed by
/// kind, then uid).
type Cursor = (crate::cache::KindKey, String);

fn encode_cursor((kind, uid): &Cursor) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(format!("{}\0{uid}", kind.storage_key()))
}

fn decode_cursor(token: &str) -> Option<Cursor> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (kind, uid) = text.split_once('\0')?;
    Some((
        crate::cache::KindKey::from_storage_key(kind)?,
        uid.to_string(),
    ))
}

/// One page of objects, selected by kind and namespace (labels are left for after the
/// lock): the kinds, (kind index, object) pairs, and whether objects remain after them.
struct Page {
    kinds: Vec<KindInfo>,
    objects: Vec<(usize, Arc<CachedObject>)>,
    next: Option<Cursor>,
}

/// Up to `max` objects after `after`, under the state lock: pointers only, so the lock is
/// held for a walk of at most `max` objects.
fn objects_page(
    hub: &Hub,
    name: &str,
    q: &ObjectQuery,
    after: Option<&Cursor>,
    max: usize,
) -> Result<Page, Box<Response>> {
    use std::ops::Bound;
    let st = hub.state();
    if !st.registry.accounts.contains_key(name) {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            format!("no account {name:?}"),
        )));
    }
    let empty = AccountCache::default();
    let cache = st.cache.accounts.get(name).unwrap_or(&empty);
    let matching = |k: &KindCache| q.kind.as_deref().is_none_or(|query| kind_matches(query, k));
    if let Some(query) = &q.kind
        && !cache.kinds.values().any(matching)
    {
        let known: Vec<String> = cache.kinds.keys().map(ToString::to_string).collect();
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            format!(
                "account {name:?} has no cached kind matching {query:?}; cached kinds: [{}]",
                known.join(", ")
            ),
        )));
    }
    let mut page = Page {
        kinds: Vec::new(),
        objects: Vec::new(),
        next: None,
    };
    let start = after.map_or(Bound::Unbounded, |(kind, _)| Bound::Included(kind));
    for (key, k) in cache.kinds.range((start, Bound::Unbounded)) {
        if !matching(k) {
            continue;
        }
        let from = match after {
            Some((kind, uid)) if kind == key => Bound::Excluded(uid.clone()),
            _ => Bound::Unbounded,
        };
        let mut index = None;
        for (uid, o) in k.objects.range((from, Bound::Unbounded)) {
            if q.namespace.as_deref().is_some_and(|ns| ns != o.namespace) {
                continue;
            }
            if page.objects.len() == max {
                page.next = page
                    .objects
                    .last()
                    .map(|(i, o)| (page.kinds[*i].key(), o.uid.clone()));
                return Ok(page);
            }
            let i = *index.get_or_insert_with(|| {
                page.kinds.push(k.info.clone());
                page.kinds.len() - 1
            });
            debug_assert_eq!(uid, &o.uid);
            page.objects.push((i, o.clone()));
        }
    }
    Ok(page)
}

/// Whether a kind matches the `kind` parameter.
pub fn kind_matches(query: &str, k: &KindCache) -> bool {
    let (group, name) = match query.split_once('/') {
        Some((g, n)) => (Some(g), n),
        None => (None, query),
    };
    let group_ok = group.is_none_or(|g| {
        g.eq_ignore_ascii_case(&k.info.group)
            || (g.eq_ignore_ascii_case("core") && k.info.group.is_empty())
    });
    group_ok
        && (name.eq_ignore_ascii_case(&k.info.kind) || name.eq_ignore_ascii_case(&k.info.plural))
}

/// The REST API's `labelSelector`, parsed as the proxy parses it (the API server's rules): the
/// error says what was refused.
fn label_selector(text: &str) -> Result<LabelSelector, String> {
    LabelSelector::parse(text).ok_or_else(|| {
        format!(
            "invalid label selector {text:?}: write it as the API server takes it (`app=web`, \
             `tier!=db`, `env in (prod,staging)`, `!legacy`)"
        )
    })
}

fn object_value(kind: &KindInfo, o: &CachedObject) -> Value {
    if o.truncated {
        return json!({
            "apiVersion": kind.api_version(),
            "kind": kind.kind,
            "metadata": {
                "name": o.name,
                "namespace": o.namespace,
                "uid": o.uid,
                "resourceVersion": o.resource_version,
                "annotations": { "scaleagent.dev/truncated": "true" },
            },
        });
    }
    o.json
        .unpack()
        .ok()
        .and_then(|json| serde_json::from_slice(&json).ok())
        .unwrap_or(Value::Null)
}

async fn objects(
    State(hub): State<Arc<Hub>>,
    Path(name): Path<String>,
    Query(q): Query<ObjectQuery>,
) -> Response {
    let selector = match q.label_selector.as_deref().map(label_selector).transpose() {
        Ok(s) => s.unwrap_or_default(),
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let mut after = match q.continue_token.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(token) => match decode_cursor(token) {
            Some(cursor) => Some(cursor),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "invalid continue token {token:?}: pass the `continue` value of the \
                         previous page as it was returned, or start again without it"
                    ),
                );
            }
        },
    };
    let limit = q.limit.filter(|l| *l > 0);
    let mut items: Vec<Value> = Vec::new();
    let next = loop {
        let max = limit.map_or(OBJECTS_CHUNK, |l| l.min(MAX_OBJECTS_PAGE));
        let page = match objects_page(&hub, &name, &q, after.as_ref(), max) {
            Ok(page) => page,
            Err(response) => return *response,
        };
        // Parsed and filtered out of the lock.
        items.extend(
            page.objects
                .iter()
                .map(|(i, o)| object_value(&page.kinds[*i], o))
                .filter(|value| {
                    let labels = value.pointer("/metadata/labels").and_then(Value::as_object);
                    selector.matches(labels)
                }),
        );
        match (page.next, limit) {
            (None, _) => break None,
            (Some(next), Some(_)) => break Some(next),
            (Some(next), None) => after = Some(next),
        }
    };
    let mut body = json!({ "account": name, "items": items });
    if let Some(next) = next {
        body["continue"] = json!(encode_cursor(&next));
    }
    Json(body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        use std::time::UNIX_EPOCH;
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        // To the second: the fraction is cut, not rounded up.
        let t = UNIX_EPOCH + std::time::Duration::from_millis(1_795_000_000_999);
        assert_eq!(rfc3339(t), "2026-11-18T11:06:40Z");
        let leap = UNIX_EPOCH + std::time::Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn selectors() {
        let labels: serde_json::Map<String, Value> =
            serde_json::from_str(r#"{"app":"web","tier":"front","env":"prod"}"#).unwrap();
        let ok = |s: &str| label_selector(s).unwrap().matches(Some(&labels));
        assert!(ok("app=web"));
        assert!(ok("app==web,tier!=back,env"));
        assert!(!ok("app=db"));
        assert!(ok("!missing"));
        assert!(!ok("!app"));
        assert!(ok("env in (prod, staging),app notin (db)"));
        assert!(!ok("env notin (prod)"));
        assert!(ok(""));
        assert!(label_selector("a b").is_err());
        assert!(label_selector("=x").is_err());
    }

    #[test]
    fn kinds() {
        let k = KindCache {
            info: KindInfo {
                group: "apps".into(),
                version: "v1".into(),
                kind: "Deployment".into(),
                plural: "deployments".into(),
                namespaced: true,
            },
            objects: Default::default(),
            resume: Default::default(),
            statuses: Default::default(),
            histories: Default::default(),
            written_through: Default::default(),
            over_quota: None,
        };
        for q in [
            "Deployment",
            "deployments",
            "DEPLOYMENT",
            "apps/deployments",
            "Apps/Deployment",
        ] {
            assert!(kind_matches(q, &k), "{q}");
        }
        assert!(!kind_matches("core/deployments", &k));
        assert!(!kind_matches("pods", &k));
        let mut pod = k.clone();
        pod.info.group = String::new();
        pod.info.kind = "Pod".into();
        pod.info.plural = "pods".into();
        assert!(kind_matches("core/pods", &pod));
        assert!(kind_matches("pod", &pod));
    }

    #[test]
    fn each_scope_of_a_kind_keeps_its_state() {
        let info = KindInfo {
            group: String::new(),
            version: "v1".into(),
            kind: "Secret".into(),
            plural: "secrets".into(),
            namespaced: true,
        };
        let mut cache = crate::cache::Cache::default();
        let mut ops = Vec::new();
        let state = |state: &str, message: &str, ns: &str| KindState {
            state: state.into(),
            message: message.into(),
            namespaces: vec![ns.into()],
        };
        cache.set_status("prod", &info, state("WATCHING", "", "web"), &mut ops);
        cache.set_status(
            "prod",
            &info,
            state("FORBIDDEN", "secrets is forbidden", "db"),
            &mut ops,
        );
        // A later WATCHING elsewhere does not hide the forbidden scope.
        cache.set_status("prod", &info, state("WATCHING", "", "web"), &mut ops);
        let view = kind_view(&cache.accounts["prod"].kinds[&info.key()]);
        assert_eq!(view.state.as_deref(), Some("FORBIDDEN"));
        assert_eq!(view.namespaces, ["db"]);
        assert_eq!(view.message, "secrets is forbidden");
        let scopes: Vec<(&str, &[String])> = view
            .scopes
            .iter()
            .map(|s| (s.state.as_str(), s.namespaces.as_slice()))
            .collect();
        assert_eq!(
            scopes,
            [
                ("FORBIDDEN", &["db".to_string()][..]),
                ("WATCHING", &["web".to_string()][..])
            ]
        );
    }
}
