//! Secret data stays in the cluster (issue 28, F3): with an account's token, every way the
//! proxy offers to read a Secret (GET `-o json`, LIST, `fieldSelector` on the name, WATCH,
//! kubectl's Table, a `dryRun` PATCH, an encoded or dotted path) gets the Secret as the hub
//! caches it (metadata and type, never `data`) or a 403 saying how to opt in, and nothing
//! reaches the agent; an account whose AgentAccount sets `allowSecretData: true` (carried in
//! its registration) reads Secrets through the tunnel as before (Helm's case). The hub
//! serves HTTPS; the agent is a fake speaking the real gRPC protocol over mutual TLS and
//! streams Secrets as the real agent does (metadata only).

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use scale_agent_proto::v1::{
    self as pb, agent_message::Kind as Msg, kind_status::State as KindState, object_event::Type,
};
use serde_json::{Value, json};

fn secrets_kind() -> pb::Kind {
    pb::Kind {
        group: String::new(),
        version: "v1".into(),
        kind: "Secret".into(),
        plural: "secrets".into(),
        namespaced: true,
    }
}

/// Streams `names` as the real agent streams Secrets: metadata and type, no data.
async fn snapshot_secrets(agent: &mut FakeAgent, account: &str, names: &[&str]) {
    agent
        .send(Msg::SnapshotBegin(pb::SnapshotBegin {
            account: account.into(),
            kind: Some(secrets_kind()),
            watch_namespace: String::new(),
        }))
        .await;
    for (i, name) in names.iter().enumerate() {
        let rv = format!("{}", 10 + i);
        let object = json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": "web", "uid": format!("uid-{name}"),
                         "resourceVersion": rv, "labels": {"app": "db"}},
        });
        agent
            .send(Msg::Object(pb::ObjectEvent {
                account: account.into(),
                kind: Some(secrets_kind()),
                r#type: Type::Applied as i32,
                namespace: "web".into(),
                name: name.to_string(),
                uid: format!("uid-{name}"),
                resource_version: rv,
                object_json: serde_json::to_vec(&object).unwrap(),
                truncated: false,
                watch_namespace: String::new(),
            }))
            .await;
    }
    agent
        .send(Msg::SnapshotEnd(pb::SnapshotEnd {
            account: account.into(),
            kind: Some(secrets_kind()),
            resource_version: "100".into(),
            object_count: names.len() as u64,
            watch_namespace: String::new(),
        }))
        .await;
    agent
        .send(Msg::KindStatus(pb::KindStatus {
            account: account.into(),
            kind: Some(secrets_kind()),
            state: KindState::Watching as i32,
            message: String::new(),
            namespaces: vec![],
        }))
        .await;
    agent.synced().await;
}

async fn get(http: &Https, path: &str, token: &str, accept: Option<&str>) -> Reply {
    let mut request = http
        .request("GET", path)
        .header("authorization", format!("Bearer {token}"));
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    http.call(request.body(empty()).unwrap()).await
}

/// Asserts `reply` holds Secrets without data, served by the hub's cache with a warning.
fn served_without_data(reply: &Reply, what: &str) -> Value {
    assert_eq!(reply.status, 200, "{what}: {}", reply.text());
    assert_eq!(
        reply.header("x-scale-agent-cache").as_deref(),
        Some("hit"),
        "{what}"
    );
    assert!(
        reply
            .header("warning")
            .is_some_and(|w| w.contains("allowSecretData")),
        "{what}: {:?}",
        reply.headers
    );
    assert!(
        !reply.text().contains("\"data\""),
        "{what}: {}",
        reply.text()
    );
    reply.json()
}

fn refused(reply: &Reply, status: u16, what: &str) -> String {
    assert_eq!(reply.status, status, "{what}: {}", reply.text());
    let message = reply.json()["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("allowSecretData") || message.contains("canonical"),
        "{what}: {message}"
    );
    message
}

const KUBECTL_TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

