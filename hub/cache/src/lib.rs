//! `scale-agent-hub-cache`: the hub's in-memory cache, account → kind → objects, with the
//! resume point of every watch scope and the proxy's watch histories. Pure: every mutation
//! also pushes the [`StoreOp`]s that persist it. Depends only on the model crate.
//!
//! [`selector`] selects cached objects by labels and fields as the API server does: the
//! proxy's cached reads and the REST API's objects route both use it.

use std::{cmp::Ordering, collections::BTreeMap, sync::Arc};

use scale_agent_proto::v1 as pb;
use serde::Serialize;

use scale_agent_hub_model::store_op::StoreOp;

pub mod history;
mod objects;
pub use scale_agent_hub_model::packed;
mod results;
pub mod selector;
mod shared;

use bytes::Bytes;
pub use history::{EventType, History, HistoryBudget, HistoryEvent};
pub use objects::Objects;
pub use packed::PackedJson;
pub use results::{apply_result_to_account, apply_result_to_cache};
pub use shared::{AccountSlot, SharedCache, lock};

pub use scale_agent_hub_model::object::{CachedObject, KindInfo, KindKey};

/// The last state an agent reported for a kind in one scope (KindStatus). Not persisted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindState {
    pub state: String,
    pub message: String,
    pub namespaces: Vec<String>,
}

/// Everything cached for one kind of one account.
#[derive(Clone, Debug)]
pub struct KindCache {
    pub info: KindInfo,
    /// By uid and by namespace and name ([`Objects`]). Shared: a read copies out pointers,
    /// not objects, so it holds the account's lock only briefly, and the store's queue
    /// shares the objects it persists.
    pub objects: Objects,
    /// Watch namespace ("" for a cluster-wide watch) → last resourceVersion.
    pub resume: BTreeMap<String, String>,
    /// The last state reported for each scope (the KindStatus's namespaces, sorted; empty for
    /// cluster-wide): a kind may be WATCHING in one namespace and FORBIDDEN in another.
    pub statuses: BTreeMap<Vec<String>, KindState>,
    /// Each watch scope's recent events, for the proxy's watches: "" for the agent's
    /// cluster-wide watch, the namespace for a per-namespace one (an account with
    /// `namespaces:`). A scope's history is reset, never removed, so its generation only
    /// grows.
    pub histories: BTreeMap<String, History>,
    /// Objects an operation's result wrote before the watch delivered them (uid → whether
    /// the object existed before), so the watch's echo gets its right event type.
    pub written_through: BTreeMap<String, bool>,
    /// Set (with the reason) while the kind is not cached because it would take the account
    /// past `--max-objects-per-account`: it holds no objects and no resume points, and its
    /// events are ignored until a snapshot that fits.
    pub over_quota: Option<String>,
}

/// How much a state needs attention, for the summary of several scopes: anything but
/// WATCHING before WATCHING, FORBIDDEN and FAILING first.
fn severity(state: &str) -> u8 {
    match state {
        "FORBIDDEN" | "FAILING" => 3,
        "WATCHING" => 0,
        "STOPPED" => 1,
        _ => 2,
    }
}

impl KindCache {
    /// The state that most needs attention among the scopes (its message and namespaces
    /// with it), or `None` before any KindStatus.
    pub fn summary_status(&self) -> Option<&KindState> {
        self.statuses.values().max_by_key(|s| severity(&s.state))
    }

    /// The history of a watch scope ("" for the cluster-wide watch).
    pub fn history(&self, scope: &str) -> Option<&History> {
        self.histories.get(scope)
    }

    /// Starts the history of `scope` over from `start` (created when new).
    fn reset_history(&mut self, scope: &str, start: Option<u64>) {
        self.histories
            .entry(scope.to_string())
            .or_default()
            .reset(start);
    }

    /// Breaks the histories whose watch covers objects of `namespace` (the cluster-wide one,
    /// and the namespace's own), other than `except`: objects there changed without an event
    /// of theirs, so their watchers must list again.
    fn break_histories(&mut self, namespace: &str, except: &str) {
        for scope in ["", namespace] {
            if scope == except {
                continue;
            }
            if let Some(history) = self.histories.get_mut(scope)
                && history.start.is_some()
            {
                history.reset(None);
            }
        }
    }

