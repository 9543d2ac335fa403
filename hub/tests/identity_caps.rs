//! What one agent identity may hold on the hub (issue 28, review F14), each past its limit
//! refused with a message naming the flag to raise while the identity's other streams and
//! other identities go on: at most `--max-accounts-per-identity` accounts bound to it
//! (releasing one makes room again), `--max-streams-per-identity` streams open at once (a
//! replica reconnecting still replaces its own), and `--max-staged-bytes` of open
//! snapshots across all its streams together (not per stream).

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use scale_agent_proto::v1::{self as pb, account_assignment::Role, agent_message::Kind as Msg};
use tonic::Code;

#[tokio::test]
async fn an_identity_past_its_account_cap_is_refused_with_the_flag_to_raise() {
    let pki = Pki::new();
    let dir = data_dir("identity-account-cap");
    let hub = start_hub(&pki, &dir, |c| c.streams.max_accounts_per_identity = 2).await;
    let admin = api(&hub);

    let mut x = agent(&hub, &pki, "agent.test", "pod-x").await;
    for account in ["team-1", "team-2"] {
        let a = x.register(account, "https://10.0.0.1:6443").await;
        assert_eq!(role(&a), Role::Streaming, "{a:?}");
    }
    let refused = x.register("team-3", "https://10.0.0.1:6443").await;
    assert_eq!(role(&refused), Role::Rejected, "{refused:?}");
    for needle in [
        "agent identity \"agent.test\" already has 2 accounts bound",
        "--max-accounts-per-identity 2",
        "scale-agent-hub account delete",
    ] {
        assert!(refused.reason.contains(needle), "{}", refused.reason);
    }
    // Another identity has a cap of its own.
    let mut y = agent(&hub, &pki, "other.test", "pod-y").await;
    assert_eq!(
        role(&y.register("ops-1", "https://10.0.0.2:6443").await),
        Role::Streaming
    );

    // Releasing an account of the first identity makes room for the refused one.
    drop(x);
    wait_for("team-2's binding released", async || {
        request(&admin, "DELETE", "/api/v1/accounts/team-2/binding", None)
            .await
            .0
            == 200
    })
    .await;
    let mut x = agent(&hub, &pki, "agent.test", "pod-x2").await;
    assert_eq!(
        role(&x.register("team-1", "https://10.0.0.1:6443").await),
        Role::Streaming,
        "an account bound already is not counted again"
    );
    let taken = x.register("team-3", "https://10.0.0.1:6443").await;
    assert_eq!(role(&taken), Role::Streaming, "{taken:?}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The value of the counter of identity refusals for `limit` on `/metrics`.
async fn identity_refusals(admin: &Api, limit: &str) -> String {
    let (code, text) = get(admin, "/metrics").await;
    assert_eq!(code, 200, "{text}");
    let needle =
        format!("scale_agent_hub_agent_identity_limit_refusals_total{{limit=\"{limit}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&needle))
        .unwrap_or("absent")
        .to_string()
}

#[tokio::test]
async fn an_identity_past_its_stream_cap_is_refused_and_a_replica_still_replaces_its_own() {
    let pki = Pki::new();
    let dir = data_dir("identity-stream-cap");
    let hub = start_hub(&pki, &dir, |c| c.streams.max_streams_per_identity = 2).await;
    let admin = api(&hub);

    let first = agent(&hub, &pki, "agent.test", "pod-1").await;
    let second = agent(&hub, &pki, "agent.test", "pod-2").await;
    // A third replica name (an attacker making names up, or a third pod) is refused.
    let mut third = open_stream(&hub, &pki.ca_pem, Some(pki.client("agent.test")))
        .await
        .unwrap();
    let refused = third.hello("pod-3", &[], "").await.unwrap_err();
    assert_eq!(
        refused.code(),
        Code::ResourceExhausted,
        "{}",
        refused.message()
    );
    for needle in [
        "agent identity \"agent.test\" already has 2 streams open",
        "--max-streams-per-identity 2",
        "raise --max-streams-per-identity",
    ] {
        assert!(refused.message().contains(needle), "{}", refused.message());
    }
    assert_eq!(identity_refusals(&admin, "streams").await, "1");
    // Another identity has streams of its own.
    let _other = agent(&hub, &pki, "other.test", "pod-1").await;
    // A replica reconnecting (its pod restarted) replaces its own stream, cap reached or not.
    let token = first.session_token();
    let again = resume_agent(&hub, &pki, "agent.test", "pod-1", &token)
        .await
        .unwrap();
    assert_eq!(again.welcome.as_ref().unwrap().identity, "agent.test");
    drop(first);

    // A stream that ends gives its place back.
    drop(second);
    wait_for("pod-2's place given back", async || {
        let mut a = open_stream(&hub, &pki.ca_pem, Some(pki.client("agent.test")))
            .await
            .unwrap();
        a.hello("pod-3", &[], "").await.is_ok()
    })
    .await;
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A ConfigMap of about `bytes` bytes of data that zstd cannot shrink much (the hub
/// counts objects packed).
fn big_configmap(account: &str, name: &str, bytes: usize) -> Msg {
    let mut state = name.bytes().fold(7u64, |h, b| h * 31 + u64::from(b));
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let data: String = (0..bytes)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            alphabet[(state >> 58) as usize] as char
        })
        .collect();
    let Msg::Object(mut event) =
        cm_event(account, pb::object_event::Type::Applied, name, "1", "web")
    else {
        unreachable!("cm_event makes an object event")
    };
    let mut object: serde_json::Value = serde_json::from_slice(&event.object_json).unwrap();
    object["data"]["blob"] = serde_json::Value::String(data);
    event.object_json = serde_json::to_vec(&object).unwrap();
    Msg::Object(event)
}

/// Begins a snapshot of ConfigMaps of `account` and stages `count` objects of 4 KB in it.
async fn stage(agent: &mut FakeAgent, account: &str, count: usize) {
    agent
        .send(Msg::SnapshotBegin(pb::SnapshotBegin {
            account: account.into(),
            kind: Some(configmaps()),
            watch_namespace: String::new(),
        }))
        .await;
    for i in 0..count {
        agent
            .send(big_configmap(account, &format!("{account}-{i}"), 4000))
            .await;
    }
}

#[tokio::test]
async fn staged_bytes_are_bounded_per_identity_across_its_streams() {
    let pki = Pki::new();
    let dir = data_dir("identity-staged-cap");
    // 8 objects of 4 KB (about 3 KB packed) fit one stream's snapshot; 16, two streams of
    // one identity, do not.
    let hub = start_hub(&pki, &dir, |c| {
        c.streams.max_object_bytes = 16 * 1024;
        c.streams.max_staged_bytes = 40_000;
    })
    .await;
    let admin = api(&hub);

    let mut first = agent(&hub, &pki, "agent.test", "pod-1").await;
    assert_eq!(
        role(&first.register("team-1", "https://10.0.0.1:6443").await),
        Role::Streaming
    );
    stage(&mut first, "team-1", 8).await;
    first.synced().await;

    // Another identity stages as much beside it.
    let mut other = agent(&hub, &pki, "other.test", "pod-1").await;
    assert_eq!(
        role(&other.register("ops-1", "https://10.0.0.2:6443").await),
        Role::Streaming
    );
    stage(&mut other, "ops-1", 8).await;
    other.synced().await;

    // A second stream of the first identity: what both stage is past the limit.
    let mut second = agent(&hub, &pki, "agent.test", "pod-2").await;
    assert_eq!(
        role(&second.register("team-2", "https://10.0.0.3:6443").await),
        Role::Streaming
    );
    stage(&mut second, "team-2", 8).await;
    let ended = second.error().await;
    assert_eq!(ended.code(), Code::ResourceExhausted, "{}", ended.message());
    for needle in [
        "the snapshots the streams of agent identity \"agent.test\" have open",
        "limit of 40000 bytes per identity (--max-staged-bytes)",
        "account \"team-2\"",
        "raise --max-staged-bytes",
    ] {
        assert!(ended.message().contains(needle), "{}", ended.message());
    }
    assert_eq!(identity_refusals(&admin, "staged_bytes").await, "1");

    // The first stream goes on: its snapshot ends, which frees what it staged.
    first
        .send(Msg::SnapshotEnd(pb::SnapshotEnd {
            account: "team-1".into(),
            kind: Some(configmaps()),
            resource_version: "10".into(),
            object_count: 8,
            watch_namespace: String::new(),
        }))
        .await;
    first.synced().await;
    let (code, body) = get(&admin, "/api/v1/accounts/team-1/objects?kind=ConfigMap").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("team-1-7"),
        "{}",
        &body[..body.len().min(300)]
    );
    // Then the identity's next stream may stage as much as the first did.
    let mut third = agent(&hub, &pki, "agent.test", "pod-3").await;
    assert_eq!(
        role(&third.register("team-2", "https://10.0.0.3:6443").await),
        Role::Streaming
    );
    stage(&mut third, "team-2", 8).await;
    third.synced().await;
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
