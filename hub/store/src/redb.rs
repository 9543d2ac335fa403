//! The embedded backend: a redb database in the data directory (`<data-dir>/hub.redb`).
//! Non-durable commits skip the fsync; redb rolls them back when it must be reopened after an
//! I/O error (a full disk), so they are kept and written again then (see
//! [`RedbStore::try_commit`]).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::{
    AccountSnapshot, CommitHook, Expired, Failed, Loaded, StoreOp, decode_object, encode_object,
};
use scale_agent_hub_cache::{Cache, KindInfo, KindKey};
use scale_agent_hub_model::{
    HubError, Result,
    records::{AccountRecord, TokenRecord},
};

/// account → AccountRecord (JSON).
const ACCOUNTS: TableDefinition<&str, &[u8]> = TableDefinition::new("accounts");
/// account \0 group/kind → KindInfo (JSON).
const KINDS: TableDefinition<&str, &[u8]> = TableDefinition::new("kinds");
/// account \0 group/kind \0 uid → object header (JSON) \n object JSON.
const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
/// account \0 group/kind \0 watch namespace → resourceVersion.
const RESUME: TableDefinition<&str, &str> = TableDefinition::new("resume_points");
/// token id → TokenRecord (JSON; the token's hash, never the token).
const TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("tokens");
/// name → value: the hub's own settings (the token derivation key).
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
/// account → hash of the body last registered in Clouddriver's Account Management API.
const REGISTRATIONS: TableDefinition<&str, &str> = TableDefinition::new("clouddriver_accounts");
/// agent token id → AgentTokenRecord (JSON; the token's hash, never the token).
const AGENT_TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("agent_tokens");
/// identity → EnrolledIdentity (JSON): the account pattern of an enrolled identity.
const AGENT_IDENTITIES: TableDefinition<&str, &[u8]> = TableDefinition::new("agent_identities");
/// account → AccountBinding (JSON): the identity an account is bound to. Kept when the
/// account's cache is removed after the grace period.
const ACCOUNT_BINDINGS: TableDefinition<&str, &[u8]> = TableDefinition::new("account_bindings");
/// identity → AgentIdentityState (JSON): identities an admin disabled, certificates denied.
const AGENT_IDENTITY_STATES: TableDefinition<&str, &[u8]> =
    TableDefinition::new("agent_identity_states");
/// account → DynamicAccountRecord (JSON): accounts added through the dynamic accounts API.
const DYNAMIC_ACCOUNTS: TableDefinition<&str, &[u8]> = TableDefinition::new("dynamic_accounts");

/// Longest wait in [`RedbStore::close`] for a write still running.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

fn key2(account: &str, kind: &KindKey) -> String {
    format!("{account}\0{}", kind.storage_key())
}

fn key3(account: &str, kind: &KindKey, last: &str) -> String {
    format!("{account}\0{}\0{last}", kind.storage_key())
}

/// The embedded store.
pub struct RedbStore {
    path: PathBuf,
    db: Option<Arc<Database>>,
    last_durable: Instant,
    dirty: bool,
    /// The changes committed without fsync since the last durable commit. redb loses them
    /// when the database must be reopened after an I/O error (a full disk), so they are
    /// written again after the reopen.
    unsynced: Vec<StoreOp>,
    /// An I/O error left redb unusable: the next commit opens the database again first.
    poisoned: bool,
    /// What redb rolled back at a reopen, written (durably) before anything newer.
    replay: Vec<StoreOp>,
    hook: Option<CommitHook>,
    /// redb's page cache, kept for a reopen.
    cache_bytes: usize,
}

