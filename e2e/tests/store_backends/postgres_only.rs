//! What only PostgreSQL has: versioned migrations, fencing, a batch PostgreSQL refuses
//! halfway, PostgreSQL restarting under the store, the reads replicas share, and a store
//! session cut off inside a transaction.

use super::*;

/// The schema is made from an empty database, a second start runs nothing again, and a
/// schema newer than the hub knows refuses to start with a message saying what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_from_empty_are_idempotent_and_refuse_a_newer_schema()
-> anyhow::Result<()> {
    let pg = Postgres::new().await?;
    let sql = pg.sql().await?;
    let tables = "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'";
    assert_eq!(sql.query_one(tables, &[]).await?.get::<_, i64>(0), 0);

    let mut store = pg.open().await?;
    store.close().await?;
    let versions = "SELECT version, applied_at FROM schema_migrations ORDER BY version";
    let first: Vec<(i64, std::time::SystemTime)> = sql
        .query(versions, &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        first.iter().map(|v| v.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    let count: i64 = sql.query_one(tables, &[]).await?.get(0);
    assert!(count >= 15, "{count} tables");
    for table in [
        "account_owners",
        "ownership_history",
        "objects",
        "resume_points",
        "hub_replicas",
    ] {
        let found: i64 = sql
            .query_one(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = $1",
                &[&table],
            )
            .await?
            .get(0);
        assert_eq!(found, 1, "{table}");
    }

    // Again, twice at once (replicas starting together): nothing is applied again.
    let (a, b) = tokio::join!(pg.open(), pg.open());
    a?.close().await?;
    b?.close().await?;
    let again: Vec<(i64, std::time::SystemTime)> = sql
        .query(versions, &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(again, first);

    sql.execute(
        "INSERT INTO schema_migrations (version, name) VALUES (999, 'from the future')",
        &[],
    )
    .await?;
    let refused = pg.open().await.err().expect("a newer schema is refused");
    let message = format!("{refused:#}");
    assert!(
        message.contains("version 999") && message.contains("run a hub at least as new"),
        "{message}"
    );
    Ok(())
}

/// Schema version 5 (review F10): a database at version 4 holding tokens and agent tokens
/// gets their `sha256` column filled from the records, so that the tokens issued before
/// the upgrade are found by the indexed lookup (and the lookup is an index scan); records
/// written since carry the column too, a tombstone's empty hash finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_version_5_backfills_the_token_hashes_a_version_4_database_holds()
-> anyhow::Result<()> {
    let pg = Postgres::new().await?;
    let sql = pg.sql().await?;
    let mut store = pg.open().await?;
    let mut tombstone = token("t-revoked");
    tombstone.sha256 = String::new();
    tombstone.revoked = true;
    store
        .commit(vec![
            StoreOp::PutToken {
                record: token("t1"),
            },
            StoreOp::PutToken { record: tombstone },
            StoreOp::PutAgentToken {
                record: agent_token("at1"),
            },
        ])
        .await?;
    store.close().await?;
    // Back to version 4 as a hub of that version left it: no column, no index, no row of
    // version 5.
    sql.batch_execute(
        "ALTER TABLE tokens DROP COLUMN sha256;
         ALTER TABLE agent_tokens DROP COLUMN sha256;
         DELETE FROM schema_migrations WHERE version = 5;",
    )
    .await?;

    let mut store = pg.open().await?;
    let hashes = |table: &'static str| {
        let sql = &sql;
        async move {
            sql.query(&format!("SELECT id, sha256 FROM {table} ORDER BY id"), &[])
                .await
                .map(|rows| {
                    rows.iter()
                        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                        .collect::<Vec<_>>()
                })
        }
    };
    assert_eq!(
        hashes("tokens").await?,
        [
            ("t-revoked".to_string(), String::new()),
            ("t1".to_string(), "00ff".to_string())
        ]
    );
    assert_eq!(
        hashes("agent_tokens").await?,
        [("at1".to_string(), "aa".to_string())]
    );
    let shared = store.shared().expect("PostgreSQL has shared reads");
    assert_eq!(shared.find_token("00ff").await?, Some(token("t1")));
    assert_eq!(shared.find_token("").await?, None);
    assert_eq!(
        shared.find_agent_token("aa").await?,
        Some(agent_token("at1"))
    );

    // Written since the upgrade: the column follows the record, on insert and on update.
    let mut later = agent_token("at2");
    later.sha256 = "bb".into();
    store
        .commit(vec![StoreOp::PutAgentToken {
            record: later.clone(),
        }])
        .await?;
    assert_eq!(shared.find_agent_token("bb").await?, Some(later.clone()));
    later.sha256 = "cc".into();
    store
        .commit(vec![StoreOp::PutAgentToken {
            record: later.clone(),
        }])
        .await?;
    assert_eq!(shared.find_agent_token("bb").await?, None);
    assert_eq!(shared.find_agent_token("cc").await?, Some(later));

    // The lookup is an index scan (sequential scans off: the tables are tiny, and the
    // planner would scan them whole otherwise).
    for (table, index) in [
        ("tokens", "tokens_sha256"),
        ("agent_tokens", "agent_tokens_sha256"),
    ] {
        let plan: Vec<String> = sql
            .simple_query(&format!(
                "SET enable_seqscan = off; \
                 EXPLAIN SELECT id, record FROM {table} WHERE sha256 = 'aa' LIMIT 1"
            ))
            .await?
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                _ => None,
            })
            .collect();
        assert!(
            plan.iter().any(|line| line.contains(index)),
            "{table}: {plan:?}"
        );
    }
    store.close().await?;
    Ok(())
}

