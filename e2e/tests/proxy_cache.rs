//! The proxy's reads from the hub's cache, on a real control plane, with real kubectl and a
//! real kube client: what the cache answers equals what the API server answers directly
//! (as the same identity), paging covers every object once, the API server receives no
//! LIST during Clouddriver-style caching cycles (its own audit log says so), a read
//! right after a write through the proxy shows that write, and watches through the proxy
//! miss and repeat nothing across an agent failover (clean stop or SIGKILL) and a hub
//! restart.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::{ConfigMap, Pod, Secret, Service},
};
use kube::{
    Api, Client, Config,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    core::{ApiResource, GroupVersionKind},
};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    fixtures::{self, TlsHub, temp_dir},
    kubectl::{Kubectl, Outcome},
    process::ManagedProcess,
};
use serde_json::{Value, json};

/// The agent as a process, for the replica that gets SIGKILL.
const AGENT: &str = env!("CARGO_BIN_EXE_e2e-agent");
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(90);
const WAIT: Duration = Duration::from_secs(120);
/// The kinds the test account streams (the agent's `kinds`), besides the widget CRD's.
const KINDS: &[&str] = &[
    "deployments",
    "replicasets",
    "pods",
    "services",
    "configmaps",
    "secrets",
    "namespaces",
    "customresourcedefinitions",
];

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(|| {
        ControlPlaneOptions::default().with_audit()
    })?)
}

