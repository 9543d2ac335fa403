//! Protobuf reads of a kind the hub caches (issue 30): client-go's typed clients for built-in
//! kinds ask for `application/vnd.kubernetes.protobuf,application/json` (kubectl 1.37's
//! `kubectl top node` reads its Nodes that way), `kubectl top` asks for protobuf alone, and
//! metadata and Table forms have protobuf variants too. The hub holds objects as JSON and has
//! no protobuf encoder, so every such read (GET, LIST, WATCH, Table) goes to the API server
//! through the tunnel whole: the agent receives the client's Accept unchanged, and the client
//! receives the API server's status, Content-Type and bytes unchanged. The same paths with a
//! JSON Accept are answered from the cache (checked first, so the tunnel is not an unsynced
//! cache). A write answered in protobuf says no resourceVersion the hub can read, so the
//! kind's cached reads are tunnelled for `consistency::BARRIER` after it (read-your-writes
//! kept without parsing protobuf). Secrets of an account that keeps their data home: a
//! protobuf-first read that accepts JSON gets the cache's JSON (metadata only), a
//! protobuf-only one the 403, and neither reaches the agent. The hub serves HTTPS; the agent is a fake speaking the
//! real gRPC protocol over mutual TLS.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use scale_agent_proto::v1::{
    self as pb, agent_message::Kind as Msg, kind_status::State, object_event::Type,
};

/// What client-go's typed clients for built-in kinds send (`PrefersProtobuf`).
const CLIENT_GO: &str = "application/vnd.kubernetes.protobuf,application/json";
/// What `kubectl top` sends (`--use-protocol-buffers`, on by default).
const PROTOBUF_ONLY: &str = "application/vnd.kubernetes.protobuf";
/// client-go's metadata client.
const METADATA: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
/// A Table asked for in protobuf first.
const TABLE: &str = "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// A protobuf answer as the API server frames it (the `k8s\0` magic, then the `Unknown`
/// envelope), with bytes that are not UTF-8, so any re-encoding would show.
const PROTOBUF_BODY: &[u8] =
    b"k8s\x00\x0a\x0d\x0a\x02v1\x12\x0dConfigMapList\x12\x04\xff\xfe\x80\x00\x1a\x00\x22\x00";

async fn get(http: &Https, path: &str, token: &str, accept: &str) -> Reply {
    read_all(
        http.send(
            http.request("GET", path)
                .header("authorization", format!("Bearer {token}"))
                .header("accept", accept)
                .body(empty())
                .unwrap(),
        )
        .await,
    )
    .await
}

fn header(head: &pb::HttpRequestHead, name: &str) -> Vec<String> {
    head.headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| String::from_utf8_lossy(&h.value).into_owned())
        .collect()
}

/// A GET with `accept` that must reach the agent: the agent checks what it received and
/// answers `status` with `content_type` and `body`; the client must get exactly that.
async fn tunnelled(
    http: &Https,
    agent: &mut FakeAgent,
    token: &str,
    api_path: &str,
    accept: &str,
    (status, content_type, body): (u32, &str, &[u8]),
) {
    let call = {
        let (http, token, accept) = (http.clone(), token.to_string(), accept.to_string());
        let path = format!("/clusters/a{api_path}");
        tokio::spawn(async move { get(&http, &path, &token, &accept).await })
    };
    let (exchange, head) = agent.request().await;
    assert_eq!(head.path_and_query, api_path, "the path the agent replays");
    assert_eq!(
        header(&head, "accept"),
        [accept],
        "{api_path}: the agent must receive the client's Accept unchanged"
    );
    agent
        .respond(exchange, status, &[("content-type", content_type)], body)
        .await;
    let reply = call.await.unwrap();
    assert_eq!(u32::from(reply.status), status, "{api_path} with {accept}");
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some(content_type),
        "{api_path} with {accept}: the API server's Content-Type"
    );
    assert_eq!(
        &reply.body[..],
        body,
        "{api_path} with {accept}: the API server's bytes"
    );
    assert_eq!(
        reply.header("x-scale-agent-cache").as_deref(),
        Some("tunnel"),
        "{api_path} with {accept}"
    );
}

