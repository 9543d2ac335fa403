//! Registration in Clouddriver end to end at the hub level: an agent that connects gets its
//! account registered (Account Management API and dynamic-config file) with a kubeconfig
//! whose token works on the hub's proxy for that account only; an account whose agent stays
//! away past the grace period is removed; a restart sends nothing for unchanged accounts; a
//! rotated Clouddriver token is registered again and the old one stops working. The
//! Clouddriver side is the contract server of `testkit/src/contract.rs` (NOT Clouddriver:
//! written from its source); the agents are fakes speaking the real gRPC protocol over mutual
//! TLS; the hub serves HTTPS.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{os::unix::fs::MetadataExt as _, path::Path, time::Duration};

use base64::Engine as _;
use bytes::Bytes;
use common::{contract::start_contract_for, *};
use scale_agent_hub::{Config, clouddriver::ClouddriverSettings};
use serde_json::{Value, json};

/// The accounts in the dynamic-config file, by name.
fn file_accounts(path: &Path) -> Vec<(String, Value)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let doc: Value = serde_saphyr::from_str(&text).unwrap();
    doc["kubernetes"]["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["name"].as_str().unwrap().to_string(), a.clone()))
        .collect()
}

fn file_names(path: &Path) -> Vec<String> {
    file_accounts(path).into_iter().map(|(n, _)| n).collect()
}

