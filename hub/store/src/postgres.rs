//! The PostgreSQL backend: the same tables as the embedded store, in a database several hub
//! replicas share. No ORM: the statements are below, and the schema is versioned by
//! [`MIGRATIONS`], run at start-up.
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
use tokio_postgres::{Client, Statement, types::ToSql};

use super::{
    AccountSnapshot, CommitHook, Expired, Failed, Loaded, SharedTables, StoreOp, decode_object,
    encode_object, postgres_tls::Target,
};
use scale_agent_hub_cache::{Cache, KindKey};
use scale_agent_hub_model::{
    HubError, Result,
    records::{AccountBinding, AccountRecord, AgentTokenRecord, EnrolledIdentity, TokenRecord},
};

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

/// One schema version: applied in one transaction, recorded in `schema_migrations`.
struct Migration {
    version: i64,
    name: &'static str,
    sql: &'static str,
}

/// Every schema version the hub knows, oldest first. Append, never edit: a database that
/// ran a version does not run it again.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "the embedded store's tables, account ownership",
        sql: "
        CREATE TABLE accounts (account text PRIMARY KEY, record bytea NOT NULL);
        CREATE TABLE kinds (
            account text NOT NULL, kind text NOT NULL, info bytea NOT NULL,
            PRIMARY KEY (account, kind));
        CREATE TABLE objects (
            account text NOT NULL, kind text NOT NULL, uid text NOT NULL, object bytea NOT NULL,
            PRIMARY KEY (account, kind, uid));
        CREATE TABLE resume_points (
            account text NOT NULL, kind text NOT NULL, watch_namespace text NOT NULL,
            resource_version text NOT NULL,
            PRIMARY KEY (account, kind, watch_namespace));
        CREATE TABLE tokens (id text PRIMARY KEY, record bytea NOT NULL);
        CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL);
        CREATE TABLE clouddriver_accounts (account text PRIMARY KEY, body_hash text NOT NULL);
        CREATE TABLE agent_tokens (id text PRIMARY KEY, record bytea NOT NULL);
        CREATE TABLE agent_identities (identity text PRIMARY KEY, record bytea NOT NULL);
        CREATE TABLE account_bindings (account text PRIMARY KEY, binding bytea NOT NULL);
        CREATE TABLE dynamic_accounts (account text PRIMARY KEY, record bytea NOT NULL);
        CREATE TABLE operation_records (
            account text NOT NULL, id text NOT NULL, record bytea NOT NULL,
            PRIMARY KEY (account, id));
        CREATE TABLE account_owners (
            account text PRIMARY KEY, replica text NOT NULL, address text NOT NULL,
            epoch bigint NOT NULL, since timestamptz NOT NULL);
        CREATE TABLE ownership_history (
            account text NOT NULL, replica text NOT NULL, epoch bigint NOT NULL,
            acquired_at timestamptz NOT NULL, released_at timestamptz NULL);
        CREATE INDEX ownership_history_account ON ownership_history (account, epoch);
    ",
    },
    Migration {
        version: 2,
        name: "the replicas sharing the store, with the last time each said it was alive",
        sql: "
        CREATE TABLE hub_replicas (
            replica text PRIMARY KEY, address text NOT NULL, seen_at timestamptz NOT NULL);
    ",
    },
];

/// The advisory lock that serializes migrations of replicas starting together ("scale-agent
/// schema" in ASCII).
const MIGRATION_LOCK: i64 = 0x7363_616c_6573_6368;

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

    /// Every operation record, `(account\0id, bytes)`.
    pub async fn load_operation_records(&self) -> Result<Vec<(String, Vec<u8>)>> {
        self.check_open()?;
        let conn = self.records.get().await?;
        let rows = conn
            .client
            .query("SELECT account, id, record FROM operation_records", &[])
            .await
            .map_err(pg("load operation records"))?;
        Ok(rows
            .iter()
            .map(|row| {
                let (account, id): (&str, &str) = (row.get(0), row.get(1));
                (format!("{account}\0{id}"), row.get(2))
            })
            .collect())
    }
}

