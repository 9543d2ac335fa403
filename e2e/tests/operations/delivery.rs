//! Delivery: an agent killed in flight, one client id submitted concurrently, a list larger than
//! one message, one account's slow operations beside another's.

use super::*;

/// Two replicas: the one running a slow delete (waiting on a finalizer) is stopped; the hub
/// sends the (idempotent) delete to the other replica, which finishes it. With no replica
/// left, the hub answers 503 noAgent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_in_flight_retries_on_the_other_replica_then_no_agent() -> anyhow::Result<()> {
    let mut s = Setup::new("failover", 2).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    s.configmaps()
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "slow", "finalizers": ["example.com/hold"]}}),
            )?,
        )
        .await?;
    let id = format!("failover-{:08x}", rand::random::<u32>());
    let (h, a, n, i) = (hub, account.clone(), ns.clone(), id.clone());
    let pending = tokio::spawn(async move {
        op(h, &a, json!({"id": i, "type": "delete", "kind": "ConfigMap", "namespace": n, "name": "slow", "wait": true, "timeoutSeconds": 50})).await
    });
    // Which replica runs it?
    let every = Duration::from_millis(50);
    let first = wait_for_within("the operation to show as running", WAIT, every, || async {
        let (code, state) = http(hub, "GET", &format!("/api/v1/operations/{id}"), None).await?;
        // (`replica` is empty until one is chosen.)
        let replica = state["replica"].as_str().unwrap_or_default();
        let running = code == 200 && state["state"] == "running" && !replica.is_empty();
        Ok(running.then(|| replica.to_string()))
    })
    .await?;
    // Let it reach the API server, then stop that replica.
    let cms = s.configmaps();
    until("the delete to be under way", || {
        let cms = cms.clone();
        async move { Ok(cms.get("slow").await?.metadata.deletion_timestamp.is_some()) }
    })
    .await?;
    let index = s
        .agents
        .iter()
        .position(|(r, _)| first.ends_with(&format!("/{r}")))
        .ok_or_else(|| anyhow::anyhow!("replica {first} unknown"))?;
    let (stopped, agent) = s.agents.remove(index);
    agent.stop().await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !pending.is_finished(),
        "the retried delete waits on the finalizer"
    );
    s.configmaps()
        .patch(
            "slow",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    let (code, r) = pending.await??;
    assert_eq!(code, 200, "{r:#}");
    assert_eq!(r["attempts"], 2, "{r:#}");
    assert!(
        !r["replica"]
            .as_str()
            .unwrap_or_default()
            .ends_with(&stopped),
        "{r:#}"
    );
    assert_eq!(r["deleted"][0], format!("ConfigMap/{ns}/slow"));
    // The same id again: the recorded result, not a second run.
    let (code, again) = op(hub, &account, json!({"id": id, "type": "delete", "kind": "ConfigMap", "namespace": ns, "name": "slow", "wait": true})).await?;
    assert_eq!(code, 200);
    assert_eq!(again["attempts"], 2);

    // No replica left: the operation waits for one up to its deadline, then 503 with a
    // clear message.
    for (_, agent) in s.agents.drain(..) {
        agent.stop().await?;
    }
    let waited = Instant::now();
    let r = expect(
        hub,
        &account,
        503,
        json!({"type": "get", "kind": "ConfigMap", "namespace": ns, "name": "x", "timeoutSeconds": 2}),
    )
    .await?;
    assert!(
        waited.elapsed() >= Duration::from_secs(2),
        "answered before its deadline"
    );
    assert_eq!(r["state"], "noAgent");
    assert!(
        r["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("no agent connected for account {account}")),
        "{r:#}"
    );

    // Submitted while no agent is connected: it runs once a replica connects within its
    // deadline (a rolling restart of a one-replica agent), as Armory's retries would.
    let (h, a, n) = (hub, account.clone(), ns.clone());
    let pending = tokio::spawn(async move {
        op(h, &a, json!({"type": "create", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after-restart", "namespace": n}}, "timeoutSeconds": 60})).await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!pending.is_finished(), "answered with no agent connected");
    let replica = "failover-back".to_string();
    let config = s.dir.join("agent.yaml");
    s.agents.push((
        replica.clone(),
        fixtures::start_agent_replica(&config, &replica).await?,
    ));
    let (code, r) = pending.await??;
    assert_eq!(code, 201, "{r:#}");
    assert_eq!(r["attempts"], 1, "{r:#}");
    let created = s.configmaps().get("after-restart").await?;
    assert_eq!(
        r["objects"][0]["metadata"]["uid"].as_str(),
        created.metadata.uid.as_deref()
    );
    s.stop().await
}

/// Concurrent submissions of one client id (Armory retrying a stage, two hub clients): the
/// operation runs once. Proven from the API server's side with a generateName create, which
/// makes a new object each time it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submits_of_one_client_id_execute_once() -> anyhow::Result<()> {
    let s = Setup::new("once", 2).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    let id = format!("once-{:08x}", rand::random::<u32>());
    let body = json!({"id": id, "type": "create", "manifest": {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"generateName": "once-", "namespace": ns, "labels": {"test": "once"}},
    }});
    let mut submits = Vec::new();
    for _ in 0..8 {
        let (a, b) = (account.clone(), body.clone());
        submits.push(tokio::spawn(async move { op(hub, &a, b).await }));
    }
    let mut uids = Vec::new();
    for submit in submits {
        let (code, r) = submit.await??;
        assert_eq!(code, 201, "{r:#}");
        uids.push(
            r["objects"][0]["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    let made = s
        .configmaps()
        .list(&ListParams::default().labels("test=once"))
        .await?;
    assert_eq!(
        made.items.len(),
        1,
        "the create ran {} times",
        made.items.len()
    );
    let uid = made.items[0].metadata.uid.clone().unwrap_or_default();
    assert!(uids.iter().all(|u| *u == uid), "{uids:?} vs {uid}");
    s.stop().await
}

/// A list larger than one gRPC message (the hub decodes at most --max-object-bytes + 1 MiB,
/// 3 MiB by default): the agent sends it in parts, it arrives whole, and the agent's stream,
/// with its other account, goes on. Before, the result ended the stream, and the hub resent
/// the list to the next replica, ending that one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_larger_than_one_message_arrives_whole_and_the_stream_survives() -> anyhow::Result<()>
{
    let s = Setup::with_accounts("large", 1, 2).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    let other = s.others[0].clone();
    let blob = "x".repeat(100_000);
    for i in 0..45 {
        s.configmaps()
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": format!("big-{i:02}"), "labels": {"size": "big"}}, "data": {"blob": blob}}))?,
            )
            .await?;
    }
    let (_, before) = http(hub, "GET", "/api/v1/agents", None).await?;
    let r = expect(
        hub,
        &account,
        200,
        json!({"type": "list", "kind": "ConfigMap", "namespace": ns, "labelSelector": "size=big", "timeoutSeconds": 120}),
    )
    .await?;
    let objects = r["objects"].as_array().map(Vec::len).unwrap_or(0);
    assert_eq!(objects, 45);
    // A page: the continue token comes back, and takes the next page.
    let r = expect(
        hub,
        &other,
        200,
        json!({"type": "list", "kind": "ConfigMap", "namespace": ns, "labelSelector": "size=big", "limit": 40}),
    )
    .await?;
    assert_eq!(r["objects"].as_array().map(Vec::len), Some(40));
    let token = r["continue"].as_str().unwrap_or_default().to_string();
    assert!(!token.is_empty(), "no continue token: {}", r["status"]);
    let r = expect(
        hub,
        &other,
        200,
        json!({"type": "list", "kind": "ConfigMap", "namespace": ns, "labelSelector": "size=big", "limit": 40, "continue": token}),
    )
    .await?;
    assert_eq!(r["objects"].as_array().map(Vec::len), Some(5));
    assert!(r.get("continue").is_none(), "{}", r["continue"]);
    // The other way: an apply whose manifests (5 MB) exceed gRPC's default message size of
    // 4 MiB, which the agent used to refuse, ending its stream.
    let manifests: Vec<Value> = (0..5)
        .map(|i| {
            configmap(
                &ns,
                &format!("wide-{i}"),
                json!({"blob": "y".repeat(1_000_000)}),
            )
        })
        .collect();
    // (Not `expect`: its message would quote the 5 MB request.)
    let (code, r) = op(
        hub,
        &other,
        json!({"type": "apply", "manifests": manifests, "timeoutSeconds": 120}),
    )
    .await?;
    assert_eq!(code, 200, "{} {}", r["status"], r["message"]);
    assert_eq!(
        r["objects"].as_array().map(Vec::len),
        Some(5),
        "{}",
        r["status"]
    );
    // The same stream all along: neither account reconnected.
    let (_, after) = http(hub, "GET", "/api/v1/agents", None).await?;
    assert_eq!(before, after);
    assert_eq!(before.as_array().map(Vec::len), Some(1), "{before:#}");
    s.stop().await
}

/// Review R16: the operations an agent runs at once are limited per account
/// (`tasks.operationsPerAccount`, 16 by default), not per agent process. Sixteen `delete`
/// with `wait` on objects a finalizer holds fill one account's slots; an operation of the
/// agent's other account still completes at once, while a seventeenth of the first account
/// waits for a slot (and, its deadline passing there, never reaches the API server). Before,
/// the sixteen held every slot of the process, and the other account's operation timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_accounts_slow_operations_do_not_starve_another_account() -> anyhow::Result<()> {
    const SLOTS: usize = scale_agent_crds::agent_config::OPERATIONS_PER_ACCOUNT as usize;
    let s = Setup::with_accounts("starve", 1, 2).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    let other = s.others[0].clone();
    let held = |i: usize| format!("held-{i:02}");
    for i in 0..=SLOTS {
        s.configmaps()
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": held(i), "finalizers": ["example.com/hold"]}}),
                )?,
            )
            .await?;
    }
    let mut pending = Vec::new();
    for i in 0..SLOTS {
        let (a, n, name) = (account.clone(), ns.clone(), held(i));
        pending.push(tokio::spawn(async move {
            op(hub, &a, json!({"type": "delete", "kind": "ConfigMap", "namespace": n, "name": name, "wait": true, "timeoutSeconds": 120})).await
        }));
    }
    // Every slot of the account is held: each delete reached the API server and waits.
    let cms = s.configmaps();
    until("a deletionTimestamp on every held configmap", || {
        let cms = cms.clone();
        async move {
            let items = cms.list(&ListParams::default()).await?.items;
            Ok(items
                .iter()
                .filter(|cm| cm.metadata.deletion_timestamp.is_some())
                .count()
                == SLOTS)
        }
    })
    .await?;

    // The other account's operation runs at once (before: 504 after its 20 s).
    let started = Instant::now();
    let (code, r) = op(
        hub,
        &other,
        json!({"type": "get", "kind": "ConfigMap", "namespace": ns, "name": held(SLOTS), "timeoutSeconds": 20}),
    )
    .await?;
    assert_eq!(code, 200, "{r:#}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    // The first account is at its limit: one more waits for a slot until its deadline.
    let r = expect(
        hub,
        &account,
        504,
        json!({"type": "delete", "kind": "ConfigMap", "namespace": ns, "name": held(SLOTS), "wait": true, "timeoutSeconds": 3}),
    )
    .await?;
    assert_eq!(r["executed"], false, "{r:#}");
    assert!(
        s.configmaps()
            .get(&held(SLOTS))
            .await?
            .metadata
            .deletion_timestamp
            .is_none(),
        "the seventeenth delete never reached the API server"
    );

    for i in 0..=SLOTS {
        s.configmaps()
            .patch(
                &held(i),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await?;
    }
    for pending in pending {
        let (code, r) = pending.await??;
        assert_eq!(code, 200, "{r:#}");
    }
    s.stop().await
}