/// redb's page cache by default (`--store-cache-mib`). The hub reads its store only at
/// start-up (the cache in memory serves every read); a commit reads the B-tree pages it
/// changes, from this cache or else from the file (the kernel's page cache, not the hub's
/// memory). redb keeps every page it writes in this cache while it fits, so the cache grew
/// the hub's RSS with the store's size: with 16 MiB, about 400 B per cached object (of
/// 1,802 B in all) at 10,000 objects in bench measure 5. 2 MiB keeps room for the pages a
/// commit reads most (the upper levels of the trees).
pub const DEFAULT_STORE_CACHE_BYTES: usize = 2 * 1024 * 1024;

impl RedbStore {
    /// Opens (or creates) `<data_dir>/hub.redb`.
    pub fn open(data_dir: &Path) -> Result<Self> {
        RedbStore::open_with_cache(data_dir, DEFAULT_STORE_CACHE_BYTES)
    }

    /// Opens (or creates) `<data_dir>/hub.redb` with a page cache of `cache_bytes`.
    pub fn open_with_cache(data_dir: &Path, cache_bytes: usize) -> Result<Self> {
        std::fs::create_dir_all(data_dir).map_err(|source| HubError::Io {
            context: format!("cannot create data directory {}", data_dir.display()),
            source,
        })?;
        let path = data_dir.join("hub.redb");
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create(&path)
            .map_err(|e| store_err("open", e))?;
        let txn = db.begin_write().map_err(|e| store_err("open", e))?;
        {
            txn.open_table(ACCOUNTS).map_err(|e| store_err("open", e))?;
            txn.open_table(KINDS).map_err(|e| store_err("open", e))?;
            txn.open_table(OBJECTS).map_err(|e| store_err("open", e))?;
            txn.open_table(RESUME).map_err(|e| store_err("open", e))?;
            txn.open_table(TOKENS).map_err(|e| store_err("open", e))?;
            txn.open_table(META).map_err(|e| store_err("open", e))?;
            txn.open_table(REGISTRATIONS)
                .map_err(|e| store_err("open", e))?;
            for table in [
                AGENT_TOKENS,
                AGENT_IDENTITIES,
                ACCOUNT_BINDINGS,
                DYNAMIC_ACCOUNTS,
                AGENT_IDENTITY_STATES,
            ] {
                txn.open_table(table).map_err(|e| store_err("open", e))?;
            }
        }
        txn.commit().map_err(|e| store_err("open", e))?;
        Ok(RedbStore {
            path,
            db: Some(Arc::new(db)),
            last_durable: Instant::now(),
            dirty: false,
            unsynced: Vec::new(),
            poisoned: false,
            replay: Vec::new(),
            hook: None,
            cache_bytes,
        })
    }

