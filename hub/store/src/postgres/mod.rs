//! The PostgreSQL backend: the same tables as the embedded store, in a database several hub
//! replicas share. No ORM: the statements are in `statements`, and the schema is versioned by
//! the migrations in `schema`, run at start-up. Replicas' reads of each other are in `shared`.
//!
//! A commit batch is one transaction, its statements pipelined on one connection (sent
//! together, answered in order), so a batch of thousands of changes costs a few round
//! trips, not thousands. `durable` maps to `synchronous_commit` for that transaction: off
//! for the streams' frequent commits (PostgreSQL still writes them within a fraction of a
//! second; a crash of PostgreSQL itself may lose the last ones, as an fsync-less redb commit
//! may), on for the rest.
//!
//! Per-account data (kinds, objects, resume points) is read per account
//! ([`PostgresStore::load_account`]): a replica reads the accounts it owns.
//!
//! Fencing: with a [`Fencing`] installed, a batch touching an account's cached data commits
//! only while `account_owners` still names this replica with the epoch it acquired, checked
//! in the batch's own transaction (the row is locked `FOR SHARE`, so a takeover waits for
//! the batch, or the batch sees the takeover).
//!
//! TLS: every connection honours the URL's `sslmode` and `sslrootcert` (or `--postgres-ca`)
//! as libpq does ([`super::postgres_tls`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};
use tokio_postgres::{Client, types::ToSql};

mod schema;
mod shared;
mod statements;

pub use schema::migrate;
use shared::read_shared_tables;
pub use shared::{OwnerRow, ReplicaRow, SharedStore};
use statements::{Statements, encode};

use super::{
    AccountSnapshot, CommitHook, Expired, Failed, Loaded, StoreOp, decode_object,
    postgres_tls::Target,
};
use scale_agent_hub_cache::{Cache, KindKey};
use scale_agent_hub_model::{HubError, Result};

/// How the hub reaches PostgreSQL. The URL carries the password: it is never logged, and
/// `Debug` leaves it out.
#[derive(Clone, Default)]
pub struct PostgresOptions {
    /// `postgres://user:password@host:port/database` (or a key=value connection string),
    /// with libpq's `sslmode` and `sslrootcert` if wanted.
    pub url: String,
    /// `--postgres-ca`: the PEM CA that signed PostgreSQL's certificate, when the URL has no
    /// `sslrootcert`.
    pub ca_file: Option<std::path::PathBuf>,
}

impl PostgresOptions {
    /// Options for `url`, with no CA file besides what the URL names.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresOptions {
            url: url.into(),
            ca_file: None,
        }
    }

    /// The connection settings and TLS the options describe (the CA file is read now).
    pub fn target(&self) -> Result<Target> {
        Target::new(&self.url, self.ca_file.as_deref())
    }
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("url", &"<redacted>")
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// The epoch this replica holds for an account, `None` when it does not own it.
pub type HeldEpoch = Arc<dyn Fn(&str) -> Option<i64> + Send + Sync>;

/// This replica's claim to the accounts it owns, checked in every commit that touches an
/// account's cached data (see the module's documentation).
#[derive(Clone)]
pub struct Fencing {
    /// This replica's id, as written in `account_owners.replica`.
    pub replica: String,
    /// The epoch this replica holds for an account, `None` when it does not own it.
    pub epoch: HeldEpoch,
}

/// Longest wait for a connection to PostgreSQL, when the URL does not say.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Most statements in flight on the connection at once within a batch.
const PIPELINE: usize = 1024;

/// One connection, made again when PostgreSQL closed it (a restart of PostgreSQL, a
/// network failure), so a failed commit that is retried finds a fresh one.
struct Connection {
    target: Target,
    location: String,
    client: Mutex<Option<Conn>>,
}

/// An open connection and the batch statements prepared on it (once per connection).
struct Conn {
    client: Client,
    statements: Option<Statements>,
}

impl Connection {
    fn new(target: Target, location: String) -> Self {
        Connection {
            target,
            location,
            client: Mutex::new(None),
        }
    }

