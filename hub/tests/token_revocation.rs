//! Revoking a Clouddriver (derived) proxy token sticks (issue 28, F2): the registrar derives
//! the account's token again at once, and before the fix it derived generation 1 again, the
//! very token just revoked. Here the hub serves HTTPS with its registrar writing the
//! dynamic-config file, a fake agent speaks the real gRPC protocol over mutual TLS: revoke
//! the registered token, wait past several registrar ticks, the revoked token is refused
//! with a message and the newly registered one works; rotate then revoke the rotated one,
//! neither earlier token comes back; and all of that holds after a restart of the hub.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{path::Path, time::Duration};

use bytes::Bytes;
use common::*;
use scale_agent_hub::{Config, clouddriver::ClouddriverSettings};
use serde_json::Value;

/// The token in the kubeconfig the registrar wrote for `account` into the dynamic-config
/// file, if it wrote one.
fn registered_token(path: &Path, account: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let doc: Value = serde_saphyr::from_str(&text).ok()?;
    let entry = doc["kubernetes"]["accounts"]
        .as_array()?
        .iter()
        .find(|a| a["name"] == account)?
        .clone();
    let kubeconfig: Value = serde_saphyr::from_str(entry["kubeconfigContents"].as_str()?).ok()?;
    Some(kubeconfig_token(&kubeconfig))
}

/// The id of `account`'s Clouddriver token, from the admin API's token list.
async fn clouddriver_token_id(http: &Https, admin: &str, account: &str) -> String {
    let reply = http.get("/api/v1/tokens", Some(admin)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let list = reply.json();
    let found: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["account"] == account && t["name"] == "clouddriver")
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one Clouddriver token, no tombstone listed: {list}"
    );
    found[0]["id"].as_str().unwrap().to_string()
}

async fn revoke(http: &Https, admin: &str, id: &str) {
    let reply = http
        .with_token(
            "DELETE",
            &format!("/api/v1/tokens/{id}"),
            admin,
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
}

/// Asserts `token` is refused on `account`'s proxy path, with a message saying why.
async fn refused(http: &Https, account: &str, token: &str, what: &str) {
    let message = http
        .get(&format!("/clusters/{account}/api/v1/pods"), Some(token))
        .await
        .k8s_status(401, "Unauthorized");
    assert!(message.contains("revoked"), "{what}: {message}");
}

/// Waits until the registrar has registered a token other than every one in `old`.
async fn newly_registered(file: &Path, account: &str, old: &[&str]) -> String {
    let mut token = String::new();
    wait_for(
        "a new Clouddriver token registered",
        async || match registered_token(file, account) {
            Some(t) if !old.contains(&t.as_str()) => {
                token = t;
                true
            }
            _ => false,
        },
    )
    .await;
    token
}

#[tokio::test]
async fn a_revoked_clouddriver_token_stays_revoked_across_derivations_rotations_and_restarts() {
    let pki = Pki::new();
    let dir = data_dir("token-revocation");
    let files = data_dir("token-revocation-files");
    std::fs::create_dir_all(&files).unwrap();
    let accounts_file = files.join("clouddriver-accounts.yml");
    let port = free_port();
    let public_url = format!("https://localhost:{port}");
    let configure = |c: &mut Config| {
        serve_https(&pki, c);
        c.listeners.http_addr = format!("127.0.0.1:{port}").parse().unwrap();
        c.api.public_url = Some(public_url.clone());
        c.clouddriver = ClouddriverSettings {
            accounts_file: Some(accounts_file.clone()),
            ..ClouddriverSettings::default()
        };
    };
    let hub = start_hub(&pki, &dir, configure).await;
    let admin = admin_token(&dir);
    let http = Https::new(
        &pki.serving_ca_pem,
        format!("https://127.0.0.1:{port}"),
        Proto::H2,
    );
    let mut agent = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    agent.register("prod", "https://10.0.0.1:6443").await;
    let first = newly_registered(&accounts_file, "prod", &[]).await;
    let (_, reply) = proxied_get(
        &http,
        &mut agent,
        "/clusters/prod/api/v1/pods",
        &first,
        b"{}",
    )
    .await;
    assert_eq!(reply.status, 200, "the registered token works");

    // Revoke it: the registrar registers another token, and the revoked one stays refused
    // after several registrar ticks (each under a second).
    revoke(
        &http,
        &admin,
        &clouddriver_token_id(&http, &admin, "prod").await,
    )
    .await;
    let second = newly_registered(&accounts_file, "prod", &[&first]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    refused(
        &http,
        "prod",
        &first,
        "revoked, after 3 s of registrar ticks",
    )
    .await;
    assert_eq!(
        registered_token(&accounts_file, "prod").as_deref(),
        Some(second.as_str())
    );
    let (_, reply) = proxied_get(
        &http,
        &mut agent,
        "/clusters/prod/api/v1/pods",
        &second,
        b"{}",
    )
    .await;
    assert_eq!(reply.status, 200, "the newly registered token works");

    // Rotate, then revoke the rotated token: neither the first nor the second comes back.
    let reply = http
        .with_token(
            "POST",
            "/api/v1/accounts/prod/kubeconfig?tokenName=clouddriver&rotate=true",
            &admin,
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let third = kubeconfig_token(&serde_saphyr::from_str(&reply.text()).unwrap());
    assert!(third != first && third != second);
    revoke(
        &http,
        &admin,
        &clouddriver_token_id(&http, &admin, "prod").await,
    )
    .await;
    let fourth = newly_registered(&accounts_file, "prod", &[&first, &second, &third]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (old, what) in [(&first, "first"), (&second, "second"), (&third, "rotated")] {
        refused(&http, "prod", old, what).await;
    }

    // A restart reads the tombstone back from the store: the revoked tokens stay refused,
    // the one registered last still works and is not replaced.
    drop(agent);
    hub.shutdown().await.unwrap();
    let hub = start_hub(&pki, &dir, configure).await;
    let mut agent = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    agent.register("prod", "https://10.0.0.1:6443").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (old, what) in [(&first, "first"), (&second, "second"), (&third, "rotated")] {
        refused(&http, "prod", old, &format!("{what}, after a restart")).await;
    }
    assert_eq!(
        registered_token(&accounts_file, "prod").as_deref(),
        Some(fourth.as_str())
    );
    let (_, reply) = proxied_get(
        &http,
        &mut agent,
        "/clusters/prod/api/v1/pods",
        &fourth,
        b"{}",
    )
    .await;
    assert_eq!(
        reply.status, 200,
        "the token registered last works after the restart"
    );

    // And revoking it after the restart moves on again, past every earlier generation.
    revoke(
        &http,
        &admin,
        &clouddriver_token_id(&http, &admin, "prod").await,
    )
    .await;
    let fifth = newly_registered(&accounts_file, "prod", &[&first, &second, &third, &fourth]).await;
    refused(&http, "prod", &fourth, "revoked after the restart").await;
    let (_, reply) = proxied_get(
        &http,
        &mut agent,
        "/clusters/prod/api/v1/pods",
        &fifth,
        b"{}",
    )
    .await;
    assert_eq!(reply.status, 200);

    drop(agent);
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&files);
}
