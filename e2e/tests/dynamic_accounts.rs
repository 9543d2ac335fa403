//! Dynamic accounts (issue 12 item 3) on the real control plane: an account added through
//! the hub's admin API is pushed to a connected agent process, which reads the account's
//! kubeconfig from a Secret with its own ServiceAccount's token (RBAC lets it get that one
//! Secret and nothing else) and streams the cluster into the hub's cache; the account
//! survives an agent restart and a hub restart (it is in the hub's store), an account of the
//! agent's own config wins over a pushed one, an unreadable Secret is reported with what to
//! change, a Secret the agent's `dynamicAccounts.kubeconfigSecrets` does not list is refused
//! before it is read (issue 28, F13), and a removed account stops being served.
//!
//! The hub runs in this process (TLS on its HTTP listener, plaintext gRPC, so the agent's
//! identity is `anonymous`), the agent as the real `e2e-agent` binary.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::{
    ByteString,
    api::{
        core::v1::{ConfigMap, Secret},
        rbac::v1::PolicyRule,
    },
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use scale_agent_e2e::{
    ControlPlane,
    fixtures::{self, Scope, TlsHub},
    http,
    process::{self, ManagedProcess},
    wait::wait_for,
};
use serde_json::{Value, json};

const AGENT: &str = env!("CARGO_BIN_EXE_e2e-agent");
/// Generous: two cores shared by many tests.
const WAIT: Duration = Duration::from_secs(90);
/// The identity of an agent on the hub's plaintext gRPC listener.
const IDENTITY: &str = "anonymous";
const SECRET: &str = "dyn-kubeconfig";
/// A Secret the agent's RBAC does not let it read.
const FORBIDDEN_SECRET: &str = "other-kubeconfig";

/// The agent process, restartable with the same flags and environment.
struct Agent {
    config: PathBuf,
    kubeconfig: PathBuf,
    admin: SocketAddr,
    dir: PathBuf,
    starts: usize,
    process: Option<ManagedProcess>,
}

impl Agent {
    /// Starts `e2e-agent` on `config`, its own credentials (for Secrets) in `kubeconfig`.
    async fn start(dir: &Path, config: PathBuf, kubeconfig: PathBuf) -> anyhow::Result<Self> {
        let port = scale_agent_e2e::local_agent::free_port()?;
        let mut agent = Agent {
            config,
            kubeconfig,
            admin: SocketAddr::from(([127, 0, 0, 1], port)),
            dir: dir.to_path_buf(),
            starts: 0,
            process: None,
        };
        agent.start_again().await?;
        Ok(agent)
    }

    async fn start_again(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        let mut command = std::process::Command::new(AGENT);
        command
            .arg(format!("--config={}", self.config.display()))
            .arg("--replica=dyn-0")
            .arg(format!("--admin-addr={}", self.admin))
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info");
        let log = self.dir.join(format!("agent-{}.log", self.starts));
        let mut process = ManagedProcess::spawn_command("e2e-agent", command, log.clone())?;
        let url = format!("http://{}/healthz", self.admin);
        process::wait_ready(&mut process, "the agent's admin port", &log, WAIT, || {
            let call = http::Call::new("GET", url.clone());
            async move { call.send().await.is_ok_and(|r| r.status == 200) }
        })
        .await?;
        self.process = Some(process);
        Ok(())
    }

