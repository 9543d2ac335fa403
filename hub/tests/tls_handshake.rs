//! Failed TLS handshakes on the hub's HTTPS listener are logged with the peer's address and
//! the reason, so an operator can tell a client with the wrong CA from a port scan. The log
//! is captured from the hub running in this test's (single-threaded) runtime.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    io::Write,
    sync::{Arc, Mutex},
};

use common::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Everything the hub logs, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn failed_handshakes_are_logged_with_peer_and_reason() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let pki = Pki::new();
    let dir = data_dir("tls-handshake");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let port = hub.http_addr.port();

    // A client that does not trust the hub's serving CA (it trusts the agents' CA instead).
    let wrong_ca = Https::new(&pki.ca_pem, format!("https://127.0.0.1:{port}"), Proto::H1);
    let reply = wrong_ca
        .raw()
        .request(wrong_ca.request("GET", "/healthz").body(empty()).unwrap())
        .await;
    assert!(reply.is_err(), "the client must refuse the certificate");

    // Plain HTTP to the HTTPS port.
    let mut plain = tokio::net::TcpStream::connect(hub.http_addr).await.unwrap();
    let plain_port = plain.local_addr().unwrap().port();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: hub\r\n\r\n")
        .await
        .unwrap();
    let mut sink = Vec::new();
    let _ = plain.read_to_end(&mut sink).await;

    // A TCP health check: connects and closes without a word.
    let probe = tokio::net::TcpStream::connect(hub.http_addr).await.unwrap();
    let probe_port = probe.local_addr().unwrap().port();
    drop(probe);

    // A client that trusts the right CA is served (the listener still works).
    let good = Https::for_hub(&pki, &hub, Proto::H1);
    assert_eq!(good.get("/healthz", None).await.status, 200);

    wait_for("the handshake failures to be logged", async || {
        captured.text().matches("TLS handshake").count() >= 3
    })
    .await;
    let log = captured.text();
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("TLS handshake failed"))
        .collect();
    assert!(
        failed
            .iter()
            .any(|l| l.contains("WARN") && l.to_lowercase().contains("unknownca")),
        "a client refusing the certificate is logged at WARN with the alert it sent:\n{log}"
    );
    assert!(
        failed.iter().any(|l| l.contains("WARN")
            && l.contains(&format!("127.0.0.1:{plain_port}"))
            && l.to_lowercase().contains("corrupt")),
        "plain HTTP is logged at WARN with the peer's address and rustls' reason:\n{log}"
    );
    let probe_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&format!("127.0.0.1:{probe_port}")))
        .collect();
    assert!(
        !probe_lines.is_empty() && probe_lines.iter().all(|l| l.contains("DEBUG")),
        "a silent probe is DEBUG, not WARN:\n{log}"
    );

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `--client-ca` without a certificate stops the hub process before it opens its store,
/// with a message naming the flag and the file (it used to fail later with rustls' "no root
/// trust anchors were provided").
#[test]
fn a_client_ca_without_a_certificate_stops_the_hub_before_the_store_is_opened() {
    let dir = std::env::temp_dir().join(format!("scale-agent-hub-emptyca-{}", std::process::id()));
    let data_dir = dir.join("data");
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("ca.pem");
    std::fs::write(&empty, "# no certificate here\n").unwrap();
    let (cert, key) = leaf(
        &ca("hub-test-ca"),
        &["hub.test"],
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (cert_file, key_file) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, key).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_scale-agent-hub"))
        .arg("--tls-cert")
        .arg(&cert_file)
        .arg("--tls-key")
        .arg(&key_file)
        .args(["--http-plaintext", "--client-ca"])
        .arg(&empty)
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("--client-ca {}: no certificate", empty.display())),
        "{stderr}"
    );
    assert!(!data_dir.join("hub.redb").exists(), "the store was opened");
    let _ = std::fs::remove_dir_all(&dir);
}
