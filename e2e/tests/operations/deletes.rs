//! Deletes with propagation policies and finalizers.

use super::*;

/// Delete by name and by selector with each propagation policy, waiting for finalizers,
/// and a missing object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_with_propagation_policies_and_finalizers() -> anyhow::Result<()> {
    let s = Setup::new("delete", 1).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    let rs_api: Api<ReplicaSet> = Api::namespaced(s.admin.clone(), &ns);
    for name in ["orphan", "background", "foreground"] {
        expect(
            hub,
            &account,
            200,
            json!({"type": "apply", "manifest": deployment(&ns, name, "nginx:1", 1)}),
        )
        .await?;
    }
    let owned = |name: &'static str| {
        let rs_api = rs_api.clone();
        async move {
            Ok::<_, anyhow::Error>(
                rs_api
                    .list(&ListParams::default().labels(&format!("app={name}")))
                    .await?
                    .items,
            )
        }
    };
    for name in ["orphan", "background", "foreground"] {
        until("the deployment's ReplicaSet", || async move {
            Ok(!owned(name).await?.is_empty())
        })
        .await?;
    }

    // Orphan: the ReplicaSet stays, without its owner.
    let r = expect(hub, &account, 200, json!({"type": "delete", "kind": "deployment", "namespace": ns, "name": "orphan", "propagationPolicy": "Orphan", "wait": true})).await?;
    assert_eq!(r["deleted"][0], format!("Deployment.apps/{ns}/orphan"));
    assert!(s.deployments().get_opt("orphan").await?.is_none());
    until("the orphaned ReplicaSet to lose its owner", || async move {
        let items = owned("orphan").await?;
        Ok(!items.is_empty()
            && items.iter().all(|rs| {
                rs.metadata
                    .owner_references
                    .as_ref()
                    .is_none_or(Vec::is_empty)
            }))
    })
    .await?;

    // Background: the Deployment goes at once, the garbage collector takes the ReplicaSet.
    expect(hub, &account, 200, json!({"type": "delete", "kind": "Deployment", "namespace": ns, "name": "background", "propagationPolicy": "Background"})).await?;
    assert!(s.deployments().get_opt("background").await?.is_none());
    until("the background ReplicaSet to be collected", || async move {
        Ok(owned("background").await?.is_empty())
    })
    .await?;

    // Foreground with wait: when the operation returns, the dependents are gone too.
    let r = expect(hub, &account, 200, json!({"type": "delete", "kind": "Deployment", "namespace": ns, "name": "foreground", "propagationPolicy": "Foreground", "wait": true, "timeoutSeconds": 45})).await?;
    assert_eq!(r["deleted"][0], format!("Deployment.apps/{ns}/foreground"));
    assert!(s.deployments().get_opt("foreground").await?.is_none());
    assert!(owned("foreground").await?.is_empty());

    // A finalizer holds the object; delete with wait returns once the test removes it.
    s.configmaps()
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}),
            )?,
        )
        .await?;
    let (h, a, n) = (hub, account.clone(), ns.clone());
    let started = Instant::now();
    let pending = tokio::spawn(async move {
        op(h, &a, json!({"type": "delete", "kind": "ConfigMap", "namespace": n, "name": "held", "gracePeriodSeconds": 0, "wait": true})).await
    });
    let cms = s.configmaps();
    until("deletionTimestamp on the held configmap", || {
        let cms = cms.clone();
        async move { Ok(cms.get("held").await?.metadata.deletion_timestamp.is_some()) }
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!pending.is_finished(), "the delete waits for the finalizer");
    s.configmaps()
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    let (code, r) = pending.await??;
    assert_eq!(code, 200, "{r:#}");
    assert_eq!(r["deleted"][0], format!("ConfigMap/{ns}/held"));
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(s.configmaps().get_opt("held").await?.is_none());
    assert!(
        cached(hub, &account, &ns, "configmaps", "held")
            .await?
            .is_none(),
        "the hub cache dropped it"
    );

    // A finalizer that stays: the deadline passes, 504 with executed=true.
    s.configmaps()
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "stuck", "finalizers": ["example.com/hold"]}}),
            )?,
        )
        .await?;
    let r = expect(hub, &account, 504, json!({"type": "delete", "kind": "ConfigMap", "namespace": ns, "name": "stuck", "wait": true, "timeoutSeconds": 2})).await?;
    assert_eq!(r["state"], "timedOut");
    assert_eq!(r["executed"], true);
    s.configmaps()
        .patch(
            "stuck",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;

    // By label selector.
    for name in ["sel-a", "sel-b"] {
        s.configmaps()
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": name, "labels": {"group": "sel"}}}),
                )?,
            )
            .await?;
    }
    let r = expect(hub, &account, 200, json!({"type": "delete", "kind": "configmaps", "namespace": ns, "labelSelector": "group=sel", "wait": true})).await?;
    assert_eq!(r["deleted"].as_array().map(Vec::len), Some(2), "{r:#}");
    assert!(
        s.configmaps()
            .list(&ListParams::default().labels("group=sel"))
            .await?
            .items
            .is_empty()
    );

    // Missing: 404, unless ignoreNotFound.
    let r = expect(
        hub,
        &account,
        404,
        json!({"type": "delete", "kind": "ConfigMap", "namespace": ns, "name": "missing"}),
    )
    .await?;
    assert_eq!(r["status"]["reason"], "NotFound");
    expect(hub, &account, 200, json!({"type": "delete", "kind": "ConfigMap", "namespace": ns, "name": "missing", "ignoreNotFound": true})).await?;
    s.stop().await
}
