//! The ownership lease on PostgreSQL: its probe while the store is down, one owner at a time,
//! a dead owner's lock freed at once.

use super::*;

/// The probe the ownership task sends while the store was unreachable and no account waits
/// to be acquired (issue 29): a read of the owners' table on the lock session, naming no
/// account. It answers while PostgreSQL is up, fails while it is stopped, answers again once
/// it is back (the lock session opened anew), and leaves nothing in the ownership tables.
#[tokio::test]
async fn the_ownership_probe_fails_while_postgres_is_down_and_answers_once_it_is_back() {
    let mut server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let ownership = PostgresOwnership::connect(&PostgresOptions::new(&url), replica("hub-a"))
        .await
        .unwrap();
    ownership.probe().await.unwrap();

    server.stop().await;
    let error = ownership
        .probe()
        .await
        .expect_err("the probe fails while PostgreSQL is stopped")
        .to_string();
    eprintln!("the probe while PostgreSQL is stopped: {error}");
    assert!(error.contains("PostgreSQL"), "{error}");

    server.start_again().await.unwrap();
    let started = std::time::Instant::now();
    while let Err(e) = ownership.probe().await {
        assert!(started.elapsed() < WAIT, "the probe still fails: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    for table in ["account_owners", "ownership_history"] {
        let statement = format!("SELECT count(*) FROM {table}");
        let rows: i64 = sql.query_one(statement.as_str(), &[]).await.unwrap().get(0);
        assert_eq!(rows, 0, "the probe wrote to {table}");
    }
}

#[tokio::test]
async fn one_owner_at_a_time_and_a_dead_owners_lock_frees_at_once() {
    let mut server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    let a = PostgresOwnership::connect(&PostgresOptions::new(&url), replica("hub-a"))
        .await
        .unwrap();
    let b = PostgresOwnership::connect(&PostgresOptions::new(&url), replica("hub-b"))
        .await
        .unwrap();

    assert_eq!(
        a.try_acquire("prod").await.unwrap(),
        Claim::Acquired { epoch: 1 }
    );
    match b.try_acquire("prod").await.unwrap() {
        Claim::HeldElsewhere(Some(owner)) => {
            assert_eq!((owner.replica.as_str(), owner.epoch), ("hub-a", 1));
            assert_eq!(owner.address, "https://hub-a:8443");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        b.owner("prod").await.unwrap().map(|o| o.replica).as_deref(),
        Some("hub-a")
    );
    // Other accounts are independent.
    assert_eq!(
        b.try_acquire("staging").await.unwrap(),
        Claim::Acquired { epoch: 1 }
    );
    assert_eq!(owner_row(&sql, "prod").await, Some(("hub-a".into(), 1)));

    // hub-a's database session dies (as when its process is killed: the socket closes).
    let mut a_losses = a.losses();
    let terminated: i64 = sql
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = 'scale-agent-hub hub-a ownership'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(terminated, 1);
    wait_changed(&mut a_losses).await;
    // The lock is free at once: hub-b takes the account with the next epoch. "At once" as
    // the server goes: a terminated backend tells its client before it releases its locks,
    // so hub-a can see its loss a moment before hub-b can acquire (one full run saw that).
    let freed_by = std::time::Instant::now() + Duration::from_secs(2);
    let claim = loop {
        let claim = b.try_acquire("prod").await.unwrap();
        if matches!(claim, Claim::Acquired { .. }) || std::time::Instant::now() > freed_by {
            break claim;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(claim, Claim::Acquired { epoch: 2 });
    assert_eq!(owner_row(&sql, "prod").await, Some(("hub-b".into(), 2)));
    // hub-a, connected again, finds it owned.
    assert!(matches!(
        a.try_acquire("prod").await.unwrap(),
        Claim::HeldElsewhere(Some(ref o)) if o.replica == "hub-b"
    ));

    // A release hands it over: the row goes (late writes of epoch 2 fail the fencing).
    b.release("prod").await.unwrap();
    assert_eq!(owner_row(&sql, "prod").await, None);
    assert_eq!(a.owner("prod").await.unwrap(), None);
    assert_eq!(
        a.try_acquire("prod").await.unwrap(),
        Claim::Acquired { epoch: 3 }
    );
    let locks: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(locks, 2, "prod by hub-a, staging by hub-b");

    let tenures = history(&sql, "prod").await;
    assert_eq!(
        tenures
            .iter()
            .map(|t| (t.replica.as_str(), t.epoch))
            .collect::<Vec<_>>(),
        [("hub-a", 1), ("hub-b", 2), ("hub-a", 3)]
    );
    assert_no_overlap("prod", &tenures);
    assert!(tenures[2].released.is_none(), "hub-a owns it now");

    // PostgreSQL restarts: every lock is gone, both replicas are told, and they acquire
    // again once it is back.
    let (mut a_losses, mut b_losses) = (a.losses(), b.losses());
    server.kill();
    wait_changed(&mut a_losses).await;
    wait_changed(&mut b_losses).await;
    server.restart().await.unwrap();
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    assert_eq!(
        a.try_acquire("prod").await.unwrap(),
        Claim::Acquired { epoch: 4 }
    );
    assert_eq!(
        b.try_acquire("staging").await.unwrap(),
        Claim::Acquired { epoch: 2 }
    );
    assert!(matches!(
        b.try_acquire("prod").await.unwrap(),
        Claim::HeldElsewhere(Some(ref o)) if o.replica == "hub-a" && o.epoch == 4
    ));
    assert_no_overlap("prod", &history(&sql, "prod").await);
    assert_no_overlap("staging", &history(&sql, "staging").await);

    // Closing releases everything.
    a.close().await;
    b.close().await;
    assert_eq!(owner_row(&sql, "prod").await, None);
    assert_eq!(owner_row(&sql, "staging").await, None);
    let open: i64 = sql
        .query_one(
            "SELECT count(*) FROM ownership_history WHERE released_at IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 0);
    assert_ne!(lock_key("prod"), lock_key("staging"));
}