    /// SIGTERM, and wait until it has exited.
    fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop(Duration::from_secs(20));
        }
    }

    /// The agent's `/accounts` entry for `name`.
    async fn account(&self, name: &str) -> anyhow::Result<Option<Value>> {
        let view = http::Call::new("GET", format!("http://{}/accounts", self.admin))
            .send()
            .await?
            .json_or_null();
        Ok(view["accounts"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["name"] == name).cloned()))
    }

    fn log(&self) -> String {
        (1..=self.starts)
            .map(|n| process::tail(&self.dir.join(format!("agent-{n}.log")), 40))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `method path` to the admin API with the admin token, and the answer's status and JSON.
async fn admin(hub: &TlsHub, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut call = hub.call(method, path).bearer(&hub.admin_token);
    if let Some(body) = body {
        call = call.json(body);
    }
    match call.send().await {
        Ok(response) => (response.status, response.json_or_null()),
        Err(e) => (0, json!({ "error": e.to_string() })),
    }
}

/// The names of the ConfigMaps of `account` in `namespace` in the hub's cache.
async fn cached_configmaps(
    hub: &TlsHub,
    account: &str,
    namespace: &str,
) -> anyhow::Result<Vec<String>> {
    let response = hub
        .api(
            "GET",
            &format!("/api/v1/accounts/{account}/objects?kind=ConfigMap&namespace={namespace}"),
        )
        .send()
        .await?;
    if response.status == 404 {
        return Ok(Vec::new());
    }
    anyhow::ensure!(
        response.status == 200,
        "objects of {account}: {} {}",
        response.status,
        response.body
    );
    let mut names: Vec<String> = response.json_or_null()["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    Ok(names)
}

async fn wait_cached(
    hub: &TlsHub,
    agent: &Agent,
    account: &str,
    namespace: &str,
    configmap: &str,
) -> anyhow::Result<()> {
    wait_for(
        &format!("ConfigMap {configmap} of account {account} in the hub's cache"),
        || async {
            let names = cached_configmaps(hub, account, namespace).await?;
            let found = names.iter().any(|n| n == configmap);
            anyhow::ensure!(found, "{names:?}; agent log:\n{}", agent.log());
            Ok(Some(()))
        },
    )
    .await
}

/// Waits until the dynamic account's report from the agent has `state`; returns its message.
async fn wait_reported(hub: &TlsHub, account: &str, state: &str) -> anyhow::Result<String> {
    wait_for(
        &format!("dynamic account {account} reported {state}"),
        || async {
            let (status, view) = admin(
                hub,
                "GET",
                &format!("/api/v1/dynamic-accounts/{account}"),
                None,
            )
            .await;
            let report = view["agentStatus"]
                .as_array()
                .and_then(|r| r.iter().find(|r| r["state"] == state).cloned());
            let message = report.map(|r| r["message"].as_str().unwrap_or_default().to_string());
            anyhow::ensure!(message.is_some(), "{status} {view}");
            Ok(message)
        },
    )
    .await
}

async fn create_configmap(admin: &Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    Api::<ConfigMap>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                data: Some([("v".to_string(), "1".to_string())].into()),
                ..Default::default()
            },
        )
        .await?;
    Ok(())
}

async fn create_secret(
    admin: &Client,
    namespace: &str,
    name: &str,
    kubeconfig: &[u8],
) -> anyhow::Result<()> {
    Api::<Secret>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                data: Some([("kubeconfig".to_string(), ByteString(kubeconfig.to_vec()))].into()),
                ..Default::default()
            },
        )
        .await?;
    Ok(())
}

