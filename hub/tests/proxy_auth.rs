//! The Kubernetes API proxy's refusals and the admin API, at the hub level. The hub serves
//! HTTPS with a serving certificate made at test time; the agents are fakes speaking the real
//! gRPC protocol over mutual TLS (no Kubernetes control plane). Proves that every refusal is
//! a Kubernetes `Status` that says what to do (plain text with the same message on discovery
//! paths), that no refused request reaches an agent, and that the admin API's kubeconfigs
//! work as they are.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use base64::Engine as _;
use bytes::Bytes;
use common::*;

#[tokio::test]
async fn refused_requests_get_a_status_and_never_reach_an_agent() {
    let pki = Pki::new();
    let dir = data_dir("proxy-refusals");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    a.register("staging", "https://10.0.0.2:6443").await;
    let prod = token_for(&http, &admin, "prod").await;
    let staging = token_for(&http, &admin, "staging").await;
    let path = "/clusters/prod/api/v1/namespaces/default/configmaps";

    // Without a token: 401 with the challenge clients look for.
    let reply = http.get(path, None).await;
    let message = reply.k8s_status(401, "Unauthorized");
    assert_eq!(
        reply.header("www-authenticate").as_deref(),
        Some("Bearer realm=\"scale-agent-hub\"")
    );
    assert!(
        message.contains("scale-agent-hub kubeconfig --account prod"),
        "{message}"
    );

    // A malformed Authorization header.
    for value in ["Basic dXNlcjpwYXNz", "Bearer", prod.as_str()] {
        let request = http
            .request("GET", path)
            .header("authorization", value)
            .body(empty())
            .unwrap();
        let reply = http.call(request).await;
        let message = reply.k8s_status(401, "Unauthorized");
        assert!(message.contains("Bearer <token>"), "{value}: {message}");
    }

    // A token this hub never issued.
    let reply = http
        .get(
            path,
            Some("sat_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
        )
        .await;
    let message = reply.k8s_status(401, "Unauthorized");
    assert!(message.contains("not valid here"), "{message}");
    assert!(message.contains("kubeconfig --account prod"), "{message}");

    // Another account's token: 403 naming both.
    let reply = http.get(path, Some(&staging)).await;
    let message = reply.k8s_status(403, "Forbidden");
    assert!(
        message.contains("\"staging\"") && message.contains("\"prod\""),
        "{message}"
    );

    // A valid token for an account no agent registered: a Status on an API path...
    let ghost = token_for(&http, &admin, "ghost").await;
    let reply = http
        .get(
            "/clusters/ghost/api/v1/namespaces/default/pods",
            Some(&ghost),
        )
        .await;
    let message = reply.k8s_status(404, "NotFound");
    assert!(message.contains("\"ghost\""), "{message}");
    assert!(message.contains("GET /api/v1/agents"), "{message}");
    // ...and the same message as plain text on a discovery path, where client-go's
    // discovery client would show a JSON Status as "unknown".
    let reply = http.get("/clusters/ghost/api", Some(&ghost)).await;
    assert_eq!(reply.text_error(404), message);
    let reply = http.get("/clusters/ghost/apis/apps/v1", Some(&ghost)).await;
    assert_eq!(reply.text_error(404), message);

    // An upgrade (exec over SPDY; HTTP/1.1, h2 has no Upgrade) is refused like any other
    // request without a token, before anything reaches an agent.
    let h1 = Https::for_hub(&pki, &hub, Proto::H1);
    let request = h1
        .request(
            "POST",
            "/clusters/prod/api/v1/namespaces/default/pods/web-0/exec?command=sh&stdin=true",
        )
        .header("connection", "Upgrade")
        .header("upgrade", "SPDY/3.1")
        .header("x-stream-protocol-version", "v4.channel.k8s.io")
        .body(empty())
        .unwrap();
    let reply = h1.call(request).await;
    let message = reply.k8s_status(401, "Unauthorized");
    assert!(
        message.contains("scale-agent-hub kubeconfig --account prod"),
        "{message}"
    );
    // None of the refused requests above reached the agent.
    a.assert_no_tunnel_frames(&http, &prod, "prod").await;

    // A token works until it is revoked through the admin API.
    let alice = kubeconfig_token(&issue_kubeconfig(&http, &admin, "prod", "alice").await);
    let (head, reply) = proxied_get(&http, &mut a, path, &alice, b"{}").await;
    assert_eq!(head.path_and_query, "/api/v1/namespaces/default/configmaps");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let list = http.get("/api/v1/tokens", Some(&admin)).await;
    assert_eq!(list.status, 200, "{}", list.text());
    let list = list.json();
    let id = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["account"] == "prod" && t["name"] == "alice")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let revoked = http
        .with_token(
            "DELETE",
            &format!("/api/v1/tokens/{id}"),
            &admin,
            Bytes::new(),
        )
        .await;
    assert_eq!(revoked.status, 200, "{}", revoked.text());
    let message = http
        .get(path, Some(&alice))
        .await
        .k8s_status(401, "Unauthorized");
    assert!(message.contains("revoked"), "{message}");
    // Revoking one token leaves the account's others alone.
    let (_, reply) = proxied_get(&http, &mut a, path, &prod, b"{}").await;
    assert_eq!(reply.status, 200);

    // An agent from before the proxy (no "http-tunnel" capability).
    let mut old = agent(&hub, &pki, "agent-old.test", "pod-1").await;
    old.register("legacy", "https://10.0.0.3:6443").await;
    let legacy = token_for(&http, &admin, "legacy").await;
    let reply = http
        .get("/clusters/legacy/api/v1/pods", Some(&legacy))
        .await;
    let message = reply.k8s_status(503, "ServiceUnavailable");
    assert!(
        message.contains("too old") && message.contains("upgrade"),
        "{message}"
    );
    // No request can be sent to `old` at all, so no probe can show that it received
    // nothing: the 503 "too old" answer is the evidence, as the hub gives it only when it
    // found no replica of the account that can tunnel, i.e. before it opened any exchange.
    // The agent that can tunnel did not get the request either.
    a.assert_no_tunnel_frames(&http, &prod, "prod").await;

    // The agent leaves; the account stays for its grace period, unreachable.
    drop(a);
    wait_for("prod to be disconnected", async || {
        http.get("/api/v1/accounts/prod", Some(&admin)).await.json()["state"] == "disconnected"
    })
    .await;
    let message = http
        .get(path, Some(&prod))
        .await
        .k8s_status(503, "ServiceUnavailable");
    assert!(
        message.contains("no agent of account \"prod\" is connected"),
        "{message}"
    );
    assert!(message.contains("GET /api/v1/agents"), "{message}");

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_admin_api_hands_out_working_kubeconfigs() {
    let pki = Pki::new();
    let dir = data_dir("proxy-admin");
    let port = free_port();
    // "localhost" rather than the address the hub binds: the URL in the kubeconfig is the
    // configured one, not one derived from the request.
    let public_url = format!("https://localhost:{port}");
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.listeners.http_addr = format!("127.0.0.1:{port}").parse().unwrap();
        c.api.public_url = Some(public_url.clone());
    })
    .await;
    let http = Https::new(
        &pki.serving_ca_pem,
        format!("https://127.0.0.1:{port}"),
        Proto::H2,
    );
    let admin = admin_token(&dir);
    assert!(
        admin.starts_with("sat_"),
        "the hub created an admin token file"
    );
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;

    let issue = "/api/v1/accounts/prod/kubeconfig";
    let reply = http
        .call(http.request("POST", issue).body(empty()).unwrap())
        .await;
    assert_eq!(reply.status, 401, "{}", reply.text());
    let message = reply.json()["error"].as_str().unwrap().to_string();
    assert!(
        message.contains("needs `Authorization: Bearer <token>` with role admin")
            && message.contains("scale-agent-hub token create"),
        "{message}"
    );
    let reply = http
        .with_token("POST", issue, "sat_not-the-admin-token", Bytes::new())
        .await;
    assert_eq!(reply.status, 401, "{}", reply.text());
    assert!(
        reply.json()["error"]
            .as_str()
            .unwrap()
            .contains("not an API token of this hub")
    );
    // The proxy's own tokens are not API tokens either.
    let prod = token_for(&http, &admin, "prod").await;
    let reply = http.with_token("POST", issue, &prod, Bytes::new()).await;
    assert_eq!(reply.status, 401, "{}", reply.text());
    assert!(
        reply.json()["error"]
            .as_str()
            .unwrap()
            .contains("a proxy token, which opens only /clusters/<account>/...")
    );

    let reply = http.with_token("POST", issue, &admin, Bytes::new()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("application/yaml")
    );
    let kubeconfig: serde_json::Value = serde_saphyr::from_str(&reply.text()).unwrap();
    let cluster = &kubeconfig["clusters"][0]["cluster"];
    let server = cluster["server"].as_str().unwrap();
    assert_eq!(server, format!("{public_url}/clusters/prod"));
    let ca = base64::engine::general_purpose::STANDARD
        .decode(cluster["certificate-authority-data"].as_str().unwrap())
        .unwrap();
    assert_eq!(String::from_utf8(ca.clone()).unwrap(), pki.serving_ca_pem);

    // Used as kubectl would: the server URL as it is, trusting only the CA it carries.
    let kubectl = Https::new(&String::from_utf8(ca).unwrap(), server, Proto::H2);
    let token = kubeconfig_token(&kubeconfig);
    let (head, reply) = proxied_get(
        &kubectl,
        &mut a,
        "/api/v1/namespaces?limit=500",
        &token,
        br#"{"kind":"NamespaceList","items":[]}"#,
    )
    .await;
    assert_eq!(head.account, "prod");
    assert_eq!(head.path_and_query, "/api/v1/namespaces?limit=500");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["kind"], "NamespaceList");
    // A client that trusts only the agents' CA cannot talk to the hub's HTTPS listener.
    let wrong = Https::new(&pki.ca_pem, http.base.clone(), Proto::H2);
    let request = wrong.request("GET", "/healthz").body(empty()).unwrap();
    assert!(
        tokio::time::timeout(WAIT, wrong.raw().request(request))
            .await
            .unwrap()
            .is_err()
    );

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
