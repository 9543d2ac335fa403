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

mod account;
mod cached_bytes;
pub mod history;
mod objects;
pub use scale_agent_hub_model::packed;
mod results;
pub mod selector;
mod shared;

use bytes::Bytes;
pub use cached_bytes::CachedBytes;
pub use history::{EventType, History, HistoryBudget, HistoryEvent};
pub use objects::{Objects, object_bytes};
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
    /// What this account last added to the hub-wide total of cached bytes
    /// ([`CachedBytes::settle`]).
    counted_bytes: u64,
}

impl AccountCache {
    pub fn object_count(&self) -> usize {
        self.kinds.values().map(|k| k.objects.len()).sum()
    }

    /// What the account's objects hold in memory, all kinds together.
    pub fn object_bytes(&self) -> u64 {
        self.kinds.values().map(|k| k.objects.bytes()).sum()
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
    /// The bytes all accounts' objects hold, against `--max-cached-mib` (settled when the
    /// running hub's [`SharedCache`] is made of this cache).
    pub cached_bytes: CachedBytes,
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
