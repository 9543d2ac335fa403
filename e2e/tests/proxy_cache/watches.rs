//! Watches through the proxy replay the API server's events, and watches of namespaces
//! watched one by one, or from a version ahead of a quiet namespace, come from the cache.

use super::*;

/// Watches from the cache's history: from a list's resourceVersion the same events, in the
/// same order, as the API server's own watch (with and without a label selector that
/// changes move objects in and out of); without a version, ADDED for each object; from a
/// version older than the history, the API server's 410 ERROR event.
#[tokio::test]
async fn watches_replay_the_same_events_as_the_api_server() -> anyhow::Result<()> {
    let setup = Setup::new("watch", |_, _, _| async { Ok(()) }).await?;
    replay_watches(&setup).await?;
    setup.stop().await
}

/// Marks the query of the proxy's watches in [`replay_watches`], so that the API server's
/// audit log tells them from the same identity's direct watches (`timeout` is a general
/// request timeout, longer than the watches' `timeoutSeconds`; the cache ignores it).
const PROXIED_WATCH_MARK: &str = "timeout=41s";
const DIRECT_WATCH_MARK: &str = "timeout=42s";

/// WATCH requests as the agent's identity the API server received with `mark` in the query.
fn watches_seen_by_the_api_server(user: &str, mark: &str) -> anyhow::Result<Vec<String>> {
    Ok(audited_control_plane()?
        .audit_events()?
        .into_iter()
        .filter(|e| e.user.username == user && e.verb == "watch")
        .filter(|e| e.request_uri.contains(mark))
        .map(|e| e.request_uri)
        .collect())
}

