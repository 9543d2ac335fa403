//! A namespace Role: its namespace streamed, forbidden kinds reported, the config reloaded.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_role_streams_its_namespace_reports_forbidden_and_reloads() -> anyhow::Result<()>
{
    let s = setup("rbac", &["configmaps"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        kubeconfig,
        ..
    } = &s;
    create(
        &Api::<ConfigMap>::namespaced(admin.clone(), namespace),
        json!({ "metadata": { "name": "visible" } }),
    )
    .await?;

    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let scoped = account_name("scoped");
    let wide = account_name("wide");
    let scoped_account = fixtures::account(&scoped, kubeconfig, namespace, &["ConfigMap"]);
    let wide_account = json!({
        "name": wide,
        "kubeconfigFile": kubeconfig.display().to_string(),
        "kinds": ["ConfigMap", "Namespace"],
    });
    let config = dir.join("scale-agent.yaml");
    write_config(&config, hub_addr, json!([scoped_account, wide_account]))?;
    let agent = start_agent(&config).await?;

    eventually("the namespace's snapshot", || {
        hub.has_object(
            &scoped,
            "configmaps",
            "visible",
            object_event::Type::Applied,
        ) && hub.snapshot_ends(&scoped, "configmaps") == 1
    })
    .await?;
    eventually("FORBIDDEN for the cluster-wide kinds", || {
        hub.kind_status(&wide, "configmaps", kind_status::State::Forbidden)
            .is_some()
            && hub
                .kind_status(&wide, "namespaces", kind_status::State::Forbidden)
                .is_some()
    })
    .await?;
    let message = hub
        .kind_status(&wide, "namespaces", kind_status::State::Forbidden)
        .unwrap_or_default();
    assert!(
        message.contains(&format!("system:serviceaccount:{namespace}:agent")),
        "the API server's message names the ServiceAccount: {message}"
    );
    let view = agent.view();
    let forbidden = view
        .kind(&wide, "namespaces", "")
        .map(|k| format!("{:?}", k.state))
        .unwrap_or_default();
    assert_eq!(forbidden, "Forbidden");
    eventually("synced with forbidden kinds", || agent.view().synced()).await?;

    // Forbidden kinds are not retried in a hot loop.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(agent.metrics().lists_total(&wide, "configmaps"), 1);
    assert_eq!(agent.metrics().lists_total(&wide, "namespaces"), 1);

    // An invalid file is refused and the running config stays.
    std::fs::write(&config, "kubernetes: [")?;
    eventually("the invalid config to be noticed", || {
        agent.metrics().config_errors.get() >= 1
    })
    .await?;
    assert!(agent.view().account(&wide).is_some());
    assert!(agent.view().hub_connected);

    // Hot reload: removing an account unregisters it, adding one registers it.
    let added = account_name("added");
    let added_account = fixtures::account(&added, kubeconfig, namespace, &["configmaps"]);
    write_config(&config, hub_addr, json!([scoped_account, added_account]))?;
    eventually("UnregisterAccount for the removed account", || {
        hub.kinds()
            .iter()
            .any(|k| matches!(k, agent_message::Kind::UnregisterAccount(u) if u.account == wide))
    })
    .await?;
    eventually("the added account's snapshot", || {
        hub.has_object(&added, "configmaps", "visible", object_event::Type::Applied)
    })
    .await?;
    assert!(agent.view().account(&wide).is_none());
    // The unchanged account kept streaming without a relist.
    assert_eq!(agent.metrics().lists_total(&scoped, "configmaps"), 1);

    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}
