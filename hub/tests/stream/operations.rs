//! Operations: routed, answered and resent only when safe; the body limit; client ids run once;
//! deadlines; large results in parts; client ids across a restart.

use super::*;

/// Operations through fake agents: a result updates the cache before the HTTP answer
/// (read-your-writes), a non-idempotent operation whose replica leaves is not resent, an
/// idempotent one is resent to another replica (a standby), and with no replica the answer
/// is 503 noAgent.
#[tokio::test]
async fn operations_are_routed_answered_and_resent_only_when_safe() {
    let pki = Pki::new();
    let dir = data_dir("ops");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    assert_eq!(
        role(&a.register("prod", "https://h:6443").await),
        Role::Streaming
    );
    a.snapshot("prod", &[("one", "5")], "100").await;
    a.synced().await;

    // An apply answered by the only replica: objects and deletions reach the cache first.
    let submitter = http.clone();
    let submit = tokio::spawn(async move {
        post_json(
            &submitter,
            "/api/v1/accounts/prod/operations",
            &serde_json::json!({"type": "apply", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "two"}}}),
        )
        .await
    });
    let op = a.operation().await;
    assert_eq!(op.account, "prod");
    assert!(op.deadline_unix_millis > 0);
    // The relative timeout: what is left of the default 30 s when it was written.
    assert!(
        (25_000..=30_000).contains(&op.timeout_millis),
        "{}",
        op.timeout_millis
    );
    assert!(matches!(op.op, Some(pb::operation::Op::Apply(_))));
    let Msg::Object(two) = cm_event("prod", EventType::Applied, "two", "120", "web") else {
        unreachable!()
    };
    a.send(Msg::OperationResult(pb::OperationResult {
        id: op.id.clone(),
        ok: true,
        status: Some(pb::OperationStatus {
            code: 200,
            ..Default::default()
        }),
        objects_json: vec![two.object_json],
        object_kinds: vec![configmaps()],
        deleted: vec!["ConfigMap/default/one".into()],
        deleted_kinds: vec![configmaps()],
        deleted_uids: vec!["uid-one".into()],
        executed: true,
        replica: "pod-1".into(),
        account: "prod".into(),
        ..Default::default()
    }))
    .await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["state"], "succeeded");
    assert_eq!(body["objects"][0]["metadata"]["name"], "two");
    // Read-your-writes: no watch event was sent for "two", nor a deletion of "one".
    assert_eq!(object_names(&hub, "prod/objects").await, ["two"]);
    let (code, looked) = get_json(&http, &format!("/api/v1/operations/{}", op.id)).await;
    assert_eq!(code, 200);
    assert_eq!(looked["state"], "succeeded");

    // A create (not idempotent) whose replica leaves after receiving it: not resent.
    let mut b = agent(&hub, &pki, "agent-a.test", "pod-2").await;
    assert_eq!(
        role(&b.register("prod", "https://h:6443").await),
        Role::Standby
    );
    let submitter = http.clone();
    let submit = tokio::spawn(async move {
        post_json(
            &submitter,
            "/api/v1/accounts/prod/operations",
            &serde_json::json!({"type": "create", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}}),
        )
        .await
    });
    let (receiver, op) = tokio::select! {
        op = a.operation() => ("a", op),
        op = b.operation() => ("b", op),
    };
    if receiver == "a" {
        drop(a);
    } else {
        drop(b);
        b = a;
    }
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["state"], "failed");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("not safe to resend"),
        "{body}"
    );
    assert!(b.operations.iter().all(|o| o.id != op.id));

    // An idempotent get whose replica leaves: resent to the other one (here a standby).
    let mut c = agent(&hub, &pki, "agent-a.test", "pod-3").await;
    assert_eq!(
        role(&c.register("prod", "https://h:6443").await),
        Role::Standby
    );
    let submitter = http.clone();
    let submit = tokio::spawn(async move {
        post_json(
            &submitter,
            "/api/v1/accounts/prod/operations",
            &serde_json::json!({"type": "get", "kind": "ConfigMap", "namespace": "default", "name": "two"}),
        )
        .await
    });
    let (receiver, first) = tokio::select! {
        op = b.operation() => ("b", op),
        op = c.operation() => ("c", op),
    };
    let mut other = if receiver == "b" {
        drop(b);
        c
    } else {
        drop(c);
        b
    };
    let again = other.operation().await;
    assert_eq!(again.id, first.id);
    other
        .send(Msg::OperationResult(pb::OperationResult {
            id: again.id.clone(),
            ok: false,
            status: Some(pb::OperationStatus {
                code: 404,
                reason: "NotFound".into(),
                message: "configmaps \"two\" not found".into(),
                causes: vec![],
            }),
            executed: true,
            account: "prod".into(),
            ..Default::default()
        }))
        .await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["attempts"], 2);
    assert_eq!(body["status"]["reason"], "NotFound");

    // Nobody left.
    drop(other);
    wait_for("the account to be disconnected", async || {
        let (_, acc) = get_json(&http, "/api/v1/accounts/prod").await;
        acc["state"] == "disconnected"
    })
    .await;
    // With nobody left the operation waits for an agent up to its deadline, then 503.
    let (code, body) = post_json(
        &http,
        "/api/v1/accounts/prod/operations",
        &serde_json::json!({"type": "get", "kind": "ConfigMap", "name": "two", "timeoutSeconds": 0.5}),
    )
    .await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["state"], "noAgent");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("no agent connected for account prod")
    );
    let (code, _) = post_json(
        &http,
        "/api/v1/accounts/prod/operations",
        &serde_json::json!({"type": "bogus"}),
    )
    .await;
    assert_eq!(code, 400);
    let (_, metrics) = get(&http, "/metrics").await;
    assert!(
        metrics.contains("scale_agent_hub_operation_retries_total 2"),
        "{metrics}"
    );

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn operation_requests_past_the_body_limit_get_413() {
    let pki = Pki::new();
    let dir = data_dir("ops-limit");
    let hub = start_hub(&pki, &dir, |c| c.api.max_request_bytes = 4096).await;
    let manifest = serde_json::json!({"kind": "ConfigMap", "data": {"pad": "x".repeat(5000)}});
    let (status, body) = post_json(
        &api(&hub),
        "/api/v1/accounts/prod/operations",
        &serde_json::json!({"type": "apply", "manifests": [manifest]}),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    assert!(message.contains("limit of 4096 bytes"), "{body}");
    assert!(message.contains("--max-request-bytes"), "{body}");
    // A Kubernetes Status, like the API server's own 413.
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["reason"], "RequestEntityTooLarge", "{body}");
    assert_eq!(body["code"], 413, "{body}");
    assert_eq!(body["message"], body["error"], "{body}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A successful result with `code` from `replica`, without objects.
fn succeeded(id: &str, account: &str, replica: &str, code: i32) -> pb::OperationResult {
    pb::OperationResult {
        id: id.into(),
        ok: true,
        status: Some(pb::OperationStatus {
            code,
            ..Default::default()
        }),
        executed: true,
        replica: replica.into(),
        account: account.into(),
        ..Default::default()
    }
}

/// A list result of `objects` ConfigMaps of `object_bytes` each, whole or a part (`more`).
fn list_result(id: &str, objects: usize, object_bytes: usize, more: bool) -> pb::OperationResult {
    pb::OperationResult {
        id: id.into(),
        ok: !more,
        status: Some(pb::OperationStatus {
            code: 200,
            ..Default::default()
        }),
        objects_json: (0..objects)
            .map(|i| {
                serde_json::to_vec(&serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("cm-{i}"), "namespace": "default"},
                    "data": {"pad": "x".repeat(object_bytes)},
                }))
                .unwrap()
            })
            .collect(),
        executed: true,
        replica: "pod-1".into(),
        more,
        ..Default::default()
    }
}

