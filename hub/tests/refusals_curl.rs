//! Refusals reach the client whole (issue 28, "Refusals that clients cannot read"): the hub
//! refused requests with a body before reading it and reset the HTTP/2 stream, and the real
//! `curl` (7.88, Debian 12) then often failed with error 92 and showed no message. Here the
//! hub serves HTTPS and the real `curl` binary sends, over HTTP/2 with TLS, 20 times each:
//! an operation with a reader token (403), a proxied write without a token (401) and with
//! another account's token (403), each with a README-sized and a 256 KiB body (past
//! HTTP/2's initial window, so the client cannot finish unless the hub reads). Every try
//! must exit 0 with the refusal's status and message; and the legitimate request with the
//! right token still gets through.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::*;

const TRIES: usize = 20;

/// What one `curl` run ended with.
#[derive(Debug)]
struct Curled {
    exit: Option<i32>,
    status: String,
    body: String,
    stderr: String,
}

/// `curl --http2` POSTing `body_file` to `url` with `token` (if any), trusting `ca`.
async fn curl(ca: PathBuf, url: String, token: Option<String>, body_file: PathBuf) -> Curled {
    tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new("curl");
        command
            .args(["-sS", "--http2", "--max-time", "30", "--cacert"])
            .arg(&ca)
            .args(["-X", "POST", "-H", "Content-Type: application/json"])
            .arg("--data-binary")
            .arg(format!("@{}", body_file.display()))
            .args(["-w", "\n%{http_code} %{http_version}"]);
        if let Some(token) = token {
            command.args(["-H", &format!("Authorization: Bearer {token}")]);
        }
        let output = command.arg(&url).output().expect("curl runs");
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        let (body, status) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
        Curled {
            exit: output.status.code(),
            status: status.to_string(),
            body: body.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).to_string(),
        }
    })
    .await
    .unwrap()
}

/// A JSON body of about `bytes` bytes: a ConfigMap, as a proxied write or an operation sends.
fn body_file(dir: &Path, bytes: usize) -> PathBuf {
    let filler = "x".repeat(bytes);
    let manifest = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app", "namespace": "default"},
        "data": {"filler": filler},
    });
    let body =
        serde_json::json!({"type": "apply", "fieldManager": "spinnaker", "manifest": manifest});
    let path = dir.join(format!("body-{bytes}.json"));
    std::fs::write(&path, body.to_string()).unwrap();
    path
}

#[tokio::test]
async fn every_refusal_of_a_request_with_a_body_reaches_curl_whole_over_http2() {
    let pki = Pki::new();
    let dir = data_dir("refusals-curl");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let ca = dir.join("serving-ca.pem");
    std::fs::write(&ca, &pki.serving_ca_pem).unwrap();
    let base = format!("https://127.0.0.1:{}", hub.http_addr.port());

    let reply = http
        .with_token(
            "POST",
            "/api/v1/tokens",
            &admin,
            serde_json::json!({"name": "grafana", "role": "reader"}).to_string(),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reader = reply.json()["token"].as_str().unwrap().to_string();
    let team_b = token_for(&http, &admin, "team-b").await;

    let cases: [(&str, String, Option<String>, &str, &str); 3] = [
        (
            "operation with a reader token",
            format!("{base}/api/v1/accounts/prod/operations"),
            Some(reader),
            "403",
            "needs role operator",
        ),
        (
            "proxied write without a token",
            format!("{base}/clusters/prod/api/v1/namespaces/default/configmaps"),
            None,
            "401",
            "needs a bearer token for account",
        ),
        (
            "proxied write with another account's token",
            format!("{base}/clusters/prod/api/v1/namespaces/default/configmaps"),
            Some(team_b),
            "403",
            "belongs to account \\\"team-b\\\"",
        ),
    ];
    let mut failures = Vec::new();
    for size in [300, 256 * 1024] {
        let body = body_file(&dir, size);
        for (what, url, token, status, message) in &cases {
            for _ in 0..TRIES {
                let got = curl(ca.clone(), url.clone(), token.clone(), body.clone()).await;
                let whole = got.exit == Some(0)
                    && got.status == format!("{status} 2")
                    && got.body.contains(message);
                if !whole {
                    failures.push(format!(
                        "{what}, {size} bytes: exit {:?}, status {:?}, stderr {:?}, body {:?}",
                        got.exit,
                        got.status,
                        got.stderr.trim(),
                        got.body
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} tries did not get the refusal whole:\n{}",
        failures.len(),
        2 * cases.len() * TRIES,
        failures.join("\n")
    );

    // The same request with the right role passes authentication (what it gets then is the
    // route's answer: prod has no agent).
    let got = curl(
        ca.clone(),
        format!("{base}/api/v1/accounts/prod/operations"),
        Some(admin.clone()),
        body_file(&dir, 256 * 1024),
    )
    .await;
    assert_eq!(got.exit, Some(0), "{got:?}");
    assert!(
        !got.status.starts_with("401") && !got.status.starts_with("403"),
        "{got:?}"
    );

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
