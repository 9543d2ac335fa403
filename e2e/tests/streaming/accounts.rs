//! A removed account stops, and the hub drops it after the grace period; the initial sync of
//! many ConfigMaps.

use super::*;

/// Test 7: an account removed from the config file stops being watched at once, and the hub
/// forgets it when the (shortened) grace period ends (ACTIVE, INACTIVE, ORPHANED); put back
/// in the config, it is ACTIVE again with its cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_account_stops_and_the_hub_drops_it_after_the_grace_period() -> anyhow::Result<()> {
    const GRACE: Duration = Duration::from_secs(3);
    let (control_plane, admin, ns) = cluster("remove").await?;
    let s = setup("remove", &["--grace-period=3s"]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &["configmaps"],
        s.dir.path(),
    )
    .await?;
    create_configmap(&admin, &ns, "kept", json!({})).await?;
    let (keep, remove) = (unique("keep"), unique("remove"));
    let account = |name: &str| fixtures::account(name, &kubeconfig, &ns, &["configmaps"]);
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(&config, &s.hub, json!([account(&keep), account(&remove)]))?;
    let agent = Agent::start(s.dir.path(), &config, "remove-0", &s.tls).await?;
    let hub = &s.hub;
    hub_equals_api(hub, &admin, &keep, &ns).await?;
    hub_equals_api(hub, &admin, &remove, &ns).await?;
    let watching = |text: &str, account: &str| {
        metric(
            text,
            "scale_agent_agent_watches",
            &[("account", account), ("state", "watching")],
        )
    };
    let (agent_, remove_) = (&agent, remove.as_str());
    eventually("the account's watch running", || async move {
        Ok(watching(&agent_.metrics().await?, remove_) == 1.0)
    })
    .await?;

    write_agent_config(&config, &s.hub, json!([account(&keep)]))?;
    eventually("the agent to drop the account", || async move {
        Ok(agent_.account(remove_).await?.is_none())
    })
    .await?;
    let dropped_at = Instant::now();
    let text = agent.metrics().await?;
    assert_eq!(
        watching(&text, remove_),
        0.0,
        "its watches stopped:\n{text}"
    );
    assert_eq!(watching(&text, &keep), 1.0, "{text}");
    let events = |text: &str| {
        metric(
            text,
            "scale_agent_agent_events_sent_total",
            &[("account", remove_)],
        )
    };
    let events_at_removal = events(&text);
    // Within the grace period the hub keeps it, without an agent.
    let mut last = Value::Null;
    while dropped_at.elapsed() < GRACE - Duration::from_secs(1) {
        match hub.account(remove_).await? {
            Some(view) if view["state"] == "disconnected" => {
                last = view;
                break;
            }
            Some(view) => last = view,
            None => anyhow::bail!("dropped at once, not after the grace period: {last}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !last.is_null() {
        assert_eq!(last["state"], "disconnected", "{last}");
        assert!(last["streaming"].is_null(), "{last}");
        assert!(last["disconnectedSince"].is_string(), "{last}");
    }
    // Dropped: no cache, no replicas; listed as ORPHANED (bound to its identity) until its
    // agent registers it again.
    eventually("the hub to drop the account (ORPHANED)", || async move {
        Ok(hub
            .account(remove_)
            .await?
            .is_some_and(|a| a["accountState"] == "ORPHANED" && a["objects"] == 0))
    })
    .await?;
    let gone_after = dropped_at.elapsed();
    assert!(
        gone_after + Duration::from_secs(1) >= GRACE,
        "dropped before the grace period: {gone_after:?}"
    );
    let (status, _) = hub
        .json(&format!(
            "/api/v1/accounts/{remove_}/objects?kind=configmaps"
        ))
        .await?;
    assert_eq!(status, 404);
    // The other account goes on; the removed one's watch saw nothing more.
    create_configmap(&admin, &ns, "after", json!({})).await?;
    hub_equals_api(hub, &admin, &keep, &ns).await?;
    assert_eq!(events(&agent.metrics().await?), events_at_removal);
    assert!(hub.log().contains("no agent within the grace period"));

    // And back: the account in the agent's config again is ACTIVE, its cache filled again.
    write_agent_config(&config, &s.hub, json!([account(&keep), account(&remove)]))?;
    eventually("the account to be ACTIVE again", || async move {
        Ok(hub
            .account(remove_)
            .await?
            .is_some_and(|a| a["accountState"] == "ACTIVE"))
    })
    .await?;
    hub_equals_api(hub, &admin, &remove, &ns).await?;
    Ok(())
}

/// Measures the initial sync of many small ConfigMaps created before the agent starts: from
/// the agent process's start to the hub holding all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_sync_of_many_configmaps() -> anyhow::Result<()> {
    const COUNT: usize = 2000;
    let (control_plane, admin, ns) = cluster("sync").await?;
    let s = setup("sync", &[]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &["configmaps"],
        s.dir.path(),
    )
    .await?;
    let created = Instant::now();
    futures::stream::iter(0..COUNT)
        .map(|i| {
            let admin = &admin;
            let ns = &ns;
            async move {
                create_configmap(
                    admin,
                    ns,
                    &format!("cm-{i:05}"),
                    json!({ "i": i.to_string() }),
                )
                .await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    eprintln!(
        "[streaming] created {COUNT} ConfigMaps in {:.2} s",
        created.elapsed().as_secs_f64()
    );
    let account = unique("sync");
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([fixtures::account(
            &account,
            &kubeconfig,
            &ns,
            &["configmaps"]
        )]),
    )?;
    let started = Instant::now();
    let agent = Agent::start(s.dir.path(), &config, "sync-0", &s.tls).await?;
    let hub = &s.hub;
    let acc = account.as_str();
    eventually("all ConfigMaps in the hub", || async move {
        let view = hub.account(acc).await?.unwrap_or_default();
        Ok(view["objects"].as_u64() == Some(COUNT as u64))
    })
    .await?;
    let synced = started.elapsed();
    eprintln!(
        "[streaming] initial sync of {COUNT} ConfigMaps: {:.2} s from agent process start to the hub holding all",
        synced.as_secs_f64()
    );
    hub_equals_api(hub, &admin, acc, &ns).await?;
    let text = agent.metrics().await?;
    assert_eq!(
        metric(
            &text,
            "scale_agent_agent_lists_total",
            &[("account", acc), ("kind", "configmaps")]
        ),
        1.0
    );
    Ok(())
}