async fn submit_in_background(
    http: &Api,
    account: &str,
    body: serde_json::Value,
) -> tokio::task::JoinHandle<(u16, serde_json::Value)> {
    let http = http.clone();
    let path = format!("/api/v1/accounts/{account}/operations");
    tokio::spawn(async move { post_json(&http, &path, &body).await })
}

/// Client ids are per account and claimed before dispatch: concurrent submissions of one id
/// reach the agent once and all get its answer; the same id in another account is another
/// operation; a later resubmission answers the recorded outcome without running again.
#[tokio::test]
async fn client_ids_run_once_per_account_under_concurrent_submits() {
    let pki = Pki::new();
    let dir = data_dir("ops-ids");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://h:6443").await;
    a.register("dev", "https://h:6443").await;
    a.synced().await;

    let create = |account: &str| serde_json::json!({"id": "release-42", "type": "create", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("{account}-x")}}});
    let mut submits = Vec::new();
    for _ in 0..5 {
        submits.push(submit_in_background(&http, "prod", create("prod")).await);
    }
    let op = a.operation().await;
    assert_eq!(op.account, "prod");
    assert_ne!(
        op.id, "release-42",
        "the wire id is the hub's, unique across accounts"
    );
    // The same client id in another account is its own operation.
    let dev = submit_in_background(&http, "dev", create("dev")).await;
    let dev_op = a.operation().await;
    assert_eq!(dev_op.account, "dev");
    assert_ne!(dev_op.id, op.id);
    // No second dispatch of prod's id, however long the submitters wait.
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.pump_ready().unwrap();
    assert!(
        a.operations.is_empty(),
        "dispatched again: {:?}",
        a.operations
    );
    for (id, account) in [(&op.id, "prod"), (&dev_op.id, "dev")] {
        a.send(Msg::OperationResult(succeeded(id, account, "pod-1", 201)))
            .await;
    }
    for submit in submits {
        let (code, body) = submit.await.unwrap();
        assert_eq!(code, 201, "{body}");
        assert_eq!(body["id"], "release-42", "{body}");
        assert_eq!(body["account"], "prod", "{body}");
    }
    let (code, body) = dev.await.unwrap();
    assert_eq!(
        (code, body["account"].as_str()),
        (201, Some("dev")),
        "{body}"
    );
    // Resubmitted later: the recorded answer, no dispatch.
    let (code, body) = post_json(&http, "/api/v1/accounts/prod/operations", &create("prod")).await;
    assert_eq!(code, 201, "{body}");
    a.pump_ready().unwrap();
    assert!(a.operations.is_empty());
    // Lookups: per account, and by id alone only when one account has it.
    let (code, body) = get_json(&http, "/api/v1/accounts/dev/operations/release-42").await;
    assert_eq!(
        (code, body["account"].as_str()),
        (200, Some("dev")),
        "{body}"
    );
    let (code, body) = get_json(&http, "/api/v1/operations/release-42").await;
    assert_eq!(code, 409, "{body}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// With no agent connected, an operation waits for one up to its deadline (a rolling
/// restart, the hub's own restart) instead of failing at once.
#[tokio::test]
async fn an_operation_waits_for_an_agent_until_its_deadline() {
    let pki = Pki::new();
    let dir = data_dir("ops-wait");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://h:6443").await;
    a.synced().await;
    drop(a);
    wait_for("the account to be disconnected", async || {
        let (_, acc) = get_json(&http, "/api/v1/accounts/prod").await;
        acc["state"] == "disconnected"
    })
    .await;
    let submit = submit_in_background(
        &http,
        "prod",
        serde_json::json!({"type": "get", "kind": "ConfigMap", "name": "two", "timeoutSeconds": 20}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!submit.is_finished(), "answered before an agent came");
    let mut b = agent(&hub, &pki, "agent-a.test", "pod-2").await;
    b.register("prod", "https://h:6443").await;
    let op = b.operation().await;
    assert!(
        op.timeout_millis > 0 && op.timeout_millis < 20_000,
        "the time left, not the whole timeout: {}",
        op.timeout_millis
    );
    b.send(Msg::OperationResult(succeeded(
        &op.id, "prod", "pod-2", 200,
    )))
    .await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["attempts"], 1, "{body}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// An operation whose deadline leaves no time to reach the cluster (a 1 ms
/// `timeoutSeconds`) is never sent: 504 with `executed: false` (a safe retry), not "sent,
/// it may have run"; the agent receives nothing.
#[tokio::test]
async fn an_operation_out_of_time_before_it_is_sent_answers_not_executed() {
    let pki = Pki::new();
    let dir = data_dir("ops-too-late");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://h:6443").await;
    a.synced().await;
    let (code, body) = post_json(
        &http,
        "/api/v1/accounts/prod/operations",
        &serde_json::json!({"type": "delete", "kind": "ConfigMap", "name": "two", "timeoutSeconds": 0.001}),
    )
    .await;
    assert_eq!(code, 504, "{body}");
    assert_eq!(body["executed"], false, "{body}");
    assert_eq!(body["state"], "timedOut", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("not sent and did not run"), "{body}");
    assert!(message.contains("timeoutSeconds"), "{body}");
    assert!(
        tokio::time::timeout(Duration::from_millis(500), a.operation())
            .await
            .is_err(),
        "the agent was sent an operation with no time left"
    );
    // With time enough the same operation is sent.
    let submit = submit_in_background(
        &http,
        "prod",
        serde_json::json!({"type": "delete", "kind": "ConfigMap", "name": "two", "timeoutSeconds": 5}),
    )
    .await;
    let op = a.operation().await;
    a.send(Msg::OperationResult(succeeded(
        &op.id, "prod", "pod-1", 200,
    )))
    .await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 200, "{body}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Large results: parts are joined (and a list's continue token returned); a result past
/// --max-operation-result-bytes ends only its operation with 413 while the stream goes on;
/// a message past the decode limit (an agent that does not split) ends its stream, and the
/// operation is answered 413 instead of being resent to break the next replica too.
#[tokio::test]
async fn large_results_come_in_parts_and_one_too_large_ends_only_its_operation() {
    let pki = Pki::new();
    let dir = data_dir("ops-large");
    let hub = start_hub(&pki, &dir, |c| {
        c.streams.max_object_bytes = 64 * 1024;
        c.streams.max_staged_bytes = 64 * 1024;
        c.operations.max_result_bytes = 3 * 1024 * 1024;
    })
    .await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    let limit = a.welcome.as_ref().unwrap().max_message_bytes;
    assert_eq!(
        limit,
        64 * 1024 + 1024 * 1024,
        "Welcome names the decode limit"
    );
    a.register("prod", "https://h:6443").await;
    a.synced().await;

    // 2.4 MB in three parts, each under the limit.
    let submit = submit_in_background(
        &http,
        "prod",
        serde_json::json!({"type": "list", "kind": "ConfigMap", "limit": 30}),
    )
    .await;
    let op = a.operation().await;
    for i in 0..3 {
        let mut part = list_result(&op.id, 10, 80_000, i < 2);
        part.account = "prod".into();
        if i == 2 {
            part.continue_token = "next-page".into();
        }
        a.send(Msg::OperationResult(part)).await;
    }
    let (code, body) = submit.await.unwrap();
    assert_eq!(
        code,
        200,
        "{}",
        body.to_string().chars().take(300).collect::<String>()
    );
    assert_eq!(body["objects"].as_array().unwrap().len(), 30);
    assert_eq!(body["continue"], "next-page");

    // Past --max-operation-result-bytes: 413 naming it; the stream serves the next one.
    let submit = submit_in_background(
        &http,
        "prod",
        serde_json::json!({"type": "list", "kind": "ConfigMap"}),
    )
    .await;
    let op = a.operation().await;
    for i in 0..5 {
        a.send(Msg::OperationResult(list_result(&op.id, 10, 80_000, i < 4)))
            .await;
    }
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 413, "{body}");
    assert_eq!(body["status"]["reason"], "RequestEntityTooLarge");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("--max-operation-result-bytes"),
        "{body}"
    );
    a.synced().await;
    let submit = submit_in_background(
        &http,
        "prod",
        serde_json::json!({"type": "get", "kind": "ConfigMap", "name": "cm-1"}),
    )
    .await;
    let op = a.operation().await;
    a.send(Msg::OperationResult(list_result(&op.id, 1, 10, false)))
        .await;
    assert_eq!(submit.await.unwrap().0, 200);

    // An agent that sends the whole result in one message past the decode limit.
    let mut b = agent(&hub, &pki, "agent-a.test", "pod-2").await;
    b.register("prod", "https://h:6443").await;
    b.synced().await;
    let submit = submit_in_background(
        &http,
        "prod",
        serde_json::json!({"type": "list", "kind": "ConfigMap"}),
    )
    .await;
    let (first, op) = tokio::select! {
        op = a.operation() => ("a", op),
        op = b.operation() => ("b", op),
    };
    let (sender, other) = if first == "a" {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    sender
        .send(Msg::OperationResult(list_result(&op.id, 20, 80_000, false)))
        .await;
    let (code, body) = submit.await.unwrap();
    assert_eq!(code, 413, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("--max-object-bytes"),
        "{body}"
    );
    // Not resent to the other replica, whose stream it would end as well.
    other.pump_ready().unwrap();
    assert!(other.operations.is_empty(), "{:?}", other.operations);
    other.send(Msg::Heartbeat(pb::Heartbeat::default())).await;
    other.synced().await;
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Client ids survive a hub restart for the retention period: a resubmitted id answers its
/// recorded outcome and is not sent to an agent again.
#[tokio::test]
async fn client_ids_survive_a_hub_restart() {
    let pki = Pki::new();
    let dir = data_dir("ops-restart");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://h:6443").await;
    a.synced().await;
    let create = serde_json::json!({"id": "release-7", "type": "create", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}});
    let submit = submit_in_background(&http, "prod", create.clone()).await;
    let op = a.operation().await;
    a.send(Msg::OperationResult(succeeded(
        &op.id, "prod", "pod-1", 201,
    )))
    .await;
    assert_eq!(submit.await.unwrap().0, 201);
    hub.shutdown().await.unwrap();
    drop(a);

    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://h:6443").await;
    a.synced().await;
    let (code, body) = post_json(&http, "/api/v1/accounts/prod/operations", &create).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["state"], "succeeded", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("before the hub restarted"),
        "{body}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.pump_ready().unwrap();
    assert!(a.operations.is_empty(), "sent again: {:?}", a.operations);
    let (code, _) = get_json(&http, "/api/v1/accounts/prod/operations/release-7").await;
    assert_eq!(code, 200);
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
