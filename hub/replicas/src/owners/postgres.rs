//! Ownership through PostgreSQL: a session-level advisory lock per account
//! (`pg_try_advisory_lock` of a 64-bit hash of `scale-agent/account/<name>`), held on one
//! dedicated connection per replica.
//!
//! Why advisory locks: the lock dies with the replica's database session (a kill -9 closes
//! its socket and PostgreSQL frees the lock at once: no lease to wait out); it lives in the
//! same database as the data, so the store can fence writes in their own transaction
//! against `account_owners`; and the hub needs no Kubernetes API access (it may run outside
//! the cluster).
//!
//! On acquiring, the replica writes itself into `account_owners` with the next epoch and
//! opens its tenure in `ownership_history` (closing a tenure its predecessor could not
//! close: it died). On releasing, it closes its tenure, deletes its row (so writes of its
//! epoch fail the store's fencing), then unlocks. When the connection breaks, every lock is
//! gone at once: [`Ownership::losses`] says so and the next acquisition reconnects.
//!
//! A frozen or partitioned replica must not keep its accounts until TCP gives up (hours, or
//! forever while its kernel still answers keepalives). So the lock session is a lease:
//! PostgreSQL ends it after [`LEASE`] without a statement (`idle_session_timeout`, PostgreSQL
//! 14+), freeing every lock for the other replicas, and the replica runs a heartbeat on it
//! every [`HEARTBEAT`]. A heartbeat that fails or takes longer than [`HEARTBEAT_TIMEOUT`],
//! or one that finds the last success older than [`LEASE`] (the process was stopped), drops
//! the connection: its accounts are lost on this side no later than `HEARTBEAT +
//! HEARTBEAT_TIMEOUT` after the last success, before PostgreSQL can give them to anyone
//! (`LEASE` after it), so two replicas never serve one account. TCP keepalives and a user
//! timeout bound a dead network under that.