/// Writes operation records on a connection of their own.
#[derive(Clone)]
pub struct PostgresRecords(Arc<Connection>);

impl PostgresRecords {
    pub async fn write(
        &self,
        key: &str,
        value: Option<&[u8]>,
        expired: Option<&Expired>,
    ) -> Result<()> {
        // PostgreSQL's text cannot hold the NUL that separates them in the embedded store.
        let (account, id) = key.split_once('\0').unwrap_or(("", key));
        let mut conn = self.0.get().await?;
        let txn = conn
            .client
            .transaction()
            .await
            .map_err(pg("operation record"))?;
        match value {
            Some(bytes) => txn
                .execute(
                    "INSERT INTO operation_records (account, id, record) VALUES ($1, $2, $3) \
                     ON CONFLICT (account, id) DO UPDATE SET record = EXCLUDED.record",
                    &[&account, &id, &bytes],
                )
                .await
                .map_err(pg("operation record"))?,
            None => txn
                .execute(
                    "DELETE FROM operation_records WHERE account = $1 AND id = $2",
                    &[&account, &id],
                )
                .await
                .map_err(pg("operation record"))?,
        };
        if let Some(expired) = expired {
            let rows = txn
                .query("SELECT account, id, record FROM operation_records", &[])
                .await
                .map_err(pg("operation record"))?;
            for row in rows.iter().filter(|row| expired(row.get(2))) {
                let (account, id): (&str, &str) = (row.get(0), row.get(1));
                txn.execute(
                    "DELETE FROM operation_records WHERE account = $1 AND id = $2",
                    &[&account, &id],
                )
                .await
                .map_err(pg("operation record"))?;
            }
        }
        txn.commit().await.map_err(pg("operation record"))
    }
}

/// The small tables replicas sharing the store read again and again (see [`SharedStore`]).
async fn read_shared_tables(client: &Client) -> Result<SharedTables> {
    let rows = |sql: &'static str| async move { client.query(sql, &[]).await.map_err(pg("load")) };
    let mut tables = SharedTables::default();
    for row in rows("SELECT id, record FROM tokens").await? {
        let id: &str = row.get(0);
        let record = serde_json::from_slice(row.get(1)).map_err(corrupt(format!("tokens/{id}")))?;
        tables.tokens.push(record);
    }
    for row in rows("SELECT id, record FROM agent_tokens").await? {
        let id: &str = row.get(0);
        let record =
            serde_json::from_slice(row.get(1)).map_err(corrupt(format!("agent_tokens/{id}")))?;
        tables.agent_tokens.push(record);
    }
    for row in rows("SELECT identity, record FROM agent_identities").await? {
        let identity: &str = row.get(0);
        let record = serde_json::from_slice(row.get(1))
            .map_err(corrupt(format!("agent_identities/{identity}")))?;
        tables.enrolled.push(record);
    }
    for row in rows("SELECT account, binding FROM account_bindings").await? {
        let account: String = row.get(0);
        let binding = serde_json::from_slice(row.get(1))
            .map_err(corrupt(format!("account_bindings/{account}")))?;
        tables.bindings.push((account, binding));
    }
    for row in rows("SELECT account, record FROM dynamic_accounts").await? {
        let account: String = row.get(0);
        let record = serde_json::from_slice(row.get(1))
            .map_err(corrupt(format!("dynamic_accounts/{account}")))?;
        tables.dynamic_accounts.push((account, record));
    }
    Ok(tables)
}

/// A replica that shares the store, as the others find it (`hub_replicas`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaRow {
    /// `--replica-id`.
    pub replica: String,
    /// `--replica-address`.
    pub address: String,
    /// When it last said it was alive.
    pub seen_at: std::time::SystemTime,
}

/// An account's owner as `account_owners` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRow {
    pub replica: String,
    pub address: String,
    pub epoch: i64,
    pub since: std::time::SystemTime,
}

