//! Operations end to end: the real hub and agent(s) in-process, a real control plane with
//! kube-controller-manager, operations submitted through the hub's HTTP API
//! (`POST /api/v1/accounts/{name}/operations`) and checked in the API server afterwards.
//!
//! Each agent authenticates with a real ServiceAccount token, bound to a Role in the test's
//! namespace: RBAC applies to every operation for real.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, ReplicaSet, StatefulSet},
        core::v1::{ConfigMap, Pod},
        rbac::v1::PolicyRule,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use scale_agent::AgentHandle;
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    fixtures::{self, start_plaintext_hub},
    wait::{until, wait_for_within},
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
/// The most one request to the hub may take: well beyond any operation's own wait.
const HTTP_TIMEOUT: Duration = Duration::from_secs(300);

fn init_logs() {
    scale_agent_e2e::fixtures::init_logs("scale_agent=info,scale_agent_hub=info");
}

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(|| {
        ControlPlaneOptions::default().with_controller_manager()
    })?)
}

fn temp_dir(name: &str) -> anyhow::Result<PathBuf> {
    Ok(fixtures::temp_dir(&format!("scale-agent-e2e-ops-{name}"))?)
}

fn account_name(prefix: &str) -> String {
    format!("{prefix}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

/// ServiceAccount `name` in `namespace` bound to a Role there with `verbs` on everything in
/// the core, apps, batch and example.com groups; returns a kubeconfig file with its token.
async fn identity(
    control_plane: &ControlPlane,
    admin: &Client,
    namespace: &str,
    name: &str,
    verbs: &[&str],
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let rules = vec![PolicyRule {
        api_groups: Some(vec![
            String::new(),
            "apps".into(),
            "batch".into(),
            "example.com".into(),
        ]),
        resources: Some(vec!["*".into()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    }];
    fixtures::service_account_identity(
        control_plane,
        admin,
        namespace,
        name,
        fixtures::Scope::Namespace,
        rules,
        dir.join(format!("kubeconfig-{name}")),
    )
    .await
}

/// The agent's config at `path`: the plaintext hub at `hub`, `accounts`, a 2 s heartbeat.
fn write_config(path: &Path, hub: SocketAddr, accounts: serde_json::Value) -> anyhow::Result<()> {
    fixtures::write_plaintext_agent_config(path, hub, accounts, 2)
}

/// One request to the hub; returns the status code and the body as JSON (as a JSON string
/// when it is not JSON).
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> anyhow::Result<(u16, Value)> {
    let body = body.map(Value::to_string);
    let mut call = fixtures::hub_call(method, addr, path).timeout(HTTP_TIMEOUT);
    if let Some(body) = body {
        call.body = Some(body.into_bytes());
        call = call.header("content-type", "application/json");
    }
    let response = call.send().await?;
    let value = serde_json::from_str(&response.body).unwrap_or(Value::String(response.body));
    Ok((response.status, value))
}

/// Submits an operation through the hub.
async fn op(hub: SocketAddr, account: &str, body: Value) -> anyhow::Result<(u16, Value)> {
    http(
        hub,
        "POST",
        &format!("/api/v1/accounts/{account}/operations"),
        Some(&body),
    )
    .await
}

/// Like [`op`], expecting `code`.
async fn expect(hub: SocketAddr, account: &str, code: u16, body: Value) -> anyhow::Result<Value> {
    let (got, response) = op(hub, account, body.clone()).await?;
    anyhow::ensure!(
        got == code,
        "expected {code} for {body}, got {got}: {response:#}"
    );
    Ok(response)
}

/// A hub, one or more agent replicas for one account with full rights in a fresh namespace.
struct Setup {
    admin: Client,
    namespace: String,
    account: String,
    /// More accounts of the same agents (same identity and namespace), when asked for.
    others: Vec<String>,
    dir: PathBuf,
    hub: scale_agent_hub::RunningHub,
    agents: Vec<(String, AgentHandle)>,
}

impl Setup {
    async fn new(name: &str, replicas: usize) -> anyhow::Result<Setup> {
        Setup::with_accounts(name, replicas, 1).await
    }

    /// Like [`Setup::new`], the agents serving `accounts` accounts (all alike).
    async fn with_accounts(name: &str, replicas: usize, accounts: usize) -> anyhow::Result<Setup> {
        init_logs();
        let control_plane = control_plane()?;
        let admin = control_plane.client().await?;
        let namespace = control_plane
            .namespace(&admin, &format!("ops-{name}"))
            .await?;
        let dir = temp_dir(name)?;
        let kubeconfig =
            identity(control_plane, &admin, &namespace, "deployer", &["*"], &dir).await?;
        let hub = start_plaintext_hub(&dir).await?;
        let names: Vec<String> = (0..accounts.max(1)).map(|_| account_name(name)).collect();
        let config = dir.join("agent.yaml");
        let entries: Vec<Value> = names
            .iter()
            .map(|account| {
                fixtures::account(
                    account,
                    &kubeconfig,
                    &namespace,
                    &["configmaps", "deployments", "replicasets"],
                )
            })
            .collect();
        write_config(&config, hub.grpc_addr, Value::Array(entries))?;
        let account = names[0].clone();
        let others = names[1..].to_vec();
        let mut agents = Vec::new();
        for i in 0..replicas {
            let replica = format!("{name}-{i}");
            agents.push((
                replica.clone(),
                fixtures::start_agent_replica(&config, &replica).await?,
            ));
        }
        let setup = Setup {
            admin,
            namespace,
            account,
            others,
            dir,
            hub,
            agents,
        };
        setup.wait_ready(replicas).await?;
        Ok(setup)
    }

    /// Waits until the account streams and `replicas` replicas are connected for it, and
    /// the watched kinds have their first snapshot.
    async fn wait_ready(&self, replicas: usize) -> anyhow::Result<()> {
        for account in std::iter::once(&self.account).chain(&self.others) {
            self.wait_account_ready(account, replicas).await?;
        }
        Ok(())
    }

    async fn wait_account_ready(&self, account: &str, replicas: usize) -> anyhow::Result<()> {
        let (hub, account) = (self.hub.http_addr, account.to_string());
        until("the account to be served", || {
            let account = account.clone();
            async move {
                let (code, a) =
                    http(hub, "GET", &format!("/api/v1/accounts/{account}"), None).await?;
                if code != 200 {
                    return Ok(false);
                }
                let connected = usize::from(a["streaming"].is_object())
                    + a["standbys"].as_array().map(Vec::len).unwrap_or(0);
                let kinds_ready = a["kinds"].as_array().is_some_and(|ks| {
                    ks.len() >= 3
                        && ks
                            .iter()
                            .all(|k| !k["resumePoints"].as_array().is_none_or(Vec::is_empty))
                });
                Ok(connected == replicas && kinds_ready)
            }
        })
        .await
    }

    fn hub(&self) -> SocketAddr {
        self.hub.http_addr
    }

    fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.admin.clone(), &self.namespace)
    }

    fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.admin.clone(), &self.namespace)
    }

    async fn stop(self) -> anyhow::Result<()> {
        for (_, agent) in self.agents {
            agent.stop().await?;
        }
        self.hub.shutdown().await?;
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

fn configmap(ns: &str, name: &str, data: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name, "namespace": ns },
        "data": data,
    })
}