    fn new(info: KindInfo) -> Self {
        KindCache {
            info,
            objects: Objects::default(),
            resume: BTreeMap::new(),
            statuses: BTreeMap::new(),
            histories: BTreeMap::new(),
            written_through: BTreeMap::new(),
            over_quota: None,
        }
    }
}

/// Everything cached for one account.
#[derive(Clone, Debug, Default)]
pub struct AccountCache {
    pub kinds: BTreeMap<KindKey, KindCache>,
}

impl AccountCache {
    pub fn object_count(&self) -> usize {
        self.kinds.values().map(|k| k.objects.len()).sum()
    }
}

/// Whether resourceVersion `new` is newer than `old`. resourceVersions are opaque in
/// general; when both parse as integers (etcd revisions) they are compared numerically,
/// otherwise `new` is taken as newer (always applied).
pub fn is_newer(new: &str, old: &str) -> bool {
    match (new.parse::<u64>(), old.parse::<u64>()) {
        (Ok(n), Ok(o)) => n.cmp(&o) == Ordering::Greater,
        _ => true,
    }
}

/// An object event after validation.
#[derive(Clone, Debug)]
pub struct Event {
    pub deleted: bool,
    pub object: CachedObject,
    pub watch_namespace: String,
}

/// What applying a delta did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Stored,
    Deleted,
    /// Not newer than what the cache holds (a replay): ignored.
    Stale,
}

/// The whole cache.
#[derive(Clone, Debug, Default)]
pub struct Cache {
    pub accounts: BTreeMap<String, AccountCache>,
    /// The bytes all the watch histories hold, against `--watch-history-mib`.
    pub history_budget: HistoryBudget,
}

impl AccountCache {
    /// The kind's cache, created (and persisted) on first use; a changed version or plural
    /// is recorded.
    fn kind_mut(
        &mut self,
        account: &str,
        info: &KindInfo,
        ops: &mut Vec<StoreOp>,
    ) -> &mut KindCache {
        let key = info.key();
        let entry = self.kinds.entry(key.clone()).or_insert_with(|| {
            ops.push(StoreOp::PutKind {
                account: account.to_string(),
                info: info.clone(),
            });
            KindCache::new(info.clone())
        });
        if entry.info != *info {
            entry.info = info.clone();
            ops.push(StoreOp::PutKind {
                account: account.to_string(),
                info: info.clone(),
            });
        }
        entry
    }

    /// Records the agent's KindStatus (memory only).
    pub fn set_status(
        &mut self,
        account: &str,
        info: &KindInfo,
        state: KindState,
        ops: &mut Vec<StoreOp>,
    ) {
        let mut scope = state.namespaces.clone();
        scope.sort();
        scope.dedup();
        self.kind_mut(account, info, ops)
            .statuses
            .insert(scope, state);
    }

    /// Applies one delta in order, idempotently: an event whose resourceVersion is not newer
    /// than the object's cached one, or than its watch's resume point, is ignored.
    pub fn apply_event(
        &mut self,
        account: &str,
        info: &KindInfo,
        event: Event,
        budget: &HistoryBudget,
        ops: &mut Vec<StoreOp>,
    ) -> Applied {
        let kind = self.kind_mut(account, info, ops);
        let rv = event.object.resource_version.clone();
        let behind_resume = kind
            .resume
            .get(&event.watch_namespace)
            .is_some_and(|r| !is_newer(&rv, r));
        let behind_object = kind
            .objects
            .get(&event.object.uid)
            .is_some_and(|o| !is_newer(&rv, &o.resource_version));
        if behind_resume {
            return Applied::Stale;
        }
        let key = info.key();
        record_history(kind, &event, budget);
        if behind_object {
            // The echo of a write an operation's result already brought in.
            advance(kind, account, &key, &event.watch_namespace, &rv, ops);
            return Applied::Stale;
        }
        let applied = if event.deleted {
            if kind.objects.remove(&event.object.uid).is_some() {
                ops.push(StoreOp::DeleteObject {
                    account: account.to_string(),
                    kind: key.clone(),
                    uid: event.object.uid.clone(),
                });
            }
            Applied::Deleted
        } else {
            let object = Arc::new(event.object);
            ops.push(StoreOp::PutObject {
                account: account.to_string(),
                kind: key.clone(),
                object: object.clone(),
            });
            kind.objects.insert(object);
            Applied::Stored
        };
        advance(kind, account, &key, &event.watch_namespace, &rv, ops);
        applied
    }

