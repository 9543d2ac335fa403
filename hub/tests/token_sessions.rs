//! Revoking one token ends what it opened (issue 28, F17), against the hub's real
//! listeners (real TLS, tokens from the admin API) with the protocol-level fake agent:
//! - a person's proxy token: its watches (served from the cache and tunnelled to the API
//!   server) and its exec session end within seconds of the revocation, the watches the way
//!   the API server ends one, and its next request gets 401; another person's watch stays;
//! - an agent bearer token: the stream that authenticated with it ends at once, and another
//!   identity's stream stays;
//! - each revocation's audit line (in the audit file) says how many it ended.
//!
//! One process-wide audit file serves both tests (a process has one tracing subscriber);
//! each finds its own line by the token's id.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod identity;

use std::{path::PathBuf, sync::OnceLock, time::Duration};

use bytes::Bytes;
use common::*;
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use identity::*;
use scale_agent_hub::audit_log::AuditLogOptions;
use scale_agent_proto::v1::account_assignment::Role;
use serde_json::Value;
use tokio::io::AsyncReadExt as _;
use tonic::Code;
use tracing_subscriber::layer::SubscriberExt as _;

/// How long a revocation may take to end what its token opened.
const ENDS_WITHIN: Duration = Duration::from_secs(5);

/// The process's audit file.
fn audit_file() -> &'static PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = data_dir("token-sessions-audit");
        std::fs::create_dir_all(&dir).unwrap();
        let options = AuditLogOptions {
            path: dir.join("audit.log"),
            max_bytes: 64 << 20,
            max_backups: 1,
        };
        let subscriber = tracing_subscriber::registry()
            .with(scale_agent_hub::audit_log::layer(options.clone()).unwrap());
        tracing::subscriber::set_global_default(subscriber).unwrap();
        options.path
    })
}

/// The audit line of the revocation of token `id`, once written.
async fn revocation_line(id: &str) -> Value {
    let find = || {
        std::fs::read_to_string(audit_file())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| {
                l["fields"]["object"] == id
                    && l["fields"]["verb"]
                        .as_str()
                        .is_some_and(|v| v.starts_with("revoke"))
            })
    };
    wait_for("the revocation's audit line", async || find().is_some()).await;
    find().unwrap()
}

async fn delete(http: &Https, admin: &str, path: &str) -> (u16, Value) {
    let reply = http.with_token("DELETE", path, admin, Bytes::new()).await;
    (
        reply.status,
        serde_json::from_str(&reply.text()).unwrap_or(Value::Null),
    )
}

