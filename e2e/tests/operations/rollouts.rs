//! Scale and rollouts: status, history, undo, restart, pause and resume.

use super::*;

/// Scale (the ReplicaSet follows), and rollout history, undo (to the previous and to a
/// given revision), pause/resume and restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_and_rollouts() -> anyhow::Result<()> {
    let s = Setup::new("rollout", 1).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    let rs_api: Api<ReplicaSet> = Api::namespaced(s.admin.clone(), &ns);
    expect(
        hub,
        &account,
        200,
        json!({"type": "apply", "manifest": deployment(&ns, "web", "nginx:1", 1)}),
    )
    .await?;

    // Scale: the Deployment changes and its ReplicaSet follows.
    let r = expect(hub, &account, 200, json!({"type": "scale", "kind": "deployment", "namespace": ns, "name": "web", "replicas": 3})).await?;
    assert_eq!(r["objects"][0]["spec"]["replicas"], 3);
    assert_eq!(s.deployments().get("web").await?.spec.replicas, Some(3));
    let rs = rs_api.clone();
    until("the ReplicaSet to follow the scale", || {
        let rs = rs.clone();
        async move {
            Ok(rs
                .list(&ListParams::default().labels("app=web"))
                .await?
                .items
                .iter()
                .any(|r| r.spec.replicas == Some(3)))
        }
    })
    .await?;
    // --current-replicas mismatch: 409, nothing changed.
    let r = expect(hub, &account, 409, json!({"type": "scale", "kind": "deploy", "namespace": ns, "name": "web", "replicas": 5, "currentReplicas": 1})).await?;
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("Expected replicas to be 1")
    );
    assert_eq!(s.deployments().get("web").await?.spec.replicas, Some(3));
    // A kind without a scale subresource.
    s.configmaps()
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "plain"}}))?,
        )
        .await?;
    expect(hub, &account, 400, json!({"type": "scale", "kind": "ConfigMap", "namespace": ns, "name": "plain", "replicas": 2})).await?;

    // Revisions 1 (nginx:1) and 2 (nginx:2).
    expect(
        hub,
        &account,
        200,
        json!({"type": "apply", "manifest": deployment(&ns, "web", "nginx:2", 3)}),
    )
    .await?;
    let image = |d: &Deployment| {
        d.spec
            .template
            .spec
            .as_ref()
            .map(|p| p.containers[0].image.clone().unwrap_or_default())
            .unwrap_or_default()
    };
    until("revision 2", || {
        let (hub, account, ns) = (hub, account.clone(), ns.clone());
        async move {
            let h = expect(hub, &account, 200, json!({"type": "rollout", "action": "history", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
            Ok(h["text"].as_str().unwrap_or_default().contains("\n2 "))
        }
    })
    .await?;
    let h = expect(hub, &account, 200, json!({"type": "rollout", "action": "history", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    let text = h["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("REVISION  CHANGE-CAUSE") && text.contains("1         <none>"),
        "{text}"
    );

    // Undo to the previous revision: the template of revision 1 comes back (revision 3).
    let r = expect(hub, &account, 200, json!({"type": "rollout", "action": "undo", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert!(
        r["text"]
            .as_str()
            .unwrap_or_default()
            .contains("rolled back"),
        "{r:#}"
    );
    assert_eq!(image(&s.deployments().get("web").await?), "nginx:1");
    let d = s.deployments().clone();
    until("revision 3", || {
        let d = d.clone();
        async move {
            Ok(d.get("web")
                .await?
                .metadata
                .annotations
                .unwrap_or_default()
                .get("deployment.kubernetes.io/revision")
                .map(String::as_str)
                == Some("3"))
        }
    })
    .await?;
    // Undo to a given revision.
    expect(hub, &account, 200, json!({"type": "rollout", "action": "undo", "toRevision": 2, "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert_eq!(image(&s.deployments().get("web").await?), "nginx:2");
    let r = expect(hub, &account, 404, json!({"type": "rollout", "action": "undo", "toRevision": 42, "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("unable to find specified revision 42")
    );

    // Pause and resume; undo and restart refuse a paused deployment.
    expect(hub, &account, 200, json!({"type": "rollout", "action": "pause", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert_eq!(s.deployments().get("web").await?.spec.paused, Some(true));
    expect(hub, &account, 400, json!({"type": "rollout", "action": "restart", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    expect(hub, &account, 400, json!({"type": "rollout", "action": "undo", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    expect(hub, &account, 200, json!({"type": "rollout", "action": "resume", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert_ne!(s.deployments().get("web").await?.spec.paused, Some(true));

    // Restart: the restartedAt annotation on the pod template, and a new ReplicaSet.
    let r = expect(hub, &account, 200, json!({"type": "rollout", "action": "restart", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert!(r["objects"][0]["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"].is_string());
    let live = s.deployments().get("web").await?;
    assert!(
        live.spec
            .template
            .metadata
            .and_then(|m| m.annotations)
            .unwrap_or_default()
            .contains_key("kubectl.kubernetes.io/restartedAt")
    );
    let r = expect(hub, &account, 200, json!({"type": "rollout", "action": "status", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert!(
        r["text"]
            .as_str()
            .unwrap_or_default()
            .contains("deployments.apps/web")
    );

    // A StatefulSet: scale, and undo through its ControllerRevisions.
    let sts = |image: &str| {
        json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": ns},
            "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": image}]}}},
        })
    };
    let sts_api: Api<StatefulSet> = Api::namespaced(s.admin.clone(), &ns);
    expect(
        hub,
        &account,
        200,
        json!({"type": "apply", "manifest": sts("db:1")}),
    )
    .await?;
    expect(
        hub,
        &account,
        200,
        json!({"type": "scale", "kind": "sts", "namespace": ns, "name": "db", "replicas": 2}),
    )
    .await?;
    assert_eq!(sts_api.get("db").await?.spec.replicas, Some(2));
    let history = |hub: SocketAddr, account: String, ns: String| async move {
        let h = expect(hub, &account, 200, json!({"type": "rollout", "action": "history", "kind": "statefulset", "namespace": ns, "name": "db"})).await?;
        Ok::<_, anyhow::Error>(h["text"].as_str().unwrap_or_default().to_string())
    };
    until("statefulset revision 1", || {
        let f = history(hub, account.clone(), ns.clone());
        async move { Ok(f.await?.contains("\n1 ")) }
    })
    .await?;
    let mut applied = sts("db:2");
    applied["spec"]["replicas"] = json!(2);
    expect(
        hub,
        &account,
        200,
        json!({"type": "apply", "manifest": applied}),
    )
    .await?;
    until("statefulset revision 2", || {
        let f = history(hub, account.clone(), ns.clone());
        async move { Ok(f.await?.contains("\n2 ")) }
    })
    .await?;
    let r = expect(hub, &account, 200, json!({"type": "rollout", "action": "undo", "kind": "statefulset", "namespace": ns, "name": "db"})).await?;
    assert!(
        r["text"]
            .as_str()
            .unwrap_or_default()
            .contains("rolled back"),
        "{r:#}"
    );
    let live = sts_api.get("db").await?;
    let image = live
        .spec
        .template
        .spec
        .map(|p| p.containers[0].image.clone().unwrap_or_default())
        .unwrap_or_default();
    assert_eq!(image, "db:1");
    expect(hub, &account, 200, json!({"type": "rollout", "action": "restart", "kind": "statefulset", "namespace": ns, "name": "db"})).await?;
    expect(hub, &account, 400, json!({"type": "rollout", "action": "pause", "kind": "statefulset", "namespace": ns, "name": "db"})).await?;

    // Rollout of a kind that has none.
    expect(hub, &account, 400, json!({"type": "rollout", "action": "undo", "kind": "ConfigMap", "namespace": ns, "name": "plain"})).await?;
    s.stop().await
}