#[tokio::test]
async fn secret_data_never_crosses_the_proxy_without_the_accounts_opt_in() {
    let pki = Pki::new();
    let dir = data_dir("proxy-secrets");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut agent = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    agent
        .register_with("ro", "https://10.0.0.1:6443", br#"{"kinds":["Secret"]}"#)
        .await;
    agent
        .register_with(
            "helm",
            "https://10.0.0.1:6443",
            br#"{"kinds":["Secret"],"allowSecretData":true}"#,
        )
        .await;
    snapshot_secrets(&mut agent, "ro", &["db", "api"]).await;
    snapshot_secrets(&mut agent, "helm", &["sh.helm.release.v1.web.v1"]).await;
    let ro = token_for(&http, &admin, "ro").await;
    let helm = token_for(&http, &admin, "helm").await;

    // Reads the cache answers: the Secrets as cached, no data, a warning saying why.
    let one = served_without_data(
        &get(
            &http,
            "/clusters/ro/api/v1/namespaces/web/secrets/db",
            &ro,
            None,
        )
        .await,
        "GET -o json",
    );
    assert_eq!(one["kind"], "Secret");
    assert_eq!(one["type"], "Opaque");
    assert_eq!(one["metadata"]["labels"]["app"], "db");
    let list = served_without_data(
        &get(
            &http,
            "/clusters/ro/api/v1/namespaces/web/secrets",
            &ro,
            None,
        )
        .await,
        "LIST",
    );
    assert_eq!(names_of(&list), ["api", "db"]);
    let all = served_without_data(
        &get(&http, "/clusters/ro/api/v1/secrets", &ro, None).await,
        "LIST all namespaces",
    );
    assert_eq!(names_of(&all), ["api", "db"]);
    let by_name = served_without_data(
        &get(
            &http,
            "/clusters/ro/api/v1/namespaces/web/secrets?fieldSelector=metadata.name%3Ddb",
            &ro,
            None,
        )
        .await,
        "fieldSelector on the name",
    );
    assert_eq!(names_of(&by_name), ["db"]);
    // kubectl get secrets asks for a Table first: it gets the JSON list it also accepts.
    let table = served_without_data(
        &get(
            &http,
            "/clusters/ro/api/v1/namespaces/web/secrets",
            &ro,
            Some(KUBECTL_TABLE),
        )
        .await,
        "kubectl's Table",
    );
    assert_eq!(table["kind"], "SecretList");
    // A watch from the cache: the initial events carry no data either.
    let watch = http
        .send(
            http.request(
                "GET",
                "/clusters/ro/api/v1/namespaces/web/secrets?watch=true&timeoutSeconds=1",
            )
            .header("authorization", format!("Bearer {ro}"))
            .body(empty())
            .unwrap(),
        )
        .await;
    let watch = read_all(watch).await;
    assert_eq!(watch.status, 200, "{}", watch.text());
    assert_eq!(watch.header("x-scale-agent-cache").as_deref(), Some("hit"));
    assert!(
        watch
            .header("warning")
            .is_some_and(|w| w.contains("allowSecretData"))
    );
    let events: Vec<Value> = watch
        .text()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    for event in &events {
        assert_eq!(event["type"], "ADDED");
        assert_eq!(event["object"]["kind"], "Secret");
        assert!(event["object"].get("data").is_none(), "{event}");
    }

    // Everything else on Secrets is refused, and says how to opt in.
    let message = refused(
        &get(
            &http,
            "/clusters/ro/api/v1/namespaces/web/secrets/db",
            &ro,
            Some("application/json;as=Table;v=v1;g=meta.k8s.io"),
        )
        .await,
        403,
        "a Table only",
    );
    assert!(message.contains("cache cannot answer"), "{message}");
    let message = refused(
        &get(
            &http,
            "/clusters/ro/api/v1/namespaces/web/secrets/db",
            &ro,
            Some("application/vnd.kubernetes.protobuf"),
        )
        .await,
        403,
        "protobuf",
    );
    assert!(message.contains("ro"), "{message}");
    refused(
        &http
            .with_token(
                "PATCH",
                "/clusters/ro/api/v1/namespaces/web/secrets/db?dryRun=All",
                &ro,
                "{}",
            )
            .await,
        403,
        "a dryRun PATCH (answers with the object)",
    );
    refused(
        &http
            .with_token(
                "POST",
                "/clusters/ro/api/v1/namespaces/web/secrets",
                &ro,
                r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x"}}"#,
            )
            .await,
        403,
        "a create",
    );
    refused(
        &get(
            &http,
            "/clusters/ro/api/v1/namespaces/web/secr%65ts/db",
            &ro,
            None,
        )
        .await,
        403,
        "an encoded path",
    );
    refused(
        &get(
            &http,
            "/clusters/ro/api/v1/watch/namespaces/web/secrets",
            &ro,
            None,
        )
        .await,
        403,
        "the legacy watch path",
    );
    refused(
        &get(
            &http,
            "/clusters/ro/api/v1/namespaces/web/configmaps/%2E%2E/%2E%2E/web/secrets/db",
            &ro,
            None,
        )
        .await,
        400,
        "a dotted path",
    );
    // None of that reached the agent.
    agent.assert_no_tunnel_frames(&http, &ro, "ro").await;

    // Other kinds still go through as before.
    let (head, reply) = proxied_get(
        &http,
        &mut agent,
        "/clusters/ro/api/v1/namespaces/web/pods",
        &ro,
        b"{}",
    )
    .await;
    assert_eq!(head.path_and_query, "/api/v1/namespaces/web/pods");
    assert_eq!(reply.status, 200);

    // The opted-in account reads a Secret through the tunnel, data and all (Helm).
    let release = br#"{"kind":"Secret","data":{"release":"H4sI"}}"#;
    let (head, reply) = proxied_get(
        &http,
        &mut agent,
        "/clusters/helm/api/v1/namespaces/web/secrets/sh.helm.release.v1.web.v1",
        &helm,
        release,
    )
    .await;
    assert_eq!(head.account, "helm");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(&reply.body[..], release);
    assert!(reply.header("warning").is_none());

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
