//! Reads through the proxy against the API server's: every read form, paging, caching
//! cycles that send the API server no LIST, and reads right after writes.

use super::*;

/// Every `kubectl get` form over every kind: the same through the proxy (from the cache)
/// as directly; the hub's answers to the same reads say they came from the cache.
#[tokio::test]
async fn every_read_form_equals_the_api_servers() -> anyhow::Result<()> {
    let setup = Setup::new("forms", seed_objects).await?;
    let ns = setup.stack.namespace.clone();
    let widgets = format!("widgets.{}", setup.widget_group);
    let direct = setup.kubectl("direct")?;
    let proxy = setup.kubectl("proxy")?;
    let mut forms: Vec<(Vec<String>, bool)> = Vec::new();
    for kind in [
        "deployments",
        "replicasets",
        "pods",
        "services",
        "configmaps",
        widgets.as_str(),
    ] {
        let json_form = |extra: &[&str]| {
            let mut a = args(&["get", kind, "-n", &ns, "-o", "json"]);
            a.extend(args(extra));
            (a, true)
        };
        forms.push(json_form(&[]));
        forms.push(json_form(&["-l", "app=web"]));
        forms.push(json_form(&["-l", "app==web,tier!=back"]));
        forms.push(json_form(&["-l", "tier in (front,back)"]));
        forms.push(json_form(&["-l", "app notin (db),!tier"]));
        forms.push(json_form(&["-l", "tier"]));
        forms.push(json_form(&["--field-selector", "metadata.name=o-2"]));
        forms.push(json_form(&[
            "--field-selector",
            "metadata.name!=o-2,metadata.namespace=",
        ]));
        forms.push(json_form(&["--chunk-size=1"]));
        forms.push((args(&["get", kind, "o-1", "-n", &ns, "-o", "json"]), true));
        forms.push((
            args(&["get", kind, "missing", "-n", &ns, "-o", "json"]),
            false,
        ));
        forms.push((args(&["get", kind, "-n", &ns, "-o", "name"]), false));
        forms.push((
            args(&["get", kind, "-A", "-o", "json", "-l", "app=web"]),
            true,
        ));
        // Tables: the API server computes built-in kinds' columns; both sides tunnel them.
        forms.push((args(&["get", kind, "-n", &ns]), false));
    }
    forms.push((args(&["get", "secrets", "-n", &ns, "-o", "json"]), true));
    forms.push((args(&["get", "namespaces", &ns, "-o", "json"]), true));
    forms.push((args(&["get", "namespaces", "-o", "json"]), true));
    forms.push((
        args(&["get", "customresourcedefinitions", &widgets, "-o", "json"]),
        true,
    ));
    for (form, json) in &forms {
        let a = direct
            .run(&setup.stack.direct, form, None, KUBECTL_TIMEOUT)
            .await?;
        let b = proxy
            .run(&setup.stack.proxied, form, None, KUBECTL_TIMEOUT)
            .await?;
        anyhow::ensure!(
            a.code == b.code,
            "kubectl {form:?}: exit {:?} directly, {:?} through the proxy\n{}\n{}",
            a.code,
            b.code,
            a.stderr,
            b.stderr
        );
        if *json && a.success() {
            let (x, y) = (
                only_namespace(normalized(serde_json::from_str(&a.stdout)?), &ns),
                only_namespace(normalized(serde_json::from_str(&b.stdout)?), &ns),
            );
            anyhow::ensure!(
                x == y,
                "kubectl {form:?} differs:\ndirect: {x:#}\nproxy:  {y:#}"
            );
            anyhow::ensure!(
                x.get("items")
                    .is_none_or(|i| i.as_array().is_some_and(|a| !a.is_empty()))
                    || form
                        .iter()
                        .any(|f| f.starts_with("-l") || f.starts_with("--field")),
                "kubectl {form:?} listed nothing: the comparison would prove nothing"
            );
        } else {
            anyhow::ensure!(
                masked_table(&a.stdout) == masked_table(&b.stdout) && a.messages() == b.messages(),
                "kubectl {form:?} differs:\ndirect: {}{}\nproxy:  {}{}",
                a.stdout,
                a.messages(),
                b.stdout,
                b.messages()
            );
        }
    }

    // A kube client: typed lists, gets and metadata-only reads.
    let direct_client = client_for(&setup.stack.direct).await?;
    let proxy_client = client_for(&setup.stack.proxied).await?;
    let same = |what: &str, a: Value, b: Value| -> anyhow::Result<()> {
        let (mut a, mut b) = (normalized(a), normalized(b));
        if what.starts_with("Secret") {
            // The hub holds Secrets as metadata without managedFields (their fieldsV1 name
            // the data's keys; agent/src/convert.rs): only there do the two sides differ.
            without_managed_fields(&mut a);
            without_managed_fields(&mut b);
        }
        anyhow::ensure!(a == b, "{what} differs:\ndirect: {a:#}\nproxy:  {b:#}");
        Ok(())
    };
    macro_rules! compare_kind {
        ($t:ty) => {{
            let d: Api<$t> = Api::namespaced(direct_client.clone(), &ns);
            let p: Api<$t> = Api::namespaced(proxy_client.clone(), &ns);
            for lp in [
                ListParams::default(),
                ListParams::default().labels("app=web,tier"),
                ListParams::default().fields("metadata.name=o-3"),
                ListParams::default().limit(3),
            ] {
                let what = format!("{} list {lp:?}", stringify!($t));
                same(
                    &what,
                    serde_json::to_value(d.list(&lp).await?.items)?,
                    serde_json::to_value(p.list(&lp).await?.items)?,
                )?;
                same(
                    &format!("{what} (metadata)"),
                    serde_json::to_value(d.list_metadata(&lp).await?.items)?,
                    serde_json::to_value(p.list_metadata(&lp).await?.items)?,
                )?;
            }
            same(
                &format!("{} get", stringify!($t)),
                serde_json::to_value(d.get("o-0").await?)?,
                serde_json::to_value(p.get("o-0").await?)?,
            )?;
            same(
                &format!("{} get_metadata", stringify!($t)),
                serde_json::to_value(d.get_metadata("o-0").await?)?,
                serde_json::to_value(p.get_metadata("o-0").await?)?,
            )?;
        }};
    }
    compare_kind!(Deployment);
    compare_kind!(ReplicaSet);
    compare_kind!(Pod);
    compare_kind!(Service);
    compare_kind!(ConfigMap);
    compare_kind!(Secret);
    let wr = widget_resource(&setup.widget_group);
    let d: Api<DynamicObject> = Api::namespaced_with(direct_client.clone(), &ns, &wr);
    let p: Api<DynamicObject> = Api::namespaced_with(proxy_client.clone(), &ns, &wr);
    same(
        "widget list",
        serde_json::to_value(
            d.list(&ListParams::default().labels("app in (web)"))
                .await?
                .items,
        )?,
        serde_json::to_value(
            p.list(&ListParams::default().labels("app in (web)"))
                .await?
                .items,
        )?,
    )?;

    // Who answered: the cache for JSON, metadata and Table reads (Tables since issue 30),
    // the tunnel for Secret data and Secrets' Tables (their Data column counts the data);
    // a missing object is the API server's NotFound, from the cache.
    let configmaps = format!("/api/v1/namespaces/{ns}/configmaps");
    let secrets = format!("/api/v1/namespaces/{ns}/secrets");
    let metadata_list =
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    for (path, accept, who) in [
        (configmaps.clone(), None, "hit"),
        (
            format!("{configmaps}?labelSelector=app%3Dweb&limit=2"),
            None,
            "hit",
        ),
        (format!("{configmaps}/o-1"), None, "hit"),
        (format!("{configmaps}/missing"), None, "hit"),
        (secrets.clone(), None, "tunnel"),
        (format!("{secrets}/o-1"), None, "tunnel"),
        (secrets.clone(), Some(metadata_list), "hit"),
        (configmaps.clone(), Some(table), "hit"),
        (secrets.clone(), Some(table), "tunnel"),
        (
            format!("{configmaps}?fieldSelector=data.i%3D1"),
            None,
            "tunnel",
        ),
        (format!("/api/v1/namespaces/{ns}/events"), None, "tunnel"),
    ] {
        let reply = setup.get(&path, accept).await?;
        anyhow::ensure!(
            reply.header("x-scale-agent-cache") == Some(who),
            "GET {path} (accept {accept:?}) was answered by {:?}, not {who}: {} {}",
            reply.header("x-scale-agent-cache"),
            reply.status,
            reply.body
        );
    }
    let missing = setup.get(&format!("{configmaps}/missing"), None).await?;
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.json_or_null()["message"],
        "configmaps \"missing\" not found"
    );
    let secret_metadata = setup.get(&secrets, Some(metadata_list)).await?;
    anyhow::ensure!(
        !secret_metadata.body.contains("secret-") && !secret_metadata.body.contains("c2VjcmV0"),
        "Secret data in a metadata-only list from the cache: {}",
        secret_metadata.body
    );
    setup.stop().await
}