    /// The connection, opened if there is none or PostgreSQL closed it.
    async fn get(&self) -> Result<MappedMutexGuard<'_, Conn>> {
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_none_or(|conn| conn.client.is_closed()) {
            *slot = Some(Conn {
                client: self.open().await?,
                statements: None,
            });
        }
        MutexGuard::try_map(slot, Option::as_mut)
            .map_err(|_| HubError::Task("the PostgreSQL connection vanished".into()))
    }

    async fn open(&self) -> Result<Client> {
        // When it ends, the next write opens another.
        self.target.connect(&self.location, "store's").await
    }

    async fn close(&self) {
        self.client.lock().await.take();
    }
}

/// How long PostgreSQL keeps a store session that went silent inside a transaction. The
/// writer sends a batch's statements back to back, so a transaction idle this long belongs
/// to a replica cut off (a partition) or stopped mid-commit. Its row locks (the fencing
/// check's `FOR SHARE` on `account_owners` among them) would otherwise stay until TCP gives
/// up, hours later, and the replica taking its accounts over would wait on them as long. It
/// is shorter than the ownership lease, so the locks are gone by the time the accounts are
/// free.
pub const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(10);

/// Makes PostgreSQL end a store session idle inside a transaction after
/// [`IDLE_IN_TRANSACTION`] (set at connection start-up, so it holds from the first
/// statement and costs no round trip), and makes TCP notice a dead peer within seconds.
/// Options already in the URL are kept.
fn bound_silent_sessions(config: &mut tokio_postgres::Config) {
    let bound = format!(
        "-c idle_in_transaction_session_timeout={}",
        IDLE_IN_TRANSACTION.as_millis()
    );
    let options = match config.get_options() {
        Some(given) if !given.trim().is_empty() => format!("{given} {bound}"),
        _ => bound,
    };
    config
        .options(&options)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .keepalives_interval(Duration::from_secs(1))
        .keepalives_retries(3)
        .tcp_user_timeout(IDLE_IN_TRANSACTION);
}

/// The PostgreSQL store.
pub struct PostgresStore {
    /// Commits and reads.
    writer: Connection,
    /// Operation records, written outside the store's lock (see [`super::OperationRecords`]).
    records: Arc<Connection>,
    /// What replicas sharing the store read of each other's writes, outside the store's
    /// lock ([`SharedStore`]).
    shared: Arc<Connection>,
    location: String,
    last_durable: Instant,
    /// A non-durable commit was made since the last durable one.
    dirty: bool,
    closed: bool,
    hook: Option<CommitHook>,
    fencing: Option<Fencing>,
}

fn pg(context: &str) -> impl FnOnce(tokio_postgres::Error) -> HubError + '_ {
    move |source| HubError::Postgres {
        context: context.to_string(),
        source: Box::new(source),
    }
}

fn corrupt(key: String) -> impl FnOnce(serde_json::Error) -> HubError {
    move |err| HubError::Corrupt {
        key,
        message: err.to_string(),
    }
}