    /// A bookmark: advances the watch's resume point.
    pub fn bookmark(
        &mut self,
        account: &str,
        info: &KindInfo,
        watch_namespace: &str,
        rv: &str,
        ops: &mut Vec<StoreOp>,
    ) {
        let key = info.key();
        let kind = self.kind_mut(account, info, ops);
        advance(kind, account, &key, watch_namespace, rv, ops);
    }

    /// Replaces a watch scope's objects with a finished snapshot (all the kind's objects for a
    /// cluster-wide watch, the namespace's for a namespaced one) and sets its resume point
    /// to the LIST's resourceVersion. Returns (objects stored, objects pruned).
    pub fn replace_scope(
        &mut self,
        account: &str,
        info: &KindInfo,
        watch_namespace: &str,
        snapshot: BTreeMap<String, CachedObject>,
        list_rv: &str,
        ops: &mut Vec<StoreOp>,
    ) -> (usize, usize) {
        let key = info.key();
        let kind = self.kind_mut(account, info, ops);
        let pruned: Vec<String> = kind
            .objects
            .in_scope((!watch_namespace.is_empty()).then_some(watch_namespace))
            .filter(|o| !snapshot.contains_key(&o.uid))
            .map(|o| o.uid.clone())
            .collect();
        for uid in &pruned {
            kind.objects.remove(uid);
            ops.push(StoreOp::DeleteObject {
                account: account.to_string(),
                kind: key.clone(),
                uid: uid.clone(),
            });
        }
        let stored = snapshot.len();
        // A first sync builds the map at once: built from sorted entries, its nodes are
        // full; inserted one by one in order, about half full (memory per cached object).
        let first = kind.objects.is_empty();
        let mut built = Vec::with_capacity(if first { snapshot.len() } else { 0 });
        for (uid, object) in snapshot {
            if kind.objects.get(&uid).is_some_and(|o| **o == object) {
                continue;
            }
            let object = Arc::new(object);
            ops.push(StoreOp::PutObject {
                account: account.to_string(),
                kind: key.clone(),
                object: object.clone(),
            });
            if first {
                built.push(object);
            } else {
                kind.objects.insert(object);
            }
        }
        if first {
            kind.objects = built.into_iter().collect();
        }
        // The proxy's watches of the old state end; the snapshot starts its scope's history
        // anew. A namespace's snapshot changed objects the cluster-wide watch (if any) did
        // not announce; a cluster-wide snapshot supersedes every per-namespace watch.
        if watch_namespace.is_empty() {
            for history in kind.histories.values_mut() {
                history.reset(None);
            }
        } else {
            kind.break_histories(watch_namespace, watch_namespace);
        }
        kind.reset_history(watch_namespace, list_rv.parse().ok());
        kind.written_through.clear();
        if watch_namespace.is_empty() {
            // A cluster-wide watch supersedes any per-namespace ones.
            let stale: Vec<String> = kind
                .resume
                .keys()
                .filter(|ns| !ns.is_empty())
                .cloned()
                .collect();
            for ns in stale {
                kind.resume.remove(&ns);
                ops.push(StoreOp::DeleteResume {
                    account: account.to_string(),
                    kind: key.clone(),
                    watch_namespace: ns,
                });
            }
        }
        kind.resume
            .insert(watch_namespace.to_string(), list_rv.to_string());
        ops.push(StoreOp::PutResume {
            account: account.to_string(),
            kind: key,
            watch_namespace: watch_namespace.to_string(),
            resource_version: list_rv.to_string(),
        });
        (stored, pruned.len())
    }

