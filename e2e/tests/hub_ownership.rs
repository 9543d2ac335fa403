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

use scale_agent_e2e::{
    http::Call,
    postgres::{self, PostgresServer, Tenure, assert_no_overlap},
    wait,
};
use scale_agent_hub::{
    RunningHub,
    owners::{
        Claim, Ownership, ReplicaIdentity,
        postgres::{PostgresOwnership, lock_key},
    },
    store::PostgresOptions,
};
use scale_agent_proto::v1::{
    self as pb, account_assignment::Role, agent_hub_client::AgentHubClient,
    agent_message::Kind as Msg, hub_message::Kind as Out,
};
use scale_agent_testkit::contract::{self, Contract};
use tokio::sync::mpsc;

#[path = "hub_ownership/revocation.rs"]
mod revocation;

const WAIT: Duration = Duration::from_secs(20);
/// How often a check of what the Clouddriver contract saw is made again.
const POLL: Duration = Duration::from_millis(25);

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

/// Tenures of `account` in the order they began.
async fn history(client: &tokio_postgres::Client, account: &str) -> Vec<Tenure> {
    postgres::ownership_history(client)
        .await
        .unwrap()
        .remove(account)
        .unwrap_or_default()
}

async fn wait_changed(losses: &mut tokio::sync::watch::Receiver<u64>) {
    tokio::time::timeout(Duration::from_secs(20), losses.changed())
        .await
        .expect("the loss was noticed in time")
        .unwrap();
}

const SECRET: &str = "0123456789abcdef0123456789abcdef-e2e";

type Replica = scale_agent_e2e::hub_replica::InProcessReplica;