/// With fencing, a batch commits only while `account_owners` names this replica with the
/// epoch it holds; a takeover (a new epoch) fails the whole batch, accounts it still owns
/// included, with a distinct error; changes to no account are not fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_fencing_refuses_a_batch_for_an_account_taken_over() -> anyhow::Result<()> {
    let pg = Postgres::new().await?;
    let mut store = pg.open().await?;
    let sql = pg.sql().await?;
    let own = "INSERT INTO account_owners (account, replica, address, epoch, since) \
               VALUES ($1, 'hub-0', 'https://hub-0:9443', $2, now()) \
               ON CONFLICT (account) DO UPDATE SET replica = EXCLUDED.replica, \
               epoch = EXCLUDED.epoch";
    sql.execute(own, &[&"prod", &3_i64]).await?;
    sql.execute(own, &[&"dev", &1_i64]).await?;
    let held: Arc<Mutex<Vec<(String, i64)>>> =
        Arc::new(Mutex::new(vec![("prod".into(), 3), ("dev".into(), 1)]));
    let epochs = held.clone();
    store.set_fencing(Some(Fencing {
        replica: "hub-0".into(),
        epoch: Arc::new(move |account| {
            epochs
                .lock()
                .unwrap()
                .iter()
                .find(|(a, _)| a == account)
                .map(|(_, e)| *e)
        }),
    }));
    let put = |account: &str, name: &str| StoreOp::PutObject {
        account: account.into(),
        kind: configmaps().key(),
        object: Arc::new(object(name, "1")),
    };
    let kinds = |account: &str| StoreOp::PutKind {
        account: account.into(),
        info: configmaps(),
    };
    store
        .commit(vec![
            kinds("prod"),
            kinds("dev"),
            put("prod", "p1"),
            put("dev", "d1"),
        ])
        .await?;

    // Another replica takes `dev` over.
    sql.execute(
        "UPDATE account_owners SET replica = 'hub-1', epoch = 2 WHERE account = 'dev'",
        &[],
    )
    .await?;
    let failed = store
        .try_commit(vec![put("prod", "p2"), put("dev", "d2")], false)
        .await
        .expect_err("fenced");
    assert!(
        matches!(&failed.error, scale_agent_hub::HubError::Fenced { accounts, .. } if accounts == &["dev"]),
        "{:?}",
        failed.error
    );
    assert_eq!(failed.ops.len(), 2, "the batch is handed back");
    // An account this replica does not hold at all is fenced too.
    let failed = store
        .try_commit(vec![put("stray", "s1")], false)
        .await
        .expect_err("fenced");
    assert!(matches!(
        failed.error,
        scale_agent_hub::HubError::Fenced { .. }
    ));
    // Hub-wide changes are not.
    store
        .commit(vec![StoreOp::PutMeta {
            key: "k".into(),
            value: "v".into(),
        }])
        .await?;
    // Once this replica lets `dev` go, its other accounts commit again.
    held.lock().unwrap().retain(|(a, _)| a != "dev");
    store.commit(vec![put("prod", "p3")]).await?;
    store.close().await?;

    let store = pg.open().await?;
    let prod = store.load_account("prod").await?;
    let mut names: Vec<&str> = prod.cache.kinds[&configmaps().key()]
        .objects
        .values()
        .map(|o| o.name.as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["p1", "p3"], "p2 went with the fenced batch");
    let dev = store.load_account("dev").await?;
    assert_eq!(dev.cache.kinds[&configmaps().key()].objects.len(), 1);
    Ok(())
}

