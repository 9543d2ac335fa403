//! Several hub replicas sharing their accounts (issue 16), in-process, with ownership from
//! a shared in-process directory: only the owner streams an account; a proxy request or an
//! operation arriving at another replica is forwarded to the owner over the internal
//! channel (never further); when the owner dies, a replica with a standby agent takes the
//! account and promotes it, and the history of owners shows no overlap.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{path::PathBuf, sync::Arc, time::Duration};

use common::*;
use scale_agent_hub::{
    RunningHub,
    owners::{OwnershipSource, directory::Directory, forward::ReplicaSecret},
    store::StoreOp,
};
use scale_agent_proto::v1::account_assignment::Role;

const SECRET: &str = "0123456789abcdef0123456789abcdef-test";

struct Replica {
    hub: RunningHub,
    dir: PathBuf,
    http: Https,
    admin: String,
}

async fn replica(pki: &Pki, directory: &Arc<Directory>, name: &str) -> Replica {
    replica_reached_at(pki, directory, name, "127.0.0.1", "localhost", None).await
}

/// A replica listening on `bind`, which the others reach at `https://<host>:<port>`,
/// verifying the other replicas' certificates for `server_name` (`--replica-server-name`).
async fn replica_reached_at(
    pki: &Pki,
    directory: &Arc<Directory>,
    name: &str,
    bind: &str,
    host: &str,
    server_name: Option<&str>,
) -> Replica {
    // Tests run side by side in one process: each replica has a directory of its own.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = data_dir(&format!("replicas-{name}-{n}"));
    let port = free_port();
    let hub = start_hub(pki, &dir, |c| {
        serve_https(pki, c);
        c.listeners.http_addr = format!("{bind}:{port}").parse().unwrap();
        c.replicas.id = name.to_string();
        c.replicas.address = Some(format!("https://{host}:{port}"));
        c.replicas.server_name = server_name.map(str::to_string);
        c.replicas.secret = Some(ReplicaSecret::new(SECRET).unwrap());
        c.replicas.ownership = OwnershipSource::Directory(directory.clone());
    })
    .await;
    let http = Https::for_hub(pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    Replica {
        hub,
        dir,
        http,
        admin,
    }
}

impl Replica {
    async fn stop(self) {
        let _ = self.hub.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn requests_reach_the_owner_and_a_standby_replica_takes_over_when_it_dies() {
    let pki = Pki::new();
    let directory = Directory::new();
    let a = replica(&pki, &directory, "hub-a").await;
    let b = replica(&pki, &directory, "hub-b").await;
    // What hub-b writes about the account: nothing until it owns it.
    let b_writes = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = b_writes.clone();
    b.hub
        .set_store_commit_hook(Some(Arc::new(move |ops: &[StoreOp]| {
            let mut seen = seen.lock().unwrap();
            for op in ops {
                match op {
                    StoreOp::PutAccount { account, .. } => seen.push(format!("account {account}")),
                    StoreOp::PutBinding { account, .. } => seen.push(format!("binding {account}")),
                    StoreOp::DeleteAccount { account } => seen.push(format!("delete {account}")),
                    _ => {}
                }
            }
            Ok(())
        })))
        .await;

    // The first agent replica reaches hub-a: it stands by until hub-a owns the account,
    // then streams.
    let mut x = tunnel_agent(&a.hub, &pki, "agent.test", "pod-x").await;
    let first = x.register("prod", "https://10.0.0.1:6443").await;
    let first = match role(&first) {
        Role::Streaming => first,
        Role::Standby => x.assignment().await,
        other => panic!("{other:?}"),
    };
    assert_eq!(role(&first), Role::Streaming);
    assert_eq!(
        directory.owner_of("prod").map(|o| o.replica).as_deref(),
        Some("hub-a")
    );
    // The second reaches hub-b, which does not own the account: it stands by.
    let mut y = tunnel_agent(&b.hub, &pki, "agent.test", "pod-y").await;
    assert_eq!(
        role(&y.register("prod", "https://10.0.0.1:6443").await),
        Role::Standby
    );

    // A proxy request on hub-b (authenticated there) is served by the owner's agent.
    let token = token_for(&b.http, &b.admin, "prod").await;
    let path = "/clusters/prod/api/v1/namespaces/default/configmaps/web";
    let call = {
        let (http, token) = (b.http.clone(), token.clone());
        tokio::spawn(async move { http.get(path, Some(&token)).await })
    };
    let (id, head) = x.request().await;
    assert_eq!(
        head.path_and_query,
        "/api/v1/namespaces/default/configmaps/web"
    );
    assert!(
        !head
            .headers
            .iter()
            .any(|h| h.name == "authorization" || h.name.starts_with("x-scale-agent")),
        "{:?}",
        head.headers
    );
    x.respond(
        id,
        200,
        &[("content-type", "application/json")],
        br#"{"from":"x"}"#,
    )
    .await;
    let reply = call.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["from"], "x");
    assert_eq!(
        reply.header("x-scale-agent-replica").as_deref(),
        Some("hub-a")
    );
    // The account's cached objects are the owner's, asked on either replica.
    x.snapshot("prod", &[("one", "5"), ("two", "6")], "100")
        .await;
    x.synced().await;
    assert_eq!(
        object_names_https(&b.http, &b.dir, "prod/objects?kind=ConfigMap").await,
        ["one", "two"]
    );
    let account = b.http.get("/api/v1/accounts/prod", Some(&b.admin)).await;
    assert_eq!(account.status, 200, "{}", account.text());
    let account = account.json();
    assert_eq!(account["accountState"], "ACTIVE", "{account}");
    assert_eq!(account["streaming"]["replica"], "pod-x", "{account}");
    assert!(
        account["stateReason"]
            .as_str()
            .unwrap()
            .contains("streamed by replica agent.test/pod-x"),
        "{account}"
    );
    // A token hub-b does not know is refused there, never forwarded.
    let refused = b.http.get(path, Some("not-a-token")).await;
    assert_eq!(refused.status, 401, "{}", refused.text());

    // An operation submitted on hub-b (by an operator token) runs on the owner's agent.
    let issue = async |name: &str| {
        let body = format!(r#"{{"name":"{name}","role":"operator"}}"#);
        let reply = b
            .http
            .with_token("POST", "/api/v1/tokens", &b.admin, body)
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply.json()["token"].as_str().unwrap().to_string()
    };
    let ci = issue("ci").await;
    let other = issue("other").await;
    let submit = {
        let http = b.http.clone();
        let ci = ci.clone();
        tokio::spawn(async move {
            http.with_token(
                "POST",
                "/api/v1/accounts/prod/operations",
                &ci,
                r#"{"type":"apply","manifest":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"two"}}}"#,
            )
            .await
        })
    };
    let op = x.operation().await;
    assert_eq!(op.account, "prod");
    x.send(scale_agent_proto::v1::agent_message::Kind::OperationResult(
        scale_agent_proto::v1::OperationResult {
            id: op.id.clone(),
            ok: true,
            status: Some(scale_agent_proto::v1::OperationStatus {
                code: 200,
                ..Default::default()
            }),
            executed: true,
            replica: "pod-x".into(),
            account: "prod".into(),
            ..Default::default()
        },
    ))
    .await;
    let answer = submit.await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    // It is ci's on the owner too (F18): lookups forwarded there find it for ci and for
    // the admin, not for another operator.
    let lookup = format!(
        "/api/v1/accounts/prod/operations/{}",
        answer.json()["id"].as_str().unwrap()
    );
    for (who, token, status) in [
        ("ci", &ci, 200),
        ("admin", &b.admin, 200),
        ("other", &other, 404),
    ] {
        let reply = b.http.get(&lookup, Some(token)).await;
        assert_eq!(reply.status, status, "{who}: {}", reply.text());
    }

    // The internal routes want the replicas' secret...
    let internal = b.http.get(&format!("/internal{path}"), Some(&token)).await;
    assert_eq!(internal.status, 401, "{}", internal.text());
    // ...and a request forwarded to a replica that does not own the account is served
    // there (by its standby), never forwarded again.
    let call = {
        let http = b.http.clone();
        tokio::spawn(async move { http.get(&format!("/internal{path}"), Some(SECRET)).await })
    };
    let (id, _) = y.request().await;
    y.respond(id, 200, &[], b"{}").await;
    let reply = call.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.header("x-scale-agent-replica").as_deref(),
        Some("hub-b")
    );

    // hub-b, which does not own the account, wrote nothing of it (the shared store would
    // refuse a non-owner's write).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        b_writes.lock().unwrap().is_empty(),
        "{:?}",
        b_writes.lock().unwrap()
    );

    // hub-a dies: its locks free at once, and its streams end.
    directory.kill("hub-a");
    let status = x.error().await;
    assert!(
        status.message().contains("lost the ownership"),
        "{status:?}"
    );
    drop(x);
    a.stop().await;
    // hub-b takes the account within its poll and promotes its standby.
    let promoted = tokio::time::timeout(Duration::from_secs(10), y.assignment())
        .await
        .expect("the standby was promoted");
    assert_eq!(role(&promoted), Role::Streaming);
    assert_eq!(
        directory.owner_of("prod").map(|o| o.replica).as_deref(),
        Some("hub-b")
    );
    // Owning it, hub-b writes what its standby registered.
    wait_for("hub-b to write the account it took over", async || {
        *b_writes.lock().unwrap() == ["account prod", "binding prod"]
    })
    .await;
    // Requests on hub-b now reach its own agent.
    let call = {
        let (http, token) = (b.http.clone(), token.clone());
        tokio::spawn(async move { http.get(path, Some(&token)).await })
    };
    let (id, _) = y.request().await;
    y.respond(id, 200, &[], br#"{"from":"y"}"#).await;
    let reply = call.await.unwrap();
    assert_eq!(reply.json()["from"], "y");
    assert_eq!(
        reply.header("x-scale-agent-replica").as_deref(),
        Some("hub-b")
    );

    // Two replicas never owned the account at once.
    let history = directory.history();
    let tenures: Vec<_> = history.iter().filter(|t| t.account == "prod").collect();
    assert_eq!(
        tenures
            .iter()
            .map(|t| t.replica.as_str())
            .collect::<Vec<_>>(),
        ["hub-a", "hub-b"]
    );
    assert!(tenures[1].epoch > tenures[0].epoch);
    let released = tenures[0].released.expect("hub-a's tenure ended");
    assert!(released <= tenures[1].acquired);

    drop(y);
    b.stop().await;
}

/// An owner that dies in the middle of a forwarded watch (its connection cut, as at a kill
/// -9): the watch ends cleanly on the replica the client reached, so the client watches
/// again; any other body cut short stays an error.
#[tokio::test]
async fn a_forwarded_watch_ends_cleanly_when_its_owner_dies() {
    use scale_agent_hub::owners::{Claim, Ownership as _, ReplicaIdentity};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let pki = Pki::new();
    let directory = Directory::new();
    let b = replica(&pki, &directory, "hub-b").await;
    // The owner: answers the head and a first event, then its connection is cut.
    // It serves HTTPS with a certificate of the serving CA, as replicas do: the only
    // addresses a replica serving TLS forwards to (review F12).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ghost = directory.member(ReplicaIdentity {
        id: "hub-ghost".into(),
        address: format!(
            "https://localhost:{}",
            listener.local_addr().unwrap().port()
        ),
    });
    let acceptor = tokio_rustls::TlsAcceptor::from(
        scale_agent_hub::serve::tls_config(
            pki.serving_cert_pem.as_bytes(),
            pki.serving_key_pem.as_bytes(),
        )
        .unwrap(),
    );
    assert_eq!(
        ghost.try_acquire("prod").await.unwrap(),
        Claim::Acquired { epoch: 1 }
    );
    let server = tokio::spawn(async move {
        for _ in 0..2 {
            let (socket, _) = listener.accept().await.unwrap();
            let mut socket = acceptor.accept(socket).await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "the forwarded request ended early");
                head.extend_from_slice(&buf[..n]);
            }
            let head = String::from_utf8_lossy(&head).to_string();
            assert!(head.contains(&format!("Bearer {SECRET}")), "{head}");
            socket
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                      transfer-encoding: chunked\r\n\r\n7\r\n{\"a\":1}\r\n",
                )
                .await
                .unwrap();
            socket.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(socket);
        }
    });
    // hub-b knows the account (a standby of it) and forwards to its owner.
    let mut y = tunnel_agent(&b.hub, &pki, "agent.test", "pod-y").await;
    assert_eq!(
        role(&y.register("prod", "https://10.0.0.1:6443").await),
        Role::Standby
    );
    let token = token_for(&b.http, &b.admin, "prod").await;
    let watch = b
        .http
        .request("GET", "/clusters/prod/api/v1/configmaps?watch=true")
        .header("authorization", format!("Bearer {token}"))
        .body(empty())
        .unwrap();
    let response = b.http.send(watch).await;
    assert_eq!(response.status(), 200);
    let (body, error) = read_to_end(response.into_body()).await;
    assert_eq!(body, br#"{"a":1}"#);
    assert!(error.is_none(), "the watch broke: {error:?}");
    // A list cut short is not complete: its client sees the error.
    let list = b
        .http
        .request("GET", "/clusters/prod/api/v1/configmaps")
        .header("authorization", format!("Bearer {token}"))
        .body(empty())
        .unwrap();
    let response = b.http.send(list).await;
    let (_, error) = read_to_end(response.into_body()).await;
    assert!(error.is_some(), "a cut list must not look complete");
    server.await.unwrap();
    drop(y);
    b.stop().await;
}

