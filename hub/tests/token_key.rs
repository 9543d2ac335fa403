//! Review F11: the key that derives every account's Clouddriver token, kept in the store,
//! let whoever reads the store (a backup, a snapshot of the volume) compute those tokens.
//! With `--token-key-file` the store holds no key: after a hub issued a Clouddriver
//! kubeconfig, its store's metadata has no derivation key left, while a restart with the
//! same file derives the very same token (Clouddriver's kubeconfig keeps working); a file
//! with another key than the store's is refused with how to migrate.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use scale_agent_hub::{store::Store, token_key::TokenKeyFile, tokens::DERIVATION_KEY};

/// What the store at `dir` keeps as the derivation key (`None`: nothing, or blanked).
async fn stored_key(dir: &std::path::Path) -> Option<String> {
    let mut store = Store::open(dir).unwrap();
    let loaded = store.load().await.unwrap();
    store.close().await.unwrap();
    loaded
        .meta
        .get(DERIVATION_KEY)
        .filter(|v| !v.trim().is_empty())
        .cloned()
}

/// Starts a hub on `dir` with `key` (if any) as `--token-key-file`, registers `prod`, and
/// returns the Clouddriver token it derives for it.
async fn clouddriver_token(pki: &Pki, dir: &std::path::Path, key: Option<TokenKeyFile>) -> String {
    let hub = start_hub(pki, dir, |c| {
        serve_https(pki, c);
        c.api.token_key = key;
    })
    .await;
    let http = Https::for_hub(pki, &hub, Proto::H1);
    let mut agent = tunnel_agent(&hub, pki, "agent-a.test", "pod-1").await;
    agent.register("prod", "https://10.0.0.1:6443").await;
    let token =
        kubeconfig_token(&issue_kubeconfig(&http, &admin_token(dir), "prod", "clouddriver").await);
    drop(agent);
    hub.shutdown().await.unwrap();
    token
}

#[tokio::test]
async fn the_derivation_key_lives_in_its_file_not_in_the_store() {
    let pki = Pki::new();
    let dir = data_dir("token-key");

    // Before: a hub without the flag keeps the key in its store.
    let before = clouddriver_token(&pki, &dir, None).await;
    let in_store = stored_key(&dir).await.expect("the store holds the key");

    // Another key in the file: refused, saying how to keep the tokens in use.
    let other = TokenKeyFile::new(&"0f".repeat(32)).unwrap();
    let Err(error) = scale_agent_hub::start({
        let mut config = scale_agent_hub::Config::new(
            scale_agent_hub::GrpcSecurity::MutualTls(scale_agent_hub::TlsMaterial {
                cert_pem: pki.server_cert_pem.clone().into_bytes(),
                key_pem: pki.server_key_pem.clone().into_bytes(),
                client_ca_pem: Some(pki.ca_pem.clone().into_bytes()),
            }),
            &dir,
        );
        config.listeners.grpc_addr = "127.0.0.1:0".parse().unwrap();
        config.listeners.http_addr = "127.0.0.1:0".parse().unwrap();
        config.api.token_key = Some(other);
        config
    })
    .await
    else {
        panic!("another key than the store's must be refused");
    };
    let message = error.to_string();
    assert!(
        message.contains("another key than the one in the store")
            && message.contains("--token-key-replaces-stored"),
        "{message}"
    );

    // The migration: the store's key copied into the file (the Secret). The hub removes
    // it from the store and derives the same token as before.
    let file_key = TokenKeyFile::new(&in_store).unwrap();
    let migrated = clouddriver_token(&pki, &dir, Some(file_key.clone())).await;
    assert_eq!(
        migrated, before,
        "the token Clouddriver holds keeps working"
    );
    assert_eq!(
        stored_key(&dir).await,
        None,
        "the store no longer holds the key"
    );

    // A reader of the store has no key now; the hub, restarted with the file, still derives
    // the same token.
    let again = clouddriver_token(&pki, &dir, Some(file_key)).await;
    assert_eq!(again, before);
    assert_eq!(stored_key(&dir).await, None);
    let _ = std::fs::remove_dir_all(&dir);
}
