//! The Kubernetes API proxy on a real control plane (with KWOK, so pods run, roll out and
//! have logs), with real clients: kubectl of three minors (the harness's own and the
//! 1.22 and 1.29 Clouddriver ships) and Helm, through `https://<hub>/clusters/<account>`:
//! the hub's TLS listener, the tunnel over the agent's existing stream, and the agent
//! replaying each request as its own ServiceAccount under real RBAC.
//!
//! The kubectl test runs every command form Clouddriver runs (`KubectlJobExecutor`, see
//! `../shared/reference/spinnaker-and-kubectl.md`) twice, in two fresh namespaces: directly
//! against the API server with the agent's own credentials, and through the proxy, and
//! compares exit codes, stdout and stderr once the namespace, uids, resourceVersions, times
//! and controller-written status are masked ([`scale_agent_e2e::kubectl::normalize`]).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Secret},
};
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, PostParams},
};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    fixtures::{self, TlsHub, temp_dir},
    kubectl::{self, Kubectl, Outcome},
    process::{self, ManagedProcess},
};
use serde_json::{Value, json};

const AGENT: &str = env!("CARGO_BIN_EXE_e2e-agent");
const HUB: &str = env!("CARGO_BIN_EXE_e2e-hub");
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(90);
const WAIT: Duration = Duration::from_secs(60);

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(|| {
        ControlPlaneOptions::default().with_kwok().with_audit()
    })?)
}

