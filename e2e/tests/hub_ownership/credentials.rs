//! What replicas keep in step (issue 16): credentials issued on one work on another,
//! revocations reach it, every replica lists every account, an orphaned account is swept once,
//! a flood of unknown tokens costs a bounded number of lookups.

use super::*;

/// A proxy token, an API token, an agent bearer token and an enrolment token issued on one
/// replica work on another at once (looked up in the store on a miss); an enrolment token
/// works once across replicas; revoked on the first, each is refused on the other within
/// the sync period.
#[tokio::test]
async fn credentials_issued_on_one_replica_work_on_another_at_once_and_revocations_reach_it() {
    let server = PostgresServer::start().await.unwrap();
    let (root, hubs) = hub_processes(&server, "credentials", 2, &[]).await;
    let (a, b) = (&hubs[0], &hubs[1]);
    let admin = admin_token(a);

    // A kubeconfig (proxy token) issued on hub-0 opens hub-1's proxy at once.
    let kubeconfig = call("POST", a.http, "/api/v1/accounts/prod/kubeconfig", &admin).await;
    assert_eq!(kubeconfig.status, 200, "{}", kubeconfig.body);
    let proxy_token = kubeconfig
        .body
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let through_b = call("GET", b.http, "/clusters/prod/api", &proxy_token).await;
    assert_ne!(
        through_b.status, 401,
        "hub-1 refused a token hub-0 issued: {}",
        through_b.body
    );
    // (An unknown token is refused there: the status above tells them apart.)
    let unknown = call("GET", b.http, "/clusters/prod/api", "sat_unknown-token").await;
    assert_eq!(unknown.status, 401, "{}", unknown.body);

    // An API token issued on hub-0 opens hub-1's API at once.
    let created =
        scale_agent_e2e::http::Call::new("POST", format!("http://{}/api/v1/tokens", a.http))
            .bearer(&admin)
            .json(&serde_json::json!({"name": "ci", "role": "reader"}))
            .send()
            .await
            .unwrap();
    assert_eq!(created.status, 200, "{}", created.body);
    let created = created.json_or_null();
    let api_token = created["token"].as_str().unwrap().to_string();
    let api_id = created["id"].as_str().unwrap().to_string();
    let agents = call("GET", b.http, "/api/v1/agents", &api_token).await;
    assert_eq!(agents.status, 200, "{}", agents.body);

    // An agent bearer token issued on hub-0 opens a stream on hub-1 at once.
    let (bearer_token, bearer_id) = issue_agent_token(a.http, &admin, false).await;
    stream_with_token(b.grpc, &bearer_token).await.unwrap();

    // An enrolment token issued on hub-0 enrols on hub-1 at once, and only once: hub-0
    // refuses it afterwards.
    let (enrolment_token, _) = issue_agent_token(a.http, &admin, true).await;
    assert_eq!(
        enroll_at(b.grpc, &enrolment_token).await.unwrap(),
        "edge-agent"
    );
    let again = enroll_at(a.grpc, &enrolment_token).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::PermissionDenied, "{again:?}");
    assert!(again.message().contains("already used"), "{again:?}");

    // Revoked on hub-0, each is refused on hub-1 within the sync period (and a little).
    let limit = SYNC * 2 + Duration::from_secs(2);
    let tokens = call("GET", a.http, "/api/v1/tokens", &admin)
        .await
        .json_or_null();
    let proxy_id = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["kind"] == "proxy" && t["account"] == "prod")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    for id in [&proxy_id, &api_id] {
        let revoked = call("DELETE", a.http, &format!("/api/v1/tokens/{id}"), &admin).await;
        assert_eq!(revoked.status, 200, "{}", revoked.body);
    }
    let revoked = call(
        "DELETE",
        a.http,
        &format!("/api/v1/agent-tokens/{bearer_id}"),
        &admin,
    )
    .await;
    assert_eq!(revoked.status, 200, "{}", revoked.body);
    let took = refused_within(limit, "the proxy token", || async {
        call("GET", b.http, "/clusters/prod/api", &proxy_token)
            .await
            .status
            == 401
    })
    .await;
    eprintln!("proxy token refused on hub-1 {took:?} after its revocation on hub-0");
    refused_within(limit, "the API token", || async {
        call("GET", b.http, "/api/v1/agents", &api_token)
            .await
            .status
            == 401
    })
    .await;
    refused_within(limit, "the agent bearer token", || async {
        matches!(
            stream_with_token(b.grpc, &bearer_token).await,
            Err(status) if status.code() == tonic::Code::Unauthenticated
        )
    })
    .await;
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}

