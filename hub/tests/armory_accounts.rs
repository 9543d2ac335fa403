//! Armory's plugin account routes on the hub's API (issue 30): every route with the bodies
//! and status codes of Armory's documents (`shared/reference/armory-scale-agent.md` §3.1),
//! the roles, paging, the audit lines, and migration from Clouddriver's Account Management
//! API. The hub runs in-process, the agents are fakes over real mutual TLS, and the
//! Clouddriver side is the contract server of `testkit/src/contract.rs` (NOT Clouddriver:
//! written from its source; its `GET /credentials/type/{type}` from Clouddriver's SQL
//! account repository).

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Mutex, OnceLock};

use common::{contract::start_contract, *};
use serde_json::{Value, json};

// ------------------------------------------------------------------ audit lines

/// Every `audit` event of this test binary (the hub runs in it).
fn audit_lines() -> &'static Mutex<Vec<u8>> {
    static LINES: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LINES.get_or_init(Mutex::default)
}

struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        audit_lines().lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_audit() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("audit=info")
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
}

/// The captured audit lines about `account`.
fn audited(account: &str) -> Vec<String> {
    String::from_utf8_lossy(&audit_lines().lock().unwrap())
        .lines()
        .filter(|l| l.contains("account change") && l.contains(&format!("account=\"{account}\"")))
        .map(str::to_string)
        .collect()
}

// ------------------------------------------------------------------ helpers

