//! The [`Ledger`] in the hub's store: what was registered through the Account Management
//! API survives restarts, so an account removed while the hub was down is still removed.
//! With replicas sharing PostgreSQL it is read again each time a replica becomes the
//! registrar, so what its predecessor sent is not sent again.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
};

use scale_agent_hub_model::Result;
use scale_agent_hub_store::{Store, StoreOp};

use super::Ledger;

/// A [`Ledger`] kept in memory and written through to the store.
pub struct StoreLedger {
    store: Arc<tokio::sync::Mutex<Store>>,
    entries: Mutex<BTreeMap<String, String>>,
    runtime: tokio::runtime::Handle,
}

impl StoreLedger {
    /// The ledger as loaded from the store at start-up; writes go to `store` on `runtime`.
    pub fn new(
        store: Arc<tokio::sync::Mutex<Store>>,
        loaded: BTreeMap<String, String>,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        StoreLedger {
            store,
            entries: Mutex::new(loaded),
            runtime,
        }
    }

    fn entries(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs on the registrar's blocking thread, so waiting for the store here is fine.
    fn commit(&self, op: StoreOp) -> Result<()> {
        self.runtime.block_on(async {
            let mut store = self.store.lock().await;
            store.commit(vec![op]).await
        })
    }
}

impl Ledger for StoreLedger {
    /// What the store holds now when it is shared (the registrar replica before this one
    /// wrote it: what it sent is not sent again); the entries in memory otherwise.
    fn load(&self) -> Result<BTreeMap<String, String>> {
        let stored = self
            .runtime
            .block_on(async { self.store.lock().await.shared_registrations().await })?;
        let mut entries = self.entries();
        if let Some(stored) = stored {
            *entries = stored;
        }
        Ok(entries.clone())
    }

    fn record(&self, name: &str, body_hash: &str) -> Result<()> {
        self.commit(StoreOp::PutRegistration {
            account: name.to_string(),
            body_hash: body_hash.to_string(),
        })?;
        self.entries()
            .insert(name.to_string(), body_hash.to_string());
        Ok(())
    }

    fn forget(&self, name: &str) -> Result<()> {
        self.commit(StoreOp::DeleteRegistration {
            account: name.to_string(),
        })?;
        self.entries().remove(name);
        Ok(())
    }
}
