//! People signed in with OIDC, at the hub level: a local OIDC issuer the test runs (HTTPS,
//! discovery and JWKS, ES256 keys made here; `scale_agent_testkit::oidc`), a hub on HTTPS
//! with `--authentication-config` (the API server's AuthenticationConfiguration) and
//! `--oidc-access`, and fake agents speaking the real protocol. Proves that Alice's ID token
//! (group `team-a`) reaches the account her group maps to and no other, on the proxy and on
//! the REST API; that a token with the wrong audience or issuer, an expired one and one
//! signed by a key the issuer never published are refused with the reason; that a rotated
//! key is fetched (once, rate-limited) and then accepted; and that real kubectl with an exec
//! credential plugin works through the proxy unchanged.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{kubectl::*, *};
use scale_agent_testkit::oidc::{Issuer, SigningKey, now};

const AUDIENCE: &str = "scale-agent-hub";
const ACCESS: &str = "- {groups: [\"oidc:team-a\"], accounts: [\"team-a-*\"], role: reader}\n";
/// A path no cache of the hub answers (Services are not streamed): it reaches the agent.
const PATH: &str = "/api/v1/namespaces/default/services";

struct World {
    issuer: Issuer,
    dir: std::path::PathBuf,
    pki: Pki,
    hub: scale_agent_hub::RunningHub,
    http: Https,
    agent: FakeAgent,
}

async fn world(name: &str) -> World {
    let issuer = Issuer::start().await;
    let pki = Pki::new();
    let dir = data_dir(name);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("authentication-config.yaml");
    std::fs::write(&config, issuer.authentication_config(AUDIENCE)).unwrap();
    let access = dir.join("oidc-access.yaml");
    std::fs::write(&access, ACCESS).unwrap();
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.api.authentication_config = Some(config.clone());
        c.api.oidc_access = Some(access.clone());
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let mut agent = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    agent.register("team-a-prod", "https://10.0.0.1:6443").await;
    agent.register("team-b-prod", "https://10.0.0.2:6443").await;
    World {
        issuer,
        dir,
        pki,
        hub,
        http,
        agent,
    }
}

fn proxy_path(account: &str) -> String {
    format!("/clusters/{account}{PATH}")
}

