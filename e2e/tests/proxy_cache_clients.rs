//! Clients that compare what they read with what the API server would answer, served from
//! the hub's cache on a real control plane (issue 30):
//! - `kubectl patch` with a patch that changes nothing prints `patched (no change)` through
//!   the proxy as directly (kubectl compares the object it read, from the cache, with the
//!   patch's answer, managedFields included), and `kubectl diff` prints the same, with
//!   kubectl 1.37, 1.29 and 1.22;
//! - streaming lists (`sendInitialEvents=true&resourceVersionMatch=NotOlderThan`) come from
//!   the cache: ADDED for every object, the `k8s.io/initial-events-end` bookmark, then the
//!   changes; kube-rs's `watcher` with `streaming_lists()` syncs and sees a change, kubectl
//!   1.37's `delete --wait` returns; the API server's audit log shows no streaming list from
//!   the proxy (and does show the direct control's); the combinations the API server refuses
//!   are refused with its own status.

use std::{path::PathBuf, time::Duration};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::watcher,
};
use scale_agent_e2e::{
    fixtures,
    kubectl::Kubectl,
    proxy_stack::{ProxyStack, args, audited_control_plane, client_for, ensure_ok},
};
use serde_json::{Value, json};

const KUBECTL_TIMEOUT: Duration = Duration::from_secs(90);
const WAIT: Duration = Duration::from_secs(60);
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";
/// A finalizer no controller removes: the test does.
const HOLD: &str = "example.com/hold";

/// A hub and one agent streaming ConfigMaps and Deployments cluster-wide with a
/// ServiceAccount of its own; direct commands use the same identity.
struct Setup {
    stack: ProxyStack,
}

impl Setup {
    async fn new(name: &str) -> anyhow::Result<Setup> {
        fixtures::init_logs("warn");
        let identity = ProxyStack::identity(&format!("clients-{name}")).await?;
        let account = identity.account_name();
        let stack = identity
            .start(
                account,
                json!({ "kinds": ["configmaps", "deployments"] }),
                &format!("{name}-0"),
                "clients",
            )
            .await?;
        Ok(Setup { stack })
    }

    /// `GET <path>` through the proxy with the account's token.
    async fn get(&self, path: &str) -> anyhow::Result<scale_agent_e2e::http::Response> {
        Ok(self
            .stack
            .hub
            .call("GET", &format!("/clusters/{}{path}", self.stack.account))
            .bearer(&self.stack.token)
            .timeout(KUBECTL_TIMEOUT)
            .send()
            .await?)
    }

    /// Waits until the cache answers `path` (one object) at the API server's
    /// resourceVersion of it.
    async fn wait_cached(&self, direct: &Client, path: &str) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let want: Value = serde_json::from_str(
                &direct
                    .request_text(http::Request::get(path).body(Vec::new())?)
                    .await?,
            )?;
            let reply = self.get(path).await?;
            let got = reply.json_or_null();
            if reply.header("x-scale-agent-cache") == Some("hit")
                && got["metadata"]["resourceVersion"] == want["metadata"]["resourceVersion"]
            {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the cache never answered {path} at {}: {} {:?} {}",
                want["metadata"]["resourceVersion"],
                reply.status,
                reply.header("x-scale-agent-cache"),
                got["metadata"]["resourceVersion"]
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.stack.stop().await
    }
}

