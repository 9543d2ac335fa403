//! The product as it ships, on a real node (e2e/src/real_node): this build's images loaded
//! into containerd, the chart installed with `helm install` as the README says (operator and
//! hub, embedded store), a ScaleAgent and an AgentAccount applied with kubectl, and real agent
//! pods run by kubelet under the chart's and the operator's probes, security contexts and
//! resources, enrolling with the hub pod through its Service, until
//! `kubectl wait --for=condition=Connected` succeeds.
//!
//! What a bare node lacks, done the way a platform team would: the hub's volume claim is
//! bound to a hostPath PersistentVolume made here (no provisioner), and there is no cluster
//! DNS, so the ScaleAgent dials the hub Service's ClusterIP with `tls.serverName` set to the
//! name in the hub's certificate.
//!
//! Needs root; without it the test says why and passes without running.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail, ensure};
use scale_agent_e2e::{
    fixtures::temp_dir,
    pki::CertificateAuthority,
    real_node::{self, NodeImage, RealNode},
};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const NAMESPACE: &str = "scale-agent-system";
const HUB_DATA_UID: &str = "65532:65532";

/// Each image: its repository, the product binary's name in it, and this build's binary
/// that is the same command.
const IMAGES: [(&str, &str, &str); 3] = [
    (
        "ghcr.io/scale-agent/operator",
        "scale-agent-operator",
        env!("CARGO_BIN_EXE_e2e-operator"),
    ),
    (
        "ghcr.io/scale-agent/agent",
        "scale-agent",
        env!("CARGO_BIN_EXE_e2e-agent"),
    ),
    (
        "ghcr.io/scale-agent/hub",
        "scale-agent-hub",
        env!("CARGO_BIN_EXE_e2e-hub"),
    ),
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The images `make images` makes, from this build's binaries (`images/image.sh layout`,
/// the same script; a fast gzip, as the binaries are debug builds).
fn build_images(dir: &Path) -> anyhow::Result<Vec<NodeImage>> {
    IMAGES
        .iter()
        .map(|(repository, name, binary)| {
            let layout = dir.join(name);
            let output = Command::new(repo_root().join("images/image.sh"))
                .args(["layout", binary, name])
                .arg(&layout)
                .env("SCALE_AGENT_IMAGE_GZIP_LEVEL", "1")
                .output()?;
            ensure!(
                output.status.success(),
                "images/image.sh layout {binary}: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            Ok(NodeImage {
                repository: repository.to_string(),
                layout,
            })
        })
        .collect()
}

/// kubectl and helm as a user runs them: the admin kubeconfig in KUBECONFIG.
struct Cli {
    kubectl: PathBuf,
    helm: PathBuf,
    kubeconfig: PathBuf,
    home: PathBuf,
}

impl Cli {
    fn command(&self, program: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(program);
        command
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", &self.home)
            .env("HELM_CACHE_HOME", self.home.join("helm-cache"))
            .env("HELM_CONFIG_HOME", self.home.join("helm-config"))
            .env("HELM_DATA_HOME", self.home.join("helm-data"));
        command
    }

    fn run(&self, program: &Path, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        let shown = format!(
            "{} {}",
            program.file_name().unwrap_or_default().to_string_lossy(),
            args.join(" ")
        );
        let mut command = self.command(program, args);
        let output = match stdin {
            Some(text) => {
                use std::io::Write as _;
                command
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped());
                let mut child = command.spawn().with_context(|| shown.clone())?;
                child
                    .stdin
                    .take()
                    .context("stdin")?
                    .write_all(text.as_bytes())?;
                child.wait_with_output()?
            }
            None => command.output().with_context(|| shown.clone())?,
        };
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        ensure!(
            output.status.success(),
            "`{shown}` failed ({}):\n{stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(stdout)
    }

    fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        self.run(&self.kubectl, args, None)
    }

    fn apply(&self, yaml: &str) -> anyhow::Result<String> {
        self.run(&self.kubectl, &["apply", "-f", "-"], Some(yaml))
    }

    fn helm(&self, args: &[&str]) -> anyhow::Result<String> {
        self.run(&self.helm, args, None)
    }

    /// What `kubectl get` says, for a failure message.
    fn describe(&self) -> String {
        let mut out = String::new();
        for args in [
            &["get", "pods", "-A", "-o", "wide"][..],
            &["-n", NAMESPACE, "get", "events", "--sort-by=.lastTimestamp"][..],
            &[
                "-n",
                NAMESPACE,
                "get",
                "scaleagents,agentaccounts",
                "-o",
                "yaml",
            ][..],
        ] {
            out.push_str(&self.kubectl(args).unwrap_or_else(|e| e.to_string()));
        }
        out
    }
}