use std::{
    collections::BTreeMap,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use scale_agent_hub_model::{HubError, Result, error::Chain};
use scale_agent_hub_store::{PostgresOptions, postgres_tls::Target};
use tokio::sync::watch;
use tokio_postgres::Client;

use super::{Claim, OwnerInfo, Ownership, ReplicaIdentity};
// The lock keys are the store's too (its sweep takes an account's lock): they live there.
pub use scale_agent_hub_store::postgres::{advisory_key, lock_key};

/// How long connecting to PostgreSQL may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the lock session may go without a statement before PostgreSQL ends it and frees
/// its locks (`idle_session_timeout`).
pub const LEASE: Duration = Duration::from_secs(15);
/// How often the replica proves it is alive on the lock session.
pub const HEARTBEAT: Duration = Duration::from_secs(3);
/// A heartbeat slower than this gives the lock session up (this side first: see the module
/// docs).
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a statement on the lock session waits for a row lock: well under
/// [`HEARTBEAT_TIMEOUT`], so a wait never costs the heartbeat.
const LOCK_WAIT: Duration = Duration::from_secs(2);

fn pg_error(action: &str, error: &tokio_postgres::Error) -> HubError {
    HubError::Ownership(format!(
        "cannot {action} in PostgreSQL: {}; check that the database is reachable and that \
         the hub's user may use its tables",
        Chain(error)
    ))
}

/// One replica's ownership through PostgreSQL.
pub struct PostgresOwnership {
    /// Where PostgreSQL is, with its TLS (the URL's password stays inside).
    target: Target,
    location: String,
    replica: ReplicaIdentity,
    /// The connection that holds the locks; `None` after it broke, until the next use.
    lock_connection: std::sync::Arc<tokio::sync::Mutex<Option<Client>>>,
    /// The accounts owned, with their epochs.
    owned: std::sync::Arc<Mutex<BTreeMap<String, i64>>>,
    losses: watch::Sender<u64>,
    /// Bumped by the heartbeat to end the lock connection at once, even while a statement
    /// on it hangs (a partition): its task drops the connection, which fails what waits on
    /// it and frees the connection's lock.
    give_up: watch::Sender<u64>,
}

impl PostgresOwnership {
    /// Connects (so that a wrong URL fails at start-up) and brings the schema up to date
    /// with the store's migrations (the ownership tables are part of it), so that ownership
    /// works whichever of the two reaches an empty database first.
    pub async fn connect(options: &PostgresOptions, replica: ReplicaIdentity) -> Result<Self> {
        let mut target = options.target()?;
        target.config.connect_timeout(CONNECT_TIMEOUT);
        // A dead network ends the session within the heartbeat's bounds too.
        target
            .config
            .keepalives(true)
            .keepalives_idle(HEARTBEAT)
            .keepalives_interval(Duration::from_secs(1))
            .keepalives_retries(3)
            .tcp_user_timeout(HEARTBEAT_TIMEOUT);
        target
            .config
            .application_name(format!("scale-agent-hub {} ownership", replica.id));
        let ownership = PostgresOwnership {
            location: scale_agent_hub_store::postgres::location(&target.config),
            target,
            replica,
            lock_connection: Default::default(),
            owned: Default::default(),
            losses: watch::Sender::new(0),
            give_up: watch::Sender::new(0),
        };
        let mut connection = ownership.lock_connection.lock().await;
        let mut client = ownership.open().await?;
        scale_agent_hub_store::postgres::migrate(&mut client).await?;
        *connection = Some(client);
        drop(connection);
        tokio::spawn(heartbeat(
            std::sync::Arc::downgrade(&ownership.lock_connection),
            ownership.give_up.clone(),
        ));
        Ok(ownership)
    }

    fn owned(&self) -> MutexGuard<'_, BTreeMap<String, i64>> {
        self.owned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new lock connection; when it ends, every lock it held is gone.
    async fn open(&self) -> Result<Client> {
        let (client, connection) = self.target.connect_raw(&self.location).await?;
        let owned = self.owned.clone();
        let losses = self.losses.clone();
        let mut give_up = self.give_up.subscribe();
        give_up.borrow_and_update();
        tokio::spawn(async move {
            tokio::select! {
                ended = connection => {
                    if let Err(error) = ended {
                        tracing::warn!(error = %Chain(&error), "the ownership connection to PostgreSQL broke");
                    }
                }
                _ = give_up.changed() => {}
            }
            let lost = std::mem::take(&mut *owned.lock().unwrap_or_else(|e| e.into_inner()));
            if !lost.is_empty() {
                tracing::warn!(
                    accounts = lost.len(),
                    "every account this replica owned is lost (its locks ended with the connection)"
                );
            }
            losses.send_modify(|n| *n += 1);
        });
        // The lease: PostgreSQL ends a session silent for LEASE (PostgreSQL 13 has no such
        // setting: then only TCP ends a frozen replica's session).
        let lease = format!("SET idle_session_timeout = '{}s'", LEASE.as_secs());
        if let Err(error) = client.batch_execute(&lease).await {
            tracing::warn!(error = %Chain(&error), "PostgreSQL does not end silent sessions (idle_session_timeout needs PostgreSQL 14): a frozen replica keeps its accounts until TCP gives up");
        }
        // A row lock held by a replica cut off mid-transaction (its store's fencing check)
        // must not hang this session: the heartbeat shares it and would give every account
        // up. The acquisition fails instead and is tried again at the next poll.
        let wait = format!("SET lock_timeout = '{}ms'", LOCK_WAIT.as_millis());
        client
            .batch_execute(&wait)
            .await
            .map_err(|e| pg_error("bound lock waits on the lock session", &e))?;
        Ok(client)
    }

    /// The lock connection, opened again after it broke.
    async fn client<'a>(
        &self,
        slot: &'a mut tokio::sync::MutexGuard<'_, Option<Client>>,
    ) -> Result<&'a mut Client> {
        if slot.as_ref().is_none_or(Client::is_closed) {
            **slot = Some(self.open().await?);
            tracing::info!("connected to PostgreSQL for account ownership");
        }
        slot.as_mut()
            .ok_or_else(|| HubError::Ownership("no connection to PostgreSQL".into()))
    }

    async fn record_acquired(&self, client: &mut Client, account: &str) -> Result<i64> {
        let tx = client
            .transaction()
            .await
            .map_err(|e| pg_error("begin", &e))?;
        let row = tx
            .query_one(
                "INSERT INTO account_owners (account, replica, address, epoch, since)
                 VALUES ($1, $2, $3,
                         COALESCE((SELECT max(epoch) FROM ownership_history WHERE account = $1), 0) + 1,
                         now())
                 ON CONFLICT (account) DO UPDATE SET
                     replica = EXCLUDED.replica,
                     address = EXCLUDED.address,
                     epoch = GREATEST(EXCLUDED.epoch, account_owners.epoch + 1),
                     since = EXCLUDED.since
                 RETURNING epoch",
                &[&account, &self.replica.id, &self.replica.address],
            )
            .await
            .map_err(|e| pg_error("record the account's owner", &e))?;
        let epoch: i64 = row.get(0);
        // A tenure still open is a dead owner's: it ended no later than now.
        tx.execute(
            "UPDATE ownership_history SET released_at = now()
             WHERE account = $1 AND released_at IS NULL",
            &[&account],
        )
        .await
        .map_err(|e| pg_error("close the previous owner's tenure", &e))?;
        tx.execute(
            "INSERT INTO ownership_history (account, replica, epoch, acquired_at)
             VALUES ($1, $2, $3, now())",
            &[&account, &self.replica.id, &epoch],
        )
        .await
        .map_err(|e| pg_error("open this replica's tenure", &e))?;
        tx.commit().await.map_err(|e| pg_error("commit", &e))?;
        Ok(epoch)
    }

    async fn owner_on(client: &Client, account: &str) -> Result<Option<OwnerInfo>> {
        let row = client
            .query_opt(
                "SELECT replica, address, epoch FROM account_owners WHERE account = $1",
                &[&account],
            )
            .await
            .map_err(|e| pg_error("read the account's owner", &e))?;
        Ok(row.map(|row| OwnerInfo {
            replica: row.get(0),
            address: row.get(1),
            epoch: row.get(2),
        }))
    }

    async fn release_on(&self, client: &mut Client, account: &str, epoch: i64) -> Result<()> {
        let tx = client
            .transaction()
            .await
            .map_err(|e| pg_error("begin", &e))?;
        tx.execute(
            "UPDATE ownership_history SET released_at = now()
             WHERE account = $1 AND replica = $2 AND epoch = $3 AND released_at IS NULL",
            &[&account, &self.replica.id, &epoch],
        )
        .await
        .map_err(|e| pg_error("close this replica's tenure", &e))?;
        tx.execute(
            "DELETE FROM account_owners WHERE account = $1 AND replica = $2 AND epoch = $3",
            &[&account, &self.replica.id, &epoch],
        )
        .await
        .map_err(|e| pg_error("remove this replica as the account's owner", &e))?;
        tx.commit().await.map_err(|e| pg_error("commit", &e))?;
        client
            .query_one("SELECT pg_advisory_unlock($1)", &[&lock_key(account)])
            .await
            .map_err(|e| pg_error("unlock the account", &e))?;
        Ok(())
    }
}

