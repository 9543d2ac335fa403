//! Dynamic accounts at the hub: the admin API, the store, and what agents' streams are sent
//! (item 12 of the stream contract). The hub in-process, fake agents over real mutual TLS.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use scale_agent_proto::v1::{
    self as pb, account_assignment::Role, agent_message::Kind as Msg, dynamic_account_status::State,
};
use serde_json::{Value, json};

fn account(name: &str, agent: &str) -> Value {
    json!({
        "name": name,
        "agent": agent,
        "kubeconfigSecret": { "namespace": "infra", "name": format!("{name}-kubeconfig") },
        "kinds": ["Deployment"],
    })
}

/// The account names of the last DynamicAccounts `agent` was sent, once it was sent one.
async fn pushed(agent: &mut FakeAgent, expected: &[&str]) {
    wait_for(&format!("the agent to be sent {expected:?}"), async || {
        let _ = agent.pump_ready();
        agent.dynamic_accounts.as_ref().is_some_and(|set| {
            set.accounts
                .iter()
                .map(|a| a.account.as_str())
                .collect::<Vec<_>>()
                == expected
        })
    })
    .await;
}

async fn call(api: &Api, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let (status, text) = request(api, method, path, body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn accounts_are_kept_pushed_to_their_agent_and_reported_on() {
    let pki = Pki::new();
    let dir = data_dir("dynamic");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let admin = api(&hub);

    // Sent on every stream, empty too (an agent drops what was removed while it was away).
    let mut a = agent(&hub, &pki, "infra.test", "pod-1").await;
    pushed(&mut a, &[]).await;

    // Only admins.
    let (status, answer) = call(
        &admin.with_token(None),
        "POST",
        "/api/v1/dynamic-accounts",
        Some(&account("dyn", "infra.test")),
    )
    .await;
    assert_eq!(status, 401, "{answer}");

    let (status, answer) = call(
        &admin,
        "POST",
        "/api/v1/dynamic-accounts",
        Some(&account("dyn", "infra.test")),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["connectedReplicas"], json!(["pod-1"]));
    pushed(&mut a, &["dyn"]).await;
    let sent = &a.dynamic_accounts.as_ref().unwrap().accounts[0];
    let secret = sent.kubeconfig_secret.clone().unwrap();
    assert_eq!(
        (secret.namespace.as_str(), secret.name.as_str()),
        ("infra", "dyn-kubeconfig")
    );
    let settings: Value = serde_json::from_slice(&sent.settings_json).unwrap();
    assert_eq!(settings["kinds"], json!(["Deployment"]));

    // The agent's report shows per replica; another identity's is ignored.
    a.send(Msg::DynamicAccountStatus(pb::DynamicAccountStatus {
        account: "dyn".into(),
        state: State::Failed as i32,
        message: "the agent may not read Secret infra/dyn-kubeconfig".into(),
    }))
    .await;
    a.synced().await;
    let mut b = agent(&hub, &pki, "other.test", "pod-1").await;
    pushed(&mut b, &[]).await;
    b.send(Msg::DynamicAccountStatus(pb::DynamicAccountStatus {
        account: "dyn".into(),
        state: State::Registered as i32,
        message: String::new(),
    }))
    .await;
    b.synced().await;
    let (status, view) = call(&admin, "GET", "/api/v1/dynamic-accounts/dyn", None).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        view["agentStatus"].as_array().map(Vec::len),
        Some(1),
        "{view}"
    );
    assert_eq!(view["agentStatus"][0]["replica"], "pod-1");
    assert_eq!(view["agentStatus"][0]["state"], "FAILED");
    assert!(
        view["agentStatus"][0]["message"]
            .as_str()
            .unwrap()
            .contains("may not read")
    );

    // An account bound to another identity cannot be pushed to this one.
    assert_eq!(
        role(&b.register("bound", "https://two:6443").await),
        Role::Streaming
    );
    let (status, answer) = call(
        &admin,
        "POST",
        "/api/v1/dynamic-accounts",
        Some(&account("bound", "infra.test")),
    )
    .await;
    assert_eq!(status, 409, "{answer}");
    let error = answer["error"].as_str().unwrap();
    assert!(
        error.contains("other.test") && error.contains("account rebind"),
        "{error}"
    );

    // Moved to another identity: taken from the first one's set, given to the other.
    let (status, answer) = call(
        &admin,
        "PUT",
        "/api/v1/dynamic-accounts/dyn",
        Some(&account("dyn", "other.test")),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    pushed(&mut a, &[]).await;
    pushed(&mut b, &["dyn"]).await;
    let (status, answer) = call(
        &admin,
        "PUT",
        "/api/v1/dynamic-accounts/dyn",
        Some(&account("other-name", "infra.test")),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("renamed"),
        "{answer}"
    );

    // Kept across a restart, and sent again to the agent's new stream.
    hub.shutdown().await.unwrap();
    drop((a, b));
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let admin = api(&hub);
    let mut b = agent(&hub, &pki, "other.test", "pod-2").await;
    pushed(&mut b, &["dyn"]).await;
    let (status, list) = call(&admin, "GET", "/api/v1/dynamic-accounts", None).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["agent"], "other.test");

    // Removed: the agent is sent the set without it; a second DELETE is a 404.
    let (status, answer) = call(&admin, "DELETE", "/api/v1/dynamic-accounts/dyn", None).await;
    assert_eq!(status, 200, "{answer}");
    pushed(&mut b, &[]).await;
    let (status, answer) = call(&admin, "DELETE", "/api/v1/dynamic-accounts/dyn", None).await;
    assert_eq!(status, 404, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("POST /api/v1/dynamic-accounts"),
        "{answer}"
    );

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
