//! Agents connecting: a snapshot then deltas seen on the HTTP API, a standby promoted with
//! its resume points, other clusters, disallowed identities and untrusted clients refused.

use super::*;

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
