//! Agent identities disabled through one hub replica hold on every replica sharing the real
//! PostgreSQL store (issue 28, F4/F17), and survive restarts: the other replica refuses a
//! new stream of the identity at once (it reads the identity's state from the store at every
//! authentication), ends the identity's live stream at its next heartbeat, and still refuses
//! after a restart. A store that cannot be read refuses (fail closed, F7) instead of letting
//! the identity in, and admits it again once it is back.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use scale_agent_e2e::{
    hub_replica::{self, InProcessReplica as Replica},
    postgres::PostgresServer,
};
use scale_agent_hub::identity::AllowRule;
use scale_agent_proto::v1::{
    self as pb, agent_hub_client::AgentHubClient, agent_message::Kind as Msg,
    hub_message::Kind as Out,
};
use tokio::sync::mpsc;
use tonic::{Code, Status, metadata::MetadataValue};

const SECRET: &str = "replica-secret-of-the-identity-test-0123456789";
const WAIT: Duration = Duration::from_secs(20);

async fn start_replica(url: &str, name: &str, dir: &std::path::Path) -> Replica {
    let mut config = hub_replica::config(url, name, &dir.join(name), SECRET).unwrap();
    config.agents.allow = vec![AllowRule::parse("prod-agent=prod-*").unwrap()];
    config.streams.heartbeat_period = Duration::from_secs(1);
    hub_replica::start(config).await.unwrap()
}

async fn admin_call(replica: &Replica, method: &str, path: &str) -> (u16, String) {
    replica.admin_call(method, path).await.unwrap()
}

/// A stream presenting an agent bearer token, kept alive by heartbeats (its own task)
/// until the hub ends it; `ended` says how.
struct LiveStream {
    ended: tokio::sync::oneshot::Receiver<Status>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LiveStream {
    /// The stream ends with its task (the agent goes away).
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn open(replica: &Replica, token: &str) -> Result<LiveStream, Status> {
    let mut client = AgentHubClient::connect(format!("http://{}", replica.hub.grpc_addr))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(8);
    tx.send(pb::AgentMessage {
        seq: 1,
        kind: Some(Msg::Hello(pb::Hello {
            replica: "pod-1".into(),
            agent_version: "e2e".into(),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    request.metadata_mut().insert(
        "authorization",
        MetadataValue::try_from(format!("Bearer {token}")).unwrap(),
    );
    let mut inbound = client.session(request).await?.into_inner();
    loop {
        let message = tokio::time::timeout(WAIT, inbound.message())
            .await
            .expect("no Welcome")?
            .expect("the stream ended before Welcome");
        if let Some(Out::Welcome(_)) = message.kind {
            break;
        }
    }
    let (done, ended) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut seq = 1;
        let mut beat = tokio::time::interval(Duration::from_millis(300));
        loop {
            tokio::select! {
                _ = beat.tick() => {
                    seq += 1;
                    let _ = tx.send(pb::AgentMessage {
                        seq,
                        kind: Some(Msg::Heartbeat(pb::Heartbeat::default())),
                    }).await;
                }
                message = inbound.message() => match message {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        let _ = done.send(Status::ok("ended"));
                        return;
                    }
                    Err(status) => {
                        let _ = done.send(status);
                        return;
                    }
                },
            }
        }
    });
    Ok(LiveStream { ended, task })
}

fn assert_refused(result: Result<LiveStream, Status>, code: Code, needles: &[&str]) {
    let Err(status) = result else {
        panic!("the hub accepted a stream it should refuse");
    };
    assert_eq!(status.code(), code, "{}", status.message());
    for needle in needles {
        assert!(
            status.message().contains(needle),
            "{:?} lacks {needle:?}",
            status.message()
        );
    }
}

#[tokio::test]
async fn a_disabled_identity_is_refused_by_every_replica_and_after_restarts() {
    let mut server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let dir = std::env::temp_dir().join(format!(
        "scale-agent-e2e-identity-replicas-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let a = start_replica(&url, "hub-a", &dir).await;
    let b = start_replica(&url, "hub-b", &dir).await;

    // A bearer token issued through replica a; the agent streams through replica b.
    let (status, body) = admin_call(
        &a,
        "POST",
        "/api/v1/agent-tokens?identity=prod-agent&accounts=prod-*&ttl=1h",
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let token = serde_json::from_str::<serde_json::Value>(&body).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut live = open(&b, &token).await.unwrap();

    // Disabled through replica a.
    let (status, body) = admin_call(
        &a,
        "POST",
        "/api/v1/agent-identities/prod-agent/disable?reason=cluster%20retired",
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // Replica b refuses a new stream at once (no wait for its periodic refresh)...
    let why = ["disabled", "cluster retired", "agent enable prod-agent"];
    assert_refused(open(&b, &token).await, Code::PermissionDenied, &why);
    // ... and ends the live one at its next heartbeat.
    let ended = tokio::time::timeout(WAIT, &mut live.ended)
        .await
        .expect("replica b did not end the disabled identity's stream")
        .unwrap();
    assert_eq!(ended.code(), Code::PermissionDenied, "{ended:?}");
    assert!(ended.message().contains("disabled"), "{ended:?}");

    // After a restart of replica b: still refused, from the store.
    let _ = b.hub.shutdown().await;
    let b = start_replica(&url, "hub-b", &dir).await;
    assert_refused(open(&b, &token).await, Code::PermissionDenied, &why);

    // Enabled through replica b: replica a lets the agent in again.
    let (status, body) = admin_call(&b, "POST", "/api/v1/agent-identities/prod-agent/enable").await;
    assert_eq!(status, 200, "{body}");
    let live = open(&a, &token).await.unwrap();
    drop(live);
    // The hub notices the agent went away (its stream's end) before the next one starts.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The store down: a new stream is refused as UNAVAILABLE, not let in undecided.
    server.stop().await;
    assert_refused(
        open(&a, &token).await,
        Code::Unavailable,
        &["cannot read the state of agent identity", "prod-agent"],
    );
    server.restart().await.unwrap();
    let started = tokio::time::Instant::now();
    loop {
        match open(&a, &token).await {
            Ok(_) => break,
            Err(status) if started.elapsed() < WAIT => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => panic!("the store is back but the stream is refused: {status:?}"),
        }
    }

    let _ = a.hub.shutdown().await;
    let _ = b.hub.shutdown().await;
    let _ = std::fs::remove_dir_all(&a.dir);
    let _ = std::fs::remove_dir_all(&dir);
}