impl PostgresStore {
    /// Connects, runs the migrations the database lacks, and refuses a database whose schema
    /// is newer than this hub knows.
    pub async fn open(options: &PostgresOptions) -> Result<Self> {
        let mut target = options.target()?;
        let config = &mut target.config;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("scale-agent-hub");
        }
        bound_silent_sessions(config);
        let location = location(&target.config);
        tracing::debug!(%location, sslmode = target.mode().as_str(), "connecting to PostgreSQL");
        let writer = Connection::new(target.clone(), location.clone());
        let records = Arc::new(Connection::new(target.clone(), location.clone()));
        let shared = Arc::new(Connection::new(target, location.clone()));
        let applied = migrate(&mut writer.get().await?.client).await?;
        if !applied.is_empty() {
            tracing::info!(%location, ?applied, "PostgreSQL schema migrated");
        }
        Ok(PostgresStore {
            writer,
            records,
            shared,
            location,
            last_durable: Instant::now(),
            dirty: false,
            closed: false,
            hook: None,
            fencing: None,
        })
    }

    pub fn location(&self) -> &str {
        &self.location
    }

    pub fn is_open(&self) -> bool {
        !self.closed
    }

    pub fn set_commit_hook(&mut self, hook: Option<CommitHook>) {
        self.hook = hook;
    }

    pub fn set_fencing(&mut self, fencing: Option<Fencing>) {
        self.fencing = fencing;
    }

    fn check_open(&self) -> Result<()> {
        if self.closed {
            Err(HubError::StoreClosed)
        } else {
            Ok(())
        }
    }

    /// Everything but the accounts' cached data (kinds, objects, resume points): see
    /// [`PostgresStore::load_account`].
    pub async fn load(&self) -> Result<Loaded> {
        self.check_open()?;
        let conn = self.writer.get().await?;
        let rows = |sql: &'static str| {
            let client = &conn.client;
            async move { client.query(sql, &[]).await.map_err(pg("load")) }
        };
        let mut loaded = Loaded::default();
        for row in rows("SELECT account, record FROM accounts").await? {
            let account: String = row.get(0);
            let record = serde_json::from_slice(row.get(1)).map_err(corrupt(account.clone()))?;
            loaded.accounts.push((account, record));
        }
        for row in rows("SELECT key, value FROM meta").await? {
            loaded.meta.insert(row.get(0), row.get(1));
        }
        for row in rows("SELECT account, body_hash FROM clouddriver_accounts").await? {
            loaded.registrations.insert(row.get(0), row.get(1));
        }
        let tables = read_shared_tables(&conn.client).await?;
        loaded.tokens = tables.tokens;
        loaded.agent_tokens = tables.agent_tokens;
        loaded.enrolled = tables.enrolled;
        loaded.bindings = tables.bindings;
        loaded.dynamic_accounts = tables.dynamic_accounts;
        for row in rows("SELECT identity, record FROM agent_identity_states").await? {
            let identity: &str = row.get(0);
            let record = serde_json::from_slice(row.get(1))
                .map_err(corrupt(format!("agent_identity_states/{identity}")))?;
            loaded.identity_states.push(record);
        }
        Ok(loaded)
    }

    /// The Clouddriver ledger: each account registered, with its body's hash.
    pub async fn registrations(&self) -> Result<BTreeMap<String, String>> {
        self.check_open()?;
        let conn = self.writer.get().await?;
        let rows = conn
            .client
            .query("SELECT account, body_hash FROM clouddriver_accounts", &[])
            .await
            .map_err(pg("read the Clouddriver ledger"))?;
        Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
    }

    /// One account's record, kinds, objects and resume points, read in one snapshot.
    pub async fn load_account(&self, account: &str) -> Result<AccountSnapshot> {
        self.check_open()?;
        let mut conn = self.writer.get().await?;
        let txn = conn
            .client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(pg("load account"))?;
        let record = match txn
            .query_opt(
                "SELECT record FROM accounts WHERE account = $1",
                &[&account],
            )
            .await
            .map_err(pg("load account"))?
        {
            Some(row) => {
                Some(serde_json::from_slice(row.get(0)).map_err(corrupt(account.to_string()))?)
            }
            None => None,
        };
        let mut cache = Cache::default();
        for row in txn
            .query(
                "SELECT kind, info FROM kinds WHERE account = $1",
                &[&account],
            )
            .await
            .map_err(pg("load account"))?
        {
            let kind: &str = row.get(0);
            let info =
                serde_json::from_slice(row.get(1)).map_err(corrupt(format!("{account}/{kind}")))?;
            cache.load_kind(account, info);
        }
        for row in txn
            .query(
                "SELECT kind, uid, object FROM objects WHERE account = $1",
                &[&account],
            )
            .await
            .map_err(pg("load account"))?
        {
            let (kind, uid): (&str, &str) = (row.get(0), row.get(1));
            let Some(key) = KindKey::from_storage_key(kind) else {
                continue;
            };
            let object = decode_object(&format!("{account}/{kind}/{uid}"), row.get(2))?;
            cache.load_object(account, &key, object);
        }
        for row in txn
            .query(
                "SELECT kind, watch_namespace, resource_version FROM resume_points \
                 WHERE account = $1",
                &[&account],
            )
            .await
            .map_err(pg("load account"))?
        {
            let Some(key) = KindKey::from_storage_key(row.get(0)) else {
                continue;
            };
            cache.load_resume(account, &key, row.get(1), row.get(2));
        }
        txn.commit().await.map_err(pg("load account"))?;
        Ok(AccountSnapshot {
            record,
            cache: cache.accounts.remove(account).unwrap_or_default(),
        })
    }

    /// See [`super::Store::try_commit`].
    pub async fn try_commit(&mut self, ops: Vec<StoreOp>, durable: bool) -> Result<(), Failed> {
        let Some(durable) = super::durable_commit(&ops, durable, self.last_durable, self.dirty)
        else {
            return Ok(());
        };
        if let Err(error) = self.check_open() {
            return Err(Failed { error, ops });
        }
        if let Some(hook) = self.hook.clone() {
            let (ops_back, result) = match tokio::task::spawn_blocking(move || {
                let result = hook(&ops);
                (ops, result)
            })
            .await
            {
                Ok(done) => done,
                Err(e) => {
                    return Err(Failed {
                        error: HubError::Task(e.to_string()),
                        ops: Vec::new(),
                    });
                }
            };
            if let Err(message) = result {
                return Err(Failed {
                    error: HubError::Io {
                        context: "store commit (test seam)".into(),
                        source: std::io::Error::other(message),
                    },
                    ops: ops_back,
                });
            }
            return self.write(ops_back, durable).await;
        }
        self.write(ops, durable).await
    }

    async fn write(&mut self, ops: Vec<StoreOp>, durable: bool) -> Result<(), Failed> {
        match self.write_batch(&ops, durable).await {
            Ok(()) => {
                if durable {
                    self.last_durable = Instant::now();
                    self.dirty = false;
                } else {
                    self.dirty = true;
                }
                Ok(())
            }
            Err(error) => Err(Failed { error, ops }),
        }
    }

    async fn write_batch(&self, ops: &[StoreOp], durable: bool) -> Result<()> {
        let mut conn = self.writer.get().await?;
        let st = match &conn.statements {
            Some(st) => st.clone(),
            None => {
                let st = Statements::prepare(&conn.client).await?;
                conn.statements = Some(st.clone());
                st
            }
        };
        let txn = conn.client.transaction().await.map_err(pg("commit"))?;
        // Per transaction: the connection's other transactions keep the server's default.
        txn.batch_execute(if durable {
            "SET LOCAL synchronous_commit = on"
        } else {
            "SET LOCAL synchronous_commit = off"
        })
        .await
        .map_err(pg("commit"))?;
        if ops.is_empty() {
            // A flush: a transaction with an id writes a commit record, and a synchronous
            // commit waits until the WAL (with every earlier commit) is on disk.
            txn.batch_execute("SELECT pg_current_xact_id()")
                .await
                .map_err(pg("flush"))?;
        }
        if let Some(fencing) = &self.fencing {
            check_fencing(&txn, fencing, ops).await?;
        }
        let mut encoded = Vec::with_capacity(ops.len());
        for op in ops {
            encoded.extend(encode(op));
        }
        for chunk in encoded.chunks(PIPELINE) {
            futures::future::try_join_all(chunk.iter().map(|(which, params)| {
                let params: Vec<&(dyn ToSql + Sync)> =
                    params.iter().map(|p| p.as_ref() as _).collect();
                let statement = st.get(*which).clone();
                let txn = &txn;
                async move { txn.execute(&statement, &params).await }
            }))
            .await
            .map_err(pg("commit"))?;
        }
        txn.commit().await.map_err(pg("commit"))
    }

    /// Makes every earlier commit durable.
    pub async fn flush(&mut self) -> Result<()> {
        if !self.dirty {
            return Ok(());
        }
        self.write(Vec::new(), true).await.map_err(|f| f.error)
    }

    /// Flushes and closes the connections.
    pub async fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        let result = self.flush().await;
        self.closed = true;
        self.writer.close().await;
        self.records.close().await;
        self.shared.close().await;
        result
    }

    /// The reads of replicas sharing the store; `None` once closed.
    pub fn shared(&self) -> Option<SharedStore> {
        (!self.closed).then(|| SharedStore(self.shared.clone()))
    }

    pub fn operation_records(&self) -> Option<PostgresRecords> {
        (!self.closed).then(|| PostgresRecords(self.records.clone()))
    }

    /// Every operation record, `(account\0submitter\0id, bytes)`.
    pub async fn load_operation_records(&self) -> Result<Vec<(String, Vec<u8>)>> {
        self.check_open()?;
        let conn = self.records.get().await?;
        let rows = conn
            .client
            .query(
                "SELECT account, submitter, id, record FROM operation_records",
                &[],
            )
            .await
            .map_err(pg("load operation records"))?;
        Ok(rows
            .iter()
            .map(|row| {
                let (account, submitter, id): (&str, &str, &str) =
                    (row.get(0), row.get(1), row.get(2));
                (format!("{account}\0{submitter}\0{id}"), row.get(3))
            })
            .collect())
    }
}

