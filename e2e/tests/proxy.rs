//! The Kubernetes API proxy on a real control plane, with real clients: kubectl (the one the
//! harness builds and older minors Clouddriver ships) through
//! `https://<hub>/clusters/<account>`, the hub's TLS listener, the tunnel over the agent's
//! stream, and the agent replaying requests as its own ServiceAccount.

use std::{
    path::{Path, PathBuf},
    process::Output,
    time::Duration,
};

use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::Client;
use scale_agent_e2e::{
    ControlPlane,
    fixtures::{self, temp_dir},
    http::Call,
    pki::CertificateAuthority,
};
use serde_json::{Value, json};

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared()?)
}

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,scale_agent=info,scale_agent_hub=info".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A hub with a TLS HTTP listener, one agent serving one account as a ServiceAccount with
/// every right in the cluster, and the admin token.
struct Setup {
    admin: Client,
    namespace: String,
    account: String,
    dir: PathBuf,
    ca_pem: String,
    admin_token: String,
    /// The agent's own kubeconfig: what "direct" commands use, so their answers compare.
    direct_kubeconfig: PathBuf,
    hub: scale_agent_hub::RunningHub,
    agents: Vec<scale_agent::AgentHandle>,
}

impl Setup {
    async fn new(name: &str) -> anyhow::Result<Setup> {
        init_logs();
        let control_plane = control_plane()?;
        let admin = control_plane.client().await?;
        let namespace = control_plane
            .namespace(&admin, &format!("proxy-{name}"))
            .await?;
        let dir = temp_dir(&format!("proxy-{name}"))?;
        let rules = vec![
            PolicyRule {
                api_groups: Some(vec!["*".into()]),
                resources: Some(vec!["*".into()]),
                verbs: vec!["*".into()],
                ..Default::default()
            },
            PolicyRule {
                non_resource_urls: Some(vec!["*".into()]),
                verbs: vec!["get".into()],
                ..Default::default()
            },
        ];
        let direct_kubeconfig = fixtures::service_account_identity(
            control_plane,
            &admin,
            &namespace,
            "agent",
            fixtures::Scope::Cluster,
            rules,
            dir.join("agent.kubeconfig"),
        )
        .await?;

        let ca = CertificateAuthority::new("proxy-test-ca")?;
        let serving = ca.serving("scale-agent-hub", &[])?;
        let mut config = scale_agent_hub::Config::new(
            scale_agent_hub::GrpcSecurity::InsecurePlaintext,
            dir.join("hub-data"),
        );
        config.grpc_addr = "127.0.0.1:0".parse()?;
        config.http_addr = "127.0.0.1:0".parse()?;
        config.heartbeat_period = Duration::from_secs(2);
        config.http_security = scale_agent_hub::HttpSecurity::Tls {
            cert_pem: serving.cert_pem.into_bytes(),
            key_pem: serving.key_pem.into_bytes(),
        };
        config.serving_ca_pem = Some(ca.cert_pem.clone().into_bytes());
        config.admin_token_file = Some(dir.join("admin-token"));
        let hub = scale_agent_hub::start(config).await?;
        let admin_token = std::fs::read_to_string(dir.join("admin-token"))?
            .trim()
            .to_string();

        let account = format!("{name}-{}", std::process::id());
        let agent_config = dir.join("agent.yaml");
        fixtures::write_plaintext_agent_config(
            &agent_config,
            hub.grpc_addr,
            json!([{
                "name": account,
                "kubeconfigFile": direct_kubeconfig.display().to_string(),
                "kinds": ["configmaps"],
                "namespaces": [namespace],
            }]),
            2,
        )?;
        let agent = fixtures::start_agent_replica(&agent_config, &format!("{name}-0")).await?;
        let setup = Setup {
            admin,
            namespace,
            account,
            dir,
            ca_pem: ca.cert_pem.clone(),
            admin_token,
            direct_kubeconfig,
            hub,
            agents: vec![agent],
        };
        setup.wait_connected().await?;
        Ok(setup)
    }

    fn base(&self) -> String {
        format!("https://{}", self.hub.http_addr)
    }

    async fn wait_connected(&self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let response = Call::new(
                "GET",
                format!("{}/api/v1/accounts/{}", self.base(), self.account),
            )
            .ca(&self.ca_pem)
            .send()
            .await?;
            if response.status == 200 && response.json_or_null()["streaming"].is_object() {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the account never connected: {response:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Issues a kubeconfig for the account through the admin API and writes it to a file.
    async fn kubeconfig(&self, token_name: &str) -> anyhow::Result<PathBuf> {
        let response = Call::new(
            "POST",
            format!(
                "{}/api/v1/accounts/{}/kubeconfig?tokenName={token_name}",
                self.base(),
                self.account
            ),
        )
        .ca(&self.ca_pem)
        .bearer(&self.admin_token)
        .send()
        .await?;
        anyhow::ensure!(response.status == 200, "kubeconfig: {response:?}");
        let path = self.dir.join(format!("proxy-{token_name}.kubeconfig"));
        std::fs::write(&path, &response.body)?;
        Ok(path)
    }

    async fn stop(self) -> anyhow::Result<()> {
        for agent in self.agents {
            agent.stop().await?;
        }
        self.hub.shutdown().await?;
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

/// Runs the control plane's kubectl with `kubeconfig`.
async fn kubectl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Output> {
    let bin = control_plane()?.binaries().kubectl();
    let output = tokio::process::Command::new(bin)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .env("HOME", kubeconfig.parent().unwrap_or(Path::new("/tmp")))
        .kill_on_drop(true)
        .output()
        .await?;
    Ok(output)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn kubectl_reaches_the_cluster_through_the_proxy() -> anyhow::Result<()> {
    let setup = Setup::new("smoke").await?;
    let kubeconfig = setup.kubeconfig("smoke").await?;
    let out = kubectl(
        &kubeconfig,
        &["get", "namespace", &setup.namespace, "-o", "json"],
    )
    .await?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl through the proxy failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let ns: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(ns["metadata"]["name"], setup.namespace.as_str());
    let _ = &setup.admin;
    let _ = &setup.direct_kubeconfig;
    setup.stop().await
}