    /// A kind no longer watched (KindStatus STOPPED): forgets its objects and resume points
    /// in `namespaces` (all of them when empty), so nothing stale is served.
    pub fn drop_scope(
        &mut self,
        account: &str,
        info: &KindInfo,
        namespaces: &[String],
        ops: &mut Vec<StoreOp>,
    ) -> usize {
        let key = info.key();
        let kind = self.kind_mut(account, info, ops);
        let in_scope = |ns: &String| namespaces.is_empty() || namespaces.contains(ns);
        for (scope, history) in &mut kind.histories {
            if scope.is_empty() || in_scope(scope) {
                history.reset(None);
            }
        }
        let doomed: Vec<String> = kind
            .objects
            .values()
            .filter(|o| in_scope(&o.namespace))
            .map(|o| o.uid.clone())
            .collect();
        for uid in &doomed {
            kind.objects.remove(uid);
            ops.push(StoreOp::DeleteObject {
                account: account.to_string(),
                kind: key.clone(),
                uid: uid.clone(),
            });
        }
        let scopes: Vec<String> = kind
            .resume
            .keys()
            .filter(|ns| in_scope(ns))
            .cloned()
            .collect();
        for ns in scopes {
            kind.resume.remove(&ns);
            ops.push(StoreOp::DeleteResume {
                account: account.to_string(),
                kind: key.clone(),
                watch_namespace: ns,
            });
        }
        doomed.len()
    }

    /// Whether the kind is left out of the cache for the account's object quota.
    pub fn is_over_quota(&self, key: &KindKey) -> bool {
        self.kinds.get(key).is_some_and(|k| k.over_quota.is_some())
    }

    /// Leaves a kind out of the cache, whole, for the account's object quota: its objects
    /// and resume points are dropped (never a part of them), so the proxy sends its reads to
    /// the cluster and nothing stale or partial is served.
    pub fn exceed_quota(
        &mut self,
        account: &str,
        info: &KindInfo,
        reason: String,
        ops: &mut Vec<StoreOp>,
    ) -> usize {
        let dropped = self.drop_scope(account, info, &[], ops);
        self.kind_mut(account, info, ops).over_quota = Some(reason);
        dropped
    }

    /// The resume points of every watch of an account, for a STREAMING assignment.
    pub fn resume_points(&self) -> Vec<pb::ResumePoint> {
        self.kinds
            .values()
            .flat_map(|k| {
                k.resume.iter().map(|(ns, rv)| pb::ResumePoint {
                    kind: Some(k.info.to_proto()),
                    resource_version: rv.clone(),
                    watch_namespace: ns.clone(),
                })
            })
            .collect()
    }
}

impl Cache {
    pub fn object_count(&self) -> usize {
        self.accounts.values().map(AccountCache::object_count).sum()
    }

    /// The account's cache, created on first use.
    pub fn account_mut(&mut self, account: &str) -> &mut AccountCache {
        self.accounts.entry(account.to_string()).or_default()
    }

    /// Forgets an account.
    pub fn remove_account(&mut self, account: &str) {
        self.accounts.remove(account);
    }

    /// Loads persisted state (at start-up, no store ops).
    pub fn load_kind(&mut self, account: &str, info: KindInfo) {
        self.accounts
            .entry(account.to_string())
            .or_default()
            .kinds
            .entry(info.key())
            .or_insert_with(|| KindCache::new(info));
    }

    /// Loads a persisted object; false when its kind is unknown.
    pub fn load_object(&mut self, account: &str, kind: &KindKey, object: CachedObject) -> bool {
        match self
            .accounts
            .get_mut(account)
            .and_then(|a| a.kinds.get_mut(kind))
        {
            Some(k) => {
                k.objects.insert(Arc::new(object));
                true
            }
            None => false,
        }
    }

    /// Loads a persisted resume point; false when its kind is unknown.
    pub fn load_resume(&mut self, account: &str, kind: &KindKey, ns: String, rv: String) -> bool {
        match self
            .accounts
            .get_mut(account)
            .and_then(|a| a.kinds.get_mut(kind))
        {
            Some(k) => {
                // After a restart the agent resumes the watch from here: the history of
                // the watch's scope starts at its resume point.
                k.reset_history(&ns, rv.parse().ok());
                k.resume.insert(ns, rv);
                true
            }
            None => false,
        }
    }