/// Lines of a hub process's log holding every one of `needles`.
fn log_lines(hub: &scale_agent_e2e::fleet::HubProcess, needles: &[&str]) -> usize {
    hub.log_tail(100_000)
        .lines()
        .filter(|line| needles.iter().all(|n| line.contains(n)))
        .count()
}

/// `GET /api/v1/accounts` and `/api/v1/agents` on any replica answer for every replica
/// (accounts with their owner, agents with the replica they reach; a replica that cannot
/// be asked is listed as unreachable); a replica holds an account registered through
/// another to its cluster; a dynamic account added through one replica reaches the agent
/// streaming to another; an account no replica owns past the grace period
/// (its owner released it, or died) is cleaned out of the shared store once, its binding
/// kept.
#[tokio::test]
async fn every_replica_lists_every_account_and_an_orphaned_account_is_swept_once() {
    let server = PostgresServer::start().await.unwrap();
    let (root, mut hubs) = hub_processes(
        &server,
        "fleet",
        3,
        &["--grace-period=3s", "--log-format=json"],
    )
    .await;
    let mut agents = Vec::new();
    for (i, hub) in hubs.iter().take(2).enumerate() {
        let account = format!("a{i}");
        // Silent for longer than the hub's heartbeat period (1 s), the agents stay.
        let mut agent = MiniAgent::connect_asking(hub.grpc, &format!("pod-{i}"), 30).await;
        agent.register_streaming(&account).await;
        agent.snapshot(&account, "100").await;
        agents.push(agent);
    }

    // hub-2 serves no agent, yet lists both accounts as their owners see them.
    let token = scale_agent_e2e::fixtures::API_TOKEN;
    let started = std::time::Instant::now();
    let accounts = loop {
        let list = call("GET", hubs[2].http, "/api/v1/accounts", token).await;
        assert_eq!(list.status, 200, "{}", list.body);
        let list = list.json_or_null();
        let complete = (0..2).all(|i| {
            list.as_array().unwrap().iter().any(|a| {
                a["name"] == format!("a{i}")
                    && a["owner"]["replica"] == format!("hub-{i}")
                    && a["objects"] == 1
                    && a["accountState"] == "ACTIVE"
            })
        });
        if complete {
            break list;
        }
        assert!(started.elapsed() < WAIT, "hub-2 lists {list}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("hub-2 lists {accounts}");
    let agents_seen = call("GET", hubs[2].http, "/api/v1/agents", token)
        .await
        .json_or_null();
    for i in 0..2 {
        assert!(
            agents_seen
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["replica"] == format!("pod-{i}")
                    && a["hubReplica"] == format!("hub-{i}")
                    && a["accounts"][0]["role"] == "STREAMING"),
            "{agents_seen}"
        );
    }

    // hub-2, which started before a0 was registered, holds a0 to its cluster too.
    let mut rival = MiniAgent::connect_asking(hubs[2].grpc, "pod-rival", 30).await;
    rival.register_cluster("a0", "https://10.9.9.9:6443").await;
    let refused = rival.assignment().await;
    assert_eq!(Role::try_from(refused.role).unwrap(), Role::Rejected);
    assert!(
        refused.reason.contains("bound to cluster"),
        "{}",
        refused.reason
    );
    drop(rival);

    // A dynamic account added through hub-0 reaches the agent streaming to hub-1 within
    // the sync period.
    let admin = admin_token(&hubs[0]);
    let added = scale_agent_e2e::http::Call::new(
        "POST",
        format!("http://{}/api/v1/dynamic-accounts", hubs[0].http),
    )
    .bearer(&admin)
    .json(&serde_json::json!({
        "name": "dyn-a", "agent": "anonymous",
        "kubeconfigSecret": {"namespace": "spinnaker", "name": "dyn-a-kubeconfig"},
    }))
    .send()
    .await
    .unwrap();
    assert_eq!(added.status, 201, "{}", added.body);
    let sent = tokio::time::timeout(
        SYNC * 2 + Duration::from_secs(2),
        agents[1].next(|kind| match kind {
            Out::DynamicAccounts(set) if set.accounts.iter().any(|a| a.account == "dyn-a") => {
                Some(set)
            }
            _ => None,
        }),
    )
    .await
    .expect("the dynamic account reached the agent on hub-1 within the sync period")
    .unwrap();
    assert_eq!(sent.accounts.len(), 1);

    // hub-1 dies: until the others forget it, it is listed as unreachable, not left out.
    hubs[1].kill();
    let agents_seen = call("GET", hubs[0].http, "/api/v1/agents", token)
        .await
        .json_or_null();
    assert!(
        agents_seen
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["hubReplica"] == "hub-1" && a["unreachable"].is_string()),
        "{agents_seen}"
    );

    // a1's owner died, a0's agent leaves hub-0 (which releases it): past the grace period
    // both are cleaned out of the store, bindings kept.
    drop(agents);
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    let count = |table: &'static str| {
        let sql = &sql;
        async move {
            let row = sql
                .query_one(
                    &format!("SELECT count(*) FROM {table} WHERE account IN ('a0', 'a1')"),
                    &[],
                )
                .await
                .unwrap();
            row.get::<_, i64>(0)
        }
    };
    let started = std::time::Instant::now();
    while count("accounts").await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the orphaned accounts are still stored"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "orphans swept {:?} after their agents left",
        started.elapsed()
    );
    for table in ["kinds", "objects", "resume_points"] {
        assert_eq!(count(table).await, 0, "{table}");
    }
    assert_eq!(count("account_bindings").await, 2);
    // Swept once: by one replica, one log line per account, even a few syncs later.
    tokio::time::sleep(SYNC * 3).await;
    for account in ["a0", "a1"] {
        let needle = format!("\"account\":\"{account}\"");
        let lines: usize = [&hubs[0], &hubs[2]]
            .iter()
            .map(|hub| log_lines(hub, &["removed from the shared store", &needle]))
            .sum();
        assert_eq!(lines, 1, "{account} was swept {lines} times");
    }
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}

