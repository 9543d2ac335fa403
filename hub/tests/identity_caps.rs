//! One agent identity may have at most `--max-accounts-per-identity` accounts bound to it
//! (issue 28, review F14): an identity registering names without end is refused past the
//! cap, with a message naming the flag, while its bound accounts and other identities go on;
//! releasing an account makes room again.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use scale_agent_proto::v1::account_assignment::Role;

#[tokio::test]
async fn an_identity_past_its_account_cap_is_refused_with_the_flag_to_raise() {
    let pki = Pki::new();
    let dir = data_dir("identity-account-cap");
    let hub = start_hub(&pki, &dir, |c| c.streams.max_accounts_per_identity = 2).await;
    let admin = api(&hub);

    let mut x = agent(&hub, &pki, "agent.test", "pod-x").await;
    for account in ["team-1", "team-2"] {
        let a = x.register(account, "https://10.0.0.1:6443").await;
        assert_eq!(role(&a), Role::Streaming, "{a:?}");
    }
    let refused = x.register("team-3", "https://10.0.0.1:6443").await;
    assert_eq!(role(&refused), Role::Rejected, "{refused:?}");
    for needle in [
        "agent identity \"agent.test\" already has 2 accounts bound",
        "--max-accounts-per-identity 2",
        "scale-agent-hub account delete",
    ] {
        assert!(refused.reason.contains(needle), "{}", refused.reason);
    }
    // Another identity has a cap of its own.
    let mut y = agent(&hub, &pki, "other.test", "pod-y").await;
    assert_eq!(
        role(&y.register("ops-1", "https://10.0.0.2:6443").await),
        Role::Streaming
    );

    // Releasing an account of the first identity makes room for the refused one.
    drop(x);
    wait_for("team-2's binding released", async || {
        request(&admin, "DELETE", "/api/v1/accounts/team-2/binding", None)
            .await
            .0
            == 200
    })
    .await;
    let mut x = agent(&hub, &pki, "agent.test", "pod-x2").await;
    assert_eq!(
        role(&x.register("team-1", "https://10.0.0.1:6443").await),
        Role::Streaming,
        "an account bound already is not counted again"
    );
    let taken = x.register("team-3", "https://10.0.0.1:6443").await;
    assert_eq!(role(&taken), Role::Streaming, "{taken:?}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