fn init_logs() {
    scale_agent_e2e::fixtures::init_logs("warn,scale_agent_hub_proxy=info");
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A ServiceAccount with [`fixtures::admin_rules`], and a kubeconfig of it in `dir`.
async fn agent_identity(
    admin: &Client,
    namespace: &str,
    name: &str,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    fixtures::service_account_identity(
        control_plane()?,
        admin,
        namespace,
        name,
        fixtures::Scope::Cluster,
        fixtures::admin_rules(),
        dir.join(format!("{name}.kubeconfig")),
    )
    .await
}

/// An agent account entry: cluster-wide, streaming only ConfigMaps (the proxy does not need
/// the cache; fewer watches keep the tests light).
fn account_entry(name: &str, kubeconfig: &Path) -> Value {
    json!({
        "name": name,
        "kubeconfigFile": kubeconfig.display().to_string(),
        "kinds": ["configmaps"],
        // Helm keeps releases in Secrets: only accounts named helm-… opt in to Secret data
        // through the proxy, the others show the default.
        "allowSecretData": name.starts_with("helm-"),
    })
}

/// A unique account name for this test run.
fn account_name(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// The hub, and one in-process agent serving `accounts` with the agent's credentials.
struct Setup {
    admin: Client,
    dir: PathBuf,
    hub: TlsHub,
    /// The agent's own kubeconfig: "direct" commands use it, so both sides act as the same
    /// identity.
    direct: PathBuf,
    agent: Option<scale_agent::AgentHandle>,
}

impl Setup {
    async fn new(name: &str, accounts: &[&str]) -> anyhow::Result<Setup> {
        init_logs();
        let control_plane = control_plane()?;
        let admin = control_plane.client().await?;
        let home = control_plane
            .namespace(&admin, &format!("proxy-{name}"))
            .await?;
        let dir = temp_dir(&format!("proxy-{name}"))?;
        let direct = agent_identity(&admin, &home, "agent", &dir).await?;
        let hub = TlsHub::start(&dir, |_| {}).await?;
        let config = dir.join("agent.yaml");
        fixtures::write_plaintext_agent_config(
            &config,
            hub.hub.grpc_addr,
            Value::Array(accounts.iter().map(|a| account_entry(a, &direct)).collect()),
            2,
        )?;
        let agent = fixtures::start_agent_replica(&config, &format!("{name}-0")).await?;
        for account in accounts {
            hub.wait_connected(account, 1).await?;
        }
        Ok(Setup {
            admin,
            dir,
            hub,
            direct,
            agent: Some(agent),
        })
    }

    async fn kubeconfig(&self, account: &str, token_name: &str) -> anyhow::Result<PathBuf> {
        self.hub
            .kubeconfig(
                account,
                token_name,
                &self.dir.join(format!("{account}-{token_name}.kubeconfig")),
            )
            .await
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

/// Waits until every Deployment in `namespace` is observed and, unless paused, fully
/// rolled out (so the next command sees the same cluster on both sides).
async fn settle(admin: &Client, namespace: &str) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(admin.clone(), namespace);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let deployments = api.list(&ListParams::default()).await?;
        let unsettled: Vec<String> = deployments
            .items
            .iter()
            .filter(|d| {
                let generation = d.metadata.generation.unwrap_or(0);
                let wanted = d.spec.replicas.unwrap_or(1);
                let paused = d.spec.paused.unwrap_or(false);
                let status = d.status.clone().unwrap_or_default();
                let observed = status.observed_generation.unwrap_or(0) >= generation;
                let rolled_out = status.updated_replicas.unwrap_or(0) == wanted
                    && status.replicas.unwrap_or(0) == wanted
                    && status.available_replicas.unwrap_or(0) == wanted;
                !(observed && (paused || rolled_out))
            })
            .map(|d| d.metadata.name.clone().unwrap_or_default())
            .collect();
        if unsettled.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "deployments {unsettled:?} in {namespace} never settled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ensure_ok(what: &str, outcome: &Outcome) -> anyhow::Result<()> {
    anyhow::ensure!(
        outcome.success(),
        "{what} failed ({:?}):\n{}\n{}",
        outcome.code,
        outcome.stdout,
        outcome.stderr
    );
    Ok(())
}

/// The bearer token of a proxy kubeconfig.
fn proxy_token(kubeconfig: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(kubeconfig)?
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: ").map(str::to_string))
        .ok_or_else(|| anyhow::anyhow!("no token in {}", kubeconfig.display()))
}

/// A bare pod `logger` (container `main`) with a log line, so `kubectl logs` has something
/// to show; kwok runs it.
async fn logger_pod(admin: &Client, namespace: &str) -> anyhow::Result<()> {
    let log = control_plane()?.pod_log(admin, namespace, "logger").await?;
    log.append("hello from the logger")?;
    run_logger(admin, namespace).await
}

/// Creates the bare pod `logger` and waits until kwok runs it (its log file, if any, was
/// made already).
async fn run_logger(admin: &Client, namespace: &str) -> anyhow::Result<()> {
    Ok(scale_agent_e2e::kwok::run_logger(admin, namespace, WAIT).await?)
}

/// A running kubectl whose stdout is read line by line.
struct Follower {
    child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    stderr: tokio::task::JoinHandle<String>,
}

impl Follower {
    async fn start(kubectl: &Kubectl, kubeconfig: &Path, list: &[String]) -> anyhow::Result<Self> {
        use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _};
        std::fs::create_dir_all(&kubectl.home)?;
        let mut child = tokio::process::Command::new(&kubectl.binary)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(list)
            .env("HOME", &kubectl.home)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut stderr = child
            .stderr
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stderr"))?;
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text).await;
            text
        });
        Ok(Follower {
            child,
            lines,
            stderr,
        })
    }

    /// Waits for a line containing `needle`.
    async fn expect(&mut self, needle: &str) -> anyhow::Result<()> {
        self.line(needle).await.map(drop)
    }

    /// Waits for a line containing `needle` and returns it.
    async fn line(&mut self, needle: &str) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.recv())
                .await
                .map_err(|_| anyhow::anyhow!("no line with {needle:?} within {WAIT:?}"))?
                .ok_or_else(|| anyhow::anyhow!("the output ended before a line with {needle:?}"))?;
            if line.contains(needle) {
                return Ok(line);
            }
        }
    }

    /// Waits for kubectl to exit; its exit code and stderr.
    async fn exited(mut self) -> anyhow::Result<(Option<i32>, String)> {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .map_err(|_| anyhow::anyhow!("kubectl did not exit within {WAIT:?}"))??;
        Ok((status.code(), self.stderr.await?))
    }
}

#[path = "proxy/discovery.rs"]
mod discovery;
#[path = "proxy/exec.rs"]
mod exec;
#[path = "proxy/helm.rs"]
mod helm;
#[path = "proxy/kubectl_forms.rs"]
mod kubectl_forms;
#[path = "proxy/streams.rs"]
mod streams;
#[path = "proxy/tokens.rs"]
mod tokens;