/// Writes operation records on a connection of their own.
#[derive(Clone)]
pub struct PostgresRecords(Arc<Connection>);

/// The columns of an operation record's key, `account\0submitter\0id` (PostgreSQL's text
/// cannot hold the NUL that separates them in the embedded store); an older key without a
/// submitter, `account\0id`, is nobody's (submitter `''`).
fn record_key(key: &str) -> (&str, &str, &str) {
    let Some((account, rest)) = key.split_once('\0') else {
        return ("", "", key);
    };
    match rest.split_once('\0') {
        Some((submitter, id)) => (account, submitter, id),
        None => (account, "", rest),
    }
}

impl PostgresRecords {
    /// Inserts the record unless one exists; returns the existing one (see
    /// [`super::OperationRecords::claim`]).
    pub async fn claim(&self, key: &str, value: &[u8]) -> Result<Option<Vec<u8>>> {
        let (account, submitter, id) = record_key(key);
        let conn = self.0.get().await?;
        let inserted = conn
            .client
            .execute(
                "INSERT INTO operation_records (account, submitter, id, record) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (account, submitter, id) DO NOTHING",
                &[&account, &submitter, &id, &value],
            )
            .await
            .map_err(pg("claim an operation id"))?;
        if inserted == 1 {
            return Ok(None);
        }
        let row = conn
            .client
            .query_opt(
                "SELECT record FROM operation_records \
                 WHERE account = $1 AND submitter = $2 AND id = $3",
                &[&account, &submitter, &id],
            )
            .await
            .map_err(pg("claim an operation id"))?;
        Ok(row.map(|row| row.get(0)))
    }