/// What replicas sharing the store read of each other's writes, on a connection of its own
/// (outside the store's lock, so a lookup never waits for a commit): the small tables each
/// replica keeps in memory (tokens, agent tokens and identities, bindings, dynamic
/// accounts), read whole every refresh and looked up one row on a miss; the replicas alive;
/// the owners; and the sweep of accounts no replica owns.
#[derive(Clone)]
pub struct SharedStore(Arc<Connection>);

impl SharedStore {
    /// Tokens, agent tokens, enrolled identities, bindings and dynamic accounts.
    pub async fn tables(&self) -> Result<SharedTables> {
        let conn = self.0.get().await?;
        read_shared_tables(&conn.client).await
    }

    /// The token (proxy or API) whose SHA-256 is `sha256_hex`, if the store holds it.
    pub async fn find_token(&self, sha256_hex: &str) -> Result<Option<TokenRecord>> {
        self.find_by_hash("tokens", sha256_hex).await
    }

    /// The agent token whose SHA-256 is `sha256_hex`, if the store holds it.
    pub async fn find_agent_token(&self, sha256_hex: &str) -> Result<Option<AgentTokenRecord>> {
        self.find_by_hash("agent_tokens", sha256_hex).await
    }

    /// A scan of a small table (its records are JSON holding their hash): the lookup of a
    /// credential this replica does not know yet.
    async fn find_by_hash<T: serde::de::DeserializeOwned>(
        &self,
        table: &'static str,
        sha256_hex: &str,
    ) -> Result<Option<T>> {
        let conn = self.0.get().await?;
        let sql = format!(
            "SELECT id, record FROM {table} \
             WHERE convert_from(record, 'UTF8')::jsonb ->> 'sha256' = $1 LIMIT 1"
        );
        let Some(row) = conn
            .client
            .query_opt(&sql, &[&sha256_hex])
            .await
            .map_err(pg("look up a token"))?
        else {
            return Ok(None);
        };
        let id: &str = row.get(0);
        serde_json::from_slice(row.get(1))
            .map(Some)
            .map_err(corrupt(format!("{table}/{id}")))
    }

    /// The enrolment of `identity`, if the store holds one.
    pub async fn find_enrolled(&self, identity: &str) -> Result<Option<EnrolledIdentity>> {
        let conn = self.0.get().await?;
        let Some(row) = conn
            .client
            .query_opt(
                "SELECT record FROM agent_identities WHERE identity = $1",
                &[&identity],
            )
            .await
            .map_err(pg("look up an enrolled identity"))?
        else {
            return Ok(None);
        };
        serde_json::from_slice(row.get(0))
            .map(Some)
            .map_err(corrupt(format!("agent_identities/{identity}")))
    }

    /// `account`'s record and binding, as far as the store holds them.
    pub async fn find_account(
        &self,
        account: &str,
    ) -> Result<(Option<AccountRecord>, Option<AccountBinding>)> {
        let conn = self.0.get().await?;
        let record = conn
            .client
            .query_opt(
                "SELECT record FROM accounts WHERE account = $1",
                &[&account],
            )
            .await
            .map_err(pg("look up an account"))?
            .map(|row| serde_json::from_slice(row.get(0)).map_err(corrupt(account.to_string())))
            .transpose()?;
        let binding = conn
            .client
            .query_opt(
                "SELECT binding FROM account_bindings WHERE account = $1",
                &[&account],
            )
            .await
            .map_err(pg("look up an account's binding"))?
            .map(|row| {
                serde_json::from_slice(row.get(0))
                    .map_err(corrupt(format!("account_bindings/{account}")))
            })
            .transpose()?;
        Ok((record, binding))
    }

    /// Marks an enrolment token used (`used` is the record with its `used` time) unless
    /// another replica did first: `false` then. Durable.
    pub async fn claim_enrolment(&self, used: &AgentTokenRecord) -> Result<bool> {
        let conn = self.0.get().await?;
        let record = serde_json::to_vec(used).unwrap_or_default();
        let claimed = conn
            .client
            .execute(
                "UPDATE agent_tokens SET record = $2 \
                 WHERE id = $1 AND (convert_from(record, 'UTF8')::jsonb ->> 'used') IS NULL",
                &[&used.id, &record],
            )
            .await
            .map_err(pg("claim an enrolment token"))?;
        Ok(claimed == 1)
    }

