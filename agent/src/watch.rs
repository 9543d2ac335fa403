//! The list/watch/resume loop of one kind in one watch namespace of one account.
//!
//! Unlike kube-runtime's watcher (which always relists), this loop resumes: with a resume
//! point from the hub it watches from that resourceVersion without a LIST; otherwise it lists
//! (pages of 500, under the list budget) and sends a snapshot, then watches from the list's
//! resourceVersion. A watch that ends is re-opened from the last resourceVersion seen; only
//! 410 Gone causes a relist. A kind RBAC forbids is reported and retried rarely. A kind the
//! API server answers 404 for (its CustomResourceDefinition was deleted) ends the watch at
//! once ([`WatchEnd::KindGone`]): the streamer tells the hub and leaves it to rediscovery.

mod event;
pub mod secrets;

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use futures::{StreamExt, stream::BoxStream};
use kube::{
    Api, Client, Resource as _,
    api::{DynamicObject, ListParams, WatchEvent, WatchParams},
    core::Status,
};
use scale_agent_proto::v1::{self, agent_message, kind_status, object_event};
use serde::Serialize;
use serde_json::Value;
use tokio::{sync::mpsc, time::Instant};

pub use self::event::Event;
use crate::{backoff::Backoff, convert, kinds::KindRef, state::KindState, state::Shared};

/// Server-side timeout of each watch request, in seconds.
pub const WATCH_TIMEOUT_SECS: u32 = 290;
/// A watch that delivers nothing (not even a bookmark) for this long is assumed dead.
pub const WATCH_IDLE: Duration = Duration::from_secs(WATCH_TIMEOUT_SECS as u64 + 30);
/// Page size of LISTs.
pub const LIST_PAGE: u32 = 500;
/// How long one LIST page or the start of a watch may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a forbidden kind waits before it is tried again.
pub const FORBIDDEN_RETRY: Duration = Duration::from_secs(300);

/// A message for the hub from one account's watches. `generation` identifies the
/// assignment it was produced under; the session drops messages of a superseded one.
#[derive(Debug)]
pub struct Outbound {
    pub account: String,
    pub generation: u64,
    pub message: agent_message::Kind,
}

/// Everything a watch needs from its account and session.
#[derive(Clone)]
pub struct WatchContext {
    pub account: String,
    pub generation: u64,
    pub client: Client,
    pub tx: mpsc::Sender<Outbound>,
    pub shared: Arc<Shared>,
    pub list_budget: crate::budget::Budget,
    pub max_object_bytes: u64,
    pub omit_namespaces: Arc<BTreeSet<String>>,
    pub forbidden_retry: Duration,
}

fn event<K: Serialize>(event: WatchEvent<K>) -> Event {
    let value = |object: K| serde_json::to_value(object).unwrap_or(Value::Null);
    match event {
        WatchEvent::Added(object) | WatchEvent::Modified(object) => Event::Applied(value(object)),
        WatchEvent::Deleted(object) => Event::Deleted(value(object)),
        WatchEvent::Bookmark(bookmark) => Event::Bookmark(bookmark.metadata.resource_version),
        WatchEvent::Error(status) => Event::Error(status),
    }
}

/// Why a watch task returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchEnd {
    /// The session or assignment ended (the channel to the hub closed).
    Closed,
    /// The API server answered 404 for the kind's collection: it no longer serves the kind
    /// (a deleted CustomResourceDefinition, a removed aggregated API). Retrying would only
    /// log the 404 until rediscovery stops the watch, so the watch ends at once.
    KindGone,
}

/// Why a list or watch stopped.
#[derive(Debug)]
enum Failure {
    /// 410 Gone: the resourceVersion is compacted; relist.
    Gone,
    /// 404 Not Found for the kind's collection: the kind is no longer served.
    KindGone(String),
    /// 403: RBAC does not allow it.
    Forbidden(String),
    /// The session is gone; stop.
    Closed,
    Other(String),
}

fn classify(error: &kube::Error) -> Failure {
    match error {
        kube::Error::Api(status) => classify_status(status),
        other => Failure::Other(other.to_string()),
    }
}

