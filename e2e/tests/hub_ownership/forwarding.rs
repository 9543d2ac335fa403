//! Hubs on PostgreSQL: streams forwarded to the owner, failover, owner lookups cached, writes
//! of an account taken over dropped.

use super::*;

#[tokio::test]
async fn hub_replicas_on_postgres_stream_forward_and_fail_over() {
    let mut server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let a = start_replica(&url, "hub-a").await;
    let b = start_replica(&url, "hub-b").await;

    let mut x = MiniAgent::connect(&a.hub, "pod-x").await;
    x.register_streaming("prod").await;
    let mut y = MiniAgent::connect(&b.hub, "pod-y").await;
    y.register("prod").await;
    assert_eq!(y.role().await, Role::Standby);
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    assert_eq!(owner_row(&sql, "prod").await, Some(("hub-a".into(), 1)));
    // hub-a stores what its agent streams (fenced by its epoch) in the shared store.
    x.snapshot("prod", "100").await;
    let stored: i64 = sql
        .query_one(
            "SELECT count(*) FROM account_owners WHERE account = 'prod'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1);

    // An operation submitted to hub-b runs on hub-a's agent.
    let submit = tokio::spawn({
        let b_addr = b.hub.http_addr;
        let admin = b.admin.clone();
        async move { post_to(b_addr, &admin, "prod").await }
    });
    x.run_operation("pod-x").await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 200, "{body}");

    // The stream's batches commit with synchronous_commit off (the store's design: a crash
    // of PostgreSQL may lose the last ones, like an fsync-less commit of the embedded
    // store); once visible, a checkpoint makes them survive the kill below.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let stored: i64 = sql
            .query_one(
                "SELECT count(*) FROM resume_points WHERE account = 'prod'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if stored == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never stored");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sql.batch_execute("CHECKPOINT").await.unwrap();
    // PostgreSQL restarts: hub-a's locks are gone, so it ends the stream it owned.
    server.kill();
    let ended = x.next(|_| None::<()>).await.unwrap_err();
    assert!(ended.message().contains("lost the ownership"), "{ended:?}");
    server.restart().await.unwrap();
    // pod-x reconnects to hub-a; whichever replica takes the account first promotes its
    // agent, and the other agent stands by.
    let mut x = MiniAgent::connect(&a.hub, "pod-x").await;
    x.register("prod").await;
    let first = x.role().await;
    let promoted = if first == Role::Streaming {
        "hub-a"
    } else {
        tokio::select! {
            role = x.role() => { assert_eq!(role, Role::Streaming); "hub-a" }
            role = y.role() => { assert_eq!(role, Role::Streaming); "hub-b" }
        }
    };
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    assert_eq!(
        owner_row(&sql, "prod")
            .await
            .map(|(replica, _)| replica)
            .as_deref(),
        Some(promoted)
    );

    // The owner stops: the other replica takes the account and promotes its standby.
    let (owner, other, mut standby) = if promoted == "hub-a" {
        (a, b, y)
    } else {
        (b, a, x)
    };
    owner.stop().await;
    // The next owner resumes from what the last one stored: no relist.
    let promoted = standby.assignment().await;
    assert_eq!(Role::try_from(promoted.role).unwrap(), Role::Streaming);
    assert_eq!(
        promoted
            .resume_points
            .iter()
            .map(|r| r.resource_version.as_str())
            .collect::<Vec<_>>(),
        ["100"],
        "{promoted:?}"
    );
    let tenures = history(&sql, "prod").await;
    assert!(tenures.len() >= 3, "{tenures:?}");
    assert_no_overlap("prod", &tenures);
    assert_eq!(
        owner_row(&sql, "prod").await.map(|(replica, _)| replica),
        tenures.last().map(|t| t.replica.clone())
    );
    drop(standby);
    other.stop().await;
}