/// Replicas reach each other at their pod IPs, which their serving certificate does not
/// name: with `--replica-server-name` they verify it for the name it does (the Service's),
/// and without it the forwarded request is refused by TLS, never sent unverified.
#[tokio::test]
async fn replicas_verify_each_other_for_the_replica_server_name() {
    let pki = Pki::new();
    let directory = Directory::new();
    // The test certificate names localhost and 127.0.0.1; 127.0.0.2 stands for a pod IP.
    let a = replica_reached_at(
        &pki,
        &directory,
        "hub-a",
        "0.0.0.0",
        "127.0.0.2",
        Some("localhost"),
    )
    .await;
    let b = replica_reached_at(
        &pki,
        &directory,
        "hub-b",
        "0.0.0.0",
        "127.0.0.2",
        Some("localhost"),
    )
    .await;
    let c = replica_reached_at(&pki, &directory, "hub-c", "0.0.0.0", "127.0.0.2", None).await;
    let mut x = tunnel_agent(&a.hub, &pki, "agent.test", "pod-x").await;
    let first = x.register("prod", "https://10.0.0.1:6443").await;
    if role(&first) == Role::Standby {
        assert_eq!(role(&x.assignment().await), Role::Streaming);
    }
    let path = "/clusters/prod/api/v1/namespaces/default/configmaps/web";

    // hub-c verifies hub-a for 127.0.0.2, which its certificate does not name.
    let token = token_for(&c.http, &c.admin, "prod").await;
    let refused = c.http.get(path, Some(&token)).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(
        refused.text().contains("cannot be reached"),
        "{}",
        refused.text()
    );

    // hub-b verifies it for localhost: the request reaches the owner's agent.
    let token = token_for(&b.http, &b.admin, "prod").await;
    let call = {
        let (http, token) = (b.http.clone(), token.clone());
        tokio::spawn(async move { http.get(path, Some(&token)).await })
    };
    let (id, head) = x.request().await;
    assert_eq!(
        head.path_and_query,
        "/api/v1/namespaces/default/configmaps/web"
    );
    x.respond(
        id,
        200,
        &[("content-type", "application/json")],
        br#"{"from":"x"}"#,
    )
    .await;
    let reply = call.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.header("x-scale-agent-replica").as_deref(),
        Some("hub-a")
    );

    for replica in [a, b, c] {
        replica.stop().await;
    }
}

