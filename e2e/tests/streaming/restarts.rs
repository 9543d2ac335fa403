//! Restarts of the hub (embedded store and PostgreSQL) and the agent resume without
//! relisting; a standby agent process takes over when the streaming one is killed.

use super::*;

/// Test 3: the hub restarts (SIGTERM, same ports and data dir): the agent reconnects and
/// resumes without a LIST. Then the agent stops, objects change while it is away, and after
/// its restart the hub is pruned and updated to the API server's state, again without a LIST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_and_agent_restarts_resume_without_relisting() -> anyhow::Result<()> {
    restarts_resume_without_relisting("restart", &[], None).await
}

/// Test 3 on PostgreSQL (`--store postgres`, the URL in a file): the hub's state lives in the
/// database, not in its data directory, and both restarts resume without a LIST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_on_postgres_restarts_and_resumes_without_relisting() -> anyhow::Result<()> {
    let postgres = PostgresServer::start().await?;
    let secrets = TempDir::new("pg-url")?;
    let url_file = secrets.path().join("postgres-url");
    std::fs::write(&url_file, format!("{}\n", postgres.url()))?;
    let flags = [
        "--store=postgres".to_string(),
        // The harness\'s PostgreSQL is plaintext on loopback.
        "--postgres-insecure-tls".to_string(),
        format!("--postgres-url-file={}", url_file.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    restarts_resume_without_relisting("pg-restart", &flags, Some(&postgres)).await
}

/// The body of test 3, with `hub_flags`; with `postgres`, also checks the hub keeps its
/// objects there and nothing in its data directory's store file.
async fn restarts_resume_without_relisting(
    name: &str,
    hub_flags: &[&str],
    postgres: Option<&PostgresServer>,
) -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster(name).await?;
    let flags: Vec<&str> = std::iter::once("--grace-period=60s")
        .chain(hub_flags.iter().copied())
        .collect();
    let mut s = setup(name, &flags).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &["configmaps", "deployments.apps"],
        s.dir.path(),
    )
    .await?;
    for name in ["alpha", "beta", "gamma"] {
        create_configmap(&admin, &ns, name, json!({ "v": "1" })).await?;
    }
    let account = unique(name);
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([fixtures::account(
            &account,
            &kubeconfig,
            &ns,
            &["configmaps", "deployments.apps"]
        )]),
    )?;
    let mut agent = Agent::start(s.dir.path(), &config, &format!("{name}-0"), &s.tls).await?;
    let acc = account.as_str();
    let hub = &s.hub;
    hub_equals_api(hub, &admin, acc, &ns).await?;
    let cm = [("account", acc), ("kind", "configmaps")];
    let deploy = [("account", acc), ("kind", "deployments.apps")];
    let before = agent.metrics().await?;
    let lists =
        |text: &str, labels: &[(&str, &str)]| metric(text, "scale_agent_agent_lists_total", labels);
    let resumes = |text: &str, labels: &[(&str, &str)]| {
        metric(text, "scale_agent_agent_watch_resumes_total", labels)
    };
    assert_eq!(
        lists(&before, &cm),
        1.0,
        "one LIST for the first snapshot:\n{before}"
    );
    assert_eq!(lists(&before, &deploy), 1.0, "{before}");

    // The hub holds a resume point for each watch before it goes.
    eventually("resume points for both kinds in the hub", || async move {
        let view = hub.account(acc).await?.unwrap_or_default();
        let kinds = view["kinds"].as_array().cloned().unwrap_or_default();
        Ok(kinds.len() == 2
            && kinds.iter().all(|k| {
                k["state"] == "WATCHING"
                    && k["resumePoints"].as_array().is_some_and(|r| !r.is_empty())
            }))
    })
    .await?;

    // Restart the hub; change things while it is down.
    s.hub.stop();
    let a = &agent;
    eventually("the agent to notice the hub is gone", || async move {
        Ok(a.metric("scale_agent_agent_hub_connected", &[]).await? == 0.0)
    })
    .await?;
    create_configmap(&admin, &ns, "delta", json!({ "v": "1" })).await?;
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .delete("gamma", &DeleteParams::default())
        .await?;
    s.hub.start_again().await?;
    let log = s.hub.log();
    assert!(log.contains("store loaded"), "{log}");
    if let Some(postgres) = postgres {
        assert!(
            !s.hub.data_dir.join("hub.redb").exists(),
            "the hub on PostgreSQL made an embedded store"
        );
        let sql = postgres.connect().await?;
        let stored: i64 = sql
            .query_one(
                "SELECT count(*) FROM objects WHERE account = $1 AND kind = '/ConfigMap'",
                &[&acc],
            )
            .await?
            .get(0);
        // At least alpha, beta and gamma (or delta, once the agent resumed).
        assert!(stored >= 3, "{stored} ConfigMaps in PostgreSQL");
        let resume_points: i64 = sql
            .query_one(
                "SELECT count(*) FROM resume_points WHERE account = $1",
                &[&acc],
            )
            .await?
            .get(0);
        assert!(resume_points >= 2, "{resume_points} resume points");
    }
    let a = &agent;
    eventually(
        "the agent to reconnect and resume both kinds",
        || async move {
            let text = a.metrics().await?;
            Ok(resumes(&text, &cm) >= 1.0 && resumes(&text, &deploy) >= 1.0)
        },
    )
    .await?;
    hub_equals_api(&s.hub, &admin, acc, &ns).await?;
    let after = agent.metrics().await?;
    assert_eq!(
        lists(&after, &cm),
        1.0,
        "no LIST after the hub restart:\n{after}"
    );
    assert_eq!(lists(&after, &deploy), 1.0, "{after}");
    assert!(
        metric(&after, "scale_agent_agent_reconnects_total", &[]) >= 1.0,
        "{after}"
    );
    let (_, hub_metrics) = hub_get(s.hub.http, "/metrics").await?;
    assert!(
        metric(&hub_metrics, "scale_agent_hub_resumes_total", &[]) >= 2.0,
        "{hub_metrics}"
    );
    assert_eq!(
        metric(&hub_metrics, "scale_agent_hub_relists_total", &[]),
        0.0,
        "{hub_metrics}"
    );

    // Stop the agent; delete and change objects while it is down.
    agent.stop();
    change_configmaps(&admin, &ns, "alpha", "beta", "epsilon").await?;
    let hub = &s.hub;
    eventually("the hub to keep the account, disconnected", || async move {
        let view = hub.account(acc).await?;
        anyhow::ensure!(view.is_some(), "dropped within the grace period");
        Ok(view.is_some_and(|v| v["state"] == "disconnected" && v["streaming"].is_null()))
    })
    .await?;
    agent.start_again().await?;
    let a = &agent;
    eventually("the restarted agent to resume both kinds", || async move {
        let text = a.metrics().await?;
        Ok(resumes(&text, &cm) >= 1.0 && resumes(&text, &deploy) >= 1.0)
    })
    .await?;
    hub_equals_api(&s.hub, &admin, acc, &ns).await?;
    let beta = s
        .hub
        .object(acc, "configmaps", &ns, "beta")
        .await?
        .unwrap_or_default();
    assert_eq!(beta["data"]["v"], "2", "{beta}");
    let restarted = agent.metrics().await?;
    assert_eq!(
        lists(&restarted, &cm),
        0.0,
        "no LIST after the agent restart:\n{restarted}"
    );
    assert_eq!(resumes(&restarted, &cm), 1.0, "{restarted}");
    assert_eq!(lists(&restarted, &deploy), 0.0, "{restarted}");
    Ok(())
}

