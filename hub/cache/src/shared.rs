//! [`SharedCache`]: the running hub's cache, one lock per account, so that one account's
//! batch never makes a reader of another account wait.
//!
//! Lock order (whoever takes more than one): the registry's lock (the state crate's
//! `Live`), then the directory here (held only to find, add or remove an account, never
//! while an account's cache is locked), then one account's lock, then the store's queue.
//! Nobody holds two accounts' locks at once.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard, RwLock},
};

use scale_agent_proto::v1 as pb;

use crate::{AccountCache, Cache, CachedBytes, HistoryBudget};

/// One account's cache behind its own lock.
pub type AccountSlot = Arc<Mutex<AccountCache>>;

/// Locks an account's cache (a poisoned lock is taken over: each critical section keeps
/// the cache consistent and never panics by design).
pub fn lock(slot: &Mutex<AccountCache>) -> MutexGuard<'_, AccountCache> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every account's cache, each behind its own lock, and the budget their watch
/// histories share.
#[derive(Debug, Default)]
pub struct SharedCache {
    accounts: RwLock<BTreeMap<String, AccountSlot>>,
    history_budget: HistoryBudget,
    /// The bytes all accounts' objects hold, against `--max-cached-mib`.
    cached_bytes: CachedBytes,
}

impl SharedCache {
    /// The running form of a loaded cache.
    pub fn new(cache: Cache) -> Self {
        let cached_bytes = cache.cached_bytes;
        SharedCache {
            accounts: RwLock::new(
                cache
                    .accounts
                    .into_iter()
                    .map(|(name, mut account)| {
                        cached_bytes.settle(&mut account);
                        (name, Arc::new(Mutex::new(account)))
                    })
                    .collect(),
            ),
            history_budget: cache.history_budget,
            cached_bytes,
        }
    }

    /// The bytes all the watch histories hold, against `--watch-history-mib`.
    pub fn history_budget(&self) -> &HistoryBudget {
        &self.history_budget
    }

    /// The bytes all accounts' objects hold, against `--max-cached-mib`.
    pub fn cached_bytes(&self) -> &CachedBytes {
        &self.cached_bytes
    }

    fn directory(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, AccountSlot>> {
        self.accounts.read().unwrap_or_else(|e| e.into_inner())
    }

    fn directory_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, AccountSlot>> {
        self.accounts.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The account's cache, if it has one.
    pub fn account(&self, account: &str) -> Option<AccountSlot> {
        self.directory().get(account).cloned()
    }

    /// The account's cache, created on first use.
    pub fn account_or_create(&self, account: &str) -> AccountSlot {
        if let Some(slot) = self.account(account) {
            return slot;
        }
        self.directory_mut()
            .entry(account.to_string())
            .or_default()
            .clone()
    }

    /// `read` on the account's cache under its lock (`None`: the account has none).
    pub fn read<R>(&self, account: &str, read: impl FnOnce(&AccountCache) -> R) -> Option<R> {
        let slot = self.account(account)?;
        let guard = lock(&slot);
        Some(read(&guard))
    }

    /// Puts an account's cache in place (one loaded from the store on a takeover).
    pub fn insert_account(&self, account: &str, cache: AccountCache) {
        let slot = self.account_or_create(account);
        let mut cache = cache;
        self.cached_bytes.settle(&mut cache);
        let mut held = lock(&slot);
        self.cached_bytes.release(&mut held);
        *held = cache;
    }

    /// Forgets an account.
    pub fn remove_account(&self, account: &str) {
        let removed = self.directory_mut().remove(account);
        if let Some(slot) = removed {
            // Emptied too, so that a batch that took its slot before the removal cannot
            // keep its objects alive; their histories give their bytes back now, and its
            // objects theirs to the hub-wide budget.
            let mut held = lock(&slot);
            self.cached_bytes.release(&mut held);
            *held = AccountCache::default();
        }
    }

    /// The accounts that have a cache.
    pub fn account_names(&self) -> Vec<String> {
        self.directory().keys().cloned().collect()
    }

    /// Objects cached, all accounts together (each account locked in turn, never two).
    pub fn object_count(&self) -> usize {
        let slots: Vec<AccountSlot> = self.directory().values().cloned().collect();
        slots.iter().map(|s| lock(s).object_count()).sum()
    }

    /// The resume points of every watch of an account, for a STREAMING assignment.
    pub fn resume_points(&self, account: &str) -> Vec<pb::ResumePoint> {
        self.read(account, AccountCache::resume_points)
            .unwrap_or_default()
    }
}