#[tokio::test]
async fn protobuf_reads_of_a_cached_kind_are_tunnelled_whole() {
    let pki = Pki::new();
    let dir = data_dir("proxy-protobuf");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut agent = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    agent
        .register_with("a", "https://10.0.0.1:6443", br#"{"kinds":["ConfigMap"]}"#)
        .await;
    agent
        .snapshot("a", &[("one", "10"), ("two", "11")], "20")
        .await;
    agent
        .send(Msg::KindStatus(pb::KindStatus {
            account: "a".into(),
            kind: Some(configmaps()),
            state: State::Watching as i32,
            message: String::new(),
            namespaces: vec![],
        }))
        .await;
    agent.synced().await;
    let token = token_for(&http, &admin, "a").await;

    let list = "/api/v1/namespaces/default/configmaps";
    let one = "/api/v1/namespaces/default/configmaps/one";
    // The kind is cached and synced: JSON, the metadata-only form and JSON Tables of these
    // paths come from the cache.
    for (path, accept) in [
        (list, "application/json"),
        (one, "application/json"),
        (
            list,
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
        ),
        (
            list,
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        ),
    ] {
        let reply = get(&http, &format!("/clusters/a{path}"), &token, accept).await;
        assert_eq!(reply.status, 200, "{path} {accept}: {}", reply.text());
        assert_eq!(
            reply.header("x-scale-agent-cache").as_deref(),
            Some("hit"),
            "{path} with {accept}"
        );
        assert!(
            reply
                .header("content-type")
                .is_some_and(|t| t.starts_with("application/json")),
            "{path} with {accept}: {:?}",
            reply.header("content-type")
        );
    }

    // Protobuf first, in every form: the API server's answer, byte for byte.
    let protobuf = (200, PROTOBUF_ONLY, PROTOBUF_BODY);
    for (path, accept) in [
        (list, CLIENT_GO),
        (list, PROTOBUF_ONLY),
        (one, CLIENT_GO),
        (one, PROTOBUF_ONLY),
        (list, METADATA),
    ] {
        tunnelled(&http, &mut agent, &token, path, accept, protobuf).await;
    }
    // The API server has no protobuf Table: whatever it answers (here its JSON Table, the
    // next alternative) is what the client gets.
    let json_table = br#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","rows":[]}"#;
    tunnelled(
        &http,
        &mut agent,
        &token,
        list,
        TABLE,
        (200, "application/json", json_table),
    )
    .await;
    // A refusal passes through as the API server wrote it.
    let not_acceptable = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotAcceptable","code":406}"#;
    tunnelled(
        &http,
        &mut agent,
        &token,
        list,
        "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io",
        (406, "application/json", not_acceptable),
    )
    .await;
    // A watch in protobuf (client-go's informers for built-in kinds): tunnelled, its
    // length-prefixed frames untouched.
    let frames = b"\x00\x00\x00\x0ck8s\x00\x0a\x05ADDED\x12\x01\xff";
    tunnelled(
        &http,
        &mut agent,
        &token,
        &format!("{list}?resourceVersion=20&watch=true"),
        CLIENT_GO,
        (
            200,
            "application/vnd.kubernetes.protobuf;stream=watch",
            frames,
        ),
    )
    .await;
    // The same watch in JSON is the cache's (it ends by its timeout).
    let reply = get(
        &http,
        &format!("/clusters/a{list}?resourceVersion=20&watch=true&timeoutSeconds=1"),
        &token,
        "application/json",
    )
    .await;
    assert_eq!(reply.header("x-scale-agent-cache").as_deref(), Some("hit"));

    // A write answered in protobuf: the hub cannot read its resourceVersion, so JSON reads
    // of the kind go to the API server for a while rather than risk an older state.
    let call = {
        let (http, token) = (http.clone(), token.clone());
        tokio::spawn(async move {
            read_all(
                http.send(
                    http.request(
                        "PUT",
                        "/clusters/a/api/v1/namespaces/default/configmaps/one",
                    )
                    .header("authorization", format!("Bearer {token}"))
                    .header("accept", CLIENT_GO)
                    .header("content-type", PROTOBUF_ONLY)
                    .body(full(PROTOBUF_BODY))
                    .unwrap(),
                )
                .await,
            )
            .await
        })
    };
    let (exchange, head) = agent.request().await;
    assert_eq!(head.method, "PUT");
    agent
        .respond(
            exchange,
            200,
            &[("content-type", PROTOBUF_ONLY)],
            PROTOBUF_BODY,
        )
        .await;
    let reply = call.await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        &reply.body[..],
        PROTOBUF_BODY,
        "the write's answer, untouched"
    );
    let json = br#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"21"},"items":[]}"#;
    tunnelled(
        &http,
        &mut agent,
        &token,
        list,
        "application/json",
        (200, "application/json", json),
    )
    .await;

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Secret as the real agent streams it (metadata and type, no data).
fn secret_event(account: &str, kind: &pb::Kind) -> Msg {
    let object = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "db", "namespace": "web", "uid": "uid-db", "resourceVersion": "10"},
    });
    Msg::Object(pb::ObjectEvent {
        account: account.into(),
        kind: Some(kind.clone()),
        r#type: Type::Applied as i32,
        namespace: "web".into(),
        name: "db".into(),
        uid: "uid-db".into(),
        resource_version: "10".into(),
        object_json: serde_json::to_vec(&object).unwrap(),
        truncated: false,
        watch_namespace: String::new(),
    })
}