fn inode(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

/// Successful `PUT /credentials` so far (of any account: the path does not name it).
fn puts(contract: &common::contract::Contract) -> usize {
    contract
        .seen()
        .iter()
        .filter(|s| s.method == "PUT" && s.status == 200)
        .count()
}

/// The kubeconfig Clouddriver holds for `account`, parsed.
fn registered_kubeconfig(contract: &common::contract::Contract, account: &str) -> Value {
    let accounts = contract.accounts();
    serde_saphyr::from_str(accounts[account]["kubeconfigContents"].as_str().unwrap()).unwrap()
}

/// What `GET /api/v1/clouddriver` says about `account`, if anything.
async fn registration(http: &Https, admin: &str, account: &str) -> Option<Value> {
    let reply = http.get("/api/v1/clouddriver", Some(admin)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["account"] == account)
        .cloned()
}

fn in_sync(status: &Option<Value>) -> bool {
    status.as_ref().is_some_and(|s| {
        s["desired"] == true
            && s["api"]["registered"] == true
            && s["api"]["inSync"] == true
            && s["file"]["registered"] == true
            && s["file"]["inSync"] == true
    })
}

#[tokio::test]
async fn connected_accounts_are_registered_and_removed_after_their_grace_period() {
    let pki = Pki::new();
    let dir = data_dir("proxy-clouddriver");
    let files = data_dir("proxy-clouddriver-files");
    std::fs::create_dir_all(&files).unwrap();
    let accounts_file = files.join("clouddriver-accounts.yml");
    let port = free_port();
    let public_url = format!("https://localhost:{port}");
    let (contract, contract_url) = start_contract_for(&public_url).await;
    let configure = |c: &mut Config| {
        serve_https(&pki, c);
        c.listeners.http_addr = format!("127.0.0.1:{port}").parse().unwrap();
        c.api.public_url = Some(public_url.clone());
        c.streams.grace_period = Duration::from_secs(2);
        c.clouddriver = ClouddriverSettings {
            accounts_file: Some(accounts_file.clone()),
            ..contract_clouddriver(&contract_url)
        };
    };
    let hub = start_hub(&pki, &dir, configure).await;
    let http = Https::new(
        &pki.serving_ca_pem,
        format!("https://127.0.0.1:{port}"),
        Proto::H2,
    );

    // An agent connects: its account is registered, with the permissions it carries.
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register_with(
        "prod-eu",
        "https://10.0.0.1:6443",
        br#"{"permissions":{"READ":["a"],"WRITE":["b"]},"kinds":["ConfigMap"]}"#,
    )
    .await;
    wait_for("prod-eu in Clouddriver", async || {
        contract.accounts().contains_key("prod-eu")
    })
    .await;
    for seen in contract.seen() {
        assert_eq!((seen.method, seen.status), ("PUT", 200), "{seen:?}");
        assert_eq!(seen.refusal, None);
    }
    let definition = &contract.accounts()["prod-eu"];
    assert_eq!(definition["type"], "kubernetes");
    assert_eq!(definition["name"], "prod-eu");
    assert_eq!(
        definition["permissions"],
        json!({"READ": ["a"], "WRITE": ["b"]})
    );
    assert!(definition.get("kinds").is_none(), "{definition}");

    // The kubeconfig works as kubectl in Clouddriver would use it: its server, its CA, its
    // token, answered by the agent...
    let kubeconfig = registered_kubeconfig(&contract, "prod-eu");
    let cluster = &kubeconfig["clusters"][0]["cluster"];
    let server = cluster["server"].as_str().unwrap().to_string();
    assert_eq!(server, format!("{public_url}/clusters/prod-eu"));
    let ca = base64::engine::general_purpose::STANDARD
        .decode(cluster["certificate-authority-data"].as_str().unwrap())
        .unwrap();
    let kubectl = Https::new(std::str::from_utf8(&ca).unwrap(), server, Proto::H2);
    let prod_token = kubeconfig_token(&kubeconfig);
    let (head, reply) = proxied_get(
        &kubectl,
        &mut a,
        "/api/v1/namespaces/default/pods",
        &prod_token,
        br#"{"kind":"PodList","items":[]}"#,
    )
    .await;
    assert_eq!(head.account, "prod-eu");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["kind"], "PodList");

    // ...and the file lists the account.
    wait_for("prod-eu in the file", async || {
        file_names(&accounts_file) == ["prod-eu"]
    })
    .await;
    let first_inode = inode(&accounts_file);
    let (_, in_file) = &file_accounts(&accounts_file)[0];
    assert_eq!(
        in_file["kubeconfigContents"],
        definition["kubeconfigContents"]
    );
    wait_for("prod-eu registered", async || {
        in_sync(&registration(&http, &admin_token(&dir), "prod-eu").await)
    })
    .await;

    // A second agent and account: a new file, with both.
    let mut b = tunnel_agent(&hub, &pki, "agent-b.test", "pod-1").await;
    b.register_with(
        "staging",
        "https://10.0.0.2:6443",
        br#"{"namespaces":["web"]}"#,
    )
    .await;
    wait_for("staging in Clouddriver and in the file", async || {
        contract.accounts().contains_key("staging")
            && file_names(&accounts_file) == ["prod-eu", "staging"]
    })
    .await;
    let second_inode = inode(&accounts_file);
    assert_ne!(second_inode, first_inode, "rewritten in place");
    assert_eq!(contract.accounts()["staging"]["namespaces"], json!(["web"]));
    // prod-eu's token reaches prod-eu only: a Status on an API path, plain text with the
    // same message on a discovery path (client-go's discovery client shows only that).
    let message = http
        .get("/clusters/staging/api/v1/pods", Some(&prod_token))
        .await
        .k8s_status(403, "Forbidden");
    assert!(
        message.contains("\"prod-eu\"") && message.contains("\"staging\""),
        "{message}"
    );
    let text = http
        .get("/clusters/staging/api", Some(&prod_token))
        .await
        .text_error(403);
    assert_eq!(text, message);
    let staging_token = kubeconfig_token(&registered_kubeconfig(&contract, "staging"));
    b.assert_no_tunnel_frames(&http, &staging_token, "staging")
        .await;

    // prod-eu's agent leaves for longer than the grace period: removed from both.
    drop(a);
    wait_for("prod-eu deleted", async || {
        contract
            .seen()
            .iter()
            .any(|s| s.method == "DELETE" && s.path == "/credentials/prod-eu")
            && file_names(&accounts_file) == ["staging"]
            && registration(&http, &admin_token(&dir), "prod-eu")
                .await
                .is_none()
    })
    .await;
    assert!(!contract.accounts().contains_key("prod-eu"));
    assert_ne!(inode(&accounts_file), second_inode, "rewritten in place");
    let message = http
        .get("/clusters/prod-eu/api", Some(&prod_token))
        .await
        .text_error(404);
    assert!(
        message.contains("\"prod-eu\"") && message.contains("grace period"),
        "{message}"
    );

    // A restart with the same data directory: staging is unchanged, nothing is sent.
    let puts_before = puts(&contract);
    let file_before = inode(&accounts_file);
    assert_eq!(
        kubeconfig_token(&registered_kubeconfig(&contract, "staging")),
        staging_token
    );
    hub.shutdown().await.unwrap();
    drop(b);
    let hub = start_hub(&pki, &dir, configure).await;
    let mut b = tunnel_agent(&hub, &pki, "agent-b.test", "pod-1").await;
    b.register_with(
        "staging",
        "https://10.0.0.2:6443",
        br#"{"namespaces":["web"]}"#,
    )
    .await;
    let http = Https::new(
        &pki.serving_ca_pem,
        format!("https://127.0.0.1:{port}"),
        Proto::H2,
    );
    wait_for("staging in sync after the restart", async || {
        in_sync(&registration(&http, &admin_token(&dir), "staging").await)
    })
    .await;
    // No DELETE and PUT again either (the registrar acting before it knew the accounts).
    assert_eq!(puts(&contract), puts_before, "PUT again");
    assert!(
        !contract
            .seen()
            .iter()
            .any(|s| s.method == "DELETE" && s.path == "/credentials/staging"),
        "staging was removed at the restart"
    );
    assert_eq!(inode(&accounts_file), file_before, "file rewritten");
    let (_, reply) = proxied_get(
        &http,
        &mut b,
        "/clusters/staging/api/v1/pods",
        &staging_token,
        b"{}",
    )
    .await;
    assert_eq!(reply.status, 200, "the registered token still works");

    // Rotating the Clouddriver token registers a new kubeconfig; the old token stops working.
    let reply = http
        .with_token(
            "POST",
            "/api/v1/accounts/staging/kubeconfig?tokenName=clouddriver&rotate=true",
            &admin_token(&dir),
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let rotated: Value = serde_saphyr::from_str(&reply.text()).unwrap();
    let new_token = kubeconfig_token(&rotated);
    assert_ne!(new_token, staging_token);
    wait_for(
        "the new kubeconfig in Clouddriver and in the file",
        async || {
            kubeconfig_token(&registered_kubeconfig(&contract, "staging")) == new_token
                && file_accounts(&accounts_file).first().is_some_and(|(_, a)| {
                    a["kubeconfigContents"]
                        .as_str()
                        .is_some_and(|k| k.contains(&new_token))
                })
        },
    )
    .await;
    assert_eq!(puts(&contract), puts_before + 1);
    assert_ne!(inode(&accounts_file), file_before, "rewritten in place");
    let message = http
        .get("/clusters/staging/api/v1/pods", Some(&staging_token))
        .await
        .k8s_status(401, "Unauthorized");
    assert!(message.contains("revoked"), "{message}");
    let (_, reply) = proxied_get(
        &http,
        &mut b,
        "/clusters/staging/api/v1/pods",
        &new_token,
        b"{}",
    )
    .await;
    assert_eq!(reply.status, 200);
    for seen in contract.seen() {
        assert_eq!(seen.refusal, None, "{seen:?}");
    }

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&files);
}