fn init_logs() {
    scale_agent_e2e::fixtures::init_logs("warn,scale_agent_hub_proxy=info");
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

async fn client_for(kubeconfig: &Path) -> anyhow::Result<Client> {
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    Ok(Client::try_from(config)?)
}

/// A hub, one agent streaming [`KINDS`] and the widget kind cluster-wide (or, with
/// [`Setup::per_namespace`], ConfigMaps and Deployments in two namespaces, one watch each)
/// with the credentials of a ServiceAccount of its own, and clients of both sides.
struct Setup {
    dir: PathBuf,
    hub: TlsHub,
    account: String,
    /// The namespace the test's objects live in.
    namespace: String,
    widget_group: String,
    /// The agent's own kubeconfig: direct reads use it, so both sides read as one identity.
    direct: PathBuf,
    proxied: PathBuf,
    token: String,
    /// `system:serviceaccount:<ns>:agent`, as the audit log names the agent.
    user: String,
    agent: Option<scale_agent::AgentHandle>,
    /// The collection paths of every streamed kind the cache answers.
    collections: Vec<String>,
}

impl Setup {
    /// Seeds the namespace with `seed` before the agent starts, so its first snapshot holds
    /// every object.
    async fn new<F, Fut>(name: &str, seed: F) -> anyhow::Result<Setup>
    where
        F: FnOnce(Client, String, String) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>>,
    {
        Self::start(name, seed, false).await
    }

    /// An account with `namespaces:` (the test namespace and one more, empty), streaming
    /// ConfigMaps and Deployments: the agent watches each kind once per namespace.
    async fn per_namespace(name: &str) -> anyhow::Result<Setup> {
        Self::start(name, |_, _, _| async { Ok(()) }, true).await
    }

    async fn start<F, Fut>(name: &str, seed: F, per_namespace: bool) -> anyhow::Result<Setup>
    where
        F: FnOnce(Client, String, String) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>>,
    {
        init_logs();
        let control_plane = control_plane()?;
        let admin = control_plane.client().await?;
        let home = control_plane
            .namespace(&admin, &format!("cache-{name}"))
            .await?;
        let namespace = control_plane
            .namespace(&admin, &format!("cache-{name}-objects"))
            .await?;
        let widget_group = format!("{home}.example.com");
        install_widget_crd(&admin, &widget_group).await?;
        seed(admin.clone(), namespace.clone(), widget_group.clone()).await?;
        let dir = temp_dir(&format!("cache-{name}"))?;
        let direct = fixtures::service_account_identity(
            control_plane,
            &admin,
            &home,
            "agent",
            fixtures::Scope::Cluster,
            fixtures::admin_rules(),
            dir.join("agent.kubeconfig"),
        )
        .await?;
        let hub = TlsHub::start(&dir, |_| {}).await?;
        let account = format!(
            "cache-{name}-{}-{:04x}",
            std::process::id(),
            rand::random::<u16>()
        );
        let mut kinds: Vec<String> = KINDS.iter().map(|k| k.to_string()).collect();
        kinds.push(format!("widgets.{widget_group}"));
        // Opted in to Secret data through the proxy: these tests compare every read with
        // the API server's, Secrets' data included (tunnelled); the default is in
        // hub/tests/proxy_secrets.rs.
        let mut account_config = json!({
            "name": account,
            "kubeconfigFile": direct.display().to_string(),
            "kinds": kinds,
            "allowSecretData": true,
        });
        let collections = if per_namespace {
            let second = control_plane
                .namespace(&admin, &format!("cache-{name}-second"))
                .await?;
            account_config["kinds"] = json!(["configmaps", "deployments"]);
            account_config["namespaces"] = json!([namespace, second]);
            vec![
                format!("/api/v1/namespaces/{namespace}/configmaps"),
                format!("/apis/apps/v1/namespaces/{namespace}/deployments"),
                format!("/api/v1/namespaces/{second}/configmaps"),
            ]
        } else {
            Self::cluster_wide_collections(&namespace, &widget_group)
        };
        let config = dir.join("agent.yaml");
        fixtures::write_plaintext_agent_config(
            &config,
            hub.hub.grpc_addr,
            json!([account_config]),
            2,
        )?;
        let agent = fixtures::start_agent_replica(&config, &format!("{name}-0")).await?;
        hub.wait_connected(&account, 1).await?;
        let proxied = hub
            .kubeconfig(&account, "cache", &dir.join("proxied.kubeconfig"))
            .await?;
        let token = proxy_token(&proxied)?;
        let setup = Setup {
            dir,
            hub,
            account,
            namespace,
            widget_group,
            direct,
            proxied,
            token,
            user: format!("system:serviceaccount:{home}:agent"),
            agent: Some(agent),
            collections,
        };
        setup.wait_synced().await?;
        Ok(setup)
    }

    /// The collection paths of every streamed kind in the test namespace.
    fn cluster_wide_collections(ns: &str, widget_group: &str) -> Vec<String> {
        vec![
            format!("/apis/apps/v1/namespaces/{ns}/deployments"),
            format!("/apis/apps/v1/namespaces/{ns}/replicasets"),
            format!("/api/v1/namespaces/{ns}/pods"),
            format!("/api/v1/namespaces/{ns}/services"),
            format!("/api/v1/namespaces/{ns}/configmaps"),
            format!("/apis/{widget_group}/v1/namespaces/{ns}/widgets"),
            "/api/v1/namespaces".to_string(),
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions".to_string(),
        ]
    }

    /// Waits until the cache answers a list of every streamed kind (the agent's snapshots
    /// are in).
    async fn wait_synced(&self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + WAIT;
        for path in &self.collections {
            loop {
                let reply = self.get(path, None).await?;
                if reply.status == 200 && reply.header("x-scale-agent-cache") == Some("hit") {
                    break;
                }
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "the cache never answered {path}: {} {:?}",
                    reply.status,
                    reply.header("x-scale-agent-cache")
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    /// `GET <path>` through the proxy with the account's token.
    async fn get(
        &self,
        path: &str,
        accept: Option<&str>,
    ) -> anyhow::Result<scale_agent_e2e::http::Response> {
        let mut call = self
            .hub
            .call("GET", &format!("/clusters/{}{path}", self.account))
            .bearer(&self.token)
            .timeout(KUBECTL_TIMEOUT);
        if let Some(accept) = accept {
            call = call.header("accept", accept);
        }
        Ok(call.send().await?)
    }

    fn kubectl(&self, side: &str) -> anyhow::Result<Kubectl> {
        Ok(Kubectl::new(
            control_plane()?.binaries().kubectl(),
            self.dir.join(format!("home-{side}")),
        ))
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(agent) = self.agent.take() {
            agent.stop().await?;
        }
        self.hub.hub.shutdown().await?;
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

/// The bearer token of a proxy kubeconfig.
fn proxy_token(kubeconfig: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(kubeconfig)?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .map(|t| t.trim_matches('"').to_string())
        .ok_or_else(|| anyhow::anyhow!("no token in {}", kubeconfig.display()))
}

async fn install_widget_crd(admin: &Client, group: &str) -> anyhow::Result<()> {
    let mut crd = scale_agent_e2e::crds::schemaless_crd(group, "Widget", "widgets");
    crd.spec.versions[0].additional_printer_columns = Some(serde_json::from_value(json!([
        { "name": "Size", "type": "string", "jsonPath": ".spec.size" },
    ]))?);
    scale_agent_e2e::crds::install(admin, &[crd]).await?;
    Ok(())
}

fn widget_resource(group: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", "Widget"), "widgets")
}

/// Labels of the i-th object of a kind: every selector operator has matches and misses.
fn labels(i: usize) -> Value {
    let mut labels = json!({ "app": if i.is_multiple_of(2) { "web" } else { "db" } });
    if !i.is_multiple_of(3) {
        labels["tier"] = json!(if i % 3 == 1 { "front" } else { "back" });
    }
    labels
}

/// Four objects of each kind, with [`labels`].
async fn seed_objects(admin: Client, ns: String, group: String) -> anyhow::Result<()> {
    let pp = PostParams::default();
    for i in 0..4 {
        let meta = json!({ "name": format!("o-{i}"), "labels": labels(i) });
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": meta, "data": { "i": i.to_string() },
        }))?;
        Api::<ConfigMap>::namespaced(admin.clone(), &ns)
            .create(&pp, &cm)
            .await?;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": meta, "stringData": { "password": format!("secret-{i}") },
        }))?;
        Api::<Secret>::namespaced(admin.clone(), &ns)
            .create(&pp, &secret)
            .await?;
        let svc: Service = serde_json::from_value(json!({
            "metadata": meta,
            "spec": { "selector": { "app": "web" }, "ports": [{ "port": 80 + i }] },
        }))?;
        Api::<Service>::namespaced(admin.clone(), &ns)
            .create(&pp, &svc)
            .await?;
        let template = json!({
            "metadata": { "labels": { "run": format!("o-{i}") } },
            "spec": { "containers": [{ "name": "main", "image": "nginx:1.27" }] },
        });
        let selector = json!({ "matchLabels": { "run": format!("o-{i}") } });
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": meta,
            "spec": { "replicas": 1, "selector": selector, "template": template },
        }))?;
        Api::<Deployment>::namespaced(admin.clone(), &ns)
            .create(&pp, &deployment)
            .await?;
        let rs: ReplicaSet = serde_json::from_value(json!({
            "metadata": meta,
            "spec": { "replicas": 0, "selector": selector, "template": template },
        }))?;
        Api::<ReplicaSet>::namespaced(admin.clone(), &ns)
            .create(&pp, &rs)
            .await?;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": meta,
            "spec": { "containers": [{ "name": "main", "image": "nginx:1.27" }] },
        }))?;
        Api::<Pod>::namespaced(admin.clone(), &ns)
            .create(&pp, &pod)
            .await?;
        let widget: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{group}/v1"), "kind": "Widget",
            "metadata": meta, "spec": { "size": format!("s{i}") },
        }))?;
        Api::<DynamicObject>::namespaced_with(admin.clone(), &ns, &widget_resource(&group))
            .create(&pp, &widget)
            .await?;
    }
    Ok(())
}

