//! The hub's credential files are read again while it runs, by content (issue 28, F25): a
//! deleted API tokens file (its Secret gone) revokes its tokens once it has been missing for
//! the grace, not at the first missing read; a rotated admin token works and the previous
//! one stops, without a restart; the OIDC files (`--authentication-config`, `--oidc-access`)
//! are followed too, a broken one keeping the rules in use. Against a hub on HTTPS, with
//! real tokens and a local OIDC issuer.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use scale_agent_hub::api_auth::{Role, file_entry};
use scale_agent_hub_auth::watched_file::MISSING_GRACE;

#[tokio::test]
async fn a_deleted_tokens_file_revokes_its_tokens_after_the_grace() {
    let pki = Pki::new();
    let dir = data_dir("tokens-file-deleted");
    std::fs::create_dir_all(&dir).unwrap();
    let tokens_file = dir.join("api-tokens.yaml");
    std::fs::write(
        &tokens_file,
        file_entry("grafana", Role::Reader, "dash-secret"),
    )
    .unwrap();
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.api.api_tokens_file = Some(tokens_file.clone());
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H1);
    assert_eq!(
        http.get("/api/v1/agents", Some("dash-secret")).await.status,
        200
    );

    // Gone for a moment (an editor's delete-and-write, a Secret volume's swap): kept.
    std::fs::remove_file(&tokens_file).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        http.get("/api/v1/agents", Some("dash-secret")).await.status,
        200,
        "a file missing for less than the grace keeps its tokens"
    );
    std::fs::write(
        &tokens_file,
        file_entry("grafana", Role::Reader, "dash-secret"),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Deleted for good (the Secret is gone): its tokens stop within the grace and a poll.
    std::fs::remove_file(&tokens_file).unwrap();
    let deleted = Instant::now();
    wait_for("the deleted file's token to stop", async || {
        http.get("/api/v1/agents", Some("dash-secret")).await.status == 401
    })
    .await;
    let took = deleted.elapsed();
    assert!(
        took >= MISSING_GRACE,
        "revoked after {took:?}, before the grace of {MISSING_GRACE:?}"
    );
    let listed = http.get("/api/v1/tokens", Some(&admin_token(&dir))).await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert!(!listed.text().contains("grafana"), "{}", listed.text());
    eprintln!("tokens of the deleted file refused {took:?} after the deletion");

    // Written again: its tokens work again.
    std::fs::write(
        &tokens_file,
        file_entry("grafana", Role::Reader, "dash-secret"),
    )
    .unwrap();
    wait_for("the file written again", async || {
        http.get("/api/v1/agents", Some("dash-secret")).await.status == 200
    })
    .await;
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_rotated_admin_token_works_and_the_previous_one_stops() {
    let pki = Pki::new();
    let dir = data_dir("admin-token-rotated");
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.listeners.tls_reload_interval = Duration::from_millis(200);
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H1);
    let first = admin_token(&dir);
    assert_eq!(http.get("/api/v1/tokens", Some(&first)).await.status, 200);

    // Rotation: a new token written over the file (as a Secret's update lands).
    let file = dir.join("admin-token");
    let second = "rotated-admin-token-0123456789abcdef";
    std::fs::write(&file, format!("{second}\n")).unwrap();
    wait_for("the rotated admin token", async || {
        http.get("/api/v1/tokens", Some(second)).await.status == 200
    })
    .await;
    let refused = http.get("/api/v1/tokens", Some(&first)).await;
    assert_eq!(refused.status, 401, "{}", refused.text());
    assert!(
        refused.text().contains("not an API token"),
        "{}",
        refused.text()
    );

    // An empty file (a write caught half done) keeps the token in use.
    std::fs::write(&file, "").unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(http.get("/api/v1/tokens", Some(second)).await.status, 200);

    // A deleted file: no admin token once the grace has passed.
    std::fs::remove_file(&file).unwrap();
    wait_for("the deleted admin token to stop", async || {
        http.get("/api/v1/tokens", Some(second)).await.status == 401
    })
    .await;
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn changed_oidc_files_take_effect_and_broken_ones_keep_the_rules_in_use() {
    let issuer = scale_agent_testkit::oidc::Issuer::start().await;
    let pki = Pki::new();
    let dir = data_dir("oidc-files-reloaded");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("authentication-config.yaml");
    std::fs::write(&config, issuer.authentication_config("hub-old")).unwrap();
    let access = dir.join("oidc-access.yaml");
    let team_a = "- {groups: [\"oidc:team-a\"], accounts: [\"*\"], role: reader}\n";
    std::fs::write(&access, team_a).unwrap();
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.api.authentication_config = Some(config.clone());
        c.api.oidc_access = Some(access.clone());
        c.listeners.tls_reload_interval = Duration::from_millis(200);
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H1);
    let alice = issuer.id_token("alice@example.com", &["team-a"], "hub-new");
    let refused = http.get("/api/v1/agents", Some(&alice)).await;
    assert_eq!(refused.status, 401, "{}", refused.text());
    assert!(refused.text().contains("aud"), "{}", refused.text());

    // The audience changed in --authentication-config: her token is taken.
    std::fs::write(&config, issuer.authentication_config("hub-new")).unwrap();
    wait_for("the new audience", async || {
        http.get("/api/v1/agents", Some(&alice)).await.status == 200
    })
    .await;

    // A broken --oidc-access keeps the rules in use.
    std::fs::write(&access, "- {groups: [oops\n").unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(http.get("/api/v1/agents", Some(&alice)).await.status, 200);

    // Her group's rule removed from --oidc-access: she reaches no API route.
    std::fs::write(
        &access,
        "- {groups: [\"oidc:team-b\"], accounts: [\"*\"], role: reader}\n",
    )
    .unwrap();
    wait_for("the rule removed", async || {
        http.get("/api/v1/agents", Some(&alice)).await.status == 403
    })
    .await;
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