    /// The record of `key`, if stored.
    pub async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let (account, submitter, id) = record_key(key);
        let conn = self.0.get().await?;
        let row = conn
            .client
            .query_opt(
                "SELECT record FROM operation_records \
                 WHERE account = $1 AND submitter = $2 AND id = $3",
                &[&account, &submitter, &id],
            )
            .await
            .map_err(pg("read an operation record"))?;
        Ok(row.map(|row| row.get(0)))
    }

    pub async fn write(
        &self,
        key: &str,
        value: Option<&[u8]>,
        expired: Option<&Expired>,
    ) -> Result<()> {
        let (account, submitter, id) = record_key(key);
        let mut conn = self.0.get().await?;
        let txn = conn
            .client
            .transaction()
            .await
            .map_err(pg("operation record"))?;
        match value {
            Some(bytes) => txn
                .execute(
                    "INSERT INTO operation_records (account, submitter, id, record) \
                     VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (account, submitter, id) DO UPDATE SET record = EXCLUDED.record",
                    &[&account, &submitter, &id, &bytes],
                )
                .await
                .map_err(pg("operation record"))?,
            None => txn
                .execute(
                    "DELETE FROM operation_records \
                     WHERE account = $1 AND submitter = $2 AND id = $3",
                    &[&account, &submitter, &id],
                )
                .await
                .map_err(pg("operation record"))?,
        };
        if let Some(expired) = expired {
            let rows = txn
                .query(
                    "SELECT account, submitter, id, record FROM operation_records",
                    &[],
                )
                .await
                .map_err(pg("operation record"))?;
            for row in rows.iter().filter(|row| expired(row.get(3))) {
                let (account, submitter, id): (&str, &str, &str) =
                    (row.get(0), row.get(1), row.get(2));
                txn.execute(
                    "DELETE FROM operation_records \
                     WHERE account = $1 AND submitter = $2 AND id = $3",
                    &[&account, &submitter, &id],
                )
                .await
                .map_err(pg("operation record"))?;
            }
        }
        txn.commit().await.map_err(pg("operation record"))
    }
}

