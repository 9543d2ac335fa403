//! Config files: unknown keys reported, a deleted file keeps the last good config, a missing
//! one stops the agent at start-up.

use super::*;

/// Config-file edge cases of a running agent (issue 17): unknown keys are reported with the
/// closest known key; a deleted file keeps the last good config (every account keeps
/// streaming) and says so once, on `/accounts` and in the config-errors metric, until the
/// file is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_keys_are_reported_and_a_deleted_config_file_keeps_the_last_good_config()
-> anyhow::Result<()> {
    let s = setup("cfgedge", &["configmaps"]).await?;
    let configmaps = Api::<ConfigMap>::namespaced(s.admin.clone(), &s.namespace);
    create(&configmaps, json!({ "metadata": { "name": "before" } })).await?;

    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("cfgedge");
    let config = s.dir.join("scale-agent.yaml");
    let mut with_typos = fixtures::account(&account, &s.kubeconfig, &s.namespace, &["ConfigMap"]);
    with_typos["kindz"] = json!(["Secret"]);
    write_config(&config, hub_addr, json!([with_typos]))?;
    let mut document: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config)?)?;
    document["kubernets"] = json!({ "accounts": [] });
    let text = serde_json::to_string_pretty(&document)?;
    std::fs::write(&config, &text)?;

    let agent = start_agent(&config).await?;
    eventually("the snapshot", || {
        hub.has_object(
            &account,
            "configmaps",
            "before",
            object_event::Type::Applied,
        )
    })
    .await?;
    let mut unknown = agent.view().config.unknown_keys;
    unknown.sort();
    assert_eq!(
        unknown,
        [
            "kubernetes.accounts[0].kindz (did you mean `kinds`?)",
            "kubernets (did you mean `kubernetes`?)",
        ]
    );
    assert_eq!(agent.metrics().config_errors.get(), 2);
    let accounts = http_get(agent.admin_addr(), "/accounts").await?;
    assert!(
        accounts
            .body
            .contains("kubernets (did you mean `kubernetes`?)"),
        "{}",
        accounts.body
    );
    assert!(
        agent
            .metrics_text()
            .contains("scale_agent_agent_config_errors_total 2")
    );

    // The file goes away (a ConfigMap unmounted, a rename in progress): nothing changes but
    // the status.
    std::fs::remove_file(&config)?;
    eventually("the missing file to be noticed", || {
        agent.view().config.problem.is_some()
    })
    .await?;
    let problem = agent.view().config.problem.unwrap_or_default();
    assert!(problem.contains("does not exist"), "{problem}");
    assert!(problem.contains(&config.display().to_string()), "{problem}");
    assert!(
        problem.contains("keeping the last good config"),
        "{problem}"
    );
    create(
        &configmaps,
        json!({ "metadata": { "name": "while-missing" } }),
    )
    .await?;
    eventually("an object created while the file is missing", || {
        hub.has_object(
            &account,
            "configmaps",
            "while-missing",
            object_event::Type::Applied,
        )
    })
    .await?;
    // Several polls later: still one error for the one disappearance, the account and the
    // hub address untouched, nothing unregistered.
    tokio::time::sleep(scale_agent::CONFIG_POLL * 3).await;
    assert_eq!(agent.metrics().config_errors.get(), 3);
    let view = agent.view();
    assert!(view.account(&account).is_some());
    assert_eq!(view.hub, hub_addr.to_string());
    assert!(view.hub_connected);
    assert!(
        !hub.kinds()
            .iter()
            .any(|k| matches!(k, agent_message::Kind::UnregisterAccount(_))),
        "an account was unregistered while the config file was missing"
    );
    let accounts = http_get(agent.admin_addr(), "/accounts").await?;
    assert!(
        accounts.body.contains("does not exist"),
        "{}",
        accounts.body
    );

    // The same file back: the problem is gone, and nothing was reloaded.
    let reloads = agent.metrics().config_reloads.get();
    std::fs::write(&config, &text)?;
    eventually("the file to be back", || {
        agent.view().config.problem.is_none()
    })
    .await?;
    assert_eq!(agent.metrics().config_reloads.get(), reloads);
    // A corrected file: applied, and no unknown keys left to show.
    write_config(
        &config,
        hub_addr,
        json!([fixtures::account(
            &account,
            &s.kubeconfig,
            &s.namespace,
            &["ConfigMap"]
        )]),
    )?;
    eventually("the corrected file to be applied", || {
        agent.metrics().config_reloads.get() == reloads + 1
    })
    .await?;
    assert!(agent.view().config.unknown_keys.is_empty());
    assert_eq!(agent.metrics().config_errors.get(), 3);

    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&s.dir);
    Ok(())
}

/// A `--config` path that does not exist stops the agent process at start-up with a message
/// that says what to do, instead of running on defaults and failing to resolve the default hub.
#[test]
fn a_missing_config_file_given_with_config_stops_the_agent_at_start_up() -> anyhow::Result<()> {
    let missing = temp_dir("cfgmissing")?.join("no-such.yaml");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_e2e-agent"))
        .arg("--config")
        .arg(&missing)
        .arg("--admin-addr")
        .arg("127.0.0.1:0")
        .output()?;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "the config file {} does not exist: create it, or point --config (SCALE_AGENT_CONFIG) at the agent's config file",
            missing.display()
        )),
        "{stderr}"
    );
    Ok(())
}