/// The hub's serving certificate (the chart's `scale-agent-hub-tls`): for the Service's
/// names, signed by a CA the agents are given.
fn hub_tls_secret(cli: &Cli, dir: &Path) -> anyhow::Result<String> {
    let ca = CertificateAuthority::new("scale-agent-hub-ca")?;
    let serving = ca.serving(
        "scale-agent-hub",
        &[
            "scale-agent-hub",
            "scale-agent-hub.scale-agent-system",
            "scale-agent-hub.scale-agent-system.svc",
        ],
    )?;
    let files = [
        ("tls.crt", &serving.cert_pem),
        ("tls.key", &serving.key_pem),
        ("ca.crt", &ca.cert_pem),
    ];
    let mut args = vec![
        "-n".to_string(),
        NAMESPACE.into(),
        "create".into(),
        "secret".into(),
        "generic".into(),
        "scale-agent-hub-tls".into(),
    ];
    for (name, pem) in files {
        let path = dir.join(name);
        std::fs::write(&path, pem)?;
        args.push(format!("--from-file={name}={}", path.display()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cli.kubectl(&args)?;
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "create",
        "secret",
        "generic",
        "hub-ca",
        &format!("--from-file=ca.crt={}", dir.join("ca.crt").display()),
    ])?;
    Ok(ca.cert_pem)
}

/// A node without a provisioner: a hostPath PersistentVolume reserved for the hub's claim,
/// its directory owned by the hub's user (hostPath volumes get no fsGroup).
fn hub_volume(cli: &Cli, dir: &Path) -> anyhow::Result<()> {
    let path = dir.join("hub-data");
    std::fs::create_dir_all(&path)?;
    let chown = Command::new("chown")
        .arg(HUB_DATA_UID)
        .arg(&path)
        .status()?;
    ensure!(chown.success(), "chown {HUB_DATA_UID} {}", path.display());
    cli.apply(&format!(
        "apiVersion: v1
kind: PersistentVolume
metadata:
  name: scale-agent-hub-data
spec:
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  claimRef:
    namespace: {NAMESPACE}
    name: scale-agent-hub-data
  hostPath:
    path: {}
    type: Directory
",
        path.display()
    ))?;
    Ok(())
}

fn wait_rollout(cli: &Cli, deployment: &str) -> anyhow::Result<()> {
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "rollout",
        "status",
        &format!("deployment/{deployment}"),
        "--timeout=240s",
    ])
    .with_context(|| cli.describe())?;
    Ok(())
}

fn step(started: Instant, what: &str) {
    eprintln!(
        "[real-node test] {:6.1} s  {what}",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_and_agents_connect_on_a_real_node() -> anyhow::Result<()> {
    if let Some(reason) = real_node::unavailable() {
        eprintln!("skipping the real-node test: {reason}");
        return Ok(());
    }
    let started = Instant::now();
    let dir = temp_dir("real-node-test")?;
    let images = build_images(&dir.join("images"))?;
    step(started, "images built from this build's binaries");
    let node = RealNode::start(&images).await?;
    step(started, "node Ready");
    let control_plane = node.control_plane();
    let home = dir.join("home");
    std::fs::create_dir_all(&home)?;
    let cli = Cli {
        kubectl: control_plane.binaries().kubectl(),
        helm: control_plane.binaries().helm(),
        kubeconfig: control_plane.kubeconfig_path().to_path_buf(),
        home,
    };

    // As the README installs it: the hub's Secret first, then the chart with the hub on.
    cli.kubectl(&["create", "namespace", NAMESPACE])?;
    hub_tls_secret(&cli, &dir)?;
    hub_volume(&cli, &dir)?;
    let chart = repo_root().join("manifests/helm/scale-agent");
    let installed = cli.helm(&[
        "install",
        "scale-agent",
        &chart.to_string_lossy(),
        "-n",
        NAMESPACE,
        "--set",
        "hub.enabled=true",
        "--timeout",
        "5m",
    ])?;
    ensure!(
        installed.contains(&format!("Scale Agent v{VERSION} is installed")),
        "helm install said:\n{installed}"
    );
    step(started, "helm install done");
    wait_rollout(&cli, "scale-agent-operator")?;
    wait_rollout(&cli, "scale-agent-hub")?;
    step(started, "operator and hub pods Ready");

    // A one-time enrolment token from the hub's pod (exec through kubelet).
    let token = cli
        .kubectl(&[
            "-n",
            NAMESPACE,
            "exec",
            "deploy/scale-agent-hub",
            "--",
            "scale-agent-hub",
            "agent-token",
            "create",
            "--identity",
            "real-node",
            "--accounts",
            "real-node*",
            "--ttl",
            "1h",
            "--once",
        ])?
        .trim()
        .to_string();
    ensure!(!token.is_empty(), "agent-token create printed no token");
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "create",
        "secret",
        "generic",
        "real-node-enrolment",
        &format!("--from-literal=token={token}"),
    ])?;

    // No cluster DNS: the hub Service's ClusterIP, and the name in its certificate.
    let hub_ip = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "service",
        "scale-agent-hub",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])?;
    cli.kubectl(&["create", "namespace", "team-a"])?;
    cli.apply(&format!(
        "apiVersion: scaleagent.dev/v1alpha1
kind: ScaleAgent
metadata:
  name: real-node
  namespace: {NAMESPACE}
spec:
  mode: Agent
  hub:
    address: {hub_ip}:9091
    tls:
      serverName: scale-agent-hub
      caSecretRef:
        name: hub-ca
  enrolment:
    tokenSecretRef:
      name: real-node-enrolment
  replicas: 2
  access: Deploy
  scope:
    type: Namespaces
    namespaces: [team-a]
  defaults:
    kinds: [Deployment, ReplicaSet, Service, ConfigMap, Pod]
---
apiVersion: scaleagent.dev/v1alpha1
kind: AgentAccount
metadata:
  name: real-node
  namespace: {NAMESPACE}
spec:
  agentRef: real-node
"
    ))?;
    step(started, "ScaleAgent and AgentAccount applied");
    if let Err(error) = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "wait",
        "--for=condition=Connected",
        "agentaccount/real-node",
        "--timeout=300s",
    ]) {
        bail!("{error}\n{}", cli.describe());
    }
    step(started, "agentaccount/real-node Connected");
    let agents = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/instance=real-node",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.containers[0].image}{\"\\n\"}{end}",
    ])?;
    eprintln!("agent pods:\n{agents}");

    drop(node);
    std::fs::remove_dir_all(&dir).ok();
    step(started, "done");
    Ok(())
}