/// The body of [`watches_replay_the_same_events_as_the_api_server`], for any account
/// whose agent watches the test namespace's ConfigMaps (cluster-wide or per namespace).
async fn replay_watches(setup: &Setup) -> anyhow::Result<()> {
    let ns = setup.stack.namespace.clone();
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    let listed = setup.get(&path, None).await?;
    assert_eq!(listed.header("x-scale-agent-cache"), Some("hit"));
    let from = listed.json_or_null()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // Changes directly on the API server: the agent's watch brings them to the cache.
    let admin = audited_control_plane()?.client().await?;
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let cm = |name: &str, app: &str, v: &str| -> anyhow::Result<ConfigMap> {
        Ok(serde_json::from_value(json!({
            "metadata": { "name": name, "labels": { "app": app } }, "data": { "v": v },
        }))?)
    };
    for i in 0..5u32 {
        let app = if i.is_multiple_of(2) { "web" } else { "db" };
        api.create(&PostParams::default(), &cm(&format!("w-{i}"), app, "1")?)
            .await?;
    }
    api.replace("w-1", &PostParams::default(), &cm("w-1", "web", "2")?)
        .await?;
    api.replace("w-0", &PostParams::default(), &cm("w-0", "db", "2")?)
        .await?;
    api.replace("w-4", &PostParams::default(), &cm("w-4", "web", "2")?)
        .await?;
    api.delete("w-2", &Default::default()).await?;
    let last = api
        .create(&PostParams::default(), &cm("w-last", "web", "1")?)
        .await?;
    let last_rv = last.metadata.resource_version.unwrap_or_default();
    // Wait for the cache to have the last change (a NotOlderThan list waits for it).
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let reply = setup
            .get(
                &format!("{path}?resourceVersion={last_rv}&resourceVersionMatch=NotOlderThan"),
                None,
            )
            .await?;
        if reply.header("x-scale-agent-cache") == Some("hit") {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the cache never reached {last_rv}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let direct = client_for(&setup.stack.direct).await?;
    for selector in ["", "&labelSelector=app%3Dweb"] {
        let query = format!("?watch=true&resourceVersion={from}&timeoutSeconds=3{selector}");
        let proxied = setup
            .get(&format!("{path}{query}&{PROXIED_WATCH_MARK}"), None)
            .await?;
        assert_eq!(proxied.status, 200, "{}", proxied.body);
        assert_eq!(
            proxied.header("x-scale-agent-cache"),
            Some("hit"),
            "the watch {query} was not served by the cache"
        );
        let request =
            http::Request::get(format!("{path}{query}&{DIRECT_WATCH_MARK}")).body(Vec::new())?;
        let expected = watch_events(&direct.request_text(request).await?)?;
        let got = watch_events(&proxied.body)?;
        anyhow::ensure!(
            expected.len() >= 6,
            "the direct watch {query} saw only {expected:?}: the comparison would prove little"
        );
        assert_eq!(got, expected, "watch {query}: proxy vs direct");
    }
    // No version: the current objects as ADDED, like the API server.
    let query = "?watch=true&timeoutSeconds=2";
    let proxied = setup
        .get(&format!("{path}{query}&{PROXIED_WATCH_MARK}"), None)
        .await?;
    assert_eq!(proxied.header("x-scale-agent-cache"), Some("hit"));
    let request =
        http::Request::get(format!("{path}{query}&{DIRECT_WATCH_MARK}")).body(Vec::new())?;
    let expected = watch_events(&direct.request_text(request).await?)?;
    assert_eq!(
        watch_events(&proxied.body)?,
        expected,
        "watch without a version"
    );
    assert!(expected.iter().all(|(t, _, _)| t == "ADDED") && expected.len() == 5);
    // Older than the history: 410 Expired as an ERROR event, and a message saying what to do.
    let gone = setup
        .get(
            &format!("{path}?watch=true&resourceVersion=1&timeoutSeconds=5&{PROXIED_WATCH_MARK}"),
            None,
        )
        .await?;
    assert_eq!(gone.header("x-scale-agent-cache"), Some("hit"));
    let line: Value = serde_json::from_str(gone.body.lines().next().unwrap_or_default())?;
    assert_eq!(line["type"], "ERROR", "{}", gone.body);
    assert_eq!(line["object"]["code"], 410);
    assert_eq!(line["object"]["reason"], "Expired");
    assert!(
        line["object"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("list again"),
        "{line}"
    );
    // The API server's own word: it saw the direct watches, and none of the proxy's.
    let direct_watches = watches_seen_by_the_api_server(&setup.stack.user, DIRECT_WATCH_MARK)?;
    // (A watch is logged when its response starts and when it completes.)
    anyhow::ensure!(
        direct_watches.len() >= 3,
        "the audit log shows {direct_watches:#?} of the 3 direct watches: it would not see the \
         proxy's either"
    );
    let proxied_watches = watches_seen_by_the_api_server(&setup.stack.user, PROXIED_WATCH_MARK)?;
    anyhow::ensure!(
        proxied_watches.is_empty(),
        "the proxy's watches reached the API server: {proxied_watches:#?}"
    );
    Ok(())
}

/// An account whose agent watches each namespace on its own (`namespaces:`): a watch of one
/// of them is served from that namespace's watch in the cache, with the API server's
/// events (with a selector too), its 410, and no WATCH reaching the API server (its audit
/// log says so); a watch of all namespaces, which no one of the agent's watches covers, is
/// tunnelled.
#[tokio::test]
async fn watches_of_namespaces_watched_one_by_one_come_from_the_cache() -> anyhow::Result<()> {
    let setup = Setup::per_namespace("nswatch").await?;
    replay_watches(&setup).await?;
    // The other namespace's watch has its own resume point and history: a watch of it from
    // its list's resourceVersion is served, and sees a change made there.
    let second = setup.collections[2].clone();
    let listed = setup.get(&second, None).await?;
    assert_eq!(listed.header("x-scale-agent-cache"), Some("hit"));
    let from = listed.json_or_null()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let second_ns = second.split('/').nth(4).unwrap_or_default().to_string();
    let admin = audited_control_plane()?.client().await?;
    let created = Api::<ConfigMap>::namespaced(admin, &second_ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "in-second" } }))?,
        )
        .await?;
    let rv = created.metadata.resource_version.unwrap_or_default();
    let watched = setup
        .get(
            &format!("{second}?watch=true&resourceVersion={from}&timeoutSeconds=2"),
            None,
        )
        .await?;
    assert_eq!(watched.header("x-scale-agent-cache"), Some("hit"));
    assert_eq!(
        watch_events(&watched.body)?,
        [("ADDED".to_string(), "in-second".to_string(), rv)],
        "{}",
        watched.body
    );
    // All namespaces: not one of the agent's watches, so tunnelled, and outside the
    // account's namespaces, so the agent refuses it (issue 28, F8).
    let all = setup
        .get("/api/v1/configmaps?watch=true&timeoutSeconds=1", None)
        .await?;
    assert_eq!(all.status, 403, "{}", all.body);
    assert_eq!(all.header("x-scale-agent-cache"), Some("tunnel"));
    assert!(
        all.body
            .contains("across all namespaces or on cluster-scoped objects"),
        "{}",
        all.body
    );
    setup.stop().await
}

