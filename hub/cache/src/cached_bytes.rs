//! [`CachedBytes`]: the hub-wide budget of the bytes the cache holds for objects
//! (`--max-cached-mib`, issue 28, F14). The per-account object quota and the accounts per
//! identity bound what one identity caches; this bounds what all of them cache together,
//! so many identities (or one with many accounts) cannot take the hub's memory.
//!
//! Each kind's [`crate::Objects`] keeps its own bytes as objects come and go; each account
//! remembers what it last added to the hub's total, and [`CachedBytes::settle`] adds the
//! difference once the account's cache changed (under that account's lock, which the
//! change holds anyway). The total is one atomic counter: no lock is shared by the
//! accounts on the ingest path. A snapshot or object that would take the total past the
//! budget is refused before it enters the cache ([`CachedBytes::fits`]); what is cached
//! already stays.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use crate::AccountCache;

/// The hub-wide budget of cached object bytes, shared by every account's cache (clones
/// share it).
#[derive(Clone, Debug)]
pub struct CachedBytes {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// `u64::MAX` for no limit.
    limit: u64,
    held: AtomicU64,
    refusals: AtomicU64,
}

impl Default for CachedBytes {
    /// No limit (tests, tools); the hub sets `--max-cached-mib`.
    fn default() -> Self {
        CachedBytes::new(0)
    }
}

impl CachedBytes {
    /// A budget of `limit` bytes; 0 means no limit.
    pub fn new(limit: u64) -> Self {
        CachedBytes {
            inner: Arc::new(Inner {
                limit: if limit == 0 { u64::MAX } else { limit },
                held: AtomicU64::new(0),
                refusals: AtomicU64::new(0),
            }),
        }
    }

    /// Bytes the cache holds for objects now, all accounts together.
    pub fn held(&self) -> u64 {
        self.inner.held.load(Ordering::Relaxed)
    }

    /// The limit (`None`: no limit).
    pub fn limit(&self) -> Option<u64> {
        (self.inner.limit != u64::MAX).then_some(self.inner.limit)
    }

    /// Snapshots and objects refused for the budget so far.
    pub fn refusals(&self) -> u64 {
        self.inner.refusals.load(Ordering::Relaxed)
    }

    /// Whether `adding` bytes may enter the cache in place of `freeing` bytes it holds;
    /// a refusal is counted.
    pub fn fits(&self, adding: u64, freeing: u64) -> bool {
        let fits = adding <= freeing || self.after(adding, freeing) <= self.inner.limit;
        if !fits {
            self.inner.refusals.fetch_add(1, Ordering::Relaxed);
        }
        fits
    }

    /// What the hub's total would be with `adding` in place of `freeing`.
    pub fn after(&self, adding: u64, freeing: u64) -> u64 {
        self.held().saturating_sub(freeing).saturating_add(adding)
    }

    /// Brings the total up to date with `account`'s cache after it changed.
    pub fn settle(&self, account: &mut AccountCache) {
        let now = account.object_bytes();
        let before = std::mem::replace(&mut account.counted_bytes, now);
        if now >= before {
            self.inner.held.fetch_add(now - before, Ordering::Relaxed);
        } else {
            self.inner.held.fetch_sub(before - now, Ordering::Relaxed);
        }
    }

    /// Takes what `account` added to the total out of it (the account's cache is dropped
    /// or replaced).
    pub fn release(&self, account: &mut AccountCache) {
        let before = std::mem::take(&mut account.counted_bytes);
        self.inner.held.fetch_sub(before, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CachedObject, KindInfo, PackedJson};

    fn object(uid: &str, json_len: usize) -> CachedObject {
        CachedObject {
            namespace: "ns".into(),
            name: uid.into(),
            uid: uid.into(),
            resource_version: "1".into(),
            json: PackedJson::pack(format!("{{\"x\":\"{}\"}}", "y".repeat(json_len)).as_bytes()),
            truncated: false,
        }
    }

    #[test]
    fn the_total_follows_every_accounts_changes_and_refuses_past_the_limit() {
        let budget = CachedBytes::new(0);
        let info = KindInfo {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        };
        let (mut a, mut b) = (AccountCache::default(), AccountCache::default());
        let mut ops = Vec::new();
        let snapshot = |n: usize| {
            (0..n)
                .map(|i| {
                    let o = object(&format!("u{i}"), 100);
                    (o.uid.clone(), o)
                })
                .collect()
        };
        a.replace_scope("a", &info, "", snapshot(10), "5", &mut ops);
        budget.settle(&mut a);
        b.replace_scope("b", &info, "", snapshot(4), "5", &mut ops);
        budget.settle(&mut b);
        assert_eq!(budget.held(), a.object_bytes() + b.object_bytes());
        assert!(a.object_bytes() > 10 * 100);
        // A relist with fewer objects gives bytes back.
        a.replace_scope("a", &info, "", snapshot(2), "6", &mut ops);
        budget.settle(&mut a);
        assert_eq!(budget.held(), a.object_bytes() + b.object_bytes());
        budget.release(&mut b);
        assert_eq!(budget.held(), a.object_bytes());

        let limited = CachedBytes::new(1000);
        assert!(limited.fits(1000, 0));
        assert!(!limited.fits(1001, 0));
        assert!(
            limited.fits(5000, 5000),
            "a change that does not grow always fits"
        );
        assert_eq!(limited.refusals(), 1);
        assert_eq!(limited.limit(), Some(1000));
        assert_eq!(CachedBytes::new(0).limit(), None);
    }
}