    /// See [`AccountCache::set_status`].
    pub fn set_status(
        &mut self,
        account: &str,
        info: &KindInfo,
        state: KindState,
        ops: &mut Vec<StoreOp>,
    ) {
        self.account_mut(account)
            .set_status(account, info, state, ops);
    }

    /// See [`AccountCache::apply_event`].
    pub fn apply_event(
        &mut self,
        account: &str,
        info: &KindInfo,
        event: Event,
        ops: &mut Vec<StoreOp>,
    ) -> Applied {
        let budget = self.history_budget.clone();
        self.account_mut(account)
            .apply_event(account, info, event, &budget, ops)
    }

    /// See [`AccountCache::bookmark`].
    pub fn bookmark(
        &mut self,
        account: &str,
        info: &KindInfo,
        watch_namespace: &str,
        rv: &str,
        ops: &mut Vec<StoreOp>,
    ) {
        self.account_mut(account)
            .bookmark(account, info, watch_namespace, rv, ops);
    }

    /// See [`AccountCache::replace_scope`].
    pub fn replace_scope(
        &mut self,
        account: &str,
        info: &KindInfo,
        watch_namespace: &str,
        snapshot: BTreeMap<String, CachedObject>,
        list_rv: &str,
        ops: &mut Vec<StoreOp>,
    ) -> (usize, usize) {
        self.account_mut(account).replace_scope(
            account,
            info,
            watch_namespace,
            snapshot,
            list_rv,
            ops,
        )
    }

    /// See [`AccountCache::drop_scope`].
    pub fn drop_scope(
        &mut self,
        account: &str,
        info: &KindInfo,
        namespaces: &[String],
        ops: &mut Vec<StoreOp>,
    ) -> usize {
        self.account_mut(account)
            .drop_scope(account, info, namespaces, ops)
    }

    /// The resume points of every watch of an account, for a STREAMING assignment.
    pub fn resume_points(&self, account: &str) -> Vec<pb::ResumePoint> {
        self.accounts
            .get(account)
            .map(AccountCache::resume_points)
            .unwrap_or_default()
    }
}

/// Appends a watch's event to the history of its scope (before the object map changes:
/// whether the object was there decides ADDED or MODIFIED).
fn record_history(kind: &mut KindCache, event: &Event, budget: &HistoryBudget) {
    let scope = event.watch_namespace.as_str();
    // Another watch covering the object (the cluster-wide one during a move to
    // per-namespace watches, or back) does not see this event.
    kind.break_histories(&event.object.namespace, scope);
    let Ok(resource_version) = event.object.resource_version.parse::<u64>() else {
        kind.reset_history(scope, None);
        return;
    };
    if event.object.truncated {
        // A watcher cannot be sent what the hub does not hold.
        kind.reset_history(scope, None);
        return;
    }
    let uid = &event.object.uid;
    let previous = kind
        .objects
        .get(uid)
        .filter(|o| !o.truncated)
        .and_then(|o| o.json.unpack().ok())
        .map(Bytes::from);
    let existed = kind
        .written_through
        .remove(uid)
        .unwrap_or(previous.is_some());
    let event_type = if event.deleted {
        EventType::Deleted
    } else if existed {
        EventType::Modified
    } else {
        EventType::Added
    };
    let Ok(json) = event.object.json.unpack() else {
        kind.reset_history(scope, None);
        return;
    };
    kind.histories.entry(scope.to_string()).or_default().push(
        HistoryEvent {
            resource_version,
            event_type,
            namespace: event.object.namespace.clone(),
            json: Bytes::from(json),
            previous: previous.filter(|_| existed),
        },
        budget,
    );
}