/// The advisory lock key of an account: the first 8 bytes of the SHA-256 of
/// `scale-agent/account/<name>`, so that other users of advisory locks in the same database
/// are unlikely to collide with it.
pub fn lock_key(account: &str) -> i64 {
    advisory_key(&format!("scale-agent/account/{account}"))
}

/// An advisory lock key: the first 8 bytes of the SHA-256 of `name`.
pub fn advisory_key(name: &str) -> i64 {
    let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest.as_ref()[..8]);
    i64::from_be_bytes(bytes)
}

/// The accounts whose cached data a batch changes: the ones fencing guards.
pub(crate) fn fenced_accounts(ops: &[StoreOp]) -> BTreeSet<&str> {
    ops.iter()
        .filter_map(|op| match op {
            StoreOp::PutAccount { account, .. }
            | StoreOp::DeleteAccount { account }
            | StoreOp::PutKind { account, .. }
            | StoreOp::PutObject { account, .. }
            | StoreOp::DeleteObject { account, .. }
            | StoreOp::PutResume { account, .. }
            | StoreOp::DeleteResume { account, .. } => Some(account.as_str()),
            _ => None,
        })
        .collect()
}

/// Fails with [`HubError::Fenced`] unless `account_owners` names this replica, with the
/// epoch it holds, for every account the batch touches.
async fn check_fencing(
    txn: &tokio_postgres::Transaction<'_>,
    fencing: &Fencing,
    ops: &[StoreOp],
) -> Result<()> {
    let accounts = fenced_accounts(ops);
    if accounts.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = accounts.iter().copied().collect();
    let rows = txn
        .query(
            "SELECT account, replica, epoch FROM account_owners WHERE account = ANY($1) \
             FOR SHARE",
            &[&names],
        )
        .await
        .map_err(pg("fencing check"))?;
    let owners: BTreeMap<&str, (&str, i64)> = rows
        .iter()
        .map(|row| (row.get(0), (row.get(1), row.get(2))))
        .collect();
    let lost: Vec<String> = accounts
        .iter()
        .filter(|account| {
            let held = (fencing.epoch)(account);
            let owner = owners.get(*account).copied();
            held.is_none() || owner != held.map(|epoch| (fencing.replica.as_str(), epoch))
        })
        .map(|account| account.to_string())
        .collect();
    if lost.is_empty() {
        Ok(())
    } else {
        Err(HubError::Fenced {
            replica: fencing.replica.clone(),
            accounts: lost,
        })
    }
}

/// `host:port/database`: where the store is, for logs (no user, no password).
pub fn location(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or_default();
    format!("{host}:{port}/{db}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_location_in_logs_holds_no_password() {
        let config: tokio_postgres::Config = "postgres://hub:s3cret@db.example:5433/scale"
            .parse()
            .unwrap();
        assert_eq!(location(&config), "db.example:5433/scale");
        let options = PostgresOptions::new("postgres://hub:s3cret@db/x");
        assert!(!format!("{options:?}").contains("s3cret"));
    }

    #[test]
    fn lock_keys_are_stable_and_distinct() {
        assert_eq!(lock_key("prod"), lock_key("prod"));
        assert_ne!(lock_key("prod"), lock_key("prod2"));
    }
}
