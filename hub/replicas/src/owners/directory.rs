//! Ownership shared by hub replicas in one process: a table of owners behind a lock. For
//! tests and programs that embed several hubs; it behaves like the PostgreSQL locks (one
//! owner per account, epochs, a history of tenures, every ownership lost at once).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Instant,
};

use scale_agent_hub_model::{HubError, Result};
use tokio::sync::watch;

use super::{Claim, OwnerInfo, Ownership, ReplicaIdentity};

/// One replica's tenure of an account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenure {
    pub account: String,
    pub replica: String,
    pub epoch: i64,
    pub acquired: Instant,
    /// `None` while it lasts.
    pub released: Option<Instant>,
}

#[derive(Default)]
struct Table {
    owners: BTreeMap<String, OwnerInfo>,
    history: Vec<Tenure>,
    /// The losses of each replica that joined.
    losses: BTreeMap<String, watch::Sender<u64>>,
    /// Replicas killed: they acquire nothing any more (a dead process does not).
    dead: std::collections::BTreeSet<String>,
}

/// The shared table; each hub gets a [`Member`] of it through
/// [`crate::owners::OwnershipSource::Directory`].
#[derive(Default)]
pub struct Directory {
    table: Mutex<Table>,
}

impl Directory {
    pub fn new() -> Arc<Self> {
        Arc::new(Directory::default())
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ownership of one replica.
    pub fn member(self: &Arc<Self>, replica: ReplicaIdentity) -> Member {
        let losses = watch::Sender::new(0);
        self.table()
            .losses
            .insert(replica.id.clone(), losses.clone());
        Member {
            directory: self.clone(),
            replica,
            losses,
        }
    }

    /// The owner of `account` now.
    pub fn owner_of(&self, account: &str) -> Option<OwnerInfo> {
        self.table().owners.get(account).cloned()
    }

    /// Every tenure so far, in the order they began.
    pub fn history(&self) -> Vec<Tenure> {
        self.table().history.clone()
    }

    /// What a replica's death does to its ownership: everything it owns is free at once,
    /// it is told it lost it all (as when its lock connection breaks), and it acquires
    /// nothing any more.
    pub fn kill(&self, replica: &str) {
        let mut table = self.table();
        table.dead.insert(replica.to_string());
        release_all(&mut table, replica);
        if let Some(losses) = table.losses.get(replica) {
            losses.send_modify(|n| *n += 1);
        }
    }
}

fn release_all(table: &mut Table, replica: &str) {
    let accounts: Vec<String> = table
        .owners
        .iter()
        .filter(|(_, o)| o.replica == replica)
        .map(|(a, _)| a.clone())
        .collect();
    for account in accounts {
        release_one(table, &account, replica);
    }
}

fn release_one(table: &mut Table, account: &str, replica: &str) {
    if table
        .owners
        .get(account)
        .is_some_and(|o| o.replica == replica)
    {
        table.owners.remove(account);
        let now = Instant::now();
        for tenure in table
            .history
            .iter_mut()
            .filter(|t| t.account == account && t.replica == replica && t.released.is_none())
        {
            tenure.released = Some(now);
        }
    }
}

/// One replica's view of a [`Directory`].
pub struct Member {
    directory: Arc<Directory>,
    replica: ReplicaIdentity,
    losses: watch::Sender<u64>,
}

#[tonic::async_trait]
impl Ownership for Member {
    fn owns_everything(&self) -> bool {
        false
    }

    async fn try_acquire(&self, account: &str) -> Result<Claim> {
        let mut table = self.directory.table();
        if table.dead.contains(&self.replica.id) {
            return Err(HubError::Ownership(format!(
                "replica {} was killed",
                self.replica.id
            )));
        }
        if let Some(owner) = table.owners.get(account) {
            return Ok(if owner.replica == self.replica.id {
                Claim::Acquired { epoch: owner.epoch }
            } else {
                Claim::HeldElsewhere(Some(owner.clone()))
            });
        }
        let epoch = table
            .history
            .iter()
            .filter(|t| t.account == account)
            .map(|t| t.epoch)
            .max()
            .unwrap_or(0)
            + 1;
        table.owners.insert(
            account.to_string(),
            OwnerInfo {
                replica: self.replica.id.clone(),
                address: self.replica.address.clone(),
                epoch,
            },
        );
        table.history.push(Tenure {
            account: account.to_string(),
            replica: self.replica.id.clone(),
            epoch,
            acquired: Instant::now(),
            released: None,
        });
        Ok(Claim::Acquired { epoch })
    }

    async fn release(&self, account: &str) -> Result<()> {
        release_one(&mut self.directory.table(), account, &self.replica.id);
        Ok(())
    }

    async fn owner(&self, account: &str) -> Result<Option<OwnerInfo>> {
        Ok(self.directory.owner_of(account))
    }

    async fn probe(&self) -> Result<()> {
        Ok(())
    }

    fn held_epoch(&self, account: &str) -> Option<i64> {
        self.directory
            .owner_of(account)
            .filter(|o| o.replica == self.replica.id)
            .map(|o| o.epoch)
    }

    fn losses(&self) -> watch::Receiver<u64> {
        self.losses.subscribe()
    }

    async fn close(&self) {
        release_all(&mut self.directory.table(), &self.replica.id);
    }
}