async fn call(api: &Api, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let (status, text) = request(api, method, path, body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The error message of an answer.
fn message(answer: &Value) -> String {
    answer["error"].as_str().unwrap_or_default().to_string()
}

/// The names of the dynamic accounts `agent` was last sent, once they are `expected`.
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

/// The settings `agent` was last sent for `account`.
fn sent_settings(agent: &FakeAgent, account: &str) -> (Value, String, String) {
    let sent = agent
        .dynamic_accounts
        .as_ref()
        .unwrap()
        .accounts
        .iter()
        .find(|a| a.account == account)
        .unwrap();
    let secret = sent.kubeconfig_secret.clone().unwrap();
    (
        serde_json::from_slice(&sent.settings_json).unwrap(),
        secret.name,
        secret.key,
    )
}

/// An API token of `role`, created by the admin.
async fn token(admin: &Api, name: &str, role: &str) -> Api {
    let (status, created) = call(
        admin,
        "POST",
        "/api/v1/tokens",
        Some(&json!({ "name": name, "role": role })),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    admin.with_token(created["token"].as_str())
}

/// A Kubernetes account definition as Clouddriver's Account Management API stores it: its
/// kubeconfig a secret reference, and Clouddriver-only fields beside the agent's.
fn clouddriver_definition(name: &str, kubeconfig_file: &str) -> Value {
    json!({
        "type": "kubernetes",
        "name": name,
        "kubeconfigFile": kubeconfig_file,
        "namespaces": ["web"],
        "kinds": ["Deployment"],
        "permissions": { "READ": ["dev"], "WRITE": ["ops"] },
        "providerVersion": "V2",
        "cacheThreads": 2,
        "onlySpinnakerManaged": true,
    })
}

// ------------------------------------------------------------------ tests

#[tokio::test]
async fn armorys_account_routes_answer_with_armorys_shapes_and_codes() {
    capture_audit();
    let pki = Pki::new();
    let dir = data_dir("armory-accounts");
    let (contract, contract_url) = start_contract().await;
    {
        let mut st = contract.state();
        for (name, definition) in [
            (
                "prod-eu",
                clouddriver_definition(
                    "prod-eu",
                    "encryptedFile:k8s!n:prod-eu-kubeconfig!k:config",
                ),
            ),
            (
                "staging",
                clouddriver_definition("staging", "encryptedFile:k8s!n:staging-kubeconfig"),
            ),
            (
                "legacy",
                clouddriver_definition("legacy", "/home/spinnaker/.kube/legacy"),
            ),
            (
                "gcp-main",
                json!({ "type": "google", "name": "gcp-main", "project": "p" }),
            ),
        ] {
            st.accounts.insert(name.into(), definition);
        }
    }
    let configure = |c: &mut scale_agent_hub::Config| {
        c.api.public_url = Some(common::contract::HUB.into());
        c.clouddriver = contract_clouddriver(&contract_url);
    };
    let hub = start_hub(&pki, &dir, configure).await;
    let admin = api(&hub);
    let reader = token(&admin, "dashboards", "reader").await;
    let operator = token(&admin, "deployer", "operator").await;
    let mut a = agent(&hub, &pki, "infra.test", "pod-1").await;
    pushed(&mut a, &[]).await;

    // Roles: reads need reader, changes admin (as the hub's dynamic accounts API).
    let migrate_prod = json!([{ "name": "prod-eu" }]);
    let (status, _) = call(
        &admin.with_token(None),
        "POST",
        "/armory/accounts",
        Some(&migrate_prod),
    )
    .await;
    assert_eq!(status, 401);
    for refused in [&reader, &operator] {
        let (status, answer) = call(refused, "POST", "/armory/accounts", Some(&migrate_prod)).await;
        assert_eq!(status, 403, "{answer}");
        let (status, answer) = call(refused, "DELETE", "/armory/accounts/prod-eu", None).await;
        assert_eq!(status, 403, "{answer}");
    }
    let (status, answer) = call(&admin.with_token(None), "GET", "/armory/accounts", None).await;
    assert_eq!(status, 401, "{answer}");
    let (status, list) = call(&reader, "GET", "/armory/accounts", None).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        list,
        json!({ "items": [], "page": 1, "limit": 100, "total": 0 })
    );
    assert!(
        contract.seen().is_empty(),
        "refused requests read nothing from Clouddriver"
    );

    // Migrate: read from Clouddriver's Account Management API, added INACTIVE, not sent.
    let (status, answer) = call(&admin, "POST", "/armory/accounts", Some(&migrate_prod)).await;
    assert_eq!((status, answer), (202, json!([])));
    let reads: Vec<String> = contract
        .seen()
        .iter()
        .filter(|s| s.method == "GET")
        .map(|s| s.path.clone())
        .collect();
    assert_eq!(reads, ["/credentials/type/kubernetes"]);
    let (status, prod) = call(&reader, "GET", "/armory/accounts/prod-eu", None).await;
    assert_eq!(status, 200, "{prod}");
    assert_eq!(
        prod,
        json!({
            "name": "prod-eu",
            "type": "kubernetes",
            "zoneId": "infra.test",
            "kubeconfigFile": "encryptedFile:k8s!n:prod-eu-kubeconfig!k:config",
            "state": "INACTIVE",
            "source": "clouddriver",
            "namespaces": ["web"],
            "kinds": ["Deployment"],
            "permissions": { "READ": ["dev"], "WRITE": ["ops"] },
        }),
        "the agent's settings carried over, Clouddriver's own fields left in Clouddriver"
    );
    a.synced().await;
    pushed(&mut a, &[]).await;

    // 409 with the already-migrated entries; the others are still migrated (staging, with
    // the request's zoneId).
    let (status, answer) = call(
        &admin,
        "POST",
        "/armory/accounts",
        Some(&json!([
            { "name": "prod-eu" },
            { "name": "staging", "zoneId": "infra.test" },
        ])),
    )
    .await;
    assert_eq!((status, answer), (409, json!([{ "name": "prod-eu" }])));
    let (status, staging) = call(&reader, "GET", "/armory/accounts/staging", None).await;
    assert_eq!(status, 200, "{staging}");
    assert_eq!(
        staging["kubeconfigFile"],
        "encryptedFile:k8s!n:staging-kubeconfig"
    );

    // 400: an empty list, a name Clouddriver does not hold (a Google account is not listed
    // among the Kubernetes ones), a kubeconfig that is a path; nothing is migrated then.
    for (body, expected) in [
        (json!([]), "the list is empty"),
        (json!({ "name": "prod-eu" }), "it is not a list"),
        (json!([{ "zoneId": "x" }]), "has no `name`"),
        (json!([{ "name": "nope" }]), "not defined in Clouddriver"),
        (
            json!([{ "name": "gcp-main" }]),
            "not defined in Clouddriver",
        ),
        (
            json!([{ "name": "legacy" }]),
            "Store the kubeconfig in a Secret",
        ),
    ] {
        let (status, answer) = call(&admin, "POST", "/armory/accounts", Some(&body)).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(message(&answer).contains(expected), "{body}: {answer}");
    }
    let (status, _) = call(&reader, "GET", "/armory/accounts/legacy", None).await;
    assert_eq!(status, 404);
    // The request's kubeconfigFile replaces the definition's.
    let (status, answer) = call(
        &admin,
        "POST",
        "/armory/accounts",
        Some(&json!([{ "name": "legacy", "kubeconfigFile": "encryptedFile:k8s!n:legacy-kc" }])),
    )
    .await;
    assert_eq!((status, answer), (202, json!([])));

    // Activate: sent to the agent; ACTIVATING until the agent registers it, then ACTIVE.
    let (status, answer) = call(
        &admin,
        "PATCH",
        "/armory/accounts",
        Some(&json!([{ "name": "prod-eu", "state": "ACTIVE" }])),
    )
    .await;
    assert_eq!((status, answer), (202, json!([])));
    pushed(&mut a, &["prod-eu"]).await;
    let (settings, secret, key) = sent_settings(&a, "prod-eu");
    assert_eq!(
        (secret.as_str(), key.as_str()),
        ("prod-eu-kubeconfig", "config")
    );
    assert_eq!(settings["namespaces"], json!(["web"]));
    assert_eq!(settings["permissions"]["WRITE"], json!(["ops"]));
    let (status, view) = call(&reader, "GET", "/agents/kubernetes/accounts/prod-eu", None).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["status"], "ACTIVATING", "{view}");
    assert_eq!(view["dynamic"], true);
    assert_eq!(view["zoneId"], "infra.test");
    assert_eq!(view["permissions"]["READ"], json!(["dev"]));
    assert_eq!(
        serde_json::from_str::<Value>(view["definitionAsString"].as_str().unwrap()).unwrap(),
        view["definition"]
    );
    a.register("prod-eu", "https://10.0.0.9:6443").await;
    let (status, view) = call(&reader, "GET", "/agents/kubernetes/accounts/prod-eu", None).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["status"], "ACTIVE", "{view}");
    assert_eq!(view["kubeHost"], "https://10.0.0.9:6443");
    assert_eq!(view["kubeVersion"], "v1.37.1");
    assert_eq!(view["certFingerprint"], "0a1b");
    assert_eq!(
        view["connections"],
        json!([{ "agentId": "infra.test", "replica": "pod-1", "role": "STREAMING" }])
    );
    assert_eq!(view["properties"]["kinds"], json!(["ConfigMap"]));
    assert!(view.get("retryCount").is_none(), "no counterpart: left out");
    let (status, namespaces) = call(
        &reader,
        "GET",
        "/agents/kubernetes/accounts/staging/namespaces",
        None,
    )
    .await;
    assert_eq!((status, namespaces), (200, json!(["web"])));
    let (status, _) = call(&reader, "GET", "/agents/kubernetes/accounts/nope", None).await;
    assert_eq!(status, 404);
    let (status, _) = call(
        &reader,
        "GET",
        "/agents/kubernetes/accounts/nope/namespaces",
        None,
    )
    .await;
    assert_eq!(status, 404);

    // PATCH refusals: a state that is not ACTIVE or INACTIVE, a name that is not dynamic,
    // an account an agent declares in its config.
    a.register("declared", "https://10.0.0.7:6443").await;
    for (body, code, expected) in [
        (
            json!([{ "name": "prod-eu", "state": "FAILED" }]),
            400,
            "\"ACTIVE\" to activate",
        ),
        (json!([]), 400, "the list is empty"),
        (
            json!([{ "name": "nope", "state": "ACTIVE" }]),
            404,
            "no dynamic account",
        ),
        (
            json!([{ "name": "declared", "state": "INACTIVE" }]),
            409,
            "declared in their agents' configs",
        ),
    ] {
        let (status, answer) = call(&admin, "PATCH", "/armory/accounts", Some(&body)).await;
        assert_eq!(status, code, "{body}: {answer}");
        assert!(message(&answer).contains(expected), "{body}: {answer}");
    }
    let (status, answer) = call(
        &admin,
        "POST",
        "/armory/accounts",
        Some(&json!([{ "name": "declared" }])),
    )
    .await;
    assert_eq!((status, answer), (409, json!([{ "name": "declared" }])));

    // Deactivate: withdrawn from the agent.
    let (status, _) = call(
        &admin,
        "PATCH",
        "/armory/accounts",
        Some(&json!([{ "name": "prod-eu", "state": "INACTIVE" }])),
    )
    .await;
    assert_eq!(status, 202);
    pushed(&mut a, &[]).await;
    let (_, prod) = call(&reader, "GET", "/armory/accounts/prod-eu", None).await;
    assert_eq!(prod["state"], "INACTIVE");

    // Dynamic accounts: added INACTIVE, one object or a list; 409 when present; 400 for what
    // does not map, naming what to send.
    let dyn_a = json!({
        "name": "dyn-a",
        "type": "kubernetes",
        "zoneId": "infra.test",
        "kubeconfigFile": "encryptedFile:k8s!n:dyn-a-kc!k:kubeconfig",
        "namespaces": ["team-a"],
        "omitKinds": ["Secret"],
    });
    let (status, answer) = call(&admin, "POST", "/armory/accounts/dynamic", Some(&dyn_a)).await;
    assert_eq!((status, answer), (202, json!([])));
    let (status, answer) = call(
        &admin,
        "POST",
        "/armory/accounts/dynamic",
        Some(&json!([dyn_a.clone()])),
    )
    .await;
    assert_eq!((status, answer), (409, json!([dyn_a.clone()])));
    for (body, expected) in [
        (json!([]), "the list is empty"),
        (json!("dyn-b"), "neither an object nor a list"),
        (
            json!({ "name": "dyn-b", "kubeconfigContents": "apiVersion: v1\nkind: Config\n" }),
            "the hub never carries kubeconfigs",
        ),
        (
            json!({ "name": "dyn-b", "serviceAccount": true }),
            "declare it in the agent's config",
        ),
        (
            json!({ "name": "dyn-b", "kubeconfigFile": "encryptedFile:k8s!n:kc", "metrics": true }),
            "does not apply metrics",
        ),
        (
            json!({ "name": "dyn-b", "kubeconfigFile": "encryptedFile:k8s!n:kc", "type": "aws" }),
            "only Kubernetes accounts",
        ),
        (
            json!({ "name": "dyn-b", "kubeconfigFile": "encryptedFile:k8s!n:kc",
                    "kinds": ["Pod"], "omitKinds": ["Secret"] }),
            "not both",
        ),
    ] {
        let (status, answer) = call(&admin, "POST", "/armory/accounts/dynamic", Some(&body)).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(message(&answer).contains(expected), "{body}: {answer}");
    }
    let (status, _) = call(&reader, "GET", "/armory/accounts/dyn-b", None).await;
    assert_eq!(status, 404);

    // Update keeps the state; an active account's agent gets the change at once.
    let mut dyn_a_b = dyn_a.clone();
    dyn_a_b["namespaces"] = json!(["team-b"]);
    let (status, answer) = call(&admin, "PUT", "/armory/accounts/dynamic", Some(&dyn_a_b)).await;
    assert_eq!((status, answer), (202, json!([])));
    let (_, shown) = call(&reader, "GET", "/armory/accounts/dyn-a", None).await;
    assert_eq!(
        (
            shown["state"].clone(),
            shown["namespaces"].clone(),
            shown["source"].clone()
        ),
        (json!("INACTIVE"), json!(["team-b"]), json!("dynamic"))
    );
    let (status, _) = call(
        &admin,
        "PATCH",
        "/armory/accounts",
        Some(&json!([{ "name": "dyn-a", "state": "ACTIVE" }])),
    )
    .await;
    assert_eq!(status, 202);
    pushed(&mut a, &["dyn-a"]).await;
    assert_eq!(
        sent_settings(&a, "dyn-a").0["namespaces"],
        json!(["team-b"])
    );
    let mut dyn_a_c = dyn_a.clone();
    dyn_a_c["namespaces"] = json!(["team-c"]);
    let (status, _) = call(&admin, "PUT", "/armory/accounts/dynamic", Some(&dyn_a_c)).await;
    assert_eq!(status, 202);
    wait_for("the agent to be sent team-c", async || {
        let _ = a.pump_ready();
        sent_settings(&a, "dyn-a").0["namespaces"] == json!(["team-c"])
    })
    .await;
    for (body, code) in [
        (json!([]), 400),
        (
            json!({ "name": "nope", "kubeconfigFile": "encryptedFile:k8s!n:kc" }),
            404,
        ),
        (
            json!({ "name": "declared", "kubeconfigFile": "encryptedFile:k8s!n:kc" }),
            409,
        ),
        (
            json!({ "name": "dyn-a", "kubeconfigFile": "/etc/kubeconfig" }),
            400,
        ),
    ] {
        let (status, answer) = call(&admin, "PUT", "/armory/accounts/dynamic", Some(&body)).await;
        assert_eq!(status, code, "{body}: {answer}");
    }

    // The list: every account sorted by name, paged; Armory's defaults page 1, limit 100.
    let names = |list: &Value| -> Vec<String> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (status, list) = call(&reader, "GET", "/armory/accounts", None).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        names(&list),
        ["declared", "dyn-a", "legacy", "prod-eu", "staging"]
    );
    assert_eq!(
        (
            list["page"].clone(),
            list["limit"].clone(),
            list["total"].clone()
        ),
        (json!(1), json!(100), json!(5))
    );
    assert_eq!(list["items"][0]["dynamic"], false);
    assert_eq!(list["items"][0]["status"], "ACTIVE");
    let (_, page) = call(&reader, "GET", "/armory/accounts?page=2&limit=2", None).await;
    assert_eq!(names(&page), ["legacy", "prod-eu"]);
    assert_eq!(page["total"], 5);
    let (_, page) = call(&reader, "GET", "/armory/accounts?page=3&limit=2", None).await;
    assert_eq!(names(&page), ["staging"]);
    let (_, page) = call(&reader, "GET", "/armory/accounts?page=4&limit=2", None).await;
    assert_eq!(names(&page), Vec::<String>::new());
    for query in ["page=0", "limit=0", "limit=ten", "limit=1001", "page=-1"] {
        let (status, answer) =
            call(&reader, "GET", &format!("/armory/accounts?{query}"), None).await;
        assert_eq!(status, 400, "{query}: {answer}");
    }

    // Delete: a list or one name; 404 (nothing removed) for unknown names, 409 for accounts
    // an agent declares; removed accounts are withdrawn from their agent.
    let (status, answer) = call(
        &admin,
        "DELETE",
        "/armory/accounts",
        Some(&json!(["staging", "nope"])),
    )
    .await;
    assert_eq!(status, 404, "{answer}");
    let (status, _) = call(&reader, "GET", "/armory/accounts/staging", None).await;
    assert_eq!(status, 200, "nothing removed");
    let (status, answer) = call(
        &admin,
        "DELETE",
        "/armory/accounts",
        Some(&json!(["declared"])),
    )
    .await;
    assert_eq!(status, 409, "{answer}");
    let (status, answer) = call(&admin, "DELETE", "/armory/accounts", Some(&json!([]))).await;
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = call(
        &admin,
        "DELETE",
        "/armory/accounts",
        Some(&json!(["staging", "legacy"])),
    )
    .await;
    assert_eq!((status, answer), (202, json!([])));
    let (status, answer) = call(&admin, "DELETE", "/armory/accounts/dyn-a", None).await;
    assert_eq!((status, answer), (202, json!([])));
    pushed(&mut a, &[]).await;
    let (status, _) = call(&admin, "DELETE", "/armory/accounts/dyn-a", None).await;
    assert_eq!(status, 404);
    let (_, list) = call(&reader, "GET", "/armory/accounts", None).await;
    assert_eq!(names(&list), ["declared", "prod-eu"]);

    // Every change audited: who, which account, the verb, the route and the code.
    let prod_lines = audited("prod-eu");
    for (verb, code) in [
        ("migrate", 202),
        ("migrate", 409),
        ("activate", 202),
        ("deactivate", 202),
    ] {
        assert!(
            prod_lines
                .iter()
                .any(|l| l.contains(&format!("verb=\"{verb}\""))
                    && l.contains(&format!("code={code}"))
                    && l.contains("who=admin")),
            "{verb} {code}: {prod_lines:#?}"
        );
    }
    let dyn_lines = audited("dyn-a");
    for verb in ["add", "update", "activate", "delete"] {
        assert!(
            dyn_lines
                .iter()
                .any(|l| l.contains(&format!("verb=\"{verb}\"")) && l.contains("code=202")),
            "{verb}: {dyn_lines:#?}"
        );
    }
    assert!(
        audited("nope").iter().any(|l| l.contains("code=404")),
        "refusals are audited too"
    );
    assert!(
        audited("-")
            .iter()
            .any(|l| l.contains("code=400") && l.contains("verb=\"migrate\"")),
        "a body naming no account is audited with account -"
    );

    // Kept across a restart: still INACTIVE, still not sent.
    hub.shutdown().await.unwrap();
    drop(a);
    let hub = start_hub(&pki, &dir, configure).await;
    let admin = api(&hub);
    let mut a = agent(&hub, &pki, "infra.test", "pod-2").await;
    pushed(&mut a, &[]).await;
    let (_, prod) = call(&admin, "GET", "/armory/accounts/prod-eu", None).await;
    assert_eq!(
        (prod["state"].clone(), prod["source"].clone()),
        (json!("INACTIVE"), json!("clouddriver"))
    );
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn migrating_needs_clouddrivers_account_management_api_and_a_zone_among_several_agents() {
    let pki = Pki::new();
    let dir = data_dir("armory-no-clouddriver");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let admin = api(&hub);
    let (status, answer) = call(
        &admin,
        "POST",
        "/armory/accounts",
        Some(&json!([{ "name": "prod-eu" }])),
    )
    .await;
    assert_eq!(status, 501, "{answer}");
    assert!(message(&answer).contains("--clouddriver-url"), "{answer}");

    // Without a zoneId the hub takes the one agent identity connected, and asks for one
    // when there are several (it does not broadcast as Armory does).
    let body = json!({ "name": "dyn-z", "kubeconfigFile": "encryptedFile:k8s!n:kc" });
    let (status, answer) = call(&admin, "POST", "/armory/accounts/dynamic", Some(&body)).await;
    assert_eq!(status, 400, "{answer}");
    assert!(message(&answer).contains("no agent connected"), "{answer}");
    let mut a = agent(&hub, &pki, "one.test", "pod-1").await;
    pushed(&mut a, &[]).await;
    let mut b = agent(&hub, &pki, "two.test", "pod-1").await;
    pushed(&mut b, &[]).await;
    let (status, answer) = call(&admin, "POST", "/armory/accounts/dynamic", Some(&body)).await;
    assert_eq!(status, 400, "{answer}");
    assert!(message(&answer).contains("several agents"), "{answer}");
    let (status, answer) = call(
        &admin,
        "POST",
        "/armory/accounts/dynamic",
        Some(&json!({ "name": "dyn-z", "zoneId": "two.test", "kubeconfigFile": "encryptedFile:k8s!n:kc" })),
    )
    .await;
    assert_eq!((status, answer), (202, json!([])));
    let (status, answer) = call(
        &admin,
        "PATCH",
        "/armory/accounts",
        Some(&json!([{ "name": "dyn-z", "state": "ACTIVE" }])),
    )
    .await;
    assert_eq!((status, answer), (202, json!([])));
    pushed(&mut b, &["dyn-z"]).await;
    pushed(&mut a, &[]).await;
    // Moved to the other agent with PATCH's zoneId: withdrawn from one, sent to the other.
    let (status, _) = call(
        &admin,
        "PATCH",
        "/armory/accounts",
        Some(&json!([{ "name": "dyn-z", "state": "ACTIVE", "zoneId": "one.test" }])),
    )
    .await;
    assert_eq!(status, 202);
    pushed(&mut a, &["dyn-z"]).await;
    pushed(&mut b, &[]).await;
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