/// Everything but 410, 404 and 403 is reported FAILING as `<code> <reason>: <message>`; the
/// hub reads a leading `401 ` as the account's credentials refused (stream contract, item
/// 11). A 404 is for the collection (a LIST or WATCH of a namespace that does not exist
/// answers 200 and nothing), so it means the kind is gone; the API server's plain-text
/// `404 page not found` reaches here as kube's "Failed to parse error data".
fn classify_status(status: &Status) -> Failure {
    match status.code {
        410 => Failure::Gone,
        404 => Failure::KindGone(format!("404 {}: {}", status.reason, status.message)),
        403 => Failure::Forbidden(status.message.clone()),
        code => Failure::Other(format!("{code} {}: {}", status.reason, status.message)),
    }
}

struct Page {
    items: Vec<Value>,
    resource_version: String,
    continue_token: Option<String>,
}

impl Page {
    fn from_list<K: serde::Serialize + Clone>(list: kube::core::ObjectList<K>) -> Self {
        Self {
            items: list
                .items
                .into_iter()
                .map(|o| serde_json::to_value(o).unwrap_or(Value::Null))
                .collect(),
            resource_version: list.metadata.resource_version.unwrap_or_default(),
            continue_token: list.metadata.continue_,
        }
    }
}

/// One (account, kind, watch namespace) watch.
struct Watch {
    ctx: WatchContext,
    kind: KindRef,
    label: String,
    /// Empty for a cluster-wide watch.
    namespace: String,
    api: Api<DynamicObject>,
    /// The kind's collection path in the watch namespace (Secrets' own requests use it).
    url_path: String,
    /// What the hub was last told about this watch's state.
    reported: Option<(kind_status::State, String)>,
    /// Whether this kind was listed or watched before (here, or by the replica whose resume
    /// point this watch started from): a 403 then is likelier passing than a revoked grant.
    allowed_before: bool,
    /// Delays between attempts while such a kind answers 403.
    forbidden_backoff: Backoff,
}

/// How long to wait after a 403 before trying again. A kind that was allowed before is
/// tried again soon, then less and less often up to `retry`: a kube-apiserver that has just
/// restarted answers 403 until its RBAC authorizer has loaded the roles, for a second or
/// two after it reports ready, and waiting the full `retry` then would leave the hub's
/// cache of the kind stale for minutes. A kind never allowed waits `retry` at once.
fn forbidden_delay(allowed_before: bool, backoff: &mut Backoff, retry: Duration) -> Duration {
    if allowed_before {
        backoff.next_delay().min(retry)
    } else {
        retry
    }
}

/// Runs the watch until its session or assignment ends (the task is aborted, or the channel
/// closes), or until the API server no longer serves the kind. `resume` is the hub's resume
/// point, if any.
pub async fn run(
    ctx: WatchContext,
    kind: KindRef,
    namespace: Option<String>,
    resume: Option<String>,
) -> WatchEnd {
    let resource = kind.api_resource();
    let api = match &namespace {
        Some(ns) => Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &resource),
        None => Api::<DynamicObject>::all_with(ctx.client.clone(), &resource),
    };
    let url_path = DynamicObject::url_path(&resource, namespace.as_deref());
    let forbidden_backoff = Backoff::new(Duration::from_secs(1), 2.0, 0.2, ctx.forbidden_retry);
    let mut watch = Watch {
        url_path,
        label: kind.label(),
        kind,
        namespace: namespace.unwrap_or_default(),
        api,
        ctx,
        reported: None,
        allowed_before: resume.as_deref().is_some_and(|rv| !rv.is_empty()),
        forbidden_backoff,
    };
    watch.update_view(|_| {});
    watch.run(resume.filter(|rv| !rv.is_empty())).await
}

