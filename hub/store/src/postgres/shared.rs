//! What replicas sharing the store read of each other: the small tables (tokens, agent tokens,
//! enrolments, bindings, dynamic accounts) read again and again, lookups on a miss, the
//! replicas alive and the accounts' owners, and the sweep of orphaned accounts.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use tokio_postgres::Client;

use scale_agent_hub_model::{
    Result,
    records::{
        AccountBinding, AccountRecord, AgentIdentityState, AgentTokenRecord, EnrolledIdentity,
        TokenRecord,
    },
};

use super::{Connection, corrupt, lock_key, pg};
use crate::SharedTables;

/// The small tables replicas sharing the store read again and again (see [`SharedStore`]).
pub(super) async fn read_shared_tables(client: &Client) -> Result<SharedTables> {
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
pub struct SharedStore(pub(super) Arc<Connection>);

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

    /// The lookup of a credential this replica does not know yet, by the table's indexed
    /// `sha256` column (schema version 5; review F10: no scan parsing every record).
    async fn find_by_hash<T: serde::de::DeserializeOwned>(
        &self,
        table: &'static str,
        sha256_hex: &str,
    ) -> Result<Option<T>> {
        // Tombstones of revoked derived tokens keep an empty hash; no token hashes to it.
        if sha256_hex.is_empty() {
            return Ok(None);
        }
        let conn = self.0.get().await?;
        let sql = format!("SELECT id, record FROM {table} WHERE sha256 = $1 LIMIT 1");
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

    /// What an admin decided about `identity` (disabled, certificates denied), as the store
    /// holds it now: read at every stream authentication and renewal, so that a decision
    /// taken through any replica holds at once on every replica.
    pub async fn find_identity_state(&self, identity: &str) -> Result<Option<AgentIdentityState>> {
        let conn = self.0.get().await?;
        let Some(row) = conn
            .client
            .query_opt(
                "SELECT record FROM agent_identity_states WHERE identity = $1",
                &[&identity],
            )
            .await
            .map_err(pg("look up an agent identity's state"))?
        else {
            return Ok(None);
        };
        serde_json::from_slice(row.get(0))
            .map(Some)
            .map_err(corrupt(format!("agent_identity_states/{identity}")))
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
