//! The stack the proxy's cache tests (`tests/proxy_cache.rs`, `proxy_cache_clients.rs`,
//! `proxy_tables.rs`) each start: the shared control plane with its audit log, a hub serving
//! TLS, and one agent replica whose account reads as a ServiceAccount of its own (cluster-wide
//! rules), so a direct read (the agent's kubeconfig) and a proxied one (the hub's kubeconfig
//! for the account) act as the same identity and their answers compare.
//!
//! It starts in two steps, so a test can seed the cluster before the agent's first snapshot:
//! [`ProxyStack::identity`] makes the namespaces, the work directory and the agent's
//! kubeconfig; [`Identity::start`] starts the hub and the agent.

use std::path::{Path, PathBuf};

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};

use crate::{
    ControlPlane, ControlPlaneOptions,
    fixtures::{self, TlsHub, temp_dir},
    kubectl::Outcome,
};

/// The shared control plane, with the audit log the tests read to prove which reads
/// reached the API server.
pub fn audited_control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(|| {
        ControlPlaneOptions::default().with_audit()
    })?)
}

/// The first step: who the agent reads as, and where the test's objects live.
pub struct Identity {
    pub control_plane: &'static ControlPlane,
    pub admin: Client,
    /// The test's name prefix: the home namespace, the work directory, the account's prefix.
    pub prefix: String,
    /// The agent ServiceAccount's namespace.
    pub home: String,
    /// The namespace the test's objects live in (`<prefix>-objects`).
    pub namespace: String,
    pub dir: PathBuf,
    /// The agent's own kubeconfig: direct reads use it, so both sides read as one identity.
    pub direct: PathBuf,
}

/// A hub and one agent replica streaming one account, with both kubeconfigs.
pub struct ProxyStack {
    pub dir: PathBuf,
    pub hub: TlsHub,
    pub account: String,
    pub home: String,
    pub namespace: String,
    pub direct: PathBuf,
    pub proxied: PathBuf,
    /// The proxy token of [`Self::proxied`].
    pub token: String,
    /// `system:serviceaccount:<home>:agent`, as the audit log names the agent (and the
    /// proxy's requests, made with the agent's credentials).
    pub user: String,
    pub agent: Option<scale_agent::AgentHandle>,
}

impl ProxyStack {
    /// Namespaces `<prefix>` (home of the agent's ServiceAccount `agent`, with cluster-wide
    /// rules) and `<prefix>-objects`, a work directory, and the agent's kubeconfig.
    pub async fn identity(prefix: &str) -> anyhow::Result<Identity> {
        let control_plane = audited_control_plane()?;
        let admin = control_plane.client().await?;
        let home = control_plane.namespace(&admin, prefix).await?;
        let namespace = control_plane
            .namespace(&admin, &format!("{prefix}-objects"))
            .await?;
        let dir = temp_dir(prefix)?;
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
        Ok(Identity {
            control_plane,
            admin,
            prefix: prefix.to_owned(),
            home,
            namespace,
            dir,
            direct,
        })
    }

    /// Stops the agent and the hub and removes the work directory.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(agent) = self.agent.take() {
            agent.stop().await?;
        }
        self.hub.hub.shutdown().await?;
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

impl Identity {
    /// A unique account name: `<prefix>-<pid>-<random>`.
    pub fn account_name(&self) -> String {
        format!(
            "{}-{}-{:04x}",
            self.prefix,
            std::process::id(),
            rand::random::<u16>()
        )
    }

    /// Starts the hub and agent replica `replica` streaming `account` (its `name` and
    /// `kubeconfigFile` are set here), waits until the hub has it, and issues the proxy
    /// kubeconfig (token name `token_name`).
    pub async fn start(
        self,
        account: String,
        mut account_config: Value,
        replica: &str,
        token_name: &str,
    ) -> anyhow::Result<ProxyStack> {
        let hub = TlsHub::start(&self.dir, |_| {}).await?;
        account_config["name"] = json!(account);
        account_config["kubeconfigFile"] = json!(self.direct.display().to_string());
        let config = self.dir.join("agent.yaml");
        fixtures::write_plaintext_agent_config(
            &config,
            hub.hub.grpc_addr,
            json!([account_config]),
            2,
        )?;
        let agent = fixtures::start_agent_replica(&config, replica).await?;
        hub.wait_connected(&account, 1).await?;
        let proxied = hub
            .kubeconfig(&account, token_name, &self.dir.join("proxied.kubeconfig"))
            .await?;
        let token = proxy_token(&proxied)?;
        Ok(ProxyStack {
            dir: self.dir,
            hub,
            account,
            user: format!("system:serviceaccount:{}:agent", self.home),
            home: self.home,
            namespace: self.namespace,
            direct: self.direct,
            proxied,
            token,
            agent: Some(agent),
        })
    }
}

/// The bearer token of a proxy kubeconfig.
pub fn proxy_token(kubeconfig: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(kubeconfig)?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .map(|t| t.trim_matches('"').to_string())
        .ok_or_else(|| anyhow::anyhow!("no token in {}", kubeconfig.display()))
}

/// A kube client for the kubeconfig at `path`.
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<Client> {
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    Ok(Client::try_from(config)?)
}

/// Owned arguments for a kubectl run.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Fails with kubectl's exit code and output unless the run succeeded.
pub fn ensure_ok(what: &str, outcome: &Outcome) -> anyhow::Result<()> {
    anyhow::ensure!(
        outcome.success(),
        "{what}: exit {:?}\nstdout: {}\nstderr: {}",
        outcome.code,
        outcome.stdout,
        outcome.stderr
    );
    Ok(())
}
