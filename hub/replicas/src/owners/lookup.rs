//! Owner lookups cached on a replica: a request for an account another replica owns needs
//! the owner's address, and asking the store (PostgreSQL's `account_owners`, over the
//! ownership's one connection) for every such request made that connection every
//! non-owner's bottleneck (issue 26). An answer is kept for [`OWNER_TTL`] at most, and
//! dropped sooner when it proves wrong: the owner it named could not be reached, or answered
//! that no agent streams the account there (it released it) — the next request asks again.
//! This replica's own ownership never comes from here (its registry says what it owns).

use std::{
    collections::HashMap,
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use scale_agent_hub_model::Result;

use super::{OwnerInfo, Ownership};

/// How long an owner looked up is trusted without asking again: a guard for a change this
/// replica was not told of (the owner moved while requests still succeed there).
pub const OWNER_TTL: Duration = Duration::from_secs(2);

/// The owners looked up, with when.
#[derive(Debug)]
pub struct OwnerLookups {
    entries: Mutex<HashMap<String, (Option<OwnerInfo>, Instant)>>,
    ttl: Duration,
    queries: AtomicU64,
    hits: AtomicU64,
}

impl Default for OwnerLookups {
    fn default() -> Self {
        Self::new(OWNER_TTL)
    }
}

impl OwnerLookups {
    pub fn new(ttl: Duration) -> Self {
        OwnerLookups {
            entries: Mutex::default(),
            ttl,
            queries: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<String, (Option<OwnerInfo>, Instant)>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The owner of `account`: the answer kept if younger than the TTL, else `ownership`'s
    /// (then kept). An error is not kept.
    pub async fn owner(
        &self,
        ownership: &dyn Ownership,
        account: &str,
    ) -> Result<Option<OwnerInfo>> {
        if let Some((owner, at)) = self.entries().get(account)
            && at.elapsed() < self.ttl
        {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(owner.clone());
        }
        self.queries.fetch_add(1, Ordering::Relaxed);
        let owner = ownership.owner(account).await?;
        let mut entries = self.entries();
        // Expired answers of other accounts go at the same time, so the table holds only
        // accounts asked about within the TTL.
        let ttl = self.ttl;
        entries.retain(|_, (_, at)| at.elapsed() < ttl);
        entries.insert(account.to_string(), (owner.clone(), Instant::now()));
        Ok(owner)
    }

    /// The answer kept for `account` proved wrong (its owner unreachable, or not streaming
    /// it): the next request asks the store again.
    pub fn forget(&self, account: &str) {
        self.entries().remove(account);
    }

    /// Lookups that asked the ownership (the store).
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }

    /// Lookups answered from what was kept.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::owners::{Claim, ReplicaIdentity, directory::Directory};

    fn member(directory: &Arc<Directory>, id: &str) -> crate::owners::directory::Member {
        directory.member(ReplicaIdentity {
            id: id.into(),
            address: format!("https://{id}.example:8443"),
        })
    }

    #[tokio::test]
    async fn many_requests_ask_once_and_a_wrong_answer_is_asked_again() {
        let directory = Directory::new();
        let (a, b, c) = (
            member(&directory, "a"),
            member(&directory, "b"),
            member(&directory, "c"),
        );
        assert!(matches!(
            b.try_acquire("prod").await.unwrap(),
            Claim::Acquired { .. }
        ));
        let lookups = OwnerLookups::new(Duration::from_secs(60));
        for _ in 0..100 {
            let owner = lookups.owner(&a, "prod").await.unwrap();
            assert_eq!(owner.map(|o| o.replica).as_deref(), Some("b"));
        }
        assert_eq!((lookups.queries(), lookups.hits()), (1, 99));

        // The owner moves: until told, the kept answer stands; once forgotten, the new one.
        b.release("prod").await.unwrap();
        assert!(matches!(
            c.try_acquire("prod").await.unwrap(),
            Claim::Acquired { .. }
        ));
        let kept = lookups.owner(&a, "prod").await.unwrap();
        assert_eq!(kept.map(|o| o.replica).as_deref(), Some("b"));
        lookups.forget("prod");
        let fresh = lookups.owner(&a, "prod").await.unwrap();
        assert_eq!(fresh.map(|o| o.replica).as_deref(), Some("c"));
        assert_eq!(lookups.queries(), 2);
    }

    #[tokio::test]
    async fn an_answer_expires_after_the_ttl() {
        let directory = Directory::new();
        let (a, b) = (member(&directory, "a"), member(&directory, "b"));
        let lookups = OwnerLookups::new(Duration::from_millis(50));
        assert_eq!(lookups.owner(&a, "prod").await.unwrap(), None);
        assert!(matches!(
            b.try_acquire("prod").await.unwrap(),
            Claim::Acquired { .. }
        ));
        // Nobody owned it when asked: kept for the TTL, then asked again.
        assert_eq!(lookups.owner(&a, "prod").await.unwrap(), None);
        tokio::time::sleep(Duration::from_millis(60)).await;
        let owner = lookups.owner(&a, "prod").await.unwrap();
        assert_eq!(owner.map(|o| o.replica).as_deref(), Some("b"));
        assert_eq!((lookups.queries(), lookups.hits()), (2, 1));
    }
}
