//! What the proxy refuses to pass on either way (issue 28, F20 and F21): paths that are not
//! canonical (`.`, `..`, empty segments, a percent-encoded `/` or `.`) are refused with a 400 `Status`
//! naming the segment before discovery, the cache or the agent see them, while a normal
//! path still crosses the tunnel. The hub serves HTTPS; the client sends raw paths (as
//! `curl --path-as-is` does, which hyper's client keeps); the agent is a fake speaking the
//! real gRPC protocol over mutual TLS.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

#[tokio::test]
async fn paths_with_dot_segments_or_encoded_separators_are_refused_before_anything_matches() {
    let pki = Pki::new();
    let dir = data_dir("proxy-canonical-paths");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let h1 = Https::for_hub(&pki, &hub, Proto::H1);
    let admin = admin_token(&dir);
    let mut agent = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    agent.register("prod", "https://10.0.0.1:6443").await;
    let token = token_for(&http, &admin, "prod").await;

    let refused = [
        // The review's example: read as an OpenAPI document (cached for 5 minutes), resolved
        // downstream to the Secrets of namespace x.
        ("/openapi/v3/../../api/v1/namespaces/x/secrets", ".."),
        ("/api/./v1/namespaces/x/configmaps", "."),
        ("/api/v1/namespaces/x/configmaps/a%2Fb", "a%2Fb"),
        ("/api/v1/namespaces/x/configmaps/%2e%2e", "%2e%2e"),
        (
            "/openapi/v3/%2E%2E/%2E%2E/api/v1/namespaces/x/secrets",
            "%2E%2E",
        ),
        // An empty segment: the API server reads it as an empty namespace, every namespace.
        ("/api/v1/namespaces//configmaps", ""),
        ("/api//v1/namespaces/x/secrets", ""),
    ];
    for (api_path, segment) in refused {
        for client in [&http, &h1] {
            let request = client
                .request("GET", &format!("/clusters/prod{api_path}"))
                .header("authorization", format!("Bearer {token}"))
                .body(empty())
                .unwrap();
            assert_eq!(
                request.uri().path(),
                format!("/clusters/prod{api_path}"),
                "the client sends the path as written"
            );
            let reply = client.call(request).await;
            assert_eq!(reply.status, 400, "{api_path}: {}", reply.text());
            let status = reply.json();
            assert_eq!(status["kind"], "Status", "{api_path}: {status}");
            assert_eq!(status["reason"], "BadRequest", "{api_path}: {status}");
            let message = status["message"].as_str().unwrap();
            assert!(
                message.contains(&format!("segment {segment:?}")),
                "{api_path}: {message}"
            );
            assert_eq!(
                reply.header("x-scale-agent-cache").as_deref(),
                Some("hub"),
                "{api_path}: the hub's own refusal"
            );
        }
    }
    // Nothing of that reached the agent, and no discovery entry was fetched for it.
    agent.assert_no_tunnel_frames(&http, &token, "prod").await;

    // A normal path (a dotted name included) still crosses the tunnel as sent.
    let api_path = "/api/v1/namespaces/x/configmaps/app.config.v1";
    let call = {
        let (http, token) = (http.clone(), token.clone());
        let path = format!("/clusters/prod{api_path}");
        tokio::spawn(async move { http.get(&path, Some(&token)).await })
    };
    let (id, head) = agent.request().await;
    assert_eq!(head.path_and_query, api_path);
    agent
        .respond(
            id,
            200,
            &[("content-type", "application/json")],
            br#"{"kind":"ConfigMap"}"#,
        )
        .await;
    let reply = call.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.header("x-scale-agent-cache").as_deref(),
        Some("tunnel")
    );

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// F20: a client's identity claims (`X-Remote-*`, `X-Forwarded-*`, `Forwarded`) do not reach
/// the agent, and an agent cannot make a tunnelled answer look like the hub's own: the
/// hub's `x-scale-agent-*` headers on an agent's answer are replaced or dropped.
#[tokio::test]
async fn identity_claims_stay_behind_and_agents_cannot_set_the_hubs_headers() {
    let pki = Pki::new();
    let dir = data_dir("proxy-header-claims");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut agent = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    agent.register("prod", "https://10.0.0.1:6443").await;
    let token = token_for(&http, &admin, "prod").await;

    let api_path = "/api/v1/namespaces/x/configmaps/web";
    let request = http
        .request("GET", &format!("/clusters/prod{api_path}"))
        .header("authorization", format!("Bearer {token}"))
        .header("x-remote-user", "system:admin")
        .header("x-remote-group", "system:masters")
        .header("x-remote-extra-scopes", "cluster-admin")
        .header("x-forwarded-for", "10.0.0.1")
        .header("x-forwarded-user", "system:admin")
        .header("forwarded", "for=10.0.0.1;proto=https")
        .header("x-scale-agent-forwarded-by", "hub-0")
        .header("accept", "application/json")
        .header("user-agent", "kubectl/v1.37.1 (linux/amd64)")
        .header("kubectl-command", "kubectl get")
        .body(empty())
        .unwrap();
    let call = {
        let http = http.clone();
        tokio::spawn(async move { http.call(request).await })
    };
    let (id, head) = agent.request().await;
    assert_eq!(head.path_and_query, api_path);
    let mut names: Vec<&str> = head.headers.iter().map(|h| h.name.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        ["accept", "kubectl-command", "user-agent"],
        "only what the API server needs: {head:?}"
    );

    // The agent claims the answer came from the hub's cache, through another replica.
    agent
        .respond(
            id,
            200,
            &[
                ("content-type", "application/json"),
                ("x-scale-agent-cache", "hit"),
                ("x-scale-agent-cache-age", "3"),
                ("x-scale-agent-replica", "hub-elsewhere"),
                ("audit-id", "from-the-api-server"),
            ],
            br#"{"kind":"ConfigMap"}"#,
        )
        .await;
    let reply = call.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    let cache: Vec<&str> = reply
        .headers
        .get_all("x-scale-agent-cache")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(cache, ["tunnel"], "the hub says who answered");
    assert_eq!(reply.header("x-scale-agent-cache-age"), None);
    assert_eq!(
        reply.header("x-scale-agent-replica"),
        None,
        "a hub without replicas names none"
    );
    assert_eq!(
        reply.header("audit-id").as_deref(),
        Some("from-the-api-server"),
        "the API server's own headers pass"
    );

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
