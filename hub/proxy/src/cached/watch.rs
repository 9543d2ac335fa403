//! WATCH answered from the cache's history of the agent's watch of the kind
//! ([`scale_agent_hub_cache::History`]): every watcher of an account's kind reads the one agent
//! stream's events; none opens a watch on the target cluster.
//!
//! Served only for a collection (`watch=true`, or a `metadata.name` field selector for one
//! object) of a kind the agent has synced for the watch's scope, as JSON or as Tables
//! ([`table::watch_events`]: each event and bookmark a one-row Table; a Table watch with
//! bookmarks and `includeObject=Object` is tunnelled). The scope is one
//! of the agent's watches ([`consistency::synced_scope`]): its cluster-wide watch, or, for
//! a watch of one namespace of an account with `namespaces:`, its watch of that namespace,
//! whose own resume point is the watch's resourceVersion. A watch no single scope covers
//! (all namespaces of an account watched per namespace) is tunnelled. Start: with no
//! resourceVersion (or "0"), ADDED for every object, then the changes; from a version the
//! history still holds, or one ahead of the scope's resume point, the changes after it;
//! from an older one, an ERROR event with a `410 Expired` Status (the API server's answer),
//! after which clients list again. Streaming lists (`sendInitialEvents=true`,
//! `resourceVersionMatch=NotOlderThan`) get ADDED for every object at the resume point
//! (tunnelled when asked for a newer version than that), then, with `allowWatchBookmarks`,
//! the BOOKMARK annotated `k8s.io/initial-events-end`; `sendInitialEvents=false` starts at
//! the resume point or the version given; the combinations the API server refuses are
//! tunnelled to it ([`super::watch_query`] has the table). The watch
//! ends cleanly at `timeoutSeconds`, when the account's agent goes away (as the tunnelled
//! watch did) or the hub shuts down (a watch that allows bookmarks first gets one at its
//! position, where a restarted hub's history starts), and with a 410 ERROR when the kind is relisted or the watcher fell out of
//! the history window.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::Response,
};
use bytes::Bytes;
use scale_agent_hub_cache::{EventType, HistoryEvent, KindInfo, KindKey, lock};
use scale_agent_hub_state::Live;
use serde_json::Value;
use tokio::sync::mpsc;

pub use super::watch_query::{WatchOptions, parse_watch_query};
use super::{
    CachedReads,
    consistency::{self, Decision},
    render,
    request::{self, Form, Target},
    selector::{FieldSelector, LabelSelector},
    table::{
        self, Negotiated, TableContext, TableForm,
        negotiate::{include_object, negotiate},
        watch_events::{self, TableEvents},
    },
    watch_query::{Start as From, bookmark_line, event_line, gone_line, initial_events_end_line},
};
use crate::{CACHE_HEADER, Proxy};

/// How long a watch without `timeoutSeconds` lasts (the API server picks 30 to 60 minutes).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How often an idle watch checks that its agent is still there, and sends a bookmark when
/// asked for them and the resourceVersion moved.
pub const TICK: Duration = Duration::from_secs(1);
/// The least time between two bookmarks of a watch.
pub const BOOKMARK_EVERY: Duration = Duration::from_secs(30);
/// How long a watch ending at shutdown waits for its account's stream to stop feeding the
/// cache, and for its client to take the last lines (the hub's shutdown waits 10 s for the
/// HTTP server).
const FINISH_WAIT: Duration = Duration::from_secs(5);
/// Event lines queued for a slow client; past them the watcher waits, and falls out of the
/// history window if it waits too long.
const QUEUE: usize = 64;

/// Who a watcher shows an event to, as the API server's watch cache decides: by the
/// object's state before and after against the selectors.
struct Filter {
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, json: &[u8]) -> bool {
        let Ok(value) = serde_json::from_slice::<Value>(json) else {
            return false;
        };
        let labels = value.pointer("/metadata/labels").and_then(Value::as_object);
        self.labels.matches(labels) && self.fields.matches(&value)
    }

    /// The event type this watcher sees, if any.
    fn view(&self, event: &HistoryEvent) -> Option<&'static str> {
        if self
            .namespace
            .as_deref()
            .is_some_and(|ns| ns != event.namespace)
        {
            return None;
        }
        let now = event.event_type != EventType::Deleted && self.matches(&event.json);
        let before = match event.event_type {
            EventType::Deleted => self.matches(&event.json),
            _ => event.previous.as_deref().is_some_and(|p| self.matches(p)),
        };
        match (before, now) {
            (false, true) => Some(EventType::Added.as_str()),
            (true, true) => Some(EventType::Modified.as_str()),
            (true, false) => Some(EventType::Deleted.as_str()),
            (false, false) => None,
        }
    }
}

