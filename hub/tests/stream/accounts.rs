//! Accounts: a restart keeps objects, resume points and bindings; account states follow the
//! agents; refused credentials; the grace period removes accounts without agents; an
//! account an agent cannot serve is failed with its reason.

use super::*;

#[tokio::test]
async fn restart_keeps_objects_resume_points_and_bindings() {
    let pki = Pki::new();
    let dir = data_dir("restart");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://one:6443").await;
    a.snapshot("prod", &[("one", "5"), ("two", "6")], "10")
        .await;
    a.send(cm_event("prod", EventType::Applied, "three", "12", "web"))
        .await;
    a.send(Msg::Bookmark(pb::Bookmark {
        account: "prod".into(),
        kind: Some(configmaps()),
        resource_version: "15".into(),
        watch_namespace: String::new(),
    }))
    .await;
    a.synced().await;
    hub.shutdown().await.unwrap();
    drop(a);

    let hub = start_hub(&pki, &dir, |_| {}).await;
    // The cache is served before any agent is back.
    assert_eq!(
        object_names(&hub, "prod/objects").await,
        ["one", "three", "two"]
    );
    let (_, acc) = get_json(&api(&hub), "/api/v1/accounts/prod").await;
    assert_eq!(acc["state"], "disconnected");
    assert!(acc["disconnectedSince"].is_string());
    // The binding survived.
    let mut b = agent(&hub, &pki, "agent-b.test", "pod-1").await;
    assert_eq!(
        role(&b.register("prod", "https://two:6443").await),
        Role::Rejected
    );
    // The same cluster resumes where it left off: no relist.
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    let assignment = a.register("prod", "https://one:6443").await;
    assert_eq!(role(&assignment), Role::Streaming);
    assert_eq!(assignment.resume_points.len(), 1);
    assert_eq!(assignment.resume_points[0].resource_version, "15");
    assert_eq!(assignment.resume_points[0].watch_namespace, "");
    let (_, metrics) = get(&api(&hub), "/metrics").await;
    assert!(
        metrics.contains("scale_agent_hub_resumes_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("scale_agent_hub_relists_total 0"),
        "{metrics}"
    );

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `(accountState, stateReason, stateSince)` of the account `prod` in the REST API.
async fn prod_state(addr: &Api) -> (String, String, String) {
    let (code, acc) = get_json(addr, "/api/v1/accounts/prod").await;
    assert_eq!(code, 200, "{acc}");
    let field = |name: &str| acc[name].as_str().unwrap_or_default().to_string();
    (
        field("accountState"),
        field("stateReason"),
        field("stateSince"),
    )
}

/// `agent` sends `failure`, which makes account prod FAILED, then its stream ends: prod is
/// INACTIVE (no agent), not FAILED.
async fn failed_then_inactive(addr: &Api, mut agent: FakeAgent, failure: Msg) {
    agent.send(failure).await;
    wait_for("FAILED again", async || {
        prod_state(addr).await.0 == "FAILED"
    })
    .await;
    drop(agent);
    wait_for("INACTIVE", async || prod_state(addr).await.0 == "INACTIVE").await;
}

/// The hub's metrics count one account FAILED, and `agent` hears it FAILED with `words` in
/// the reason.
async fn failed_in_metrics_and_on_the_stream(addr: &Api, agent: &mut FakeAgent, words: &str) {
    let (_, metrics) = get(addr, "/metrics").await;
    assert!(
        metrics.contains("scale_agent_hub_accounts_by_state{state=\"FAILED\"} 1"),
        "{metrics}"
    );
    wait_for("the agent to hear FAILED", async || {
        let _ = agent.pump_ready();
        agent
            .states
            .iter()
            .any(|s| s.state == pb::account_state::State::Failed as i32 && s.reason.contains(words))
    })
    .await;
}

/// The hub's account states: ACTIVE while streamed, INACTIVE within the grace period,
/// ORPHANED after it, FAILED while only a rejected claimant is around, and ACTIVE again when
/// the agent returns; in the API, in metrics and on the agents' streams.
#[tokio::test]
async fn account_states_follow_the_agents() {
    let pki = Pki::new();
    let dir = data_dir("states");
    let hub = start_hub(&pki, &dir, |c| {
        c.streams.grace_period = Duration::from_millis(1500)
    })
    .await;
    let addr = api(&hub);

    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    assert_eq!(
        role(&a.register("prod", "https://one:6443").await),
        Role::Streaming
    );
    wait_for("the agent to hear ACTIVE", async || {
        let _ = a.pump_ready();
        a.states.iter().any(|s| {
            s.account == "prod"
                && s.state == pb::account_state::State::Active as i32
                && s.reason.contains("agent-a.test/pod-1")
                && s.since_unix_millis > 0
        })
    })
    .await;
    let (state, reason, since) = prod_state(&addr).await;
    assert_eq!(state, "ACTIVE");
    assert!(reason.contains("agent-a.test/pod-1"), "{reason}");
    assert!(since.ends_with('Z'), "{since}");

    // Replicas of one identity hear who of them is connected.
    let a2 = agent(&hub, &pki, "agent-a.test", "pod-0").await;
    wait_for("both replicas to be announced", async || {
        let _ = a.pump_ready();
        a.replicas
            .as_ref()
            .is_some_and(|r| r.replicas == ["pod-0", "pod-1"])
    })
    .await;
    drop(a2);
    wait_for("the replica that left to be announced", async || {
        let _ = a.pump_ready();
        a.replicas.as_ref().is_some_and(|r| r.replicas == ["pod-1"])
    })
    .await;

    drop(a);
    wait_for("INACTIVE", async || prod_state(&addr).await.0 == "INACTIVE").await;
    assert!(prod_state(&addr).await.1.contains("grace period"));
    wait_for("ORPHANED", async || prod_state(&addr).await.0 == "ORPHANED").await;
    let (_, reason, _) = prod_state(&addr).await;
    assert!(reason.contains("agent-a.test"), "{reason}");
    let (_, metrics) = get(&addr, "/metrics").await;
    assert!(
        metrics.contains("scale_agent_hub_accounts_by_state{state=\"ORPHANED\"} 1"),
        "{metrics}"
    );
    for state in ["ACTIVE", "INACTIVE", "ORPHANED"] {
        assert!(
            metrics.contains(&format!(
                "scale_agent_hub_account_transitions_total{{state=\"{state}\"}} 1"
            )),
            "{state} in {metrics}"
        );
    }

    // Another cluster claims the name: FAILED while nobody streams it, and the claimant
    // hears why.
    let mut b = agent(&hub, &pki, "agent-b.test", "pod-1").await;
    assert_eq!(
        role(&b.register("prod", "https://two:6443").await),
        Role::Rejected
    );
    wait_for("FAILED", async || prod_state(&addr).await.0 == "FAILED").await;
    assert!(prod_state(&addr).await.1.contains("agent-b.test/pod-1"));
    wait_for("the claimant to hear FAILED", async || {
        let _ = b.pump_ready();
        b.states.iter().any(|s| {
            s.state == pb::account_state::State::Failed as i32
                && s.reason
                    .contains("bound to agent identity \"agent-a.test\"")
        })
    })
    .await;
    drop(b);
    wait_for("ORPHANED again", async || {
        prod_state(&addr).await.0 == "ORPHANED"
    })
    .await;

    // The agent returns.
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-2").await;
    assert_eq!(
        role(&a.register("prod", "https://one:6443").await),
        Role::Streaming
    );
    wait_for("ACTIVE again", async || {
        prod_state(&addr).await.0 == "ACTIVE"
    })
    .await;
    assert!(prod_state(&addr).await.1.contains("agent-a.test/pod-2"));
    wait_for("the agent to hear ACTIVE again", async || {
        let _ = a.pump_ready();
        a.states
            .iter()
            .any(|s| s.state == pb::account_state::State::Active as i32)
    })
    .await;
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// An account whose API server refuses its credentials (a kind FAILING with 401, as the agent
/// reports it) is FAILED with the API server's words while its agent stays connected, and
/// ACTIVE again once a kind is watched; in the API, in metrics and on the agent's stream.
/// Other failures (a kind forbidden, a 500) leave it ACTIVE.
#[tokio::test]
async fn an_account_whose_credentials_are_refused_is_failed_until_it_streams_again() {
    let pki = Pki::new();
    let dir = data_dir("credentials");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let addr = api(&hub);
    let status = |state: KindState, message: &str| {
        Msg::KindStatus(pb::KindStatus {
            account: "prod".into(),
            kind: Some(configmaps()),
            state: state as i32,
            message: message.into(),
            namespaces: vec![],
        })
    };
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    assert_eq!(
        role(&a.register("prod", "https://one:6443").await),
        Role::Streaming
    );
    a.send(status(KindState::Watching, "")).await;
    a.send(status(
        KindState::Failing,
        "500 InternalError: etcd timeout",
    ))
    .await;
    a.send(status(KindState::Forbidden, "configmaps is forbidden"))
        .await;
    a.synced().await;
    assert_eq!(prod_state(&addr).await.0, "ACTIVE");

    a.send(status(KindState::Failing, "401 Unauthorized: Unauthorized"))
        .await;
    wait_for("FAILED", async || prod_state(&addr).await.0 == "FAILED").await;
    let (_, reason, _) = prod_state(&addr).await;
    assert!(
        reason.contains("refuses the account's credentials")
            && reason.contains("agent-a.test/pod-1")
            && reason.contains("401 Unauthorized"),
        "{reason}"
    );
    failed_in_metrics_and_on_the_stream(&addr, &mut a, "refuses the account's credentials").await;

    // The credentials work again: a kind is watched.
    a.send(status(KindState::Watching, "")).await;
    wait_for("ACTIVE again", async || {
        prod_state(&addr).await.0 == "ACTIVE"
    })
    .await;
    wait_for("the agent to hear ACTIVE again", async || {
        let _ = a.pump_ready();
        a.states
            .back()
            .is_some_and(|s| s.state == pb::account_state::State::Active as i32)
    })
    .await;

    // Refused again, then the stream ends: INACTIVE (no agent), not FAILED.
    failed_then_inactive(
        &addr,
        a,
        status(KindState::Failing, "401 Unauthorized: Unauthorized"),
    )
    .await;
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn grace_period_removes_accounts_without_agents() {
    let pki = Pki::new();
    let dir = data_dir("grace");
    let hub = start_hub(&pki, &dir, |c| {
        c.streams.grace_period = Duration::from_millis(1500)
    })
    .await;
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://one:6443").await;
    a.snapshot("prod", &[("one", "5")], "10").await;
    a.synced().await;
    drop(a);
    // Reconnecting within the grace period keeps the account and its cache.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    let assignment = a.register("prod", "https://one:6443").await;
    assert_eq!(assignment.resume_points[0].resource_version, "10");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(object_names(&hub, "prod/objects").await, ["one"]);

    drop(a);
    let addr = api(&hub);
    // The account is ORPHANED: no cache, no replicas, only its binding is left.
    wait_for("the account to be orphaned", async || {
        get_json(&addr, "/api/v1/accounts/prod").await.1["accountState"] == "ORPHANED"
    })
    .await;
    let (_, list) = get_json(&addr, "/api/v1/accounts").await;
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["objects"], 0, "{list}");
    assert_eq!(list[0]["streaming"], serde_json::Value::Null, "{list}");
    // Gone from the store too; the name's binding to its identity stays (only an admin
    // moves it), so another identity may not take it over, while the bound identity may
    // serve it from another cluster.
    hub.shutdown().await.unwrap();
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let restarted = api(&hub);
    wait_for("the account to be orphaned after a restart", async || {
        let (code, acc) = get_json(&restarted, "/api/v1/accounts/prod").await;
        code == 200 && acc["accountState"] == "ORPHANED" && acc["objects"] == 0
    })
    .await;
    let mut b = agent(&hub, &pki, "agent-b.test", "pod-1").await;
    let refused = b.register("prod", "https://two:6443").await;
    assert_eq!(role(&refused), Role::Rejected);
    assert!(
        refused
            .reason
            .contains("bound to agent identity \"agent-a.test\"")
            && refused
                .reason
                .contains("scale-agent-hub account rebind prod --identity agent-b.test"),
        "{}",
        refused.reason
    );
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    let assignment = a.register("prod", "https://two:6443").await;
    assert_eq!(role(&assignment), Role::Streaming);
    assert!(assignment.resume_points.is_empty());
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// An account an agent cannot serve at all (AccountUnavailable: its kubeconfig does not load,
/// its API server refuses the first request) is FAILED with the agent's words while nobody
/// streams it, in the API, in metrics and on the agent's stream; ACTIVE once the agent
/// registers it. The hub says it reads the message (HubCapabilities after Welcome), and
/// ignores reports on accounts bound to another identity.
#[tokio::test]
async fn an_account_an_agent_cannot_serve_is_failed_with_its_reason() {
    let pki = Pki::new();
    let dir = data_dir("unavailable");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let addr = api(&hub);
    let unavailable = |account: &str, reason: &str| {
        Msg::AccountUnavailable(pb::AccountUnavailable {
            account: account.into(),
            reason: reason.into(),
        })
    };
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    wait_for("HubCapabilities", async || {
        let _ = a.pump_ready();
        a.capabilities
            .iter()
            .any(|c| c == scale_agent_proto::ACCOUNT_UNAVAILABLE_CAPABILITY)
    })
    .await;
    a.send(unavailable(
        "prod",
        "cannot read the kubeconfig /k: No such file or directory",
    ))
    .await;
    a.synced().await;
    let (state, reason, _) = prod_state(&addr).await;
    assert_eq!(state, "FAILED");
    assert!(
        reason.contains("agent-a.test/pod-1") && reason.contains("/k: No such file"),
        "{reason}"
    );
    let (_, list) = get_json(&addr, "/api/v1/accounts").await;
    assert_eq!(list[0]["name"], "prod", "{list}");
    assert_eq!(list[0]["accountState"], "FAILED", "{list}");
    failed_in_metrics_and_on_the_stream(&addr, &mut a, "cannot serve it").await;

    // The agent can serve it now: it registers, ACTIVE.
    assert_eq!(
        role(&a.register("prod", "https://one:6443").await),
        Role::Streaming
    );
    wait_for("ACTIVE", async || prod_state(&addr).await.0 == "ACTIVE").await;

    // Another identity cannot mark an account bound to agent-a FAILED.
    let mut b = agent(&hub, &pki, "agent-b.test", "pod-1").await;
    b.send(unavailable("prod", "401 Unauthorized")).await;
    b.synced().await;
    assert_eq!(prod_state(&addr).await.0, "ACTIVE");
    // ...nor does agent-a's own stream ending keep it FAILED: INACTIVE, as before.
    failed_then_inactive(
        &addr,
        a,
        unavailable("prod", "401 Unauthorized: Unauthorized"),
    )
    .await;
    drop(b);
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