#[tokio::test]
async fn alice_reaches_her_groups_accounts_and_bad_tokens_are_refused_with_the_reason() {
    let mut w = world("people-oidc").await;
    let alice = w
        .issuer
        .id_token("alice@example.com", &["team-a"], AUDIENCE);

    // Her group's account: the request reaches the agent, and she gets its answer.
    let (head, reply) = proxied_get(
        &w.http,
        &mut w.agent,
        &proxy_path("team-a-prod"),
        &alice,
        br#"{"kind":"ServiceList","items":[]}"#,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(head.account, "team-a-prod");
    assert_eq!(
        w.issuer.jwks_fetches(),
        1,
        "the first token fetched the keys"
    );

    // Another team's account: 403 saying which rule is missing, before any agent sees it.
    let reply = w.http.get(&proxy_path("team-b-prod"), Some(&alice)).await;
    let message = reply.k8s_status(403, "Forbidden");
    assert!(
        message.contains("oidc:alice@example.com")
            && message.contains("team-b-prod")
            && message.contains("--oidc-access"),
        "{message}"
    );

    // The REST API: the rule's role (reader), on the rule's accounts only.
    let reply = w
        .http
        .get("/api/v1/accounts/team-a-prod", Some(&alice))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = w
        .http
        .get("/api/v1/accounts/team-b-prod", Some(&alice))
        .await;
    assert_eq!(reply.status, 403, "{}", reply.text());
    let error = reply.json()["error"].as_str().unwrap().to_string();
    assert!(
        error.contains("team-a-*") && error.contains("team-b-prod"),
        "{error}"
    );
    let reply = w
        .http
        .with_token(
            "POST",
            "/api/v1/tokens",
            &alice,
            r#"{"name":"x","role":"admin"}"#,
        )
        .await;
    assert_eq!(
        reply.status,
        403,
        "a reader issues no tokens: {}",
        reply.text()
    );

    // Bob is in no group the access file names: signed in, but reaching nothing.
    let bob = w.issuer.id_token("bob@example.com", &["team-z"], AUDIENCE);
    let reply = w.http.get(&proxy_path("team-a-prod"), Some(&bob)).await;
    reply.k8s_status(403, "Forbidden");

    // Tokens refused with the reason: audience, issuer, expiry, a key never published.
    let key = w.issuer.current_key();
    let mut wrong_aud = w
        .issuer
        .claims("alice@example.com", &["team-a"], "another-client");
    let mut wrong_iss = w.issuer.claims("alice@example.com", &["team-a"], AUDIENCE);
    wrong_iss["iss"] = "https://evil.example".into();
    let mut expired = w.issuer.claims("alice@example.com", &["team-a"], AUDIENCE);
    expired["exp"] = (now() - 10).into();
    let rogue = SigningKey::new("key-1");
    let unknown_kid = SigningKey::new("rogue");
    let alice_claims = w.issuer.claims("alice@example.com", &["team-a"], AUDIENCE);
    for (what, token, reason) in [
        ("wrong aud", key.sign(&wrong_aud), "aud"),
        (
            "wrong iss",
            key.sign(&wrong_iss),
            "not an issuer the hub trusts",
        ),
        ("expired", key.sign(&expired), "expired at"),
        (
            "forged with the issuer's kid",
            rogue.sign(&alice_claims),
            "signature does not verify",
        ),
        (
            "unknown kid",
            unknown_kid.sign(&alice_claims),
            "does not publish",
        ),
    ] {
        let reply = w.http.get(&proxy_path("team-a-prod"), Some(&token)).await;
        let message = reply.k8s_status(401, "Unauthorized");
        assert!(message.contains(reason), "{what}: {message}");
        // The same on the REST API.
        let reply = w
            .http
            .get("/api/v1/accounts/team-a-prod", Some(&token))
            .await;
        assert_eq!(reply.status, 401, "{what}: {}", reply.text());
        assert!(reply.text().contains(reason), "{what}: {}", reply.text());
    }
    wrong_aud["aud"] = serde_json::json!(["another-client", AUDIENCE]);
    let reply = w
        .http
        .get("/api/v1/accounts/team-a-prod", Some(&key.sign(&wrong_aud)))
        .await;
    assert_eq!(
        reply.status, 200,
        "one matching audience among several is enough"
    );

    // The issuer rotates its key: a token with the new kid makes the hub fetch the keys
    // again (at most every 5 s, however many tokens name unknown keys), then passes.
    let fetches = w.issuer.jwks_fetches();
    let rotated = w.issuer.rotate("key-2");
    let token = rotated.sign(&alice_claims);
    let started = Instant::now();
    loop {
        let reply = w
            .http
            .get("/api/v1/accounts/team-a-prod", Some(&token))
            .await;
        if reply.status == 200 {
            break;
        }
        assert_eq!(reply.status, 401, "{}", reply.text());
        assert!(
            reply.text().contains("does not publish"),
            "{}",
            reply.text()
        );
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the new key was never fetched"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        w.issuer.jwks_fetches(),
        fetches + 1,
        "one fetch for the rotation, however many requests waited for it"
    );
    let reply = w
        .http
        .get("/api/v1/accounts/team-a-prod", Some(&alice))
        .await;
    assert_eq!(
        reply.status,
        401,
        "the old key is gone from the issuer: {}",
        reply.text()
    );
    drop(w.hub);
}

#[tokio::test]
async fn kubectl_with_an_exec_credential_plugin_works_unchanged() {
    let mut w = world("people-oidc-kubectl").await;
    let alice = w
        .issuer
        .id_token("alice@example.com", &["team-a"], AUDIENCE);
    // The plugin: a script printing an ExecCredential, as kubelogin does after sign-in.
    let plugin = w.dir.join("id-token-plugin.sh");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\ncat <<'EOF'\n{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\
             \"kind\":\"ExecCredential\",\"status\":{{\"token\":\"{alice}\"}}}}\nEOF\n"
        ),
    )
    .unwrap();
    let mut permissions = std::fs::metadata(&plugin).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&plugin, permissions).unwrap();
    let exec = serde_json::json!({"exec": {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": plugin.display().to_string(),
        "interactiveMode": "Never",
    }});
    let base = format!("https://127.0.0.1:{}/clusters", w.hub.http_addr.port());
    let team_a = w.dir.join("team-a.kubeconfig");
    write_kubeconfig(
        &team_a,
        &format!("{base}/team-a-prod"),
        &w.pki.serving_ca_pem,
        &exec,
    );
    let out = kubectl_raw_answered(
        &team_a,
        &mut w.agent,
        PATH,
        br#"{"kind":"ServiceList","apiVersion":"v1","items":[]}"#,
    )
    .await;
    assert!(out.contains("ServiceList"), "{out}");

    let team_b = w.dir.join("team-b.kubeconfig");
    write_kubeconfig(
        &team_b,
        &format!("{base}/team-b-prod"),
        &w.pki.serving_ca_pem,
        &exec,
    );
    let error = kubectl_raw_refused(&team_b, PATH).await;
    eprintln!("kubectl said: {error}");
    assert!(
        error.contains("may not reach account \"team-b-prod\"") && error.contains("--oidc-access"),
        "kubectl shows the hub's reason: {error}"
    );
}
