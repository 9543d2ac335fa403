//! LIST and GET answered from the hub's cache, when that answer is the API server's.
//!
//! A read is served from the cache only when all of these hold; otherwise it goes through
//! the tunnel exactly as before:
//! - the path is a collection or one object of a kind the account's agent streams, at the
//!   version the agent streams it (while no agent streams the account, the cache held for
//!   the grace period answers, flagged stale by `crate::degraded`);
//! - the kind is synced for the scope ([`consistency::synced_resume_point`]);
//! - the query has only parameters the cache implements ([`request::parse_query`]), the
//!   selectors are ones it evaluates exactly ([`selector`]), and Accept asks for JSON, the
//!   metadata-only form ([`request::parse_accept`]) or a Table of a kind the hub can print
//!   ([`table`]);
//! - Secrets only in the metadata-only form (the hub never holds their data);
//! - the resourceVersion rules and the account's own writes through the proxy are satisfied,
//!   after waiting up to [`READ_WAIT`] for the cache to catch up ([`consistency`]).

pub mod consistency;
mod members;
pub mod paging;
pub mod render;
pub mod request;
pub use scale_agent_hub_cache::selector;
pub mod table;
pub mod watch;
pub mod watch_query;

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use axum::{
    body::Body,
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    response::Response,
};
use http_body_util::BodyExt as _;
use scale_agent_hub_cache::{CachedObject, KindInfo, KindKey, lock};
use scale_agent_hub_state::Live;

use self::{
    consistency::{Decision, Floor, Floors},
    paging::{Snapshot, Snapshots, TokenError},
    request::{Form, ReadOptions, Target},
    selector::{FieldSelector, LabelSelector},
    table::{Negotiated, TableContext, TableForm},
};
use super::{CACHE_HEADER, status::Status};

/// How long a read waits for the cache to reach a resourceVersion (its own or one of the
/// account's writes) before it is tunnelled instead.
pub const READ_WAIT: Duration = Duration::from_secs(3);
/// The largest write answer read to learn its resourceVersion (objects are at most 1.5 MiB
/// in etcd; deletecollection lists can be larger, and then reads of the kind are
/// tunnelled for [`consistency::BARRIER`]).
pub const MAX_WRITE_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// What rendering the items of a paged list needs besides each object.
#[derive(Debug)]
pub struct ListContext {
    info: KindInfo,
    labels: LabelSelector,
    fields: FieldSelector,
    form: Form,
    /// Set for a Table: the items are its rows.
    table: Option<TableContext>,
    /// What the list's tokens stay good for.
    continuity: Continuity,
}

/// The watch history a list was taken from, and its generation then: the list's tokens are
/// good while the generation is the same (the kind's events since the list are one
/// unbroken sequence); a relist, a dropped scope or the account leaving is a real
/// resourceVersion gap, and the tokens expire (410), as the API server's do once etcd
/// compacted the list's revision.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Continuity {
    account: String,
    kind: KindKey,
    /// The watch scope whose resume point the list was at ("" for the cluster-wide one).
    scope: String,
    generation: Option<u64>,
}

impl Continuity {
    /// Whether the kind's events since the list are unbroken in `live`'s cache.
    fn unbroken(&self, live: &Live) -> bool {
        let Some(slot) = live.cache().account(&self.account) else {
            return false;
        };
        let cache = lock(&slot);
        cache
            .kinds
            .get(&self.kind)
            .is_some_and(|kind| kind.history(&self.scope).map(|h| h.generation) == self.generation)
    }
}

impl ListContext {
    fn item(
        &self,
        object: &Arc<CachedObject>,
    ) -> Result<Option<bytes::Bytes>, render::Unrenderable> {
        match &self.table {
            Some(table) => table::row_of(
                table,
                object,
                &self.labels,
                &self.fields,
                jiff::Timestamp::now(),
            ),
            None => render::list_item_of(&self.info, object, &self.labels, &self.fields, self.form),
        }
    }

    /// The list's body around a page of its items: a `<Kind>List` or a Table.
    fn body(
        &self,
        list_type: &(String, String),
        resource_version: &str,
        continue_token: Option<&str>,
        remaining: Option<usize>,
        items: &[bytes::Bytes],
    ) -> Vec<u8> {
        match &self.table {
            Some(table) => table::table_body(
                table.form.version,
                Some(&table.printer.columns()),
                resource_version,
                continue_token,
                remaining,
                &table.page_order(items),
            ),
            None => render::list_body(
                list_type,
                resource_version,
                continue_token,
                remaining,
                items,
            ),
        }
    }
}