/// Requests for an account reaching a replica that does not own it are forwarded to the
/// owner without asking PostgreSQL for the owner each time (issue 26): 50 reads of the
/// account through hub-b all answered by hub-a, with at most a few lookups of the owner
/// (one per two-second TTL). When the owner stops, hub-b forgets the owner it kept and the
/// next request finds the new one: the account is served again without waiting for the TTL.
#[tokio::test]
async fn a_non_owner_looks_the_owner_up_once_not_per_request() {
    let server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let a = start_replica(&url, "hub-a").await;
    let b = start_replica(&url, "hub-b").await;
    let mut x = MiniAgent::connect(&a.hub, "pod-x").await;
    x.register_streaming("prod").await;

    let read = |replica: &Replica| {
        Call::new(
            "GET",
            format!("http://{}/api/v1/accounts/prod", replica.hub.http_addr),
        )
        .bearer(&replica.admin)
    };
    let started = tokio::time::Instant::now();
    for _ in 0..50 {
        let response = read(&b).send().await.unwrap();
        assert_eq!(response.status, 200, "{}", response.body);
        // Only the owner sees the agent's stream: hub-b's own view would not.
        assert!(
            response.body.contains(r#""state":"connected""#),
            "answered by the owner: {}",
            response.body
        );
    }
    let (queries, hits) = b.hub.owner_lookups();
    // One lookup per TTL (2 s) that the 50 reads spanned, the first included.
    let windows = started.elapsed().as_secs() / 2 + 1;
    assert!(
        queries <= windows && queries + hits == 50,
        "{queries} lookups of the owner in PostgreSQL and {hits} kept answers for 50 reads in {:?}",
        started.elapsed()
    );
    assert_eq!(
        a.hub.owner_lookups(),
        (0, 0),
        "the owner never looks itself up"
    );

    // The owner goes away; its agent reconnects to hub-b, which takes the account: hub-b
    // serves it itself, whatever it kept.
    a.stop().await;
    drop(x);
    let mut x = MiniAgent::connect(&b.hub, "pod-x").await;
    x.register_streaming("prod").await;
    let response = read(&b).send().await.unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    assert!(
        response.body.contains(r#""state":"connected""#),
        "{}",
        response.body
    );
    drop(x);
    b.stop().await;
}

/// A replica whose account was taken over behind its back (its lock connection not yet
/// broken, say) has its writes of that account refused by the store's fencing: they are
/// dropped, the rest of the queue is committed, and its agents' acknowledgements go on
/// instead of waiting for a store that would refuse forever.
#[tokio::test]
async fn writes_of_an_account_taken_over_are_dropped_not_retried_forever() {
    let server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let a = start_replica(&url, "hub-a").await;
    let mut x = MiniAgent::connect(&a.hub, "pod-x").await;
    x.register_streaming("prod").await;
    x.snapshot("prod", "100").await;
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    let objects = async |sql: &tokio_postgres::Client| -> i64 {
        sql.query_one("SELECT count(*) FROM objects WHERE account = 'prod'", &[])
            .await
            .unwrap()
            .get(0)
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    while objects(&sql).await != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the snapshot was never stored"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another replica's tenure, as the store sees it.
    sql.execute(
        "UPDATE account_owners SET replica = 'hub-z', epoch = epoch + 1 WHERE account = 'prod'",
        &[],
    )
    .await
    .unwrap();
    // hub-a's next writes of the account are refused and dropped; the agent is acknowledged.
    x.send(Msg::Object(pb::ObjectEvent {
        account: "prod".into(),
        kind: Some(pb::Kind {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        }),
        r#type: pb::object_event::Type::Applied as i32,
        namespace: "default".into(),
        name: "two".into(),
        uid: "uid-two".into(),
        resource_version: "101".into(),
        object_json: br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"two","namespace":"default","uid":"uid-two","resourceVersion":"101"}}"#.to_vec(),
        truncated: false,
        watch_namespace: String::new(),
    }))
    .await;
    while x.acked < x.seq {
        x.next(|kind| matches!(kind, Out::Ack(_)).then_some(()))
            .await
            .expect("the agent was acknowledged");
    }
    // The store never turns failing over it (which would hold every agent's
    // acknowledgements), and the write is not stored.
    for _ in 0..20 {
        assert_eq!(get_status(a.hub.http_addr, "/readyz/store").await, 200);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(objects(&sql).await, 1, "the fenced write was stored");
    drop(x);
    a.stop().await;
}

/// The status of an unauthenticated GET on a plaintext hub.
async fn get_status(addr: std::net::SocketAddr, path: &str) -> u16 {
    Call::new("GET", format!("http://{addr}{path}"))
        .send()
        .await
        .unwrap()
        .status
}
