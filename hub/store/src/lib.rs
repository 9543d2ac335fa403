//! `scale-agent-hub-store` (layer 2): the hub's persistence, and nothing else: the store on
//! its two backends ([`Store`]) and the group-commit writer that feeds it from the agents'
//! streams ([`writer`], with its [`StoreMetrics`]). It depends on the model crate (the
//! records and [`StoreOp`]s it writes, the error type) and the cache crate (the cache it
//! loads) only, never on a crate above them.
//!
//! What it keeps: account bindings, kinds, cached objects and resume points, the proxy's tokens
//! (hashed), the agents' tokens and identities, dynamic accounts, the accounts registered in
//! Clouddriver, and the operation records of client ids. Writers hand a batch of
//! [`StoreOp`]s to [`Store::commit`]: one transaction per batch.
//!
//! Two backends behind one [`Store`]:
//! - `embedded` (`redb`): a redb file in the data directory, `<data-dir>/hub.redb`, for one
//!   replica (the default).
//! - `postgres` ([`postgres`]): a PostgreSQL database shared by several replicas.
//!
//! Why an enum over the backends rather than a trait object: there are two, both known here;
//! the store's methods are async (a trait would need boxed futures on every commit), and the
//! hub keeps one concrete `Store` behind its lock, so the callers never see which backend
//! they talk to. Backend-only needs (redb's reopen after an I/O error, PostgreSQL's fencing)
//! stay inside the backend.
//!
//! Durability: most commits are non-durable (no fsync, or PostgreSQL's
//! `synchronous_commit = off`); a commit is made durable when the last durable one is older
//! than [`DURABLE_EVERY`], and [`Store::flush`] (called periodically and at shutdown) makes
//! everything durable. Cache and resume points are always written in the same transaction,
//! so after a crash the hub holds a consistent, slightly older state and hands out slightly
//! older resume points: agents replay a few events, which is harmless (events are
//! idempotent).

pub mod memory;
pub mod metrics;
pub mod postgres;
pub mod postgres_tls;
mod redb;
pub mod writer;

use std::{path::Path, sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};

use scale_agent_hub_cache::{AccountCache, Cache, CachedObject, PackedJson};
use scale_agent_hub_model::{
    HubError, Result,
    dynamic_accounts::DynamicAccountRecord,
    records::{
        AccountBinding, AccountRecord, AgentIdentityState, AgentTokenRecord, EnrolledIdentity,
        TokenRecord,
    },
};

pub use self::metrics::StoreMetrics;
pub(crate) use self::postgres::fenced_accounts;
pub use self::postgres::{Fencing, HeldEpoch, OwnerRow, PostgresOptions, ReplicaRow, SharedStore};

/// Longest time between durable commits while agents stream.
pub const DURABLE_EVERY: Duration = Duration::from_secs(1);

pub use scale_agent_hub_model::store_op::StoreOp;

#[derive(Serialize, Deserialize)]
struct ObjectHeader {
    namespace: String,
    name: String,
    uid: String,
    rv: String,
    truncated: bool,
    /// The JSON after the header is packed ([`PackedJson`]); stores written before the hub
    /// packed objects hold it as it is, and are packed as they load.
    #[serde(default)]
    packed: bool,
}

fn encode_object(o: &CachedObject) -> Vec<u8> {
    let header = ObjectHeader {
        namespace: o.namespace.clone(),
        name: o.name.clone(),
        uid: o.uid.clone(),
        rv: o.resource_version.clone(),
        truncated: o.truncated,
        packed: true,
    };
    // serde_json escapes newlines, so the first b'\n' ends the header.
    let mut bytes = serde_json::to_vec(&header).unwrap_or_default();
    bytes.push(b'\n');
    bytes.extend_from_slice(o.json.packed());
    bytes
}

