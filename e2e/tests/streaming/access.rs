//! Who may stream: other clusters' and untrusted clients are rejected; a namespace Role
//! streams its namespace and reports the kinds it may not read.

use super::*;

/// Test 5: an agent of a second cluster claiming an existing account name is rejected with
/// the reason; agents without a client certificate, or with one from another CA, never
/// connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_cluster_and_untrusted_clients_are_rejected() -> anyhow::Result<()> {
    // The second cluster starts while the first agent gets going.
    let second_cluster = tokio::spawn(ControlPlane::start(ControlPlaneOptions::default()));
    let (control_plane, admin, ns) = cluster("claim").await?;
    let s = setup("claim", &[]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &["configmaps"],
        s.dir.path(),
    )
    .await?;
    create_configmap(&admin, &ns, "first-cluster", json!({})).await?;
    let account = unique("claimed");
    let acc = account.as_str();
    let first_config = s.dir.path().join("first.yaml");
    let account_config = |kubeconfig: &Path, namespace: &str| {
        json!([fixtures::account(
            &account,
            kubeconfig,
            namespace,
            &["configmaps"]
        )])
    };
    write_agent_config(&first_config, &s.hub, account_config(&kubeconfig, &ns))?;
    let first = Agent::start(s.dir.path(), &first_config, "first", &s.tls).await?;
    let hub = &s.hub;
    let ns_ = ns.as_str();
    eventually("the first cluster's ConfigMap in the hub", || async move {
        Ok(hub
            .object(acc, "configmaps", ns_, "first-cluster")
            .await?
            .is_some())
    })
    .await?;

    let second_cluster = second_cluster.await??;
    let second_admin = second_cluster.client().await?;
    let second_ns = second_cluster
        .namespace(&second_admin, "stream-claim")
        .await?;
    let second_kubeconfig = agent_identity(
        &second_cluster,
        &second_admin,
        &second_ns,
        Scope::Cluster,
        &["configmaps"],
        s.dir.path(),
    )
    .await?;
    create_configmap(&second_admin, &second_ns, "second-cluster", json!({})).await?;
    let second_config = s.dir.path().join("second.yaml");
    write_agent_config(
        &second_config,
        &s.hub,
        account_config(&second_kubeconfig, &second_ns),
    )?;
    // The same identity in another cluster (another identity is refused by the account's
    // identity binding first; enrolled_and_token_agents_stream_and_accounts_stay_bound).
    let second_tls = AgentTls {
        ca_file: s.pki.ca_file.clone(),
        client: s.tls.client.clone(),
    };
    let second = Agent::start(s.dir.path(), &second_config, "second", &second_tls).await?;
    let second_ = &second;
    eventually("the second cluster's claim rejected", || async move {
        let view = second_.account(acc).await?.unwrap_or_default();
        Ok(view["role"] == "rejected")
    })
    .await?;
    let view = second.account(acc).await?.unwrap_or_default();
    let reason = view["rejectionReason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(control_plane.server()) && reason.contains(second_cluster.server()),
        "the reason names both clusters: {view}"
    );
    assert_eq!(
        second
            .metric("scale_agent_agent_account_rejected", &[("account", acc)])
            .await?,
        1.0
    );
    // A rejected account is not watched.
    let text = second.metrics().await?;
    assert_eq!(
        metric(&text, "scale_agent_agent_lists_total", &[("account", acc)]),
        0.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "scale_agent_agent_account_streaming",
            &[("account", acc)]
        ),
        0.0
    );
    // The hub still serves the first cluster, and says why it refused.
    let held = hub.account(acc).await?.unwrap_or_default();
    assert_eq!(
        held["cluster"]["apiServerHost"],
        control_plane.server(),
        "{held}"
    );
    assert_eq!(held["streaming"]["replica"], "first", "{held}");
    assert!(
        held["standbys"].as_array().is_none_or(Vec::is_empty),
        "{held}"
    );
    let log = hub.log();
    assert!(
        log.lines()
            .any(|l| l.contains("account rejected") && l.contains(acc)),
        "the hub logs the rejection:\n{log}"
    );
    assert!(
        hub.object(acc, "configmaps", "", "second-cluster")
            .await?
            .is_none()
    );
    assert!(
        hub.object(acc, "configmaps", ns_, "first-cluster")
            .await?
            .is_some()
    );
    assert_eq!(
        first.account(acc).await?.unwrap_or_default()["role"],
        "streaming"
    );

    // No client certificate, or one from another CA: never connected.
    let stranger = Pki::new(s.dir.path(), "stranger")?;
    let untrusted = [
        (
            "no-cert",
            AgentTls {
                ca_file: s.pki.ca_file.clone(),
                client: None,
            },
        ),
        (
            "other-ca",
            AgentTls {
                ca_file: s.pki.ca_file.clone(),
                client: Some(stranger.client("agent-claim")?),
            },
        ),
    ];
    let intruder_config = s.dir.path().join("intruder.yaml");
    let intruder = unique("intruder");
    write_agent_config(
        &intruder_config,
        hub,
        json!([fixtures::account(
            &intruder,
            &kubeconfig,
            &ns,
            &["configmaps"]
        )]),
    )?;
    let mut agents = Vec::new();
    for (replica, tls) in &untrusted {
        agents.push(Agent::start(s.dir.path(), &intruder_config, replica, tls).await?);
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        for agent in &agents {
            let connected = agent.metric("scale_agent_agent_hub_connected", &[]).await?;
            assert_eq!(
                connected,
                0.0,
                "an untrusted agent connected: {}",
                agent.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for agent in &agents {
        let view = agent.view().await?;
        assert_eq!(view["hubConnected"], false, "{view}");
        assert!(
            agent
                .metric("scale_agent_agent_reconnects_total", &[])
                .await?
                >= 1.0,
            "it did try: {view}"
        );
    }
    assert!(hub.account(&intruder).await?.is_none());
    let (_, agents_json) = hub.json("/api/v1/agents").await?;
    let replicas: Vec<&str> = agents_json
        .as_array()
        .map(|a| a.iter().filter_map(|a| a["replica"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        !replicas.contains(&"no-cert") && !replicas.contains(&"other-ca"),
        "{agents_json}"
    );
    drop(second);
    drop(second_cluster);
    Ok(())
}

/// Test 6: a ServiceAccount with a Role in one namespace: the namespace is streamed, and
/// what it may not watch cluster-wide is reported FORBIDDEN with the API server's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_role_streams_its_namespace_and_reports_forbidden_kinds() -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster("role").await?;
    let s = setup("role", &[]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Namespace,
        &["configmaps", "deployments.apps"],
        s.dir.path(),
    )
    .await?;
    create_configmap(&admin, &ns, "visible", json!({ "v": "1" })).await?;
    let scoped = unique("scoped");
    let wide = unique("wide");
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([
            fixtures::account(&scoped, &kubeconfig, &ns, &["configmaps", "deployments.apps"]),
            {
                "name": wide,
                "kubeconfigFile": kubeconfig.display().to_string(),
                "kinds": ["configmaps", "namespaces"],
            },
        ]),
    )?;
    let agent = Agent::start(s.dir.path(), &config, "role-0", &s.tls).await?;
    let hub = &s.hub;
    let (scoped_, wide_) = (scoped.as_str(), wide.as_str());
    hub_equals_api(hub, &admin, scoped_, &ns).await?;
    let kind_state = |view: &Value, plural: &str| -> (String, String) {
        view["kinds"]
            .as_array()
            .and_then(|k| k.iter().find(|k| k["plural"] == plural))
            .map(|k| {
                (
                    k["state"].as_str().unwrap_or_default().to_string(),
                    k["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .unwrap_or_default()
    };
    eventually(
        "FORBIDDEN for the cluster-wide kinds in the hub",
        || async move {
            let view = hub.account(wide_).await?.unwrap_or_default();
            Ok(kind_state(&view, "configmaps").0 == "FORBIDDEN"
                && kind_state(&view, "namespaces").0 == "FORBIDDEN")
        },
    )
    .await?;
    let view = hub.account(wide_).await?.unwrap_or_default();
    let user = format!("system:serviceaccount:{ns}:agent");
    for plural in ["configmaps", "namespaces"] {
        let (_, message) = kind_state(&view, plural);
        assert!(
            message.contains(&user) && message.contains("cannot list") && message.contains(plural),
            "the API server's message for {plural}: {view}"
        );
    }
    assert_eq!(view["objects"], 0, "{view}");
    eventually(
        "both kinds of the namespace WATCHING in the hub",
        || async move {
            let view = hub.account(scoped_).await?.unwrap_or_default();
            Ok(kind_state(&view, "configmaps").0 == "WATCHING"
                && kind_state(&view, "deployments").0 == "WATCHING")
        },
    )
    .await?;
    let scoped_view = hub.account(scoped_).await?.unwrap_or_default();
    assert_eq!(scoped_view["namespaces"], json!([ns]), "{scoped_view}");
    // The agent's own view agrees, and it does not retry in a hot loop.
    let agent_ = &agent;
    eventually("the agent's view to say forbidden", || async move {
        let view = agent_.account(wide_).await?.unwrap_or_default();
        Ok(view["kinds"].as_array().is_some_and(|k| {
            k.len() == 2
                && k.iter()
                    .all(|k| k["state"] == "forbidden" && k["message"].is_string())
        }))
    })
    .await?;
    create_configmap(&admin, &ns, "later", json!({ "v": "1" })).await?;
    hub_equals_api(hub, &admin, scoped_, &ns).await?;
    let text = agent.metrics().await?;
    assert_eq!(
        metric(
            &text,
            "scale_agent_agent_lists_total",
            &[("account", wide_), ("kind", "namespaces")]
        ),
        1.0,
        "{text}"
    );
    Ok(())
}
