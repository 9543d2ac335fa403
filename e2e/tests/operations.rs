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

#[path = "operations/deletes.rs"]
mod deletes;
#[path = "operations/delivery.rs"]
mod delivery;
#[path = "operations/logs_and_rbac.rs"]
mod logs_and_rbac;
#[path = "operations/rollouts.rs"]
mod rollouts;
#[path = "operations/writes.rs"]
mod writes;