fn decode_object(key: &str, bytes: &[u8]) -> Result<CachedObject> {
    let corrupt = |message: String| HubError::Corrupt {
        key: key.to_string(),
        message,
    };
    let split = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| corrupt("no header".into()))?;
    let header: ObjectHeader =
        serde_json::from_slice(&bytes[..split]).map_err(|e| corrupt(e.to_string()))?;
    let json = &bytes[split + 1..];
    let json = if header.packed {
        PackedJson::from_packed(json).map_err(|e| corrupt(e.to_string()))?
    } else {
        PackedJson::pack(json)
    };
    Ok(CachedObject {
        namespace: header.namespace,
        name: header.name,
        uid: header.uid,
        resource_version: header.rv,
        json,
        truncated: header.truncated,
    })
}

/// What the store held at start-up.
#[derive(Debug, Default)]
pub struct Loaded {
    pub accounts: Vec<(String, AccountRecord)>,
    pub cache: Cache,
    pub tokens: Vec<TokenRecord>,
    pub meta: std::collections::BTreeMap<String, String>,
    /// Accounts registered in Clouddriver, with the hash of their last body.
    pub registrations: std::collections::BTreeMap<String, String>,
    pub agent_tokens: Vec<AgentTokenRecord>,
    pub enrolled: Vec<EnrolledIdentity>,
    pub bindings: Vec<(String, AccountBinding)>,
    pub dynamic_accounts: Vec<(String, DynamicAccountRecord)>,
    /// Identities an admin disabled, certificates denied.
    pub identity_states: Vec<AgentIdentityState>,
}

/// The small tables replicas sharing a store keep in memory and read again periodically
/// ([`SharedStore::tables`]).
#[derive(Debug, Default)]
pub struct SharedTables {
    pub tokens: Vec<TokenRecord>,
    pub agent_tokens: Vec<AgentTokenRecord>,
    pub enrolled: Vec<EnrolledIdentity>,
    pub bindings: Vec<(String, AccountBinding)>,
    pub dynamic_accounts: Vec<(String, DynamicAccountRecord)>,
}

/// A test seam: called on the commit's blocking thread with the batch before it is
/// written. It may block (a slow disk) or fail the commit (`Err(message)`).
pub type CommitHook = Arc<dyn Fn(&[StoreOp]) -> Result<(), String> + Send + Sync>;

/// A commit that failed, with its changes handed back so that they can be tried again.
pub struct Failed {
    pub error: HubError,
    pub ops: Vec<StoreOp>,
}

/// Whether a commit of `ops` asked with `durable` is made durable: when asked, when the last
/// durable commit (at `last_durable`) is older than [`DURABLE_EVERY`], or when an op needs it.
/// `None`: there is nothing to write (no ops, and no non-durable commit to make durable).
fn durable_commit(
    ops: &[StoreOp],
    durable: bool,
    last_durable: std::time::Instant,
    dirty: bool,
) -> Option<bool> {
    let durable = durable
        || last_durable.elapsed() >= DURABLE_EVERY
        || ops.iter().any(StoreOp::needs_durability);
    (!ops.is_empty() || (durable && dirty)).then_some(durable)
}

/// One account as the store holds it, for a replica that takes the account over (see
/// [`Store::load_account`]).
#[derive(Debug, Default)]
pub struct AccountSnapshot {
    /// The account's record; `None` when the store holds no such account.
    pub record: Option<AccountRecord>,
    /// Its kinds, objects and resume points, as [`Cache::load_kind`] and friends load them.
    pub cache: AccountCache,
}

/// Says whether a stored operation record is past its retention.
pub type Expired = dyn Fn(&[u8]) -> bool + Send + Sync;

/// Which backend keeps the hub's state (`--store`).
#[derive(Clone, Debug, Default)]
pub enum Backend {
    /// redb in the data directory: one replica.
    #[default]
    Embedded,
    /// A PostgreSQL database: one or several replicas.
    Postgres(PostgresOptions),
}

/// The store, on one of its backends.
pub enum Store {
    /// redb in the data directory.
    Embedded(redb::RedbStore),
    /// A PostgreSQL database (boxed: it is the larger by far, and the store is one value).
    Postgres(Box<postgres::PostgresStore>),
}

pub use redb::DEFAULT_STORE_CACHE_BYTES;

impl Store {
    /// Opens (or creates) the embedded store, `<data_dir>/hub.redb`.
    pub fn open(data_dir: &Path) -> Result<Self> {
        redb::RedbStore::open(data_dir).map(Store::Embedded)
    }