/// A batch PostgreSQL refuses halfway (a NUL byte, which its text cannot hold) writes none
/// of its changes, and is handed back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_batch_refused_halfway_writes_nothing() -> anyhow::Result<()> {
    let pg = Postgres::new().await?;
    let mut store = pg.open().await?;
    let mut ops = one_of_everything();
    ops.insert(
        ops.len() / 2,
        StoreOp::PutMeta {
            key: "bad".into(),
            value: "nul\0byte".into(),
        },
    );
    let count = ops.len();
    let failed = store.try_commit(ops, false).await.expect_err("refused");
    assert_eq!(failed.ops.len(), count);
    // The store goes on after a refused batch.
    store
        .commit(vec![StoreOp::PutMeta {
            key: "after".into(),
            value: "ok".into(),
        }])
        .await?;
    let loaded = store.load().await?;
    assert!(loaded.accounts.is_empty(), "{:?}", loaded.accounts);
    assert!(loaded.tokens.is_empty());
    assert_eq!(loaded.meta.keys().collect::<Vec<_>>(), ["after"]);
    Ok(())
}

/// PostgreSQL restarts under a running store: commits fail while it is down (the batch is
/// handed back, as the hub's writer retries it), then the same batch commits on a new
/// connection, with what was committed before still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_fails_commits_until_it_is_back() -> anyhow::Result<()> {
    let mut pg = Postgres::new().await?;
    let mut store = pg.open().await?;
    store.commit(one_of_everything()).await?;
    pg.0.kill();
    let batch = vec![StoreOp::PutObject {
        account: "prod".into(),
        kind: configmaps().key(),
        object: Arc::new(object("after-restart", "50")),
    }];
    let failed = store
        .try_commit(batch, true)
        .await
        .expect_err("PostgreSQL is down");
    let message = scale_agent_hub::error::Chain(&failed.error).to_string();
    assert!(message.contains("PostgreSQL"), "{message}");
    pg.0.restart().await?;
    store
        .try_commit(failed.ops, true)
        .await
        .map_err(|f| f.error)?;
    let prod = store.load_account("prod").await?;
    let cms = &prod.cache.kinds[&configmaps().key()];
    assert_eq!(cms.objects.len(), 4);
    assert!(cms.objects.contains_key("uid-after-restart"));
    store.close().await?;
    Ok(())
}

