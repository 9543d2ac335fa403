//! Watches and followed logs stream, and end cleanly when their agent dies.

use super::*;

async fn create_configmap(admin: &Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), namespace);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &cm).await?;
    Ok(())
}

#[tokio::test]
async fn watches_and_logs_stream_and_end_cleanly_when_their_agent_dies() -> anyhow::Result<()> {
    // Accounts `doomed` (its own agent, a process killed with SIGKILL) and `steady` and
    // `sibling` (one in-process agent; they share its stream).
    let doomed = account_name("doomed");
    let steady = account_name("steady");
    let sibling = account_name("sibling");
    let setup = Setup::new("watch", &[&steady, &sibling]).await?;
    let config = setup.dir.join("doomed-agent.yaml");
    fixtures::write_plaintext_agent_config(
        &config,
        setup.hub.hub.grpc_addr,
        json!([account_entry(&doomed, &setup.direct)]),
        2,
    )?;
    let admin_addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut doomed_agent = ManagedProcess::spawn(
        "e2e-agent",
        Path::new(AGENT),
        &[
            format!("--config={}", config.display()),
            "--replica=doomed-0".into(),
            format!("--admin-addr={admin_addr}"),
        ],
        setup.dir.join("doomed-agent.log"),
    )?;
    setup.hub.wait_connected(&doomed, 1).await?;

    let control_plane = control_plane()?;
    let namespace = control_plane.namespace(&setup.admin, "watched").await?;
    let kubectl = Kubectl::new(control_plane.binaries().kubectl(), setup.dir.join("home"));
    let ns = format!("--namespace={namespace}");
    let watch_args = args(&["get", "configmaps", "-w", "-o", "name", &ns]);
    let doomed_kubeconfig = setup.kubeconfig(&doomed, "watch").await?;
    let steady_kubeconfig = setup.kubeconfig(&steady, "watch").await?;
    let sibling_kubeconfig = setup.kubeconfig(&sibling, "watch").await?;
    let mut doomed_watch = Follower::start(&kubectl, &doomed_kubeconfig, &watch_args).await?;
    let mut steady_watch = Follower::start(&kubectl, &steady_kubeconfig, &watch_args).await?;
    let mut sibling_watch = Follower::start(&kubectl, &sibling_kubeconfig, &watch_args).await?;

    // A change reaches every watch.
    create_configmap(&setup.admin, &namespace, "first").await?;
    doomed_watch.expect("configmap/first").await?;
    steady_watch.expect("configmap/first").await?;
    sibling_watch.expect("configmap/first").await?;

    // A followed log streams what the pod writes after kubectl started.
    let log = control_plane
        .pod_log(&setup.admin, &namespace, "logger")
        .await?;
    run_logger(&setup.admin, &namespace).await?;
    let mut follow = Follower::start(
        &kubectl,
        &doomed_kubeconfig,
        &args(&["logs", "-f", "logger", "-c", "main", &ns]),
    )
    .await?;
    log.append("line one")?;
    follow.expect("line one").await?;
    log.append("line two, after the follower started")?;
    follow.expect("line two").await?;

    // Killing the agent ends its account's watch and log follow cleanly (kubectl sees the
    // stream end, as when the API server ends a watch), and the account answers 503.
    process::send_signal(doomed_agent.pid(), libc::SIGKILL);
    doomed_agent.stop(Duration::from_secs(5));
    // Exit 0 and nothing on stderr is what kubectl does when the API server ends a watch;
    // a broken stream gives "unexpected EOF" or "INTERNAL_ERROR" and a non-zero exit.
    let (code, stderr) = doomed_watch.exited().await?;
    assert_eq!(
        (code, stderr.trim()),
        (Some(0), ""),
        "the watch did not end cleanly"
    );
    let (code, stderr) = follow.exited().await?;
    assert_eq!(
        (code, stderr.trim()),
        (Some(0), ""),
        "the log follow did not end cleanly"
    );
    // A plain `kubectl get` (a Table) is printed from the cache the hub holds for the grace
    // period, flagged stale (issue 30: it used to be tunnelled, and failed); a write has
    // nobody to run it and answers 503.
    let after = kubectl
        .run(
            &doomed_kubeconfig,
            &args(&["get", "configmaps", &ns]),
            None,
            KUBECTL_TIMEOUT,
        )
        .await?;
    assert!(
        after.success() && after.stdout.contains("first") && after.stderr.contains("no agent"),
        "{}\n{}",
        after.stdout,
        after.stderr
    );
    let write = kubectl
        .run(
            &doomed_kubeconfig,
            &args(&["create", "configmap", "refused", &ns]),
            None,
            KUBECTL_TIMEOUT,
        )
        .await?;
    assert!(!write.success());
    assert!(
        write.stderr.contains("no agent") && write.stderr.contains("writes need a connected agent"),
        "{}",
        write.stderr
    );

    // The other accounts' watches go on, and one client going away on the shared stream
    // leaves its sibling's watch alone.
    create_configmap(&setup.admin, &namespace, "second").await?;
    steady_watch.expect("configmap/second").await?;
    sibling_watch.expect("configmap/second").await?;
    drop(steady_watch);
    create_configmap(&setup.admin, &namespace, "third").await?;
    sibling_watch.expect("configmap/third").await?;
    drop(sibling_watch);
    setup.stop().await
}