/// `kubectl diff`'s output with what differs by nature between two runs masked: the
/// temporary directories in its headers and the times (the dry-run's managedFields entry
/// takes the time of the request).
fn masked_diff(text: &str) -> String {
    text.lines()
        .map(|line| {
            if line.starts_with("diff ") || line.starts_with("--- ") || line.starts_with("+++ ") {
                line.split_whitespace()
                    .take(1)
                    .chain(["<header>"])
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                mask_times(line)
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// RFC 3339 times (`2026-12-07T11:37:14Z`) as `<time>`.
fn mask_times(line: &str) -> String {
    let bytes = line.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let candidate = &line[i..];
        let is_time = candidate.len() >= 20
            && candidate
                .bytes()
                .take(20)
                .enumerate()
                .all(|(k, b)| match k {
                    4 | 7 => b == b'-',
                    10 => b == b'T',
                    13 | 16 => b == b':',
                    19 => b == b'Z',
                    _ => b.is_ascii_digit(),
                });
        if is_time {
            out.push_str("<time>");
            i += 20;
        } else {
            let c = candidate.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

const CONFIGMAP: &str =
    r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"plain"},"data":{"a":"1"}}"#;
const DEPLOYMENT: &str = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web"},"spec":{"replicas":1,"selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"main","image":"nginx:1.27"}]}}}}"#;

/// With each kubectl: a patch that changes nothing, and `kubectl diff` of a change and of
/// no change, directly and through the proxy, on the same objects: the same output. The
/// objects were applied with `kubectl apply` (client-side: last-applied annotation and a
/// managedFields entry) and the cache holds them at the API server's resourceVersion.
async fn patch_and_diff_match(version: &str, binary: PathBuf) -> anyhow::Result<()> {
    let setup = Setup::new(&format!("patch-{}", version.replace('.', "-"))).await?;
    let ns = setup.stack.namespace.clone();
    let direct = Kubectl::new(binary.clone(), setup.stack.dir.join("home-direct"));
    let proxy = Kubectl::new(binary, setup.stack.dir.join("home-proxy"));
    for manifest in [CONFIGMAP, DEPLOYMENT] {
        ensure_ok(
            "kubectl apply",
            &direct
                .run(
                    &setup.stack.direct,
                    &args(&["apply", "-n", &ns, "-f", "-"]),
                    Some(manifest),
                    KUBECTL_TIMEOUT,
                )
                .await?,
        )?;
    }
    let direct_client = client_for(&setup.stack.direct).await?;
    setup
        .wait_cached(
            &direct_client,
            &format!("/api/v1/namespaces/{ns}/configmaps/plain"),
        )
        .await?;
    setup
        .wait_cached(
            &direct_client,
            &format!("/apis/apps/v1/namespaces/{ns}/deployments/web"),
        )
        .await?;
    let changed_configmap = CONFIGMAP.replace(r#""a":"1""#, r#""a":"2""#);
    let commands: Vec<(Vec<String>, Option<&str>)> = vec![
        (
            args(&[
                "patch",
                "configmap",
                "plain",
                "-n",
                &ns,
                "-p",
                r#"{"data":{"a":"1"}}"#,
            ]),
            None,
        ),
        (
            args(&[
                "patch",
                "deployment",
                "web",
                "-n",
                &ns,
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"replicas":1}}"#,
            ]),
            None,
        ),
        (args(&["diff", "-n", &ns, "-f", "-"]), Some(CONFIGMAP)),
        (
            args(&["diff", "-n", &ns, "-f", "-"]),
            Some(changed_configmap.as_str()),
        ),
        (args(&["diff", "-n", &ns, "-f", "-"]), Some(DEPLOYMENT)),
    ];
    for (command, stdin) in &commands {
        let a = direct
            .run(&setup.stack.direct, command, *stdin, KUBECTL_TIMEOUT)
            .await?;
        let b = proxy
            .run(&setup.stack.proxied, command, *stdin, KUBECTL_TIMEOUT)
            .await?;
        anyhow::ensure!(
            a.code == b.code
                && masked_diff(&a.stdout) == masked_diff(&b.stdout)
                && a.messages() == b.messages(),
            "kubectl {version} {command:?} differs:\ndirect ({:?}):\n{}{}\nproxy ({:?}):\n{}{}",
            a.code,
            a.stdout,
            a.messages(),
            b.code,
            b.stdout,
            b.messages()
        );
        if command[0] == "patch" {
            anyhow::ensure!(
                a.stdout.contains("patched (no change)"),
                "kubectl {version} {command:?}: {}",
                a.stdout
            );
        }
        eprintln!(
            "[clients] kubectl {version} {}: exit {:?} on both sides, {} lines of output equal",
            command.join(" "),
            a.code,
            a.stdout.lines().count()
        );
    }
    // The changed ConfigMap's diff is not empty (the comparison compared something).
    let changed = proxy
        .run(
            &setup.stack.proxied,
            &args(&["diff", "-n", &ns, "-f", "-"]),
            Some(&changed_configmap),
            KUBECTL_TIMEOUT,
        )
        .await?;
    anyhow::ensure!(
        changed.code == Some(1) && changed.stdout.contains("+  a: \"2\""),
        "kubectl {version} diff of a change through the proxy: {:?}\n{}{}",
        changed.code,
        changed.stdout,
        changed.stderr
    );
    setup.stop().await
}