impl Watch {
    async fn run(&mut self, resume: Option<String>) -> WatchEnd {
        let mut resource_version = resume;
        if let Some(rv) = &resource_version {
            self.ctx
                .shared
                .metrics
                .watch_resumes
                .get_or_create(&self.labels())
                .inc();
            tracing::info!(resource_version = %rv, "resuming from the hub's resume point, no LIST");
        }
        let mut backoff = Backoff::for_retries();
        loop {
            let from = match resource_version.take() {
                Some(rv) => rv,
                None => match self.snapshot().await {
                    Ok(rv) => {
                        backoff.reset();
                        self.allowed_before = true;
                        self.forbidden_backoff.reset();
                        rv
                    }
                    Err(failure) => {
                        if let Some(end) = self.failed(failure, &mut backoff).await {
                            return end;
                        }
                        continue;
                    }
                },
            };
            let mut current = from;
            let started = Instant::now();
            let result = self.watch(&mut current).await;
            resource_version = Some(current);
            match result {
                Ok(events) => {
                    if events > 0 || started.elapsed() > Duration::from_secs(10) {
                        backoff.reset();
                        self.forbidden_backoff.reset();
                    } else {
                        // A watch closed at once with nothing in it: do not spin.
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                }
                Err(Failure::Gone) => {
                    self.ctx
                        .shared
                        .metrics
                        .watch_gone
                        .get_or_create(&self.labels())
                        .inc();
                    tracing::info!("resourceVersion is gone (410); relisting");
                    resource_version = None;
                }
                Err(failure) => {
                    if let Some(end) = self.failed(failure, &mut backoff).await {
                        return end;
                    }
                }
            }
        }
    }

    fn labels(&self) -> crate::metrics::KindLabels {
        crate::metrics::KindLabels {
            account: self.ctx.account.clone(),
            kind: self.label.clone(),
        }
    }

    /// Reports a failure and waits before the next attempt; `Some` when the watch must stop.
    async fn failed(&mut self, failure: Failure, backoff: &mut Backoff) -> Option<WatchEnd> {
        match failure {
            Failure::Closed => Some(WatchEnd::Closed),
            Failure::KindGone(message) => {
                // One line, and no KindStatus from here: the streamer reports the kind
                // STOPPED, as rediscovery does for a kind that went away.
                tracing::info!(%message, "the API server no longer serves this kind; ending its watch until discovery lists it again");
                Some(WatchEnd::KindGone)
            }
            Failure::Forbidden(message) => {
                self.ctx
                    .shared
                    .metrics
                    .forbidden
                    .get_or_create(&self.labels())
                    .inc();
                if self
                    .report(kind_status::State::Forbidden, &message)
                    .await
                    .is_err()
                {
                    return Some(WatchEnd::Closed);
                }
                let delay = forbidden_delay(
                    self.allowed_before,
                    &mut self.forbidden_backoff,
                    self.ctx.forbidden_retry,
                );
                tracing::warn!(%message,
                    "RBAC forbids listing or watching this kind; skipped (grant list and watch, or omit it with omitKinds); retrying in {:.1} s",
                    delay.as_secs_f64());
                tokio::time::sleep(delay).await;
                None
            }
            Failure::Gone => {
                // A LIST answered 410 (an expired continue token): list again, not at once.
                tokio::time::sleep(backoff.next_delay()).await;
                None
            }
            Failure::Other(message) => {
                if self
                    .report(kind_status::State::Failing, &message)
                    .await
                    .is_err()
                {
                    return Some(WatchEnd::Closed);
                }
                let delay = backoff.next_delay();
                tracing::warn!(%message, "list or watch failed; retrying in {:.1} s", delay.as_secs_f64());
                tokio::time::sleep(delay).await;
                None
            }
        }
    }

    async fn send(&self, message: agent_message::Kind) -> Result<(), Failure> {
        self.ctx
            .tx
            .send(Outbound {
                account: self.ctx.account.clone(),
                generation: self.ctx.generation,
                message,
            })
            .await
            .map_err(|_| Failure::Closed)
    }

    /// Sends KindStatus when the state (or its message) changed since the last report.
    async fn report(&mut self, state: kind_status::State, message: &str) -> Result<(), Failure> {
        let current = (state, message.to_string());
        if self.reported.as_ref() == Some(&current) {
            return Ok(());
        }
        let view_state = match state {
            kind_status::State::Watching => KindState::Watching,
            kind_status::State::Forbidden => KindState::Forbidden,
            _ => KindState::Failing,
        };
        self.update_view(|view| {
            view.state = view_state;
            view.message = message.to_string();
        });
        self.send(agent_message::Kind::KindStatus(v1::KindStatus {
            account: self.ctx.account.clone(),
            kind: Some(self.kind.to_proto()),
            state: state as i32,
            message: message.to_string(),
            namespaces: if self.namespace.is_empty() {
                Vec::new()
            } else {
                vec![self.namespace.clone()]
            },
        }))
        .await?;
        self.reported = Some(current);
        Ok(())
    }

    fn omitted(&self, object: &Value) -> bool {
        !self.ctx.omit_namespaces.is_empty()
            && self
                .ctx
                .omit_namespaces
                .contains(&convert::namespace(object))
    }

    async fn send_object(
        &self,
        event_type: object_event::Type,
        object: Value,
    ) -> Result<(), Failure> {
        let event = convert::object_event(
            &self.ctx.account,
            &self.kind,
            &self.namespace,
            event_type,
            object,
            self.ctx.max_object_bytes,
        );
        let resource_version = event.resource_version.clone();
        self.send(agent_message::Kind::Object(event)).await?;
        self.update_view(|view| {
            view.objects_sent += 1;
            view.resource_version = resource_version;
        });
        Ok(())
    }

    async fn list_page(&self, params: &ListParams) -> Result<Page, kube::Error> {
        // Secrets are listed as metadata only, decoded without the data client-side
        // `kubectl apply` copies into their metadata (see `secrets`).
        if self.kind.is_secret() {
            let page = secrets::list(&self.ctx.client, &self.url_path, params).await?;
            Ok(Page {
                items: page.items,
                resource_version: page.metadata.resource_version.unwrap_or_default(),
                continue_token: page.metadata.continue_,
            })
        } else {
            Ok(Page::from_list(self.api.list(params).await?))
        }
    }

    /// Updates this watch's entry in the admin view.
    fn update_view(&self, f: impl FnOnce(&mut crate::state::KindView)) {
        self.ctx
            .shared
            .update_kind(&self.ctx.account, &self.kind, &self.namespace, f);
    }

    /// LISTs the kind (under the budget) and sends a snapshot; returns the list's
    /// resourceVersion.
    async fn snapshot(&mut self) -> Result<String, Failure> {
        let _permit = self
            .ctx
            .list_budget
            .acquire()
            .await
            .ok_or(Failure::Closed)?;
        self.ctx
            .shared
            .metrics
            .lists
            .get_or_create(&self.labels())
            .inc();
        self.update_view(|view| view.lists += 1);
        let mut params = ListParams::default().limit(LIST_PAGE);
        let mut count: u64 = 0;
        let mut begun = false;
        loop {
            let page = match tokio::time::timeout(REQUEST_TIMEOUT, self.list_page(&params)).await {
                Ok(page) => page.map_err(|e| classify(&e))?,
                Err(_) => {
                    return Err(Failure::Other(format!(
                        "LIST got no answer within {} s",
                        REQUEST_TIMEOUT.as_secs()
                    )));
                }
            };
            if !begun {
                self.report(kind_status::State::Watching, "").await?;
                self.send(agent_message::Kind::SnapshotBegin(v1::SnapshotBegin {
                    account: self.ctx.account.clone(),
                    kind: Some(self.kind.to_proto()),
                    watch_namespace: self.namespace.clone(),
                }))
                .await?;
                begun = true;
            }
            for item in page.items {
                if self.omitted(&item) {
                    continue;
                }
                self.send_object(object_event::Type::Applied, item).await?;
                count += 1;
            }
            match page.continue_token.filter(|c| !c.is_empty()) {
                Some(token) => params.continue_token = Some(token),
                None => {
                    let resource_version = page.resource_version;
                    self.send(agent_message::Kind::SnapshotEnd(v1::SnapshotEnd {
                        account: self.ctx.account.clone(),
                        kind: Some(self.kind.to_proto()),
                        resource_version: resource_version.clone(),
                        object_count: count,
                        watch_namespace: self.namespace.clone(),
                    }))
                    .await?;
                    let rv = resource_version.clone();
                    self.update_view(|view| view.resource_version = rv);
                    tracing::debug!(objects = count, %resource_version, "snapshot sent");
                    return Ok(resource_version);
                }
            }
        }
    }

    async fn open(
        &self,
        from: &str,
    ) -> Result<BoxStream<'static, kube::Result<Event>>, kube::Error> {
        let params = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
        debug_assert!(params.bookmarks);
        if self.kind.is_secret() {
            secrets::watch(&self.ctx.client, &self.url_path, &params, from).await
        } else {
            let stream = self.api.watch(&params, from).await?;
            Ok(stream.map(|e| e.map(event)).boxed())
        }
    }

