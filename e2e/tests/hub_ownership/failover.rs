//! Failover: three replicas with one killed, an operation id run once across it, a frozen owner
//! and a replica partitioned from PostgreSQL losing their accounts.

use super::*;

/// Issue 16's failover, as processes: three hub replicas on one PostgreSQL, three accounts
/// each streamed through one replica with a standby on the next; one replica is killed
/// (SIGKILL) while its agent streams; its account streams again on the next replica, resumed
/// from the stored resume point (no relist); an operation submitted to any replica reaches
/// the account's streaming agent; the ownership history never overlaps.
#[tokio::test]
async fn three_replicas_one_killed_every_account_streams_again_without_relisting() {
    let server = PostgresServer::start().await.unwrap();
    let (root, mut hubs) = hub_processes(&server, "three", 3, &[]).await;
    // Account a<i> streams through hub i, with a standby agent on hub i+1.
    let mut streaming = Vec::new();
    let mut standbys = Vec::new();
    for i in 0..3 {
        let account = format!("a{i}");
        let mut agent = MiniAgent::connect_to(hubs[i].grpc, &format!("pod-{i}-0")).await;
        agent.register_streaming(&account).await;
        agent.snapshot(&account, "100").await;
        let mut standby =
            MiniAgent::connect_to(hubs[(i + 1) % 3].grpc, &format!("pod-{i}-1")).await;
        standby.register(&account).await;
        assert_eq!(standby.role().await, Role::Standby);
        streaming.push(agent);
        standbys.push(standby);
    }
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    for i in 0..3 {
        assert_eq!(
            owner_row(&sql, &format!("a{i}")).await.map(|o| o.0),
            Some(format!("hub-{i}"))
        );
    }

    // hub-0 is killed while its agent streams.
    hubs[0].kill();
    let killed_at = std::time::Instant::now();
    // a0's standby on hub-1 streams, from the stored resume point.
    let promoted = tokio::time::timeout(WAIT, standbys[0].assignment())
        .await
        .expect("a0 streams again");
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
    eprintln!("a0 streamed again {:?} after the kill", killed_at.elapsed());
    assert_eq!(
        owner_row(&sql, "a0").await.map(|o| o.0).as_deref(),
        Some("hub-1")
    );
    // The other accounts kept their owners.
    assert_eq!(
        owner_row(&sql, "a1").await.map(|o| o.0).as_deref(),
        Some("hub-1")
    );
    assert_eq!(
        owner_row(&sql, "a2").await.map(|o| o.0).as_deref(),
        Some("hub-2")
    );

    // An operation on a0 submitted to hub-2 runs on its agent now streaming on hub-1.
    let submit = tokio::spawn({
        let addr = hubs[2].http;
        async move { post_to(addr, scale_agent_e2e::fixtures::API_TOKEN, "a0").await }
    });
    standbys[0].run_operation("pod-0-1").await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 200, "{body}");

    for i in 0..3 {
        let account = format!("a{i}");
        assert_no_overlap(&account, &history(&sql, &account).await);
    }
    let a0 = history(&sql, "a0").await;
    assert_eq!(
        a0.iter().map(|t| t.replica.as_str()).collect::<Vec<_>>(),
        ["hub-0", "hub-1"]
    );
    drop((streaming, standbys));
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}

/// Submits a json patch under client id `id` to the hub at `addr` (the API token of the
/// tests' hubs) and waits for its result: (status, body as JSON).
async fn patch_with_id(
    addr: std::net::SocketAddr,
    account: &str,
    id: &str,
) -> (u16, serde_json::Value) {
    let body = serde_json::json!({
        "type": "patch", "id": id, "kind": "ConfigMap", "namespace": "default", "name": "two",
        "patchType": "json", "patch": [{"op": "add", "path": "/data/n", "value": "1"}],
    });
    let url = format!("http://{addr}/api/v1/accounts/{account}/operations");
    let mut call = Call::new("POST", url)
        .bearer(scale_agent_e2e::fixtures::API_TOKEN)
        .header("content-type", "application/json")
        .timeout(wait::WAIT);
    call.body = Some(body.to_string().into_bytes());
    let response = call.send().await.unwrap();
    (response.status, response.json_or_null())
}