/// The lists whose continue tokens are out: pointers into the cache ([`paging`]).
type Lists = Snapshots<Arc<CachedObject>, ListContext>;

/// The proxy's state for cached reads.
pub struct CachedReads {
    snapshots: Mutex<Lists>,
    floors: Mutex<Floors>,
    /// Bumped after every batch an agent stream applied to the cache.
    advanced: tokio::sync::watch::Sender<u64>,
}

impl Default for CachedReads {
    fn default() -> Self {
        CachedReads {
            snapshots: Mutex::default(),
            floors: Mutex::default(),
            advanced: tokio::sync::watch::channel(0).0,
        }
    }
}

impl CachedReads {
    /// Called after the cache applied a batch: wakes reads waiting for it.
    pub fn cache_advanced(&self) {
        self.advanced.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn snapshots(&self) -> MutexGuard<'_, Lists> {
        self.snapshots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn floors(&self) -> MutexGuard<'_, Floors> {
        self.floors.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the cache held for a read, copied out under the lock.
struct Held {
    info: KindInfo,
    fields: FieldSelector,
    resource_version: String,
    /// Shared with the cache: copying them out under the state lock is cheap.
    objects: Vec<Arc<CachedObject>>,
    continuity: Continuity,
}

/// What the cache can do for a read right now.
enum Plan {
    /// Boxed: the other variants are a few words.
    Ready(Box<Held>),
    /// For the cache to reach a resourceVersion, or to drop an object deleted (`None`).
    WaitFor(Option<u64>),
    Tunnel(&'static str),
}

/// The read's answer from the cache, or `None` when it must be tunnelled.
pub(crate) async fn read(
    live: &Live,
    reads: &CachedReads,
    account: &str,
    api_path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Option<Response> {
    read_from_cache(live, reads, account, api_path, query, headers, false).await
}

/// [`read`], but a full read of Secrets is answered with the Secrets as cached (no data)
/// instead of `None`: for accounts whose Secret data stays home ([`crate::secrets`]).
pub(crate) async fn read_as_cached(
    live: &Live,
    reads: &CachedReads,
    account: &str,
    api_path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Option<Response> {
    read_from_cache(live, reads, account, api_path, query, headers, true).await
}

async fn read_from_cache(
    live: &Live,
    reads: &CachedReads,
    account: &str,
    api_path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    secrets_as_cached: bool,
) -> Option<Response> {
    let target = request::parse_path(api_path)?;
    let list = target.name.is_none();
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (table_form, query) = match table::negotiate::negotiate(accept) {
        Negotiated::NotTable => (None, query.map(str::to_string)),
        Negotiated::Tunnel => return None,
        Negotiated::Table(version) => {
            let (include, rest) = table::negotiate::include_object(query)?;
            (Some(TableForm { version, include }), Some(rest))
        }
    };
    let options = request::parse_query(query.as_deref())?;
    let form = match table_form {
        // A Table's rows are printed from the whole object.
        Some(_) => Form::Full,
        None => request::parse_accept(accept, list)?,
    };
    if target.group.is_empty()
        && target.resource == "secrets"
        && form == Form::Full
        && (!secrets_as_cached || table_form.is_some())
    {
        // Secret data never reaches the hub: only the API server has it.
        return None;
    }
    let labels = LabelSelector::parse(&options.label_selector)?;
    let list_key = format!(
        "{account}|{api_path}|{}|{}|{form:?}|{table_form:?}",
        options.label_selector, options.field_selector
    );
    if let Some(token) = &options.continue_token {
        if !paging::is_hub_token(token) || options.resource_version.is_some() {
            return None;
        }
        return Some(next_page(live, reads, token, &list_key, options.limit));
    }
    let deadline = tokio::time::Instant::now() + READ_WAIT;
    let mut advanced = reads.advanced.subscribe();
    let held = loop {
        advanced.borrow_and_update();
        match plan(live, reads, account, &target, &options) {
            Plan::Ready(held) => break *held,
            Plan::Tunnel(why) => {
                tracing::debug!(path = %api_path, why, "read tunnelled");
                return None;
            }
            Plan::WaitFor(rv) => {
                let changed = tokio::time::timeout_at(deadline, advanced.changed()).await;
                if !matches!(changed, Ok(Ok(()))) {
                    tracing::info!(path = %api_path, resource_version = ?rv, "the cache did not reach the resourceVersion in time; read tunnelled");
                    return None;
                }
            }
        }
    };
    let table = match table_form {
        None => None,
        Some(form) => match table::printer(live, account, &held.info) {
            Ok(printer) => Some(TableContext { form, printer }),
            Err(why) => {
                tracing::debug!(path = %api_path, why, "Table not printable from the cache; tunnelled");
                return None;
            }
        },
    };
    let response = if list {
        let objects = match render::in_list_order(held.objects) {
            Ok(objects) => objects,
            Err(why) => {
                tracing::debug!(path = %api_path, ?why, "list not renderable from the cache; tunnelled");
                return None;
            }
        };
        let list_type = render::list_type(&held.info, form);
        let count_remaining = labels.is_empty() && held.fields.is_empty();
        let snapshot = Snapshot {
            context: ListContext {
                info: held.info,
                labels,
                fields: held.fields,
                form,
                table,
                continuity: held.continuity,
            },
            list: list_key,
            resource_version: held.resource_version.clone(),
            list_type: list_type.clone(),
            objects,
            count_remaining,
        };
        let cursor = Snapshots::start(snapshot);
        let context = cursor.snapshot.clone();
        let rendered = paging::page(
            &reads.snapshots,
            cursor,
            options.limit,
            Instant::now(),
            |o| context.context.item(o),
        );
        let page = match rendered {
            Ok(page) => page,
            Err(why) => {
                tracing::debug!(path = %api_path, ?why, "list not renderable from the cache; tunnelled");
                return None;
            }
        };
        json_response(
            StatusCode::OK,
            context.context.body(
                &list_type,
                &held.resource_version,
                page.continue_token.as_deref(),
                page.remaining,
                &page.items,
            ),
        )
    } else {
        match held.objects.first() {
            None => json_response(
                StatusCode::NOT_FOUND,
                render::not_found_body(&held.info, target.name.as_deref().unwrap_or_default()),
            ),
            Some(object) => {
                let body = match &table {
                    Some(table) => table::object_table(table, object, jiff::Timestamp::now()),
                    None => render::object_body(object, form),
                };
                match body {
                    Ok(body) => json_response(StatusCode::OK, body),
                    Err(_) => return None,
                }
            }
        }
    };
    Some(response)
}

/// Decides under the registry's shared lock and the account's lock, copying out what the
/// answer needs: pointers to the objects of the named one (a lookup in the name index) or
/// of the namespace's range (the whole kind for a cluster-wide list). Selectors are
/// evaluated on those afterwards, outside any lock.
fn plan(
    live: &Live,
    reads: &CachedReads,
    account: &str,
    target: &Target,
    options: &ReadOptions,
) -> Plan {
    let registry = live.registry_read();
    let Some(registered) = registry.accounts.get(account) else {
        return Plan::Tunnel("unknown account");
    };
    // No agent streams the account: the cache is held for the grace period and answers,
    // flagged as stale by the caller (`crate::degraded`).
    let omit: Vec<String> = registered
        .record
        .properties
        .get("omitNamespaces")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let Some(slot) = live.cache().account(account) else {
        return Plan::Tunnel("kind not streamed");
    };
    let cache = lock(&slot);
    let Some(kind) = cache
        .kinds
        .values()
        .find(|k| k.info.group == target.group && k.info.plural == target.resource)
    else {
        return Plan::Tunnel("kind not streamed");
    };
    if kind.info.version != target.version {
        return Plan::Tunnel("another version than the agent streams");
    }
    if target.namespace.is_some() && !kind.info.namespaced {
        return Plan::Tunnel("namespaced path of a cluster-scoped kind");
    }
    if target.name.is_some() && kind.info.namespaced && target.namespace.is_none() {
        return Plan::Tunnel("named object of a namespaced kind without a namespace");
    }
    let Some(fields) =
        FieldSelector::parse(&options.field_selector, &kind.info.group, &kind.info.kind)
    else {
        return Plan::Tunnel("field selector the cache cannot evaluate");
    };
    // A `metadata.namespace=` selector narrows a cluster-wide list to one namespace.
    let scope = target.namespace.as_deref().or(fields
        .namespace()
        .filter(|ns| kind.info.namespaced && !ns.is_empty()));
    let Some((watch_scope, resume)) = consistency::synced_scope(kind, scope, &omit) else {
        return Plan::Tunnel("kind not synced for the scope");
    };
    let list = target.name.is_none();
    let decision = consistency::stricter(
        consistency::resource_version_decision(options, resume, list),
        reads.floors().decision(
            account,
            &kind.info.key(),
            scope,
            resume,
            |uid| kind.objects.contains_key(uid),
            Instant::now(),
        ),
    );
    match decision {
        Decision::Tunnel => Plan::Tunnel("resourceVersion the cache cannot satisfy"),
        Decision::WaitFor(rv) => Plan::WaitFor(Some(rv)),
        Decision::WaitForDeletion => Plan::WaitFor(None),
        Decision::Serve => {
            let objects = match &target.name {
                // A namespaced kind's object is named with its namespace (checked above);
                // a cluster-scoped one's namespace is "".
                Some(name) => kind
                    .objects
                    .by_name(scope.unwrap_or_default(), name)
                    .cloned()
                    .into_iter()
                    .collect(),
                None => kind.objects.in_scope(scope).cloned().collect(),
            };
            Plan::Ready(Box::new(Held {
                info: kind.info.clone(),
                fields,
                resource_version: resume.to_string(),
                objects,
                continuity: Continuity {
                    account: account.to_string(),
                    kind: kind.info.key(),
                    scope: watch_scope.to_string(),
                    generation: kind.history(watch_scope).map(|h| h.generation),
                },
            }))
        }
    }
}

fn next_page(
    live: &Live,
    reads: &CachedReads,
    token: &str,
    list_key: &str,
    limit: Option<usize>,
) -> Response {
    let now = Instant::now();
    let found = reads.snapshots().resume(token, list_key, now);
    // Checked outside the snapshots' lock (it takes the account's).
    let found = found.and_then(|cursor| {
        if cursor.snapshot.context.continuity.unbroken(live) {
            return Ok(cursor);
        }
        tracing::debug!(
            account = %cursor.snapshot.context.continuity.account,
            "a paged list's kind was relisted since its first page: its token expired"
        );
        reads.snapshots().end(cursor);
        Err(TokenError::Expired)
    });
    let rendered = found.map(|cursor| {
        let snapshot = cursor.snapshot.clone();
        let page = paging::page(&reads.snapshots, cursor, limit, now, |o| {
            snapshot.context.item(o)
        });
        (page, snapshot)
    });
    match rendered {
        Ok((Err(why), _)) => {
            // An object of the pinned list does not render (a corrupt store): the list
            // starts again, and its first page is tunnelled.
            tracing::warn!(
                ?why,
                "a page of a cached list does not render; answered 410"
            );
            expired()
        }
        Ok((Ok(page), snapshot)) => json_response(
            StatusCode::OK,
            snapshot.context.body(
                &snapshot.list_type,
                &snapshot.resource_version,
                page.continue_token.as_deref(),
                page.remaining,
                &page.items,
            ),
        ),
        Err(TokenError::Expired) => expired(),
        Err(TokenError::OtherList) => cached_status(Status::failure(
            400,
            "BadRequest",
            "this continue token belongs to another list (another path, selector or Accept): \
             send it with the same query as the list that returned it, or start the list \
             again without continue",
        )),
    }
}

fn expired() -> Response {
    cached_status(Status::failure(
        410,
        "Expired",
        "the provided continue parameter is too old to display a consistent list result (the \
         hub keeps a list's pages for 5 minutes): start the list again without the continue \
         parameter",
    ))
}

fn cached_status(status: Status) -> Response {
    use axum::response::IntoResponse as _;
    let mut response = status.into_response();
    response
        .headers_mut()
        .insert(CACHE_HEADER, HeaderValue::from_static("hit"));
    response
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(CACHE_HEADER, HeaderValue::from_static("hit"));
    response
}

/// The kind and namespace a write path changes: a collection, an object or one of its
/// subresources.
fn write_target(api_path: &str) -> Option<Target> {
    request::parse_path(api_path).or_else(|| {
        // `.../<resource>/<name>/<subresource>`: the object's resourceVersion changes.
        let (object, _) = api_path.rsplit_once('/')?;
        request::parse_path(object).filter(|t| t.name.is_some())
    })
}

/// After a write through the proxy: remembers its resourceVersion so that cached reads of
/// the account never show an older state of what it wrote (read-your-writes). The answer
/// is read to learn it (and handed on unchanged) only for kinds the cache holds.
pub(crate) async fn after_write(
    live: &Live,
    reads: &CachedReads,
    account: &str,
    method: &Method,
    api_path: &str,
    response: Response,
) -> Response {
    if !matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) || !response.status().is_success()
    {
        return response;
    }
    let Some(target) = write_target(api_path) else {
        return response;
    };
    let key = live.cache().read(account, |a| {
        a.kinds
            .values()
            .find(|k| k.info.group == target.group && k.info.plural == target.resource)
            .map(|k| k.info.key())
    });
    let Some(key) = key.flatten() else {
        return response;
    };
    let namespace = target.namespace.clone().unwrap_or_default();
    let (parts, body) = response.into_parts();
    let limited = http_body_util::Limited::new(body, MAX_WRITE_ANSWER_BYTES);
    let (floor, body) = match limited.collect().await {
        Ok(collected) => {
            let bytes = collected.to_bytes();
            (written_floor(&bytes), Body::from(bytes))
        }
        Err(error) => {
            // Too large or cut: the client gets the error; reads wait out the barrier.
            tracing::debug!(path = %api_path, %error, "write answer not readable");
            (
                None,
                Body::from_stream(futures::stream::once(async move {
                    Err::<bytes::Bytes, _>(std::io::Error::other(error.to_string()))
                })),
            )
        }
    };
    let now = Instant::now();
    let floor = floor.unwrap_or(Floor::Until(now + consistency::BARRIER));
    record_write(reads, account, key, &namespace, floor, now);
    Response::from_parts(parts, body)
}

fn record_write(
    reads: &CachedReads,
    account: &str,
    key: KindKey,
    namespace: &str,
    floor: Floor,
    now: Instant,
) {
    tracing::debug!(kind = %key, %namespace, ?floor, "write through the proxy: cached reads wait for it");
    reads.floors().record(account, key, namespace, floor, now);
}

/// What a write's answer says the cache must show: its object's resourceVersion (the
/// newest of a deletecollection's items), or, for a delete answered with a `Status`, that
/// the object (by uid) is gone; `None` for anything else.
pub fn written_floor(body: &[u8]) -> Option<Floor> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let rv_of = |v: &serde_json::Value| {
        v.pointer("/metadata/resourceVersion")
            .and_then(|r| r.as_str())
            .and_then(|r| r.parse::<u64>().ok())
    };
    if value.get("kind").and_then(|k| k.as_str()) == Some("Status") {
        return value
            .pointer("/details/uid")
            .and_then(|u| u.as_str())
            .filter(|u| !u.is_empty())
            .map(|u| Floor::Gone(u.to_string()));
    }
    match value.get("items").and_then(|i| i.as_array()) {
        Some(items) => items.iter().filter_map(rv_of).max(),
        None => rv_of(&value),
    }
    .map(Floor::Version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_floors() {
        assert_eq!(
            written_floor(br#"{"kind":"ConfigMap","metadata":{"resourceVersion":"42"}}"#),
            Some(Floor::Version(42))
        );
        assert_eq!(
            written_floor(
                br#"{"kind":"ConfigMapList","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"resourceVersion":"7"}},{"metadata":{"resourceVersion":"9"}}]}"#
            ),
            Some(Floor::Version(9))
        );
        assert_eq!(
            written_floor(
                br#"{"kind":"Status","status":"Success","details":{"name":"x","kind":"configmaps","uid":"u1"}}"#
            ),
            Some(Floor::Gone("u1".into()))
        );
        assert_eq!(
            written_floor(br#"{"kind":"Status","status":"Success","metadata":{}}"#),
            None
        );
        assert_eq!(written_floor(b"not json"), None);
    }

    #[test]
    fn write_targets_include_subresources() {
        let t = write_target("/apis/apps/v1/namespaces/x/deployments/web/scale").unwrap();
        assert_eq!(
            (t.resource.as_str(), t.name.as_deref()),
            ("deployments", Some("web"))
        );
        let t = write_target("/api/v1/namespaces/x/configmaps").unwrap();
        assert_eq!(t.namespace.as_deref(), Some("x"));
        assert!(write_target("/api/v1/namespaces/x/pods/p/log/extra").is_none());
    }
}
