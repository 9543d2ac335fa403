//! The per-account operations of the cache ([`AccountCache`]): kinds, objects, snapshots and
//! resume points of one account, under that account's own lock ([`crate::SharedCache`]), and
//! the watch histories they feed.

use super::*;

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