/// Proves every [`HEARTBEAT`] that this replica is alive on the lock session, and gives the
/// session (every lock) up when it cannot, or when it was silent past [`LEASE`] (the process
/// was stopped): PostgreSQL has ended it, or will, and another replica may own the accounts
/// now. Ends with the ownership.
async fn heartbeat(
    slot: std::sync::Weak<tokio::sync::Mutex<Option<Client>>>,
    give_up: watch::Sender<u64>,
) {
    let mut last_ok = std::time::Instant::now();
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(slot) = slot.upgrade() else {
            return;
        };
        // A statement hanging on the session (a partition) holds it: that is a failed
        // heartbeat too, and ending the connection fails the statement.
        let Ok(mut connection) = tokio::time::timeout(HEARTBEAT_TIMEOUT, slot.lock()).await else {
            tracing::warn!(
                "the ownership heartbeat failed: a statement on the lock session has hung for \
                 {} s; giving the session up, so this replica stops serving the accounts it \
                 owned before PostgreSQL can give them to another",
                HEARTBEAT_TIMEOUT.as_secs()
            );
            give_up.send_modify(|n| *n += 1);
            last_ok = std::time::Instant::now();
            continue;
        };
        let Some(client) = connection.as_ref().filter(|c| !c.is_closed()) else {
            last_ok = std::time::Instant::now();
            continue;
        };
        let silent = last_ok.elapsed();
        let outcome = if silent > LEASE {
            Err(format!(
                "the lock session was silent for {} s, past its {} s lease (was the process \
                 stopped?)",
                silent.as_secs(),
                LEASE.as_secs()
            ))
        } else {
            match tokio::time::timeout(HEARTBEAT_TIMEOUT, client.simple_query("SELECT 1")).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(error)) => Err(Chain(&error).to_string()),
                Err(_) => Err(format!(
                    "no answer within {} s",
                    HEARTBEAT_TIMEOUT.as_secs()
                )),
            }
        };
        match outcome {
            Ok(()) => last_ok = std::time::Instant::now(),
            Err(why) => {
                tracing::warn!(%why, "the ownership heartbeat failed: giving up the lock session, so this replica stops serving the accounts it owned before PostgreSQL can give them to another");
                // Ending the connection's task drops it; the task reports the losses.
                give_up.send_modify(|n| *n += 1);
                *connection = None;
                last_ok = std::time::Instant::now();
            }
        }
    }
}