/// An owner "replica" for the forwarding tests: a listener that owns `account` in
/// `directory` under `address` (a format string's result given the port), and counts the
/// connections it gets. With `tls`, it serves that certificate and key.
async fn fake_owner(
    directory: &Arc<Directory>,
    account: &str,
    address: impl FnOnce(u16) -> String,
    tls: Option<(&str, &str)>,
) -> (
    scale_agent_hub::owners::directory::Member,
    Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    use scale_agent_hub::owners::{Claim, Ownership as _, ReplicaIdentity};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let member = directory.member(ReplicaIdentity {
        id: "hub-evil".into(),
        address: address(port),
    });
    assert_eq!(
        member.try_acquire(account).await.unwrap(),
        Claim::Acquired { epoch: 1 }
    );
    let acceptor = tls.map(|(cert, key)| {
        tokio_rustls::TlsAcceptor::from(
            scale_agent_hub::serve::tls_config(cert.as_bytes(), key.as_bytes()).unwrap(),
        )
    });
    let reached = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = reached.clone();
    let server = tokio::spawn(async move {
        use tokio::io::AsyncReadExt as _;
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            let got = match &acceptor {
                Some(acceptor) => match acceptor.accept(socket).await {
                    Ok(mut tls) => tls.read(&mut buf).await.unwrap_or(0),
                    Err(_) => 0,
                },
                None => socket.read(&mut buf).await.unwrap_or(0),
            };
            // Only a connection that delivered request bytes (the secret) counts.
            if got > 0 {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    (member, reached, server)
}

/// Review F12: whoever writes an owner's address into the store (`account_owners`) could
/// point a replica at itself and receive the replica secret with the client's request. A
/// replica serving HTTPS forwards only to https:// addresses whose certificate the serving
/// CA issued, inside `--replica-peer-cidrs` when given; the client gets a 502 saying why,
/// and the address gets nothing. Forwarding to a real replica keeps working
/// (`requests_reach_the_owner_and_a_standby_replica_takes_over_when_it_dies`).
#[tokio::test]
async fn a_replica_refuses_to_forward_to_an_owner_address_outside_its_rule() {
    let pki = Pki::new();

    async fn proxied(b: &Replica, account: &str) -> (u16, String) {
        let token = token_for(&b.http, &b.admin, account).await;
        let reply = b
            .http
            .get(
                &format!("/clusters/{account}/api/v1/namespaces/default/configmaps"),
                Some(&token),
            )
            .await;
        (reply.status, reply.text())
    }

    // 1. An http:// owner address on replicas serving HTTPS.
    let directory = Directory::new();
    let (_member, reached, server) = fake_owner(
        &directory,
        "prod",
        |port| format!("http://127.0.0.1:{port}"),
        None,
    )
    .await;
    let b = replica(&pki, &directory, "hub-b").await;
    let mut y = tunnel_agent(&b.hub, &pki, "agent.test", "pod-y").await;
    assert_eq!(
        role(&y.register("prod", "https://10.0.0.1:6443").await),
        Role::Standby
    );
    let (code, text) = proxied(&b, "prod").await;
    assert_eq!(code, 502, "{text}");
    assert!(
        text.contains("its scheme is http://")
            && text.contains("only to addresses of its own scheme (https://)"),
        "{text}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0);
    server.abort();
    drop(y);
    b.stop().await;

    // 2. An https:// owner whose certificate another CA issued (the agents' CA here; a
    // public CA's for a host the attacker controls alike): TLS refuses it before a byte of
    // the request is sent.
    let directory = Directory::new();
    let (_member, reached, server) = fake_owner(
        &directory,
        "prod",
        |port| format!("https://localhost:{port}"),
        Some((&pki.server_cert_pem, &pki.server_key_pem)),
    )
    .await;
    let b = replica(&pki, &directory, "hub-b").await;
    let mut y = tunnel_agent(&b.hub, &pki, "agent.test", "pod-y").await;
    y.register("prod", "https://10.0.0.1:6443").await;
    let (code, text) = proxied(&b, "prod").await;
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("cannot be reached"), "{text}");
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0);
    server.abort();
    drop(y);
    b.stop().await;

    // 3. With --replica-peer-cidrs, an https:// owner with a serving-CA certificate but
    // outside the ranges.
    let directory = Directory::new();
    let (_member, reached, server) = fake_owner(
        &directory,
        "prod",
        |port| format!("https://127.0.0.1:{port}"),
        Some((&pki.serving_cert_pem, &pki.serving_key_pem)),
    )
    .await;
    let dir = data_dir("replicas-cidrs");
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.replicas.id = "hub-b".into();
        c.replicas.address = Some(format!("https://10.0.0.2:{}", free_port()));
        c.replicas.secret = Some(ReplicaSecret::new(SECRET).unwrap());
        c.replicas.ownership = OwnershipSource::Directory(directory.clone());
        c.replicas.peer_cidrs =
            vec![scale_agent_hub::forwarded::Cidr::parse("10.0.0.0/8").unwrap()];
    })
    .await;
    let b = Replica {
        http: Https::for_hub(&pki, &hub, Proto::H2),
        admin: admin_token(&dir),
        hub,
        dir,
    };
    let mut y = tunnel_agent(&b.hub, &pki, "agent.test", "pod-y").await;
    y.register("prod", "https://10.0.0.1:6443").await;
    let (code, text) = proxied(&b, "prod").await;
    assert_eq!(code, 502, "{text}");
    assert!(
        text.contains("127.0.0.1 is outside the allowed ranges")
            && text.contains("inside --replica-peer-cidrs (10.0.0.0/8)"),
        "{text}"
    );
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0);
    server.abort();
    drop(y);
    b.stop().await;
}

