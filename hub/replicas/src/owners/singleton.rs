//! Duties of the whole hub that exactly one replica may carry at a time (the Clouddriver
//! registrar: two registrars would each remove the accounts the other registered).
//!
//! With PostgreSQL ([`Singleton::Postgres`]) the duty is a session-level advisory lock of
//! its own (`pg_try_advisory_lock` of the SHA-256 of `scale-agent/duty/<name>`, a key apart
//! from every account's), held on a connection of its own, so that it neither depends on
//! nor disturbs account ownership. When the holder dies, PostgreSQL frees the lock with its
//! session, and another replica's next try (every [`TRY_EVERY`]) takes it. The holder
//! checks its connection at each try; when it broke, the duty is lost at once (another
//! replica may hold it already).
//!
//! Otherwise ([`Singleton::Always`]: the embedded store, one replica) the replica always
//! holds it.

use std::time::Duration;

use scale_agent_hub_model::{HubError, Result, error::Chain};
use scale_agent_hub_store::{PostgresOptions, postgres_tls::Target};
use tokio::sync::Mutex;
use tokio_postgres::Client;

use super::postgres::advisory_key;

/// How often a replica tries to take a duty it does not hold, and checks one it holds.
pub const TRY_EVERY: Duration = Duration::from_secs(1);

/// Longest wait for PostgreSQL (connecting, taking the lock, checking the connection).
const DEADLINE: Duration = Duration::from_secs(5);

/// A duty one replica carries at a time.
pub enum Singleton {
    /// One replica: it always holds the duty.
    Always,
    /// An advisory lock in PostgreSQL (boxed: it is the larger by far).
    Postgres(Box<PostgresSingleton>),
}

impl Singleton {
    /// Whether this replica holds the duty now; tries to take it when it does not. An
    /// error (PostgreSQL unreachable) means it does not.
    pub async fn hold(&self) -> Result<bool> {
        match self {
            Singleton::Always => Ok(true),
            Singleton::Postgres(lock) => lock.hold().await,
        }
    }

    /// Gives the duty up (the hub is stopping), so another replica takes it at once.
    pub async fn release(&self) {
        if let Singleton::Postgres(lock) = self {
            lock.release().await;
        }
    }
}

/// The advisory lock of one duty, on a connection of its own.
pub struct PostgresSingleton {
    name: &'static str,
    key: i64,
    target: Target,
    location: String,
    /// The connection and whether it holds the lock.
    state: Mutex<(Option<Client>, bool)>,
}

impl PostgresSingleton {
    /// The duty `name` of `replica` (nothing is connected until the first `hold`).
    pub fn new(options: &PostgresOptions, replica: &str, name: &'static str) -> Result<Self> {
        let mut target = options.target()?;
        target.config.connect_timeout(DEADLINE);
        target
            .config
            .application_name(format!("scale-agent-hub {replica} {name}"));
        Ok(PostgresSingleton {
            name,
            key: advisory_key(&format!("scale-agent/duty/{name}")),
            location: scale_agent_hub_store::postgres::location(&target.config),
            target,
            state: Mutex::new((None, false)),
        })
    }

    async fn hold(&self) -> Result<bool> {
        let mut state = self.state.lock().await;
        let (slot, held) = &mut *state;
        if *held {
            // The session (and so the lock) is still there: PostgreSQL answers on it.
            let alive = match slot.as_ref() {
                Some(client) if !client.is_closed() => {
                    tokio::time::timeout(DEADLINE, client.simple_query("SELECT 1"))
                        .await
                        .is_ok_and(|answer| answer.is_ok())
                }
                _ => false,
            };
            if alive {
                return Ok(true);
            }
            *held = false;
            *slot = None;
            return Err(HubError::Ownership(format!(
                "the connection holding the {} duty broke; another replica may carry it now",
                self.name
            )));
        }
        if slot.as_ref().is_none_or(Client::is_closed) {
            *slot = Some(self.target.connect(&self.location, self.name).await?);
        }
        let Some(client) = slot.as_ref() else {
            return Ok(false);
        };
        let taken = tokio::time::timeout(
            DEADLINE,
            client.query_one("SELECT pg_try_advisory_lock($1)", &[&self.key]),
        )
        .await
        .map_err(|_| HubError::Ownership(format!("PostgreSQL did not answer within {DEADLINE:?}")))?
        .map_err(|e| {
            HubError::Ownership(format!(
                "cannot try the {} lock in PostgreSQL: {}; check that the database is reachable",
                self.name,
                Chain(&e)
            ))
        })?
        .get::<_, bool>(0);
        *held = taken;
        Ok(taken)
    }

    async fn release(&self) {
        // Closing the session frees its locks.
        *self.state.lock().await = (None, false);
    }
}
