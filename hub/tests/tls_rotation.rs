//! Certificate rotation without a restart (a cert-manager renewal of the hub's Secret): when
//! the files of the gRPC certificate, the client CA and the HTTP certificate change, new
//! connections get the new certificates and agents signed by the new client CA get in,
//! while those of the old CA no longer do. Real TLS on 127.0.0.1 throughout.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use common::*;
use rcgen::ExtendedKeyUsagePurpose;
use scale_agent_hub::{GrpcSecurity, TlsFiles, TlsMaterial};

/// Replaces `path` atomically (as the kubelet swaps a Secret's files).
fn write(path: &Path, content: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, content).unwrap();
    std::fs::rename(&partial, path).unwrap();
}

/// Whether an HTTPS GET of /healthz on a new connection, trusting `ca_pem`, answers 200.
async fn https_ok(hub: &scale_agent_hub::RunningHub, ca_pem: &str) -> bool {
    let client = Https::new(
        ca_pem,
        format!("https://127.0.0.1:{}", hub.http_addr.port()),
        Proto::H1,
    );
    let request = client.request("GET", "/healthz").body(empty()).unwrap();
    matches!(
        tokio::time::timeout(WAIT, client.raw().request(request)).await,
        Ok(Ok(response)) if response.status() == 200
    )
}