#[tokio::test]
async fn patch_without_change_and_diff_match_direct_with_the_current_kubectl() -> anyhow::Result<()>
{
    let binaries = audited_control_plane()?.binaries();
    patch_and_diff_match(scale_agent_e2e::KUBERNETES_VERSION, binaries.kubectl()).await
}

#[tokio::test]
async fn patch_without_change_and_diff_match_direct_with_kubectl_1_29() -> anyhow::Result<()> {
    let binaries = audited_control_plane()?.binaries();
    patch_and_diff_match("v1.29", binaries.kubectl_client(29)).await
}

#[tokio::test]
async fn patch_without_change_and_diff_match_direct_with_kubectl_1_22() -> anyhow::Result<()> {
    let binaries = audited_control_plane()?.binaries();
    patch_and_diff_match("v1.22", binaries.kubectl_client(22)).await
}

/// A watch's lines: (type, name, resourceVersion, initial-events-end annotation).
fn lines(body: &str) -> anyhow::Result<Vec<(String, String, String, bool)>> {
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l)?;
            let meta = &v["object"]["metadata"];
            Ok((
                v["type"].as_str().unwrap_or_default().to_string(),
                meta["name"].as_str().unwrap_or_default().to_string(),
                meta["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                meta["annotations"][INITIAL_EVENTS_END] == "true",
            ))
        })
        .collect()
}