/// A replica whose HTTP listener serves TLS but whose `--replica-address` is http:// would
/// receive the secret in clear from the others: it does not start.
#[tokio::test]
async fn an_http_replica_address_on_a_tls_listener_is_refused_at_start() {
    let pki = Pki::new();
    let directory = Directory::new();
    let dir = data_dir("replicas-http-address");
    let mut config = scale_agent_hub::Config::new(
        scale_agent_hub::GrpcSecurity::MutualTls(scale_agent_hub::TlsMaterial {
            cert_pem: pki.server_cert_pem.clone().into_bytes(),
            key_pem: pki.server_key_pem.clone().into_bytes(),
            client_ca_pem: Some(pki.ca_pem.clone().into_bytes()),
        }),
        &dir,
    );
    config.listeners.grpc_addr = "127.0.0.1:0".parse().unwrap();
    config.listeners.http_addr = "127.0.0.1:0".parse().unwrap();
    serve_https(&pki, &mut config);
    config.replicas.id = "hub-x".into();
    config.replicas.address = Some("http://127.0.0.1:8443".into());
    config.replicas.secret = Some(ReplicaSecret::new(SECRET).unwrap());
    config.replicas.ownership = OwnershipSource::Directory(directory);
    let Err(error) = scale_agent_hub::start(config).await else {
        panic!("a replica with an http:// address on a TLS listener must not start");
    };
    let message = error.to_string();
    assert!(
        message.contains("is http:// but the HTTP listener serves TLS"),
        "{message}"
    );
}
