//! Logs, events, and operations RBAC forbids.

use super::*;

/// Logs and events (this cluster runs no kubelet, so pods never start: the request path and
/// the API server's errors are what is checked), and an operation RBAC forbids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_events_and_rbac_forbidden() -> anyhow::Result<()> {
    let s = Setup::new("logs", 1).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    let pods: Api<Pod> = Api::namespaced(s.admin.clone(), &ns);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": {"job": "j"}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}
        }))?,
    )
    .await?;

    // A pod that was never scheduled: this API server answers an empty log.
    let r = expect(hub, &account, 200, json!({"type": "logs", "namespace": ns, "name": "p", "container": "main", "tailLines": 10, "sinceSeconds": 60, "timestamps": true})).await?;
    assert_eq!(r["state"], "succeeded");
    assert_eq!(r["executed"], true);
    assert_eq!(r["text"], "");
    // A container the pod does not have: the API server's error comes back as is.
    let (code, r) = op(hub, &account, json!({"type": "logs", "namespace": ns, "name": "p", "container": "nope", "previous": true})).await?;
    assert!((400..500).contains(&code), "{code} {r:#}");
    assert_eq!(r["state"], "failed");
    assert_eq!(r["executed"], true);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("nope"),
        "{r:#}"
    );
    // Missing pod.
    expect(
        hub,
        &account,
        404,
        json!({"type": "logs", "namespace": ns, "name": "missing"}),
    )
    .await?;
    // Job logs: a Job whose pods do not exist yet (the job controller may create one that
    // never runs): either no pods (404) or the pod's error.
    let (code, r) = op(
        hub,
        &account,
        json!({"type": "logs", "kind": "deployment", "namespace": ns, "name": "missing"}),
    )
    .await?;
    assert_eq!(code, 404, "{r:#}");
    expect(
        hub,
        &account,
        200,
        json!({"type": "apply", "manifest": deployment(&ns, "nopods", "nginx:1", 0)}),
    )
    .await?;
    let r = expect(
        hub,
        &account,
        404,
        json!({"type": "logs", "kind": "deployment", "namespace": ns, "name": "nopods"}),
    )
    .await?;
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("no pods found"),
        "{r:#}"
    );

    // Events about an object.
    let r = expect(
        hub,
        &account,
        200,
        json!({"type": "events", "kind": "Pod", "namespace": ns, "name": "p"}),
    )
    .await?;
    assert!(r["text"].as_str().unwrap_or_default().starts_with("TYPE"));

    // RBAC: a read-only account (its own agent) is refused with the API server's 403 and
    // nothing changes.
    let control_plane = control_plane()?;
    let reader = identity(
        control_plane,
        &s.admin,
        &ns,
        "reader",
        &["get", "list", "watch"],
        &s.dir,
    )
    .await?;
    let read_account = account_name("reader");
    let config = s.dir.join("reader.yaml");
    write_config(
        &config,
        s.hub.grpc_addr,
        json!([fixtures::account(
            &read_account,
            &reader,
            &ns,
            &["configmaps"]
        )]),
    )?;
    let reader_agent = fixtures::start_agent_replica(&config, "reader-0").await?;
    let ra = read_account.clone();
    until("the read-only account", || {
        let ra = ra.clone();
        async move {
            Ok(http(hub, "GET", &format!("/api/v1/accounts/{ra}"), None)
                .await?
                .1["streaming"]
                .is_object())
        }
    })
    .await?;
    s.configmaps()
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "keep"}, "data": {"v": "1"}}))?,
        )
        .await?;
    let before = s.configmaps().get("keep").await?.metadata.resource_version;
    let r = expect(
        hub,
        &read_account,
        403,
        json!({"type": "delete", "kind": "ConfigMap", "namespace": ns, "name": "keep"}),
    )
    .await?;
    assert_eq!(r["status"]["reason"], "Forbidden");
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot delete resource \"configmaps\""),
        "{r:#}"
    );
    let r = expect(
        hub,
        &read_account,
        403,
        json!({"type": "apply", "manifest": configmap(&ns, "keep", json!({"v": "2"}))}),
    )
    .await?;
    assert_eq!(r["executed"], true);
    assert_eq!(
        s.configmaps().get("keep").await?.metadata.resource_version,
        before,
        "nothing changed"
    );
    // Reads are allowed.
    expect(
        hub,
        &read_account,
        200,
        json!({"type": "get", "kind": "ConfigMap", "namespace": ns, "name": "keep"}),
    )
    .await?;
    reader_agent.stop().await?;
    s.stop().await
}
