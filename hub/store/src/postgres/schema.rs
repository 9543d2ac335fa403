//! The PostgreSQL schema: every version the hub knows, and the migration run at start-up
//! (by the store and by account ownership, which share the database).

use tokio_postgres::Client;

use scale_agent_hub_model::{HubError, Result};

use super::pg;

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
    Migration {
        version: 3,
        name: "agent identities an admin disabled, and certificates denied by serial",
        sql: "
        CREATE TABLE agent_identity_states (identity text PRIMARY KEY, record bytea NOT NULL);
    ",
    },
    Migration {
        version: 4,
        name: "operation records keyed by their submitter too: client ids are per caller",
        sql: "
        ALTER TABLE operation_records ADD COLUMN submitter text NOT NULL DEFAULT '';
        ALTER TABLE operation_records DROP CONSTRAINT operation_records_pkey;
        ALTER TABLE operation_records ADD PRIMARY KEY (account, submitter, id);
    ",
    },
    Migration {
        version: 5,
        name: "tokens and agent tokens looked up by an indexed hash, not a scan parsing every record",
        // Review F10: a credential a replica does not know (anyone reaching a port may send
        // one) was found by parsing every record's JSON. The column is the record's
        // `sha256`, backfilled here and written with every record since. A plain index, not
        // a unique one: a revoked derived token's tombstone keeps an empty hash (several
        // do), and two replicas deriving one account's Clouddriver token together store
        // the same hash under two ids; a lookup takes either, as the scan did.
        sql: "
        ALTER TABLE tokens ADD COLUMN sha256 text NOT NULL DEFAULT '';
        UPDATE tokens SET sha256 = coalesce(convert_from(record, 'UTF8')::jsonb ->> 'sha256', '');
        CREATE INDEX tokens_sha256 ON tokens (sha256);
        ALTER TABLE agent_tokens ADD COLUMN sha256 text NOT NULL DEFAULT '';
        UPDATE agent_tokens
            SET sha256 = coalesce(convert_from(record, 'UTF8')::jsonb ->> 'sha256', '');
        CREATE INDEX agent_tokens_sha256 ON agent_tokens (sha256);
    ",
    },
];

/// The advisory lock that serializes migrations of replicas starting together ("scale-agent
/// schema" in ASCII).
const MIGRATION_LOCK: i64 = 0x7363_616c_6573_6368;

/// Runs the migrations the database lacks, each in its own transaction under an advisory
/// lock (replicas starting together migrate once); returns the versions applied. The one
/// definition of the schema: account ownership (the hub's `owners::postgres`) runs it too.
pub async fn migrate(client: &mut Client) -> Result<Vec<i64>> {
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    let mut applied = Vec::new();
    for migration in MIGRATIONS {
        let txn = client.transaction().await.map_err(pg("migrate"))?;
        // A replica migrating beside this one holds the lock for as long as its migration
        // takes: wait for it, whatever bound the session puts on lock waits (the ownership
        // session's is 2 s).
        txn.batch_execute(&format!(
            "SET LOCAL lock_timeout = 0;
             SELECT pg_advisory_xact_lock({MIGRATION_LOCK});
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i64 + 1, "{}", m.name);
        }
    }
}
