//! [`Objects`]: one kind's cached objects, indexed by uid (what the agent's events name) and
//! by namespace and name (what reads name).
//!
//! Both indexes are ordered sets of the same `Arc`s, each ordered by a key read from the
//! object itself, so an index costs one pointer and its share of a B-tree node per object
//! (about 16 bytes), not a copy of the key: the uid-keyed map this replaced held a second
//! copy of every uid. A GET by namespace and name is a B-tree descent, and a namespace's
//! LIST walks only that namespace's range. Label and field selectors are evaluated on the
//! objects of the range (a namespace's, or the kind's for a cluster-wide list): they scan
//! it, they are not indexed.
//!
//! The name index is keyed by (namespace, name, uid), not (namespace, name): a deleted
//! object's DELETED event can be missed (a relist then prunes it), and until then two uids
//! may share a name. The index never breaks on that; [`Objects::by_name`] answers the one
//! with the newest resourceVersion.

use std::{
    borrow::Borrow,
    cmp::Ordering,
    collections::BTreeSet,
    ops::{Bound, Index},
    sync::Arc,
};

use scale_agent_hub_model::object::CachedObject;

use crate::is_newer;

/// An object in the uid index: ordered by its uid, and found by a `&str`.
#[derive(Clone, Debug)]
struct ByUid(Arc<CachedObject>);

impl PartialEq for ByUid {
    fn eq(&self, other: &Self) -> bool {
        self.0.uid == other.0.uid
    }
}
impl Eq for ByUid {}
impl PartialOrd for ByUid {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ByUid {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.uid.cmp(&other.0.uid)
    }
}
impl Borrow<str> for ByUid {
    fn borrow(&self) -> &str {
        &self.0.uid
    }
}

/// The key of the name index: (namespace, name, uid). A trait so that both an indexed
/// object and a probe made of borrowed strings can be looked up by it without allocating.
trait NameKey {
    fn name_key(&self) -> (&str, &str, &str);
}

impl PartialEq for dyn NameKey + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.name_key() == other.name_key()
    }
}
impl Eq for dyn NameKey + '_ {}
impl PartialOrd for dyn NameKey + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for dyn NameKey + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        self.name_key().cmp(&other.name_key())
    }
}

/// An object in the name index.
#[derive(Clone, Debug)]
struct ByName(Arc<CachedObject>);

impl NameKey for ByName {
    fn name_key(&self) -> (&str, &str, &str) {
        (&self.0.namespace, &self.0.name, &self.0.uid)
    }
}
impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.name_key() == other.name_key()
    }
}
impl Eq for ByName {}
impl PartialOrd for ByName {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ByName {
    fn cmp(&self, other: &Self) -> Ordering {
        self.name_key().cmp(&other.name_key())
    }
}
impl<'a> Borrow<dyn NameKey + 'a> for ByName {
    fn borrow(&self) -> &(dyn NameKey + 'a) {
        self
    }
}

/// A lookup key of borrowed strings.
struct Probe<'s>(&'s str, &'s str, &'s str);

impl NameKey for Probe<'_> {
    fn name_key(&self) -> (&str, &str, &str) {
        (self.0, self.1, self.2)
    }
}

/// One kind's objects, by uid and by (namespace, name).
#[derive(Clone, Debug, Default)]
pub struct Objects {
    by_uid: BTreeSet<ByUid>,
    by_name: BTreeSet<ByName>,
    /// What the objects hold in memory ([`object_bytes`]), kept as they come and go: the
    /// hub-wide budget of cached bytes ([`crate::CachedBytes`]) sums it per account.
    bytes: u64,
}

/// What one cached object holds in memory, as the hub-wide budget counts it: its packed
/// JSON and strings, the object's own struct and `Arc`, and its place in both indexes.
pub fn object_bytes(object: &CachedObject) -> u64 {
    const FIXED: usize = std::mem::size_of::<CachedObject>() + 16 + 2 * 16;
    (FIXED
        + object.json.packed_len()
        + object.namespace.len()
        + object.name.len()
        + object.uid.len()
        + object.resource_version.len()) as u64
}

impl PartialEq for Objects {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.values().zip(other.values()).all(|(a, b)| a == b)
    }
}

