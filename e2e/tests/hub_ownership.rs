//! Account ownership of hub replicas through PostgreSQL advisory locks (issue 16), on
//! Debian's real server: one owner at a time; the lock frees the moment the owner's
//! database session dies (its socket closes, as at a kill -9) and another replica takes the
//! account with the next epoch; a release hands it over; a restart of PostgreSQL loses every
//! ownership at once and they are acquired again; `ownership_history` never overlaps.
//! Then two hubs in-process on it: only the owner streams, an operation submitted to the
//! other replica reaches the owner's agent, a PostgreSQL restart ends the owned streams and
//! ownership is taken again, and a stopped owner's account moves to the other replica.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::PathBuf, time::Duration};

use scale_agent_e2e::postgres::{self, PostgresServer};
use scale_agent_hub::{
    Config, GrpcSecurity, RunningHub,
    owners::{
        Claim, Ownership, OwnershipSource, ReplicaIdentity,
        forward::ReplicaSecret,
        postgres::{PostgresOwnership, lock_key},
    },
};
use scale_agent_proto::v1::{
    self as pb, account_assignment::Role, agent_hub_client::AgentHubClient,
    agent_message::Kind as Msg, hub_message::Kind as Out,
};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(20);

fn replica(id: &str) -> ReplicaIdentity {
    ReplicaIdentity {
        id: id.into(),
        address: format!("https://{id}:8443"),
    }
}

async fn owner_row(client: &tokio_postgres::Client, account: &str) -> Option<(String, i64)> {
    client
        .query_opt(
            "SELECT replica, epoch FROM account_owners WHERE account = $1",
            &[&account],
        )
        .await
        .unwrap()
        .map(|row| (row.get(0), row.get(1)))
}

/// Tenures of `account` in the order they began: (replica, epoch, began, ended).
async fn history(
    client: &tokio_postgres::Client,
    account: &str,
) -> Vec<(
    String,
    i64,
    std::time::SystemTime,
    Option<std::time::SystemTime>,
)> {
    client
        .query(
            "SELECT replica, epoch, acquired_at, released_at FROM ownership_history
             WHERE account = $1 ORDER BY acquired_at, epoch",
            &[&account],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect()
}

/// No two tenures overlap, and epochs grow.
fn assert_no_overlap(
    tenures: &[(
        String,
        i64,
        std::time::SystemTime,
        Option<std::time::SystemTime>,
    )],
) {
    for pair in tenures.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        let ended = before
            .3
            .unwrap_or_else(|| panic!("{before:?} never ended, yet {after:?} began"));
        assert!(ended <= after.2, "{before:?} overlaps {after:?}");
        assert!(after.1 > before.1, "epochs must grow: {tenures:?}");
    }
}

async fn wait_changed(losses: &mut tokio::sync::watch::Receiver<u64>) {
    tokio::time::timeout(Duration::from_secs(20), losses.changed())
        .await
        .expect("the loss was noticed in time")
        .unwrap();
}