#[tokio::test]
async fn protobuf_reads_of_secrets_kept_home_get_the_caches_json_or_403() {
    let pki = Pki::new();
    let dir = data_dir("proxy-protobuf-secrets");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut agent = tunnel_agent(&hub, &pki, "agent-s.test", "pod-1").await;
    agent
        .register_with("s", "https://10.0.0.1:6443", br#"{"kinds":["Secret"]}"#)
        .await;
    let secrets = pb::Kind {
        group: String::new(),
        version: "v1".into(),
        kind: "Secret".into(),
        plural: "secrets".into(),
        namespaced: true,
    };
    let (account, kind) = ("s".to_string(), Some(secrets.clone()));
    agent
        .send(Msg::SnapshotBegin(pb::SnapshotBegin {
            account: account.clone(),
            kind: kind.clone(),
            watch_namespace: String::new(),
        }))
        .await;
    agent.send(secret_event("s", &secrets)).await;
    agent
        .send(Msg::SnapshotEnd(pb::SnapshotEnd {
            account: account.clone(),
            kind: kind.clone(),
            resource_version: "20".into(),
            object_count: 1,
            watch_namespace: String::new(),
        }))
        .await;
    agent
        .send(Msg::KindStatus(pb::KindStatus {
            account,
            kind,
            state: State::Watching as i32,
            message: String::new(),
            namespaces: vec![],
        }))
        .await;
    agent.synced().await;
    let token = token_for(&http, &admin, "s").await;

    for path in [
        "/clusters/s/api/v1/namespaces/web/secrets",
        "/clusters/s/api/v1/namespaces/web/secrets/db",
    ] {
        let reply = get(&http, path, &token, CLIENT_GO).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
        assert_eq!(reply.header("x-scale-agent-cache").as_deref(), Some("hit"));
        assert_eq!(
            reply.header("content-type").as_deref(),
            Some("application/json"),
            "{path}: JSON, which the client accepts, under its own Content-Type"
        );
        assert!(reply.text().contains("\"db\""), "{}", reply.text());
        assert!(!reply.text().contains("\"data\""), "{}", reply.text());

        let reply = get(&http, path, &token, PROTOBUF_ONLY).await;
        assert_eq!(reply.status, 403, "{path}: {}", reply.text());
        assert!(reply.text().contains("allowSecretData"), "{}", reply.text());
    }
    agent.assert_no_tunnel_frames(&http, &token, "s").await;

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