    /// Every account record in the store.
    pub async fn accounts(&self) -> Result<Vec<(String, AccountRecord)>> {
        let conn = self.0.get().await?;
        let rows = conn
            .client
            .query("SELECT account, record FROM accounts ORDER BY account", &[])
            .await
            .map_err(pg("list the accounts"))?;
        rows.iter()
            .map(|row| {
                let account: String = row.get(0);
                let record =
                    serde_json::from_slice(row.get(1)).map_err(corrupt(account.clone()))?;
                Ok((account, record))
            })
            .collect()
    }

    /// Every account's owner as `account_owners` names it (a dead owner's row stays until
    /// another replica takes the account or the sweep clears it).
    pub async fn owners(&self) -> Result<BTreeMap<String, OwnerRow>> {
        let conn = self.0.get().await?;
        let rows = conn
            .client
            .query(
                "SELECT account, replica, address, epoch, since FROM account_owners",
                &[],
            )
            .await
            .map_err(pg("list the accounts' owners"))?;
        Ok(rows
            .iter()
            .map(|row| {
                (
                    row.get(0),
                    OwnerRow {
                        replica: row.get(1),
                        address: row.get(2),
                        epoch: row.get(3),
                        since: row.get(4),
                    },
                )
            })
            .collect())
    }

    /// Says `replica` (reached at `address`) is alive now, and forgets replicas silent for
    /// longer than `forget_after`.
    pub async fn heartbeat(
        &self,
        replica: &str,
        address: &str,
        forget_after: Duration,
    ) -> Result<()> {
        let conn = self.0.get().await?;
        conn.client
            .execute(
                "INSERT INTO hub_replicas (replica, address, seen_at) VALUES ($1, $2, now()) \
                 ON CONFLICT (replica) DO UPDATE SET address = EXCLUDED.address, \
                 seen_at = EXCLUDED.seen_at",
                &[&replica, &address],
            )
            .await
            .map_err(pg("record this replica as alive"))?;
        conn.client
            .execute(
                "DELETE FROM hub_replicas WHERE seen_at < now() - make_interval(secs => $1)",
                &[&forget_after.as_secs_f64()],
            )
            .await
            .map_err(pg("forget silent replicas"))?;
        Ok(())
    }

    /// The replicas that said they were alive within `within`.
    pub async fn replicas(&self, within: Duration) -> Result<Vec<ReplicaRow>> {
        let conn = self.0.get().await?;
        let rows = conn
            .client
            .query(
                "SELECT replica, address, seen_at FROM hub_replicas \
                 WHERE seen_at >= now() - make_interval(secs => $1) ORDER BY replica",
                &[&within.as_secs_f64()],
            )
            .await
            .map_err(pg("list the replicas"))?;
        Ok(rows
            .iter()
            .map(|row| ReplicaRow {
                replica: row.get(0),
                address: row.get(1),
                seen_at: row.get(2),
            })
            .collect())
    }