/// Opens a GET through the proxy with `token`; the response once its head arrived.
fn spawn_get(
    http: &Https,
    path: &str,
    token: &str,
    headers: &[(&str, &str)],
) -> tokio::task::JoinHandle<http::Response<hyper::body::Incoming>> {
    let mut request = http
        .request("GET", &format!("/clusters/prod{path}"))
        .header("authorization", format!("Bearer {token}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(empty()).unwrap();
    let http = http.clone();
    tokio::spawn(async move { http.send(request).await })
}

#[tokio::test]
async fn revoking_a_proxy_token_ends_its_watches_and_exec_sessions_and_no_others() {
    audit_file();
    let pki = Pki::new();
    let dir = data_dir("token-sessions-proxy");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let h1 = Https::for_hub(&pki, &hub, Proto::H1);
    let admin = admin_token(&dir);
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    assert_eq!(a.register("prod", HOST).await.role, Role::Streaming as i32);
    a.snapshot("prod", &[("web", "10")], "10").await;
    a.send(scale_agent_proto::v1::agent_message::Kind::KindStatus(
        scale_agent_proto::v1::KindStatus {
            account: "prod".into(),
            kind: Some(configmaps()),
            state: scale_agent_proto::v1::kind_status::State::Watching as i32,
            message: String::new(),
            namespaces: Vec::new(),
        },
    ))
    .await;
    a.synced().await;
    let alice = kubeconfig_token(&issue_kubeconfig(&h1, &admin, "prod", "alice").await);
    let bob = kubeconfig_token(&issue_kubeconfig(&h1, &admin, "prod", "bob").await);

    // Alice: a watch the cache serves, a watch tunnelled to the API server, and an exec
    // session; Bob: a watch the cache serves.
    let cached_watch = "/api/v1/configmaps?watch=true&resourceVersion=0";
    let alice_cached = spawn_get(&h1, cached_watch, &alice, &[]).await.unwrap();
    assert_eq!(alice_cached.status(), 200);
    assert_eq!(alice_cached.headers()["x-scale-agent-cache"], "hit");
    let bob_cached = spawn_get(&h1, cached_watch, &bob, &[]).await.unwrap();
    assert_eq!(bob_cached.status(), 200);

    let tunnelled = spawn_get(
        &h1,
        "/api/v1/pods?watch=true&resourceVersion=5",
        &alice,
        &[],
    );
    let (watch_id, _) = a.request().await;
    a.respond_head(
        watch_id,
        200,
        &[("content-type", "application/json")],
        false,
    )
    .await;
    let event = b"{\"type\":\"ADDED\",\"object\":{}}\n";
    a.send_data(watch_id, event, false).await;
    let alice_tunnelled = tunnelled.await.unwrap();
    assert_eq!(alice_tunnelled.status(), 200);

    let exec = spawn_get(
        &h1,
        "/api/v1/namespaces/default/pods/web-0/exec?command=sh&stdin=true&stdout=true",
        &alice,
        &[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v4.channel.k8s.io"),
        ],
    );
    let (exec_id, _) = a.request().await;
    a.respond_head(
        exec_id,
        101,
        &[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v4.channel.k8s.io"),
        ],
        false,
    )
    .await;
    let exec = exec.await.unwrap();
    assert_eq!(exec.status(), 101);
    let upgraded = tokio::time::timeout(WAIT, hyper::upgrade::on(exec))
        .await
        .unwrap()
        .unwrap();
    let mut exec_io = TokioIo::new(upgraded);
    a.send_data(exec_id, b"$ ", false).await;
    let mut prompt = [0u8; 2];
    tokio::time::timeout(WAIT, exec_io.read_exact(&mut prompt))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&prompt, b"$ ");

    // The admin revokes Alice's token.
    let (status, tokens) = get_tokens(&h1, &admin).await;
    assert_eq!(status, 200);
    let id = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "alice" && t["account"] == "prod")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, revoked) = delete(&h1, &admin, &format!("/api/v1/tokens/{id}")).await;
    assert_eq!(status, 200, "{revoked}");
    assert_eq!(revoked["endedSessions"], 3, "{revoked}");

    // Both watches end as the API server ends a watch (the body ends, nothing broken),
    // with what they had sent; the exec connection closes.
    let (bytes, error) = tokio::time::timeout(ENDS_WITHIN, read_to_end(alice_cached.into_body()))
        .await
        .expect("the cached watch outlived its revoked token");
    assert!(error.is_none(), "{error:?}");
    assert!(
        String::from_utf8_lossy(&bytes).contains("\"web\""),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let (bytes, error) =
        tokio::time::timeout(ENDS_WITHIN, read_to_end(alice_tunnelled.into_body()))
            .await
            .expect("the tunnelled watch outlived its revoked token");
    assert!(error.is_none(), "{error:?}");
    assert_eq!(bytes, event);
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(ENDS_WITHIN, exec_io.read_to_end(&mut rest))
        .await
        .expect("the exec session outlived its revoked token");

    // Bob's watch goes on; a new request with Alice's token is refused.
    let mut bob_body = bob_cached.into_body();
    let mut seen = Vec::new();
    let still_open = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(frame) = bob_body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                seen.extend_from_slice(&data);
            }
        }
    })
    .await
    .is_err();
    assert!(
        still_open,
        "another token's watch ended: {}",
        String::from_utf8_lossy(&seen)
    );
    let reply = h1
        .get("/clusters/prod/api/v1/configmaps", Some(&alice))
        .await;
    assert_eq!(reply.status, 401, "{}", reply.text());

    let line = revocation_line(&id).await;
    assert_eq!(line["fields"]["verb"], "revoke-token", "{line}");
    assert_eq!(line["fields"]["ended"], 3, "{line}");
    assert_eq!(line["fields"]["code"], 200, "{line}");
    drop(bob_body);
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

async fn get_tokens(http: &Https, admin: &str) -> (u16, Value) {
    let reply = http.get("/api/v1/tokens", Some(admin)).await;
    (reply.status, reply.json())
}

#[tokio::test]
async fn revoking_an_agent_bearer_token_ends_its_stream_and_no_other() {
    audit_file();
    let pki = Pki::new();
    let dir = data_dir("token-sessions-agent");
    let (hub, http, admin) = hub_of_its_own(&pki, &dir).await;
    let (status, issued) = post(
        &http,
        &admin,
        "/api/v1/agent-tokens?identity=prod-agent&accounts=prod-*&ttl=1h",
    )
    .await;
    assert_eq!(status, 201, "{issued}");
    let (id, bearer) = (
        issued["id"].as_str().unwrap().to_string(),
        issued["token"].as_str().unwrap().to_string(),
    );
    let mut by_token = connect(&hub, &pki, None, Some(&bearer), "pod-1")
        .await
        .unwrap();
    assert_eq!(
        by_token.register("prod-eu", HOST).await.role,
        Role::Streaming as i32
    );
    let (client, _) = enrolled(&hub, &pki, &http, &admin, "dev-agent", "dev-*").await;
    let mut other = connect(&hub, &pki, Some(client), None, "pod-1")
        .await
        .unwrap();
    assert_eq!(
        other.register("dev-eu", HOST).await.role,
        Role::Streaming as i32
    );

    let (status, revoked) = delete(&http, &admin, &format!("/api/v1/agent-tokens/{id}")).await;
    assert_eq!(status, 200, "{revoked}");
    assert_eq!(revoked["endedSessions"], 1, "{revoked}");
    let ended = tokio::time::timeout(ENDS_WITHIN, by_token.error())
        .await
        .expect("the stream outlived its revoked bearer token");
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert!(
        ended.message().contains(&id) && ended.message().contains("revoked"),
        "{ended:?}"
    );
    // The token opens nothing any more; the other identity's stream goes on.
    refused(
        connect(&hub, &pki, None, Some(&bearer), "pod-1").await,
        Code::Unauthenticated,
        &["revoked"],
    );
    assert_eq!(
        other.register("dev-us", HOST).await.role,
        Role::Streaming as i32
    );
    let line = revocation_line(&id).await;
    assert_eq!(line["fields"]["verb"], "revoke-agent-token", "{line}");
    assert_eq!(line["fields"]["ended"], 1, "{line}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
