//! Watches through the proxy across an agent failover (clean stop or SIGKILL) and a hub
//! restart miss and repeat nothing.

use super::*;

/// The events of a direct watch of `path` from `from` (timing out after 3 s), as
/// (name, resourceVersion) pairs: what a watch through the proxy must have seen.
async fn direct_watch(
    client: &Client,
    path: &str,
    from: &str,
) -> anyhow::Result<Vec<(String, u64)>> {
    let request = http::Request::get(format!(
        "{path}?watch=true&resourceVersion={from}&timeoutSeconds=3"
    ))
    .body(Vec::new())?;
    watch_events(&client.request_text(request).await?)?
        .into_iter()
        .map(|(_, name, rv)| Ok((name, rv.parse()?)))
        .collect()
}

/// Watches the creation of [`FAILOVER_CHANGES`] ConfigMaps through the proxy (a kube
/// client's watch, started again from its last resourceVersion whenever it ends) while
/// `fail_over` runs from halfway through the writes; then checks that the watch saw each
/// change once, in order, with the resourceVersions of the API server's own watch, and that
/// the account is left with no standby (the failover happened). Returns `fail_over`'s value.
async fn watch_across<T>(
    setup: &Setup,
    fail_over: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let ns = setup.stack.namespace.clone();
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    let proxy_client = client_for(&setup.stack.proxied).await?;
    let proxied: Api<ConfigMap> = Api::namespaced(proxy_client, &ns);
    let start = proxied
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let probe = setup
        .get(
            &format!("{path}?watch=true&timeoutSeconds=1&resourceVersion={start}"),
            None,
        )
        .await?;
    assert_eq!(
        probe.header("x-scale-agent-cache"),
        Some("hit"),
        "the watch is the cache's"
    );
    let admin = audited_control_plane()?.client().await?;
    let direct: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let writer = tokio::spawn(async move {
        for i in 0..FAILOVER_CHANGES {
            let cm: ConfigMap =
                serde_json::from_value(json!({ "metadata": { "name": format!("f-{i:02}") } }))?;
            direct.create(&PostParams::default(), &cm).await?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::Ok(())
    });
    let failing_over = async {
        tokio::time::sleep(Duration::from_millis(FAILOVER_CHANGES as u64 * 25)).await;
        fail_over.await
    };
    let watching = async {
        let mut seen: Vec<(String, u64)> = Vec::new();
        let mut from = start.clone();
        let mut restarts = 0;
        let deadline = tokio::time::Instant::now() + WAIT;
        while seen.len() < FAILOVER_CHANGES {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the watch saw {} of {FAILOVER_CHANGES} changes: {seen:?}",
                seen.len()
            );
            let params = kube::api::WatchParams::default().timeout(30);
            let mut stream = match proxied.watch(&params, &from).await {
                Ok(stream) => stream.boxed(),
                Err(error) => {
                    // No agent for a moment: the proxy says so; try again.
                    tracing::info!(%error, "watch refused during the failover; again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            // A stream that breaks off (a truncated line, a reset) fails the test: the watch
            // must end cleanly.
            while let Some(event) = stream.try_next().await? {
                match event {
                    kube::core::WatchEvent::Added(cm) => {
                        let rv: u64 = cm
                            .metadata
                            .resource_version
                            .clone()
                            .unwrap_or_default()
                            .parse()?;
                        from = rv.to_string();
                        seen.push((cm.metadata.name.unwrap_or_default(), rv));
                    }
                    kube::core::WatchEvent::Error(status) => {
                        anyhow::bail!("the watch from {from} ended with an error: {status:?}")
                    }
                    kube::core::WatchEvent::Bookmark(b) => from = b.metadata.resource_version,
                    other => anyhow::bail!("unexpected event {other:?}"),
                }
                if seen.len() == FAILOVER_CHANGES {
                    break;
                }
            }
            restarts += 1;
        }
        anyhow::Ok((seen, restarts))
    };
    let (watched, failed_over) = tokio::join!(watching, failing_over);
    let (seen, restarts) = watched?;
    let failed_over = failed_over?;
    writer.await??;
    tracing::info!(restarts, "watch across the failover");
    // The failover did happen: the replica left streams the account now.
    let view = setup
        .stack
        .hub
        .api("GET", &format!("/api/v1/accounts/{}", setup.stack.account))
        .send()
        .await?
        .json_or_null();
    assert!(view["streaming"].is_object(), "{view}");
    assert!(
        view["standbys"].as_array().is_none_or(Vec::is_empty),
        "{view}"
    );
    let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
    let expected: Vec<String> = (0..FAILOVER_CHANGES).map(|i| format!("f-{i:02}")).collect();
    assert_eq!(
        names, expected,
        "every change once, in order (watch restarted {restarts} times)"
    );
    assert_eq!(
        seen,
        direct_watch(&admin, &path, &start).await?,
        "the API server's own watch from {start} (watch restarted {restarts} times)"
    );
    Ok(failed_over)
}

/// ConfigMaps created while a watch runs across a failover.
const FAILOVER_CHANGES: usize = 40;

/// The streaming replica of the account, by the hub's account view.
async fn streaming_replica(hub: &TlsHub, account: &str) -> anyhow::Result<String> {
    let view = hub
        .api("GET", &format!("/api/v1/accounts/{account}"))
        .send()
        .await?
        .json_or_null();
    Ok(view["streaming"]["replica"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// A watch through the proxy across an agent failover (the streaming replica stops, the
/// standby is promoted and resumes from the hub's resume points): the watch continues, or
/// ends cleanly and is resumed from the last resourceVersion it saw, and every change is
/// seen exactly once, in order.
#[tokio::test]
async fn a_watch_across_agent_failover_misses_and_repeats_nothing() -> anyhow::Result<()> {
    let mut setup = Setup::new("failover", |_, _, _| async { Ok(()) }).await?;
    let standby =
        fixtures::start_agent_replica(&setup.stack.dir.join("agent.yaml"), "failover-1").await?;
    setup
        .stack
        .hub
        .wait_connected(&setup.stack.account, 2)
        .await?;
    let first = setup.stack.agent.take();
    let kept = watch_across(&setup, async {
        let streaming = streaming_replica(&setup.stack.hub, &setup.stack.account).await?;
        let (gone, kept) = if streaming == "failover-1" {
            (Some(standby), first)
        } else {
            (first, Some(standby))
        };
        if let Some(agent) = gone {
            agent.stop().await?;
        }
        anyhow::Ok(kept)
    })
    .await?;
    setup.stack.agent = kept;
    setup.stop().await
}

/// The same across a streaming replica that is KILLED: a real agent process gets SIGKILL,
/// so its stream to the hub drops without a goodbye, and the standby (in this process) is
/// promoted.
#[tokio::test]
async fn a_watch_across_a_killed_streaming_agent_misses_and_repeats_nothing() -> anyhow::Result<()>
{
    let mut setup = Setup::new("killed", |_, _, _| async { Ok(()) }).await?;
    // Make a process the streaming replica: it joins as the standby, and the replica in
    // this process hands over to it.
    let admin_port = scale_agent_e2e::local_agent::free_port()?;
    let mut process = ManagedProcess::spawn(
        "e2e-agent",
        Path::new(AGENT),
        &args(&[
            &format!("--config={}", setup.stack.dir.join("agent.yaml").display()),
            "--replica=killed-process",
            &format!("--admin-addr=127.0.0.1:{admin_port}"),
        ]),
        setup.stack.dir.join("agent-process.log"),
    )?;
    setup
        .stack
        .hub
        .wait_connected(&setup.stack.account, 2)
        .await?;
    if let Some(agent) = setup.stack.agent.take() {
        agent.stop().await?;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while streaming_replica(&setup.stack.hub, &setup.stack.account).await? != "killed-process" {
        process.ensure_running()?;
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the agent process never streamed the account: {}",
            scale_agent_e2e::process::tail(process.log(), 20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    setup.stack.agent = Some(
        fixtures::start_agent_replica(&setup.stack.dir.join("agent.yaml"), "killed-standby")
            .await?,
    );
    setup
        .stack
        .hub
        .wait_connected(&setup.stack.account, 2)
        .await?;
    let pid = process.pid();
    watch_across(&setup, async {
        scale_agent_e2e::process::send_signal(pid, libc::SIGKILL);
        anyhow::Ok(())
    })
    .await?;
    anyhow::ensure!(
        process.ensure_running().is_err(),
        "the agent process survived SIGKILL"
    );
    assert_eq!(
        streaming_replica(&setup.stack.hub, &setup.stack.account).await?,
        "killed-standby",
        "the standby was promoted"
    );
    setup.stop().await
}

/// kubectl's `-o json --output-watch-events` output (pretty-printed events one after
/// another) as (type, name, resourceVersion); `strict` fails on a value cut off (a
/// truncated event), otherwise the complete ones so far.
fn kubectl_watch_events(stdout: &[u8], strict: bool) -> anyhow::Result<Vec<(String, String, u64)>> {
    let mut events = Vec::new();
    for value in serde_json::Deserializer::from_slice(stdout).into_iter::<Value>() {
        let value = match value {
            Ok(value) => value,
            Err(error) if !strict && error.is_eof() => break,
            Err(error) => anyhow::bail!(
                "kubectl printed a broken event ({error}): {}",
                String::from_utf8_lossy(stdout)
            ),
        };
        let object = &value["object"];
        events.push((
            value["type"].as_str().unwrap_or_default().to_string(),
            object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            object["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .parse()?,
        ));
    }
    Ok(events)
}

/// What a kube-runtime `watcher` (a reflector's stream) delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reflected {
    /// A (re)list began.
    Init,
    /// The (re)list is complete; watch events follow.
    InitDone,
    Apply(String, u64),
    Delete(String, u64),
}

impl Reflected {
    fn of(event: kube::runtime::watcher::Event<ConfigMap>) -> Option<Reflected> {
        use kube::runtime::watcher::Event;
        let key = |cm: &ConfigMap| {
            (
                cm.metadata.name.clone().unwrap_or_default(),
                cm.metadata
                    .resource_version
                    .as_deref()
                    .and_then(|rv| rv.parse().ok())
                    .unwrap_or_default(),
            )
        };
        match event {
            Event::Init => Some(Reflected::Init),
            Event::InitApply(cm) | Event::Apply(cm) => {
                let (name, rv) = key(&cm);
                Some(Reflected::Apply(name, rv))
            }
            Event::Delete(cm) => {
                let (name, rv) = key(&cm);
                Some(Reflected::Delete(name, rv))
            }
            Event::InitDone => Some(Reflected::InitDone),
        }
    }
}

/// The objects a reflector holds after `events` (name → resourceVersion), and whether any
/// change after the last (re)list repeated or went back in resourceVersion.
fn reflect(events: &[Reflected]) -> (std::collections::BTreeMap<String, u64>, Vec<String>) {
    let mut state = std::collections::BTreeMap::new();
    let mut problems = Vec::new();
    // The highest resourceVersion since the (re)list; `None` during one (its objects come
    // in name order).
    let mut last: Option<u64> = None;
    for event in events {
        match event {
            Reflected::Init => {
                state.clear();
                last = None;
            }
            Reflected::InitDone => last = Some(state.values().copied().max().unwrap_or(0)),
            Reflected::Apply(name, rv) | Reflected::Delete(name, rv) => {
                if let Some(at) = last {
                    if *rv <= at {
                        problems.push(format!("{event:?} after resourceVersion {at}"));
                    }
                    last = Some(at.max(*rv));
                }
                if matches!(event, Reflected::Delete(..)) {
                    state.remove(name);
                } else {
                    state.insert(name.clone(), *rv);
                }
            }
        }
    }
    (state, problems)
}

/// The ConfigMaps of `namespace` on the API server: name → resourceVersion.
async fn api_state(
    api: &Api<ConfigMap>,
) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|cm| {
            (
                cm.metadata.name.unwrap_or_default(),
                cm.metadata
                    .resource_version
                    .and_then(|rv| rv.parse().ok())
                    .unwrap_or_default(),
            )
        })
        .collect())
}

/// A watch through the proxy across a HUB restart (same ports, certificate and data
/// directory): kubectl's watch ends cleanly (every event it printed whole) and kubectl
/// exits; kubectl watching again from the last resourceVersion it printed either continues
/// with exactly the API server's events after it, or gets 410 Expired and a list from the
/// cache equals the API server's; and a kube-runtime watcher (a reflector, which watches
/// again from its last resourceVersion and relists on 410) ends up with the API server's
/// state without a change seen twice.
#[tokio::test]
async fn a_watch_across_a_hub_restart_ends_cleanly_and_resumes() -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt as _;
    let mut setup = Setup::new("hubrestart", |_, _, _| async { Ok(()) }).await?;
    let ns = setup.stack.namespace.clone();
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    let admin = audited_control_plane()?.client().await?;
    let direct: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let create = |name: String| {
        let direct = direct.clone();
        async move {
            let cm: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": name } }))?;
            let created = direct.create(&PostParams::default(), &cm).await?;
            anyhow::Ok(created.metadata.resource_version.unwrap_or_default())
        }
    };
    // kubectl's watch, as a person or a script runs it.
    let kubectl = setup.kubectl("proxied")?;
    std::fs::create_dir_all(&kubectl.home)?;
    let mut watch = tokio::process::Command::new(&kubectl.binary)
        .arg(format!("--kubeconfig={}", setup.stack.proxied.display()))
        .args(["get", "configmaps", "-n", &ns, "-w", "-o", "json"])
        .arg("--output-watch-events")
        .env("HOME", &kubectl.home)
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let printed = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let mut stdout = watch
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let reader = tokio::spawn({
        let printed = printed.clone();
        async move {
            let mut chunk = [0u8; 8192];
            loop {
                let n = stdout.read(&mut chunk).await?;
                if n == 0 {
                    return anyhow::Ok(());
                }
                printed
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .extend_from_slice(&chunk[..n]);
            }
        }
    });
    let printed_now = || -> anyhow::Result<Vec<u8>> {
        Ok(printed
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .clone())
    };
    // A kube-runtime watcher through the proxy, as a controller's reflector runs.
    let reflected = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Reflected>::new()));
    let reflector = tokio::spawn({
        use kube::runtime::{WatchStreamExt as _, watcher};
        let reflected = reflected.clone();
        let api: Api<ConfigMap> = Api::namespaced(client_for(&setup.stack.proxied).await?, &ns);
        async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        if let Some(r) = Reflected::of(event) {
                            reflected
                                .lock()
                                .map_err(|_| anyhow::anyhow!("poisoned"))?
                                .push(r);
                        }
                    }
                    // The hub is away for a moment; the watcher backs off and tries again.
                    Err(error) => tracing::info!(%error, "the watcher retries"),
                }
            }
            anyhow::Ok(())
        }
    });
    let deadline = tokio::time::Instant::now() + WAIT;
    let wait_for =
        |what: &'static str, done: &dyn Fn() -> anyhow::Result<bool>| -> anyhow::Result<bool> {
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "never: {what}");
            done()
        };
    // Both are watching once they show an object created now.
    create("r-00".into()).await?;
    loop {
        let kubectl_has = kubectl_watch_events(&printed_now()?, false)?
            .iter()
            .any(|(_, name, _)| name == "r-00");
        let reflector_has = reflect(&reflected.lock().map_err(|_| anyhow::anyhow!("poisoned"))?)
            .0
            .contains_key("r-00");
        if wait_for("both watches show r-00", &|| {
            Ok(kubectl_has && reflector_has)
        })? {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for i in 1..5 {
        create(format!("r-{i:02}")).await?;
    }
    let last_before = create("r-05".into()).await?;
    // Changes elsewhere in the cluster move the account's resume point past the last
    // event either watch has seen (as other workloads do on a real cluster).
    let elsewhere = audited_control_plane()?
        .namespace(&admin, "cache-hubrestart-elsewhere")
        .await?;
    let elsewhere_api: Api<ConfigMap> = Api::namespaced(admin.clone(), &elsewhere);
    let mut elsewhere_rv = String::new();
    for i in 0..3 {
        let cm: ConfigMap =
            serde_json::from_value(json!({ "metadata": { "name": format!("other-{i}") } }))?;
        elsewhere_rv = elsewhere_api
            .create(&PostParams::default(), &cm)
            .await?
            .metadata
            .resource_version
            .unwrap_or_default();
    }
    loop {
        let seen = kubectl_watch_events(&printed_now()?, false)?;
        let reply = setup
            .get(
                &format!(
                    "/api/v1/configmaps?resourceVersion={elsewhere_rv}&resourceVersionMatch=NotOlderThan&limit=1"
                ),
                None,
            )
            .await?;
        if wait_for(
            "kubectl prints r-05 and the cache has the other changes",
            &|| {
                Ok(seen.iter().any(|(_, name, _)| name == "r-05")
                    && reply.header("x-scale-agent-cache") == Some("hit"))
            },
        )? {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The hub restarts; while it is down, more changes happen on the cluster.
    let (hub, (exit, stderr)) = setup
        .stack
        .hub
        .restart(async {
            let exit = tokio::time::timeout(WAIT, watch.wait())
                .await
                .map_err(|_| {
                    anyhow::anyhow!("kubectl's watch did not end when the hub stopped")
                })??;
            tokio::time::timeout(WAIT, reader).await???;
            let mut stderr = String::new();
            if let Some(mut err) = watch.stderr.take() {
                err.read_to_string(&mut stderr).await?;
            }
            for i in 6..9 {
                create(format!("r-{i:02}")).await?;
            }
            anyhow::Ok((exit, stderr))
        })
        .await?;
    setup.stack.hub = hub;
    // kubectl's watch ended cleanly: every event it printed is whole, and it says nothing
    // about a broken stream.
    let printed = kubectl_watch_events(&printed_now()?, true)?;
    tracing::info!(?exit, %stderr, events = printed.len(), "kubectl's watch ended");
    let names: Vec<&str> = printed.iter().map(|(_, n, _)| n.as_str()).collect();
    let expected: Vec<String> = (0..6).map(|i| format!("r-{i:02}")).collect();
    assert_eq!(
        names, expected,
        "kubectl printed each change once, in order"
    );
    for broken in [
        "unexpected EOF",
        "unexpected end",
        "decode",
        "INTERNAL_ERROR",
    ] {
        assert!(
            !stderr.contains(broken),
            "kubectl saw a broken stream: {stderr}"
        );
    }
    let (_, _, last) = printed
        .last()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("kubectl printed nothing"))?;
    assert_eq!(last.to_string(), last_before);
    setup
        .stack
        .hub
        .wait_connected(&setup.stack.account, 1)
        .await?;
    let newest = create("r-09".into()).await?;
    // Until the cache has caught up, a watch from `last` is tunnelled or waits: wait for it.
    loop {
        let reply = setup
            .get(
                &format!("{path}?resourceVersion={newest}&resourceVersionMatch=NotOlderThan"),
                None,
            )
            .await?;
        if wait_for("the cache catches up after the restart", &|| {
            Ok(reply.header("x-scale-agent-cache") == Some("hit"))
        })? {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // kubectl watches again from the last resourceVersion it printed, as a client-go
    // reflector does (with bookmarks allowed).
    let resumed = kubectl
        .run(
            &setup.stack.proxied,
            &args(&[
                "get",
                "--raw",
                &format!(
                    "{path}?watch=true&resourceVersion={last}&allowWatchBookmarks=true&timeoutSeconds=3"
                ),
            ]),
            None,
            KUBECTL_TIMEOUT,
        )
        .await?;
    ensure_ok("kubectl get --raw (watch again)", &resumed)?;
    let events = watch_events(&resumed.stdout)?;
    let expired = events
        .first()
        .is_some_and(|(t, code, _)| t == "ERROR" && code == "410");
    tracing::info!(expired, ?events, "kubectl's watch again from {last}");
    if expired {
        // 410: list again (from the cache) and have the API server's state.
        let listed = kubectl
            .run(
                &setup.stack.proxied,
                &args(&["get", "configmaps", "-n", &ns, "-o", "json"]),
                None,
                KUBECTL_TIMEOUT,
            )
            .await?;
        ensure_ok("kubectl get configmaps (list again)", &listed)?;
        let items: Value = serde_json::from_str(&listed.stdout)?;
        let state: std::collections::BTreeMap<String, u64> = items["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|cm| {
                Ok((
                    cm["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    cm["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .parse()?,
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        assert_eq!(state, api_state(&direct).await?, "the list after 410");
    } else {
        let changes: Vec<(String, u64)> = events
            .iter()
            .filter(|(t, _, _)| t != "BOOKMARK")
            .map(|(_, name, rv)| Ok((name.clone(), rv.parse()?)))
            .collect::<anyhow::Result<_>>()?;
        assert_eq!(
            changes,
            direct_watch(&admin, &path, &last.to_string()).await?,
            "the watch from {last} after the restart: proxy vs API server"
        );
        let names: Vec<&str> = changes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["r-06", "r-07", "r-08", "r-09"]);
    }
    // The reflector reaches the API server's state, every change after its last (re)list
    // once and in order.
    let want = api_state(&direct).await?;
    loop {
        let events = reflected
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .clone();
        let (state, problems) = reflect(&events);
        assert!(
            problems.is_empty(),
            "the watcher saw {problems:?} in {events:?}"
        );
        let relists = events.iter().filter(|e| **e == Reflected::Init).count();
        if wait_for("the watcher reaches the API server's state", &|| {
            Ok(state == want)
        })? {
            // The hub's last bookmark to it (its watch allows them) put it at the resume
            // point, which the history starts from after the restart: no relist.
            assert_eq!(
                relists, 1,
                "the watcher relisted after the restart: {events:?}"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    reflector.abort();
    setup.stop().await
}