/// Where a watcher is.
struct Position {
    key: KindKey,
    /// The agent's watch it follows: "" for the cluster-wide one, or a namespace.
    scope: String,
    generation: u64,
    resource_version: u64,
}

/// What a watcher found in the cache.
enum Step {
    Events(Vec<HistoryEvent>, u64),
    /// The kind was relisted, dropped, or the watcher fell out of the window.
    Gone(String),
    /// The agent went away or the account was removed: end as the API server ends a watch.
    End,
}

/// Whether an agent streams `account` (its events still reach the cache).
fn streaming(live: &Live, account: &str) -> bool {
    live.registry_read()
        .accounts
        .get(account)
        .is_some_and(|a| a.streaming.is_some())
}

fn step(live: &Live, account: &str, position: &Position) -> Step {
    if !streaming(live, account) {
        return Step::End;
    }
    read_history(live, account, position)
}

/// The events after `position` in its kind's history and the position they bring the
/// watcher to (past its last event when the resume point moved on), whether or not an agent
/// still streams the account.
fn read_history(live: &Live, account: &str, position: &Position) -> Step {
    let Some(slot) = live.cache().account(account) else {
        return Step::End;
    };
    let cache = lock(&slot);
    let Some(kind) = cache.kinds.get(&position.key) else {
        return Step::End;
    };
    let Some(history) = kind.history(&position.scope) else {
        return Step::End;
    };
    if history.generation != position.generation {
        return Step::Gone(format!(
            "the Scale Agent hub relisted {} for this account: list again and watch from the \
             list's resourceVersion",
            position.key
        ));
    }
    let Some(events) = history.since(position.resource_version) else {
        return Step::Gone(format!(
            "too old resource version: {} (the Scale Agent hub keeps the last {} events of a \
             kind, fewer when all kinds' together take more than --watch-history-mib, and this \
             watch fell behind them): list again and watch from the list's resourceVersion",
            position.resource_version,
            scale_agent_hub_cache::history::MAX_EVENTS
        ));
    };
    let events: Vec<HistoryEvent> = events.cloned().collect();
    let resume = kind
        .resume
        .get(&position.scope)
        .and_then(|r| r.parse::<u64>().ok())
        .unwrap_or(position.resource_version);
    let last = events
        .last()
        .map_or(position.resource_version, |e| e.resource_version);
    Step::Events(events, last.max(resume))
}