    /// Removes the cached data (record, kinds, objects, resume points; the binding stays) of
    /// every account no replica has owned for `grace`, as one replica removes its own past
    /// the grace period. Each account is swept in a transaction holding its ownership lock
    /// (`pg_try_advisory_xact_lock`), so no replica acquires it meanwhile and two replicas
    /// sweeping together remove it once: the one whose delete found the row reports it.
    /// A tenure left open by a dead owner (its lock is free) is closed now, and its
    /// `account_owners` row removed: its grace period starts then. Returns the accounts
    /// this call removed.
    pub async fn sweep_orphans(&self, grace: Duration) -> Result<Vec<String>> {
        let mut conn = self.0.get().await?;
        let client = &mut conn.client;
        // The advisory locks held now, by any session: owned accounts (and ones being
        // acquired or released) are among them.
        let held: BTreeSet<i64> = client
            .query(
                "SELECT ((classid::bigint << 32) | objid::bigint) FROM pg_locks \
                 WHERE locktype = 'advisory' AND granted AND objsubid = 1",
                &[],
            )
            .await
            .map_err(pg("read the advisory locks"))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let candidates = client
            .query(
                "SELECT a.account,
                        EXISTS (SELECT 1 FROM account_owners o WHERE o.account = a.account)
                          OR EXISTS (SELECT 1 FROM ownership_history h
                                     WHERE h.account = a.account AND h.released_at IS NULL),
                        COALESCE((SELECT max(h.released_at) FROM ownership_history h
                                  WHERE h.account = a.account)
                                 <= now() - make_interval(secs => $1), false)
                 FROM accounts a",
                &[&grace.as_secs_f64()],
            )
            .await
            .map_err(pg("list the accounts to sweep"))?;
        let mut removed = Vec::new();
        for row in candidates {
            let (account, owner_left, expired): (String, bool, bool) =
                (row.get(0), row.get(1), row.get(2));
            let key = lock_key(&account);
            if held.contains(&key) || !(owner_left || expired) {
                continue;
            }
            let txn = client.transaction().await.map_err(pg("sweep"))?;
            let locked: bool = txn
                .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&key])
                .await
                .map_err(pg("sweep"))?
                .get(0);
            if !locked {
                continue;
            }
            let closed = txn
                .execute(
                    "UPDATE ownership_history SET released_at = now() \
                     WHERE account = $1 AND released_at IS NULL",
                    &[&account],
                )
                .await
                .map_err(pg("sweep"))?;
            txn.execute("DELETE FROM account_owners WHERE account = $1", &[&account])
                .await
                .map_err(pg("sweep"))?;
            if closed > 0 {
                tracing::info!(%account, "the owner of the account is gone (its lock is free): its tenure ends now, and so the grace period starts");
            }
            let expired: bool = txn
                .query_one(
                    "SELECT COALESCE(max(released_at) <= now() - make_interval(secs => $2), \
                     false) FROM ownership_history WHERE account = $1",
                    &[&account, &grace.as_secs_f64()],
                )
                .await
                .map_err(pg("sweep"))?
                .get(0);
            if expired {
                let deleted = txn
                    .execute("DELETE FROM accounts WHERE account = $1", &[&account])
                    .await
                    .map_err(pg("sweep"))?;
                for table in ["kinds", "objects", "resume_points"] {
                    txn.execute(
                        &format!("DELETE FROM {table} WHERE account = $1"),
                        &[&account],
                    )
                    .await
                    .map_err(pg("sweep"))?;
                }
                if deleted > 0 {
                    removed.push(account);
                }
            }
            txn.commit().await.map_err(pg("sweep"))?;
        }
        Ok(removed)
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

/// Runs the migrations the database lacks, each in its own transaction under an advisory
/// lock (replicas starting together migrate once); returns the versions applied. The one
/// definition of the schema: account ownership ([`crate::owners::postgres`]) runs it too.
pub async fn migrate(client: &mut Client) -> Result<Vec<i64>> {
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    let mut applied = Vec::new();
    for migration in MIGRATIONS {
        let txn = client.transaction().await.map_err(pg("migrate"))?;
        txn.batch_execute(&format!(
            "SELECT pg_advisory_xact_lock({MIGRATION_LOCK});
             CREATE TABLE IF NOT EXISTS schema_migrations (
                 version bigint PRIMARY KEY, name text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now());"
        ))
        .await
        .map_err(pg("migrate"))?;
        let current: i64 = txn
            .query_one(
                "SELECT coalesce(max(version), 0) FROM schema_migrations",
                &[],
            )
            .await
            .map_err(pg("migrate"))?
            .get(0);
        if current > known {
            return Err(HubError::SchemaTooNew { current, known });
        }
        if current >= migration.version {
            continue;
        }
        txn.batch_execute(migration.sql)
            .await
            .map_err(pg("migrate"))?;
        txn.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            &[&migration.version, &migration.name],
        )
        .await
        .map_err(pg("migrate"))?;
        txn.commit().await.map_err(pg("migrate"))?;
        applied.push(migration.version);
    }
    Ok(applied)
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

