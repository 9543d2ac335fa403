//! Tokens revoked on one replica of several on PostgreSQL (issue 28): a Clouddriver token is
//! never derived again on any replica (F2), and what it holds open on another replica ends
//! (F17).

use super::*;

/// The token of the kubeconfig `POST /api/v1/accounts/{account}/kubeconfig?{query}` on the
/// hub at `addr` returns.
async fn kubeconfig_token_at(
    addr: std::net::SocketAddr,
    admin: &str,
    account: &str,
    query: &str,
) -> String {
    let issued = call(
        "POST",
        addr,
        &format!("/api/v1/accounts/{account}/kubeconfig?{query}"),
        admin,
    )
    .await;
    assert_eq!(issued.status, 200, "{}", issued.body);
    issued
        .body
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap()
        .trim_matches('"')
        .to_string()
}

/// The id of `account`'s Clouddriver token, as the hub at `addr` lists it.
async fn clouddriver_token_id(addr: std::net::SocketAddr, admin: &str, account: &str) -> String {
    let tokens = call("GET", addr, "/api/v1/tokens", admin)
        .await
        .json_or_null();
    tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["account"] == account && t["name"] == "clouddriver")
        .unwrap_or_else(|| panic!("no clouddriver token of {account}: {tokens}"))["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Issue 28, F2, on replicas: a Clouddriver (derived) token revoked on one replica is
/// refused on the other within the sync period, and neither replica derives it (or any
/// earlier generation) again afterwards, also after rotate-then-revoke on the other one:
/// the tombstone lives in the shared store.
#[tokio::test]
async fn a_revoked_clouddriver_token_is_never_derived_again_on_any_replica() {
    let server = PostgresServer::start().await.unwrap();
    let (root, hubs) = hub_processes(&server, "derived-revocation", 2, &[]).await;
    let (a, b) = (&hubs[0], &hubs[1]);
    let (admin_a, admin_b) = (admin_token(a), admin_token(b));
    let limit = SYNC * 2 + Duration::from_secs(2);
    let opens = |hub: std::net::SocketAddr, token: String| async move {
        call("GET", hub, "/clusters/prod/api", &token).await.status != 401
    };

    let first = kubeconfig_token_at(a.http, &admin_a, "prod", "tokenName=clouddriver").await;
    assert!(
        opens(b.http, first.clone()).await,
        "hub-1 refused hub-0's derived token"
    );
    let id = clouddriver_token_id(a.http, &admin_a, "prod").await;
    let revoked = call("DELETE", a.http, &format!("/api/v1/tokens/{id}"), &admin_a).await;
    assert_eq!(revoked.status, 200, "{}", revoked.body);
    refused_within(limit, "the revoked Clouddriver token on hub-1", || {
        let first = first.clone();
        async move { !opens(b.http, first).await }
    })
    .await;
    assert!(!opens(a.http, first.clone()).await);

    // hub-1 derives the account's token again: the next generation, not the revoked one.
    let second = kubeconfig_token_at(b.http, &admin_b, "prod", "tokenName=clouddriver").await;
    assert_ne!(second, first, "hub-1 derived the revoked token again");
    assert!(opens(b.http, second.clone()).await);
    // Rotated and revoked on hub-1: hub-0 derives past both.
    let third = kubeconfig_token_at(
        b.http,
        &admin_b,
        "prod",
        "tokenName=clouddriver&rotate=true",
    )
    .await;
    let id = clouddriver_token_id(b.http, &admin_b, "prod").await;
    let revoked = call("DELETE", b.http, &format!("/api/v1/tokens/{id}"), &admin_b).await;
    assert_eq!(revoked.status, 200, "{}", revoked.body);
    refused_within(limit, "the rotated, revoked token on hub-0", || {
        let third = third.clone();
        async move { !opens(a.http, third).await }
    })
    .await;
    let fourth = kubeconfig_token_at(a.http, &admin_a, "prod", "tokenName=clouddriver").await;
    for (old, what) in [(&first, "first"), (&second, "second"), (&third, "rotated")] {
        assert_ne!(&fourth, old, "hub-0 derived the {what} token again");
        for hub in [a.http, b.http] {
            assert!(
                !opens(hub, old.clone()).await,
                "the {what} token opens {hub}"
            );
        }
    }
    assert!(opens(a.http, fourth.clone()).await);
    refused_within(limit, "nothing: the newest token on hub-1", || {
        let fourth = fourth.clone();
        async move { opens(b.http, fourth).await }
    })
    .await;
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}

/// Issue 28, F17, on replicas: a watch held open on one replica with a Clouddriver token
/// ends when the token is revoked on the other one, within the replicas' sync period (the
/// watching replica reads the revocation from the shared store and ends what the token
/// holds open there), and the token's next request there is refused.
#[tokio::test]
async fn a_watch_on_one_replica_ends_when_its_token_is_revoked_on_another() {
    let server = PostgresServer::start().await.unwrap();
    let (root, hubs) = hub_processes(&server, "revoked-watch", 2, &[]).await;
    let (a, b) = (&hubs[0], &hubs[1]);
    let admin_a = admin_token(a);
    // hub-1 streams the account, so the account's requests are its own.
    let mut agent = MiniAgent::connect_asking(b.grpc, "pod-w", 30).await;
    agent.register_streaming("prod").await;
    agent.snapshot("prod", "100").await;
    let token = kubeconfig_token_at(a.http, &admin_a, "prod", "tokenName=clouddriver").await;
    let path = "/clusters/prod/api/v1/namespaces/default/configmaps";
    let watch = {
        let (token, hub) = (token.clone(), b.http);
        tokio::spawn(async move {
            let watch = format!("{path}?watch=true&resourceVersion=100&timeoutSeconds=300");
            call("GET", hub, &watch, &token).await
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !watch.is_finished(),
        "the watch on hub-1 ended before any revocation: {:?}",
        watch.await.map(|r| (r.status, r.body))
    );

    let id = clouddriver_token_id(a.http, &admin_a, "prod").await;
    let revoked = call("DELETE", a.http, &format!("/api/v1/tokens/{id}"), &admin_a).await;
    assert_eq!(revoked.status, 200, "{}", revoked.body);
    let limit = SYNC * 2 + Duration::from_secs(2);
    let ended = tokio::time::timeout(limit, watch)
        .await
        .expect("the watch on hub-1 outlived its token, revoked on hub-0")
        .unwrap();
    // The mini agent answers no tunnel, so the watch was still waiting for its answer's
    // head: it is refused whole, as its next request would be (a watch already answering
    // ends its body instead: hub/tests/token_sessions.rs).
    assert_eq!(ended.status, 401, "{}", ended.body);
    assert!(ended.body.contains("revoked"), "{}", ended.body);
    let refused = call("GET", b.http, path, &token).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    drop(agent);
    drop(hubs);
    let _ = std::fs::remove_dir_all(&root);
}