/// `GET path` straight to the API server: status and body, whatever the status.
async fn direct_get(client: &Client, path: &str) -> anyhow::Result<(u16, String)> {
    let request = http::Request::get(path).body(kube::client::Body::empty())?;
    let response = client.send(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect_bytes().await?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Requests as the agent's identity the API server received with `sendInitialEvents`.
fn streaming_lists_seen(user: &str) -> anyhow::Result<Vec<String>> {
    Ok(audited_control_plane()?
        .audit_events()?
        .into_iter()
        .filter(|e| e.user.username == user && e.request_uri.contains("sendInitialEvents"))
        .map(|e| format!("{} {}", e.verb, e.request_uri))
        .collect())
}

#[tokio::test]
async fn streaming_lists_come_from_the_cache() -> anyhow::Result<()> {
    let setup = Setup::new("stream").await?;
    let ns = setup.stack.namespace.clone();
    let admin = audited_control_plane()?.client().await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    for name in ["c", "a", "b"] {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": name }, "data": { "v": name },
        }))?;
        configmaps.create(&PostParams::default(), &cm).await?;
    }
    let direct_client = client_for(&setup.stack.direct).await?;
    setup
        .wait_cached(
            &direct_client,
            &format!("/api/v1/namespaces/{ns}/configmaps/c"),
        )
        .await?;
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    let streaming =
        "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=2";
    let before = streaming_lists_seen(&setup.stack.user)?.len();

    // Raw: ADDED for each object in key order, then the annotated bookmark at the list's
    // resourceVersion; without allowWatchBookmarks no bookmark; sendInitialEvents=false no
    // initial events.
    let listed = setup.get(&path).await?;
    let list_rv = listed.json_or_null()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let reply = setup
        .get(&format!("{path}?{streaming}&allowWatchBookmarks=true"))
        .await?;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-scale-agent-cache"), Some("hit"));
    let got = lines(&reply.body)?;
    let kinds: Vec<(&str, &str, bool)> = got
        .iter()
        .map(|(t, n, _, end)| (t.as_str(), n.as_str(), *end))
        .collect();
    assert_eq!(
        kinds,
        [
            ("ADDED", "a", false),
            ("ADDED", "b", false),
            ("ADDED", "c", false),
            ("BOOKMARK", "", true)
        ],
        "{}",
        reply.body
    );
    let bookmark_rv: u64 = got[3].2.parse()?;
    anyhow::ensure!(
        bookmark_rv >= list_rv.parse::<u64>()?,
        "the initial-events-end bookmark at {bookmark_rv}, before the list's {list_rv}"
    );
    let reply = setup.get(&format!("{path}?{streaming}")).await?;
    assert_eq!(reply.header("x-scale-agent-cache"), Some("hit"));
    let types: Vec<String> = lines(&reply.body)?.into_iter().map(|l| l.0).collect();
    assert_eq!(types, ["ADDED", "ADDED", "ADDED"], "{}", reply.body);
    let reply = setup
        .get(&format!(
            "{path}?watch=true&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&timeoutSeconds=1"
        ))
        .await?;
    assert_eq!(reply.header("x-scale-agent-cache"), Some("hit"));
    assert_eq!(lines(&reply.body)?, [], "{}", reply.body);

    // kube-rs's watcher with streaming lists: the three objects, the end of the initial
    // events, then a change made directly.
    let proxy_client = client_for(&setup.stack.proxied).await?;
    let proxied: Api<ConfigMap> = Api::namespaced(proxy_client, &ns);
    let mut stream = watcher(proxied, watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        let event = tokio::time::timeout(WAIT, stream.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("kube-rs's watcher ended"))??;
        match event {
            watcher::Event::Init => {}
            watcher::Event::InitApply(cm) => initial.push(cm.metadata.name.unwrap_or_default()),
            watcher::Event::InitDone => break,
            other => anyhow::bail!("kube-rs's watcher before InitDone: {other:?}"),
        }
    }
    initial.sort();
    assert_eq!(initial, ["a", "b", "c"]);
    // Held by a finalizer, so that kubectl's delete below has to wait for it.
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "d", "finalizers": [HOLD] },
    }))?;
    configmaps.create(&PostParams::default(), &cm).await?;
    loop {
        let event = tokio::time::timeout(WAIT, stream.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("kube-rs's watcher ended"))??;
        if let watcher::Event::Apply(cm) = event
            && cm.metadata.name.as_deref() == Some("d")
        {
            break;
        }
    }
    drop(stream);

    // kubectl 1.37's delete waits for the object to go with a streaming list (its -v=6 log
    // shows the request).
    let kubectl = Kubectl::new(
        audited_control_plane()?.binaries().kubectl(),
        setup.stack.dir.join("home-proxy"),
    );
    let delete = args(&[
        "delete",
        "configmap",
        "d",
        "-n",
        &ns,
        "--wait=true",
        "--timeout=60s",
        "-v=6",
    ]);
    let release = async {
        // Once kubectl waits (the object is marked deleted), the finalizer goes.
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let held = configmaps.get("d").await?;
            if held.metadata.deletion_timestamp.is_some() {
                break;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "kubectl never deleted d"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        configmaps
            .patch(
                "d",
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
            )
            .await?;
        anyhow::Ok(())
    };
    let (deleted, released) = tokio::join!(
        kubectl.run(&setup.stack.proxied, &delete, None, KUBECTL_TIMEOUT),
        release
    );
    released?;
    let deleted = deleted?;
    ensure_ok("kubectl delete --wait through the proxy", &deleted)?;
    assert!(
        deleted.stdout.contains("configmap \"d\" deleted"),
        "{}",
        deleted.stdout
    );
    let waited_with = deleted
        .stderr
        .lines()
        .filter(|l| l.contains("watch=true") && l.contains("/configmaps"))
        .map(str::to_string)
        .collect::<Vec<_>>();
    eprintln!("[clients] kubectl delete --wait watched with: {waited_with:#?}");
    anyhow::ensure!(
        waited_with
            .iter()
            .any(|l| l.contains("sendInitialEvents=true")),
        "kubectl delete --wait sent no streaming list: {}",
        deleted.stderr
    );

    // No streaming list from the proxy reached the API server.
    let seen = streaming_lists_seen(&setup.stack.user)?;
    anyhow::ensure!(
        seen.len() == before,
        "streaming lists reached the API server: {:#?}",
        &seen[before..]
    );

    // The control: the same streaming list directly is in the audit log, and its lines are
    // the cache's (the bookmark's version aside: the API server's own).
    let (status, body) = direct_get(
        &direct_client,
        &format!("{path}?{streaming}&allowWatchBookmarks=true"),
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    let direct_kinds: Vec<(String, String, bool)> = lines(&body)?
        .into_iter()
        .map(|(t, n, _, end)| (t, n, end))
        .collect();
    let direct_kinds: Vec<(&str, &str, bool)> = direct_kinds
        .iter()
        .map(|(t, n, end)| (t.as_str(), n.as_str(), *end))
        .collect();
    assert_eq!(
        direct_kinds,
        [
            ("ADDED", "a", false),
            ("ADDED", "b", false),
            ("ADDED", "c", false),
            ("BOOKMARK", "", true)
        ],
        "{body}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = streaming_lists_seen(&setup.stack.user)?;
    anyhow::ensure!(
        seen.len() > before,
        "the direct streaming list is not in the audit log: the check above proves nothing"
    );

    // The combinations the API server refuses: its status and message through the proxy.
    for query in [
        "watch=true&sendInitialEvents=true",
        "watch=true&sendInitialEvents=false",
        "watch=true&resourceVersionMatch=NotOlderThan",
        "watch=true&sendInitialEvents=true&resourceVersionMatch=Exact&resourceVersion=5",
        "watch=true&resourceVersionMatch=NotOlderThan&resourceVersion=5",
    ] {
        let (status, body) = direct_get(&direct_client, &format!("{path}?{query}")).await?;
        let reply = setup.get(&format!("{path}?{query}")).await?;
        anyhow::ensure!(
            status >= 400
                && reply.status == status
                && reply.json_or_null() == serde_json::from_str::<Value>(&body)?,
            "{query}: directly {status} {body}, through the proxy {} {}",
            reply.status,
            reply.body
        );
        eprintln!("[clients] {query}: {status} {body}");
    }
    setup.stop().await
}

/// client-go's informer in WatchList mode through the proxy (`watchlist-informer` of the
/// control plane's multi-call binary, built from the pinned client-go), asking for JSON: it
/// syncs (client-go waits for the initial-events-end bookmark) with the namespace's objects,
/// then sees a change; its own log shows a streaming list and no LIST, and the API server's
/// audit log shows neither from the proxy. Asking for protobuf (the typed clientset's
/// default), the same informer works through the tunnel: the cache answers JSON only.
#[tokio::test]
async fn a_client_go_informer_in_watch_list_mode_syncs_from_the_cache() -> anyhow::Result<()> {
    let setup = Setup::new("informer").await?;
    let ns = setup.stack.namespace.clone();
    let admin = audited_control_plane()?.client().await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    for name in ["b", "a"] {
        let cm: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": name } }))?;
        configmaps.create(&PostParams::default(), &cm).await?;
    }
    let direct_client = client_for(&setup.stack.direct).await?;
    setup
        .wait_cached(
            &direct_client,
            &format!("/api/v1/namespaces/{ns}/configmaps/a"),
        )
        .await?;
    for (protobuf, synced, created) in [(false, "a,b", "c"), (true, "a,b,c", "d")] {
        let before = streaming_lists_seen(&setup.stack.user)?.len();
        let lists_before = configmap_lists_seen(&setup.stack.user, &ns)?.len();
        let requests = run_informer(&setup, &configmaps, protobuf, synced, created).await?;
        anyhow::ensure!(
            requests
                .iter()
                .any(|l| l.contains("sendInitialEvents=true") && l.contains("200")),
            "the informer (protobuf: {protobuf}) sent no streaming list: {requests:#?}"
        );
        anyhow::ensure!(
            requests.iter().all(|l| l.contains("watch=true")),
            "the informer (protobuf: {protobuf}) listed: {requests:#?}"
        );
        let seen = streaming_lists_seen(&setup.stack.user)?;
        let lists = configmap_lists_seen(&setup.stack.user, &ns)?;
        if protobuf {
            anyhow::ensure!(
                seen.len() > before,
                "the protobuf informer's streaming list did not reach the API server"
            );
            continue;
        }
        anyhow::ensure!(
            seen.len() == before,
            "streaming lists reached the API server: {:#?}",
            &seen[before..]
        );
        anyhow::ensure!(
            lists.len() == lists_before,
            "the API server received requests for the namespace's ConfigMaps: {:#?}",
            &lists[lists_before..]
        );
    }
    setup.stop().await
}

/// Runs the informer through the proxy until it printed `SYNCED <synced>` and, after
/// `created` is created directly, `ADDED <created>`; returns its requests for ConfigMaps
/// (client-go's `-v=6` lines).
async fn run_informer(
    setup: &Setup,
    configmaps: &Api<ConfigMap>,
    protobuf: bool,
    synced: &str,
    created: &str,
) -> anyhow::Result<Vec<String>> {
    use tokio::io::AsyncBufReadExt as _;
    let stderr_path = setup.stack.dir.join(format!("informer-{protobuf}.stderr"));
    let mut child =
        tokio::process::Command::new(audited_control_plane()?.binaries().path("kube-testbins"))
            .args(["watchlist-informer", "--seconds=90", "-v=6"])
            .arg(format!("--protobuf={protobuf}"))
            .arg(format!("--kubeconfig={}", setup.stack.proxied.display()))
            .arg(format!("--namespace={}", setup.stack.namespace))
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&stderr_path)?)
            .kill_on_drop(true)
            .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut out = tokio::io::BufReader::new(stdout).lines();
    let mut next_line = async || -> anyhow::Result<String> {
        let line = tokio::time::timeout(WAIT, out.next_line()).await;
        let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        match line {
            Ok(Ok(Some(line))) => Ok(line),
            other => anyhow::bail!("the informer stopped or said nothing ({other:?}):\n{stderr}"),
        }
    };
    assert_eq!(next_line().await?, format!("SYNCED {synced}"));
    let cm: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": created } }))?;
    configmaps.create(&PostParams::default(), &cm).await?;
    assert_eq!(next_line().await?, format!("ADDED {created}"));
    child.kill().await?;
    let stderr = std::fs::read_to_string(&stderr_path)?;
    Ok(stderr
        .lines()
        .filter(|l| l.contains("\"Response\"") && l.contains("/configmaps"))
        .map(str::to_string)
        .collect())
}

/// Lists and watches of `namespace`'s ConfigMaps as the agent's identity the API server
/// received (the agent's own watch is cluster-wide).
fn configmap_lists_seen(user: &str, namespace: &str) -> anyhow::Result<Vec<String>> {
    let path = format!("/api/v1/namespaces/{namespace}/configmaps");
    Ok(audited_control_plane()?
        .audit_events()?
        .into_iter()
        .filter(|e| e.user.username == user && e.request_uri.starts_with(&path))
        .filter(|e| e.verb == "list" || e.verb == "watch")
        .map(|e| format!("{} {}", e.verb, e.request_uri))
        .collect())
}
