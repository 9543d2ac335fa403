//! The HTTP API's authentication and roles, at the hub level: a hub on HTTPS with its admin
//! token file, a tokens file, and API tokens it issues. Proves that every route but health
//! needs a token, that each refusal has its status and a message saying what to change, that
//! the tokens file is re-read (a broken one keeps the tokens read before), that issuing a name
//! again rotates it, and that API tokens and proxy tokens open disjoint routes.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use bytes::Bytes;
use common::*;
use scale_agent_hub::api_auth::{Role, file_entry};

/// The `error` message of a JSON error reply, after checking its status.
fn refusal(reply: &Reply, status: u16) -> String {
    assert_eq!(reply.status, status, "{}", reply.text());
    reply.json()["error"].as_str().unwrap().to_string()
}

async fn create_token(http: &Https, admin: &str, name: &str, role: &str) -> String {
    let body = serde_json::json!({ "name": name, "role": role }).to_string();
    let reply = http.with_token("POST", "/api/v1/tokens", admin, body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let created = reply.json();
    assert_eq!(created["kind"], "api");
    assert_eq!(created["role"], role);
    created["token"].as_str().unwrap().to_string()
}

fn write_tokens_file(path: &Path, entries: &[(&str, Role, &str)]) {
    let text: String = entries
        .iter()
        .map(|(name, role, token)| file_entry(name, *role, token))
        .collect();
    std::fs::write(path, text).unwrap();
}

#[tokio::test]
async fn every_route_needs_a_token_with_a_large_enough_role() {
    let pki = Pki::new();
    let dir = data_dir("api-roles");
    std::fs::create_dir_all(&dir).unwrap();
    let tokens_file = dir.join("api-tokens.yaml");
    write_tokens_file(
        &tokens_file,
        &[("grafana", Role::Reader, "dashboards-secret")],
    );
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.api.api_tokens_file = Some(tokens_file.clone());
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H1);
    let admin = admin_token(&dir);

    // Health needs nothing; everything else needs a token.
    assert_eq!(http.get("/healthz", None).await.status, 200);
    assert_eq!(http.get("/readyz", None).await.status, 200);
    for path in [
        "/api/v1/agents",
        "/api/v1/accounts",
        "/api/v1/version",
        "/metrics",
        "/api/v1/tokens",
    ] {
        let message = refusal(&http.get(path, None).await, 401);
        assert!(
            message.contains("Authorization: Bearer") && message.contains("token create"),
            "{path}: {message}"
        );
    }
    let reply = http.get("/api/v1/agents", Some("sat_unknown")).await;
    assert_eq!(
        reply.header("www-authenticate").as_deref(),
        Some("Bearer realm=\"scale-agent-hub\"")
    );
    assert!(refusal(&reply, 401).contains("not an API token of this hub"));

    // A reader (from the tokens file) reads, and is told which role an operation needs.
    let reader = "dashboards-secret";
    assert_eq!(http.get("/api/v1/agents", Some(reader)).await.status, 200);
    assert_eq!(http.get("/metrics", Some(reader)).await.status, 200);
    assert_eq!(
        http.get("/api/v1/clouddriver", Some(reader)).await.status,
        200
    );
    let operation =
        serde_json::json!({"type": "get", "kind": "ConfigMap", "name": "x"}).to_string();
    let submit = "/api/v1/accounts/prod/operations";
    let message = refusal(
        &http
            .with_token("POST", submit, reader, operation.clone())
            .await,
        403,
    );
    assert!(
        message.contains("POST /api/v1/accounts/prod/operations needs role operator")
            && message.contains("token \"grafana\" has role reader"),
        "{message}"
    );
    assert!(
        refusal(&http.get("/api/v1/operations/x", Some(reader)).await, 403)
            .contains("needs role operator")
    );

    // An operator (issued by the hub) runs operations but cannot issue tokens.
    let ci = create_token(&http, &admin, "ci", "operator").await;
    let reply = http
        .with_token("POST", submit, &ci, operation.clone())
        .await;
    // Past the role check: the operation itself answers (no agent registered prod).
    assert_eq!(reply.status, 404, "{}", reply.text());
    assert_eq!(reply.json()["state"], "noAgent");
    assert_eq!(
        http.get("/api/v1/operations/nope", Some(&ci)).await.status,
        404
    );
    let message = refusal(
        &http
            .with_token(
                "POST",
                "/api/v1/tokens",
                &ci,
                r#"{"name":"x","role":"admin"}"#,
            )
            .await,
        403,
    );
    assert!(
        message.contains("needs role admin") && message.contains("token \"ci\" has role operator"),
        "{message}"
    );
    let message = refusal(
        &http
            .with_token(
                "POST",
                "/api/v1/accounts/prod/kubeconfig",
                &ci,
                Bytes::new(),
            )
            .await,
        403,
    );
    assert!(message.contains("needs role admin"), "{message}");

    // An API token, even an admin one, does not open the proxy; a proxy token opens no API.
    let ops_admin = create_token(&http, &admin, "ops-admin", "admin").await;
    let reply = http
        .get("/clusters/prod/api/v1/pods", Some(&ops_admin))
        .await;
    assert_eq!(reply.status, 401, "{}", reply.text());
    assert!(
        reply
            .text()
            .contains("scale-agent-hub kubeconfig --account prod"),
        "{}",
        reply.text()
    );
    let proxy = token_for(&http, &ops_admin, "prod").await;
    assert!(
        refusal(&http.get("/api/v1/agents", Some(&proxy)).await, 401).contains("a proxy token")
    );

    // The list shows every token with its kind, role and source; the secrets never.
    let list = http.get("/api/v1/tokens", Some(&admin)).await;
    assert_eq!(list.status, 200);
    let kinds: Vec<(String, String, String)> = list
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["kind"].as_str().unwrap().to_string(),
                t["source"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for expected in [
        ("admin", "admin", "admin-token-file"),
        ("grafana", "api", "file"),
        ("ci", "api", "hub"),
        ("tests", "proxy", "hub"),
    ] {
        let expected = (
            expected.0.to_string(),
            expected.1.to_string(),
            expected.2.to_string(),
        );
        assert!(kinds.contains(&expected), "{expected:?} in {kinds:?}");
    }
    assert!(!list.text().contains(&ci) && !list.text().contains(reader));

    // Issuing a name again rotates it: the old secret stops working at once.
    let rotated = create_token(&http, &admin, "ci", "reader").await;
    assert_eq!(http.get("/api/v1/agents", Some(&ci)).await.status, 401);
    assert_eq!(http.get("/api/v1/agents", Some(&rotated)).await.status, 200);
    let message = refusal(
        &http.with_token("POST", submit, &rotated, operation).await,
        403,
    );
    assert!(
        message.contains("token \"ci\" has role reader"),
        "{message}"
    );

    // The tokens file is re-read when it changes; a broken one keeps the previous tokens.
    std::fs::write(
        &tokens_file,
        "- name: grafana\n  role: reader\n  sha256: [broken\n",
    )
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(
        http.get("/api/v1/agents", Some(reader)).await.status,
        200,
        "kept"
    );
    write_tokens_file(&tokens_file, &[("grafana-2", Role::Operator, "new-secret")]);
    wait_for("the new tokens file", async || {
        http.get("/api/v1/operations/nope", Some("new-secret"))
            .await
            .status
            == 404
    })
    .await;
    assert_eq!(http.get("/api/v1/agents", Some(reader)).await.status, 401);

    // The issued tokens survive a restart (hashed in the store).
    hub.shutdown().await.unwrap();
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.api.api_tokens_file = Some(tokens_file.clone());
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H1);
    assert_eq!(http.get("/api/v1/agents", Some(&rotated)).await.status, 200);
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn metrics_can_be_opened_by_a_flag() {
    let pki = Pki::new();
    let dir = data_dir("api-metrics-open");
    let hub = start_hub(&pki, &dir, |c| c.api.metrics_unauthenticated = true).await;
    let open = api(&hub).with_token(None);
    let (status, body) = get(&open, "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("scale_agent_hub"), "{body}");
    assert_eq!(
        get(&open, "/api/v1/agents").await.0,
        401,
        "only /metrics is opened"
    );
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