/// Client ids are claimed in the shared store (issue 29): an operation with a client id
/// finishes through its owner, the owner is killed (SIGKILL), the account streams on the
/// other replica, and the same id retried there answers the first outcome without reaching
/// the agent again, so a retried json patch does not run twice. (That a new id does reach
/// the agent through another replica is `three_replicas_one_killed_...`.)
#[tokio::test]
async fn a_client_id_retried_on_another_replica_after_the_owner_died_runs_once() {
    let server = PostgresServer::start().await.unwrap();
    let (root, mut hubs) = hub_processes(&server, "client-ids", 2, &[]).await;
    let mut owner_agent = MiniAgent::connect_to(hubs[0].grpc, "pod-0").await;
    owner_agent.register_streaming("a0").await;
    owner_agent.snapshot("a0", "100").await;
    let mut standby = MiniAgent::connect_to(hubs[1].grpc, "pod-1").await;
    standby.register("a0").await;
    assert_eq!(standby.role().await, Role::Standby);

    let submit = tokio::spawn({
        let addr = hubs[0].http;
        async move { patch_with_id(addr, "a0", "deploy-42").await }
    });
    owner_agent.run_operation("pod-0").await;
    let (code, first) = submit.await.unwrap();
    assert_eq!(code, 200, "{first}");
    assert_eq!(first["state"], "succeeded", "{first}");
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    let stored: i64 = sql
        .query_one(
            "SELECT count(*) FROM operation_records WHERE account = 'a0' AND id = 'deploy-42'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1, "the claim is in the shared store");
    let submitter: String = sql
        .query_one(
            "SELECT submitter FROM operation_records WHERE account = 'a0' AND id = 'deploy-42'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        submitter,
        format!("api:{}", scale_agent_e2e::fixtures::API_TOKEN_NAME),
        "the claim is the caller's (F18)"
    );

    hubs[0].kill();
    let promoted = tokio::time::timeout(WAIT, standby.assignment())
        .await
        .expect("a0 streams again on hub-1");
    assert_eq!(Role::try_from(promoted.role).unwrap(), Role::Streaming);

    // The retry on hub-1: the first outcome, and nothing reaches the agent.
    let (code, again) = patch_with_id(hubs[1].http, "a0", "deploy-42").await;
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["state"], "succeeded", "{again}");
    assert_eq!(again["id"], "deploy-42", "{again}");
    assert_eq!(again["replica"], first["replica"], "{again}");
    // Whatever the agent hears next (the mini agent sends no heartbeats, so the hub ends
    // its stream after two periods), it is no operation.
    let sent = tokio::time::timeout(
        Duration::from_secs(3),
        standby.next(|kind| match kind {
            Out::Operation(op) => Some(op),
            _ => None,
        }),
    )
    .await;
    assert!(
        !matches!(sent, Ok(Ok(_))),
        "the retried id reached the agent: {sent:?}"
    );
    drop((owner_agent, standby));
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}

/// A frozen owner (SIGSTOP: its sockets stay open and its kernel still answers TCP) loses
/// its accounts when its lock session's lease ends (issue 29): PostgreSQL ends the silent
/// session, the other replica takes the account with the next epoch and promotes its
/// standby, from the stored resume point, within 30 s; after SIGCONT the old owner finds its
/// lease gone and ends the stream it served; the ownership history never overlaps.
#[tokio::test]
async fn a_frozen_owner_loses_its_accounts_within_the_lease() {
    let server = PostgresServer::start().await.unwrap();
    let (root, hubs) = hub_processes(&server, "frozen", 2, &[]).await;
    // Agents that ask for a long heartbeat period: they stay connected while silent.
    let mut owner_agent = MiniAgent::connect_asking(hubs[0].grpc, "pod-0", 60).await;
    owner_agent.register_streaming("a0").await;
    owner_agent.snapshot("a0", "100").await;
    let mut standby = MiniAgent::connect_asking(hubs[1].grpc, "pod-1", 60).await;
    standby.register("a0").await;
    assert_eq!(standby.role().await, Role::Standby);
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    assert_eq!(
        owner_row(&sql, "a0").await.map(|o| o.0).as_deref(),
        Some("hub-0")
    );

    let pid = hubs[0].pid().expect("hub-0 runs");
    scale_agent_e2e::process::send_signal(pid, libc::SIGSTOP);
    let frozen_at = std::time::Instant::now();
    let promoted = tokio::time::timeout(Duration::from_secs(60), standby.assignment())
        .await
        .expect("a0 streams again on hub-1 while hub-0 is frozen");
    let took = frozen_at.elapsed();
    eprintln!("a0 streamed again {took:?} after hub-0 was frozen");
    assert_eq!(Role::try_from(promoted.role).unwrap(), Role::Streaming);
    assert_eq!(
        promoted
            .resume_points
            .iter()
            .map(|r| r.resource_version.as_str())
            .collect::<Vec<_>>(),
        ["100"],
        "resumed, not relisted: {promoted:?}"
    );
    assert!(took <= Duration::from_secs(30), "taken over after {took:?}");
    assert_eq!(
        owner_row(&sql, "a0").await.map(|o| o.0).as_deref(),
        Some("hub-1")
    );

    // Thawed, hub-0 finds its lease gone and stops serving a0 at once.
    scale_agent_e2e::process::send_signal(pid, libc::SIGCONT);
    let thawed_at = std::time::Instant::now();
    let ended = owner_agent.next(|_| None::<()>).await.unwrap_err();
    eprintln!(
        "hub-0 ended a0's stream {:?} after SIGCONT: {ended:?}",
        thawed_at.elapsed()
    );
    assert!(ended.message().contains("lost the ownership"), "{ended:?}");
    assert!(
        thawed_at.elapsed() < Duration::from_secs(15),
        "{:?}",
        thawed_at.elapsed()
    );
    let tenures = history(&sql, "a0").await;
    assert_no_overlap("a0", &tenures);
    assert_eq!(
        tenures
            .iter()
            .map(|t| t.replica.as_str())
            .collect::<Vec<_>>(),
        ["hub-0", "hub-1"]
    );
    assert_eq!(
        owner_row(&sql, "a0").await.map(|o| o.0).as_deref(),
        Some("hub-1"),
        "hub-0 took nothing back"
    );
    drop((owner_agent, standby));
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}