    /// Watches from `resource_version` until the watch ends, advancing it; returns the
    /// number of events seen.
    async fn watch(&mut self, resource_version: &mut String) -> Result<u64, Failure> {
        let opened = tokio::time::timeout(REQUEST_TIMEOUT, self.open(resource_version)).await;
        let mut stream = match opened {
            Ok(stream) => stream.map_err(|e| classify(&e))?,
            Err(_) => {
                return Err(Failure::Other(format!(
                    "WATCH got no answer within {} s",
                    REQUEST_TIMEOUT.as_secs()
                )));
            }
        };
        self.report(kind_status::State::Watching, "").await?;
        let mut seen = 0;
        loop {
            let next = match tokio::time::timeout(WATCH_IDLE, stream.next()).await {
                Err(_) => {
                    tracing::debug!("watch idle for too long; re-opening");
                    return Ok(seen);
                }
                Ok(None) => return Ok(seen),
                Ok(Some(Err(error))) => return Err(classify(&error)),
                Ok(Some(Ok(event))) => event,
            };
            seen += 1;
            match next {
                Event::Applied(object) | Event::Deleted(object) if self.omitted(&object) => {
                    *resource_version = convert::resource_version(&object);
                }
                Event::Applied(object) => {
                    *resource_version = convert::resource_version(&object);
                    self.send_object(object_event::Type::Applied, object)
                        .await?;
                }
                Event::Deleted(object) => {
                    *resource_version = convert::resource_version(&object);
                    self.send_object(object_event::Type::Deleted, object)
                        .await?;
                }
                Event::Bookmark(rv) if rv.is_empty() => {}
                Event::Bookmark(rv) => {
                    *resource_version = rv.clone();
                    self.send(agent_message::Kind::Bookmark(v1::Bookmark {
                        account: self.ctx.account.clone(),
                        kind: Some(self.kind.to_proto()),
                        resource_version: rv.clone(),
                        watch_namespace: self.namespace.clone(),
                    }))
                    .await?;
                    self.update_view(|view| view.resource_version = rv);
                }
                Event::Error(status) => return Err(classify_status(&status)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified() {
        let status = |code: u16| Status {
            code,
            message: format!("m{code}"),
            ..Default::default()
        };
        assert!(matches!(classify_status(&status(410)), Failure::Gone));
        assert!(matches!(classify_status(&status(403)), Failure::Forbidden(m) if m == "m403"));
        assert!(matches!(classify_status(&status(500)), Failure::Other(_)));
        // The API server's plain-text "404 page not found" for a kind it no longer serves.
        let unparsed = Status {
            reason: "Failed to parse error data".into(),
            ..status(404)
        };
        assert!(
            matches!(classify_status(&unparsed), Failure::KindGone(m) if m == "404 Failed to parse error data: m404")
        );
        // The hub reads "401 " at the start of a FAILING message as credentials refused
        // (stream contract, item 11): keep the code first.
        let refused = Status {
            reason: "Unauthorized".into(),
            ..status(401)
        };
        assert!(
            matches!(classify(&kube::Error::Api(Box::new(refused))), Failure::Other(m) if m == "401 Unauthorized: m401")
        );
        assert!(matches!(
            classify(&kube::Error::Api(Box::new(status(410)))),
            Failure::Gone
        ));
    }

    /// Found by `e2e/tests/chaos.rs` (round RestartApiServer): a restarted kube-apiserver
    /// answered 403 for a second after it was ready, and the agent then left every kind
    /// unwatched for 300 s while the hub served what it had before the restart.
    #[test]
    fn a_403_for_a_kind_allowed_before_is_retried_soon_then_less_often() {
        let retry = FORBIDDEN_RETRY;
        let mut backoff = Backoff::new(Duration::from_secs(1), 2.0, 0.2, retry);
        let first = forbidden_delay(true, &mut backoff, retry);
        assert!(first <= Duration::from_millis(1200), "{first:?}");
        let delays: Vec<Duration> = (0..12)
            .map(|_| forbidden_delay(true, &mut backoff, retry))
            .collect();
        assert!(delays.windows(2).all(|w| w[1] >= w[0] / 2), "{delays:?}");
        let last = delays.last().copied().unwrap_or_default();
        assert!(
            last >= retry.mul_f64(0.8) && last <= retry,
            "a revoked grant settles at {retry:?} (±20 %): {delays:?}"
        );
        let mut fresh = Backoff::new(Duration::from_secs(1), 2.0, 0.2, retry);
        assert_eq!(forbidden_delay(false, &mut fresh, retry), retry);
    }
}