async fn start_replica(url: &str, name: &str) -> Replica {
    let dir = std::env::temp_dir().join(format!(
        "scale-agent-e2e-ownership-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = scale_agent_e2e::hub_replica::config(url, name, &dir, SECRET).unwrap();
    // `anonymous` registers only what an --allow rule names.
    config.agents.allow = vec![scale_agent_hub::identity::AllowRule::parse("*=*").unwrap()];
    scale_agent_e2e::hub_replica::start(config).await.unwrap()
}

struct MiniAgent {
    tx: mpsc::Sender<pb::AgentMessage>,
    inbound: tonic::Streaming<pb::HubMessage>,
    seq: u64,
    acked: u64,
}

impl MiniAgent {
    async fn connect(hub: &RunningHub, replica: &str) -> MiniAgent {
        Self::connect_to(hub.grpc_addr, replica).await
    }

    async fn connect_to(grpc: std::net::SocketAddr, replica: &str) -> MiniAgent {
        Self::connect_asking(grpc, replica, 0).await
    }

    /// Asks for heartbeats every `heartbeat_seconds` (0: the hub's period): an agent that
    /// sends none stays connected that long and twice more.
    async fn connect_asking(
        grpc: std::net::SocketAddr,
        replica: &str,
        heartbeat_seconds: u32,
    ) -> MiniAgent {
        let mut client = AgentHubClient::connect(format!("http://{grpc}"))
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
            acked: 0,
        };
        agent
            .send(Msg::Hello(pb::Hello {
                replica: replica.into(),
                agent_version: "e2e".into(),
                capabilities: vec!["http-tunnel".into()],
                heartbeat_period_seconds: heartbeat_seconds,
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
        self.register_cluster(account, "https://10.0.0.1:6443")
            .await;
    }

    /// Registers `account` for the cluster at `api_server_host`.
    async fn register_cluster(&mut self, account: &str, api_server_host: &str) {
        self.send(Msg::RegisterAccount(pb::RegisterAccount {
            account: account.into(),
            cluster: Some(pb::ClusterInfo {
                api_server_host: api_server_host.into(),
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
            if let Some(Out::Ack(ack)) = &message.kind {
                self.acked = self.acked.max(ack.seq);
            }
            if let Some(found) = message.kind.and_then(&pick) {
                return Ok(found);
            }
        }
    }

    async fn assignment(&mut self) -> pb::AccountAssignment {
        self.next(|kind| match kind {
            Out::Assignment(a) => Some(a),
            _ => None,
        })
        .await
        .unwrap()
    }

    async fn role(&mut self) -> Role {
        Role::try_from(self.assignment().await.role).unwrap()
    }

    /// Waits for an operation and answers it: done (200).
    async fn run_operation(&mut self, replica: &str) {
        let op = self
            .next(|kind| match kind {
                Out::Operation(op) => Some(op),
                _ => None,
            })
            .await
            .unwrap();
        self.send(Msg::OperationResult(pb::OperationResult {
            id: op.id.clone(),
            ok: true,
            status: Some(pb::OperationStatus {
                code: 200,
                ..Default::default()
            }),
            executed: true,
            replica: replica.into(),
            account: op.account.clone(),
            ..Default::default()
        }))
        .await;
    }

    /// A snapshot of one ConfigMap, then waits until the hub stored it (its Ack).
    async fn snapshot(&mut self, account: &str, resource_version: &str) {
        let kind = pb::Kind {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        };
        self.send(Msg::SnapshotBegin(pb::SnapshotBegin {
            account: account.into(),
            kind: Some(kind.clone()),
            watch_namespace: String::new(),
        }))
        .await;
        self.send(Msg::Object(pb::ObjectEvent {
            account: account.into(),
            kind: Some(kind.clone()),
            r#type: pb::object_event::Type::Applied as i32,
            namespace: "default".into(),
            name: "one".into(),
            uid: "uid-one".into(),
            resource_version: "5".into(),
            object_json: br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"one","namespace":"default","uid":"uid-one","resourceVersion":"5"}}"#.to_vec(),
            truncated: false,
            watch_namespace: String::new(),
        }))
        .await;
        self.send(Msg::SnapshotEnd(pb::SnapshotEnd {
            account: account.into(),
            kind: Some(kind),
            resource_version: resource_version.into(),
            object_count: 1,
            watch_namespace: String::new(),
        }))
        .await;
        while self.acked < self.seq {
            self.next(|kind| matches!(kind, Out::Ack(_)).then_some(()))
                .await
                .unwrap();
        }
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

/// Submits an apply with `admin`'s token to the hub at `addr` and waits for its result (at
/// most [`wait::WAIT`]): (status, body).
async fn post_to(addr: std::net::SocketAddr, admin: &str, account: &str) -> (u16, String) {
    let body = r#"{"type":"apply","manifest":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"two"}}}"#;
    let url = format!("http://{addr}/api/v1/accounts/{account}/operations");
    let mut call = Call::new("POST", url)
        .bearer(admin)
        .header("content-type", "application/json")
        .timeout(wait::WAIT);
    call.body = Some(body.as_bytes().to_vec());
    let response = call.send().await.unwrap();
    (response.status, response.body)
}

/// `--replica-sync-period` of the replicas below.
const SYNC: Duration = Duration::from_secs(1);

/// Hub processes on one PostgreSQL, `hub-0`, `hub-1`, … (each with its own data directory,
/// admin token and agent CA), with `extra` flags.
async fn hub_processes(
    server: &PostgresServer,
    name: &str,
    count: usize,
    extra: &[&str],
) -> (PathBuf, Vec<scale_agent_e2e::fleet::HubProcess>) {
    let root = std::env::temp_dir().join(format!("scale-agent-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let url_file = root.join("postgres-url");
    std::fs::write(&url_file, server.url()).unwrap();
    let secret_file = root.join("replica-secret");
    std::fs::write(&secret_file, SECRET).unwrap();
    let mut hubs = Vec::new();
    for i in 0..count {
        let mut flags = vec![
            "--store=postgres".to_string(),
            // The harness\'s PostgreSQL is plaintext on loopback.
            "--postgres-insecure-tls".to_string(),
            format!("--postgres-url-file={}", url_file.display()),
            format!("--replica-id=hub-{i}"),
            "--replica-address=http://{http}".to_string(),
            format!("--replica-secret-file={}", secret_file.display()),
            format!("--replica-sync-period={}ms", SYNC.as_millis()),
        ];
        flags.extend(extra.iter().map(|f| f.to_string()));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let dir = root.join(format!("hub-{i}"));
        hubs.push(
            scale_agent_e2e::fleet::HubProcess::start(&dir, &flags)
                .await
                .unwrap(),
        );
    }
    (root, hubs)
}

/// The admin token a hub process created in its data directory.
fn admin_token(hub: &scale_agent_e2e::fleet::HubProcess) -> String {
    std::fs::read_to_string(hub.data_dir.join("admin-token"))
        .unwrap()
        .trim()
        .to_string()
}

async fn call(
    method: &str,
    addr: std::net::SocketAddr,
    path: &str,
    token: &str,
) -> scale_agent_e2e::http::Response {
    scale_agent_e2e::http::Call::new(method, format!("http://{addr}{path}"))
        .bearer(token)
        .send()
        .await
        .unwrap()
}

/// Opens a stream presenting an agent bearer token and says Hello; the hub's refusal.
async fn stream_with_token(grpc: std::net::SocketAddr, token: &str) -> Result<(), tonic::Status> {
    let mut client = AgentHubClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(4);
    tx.send(pb::AgentMessage {
        seq: 1,
        kind: Some(Msg::Hello(pb::Hello {
            replica: "pod-t".into(),
            agent_version: "e2e".into(),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let mut inbound = client.session(request).await?.into_inner();
    // The Welcome: the stream was accepted.
    tokio::time::timeout(WAIT, inbound.message())
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("test: no Welcome"))??;
    Ok(())
}

async fn enroll_at(grpc: std::net::SocketAddr, token: &str) -> Result<String, tonic::Status> {
    let key = rcgen::KeyPair::generate().unwrap();
    let csr_pem = rcgen::CertificateParams::new(vec!["edge-agent".to_string()])
        .unwrap()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    let mut client = AgentHubClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    client
        .enroll(pb::EnrollRequest {
            token: token.into(),
            csr_pem,
        })
        .await
        .map(|r| r.into_inner().certificate.unwrap().identity)
}

/// Issues an agent token for `edge-agent` on the hub at `addr` (`once`: an enrolment
/// token): (token, id).
async fn issue_agent_token(
    addr: std::net::SocketAddr,
    admin: &str,
    once: bool,
) -> (String, String) {
    let path =
        format!("/api/v1/agent-tokens?identity=edge-agent&accounts=edge-*&ttl=1h&once={once}");
    let issued = call("POST", addr, &path, admin).await;
    assert_eq!(issued.status, 201, "{}", issued.body);
    let issued = issued.json_or_null();
    let field = |name: &str| issued[name].as_str().unwrap().to_string();
    (field("token"), field("id"))
}

/// Polls `refused` until it says yes; how long that took. Fails past `limit`.
async fn refused_within<F, Fut>(limit: Duration, what: &str, mut refused: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    loop {
        if refused().await {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "{what} still accepted {:?} after its revocation",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[path = "hub_ownership/clouddriver.rs"]
mod clouddriver;
#[path = "hub_ownership/credentials.rs"]
mod credentials;
#[path = "hub_ownership/failover.rs"]
mod failover;
#[path = "hub_ownership/forwarding.rs"]
mod forwarding;
#[path = "hub_ownership/lease.rs"]
mod lease;