fn advance(
    kind: &mut KindCache,
    account: &str,
    key: &KindKey,
    watch_namespace: &str,
    rv: &str,
    ops: &mut Vec<StoreOp>,
) {
    if rv.is_empty() {
        return;
    }
    let newer = kind
        .resume
        .get(watch_namespace)
        .is_none_or(|old| is_newer(rv, old));
    if newer {
        kind.resume
            .insert(watch_namespace.to_string(), rv.to_string());
        ops.push(StoreOp::PutResume {
            account: account.to_string(),
            kind: key.clone(),
            watch_namespace: watch_namespace.to_string(),
            resource_version: rv.to_string(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> KindInfo {
        KindInfo {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            plural: "deployments".into(),
            namespaced: true,
        }
    }

    fn obj(ns: &str, name: &str, rv: &str) -> CachedObject {
        CachedObject {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{ns}-{name}"),
            resource_version: rv.into(),
            json: format!(r#"{{"metadata":{{"name":"{name}","resourceVersion":"{rv}"}}}}"#)
                .into_bytes()
                .into(),
            truncated: false,
        }
    }

    fn ev(deleted: bool, o: CachedObject, ns: &str) -> Event {
        Event {
            deleted,
            object: o,
            watch_namespace: ns.into(),
        }
    }

    fn snapshot(objs: &[CachedObject]) -> BTreeMap<String, CachedObject> {
        objs.iter().map(|o| (o.uid.clone(), o.clone())).collect()
    }

    #[test]
    fn newer() {
        assert!(is_newer("10", "9"));
        assert!(!is_newer("9", "10"));
        assert!(!is_newer("10", "10"));
        assert!(is_newer("abc", "10"));
        assert!(is_newer("10", "abc"));
    }

    #[test]
    fn snapshot_prunes_and_sets_resume_point() {
        let mut c = Cache::default();
        let mut ops = Vec::new();
        c.replace_scope(
            "a",
            &info(),
            "",
            snapshot(&[obj("x", "one", "5"), obj("x", "two", "6")]),
            "10",
            &mut ops,
        );
        assert_eq!(c.object_count(), 2);
        assert!(ops.iter().any(|o| matches!(o, StoreOp::PutKind { .. })));
        let mut ops = Vec::new();
        let (stored, pruned) = c.replace_scope(
            "a",
            &info(),
            "",
            snapshot(&[obj("x", "two", "6"), obj("y", "three", "12")]),
            "20",
            &mut ops,
        );
        assert_eq!((stored, pruned), (2, 1));
        let names: Vec<_> = c.accounts["a"].kinds[&info().key()]
            .objects
            .values()
            .map(|o| o.name.clone())
            .collect();
        assert_eq!(names, vec!["two", "three"]);
        // Unchanged "two" is not rewritten; "one" deleted; "three" put; resume point put.
        assert_eq!(
            ops.iter()
                .filter(|o| matches!(o, StoreOp::PutObject { .. }))
                .count(),
            1
        );
        assert_eq!(
            ops.iter()
                .filter(|o| matches!(o, StoreOp::DeleteObject { .. }))
                .count(),
            1
        );
        let rp = c.resume_points("a");
        assert_eq!(rp.len(), 1);
        assert_eq!(rp[0].resource_version, "20");
    }

    #[test]
    fn namespaced_snapshot_only_replaces_its_namespace() {
        let mut c = Cache::default();
        let mut ops = Vec::new();
        c.replace_scope(
            "a",
            &info(),
            "x",
            snapshot(&[obj("x", "one", "5")]),
            "10",
            &mut ops,
        );
        c.replace_scope(
            "a",
            &info(),
            "y",
            snapshot(&[obj("y", "two", "6")]),
            "11",
            &mut ops,
        );
        c.replace_scope("a", &info(), "x", snapshot(&[]), "12", &mut ops);
        let k = &c.accounts["a"].kinds[&info().key()];
        assert_eq!(k.objects.len(), 1);
        assert_eq!(k.resume.len(), 2);
        assert_eq!(k.resume["x"], "12");
    }

    #[test]
    fn deltas_are_idempotent() {
        let mut c = Cache::default();
        let mut ops = Vec::new();
        c.replace_scope("a", &info(), "", snapshot(&[]), "10", &mut ops);
        assert_eq!(
            c.apply_event("a", &info(), ev(false, obj("x", "one", "11"), ""), &mut ops),
            Applied::Stored
        );
        assert_eq!(
            c.apply_event("a", &info(), ev(false, obj("x", "one", "13"), ""), &mut ops),
            Applied::Stored
        );
        // Replay of an older version, and of the same one.
        assert_eq!(
            c.apply_event("a", &info(), ev(false, obj("x", "one", "11"), ""), &mut ops),
            Applied::Stale
        );
        assert_eq!(
            c.apply_event("a", &info(), ev(false, obj("x", "one", "13"), ""), &mut ops),
            Applied::Stale
        );
        assert_eq!(
            c.accounts["a"].kinds[&info().key()].objects["uid-x-one"].resource_version,
            "13"
        );
        assert_eq!(
            c.apply_event("a", &info(), ev(true, obj("x", "one", "14"), ""), &mut ops),
            Applied::Deleted
        );
        // A replayed APPLIED from before the delete does not resurrect the object.
        assert_eq!(
            c.apply_event("a", &info(), ev(false, obj("x", "one", "13"), ""), &mut ops),
            Applied::Stale
        );
        assert_eq!(c.object_count(), 0);
        assert_eq!(c.resume_points("a")[0].resource_version, "14");
        // Non-numeric resourceVersions are always applied.
        assert_eq!(
            c.apply_event(
                "a",
                &info(),
                ev(false, obj("x", "two", "abc"), ""),
                &mut ops
            ),
            Applied::Stored
        );
    }

    #[test]
    fn stopped_kinds_are_dropped() {
        let mut c = Cache::default();
        let mut ops = Vec::new();
        c.replace_scope(
            "a",
            &info(),
            "x",
            snapshot(&[obj("x", "one", "5")]),
            "10",
            &mut ops,
        );
        c.replace_scope(
            "a",
            &info(),
            "y",
            snapshot(&[obj("y", "two", "6")]),
            "11",
            &mut ops,
        );
        assert_eq!(c.drop_scope("a", &info(), &["x".to_string()], &mut ops), 1);
        let k = &c.accounts["a"].kinds[&info().key()];
        assert_eq!(k.objects.len(), 1);
        assert_eq!(k.resume.keys().collect::<Vec<_>>(), ["y"]);
        assert_eq!(c.drop_scope("a", &info(), &[], &mut ops), 1);
        assert!(c.resume_points("a").is_empty());
        assert_eq!(c.object_count(), 0);
    }

    #[test]
    fn each_namespace_watch_has_its_own_history() {
        let mut c = Cache::default();
        let mut ops = Vec::new();
        let rvs = |c: &Cache, scope: &str, from: u64| {
            c.accounts["a"].kinds[&info().key()]
                .history(scope)
                .and_then(|h| h.since(from))
                .map(|events| events.map(|e| e.resource_version).collect::<Vec<_>>())
        };
        c.replace_scope(
            "a",
            &info(),
            "x",
            snapshot(&[obj("x", "one", "5")]),
            "10",
            &mut ops,
        );
        c.replace_scope("a", &info(), "y", snapshot(&[]), "11", &mut ops);
        c.apply_event(
            "a",
            &info(),
            ev(false, obj("x", "one", "12"), "x"),
            &mut ops,
        );
        c.apply_event(
            "a",
            &info(),
            ev(false, obj("y", "two", "13"), "y"),
            &mut ops,
        );
        c.apply_event(
            "a",
            &info(),
            ev(false, obj("x", "three", "14"), "x"),
            &mut ops,
        );
        assert_eq!(rvs(&c, "x", 10), Some(vec![12, 14]));
        assert_eq!(rvs(&c, "y", 11), Some(vec![13]));
        assert_eq!(
            rvs(&c, "x", 9),
            None,
            "older than the namespace's snapshot: 410"
        );
        assert_eq!(rvs(&c, "", 0), None, "no cluster-wide watch");
        let k = &c.accounts["a"].kinds[&info().key()];
        let x = k.history("x").unwrap();
        assert_eq!(x.events[0].event_type, EventType::Modified);
        assert_eq!(x.events[1].event_type, EventType::Added);
        let generation = x.generation;
        // Another namespace's relist or stop leaves this one's watchers alone.
        c.replace_scope("a", &info(), "y", snapshot(&[]), "15", &mut ops);
        c.drop_scope("a", &info(), &["y".to_string()], &mut ops);
        let x = c.accounts["a"].kinds[&info().key()].history("x").unwrap();
        assert_eq!(x.generation, generation);
        assert_eq!(rvs(&c, "x", 12), Some(vec![14]));
        // Its own relist starts it anew; a cluster-wide snapshot supersedes it.
        c.replace_scope("a", &info(), "x", snapshot(&[]), "16", &mut ops);
        assert_eq!(rvs(&c, "x", 14), None);
        assert_eq!(rvs(&c, "x", 16), Some(vec![]));
        c.replace_scope("a", &info(), "", snapshot(&[]), "17", &mut ops);
        assert_eq!(rvs(&c, "x", 16), None);
        assert_eq!(rvs(&c, "", 17), Some(vec![]));
        // An event of a namespace's own watch is not in the cluster-wide history: it breaks.
        c.apply_event(
            "a",
            &info(),
            ev(false, obj("x", "four", "18"), "x"),
            &mut ops,
        );
        assert_eq!(rvs(&c, "", 17), None);
        // After a restart each scope's history starts at its persisted resume point.
        let mut restarted = Cache::default();
        restarted.load_kind("a", info());
        restarted.load_resume("a", &info().key(), "x".into(), "30".into());
        assert_eq!(rvs(&restarted, "x", 30), Some(vec![]));
        assert_eq!(rvs(&restarted, "x", 29), None);
    }

    #[test]
    fn bookmarks_only_advance() {
        let mut c = Cache::default();
        let mut ops = Vec::new();
        c.bookmark("a", &info(), "", "30", &mut ops);
        c.bookmark("a", &info(), "", "20", &mut ops);
        assert_eq!(c.resume_points("a")[0].resource_version, "30");
    }

    #[test]
    fn kind_validation() {
        assert!(KindInfo::from_proto(None).is_err());
        let mut k = info().to_proto();
        assert_eq!(KindInfo::from_proto(Some(&k)).unwrap(), info());
        k.version.clear();
        assert!(KindInfo::from_proto(Some(&k)).is_err());
        assert_eq!(
            KindKey::from_storage_key(&info().key().storage_key()),
            Some(info().key())
        );
        assert_eq!(
            KindKey::from_storage_key("/Pod").unwrap().to_string(),
            "Pod"
        );
    }

    /// Many accounts' histories share the hub's budget: the cache never holds more (each
    /// history here keeps more than its floor), a removed account or a relist gives its
    /// bytes back, and a watcher from before a trimmed history's start is told it is too
    /// old.
    #[test]
    fn histories_of_all_accounts_share_the_budget() {
        let mut c = Cache {
            history_budget: HistoryBudget::new(64 * 1024),
            ..Cache::default()
        };
        let mut ops = Vec::new();
        let accounts: Vec<String> = (0..8).map(|i| format!("account-{i}")).collect();
        for a in &accounts {
            c.replace_scope(a, &info(), "", snapshot(&[]), "10", &mut ops);
        }
        let held = |c: &Cache| -> usize {
            c.accounts
                .values()
                .flat_map(|a| a.kinds.values())
                .flat_map(|k| k.histories.values())
                .map(History::bytes)
                .sum()
        };
        for rv in 11..2000u64 {
            for a in &accounts {
                let o = obj("x", &format!("object-{}", rv % 7), &rv.to_string());
                c.apply_event(a, &info(), ev(false, o, ""), &mut ops);
                let budget = &c.history_budget;
                assert!(budget.held() <= budget.limit(), "{} held", budget.held());
            }
            ops.clear();
        }
        assert_eq!(c.history_budget.held(), held(&c));
        assert!(c.history_budget.evicted() > 0);
        let h = c.accounts["account-0"].kinds[&info().key()]
            .history("")
            .unwrap();
        let start = h.start.unwrap();
        assert!(start > 10 && h.events.len() > history::MIN_EVENTS);
        assert!(h.since(start - 1).is_none(), "behind the window: 410");
        assert_eq!(h.since(start).unwrap().count(), h.events.len());
        // A removed account, and a relist, give their bytes back.
        let before = c.history_budget.held();
        c.remove_account("account-0");
        assert!(c.history_budget.held() < before);
        c.replace_scope("account-1", &info(), "", snapshot(&[]), "3000", &mut ops);
        assert_eq!(c.history_budget.held(), held(&c));
        for a in &accounts[2..] {
            c.remove_account(a);
        }
        assert_eq!(c.history_budget.held(), 0);
    }
}