/// What replicas sharing the store read of each other's writes ([`SharedStore`]): the small
/// tables whole, a token, agent token, enrolment or account looked up alone, an enrolment
/// token claimed once, the replicas alive, the owners, and the sweep of the accounts no
/// replica owns past the grace period (a dead owner's tenure closed first; an account whose
/// lock is held is left alone; bindings kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_shared_reads_lookups_claims_and_the_orphan_sweep() -> anyhow::Result<()> {
    let pg = Postgres::new().await?;
    let mut store = pg.open().await?;
    store.commit(one_of_everything()).await?;
    let shared = store.shared().expect("PostgreSQL has shared reads");
    assert!(
        Store::open(&fixtures::temp_dir("scale-agent-store-shared")?)?
            .shared()
            .is_none()
    );

    let tables = shared.tables().await?;
    assert_eq!(tables.tokens, [token("t1")]);
    assert_eq!(tables.agent_tokens, [agent_token("at1")]);
    assert_eq!(tables.enrolled.len(), 1);
    assert_eq!(tables.bindings.len(), 2);
    assert_eq!(tables.dynamic_accounts.len(), 1);
    assert_eq!(shared.find_token("00ff").await?, Some(token("t1")));
    assert_eq!(shared.find_token("0000").await?, None);
    assert_eq!(
        shared.find_agent_token("aa").await?,
        Some(agent_token("at1"))
    );
    assert_eq!(shared.find_agent_token("bb").await?, None);
    assert_eq!(
        shared.find_enrolled("agent-a").await?.map(|e| e.token_id),
        Some("at1".to_string())
    );
    let (found, binding) = shared.find_account("prod").await?;
    assert_eq!(found, Some(record("https://prod:6443")));
    assert_eq!(binding.map(|b| b.identity), Some("agent-a".to_string()));
    assert_eq!(shared.find_account("nope").await?, (None, None));
    assert_eq!(shared.accounts().await?.len(), 2);

    // An unused enrolment token is claimed once.
    let mut fresh = agent_token("at2");
    fresh.sha256 = "cc".into();
    fresh.used = None;
    store
        .commit(vec![StoreOp::PutAgentToken {
            record: fresh.clone(),
        }])
        .await?;
    fresh.used = Some(50);
    assert!(shared.claim_enrolment(&fresh).await?);
    assert!(!shared.claim_enrolment(&fresh).await?);
    assert_eq!(
        shared.find_agent_token("cc").await?.and_then(|r| r.used),
        Some(50)
    );

    // Replicas alive.
    shared
        .heartbeat("hub-a", "http://a:1", Duration::from_secs(3600))
        .await?;
    shared
        .heartbeat("hub-b", "http://b:1", Duration::from_secs(3600))
        .await?;
    let sql = pg.sql().await?;
    sql.execute(
        "UPDATE hub_replicas SET seen_at = now() - interval '1 minute' WHERE replica = 'hub-b'",
        &[],
    )
    .await?;
    let alive: Vec<String> = shared
        .replicas(Duration::from_secs(10))
        .await?
        .into_iter()
        .map(|r| r.replica)
        .collect();
    assert_eq!(alive, ["hub-a"]);
    // Silent past forget_after: forgotten.
    shared
        .heartbeat("hub-a", "http://a:1", Duration::from_secs(30))
        .await?;
    assert_eq!(shared.replicas(Duration::from_secs(3600)).await?.len(), 1);

    // prod: owned by a dead replica (its row and open tenure left, its lock free). dev:
    // released long ago, but its lock is held by a live session (being acquired).
    sql.batch_execute(
        "INSERT INTO account_owners VALUES ('prod', 'hub-dead', 'http://d:1', 4, now());
         INSERT INTO ownership_history VALUES ('prod', 'hub-dead', 4, now() - interval '1 hour', NULL);
         INSERT INTO ownership_history VALUES ('dev', 'hub-a', 1, now() - interval '2 hours', now() - interval '1 hour');",
    )
    .await?;
    let owners = shared.owners().await?;
    assert_eq!(owners["prod"].replica, "hub-dead");
    assert_eq!(owners["prod"].epoch, 4);
    let holder = pg.sql().await?;
    let dev_key = scale_agent_hub::owners::postgres::lock_key("dev");
    holder
        .query_one("SELECT pg_advisory_lock($1)", &[&dev_key])
        .await?;
    let grace = Duration::from_secs(2);
    // prod's dead owner is closed out now (its grace starts); dev is locked: nothing goes.
    assert!(shared.sweep_orphans(grace).await?.is_empty());
    assert!(shared.owners().await?.is_empty());
    let open: i64 = sql
        .query_one(
            "SELECT count(*) FROM ownership_history WHERE released_at IS NULL",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(open, 0);
    holder
        .query_one("SELECT pg_advisory_unlock($1)", &[&dev_key])
        .await?;
    // dev's lock is free and its grace long over: swept; prod's grace is not over yet.
    assert_eq!(shared.sweep_orphans(grace).await?, ["dev"]);
    tokio::time::sleep(grace).await;
    // Two sweeps at once remove prod once.
    let (one, two) = tokio::join!(shared.sweep_orphans(grace), {
        let other = pg.open().await?.shared().unwrap();
        async move { other.sweep_orphans(grace).await }
    });
    let mut swept = one?;
    swept.extend(two?);
    assert_eq!(swept, ["prod"]);
    for table in ["accounts", "kinds", "objects", "resume_points"] {
        let left: i64 = sql
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await?
            .get(0);
        assert_eq!(left, 0, "{table}");
    }
    let bindings: i64 = sql
        .query_one("SELECT count(*) FROM account_bindings", &[])
        .await?
        .get(0);
    assert_eq!(bindings, 2);
    store.close().await?;
    Ok(())
}

