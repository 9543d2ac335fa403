//! An account binding released through one hub replica is released on every replica sharing
//! the real PostgreSQL store (issue 28): before, the other replicas kept it in memory until
//! they restarted and refused the name to every other identity. And a binding a replica made
//! itself is not dropped by its next read of the store. Two hub replicas, agent bearer
//! tokens of two identities, the protocol spoken over real gRPC.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use scale_agent_e2e::{
    hub_replica::{self, InProcessReplica as Replica},
    postgres::PostgresServer,
};
use scale_agent_hub::identity::AllowRule;
use scale_agent_proto::v1::{
    self as pb, account_assignment::Role, agent_hub_client::AgentHubClient,
    agent_message::Kind as Msg, hub_message::Kind as Out,
};
use tokio::sync::mpsc;
use tonic::metadata::MetadataValue;

const SECRET: &str = "replica-secret-of-the-binding-test-0123456789";
const WAIT: Duration = Duration::from_secs(20);
const SYNC_PERIOD: Duration = Duration::from_millis(500);

async fn start_replica(url: &str, name: &str, dir: &std::path::Path) -> Replica {
    let mut config = hub_replica::config(url, name, &dir.join(name), SECRET).unwrap();
    config.agents.allow = vec![
        AllowRule::parse("prod-agent=prod-*").unwrap(),
        AllowRule::parse("other-agent=prod-*").unwrap(),
    ];
    config.streams.heartbeat_period = Duration::from_secs(1);
    config.replicas.sync_period = SYNC_PERIOD;
    hub_replica::start(config).await.unwrap()
}

async fn admin_call(replica: &Replica, method: &str, path: &str) -> (u16, String) {
    replica.admin_call(method, path).await.unwrap()
}

async fn agent_token(replica: &Replica, identity: &str) -> String {
    let (status, body) = admin_call(
        replica,
        "POST",
        &format!("/api/v1/agent-tokens?identity={identity}&accounts=prod-*&ttl=1h"),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string()
}

/// An agent stream that registered one account, kept alive by heartbeats until dropped.
struct Agent {
    /// The assignments the hub sent after the first one.
    assignments: mpsc::UnboundedReceiver<pb::AccountAssignment>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Opens a stream on `replica` with the agent `token` and registers `account`; returns the
/// hub's first answer and the live stream.
async fn register(replica: &Replica, token: &str, account: &str) -> (pb::AccountAssignment, Agent) {
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
    let mut inbound = client.session(request).await.unwrap().into_inner();
    tx.send(pb::AgentMessage {
        seq: 2,
        kind: Some(Msg::RegisterAccount(pb::RegisterAccount {
            account: account.into(),
            cluster: Some(pb::ClusterInfo {
                api_server_host: "https://10.0.0.1:6443".into(),
                ca_fingerprint: "0a1b".into(),
                kubernetes_version: "v1.37.1".into(),
            }),
            namespaces: vec![],
            properties_json: br#"{"kinds":["ConfigMap"]}"#.to_vec(),
        })),
    })
    .await
    .unwrap();
    let first = loop {
        let message = tokio::time::timeout(WAIT, inbound.message())
            .await
            .expect("no assignment")
            .unwrap()
            .expect("the stream ended before the assignment");
        if let Some(Out::Assignment(a)) = message.kind {
            break a;
        }
    };
    let (assigned, assignments) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut seq = 2;
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
                    Ok(Some(pb::HubMessage { kind: Some(Out::Assignment(a)), .. })) => {
                        let _ = assigned.send(a);
                    }
                    Ok(Some(_)) => {}
                    _ => return,
                },
            }
        }
    });
    (first, Agent { assignments, task })
}

fn role(a: &pb::AccountAssignment) -> Role {
    Role::try_from(a.role).unwrap()
}

#[tokio::test]
async fn a_released_binding_is_released_on_every_replica_and_a_new_one_kept() {
    let mut server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let dir = std::env::temp_dir().join(format!(
        "scale-agent-e2e-binding-release-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let a = start_replica(&url, "hub-a", &dir).await;
    let b = start_replica(&url, "hub-b", &dir).await;
    let prod = agent_token(&a, "prod-agent").await;
    let other = agent_token(&a, "other-agent").await;

    // prod-agent registers prod-1 through replica a, which takes the account and stores
    // the binding.
    let (first, mut streaming) = register(&a, &prod, "prod-1").await;
    let mut assignment = first;
    while role(&assignment) != Role::Streaming {
        assert_ne!(role(&assignment), Role::Rejected, "{}", assignment.reason);
        assignment = tokio::time::timeout(WAIT, streaming.assignments.recv())
            .await
            .expect("replica a never streamed the account")
            .unwrap();
    }
    // Replica b holds the binding (its store reads), and refuses the name to other-agent.
    tokio::time::sleep(SYNC_PERIOD * 3).await;
    let (refused, _) = register(&b, &other, "prod-1").await;
    assert_eq!(role(&refused), Role::Rejected, "{refused:?}");
    assert!(
        refused
            .reason
            .contains("bound to agent identity \"prod-agent\""),
        "{}",
        refused.reason
    );

    // The cluster is retired: its agent goes, an admin releases the binding through a.
    drop(streaming);
    let started = tokio::time::Instant::now();
    loop {
        let (status, body) = admin_call(&a, "DELETE", "/api/v1/accounts/prod-1/binding").await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 409, "{body}");
        assert!(
            started.elapsed() < WAIT,
            "the binding was never released: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let released = tokio::time::Instant::now();

    // Replica b lets other-agent have the name within a sync period or so.
    let (taken, kept) = loop {
        let (answer, agent) = register(&b, &other, "prod-1").await;
        if role(&answer) != Role::Rejected {
            break (answer, agent);
        }
        assert!(
            answer
                .reason
                .contains("bound to agent identity \"prod-agent\""),
            "{}",
            answer.reason
        );
        assert!(
            released.elapsed() < WAIT,
            "replica b still holds the released binding after {:?}",
            released.elapsed()
        );
        drop(agent);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "replica b released the binding {:?} after the release on replica a (sync period {SYNC_PERIOD:?}); other-agent got {:?}",
        released.elapsed(),
        role(&taken)
    );

    // The binding replica b made is not dropped by its next reads of the store.
    tokio::time::sleep(SYNC_PERIOD * 4).await;
    let (refused, _) = register(&b, &prod, "prod-1").await;
    assert_eq!(role(&refused), Role::Rejected, "{refused:?}");
    assert!(
        refused
            .reason
            .contains("bound to agent identity \"other-agent\""),
        "{}",
        refused.reason
    );

    drop(kept);
    let _ = a.hub.shutdown().await;
    let _ = b.hub.shutdown().await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
