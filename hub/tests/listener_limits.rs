//! Review F23: both listeners bound what a client that connects and then does nothing useful
//! costs. A slowloris client (TLS done, request head never finished, or nothing sent at all)
//! is disconnected after `--header-read-timeout` while a normal client is served meanwhile;
//! a listener with `--http-max-connections`/`--grpc-max-connections` open closes the next
//! connection at accept, counts it, and serves again once a place is free. Real TLS on both
//! listeners, a real HTTPS client, and the protocol-level fake agent on the gRPC side.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use common::*;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject as _};
use scale_agent_hub::ListenerLimits;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};
use tokio_rustls::{TlsConnector, client::TlsStream};

/// The header-read timeout of the slowloris tests.
const SHORT: Duration = Duration::from_secs(1);

/// A TLS connection to `addr` trusting `ca_pem`, offering `alpn`; `None` when the hub closed
/// it before the handshake finished.
async fn tls_connect(addr: SocketAddr, ca_pem: &str, alpn: &[u8]) -> Option<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    tokio::time::timeout(
        WAIT,
        TlsConnector::from(Arc::new(config)).connect(name, tcp),
    )
    .await
    .expect("the handshake neither finished nor failed")
    .ok()
}

/// Reads until the hub closes `stream`; returns how long that took and what it sent.
async fn until_closed(stream: &mut TlsStream<TcpStream>) -> (Duration, Vec<u8>) {
    let started = Instant::now();
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return (started.elapsed(), received),
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the hub kept the connection open for {WAIT:?}"),
        }
    }
}

/// A metric's value in the hub's /metrics text (0 when absent).
async fn metric(http: &Https, admin: &str, line_start: &str) -> f64 {
    let reply = http.get("/metrics", Some(admin)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(line_start))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

fn https(hub: &scale_agent_hub::RunningHub, pki: &Pki, proto: Proto) -> Https {
    Https::new(
        &pki.serving_ca_pem,
        format!("https://127.0.0.1:{}", hub.http_addr.port()),
        proto,
    )
}

#[tokio::test]
async fn http_slowloris_is_cut_after_the_header_timeout_while_others_are_served() {
    let pki = Pki::new();
    let dir = data_dir("limits-http-slowloris");
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.listeners.http_limits.header_read_timeout = SHORT;
    })
    .await;
    let admin = admin_token(&dir);

    // A request head that never ends: one header line every 300 ms would keep a server
    // without a header timeout busy forever.
    let mut partial = tls_connect(hub.http_addr, &pki.serving_ca_pem, b"http/1.1")
        .await
        .unwrap();
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let drip = async {
        for i in 0..20 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let line = format!("X-Drip-{i}: x\r\n");
            if partial.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
    };
    // A connection that sends nothing at all after its handshake.
    let mut silent = tls_connect(hub.http_addr, &pki.serving_ca_pem, b"h2")
        .await
        .unwrap();
    let started = Instant::now();

    // Meanwhile normal clients are served, over HTTP/1.1 and HTTP/2.
    let served = async {
        for proto in [Proto::H1, Proto::H2] {
            let reply = https(&hub, &pki, proto).get("/healthz", None).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
        }
    };
    let ((silent_after, silent_got), (), ()) =
        tokio::join!(until_closed(&mut silent), drip, served);
    assert!(
        silent_after >= SHORT - Duration::from_millis(100) && silent_after < SHORT * 5,
        "a silent connection must be closed after the header timeout ({SHORT:?}), was {silent_after:?}"
    );
    assert!(silent_got.is_empty(), "{silent_got:?}");
    let (_, partial_got) = until_closed(&mut partial).await;
    let cut_after = started.elapsed();
    assert!(
        cut_after < SHORT * 5,
        "a dripping request head must be cut after the header timeout, took {cut_after:?}"
    );
    let answer = String::from_utf8_lossy(&partial_got);
    assert!(
        !answer.contains("200 OK"),
        "the dripped request must not be served: {answer}"
    );

    // The hub counted the silent one, and still serves.
    let timeouts = metric(
        &https(&hub, &pki, Proto::H1),
        &admin,
        "scale_agent_hub_listener_header_timeouts_total{listener=\"http\"} ",
    )
    .await;
    assert!(timeouts >= 1.0, "header timeouts counted: {timeouts}");
    hub.shutdown().await.unwrap();
}