/// A replica cut off from PostgreSQL in the middle of a commit (a silent partition: nothing
/// closes) holds the fencing check's row lock on `account_owners`, and the replica taking its
/// accounts over must write that row. PostgreSQL ends the silent session after
/// `IDLE_IN_TRANSACTION` (10 s), not when TCP gives up hours later. Staged exactly: the
/// commit is held at its fencing check by another session's lock on the row, the relay goes
/// silent, that lock goes, so the store's session sits idle in its transaction with the row
/// locked `FOR SHARE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_store_cut_off_inside_a_commit_frees_its_row_locks() -> anyhow::Result<()> {
    let pg = Postgres::new().await?;
    let relay =
        scale_agent_e2e::relay::Relay::start(format!("127.0.0.1:{}", pg.0.port()).parse()?).await?;
    let url = pg.0.url().replace(
        &format!("127.0.0.1:{}", pg.0.port()),
        &relay.addr().to_string(),
    );
    let mut store = Store::open_postgres(&PostgresOptions::new(url)).await?;
    let sql = pg.sql().await?;
    sql.execute(
        "INSERT INTO account_owners (account, replica, address, epoch, since) \
         VALUES ('prod', 'hub-0', 'https://hub-0:9443', 1, now())",
        &[],
    )
    .await?;
    store.set_fencing(Some(Fencing {
        replica: "hub-0".into(),
        epoch: Arc::new(|account| (account == "prod").then_some(1)),
    }));
    store
        .commit(vec![StoreOp::PutKind {
            account: "prod".into(),
            info: configmaps(),
        }])
        .await?;

    let mut holder = pg.sql().await?;
    let hold = holder.transaction().await?;
    // A row lock, not a table lock: the store's statement must pass its Parse (which a
    // table lock would hold up, before the row is locked) and wait in its Execute.
    hold.batch_execute("SELECT * FROM account_owners WHERE account = 'prod' FOR UPDATE")
        .await?;
    let commit = tokio::spawn(async move {
        let batch = vec![StoreOp::PutObject {
            account: "prod".into(),
            kind: configmaps().key(),
            object: Arc::new(object("cut-off", "7")),
        }];
        store.try_commit(batch, true).await.map_err(|f| f.error)
    });
    // The store's commit waits on the table lock, inside its transaction.
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE application_name = 'scale-agent-hub' AND wait_event_type = 'Lock'";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sql.query_one(waiting, &[]).await?.get::<_, i64>(0) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the store's commit never reached its fencing check"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.blackhole();
    hold.commit().await?;
    // Now the store's session holds `FOR SHARE` on prod's row, idle in its transaction.
    let idle = "SELECT count(*) FROM pg_stat_activity \
                WHERE application_name = 'scale-agent-hub' AND state = 'idle in transaction'";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sql.query_one(idle, &[]).await?.get::<_, i64>(0) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the store's session never went idle in its transaction"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The next owner takes the row over; a wait past 30 s fails instead of hanging.
    let started = std::time::Instant::now();
    sql.batch_execute("SET lock_timeout = '30s'").await?;
    let taken = sql
        .execute(
            "UPDATE account_owners SET replica = 'hub-1', epoch = 2 WHERE account = 'prod'",
            &[],
        )
        .await;
    let waited = started.elapsed();
    eprintln!("the next owner waited {waited:?} for the row the cut-off store locked");
    assert_eq!(
        taken.map_err(|e| format!("{e:?}")),
        Ok(1),
        "PostgreSQL kept the cut-off session's row lock"
    );
    assert!(
        waited <= scale_agent_hub::store::postgres::IDLE_IN_TRANSACTION + Duration::from_secs(5),
        "{waited:?}"
    );
    // The cut-off commit did not land, whatever the store says once its connection ends.
    drop(relay);
    let _ = tokio::time::timeout(Duration::from_secs(30), commit).await;
    let objects = sql
        .query_one("SELECT count(*) FROM objects WHERE account = 'prod'", &[])
        .await?
        .get::<_, i64>(0);
    assert_eq!(objects, 0, "nothing of the cut-off commit was stored");
    Ok(())
}
