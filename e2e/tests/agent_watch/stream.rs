//! The stream: reconnects without relisting, the unacked bound, accounts the hub rejects or
//! holds on standby, older hubs, mutual TLS reloaded on reconnect.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_stream_reconnects_and_resumes_without_relisting() -> anyhow::Result<()> {
    let s = setup("reconnect", &["configmaps"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    create(
        &configmaps,
        json!({ "metadata": { "name": "a" }, "data": { "v": "1" } }),
    )
    .await?;

    let hub = Arc::new(HubState::default());
    hub.learn_resume_points.store(true, Ordering::SeqCst);
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("reconnect");
    let config = s.write_config(hub_addr, &account, &["configmaps"])?;
    let agent = start_agent(&config).await?;
    eventually("the first snapshot", || {
        hub.snapshot_ends(&account, "configmaps") == 1
    })
    .await?;

    // The hub drops the stream; a change made meanwhile must still arrive, from a watch
    // resumed at the hub's resume point, without a second LIST.
    hub.disconnect.notify_one();
    configmaps
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "v": "2" } })),
        )
        .await?;
    eventually("a second stream", || {
        hub.sessions.load(Ordering::SeqCst) >= 2
    })
    .await?;
    eventually("the change made while disconnected", || {
        hub.objects(&account, "configmaps").iter().any(|o| {
            o.name == "a"
                && serde_json::from_slice::<serde_json::Value>(&o.object_json)
                    .is_ok_and(|v| v["data"]["v"] == "2")
        })
    })
    .await?;
    create(&configmaps, json!({ "metadata": { "name": "b" } })).await?;
    eventually("a change after the reconnect", || {
        hub.has_object(&account, "configmaps", "b", object_event::Type::Applied)
    })
    .await?;
    let metrics = agent.metrics();
    assert_eq!(metrics.lists_total(&account, "configmaps"), 1);
    assert_eq!(metrics.watch_resumes_total(&account, "configmaps"), 1);
    assert_eq!(hub.snapshot_begins(&account, "configmaps"), 1);
    assert!(metrics.reconnects.get() >= 1);
    // Sequence numbers restart at 1 on every stream.
    let hellos: Vec<u64> = hub
        .messages()
        .iter()
        .filter(|m| matches!(m.kind, Some(agent_message::Kind::Hello(_))))
        .map(|m| m.seq)
        .collect();
    assert_eq!(hellos, [1, 1]);
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_that_does_not_ack_stops_the_watches_at_max_unacked() -> anyhow::Result<()> {
    let s = setup("flow", &["configmaps"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    let count = 40;
    for i in 0..count {
        create(
            &configmaps,
            json!({ "metadata": { "name": format!("cm-{i}") } }),
        )
        .await?;
    }
    let hub = Arc::new(HubState::default());
    hub.acks_paused.store(true, Ordering::SeqCst);
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("flow");
    let config = s.write_config(hub_addr, &account, &["configmaps"])?;
    let agent = start_agent(&config).await?;
    let non_heartbeats = || {
        hub.messages()
            .iter()
            .filter(|m| !matches!(m.kind, Some(agent_message::Kind::Heartbeat(_))))
            .count()
    };
    eventually("the window to fill", || {
        non_heartbeats() >= MAX_UNACKED as usize
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let summary: Vec<String> = hub
        .messages()
        .iter()
        .map(|m| {
            let kind = format!("{:?}", m.kind);
            format!("{}:{}", m.seq, kind.chars().take(40).collect::<String>())
        })
        .collect();
    assert!(
        non_heartbeats() <= MAX_UNACKED as usize,
        "{} messages sent with {MAX_UNACKED} allowed unacknowledged: {summary:#?}",
        non_heartbeats()
    );
    assert_eq!(hub.snapshot_ends(&account, "configmaps"), 0);

    hub.acks_paused.store(false, Ordering::SeqCst);
    hub.release.notify_one();
    eventually("the whole snapshot once acks flow", || {
        hub.snapshot_ends(&account, "configmaps") == 1
    })
    .await?;
    let objects = hub.objects(&account, "configmaps").len();
    assert_eq!(objects, count, "every ConfigMap, once");
    // Sequence numbers have no gaps.
    let seqs: Vec<u64> = hub.messages().iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_and_standby_accounts_are_not_streamed() -> anyhow::Result<()> {
    let s = setup("roles", &["configmaps"]).await?;
    let Setup {
        control_plane,
        namespace,
        dir,
        kubeconfig,
        ..
    } = &s;
    let hub = Arc::new(HubState::default());
    let rejected = account_name("rejected");
    let standby = account_name("standby");
    if let Ok(mut roles) = hub.roles.lock() {
        roles.insert(
            rejected.clone(),
            (AssignmentRole::Rejected, "bound to another cluster".into()),
        );
        roles.insert(standby.clone(), (AssignmentRole::Standby, String::new()));
    }
    let hub_addr = start_hub(hub.clone()).await?;
    let config = dir.join("scale-agent.yaml");
    let watching_configmaps =
        |name: &str| fixtures::account(name, kubeconfig, namespace, &["configmaps"]);
    write_config(
        &config,
        hub_addr,
        json!([
            watching_configmaps(&rejected),
            watching_configmaps(&standby)
        ]),
    )?;
    let agent = start_agent(&config).await?;
    eventually("both assignments", || {
        let view = agent.view();
        view.account(&rejected)
            .is_some_and(|a| a.role == "rejected")
            && view.account(&standby).is_some_and(|a| a.role == "standby")
    })
    .await?;
    let view = agent.view();
    let register = hub.kinds().into_iter().find_map(|k| match k {
        agent_message::Kind::RegisterAccount(r) if r.account == rejected => Some(r),
        _ => None,
    });
    let register = register.ok_or_else(|| anyhow::anyhow!("no RegisterAccount"))?;
    let cluster = register.cluster.unwrap_or_default();
    assert_eq!(cluster.api_server_host, control_plane.server());
    assert_eq!(cluster.ca_fingerprint.len(), 64);
    assert_eq!(
        cluster.kubernetes_version,
        scale_agent_e2e::KUBERNETES_VERSION
    );
    assert_eq!(register.namespaces, [namespace.as_str()]);
    assert_eq!(
        view.account(&rejected)
            .and_then(|a| a.rejection_reason.clone())
            .as_deref(),
        Some("bound to another cluster")
    );
    assert!(
        view.ready() && view.synced(),
        "rejected and standby accounts do not block readiness"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(hub.streamed_about(&rejected), 0);
    assert_eq!(hub.streamed_about(&standby), 0);
    assert_eq!(agent.metrics().lists_total(&standby, "configmaps"), 0);
    let metrics = agent.metrics().encode();
    assert!(
        metrics.contains(&format!(
            "scale_agent_agent_account_rejected{{account=\"{rejected}\"}} 1"
        )),
        "{metrics}"
    );
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// A hub that does not announce the "account-unavailable" capability (an older hub, which
/// would end the stream on a message it cannot read) is never sent AccountUnavailable: an
/// account whose kubeconfig cannot be loaded stays in the agent's view only, and the stream,
/// with the good account on it, goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_hub_is_not_sent_account_unavailable() -> anyhow::Result<()> {
    let s = setup("older-hub", &["configmaps"]).await?;
    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let (good, broken) = (account_name("good"), account_name("broken"));
    let config = s.dir.join("scale-agent.yaml");
    write_config(
        &config,
        hub_addr,
        json!([
            fixtures::account(&good, &s.kubeconfig, &s.namespace, &["configmaps"]),
            fixtures::account(
                &broken,
                &s.dir.join("no-such-kubeconfig"),
                &s.namespace,
                &["configmaps"]
            ),
        ]),
    )?;
    let agent = start_agent(&config).await?;
    eventually("the good account streaming, the broken one failing", || {
        let view = agent.view();
        view.account(&good).is_some_and(|a| a.role == "streaming")
            && view.account(&broken).is_some_and(|a| a.error.is_some())
    })
    .await?;
    // A retry or two of the broken account.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kinds = hub.kinds();
    assert!(
        !kinds
            .iter()
            .any(|k| matches!(k, agent_message::Kind::AccountUnavailable(_))),
        "AccountUnavailable sent to a hub that does not read it"
    );
    let hellos = kinds
        .iter()
        .filter(|k| matches!(k, agent_message::Kind::Hello(_)))
        .count();
    assert_eq!(hellos, 1, "the stream was not replaced");
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&s.dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_certificates_reloaded_on_reconnect() -> anyhow::Result<()> {
    init_logs();
    let dir = temp_dir("mtls")?;
    let ca = scale_agent_e2e::pki::CertificateAuthority::new("hub-ca")?;
    let serving = ca.serving("hub", &["hub.test"])?;
    let write = |name: &str, text: &str| -> anyhow::Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        Ok(path)
    };
    let ca_path = write("ca.pem", &ca.cert_pem)?;
    let first = ca.client("agent-one", &[])?;
    let cert_path = write("tls.crt", &first.cert_pem)?;
    let key_path = write("tls.key", &first.key_pem)?;

    let hub = Arc::new(HubState::default());
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&serving.cert_pem, &serving.key_pem))
        .client_ca_root(Certificate::from_pem(&ca.cert_pem));
    let hub_addr = start_hub_with(hub.clone(), Some(tls)).await?;
    let config = dir.join("scale-agent.yaml");
    std::fs::write(
        &config,
        serde_json::to_string(&json!({
            "clouddriver": {
                "grpc": format!("localhost:{}", hub_addr.port()),
                "backoff": { "baseDelay": "200ms", "maxDelay": "2s" },
            },
        }))?,
    )?;
    let mut options = Options::for_config(&config);
    options.admin_addr = Some("127.0.0.1:0".parse()?);
    options.hub_ca = Some(ca_path);
    options.tls_cert = Some(cert_path.clone());
    options.tls_key = Some(key_path.clone());
    options.hub_server_name = Some("hub.test".into());
    let agent = scale_agent::start(options).await?;
    eventually("a TLS stream", || agent.view().hub_connected).await?;
    assert_eq!(agent.view().hub_identity, "fake-agent");

    // Rotate the client certificate on disk, then drop the stream: the next stream
    // presents the new certificate.
    let second = ca.client("agent-two", &[])?;
    std::fs::write(&cert_path, &second.cert_pem)?;
    std::fs::write(&key_path, &second.key_pem)?;
    hub.disconnect.notify_one();
    eventually("a second TLS stream", || {
        hub.client_certificates.lock().map(|c| c.len()).unwrap_or(0) >= 2
    })
    .await?;
    let seen = hub
        .client_certificates
        .lock()
        .map(|c| c.clone())
        .unwrap_or_default();
    assert_ne!(
        seen[0], seen[1],
        "the rotated certificate was not picked up"
    );
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
