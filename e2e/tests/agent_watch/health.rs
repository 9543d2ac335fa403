//! Readiness, a silent hub, oversized objects, clock skew, kinds discovered later.

use super::*;

/// A hub outage must not turn every agent in the fleet NotReady: `/readyz` says whether the
/// agent itself works (its account's credentials load and its API server answers), and the
/// hub connection shows on `/accounts` and in `scale_agent_agent_hub_connected`, before the
/// first connection and after the hub went away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_does_not_depend_on_the_hub() -> anyhow::Result<()> {
    let s = setup("readyz-no-hub", &["configmaps"]).await?;
    // Nothing listens here.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let account = account_name("no-hub");
    let config = s.write_config(nobody, &account, &["configmaps"])?;
    let agent = start_agent(&config).await?;
    eventually("the account's credentials loaded", || {
        agent.view().account(&account).is_some_and(|a| a.prepared)
    })
    .await?;
    let ready = http_get(agent.admin_addr(), "/readyz").await?;
    assert_eq!(ready.status, 200, "never reached the hub: {ready:?}");
    assert!(ready.body.contains("not connected to the hub"), "{ready:?}");
    let view = http_get(agent.admin_addr(), "/accounts")
        .await?
        .json_or_null();
    assert_eq!(view["hubConnected"], false, "{view}");
    assert_eq!(view["synced"], false, "{view}");
    assert!(
        agent
            .metrics_text()
            .contains("scale_agent_agent_hub_connected 0"),
        "{}",
        agent.metrics_text()
    );

    // The hub appears: synced, still ready.
    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    s.write_config(hub_addr, &account, &["configmaps"])?;
    eventually("synced with the hub", || agent.view().synced()).await?;
    assert_eq!(http_get(agent.admin_addr(), "/readyz").await?.body, "ready");
    assert!(
        agent
            .metrics_text()
            .contains("scale_agent_agent_hub_connected 1")
    );

    // The hub goes away (the config points elsewhere): disconnected, still ready.
    s.write_config(nobody, &account, &["configmaps"])?;
    eventually("disconnected", || !agent.view().hub_connected).await?;
    let ready = http_get(agent.admin_addr(), "/readyz").await?;
    assert_eq!(ready.status, 200, "the hub went away: {ready:?}");
    assert!(!agent.view().synced());

    // What does make it unready: an account whose credentials cannot load.
    let broken = s.dir.join("broken.yaml");
    write_config(
        &broken,
        nobody,
        json!([fixtures::account(
            &account,
            &s.dir.join("no-such-kubeconfig"),
            &s.namespace,
            &["configmaps"]
        )]),
    )?;
    std::fs::rename(&broken, &config)?;
    eventually("the broken account's error", || {
        agent
            .view()
            .account(&account)
            .is_some_and(|a| !a.prepared && a.error.is_some())
    })
    .await?;
    let ready = http_get(agent.admin_addr(), "/readyz").await?;
    assert_eq!(ready.status, 503, "{ready:?}");
    assert!(ready.body.contains(&account), "{ready:?}");
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&s.dir);
    Ok(())
}