/// The statements of a batch.
#[derive(Clone, Copy)]
enum Which {
    PutAccount,
    DeleteAccount,
    DeleteKinds,
    DeleteObjects,
    DeleteResumes,
    PutKind,
    PutObject,
    DeleteObject,
    PutResume,
    DeleteResume,
    PutToken,
    DeleteToken,
    PutMeta,
    PutRegistration,
    DeleteRegistration,
    PutAgentToken,
    DeleteAgentToken,
    PutIdentity,
    PutBinding,
    PutDynamicAccount,
    DeleteDynamicAccount,
}

const SQL: &[(Which, &str)] = &[
    (
        Which::PutAccount,
        "INSERT INTO accounts (account, record) VALUES ($1, $2) \
         ON CONFLICT (account) DO UPDATE SET record = EXCLUDED.record",
    ),
    (
        Which::DeleteAccount,
        "DELETE FROM accounts WHERE account = $1",
    ),
    (Which::DeleteKinds, "DELETE FROM kinds WHERE account = $1"),
    (
        Which::DeleteObjects,
        "DELETE FROM objects WHERE account = $1",
    ),
    (
        Which::DeleteResumes,
        "DELETE FROM resume_points WHERE account = $1",
    ),
    (
        Which::PutKind,
        "INSERT INTO kinds (account, kind, info) VALUES ($1, $2, $3) \
         ON CONFLICT (account, kind) DO UPDATE SET info = EXCLUDED.info",
    ),
    (
        Which::PutObject,
        "INSERT INTO objects (account, kind, uid, object) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (account, kind, uid) DO UPDATE SET object = EXCLUDED.object",
    ),
    (
        Which::DeleteObject,
        "DELETE FROM objects WHERE account = $1 AND kind = $2 AND uid = $3",
    ),
    (
        Which::PutResume,
        "INSERT INTO resume_points (account, kind, watch_namespace, resource_version) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (account, kind, watch_namespace) \
         DO UPDATE SET resource_version = EXCLUDED.resource_version",
    ),
    (
        Which::DeleteResume,
        "DELETE FROM resume_points WHERE account = $1 AND kind = $2 AND watch_namespace = $3",
    ),
    (
        Which::PutToken,
        "INSERT INTO tokens (id, record) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record",
    ),
    (Which::DeleteToken, "DELETE FROM tokens WHERE id = $1"),
    (
        Which::PutMeta,
        "INSERT INTO meta (key, value) VALUES ($1, $2) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
    ),
    (
        Which::PutRegistration,
        "INSERT INTO clouddriver_accounts (account, body_hash) VALUES ($1, $2) \
         ON CONFLICT (account) DO UPDATE SET body_hash = EXCLUDED.body_hash",
    ),
    (
        Which::DeleteRegistration,
        "DELETE FROM clouddriver_accounts WHERE account = $1",
    ),
    (
        Which::PutAgentToken,
        "INSERT INTO agent_tokens (id, record) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record",
    ),
    (
        Which::DeleteAgentToken,
        "DELETE FROM agent_tokens WHERE id = $1",
    ),
    (
        Which::PutIdentity,
        "INSERT INTO agent_identities (identity, record) VALUES ($1, $2) \
         ON CONFLICT (identity) DO UPDATE SET record = EXCLUDED.record",
    ),
    (
        Which::PutBinding,
        "INSERT INTO account_bindings (account, binding) VALUES ($1, $2) \
         ON CONFLICT (account) DO UPDATE SET binding = EXCLUDED.binding",
    ),
    (
        Which::PutDynamicAccount,
        "INSERT INTO dynamic_accounts (account, record) VALUES ($1, $2) \
         ON CONFLICT (account) DO UPDATE SET record = EXCLUDED.record",
    ),
    (
        Which::DeleteDynamicAccount,
        "DELETE FROM dynamic_accounts WHERE account = $1",
    ),
];

/// The batch statements, prepared once per connection (pipelined: one round trip).
#[derive(Clone)]
struct Statements(Vec<Statement>);

