//! Stream tests: the hub in-process on 127.0.0.1, fake agents built on the generated client,
//! over real mutual TLS with certificates generated at test time.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use rcgen::ExtendedKeyUsagePurpose;
use scale_agent_hub::{Config, GrpcSecurity, RunningHub, identity::AllowRule};
use scale_agent_proto::v1::{
    self as pb, account_assignment::Role, agent_hub_client::AgentHubClient,
    agent_message::Kind as Msg, hub_message::Kind as Out, kind_status::State as KindState,
    object_event::Type as EventType,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, transport::Endpoint};

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn snapshot_deltas_and_http_api() {
    let pki = Pki::new();
    let dir = data_dir("api");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    let welcome = a.welcome.clone().unwrap();
    assert_eq!(welcome.identity, "agent-a.test");
    assert_eq!(welcome.heartbeat_period_seconds, 15);
    assert_eq!(welcome.max_unacked, 1000);
    assert_eq!(welcome.max_object_bytes, 2 * 1024 * 1024);
    assert_eq!(a.acked, 0);
    a.synced().await; // Hello is acknowledged too.

    let assignment = a.register("prod", "https://10.0.0.1:6443").await;
    assert_eq!(role(&assignment), Role::Streaming);
    assert!(assignment.resume_points.is_empty());

    a.send(Msg::KindStatus(pb::KindStatus {
        account: "prod".into(),
        kind: Some(configmaps()),
        state: KindState::Watching as i32,
        message: String::new(),
        namespaces: vec![],
    }))
    .await;
    a.send(Msg::KindStatus(pb::KindStatus {
        account: "prod".into(),
        kind: Some(pb::Kind {
            group: String::new(),
            version: "v1".into(),
            kind: "Secret".into(),
            plural: "secrets".into(),
            namespaced: true,
        }),
        state: KindState::Forbidden as i32,
        message: "secrets is forbidden: User cannot list".into(),
        namespaces: vec![],
    }))
    .await;
    a.snapshot("prod", &[("one", "5"), ("two", "6"), ("three", "7")], "10")
        .await;
    a.synced().await;
    // Ack comes after apply: the objects are visible now.
    assert_eq!(
        object_names(&hub, "prod/objects?kind=configmaps").await,
        ["one", "three", "two"]
    );

    // Deltas: modify, add, delete.
    a.send(cm_event("prod", EventType::Applied, "one", "11", "db"))
        .await;
    a.send(cm_event("prod", EventType::Applied, "four", "12", "web"))
        .await;
    a.send(cm_event("prod", EventType::Deleted, "two", "13", "web"))
        .await;
    a.synced().await;
    assert_eq!(
        object_names(&hub, "prod/objects?kind=ConfigMap").await,
        ["four", "one", "three"]
    );
    assert_eq!(
        object_names(
            &hub,
            "prod/objects?kind=core/configmaps&labelSelector=app%3Dweb"
        )
        .await,
        ["four", "three"]
    );
    assert_eq!(
        object_names(
            &hub,
            "prod/objects?labelSelector=app!%3Dweb,app&namespace=default"
        )
        .await,
        ["one"]
    );
    assert!(
        object_names(&hub, "prod/objects?namespace=other")
            .await
            .is_empty()
    );

    // Idempotent replay: old versions of "one" and of the deleted "two" change nothing.
    a.send(cm_event("prod", EventType::Applied, "one", "5", "web"))
        .await;
    a.send(cm_event("prod", EventType::Applied, "two", "6", "web"))
        .await;
    a.synced().await;
    let (_, v) = get_json(&api(&hub), "/api/v1/accounts/prod/objects?kind=configmaps").await;
    let one = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["metadata"]["name"] == "one")
        .unwrap();
    assert_eq!(one["metadata"]["resourceVersion"], "11");
    assert_eq!(
        object_names(&hub, "prod/objects").await,
        ["four", "one", "three"]
    );

    // Bookmark then a new snapshot prunes what was not re-sent.
    a.send(Msg::Bookmark(pb::Bookmark {
        account: "prod".into(),
        kind: Some(configmaps()),
        resource_version: "20".into(),
        watch_namespace: String::new(),
    }))
    .await;
    a.snapshot("prod", &[("three", "7"), ("five", "25")], "30")
        .await;
    a.synced().await;
    assert_eq!(object_names(&hub, "prod/objects").await, ["five", "three"]);

    // Accounts and agents.
    let (status, acc) = get_json(&api(&hub), "/api/v1/accounts/prod").await;
    assert_eq!(status, 200);
    assert_eq!(acc["state"], "connected");
    assert_eq!(acc["cluster"]["apiServerHost"], "https://10.0.0.1:6443");
    assert_eq!(acc["cluster"]["kubernetesVersion"], "v1.37.1");
    assert_eq!(acc["streaming"]["identity"], "agent-a.test");
    assert_eq!(acc["streaming"]["replica"], "pod-1");
    assert_eq!(acc["objectCounts"]["ConfigMap"], 2);
    assert_eq!(acc["properties"]["kinds"][0], "ConfigMap");
    let kinds = acc["kinds"].as_array().unwrap();
    let secret = kinds.iter().find(|k| k["kind"] == "Secret").unwrap();
    assert_eq!(secret["state"], "FORBIDDEN");
    assert_eq!(secret["message"], "secrets is forbidden: User cannot list");
    let cm = kinds.iter().find(|k| k["kind"] == "ConfigMap").unwrap();
    assert_eq!(cm["state"], "WATCHING");
    assert_eq!(cm["resumePoints"][0]["resourceVersion"], "30");
    let (_, list) = get_json(&api(&hub), "/api/v1/accounts").await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    let (_, agents) = get_json(&api(&hub), "/api/v1/agents").await;
    assert_eq!(agents[0]["identity"], "agent-a.test");
    assert_eq!(agents[0]["accounts"][0]["name"], "prod");
    assert_eq!(agents[0]["accounts"][0]["role"], "STREAMING");
    assert!(agents[0]["connectedSince"].as_str().unwrap().ends_with('Z'));

    // Errors of the API.
    assert_eq!(get(&api(&hub), "/api/v1/accounts/nope").await.0, 404);
    let (status, body) = get(&api(&hub), "/api/v1/accounts/prod/objects?kind=pods").await;
    assert_eq!(status, 404);
    assert!(body.contains("ConfigMap"), "{body}");
    assert_eq!(
        get(
            &api(&hub),
            "/api/v1/accounts/prod/objects?labelSelector=a%20b"
        )
        .await
        .0,
        400
    );

    // Health and metrics.
    assert_eq!(get(&api(&hub), "/healthz").await.0, 200);
    assert_eq!(get(&api(&hub), "/readyz").await.0, 200);
    let (status, metrics) = get(&api(&hub), "/metrics").await;
    assert_eq!(status, 200);
    for line in [
        "scale_agent_hub_connected_agents 1",
        "scale_agent_hub_accounts 1",
        "scale_agent_hub_objects_cached 2",
        "scale_agent_hub_relists_total 2",
        "scale_agent_hub_events_received_total{type=\"object\"}",
        "scale_agent_hub_bytes_received_total",
        "scale_agent_hub_resumes_total 0",
    ] {
        assert!(metrics.contains(line), "{line} missing in\n{metrics}");
    }

    // An oversized object arrives truncated: the hub keeps its metadata.
    let Msg::Object(mut ev) = cm_event("prod", EventType::Applied, "big", "40", "web") else {
        unreachable!()
    };
    ev.truncated = true;
    ev.object_json.clear();
    a.send(Msg::Object(ev)).await;
    a.synced().await;
    let (_, v) = get_json(&api(&hub), "/api/v1/accounts/prod/objects?kind=configmaps").await;
    let big = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["metadata"]["name"] == "big")
        .unwrap()
        .clone();
    assert_eq!(big["metadata"]["resourceVersion"], "40");
    assert_eq!(
        big["metadata"]["annotations"]["scaleagent.dev/truncated"],
        "true"
    );
    assert_eq!(big["kind"], "ConfigMap");

    // A kind no longer watched: its objects and resume points go.
    a.send(Msg::KindStatus(pb::KindStatus {
        account: "prod".into(),
        kind: Some(configmaps()),
        state: KindState::Stopped as i32,
        message: String::new(),
        namespaces: vec![],
    }))
    .await;
    a.synced().await;
    assert!(
        object_names(&hub, "prod/objects?kind=configmaps")
            .await
            .is_empty()
    );
    let (_, acc) = get_json(&api(&hub), "/api/v1/accounts/prod").await;
    let cm = acc["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == "ConfigMap")
        .unwrap()
        .clone();
    assert_eq!(cm["state"], "STOPPED");
    assert_eq!(cm["resumePoints"], serde_json::json!([]));

    hub.shutdown().await.unwrap();
    // The agent is told the hub is going away.
    assert_eq!(a.error().await.code(), Code::Unavailable);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn standby_is_promoted_with_resume_points() {
    let pki = Pki::new();
    let dir = data_dir("ha");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    assert_eq!(
        role(&a.register("prod", "https://h:6443").await),
        Role::Streaming
    );
    a.snapshot("prod", &[("one", "5")], "100").await;
    a.synced().await;

    // Another replica of the same agent: STANDBY.
    let mut b = agent(&hub, &pki, "agent-a.test", "pod-2").await;
    assert_eq!(
        role(&b.register("prod", "https://h:6443").await),
        Role::Standby
    );
    // A standby may not stream.
    let (_, acc) = get_json(&api(&hub), "/api/v1/accounts/prod").await;
    assert_eq!(acc["standbys"][0]["replica"], "pod-2");

    // a starts a new snapshot but never ends it: it is discarded.
    a.send(Msg::SnapshotBegin(pb::SnapshotBegin {
        account: "prod".into(),
        kind: Some(configmaps()),
        watch_namespace: String::new(),
    }))
    .await;
    a.send(cm_event("prod", EventType::Applied, "ghost", "150", "web"))
        .await;
    a.synced().await;
    assert_eq!(object_names(&hub, "prod/objects").await, ["one"]);

    // The streaming replica goes away: b is promoted with the hub's resume points.
    drop(a);
    let promoted = b.assignment().await;
    assert_eq!(role(&promoted), Role::Streaming);
    assert_eq!(promoted.resume_points.len(), 1);
    assert_eq!(promoted.resume_points[0].resource_version, "100");
    assert_eq!(
        promoted.resume_points[0].kind.as_ref().unwrap().plural,
        "configmaps"
    );
    // b streams a delta from there.
    b.send(cm_event("prod", EventType::Applied, "two", "101", "web"))
        .await;
    b.synced().await;
    assert_eq!(object_names(&hub, "prod/objects").await, ["one", "two"]);
    let (_, acc) = get_json(&api(&hub), "/api/v1/accounts/prod").await;
    assert_eq!(acc["streaming"]["replica"], "pod-2");
    assert_eq!(acc["standbys"].as_array().unwrap().len(), 0);
    let (_, metrics) = get(&api(&hub), "/metrics").await;
    assert!(
        metrics.contains("scale_agent_hub_resumes_total 1"),
        "{metrics}"
    );

    // A newer stream from the same identity and replica, presenting the session token of
    // the live stream, replaces it.
    let mut b2 = resume_agent(&hub, &pki, "agent-a.test", "pod-2", &b.session_token())
        .await
        .unwrap();
    let status = b.error().await;
    assert_eq!(status.code(), Code::Aborted);
    assert!(
        status.message().contains("replaced"),
        "{}",
        status.message()
    );
    let again = b2.register("prod", "https://h:6443").await;
    assert_eq!(role(&again), Role::Streaming);
    assert_eq!(again.resume_points[0].resource_version, "101");

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn other_cluster_and_disallowed_identity_are_rejected() {
    let pki = Pki::new();
    let dir = data_dir("reject");
    let hub = start_hub(&pki, &dir, |c| {
        c.agents.allow = vec![
            AllowRule::parse("agent-a.test=prod*").unwrap(),
            AllowRule::parse("agent-b.test=*").unwrap(),
            AllowRule::parse("agent-c.test=dev").unwrap(),
        ];
    })
    .await;
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    assert_eq!(
        role(&a.register("prod", "https://one:6443").await),
        Role::Streaming
    );
    a.snapshot("prod", &[("one", "5")], "10").await;
    a.synced().await;

    // Another replica of the same identity claiming another cluster for the account.
    let mut b = agent(&hub, &pki, "agent-a.test", "pod-2").await;
    let rejected = b.register("prod", "https://two:6443").await;
    assert_eq!(role(&rejected), Role::Rejected);
    assert!(
        rejected.reason.contains("https://one:6443"),
        "{}",
        rejected.reason
    );
    assert!(
        rejected.reason.contains("https://two:6443"),
        "{}",
        rejected.reason
    );

    let mut c = agent(&hub, &pki, "agent-c.test", "pod-1").await;
    let rejected = c.register("prod-2", "https://three:6443").await;
    assert_eq!(role(&rejected), Role::Rejected);
    assert!(rejected.reason.contains("--allow"), "{}", rejected.reason);
    assert_eq!(
        role(&c.register("dev", "https://three:6443").await),
        Role::Streaming
    );

    // The rejected agent cannot write into the account anyway.
    b.send(cm_event("prod", EventType::Deleted, "one", "11", "web"))
        .await;
    let status = b.error().await;
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("\"prod\""),
        "{}",
        status.message()
    );
    assert_eq!(object_names(&hub, "prod/objects").await, ["one"]);
    let (_, acc) = get_json(&api(&hub), "/api/v1/accounts/prod").await;
    assert_eq!(acc["cluster"]["apiServerHost"], "https://one:6443");

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn clients_without_a_trusted_certificate_cannot_connect() {
    let pki = Pki::new();
    let dir = data_dir("untrusted");
    let hub = start_hub(&pki, &dir, |_| {}).await;

    async fn try_hello(hub: &RunningHub, ca_pem: &str, client: Option<(String, String)>) -> bool {
        let Ok(mut a) = open_stream(hub, ca_pem, client).await else {
            return false;
        };
        a.send(Msg::Hello(pb::Hello::default())).await;
        while a.welcome.is_none() {
            if a.pump().await.is_err() {
                return false;
            }
        }
        true
    }

    assert!(!try_hello(&hub, &pki.ca_pem, None).await);
    let other = ca("another-ca");
    let foreign = leaf(
        &other,
        &["agent-x.test"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    assert!(!try_hello(&hub, &pki.ca_pem, Some(foreign)).await);
    // And a proper one can.
    assert!(try_hello(&hub, &pki.ca_pem, Some(pki.client("agent-a.test"))).await);

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

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

#[tokio::test]
async fn malformed_messages_end_only_the_offending_stream() {
    let pki = Pki::new();
    let dir = data_dir("malformed");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let mut good = agent(&hub, &pki, "agent-good.test", "pod-1").await;
    good.register("prod", "https://one:6443").await;
    good.snapshot("prod", &[("one", "5")], "10").await;
    good.synced().await;

    // First message not Hello.
    let mut bad = open_stream(&hub, &pki.ca_pem, Some(pki.client("agent-bad.test")))
        .await
        .unwrap();
    bad.send(Msg::Heartbeat(pb::Heartbeat::default())).await;
    let status = bad.error().await;
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("must be Hello"),
        "{}",
        status.message()
    );

    // Sequence number skipped.
    let mut bad = agent(&hub, &pki, "agent-bad.test", "pod-1").await;
    bad.send_raw(pb::AgentMessage {
        seq: 5,
        kind: Some(Msg::Heartbeat(pb::Heartbeat::default())),
    })
    .await;
    let status = bad.error().await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("expected 2"),
        "{}",
        status.message()
    );

    // SnapshotEnd without SnapshotBegin.
    let mut bad = agent(&hub, &pki, "agent-bad.test", "pod-1").await;
    bad.register("other", "https://two:6443").await;
    bad.send(Msg::SnapshotEnd(pb::SnapshotEnd {
        account: "other".into(),
        kind: Some(configmaps()),
        resource_version: "3".into(),
        object_count: 0,
        watch_namespace: String::new(),
    }))
    .await;
    let status = bad.error().await;
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("without a SnapshotBegin"),
        "{}",
        status.message()
    );

    // An event for an account this stream did not register (someone else's).
    let mut bad = agent(&hub, &pki, "agent-bad.test", "pod-1").await;
    bad.send(cm_event("prod", EventType::Deleted, "one", "99", "web"))
        .await;
    let status = bad.error().await;
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("did not register"),
        "{}",
        status.message()
    );

    // A payload that is not JSON.
    let mut bad = agent(&hub, &pki, "agent-bad.test", "pod-1").await;
    bad.register("other", "https://two:6443").await;
    let Msg::Object(mut ev) = cm_event("other", EventType::Applied, "x", "1", "web") else {
        unreachable!()
    };
    ev.object_json = b"{not json".to_vec();
    bad.send(Msg::Object(ev)).await;
    let status = bad.error().await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("not a JSON object"),
        "{}",
        status.message()
    );

    // The good agent's account is untouched and its stream still works.
    assert_eq!(object_names(&hub, "prod/objects").await, ["one"]);
    good.send(cm_event("prod", EventType::Applied, "two", "11", "web"))
        .await;
    good.synced().await;
    assert_eq!(object_names(&hub, "prod/objects").await, ["one", "two"]);
    let (_, acc) = get_json(&api(&hub), "/api/v1/accounts/prod").await;
    assert_eq!(acc["streaming"]["identity"], "agent-good.test");

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn silent_streams_are_ended_after_two_heartbeat_periods() {
    let pki = Pki::new();
    let dir = data_dir("silent");
    let hub = start_hub(&pki, &dir, |c| {
        c.streams.heartbeat_period = Duration::from_secs(1)
    })
    .await;
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    assert_eq!(a.welcome.as_ref().unwrap().heartbeat_period_seconds, 1);
    let started = std::time::Instant::now();
    let status = a.error().await;
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert!(a.heartbeats >= 1, "the hub sends heartbeats");
    let (_, agents) = get_json(&api(&hub), "/api/v1/agents").await;
    assert_eq!(agents, serde_json::json!([]));
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The agent asks for a heartbeat period in Hello; the hub grants it within
/// --min/--max-heartbeat-period, gives its own --heartbeat-period to an agent that asks for
/// none, and ends a silent stream after two *granted* periods.
#[tokio::test]
async fn a_requested_heartbeat_period_is_granted_within_the_bounds_and_enforced() {
    let pki = Pki::new();
    let dir = data_dir("heartbeat-grant");
    let hub = start_hub(&pki, &dir, |c| {
        c.streams.heartbeat_period = Duration::from_secs(20);
        c.streams.min_heartbeat_period = Duration::from_secs(1);
        c.streams.max_heartbeat_period = Duration::from_secs(30);
    })
    .await;
    let granted = async |replica: &str, asked: u32| {
        let mut a = open_stream(&hub, &pki.ca_pem, Some(pki.client("agent-hb.test")))
            .await
            .unwrap();
        a.hello_asking(replica, &[], "", asked).await.unwrap();
        let period = a.welcome.as_ref().unwrap().heartbeat_period_seconds;
        (a, period)
    };
    assert_eq!(
        granted("none", 0).await.1,
        20,
        "no request: the hub's period"
    );
    assert_eq!(granted("long", 3600).await.1, 30, "clamped to the maximum");
    assert_eq!(granted("within", 25).await.1, 25);
    // Asked for 1 s where the hub's own period is 20 s: silent, it is ended after ~2 s.
    let (mut quick, period) = granted("quick", 1).await;
    assert_eq!(period, 1);
    let started = std::time::Instant::now();
    let status = quick.error().await;
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let ended = started.elapsed();
    assert!(
        ended >= Duration::from_millis(1500) && ended < Duration::from_secs(15),
        "ended after {ended:?}: two granted periods, not two of the hub's"
    );
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn insecure_plaintext_mode_serves_anonymous_agents() {
    let dir = data_dir("plaintext");
    let mut config = Config::new(GrpcSecurity::InsecurePlaintext, &dir);
    config.listeners.grpc_addr = "127.0.0.1:0".parse().unwrap();
    config.listeners.http_addr = "127.0.0.1:0".parse().unwrap();
    let hub = scale_agent_hub::start(config).await.unwrap();
    let channel = Endpoint::from_shared(format!("http://{}", hub.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(8);
    let mut inbound = AgentHubClient::new(channel)
        .session(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(pb::AgentMessage {
        seq: 1,
        kind: Some(Msg::Hello(pb::Hello {
            replica: "r".into(),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let first = inbound.message().await.unwrap().unwrap();
    let Some(Out::Welcome(welcome)) = first.kind else {
        panic!("expected Welcome, got {first:?}")
    };
    assert_eq!(welcome.identity, scale_agent_hub::identity::ANONYMOUS);
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Operations through fake agents: a result updates the cache before the HTTP answer
/// (read-your-writes), a non-idempotent operation whose replica leaves is not resent, an
/// idempotent one is resent to another replica (a standby), and with no replica the answer
/// is 503 noAgent.
#[tokio::test]
async fn operations_are_routed_answered_and_resent_only_when_safe() {
    let pki = Pki::new();
    let dir = data_dir("ops");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    assert_eq!(
        role(&a.register("prod", "https://h:6443").await),
        Role::Streaming
    );
    a.snapshot("prod", &[("one", "5")], "100").await;
    a.synced().await;

    // An apply answered by the only replica: objects and deletions reach the cache first.
    let submitter = http.clone();
    let submit = tokio::spawn(async move {
        post_json(
            &submitter,
            "/api/v1/accounts/prod/operations",
            &serde_json::json!({"type": "apply", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "two"}}}),
        )
        .await
    });
    let op = a.operation().await;
    assert_eq!(op.account, "prod");
    assert!(op.deadline_unix_millis > 0);
    // The relative timeout: what is left of the default 30 s when it was written.
    assert!(
        (25_000..=30_000).contains(&op.timeout_millis),
        "{}",
        op.timeout_millis
    );
    assert!(matches!(op.op, Some(pb::operation::Op::Apply(_))));
    let Msg::Object(two) = cm_event("prod", EventType::Applied, "two", "120", "web") else {
        unreachable!()
    };
    a.send(Msg::OperationResult(pb::OperationResult {
        id: op.id.clone(),
        ok: true,
        status: Some(pb::OperationStatus {
            code: 200,
            ..Default::default()
        }),
        objects_json: vec![two.object_json],
        object_kinds: vec![configmaps()],
        deleted: vec!["ConfigMap/default/one".into()],
        deleted_kinds: vec![configmaps()],
        deleted_uids: vec!["uid-one".into()],
        executed: true,
        replica: "pod-1".into(),
        account: "prod".into(),
        ..Default::default()
    }))
    .await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["state"], "succeeded");
    assert_eq!(body["objects"][0]["metadata"]["name"], "two");
    // Read-your-writes: no watch event was sent for "two", nor a deletion of "one".
    assert_eq!(object_names(&hub, "prod/objects").await, ["two"]);
    let (code, looked) = get_json(&http, &format!("/api/v1/operations/{}", op.id)).await;
    assert_eq!(code, 200);
    assert_eq!(looked["state"], "succeeded");

    // A create (not idempotent) whose replica leaves after receiving it: not resent.
    let mut b = agent(&hub, &pki, "agent-a.test", "pod-2").await;
    assert_eq!(
        role(&b.register("prod", "https://h:6443").await),
        Role::Standby
    );
    let submitter = http.clone();
    let submit = tokio::spawn(async move {
        post_json(
            &submitter,
            "/api/v1/accounts/prod/operations",
            &serde_json::json!({"type": "create", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}}),
        )
        .await
    });
    let (receiver, op) = tokio::select! {
        op = a.operation() => ("a", op),
        op = b.operation() => ("b", op),
    };
    if receiver == "a" {
        drop(a);
    } else {
        drop(b);
        b = a;
    }
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["state"], "failed");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("not safe to resend"),
        "{body}"
    );
    assert!(b.operations.iter().all(|o| o.id != op.id));

    // An idempotent get whose replica leaves: resent to the other one (here a standby).
    let mut c = agent(&hub, &pki, "agent-a.test", "pod-3").await;
    assert_eq!(
        role(&c.register("prod", "https://h:6443").await),
        Role::Standby
    );
    let submitter = http.clone();
    let submit = tokio::spawn(async move {
        post_json(
            &submitter,
            "/api/v1/accounts/prod/operations",
            &serde_json::json!({"type": "get", "kind": "ConfigMap", "namespace": "default", "name": "two"}),
        )
        .await
    });
    let (receiver, first) = tokio::select! {
        op = b.operation() => ("b", op),
        op = c.operation() => ("c", op),
    };
    let mut other = if receiver == "b" {
        drop(b);
        c
    } else {
        drop(c);
        b
    };
    let again = other.operation().await;
    assert_eq!(again.id, first.id);
    other
        .send(Msg::OperationResult(pb::OperationResult {
            id: again.id.clone(),
            ok: false,
            status: Some(pb::OperationStatus {
                code: 404,
                reason: "NotFound".into(),
                message: "configmaps \"two\" not found".into(),
                causes: vec![],
            }),
            executed: true,
            account: "prod".into(),
            ..Default::default()
        }))
        .await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["attempts"], 2);
    assert_eq!(body["status"]["reason"], "NotFound");

    // Nobody left.
    drop(other);
    wait_for("the account to be disconnected", async || {
        let (_, acc) = get_json(&http, "/api/v1/accounts/prod").await;
        acc["state"] == "disconnected"
    })
    .await;
    // With nobody left the operation waits for an agent up to its deadline, then 503.
    let (code, body) = post_json(
        &http,
        "/api/v1/accounts/prod/operations",
        &serde_json::json!({"type": "get", "kind": "ConfigMap", "name": "two", "timeoutSeconds": 0.5}),
    )
    .await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["state"], "noAgent");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("no agent connected for account prod")
    );
    let (code, _) = post_json(
        &http,
        "/api/v1/accounts/prod/operations",
        &serde_json::json!({"type": "bogus"}),
    )
    .await;
    assert_eq!(code, 400);
    let (_, metrics) = get(&http, "/metrics").await;
    assert!(
        metrics.contains("scale_agent_hub_operation_retries_total 2"),
        "{metrics}"
    );

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn operation_requests_past_the_body_limit_get_413() {
    let pki = Pki::new();
    let dir = data_dir("ops-limit");
    let hub = start_hub(&pki, &dir, |c| c.api.max_request_bytes = 4096).await;
    let manifest = serde_json::json!({"kind": "ConfigMap", "data": {"pad": "x".repeat(5000)}});
    let (status, body) = post_json(
        &api(&hub),
        "/api/v1/accounts/prod/operations",
        &serde_json::json!({"type": "apply", "manifests": [manifest]}),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    assert!(message.contains("limit of 4096 bytes"), "{body}");
    assert!(message.contains("--max-request-bytes"), "{body}");
    // A Kubernetes Status, like the API server's own 413.
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["reason"], "RequestEntityTooLarge", "{body}");
    assert_eq!(body["code"], 413, "{body}");
    assert_eq!(body["message"], body["error"], "{body}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A successful result with `code` from `replica`, without objects.
fn succeeded(id: &str, account: &str, replica: &str, code: i32) -> pb::OperationResult {
    pb::OperationResult {
        id: id.into(),
        ok: true,
        status: Some(pb::OperationStatus {
            code,
            ..Default::default()
        }),
        executed: true,
        replica: replica.into(),
        account: account.into(),
        ..Default::default()
    }
}

/// A list result of `objects` ConfigMaps of `object_bytes` each, whole or a part (`more`).
fn list_result(id: &str, objects: usize, object_bytes: usize, more: bool) -> pb::OperationResult {
    pb::OperationResult {
        id: id.into(),
        ok: !more,
        status: Some(pb::OperationStatus {
            code: 200,
            ..Default::default()
        }),
        objects_json: (0..objects)
            .map(|i| {
                serde_json::to_vec(&serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("cm-{i}"), "namespace": "default"},
                    "data": {"pad": "x".repeat(object_bytes)},
                }))
                .unwrap()
            })
            .collect(),
        executed: true,
        replica: "pod-1".into(),
        more,
        ..Default::default()
    }
}

async fn submit_in_background(
    http: &Api,
    account: &str,
    body: serde_json::Value,
) -> tokio::task::JoinHandle<(u16, serde_json::Value)> {
    let http = http.clone();
    let path = format!("/api/v1/accounts/{account}/operations");
    tokio::spawn(async move { post_json(&http, &path, &body).await })
}

/// Client ids are per account and claimed before dispatch: concurrent submissions of one id
/// reach the agent once and all get its answer; the same id in another account is another
/// operation; a later resubmission answers the recorded outcome without running again.
#[tokio::test]
async fn client_ids_run_once_per_account_under_concurrent_submits() {
    let pki = Pki::new();
    let dir = data_dir("ops-ids");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://h:6443").await;
    a.register("dev", "https://h:6443").await;
    a.synced().await;

    let create = |account: &str| serde_json::json!({"id": "release-42", "type": "create", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("{account}-x")}}});
    let mut submits = Vec::new();
    for _ in 0..5 {
        submits.push(submit_in_background(&http, "prod", create("prod")).await);
    }
    let op = a.operation().await;
    assert_eq!(op.account, "prod");
    assert_ne!(
        op.id, "release-42",
        "the wire id is the hub's, unique across accounts"
    );
    // The same client id in another account is its own operation.
    let dev = submit_in_background(&http, "dev", create("dev")).await;
    let dev_op = a.operation().await;
    assert_eq!(dev_op.account, "dev");
    assert_ne!(dev_op.id, op.id);
    // No second dispatch of prod's id, however long the submitters wait.
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.pump_ready().unwrap();
    assert!(
        a.operations.is_empty(),
        "dispatched again: {:?}",
        a.operations
    );
    for (id, account) in [(&op.id, "prod"), (&dev_op.id, "dev")] {
        a.send(Msg::OperationResult(succeeded(id, account, "pod-1", 201)))
            .await;
    }
    for submit in submits {
        let (code, body) = submit.await.unwrap();
        assert_eq!(code, 201, "{body}");
        assert_eq!(body["id"], "release-42", "{body}");
        assert_eq!(body["account"], "prod", "{body}");
    }
    let (code, body) = dev.await.unwrap();
    assert_eq!(
        (code, body["account"].as_str()),
        (201, Some("dev")),
        "{body}"
    );
    // Resubmitted later: the recorded answer, no dispatch.
    let (code, body) = post_json(&http, "/api/v1/accounts/prod/operations", &create("prod")).await;
    assert_eq!(code, 201, "{body}");
    a.pump_ready().unwrap();
    assert!(a.operations.is_empty());
    // Lookups: per account, and by id alone only when one account has it.
    let (code, body) = get_json(&http, "/api/v1/accounts/dev/operations/release-42").await;
    assert_eq!(
        (code, body["account"].as_str()),
        (200, Some("dev")),
        "{body}"
    );
    let (code, body) = get_json(&http, "/api/v1/operations/release-42").await;
    assert_eq!(code, 409, "{body}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// With no agent connected, an operation waits for one up to its deadline (a rolling
/// restart, the hub's own restart) instead of failing at once.
#[tokio::test]
async fn an_operation_waits_for_an_agent_until_its_deadline() {
    let pki = Pki::new();
    let dir = data_dir("ops-wait");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://h:6443").await;
    a.synced().await;
    drop(a);
    wait_for("the account to be disconnected", async || {
        let (_, acc) = get_json(&http, "/api/v1/accounts/prod").await;
        acc["state"] == "disconnected"
    })
    .await;
    let submit = submit_in_background(
        &http,
        "prod",
        serde_json::json!({"type": "get", "kind": "ConfigMap", "name": "two", "timeoutSeconds": 20}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!submit.is_finished(), "answered before an agent came");
    let mut b = agent(&hub, &pki, "agent-a.test", "pod-2").await;
    b.register("prod", "https://h:6443").await;
    let op = b.operation().await;
    assert!(
        op.timeout_millis > 0 && op.timeout_millis < 20_000,
        "the time left, not the whole timeout: {}",
        op.timeout_millis
    );
    b.send(Msg::OperationResult(succeeded(
        &op.id, "prod", "pod-2", 200,
    )))
    .await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["attempts"], 1, "{body}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// An operation whose deadline leaves no time to reach the cluster (a 1 ms
/// `timeoutSeconds`) is never sent: 504 with `executed: false` (a safe retry), not "sent,
/// it may have run"; the agent receives nothing.
#[tokio::test]
async fn an_operation_out_of_time_before_it_is_sent_answers_not_executed() {
    let pki = Pki::new();
    let dir = data_dir("ops-too-late");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://h:6443").await;
    a.synced().await;
    let (code, body) = post_json(
        &http,
        "/api/v1/accounts/prod/operations",
        &serde_json::json!({"type": "delete", "kind": "ConfigMap", "name": "two", "timeoutSeconds": 0.001}),
    )
    .await;
    assert_eq!(code, 504, "{body}");
    assert_eq!(body["executed"], false, "{body}");
    assert_eq!(body["state"], "timedOut", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("not sent and did not run"), "{body}");
    assert!(message.contains("timeoutSeconds"), "{body}");
    assert!(
        tokio::time::timeout(Duration::from_millis(500), a.operation())
            .await
            .is_err(),
        "the agent was sent an operation with no time left"
    );
    // With time enough the same operation is sent.
    let submit = submit_in_background(
        &http,
        "prod",
        serde_json::json!({"type": "delete", "kind": "ConfigMap", "name": "two", "timeoutSeconds": 5}),
    )
    .await;
    let op = a.operation().await;
    a.send(Msg::OperationResult(succeeded(
        &op.id, "prod", "pod-1", 200,
    )))
    .await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 200, "{body}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Large results: parts are joined (and a list's continue token returned); a result past
/// --max-operation-result-bytes ends only its operation with 413 while the stream goes on;
/// a message past the decode limit (an agent that does not split) ends its stream, and the
/// operation is answered 413 instead of being resent to break the next replica too.
#[tokio::test]
async fn large_results_come_in_parts_and_one_too_large_ends_only_its_operation() {
    let pki = Pki::new();
    let dir = data_dir("ops-large");
    let hub = start_hub(&pki, &dir, |c| {
        c.streams.max_object_bytes = 64 * 1024;
        c.streams.max_staged_bytes = 64 * 1024;
        c.operations.max_result_bytes = 3 * 1024 * 1024;
    })
    .await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    let limit = a.welcome.as_ref().unwrap().max_message_bytes;
    assert_eq!(
        limit,
        64 * 1024 + 1024 * 1024,
        "Welcome names the decode limit"
    );
    a.register("prod", "https://h:6443").await;
    a.synced().await;

    // 2.4 MB in three parts, each under the limit.
    let submit = submit_in_background(
        &http,
        "prod",
        serde_json::json!({"type": "list", "kind": "ConfigMap", "limit": 30}),
    )
    .await;
    let op = a.operation().await;
    for i in 0..3 {
        let mut part = list_result(&op.id, 10, 80_000, i < 2);
        part.account = "prod".into();
        if i == 2 {
            part.continue_token = "next-page".into();
        }
        a.send(Msg::OperationResult(part)).await;
    }
    let (code, body) = submit.await.unwrap();
    assert_eq!(
        code,
        200,
        "{}",
        body.to_string().chars().take(300).collect::<String>()
    );
    assert_eq!(body["objects"].as_array().unwrap().len(), 30);
    assert_eq!(body["continue"], "next-page");

    // Past --max-operation-result-bytes: 413 naming it; the stream serves the next one.
    let submit = submit_in_background(
        &http,
        "prod",
        serde_json::json!({"type": "list", "kind": "ConfigMap"}),
    )
    .await;
    let op = a.operation().await;
    for i in 0..5 {
        a.send(Msg::OperationResult(list_result(&op.id, 10, 80_000, i < 4)))
            .await;
    }
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 413, "{body}");
    assert_eq!(body["status"]["reason"], "RequestEntityTooLarge");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("--max-operation-result-bytes"),
        "{body}"
    );
    a.synced().await;
    let submit = submit_in_background(
        &http,
        "prod",
        serde_json::json!({"type": "get", "kind": "ConfigMap", "name": "cm-1"}),
    )
    .await;
    let op = a.operation().await;
    a.send(Msg::OperationResult(list_result(&op.id, 1, 10, false)))
        .await;
    assert_eq!(submit.await.unwrap().0, 200);

    // An agent that sends the whole result in one message past the decode limit.
    let mut b = agent(&hub, &pki, "agent-a.test", "pod-2").await;
    b.register("prod", "https://h:6443").await;
    b.synced().await;
    let submit = submit_in_background(
        &http,
        "prod",
        serde_json::json!({"type": "list", "kind": "ConfigMap"}),
    )
    .await;
    let (first, op) = tokio::select! {
        op = a.operation() => ("a", op),
        op = b.operation() => ("b", op),
    };
    let (sender, other) = if first == "a" {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    sender
        .send(Msg::OperationResult(list_result(&op.id, 20, 80_000, false)))
        .await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 413, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("--max-object-bytes"),
        "{body}"
    );
    // Not resent to the other replica, whose stream it would end as well.
    other.pump_ready().unwrap();
    assert!(other.operations.is_empty(), "{:?}", other.operations);
    other.send(Msg::Heartbeat(pb::Heartbeat::default())).await;
    other.synced().await;
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Client ids survive a hub restart for the retention period: a resubmitted id answers its
/// recorded outcome and is not sent to an agent again.
#[tokio::test]
async fn client_ids_survive_a_hub_restart() {
    let pki = Pki::new();
    let dir = data_dir("ops-restart");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://h:6443").await;
    a.synced().await;
    let create = serde_json::json!({"id": "release-7", "type": "create", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}});
    let submit = submit_in_background(&http, "prod", create.clone()).await;
    let op = a.operation().await;
    a.send(Msg::OperationResult(succeeded(
        &op.id, "prod", "pod-1", 201,
    )))
    .await;
    assert_eq!(submit.await.unwrap().0, 201);
    hub.shutdown().await.unwrap();
    drop(a);

    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://h:6443").await;
    a.synced().await;
    let (code, body) = post_json(&http, "/api/v1/accounts/prod/operations", &create).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["state"], "succeeded", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("before the hub restarted"),
        "{body}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.pump_ready().unwrap();
    assert!(a.operations.is_empty(), "sent again: {:?}", a.operations);
    let (code, _) = get_json(&http, "/api/v1/accounts/prod/operations/release-7").await;
    assert_eq!(code, 200);
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