#[tonic::async_trait]
impl Ownership for PostgresOwnership {
    fn owns_everything(&self) -> bool {
        false
    }

    async fn try_acquire(&self, account: &str) -> Result<Claim> {
        let mut slot = self.lock_connection.lock().await;
        let client = self.client(&mut slot).await?;
        if let Some(epoch) = self.owned().get(account) {
            return Ok(Claim::Acquired { epoch: *epoch });
        }
        let key = lock_key(account);
        let locked: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
            .await
            .map_err(|e| pg_error("try the account's lock", &e))?
            .get(0);
        if !locked {
            return Ok(Claim::HeldElsewhere(Self::owner_on(client, account).await?));
        }
        match self.record_acquired(client, account).await {
            Ok(epoch) => {
                self.owned().insert(account.to_string(), epoch);
                Ok(Claim::Acquired { epoch })
            }
            Err(e) => {
                // Not recorded: not owned. The lock goes, so another replica may try.
                let _ = client
                    .query_one("SELECT pg_advisory_unlock($1)", &[&key])
                    .await;
                Err(e)
            }
        }
    }

    async fn release(&self, account: &str) -> Result<()> {
        let mut slot = self.lock_connection.lock().await;
        let Some(epoch) = self.owned().get(account).copied() else {
            return Ok(());
        };
        let client = self.client(&mut slot).await?;
        self.release_on(client, account, epoch).await?;
        self.owned().remove(account);
        Ok(())
    }

    async fn owner(&self, account: &str) -> Result<Option<OwnerInfo>> {
        let mut slot = self.lock_connection.lock().await;
        let client = self.client(&mut slot).await?;
        Self::owner_on(client, account).await
    }

    async fn probe(&self) -> Result<()> {
        let mut slot = self.lock_connection.lock().await;
        let client = self.client(&mut slot).await?;
        // The table the look-ups read, on the lock session (reopened above if it broke): it
        // fails when they would, for the connection or for the hub's user's grants.
        client
            .query("SELECT 1 FROM account_owners LIMIT 1", &[])
            .await
            .map_err(|e| pg_error("read the accounts' owners", &e))?;
        Ok(())
    }

    fn held_epoch(&self, account: &str) -> Option<i64> {
        self.owned().get(account).copied()
    }

    fn losses(&self) -> watch::Receiver<u64> {
        self.losses.subscribe()
    }

    async fn close(&self) {
        let mut slot = self.lock_connection.lock().await;
        let owned: Vec<(String, i64)> = self.owned().iter().map(|(a, e)| (a.clone(), *e)).collect();
        if let Some(client) = slot.as_mut().filter(|c| !c.is_closed()) {
            for (account, epoch) in owned {
                if let Err(e) = self.release_on(client, &account, epoch).await {
                    tracing::warn!(error = %Chain(&e), %account, "cannot release the account at shutdown; it is freed when the connection closes");
                }
            }
        }
        self.owned().clear();
        // Closing the connection frees any lock left.
        *slot = None;
    }
}