#[tokio::test]
async fn one_owner_at_a_time_and_a_dead_owners_lock_frees_at_once() {
    let mut server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    let a = PostgresOwnership::connect(&url, replica("hub-a"))
        .await
        .unwrap();
    let b = PostgresOwnership::connect(&url, replica("hub-b"))
        .await
        .unwrap();

    assert_eq!(
        a.try_acquire("prod").await.unwrap(),
        Claim::Acquired { epoch: 1 }
    );
    match b.try_acquire("prod").await.unwrap() {
        Claim::HeldElsewhere(Some(owner)) => {
            assert_eq!((owner.replica.as_str(), owner.epoch), ("hub-a", 1));
            assert_eq!(owner.address, "https://hub-a:8443");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        b.owner("prod").await.unwrap().map(|o| o.replica).as_deref(),
        Some("hub-a")
    );
    // Other accounts are independent.
    assert_eq!(
        b.try_acquire("staging").await.unwrap(),
        Claim::Acquired { epoch: 1 }
    );
    assert_eq!(owner_row(&sql, "prod").await, Some(("hub-a".into(), 1)));

    // hub-a's database session dies (as when its process is killed: the socket closes).
    let mut a_losses = a.losses();
    let terminated: i64 = sql
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = 'scale-agent-hub hub-a ownership'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(terminated, 1);
    wait_changed(&mut a_losses).await;
    // The lock is free at once: hub-b takes the account with the next epoch.
    assert_eq!(
        b.try_acquire("prod").await.unwrap(),
        Claim::Acquired { epoch: 2 }
    );
    assert_eq!(owner_row(&sql, "prod").await, Some(("hub-b".into(), 2)));
    // hub-a, connected again, finds it owned.
    assert!(matches!(
        a.try_acquire("prod").await.unwrap(),
        Claim::HeldElsewhere(Some(ref o)) if o.replica == "hub-b"
    ));

    // A release hands it over: the row goes (late writes of epoch 2 fail the fencing).
    b.release("prod").await.unwrap();
    assert_eq!(owner_row(&sql, "prod").await, None);
    assert_eq!(a.owner("prod").await.unwrap(), None);
    assert_eq!(
        a.try_acquire("prod").await.unwrap(),
        Claim::Acquired { epoch: 3 }
    );
    let locks: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(locks, 2, "prod by hub-a, staging by hub-b");

    let tenures = history(&sql, "prod").await;
    assert_eq!(
        tenures
            .iter()
            .map(|t| (t.0.as_str(), t.1))
            .collect::<Vec<_>>(),
        [("hub-a", 1), ("hub-b", 2), ("hub-a", 3)]
    );
    assert_no_overlap(&tenures);
    assert!(tenures[2].3.is_none(), "hub-a owns it now");

    // PostgreSQL restarts: every lock is gone, both replicas are told, and they acquire
    // again once it is back.
    let (mut a_losses, mut b_losses) = (a.losses(), b.losses());
    server.kill();
    wait_changed(&mut a_losses).await;
    wait_changed(&mut b_losses).await;
    server.restart().await.unwrap();
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    assert_eq!(
        a.try_acquire("prod").await.unwrap(),
        Claim::Acquired { epoch: 4 }
    );
    assert_eq!(
        b.try_acquire("staging").await.unwrap(),
        Claim::Acquired { epoch: 2 }
    );
    assert!(matches!(
        b.try_acquire("prod").await.unwrap(),
        Claim::HeldElsewhere(Some(ref o)) if o.replica == "hub-a" && o.epoch == 4
    ));
    assert_no_overlap(&history(&sql, "prod").await);
    assert_no_overlap(&history(&sql, "staging").await);

    // Closing releases everything.
    a.close().await;
    b.close().await;
    assert_eq!(owner_row(&sql, "prod").await, None);
    assert_eq!(owner_row(&sql, "staging").await, None);
    let open: i64 = sql
        .query_one(
            "SELECT count(*) FROM ownership_history WHERE released_at IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 0);
    assert_ne!(lock_key("prod"), lock_key("staging"));
}

// ---------------------------------------------------------------- hubs on PostgreSQL

const SECRET: &str = "0123456789abcdef0123456789abcdef-e2e";

struct Replica {
    hub: RunningHub,
    dir: PathBuf,
    admin: String,
}

async fn start_replica(url: &str, name: &str) -> Replica {
    let dir = std::env::temp_dir().join(format!(
        "scale-agent-e2e-ownership-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let port = scale_agent_e2e::local_agent::free_port().unwrap();
    let mut config = Config::new(GrpcSecurity::InsecurePlaintext, &dir);
    config.grpc_addr = "127.0.0.1:0".parse().unwrap();
    config.http_addr = format!("127.0.0.1:{port}").parse().unwrap();
    config.replica_id = name.into();
    config.replica_address = Some(format!("http://127.0.0.1:{port}"));
    config.replica_secret = Some(ReplicaSecret::new(SECRET).unwrap());
    config.ownership = OwnershipSource::Postgres { url: url.into() };
    let hub = scale_agent_hub::start(config).await.unwrap();
    let admin = std::fs::read_to_string(hub.admin_token_file().unwrap())
        .unwrap()
        .trim()
        .to_string();
    Replica { hub, dir, admin }
}

impl Replica {
    async fn stop(self) {
        let _ = self.hub.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Just enough of an agent: Hello, registrations, and what the hub sends.
struct MiniAgent {
    tx: mpsc::Sender<pb::AgentMessage>,
    inbound: tonic::Streaming<pb::HubMessage>,
    seq: u64,
}

impl MiniAgent {
    async fn connect(hub: &RunningHub, replica: &str) -> MiniAgent {
        let mut client = AgentHubClient::connect(format!("http://{}", hub.grpc_addr))
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(16);
        let inbound = client
            .session(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let mut agent = MiniAgent {
            tx,
            inbound,
            seq: 0,
        };
        agent
            .send(Msg::Hello(pb::Hello {
                replica: replica.into(),
                agent_version: "e2e".into(),
                capabilities: vec!["http-tunnel".into()],
                ..Default::default()
            }))
            .await;
        agent
    }

    async fn send(&mut self, kind: Msg) {
        self.seq += 1;
        let message = pb::AgentMessage {
            seq: self.seq,
            kind: Some(kind),
        };
        self.tx.send(message).await.unwrap();
    }

    async fn register(&mut self, account: &str) {
        self.send(Msg::RegisterAccount(pb::RegisterAccount {
            account: account.into(),
            cluster: Some(pb::ClusterInfo {
                api_server_host: "https://10.0.0.1:6443".into(),
                ca_fingerprint: "0a1b".into(),
                kubernetes_version: "v1.37.1".into(),
            }),
            ..Default::default()
        }))
        .await;
    }

    /// The next message `pick` takes, skipping others; the status when the stream ends.
    async fn next<T>(&mut self, pick: impl Fn(Out) -> Option<T>) -> Result<T, tonic::Status> {
        loop {
            let message = tokio::time::timeout(WAIT, self.inbound.message())
                .await
                .map_err(|_| tonic::Status::deadline_exceeded("test: nothing in time"))??
                .ok_or_else(|| tonic::Status::ok("the stream ended"))?;
            if let Some(found) = message.kind.and_then(&pick) {
                return Ok(found);
            }
        }
    }

    async fn role(&mut self) -> Role {
        let assignment = self
            .next(|kind| match kind {
                Out::Assignment(a) => Some(a),
                _ => None,
            })
            .await
            .unwrap();
        Role::try_from(assignment.role).unwrap()
    }

    /// Registers and waits until it streams (it stands by until its hub owns the account).
    async fn register_streaming(&mut self, account: &str) {
        self.register(account).await;
        let mut role = self.role().await;
        if role == Role::Standby {
            role = self.role().await;
        }
        assert_eq!(role, Role::Streaming);
    }
}

/// Submits an apply with `admin`'s token to the hub at `addr`: (status, body).
async fn post_to(addr: std::net::SocketAddr, admin: &str, account: &str) -> (u16, String) {
    use http_body_util::BodyExt as _;
    let client: hyper_util::client::legacy::Client<_, http_body_util::Full<hyper::body::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let body = r#"{"type":"apply","manifest":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"two"}}}"#;
    let request = http::Request::post(format!(
        "http://{addr}/api/v1/accounts/{account}/operations"
    ))
    .header("authorization", format!("Bearer {admin}"))
    .header("content-type", "application/json")
    .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
    .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn hub_replicas_on_postgres_stream_forward_and_fail_over() {
    let mut server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let a = start_replica(&url, "hub-a").await;
    let b = start_replica(&url, "hub-b").await;

    let mut x = MiniAgent::connect(&a.hub, "pod-x").await;
    x.register_streaming("prod").await;
    let mut y = MiniAgent::connect(&b.hub, "pod-y").await;
    y.register("prod").await;
    assert_eq!(y.role().await, Role::Standby);
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    assert_eq!(owner_row(&sql, "prod").await, Some(("hub-a".into(), 1)));

    // An operation submitted to hub-b runs on hub-a's agent.
    let submit = tokio::spawn({
        let b_addr = b.hub.http_addr;
        let admin = b.admin.clone();
        async move { post_to(b_addr, &admin, "prod").await }
    });
    let op = x
        .next(|kind| match kind {
            Out::Operation(op) => Some(op),
            _ => None,
        })
        .await
        .unwrap();
    x.send(Msg::OperationResult(pb::OperationResult {
        id: op.id.clone(),
        ok: true,
        status: Some(pb::OperationStatus {
            code: 200,
            ..Default::default()
        }),
        executed: true,
        replica: "pod-x".into(),
        account: "prod".into(),
        ..Default::default()
    }))
    .await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 200, "{body}");

    // PostgreSQL restarts: hub-a's locks are gone, so it ends the stream it owned.
    server.kill();
    let ended = x.next(|_| None::<()>).await.unwrap_err();
    assert!(ended.message().contains("lost the ownership"), "{ended:?}");
    server.restart().await.unwrap();
    // pod-x reconnects to hub-a; whichever replica takes the account first promotes its
    // agent, and the other agent stands by.
    let mut x = MiniAgent::connect(&a.hub, "pod-x").await;
    x.register("prod").await;
    let first = x.role().await;
    let promoted = if first == Role::Streaming {
        "hub-a"
    } else {
        tokio::select! {
            role = x.role() => { assert_eq!(role, Role::Streaming); "hub-a" }
            role = y.role() => { assert_eq!(role, Role::Streaming); "hub-b" }
        }
    };
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    assert_eq!(
        owner_row(&sql, "prod")
            .await
            .map(|(replica, _)| replica)
            .as_deref(),
        Some(promoted)
    );

    // The owner stops: the other replica takes the account and promotes its standby.
    let (owner, other, mut standby) = if promoted == "hub-a" {
        (a, b, y)
    } else {
        (b, a, x)
    };
    owner.stop().await;
    assert_eq!(standby.role().await, Role::Streaming);
    let tenures = history(&sql, "prod").await;
    assert!(tenures.len() >= 3, "{tenures:?}");
    assert_no_overlap(&tenures);
    assert_eq!(
        owner_row(&sql, "prod").await.map(|(replica, _)| replica),
        tenures.last().map(|t| t.0.clone())
    );
    drop(standby);
    other.stop().await;
}