/// The resourceVersion of a direct LIST of `path` (one item, as the bench takes it): the API
/// server's current version, ahead of a quiet namespace's resume point in the hub.
async fn direct_version(client: &Client, path: &str) -> anyhow::Result<String> {
    let request = http::Request::get(format!("{path}?limit=1")).body(Vec::new())?;
    let list: Value = serde_json::from_str(&client.request_text(request).await?)?;
    Ok(list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// Another namespace's change moves the API server's resourceVersion past a quiet
/// namespace's resume point in the hub, where only the API server's bookmarks (about once a
/// minute) would move it. A watch of the quiet namespace from the API server's version (as
/// measure 9 of the bench opens it) is still served by the cache, with the API server's
/// events, and the audit log shows none of the proxy's watches.
#[tokio::test]
async fn a_watch_from_a_version_ahead_of_a_quiet_namespace_comes_from_the_cache()
-> anyhow::Result<()> {
    let setup = Setup::per_namespace("ahead").await?;
    let path = format!("/api/v1/namespaces/{}/configmaps", setup.stack.namespace);
    let second = setup.collections[2].clone();
    let second_ns = second.split('/').nth(4).unwrap_or_default().to_string();
    let admin = audited_control_plane()?.client().await?;
    let direct = client_for(&setup.stack.direct).await?;
    let listed = setup.get(&path, None).await?;
    assert_eq!(listed.header("x-scale-agent-cache"), Some("hit"));
    let before: u64 = listed.json_or_null()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .parse()?;
    // A change in the other namespace the agent watches: another scope moves on.
    Api::<ConfigMap>::namespaced(admin.clone(), &second_ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "elsewhere" } }))?,
        )
        .await?;
    let ahead = direct_version(&direct, &path).await?;
    anyhow::ensure!(
        ahead.parse::<u64>()? > before,
        "the API server's version {ahead} is not ahead of the namespace's {before}"
    );
    let query = format!("?watch=true&resourceVersion={ahead}&timeoutSeconds=2");
    let watched = setup
        .get(&format!("{path}{query}&{PROXIED_WATCH_MARK}"), None)
        .await?;
    assert_eq!(watched.status, 200, "{}", watched.body);
    assert_eq!(
        watched.header("x-scale-agent-cache"),
        Some("hit"),
        "a watch from {ahead} (the namespace's resume point was {before})"
    );
    assert_eq!(watch_events(&watched.body)?, []);
    // A change in the namespace after that version: the API server's events, and the
    // other namespace's change (between the resume point and the version) is not one.
    let created = Api::<ConfigMap>::namespaced(admin.clone(), &setup.stack.namespace)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "after" } }))?,
        )
        .await?;
    let watched = setup
        .get(&format!("{path}{query}&{PROXIED_WATCH_MARK}"), None)
        .await?;
    assert_eq!(watched.header("x-scale-agent-cache"), Some("hit"));
    let request =
        http::Request::get(format!("{path}{query}&{DIRECT_WATCH_MARK}")).body(Vec::new())?;
    let expected = watch_events(&direct.request_text(request).await?)?;
    assert_eq!(
        expected,
        [(
            "ADDED".to_string(),
            "after".to_string(),
            created.metadata.resource_version.unwrap_or_default()
        )]
    );
    assert_eq!(watch_events(&watched.body)?, expected);
    let proxied = watches_seen_by_the_api_server(&setup.stack.user, PROXIED_WATCH_MARK)?;
    anyhow::ensure!(
        proxied.is_empty(),
        "the proxy's watches reached the API server: {proxied:#?}"
    );
    setup.stop().await
}