    /// Installs the test seam called before each commit ([`CommitHook`]).
    #[doc(hidden)]
    pub fn set_commit_hook(&mut self, hook: Option<CommitHook>) {
        self.hook = hook;
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_open(&self) -> bool {
        self.db.is_some()
    }

    /// Reads everything back.
    pub fn load(&self) -> Result<Loaded> {
        let db = self.db.as_ref().ok_or(HubError::StoreClosed)?;
        let txn = db.begin_read().map_err(load_err)?;
        let mut loaded = Loaded::default();
        let accounts = txn.open_table(ACCOUNTS).map_err(load_err)?;
        for row in accounts.iter().map_err(load_err)? {
            let (k, v) = row.map_err(load_err)?;
            let record: AccountRecord =
                serde_json::from_slice(v.value()).map_err(|err| HubError::Corrupt {
                    key: k.value().to_string(),
                    message: err.to_string(),
                })?;
            loaded.accounts.push((k.value().to_string(), record));
        }
        let kinds = txn.open_table(KINDS).map_err(load_err)?;
        for row in kinds.iter().map_err(load_err)? {
            let (k, v) = row.map_err(load_err)?;
            let key = k.value();
            let Some((account, _)) = key.split_once('\0') else {
                continue;
            };
            let info: KindInfo =
                serde_json::from_slice(v.value()).map_err(|err| HubError::Corrupt {
                    key: key.replace('\0', "/"),
                    message: err.to_string(),
                })?;
            loaded.cache.load_kind(account, info);
        }
        let objects = txn.open_table(OBJECTS).map_err(load_err)?;
        for row in objects.iter().map_err(load_err)? {
            let (k, v) = row.map_err(load_err)?;
            let key = k.value();
            let mut parts = key.splitn(3, '\0');
            let (Some(account), Some(kind), Some(_)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let Some(kind) = KindKey::from_storage_key(kind) else {
                continue;
            };
            let object = decode_object(&key.replace('\0', "/"), v.value())?;
            loaded.cache.load_object(account, &kind, object);
        }
        let resume = txn.open_table(RESUME).map_err(load_err)?;
        for row in resume.iter().map_err(load_err)? {
            let (k, v) = row.map_err(load_err)?;
            let key = k.value();
            let mut parts = key.splitn(3, '\0');
            let (Some(account), Some(kind), Some(ns)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let Some(kind) = KindKey::from_storage_key(kind) else {
                continue;
            };
            loaded
                .cache
                .load_resume(account, &kind, ns.to_string(), v.value().to_string());
        }
        let tokens = txn.open_table(TOKENS).map_err(load_err)?;
        for row in tokens.iter().map_err(load_err)? {
            let (k, v) = row.map_err(load_err)?;
            let record: TokenRecord =
                serde_json::from_slice(v.value()).map_err(|err| HubError::Corrupt {
                    key: format!("tokens/{}", k.value()),
                    message: err.to_string(),
                })?;
            loaded.tokens.push(record);
        }
        let meta = txn.open_table(META).map_err(load_err)?;
        for row in meta.iter().map_err(load_err)? {
            let (k, v) = row.map_err(load_err)?;
            loaded
                .meta
                .insert(k.value().to_string(), v.value().to_string());
        }
        let registrations = txn.open_table(REGISTRATIONS).map_err(load_err)?;
        for row in registrations.iter().map_err(load_err)? {
            let (k, v) = row.map_err(load_err)?;
            loaded
                .registrations
                .insert(k.value().to_string(), v.value().to_string());
        }
        loaded.agent_tokens = load_json(&txn, AGENT_TOKENS, "agent_tokens")?
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        loaded.enrolled = load_json(&txn, AGENT_IDENTITIES, "agent_identities")?
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        loaded.bindings = load_json(&txn, ACCOUNT_BINDINGS, "account_bindings")?;
        loaded.dynamic_accounts = load_json(&txn, DYNAMIC_ACCOUNTS, "dynamic_accounts")?;
        loaded.identity_states = load_json(&txn, AGENT_IDENTITY_STATES, "agent_identity_states")?
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        // Cached data of accounts without a binding (should not happen) is dropped.
        let known: std::collections::BTreeSet<&String> =
            loaded.accounts.iter().map(|(a, _)| a).collect();
        loaded.cache.accounts.retain(|a, _| known.contains(a));
        Ok(loaded)
    }

    /// Reads one account back (one replica: what it holds in memory is as current).
    pub fn load_account(&self, account: &str) -> Result<AccountSnapshot> {
        let db = self.db.as_ref().ok_or(HubError::StoreClosed)?;
        let txn = db.begin_read().map_err(load_err)?;
        let accounts = txn.open_table(ACCOUNTS).map_err(load_err)?;
        let record =
            match accounts.get(account).map_err(load_err)? {
                Some(v) => Some(serde_json::from_slice::<AccountRecord>(v.value()).map_err(
                    |err| HubError::Corrupt {
                        key: account.to_string(),
                        message: err.to_string(),
                    },
                )?),
                None => None,
            };
        let mut cache = Cache::default();
        let (start, end) = prefix_range(account);
        let range = start.as_str()..end.as_str();
        let kinds = txn.open_table(KINDS).map_err(load_err)?;
        for row in kinds.range(range.clone()).map_err(load_err)? {
            let (k, v) = row.map_err(load_err)?;
            let info: KindInfo =
                serde_json::from_slice(v.value()).map_err(|err| HubError::Corrupt {
                    key: k.value().replace('\0', "/"),
                    message: err.to_string(),
                })?;
            cache.load_kind(account, info);
        }
        let objects = txn.open_table(OBJECTS).map_err(load_err)?;
        for row in objects.range(range.clone()).map_err(load_err)? {
            let (k, v) = row.map_err(load_err)?;
            let key = k.value();
            let Some(kind) = key.split('\0').nth(1).and_then(KindKey::from_storage_key) else {
                continue;
            };
            let object = decode_object(&key.replace('\0', "/"), v.value())?;
            cache.load_object(account, &kind, object);
        }
        let resume = txn.open_table(RESUME).map_err(load_err)?;
        for row in resume.range(range).map_err(load_err)? {
            let (k, v) = row.map_err(load_err)?;
            let mut parts = k.value().splitn(3, '\0').skip(1);
            let (Some(kind), Some(ns)) = (parts.next(), parts.next()) else {
                continue;
            };
            let Some(kind) = KindKey::from_storage_key(kind) else {
                continue;
            };
            cache.load_resume(account, &kind, ns.to_string(), v.value().to_string());
        }
        Ok(AccountSnapshot {
            record,
            cache: cache.accounts.remove(account).unwrap_or_default(),
        })
    }

    /// Writes a batch in one transaction (on a blocking thread).
    pub async fn commit(&mut self, ops: Vec<StoreOp>) -> Result<()> {
        self.try_commit(ops, false).await.map_err(|f| f.error)
    }

    /// Writes a batch in one transaction, durably when `durable` (or when the last durable
    /// commit is older than [`super::DURABLE_EVERY`], or an op needs it); on failure the batch is
    /// handed back.
    pub async fn try_commit(&mut self, ops: Vec<StoreOp>, durable: bool) -> Result<(), Failed> {
        match super::durable_commit(&ops, durable, self.last_durable, self.dirty) {
            Some(durable) => self.write(ops, durable).await,
            None => Ok(()),
        }
    }

    /// Whether `error` left redb unusable until the database is opened again (an I/O error
    /// such as a full disk poisons it).
    fn needs_reopen(error: &HubError) -> bool {
        matches!(
            error,
            HubError::Store { source, .. }
                if matches!(
                    source.downcast_ref::<redb::Error>(),
                    Some(redb::Error::Io(_) | redb::Error::PreviousIo)
                )
        )
    }

    /// Opens the database again after an I/O error. redb rolls back to its last durable
    /// commit: the changes committed since without fsync are kept to be written again
    /// before anything newer.
    async fn reopen(&mut self) -> Result<()> {
        self.release().await;
        let db = redb::Builder::new()
            .set_cache_size(self.cache_bytes)
            .create(&self.path)
            .map_err(|e| store_err("reopen", e))?;
        self.db = Some(Arc::new(db));
        self.poisoned = false;
        self.dirty = false;
        let mut rolled_back = std::mem::take(&mut self.unsynced);
        tracing::info!(path = %self.path.display(), rolled_back = rolled_back.len(), "store opened again after an I/O error; the changes it rolled back are written again");
        self.replay.append(&mut rolled_back);
        Ok(())
    }

    /// Makes every earlier commit durable.
    pub async fn flush(&mut self) -> Result<()> {
        if !self.dirty {
            return Ok(());
        }
        self.write(Vec::new(), true).await.map_err(|f| f.error)
    }

    /// Flushes and closes the database (releasing its file lock).
    pub async fn close(&mut self) -> Result<()> {
        let result = self.flush().await;
        self.release().await;
        result
    }

    /// Drops the database, waiting for a write still running on a blocking thread.
    async fn release(&mut self) {
        // A write whose caller was cancelled (the maintenance task aborted at shutdown) runs
        // on to its end on a blocking thread, holding the database: wait for it, so that the
        // file lock is released when this returns.
        if let Some(mut db) = self.db.take() {
            let deadline = Instant::now() + CLOSE_TIMEOUT;
            loop {
                match Arc::try_unwrap(db) {
                    Ok(db) => {
                        drop(db);
                        break;
                    }
                    Err(shared) if Instant::now() < deadline => {
                        db = shared;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(_) => {
                        tracing::warn!(
                            "a store write is still running {CLOSE_TIMEOUT:?} after close; the \
                             database stays open until it ends"
                        );
                        break;
                    }
                }
            }
        }
    }

    async fn write(&mut self, ops: Vec<StoreOp>, durable: bool) -> Result<(), Failed> {
        if self.poisoned
            && let Err(error) = self.reopen().await
        {
            return Err(Failed { error, ops });
        }
        let Some(db) = self.db.clone() else {
            return Err(Failed {
                error: HubError::StoreClosed,
                ops,
            });
        };
        // After a reopen, what redb rolled back goes first, in a durable commit.
        let replayed = self.replay.len();
        let durable = durable || replayed > 0;
        let batch = if replayed > 0 {
            let mut batch = self.replay.clone();
            batch.extend(ops);
            batch
        } else {
            ops
        };
        let hook = self.hook.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let result = match hook.map(|hook| hook(&batch)) {
                Some(Err(message)) => Err(HubError::Io {
                    context: "store commit (test seam)".into(),
                    source: std::io::Error::other(message),
                }),
                _ => write_batch(&db, &batch, durable),
            };
            (batch, result)
        })
        .await;
        let (mut batch, result) = match joined {
            Ok(done) => done,
            Err(e) => {
                return Err(Failed {
                    error: HubError::Task(e.to_string()),
                    ops: Vec::new(),
                });
            }
        };
        let ops = batch.split_off(replayed);
        if let Err(error) = result {
            self.poisoned = Self::needs_reopen(&error);
            return Err(Failed { error, ops });
        }
        if durable {
            self.last_durable = Instant::now();
            self.dirty = false;
            // Dropped, not cleared: a snapshot's commit grows them to one entry per object,
            // and a cleared vector would keep that allocation for the hub's life.
            self.unsynced = Vec::new();
            self.replay = Vec::new();
        } else {
            self.dirty = true;
            self.unsynced.extend(ops);
        }
        Ok(())
    }
}

/// Every row of a table of JSON values, decoded.
fn load_json<T: serde::de::DeserializeOwned>(
    txn: &redb::ReadTransaction,
    table: TableDefinition<&str, &[u8]>,
    name: &str,
) -> Result<Vec<(String, T)>> {
    let table = txn.open_table(table).map_err(load_err)?;
    let mut rows = Vec::new();
    for row in table.iter().map_err(load_err)? {
        let (k, v) = row.map_err(load_err)?;
        let value = serde_json::from_slice(v.value()).map_err(|err| HubError::Corrupt {
            key: format!("{name}/{}", k.value()),
            message: err.to_string(),
        })?;
        rows.push((k.value().to_string(), value));
    }
    Ok(rows)
}

/// A redb error as the hub's, always as a [`redb::Error`] (what [`RedbStore::needs_reopen`]
/// looks for among the sources).
fn store_err(context: &'static str, source: impl Into<redb::Error>) -> HubError {
    HubError::store(context, source.into())
}

fn load_err<E: Into<redb::Error>>(e: E) -> HubError {
    store_err("load", e)
}

fn commit_err<E: Into<redb::Error>>(e: E) -> HubError {
    store_err("commit", e)
}

fn prefix_range(account: &str) -> (String, String) {
    (format!("{account}\0"), format!("{account}\u{1}"))
}

fn write_batch(db: &Database, ops: &[StoreOp], durable: bool) -> Result<()> {
    let mut txn = db.begin_write().map_err(commit_err)?;
    txn.set_durability(if durable {
        Durability::Immediate
    } else {
        Durability::None
    })
    .map_err(commit_err)?;
    {
        let mut accounts = txn.open_table(ACCOUNTS).map_err(commit_err)?;
        let mut kinds = txn.open_table(KINDS).map_err(commit_err)?;
        let mut objects = txn.open_table(OBJECTS).map_err(commit_err)?;
        let mut resume = txn.open_table(RESUME).map_err(commit_err)?;
        let mut tokens = txn.open_table(TOKENS).map_err(commit_err)?;
        let mut meta = txn.open_table(META).map_err(commit_err)?;
        let mut registrations = txn.open_table(REGISTRATIONS).map_err(commit_err)?;
        let mut agent_tokens = txn.open_table(AGENT_TOKENS).map_err(commit_err)?;
        let mut agent_identities = txn.open_table(AGENT_IDENTITIES).map_err(commit_err)?;
        let mut bindings = txn.open_table(ACCOUNT_BINDINGS).map_err(commit_err)?;
        let mut dynamic_accounts = txn.open_table(DYNAMIC_ACCOUNTS).map_err(commit_err)?;
        let mut identity_states = txn.open_table(AGENT_IDENTITY_STATES).map_err(commit_err)?;
        for op in ops {
            match op {
                StoreOp::PutAccount { account, record } => {
                    let bytes = serde_json::to_vec(&record).unwrap_or_default();
                    accounts
                        .insert(account.as_str(), bytes.as_slice())
                        .map_err(commit_err)?;
                }
                StoreOp::DeleteAccount { account } => {
                    accounts.remove(account.as_str()).map_err(commit_err)?;
                    let (start, end) = prefix_range(account);
                    let range = start.as_str()..end.as_str();
                    kinds
                        .retain_in(range.clone(), |_, _| false)
                        .map_err(commit_err)?;
                    objects
                        .retain_in(range.clone(), |_, _| false)
                        .map_err(commit_err)?;
                    resume.retain_in(range, |_, _| false).map_err(commit_err)?;
                }
                StoreOp::PutKind { account, info } => {
                    let bytes = serde_json::to_vec(&info).unwrap_or_default();
                    kinds
                        .insert(key2(account, &info.key()).as_str(), bytes.as_slice())
                        .map_err(commit_err)?;
                }
                StoreOp::PutObject {
                    account,
                    kind,
                    object,
                } => {
                    let bytes = encode_object(object);
                    objects
                        .insert(key3(account, kind, &object.uid).as_str(), bytes.as_slice())
                        .map_err(commit_err)?;
                }
                StoreOp::DeleteObject { account, kind, uid } => {
                    objects
                        .remove(key3(account, kind, uid).as_str())
                        .map_err(commit_err)?;
                }
                StoreOp::PutResume {
                    account,
                    kind,
                    watch_namespace,
                    resource_version,
                } => {
                    resume
                        .insert(
                            key3(account, kind, watch_namespace).as_str(),
                            resource_version.as_str(),
                        )
                        .map_err(commit_err)?;
                }
                StoreOp::DeleteResume {
                    account,
                    kind,
                    watch_namespace,
                } => {
                    resume
                        .remove(key3(account, kind, watch_namespace).as_str())
                        .map_err(commit_err)?;
                }
                StoreOp::PutToken { record } => {
                    let bytes = serde_json::to_vec(&record).unwrap_or_default();
                    tokens
                        .insert(record.id.as_str(), bytes.as_slice())
                        .map_err(commit_err)?;
                }
                StoreOp::DeleteToken { id } => {
                    tokens.remove(id.as_str()).map_err(commit_err)?;
                }
                StoreOp::PutMeta { key, value } => {
                    meta.insert(key.as_str(), value.as_str())
                        .map_err(commit_err)?;
                }
                StoreOp::PutRegistration { account, body_hash } => {
                    registrations
                        .insert(account.as_str(), body_hash.as_str())
                        .map_err(commit_err)?;
                }
                StoreOp::DeleteRegistration { account } => {
                    registrations.remove(account.as_str()).map_err(commit_err)?;
                }
                StoreOp::PutAgentToken { record } => {
                    let bytes = serde_json::to_vec(&record).unwrap_or_default();
                    agent_tokens
                        .insert(record.id.as_str(), bytes.as_slice())
                        .map_err(commit_err)?;
                }
                StoreOp::DeleteAgentToken { id } => {
                    agent_tokens.remove(id.as_str()).map_err(commit_err)?;
                }
                StoreOp::PutEnrolledIdentity { record } => {
                    let bytes = serde_json::to_vec(&record).unwrap_or_default();
                    agent_identities
                        .insert(record.identity.as_str(), bytes.as_slice())
                        .map_err(commit_err)?;
                }
                StoreOp::PutBinding { account, binding } => {
                    let bytes = serde_json::to_vec(&binding).unwrap_or_default();
                    bindings
                        .insert(account.as_str(), bytes.as_slice())
                        .map_err(commit_err)?;
                }
                StoreOp::DeleteBinding { account } => {
                    bindings.remove(account.as_str()).map_err(commit_err)?;
                }
                StoreOp::PutIdentityState { record } => {
                    let bytes = serde_json::to_vec(&record).unwrap_or_default();
                    identity_states
                        .insert(record.identity.as_str(), bytes.as_slice())
                        .map_err(commit_err)?;
                }
                StoreOp::PutDynamicAccount { record } => {
                    let bytes = serde_json::to_vec(&record).unwrap_or_default();
                    dynamic_accounts
                        .insert(record.spec.name.as_str(), bytes.as_slice())
                        .map_err(commit_err)?;
                }
                StoreOp::DeleteDynamicAccount { account } => {
                    dynamic_accounts
                        .remove(account.as_str())
                        .map_err(commit_err)?;
                }
            }
        }
    }
    txn.commit().map_err(commit_err)?;
    Ok(())
}

/// Operation records (see [`super::OperationRecords`]): bytes under `account\0id`.
const OPERATION_RECORDS: TableDefinition<&str, &[u8]> = TableDefinition::new("operation_records");

impl RedbStore {
    /// The database, for a write outside the batches (operation records). Hold it for one
    /// write only: [`RedbStore::close`] waits until every holder has let go.
    pub fn database(&self) -> Option<Arc<Database>> {
        self.db.clone()
    }
}

/// Writes one operation record (`None` removes it) durably, in a transaction of its own.
/// With `expired`, also removes every row it says is past its retention.
pub fn write_operation_record(
    db: &Database,
    key: &str,
    value: Option<&[u8]>,
    expired: Option<&Expired>,
) -> Result<()> {
    let txn = db.begin_write().map_err(commit_err)?;
    {
        let mut table = txn.open_table(OPERATION_RECORDS).map_err(commit_err)?;
        match value {
            Some(bytes) => {
                table.insert(key, bytes).map_err(commit_err)?;
            }
            None => {
                table.remove(key).map_err(commit_err)?;
            }
        }
        if let Some(expired) = expired {
            table.retain(|_, v| !expired(v)).map_err(commit_err)?;
        }
    }
    txn.commit().map_err(commit_err)
}

/// Every operation record, `(account\0id, bytes)`; none when the table was never written.
pub fn load_operation_records(db: &Database) -> Result<Vec<(String, Vec<u8>)>> {
    let txn = db.begin_read().map_err(load_err)?;
    let table = match txn.open_table(OPERATION_RECORDS) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(load_err(e)),
    };
    let mut rows = Vec::new();
    for row in table.iter().map_err(load_err)? {
        let (k, v) = row.map_err(load_err)?;
        rows.push((k.value().to_string(), v.value().to_vec()));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests;
