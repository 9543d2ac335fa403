//! Tokens that end and tokens that are scoped, at the hub level: a hub on HTTPS, fake agents
//! speaking the real protocol, real kubectl and the real `scale-agent-hub` binary. Proves
//! that an expired proxy token is refused with a message kubectl prints (its expiry and how
//! to get a new one); that `scale-agent-hub kubeconfig --exec` writes a kubeconfig holding
//! no token whose plugin (`scale-agent-hub token credential`) fetches fresh ones kubectl
//! uses; that an API token scoped to `prod-*` is refused on `staging-x` naming the glob; that
//! role `metrics` reads `/metrics` and nothing else; and that Clouddriver's token works as
//! before, without an expiry.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{path::Path, time::Duration};

use bytes::Bytes;
use common::{kubectl::*, *};

/// A path no cache of the hub answers (Services are not streamed): it reaches the agent.
const PATH: &str = "/api/v1/namespaces/default/services";
const SERVICES: &[u8] = br#"{"kind":"ServiceList","apiVersion":"v1","items":[]}"#;

/// Runs the hub's own binary (an admin command); returns (success, stdout, stderr).
async fn hub_command(args: Vec<String>) -> (bool, String, String) {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_scale-agent-hub"))
            .args(&args)
            .env_remove("SCALE_AGENT_HUB_ADMIN_TOKEN_FILE")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn create_api_token(http: &Https, admin: &str, body: serde_json::Value) -> String {
    let reply = http
        .with_token("POST", "/api/v1/tokens", admin, body.to_string())
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["token"].as_str().unwrap().to_string()
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[tokio::test]
async fn an_expired_token_is_refused_and_an_exec_kubeconfig_fetches_fresh_ones() {
    let pki = Pki::new();
    let dir = data_dir("people-tokens-expiry");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut agent = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    agent.register("prod-a", "https://10.0.0.1:6443").await;

    // A kubeconfig whose token lasts 2 s: kubectl works, then is told it expired.
    let reply = http
        .with_token(
            "POST",
            "/api/v1/accounts/prod-a/kubeconfig?tokenName=alice&ttl=2s",
            &admin,
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let kubeconfig = dir.join("alice.kubeconfig");
    write(&kubeconfig, &reply.text());
    let listed = http.get("/api/v1/tokens", Some(&admin)).await.json();
    let alice = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "alice")
        .unwrap();
    assert!(
        alice["expires"].as_str().is_some_and(|e| e.ends_with('Z')),
        "{alice}"
    );
    let out = kubectl_raw_answered(&kubeconfig, &mut agent, PATH, SERVICES).await;
    assert!(out.contains("ServiceList"), "{out}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let error = kubectl_raw_refused(&kubeconfig, PATH).await;
    assert!(
        error.contains("You must be logged in to the server")
            && error.contains("the token \"alice\" expired at")
            && error.contains("scale-agent-hub kubeconfig --account prod-a")
            && error.contains("--exec"),
        "kubectl prints the expiry and what to do: {error}"
    );

    // An exec-plugin kubeconfig: no token in it; the plugin presents Alice's API token
    // (role operator, limited to prod-*) and prints a fresh ExecCredential.
    let alice_api = create_api_token(
        &http,
        &admin,
        serde_json::json!({"name": "alice", "role": "operator", "accounts": ["prod-*"]}),
    )
    .await;
    let token_file = dir.join("alice.token");
    write(&token_file, &alice_api);
    let ca_file = dir.join("serving-ca.pem");
    write(&ca_file, &pki.serving_ca_pem);
    let hub_url = format!("https://127.0.0.1:{}", hub.http_addr.port());
    let exec_kubeconfig = dir.join("alice-exec.kubeconfig");
    let access = |account: &str| {
        vec![
            format!("--account={account}"),
            format!("--hub-url={hub_url}"),
            format!("--ca-file={}", ca_file.display()),
            format!("--token-file={}", token_file.display()),
        ]
    };
    let mut args = vec!["kubeconfig".to_string(), "--exec".to_string()];
    args.extend(access("prod-a"));
    args.push(format!("--output={}", exec_kubeconfig.display()));
    let (ok, _, stderr) = hub_command(args).await;
    assert!(ok, "{stderr}");
    let written = std::fs::read_to_string(&exec_kubeconfig).unwrap();
    assert!(
        !written.contains("token:") && !written.contains(&alice_api),
        "{written}"
    );
    assert!(
        written.contains("client.authentication.k8s.io/v1") && written.contains("credential"),
        "{written}"
    );
    let out = kubectl_raw_answered(&exec_kubeconfig, &mut agent, PATH, SERVICES).await;
    assert!(out.contains("ServiceList"), "{out}");

    // The plugin by itself: an ExecCredential with an expiry; refused outside prod-*.
    let mut args = vec!["token".to_string(), "credential".to_string()];
    args.extend(access("prod-a"));
    let (ok, stdout, stderr) = hub_command(args).await;
    assert!(ok, "{stderr}");
    let credential: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(credential["kind"], "ExecCredential");
    assert!(
        credential["status"]["token"]
            .as_str()
            .unwrap()
            .starts_with("sat_")
    );
    assert!(credential["status"]["expirationTimestamp"].is_string());
    let mut args = vec!["token".to_string(), "credential".to_string()];
    args.extend(access("staging-x"));
    let (ok, _, stderr) = hub_command(args).await;
    assert!(
        !ok && stderr.contains("403") && stderr.contains("prod-*"),
        "{stderr}"
    );
}

#[tokio::test]
async fn scoped_tokens_the_metrics_role_and_clouddrivers_token() {
    let pki = Pki::new();
    let dir = data_dir("people-tokens-scopes");
    std::fs::create_dir_all(&dir).unwrap();
    let tokens_file = dir.join("api-tokens.yaml");
    write(
        &tokens_file,
        &scale_agent_hub::api_auth::scoped_file_entry(
            "grafana-eu",
            scale_agent_hub::api_auth::Role::Reader,
            &["prod-*".to_string()],
            "file-secret",
        ),
    );
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.api.api_tokens_file = Some(tokens_file.clone());
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut agent = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    agent.register("prod-eu", "https://10.0.0.1:6443").await;
    agent.register("staging-x", "https://10.0.0.2:6443").await;

    // A reader limited to prod-*, issued with the CLI.
    let admin_file = dir.join("admin-token");
    let ca_file = dir.join("serving-ca.pem");
    write(&ca_file, &pki.serving_ca_pem);
    let (ok, stdout, stderr) = hub_command(vec![
        "token".into(),
        "create".into(),
        "--name=dashboards".into(),
        "--role=reader".into(),
        "--accounts=prod-*".into(),
        "--ttl=1h".into(),
        format!("--hub-url=https://127.0.0.1:{}", hub.http_addr.port()),
        format!("--ca-file={}", ca_file.display()),
        format!("--admin-token-file={}", admin_file.display()),
    ])
    .await;
    assert!(ok, "{stderr}");
    let scoped = stdout.trim().to_string();
    let reply = http.get("/api/v1/accounts/prod-eu", Some(&scoped)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = http.get("/api/v1/accounts/staging-x", Some(&scoped)).await;
    assert_eq!(reply.status, 403, "{}", reply.text());
    let error = reply.json()["error"].as_str().unwrap().to_string();
    assert!(
        error.contains("\"dashboards\" is limited to accounts [\"prod-*\"]")
            && error.contains("staging-x"),
        "{error}"
    );
    let reply = http
        .get(
            "/api/v1/accounts/staging-x/objects?kind=ConfigMap",
            Some(&scoped),
        )
        .await;
    assert_eq!(
        reply.status,
        403,
        "every route of the account: {}",
        reply.text()
    );
    // The same limit from the tokens file.
    let reply = http
        .get("/api/v1/accounts/staging-x", Some("file-secret"))
        .await;
    assert_eq!(reply.status, 403, "{}", reply.text());
    assert!(reply.text().contains("grafana-eu"), "{}", reply.text());
    let reply = http
        .get("/api/v1/accounts/prod-eu", Some("file-secret"))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());

    // The listings show a scoped token its accounts only, and only the agents serving them,
    // each with only those accounts; the admin token sees everything.
    let mut staging_only = tunnel_agent(&hub, &pki, "agent-b.test", "pod-1").await;
    staging_only
        .register("staging-y", "https://10.0.0.3:6443")
        .await;
    let names = |list: &serde_json::Value| -> Vec<String> {
        let mut names: Vec<String> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    let agents = |list: &serde_json::Value| -> Vec<(String, Vec<String>)> {
        let mut agents: Vec<(String, Vec<String>)> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["identity"].as_str().unwrap().to_string(),
                    names(&a["accounts"]),
                )
            })
            .collect();
        agents.sort();
        agents
    };
    let everything = http.get("/api/v1/accounts", Some(&admin)).await;
    assert_eq!(everything.status, 200, "{}", everything.text());
    assert_eq!(
        names(&everything.json()),
        ["prod-eu", "staging-x", "staging-y"]
    );
    let all_agents = http.get("/api/v1/agents", Some(&admin)).await.json();
    assert_eq!(agents(&all_agents).len(), 2, "{all_agents}");
    for token in [scoped.as_str(), "file-secret"] {
        let reply = http.get("/api/v1/accounts", Some(token)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(names(&reply.json()), ["prod-eu"], "{}", reply.text());
        let reply = http.get("/api/v1/agents", Some(token)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let seen = agents(&reply.json());
        assert_eq!(seen.len(), 1, "agent-b serves staging-y only: {seen:?}");
        assert_eq!(
            seen[0].1,
            ["prod-eu"],
            "agent-a without staging-x: {seen:?}"
        );
        // Armory's account routes read the same accounts: the same limits.
        let reply = http.get("/armory/accounts", Some(token)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let armory = reply.json();
        assert_eq!(names(&armory["items"]), ["prod-eu"], "{armory}");
        assert_eq!(armory["total"], 1, "{armory}");
        for path in [
            "/armory/accounts/staging-x",
            "/agents/kubernetes/accounts/staging-x",
            "/agents/kubernetes/accounts/staging-x/namespaces",
        ] {
            let reply = http.get(path, Some(token)).await;
            assert_eq!(reply.status, 403, "{path}: {}", reply.text());
        }
    }
    let armory = http.get("/armory/accounts", Some(&admin)).await.json();
    assert_eq!(armory["total"], 3, "{armory}");
    drop(staging_only);

    // An operation on staging-x is not found by id for an operator limited to prod-*.
    let submit = {
        let (http, admin) = (http.clone(), admin.clone());
        tokio::spawn(async move {
            let body = serde_json::json!({"type": "get", "kind": "ConfigMap", "namespace": "default", "name": "web"});
            http.with_token(
                "POST",
                "/api/v1/accounts/staging-x/operations",
                &admin,
                body.to_string(),
            )
            .await
        })
    };
    let op = agent.operation().await;
    assert_eq!(op.account, "staging-x");
    agent
        .send(scale_agent_proto::v1::agent_message::Kind::OperationResult(
            scale_agent_proto::v1::OperationResult {
                id: op.id.clone(),
                ok: true,
                status: Some(scale_agent_proto::v1::OperationStatus {
                    code: 200,
                    ..Default::default()
                }),
                executed: true,
                replica: "pod-1".into(),
                account: "staging-x".into(),
                ..Default::default()
            },
        ))
        .await;
    let reply = submit.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    let deployer = create_api_token(
        &http,
        &admin,
        serde_json::json!({"name": "deployer", "role": "operator", "accounts": ["prod-*"]}),
    )
    .await;
    let by_id = format!("/api/v1/operations/{}", op.id);
    assert_eq!(http.get(&by_id, Some(&admin)).await.status, 200);
    let reply = http.get(&by_id, Some(&deployer)).await;
    assert_eq!(reply.status, 404, "{}", reply.text());

    // Role metrics: /metrics, and nothing else.
    let scraper = create_api_token(
        &http,
        &admin,
        serde_json::json!({"name": "prometheus", "role": "metrics"}),
    )
    .await;
    let reply = http.get("/metrics", Some(&scraper)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.text().contains("# TYPE"), "Prometheus text");
    for path in [
        "/api/v1/agents",
        "/api/v1/accounts",
        "/api/v1/accounts/prod-eu",
    ] {
        let reply = http.get(path, Some(&scraper)).await;
        assert_eq!(reply.status, 403, "{path}: {}", reply.text());
        assert!(
            reply.text().contains("needs role reader") && reply.text().contains("role metrics"),
            "{path}: {}",
            reply.text()
        );
    }

    // An API token that ended. Expiry is kept in whole seconds from the second it was
    // issued in, so a `2s` token lasts more than 1 s and at most 2 s (a `1s` one could end
    // a millisecond after it was issued, and did on a loaded machine).
    let brief = create_api_token(
        &http,
        &admin,
        serde_json::json!({"name": "brief", "role": "reader", "ttl": "2s"}),
    )
    .await;
    assert_eq!(http.get("/api/v1/agents", Some(&brief)).await.status, 200);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let reply = http.get("/api/v1/agents", Some(&brief)).await;
    assert_eq!(reply.status, 401, "{}", reply.text());
    assert!(
        reply.text().contains("\\\"brief\\\" expired at"),
        "{}",
        reply.text()
    );

    // Clouddriver's token: no expiry, and it works as before.
    let kubeconfig = issue_kubeconfig(&http, &admin, "prod-eu", "clouddriver").await;
    let clouddriver = kubeconfig_token(&kubeconfig);
    let listed = http.get("/api/v1/tokens", Some(&admin)).await.json();
    let record = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "clouddriver")
        .unwrap();
    assert!(record.get("expires").is_none(), "{record}");
    let (_, reply) = proxied_get(
        &http,
        &mut agent,
        &format!("/clusters/prod-eu{PATH}"),
        &clouddriver,
        SERVICES,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // A person's kubeconfig token carries the default expiry (--token-ttl, 12 h).
    issue_kubeconfig(&http, &admin, "prod-eu", "bob").await;
    let listed = http.get("/api/v1/tokens", Some(&admin)).await.json();
    let bob = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "bob")
        .unwrap();
    let expires: jiff::Timestamp = bob["expires"].as_str().unwrap().parse().unwrap();
    let hours = (expires.as_second() - jiff::Timestamp::now().as_second()) / 3600;
    assert!((11..=12).contains(&hours), "{bob}");
}

/// Expired tokens leave the store once past the retention (issue 31): listed, with their
/// expiry, while recent; gone from `token list` and from the store itself after it; tokens
/// that have not expired (or never do) stay.
#[tokio::test]
async fn expired_tokens_leave_the_store_after_the_retention() {
    let pki = Pki::new();
    let dir = data_dir("people-tokens-prune");
    let retention = Duration::from_secs(3);
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.api.expired_token_retention = retention;
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H1);
    let admin = admin_token(&dir);
    let issued_at = std::time::Instant::now();
    let issued = http
        .with_token(
            "POST",
            "/api/v1/accounts/prod-a/kubeconfig?tokenName=alice&ttl=1s",
            &admin,
            Bytes::new(),
        )
        .await;
    assert_eq!(issued.status, 200, "{}", issued.text());
    create_api_token(
        &http,
        &admin,
        serde_json::json!({"name": "short", "role": "reader", "ttl": "1s"}),
    )
    .await;
    create_api_token(
        &http,
        &admin,
        serde_json::json!({"name": "lasting", "role": "reader", "ttl": "0s"}),
    )
    .await;
    let names = async || -> Vec<String> {
        let reply = http.get("/api/v1/tokens", Some(&admin)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    // Expired (1 s), within the retention: still listed, so whoever asks why it was refused
    // finds it.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let listed = names().await;
    assert!(
        listed.contains(&"alice".to_string()) && listed.contains(&"short".to_string()),
        "{listed:?}"
    );
    wait_for("the expired tokens dropped", async || {
        let listed = names().await;
        !listed.contains(&"alice".to_string()) && !listed.contains(&"short".to_string())
    })
    .await;
    let gone_after = issued_at.elapsed();
    eprintln!(
        "expired tokens dropped {gone_after:?} after they were issued (ttl 1 s, retention 3 s)"
    );
    assert!(
        gone_after >= Duration::from_secs(3),
        "not before the retention: {gone_after:?}"
    );
    assert!(names().await.contains(&"lasting".to_string()));
    hub.shutdown().await.unwrap();

    // The store itself no longer holds them (not only the hub's memory).
    let mut store = scale_agent_hub::store::Store::open(&dir).unwrap();
    let loaded = store.load().await.unwrap();
    store.close().await.unwrap();
    let stored: Vec<&str> = loaded.tokens.iter().map(|t| t.name.as_str()).collect();
    assert!(
        !stored.contains(&"alice") && !stored.contains(&"short"),
        "{stored:?}"
    );
    assert!(stored.contains(&"lasting"), "{stored:?}");
}