/// JSON as both sides must agree on it, managedFields included (serde_json's maps sort
/// keys, so equal values are equal byte for byte once printed): without the list's own
/// metadata only (the list resourceVersion is the cache's resume point; kubectl's `List`
/// carries an empty one).
fn normalized(mut value: Value) -> Value {
    if value.get("items").is_some()
        && let Some(map) = value.as_object_mut()
    {
        map.remove("metadata");
    }
    value
}

/// `value` without any `managedFields`.
fn without_managed_fields(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("managedFields");
            map.values_mut().for_each(without_managed_fields);
        }
        Value::Array(items) => items.iter_mut().for_each(without_managed_fields),
        _ => {}
    }
}

/// Only the items of `namespace` (a cluster-wide list also holds other tests' objects),
/// or, for a list of namespaces, only that namespace.
fn only_namespace(mut value: Value, namespace: &str) -> Value {
    if let Some(items) = value.get_mut("items").and_then(Value::as_array_mut) {
        items.retain(|i| {
            i["metadata"]["namespace"] == namespace || i["metadata"]["name"] == namespace
        });
    }
    value
}

/// A printed table with its AGE column masked (it may tick between the two runs).
fn masked_table(text: &str) -> String {
    let is_age = |w: &str| {
        let digits = w.trim_end_matches(|c: char| "smhd".contains(c));
        w.len() > digits.len()
            && !digits.is_empty()
            && digits
                .chars()
                .all(|c| c.is_ascii_digit() || "smhd".contains(c))
    };
    text.lines()
        .map(|line| {
            line.split_whitespace()
                .map(|w| if is_age(w) { "AGE" } else { w })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ensure_ok(what: &str, outcome: &Outcome) -> anyhow::Result<()> {
    anyhow::ensure!(
        outcome.success(),
        "{what}: exit {:?}\nstdout: {}\nstderr: {}",
        outcome.code,
        outcome.stdout,
        outcome.stderr
    );
    Ok(())
}

/// Every `kubectl get` form over every kind: the same through the proxy (from the cache)
/// as directly; the hub's answers to the same reads say they came from the cache.
#[tokio::test]
async fn every_read_form_equals_the_api_servers() -> anyhow::Result<()> {
    let setup = Setup::new("forms", seed_objects).await?;
    let ns = setup.namespace.clone();
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
            .run(&setup.direct, form, None, KUBECTL_TIMEOUT)
            .await?;
        let b = proxy
            .run(&setup.proxied, form, None, KUBECTL_TIMEOUT)
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
    let direct_client = client_for(&setup.direct).await?;
    let proxy_client = client_for(&setup.proxied).await?;
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
    let ns = setup.namespace.clone();
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
    let proxy_client = client_for(&setup.proxied).await?;
    let direct_client = client_for(&setup.direct).await?;
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
    Ok(control_plane()?
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
    let ns = setup.namespace.clone();
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
    let before = lists_seen_by_the_api_server(&setup.user)?.len();
    for command in &cycle {
        ensure_ok(
            "direct",
            &direct
                .run(&setup.direct, command, None, KUBECTL_TIMEOUT)
                .await?,
        )?;
    }
    let direct_lists = lists_seen_by_the_api_server(&setup.user)?.len() - before;
    anyhow::ensure!(
        direct_lists >= 9,
        "a direct cycle sent {direct_lists} LISTs as {}: the audit log does not see them",
        setup.user
    );
    let before = lists_seen_by_the_api_server(&setup.user)?;
    for round in 0..3 {
        for command in &cycle {
            let outcome = proxy
                .run(&setup.proxied, command, None, KUBECTL_TIMEOUT)
                .await?;
            ensure_ok(&format!("round {round} through the proxy"), &outcome)?;
        }
    }
    let after = lists_seen_by_the_api_server(&setup.user)?;
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
    let ns = setup.namespace.clone();
    let client = client_for(&setup.proxied).await?;
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

/// The lines of a finished watch: (type, name, resourceVersion, code of an ERROR).
fn watch_events(body: &str) -> anyhow::Result<Vec<(String, String, String)>> {
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l)?;
            let o = &v["object"];
            Ok((
                v["type"].as_str().unwrap_or_default().to_string(),
                o["metadata"]["name"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| o["code"].to_string()),
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ))
        })
        .collect()
}

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
    Ok(control_plane()?
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
    let ns = setup.namespace.clone();
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    let listed = setup.get(&path, None).await?;
    assert_eq!(listed.header("x-scale-agent-cache"), Some("hit"));
    let from = listed.json_or_null()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // Changes directly on the API server: the agent's watch brings them to the cache.
    let admin = control_plane()?.client().await?;
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
    let direct = client_for(&setup.direct).await?;
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
    let direct_watches = watches_seen_by_the_api_server(&setup.user, DIRECT_WATCH_MARK)?;
    // (A watch is logged when its response starts and when it completes.)
    anyhow::ensure!(
        direct_watches.len() >= 3,
        "the audit log shows {direct_watches:#?} of the 3 direct watches: it would not see the \
         proxy's either"
    );
    let proxied_watches = watches_seen_by_the_api_server(&setup.user, PROXIED_WATCH_MARK)?;
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
    let admin = control_plane()?.client().await?;
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
    let path = format!("/api/v1/namespaces/{}/configmaps", setup.namespace);
    let second = setup.collections[2].clone();
    let second_ns = second.split('/').nth(4).unwrap_or_default().to_string();
    let admin = control_plane()?.client().await?;
    let direct = client_for(&setup.direct).await?;
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
    let created = Api::<ConfigMap>::namespaced(admin.clone(), &setup.namespace)
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
    let proxied = watches_seen_by_the_api_server(&setup.user, PROXIED_WATCH_MARK)?;
    anyhow::ensure!(
        proxied.is_empty(),
        "the proxy's watches reached the API server: {proxied:#?}"
    );
    setup.stop().await
}

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
    let ns = setup.namespace.clone();
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    let proxy_client = client_for(&setup.proxied).await?;
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
    let admin = control_plane()?.client().await?;
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
        .hub
        .api("GET", &format!("/api/v1/accounts/{}", setup.account))
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
        fixtures::start_agent_replica(&setup.dir.join("agent.yaml"), "failover-1").await?;
    setup.hub.wait_connected(&setup.account, 2).await?;
    let first = setup.agent.take();
    let kept = watch_across(&setup, async {
        let streaming = streaming_replica(&setup.hub, &setup.account).await?;
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
    setup.agent = kept;
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
            &format!("--config={}", setup.dir.join("agent.yaml").display()),
            "--replica=killed-process",
            &format!("--admin-addr=127.0.0.1:{admin_port}"),
        ]),
        setup.dir.join("agent-process.log"),
    )?;
    setup.hub.wait_connected(&setup.account, 2).await?;
    if let Some(agent) = setup.agent.take() {
        agent.stop().await?;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while streaming_replica(&setup.hub, &setup.account).await? != "killed-process" {
        process.ensure_running()?;
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the agent process never streamed the account: {}",
            scale_agent_e2e::process::tail(process.log(), 20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    setup.agent =
        Some(fixtures::start_agent_replica(&setup.dir.join("agent.yaml"), "killed-standby").await?);
    setup.hub.wait_connected(&setup.account, 2).await?;
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
        streaming_replica(&setup.hub, &setup.account).await?,
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
    let ns = setup.namespace.clone();
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    let admin = control_plane()?.client().await?;
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
        .arg(format!("--kubeconfig={}", setup.proxied.display()))
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
        let api: Api<ConfigMap> = Api::namespaced(client_for(&setup.proxied).await?, &ns);
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
    let elsewhere = control_plane()?
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
    setup.hub = hub;
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
    setup.hub.wait_connected(&setup.account, 1).await?;
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
            &setup.proxied,
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
                &setup.proxied,
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

/// `GET <path>` through the proxy until `check` holds for the reply, within [`WAIT`].
async fn get_until(
    setup: &Setup,
    path: &str,
    what: &str,
    check: impl Fn(&scale_agent_e2e::http::Response) -> bool,
) -> anyhow::Result<scale_agent_e2e::http::Response> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let reply = setup.get(path, None).await?;
        if check(&reply) {
            return Ok(reply);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{what}: never; last {} {:?} {:?}",
            reply.status,
            reply.header("warning"),
            reply.header("x-scale-agent-cache")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Degraded modes say what they are, as kubectl shows them: while the store cannot commit
/// (a failing commit hook) and then while the account's agent is away (its cache held for
/// the grace period), reads are answered from the cache with a `Warning` header (kubectl
/// prints `Warning: ...`) and `x-scale-agent-cache-age`; writes answer 503 with the reason;
/// `scale_agent_hub_proxy_stale_reads_total` counts them. After the store recovers nothing
/// is lost and the warning is gone.
#[tokio::test]
async fn degraded_reads_carry_a_warning_and_writes_say_why_not() -> anyhow::Result<()> {
    let mut setup = Setup::new("degraded", |_, _, _| async { Ok(()) }).await?;
    let ns = setup.namespace.clone();
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    let proxy = setup.kubectl("proxy")?;
    let kubectl = |args: &[&str]| {
        let args = args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let proxy = &proxy;
        let proxied = setup.proxied.clone();
        async move { proxy.run(&proxied, &args, None, KUBECTL_TIMEOUT).await }
    };
    let fresh = setup.get(&path, None).await?;
    assert_eq!(fresh.header("x-scale-agent-cache"), Some("hit"));
    assert_eq!(
        fresh.header("warning"),
        None,
        "fresh answers carry no warning"
    );

    // 1. The store cannot commit: the next change the agent streams fails to commit.
    setup
        .hub
        .hub
        .set_store_commit_hook(Some(std::sync::Arc::new(|_| {
            Err("injected: the volume is full".to_string())
        })))
        .await;
    let direct = client_for(&setup.direct).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(direct, &ns);
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "during-outage"}}))?,
        )
        .await?;
    let stale = get_until(&setup, &path, "a stale-flagged read", |r| {
        r.header("warning")
            .is_some_and(|w| w.contains("store has not committed"))
    })
    .await?;
    assert_eq!(stale.status, 200);
    assert_eq!(stale.header("x-scale-agent-cache"), Some("hit"));
    assert!(
        stale
            .header("x-scale-agent-cache-age")
            .is_some_and(|a| a.parse::<u64>().is_ok()),
        "{:?}",
        stale.header("x-scale-agent-cache-age")
    );
    // JSON, as Clouddriver asks: a table (a person's plain `get`) is tunnelled, fresh.
    let read = kubectl(&["get", "configmaps", "-n", &ns, "-o", "json"]).await?;
    ensure_ok("kubectl get while the store fails", &read)?;
    assert!(
        read.stderr.contains("Warning:") && read.stderr.contains("store has not committed"),
        "kubectl prints the warning: {}",
        read.stderr
    );
    assert!(read.stderr.contains("volume is full"), "{}", read.stderr);
    let write = kubectl(&["create", "configmap", "refused-store", "-n", &ns]).await?;
    assert!(!write.success(), "a write while the store fails: {write:?}");
    assert!(
        write
            .messages()
            .contains("writes are refused until the store commits again"),
        "{}",
        write.messages()
    );

    // The account's state says the same.
    let account_path = format!("/api/v1/accounts/{}", setup.account);
    let view = setup
        .hub
        .api("GET", &account_path)
        .send()
        .await?
        .json_or_null();
    assert!(
        view["cacheStale"]
            .as_str()
            .is_some_and(|s| s.contains("volume is full")),
        "{view}"
    );

    // The store recovers: nothing lost, no warning.
    setup.hub.hub.set_store_commit_hook(None).await;
    let recovered = get_until(
        &setup,
        &path,
        "a fresh read after the store recovered",
        |r| r.header("warning").is_none() && r.body.contains("during-outage"),
    )
    .await?;
    assert_eq!(recovered.header("x-scale-agent-cache-age"), None);
    let view = setup
        .hub
        .api("GET", &account_path)
        .send()
        .await?
        .json_or_null();
    assert_eq!(view["cacheStale"], Value::Null, "{view}");

    // 2. The agent goes away: reads from the held cache, flagged; writes 503.
    if let Some(agent) = setup.agent.take() {
        agent.stop().await?;
    }
    let away = get_until(
        &setup,
        &path,
        "a read flagged as the agent being away",
        |r| {
            r.header("warning")
                .is_some_and(|w| w.contains("no agent of account"))
        },
    )
    .await?;
    assert_eq!(away.status, 200, "not 503 within the grace period");
    assert!(away.body.contains("during-outage"), "{}", away.body);
    let read = kubectl(&["get", "configmaps", "-n", &ns, "-o", "json"]).await?;
    ensure_ok("kubectl get with the agent away", &read)?;
    assert!(read.stdout.contains("\"during-outage\""), "{}", read.stdout);
    assert!(
        read.stderr.contains("Warning:") && read.stderr.contains("no agent of account"),
        "kubectl prints the warning: {}",
        read.stderr
    );
    let write = kubectl(&["create", "configmap", "refused-away", "-n", &ns]).await?;
    assert!(!write.success(), "a write with the agent away: {write:?}");
    assert!(
        write.messages().contains("writes need a connected agent"),
        "{}",
        write.messages()
    );

    let metrics = setup.hub.api("GET", "/metrics").send().await?.body;
    for line in [
        "scale_agent_hub_proxy_stale_reads_total{reason=\"store_failing\"}",
        "scale_agent_hub_proxy_stale_reads_total{reason=\"agent_away\"}",
        "scale_agent_hub_proxy_refused_writes_total{reason=\"store_failing\"}",
        "scale_agent_hub_proxy_refused_writes_total{reason=\"agent_away\"}",
    ] {
        assert!(metrics.contains(line), "{line} missing in {metrics}");
    }
    setup.stop().await
}