    /// Connects to PostgreSQL and brings its schema up to date (see
    /// [`postgres::PostgresStore::open`]).
    pub async fn open_postgres(options: &PostgresOptions) -> Result<Self> {
        postgres::PostgresStore::open(options)
            .await
            .map(|store| Store::Postgres(Box::new(store)))
    }

    /// Opens (or creates) the embedded store with a page cache of `cache_bytes`.
    pub fn open_with_cache(data_dir: &Path, cache_bytes: usize) -> Result<Self> {
        redb::RedbStore::open_with_cache(data_dir, cache_bytes).map(Store::Embedded)
    }

    /// Opens the store `backend` names (the embedded one in `data_dir`, with a page cache of
    /// `cache_bytes`).
    pub async fn open_backend(
        backend: &Backend,
        data_dir: &Path,
        cache_bytes: usize,
    ) -> Result<Self> {
        match backend {
            Backend::Embedded => Self::open_with_cache(data_dir, cache_bytes),
            Backend::Postgres(options) => Self::open_postgres(options).await,
        }
    }

    /// Whether [`Store::load`] leaves out the accounts' cached data (kinds, objects, resume
    /// points), to be read per account with [`Store::load_account`]: PostgreSQL, where a
    /// replica reads only the accounts it owns.
    pub fn loads_accounts_separately(&self) -> bool {
        matches!(self, Store::Postgres(_))
    }

    /// What replicas sharing the store read of each other's writes ([`SharedStore`]):
    /// PostgreSQL only (the embedded store has one replica, which reads nothing back);
    /// `None` once closed.
    pub fn shared(&self) -> Option<SharedStore> {
        match self {
            Store::Embedded(_) => None,
            Store::Postgres(s) => s.shared(),
        }
    }

    /// Installs the fencing check of every later commit (PostgreSQL; the embedded store has
    /// one replica and nothing to fence).
    pub fn set_fencing(&mut self, fencing: Option<Fencing>) {
        match self {
            Store::Embedded(_) => {}
            Store::Postgres(s) => s.set_fencing(fencing),
        }
    }

    /// Installs the test seam called before each commit ([`CommitHook`]).
    #[doc(hidden)]
    pub fn set_commit_hook(&mut self, hook: Option<CommitHook>) {
        match self {
            Store::Embedded(s) => s.set_commit_hook(hook),
            Store::Postgres(s) => s.set_commit_hook(hook),
        }
    }

