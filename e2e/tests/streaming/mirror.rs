//! The hub mirrors the cluster: creates, updates and deletes.

use super::*;

/// Test 1: creates, updates and deletes of a Deployment, a ConfigMap and a custom resource
/// reach the hub's HTTP API, with a cluster-wide watch under a ClusterRole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_reflects_creates_updates_and_deletes() -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster("crud").await?;
    let gadget_resource = install_gadget_crd(&admin).await?;
    let s = setup("crud", &[]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &[
            "configmaps",
            "deployments.apps",
            &format!("gadgets.{GADGET_GROUP}"),
        ],
        s.dir.path(),
    )
    .await?;
    let account = unique("crud");
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([{
            "name": account,
            "kubeconfigFile": kubeconfig.display().to_string(),
            "kinds": ["configmaps", "deployments.apps"],
            "customResourceDefinitions": [{ "kind": format!("Gadget.{GADGET_GROUP}") }],
        }]),
    )?;
    let agent = Agent::start(s.dir.path(), &config, "crud-0", &s.tls).await?;
    eventually("the agent ready", || agent.ready()).await?;
    let hub = &s.hub;

    // Create.
    let pp = PostParams::default();
    let deployments = Api::<Deployment>::namespaced(admin.clone(), &ns);
    deployments
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": "web", "labels": { "app": "web" } },
                "spec": {
                    "replicas": 1,
                    "selector": { "matchLabels": { "app": "web" } },
                    "template": {
                        "metadata": { "labels": { "app": "web" } },
                        "spec": { "containers": [{ "name": "web", "image": "nginx:1.27" }] },
                    },
                },
            }))?,
        )
        .await?;
    create_configmap(&admin, &ns, "settings", json!({ "level": "one" })).await?;
    let gadgets = Api::<DynamicObject>::namespaced_with(admin.clone(), &ns, &gadget_resource);
    gadgets
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": format!("{GADGET_GROUP}/v1"), "kind": "Gadget",
                "metadata": { "name": "gear" }, "spec": { "teeth": 12 },
            }))?,
        )
        .await?;
    let acc = account.as_str();
    let ns_ = ns.as_str();
    eventually("the three creates in the hub", || async move {
        let d = hub.object(acc, "deployments", ns_, "web").await?;
        let c = hub.object(acc, "configmaps", ns_, "settings").await?;
        let g = hub.object(acc, "gadgets", ns_, "gear").await?;
        Ok(d.is_some_and(|d| d["spec"]["replicas"] == 1)
            && c.is_some_and(|c| c["data"]["level"] == "one")
            && g.is_some_and(|g| {
                g["spec"]["teeth"] == 12 && g["apiVersion"] == format!("{GADGET_GROUP}/v1")
            }))
    })
    .await?;
    // Objects keep their managedFields (the API server's object), and the group-qualified
    // and kind spellings of the API work too.
    let web = hub.object(acc, "apps/deployments", ns_, "web").await?;
    let web = web.ok_or_else(|| anyhow::anyhow!("no apps/deployments web"))?;
    assert!(
        web["metadata"]["managedFields"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "{web}"
    );
    assert_eq!(hub.objects(acc, "Gadget", ns_).await?.len(), 1);

    // Update.
    let params = PatchParams::default();
    deployments
        .patch("web", &params, &merge(json!({ "spec": { "replicas": 3 } })))
        .await?;
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .patch(
            "settings",
            &params,
            &merge(json!({ "data": { "level": "two" } })),
        )
        .await?;
    gadgets
        .patch("gear", &params, &merge(json!({ "spec": { "teeth": 24 } })))
        .await?;
    eventually("the three updates in the hub", || async move {
        let d = hub.object(acc, "deployments", ns_, "web").await?;
        let c = hub.object(acc, "configmaps", ns_, "settings").await?;
        let g = hub.object(acc, "gadgets", ns_, "gear").await?;
        Ok(d.is_some_and(|d| d["spec"]["replicas"] == 3)
            && c.is_some_and(|c| c["data"]["level"] == "two")
            && g.is_some_and(|g| g["spec"]["teeth"] == 24))
    })
    .await?;
    // The cache holds what the API server holds, resourceVersion included.
    let api_web = deployments.get("web").await?;
    let cached_web = hub
        .object(acc, "deployments", ns_, "web")
        .await?
        .unwrap_or_default();
    assert_eq!(
        cached_web["metadata"]["resourceVersion"].as_str(),
        api_web.metadata.resource_version.as_deref()
    );

    // Delete.
    let dp = DeleteParams::default();
    deployments.delete("web", &dp).await?;
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .delete("settings", &dp)
        .await?;
    gadgets.delete("gear", &dp).await?;
    eventually("the three deletes in the hub", || async move {
        Ok(hub.object(acc, "deployments", ns_, "web").await?.is_none()
            && hub
                .object(acc, "configmaps", ns_, "settings")
                .await?
                .is_none()
            && hub.object(acc, "gadgets", ns_, "gear").await?.is_none())
    })
    .await?;
    let view = hub.account(acc).await?.unwrap_or_default();
    assert_eq!(view["state"], "connected", "{view}");
    assert_eq!(view["streaming"]["replica"], "crud-0", "{view}");
    assert_eq!(view["streaming"]["identity"], "agent-crud", "{view}");
    drop(agent);
    Ok(())
}
