//! Armory's account changes and API tokens limited to account globs (issue 31's scoped
//! tokens, issue 30's Armory routes): a token scoped to `team-a-*` migrates, adds, updates,
//! activates, deactivates and deletes `team-a-…` accounts and none other, on every route and
//! body shape; a body naming several accounts is refused whole (403 naming the token's globs
//! and the accounts outside them) and changes nothing, and nothing is read from Clouddriver
//! for it. The hub runs in-process on HTTPS (real TLS), the token comes from its API tokens
//! file, the agent is a fake over real mutual TLS, and the Clouddriver side is the contract
//! server of `testkit/src/contract.rs`.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{contract::start_contract, *};
use scale_agent_hub::api_auth::{Role, scoped_file_entry};
use serde_json::{Value, json};

/// The scoped admin token of the tokens file.
const TEAM_A: &str = "team-a-secret";

/// A request with a JSON body (or none): (status, JSON answer).
async fn call(http: &Https, token: &str, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let reply = http.with_token(method, path, token, body).await;
    let answer = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
    (reply.status, answer)
}

/// Asserts a 403 naming the token, its globs and exactly the accounts `outside` them.
fn assert_out_of_scope(what: &str, (status, answer): (u16, Value), outside: &[&str]) {
    assert_eq!(status, 403, "{what}: {answer}");
    let message = answer["error"].as_str().unwrap_or_default();
    let names = serde_json::to_string(outside).unwrap();
    assert!(
        message.contains("\"team-a-admin\" is limited to accounts [\"team-a-*\"]")
            && message.contains(&format!("which do not include {names}")),
        "{what}: {message}"
    );
}

/// The definition of an Armory account (its state, namespaces, ...) as the unscoped admin
/// reads it; `None` when there is no such dynamic account.
async fn shown(http: &Https, admin: &str, name: &str) -> Option<Value> {
    let (status, answer) = call(
        http,
        admin,
        "GET",
        &format!("/armory/accounts/{name}"),
        &Value::Null,
    )
    .await;
    match status {
        200 => Some(answer),
        404 => None,
        other => panic!("GET {name}: {other} {answer}"),
    }
}

fn dynamic(name: &str, namespace: &str) -> Value {
    json!({
        "name": name,
        "zoneId": "infra.test",
        "kubeconfigFile": format!("encryptedFile:k8s!n:{name}-kc"),
        "namespaces": [namespace],
    })
}