fn dynamic_account(name: &str, namespace: &str, secret: &str) -> Value {
    json!({
        "name": name,
        "agent": IDENTITY,
        "mode": "Infrastructure",
        "kubeconfigSecret": { "namespace": namespace, "name": secret },
        "kinds": ["ConfigMap"],
        "namespaces": [namespace],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamic_account_streams_survives_restarts_and_is_removed() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared()?;
    let admin_client = control_plane.client().await?;
    let ns = control_plane
        .namespace(&admin_client, "dyn-accounts")
        .await?;
    let dir = fixtures::temp_dir("dyn-accounts")?;

    // The account's cluster identity: reads ConfigMaps in the namespace. Its kubeconfig goes
    // into a Secret; a second Secret holds it too, but the agent may not read that one.
    let target_kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin_client,
        &ns,
        "target",
        Scope::Namespace,
        fixtures::read_rules(&["configmaps"]),
        dir.join("target-kubeconfig"),
    )
    .await?;
    let kubeconfig_bytes = std::fs::read(&target_kubeconfig)?;
    create_secret(&admin_client, &ns, SECRET, &kubeconfig_bytes).await?;
    create_secret(&admin_client, &ns, FORBIDDEN_SECRET, &kubeconfig_bytes).await?;
    // The agent's own identity: may get that one Secret, nothing else.
    let agent_kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin_client,
        &ns,
        "agent",
        Scope::Namespace,
        vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            resource_names: Some(vec![SECRET.into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }],
        dir.join("agent-kubeconfig"),
    )
    .await?;
    create_configmap(&admin_client, &ns, "before").await?;

    // A grace period long enough for restarts, short enough to see a removed account go.
    let hub = TlsHub::start(&dir, |config| {
        config.streams.grace_period = Duration::from_secs(20);
    })
    .await?;
    // The agent's own config has one account, `static-<ns>`, which a pushed account of the
    // same name cannot replace.
    let static_name = format!("static-{ns}");
    let config = dir.join("agent.yaml");
    fixtures::write_plaintext_agent_config(
        &config,
        hub.hub.grpc_addr,
        json!([fixtures::account(
            &static_name,
            &target_kubeconfig,
            &ns,
            &["ConfigMap"]
        )]),
        1,
    )?;
    // The agent's opt-in (issue 28, F13): pushed accounts only with these two Secrets.
    let mut written: serde_json::Value = serde_json::from_slice(&std::fs::read(&config)?)?;
    written["dynamicAccounts"] = json!({
        "enabled": true,
        "kubeconfigSecrets": [format!("{ns}/{SECRET}"), format!("{ns}/{FORBIDDEN_SECRET}")],
    });
    std::fs::write(&config, serde_json::to_string_pretty(&written)?)?;
    let mut agent = Agent::start(&dir, config, agent_kubeconfig).await?;
    wait_cached(&hub, &agent, &static_name, &ns, "before").await?;

    // Refusals: status and what to change.
    let name = format!("dyn-{ns}");
    let body = dynamic_account(&name, &ns, SECRET);
    let (status, answer) = hub
        .api("POST", "/api/v1/dynamic-accounts")
        .json(&body)
        .send()
        .await
        .map(|r| (r.status, r.json_or_null()))?;
    assert_eq!(
        status, 403,
        "the operator role may not add accounts: {answer}"
    );
    let mut with_contents = body.clone();
    with_contents["kubeconfigContents"] = json!("apiVersion: v1");
    let (status, answer) = admin(
        &hub,
        "POST",
        "/api/v1/dynamic-accounts",
        Some(&with_contents),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("kubeconfigSecret") && e.contains("never carries")),
        "{answer}"
    );
    let (status, answer) = admin(
        &hub,
        "PUT",
        &format!("/api/v1/dynamic-accounts/{name}"),
        Some(&body),
    )
    .await;
    assert_eq!(status, 404, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("POST /api/v1/dynamic-accounts")),
        "{answer}"
    );

    // Added: pushed to the agent, which streams the cluster.
    let (status, answer) = admin(&hub, "POST", "/api/v1/dynamic-accounts", Some(&body)).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["name"], name.as_str());
    let (status, answer) = admin(&hub, "POST", "/api/v1/dynamic-accounts", Some(&body)).await;
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["error"].as_str().is_some_and(|e| e.contains("PUT")),
        "{answer}"
    );
    wait_cached(&hub, &agent, &name, &ns, "before").await?;
    create_configmap(&admin_client, &ns, "added").await?;
    wait_cached(&hub, &agent, &name, &ns, "added").await?;
    let message = wait_reported(&hub, &name, "REGISTERED").await?;
    assert!(message.contains("dyn-0"), "{message}");
    let (_, view) = admin(
        &hub,
        "GET",
        &format!("/api/v1/dynamic-accounts/{name}"),
        None,
    )
    .await;
    assert_eq!(view["state"], "ACTIVE", "{view}");
    assert_eq!(view["connectedReplicas"], json!(["dyn-0"]), "{view}");
    let served = agent.account(&name).await?;
    assert!(
        served.as_ref().is_some_and(|a| a["role"] == "streaming"),
        "{served:?}"
    );

    // The agent's own config wins over a pushed account of the same name.
    let (status, answer) = admin(
        &hub,
        "POST",
        "/api/v1/dynamic-accounts",
        Some(&dynamic_account(&static_name, &ns, SECRET)),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let message = wait_reported(&hub, &static_name, "OVERRIDDEN").await?;
    assert!(message.contains("own config"), "{message}");
    // A Secret the agent may not read: FAILED, saying which permission is missing.
    let denied = format!("denied-{ns}");
    let (status, answer) = admin(
        &hub,
        "POST",
        "/api/v1/dynamic-accounts",
        Some(&dynamic_account(&denied, &ns, FORBIDDEN_SECRET)),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let message = wait_reported(&hub, &denied, "FAILED").await?;
    assert!(
        message.contains(FORBIDDEN_SECRET) && message.contains("grant its ServiceAccount `get`"),
        "{message}"
    );
    // A Secret the agent's config does not list (a pivot to another cluster's admin
    // kubeconfig): FAILED before any read, saying where to list it.
    let unlisted = format!("unlisted-{ns}");
    let (status, answer) = admin(
        &hub,
        "POST",
        "/api/v1/dynamic-accounts",
        Some(&dynamic_account(
            &unlisted,
            "capi-system",
            "prod-kubeconfig",
        )),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let message = wait_reported(&hub, &unlisted, "FAILED").await?;
    assert!(
        message.contains("Secret capi-system/prod-kubeconfig")
            && message.contains("dynamicAccounts.kubeconfigSecrets does not list"),
        "{message}"
    );

    // The agent restarts (with nothing of the pushed accounts in its config): the hub
    // pushes them again and the account streams on.
    agent.stop();
    create_configmap(&admin_client, &ns, "while-agent-down").await?;
    agent.start_again().await?;
    wait_cached(&hub, &agent, &name, &ns, "while-agent-down").await?;
    wait_reported(&hub, &name, "REGISTERED").await?;

    // The hub restarts: the accounts are in its store, and pushed again.
    let (hub, ()) = hub.restart(async { Ok(()) }).await?;
    let (status, view) = admin(
        &hub,
        "GET",
        &format!("/api/v1/dynamic-accounts/{name}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "kept across a hub restart: {view}");
    create_configmap(&admin_client, &ns, "after-hub-restart").await?;
    wait_cached(&hub, &agent, &name, &ns, "after-hub-restart").await?;
    wait_reported(&hub, &name, "REGISTERED").await?;

    // Removed: the agent stops serving it, and the hub drops it after the grace period.
    let (status, answer) = admin(
        &hub,
        "DELETE",
        &format!("/api/v1/dynamic-accounts/{name}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = admin(
        &hub,
        "GET",
        &format!("/api/v1/dynamic-accounts/{name}"),
        None,
    )
    .await;
    assert_eq!(status, 404, "{answer}");
    wait_for("the agent to stop serving the removed account", || async {
        let served = agent.account(&name).await?;
        anyhow::ensure!(served.is_none(), "{served:?}");
        Ok(Some(()))
    })
    .await?;
    wait_for("the hub to drop the removed account's objects", || async {
        let names = cached_configmaps(&hub, &name, &ns).await?;
        anyhow::ensure!(names.is_empty(), "{names:?}");
        Ok(Some(()))
    })
    .await?;
    // The static account is untouched.
    let names = cached_configmaps(&hub, &static_name, &ns).await?;
    assert!(
        names.contains(&"after-hub-restart".to_string()),
        "{names:?}"
    );
    let (status, listed) = admin(&hub, "GET", "/api/v1/dynamic-accounts", None).await;
    assert_eq!(status, 200);
    let mut listed_names: Vec<&str> = listed
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["name"].as_str())
        .collect();
    listed_names.sort();
    let mut expected = vec![denied.as_str(), static_name.as_str(), unlisted.as_str()];
    expected.sort();
    assert_eq!(listed_names, expected);

    drop(agent);
    hub.hub.shutdown().await?;
    process::remove_at_exit(dir);
    Ok(())
}
