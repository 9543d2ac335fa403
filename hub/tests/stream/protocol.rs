//! The protocol's edges: malformed messages end only their stream, silent streams end after
//! two heartbeat periods, requested heartbeat periods, the insecure plaintext mode.

use super::*;

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