    /// The store's file, for the embedded store.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Store::Embedded(s) => Some(s.path()),
            Store::Postgres(_) => None,
        }
    }

    /// Where the store is, for logs (never a password).
    pub fn location(&self) -> String {
        match self {
            Store::Embedded(s) => s.path().display().to_string(),
            Store::Postgres(s) => format!("postgres://{}", s.location()),
        }
    }

    pub fn is_open(&self) -> bool {
        match self {
            Store::Embedded(s) => s.is_open(),
            Store::Postgres(s) => s.is_open(),
        }
    }

    /// Reads everything back (at start-up).
    pub async fn load(&self) -> Result<Loaded> {
        match self {
            Store::Embedded(s) => s.load(),
            Store::Postgres(s) => s.load().await,
        }
    }

    /// Reads one account back: its record, kinds, objects and resume points.
    pub async fn load_account(&self, account: &str) -> Result<AccountSnapshot> {
        match self {
            Store::Embedded(s) => s.load_account(account),
            Store::Postgres(s) => s.load_account(account).await,
        }
    }

    /// Writes a batch in one transaction.
    pub async fn commit(&mut self, ops: Vec<StoreOp>) -> Result<()> {
        self.try_commit(ops, false).await.map_err(|f| f.error)
    }

    /// Writes a batch in one transaction, durably when `durable` (or when the last durable
    /// commit is older than [`DURABLE_EVERY`], or an op needs it); on failure the batch is
    /// handed back.
    pub async fn try_commit(&mut self, ops: Vec<StoreOp>, durable: bool) -> Result<(), Failed> {
        match self {
            Store::Embedded(s) => s.try_commit(ops, durable).await,
            Store::Postgres(s) => s.try_commit(ops, durable).await,
        }
    }

    /// Makes every earlier commit durable.
    pub async fn flush(&mut self) -> Result<()> {
        match self {
            Store::Embedded(s) => s.flush().await,
            Store::Postgres(s) => s.flush().await,
        }
    }

    /// Flushes and closes the store.
    pub async fn close(&mut self) -> Result<()> {
        match self {
            Store::Embedded(s) => s.close().await,
            Store::Postgres(s) => s.close().await,
        }
    }

    /// A handle for writing operation records outside the batches (the operations API writes
    /// them without holding the store's lock); `None` once closed.
    pub fn operation_records(&self) -> Option<OperationRecords> {
        match self {
            Store::Embedded(s) => s.database().map(OperationRecords::Embedded),
            Store::Postgres(s) => s.operation_records().map(OperationRecords::Postgres),
        }
    }

    /// Every operation record, `(account\0submitter\0id, bytes)`.
    pub async fn load_operation_records(&self) -> Result<Vec<(String, Vec<u8>)>> {
        match self {
            Store::Embedded(s) => match s.database() {
                Some(db) => redb::load_operation_records(&db),
                None => Ok(Vec::new()),
            },
            Store::Postgres(s) => s.load_operation_records().await,
        }
    }

    /// The Clouddriver ledger as the shared store holds it now (another replica may have
    /// written it since start-up); `None` for the embedded store, where the ledger in memory
    /// is current.
    pub async fn shared_registrations(
        &self,
    ) -> Result<Option<std::collections::BTreeMap<String, String>>> {
        match self {
            Store::Embedded(_) => Ok(None),
            Store::Postgres(s) => s.registrations().await.map(Some),
        }
    }
}

/// Writes operation records: operations submitted with a client id, kept across restarts for
/// the retention period so that a resubmitted id does not run again. Outside the stream
/// batches: the operations API writes them (see `operations::persist`), which also owns the
/// rows' format; here they are bytes under `account\0submitter\0id` (rows of hubs before
/// submitters were kept: `account\0id`).
#[derive(Clone)]
pub enum OperationRecords {
    /// Hold it for one write only: [`Store::close`] waits until every holder has let go.
    Embedded(Arc<::redb::Database>),
    /// A connection of its own.
    Postgres(postgres::PostgresRecords),
}

impl OperationRecords {
    /// Writes one operation record (`None` removes it) durably, in a transaction of its own.
    /// With `expired`, also removes every row it says is past its retention.
    pub async fn write(
        self,
        key: String,
        value: Option<Vec<u8>>,
        expired: Option<Box<Expired>>,
    ) -> Result<()> {
        match self {
            OperationRecords::Embedded(db) => tokio::task::spawn_blocking(move || {
                redb::write_operation_record(&db, &key, value.as_deref(), expired.as_deref())
            })
            .await
            .map_err(|e| HubError::Task(e.to_string()))?,
            OperationRecords::Postgres(records) => {
                records
                    .write(&key, value.as_deref(), expired.as_deref())
                    .await
            }
        }
    }

    /// Claims `key` for a new operation with the record `value`: stores it unless a record
    /// is there already, which it returns instead (`None`: claimed). In PostgreSQL this is one
    /// insert that only one replica can win, so a client id retried on another replica
    /// (after the owner was killed, say) finds the first submission's record and does not
    /// run again. The embedded store has one replica, whose registry in memory already
    /// refused a second claim: it just writes.
    pub async fn claim(self, key: String, value: Vec<u8>) -> Result<Option<Vec<u8>>> {
        match self {
            OperationRecords::Embedded(_) => {
                self.write(key, Some(value), None).await?;
                Ok(None)
            }
            OperationRecords::Postgres(records) => records.claim(&key, &value).await,
        }
    }

    /// The record of `key`, when one is stored (`None` with the embedded store: its records
    /// are all in memory since start-up).
    pub async fn read(self, key: String) -> Result<Option<Vec<u8>>> {
        match self {
            OperationRecords::Embedded(_) => Ok(None),
            OperationRecords::Postgres(records) => records.read(&key).await,
        }
    }
}