#[tokio::test]
async fn a_scoped_token_changes_only_the_accounts_its_globs_admit() {
    let pki = Pki::new();
    let dir = data_dir("armory-scopes");
    std::fs::create_dir_all(&dir).unwrap();
    let tokens_file = dir.join("api-tokens.yaml");
    std::fs::write(
        &tokens_file,
        scoped_file_entry("team-a-admin", Role::Admin, &["team-a-*".into()], TEAM_A),
    )
    .unwrap();
    let (contract, contract_url) = start_contract().await;
    for name in ["team-a-m", "team-b-m"] {
        contract.state().accounts.insert(
            name.into(),
            json!({
                "type": "kubernetes",
                "name": name,
                "kubeconfigFile": format!("encryptedFile:k8s!n:{name}-kc"),
            }),
        );
    }
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.api.api_tokens_file = Some(tokens_file.clone());
        c.api.public_url = Some(common::contract::HUB.into());
        c.clouddriver = contract_clouddriver(&contract_url);
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut agent = agent(&hub, &pki, "infra.test", "pod-1").await;
    wait_for("the agent's first set of dynamic accounts", async || {
        let _ = agent.pump_ready();
        agent.dynamic_accounts.is_some()
    })
    .await;
    let (status, answer) = call(
        &http,
        &admin,
        "POST",
        "/armory/accounts/dynamic",
        &dynamic("team-b", "b"),
    )
    .await;
    assert_eq!(
        (status, answer),
        (202, json!([])),
        "the unscoped admin adds"
    );

    // Add: one object or a list; in scope is added, a list with one account outside is
    // refused whole.
    let add = "/armory/accounts/dynamic";
    let (status, answer) = call(&http, TEAM_A, "POST", add, &dynamic("team-a-one", "a")).await;
    assert_eq!((status, answer), (202, json!([])), "in scope");
    assert_out_of_scope(
        "add one",
        call(&http, TEAM_A, "POST", add, &dynamic("team-b-x", "b")).await,
        &["team-b-x"],
    );
    let mixed = json!([dynamic("team-a-two", "a"), dynamic("team-b-y", "b")]);
    assert_out_of_scope(
        "add a list",
        call(&http, TEAM_A, "POST", add, &mixed).await,
        &["team-b-y"],
    );
    for name in ["team-a-two", "team-b-x", "team-b-y"] {
        assert!(shown(&http, &admin, name).await.is_none(), "{name} added");
    }

    // Update: the same, and an account outside keeps its definition.
    assert_out_of_scope(
        "update one",
        call(&http, TEAM_A, "PUT", add, &dynamic("team-b", "changed")).await,
        &["team-b"],
    );
    let mixed = json!([
        dynamic("team-a-one", "changed"),
        dynamic("team-b", "changed")
    ]);
    assert_out_of_scope(
        "update a list",
        call(&http, TEAM_A, "PUT", add, &mixed).await,
        &["team-b"],
    );
    for (name, namespace) in [("team-a-one", "a"), ("team-b", "b")] {
        let account = shown(&http, &admin, name).await.unwrap();
        assert_eq!(account["namespaces"], json!([namespace]), "{account}");
    }
    let (status, _) = call(&http, TEAM_A, "PUT", add, &dynamic("team-a-one", "a2")).await;
    assert_eq!(status, 202);

    // Activate and deactivate: nothing is sent to the agent for a refused body.
    let state = "/armory/accounts";
    let both = json!([
        { "name": "team-a-one", "state": "ACTIVE" },
        { "name": "team-b", "state": "ACTIVE" },
    ]);
    assert_out_of_scope(
        "activate a list",
        call(&http, TEAM_A, "PATCH", state, &both).await,
        &["team-b"],
    );
    let team_b_off = json!([{ "name": "team-b", "state": "INACTIVE" }]);
    assert_out_of_scope(
        "deactivate",
        call(&http, TEAM_A, "PATCH", state, &team_b_off).await,
        &["team-b"],
    );
    assert_eq!(
        shown(&http, &admin, "team-a-one").await.unwrap()["state"],
        "INACTIVE"
    );
    let (status, _) = call(
        &http,
        TEAM_A,
        "PATCH",
        state,
        &json!([{ "name": "team-a-one", "state": "ACTIVE" }]),
    )
    .await;
    assert_eq!(status, 202);
    wait_for("team-a-one sent to the agent, and only it", async || {
        let _ = agent.pump_ready();
        agent.dynamic_accounts.as_ref().is_some_and(|set| {
            set.accounts
                .iter()
                .map(|a| a.account.as_str())
                .eq(["team-a-one"])
        })
    })
    .await;

    // Migrate: refused before Clouddriver is read.
    let migrate = json!([{ "name": "team-a-m" }, { "name": "team-b-m" }]);
    assert_out_of_scope(
        "migrate a list",
        call(&http, TEAM_A, "POST", "/armory/accounts", &migrate).await,
        &["team-b-m"],
    );
    assert!(
        contract.seen().is_empty(),
        "a refused migration reads nothing from Clouddriver: {:?}",
        contract.seen()
    );
    let (status, answer) = call(
        &http,
        TEAM_A,
        "POST",
        "/armory/accounts",
        &json!([{ "name": "team-a-m" }]),
    )
    .await;
    assert_eq!((status, answer), (202, json!([])), "migrated in scope");

    // Delete: a list or one name.
    let names = json!(["team-a-m", "team-b"]);
    assert_out_of_scope(
        "delete a list",
        call(&http, TEAM_A, "DELETE", "/armory/accounts", &names).await,
        &["team-b"],
    );
    let (status, answer) = call(
        &http,
        TEAM_A,
        "DELETE",
        "/armory/accounts/team-b",
        &Value::Null,
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    let message = answer["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("[\"team-a-*\"], which do not include \"team-b\""),
        "{message}"
    );
    for name in ["team-a-m", "team-b"] {
        assert!(shown(&http, &admin, name).await.is_some(), "{name} deleted");
    }
    let (status, _) = call(
        &http,
        TEAM_A,
        "DELETE",
        "/armory/accounts",
        &json!(["team-a-m"]),
    )
    .await;
    assert_eq!(status, 202);
    let (status, _) = call(
        &http,
        TEAM_A,
        "DELETE",
        "/armory/accounts/team-a-one",
        &Value::Null,
    )
    .await;
    assert_eq!(status, 202);
    assert!(shown(&http, &admin, "team-a-one").await.is_none());

    // The listing shows the scoped token its accounts only; the admin sees team-b still.
    let (_, list) = call(&http, TEAM_A, "GET", "/armory/accounts", &Value::Null).await;
    assert_eq!(list["total"], 0, "{list}");
    let (_, list) = call(&http, &admin, "GET", "/armory/accounts", &Value::Null).await;
    assert_eq!(list["total"], 1, "{list}");

    // The hub's own dynamic accounts API: the same token, the same limit (the name in the
    // body of a POST, in the path of the others).
    let hub_account = |name: &str| {
        json!({
            "name": name,
            "agent": "infra.test",
            "kubeconfigSecret": { "namespace": "infra", "name": format!("{name}-kubeconfig") },
        })
    };
    let accounts = "/api/v1/dynamic-accounts";
    let (status, answer) = call(&http, TEAM_A, "POST", accounts, &hub_account("team-a-own")).await;
    assert_eq!(status, 201, "in scope: {answer}");
    assert_out_of_scope(
        "the hub's POST",
        call(&http, TEAM_A, "POST", accounts, &hub_account("team-b-own")).await,
        &["team-b-own"],
    );
    let (status, answer) = call(
        &http,
        &admin,
        "GET",
        &format!("{accounts}/team-b-own"),
        &Value::Null,
    )
    .await;
    assert_eq!(status, 404, "the refused POST stored nothing: {answer}");
    for method in ["GET", "PUT", "DELETE"] {
        let (status, answer) = call(
            &http,
            TEAM_A,
            method,
            &format!("{accounts}/team-b"),
            &hub_account("team-b"),
        )
        .await;
        assert_eq!(
            status, 403,
            "{method} {accounts}/team-b with the scoped token: {answer}"
        );
    }
    let (_, listed) = call(&http, TEAM_A, "GET", accounts, &Value::Null).await;
    let names: Vec<&str> = listed
        .as_array()
        .map(|all| all.iter().filter_map(|a| a["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, ["team-a-own"], "the scoped listing: {listed}");
    let (_, listed) = call(&http, &admin, "GET", accounts, &Value::Null).await;
    assert!(
        listed
            .as_array()
            .is_some_and(|all| all.iter().any(|a| a["name"] == "team-b")),
        "the admin lists team-b: {listed}"
    );
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