/// Scans of the `tokens` table PostgreSQL counted (sequential and by index), after its
/// statistics of the last second are flushed.
async fn tokens_scans(sql: &tokio_postgres::Client) -> i64 {
    tokio::time::sleep(Duration::from_millis(1100)).await;
    sql.batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    sql.query_one(
        "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables \
         WHERE relname = 'tokens'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Review F10: anyone who reaches the HTTP port can present made-up `sat_…` tokens, and a
/// replica looks a token it does not know up in PostgreSQL (a scan of `tokens`) before
/// refusing it. A flood of 600 distinct made-up tokens (and 600 repeats of one) costs the
/// store a bounded number of scans (the guard's burst and rate, plus the replicas' own
/// refreshes), every one answered 401; a token issued on the other replica still works at
/// once afterwards.
#[tokio::test]
async fn a_flood_of_unknown_tokens_costs_the_store_a_bounded_number_of_lookups() {
    let server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let a = start_replica(&url, "hub-a").await;
    let b = start_replica(&url, "hub-b").await;
    let sql = server.connect_to(&server.superuser_url()).await.unwrap();

    let before = tokens_scans(&sql).await;
    let started = std::time::Instant::now();
    let api = format!("http://{}/api/v1/agents", b.hub.http_addr);
    let mut refused = 0;
    for batch in 0..12 {
        let calls = (0..100).map(|i| {
            // Half distinct, half the same one again (the negative cache's case).
            let token = if i % 2 == 0 {
                format!("sat_made-up-{batch}-{i}")
            } else {
                "sat_made-up-again".to_string()
            };
            let api = api.clone();
            async move { Call::new("GET", api).bearer(&token).send().await.unwrap() }
        });
        for response in futures::future::join_all(calls).await {
            assert_eq!(response.status, 401, "{}", response.body);
            refused += 1;
        }
    }
    let flood = started.elapsed();
    let scans = tokens_scans(&sql).await - before;
    // The guard: 20 at once and 20 a second; the refreshes: each replica reads the table
    // every sync period (2 s); slack for the flushes' timing.
    let bound = 20 + 20 * (flood.as_secs() as i64 + 3) + 2 * (flood.as_secs() as i64 / 2 + 3);
    eprintln!(
        "[F10] {refused} made-up tokens refused in {flood:?}: {scans} scans of tokens (bound {bound})"
    );
    assert_eq!(refused, 1200);
    assert!(
        scans <= bound,
        "{scans} scans of the tokens table for {refused} unknown tokens in {flood:?} (bound {bound})"
    );

    // A token issued on hub-a works on hub-b at once (its lookup is within the rate again).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let created = Call::new("POST", format!("http://{}/api/v1/tokens", a.hub.http_addr))
        .bearer(&a.admin)
        .json(&serde_json::json!({"name": "ci", "role": "reader"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status, 200, "{}", created.body);
    let token = created.json_or_null()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let agents = Call::new("GET", api).bearer(&token).send().await.unwrap();
    assert_eq!(agents.status, 200, "{}", agents.body);
    a.stop().await;
    b.stop().await;
}