/// Whether an agent with `client` (cert, key), trusting `server_ca_pem`, is welcomed.
async fn welcomed(
    hub: &scale_agent_hub::RunningHub,
    server_ca_pem: &str,
    client: (String, String),
) -> Result<(), String> {
    let mut agent = open_stream(hub, server_ca_pem, Some(client))
        .await
        .map_err(|s| format!("{s:?}"))?;
    tokio::time::timeout(WAIT, agent.hello("r", &[], ""))
        .await
        .map_err(|_| "no Welcome in time".to_string())?
        .map_err(|s| format!("{s:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_and_client_ca_apply_to_new_connections_without_a_restart() {
    let pki = Pki::new();
    let dir = data_dir("tls-rotation");
    let files = dir.join("tls");
    std::fs::create_dir_all(&files).unwrap();
    let path = |name: &str| -> PathBuf { files.join(name) };
    let old_agents = ca("old-agents-ca");
    let new_agents = ca("new-agents-ca");
    write(&path("grpc.crt"), &pki.server_cert_pem);
    write(&path("grpc.key"), &pki.server_key_pem);
    write(&path("client-ca.crt"), &old_agents.pem());
    write(&path("http.crt"), &pki.serving_cert_pem);
    write(&path("http.key"), &pki.serving_key_pem);
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.agents.security = GrpcSecurity::MutualTls(TlsMaterial {
            cert_pem: pki.server_cert_pem.clone().into_bytes(),
            key_pem: pki.server_key_pem.clone().into_bytes(),
            client_ca_pem: Some(old_agents.pem().into_bytes()),
        });
        c.listeners.tls_files = TlsFiles {
            grpc: Some((path("grpc.crt"), path("grpc.key"))),
            client_ca: Some(path("client-ca.crt")),
            http: Some((path("http.crt"), path("http.key"))),
        };
        c.listeners.tls_reload_interval = Duration::from_millis(100);
    })
    .await;
    let old_agent = || {
        leaf(
            &old_agents,
            &["old-agent"],
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    };
    let new_agent = || {
        leaf(
            &new_agents,
            &["new-agent"],
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    };

    // Before: the first certificates, the old client CA.
    welcomed(&hub, &pki.ca_pem, old_agent()).await.unwrap();
    let refused = welcomed(&hub, &pki.ca_pem, new_agent()).await.unwrap_err();
    assert!(refused.contains("Unauthenticated"), "{refused}");
    assert!(https_ok(&hub, &pki.serving_ca_pem).await);

    // An agent connected before the rotation keeps its stream.
    let mut connected = open_stream(&hub, &pki.ca_pem, Some(old_agent()))
        .await
        .unwrap();
    connected.hello("kept", &[], "").await.unwrap();

    // cert-manager renews both serving certificates under new CAs, and the agents' CA
    // is rotated.
    let grpc_ca = ca("rotated-grpc-ca");
    let (grpc_cert, grpc_key) = leaf(
        &grpc_ca,
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let http_ca = ca("rotated-http-ca");
    let (http_cert, http_key) = leaf(
        &http_ca,
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    write(&path("grpc.key"), &grpc_key);
    write(&path("grpc.crt"), &grpc_cert);
    write(&path("client-ca.crt"), &new_agents.pem());
    write(&path("http.key"), &http_key);
    write(&path("http.crt"), &http_cert);

    let grpc_ca_pem = grpc_ca.pem();
    wait_for("the rotated gRPC certificate and client CA", async || {
        welcomed(&hub, &grpc_ca_pem, new_agent()).await.is_ok()
    })
    .await;
    let http_ca_pem = http_ca.pem();
    wait_for("the rotated HTTP certificate", async || {
        https_ok(&hub, &http_ca_pem).await
    })
    .await;

    // After: the old certificates and the old client CA no longer work.
    let old_server = welcomed(&hub, &pki.ca_pem, new_agent()).await.unwrap_err();
    assert!(old_server.contains("connect"), "{old_server}");
    let old_client = welcomed(&hub, &grpc_ca_pem, old_agent()).await.unwrap_err();
    assert!(old_client.contains("Unauthenticated"), "{old_client}");
    assert!(!https_ok(&hub, &pki.serving_ca_pem).await);
    // The stream opened before the rotation is still served.
    connected
        .send(scale_agent_proto::v1::agent_message::Kind::Heartbeat(
            scale_agent_proto::v1::Heartbeat::default(),
        ))
        .await;
    connected.synced().await;

    // A half-done rotation (a certificate without its key) keeps what is served.
    let (other_cert, _) = leaf(
        &grpc_ca,
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    write(&path("grpc.crt"), &other_cert);
    tokio::time::sleep(Duration::from_millis(500)).await;
    welcomed(&hub, &grpc_ca_pem, new_agent()).await.unwrap();

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `scale_agent_hub_tls_certificate_expiry_seconds` of `listener` and `file`, from /metrics
/// over HTTPS trusting `ca_pem`; `None` when absent or the hub's certificate is not trusted.
async fn expiry_seconds(
    hub: &scale_agent_hub::RunningHub,
    ca_pem: &str,
    listener: &str,
    file: &Path,
) -> Option<i64> {
    let client = Https::new(
        ca_pem,
        format!("https://127.0.0.1:{}", hub.http_addr.port()),
        Proto::H1,
    );
    let token = std::fs::read_to_string(hub.admin_token_file()?).ok()?;
    let request = client
        .request("GET", "/metrics")
        .header("authorization", format!("Bearer {}", token.trim()))
        .body(empty())
        .ok()?;
    // A connection refused while the listener's certificate is not the one trusted yet: None.
    let response = tokio::time::timeout(WAIT, client.raw().request(request))
        .await
        .ok()?
        .ok()?;
    let metrics = read_all(response).await.text();
    let series = format!(
        "scale_agent_hub_tls_certificate_expiry_seconds{{listener=\"{listener}\",file=\"{}\"}} ",
        file.display()
    );
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|value| value.trim().parse().ok())
}

/// Seconds from now to `not_after` (Unix seconds).
fn seconds_until(not_after: i64) -> i64 {
    not_after - jiff::Timestamp::now().as_second()
}

/// The expiry metric of each serving certificate file: from the files at start, and from the
/// new files once a rotation is loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificates_expiry_is_a_metric_refreshed_on_reload() {
    let pki = Pki::new();
    let dir = data_dir("tls-expiry");
    let files = dir.join("tls");
    std::fs::create_dir_all(&files).unwrap();
    let path = |name: &str| -> PathBuf { files.join(name) };
    write(&path("grpc.crt"), &pki.server_cert_pem);
    write(&path("grpc.key"), &pki.server_key_pem);
    write(&path("http.crt"), &pki.serving_cert_pem);
    write(&path("http.key"), &pki.serving_key_pem);
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.listeners.tls_files = TlsFiles {
            grpc: Some((path("grpc.crt"), path("grpc.key"))),
            client_ca: None,
            http: Some((path("http.crt"), path("http.key"))),
        };
        c.listeners.tls_reload_interval = Duration::from_millis(100);
    })
    .await;
    // rcgen's default notAfter: 4096-01-01.
    let far = seconds_until(67_090_118_400);
    for (listener, file) in [("grpc", path("grpc.crt")), ("http", path("http.crt"))] {
        let seconds = expiry_seconds(&hub, &pki.serving_ca_pem, listener, &file)
            .await
            .unwrap_or_else(|| panic!("no expiry metric for {listener}"));
        assert!(
            (seconds - far).abs() < 120,
            "{listener}: {seconds} vs {far}"
        );
    }

    // Renewed with certificates that expire on 2031-01-01.
    let renewed = |issuer: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>| {
        let sans = ["localhost", "127.0.0.1"];
        leaf_with(issuer, &sans, ExtendedKeyUsagePurpose::ServerAuth, |p| {
            p.not_after = rcgen::date_time_ymd(2031, 1, 1);
        })
    };
    let http_ca = ca("renewed-http-ca");
    let (grpc_cert, grpc_key) = renewed(&ca("renewed-grpc-ca"));
    let (http_cert, http_key) = renewed(&http_ca);
    write(&path("grpc.key"), &grpc_key);
    write(&path("grpc.crt"), &grpc_cert);
    write(&path("http.key"), &http_key);
    write(&path("http.crt"), &http_cert);
    let soon = seconds_until(1_924_992_000);
    let http_ca_pem = http_ca.pem();
    for (listener, file) in [("grpc", path("grpc.crt")), ("http", path("http.crt"))] {
        wait_for("the renewed certificate's expiry", async || {
            expiry_seconds(&hub, &http_ca_pem, listener, &file)
                .await
                .is_some_and(|seconds| (seconds - soon).abs() < 120)
        })
        .await;
    }

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