impl Objects {
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }

    /// What the objects hold in memory ([`object_bytes`] of each).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The object with this uid.
    pub fn get(&self, uid: &str) -> Option<&Arc<CachedObject>> {
        self.by_uid.get(uid).map(|o| &o.0)
    }

    pub fn contains_key(&self, uid: &str) -> bool {
        self.by_uid.contains(uid)
    }

    /// Adds the object, or replaces the one with its uid; returns the replaced one.
    pub fn insert(&mut self, object: Arc<CachedObject>) -> Option<Arc<CachedObject>> {
        let old = self.by_uid.replace(ByUid(object.clone())).map(|o| o.0);
        self.bytes += object_bytes(&object);
        if let Some(old) = &old {
            self.bytes -= object_bytes(old);
            // A uid keeps its namespace and name in Kubernetes; removed by its own key all
            // the same, so that the indexes never disagree.
            self.by_name
                .remove(&Probe(&old.namespace, &old.name, &old.uid) as &dyn NameKey);
        }
        self.by_name.insert(ByName(object));
        old
    }

    /// Removes the object with this uid.
    pub fn remove(&mut self, uid: &str) -> Option<Arc<CachedObject>> {
        let old = self.by_uid.take(uid)?.0;
        self.bytes -= object_bytes(&old);
        self.by_name
            .remove(&Probe(&old.namespace, &old.name, &old.uid) as &dyn NameKey);
        Some(old)
    }

    /// Keeps only the objects `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&CachedObject) -> bool) {
        let gone: Vec<String> = self
            .values()
            .filter(|o| !keep(o))
            .map(|o| o.uid.clone())
            .collect();
        for uid in gone {
            self.remove(&uid);
        }
    }

    /// The uids, in order.
    pub fn keys(&self) -> Keys<'_> {
        Keys(self.by_uid.iter())
    }

    /// The objects from `from` on, by uid (the REST API's pages).
    pub fn range_by_uid(&self, from: Bound<&str>) -> impl Iterator<Item = &Arc<CachedObject>> {
        self.by_uid
            .range::<str, _>((from, Bound::Unbounded))
            .map(|o| &o.0)
    }

    /// Every object, by namespace, name and uid (the API server's order).
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Arc<CachedObject>> + Clone {
        self.by_name.iter().map(|o| &o.0)
    }

    /// The objects of one namespace ("" for a cluster-scoped kind's), by name: a range of
    /// the name index, so proportional to what it returns.
    pub fn in_namespace<'s>(
        &'s self,
        namespace: &'s str,
    ) -> impl Iterator<Item = &'s Arc<CachedObject>> + Clone + 's {
        let from = Probe(namespace, "", "");
        self.by_name
            .range::<dyn NameKey, _>((Bound::Included(&from as &dyn NameKey), Bound::Unbounded))
            .map(|o| &o.0)
            .take_while(move |o| o.namespace == namespace)
    }

    /// The objects in `namespace` (all of them for `None`).
    pub fn in_scope<'s>(
        &'s self,
        namespace: Option<&'s str>,
    ) -> Box<dyn Iterator<Item = &'s Arc<CachedObject>> + 's> {
        match namespace {
            Some(ns) => Box::new(self.in_namespace(ns)),
            None => Box::new(self.values()),
        }
    }

    /// The object named `name` in `namespace` ("" for a cluster-scoped kind): a B-tree
    /// descent. Of two uids with one name (a missed DELETED), the newer.
    pub fn by_name(&self, namespace: &str, name: &str) -> Option<&Arc<CachedObject>> {
        let from = Probe(namespace, name, "");
        self.by_name
            .range::<dyn NameKey, _>((Bound::Included(&from as &dyn NameKey), Bound::Unbounded))
            .map(|o| &o.0)
            .take_while(|o| o.namespace == namespace && o.name == name)
            .reduce(|a, b| {
                if is_newer(&b.resource_version, &a.resource_version) {
                    b
                } else {
                    a
                }
            })
    }
}

/// The uids of [`Objects`], in order.
#[derive(Clone)]
pub struct Keys<'a>(std::collections::btree_set::Iter<'a, ByUid>);

impl<'a> Iterator for Keys<'a> {
    type Item = &'a String;

    fn next(&mut self) -> Option<&'a String> {
        self.0.next().map(|o| &o.0.uid)
    }
}

impl std::fmt::Debug for Keys<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.clone()).finish()
    }
}

impl FromIterator<Arc<CachedObject>> for Objects {
    /// Built at once: both sets are bulk-built from sorted entries, so their nodes are full
    /// (inserted one by one, about half full).
    fn from_iter<I: IntoIterator<Item = Arc<CachedObject>>>(iter: I) -> Self {
        let objects: Vec<Arc<CachedObject>> = iter.into_iter().collect();
        let by_uid: BTreeSet<ByUid> = objects.iter().cloned().map(ByUid).collect();
        if by_uid.len() == objects.len() {
            Objects {
                bytes: objects.iter().map(|o| object_bytes(o)).sum(),
                by_name: objects.into_iter().map(ByName).collect(),
                by_uid,
            }
        } else {
            // Repeated uids: the last one wins, as with inserts.
            let mut built = Objects::default();
            for object in objects {
                built.insert(object);
            }
            built
        }
    }
}

impl Index<&str> for Objects {
    type Output = Arc<CachedObject>;

    /// The object with this uid; panics when there is none (tests).
    fn index(&self, uid: &str) -> &Arc<CachedObject> {
        match self.get(uid) {
            Some(object) => object,
            None => panic!("no object with uid {uid:?}"),
        }
    }
}