fn deployment(ns: &str, name: &str, image: &str, replicas: i32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": name, "namespace": ns, "labels": { "app": name } },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{ "name": "main", "image": image }] },
            },
        },
    })
}

fn rv(v: &Value) -> String {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The hub's cached copy of a configmap (objects endpoint).
async fn cached(
    hub: SocketAddr,
    account: &str,
    ns: &str,
    kind: &str,
    name: &str,
) -> anyhow::Result<Option<Value>> {
    let (_, body) = http(
        hub,
        "GET",
        &format!("/api/v1/accounts/{account}/objects?kind={kind}&namespace={ns}"),
        None,
    )
    .await?;
    Ok(body["items"].as_array().and_then(|items| {
        items
            .iter()
            .find(|o| o["metadata"]["name"] == name)
            .cloned()
    }))
}

// ---------------------------------------------------------------------------------------
// Tests

/// Server-side apply (idempotent, changes, several documents, invalid manifests, unknown
/// kinds, same-name kinds across groups), client-side apply, create, replace, patch of
/// every type, get and list; every write visible in the hub right after it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_create_replace_patch_get_list_and_read_your_writes() -> anyhow::Result<()> {
    let s = Setup::new("apply", 1).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());

    // Apply twice: the second is a no-op with the same resourceVersion.
    let first = expect(hub, &account, 200, json!({"type": "apply", "manifest": configmap(&ns, "app", json!({"a": "1"})), "fieldManager": "spinnaker"})).await?;
    assert_eq!(first["state"], "succeeded");
    assert_eq!(first["executed"], true);
    let rv1 = rv(&first["objects"][0]);
    let again = expect(hub, &account, 200, json!({"type": "apply", "manifest": configmap(&ns, "app", json!({"a": "1"})), "fieldManager": "spinnaker"})).await?;
    assert_eq!(
        rv(&again["objects"][0]),
        rv1,
        "applying the same manifest changes nothing"
    );
    let live = s.configmaps().get("app").await?;
    assert_eq!(
        live.metadata.resource_version.as_deref(),
        Some(rv1.as_str())
    );
    let managers: Vec<String> = live
        .metadata
        .managed_fields
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.contains(&"spinnaker".to_string()), "{managers:?}");
    // The result carries the object as the API server answered it, field owners included.
    assert_eq!(
        first["objects"][0]["metadata"]["managedFields"],
        serde_json::to_value(live.metadata.managed_fields.unwrap_or_default())?
    );

    // A change: the hub's cache shows it at once (read-your-writes).
    let changed = expect(hub, &account, 200, json!({"type": "apply", "manifest": configmap(&ns, "app", json!({"a": "2"})), "fieldManager": "spinnaker"})).await?;
    let rv2 = rv(&changed["objects"][0]);
    assert_ne!(rv2, rv1);
    let seen = cached(hub, &account, &ns, "configmaps", "app")
        .await?
        .ok_or_else(|| anyhow::anyhow!("not cached"))?;
    assert_eq!(
        rv(&seen),
        rv2,
        "the hub cache reflects the write immediately"
    );
    assert_eq!(seen["data"]["a"], "2");
    assert_eq!(
        s.configmaps().get("app").await?.data.unwrap_or_default()["a"],
        "2"
    );

    // The result is kept for lookups.
    let id = changed["id"].as_str().unwrap_or_default().to_string();
    let (code, looked) = http(hub, "GET", &format!("/api/v1/operations/{id}"), None).await?;
    assert_eq!(code, 200);
    assert_eq!(looked["state"], "succeeded");
    let (code, _) = http(hub, "GET", "/api/v1/operations/nope", None).await?;
    assert_eq!(code, 404);

    // Several documents in one apply, namespace defaulted.
    let both = expect(hub, &account, 200, json!({"type": "apply", "namespace": ns, "manifests": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one"}, "data": {"x": "1"}},
        {"apiVersion": "v1", "kind": "List", "items": [deployment(&ns, "web", "nginx:1", 1)]},
    ]})).await?;
    assert_eq!(both["objects"].as_array().map(Vec::len), Some(2));
    s.configmaps().get("one").await?;
    s.deployments().get("web").await?;

    // An invalid manifest: 422 with the API server's causes; nothing created.
    let mut invalid = deployment(&ns, "broken", "nginx:1", 1);
    invalid["spec"]["template"]["metadata"]["labels"] = json!({"app": "other"});
    let bad = expect(
        hub,
        &account,
        422,
        json!({"type": "apply", "manifest": invalid}),
    )
    .await?;
    assert_eq!(bad["state"], "failed");
    assert_eq!(bad["status"]["reason"], "Invalid");
    let causes = bad["status"]["causes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        causes.iter().any(|c| c["field"]
            .as_str()
            .is_some_and(|f| f.contains("selector") || f.contains("labels"))),
        "{bad:#}"
    );
    assert!(s.deployments().get_opt("broken").await?.is_none());

    // Unknown kind: 404, as kubectl says it.
    let unknown = expect(hub, &account, 404, json!({"type": "apply", "manifest": {"apiVersion": "nope.example/v1", "kind": "Gadget", "metadata": {"name": "g", "namespace": ns}}})).await?;
    assert!(
        unknown["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("doesn't have a resource type"),
        "{unknown:#}"
    );
    assert_eq!(unknown["executed"], true);

    // Same-name kinds across groups: a custom resource "ConfigMap" in example.com.
    let crds = Api::<CustomResourceDefinition>::all(s.admin.clone());
    let crd_name = "configmaps.example.com";
    if crds.get_opt(crd_name).await?.is_none() {
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": crd_name},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "configmaps", "singular": "configmap", "kind": "ConfigMap", "listKind": "ConfigMapList"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))?;
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let custom_api: Api<DynamicObject> = Api::namespaced_with(
        s.admin.clone(),
        &ns,
        &ApiResource {
            group: "example.com".into(),
            version: "v1".into(),
            api_version: "example.com/v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
        },
    );
    until("the custom ConfigMap kind to be served", || {
        let api = custom_api.clone();
        async move { Ok(api.list(&ListParams::default()).await.is_ok()) }
    })
    .await?;
    let custom = expect(hub, &account, 200, json!({"type": "apply", "manifest": {"apiVersion": "example.com/v1", "kind": "ConfigMap", "metadata": {"name": "twin", "namespace": ns}, "spec": {"custom": true}}})).await?;
    assert_eq!(custom["objects"][0]["apiVersion"], "example.com/v1");
    custom_api.get("twin").await?;
    assert!(
        s.configmaps().get_opt("twin").await?.is_none(),
        "the core ConfigMap is another kind"
    );
    let got = expect(
        hub,
        &account,
        200,
        json!({"type": "get", "kind": "configmaps.example.com", "namespace": ns, "name": "twin"}),
    )
    .await?;
    assert_eq!(got["objects"][0]["spec"]["custom"], true);

    // Client-side apply: kubectl's last-applied annotation, and removed keys go away.
    let csa = expect(hub, &account, 200, json!({"type": "apply", "serverSide": false, "manifest": configmap(&ns, "csa", json!({"k": "1", "gone": "x"}))})).await?;
    assert!(csa["objects"][0]["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"].is_string());
    expect(hub, &account, 200, json!({"type": "apply", "serverSide": false, "manifest": configmap(&ns, "csa", json!({"k": "2"}))})).await?;
    let data = s.configmaps().get("csa").await?.data.unwrap_or_default();
    assert_eq!(data.get("k").map(String::as_str), Some("2"));
    assert!(!data.contains_key("gone"), "{data:?}");

    // Create: 201, then 409 AlreadyExists.
    let created = expect(
        hub,
        &account,
        201,
        json!({"type": "create", "manifest": configmap(&ns, "fresh", json!({"v": "1"}))}),
    )
    .await?;
    assert_eq!(created["state"], "succeeded");
    let dup = expect(
        hub,
        &account,
        409,
        json!({"type": "create", "manifest": configmap(&ns, "fresh", json!({"v": "1"}))}),
    )
    .await?;
    assert_eq!(dup["status"]["reason"], "AlreadyExists");

    // Replace.
    expect(
        hub,
        &account,
        200,
        json!({"type": "replace", "manifest": configmap(&ns, "fresh", json!({"v": "2"}))}),
    )
    .await?;
    assert_eq!(
        s.configmaps().get("fresh").await?.data.unwrap_or_default()["v"],
        "2"
    );

    // Patches of every type.
    expect(hub, &account, 200, json!({"type": "patch", "kind": "configmap", "namespace": ns, "name": "fresh", "patchType": "merge", "patch": {"data": {"m": "1"}}})).await?;
    expect(hub, &account, 200, json!({"type": "patch", "kind": "cm", "namespace": ns, "name": "fresh", "patchType": "json", "patch": [{"op": "add", "path": "/data/j", "value": "1"}]})).await?;
    expect(hub, &account, 200, json!({"type": "patch", "kind": "ConfigMap", "namespace": ns, "name": "fresh", "patchType": "strategic", "patch": {"data": {"s": "1"}}})).await?;
    let applied = expect(hub, &account, 200, json!({"type": "patch", "kind": "ConfigMap", "namespace": ns, "name": "fresh", "patchType": "apply", "fieldManager": "other", "patch": {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "1"}}})).await?;
    let data = s.configmaps().get("fresh").await?.data.unwrap_or_default();
    for k in ["v", "m", "j", "s", "a"] {
        assert!(data.contains_key(k), "{k} missing in {data:?}");
    }
    let seen = cached(hub, &account, &ns, "configmaps", "fresh")
        .await?
        .ok_or_else(|| anyhow::anyhow!("not cached"))?;
    assert_eq!(rv(&seen), rv(&applied["objects"][0]));
    // A json patch that does not apply: the API server's error passed through.
    let (code, failed) = op(hub, &account, json!({"type": "patch", "kind": "ConfigMap", "namespace": ns, "name": "fresh", "patchType": "json", "patch": [{"op": "test", "path": "/data/v", "value": "nope"}]})).await?;
    assert!((400..500).contains(&code), "{code} {failed:#}");

    // Get and list (label and field selectors); 404 for a missing object.
    let got = expect(
        hub,
        &account,
        200,
        json!({"type": "get", "kind": "ConfigMap", "namespace": ns, "name": "app"}),
    )
    .await?;
    assert_eq!(got["objects"][0]["data"]["a"], "2");
    expect(
        hub,
        &account,
        404,
        json!({"type": "get", "kind": "ConfigMap", "namespace": ns, "name": "missing"}),
    )
    .await?;
    let listed = expect(hub, &account, 200, json!({"type": "list", "kind": "configmaps", "namespace": ns, "fieldSelector": "metadata.name=fresh"})).await?;
    assert_eq!(listed["objects"].as_array().map(Vec::len), Some(1));
    let listed = expect(hub, &account, 200, json!({"type": "list", "kind": "deployments.apps", "namespace": ns, "labelSelector": "app=web"})).await?;
    assert_eq!(listed["objects"][0]["metadata"]["name"], "web");

    // A bad request never reaches an agent.
    let bad = expect(
        hub,
        &account,
        400,
        json!({"type": "scale", "kind": "Deployment", "name": "web"}),
    )
    .await?;
    assert!(
        bad["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("replicas")
    );
    // An unknown account.
    expect(
        hub,
        "no-such-account",
        404,
        json!({"type": "get", "kind": "ConfigMap", "name": "x"}),
    )
    .await?;
    let (_, metrics) = http(hub, "GET", "/metrics", None).await?;
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    assert!(
        metrics.contains("scale_agent_hub_operations_total{type=\"apply\",state=\"succeeded\"}"),
        "{metrics}"
    );
    s.stop().await
}

/// Delete by name and by selector with each propagation policy, waiting for finalizers,
/// and a missing object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_with_propagation_policies_and_finalizers() -> anyhow::Result<()> {
    let s = Setup::new("delete", 1).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    let rs_api: Api<ReplicaSet> = Api::namespaced(s.admin.clone(), &ns);
    for name in ["orphan", "background", "foreground"] {
        expect(
            hub,
            &account,
            200,
            json!({"type": "apply", "manifest": deployment(&ns, name, "nginx:1", 1)}),
        )
        .await?;
    }
    let owned = |name: &'static str| {
        let rs_api = rs_api.clone();
        async move {
            Ok::<_, anyhow::Error>(
                rs_api
                    .list(&ListParams::default().labels(&format!("app={name}")))
                    .await?
                    .items,
            )
        }
    };
    for name in ["orphan", "background", "foreground"] {
        until("the deployment's ReplicaSet", || async move {
            Ok(!owned(name).await?.is_empty())
        })
        .await?;
    }

    // Orphan: the ReplicaSet stays, without its owner.
    let r = expect(hub, &account, 200, json!({"type": "delete", "kind": "deployment", "namespace": ns, "name": "orphan", "propagationPolicy": "Orphan", "wait": true})).await?;
    assert_eq!(r["deleted"][0], format!("Deployment.apps/{ns}/orphan"));
    assert!(s.deployments().get_opt("orphan").await?.is_none());
    until("the orphaned ReplicaSet to lose its owner", || async move {
        let items = owned("orphan").await?;
        Ok(!items.is_empty()
            && items.iter().all(|rs| {
                rs.metadata
                    .owner_references
                    .as_ref()
                    .is_none_or(Vec::is_empty)
            }))
    })
    .await?;

    // Background: the Deployment goes at once, the garbage collector takes the ReplicaSet.
    expect(hub, &account, 200, json!({"type": "delete", "kind": "Deployment", "namespace": ns, "name": "background", "propagationPolicy": "Background"})).await?;
    assert!(s.deployments().get_opt("background").await?.is_none());
    until("the background ReplicaSet to be collected", || async move {
        Ok(owned("background").await?.is_empty())
    })
    .await?;

    // Foreground with wait: when the operation returns, the dependents are gone too.
    let r = expect(hub, &account, 200, json!({"type": "delete", "kind": "Deployment", "namespace": ns, "name": "foreground", "propagationPolicy": "Foreground", "wait": true, "timeoutSeconds": 45})).await?;
    assert_eq!(r["deleted"][0], format!("Deployment.apps/{ns}/foreground"));
    assert!(s.deployments().get_opt("foreground").await?.is_none());
    assert!(owned("foreground").await?.is_empty());

    // A finalizer holds the object; delete with wait returns once the test removes it.
    s.configmaps()
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}),
            )?,
        )
        .await?;
    let (h, a, n) = (hub, account.clone(), ns.clone());
    let started = Instant::now();
    let pending = tokio::spawn(async move {
        op(h, &a, json!({"type": "delete", "kind": "ConfigMap", "namespace": n, "name": "held", "gracePeriodSeconds": 0, "wait": true})).await
    });
    let cms = s.configmaps();
    until("deletionTimestamp on the held configmap", || {
        let cms = cms.clone();
        async move { Ok(cms.get("held").await?.metadata.deletion_timestamp.is_some()) }
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!pending.is_finished(), "the delete waits for the finalizer");
    s.configmaps()
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    let (code, r) = pending.await??;
    assert_eq!(code, 200, "{r:#}");
    assert_eq!(r["deleted"][0], format!("ConfigMap/{ns}/held"));
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(s.configmaps().get_opt("held").await?.is_none());
    assert!(
        cached(hub, &account, &ns, "configmaps", "held")
            .await?
            .is_none(),
        "the hub cache dropped it"
    );

    // A finalizer that stays: the deadline passes, 504 with executed=true.
    s.configmaps()
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "stuck", "finalizers": ["example.com/hold"]}}),
            )?,
        )
        .await?;
    let r = expect(hub, &account, 504, json!({"type": "delete", "kind": "ConfigMap", "namespace": ns, "name": "stuck", "wait": true, "timeoutSeconds": 2})).await?;
    assert_eq!(r["state"], "timedOut");
    assert_eq!(r["executed"], true);
    s.configmaps()
        .patch(
            "stuck",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;

    // By label selector.
    for name in ["sel-a", "sel-b"] {
        s.configmaps()
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": name, "labels": {"group": "sel"}}}),
                )?,
            )
            .await?;
    }
    let r = expect(hub, &account, 200, json!({"type": "delete", "kind": "configmaps", "namespace": ns, "labelSelector": "group=sel", "wait": true})).await?;
    assert_eq!(r["deleted"].as_array().map(Vec::len), Some(2), "{r:#}");
    assert!(
        s.configmaps()
            .list(&ListParams::default().labels("group=sel"))
            .await?
            .items
            .is_empty()
    );

    // Missing: 404, unless ignoreNotFound.
    let r = expect(
        hub,
        &account,
        404,
        json!({"type": "delete", "kind": "ConfigMap", "namespace": ns, "name": "missing"}),
    )
    .await?;
    assert_eq!(r["status"]["reason"], "NotFound");
    expect(hub, &account, 200, json!({"type": "delete", "kind": "ConfigMap", "namespace": ns, "name": "missing", "ignoreNotFound": true})).await?;
    s.stop().await
}