/// 5,000 ConfigMaps paged with limit=500 from the cache: each exactly once, in pages of 500
/// under continue tokens; a stale token is `410 Expired`, a token of another list `400`.
#[tokio::test]
async fn paging_returns_each_object_once_and_expired_tokens_are_gone() -> anyhow::Result<()> {
    const COUNT: usize = 5_000;
    let setup = Setup::new("paging", |admin, ns, _| async move {
        let api: Api<ConfigMap> = Api::namespaced(admin, &ns);
        futures::stream::iter(0..COUNT)
            .map(|i| {
                let api = api.clone();
                async move {
                    let cm: ConfigMap = serde_json::from_value(json!({
                        "metadata": { "name": format!("cm-{i:05}"), "labels": { "even": i.is_multiple_of(2).to_string() } },
                    }))?;
                    api.create(&PostParams::default(), &cm).await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    })
    .await?;
    let ns = setup.stack.namespace.clone();
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    let mut names = Vec::new();
    let mut pages = 0;
    let mut next: Option<String> = None;
    loop {
        let query = match &next {
            Some(token) => format!("?limit=500&continue={token}"),
            None => "?limit=500".to_string(),
        };
        let reply = setup.get(&format!("{path}{query}"), None).await?;
        anyhow::ensure!(
            reply.status == 200 && reply.header("x-scale-agent-cache") == Some("hit"),
            "page {pages}: {} {:?} {}",
            reply.status,
            reply.header("x-scale-agent-cache"),
            reply.body.chars().take(300).collect::<String>()
        );
        let page = reply.json_or_null();
        let items = page["items"].as_array().cloned().unwrap_or_default();
        anyhow::ensure!(items.len() <= 500, "a page of {} items", items.len());
        names.extend(items.iter().map(|i| {
            i["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        }));
        pages += 1;
        next = page["metadata"]["continue"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        if next.is_none() {
            break;
        }
        anyhow::ensure!(
            page["metadata"]["remainingItemCount"].as_u64() == Some((COUNT - names.len()) as u64),
            "remainingItemCount {} after {} items",
            page["metadata"]["remainingItemCount"],
            names.len()
        );
    }
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(names.len(), COUNT, "every object once");
    assert_eq!(unique.len(), COUNT, "no object twice");
    assert_eq!(pages, COUNT / 500);
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "the API server's order");

    // The kube client pages the same way through the proxy and directly.
    let proxy_client = client_for(&setup.stack.proxied).await?;
    let direct_client = client_for(&setup.stack.direct).await?;
    for client in [&proxy_client, &direct_client] {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let mut lp = ListParams::default().limit(500).labels("even=true");
        let mut seen = BTreeSet::new();
        loop {
            let page = api.list(&lp).await?;
            for item in page.items {
                anyhow::ensure!(seen.insert(item.metadata.name.unwrap_or_default()), "twice");
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => lp = lp.continue_token(&token),
                None => break,
            }
        }
        assert_eq!(seen.len(), COUNT / 2);
    }

    // Tokens: a token of the hub it no longer holds is 410 Expired (the API server's
    // answer to a compacted one), another list's is refused.
    let first = setup
        .get(&format!("{path}?limit=500"), None)
        .await?
        .json_or_null();
    let token = first["metadata"]["continue"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(token.starts_with("scale-agent-hub."), "token {token:?}");
    let other = setup
        .get(
            &format!("{path}?limit=500&labelSelector=even%3Dtrue&continue={token}"),
            None,
        )
        .await?;
    assert_eq!(other.status, 400, "{}", other.body);
    assert!(
        other.json_or_null()["message"]
            .as_str()
            .unwrap_or_default()
            .contains("same query")
    );
    let gone = setup
        .get(
            &format!("{path}?limit=500&continue=scale-agent-hub.987654321.500"),
            None,
        )
        .await?;
    assert_eq!(gone.status, 410, "{}", gone.body);
    let status = gone.json_or_null();
    assert_eq!(status["reason"], "Expired");
    assert!(
        status["message"]
            .as_str()
            .unwrap_or_default()
            .contains("start the list again without the continue parameter"),
        "{status}"
    );
    setup.stop().await
}

/// LIST requests for the test's kinds the API server received as the agent's identity.
fn lists_seen_by_the_api_server(user: &str) -> anyhow::Result<Vec<String>> {
    Ok(audited_control_plane()?
        .audit_events()?
        .into_iter()
        .filter(|e| e.user.username == user)
        .filter(|e| e.verb == "list" || (e.verb == "watch" && e.user_agent.starts_with("kubectl/")))
        .map(|e| format!("{} {}", e.verb, e.request_uri))
        .collect())
}

/// Clouddriver's caching cycle (`kubectl get <kinds> -o json`, per namespace and across
/// all) through the proxy: the API server receives no LIST for any of them, by its own
/// audit log. The same cycle directly is the control: it does.
#[tokio::test]
async fn caching_cycles_send_no_list_to_the_api_server() -> anyhow::Result<()> {
    let setup = Setup::new("cycles", seed_objects).await?;
    let ns = setup.stack.namespace.clone();
    let kinds = format!(
        "deployments,replicasets,pods,services,configmaps,widgets.{}",
        setup.widget_group
    );
    let cycle = [
        args(&["get", &kinds, "-n", &ns, "-o", "json"]),
        args(&["get", &kinds, "--all-namespaces", "-o", "json"]),
        args(&["get", "namespaces", "-o", "json"]),
        args(&["get", "customresourcedefinitions", "-o", "json"]),
        args(&["get", "secrets", "-n", &ns, "-o", "json", "--show-kind"]),
    ];
    let direct = setup.kubectl("direct")?;
    let proxy = setup.kubectl("proxy")?;
    let before = lists_seen_by_the_api_server(&setup.stack.user)?.len();
    for command in &cycle {
        ensure_ok(
            "direct",
            &direct
                .run(&setup.stack.direct, command, None, KUBECTL_TIMEOUT)
                .await?,
        )?;
    }
    let direct_lists = lists_seen_by_the_api_server(&setup.stack.user)?.len() - before;
    anyhow::ensure!(
        direct_lists >= 9,
        "a direct cycle sent {direct_lists} LISTs as {}: the audit log does not see them",
        setup.stack.user
    );
    let before = lists_seen_by_the_api_server(&setup.stack.user)?;
    for round in 0..3 {
        for command in &cycle {
            let outcome = proxy
                .run(&setup.stack.proxied, command, None, KUBECTL_TIMEOUT)
                .await?;
            ensure_ok(&format!("round {round} through the proxy"), &outcome)?;
        }
    }
    let after = lists_seen_by_the_api_server(&setup.stack.user)?;
    let new: Vec<&String> = after[before.len()..].iter().collect();
    // Secrets' data is only on the API server: that one list per round goes through.
    let unexpected: Vec<&&String> = new.iter().filter(|l| !l.contains("/secrets")).collect();
    anyhow::ensure!(
        unexpected.is_empty(),
        "the API server received LISTs of cached kinds during the caching cycles: {unexpected:#?}"
    );
    assert_eq!(
        new.len(),
        3,
        "one tunnelled Secret list per round: {new:#?}"
    );
    setup.stop().await
}

/// Read-your-writes: 200 times, apply a change through the proxy and at once get and list
/// it through the proxy: always the new state; and a delete is never read back.
#[tokio::test]
async fn reads_right_after_writes_through_the_proxy_see_them() -> anyhow::Result<()> {
    let setup = Setup::new("ryw", |_, _, _| async { Ok(()) }).await?;
    let ns = setup.stack.namespace.clone();
    let client = client_for(&setup.stack.proxied).await?;
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    let params = PatchParams::apply("cache-test").force();
    let mut from_cache = 0;
    for i in 0..200 {
        let name = format!("ryw-{}", i % 7);
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": name, "labels": { "round": i.to_string() } },
            "data": { "i": i.to_string() },
        });
        let written = api.patch(&name, &params, &Patch::Apply(&cm)).await?;
        let rv = written
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let got = api.get(&name).await?;
        anyhow::ensure!(
            got.data.as_ref().and_then(|d| d.get("i")) == Some(&i.to_string()),
            "round {i}: get returned {:?} (rv {:?}) after a write at rv {rv}",
            got.data,
            got.metadata.resource_version
        );
        let listed = api
            .list(&ListParams::default().labels(&format!("round={i}")))
            .await?;
        anyhow::ensure!(
            listed.items.len() == 1,
            "round {i}: the list by the new label found {} objects",
            listed.items.len()
        );
        let reply = setup
            .get(&format!("/api/v1/namespaces/{ns}/configmaps/{name}"), None)
            .await?;
        anyhow::ensure!(
            reply.json_or_null()["data"]["i"].as_str() == Some(i.to_string().as_str()),
            "round {i}: raw get {}",
            reply.body
        );
        if reply.header("x-scale-agent-cache") == Some("hit") {
            from_cache += 1;
        }
        if i % 20 == 19 {
            api.delete(&name, &Default::default()).await?;
            let after = setup
                .get(&format!("/api/v1/namespaces/{ns}/configmaps/{name}"), None)
                .await?;
            anyhow::ensure!(
                after.status == 404,
                "round {i}: a deleted object was read back: {} {:?} {}",
                after.status,
                after.header("x-scale-agent-cache"),
                after.body
            );
            let listed = api.list(&ListParams::default()).await?;
            anyhow::ensure!(
                listed
                    .items
                    .iter()
                    .all(|c| c.metadata.name.as_deref() != Some(name.as_str())),
                "round {i}: a deleted object was listed"
            );
        }
    }
    tracing::info!(from_cache, "reads after writes answered by the cache");
    // The cache normally has the write within milliseconds of its answer; reads wait up to
    // 3 s for it. Mostly tunnelled reads would make this test prove nothing.
    anyhow::ensure!(
        from_cache >= 100,
        "only {from_cache} of 200 reads after a write were answered by the cache"
    );
    setup.stop().await
}