impl Statements {
    async fn prepare(client: &Client) -> Result<Self> {
        let statements =
            futures::future::try_join_all(SQL.iter().map(|(_, sql)| client.prepare(sql)))
                .await
                .map_err(pg("prepare"))?;
        Ok(Statements(statements))
    }

    fn get(&self, which: Which) -> &Statement {
        // SQL lists every `Which` in declaration order.
        &self.0[which as usize]
    }
}

type Param = Box<dyn ToSql + Sync + Send>;

fn text(s: &str) -> Param {
    Box::new(s.to_string())
}

fn bytes(b: Vec<u8>) -> Param {
    Box::new(b)
}

fn json<T: serde::Serialize>(value: &T) -> Param {
    bytes(serde_json::to_vec(value).unwrap_or_default())
}

/// The statements (and their parameters) that make one change.
fn encode(op: &StoreOp) -> Vec<(Which, Vec<Param>)> {
    let one = |which, params| vec![(which, params)];
    match op {
        StoreOp::PutAccount { account, record } => {
            one(Which::PutAccount, vec![text(account), json(record)])
        }
        StoreOp::DeleteAccount { account } => [
            Which::DeleteAccount,
            Which::DeleteKinds,
            Which::DeleteObjects,
            Which::DeleteResumes,
        ]
        .into_iter()
        .map(|which| (which, vec![text(account)]))
        .collect(),
        StoreOp::PutKind { account, info } => one(
            Which::PutKind,
            vec![text(account), text(&info.key().storage_key()), json(info)],
        ),
        StoreOp::PutObject {
            account,
            kind,
            object,
        } => one(
            Which::PutObject,
            vec![
                text(account),
                text(&kind.storage_key()),
                text(&object.uid),
                bytes(encode_object(object)),
            ],
        ),
        StoreOp::DeleteObject { account, kind, uid } => one(
            Which::DeleteObject,
            vec![text(account), text(&kind.storage_key()), text(uid)],
        ),
        StoreOp::PutResume {
            account,
            kind,
            watch_namespace,
            resource_version,
        } => one(
            Which::PutResume,
            vec![
                text(account),
                text(&kind.storage_key()),
                text(watch_namespace),
                text(resource_version),
            ],
        ),
        StoreOp::DeleteResume {
            account,
            kind,
            watch_namespace,
        } => one(
            Which::DeleteResume,
            vec![
                text(account),
                text(&kind.storage_key()),
                text(watch_namespace),
            ],
        ),
        StoreOp::PutToken { record } => one(Which::PutToken, vec![text(&record.id), json(record)]),
        StoreOp::DeleteToken { id } => one(Which::DeleteToken, vec![text(id)]),
        StoreOp::PutMeta { key, value } => one(Which::PutMeta, vec![text(key), text(value)]),
        StoreOp::PutRegistration { account, body_hash } => {
            one(Which::PutRegistration, vec![text(account), text(body_hash)])
        }
        StoreOp::DeleteRegistration { account } => {
            one(Which::DeleteRegistration, vec![text(account)])
        }
        StoreOp::PutAgentToken { record } => {
            one(Which::PutAgentToken, vec![text(&record.id), json(record)])
        }
        StoreOp::DeleteAgentToken { id } => one(Which::DeleteAgentToken, vec![text(id)]),
        StoreOp::PutEnrolledIdentity { record } => one(
            Which::PutIdentity,
            vec![text(&record.identity), json(record)],
        ),
        StoreOp::PutBinding { account, binding } => {
            one(Which::PutBinding, vec![text(account), json(binding)])
        }
        StoreOp::PutDynamicAccount { record } => one(
            Which::PutDynamicAccount,
            vec![text(&record.spec.name), json(record)],
        ),
        StoreOp::DeleteDynamicAccount { account } => {
            one(Which::DeleteDynamicAccount, vec![text(account)])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_at_its_index() {
        for (i, (which, _)) in SQL.iter().enumerate() {
            assert_eq!(*which as usize, i);
        }
        assert_eq!(SQL.len(), Which::DeleteDynamicAccount as usize + 1);
    }

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

    #[test]
    fn migrations_are_numbered_in_order() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i64 + 1, "{}", m.name);
        }
    }
}