/// A replica cut off from PostgreSQL by a silent partition (issue 29; a relay that stops
/// relaying without closing anything, as dropped packets do): its heartbeat on the lock
/// session fails, so it ends the streams of the accounts it owned, before PostgreSQL ends
/// the silent session and the other replica takes them over; the ownership history never
/// overlaps, and after the partition heals the account stays with its new owner.
#[tokio::test]
async fn a_replica_partitioned_from_postgres_stops_serving_before_another_takes_over() {
    let server = PostgresServer::start().await.unwrap();
    let relay = scale_agent_e2e::relay::Relay::start(
        format!("127.0.0.1:{}", server.port()).parse().unwrap(),
    )
    .await
    .unwrap();
    let root =
        std::env::temp_dir().join(format!("scale-agent-e2e-partition-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let secret_file = root.join("replica-secret");
    std::fs::write(&secret_file, SECRET).unwrap();
    let mut hubs = Vec::new();
    for i in 0..2 {
        // hub-0 reaches PostgreSQL through the relay.
        let url = if i == 0 {
            server.url().replace(
                &format!("127.0.0.1:{}", server.port()),
                &relay.addr().to_string(),
            )
        } else {
            server.url()
        };
        let url_file = root.join(format!("postgres-url-{i}"));
        std::fs::write(&url_file, url).unwrap();
        let flags = [
            "--store=postgres".to_string(),
            // The harness\'s PostgreSQL is plaintext on loopback.
            "--postgres-insecure-tls".to_string(),
            format!("--postgres-url-file={}", url_file.display()),
            format!("--replica-id=hub-{i}"),
            "--replica-address=http://{http}".to_string(),
            format!("--replica-secret-file={}", secret_file.display()),
            format!("--replica-sync-period={}ms", SYNC.as_millis()),
        ];
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        hubs.push(
            scale_agent_e2e::fleet::HubProcess::start(&root.join(format!("hub-{i}")), &flags)
                .await
                .unwrap(),
        );
    }
    let mut owner_agent = MiniAgent::connect_asking(hubs[0].grpc, "pod-0", 60).await;
    owner_agent.register_streaming("a0").await;
    owner_agent.snapshot("a0", "100").await;
    let mut standby = MiniAgent::connect_asking(hubs[1].grpc, "pod-1", 60).await;
    standby.register("a0").await;
    assert_eq!(standby.role().await, Role::Standby);
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    assert_eq!(
        owner_row(&sql, "a0").await.map(|o| o.0).as_deref(),
        Some("hub-0")
    );

    relay.blackhole();
    let partitioned_at = std::time::Instant::now();
    let ended = owner_agent.next(|_| None::<()>).await.unwrap_err();
    let stopped = partitioned_at.elapsed();
    eprintln!("hub-0 ended a0's stream {stopped:?} into the partition: {ended:?}");
    assert!(ended.message().contains("lost the ownership"), "{ended:?}");
    let promoted = tokio::time::timeout(Duration::from_secs(60), standby.assignment())
        .await
        .expect("a0 streams again on hub-1");
    let taken = partitioned_at.elapsed();
    eprintln!("a0 streamed again on hub-1 {taken:?} into the partition");
    assert_eq!(Role::try_from(promoted.role).unwrap(), Role::Streaming);
    assert!(
        stopped < taken,
        "the old owner stopped ({stopped:?}) after the new one took over ({taken:?})"
    );
    assert!(taken <= Duration::from_secs(30), "{taken:?}");
    let tenures = history(&sql, "a0").await;
    assert_no_overlap("a0", &tenures);
    assert_eq!(
        tenures
            .iter()
            .map(|t| t.replica.as_str())
            .collect::<Vec<_>>(),
        ["hub-0", "hub-1"]
    );

    // The partition heals: the account stays with hub-1.
    relay.restore();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        owner_row(&sql, "a0").await.map(|o| o.0).as_deref(),
        Some("hub-1")
    );
    drop((owner_agent, standby));
    drop(hubs);
    drop(relay);
    let _ = std::fs::remove_dir_all(&root);
}