/// The watch's answer from the cache, or `None` when it must be tunnelled.
pub(crate) async fn watch(
    proxy: &Arc<Proxy>,
    account: &str,
    api_path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Option<Response> {
    watch_from_cache(proxy, account, api_path, query, headers, false).await
}

/// [`watch`], but a watch of Secrets is answered with the Secrets as cached (no data)
/// instead of `None`: for accounts whose Secret data stays home ([`crate::secrets`]).
pub(crate) async fn watch_as_cached(
    proxy: &Arc<Proxy>,
    account: &str,
    api_path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Option<Response> {
    watch_from_cache(proxy, account, api_path, query, headers, true).await
}

async fn watch_from_cache(
    proxy: &Arc<Proxy>,
    account: &str,
    api_path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    secrets_as_cached: bool,
) -> Option<Response> {
    let target = request::parse_path(api_path)?;
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    // `kubectl get -w` asks for Tables: `includeObject` is the Table's parameter.
    let (table_form, query) = match negotiate(accept) {
        Negotiated::NotTable => (None, query.map(str::to_string)),
        Negotiated::Tunnel => return None,
        Negotiated::Table(version) => {
            let (include, rest) = include_object(query)?;
            (Some(TableForm { version, include }), Some(rest))
        }
    };
    let options = parse_watch_query(query.as_deref())?;
    if target.name.is_some() || !options.accepted() {
        return None;
    }
    // A Table watch's bookmarks are Tables too, of a row printed from an empty object
    // ([`table::watch_events`]); rows carrying that whole object are left to the API server.
    if let Some(form) = table_form
        && options.allow_bookmarks
        && !watch_events::bookmarks_served(form)
    {
        return None;
    }
    if (table_form.is_none() && request::parse_accept(accept, false)? != Form::Full)
        || (target.group.is_empty() && target.resource == "secrets" && !secrets_as_cached)
    {
        return None;
    }
    let labels = LabelSelector::parse(&options.label_selector)?;
    let (info, filter, position, mut objects, opening) = start(
        &proxy.live,
        &proxy.state.cached_reads,
        account,
        &target,
        &options,
        labels,
    )?;
    let mut tables = match table_form {
        Some(form) => {
            let printer = table::printer(&proxy.live, account, &info).ok()?;
            Some(TableEvents::new(TableContext { form, printer }))
        }
        None => None,
    };
    // Rendered out of the state lock: parsing every object under it would stall the agents'
    // batches.
    objects.sort_by_cached_key(|o| format!("{}/{}", o.namespace, o.name));
    let mut initial = Vec::new();
    for object in &objects {
        if object.truncated {
            return None;
        }
        // Objects left out by what is kept beside their packed JSON are not unpacked.
        let selected = render::preselect(object, &filter.labels, &filter.fields);
        if selected == Some(false) {
            continue;
        }
        let json = object.json.unpack().ok()?;
        if selected == Some(true) || filter.matches(&json) {
            initial.push(encode(&mut tables, "ADDED", &json)?);
        }
    }
    drop(objects);
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(QUEUE);
    let mut response = Response::new(Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
        .headers_mut()
        .insert(CACHE_HEADER, HeaderValue::from_static("hit"));
    let proxy = proxy.clone();
    let account = account.to_string();
    let timeout = options.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let end_of_initial = match opening {
        Opening::Gone(message) => {
            tokio::spawn(async move {
                let _ = tx.send(Ok(gone_line(&message))).await;
            });
            return Some(response);
        }
        Opening::Initial { end_bookmark: true } => Some(encode_bookmark(
            &mut tables,
            &info,
            position.resource_version,
            true,
        )?),
        Opening::Initial {
            end_bookmark: false,
        }
        | Opening::Changes => None,
    };
    tokio::spawn(async move {
        for line in initial.into_iter().chain(end_of_initial) {
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
        let watcher = Watcher {
            proxy,
            account,
            info,
            filter,
            bookmarks: options.allow_bookmarks,
            tables,
            tx,
        };
        watcher.run(position, timeout).await;
    });
    Some(response)
}

/// How a watch opens.
enum Opening {
    /// With the objects (ADDED), and then, for a streaming list that allows bookmarks, the
    /// initial-events-end bookmark at the watch's start.
    Initial { end_bookmark: bool },
    /// With the changes after its start.
    Changes,
    /// With a `410 Expired` ERROR: its version is older than the history.
    Gone(String),
}

/// The objects are copied out as pointers; they are filtered and rendered after the lock.
type Start = (
    KindInfo,
    Filter,
    Position,
    Vec<Arc<scale_agent_hub_cache::CachedObject>>,
    Opening,
);

/// Decides under the state lock where the watch starts; `None` tunnels it.
fn start(
    live: &Live,
    reads: &CachedReads,
    account: &str,
    target: &Target,
    options: &WatchOptions,
    labels: LabelSelector,
) -> Option<Start> {
    let registry = live.registry_read();
    let registered = registry.accounts.get(account)?;
    registered.streaming?;
    let omit: Vec<String> = registered
        .record
        .properties
        .get("omitNamespaces")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let slot = live.cache().account(account)?;
    let cache = lock(&slot);
    let kind = cache
        .kinds
        .values()
        .find(|k| k.info.group == target.group && k.info.plural == target.resource)?;
    if kind.info.version != target.version || (target.namespace.is_some() && !kind.info.namespaced)
    {
        return None;
    }
    let fields = FieldSelector::parse(&options.field_selector, &kind.info.group, &kind.info.kind)?;
    // A `metadata.namespace=` selector narrows a cluster-wide watch to one namespace, as
    // for a list.
    let scope: Option<String> = target.namespace.clone().or_else(|| {
        fields
            .namespace()
            .filter(|ns| kind.info.namespaced && !ns.is_empty())
            .map(str::to_string)
    });
    let scope = scope.as_deref();
    // The one watch of the agent whose events (and resume point) the watcher follows.
    let (watch_scope, resume) = consistency::synced_scope(kind, scope, &omit)?;
    let resume_rv: u64 = resume.parse().ok()?;
    let history = kind.history(watch_scope)?;
    history.start?;
    let filter = Filter {
        namespace: target.namespace.clone(),
        labels,
        fields,
    };
    let at = |rv| Position {
        key: kind.info.key(),
        scope: watch_scope.to_string(),
        generation: history.generation,
        resource_version: rv,
    };
    match options.start() {
        From::Initial {
            not_older_than,
            end_bookmark,
        } => {
            // Not older than a version: the cache's state at its resume point is, once the
            // resume point has reached it (else the API server answers).
            if let Some(rv) = not_older_than
                && rv.parse::<u64>().ok()? > resume_rv
            {
                return None;
            }
            // The account's own writes first, as for a list.
            let floors = reads.floors().decision(
                account,
                &kind.info.key(),
                scope,
                resume,
                |uid| kind.objects.contains_key(uid),
                std::time::Instant::now(),
            );
            if floors != Decision::Serve {
                return None;
            }
            let objects: Vec<_> = kind.objects.in_scope(scope).cloned().collect();
            let opening = Opening::Initial { end_bookmark };
            Some((kind.info.clone(), filter, at(resume_rv), objects, opening))
        }
        From::Now => Some((
            kind.info.clone(),
            filter,
            at(resume_rv),
            Vec::new(),
            Opening::Changes,
        )),
        From::After(rv) => {
            // A version ahead of the scope's resume point (the client took it from the API
            // server, or from a list of another scope) is served too: the watch shows the
            // events after it, and the agent's watch of the scope delivers every event
            // after the resume point, in order, so each event after `wanted` reaches this
            // history (those between the two are before the watch's start, and never
            // shown). A quiet scope's resume point moves only with the API server's
            // bookmarks, about once a minute, so waiting for it would not do.
            let wanted: u64 = rv.parse().ok()?;
            let gone = history.since(wanted).is_none().then(|| {
                format!(
                    "too old resource version: {wanted} ({}): the Scale Agent hub keeps the \
                     last {} events of a kind, fewer when all kinds' together take more than \
                     --watch-history-mib; list again and watch from the list's \
                     resourceVersion",
                    history.start.unwrap_or_default(),
                    scale_agent_hub_cache::history::MAX_EVENTS
                )
            });
            let opening = gone.map_or(Opening::Changes, Opening::Gone);
            Some((kind.info.clone(), filter, at(wanted), Vec::new(), opening))
        }
    }
}

/// An event's watch line: its object as is, or as a Table for a Table watch (`None` when
/// it cannot be printed).
fn encode(tables: &mut Option<TableEvents>, event_type: &str, json: &[u8]) -> Option<Bytes> {
    match tables {
        Some(tables) => tables.line(event_type, json, jiff::Timestamp::now()).ok(),
        None => Some(event_line(event_type, json)),
    }
}

/// A BOOKMARK line at `rv` (`initial_events_end`: the one that ends a streaming list's
/// initial events), a Table for a Table watch.
fn encode_bookmark(
    tables: &mut Option<TableEvents>,
    info: &KindInfo,
    rv: u64,
    initial_events_end: bool,
) -> Option<Bytes> {
    match tables {
        Some(tables) => tables
            .bookmark(rv, initial_events_end, jiff::Timestamp::now())
            .ok(),
        None if initial_events_end => Some(initial_events_end_line(info, rv)),
        None => Some(bookmark_line(info, rv)),
    }
}

struct Watcher {
    proxy: Arc<Proxy>,
    account: String,
    info: KindInfo,
    filter: Filter,
    bookmarks: bool,
    /// Set for a Table watch: its events and bookmarks are Tables.
    tables: Option<TableEvents>,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
}

impl Watcher {
    async fn run(mut self, mut position: Position, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut advanced = self.proxy.state.cached_reads.advanced.subscribe();
        let mut last_sent = position.resource_version;
        let mut last_bookmark = tokio::time::Instant::now();
        // The hub shutting down ends its watches at once, as the API server's do, so that
        // clients watch again from their last resourceVersion.
        let mut shutdown = self.proxy.shutdown.clone();
        loop {
            if *shutdown.borrow() {
                self.finish(position, last_sent, true).await;
                return;
            }
            advanced.borrow_and_update();
            match step(&self.proxy.live, &self.account, &position) {
                Step::End => {
                    self.finish(position, last_sent, false).await;
                    return;
                }
                Step::Gone(message) => {
                    let _ = self.tx.send(Ok(gone_line(&message))).await;
                    return;
                }
                Step::Events(events, now_at) => {
                    for event in events {
                        if let Some(event_type) = self.filter.view(&event) {
                            // An object the printer cannot print ends the watch; the
                            // client watches again (and is tunnelled if it persists).
                            let Some(line) = encode(&mut self.tables, event_type, &event.json)
                            else {
                                return;
                            };
                            if self.tx.send(Ok(line)).await.is_err() {
                                return;
                            }
                            last_sent = event.resource_version;
                        }
                    }
                    position.resource_version = now_at;
                }
            }
            if self.bookmarks
                && position.resource_version > last_sent
                && last_bookmark.elapsed() >= BOOKMARK_EVERY
            {
                let Some(line) = encode_bookmark(
                    &mut self.tables,
                    &self.info,
                    position.resource_version,
                    false,
                ) else {
                    return;
                };
                if self.tx.send(Ok(line)).await.is_err() {
                    return;
                }
                last_sent = position.resource_version;
                last_bookmark = tokio::time::Instant::now();
            }
            tokio::select! {
                _ = advanced.changed() => {}
                _ = tokio::time::sleep(TICK) => {}
                _ = tokio::time::sleep_until(deadline) => return,
                _ = self.tx.closed() => return,
                _ = shutdown.changed() => {}
            }
        }
    }

    /// Ends the watch cleanly (the hub stops, the agent goes away): once the account's
    /// stream no longer feeds the cache (at shutdown it is waited for, up to
    /// [`FINISH_WAIT`]), sends the events not yet sent and then tells a watcher that allows
    /// bookmarks how far it has got. The events of other namespaces and objects move the
    /// resume point past its last event, and a restarted hub's history starts at the
    /// persisted resume point: a bookmark short of it, or a batch stored after it, would
    /// make the client's next watch 410 and relist. A client that does not read is not
    /// waited for past [`FINISH_WAIT`].
    async fn finish(mut self, mut position: Position, mut last_sent: u64, shutting_down: bool) {
        let deadline = tokio::time::Instant::now() + FINISH_WAIT;
        while shutting_down
            && streaming(&self.proxy.live, &self.account)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Step::Events(events, now_at) =
            read_history(&self.proxy.live, &self.account, &position)
        {
            for event in events {
                if let Some(event_type) = self.filter.view(&event) {
                    let Some(line) = encode(&mut self.tables, event_type, &event.json) else {
                        return;
                    };
                    match tokio::time::timeout_at(deadline, self.tx.send(Ok(line))).await {
                        Ok(Ok(())) => last_sent = event.resource_version,
                        _ => return,
                    }
                }
            }
            position.resource_version = now_at;
        }
        if let Some(rv) = closing_bookmark_at(self.bookmarks, position.resource_version, last_sent)
            && let Some(line) = encode_bookmark(&mut self.tables, &self.info, rv, false)
        {
            let _ = self.tx.try_send(Ok(line));
        }
    }
}

/// The resourceVersion of the bookmark a watch ends with, if any: when bookmarks are
/// allowed and the watcher's position (every event up to it sent) is past the last line sent.
fn closing_bookmark_at(bookmarks: bool, position: u64, last_sent: u64) -> Option<u64> {
    (bookmarks && position > last_sent).then_some(position)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(t: EventType, json: &str, previous: Option<&str>) -> HistoryEvent {
        HistoryEvent {
            resource_version: 5,
            event_type: t,
            namespace: "ns".into(),
            json: Bytes::from(json.to_string()),
            previous: previous.map(|p| Bytes::from(p.to_string())),
        }
    }

    #[test]
    fn selectors_turn_changes_into_added_and_deleted() {
        let filter = Filter {
            namespace: Some("ns".into()),
            labels: LabelSelector::parse("app=web").unwrap(),
            fields: FieldSelector::default(),
        };
        let web = r#"{"metadata":{"labels":{"app":"web"}}}"#;
        let db = r#"{"metadata":{"labels":{"app":"db"}}}"#;
        assert_eq!(filter.view(&ev(EventType::Added, web, None)), Some("ADDED"));
        assert_eq!(filter.view(&ev(EventType::Added, db, None)), None);
        assert_eq!(
            filter.view(&ev(EventType::Modified, web, Some(web))),
            Some("MODIFIED")
        );
        assert_eq!(
            filter.view(&ev(EventType::Modified, web, Some(db))),
            Some("ADDED")
        );
        assert_eq!(
            filter.view(&ev(EventType::Modified, db, Some(web))),
            Some("DELETED")
        );
        assert_eq!(filter.view(&ev(EventType::Modified, db, Some(db))), None);
        assert_eq!(
            filter.view(&ev(EventType::Deleted, web, Some(web))),
            Some("DELETED")
        );
        assert_eq!(filter.view(&ev(EventType::Deleted, db, None)), None);
        let mut other = ev(EventType::Added, web, None);
        other.namespace = "other".into();
        assert_eq!(filter.view(&other), None);
    }

    #[test]
    fn a_watch_ends_with_a_bookmark_at_its_position_when_it_moved() {
        assert_eq!(closing_bookmark_at(true, 20, 13), Some(20));
        assert_eq!(
            closing_bookmark_at(true, 13, 13),
            None,
            "nothing new to say"
        );
        assert_eq!(
            closing_bookmark_at(false, 20, 13),
            None,
            "bookmarks not allowed"
        );
    }
}
