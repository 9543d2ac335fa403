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

/// The probe the ownership task sends while the store was unreachable and no account waits
/// to be acquired (issue 29): a read of the owners' table on the lock session, naming no
/// account. It answers while PostgreSQL is up, fails while it is stopped, answers again once
/// it is back (the lock session opened anew), and leaves nothing in the ownership tables.
#[tokio::test]
async fn the_ownership_probe_fails_while_postgres_is_down_and_answers_once_it_is_back() {
    let mut server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let ownership = PostgresOwnership::connect(&PostgresOptions::new(&url), replica("hub-a"))
        .await
        .unwrap();
    ownership.probe().await.unwrap();

    server.stop().await;
    let error = ownership
        .probe()
        .await
        .expect_err("the probe fails while PostgreSQL is stopped")
        .to_string();
    eprintln!("the probe while PostgreSQL is stopped: {error}");
    assert!(error.contains("PostgreSQL"), "{error}");

    server.start_again().await.unwrap();
    let started = std::time::Instant::now();
    while let Err(e) = ownership.probe().await {
        assert!(started.elapsed() < WAIT, "the probe still fails: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    for table in ["account_owners", "ownership_history"] {
        let statement = format!("SELECT count(*) FROM {table}");
        let rows: i64 = sql.query_one(statement.as_str(), &[]).await.unwrap().get(0);
        assert_eq!(rows, 0, "the probe wrote to {table}");
    }
}

#[tokio::test]
async fn one_owner_at_a_time_and_a_dead_owners_lock_frees_at_once() {
    let mut server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    let a = PostgresOwnership::connect(&PostgresOptions::new(&url), replica("hub-a"))
        .await
        .unwrap();
    let b = PostgresOwnership::connect(&PostgresOptions::new(&url), replica("hub-b"))
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
    // The lock is free at once: hub-b takes the account with the next epoch. "At once" as
    // the server goes: a terminated backend tells its client before it releases its locks,
    // so hub-a can see its loss a moment before hub-b can acquire (one full run saw that).
    let freed_by = std::time::Instant::now() + Duration::from_secs(2);
    let claim = loop {
        let claim = b.try_acquire("prod").await.unwrap();
        if matches!(claim, Claim::Acquired { .. }) || std::time::Instant::now() > freed_by {
            break claim;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(claim, Claim::Acquired { epoch: 2 });
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
            .map(|t| (t.replica.as_str(), t.epoch))
            .collect::<Vec<_>>(),
        [("hub-a", 1), ("hub-b", 2), ("hub-a", 3)]
    );
    assert_no_overlap("prod", &tenures);
    assert!(tenures[2].released.is_none(), "hub-a owns it now");

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
    assert_no_overlap("prod", &history(&sql, "prod").await);
    assert_no_overlap("staging", &history(&sql, "staging").await);

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
    // hub-a stores what its agent streams (fenced by its epoch) in the shared store.
    x.snapshot("prod", "100").await;
    let stored: i64 = sql
        .query_one(
            "SELECT count(*) FROM account_owners WHERE account = 'prod'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1);

    // An operation submitted to hub-b runs on hub-a's agent.
    let submit = tokio::spawn({
        let b_addr = b.hub.http_addr;
        let admin = b.admin.clone();
        async move { post_to(b_addr, &admin, "prod").await }
    });
    x.run_operation("pod-x").await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 200, "{body}");

    // The stream's batches commit with synchronous_commit off (the store's design: a crash
    // of PostgreSQL may lose the last ones, like an fsync-less commit of the embedded
    // store); once visible, a checkpoint makes them survive the kill below.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let stored: i64 = sql
            .query_one(
                "SELECT count(*) FROM resume_points WHERE account = 'prod'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if stored == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never stored");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sql.batch_execute("CHECKPOINT").await.unwrap();
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
    // The next owner resumes from what the last one stored: no relist.
    let promoted = standby.assignment().await;
    assert_eq!(Role::try_from(promoted.role).unwrap(), Role::Streaming);
    assert_eq!(
        promoted
            .resume_points
            .iter()
            .map(|r| r.resource_version.as_str())
            .collect::<Vec<_>>(),
        ["100"],
        "{promoted:?}"
    );
    let tenures = history(&sql, "prod").await;
    assert!(tenures.len() >= 3, "{tenures:?}");
    assert_no_overlap("prod", &tenures);
    assert_eq!(
        owner_row(&sql, "prod").await.map(|(replica, _)| replica),
        tenures.last().map(|t| t.replica.clone())
    );
    drop(standby);
    other.stop().await;
}

/// Requests for an account reaching a replica that does not own it are forwarded to the
/// owner without asking PostgreSQL for the owner each time (issue 26): 50 reads of the
/// account through hub-b all answered by hub-a, with at most a few lookups of the owner
/// (one per two-second TTL). When the owner stops, hub-b forgets the owner it kept and the
/// next request finds the new one: the account is served again without waiting for the TTL.
#[tokio::test]
async fn a_non_owner_looks_the_owner_up_once_not_per_request() {
    let server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let a = start_replica(&url, "hub-a").await;
    let b = start_replica(&url, "hub-b").await;
    let mut x = MiniAgent::connect(&a.hub, "pod-x").await;
    x.register_streaming("prod").await;

    let read = |replica: &Replica| {
        Call::new(
            "GET",
            format!("http://{}/api/v1/accounts/prod", replica.hub.http_addr),
        )
        .bearer(&replica.admin)
    };
    let started = tokio::time::Instant::now();
    for _ in 0..50 {
        let response = read(&b).send().await.unwrap();
        assert_eq!(response.status, 200, "{}", response.body);
        // Only the owner sees the agent's stream: hub-b's own view would not.
        assert!(
            response.body.contains(r#""state":"connected""#),
            "answered by the owner: {}",
            response.body
        );
    }
    let (queries, hits) = b.hub.owner_lookups();
    // One lookup per TTL (2 s) that the 50 reads spanned, the first included.
    let windows = started.elapsed().as_secs() / 2 + 1;
    assert!(
        queries <= windows && queries + hits == 50,
        "{queries} lookups of the owner in PostgreSQL and {hits} kept answers for 50 reads in {:?}",
        started.elapsed()
    );
    assert_eq!(
        a.hub.owner_lookups(),
        (0, 0),
        "the owner never looks itself up"
    );

    // The owner goes away; its agent reconnects to hub-b, which takes the account: hub-b
    // serves it itself, whatever it kept.
    a.stop().await;
    drop(x);
    let mut x = MiniAgent::connect(&b.hub, "pod-x").await;
    x.register_streaming("prod").await;
    let response = read(&b).send().await.unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    assert!(
        response.body.contains(r#""state":"connected""#),
        "{}",
        response.body
    );
    drop(x);
    b.stop().await;
}

/// A replica whose account was taken over behind its back (its lock connection not yet
/// broken, say) has its writes of that account refused by the store's fencing: they are
/// dropped, the rest of the queue is committed, and its agents' acknowledgements go on
/// instead of waiting for a store that would refuse forever.
#[tokio::test]
async fn writes_of_an_account_taken_over_are_dropped_not_retried_forever() {
    let server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let a = start_replica(&url, "hub-a").await;
    let mut x = MiniAgent::connect(&a.hub, "pod-x").await;
    x.register_streaming("prod").await;
    x.snapshot("prod", "100").await;
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    let objects = async |sql: &tokio_postgres::Client| -> i64 {
        sql.query_one("SELECT count(*) FROM objects WHERE account = 'prod'", &[])
            .await
            .unwrap()
            .get(0)
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    while objects(&sql).await != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the snapshot was never stored"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another replica's tenure, as the store sees it.
    sql.execute(
        "UPDATE account_owners SET replica = 'hub-z', epoch = epoch + 1 WHERE account = 'prod'",
        &[],
    )
    .await
    .unwrap();
    // hub-a's next writes of the account are refused and dropped; the agent is acknowledged.
    x.send(Msg::Object(pb::ObjectEvent {
        account: "prod".into(),
        kind: Some(pb::Kind {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        }),
        r#type: pb::object_event::Type::Applied as i32,
        namespace: "default".into(),
        name: "two".into(),
        uid: "uid-two".into(),
        resource_version: "101".into(),
        object_json: br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"two","namespace":"default","uid":"uid-two","resourceVersion":"101"}}"#.to_vec(),
        truncated: false,
        watch_namespace: String::new(),
    }))
    .await;
    while x.acked < x.seq {
        x.next(|kind| matches!(kind, Out::Ack(_)).then_some(()))
            .await
            .expect("the agent was acknowledged");
    }
    // The store never turns failing over it (which would hold every agent's
    // acknowledgements), and the write is not stored.
    for _ in 0..20 {
        assert_eq!(get_status(a.hub.http_addr, "/readyz/store").await, 200);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(objects(&sql).await, 1, "the fenced write was stored");
    drop(x);
    a.stop().await;
}

/// The status of an unauthenticated GET on a plaintext hub.
async fn get_status(addr: std::net::SocketAddr, path: &str) -> u16 {
    Call::new("GET", format!("http://{addr}{path}"))
        .send()
        .await
        .unwrap()
        .status
}

/// Issue 16's failover, as processes: three hub replicas on one PostgreSQL, three accounts
/// each streamed through one replica with a standby on the next; one replica is killed
/// (SIGKILL) while its agent streams; its account streams again on the next replica, resumed
/// from the stored resume point (no relist); an operation submitted to any replica reaches
/// the account's streaming agent; the ownership history never overlaps.
#[tokio::test]
async fn three_replicas_one_killed_every_account_streams_again_without_relisting() {
    let server = PostgresServer::start().await.unwrap();
    let (root, mut hubs) = hub_processes(&server, "three", 3, &[]).await;
    // Account a<i> streams through hub i, with a standby agent on hub i+1.
    let mut streaming = Vec::new();
    let mut standbys = Vec::new();
    for i in 0..3 {
        let account = format!("a{i}");
        let mut agent = MiniAgent::connect_to(hubs[i].grpc, &format!("pod-{i}-0")).await;
        agent.register_streaming(&account).await;
        agent.snapshot(&account, "100").await;
        let mut standby =
            MiniAgent::connect_to(hubs[(i + 1) % 3].grpc, &format!("pod-{i}-1")).await;
        standby.register(&account).await;
        assert_eq!(standby.role().await, Role::Standby);
        streaming.push(agent);
        standbys.push(standby);
    }
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    for i in 0..3 {
        assert_eq!(
            owner_row(&sql, &format!("a{i}")).await.map(|o| o.0),
            Some(format!("hub-{i}"))
        );
    }

    // hub-0 is killed while its agent streams.
    hubs[0].kill();
    let killed_at = std::time::Instant::now();
    // a0's standby on hub-1 streams, from the stored resume point.
    let promoted = tokio::time::timeout(WAIT, standbys[0].assignment())
        .await
        .expect("a0 streams again");
    assert_eq!(Role::try_from(promoted.role).unwrap(), Role::Streaming);
    assert_eq!(
        promoted
            .resume_points
            .iter()
            .map(|r| r.resource_version.as_str())
            .collect::<Vec<_>>(),
        ["100"],
        "{promoted:?}"
    );
    eprintln!("a0 streamed again {:?} after the kill", killed_at.elapsed());
    assert_eq!(
        owner_row(&sql, "a0").await.map(|o| o.0).as_deref(),
        Some("hub-1")
    );
    // The other accounts kept their owners.
    assert_eq!(
        owner_row(&sql, "a1").await.map(|o| o.0).as_deref(),
        Some("hub-1")
    );
    assert_eq!(
        owner_row(&sql, "a2").await.map(|o| o.0).as_deref(),
        Some("hub-2")
    );

    // An operation on a0 submitted to hub-2 runs on its agent now streaming on hub-1.
    let submit = tokio::spawn({
        let addr = hubs[2].http;
        async move { post_to(addr, scale_agent_e2e::fixtures::API_TOKEN, "a0").await }
    });
    standbys[0].run_operation("pod-0-1").await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 200, "{body}");

    for i in 0..3 {
        let account = format!("a{i}");
        assert_no_overlap(&account, &history(&sql, &account).await);
    }
    let a0 = history(&sql, "a0").await;
    assert_eq!(
        a0.iter().map(|t| t.replica.as_str()).collect::<Vec<_>>(),
        ["hub-0", "hub-1"]
    );
    drop((streaming, standbys));
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}

/// Submits a json patch under client id `id` to the hub at `addr` (the API token of the
/// tests' hubs) and waits for its result: (status, body as JSON).
async fn patch_with_id(
    addr: std::net::SocketAddr,
    account: &str,
    id: &str,
) -> (u16, serde_json::Value) {
    let body = serde_json::json!({
        "type": "patch", "id": id, "kind": "ConfigMap", "namespace": "default", "name": "two",
        "patchType": "json", "patch": [{"op": "add", "path": "/data/n", "value": "1"}],
    });
    let url = format!("http://{addr}/api/v1/accounts/{account}/operations");
    let mut call = Call::new("POST", url)
        .bearer(scale_agent_e2e::fixtures::API_TOKEN)
        .header("content-type", "application/json")
        .timeout(wait::WAIT);
    call.body = Some(body.to_string().into_bytes());
    let response = call.send().await.unwrap();
    (response.status, response.json_or_null())
}

/// Client ids are claimed in the shared store (issue 29): an operation with a client id
/// finishes through its owner, the owner is killed (SIGKILL), the account streams on the
/// other replica, and the same id retried there answers the first outcome without reaching
/// the agent again, so a retried json patch does not run twice. (That a new id does reach
/// the agent through another replica is `three_replicas_one_killed_...`.)
#[tokio::test]
async fn a_client_id_retried_on_another_replica_after_the_owner_died_runs_once() {
    let server = PostgresServer::start().await.unwrap();
    let (root, mut hubs) = hub_processes(&server, "client-ids", 2, &[]).await;
    let mut owner_agent = MiniAgent::connect_to(hubs[0].grpc, "pod-0").await;
    owner_agent.register_streaming("a0").await;
    owner_agent.snapshot("a0", "100").await;
    let mut standby = MiniAgent::connect_to(hubs[1].grpc, "pod-1").await;
    standby.register("a0").await;
    assert_eq!(standby.role().await, Role::Standby);

    let submit = tokio::spawn({
        let addr = hubs[0].http;
        async move { patch_with_id(addr, "a0", "deploy-42").await }
    });
    owner_agent.run_operation("pod-0").await;
    let (code, first) = submit.await.unwrap();
    assert_eq!(code, 200, "{first}");
    assert_eq!(first["state"], "succeeded", "{first}");
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    let stored: i64 = sql
        .query_one(
            "SELECT count(*) FROM operation_records WHERE account = 'a0' AND id = 'deploy-42'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1, "the claim is in the shared store");
    let submitter: String = sql
        .query_one(
            "SELECT submitter FROM operation_records WHERE account = 'a0' AND id = 'deploy-42'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        submitter,
        format!("api:{}", scale_agent_e2e::fixtures::API_TOKEN_NAME),
        "the claim is the caller's (F18)"
    );

    hubs[0].kill();
    let promoted = tokio::time::timeout(WAIT, standby.assignment())
        .await
        .expect("a0 streams again on hub-1");
    assert_eq!(Role::try_from(promoted.role).unwrap(), Role::Streaming);

    // The retry on hub-1: the first outcome, and nothing reaches the agent.
    let (code, again) = patch_with_id(hubs[1].http, "a0", "deploy-42").await;
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["state"], "succeeded", "{again}");
    assert_eq!(again["id"], "deploy-42", "{again}");
    assert_eq!(again["replica"], first["replica"], "{again}");
    // Whatever the agent hears next (the mini agent sends no heartbeats, so the hub ends
    // its stream after two periods), it is no operation.
    let sent = tokio::time::timeout(
        Duration::from_secs(3),
        standby.next(|kind| match kind {
            Out::Operation(op) => Some(op),
            _ => None,
        }),
    )
    .await;
    assert!(
        !matches!(sent, Ok(Ok(_))),
        "the retried id reached the agent: {sent:?}"
    );
    drop((owner_agent, standby));
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}

/// A frozen owner (SIGSTOP: its sockets stay open and its kernel still answers TCP) loses
/// its accounts when its lock session's lease ends (issue 29): PostgreSQL ends the silent
/// session, the other replica takes the account with the next epoch and promotes its
/// standby, from the stored resume point, within 30 s; after SIGCONT the old owner finds its
/// lease gone and ends the stream it served; the ownership history never overlaps.
#[tokio::test]
async fn a_frozen_owner_loses_its_accounts_within_the_lease() {
    let server = PostgresServer::start().await.unwrap();
    let (root, hubs) = hub_processes(&server, "frozen", 2, &[]).await;
    // Agents that ask for a long heartbeat period: they stay connected while silent.
    let mut owner_agent = MiniAgent::connect_asking(hubs[0].grpc, "pod-0", 60).await;
    owner_agent.register_streaming("a0").await;
    owner_agent.snapshot("a0", "100").await;
    let mut standby = MiniAgent::connect_asking(hubs[1].grpc, "pod-1", 60).await;
    standby.register("a0").await;
    assert_eq!(standby.role().await, Role::Standby);
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    assert_eq!(
        owner_row(&sql, "a0").await.map(|o| o.0).as_deref(),
        Some("hub-0")
    );

    let pid = hubs[0].pid().expect("hub-0 runs");
    scale_agent_e2e::process::send_signal(pid, libc::SIGSTOP);
    let frozen_at = std::time::Instant::now();
    let promoted = tokio::time::timeout(Duration::from_secs(60), standby.assignment())
        .await
        .expect("a0 streams again on hub-1 while hub-0 is frozen");
    let took = frozen_at.elapsed();
    eprintln!("a0 streamed again {took:?} after hub-0 was frozen");
    assert_eq!(Role::try_from(promoted.role).unwrap(), Role::Streaming);
    assert_eq!(
        promoted
            .resume_points
            .iter()
            .map(|r| r.resource_version.as_str())
            .collect::<Vec<_>>(),
        ["100"],
        "resumed, not relisted: {promoted:?}"
    );
    assert!(took <= Duration::from_secs(30), "taken over after {took:?}");
    assert_eq!(
        owner_row(&sql, "a0").await.map(|o| o.0).as_deref(),
        Some("hub-1")
    );

    // Thawed, hub-0 finds its lease gone and stops serving a0 at once.
    scale_agent_e2e::process::send_signal(pid, libc::SIGCONT);
    let thawed_at = std::time::Instant::now();
    let ended = owner_agent.next(|_| None::<()>).await.unwrap_err();
    eprintln!(
        "hub-0 ended a0's stream {:?} after SIGCONT: {ended:?}",
        thawed_at.elapsed()
    );
    assert!(ended.message().contains("lost the ownership"), "{ended:?}");
    assert!(
        thawed_at.elapsed() < Duration::from_secs(15),
        "{:?}",
        thawed_at.elapsed()
    );
    let tenures = history(&sql, "a0").await;
    assert_no_overlap("a0", &tenures);
    assert_eq!(
        tenures
            .iter()
            .map(|t| t.replica.as_str())
            .collect::<Vec<_>>(),
        ["hub-0", "hub-1"]
    );
    assert_eq!(
        owner_row(&sql, "a0").await.map(|o| o.0).as_deref(),
        Some("hub-1"),
        "hub-0 took nothing back"
    );
    drop((owner_agent, standby));
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}

/// A replica cut off from PostgreSQL by a silent partition (issue 29; a relay that stops
/// relaying without closing anything, as dropped packets do): its heartbeat on the lock
/// session fails, so it ends the streams of the accounts it owned, before PostgreSQL ends
/// the silent session and the other replica takes them over; the ownership history never
/// overlaps, and after the partition heals the account stays with its new owner.
#[tokio::test]
async fn a_replica_partitioned_from_postgres_stops_serving_before_another_takes_over() {
    let server = PostgresServer::start().await.unwrap();
    let relay = scale_agent_e2e::relay::Relay::start(
        format!("127.0.0.1:{}", server.port()).parse().unwrap(),
    )
    .await
    .unwrap();
    let root =
        std::env::temp_dir().join(format!("scale-agent-e2e-partition-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let secret_file = root.join("replica-secret");
    std::fs::write(&secret_file, SECRET).unwrap();
    let mut hubs = Vec::new();
    for i in 0..2 {
        // hub-0 reaches PostgreSQL through the relay.
        let url = if i == 0 {
            server.url().replace(
                &format!("127.0.0.1:{}", server.port()),
                &relay.addr().to_string(),
            )
        } else {
            server.url()
        };
        let url_file = root.join(format!("postgres-url-{i}"));
        std::fs::write(&url_file, url).unwrap();
        let flags = [
            "--store=postgres".to_string(),
            // The harness\'s PostgreSQL is plaintext on loopback.
            "--postgres-insecure-tls".to_string(),
            format!("--postgres-url-file={}", url_file.display()),
            format!("--replica-id=hub-{i}"),
            "--replica-address=http://{http}".to_string(),
            format!("--replica-secret-file={}", secret_file.display()),
            format!("--replica-sync-period={}ms", SYNC.as_millis()),
        ];
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        hubs.push(
            scale_agent_e2e::fleet::HubProcess::start(&root.join(format!("hub-{i}")), &flags)
                .await
                .unwrap(),
        );
    }
    let mut owner_agent = MiniAgent::connect_asking(hubs[0].grpc, "pod-0", 60).await;
    owner_agent.register_streaming("a0").await;
    owner_agent.snapshot("a0", "100").await;
    let mut standby = MiniAgent::connect_asking(hubs[1].grpc, "pod-1", 60).await;
    standby.register("a0").await;
    assert_eq!(standby.role().await, Role::Standby);
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    assert_eq!(
        owner_row(&sql, "a0").await.map(|o| o.0).as_deref(),
        Some("hub-0")
    );

    relay.blackhole();
    let partitioned_at = std::time::Instant::now();
    let ended = owner_agent.next(|_| None::<()>).await.unwrap_err();
    let stopped = partitioned_at.elapsed();
    eprintln!("hub-0 ended a0's stream {stopped:?} into the partition: {ended:?}");
    assert!(ended.message().contains("lost the ownership"), "{ended:?}");
    let promoted = tokio::time::timeout(Duration::from_secs(60), standby.assignment())
        .await
        .expect("a0 streams again on hub-1");
    let taken = partitioned_at.elapsed();
    eprintln!("a0 streamed again on hub-1 {taken:?} into the partition");
    assert_eq!(Role::try_from(promoted.role).unwrap(), Role::Streaming);
    assert!(
        stopped < taken,
        "the old owner stopped ({stopped:?}) after the new one took over ({taken:?})"
    );
    assert!(taken <= Duration::from_secs(30), "{taken:?}");
    let tenures = history(&sql, "a0").await;
    assert_no_overlap("a0", &tenures);
    assert_eq!(
        tenures
            .iter()
            .map(|t| t.replica.as_str())
            .collect::<Vec<_>>(),
        ["hub-0", "hub-1"]
    );

    // The partition heals: the account stays with hub-1.
    relay.restore();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        owner_row(&sql, "a0").await.map(|o| o.0).as_deref(),
        Some("hub-1")
    );
    drop((owner_agent, standby));
    drop(hubs);
    drop(relay);
    let _ = std::fs::remove_dir_all(&root);
}

// ------------------------------------------------ Clouddriver registration with replicas

/// The replica holding the Clouddriver registrar's lock, as PostgreSQL sees it.
async fn registrar(sql: &tokio_postgres::Client) -> Option<String> {
    let rows = sql
        .query(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted \
             AND a.application_name LIKE '% clouddriver-registrar'",
            &[],
        )
        .await
        .unwrap();
    assert!(rows.len() <= 1, "two registrars");
    rows.first().map(|row| {
        let name: String = row.get(0);
        name.split(' ').nth(1).unwrap_or_default().to_string()
    })
}

/// Agent `pod-<i>` of account `prod-<i>`, whose hub died, streams again through `grpc`.
async fn reconnect(agent: &mut MiniAgent, grpc: std::net::SocketAddr, i: usize) {
    *agent = MiniAgent::connect_asking(grpc, &format!("pod-{i}"), 300).await;
    agent.register_streaming(&format!("prod-{i}")).await;
}

/// What the contract saw: (PUTs, DELETEs).
fn puts_and_deletes(contract: &Contract) -> (usize, Vec<String>) {
    let seen = contract.seen();
    let puts = seen.iter().filter(|s| s.method == "PUT").count();
    let deletes = seen
        .iter()
        .filter(|s| s.method == "DELETE")
        .map(|s| s.path.clone())
        .collect();
    (puts, deletes)
}

/// Three hub processes on one PostgreSQL register their accounts in Clouddriver (the
/// contract server of the hub's tests, written from Clouddriver's source: see
/// `scale_agent_testkit::contract`): exactly one replica (the holder of the registrar's lock)
/// registers every account of the store, whichever replica streams it, each once; a replica
/// restarted (which loads every account and forgets those it does not stream after the grace
/// period) deletes nothing; killing the registrar moves the duty to another replica within
/// seconds, with no DELETE and no account sent again, and the new registrar registers new
/// accounts; so does a break of the registrar's lock connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_replica_registers_every_account_in_clouddriver_and_the_duty_survives_its_death() {
    const PUBLIC_URL: &str = "https://hub.example:8443";
    let server = PostgresServer::start().await.unwrap();
    let (contract, contract_url) = contract::start_contract_for(PUBLIC_URL).await;
    let extra = [
        format!("--public-url={PUBLIC_URL}"),
        format!("--clouddriver-url={contract_url}"),
        // Replicas forget accounts they do not stream quickly.
        "--grace-period=2s".to_string(),
    ];
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let (root, mut hubs) = hub_processes(&server, "registrar", 3, &extra).await;
    // Account prod-<i> streams through hub i; its agent asks for rare heartbeats, so that it
    // stays connected without sending any.
    let mut agents = Vec::new();
    for (i, hub) in hubs.iter().enumerate() {
        let mut agent = MiniAgent::connect_asking(hub.grpc, &format!("pod-{i}"), 300).await;
        agent.register_streaming(&format!("prod-{i}")).await;
        agents.push(agent);
    }
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    let wanted = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let deadline = std::time::Instant::now() + WAIT;
    while contract.accounts().into_keys().collect::<Vec<_>>()
        != wanted(&["prod-0", "prod-1", "prod-2"])
    {
        if std::time::Instant::now() > deadline {
            for hub in &hubs {
                eprintln!("---\n{}", hub.log_tail(40));
            }
            panic!(
                "prod-0, prod-1 and prod-2 not registered: {:?}, registrar {:?}",
                contract.seen(),
                registrar(&sql).await
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = registrar(&sql)
        .await
        .expect("a replica holds the registrar's lock");
    let index = |id: &str| (0..3).find(|i| format!("hub-{i}") == id).unwrap();
    let first = index(&first);
    assert_eq!(puts_and_deletes(&contract), (3, vec![]));

    // A replica that is not the registrar restarts: it loads every account from the store
    // and forgets those it does not stream after the grace period, and removes nothing.
    let other = (first + 1) % 3;
    // A replica that is killed in neither step below, for agents to reconnect to.
    let steady = (first + 2) % 3;
    hubs[other].kill();
    // Its agent reconnects to a live replica, as a real one does through the Service: an
    // account left without an agent past the grace period is swept from the store, and so
    // removed from Clouddriver, like an ORPHANED account of a single hub.
    reconnect(&mut agents[other], hubs[steady].grpc, other).await;
    hubs[other].start_again().await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        puts_and_deletes(&contract),
        (3, vec![]),
        "the restarted hub-{other} changed the registrations"
    );
    assert_eq!(
        contract.accounts().into_keys().collect::<Vec<_>>(),
        wanted(&["prod-0", "prod-1", "prod-2"])
    );

    // The registrar dies: another replica takes the duty within seconds.
    hubs[first].kill();
    let killed = std::time::Instant::now();
    reconnect(&mut agents[first], hubs[steady].grpc, first).await;
    let mut second = None;
    while second.is_none() && killed.elapsed() < WAIT {
        second = registrar(&sql)
            .await
            .filter(|r| *r != format!("hub-{first}"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = index(&second.expect("another replica takes the registrar's lock"));
    eprintln!(
        "hub-{second} took the registrar's duty {:?} after hub-{first} was killed",
        killed.elapsed()
    );
    // The new registrar registers an account streamed by another replica.
    let third = (0..3).find(|i| *i != first && *i != second).unwrap();
    let mut late = MiniAgent::connect_asking(hubs[third].grpc, "pod-late", 300).await;
    late.register_streaming("prod-3").await;
    wait::eventually(
        "prod-3 registered by the new registrar",
        WAIT,
        POLL,
        async || contract.accounts().contains_key("prod-3"),
    )
    .await;
    // Its first pass is over (prod-3 was sent after it): nothing else was sent.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        puts_and_deletes(&contract),
        (4, vec![]),
        "the takeover sent unchanged accounts again or removed some"
    );
    assert_eq!(
        contract.accounts().into_keys().collect::<Vec<_>>(),
        wanted(&["prod-0", "prod-1", "prod-2", "prod-3"])
    );

    // The registrar's lock connection breaks (its process lives on): it stops registering,
    // and a replica (maybe itself, connected again) takes the duty over as after a death.
    let terminated: i64 = sql
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name LIKE '% clouddriver-registrar' \
             AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(terminated, 1);
    let mut last = MiniAgent::connect_asking(hubs[third].grpc, "pod-last", 300).await;
    last.register_streaming("prod-4").await;
    wait::eventually(
        "prod-4 registered after the lock connection broke",
        WAIT,
        POLL,
        async || contract.accounts().contains_key("prod-4"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(registrar(&sql).await.is_some());
    assert_eq!(
        puts_and_deletes(&contract),
        (5, vec![]),
        "the broken lock connection led to a removal or a repeated registration"
    );
    drop((agents, late, last));
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}

// ------------------------------------------------ what replicas keep in step (issue 16)

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

/// A proxy token, an API token, an agent bearer token and an enrolment token issued on one
/// replica work on another at once (looked up in the store on a miss); an enrolment token
/// works once across replicas; revoked on the first, each is refused on the other within
/// the sync period.
#[tokio::test]
async fn credentials_issued_on_one_replica_work_on_another_at_once_and_revocations_reach_it() {
    let server = PostgresServer::start().await.unwrap();
    let (root, hubs) = hub_processes(&server, "credentials", 2, &[]).await;
    let (a, b) = (&hubs[0], &hubs[1]);
    let admin = admin_token(a);

    // A kubeconfig (proxy token) issued on hub-0 opens hub-1's proxy at once.
    let kubeconfig = call("POST", a.http, "/api/v1/accounts/prod/kubeconfig", &admin).await;
    assert_eq!(kubeconfig.status, 200, "{}", kubeconfig.body);
    let proxy_token = kubeconfig
        .body
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let through_b = call("GET", b.http, "/clusters/prod/api", &proxy_token).await;
    assert_ne!(
        through_b.status, 401,
        "hub-1 refused a token hub-0 issued: {}",
        through_b.body
    );
    // (An unknown token is refused there: the status above tells them apart.)
    let unknown = call("GET", b.http, "/clusters/prod/api", "sat_unknown-token").await;
    assert_eq!(unknown.status, 401, "{}", unknown.body);

    // An API token issued on hub-0 opens hub-1's API at once.
    let created =
        scale_agent_e2e::http::Call::new("POST", format!("http://{}/api/v1/tokens", a.http))
            .bearer(&admin)
            .json(&serde_json::json!({"name": "ci", "role": "reader"}))
            .send()
            .await
            .unwrap();
    assert_eq!(created.status, 200, "{}", created.body);
    let created = created.json_or_null();
    let api_token = created["token"].as_str().unwrap().to_string();
    let api_id = created["id"].as_str().unwrap().to_string();
    let agents = call("GET", b.http, "/api/v1/agents", &api_token).await;
    assert_eq!(agents.status, 200, "{}", agents.body);

    // An agent bearer token issued on hub-0 opens a stream on hub-1 at once.
    let (bearer_token, bearer_id) = issue_agent_token(a.http, &admin, false).await;
    stream_with_token(b.grpc, &bearer_token).await.unwrap();

    // An enrolment token issued on hub-0 enrols on hub-1 at once, and only once: hub-0
    // refuses it afterwards.
    let (enrolment_token, _) = issue_agent_token(a.http, &admin, true).await;
    assert_eq!(
        enroll_at(b.grpc, &enrolment_token).await.unwrap(),
        "edge-agent"
    );
    let again = enroll_at(a.grpc, &enrolment_token).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::PermissionDenied, "{again:?}");
    assert!(again.message().contains("already used"), "{again:?}");

    // Revoked on hub-0, each is refused on hub-1 within the sync period (and a little).
    let limit = SYNC * 2 + Duration::from_secs(2);
    let tokens = call("GET", a.http, "/api/v1/tokens", &admin)
        .await
        .json_or_null();
    let proxy_id = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["kind"] == "proxy" && t["account"] == "prod")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    for id in [&proxy_id, &api_id] {
        let revoked = call("DELETE", a.http, &format!("/api/v1/tokens/{id}"), &admin).await;
        assert_eq!(revoked.status, 200, "{}", revoked.body);
    }
    let revoked = call(
        "DELETE",
        a.http,
        &format!("/api/v1/agent-tokens/{bearer_id}"),
        &admin,
    )
    .await;
    assert_eq!(revoked.status, 200, "{}", revoked.body);
    let took = refused_within(limit, "the proxy token", || async {
        call("GET", b.http, "/clusters/prod/api", &proxy_token)
            .await
            .status
            == 401
    })
    .await;
    eprintln!("proxy token refused on hub-1 {took:?} after its revocation on hub-0");
    refused_within(limit, "the API token", || async {
        call("GET", b.http, "/api/v1/agents", &api_token)
            .await
            .status
            == 401
    })
    .await;
    refused_within(limit, "the agent bearer token", || async {
        matches!(
            stream_with_token(b.grpc, &bearer_token).await,
            Err(status) if status.code() == tonic::Code::Unauthenticated
        )
    })
    .await;
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}

/// Lines of a hub process's log holding every one of `needles`.
fn log_lines(hub: &scale_agent_e2e::fleet::HubProcess, needles: &[&str]) -> usize {
    hub.log_tail(100_000)
        .lines()
        .filter(|line| needles.iter().all(|n| line.contains(n)))
        .count()
}

/// `GET /api/v1/accounts` and `/api/v1/agents` on any replica answer for every replica
/// (accounts with their owner, agents with the replica they reach; a replica that cannot
/// be asked is listed as unreachable); a replica holds an account registered through
/// another to its cluster; a dynamic account added through one replica reaches the agent
/// streaming to another; an account no replica owns past the grace period
/// (its owner released it, or died) is cleaned out of the shared store once, its binding
/// kept.
#[tokio::test]
async fn every_replica_lists_every_account_and_an_orphaned_account_is_swept_once() {
    let server = PostgresServer::start().await.unwrap();
    let (root, mut hubs) = hub_processes(
        &server,
        "fleet",
        3,
        &["--grace-period=3s", "--log-format=json"],
    )
    .await;
    let mut agents = Vec::new();
    for (i, hub) in hubs.iter().take(2).enumerate() {
        let account = format!("a{i}");
        // Silent for longer than the hub's heartbeat period (1 s), the agents stay.
        let mut agent = MiniAgent::connect_asking(hub.grpc, &format!("pod-{i}"), 30).await;
        agent.register_streaming(&account).await;
        agent.snapshot(&account, "100").await;
        agents.push(agent);
    }

    // hub-2 serves no agent, yet lists both accounts as their owners see them.
    let token = scale_agent_e2e::fixtures::API_TOKEN;
    let started = std::time::Instant::now();
    let accounts = loop {
        let list = call("GET", hubs[2].http, "/api/v1/accounts", token).await;
        assert_eq!(list.status, 200, "{}", list.body);
        let list = list.json_or_null();
        let complete = (0..2).all(|i| {
            list.as_array().unwrap().iter().any(|a| {
                a["name"] == format!("a{i}")
                    && a["owner"]["replica"] == format!("hub-{i}")
                    && a["objects"] == 1
                    && a["accountState"] == "ACTIVE"
            })
        });
        if complete {
            break list;
        }
        assert!(started.elapsed() < WAIT, "hub-2 lists {list}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("hub-2 lists {accounts}");
    let agents_seen = call("GET", hubs[2].http, "/api/v1/agents", token)
        .await
        .json_or_null();
    for i in 0..2 {
        assert!(
            agents_seen
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["replica"] == format!("pod-{i}")
                    && a["hubReplica"] == format!("hub-{i}")
                    && a["accounts"][0]["role"] == "STREAMING"),
            "{agents_seen}"
        );
    }

    // hub-2, which started before a0 was registered, holds a0 to its cluster too.
    let mut rival = MiniAgent::connect_asking(hubs[2].grpc, "pod-rival", 30).await;
    rival.register_cluster("a0", "https://10.9.9.9:6443").await;
    let refused = rival.assignment().await;
    assert_eq!(Role::try_from(refused.role).unwrap(), Role::Rejected);
    assert!(
        refused.reason.contains("bound to cluster"),
        "{}",
        refused.reason
    );
    drop(rival);

    // A dynamic account added through hub-0 reaches the agent streaming to hub-1 within
    // the sync period.
    let admin = admin_token(&hubs[0]);
    let added = scale_agent_e2e::http::Call::new(
        "POST",
        format!("http://{}/api/v1/dynamic-accounts", hubs[0].http),
    )
    .bearer(&admin)
    .json(&serde_json::json!({
        "name": "dyn-a", "agent": "anonymous",
        "kubeconfigSecret": {"namespace": "spinnaker", "name": "dyn-a-kubeconfig"},
    }))
    .send()
    .await
    .unwrap();
    assert_eq!(added.status, 201, "{}", added.body);
    let sent = tokio::time::timeout(
        SYNC * 2 + Duration::from_secs(2),
        agents[1].next(|kind| match kind {
            Out::DynamicAccounts(set) if set.accounts.iter().any(|a| a.account == "dyn-a") => {
                Some(set)
            }
            _ => None,
        }),
    )
    .await
    .expect("the dynamic account reached the agent on hub-1 within the sync period")
    .unwrap();
    assert_eq!(sent.accounts.len(), 1);

    // hub-1 dies: until the others forget it, it is listed as unreachable, not left out.
    hubs[1].kill();
    let agents_seen = call("GET", hubs[0].http, "/api/v1/agents", token)
        .await
        .json_or_null();
    assert!(
        agents_seen
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["hubReplica"] == "hub-1" && a["unreachable"].is_string()),
        "{agents_seen}"
    );

    // a1's owner died, a0's agent leaves hub-0 (which releases it): past the grace period
    // both are cleaned out of the store, bindings kept.
    drop(agents);
    let sql = postgres::connect(&server.superuser_url()).await.unwrap();
    let count = |table: &'static str| {
        let sql = &sql;
        async move {
            let row = sql
                .query_one(
                    &format!("SELECT count(*) FROM {table} WHERE account IN ('a0', 'a1')"),
                    &[],
                )
                .await
                .unwrap();
            row.get::<_, i64>(0)
        }
    };
    let started = std::time::Instant::now();
    while count("accounts").await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the orphaned accounts are still stored"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "orphans swept {:?} after their agents left",
        started.elapsed()
    );
    for table in ["kinds", "objects", "resume_points"] {
        assert_eq!(count(table).await, 0, "{table}");
    }
    assert_eq!(count("account_bindings").await, 2);
    // Swept once: by one replica, one log line per account, even a few syncs later.
    tokio::time::sleep(SYNC * 3).await;
    for account in ["a0", "a1"] {
        let needle = format!("\"account\":\"{account}\"");
        let lines: usize = [&hubs[0], &hubs[2]]
            .iter()
            .map(|hub| log_lines(hub, &["removed from the shared store", &needle]))
            .sum();
        assert_eq!(lines, 1, "{account} was swept {lines} times");
    }
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}

/// Scans of the `tokens` table PostgreSQL counted (sequential and by index), after its
/// statistics of the last second are flushed.
async fn tokens_scans(sql: &tokio_postgres::Client) -> i64 {
    tokio::time::sleep(Duration::from_millis(1100)).await;
    sql.batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    sql.query_one(
        "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables \
         WHERE relname = 'tokens'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Review F10: anyone who reaches the HTTP port can present made-up `sat_…` tokens, and a
/// replica looks a token it does not know up in PostgreSQL (a scan of `tokens`) before
/// refusing it. A flood of 600 distinct made-up tokens (and 600 repeats of one) costs the
/// store a bounded number of scans (the guard's burst and rate, plus the replicas' own
/// refreshes), every one answered 401; a token issued on the other replica still works at
/// once afterwards.
#[tokio::test]
async fn a_flood_of_unknown_tokens_costs_the_store_a_bounded_number_of_lookups() {
    let server = PostgresServer::start().await.unwrap();
    let url = server.url();
    let a = start_replica(&url, "hub-a").await;
    let b = start_replica(&url, "hub-b").await;
    let sql = server.connect_to(&server.superuser_url()).await.unwrap();

    let before = tokens_scans(&sql).await;
    let started = std::time::Instant::now();
    let api = format!("http://{}/api/v1/agents", b.hub.http_addr);
    let mut refused = 0;
    for batch in 0..12 {
        let calls = (0..100).map(|i| {
            // Half distinct, half the same one again (the negative cache's case).
            let token = if i % 2 == 0 {
                format!("sat_made-up-{batch}-{i}")
            } else {
                "sat_made-up-again".to_string()
            };
            let api = api.clone();
            async move { Call::new("GET", api).bearer(&token).send().await.unwrap() }
        });
        for response in futures::future::join_all(calls).await {
            assert_eq!(response.status, 401, "{}", response.body);
            refused += 1;
        }
    }
    let flood = started.elapsed();
    let scans = tokens_scans(&sql).await - before;
    // The guard: 20 at once and 20 a second; the refreshes: each replica reads the table
    // every sync period (2 s); slack for the flushes' timing.
    let bound = 20 + 20 * (flood.as_secs() as i64 + 3) + 2 * (flood.as_secs() as i64 / 2 + 3);
    eprintln!(
        "[F10] {refused} made-up tokens refused in {flood:?}: {scans} scans of tokens (bound {bound})"
    );
    assert_eq!(refused, 1200);
    assert!(
        scans <= bound,
        "{scans} scans of the tokens table for {refused} unknown tokens in {flood:?} (bound {bound})"
    );

    // A token issued on hub-a works on hub-b at once (its lookup is within the rate again).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let created = Call::new("POST", format!("http://{}/api/v1/tokens", a.hub.http_addr))
        .bearer(&a.admin)
        .json(&serde_json::json!({"name": "ci", "role": "reader"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status, 200, "{}", created.body);
    let token = created.json_or_null()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let agents = Call::new("GET", api).bearer(&token).send().await.unwrap();
    assert_eq!(agents.status, 200, "{}", agents.body);
    a.stop().await;
    b.stop().await;
}