/// Test 4: two agent processes for one account; SIGKILL the one that streams, the standby
/// takes over from the hub's resume points and the cache follows the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_process_takes_over_when_the_streaming_one_is_killed() -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster("ha").await?;
    let s = setup("ha", &[]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &["configmaps"],
        s.dir.path(),
    )
    .await?;
    for name in ["one", "two", "three"] {
        create_configmap(&admin, &ns, name, json!({ "v": "1" })).await?;
    }
    let account = unique("ha");
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
    let mut a = Agent::start(s.dir.path(), &config, "a", &s.tls).await?;
    let mut b = Agent::start(s.dir.path(), &config, "b", &s.tls).await?;
    let acc = account.as_str();
    let hub = &s.hub;
    eventually("one streaming replica and one standby", || async move {
        let view = hub.account(acc).await?.unwrap_or_default();
        Ok(view["streaming"]["replica"].is_string()
            && view["standbys"].as_array().is_some_and(|s| s.len() == 1))
    })
    .await?;
    hub_equals_api(hub, &admin, acc, &ns).await?;
    let view = hub.account(acc).await?.unwrap_or_default();
    let streaming = view["streaming"]["replica"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        view["standbys"][0]["replica"],
        if streaming == "a" { "b" } else { "a" },
        "{view}"
    );
    let (killed, standby) = if streaming == "a" {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    let standby_name = if streaming == "a" { "b" } else { "a" };
    eventually("the standby's own view to say standby", || async move {
        Ok(standby.account(acc).await?.unwrap_or_default()["role"] == "standby")
    })
    .await?;
    let text = standby.metrics().await?;
    assert_eq!(
        metric(&text, "scale_agent_agent_lists_total", &[("account", acc)]),
        0.0,
        "a standby does not watch:\n{text}"
    );

    killed.kill();
    change_configmaps(&admin, &ns, "one", "two", "four").await?;
    eventually("the standby promoted", || async move {
        let view = hub.account(acc).await?.unwrap_or_default();
        Ok(view["streaming"]["replica"] == standby_name)
    })
    .await?;
    hub_equals_api(hub, &admin, acc, &ns).await?;
    let role = standby.account(acc).await?.unwrap_or_default();
    assert_eq!(role["role"], "streaming", "{role}");
    let text = standby.metrics().await?;
    let cm = [("account", acc), ("kind", "configmaps")];
    assert_eq!(
        metric(&text, "scale_agent_agent_lists_total", &cm),
        0.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "scale_agent_agent_watch_resumes_total", &cm),
        1.0,
        "{text}"
    );
    // And it keeps following.
    create_configmap(&admin, &ns, "five", json!({ "v": "1" })).await?;
    hub_equals_api(hub, &admin, acc, &ns).await?;
    Ok(())
}
