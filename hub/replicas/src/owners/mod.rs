//! Which hub replica owns each account: streams it from an agent, keeps its cache and writes
//! it to the store. Several replicas share one store; exactly one owns an account at a time.
//!
//! The source of ownership is an interface, [`Ownership`], with these implementations:
//! - [`Embedded`]: one replica owns everything (the embedded store, `make demo`, and every
//!   hub before issue 16). The registry then never asks about ownership: nothing changes.
//! - [`directory::Directory`]: replicas in one process share a table of owners (tests, and
//!   programs that embed several hubs). Ownership ends when the replica stops or is
//!   killed ([`directory::Directory::kill`]).
//! - [`postgres::PostgresOwnership`]: a session-level PostgreSQL advisory lock per account,
//!   held on one dedicated connection per replica, with the owner's address and epoch in
//!   `account_owners` and every tenure in `ownership_history`.
//!
//! How the hub uses it ([`duty`]): an agent's registration is answered
//! STREAMING only for an account this replica owns; otherwise STANDBY, and the ownership
//! task tries to acquire the account (at once, then about every second). On acquiring it
//! reloads the account from the store ([`AccountSource`]) and promotes the first standby
//! with the resume points just loaded. When the last agent of an account leaves this
//! replica, the replica releases it, so a replica its agent reconnected to can take it.
//! When every ownership is lost at once (the lock connection broke), the streams of the
//! accounts owned are ended, so their agents reconnect, and ownership is acquired again.
//!
//! Requests that need an account's agent (and reads of its cache) arriving at a replica
//! that does not own it are forwarded to the owner ([`forward`]), whose address is looked
//! up once and kept for a short while ([`lookup`]).

pub mod directory;
pub mod duty;
pub mod forward;
pub mod lookup;
pub mod peers;
pub mod postgres;
pub mod secret;
pub mod singleton;

use std::sync::Arc;

use scale_agent_hub_model::Result;
use tokio::sync::watch;

/// The replica that owns an account, as other replicas reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerInfo {
    /// `--replica-id` of the owner.
    pub replica: String,
    /// `--replica-address` of the owner: the base URL of its HTTP listener.
    pub address: String,
    /// Bumped at every change of owner: writes of an older epoch are refused (fencing).
    pub epoch: i64,
}

/// The answer to [`Ownership::try_acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This replica owns the account now, at this epoch.
    Acquired { epoch: i64 },
    /// Another replica owns it (`None`: its owner is not known yet, e.g. it is acquiring).
    HeldElsewhere(Option<OwnerInfo>),
}

/// Where ownership comes from. Every method may be called concurrently.
#[tonic::async_trait]
pub trait Ownership: Send + Sync {
    /// One replica owns everything: the registry skips ownership altogether.
    fn owns_everything(&self) -> bool;

    /// Takes ownership of `account` unless another replica holds it. Only called for
    /// accounts this replica does not own.
    async fn try_acquire(&self, account: &str) -> Result<Claim>;

    /// Gives up ownership of `account` (owned by this replica), so another replica can take
    /// it.
    async fn release(&self, account: &str) -> Result<()>;

    /// The replica that owns `account` now, `None` when nobody does.
    async fn owner(&self, account: &str) -> Result<Option<OwnerInfo>>;

    /// Whether the ownership's store answers now: what the ownership task asks, while the
    /// store was unreachable and no account waits to be acquired, to find out that it is
    /// back. It reads what a look-up reads, on the same connection, without naming an
    /// account.
    async fn probe(&self) -> Result<()>;

    /// The epoch this replica holds `account` at, `None` when it does not own it: what the
    /// shared store's fencing checks every write against.
    fn held_epoch(&self, account: &str) -> Option<i64>;

    /// Changes each time every ownership of this replica was lost at once (the connection
    /// that holds the locks broke): the accounts must be treated as not owned.
    fn losses(&self) -> watch::Receiver<u64>;

    /// Releases everything (the hub is stopping).
    async fn close(&self);
}

/// One replica owns every account.
#[derive(Debug)]
pub struct Embedded {
    losses: watch::Sender<u64>,
}

impl Default for Embedded {
    fn default() -> Self {
        Embedded {
            losses: watch::Sender::new(0),
        }
    }
}

