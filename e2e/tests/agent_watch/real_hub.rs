//! With the real hub: resume after an agent restart, a standby replica taking over.

use super::*;

/// The agent against the real hub (in-process, plaintext): it registers, streams, and after
/// an agent restart resumes from the hub's stored resume points without a LIST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_to_the_real_hub_and_resumes_after_an_agent_restart() -> anyhow::Result<()> {
    let s = setup("real-hub", &["configmaps", "secrets"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        kubeconfig: _,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    create(&configmaps, json!({ "metadata": { "name": "first" } })).await?;

    let hub = start_plaintext_hub(dir).await?;
    let account = account_name("real");
    let config = s.write_config(hub.grpc_addr, &account, &["configmaps", "secrets"])?;
    let agent = start_agent(&config).await?;
    eventually("synced with the real hub", || agent.view().synced()).await?;
    let listed = hub_lists(hub.http_addr, &account, "first").await?;
    assert!(listed.contains("\"first\""), "{listed}");
    assert_eq!(agent.metrics().lists_total(&account, "configmaps"), 1);
    // The agent asked for its keepAliveHeartbeatSeconds (5); the hub's own period is 2 s
    // and its bounds 1..300 s, so it granted the 5 s asked for.
    assert_eq!(agent.view().heartbeat_period_seconds, 5);
    agent.stop().await?;

    // Restart the agent: the hub holds resume points, so nothing is listed again.
    create(&configmaps, json!({ "metadata": { "name": "second" } })).await?;
    let agent = start_agent(&config).await?;
    eventually("synced after the restart", || agent.view().synced()).await?;
    let listed = hub_lists(hub.http_addr, &account, "second").await?;
    assert!(listed.contains("\"second\""), "{listed}");
    assert_eq!(agent.metrics().lists_total(&account, "configmaps"), 0);
    assert_eq!(
        agent.metrics().watch_resumes_total(&account, "configmaps"),
        1
    );
    assert_eq!(agent.metrics().lists_total(&account, "secrets"), 0);
    agent.stop().await?;
    hub.shutdown().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// Two replicas against the real hub: one streams, the other stands by; when the streaming
/// replica stops, the standby is promoted and resumes from the hub's resume points without
/// a LIST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_replica_takes_over_without_relisting() -> anyhow::Result<()> {
    let s = setup("ha", &["configmaps"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        kubeconfig: _,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    create(&configmaps, json!({ "metadata": { "name": "one" } })).await?;

    let hub = start_plaintext_hub(dir).await?;
    let account = account_name("ha");
    let config = s.write_config(hub.grpc_addr, &account, &["configmaps"])?;
    let first = fixtures::start_agent_replica(&config, "replica-a").await?;
    eventually("the first replica streaming", || {
        first.view().synced()
            && first
                .view()
                .account(&account)
                .is_some_and(|a| a.role == "streaming")
    })
    .await?;
    let second = fixtures::start_agent_replica(&config, "replica-b").await?;
    eventually("the second replica on standby", || {
        second
            .view()
            .account(&account)
            .is_some_and(|a| a.role == "standby")
    })
    .await?;
    assert_eq!(second.metrics().lists_total(&account, "configmaps"), 0);

    first.stop().await?;
    create(&configmaps, json!({ "metadata": { "name": "two" } })).await?;
    eventually("the standby promoted", || {
        second
            .view()
            .account(&account)
            .is_some_and(|a| a.role == "streaming")
    })
    .await?;
    let listed = hub_lists(hub.http_addr, &account, "two").await?;
    assert!(listed.contains("\"two\""), "{listed}");
    assert_eq!(second.metrics().lists_total(&account, "configmaps"), 0);
    assert_eq!(
        second.metrics().watch_resumes_total(&account, "configmaps"),
        1
    );
    second.stop().await?;
    hub.shutdown().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}