/// One unreachable target cluster must not make an agent serving many accounts NotReady:
/// with one account's API server unreachable and another's working, `/readyz` answers 200
/// naming the failing account, the working one streams to the hub, and the failing one is
/// reported on `/accounts` (its error) and in `scale_agent_agent_account_ready`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_while_one_account_of_two_works() -> anyhow::Result<()> {
    let s = setup("readyz-one-of-two", &["configmaps"]).await?;
    // The same identity, but a server where nothing listens.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let unreachable = s.dir.join("unreachable-kubeconfig");
    let text = std::fs::read_to_string(&s.kubeconfig)?;
    let rewritten: String = text
        .lines()
        .map(|line| match line.split_once("server:") {
            Some((indent, _)) => format!("{indent}server: https://{nobody}"),
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_ne!(
        rewritten,
        text,
        "no server line in {}",
        s.kubeconfig.display()
    );
    std::fs::write(&unreachable, rewritten)?;

    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let good = account_name("works");
    let bad = account_name("unreachable");
    let config = s.dir.join("scale-agent.yaml");
    write_config(
        &config,
        hub_addr,
        json!([
            fixtures::account(&good, &s.kubeconfig, &s.namespace, &["configmaps"]),
            fixtures::account(&bad, &unreachable, &s.namespace, &["configmaps"]),
        ]),
    )?;
    let agent = start_agent(&config).await?;
    eventually("the working account streaming, the other failing", || {
        let view = agent.view();
        view.account(&good)
            .is_some_and(|a| a.role == "streaming" && a.kinds_started)
            && view.account(&bad).is_some_and(|a| a.failing())
    })
    .await?;

    let ready = http_get(agent.admin_addr(), "/readyz").await?;
    assert_eq!(ready.status, 200, "one account works: {ready:?}");
    assert!(
        ready.body.contains(&bad),
        "the failing account named: {ready:?}"
    );
    assert!(!ready.body.contains(&good), "{ready:?}");

    let view = http_get(agent.admin_addr(), "/accounts")
        .await?
        .json_or_null();
    let accounts = view["accounts"].as_array().cloned().unwrap_or_default();
    let bad_view = accounts
        .iter()
        .find(|a| a["name"] == bad.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(bad_view["prepared"], false, "{view}");
    assert_eq!(bad_view["role"], "pending", "{view}");
    assert!(
        bad_view["error"]
            .as_str()
            .is_some_and(|e| e.contains(&nobody.port().to_string())),
        "the error names the unreachable server: {view}"
    );
    let good_view = accounts
        .iter()
        .find(|a| a["name"] == good.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(good_view["prepared"], true, "{view}");
    assert_eq!(good_view["role"], "streaming", "{view}");

    let metrics = http_get(agent.admin_addr(), "/metrics").await?.body;
    assert!(
        metrics.contains(&format!(
            "scale_agent_agent_account_ready{{account=\"{bad}\"}} 0"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "scale_agent_agent_account_ready{{account=\"{good}\"}} 1"
        )),
        "{metrics}"
    );
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&s.dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_hub_is_dropped_after_two_heartbeat_periods() -> anyhow::Result<()> {
    init_logs();
    let dir = temp_dir("silent")?;
    let hub = Arc::new(HubState::default());
    hub.heartbeat_seconds.store(1, Ordering::SeqCst);
    hub.silent.store(true, Ordering::SeqCst);
    let hub_addr = start_hub(hub.clone()).await?;
    let config = dir.join("scale-agent.yaml");
    write_config(&config, hub_addr, json!([]))?;
    let started = Instant::now();
    let agent = start_agent(&config).await?;
    eventually("a reconnect after the hub went silent", || {
        hub.sessions.load(Ordering::SeqCst) >= 2
    })
    .await?;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "dropped before two periods: {:?}",
        started.elapsed()
    );
    assert!(agent.metrics().reconnects.get() >= 1);
    // The agent kept heartbeating while it waited.
    assert!(
        hub.kinds()
            .iter()
            .any(|k| matches!(k, agent_message::Kind::Heartbeat(_)))
    );
    let hello = hub.kinds().into_iter().find_map(|k| match k {
        agent_message::Kind::Hello(hello) => Some(hello),
        _ => None,
    });
    let hello = hello.ok_or_else(|| anyhow::anyhow!("no Hello"))?;
    assert_eq!(hello.replica, "e2e-0");
    // It asked for its keepAliveHeartbeatSeconds (5), and used the 1 s the hub granted.
    assert_eq!(hello.heartbeat_period_seconds, 5);
    assert_eq!(agent.view().heartbeat_period_seconds, 1);
    assert!(!hello.agent_version.is_empty());
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_objects_are_sent_truncated() -> anyhow::Result<()> {
    let s = setup("big", &["configmaps"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    create(
        &configmaps,
        json!({ "metadata": { "name": "big" }, "data": { "blob": "x".repeat(20_000) } }),
    )
    .await?;
    create(&configmaps, json!({ "metadata": { "name": "small" } })).await?;
    let hub = Arc::new(HubState::default());
    hub.max_object_bytes.store(10_000, Ordering::SeqCst);
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("big");
    let config = s.write_config(hub_addr, &account, &["configmaps"])?;
    let agent = start_agent(&config).await?;
    eventually("the snapshot", || {
        hub.snapshot_ends(&account, "configmaps") == 1
    })
    .await?;
    let objects = hub.objects(&account, "configmaps");
    let big = objects.iter().find(|o| o.name == "big");
    let big = big.ok_or_else(|| anyhow::anyhow!("no event for 'big'"))?;
    assert!(big.truncated);
    assert!(big.object_json.is_empty());
    assert!(!big.uid.is_empty() && !big.resource_version.is_empty());
    let small = objects.iter().find(|o| o.name == "small");
    assert!(small.is_some_and(|o| !o.truncated && !o.object_json.is_empty()));
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// An operation whose absolute deadline has already passed by the agent's clock (a hub
/// whose clock is a minute behind) but whose relative timeout leaves time: it runs. Before
/// `timeout_millis`, clock skew alone made it a 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_timeout_makes_operations_immune_to_clock_skew() -> anyhow::Result<()> {
    let s = setup("skew", &["configmaps"]).await?;
    let configmaps = Api::<ConfigMap>::namespaced(s.admin.clone(), &s.namespace);
    create(&configmaps, json!({ "metadata": { "name": "skewed" } })).await?;
    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("skew");
    let config = s.write_config(hub_addr, &account, &["configmaps"])?;
    let agent = start_agent(&config).await?;
    eventually("the snapshot", || {
        hub.snapshot_ends(&account, "configmaps") == 1
    })
    .await?;
    let minute_ago = k8s_openapi::jiff::Timestamp::now().as_millisecond() - 60_000;
    let get = |id: &str, timeout_millis: u64| Operation {
        id: id.into(),
        account: account.clone(),
        deadline_unix_millis: minute_ago,
        timeout_millis,
        op: Some(scale_agent_proto::v1::operation::Op::Get(GetOp {
            target: Some(ObjectRef {
                kind: Some(KindSelector {
                    kind: "ConfigMap".into(),
                    ..Default::default()
                }),
                namespace: s.namespace.clone(),
                name: "skewed".into(),
            }),
        })),
        ..Default::default()
    };
    if let Ok(mut operations) = hub.operations.lock() {
        operations.push(get("skewed", 30_000));
        // An older hub's operation (no relative timeout): the absolute deadline still rules,
        // and an operation with no time left is not started.
        operations.push(get("late", 0));
    }
    hub.operate.notify_one();
    let result = |id: &'static str| {
        hub.messages().into_iter().find_map(|m| match m.kind {
            Some(agent_message::Kind::OperationResult(r)) if r.id == id => Some(r),
            _ => None,
        })
    };
    eventually("both results", || {
        result("skewed").is_some() && result("late").is_some()
    })
    .await?;
    let skewed = result("skewed").ok_or_else(|| anyhow::anyhow!("no result"))?;
    let status = skewed.status.clone().unwrap_or_default();
    assert!(skewed.ok, "{status:?}");
    assert_eq!(status.code, 200);
    assert_eq!(skewed.objects_json.len(), 1);
    let late = result("late").ok_or_else(|| anyhow::anyhow!("no result"))?;
    let status = late.status.clone().unwrap_or_default();
    assert_eq!(status.code, 504, "{status:?}");
    assert!(
        !late.executed,
        "an operation with no time left is not started"
    );
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&s.dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_resource_installed_later_is_discovered() -> anyhow::Result<()> {
    let s = setup("crd", &["configmaps", "widgets.agenttest.scaleagent.dev"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        kubeconfig,
        ..
    } = &s;
    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("crd");
    let config = dir.join("scale-agent.yaml");
    write_config(
        &config,
        hub_addr,
        json!([{
            "name": account,
            "kubeconfigFile": kubeconfig.display().to_string(),
            "namespaces": [namespace],
            "kinds": ["configmaps"],
            "customResourceDefinitions": [{ "kind": "Widget.agenttest.scaleagent.dev" }],
        }]),
    )?;
    let mut options = Options::for_config(&config);
    options.admin_addr = Some("127.0.0.1:0".parse()?);
    options.rediscover_seconds = 1;
    let agent = scale_agent::start(options).await?;
    eventually("the ConfigMap snapshot", || {
        hub.snapshot_ends(&account, "configmaps") == 1
    })
    .await?;
    assert_eq!(hub.snapshot_ends(&account, "widgets"), 0);

    let crd =
        scale_agent_e2e::crds::schemaless_crd("agenttest.scaleagent.dev", "Widget", "widgets");
    scale_agent_e2e::crds::install(admin, &[crd]).await?;
    let widgets = Api::<kube::api::DynamicObject>::namespaced_with(
        admin.clone(),
        namespace,
        &kube::discovery::ApiResource {
            group: "agenttest.scaleagent.dev".into(),
            version: "v1".into(),
            api_version: "agenttest.scaleagent.dev/v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        },
    );
    let widget: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "agenttest.scaleagent.dev/v1",
        "kind": "Widget",
        "metadata": { "name": "gear" },
        "spec": { "teeth": 12 },
    }))?;
    widgets.create(&PostParams::default(), &widget).await?;
    eventually("the Widget, after rediscovery", || {
        hub.has_object(&account, "widgets", "gear", object_event::Type::Applied)
    })
    .await?;
    let gear = hub
        .objects(&account, "widgets")
        .into_iter()
        .find(|o| o.name == "gear");
    let gear = gear.ok_or_else(|| anyhow::anyhow!("no event for 'gear'"))?;
    let body: serde_json::Value = serde_json::from_slice(&gear.object_json)?;
    assert_eq!(body["apiVersion"], "agenttest.scaleagent.dev/v1");
    assert_eq!(body["spec"]["teeth"], 12);
    // The ConfigMap watch was not restarted by rediscovery.
    assert_eq!(agent.metrics().lists_total(&account, "configmaps"), 1);
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}
