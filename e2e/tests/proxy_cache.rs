//! The proxy's reads from the hub's cache, on a real control plane, with real kubectl and a
//! real kube client: what the cache answers equals what the API server answers directly
//! (as the same identity), paging covers every object once, the API server receives no
//! LIST during Clouddriver-style caching cycles (its own audit log says so), a read
//! right after a write through the proxy shows that write, and watches through the proxy
//! miss and repeat nothing across an agent failover (clean stop or SIGKILL) and a hub
//! restart.
//!
//! This file holds the fixture ([`Setup`]: control plane, hub, agent, both kubeconfigs) and
//! the seeding and comparison helpers; the tests are in child modules by theme: `reads`,
//! `watches`, `failover` and `degraded`.

use std::{collections::BTreeSet, path::Path, time::Duration};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::{ConfigMap, Pod, Secret, Service},
};
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use scale_agent_e2e::{
    fixtures::{self, TlsHub},
    kubectl::Kubectl,
    process::ManagedProcess,
    proxy_stack::{ProxyStack, args, audited_control_plane, client_for, ensure_ok},
};
use serde_json::{Value, json};

#[path = "proxy_cache/degraded.rs"]
mod degraded;
#[path = "proxy_cache/failover.rs"]
mod failover;
#[path = "proxy_cache/reads.rs"]
mod reads;
#[path = "proxy_cache/watches.rs"]
mod watches;

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

fn init_logs() {
    scale_agent_e2e::fixtures::init_logs("warn,scale_agent_hub_proxy=info");
}

/// A hub, one agent streaming [`KINDS`] and the widget kind cluster-wide (or, with
/// [`Setup::per_namespace`], ConfigMaps and Deployments in two namespaces, one watch each)
/// with the credentials of a ServiceAccount of its own, and clients of both sides.
struct Setup {
    stack: ProxyStack,
    widget_group: String,
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
        let identity = ProxyStack::identity(&format!("cache-{name}")).await?;
        let (control_plane, admin) = (identity.control_plane, identity.admin.clone());
        let namespace = identity.namespace.clone();
        let widget_group = format!("{}.example.com", identity.home);
        install_widget_crd(&admin, &widget_group).await?;
        seed(admin.clone(), namespace.clone(), widget_group.clone()).await?;
        let account = identity.account_name();
        let mut kinds: Vec<String> = KINDS.iter().map(|k| k.to_string()).collect();
        kinds.push(format!("widgets.{widget_group}"));
        // Opted in to Secret data through the proxy: these tests compare every read with
        // the API server's, Secrets' data included (tunnelled); the default is in
        // hub/tests/proxy_secrets.rs.
        let mut account_config = json!({
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
        let stack = identity
            .start(account, account_config, &format!("{name}-0"), "cache")
            .await?;
        let setup = Setup {
            stack,
            widget_group,
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
            .stack
            .hub
            .call("GET", &format!("/clusters/{}{path}", self.stack.account))
            .bearer(&self.stack.token)
            .timeout(KUBECTL_TIMEOUT);
        if let Some(accept) = accept {
            call = call.header("accept", accept);
        }
        Ok(call.send().await?)
    }

    fn kubectl(&self, side: &str) -> anyhow::Result<Kubectl> {
        Ok(Kubectl::new(
            audited_control_plane()?.binaries().kubectl(),
            self.stack.dir.join(format!("home-{side}")),
        ))
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.stack.stop().await
    }
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
