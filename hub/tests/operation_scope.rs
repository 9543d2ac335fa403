//! Operations are their submitter's (issue 28, F18): the hub's operation ids are random, a
//! second operator token cannot read the first's results (404, exactly as for an id that
//! does not exist, so the id is not confirmed), the same client id from two callers runs
//! twice, once for each, and an admin reads both. The hub runs in-process with its real
//! API tokens; a fake agent speaks the real protocol over mutual TLS.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use scale_agent_proto::v1::{self as pb, agent_message::Kind as Msg};
use serde_json::{Value, json};

/// A token of `role` issued by the hub, as the API with it.
async fn issued(admin: &Api, name: &str, role: &str) -> Api {
    let (code, body) = post_json(
        admin,
        "/api/v1/tokens",
        &json!({"name": name, "role": role}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    admin.with_token(Some(body["token"].as_str().unwrap()))
}

/// The agent's answer to operation `id`: succeeded with `code`, its text saying who ran.
fn answer(id: &str, code: i32, text: &str) -> Msg {
    Msg::OperationResult(pb::OperationResult {
        id: id.into(),
        ok: true,
        status: Some(pb::OperationStatus {
            code,
            ..Default::default()
        }),
        executed: true,
        replica: "pod-1".into(),
        account: "prod".into(),
        text: text.into(),
        ..Default::default()
    })
}

fn submit(api: &Api, body: Value) -> tokio::task::JoinHandle<(u16, Value)> {
    let api = api.clone();
    tokio::spawn(async move { post_json(&api, "/api/v1/accounts/prod/operations", &body).await })
}

/// The `error` of a 404, with the id replaced, to compare refusals of known and unknown ids.
async fn not_found(api: &Api, path: &str, id: &str) -> String {
    let (code, body) = get_json(api, path).await;
    assert_eq!(code, 404, "{path}: {body}");
    body["error"].as_str().unwrap().replace(id, "<id>")
}

#[tokio::test]
async fn operations_are_seen_and_claimed_only_by_their_submitter() {
    let pki = Pki::new();
    let dir = data_dir("operation-scope");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let admin = api(&hub);
    let one = issued(&admin, "ci-one", "operator").await;
    let two = issued(&admin, "ci-two", "operator").await;
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://h:6443").await;
    a.synced().await;

    // A hub-made id: 128 random bits, nothing of a clock or a counter.
    let get = json!({"type": "get", "kind": "ConfigMap", "name": "x", "namespace": "default"});
    let first = submit(&one, get.clone());
    let op = a.operation().await;
    a.send(answer(&op.id, 200, "one's get")).await;
    let (code, body) = first.await.unwrap();
    assert_eq!(code, 200, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let hex = id.strip_prefix("op-").unwrap_or_else(|| panic!("{id}"));
    assert!(
        hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit()),
        "{id}"
    );
    let second = submit(&one, get.clone());
    let op2 = a.operation().await;
    a.send(answer(&op2.id, 200, "one's second get")).await;
    let (_, body2) = second.await.unwrap();
    let id2 = body2["id"].as_str().unwrap();
    assert_ne!(
        id[..12],
        id2[..12],
        "consecutive ids share a prefix: {id} {id2}"
    );

    // The submitter and an admin read it; another operator gets the 404 of an unknown id.
    let by_id = format!("/api/v1/operations/{id}");
    let in_account = format!("/api/v1/accounts/prod/operations/{id}");
    for (who, api) in [("ci-one", &one), ("admin", &admin)] {
        for path in [&by_id, &in_account] {
            let (code, body) = get_json(api, path).await;
            assert_eq!(code, 200, "{who} {path}: {body}");
            assert_eq!(body["text"], "one's get", "{who} {path}: {body}");
        }
    }
    let unknown = "op-00000000000000000000000000000000";
    for (path, unknown_path) in [
        (&by_id, format!("/api/v1/operations/{unknown}")),
        (
            &in_account,
            format!("/api/v1/accounts/prod/operations/{unknown}"),
        ),
    ] {
        let refused = not_found(&two, path, &id).await;
        assert_eq!(
            refused,
            not_found(&two, &unknown_path, unknown).await,
            "another caller's id is refused as an unknown one is"
        );
    }

    // The same client id from two callers: two operations, each run once for its caller.
    let create = json!({"id": "release-1", "type": "create", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}}});
    let from_one = submit(&one, create.clone());
    let op_one = a.operation().await;
    a.send(answer(&op_one.id, 201, "created for ci-one")).await;
    let (code, body) = from_one.await.unwrap();
    assert_eq!(
        (code, body["text"].as_str()),
        (201, Some("created for ci-one"))
    );
    let from_two = submit(&two, create.clone());
    let op_two = tokio::time::timeout(Duration::from_secs(10), a.operation())
        .await
        .expect("ci-two's release-1 was not run: it got ci-one's outcome");
    assert_ne!(op_two.id, op_one.id);
    a.send(answer(&op_two.id, 201, "created for ci-two")).await;
    let (code, body) = from_two.await.unwrap();
    assert_eq!(
        (code, body["text"].as_str()),
        (201, Some("created for ci-two")),
        "{body}"
    );
    // Resubmitted by either: its own recorded outcome, nothing run again.
    for (api, text) in [(&one, "created for ci-one"), (&two, "created for ci-two")] {
        let (code, body) = post_json(api, "/api/v1/accounts/prod/operations", &create).await;
        assert_eq!((code, body["text"].as_str()), (201, Some(text)), "{body}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.pump_ready().unwrap();
    assert!(a.operations.is_empty(), "run again: {:?}", a.operations);
    // Each caller reads their own; the admin sees both and is asked to choose.
    for (api, text) in [(&one, "created for ci-one"), (&two, "created for ci-two")] {
        for path in [
            "/api/v1/operations/release-1",
            "/api/v1/accounts/prod/operations/release-1",
        ] {
            let (code, body) = get_json(api, path).await;
            assert_eq!(
                (code, body["text"].as_str()),
                (200, Some(text)),
                "{path}: {body}"
            );
        }
    }
    for path in [
        "/api/v1/operations/release-1",
        "/api/v1/accounts/prod/operations/release-1",
    ] {
        let (code, body) = get_json(&admin, path).await;
        assert_eq!(code, 409, "{path}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains("several callers"),
            "{path}: {body}"
        );
    }
    // A reader still cannot look operations up at all.
    let reader = issued(&admin, "dashboards", "reader").await;
    assert_eq!(get_json(&reader, &by_id).await.0, 403);

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
