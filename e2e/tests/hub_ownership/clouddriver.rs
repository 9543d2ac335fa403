//! Clouddriver registration with replicas: one registrar, and the duty surviving its death.

use super::*;

/// The replica holding the Clouddriver registrar's lock, as PostgreSQL sees it.
async fn registrar(sql: &tokio_postgres::Client) -> Option<String> {
    let rows = sql
        .query(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted \
             AND a.application_name LIKE '% clouddriver-registrar'",
            &[],
        )
        .await
        .unwrap();
    assert!(rows.len() <= 1, "two registrars");
    rows.first().map(|row| {
        let name: String = row.get(0);
        name.split(' ').nth(1).unwrap_or_default().to_string()
    })
}

/// Agent `pod-<i>` of account `prod-<i>`, whose hub died, streams again through `grpc`.
async fn reconnect(agent: &mut MiniAgent, grpc: std::net::SocketAddr, i: usize) {
    *agent = MiniAgent::connect_asking(grpc, &format!("pod-{i}"), 300).await;
    agent.register_streaming(&format!("prod-{i}")).await;
}

/// What the contract saw: (PUTs, DELETEs).
fn puts_and_deletes(contract: &Contract) -> (usize, Vec<String>) {
    let seen = contract.seen();
    let puts = seen.iter().filter(|s| s.method == "PUT").count();
    let deletes = seen
        .iter()
        .filter(|s| s.method == "DELETE")
        .map(|s| s.path.clone())
        .collect();
    (puts, deletes)
}

/// Three hub processes on one PostgreSQL register their accounts in Clouddriver (the
/// contract server of the hub's tests, written from Clouddriver's source: see
/// `scale_agent_testkit::contract`): exactly one replica (the holder of the registrar's lock)
/// registers every account of the store, whichever replica streams it, each once; a replica
/// restarted (which loads every account and forgets those it does not stream after the grace
/// period) deletes nothing; killing the registrar moves the duty to another replica within
/// seconds, with no DELETE and no account sent again, and the new registrar registers new
/// accounts; so does a break of the registrar's lock connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_replica_registers_every_account_in_clouddriver_and_the_duty_survives_its_death() {
    const PUBLIC_URL: &str = "https://hub.example:8443";
    let server = PostgresServer::start().await.unwrap();
    let (contract, contract_url) = contract::start_contract_for(PUBLIC_URL).await;
    let extra = [
        format!("--public-url={PUBLIC_URL}"),
        format!("--clouddriver-url={contract_url}"),
        // Replicas forget accounts they do not stream quickly.
        "--grace-period=2s".to_string(),
    ];
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let (root, mut hubs) = hub_processes(&server, "registrar", 3, &extra).await;
    // Account prod-<i> streams through hub i; its agent asks for rare heartbeats, so that it
    // stays connected without sending any.
    let mut agents = Vec::new();
    for (i, hub) in hubs.iter().enumerate() {
        let mut agent = MiniAgent::connect_asking(hub.grpc, &format!("pod-{i}"), 300).await;
        agent.register_streaming(&format!("prod-{i}")).await;
        agents.push(agent);
    }
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    let wanted = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let deadline = std::time::Instant::now() + WAIT;
    while contract.accounts().into_keys().collect::<Vec<_>>()
        != wanted(&["prod-0", "prod-1", "prod-2"])
    {
        if std::time::Instant::now() > deadline {
            for hub in &hubs {
                eprintln!("---\n{}", hub.log_tail(40));
            }
            panic!(
                "prod-0, prod-1 and prod-2 not registered: {:?}, registrar {:?}",
                contract.seen(),
                registrar(&sql).await
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = registrar(&sql)
        .await
        .expect("a replica holds the registrar's lock");
    let index = |id: &str| (0..3).find(|i| format!("hub-{i}") == id).unwrap();
    let first = index(&first);
    assert_eq!(puts_and_deletes(&contract), (3, vec![]));

    // A replica that is not the registrar restarts: it loads every account from the store
    // and forgets those it does not stream after the grace period, and removes nothing.
    let other = (first + 1) % 3;
    // A replica that is killed in neither step below, for agents to reconnect to.
    let steady = (first + 2) % 3;
    hubs[other].kill();
    // Its agent reconnects to a live replica, as a real one does through the Service: an
    // account left without an agent past the grace period is swept from the store, and so
    // removed from Clouddriver, like an ORPHANED account of a single hub.
    reconnect(&mut agents[other], hubs[steady].grpc, other).await;
    hubs[other].start_again().await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        puts_and_deletes(&contract),
        (3, vec![]),
        "the restarted hub-{other} changed the registrations"
    );
    assert_eq!(
        contract.accounts().into_keys().collect::<Vec<_>>(),
        wanted(&["prod-0", "prod-1", "prod-2"])
    );

    // The registrar dies: another replica takes the duty within seconds.
    hubs[first].kill();
    let killed = std::time::Instant::now();
    reconnect(&mut agents[first], hubs[steady].grpc, first).await;
    let mut second = None;
    while second.is_none() && killed.elapsed() < WAIT {
        second = registrar(&sql)
            .await
            .filter(|r| *r != format!("hub-{first}"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = index(&second.expect("another replica takes the registrar's lock"));
    eprintln!(
        "hub-{second} took the registrar's duty {:?} after hub-{first} was killed",
        killed.elapsed()
    );
    // The new registrar registers an account streamed by another replica.
    let third = (0..3).find(|i| *i != first && *i != second).unwrap();
    let mut late = MiniAgent::connect_asking(hubs[third].grpc, "pod-late", 300).await;
    late.register_streaming("prod-3").await;
    wait::eventually(
        "prod-3 registered by the new registrar",
        WAIT,
        POLL,
        async || contract.accounts().contains_key("prod-3"),
    )
    .await;
    // Its first pass is over (prod-3 was sent after it): nothing else was sent.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        puts_and_deletes(&contract),
        (4, vec![]),
        "the takeover sent unchanged accounts again or removed some"
    );
    assert_eq!(
        contract.accounts().into_keys().collect::<Vec<_>>(),
        wanted(&["prod-0", "prod-1", "prod-2", "prod-3"])
    );

    // The registrar's lock connection breaks (its process lives on): it stops registering,
    // and a replica (maybe itself, connected again) takes the duty over as after a death.
    let terminated: i64 = sql
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name LIKE '% clouddriver-registrar' \
             AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(terminated, 1);
    let mut last = MiniAgent::connect_asking(hubs[third].grpc, "pod-last", 300).await;
    last.register_streaming("prod-4").await;
    wait::eventually(
        "prod-4 registered after the lock connection broke",
        WAIT,
        POLL,
        async || contract.accounts().contains_key("prod-4"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(registrar(&sql).await.is_some());
    assert_eq!(
        puts_and_deletes(&contract),
        (5, vec![]),
        "the broken lock connection led to a removal or a repeated registration"
    );
    drop((agents, late, last));
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}
