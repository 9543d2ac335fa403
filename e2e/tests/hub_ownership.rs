//! Account ownership of hub replicas through PostgreSQL advisory locks (issue 16), on
//! Debian's real server: one owner at a time; the lock frees the moment the owner's
//! database session dies (its socket closes, as at a kill -9) and another replica takes the
//! account with the next epoch; a release hands it over; a restart of PostgreSQL loses every
//! ownership at once and they are acquired again; `ownership_history` never overlaps.

use std::time::Duration;

use scale_agent_e2e::postgres::{self, PostgresServer};
use scale_agent_hub::owners::{
    Claim, Ownership, ReplicaIdentity,
    postgres::{PostgresOwnership, lock_key},
};

fn replica(id: &str) -> ReplicaIdentity {
    ReplicaIdentity {
        id: id.into(),
        address: format!("https://{id}:8443"),
    }
}

async fn owner_row(client: &tokio_postgres::Client, account: &str) -> Option<(String, i64)> {
    client
        .query_opt(
            "SELECT replica, epoch FROM account_owners WHERE account = $1",
            &[&account],
        )
        .await
        .unwrap()
        .map(|row| (row.get(0), row.get(1)))
}

/// Tenures of `account` in the order they began: (replica, epoch, began, ended).
async fn history(
    client: &tokio_postgres::Client,
    account: &str,
) -> Vec<(
    String,
    i64,
    std::time::SystemTime,
    Option<std::time::SystemTime>,
)> {
    client
        .query(
            "SELECT replica, epoch, acquired_at, released_at FROM ownership_history
             WHERE account = $1 ORDER BY acquired_at, epoch",
            &[&account],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect()
}

/// No two tenures overlap, and epochs grow.
fn assert_no_overlap(
    tenures: &[(
        String,
        i64,
        std::time::SystemTime,
        Option<std::time::SystemTime>,
    )],
) {
    for pair in tenures.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        let ended = before
            .3
            .unwrap_or_else(|| panic!("{before:?} never ended, yet {after:?} began"));
        assert!(ended <= after.2, "{before:?} overlaps {after:?}");
        assert!(after.1 > before.1, "epochs must grow: {tenures:?}");
    }
}

async fn wait_changed(losses: &mut tokio::sync::watch::Receiver<u64>) {
    tokio::time::timeout(Duration::from_secs(20), losses.changed())
        .await
        .expect("the loss was noticed in time")
        .unwrap();
}

#[tokio::test]
async fn one_owner_at_a_time_and_a_dead_owners_lock_frees_at_once() {
    let mut server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    let a = PostgresOwnership::connect(&url, replica("hub-a"))
        .await
        .unwrap();
    let b = PostgresOwnership::connect(&url, replica("hub-b"))
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
    // The lock is free at once: hub-b takes the account with the next epoch.
    assert_eq!(
        b.try_acquire("prod").await.unwrap(),
        Claim::Acquired { epoch: 2 }
    );
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
            .map(|t| (t.0.as_str(), t.1))
            .collect::<Vec<_>>(),
        [("hub-a", 1), ("hub-b", 2), ("hub-a", 3)]
    );
    assert_no_overlap(&tenures);
    assert!(tenures[2].3.is_none(), "hub-a owns it now");

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
    assert_no_overlap(&history(&sql, "prod").await);
    assert_no_overlap(&history(&sql, "staging").await);

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