#[tokio::test]
async fn http_listener_full_closes_the_next_connection_until_one_leaves() {
    let pki = Pki::new();
    let dir = data_dir("limits-http-cap");
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.listeners.http_limits = ListenerLimits {
            max_connections: 3,
            header_read_timeout: Duration::from_secs(60),
        };
    })
    .await;
    let admin = admin_token(&dir);

    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            tls_connect(hub.http_addr, &pki.serving_ca_pem, b"http/1.1")
                .await
                .expect("within the cap: served"),
        );
    }
    // The fourth is closed at accept: its handshake cannot finish.
    assert!(
        tls_connect(hub.http_addr, &pki.serving_ca_pem, b"http/1.1")
            .await
            .is_none(),
        "the listener is full: the fourth connection must be closed"
    );
    // A normal client is refused too while the listener is full...
    let refused = https(&hub, &pki, Proto::H1)
        .raw()
        .request(
            https(&hub, &pki, Proto::H1)
                .request("GET", "/healthz")
                .body(empty())
                .unwrap(),
        )
        .await;
    assert!(refused.is_err(), "full listener: {refused:?}");

    // ...and served once a connection leaves.
    held.pop();
    let client = https(&hub, &pki, Proto::H1);
    wait_for("a place on the listener", async || {
        matches!(
            client
                .raw()
                .request(client.request("GET", "/healthz").body(empty()).unwrap())
                .await,
            Ok(r) if r.status() == 200
        )
    })
    .await;
    drop(held);
    let refused_total = metric(
        &client,
        &admin,
        "scale_agent_hub_listener_connections_refused_total{listener=\"http\"} ",
    )
    .await;
    assert!(refused_total >= 2.0, "refusals counted: {refused_total}");
    hub.shutdown().await.unwrap();
}

#[tokio::test]
async fn grpc_slowloris_and_a_full_listener_leave_agents_streaming() {
    let pki = Pki::new();
    let dir = data_dir("limits-grpc");
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.listeners.grpc_limits = ListenerLimits {
            max_connections: 3,
            header_read_timeout: SHORT,
        };
    })
    .await;
    let admin = admin_token(&dir);

    // An agent streams.
    let mut agent = agent(&hub, &pki, "agent-a", "r1").await;
    agent.register("acct-a", "https://a.example").await;

    // A client that finishes TLS (no client certificate: the gRPC listener's TLS lets
    // enrolling agents in without one) and then sends nothing is cut.
    let mut silent = tls_connect(hub.grpc_addr, &pki.ca_pem, b"h2")
        .await
        .unwrap();
    // One that sends the HTTP/2 preface and stops before its SETTINGS frame too.
    let mut preface_only = tls_connect(hub.grpc_addr, &pki.ca_pem, b"h2")
        .await
        .unwrap();
    preface_only
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // The listener (cap 3) is full now: agent, silent, preface_only.
    wait_for("two connections held besides the agent", async || {
        metric(
            &https(&hub, &pki, Proto::H1),
            &admin,
            "scale_agent_hub_listener_connections{listener=\"grpc\"} ",
        )
        .await
            == 3.0
    })
    .await;
    assert!(
        tls_connect(hub.grpc_addr, &pki.ca_pem, b"h2")
            .await
            .is_none(),
        "a fourth gRPC connection must be closed at accept"
    );
    let (silent_after, _) = until_closed(&mut silent).await;
    let (preface_after, _) = until_closed(&mut preface_only).await;
    assert!(silent_after < SHORT * 5, "{silent_after:?}");
    assert!(preface_after < SHORT * 5, "{preface_after:?}");

    // The agent kept streaming through it all, and a second agent gets in now.
    agent.snapshot("acct-a", &[("cm-1", "v1")], "10").await;
    let mut second = agent_with(&hub, &pki, "agent-b", "r1", &[]).await;
    second.register("acct-b", "https://b.example").await;
    let http = https(&hub, &pki, Proto::H1);
    wait_for("the first agent's object cached", async || {
        object_names_https(&http, &dir, "acct-a/objects?kind=configmaps").await == ["cm-1"]
    })
    .await;
    let text = http.get("/metrics", Some(&admin)).await.text();
    for line in [
        "scale_agent_hub_listener_connections_refused_total{listener=\"grpc\"} ",
        "scale_agent_hub_listener_header_timeouts_total{listener=\"grpc\"} ",
    ] {
        let value: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(line))
            .unwrap_or_else(|| panic!("{line} missing in {text}"))
            .trim()
            .parse()
            .unwrap();
        assert!(value >= 1.0, "{line}{value}");
    }
    hub.shutdown().await.unwrap();
}