/// Scale (the ReplicaSet follows), and rollout history, undo (to the previous and to a
/// given revision), pause/resume and restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_and_rollouts() -> anyhow::Result<()> {
    let s = Setup::new("rollout", 1).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    let rs_api: Api<ReplicaSet> = Api::namespaced(s.admin.clone(), &ns);
    expect(
        hub,
        &account,
        200,
        json!({"type": "apply", "manifest": deployment(&ns, "web", "nginx:1", 1)}),
    )
    .await?;

    // Scale: the Deployment changes and its ReplicaSet follows.
    let r = expect(hub, &account, 200, json!({"type": "scale", "kind": "deployment", "namespace": ns, "name": "web", "replicas": 3})).await?;
    assert_eq!(r["objects"][0]["spec"]["replicas"], 3);
    assert_eq!(s.deployments().get("web").await?.spec.replicas, Some(3));
    let rs = rs_api.clone();
    until("the ReplicaSet to follow the scale", || {
        let rs = rs.clone();
        async move {
            Ok(rs
                .list(&ListParams::default().labels("app=web"))
                .await?
                .items
                .iter()
                .any(|r| r.spec.replicas == Some(3)))
        }
    })
    .await?;
    // --current-replicas mismatch: 409, nothing changed.
    let r = expect(hub, &account, 409, json!({"type": "scale", "kind": "deploy", "namespace": ns, "name": "web", "replicas": 5, "currentReplicas": 1})).await?;
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("Expected replicas to be 1")
    );
    assert_eq!(s.deployments().get("web").await?.spec.replicas, Some(3));
    // A kind without a scale subresource.
    s.configmaps()
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "plain"}}))?,
        )
        .await?;
    expect(hub, &account, 400, json!({"type": "scale", "kind": "ConfigMap", "namespace": ns, "name": "plain", "replicas": 2})).await?;

    // Revisions 1 (nginx:1) and 2 (nginx:2).
    expect(
        hub,
        &account,
        200,
        json!({"type": "apply", "manifest": deployment(&ns, "web", "nginx:2", 3)}),
    )
    .await?;
    let image = |d: &Deployment| {
        d.spec
            .template
            .spec
            .as_ref()
            .map(|p| p.containers[0].image.clone().unwrap_or_default())
            .unwrap_or_default()
    };
    until("revision 2", || {
        let (hub, account, ns) = (hub, account.clone(), ns.clone());
        async move {
            let h = expect(hub, &account, 200, json!({"type": "rollout", "action": "history", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
            Ok(h["text"].as_str().unwrap_or_default().contains("\n2 "))
        }
    })
    .await?;
    let h = expect(hub, &account, 200, json!({"type": "rollout", "action": "history", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    let text = h["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("REVISION  CHANGE-CAUSE") && text.contains("1         <none>"),
        "{text}"
    );

    // Undo to the previous revision: the template of revision 1 comes back (revision 3).
    let r = expect(hub, &account, 200, json!({"type": "rollout", "action": "undo", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert!(
        r["text"]
            .as_str()
            .unwrap_or_default()
            .contains("rolled back"),
        "{r:#}"
    );
    assert_eq!(image(&s.deployments().get("web").await?), "nginx:1");
    let d = s.deployments().clone();
    until("revision 3", || {
        let d = d.clone();
        async move {
            Ok(d.get("web")
                .await?
                .metadata
                .annotations
                .unwrap_or_default()
                .get("deployment.kubernetes.io/revision")
                .map(String::as_str)
                == Some("3"))
        }
    })
    .await?;
    // Undo to a given revision.
    expect(hub, &account, 200, json!({"type": "rollout", "action": "undo", "toRevision": 2, "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert_eq!(image(&s.deployments().get("web").await?), "nginx:2");
    let r = expect(hub, &account, 404, json!({"type": "rollout", "action": "undo", "toRevision": 42, "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("unable to find specified revision 42")
    );

    // Pause and resume; undo and restart refuse a paused deployment.
    expect(hub, &account, 200, json!({"type": "rollout", "action": "pause", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert_eq!(s.deployments().get("web").await?.spec.paused, Some(true));
    expect(hub, &account, 400, json!({"type": "rollout", "action": "restart", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    expect(hub, &account, 400, json!({"type": "rollout", "action": "undo", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    expect(hub, &account, 200, json!({"type": "rollout", "action": "resume", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert_ne!(s.deployments().get("web").await?.spec.paused, Some(true));

    // Restart: the restartedAt annotation on the pod template, and a new ReplicaSet.
    let r = expect(hub, &account, 200, json!({"type": "rollout", "action": "restart", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert!(r["objects"][0]["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"].is_string());
    let live = s.deployments().get("web").await?;
    assert!(
        live.spec
            .template
            .metadata
            .and_then(|m| m.annotations)
            .unwrap_or_default()
            .contains_key("kubectl.kubernetes.io/restartedAt")
    );
    let r = expect(hub, &account, 200, json!({"type": "rollout", "action": "status", "kind": "deployment", "namespace": ns, "name": "web"})).await?;
    assert!(
        r["text"]
            .as_str()
            .unwrap_or_default()
            .contains("deployments.apps/web")
    );

    // A StatefulSet: scale, and undo through its ControllerRevisions.
    let sts = |image: &str| {
        json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": ns},
            "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": image}]}}},
        })
    };
    let sts_api: Api<StatefulSet> = Api::namespaced(s.admin.clone(), &ns);
    expect(
        hub,
        &account,
        200,
        json!({"type": "apply", "manifest": sts("db:1")}),
    )
    .await?;
    expect(
        hub,
        &account,
        200,
        json!({"type": "scale", "kind": "sts", "namespace": ns, "name": "db", "replicas": 2}),
    )
    .await?;
    assert_eq!(sts_api.get("db").await?.spec.replicas, Some(2));
    let history = |hub: SocketAddr, account: String, ns: String| async move {
        let h = expect(hub, &account, 200, json!({"type": "rollout", "action": "history", "kind": "statefulset", "namespace": ns, "name": "db"})).await?;
        Ok::<_, anyhow::Error>(h["text"].as_str().unwrap_or_default().to_string())
    };
    until("statefulset revision 1", || {
        let f = history(hub, account.clone(), ns.clone());
        async move { Ok(f.await?.contains("\n1 ")) }
    })
    .await?;
    let mut applied = sts("db:2");
    applied["spec"]["replicas"] = json!(2);
    expect(
        hub,
        &account,
        200,
        json!({"type": "apply", "manifest": applied}),
    )
    .await?;
    until("statefulset revision 2", || {
        let f = history(hub, account.clone(), ns.clone());
        async move { Ok(f.await?.contains("\n2 ")) }
    })
    .await?;
    let r = expect(hub, &account, 200, json!({"type": "rollout", "action": "undo", "kind": "statefulset", "namespace": ns, "name": "db"})).await?;
    assert!(
        r["text"]
            .as_str()
            .unwrap_or_default()
            .contains("rolled back"),
        "{r:#}"
    );
    let live = sts_api.get("db").await?;
    let image = live
        .spec
        .template
        .spec
        .map(|p| p.containers[0].image.clone().unwrap_or_default())
        .unwrap_or_default();
    assert_eq!(image, "db:1");
    expect(hub, &account, 200, json!({"type": "rollout", "action": "restart", "kind": "statefulset", "namespace": ns, "name": "db"})).await?;
    expect(hub, &account, 400, json!({"type": "rollout", "action": "pause", "kind": "statefulset", "namespace": ns, "name": "db"})).await?;

    // Rollout of a kind that has none.
    expect(hub, &account, 400, json!({"type": "rollout", "action": "undo", "kind": "ConfigMap", "namespace": ns, "name": "plain"})).await?;
    s.stop().await
}

/// Logs and events (this cluster runs no kubelet, so pods never start: the request path and
/// the API server's errors are what is checked), and an operation RBAC forbids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_events_and_rbac_forbidden() -> anyhow::Result<()> {
    let s = Setup::new("logs", 1).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    let pods: Api<Pod> = Api::namespaced(s.admin.clone(), &ns);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": {"job": "j"}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}
        }))?,
    )
    .await?;

    // A pod that was never scheduled: this API server answers an empty log.
    let r = expect(hub, &account, 200, json!({"type": "logs", "namespace": ns, "name": "p", "container": "main", "tailLines": 10, "sinceSeconds": 60, "timestamps": true})).await?;
    assert_eq!(r["state"], "succeeded");
    assert_eq!(r["executed"], true);
    assert_eq!(r["text"], "");
    // A container the pod does not have: the API server's error comes back as is.
    let (code, r) = op(hub, &account, json!({"type": "logs", "namespace": ns, "name": "p", "container": "nope", "previous": true})).await?;
    assert!((400..500).contains(&code), "{code} {r:#}");
    assert_eq!(r["state"], "failed");
    assert_eq!(r["executed"], true);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("nope"),
        "{r:#}"
    );
    // Missing pod.
    expect(
        hub,
        &account,
        404,
        json!({"type": "logs", "namespace": ns, "name": "missing"}),
    )
    .await?;
    // Job logs: a Job whose pods do not exist yet (the job controller may create one that
    // never runs): either no pods (404) or the pod's error.
    let (code, r) = op(
        hub,
        &account,
        json!({"type": "logs", "kind": "deployment", "namespace": ns, "name": "missing"}),
    )
    .await?;
    assert_eq!(code, 404, "{r:#}");
    expect(
        hub,
        &account,
        200,
        json!({"type": "apply", "manifest": deployment(&ns, "nopods", "nginx:1", 0)}),
    )
    .await?;
    let r = expect(
        hub,
        &account,
        404,
        json!({"type": "logs", "kind": "deployment", "namespace": ns, "name": "nopods"}),
    )
    .await?;
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("no pods found"),
        "{r:#}"
    );

    // Events about an object.
    let r = expect(
        hub,
        &account,
        200,
        json!({"type": "events", "kind": "Pod", "namespace": ns, "name": "p"}),
    )
    .await?;
    assert!(r["text"].as_str().unwrap_or_default().starts_with("TYPE"));

    // RBAC: a read-only account (its own agent) is refused with the API server's 403 and
    // nothing changes.
    let control_plane = control_plane()?;
    let reader = identity(
        control_plane,
        &s.admin,
        &ns,
        "reader",
        &["get", "list", "watch"],
        &s.dir,
    )
    .await?;
    let read_account = account_name("reader");
    let config = s.dir.join("reader.yaml");
    write_config(
        &config,
        s.hub.grpc_addr,
        json!([fixtures::account(
            &read_account,
            &reader,
            &ns,
            &["configmaps"]
        )]),
    )?;
    let reader_agent = fixtures::start_agent_replica(&config, "reader-0").await?;
    let ra = read_account.clone();
    until("the read-only account", || {
        let ra = ra.clone();
        async move {
            Ok(http(hub, "GET", &format!("/api/v1/accounts/{ra}"), None)
                .await?
                .1["streaming"]
                .is_object())
        }
    })
    .await?;
    s.configmaps()
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "keep"}, "data": {"v": "1"}}))?,
        )
        .await?;
    let before = s.configmaps().get("keep").await?.metadata.resource_version;
    let r = expect(
        hub,
        &read_account,
        403,
        json!({"type": "delete", "kind": "ConfigMap", "namespace": ns, "name": "keep"}),
    )
    .await?;
    assert_eq!(r["status"]["reason"], "Forbidden");
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot delete resource \"configmaps\""),
        "{r:#}"
    );
    let r = expect(
        hub,
        &read_account,
        403,
        json!({"type": "apply", "manifest": configmap(&ns, "keep", json!({"v": "2"}))}),
    )
    .await?;
    assert_eq!(r["executed"], true);
    assert_eq!(
        s.configmaps().get("keep").await?.metadata.resource_version,
        before,
        "nothing changed"
    );
    // Reads are allowed.
    expect(
        hub,
        &read_account,
        200,
        json!({"type": "get", "kind": "ConfigMap", "namespace": ns, "name": "keep"}),
    )
    .await?;
    reader_agent.stop().await?;
    s.stop().await
}

/// Two replicas: the one running a slow delete (waiting on a finalizer) is stopped; the hub
/// sends the (idempotent) delete to the other replica, which finishes it. With no replica
/// left, the hub answers 503 noAgent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_in_flight_retries_on_the_other_replica_then_no_agent() -> anyhow::Result<()> {
    let mut s = Setup::new("failover", 2).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    s.configmaps()
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "slow", "finalizers": ["example.com/hold"]}}),
            )?,
        )
        .await?;
    let id = format!("failover-{:08x}", rand::random::<u32>());
    let (h, a, n, i) = (hub, account.clone(), ns.clone(), id.clone());
    let pending = tokio::spawn(async move {
        op(h, &a, json!({"id": i, "type": "delete", "kind": "ConfigMap", "namespace": n, "name": "slow", "wait": true, "timeoutSeconds": 50})).await
    });
    // Which replica runs it?
    let every = Duration::from_millis(50);
    let first = wait_for_within("the operation to show as running", WAIT, every, || async {
        let (code, state) = http(hub, "GET", &format!("/api/v1/operations/{id}"), None).await?;
        // (`replica` is empty until one is chosen.)
        let replica = state["replica"].as_str().unwrap_or_default();
        let running = code == 200 && state["state"] == "running" && !replica.is_empty();
        Ok(running.then(|| replica.to_string()))
    })
    .await?;
    // Let it reach the API server, then stop that replica.
    let cms = s.configmaps();
    until("the delete to be under way", || {
        let cms = cms.clone();
        async move { Ok(cms.get("slow").await?.metadata.deletion_timestamp.is_some()) }
    })
    .await?;
    let index = s
        .agents
        .iter()
        .position(|(r, _)| first.ends_with(&format!("/{r}")))
        .ok_or_else(|| anyhow::anyhow!("replica {first} unknown"))?;
    let (stopped, agent) = s.agents.remove(index);
    agent.stop().await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !pending.is_finished(),
        "the retried delete waits on the finalizer"
    );
    s.configmaps()
        .patch(
            "slow",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    let (code, r) = pending.await??;
    assert_eq!(code, 200, "{r:#}");
    assert_eq!(r["attempts"], 2, "{r:#}");
    assert!(
        !r["replica"]
            .as_str()
            .unwrap_or_default()
            .ends_with(&stopped),
        "{r:#}"
    );
    assert_eq!(r["deleted"][0], format!("ConfigMap/{ns}/slow"));
    // The same id again: the recorded result, not a second run.
    let (code, again) = op(hub, &account, json!({"id": id, "type": "delete", "kind": "ConfigMap", "namespace": ns, "name": "slow", "wait": true})).await?;
    assert_eq!(code, 200);
    assert_eq!(again["attempts"], 2);

    // No replica left: the operation waits for one up to its deadline, then 503 with a
    // clear message.
    for (_, agent) in s.agents.drain(..) {
        agent.stop().await?;
    }
    let waited = Instant::now();
    let r = expect(
        hub,
        &account,
        503,
        json!({"type": "get", "kind": "ConfigMap", "namespace": ns, "name": "x", "timeoutSeconds": 2}),
    )
    .await?;
    assert!(
        waited.elapsed() >= Duration::from_secs(2),
        "answered before its deadline"
    );
    assert_eq!(r["state"], "noAgent");
    assert!(
        r["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("no agent connected for account {account}")),
        "{r:#}"
    );

    // Submitted while no agent is connected: it runs once a replica connects within its
    // deadline (a rolling restart of a one-replica agent), as Armory's retries would.
    let (h, a, n) = (hub, account.clone(), ns.clone());
    let pending = tokio::spawn(async move {
        op(h, &a, json!({"type": "create", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after-restart", "namespace": n}}, "timeoutSeconds": 60})).await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!pending.is_finished(), "answered with no agent connected");
    let replica = "failover-back".to_string();
    let config = s.dir.join("agent.yaml");
    s.agents.push((
        replica.clone(),
        fixtures::start_agent_replica(&config, &replica).await?,
    ));
    let (code, r) = pending.await??;
    assert_eq!(code, 201, "{r:#}");
    assert_eq!(r["attempts"], 1, "{r:#}");
    let created = s.configmaps().get("after-restart").await?;
    assert_eq!(
        r["objects"][0]["metadata"]["uid"].as_str(),
        created.metadata.uid.as_deref()
    );
    s.stop().await
}

/// Concurrent submissions of one client id (Armory retrying a stage, two hub clients): the
/// operation runs once. Proven from the API server's side with a generateName create, which
/// makes a new object each time it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submits_of_one_client_id_execute_once() -> anyhow::Result<()> {
    let s = Setup::new("once", 2).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    let id = format!("once-{:08x}", rand::random::<u32>());
    let body = json!({"id": id, "type": "create", "manifest": {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"generateName": "once-", "namespace": ns, "labels": {"test": "once"}},
    }});
    let mut submits = Vec::new();
    for _ in 0..8 {
        let (a, b) = (account.clone(), body.clone());
        submits.push(tokio::spawn(async move { op(hub, &a, b).await }));
    }
    let mut uids = Vec::new();
    for submit in submits {
        let (code, r) = submit.await??;
        assert_eq!(code, 201, "{r:#}");
        uids.push(
            r["objects"][0]["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    let made = s
        .configmaps()
        .list(&ListParams::default().labels("test=once"))
        .await?;
    assert_eq!(
        made.items.len(),
        1,
        "the create ran {} times",
        made.items.len()
    );
    let uid = made.items[0].metadata.uid.clone().unwrap_or_default();
    assert!(uids.iter().all(|u| *u == uid), "{uids:?} vs {uid}");
    s.stop().await
}

/// A list larger than one gRPC message (the hub decodes at most --max-object-bytes + 1 MiB,
/// 3 MiB by default): the agent sends it in parts, it arrives whole, and the agent's stream,
/// with its other account, goes on. Before, the result ended the stream, and the hub resent
/// the list to the next replica, ending that one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_larger_than_one_message_arrives_whole_and_the_stream_survives() -> anyhow::Result<()>
{
    let s = Setup::with_accounts("large", 1, 2).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    let other = s.others[0].clone();
    let blob = "x".repeat(100_000);
    for i in 0..45 {
        s.configmaps()
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": format!("big-{i:02}"), "labels": {"size": "big"}}, "data": {"blob": blob}}))?,
            )
            .await?;
    }
    let (_, before) = http(hub, "GET", "/api/v1/agents", None).await?;
    let r = expect(
        hub,
        &account,
        200,
        json!({"type": "list", "kind": "ConfigMap", "namespace": ns, "labelSelector": "size=big", "timeoutSeconds": 120}),
    )
    .await?;
    let objects = r["objects"].as_array().map(Vec::len).unwrap_or(0);
    assert_eq!(objects, 45);
    // A page: the continue token comes back, and takes the next page.
    let r = expect(
        hub,
        &other,
        200,
        json!({"type": "list", "kind": "ConfigMap", "namespace": ns, "labelSelector": "size=big", "limit": 40}),
    )
    .await?;
    assert_eq!(r["objects"].as_array().map(Vec::len), Some(40));
    let token = r["continue"].as_str().unwrap_or_default().to_string();
    assert!(!token.is_empty(), "no continue token: {}", r["status"]);
    let r = expect(
        hub,
        &other,
        200,
        json!({"type": "list", "kind": "ConfigMap", "namespace": ns, "labelSelector": "size=big", "limit": 40, "continue": token}),
    )
    .await?;
    assert_eq!(r["objects"].as_array().map(Vec::len), Some(5));
    assert!(r.get("continue").is_none(), "{}", r["continue"]);
    // The other way: an apply whose manifests (5 MB) exceed gRPC's default message size of
    // 4 MiB, which the agent used to refuse, ending its stream.
    let manifests: Vec<Value> = (0..5)
        .map(|i| {
            configmap(
                &ns,
                &format!("wide-{i}"),
                json!({"blob": "y".repeat(1_000_000)}),
            )
        })
        .collect();
    // (Not `expect`: its message would quote the 5 MB request.)
    let (code, r) = op(
        hub,
        &other,
        json!({"type": "apply", "manifests": manifests, "timeoutSeconds": 120}),
    )
    .await?;
    assert_eq!(code, 200, "{} {}", r["status"], r["message"]);
    assert_eq!(
        r["objects"].as_array().map(Vec::len),
        Some(5),
        "{}",
        r["status"]
    );
    // The same stream all along: neither account reconnected.
    let (_, after) = http(hub, "GET", "/api/v1/agents", None).await?;
    assert_eq!(before, after);
    assert_eq!(before.as_array().map(Vec::len), Some(1), "{before:#}");
    s.stop().await
}

/// Review R16: the operations an agent runs at once are limited per account
/// (`tasks.operationsPerAccount`, 16 by default), not per agent process. Sixteen `delete`
/// with `wait` on objects a finalizer holds fill one account's slots; an operation of the
/// agent's other account still completes at once, while a seventeenth of the first account
/// waits for a slot (and, its deadline passing there, never reaches the API server). Before,
/// the sixteen held every slot of the process, and the other account's operation timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_accounts_slow_operations_do_not_starve_another_account() -> anyhow::Result<()> {
    const SLOTS: usize = scale_agent_crds::agent_config::OPERATIONS_PER_ACCOUNT as usize;
    let s = Setup::with_accounts("starve", 1, 2).await?;
    let (hub, account, ns) = (s.hub(), s.account.clone(), s.namespace.clone());
    let other = s.others[0].clone();
    let held = |i: usize| format!("held-{i:02}");
    for i in 0..=SLOTS {
        s.configmaps()
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": held(i), "finalizers": ["example.com/hold"]}}),
                )?,
            )
            .await?;
    }
    let mut pending = Vec::new();
    for i in 0..SLOTS {
        let (a, n, name) = (account.clone(), ns.clone(), held(i));
        pending.push(tokio::spawn(async move {
            op(hub, &a, json!({"type": "delete", "kind": "ConfigMap", "namespace": n, "name": name, "wait": true, "timeoutSeconds": 120})).await
        }));
    }
    // Every slot of the account is held: each delete reached the API server and waits.
    let cms = s.configmaps();
    until("a deletionTimestamp on every held configmap", || {
        let cms = cms.clone();
        async move {
            let items = cms.list(&ListParams::default()).await?.items;
            Ok(items
                .iter()
                .filter(|cm| cm.metadata.deletion_timestamp.is_some())
                .count()
                == SLOTS)
        }
    })
    .await?;

    // The other account's operation runs at once (before: 504 after its 20 s).
    let started = Instant::now();
    let (code, r) = op(
        hub,
        &other,
        json!({"type": "get", "kind": "ConfigMap", "namespace": ns, "name": held(SLOTS), "timeoutSeconds": 20}),
    )
    .await?;
    assert_eq!(code, 200, "{r:#}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    // The first account is at its limit: one more waits for a slot until its deadline.
    let r = expect(
        hub,
        &account,
        504,
        json!({"type": "delete", "kind": "ConfigMap", "namespace": ns, "name": held(SLOTS), "wait": true, "timeoutSeconds": 3}),
    )
    .await?;
    assert_eq!(r["executed"], false, "{r:#}");
    assert!(
        s.configmaps()
            .get(&held(SLOTS))
            .await?
            .metadata
            .deletion_timestamp
            .is_none(),
        "the seventeenth delete never reached the API server"
    );

    for i in 0..=SLOTS {
        s.configmaps()
            .patch(
                &held(i),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await?;
    }
    for pending in pending {
        let (code, r) = pending.await??;
        assert_eq!(code, 200, "{r:#}");
    }
    s.stop().await
}