#[tonic::async_trait]
impl Ownership for Embedded {
    fn owns_everything(&self) -> bool {
        true
    }

    async fn try_acquire(&self, _account: &str) -> Result<Claim> {
        Ok(Claim::Acquired { epoch: 0 })
    }

    async fn release(&self, _account: &str) -> Result<()> {
        Ok(())
    }

    async fn owner(&self, _account: &str) -> Result<Option<OwnerInfo>> {
        Ok(None)
    }

    async fn probe(&self) -> Result<()> {
        Ok(())
    }

    fn held_epoch(&self, _account: &str) -> Option<i64> {
        Some(0)
    }

    fn losses(&self) -> watch::Receiver<u64> {
        self.losses.subscribe()
    }

    async fn close(&self) {}
}

/// Which ownership a hub uses (a field of the hub's `Config`).
#[derive(Clone, Default)]
pub enum OwnershipSource {
    /// One replica owns everything (the embedded store).
    #[default]
    Embedded,
    /// Replicas in one process share this directory (tests, embedding).
    Directory(Arc<directory::Directory>),
    /// PostgreSQL advisory locks; the URL (with its password) is never logged.
    Postgres {
        options: scale_agent_hub_store::PostgresOptions,
    },
}

impl std::fmt::Debug for OwnershipSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OwnershipSource::Embedded => f.write_str("Embedded"),
            OwnershipSource::Directory(_) => f.write_str("Directory"),
            OwnershipSource::Postgres { .. } => f.write_str("Postgres(<url redacted>)"),
        }
    }
}

impl OwnershipSource {
    /// Whether replicas share the accounts (anything but the embedded store).
    pub fn is_shared(&self) -> bool {
        !matches!(self, OwnershipSource::Embedded)
    }
}

/// Who this replica is to the others.
#[derive(Clone, Debug)]
pub struct ReplicaIdentity {
    /// `--replica-id`.
    pub id: String,
    /// `--replica-address` (the base URL of this replica's HTTP listener); empty with the
    /// embedded store, where nobody forwards.
    pub address: String,
}

/// Opens the ownership `source` names for `replica`.
pub async fn open(
    source: &OwnershipSource,
    replica: &ReplicaIdentity,
) -> Result<Arc<dyn Ownership>> {
    Ok(match source {
        OwnershipSource::Embedded => Arc::new(Embedded::default()),
        OwnershipSource::Directory(directory) => Arc::new(directory.member(replica.clone())),
        OwnershipSource::Postgres { options } => {
            Arc::new(postgres::PostgresOwnership::connect(options, replica.clone()).await?)
        }
    })
}

/// The host name, the default of `--replica-id` (a pod's name in Kubernetes), else
/// `scale-agent-hub`.
pub fn hostname() -> String {
    scale_agent_runtime::hostname().unwrap_or_else(|| "scale-agent-hub".to_string())
}

pub use scale_agent_hub_store::AccountSnapshot;

/// Loads one account from the store when this replica takes ownership of it.
#[tonic::async_trait]
pub trait AccountSource: Send + Sync {
    /// `None`: the cache in memory is what the store holds (one replica writes it: the
    /// embedded store), keep it.
    async fn load_account(&self, account: &str) -> Result<Option<AccountSnapshot>>;
}

/// The embedded (redb) store's behaviour: this replica is the only writer, so its cache is
/// always current (and in-process directories of tests share no store).
#[derive(Debug, Default)]
pub struct MemoryIsCurrent;

#[tonic::async_trait]
impl AccountSource for MemoryIsCurrent {
    async fn load_account(&self, _account: &str) -> Result<Option<AccountSnapshot>> {
        Ok(None)
    }
}

/// The shared store: an account taken over is read from it (what its last owner wrote).
pub struct StoreAccounts(pub Arc<tokio::sync::Mutex<scale_agent_hub_store::Store>>);

#[tonic::async_trait]
impl AccountSource for StoreAccounts {
    async fn load_account(&self, account: &str) -> Result<Option<AccountSnapshot>> {
        let store = self.0.lock().await;
        store.load_account(account).await.map(Some)
    }
}
