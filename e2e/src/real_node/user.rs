//! kubectl and Helm as a platform team runs them against a real node's cluster, and the
//! hub's Kubernetes API proxy reached as a user reaches it (a port-forward and the
//! kubeconfig the hub hands out).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};

use crate::local_agent::free_port;

/// kubectl and helm as a user runs them: the admin kubeconfig in KUBECONFIG.
pub struct Cli {
    pub kubectl: PathBuf,
    pub helm: PathBuf,
    pub kubeconfig: PathBuf,
    /// HOME and Helm's cache, configuration and data: nothing of the machine's user.
    pub home: PathBuf,
}

impl Cli {
    /// `program args` with the user's environment, to spawn.
    pub fn command(&self, program: &Path, args: &[&str]) -> Command {
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

    /// Runs `program args` (with `stdin`), failing with its output unless it succeeds.
    pub fn run(&self, program: &Path, args: &[&str], stdin: Option<&str>) -> Result<String> {
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

    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.run(&self.kubectl, args, None)
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> Result<String> {
        self.run(&self.kubectl, &["apply", "-f", "-"], Some(yaml))
    }

    pub fn helm(&self, args: &[&str]) -> Result<String> {
        self.run(&self.helm, args, None)
    }

    /// What `kubectl get` says of the pods, and of `namespace`'s events and Scale Agent
    /// objects, for a failure message.
    pub fn describe(&self, namespace: &str) -> String {
        let mut out = String::new();
        for args in [
            &["get", "pods", "-A", "-o", "wide"][..],
            &["-n", namespace, "get", "events", "--sort-by=.lastTimestamp"][..],
            &[
                "-n",
                namespace,
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

/// `kubectl port-forward` to the hub's Service, as a user reaches it from their machine
/// (through the API server and kubelet's port-forward); stopped when dropped.
pub struct PortForward {
    child: std::process::Child,
    /// The local port, on 127.0.0.1.
    pub port: u16,
}

impl PortForward {
    /// Forwards a free local port to `service`'s `remote_port` in `namespace`, and waits
    /// until it listens.
    pub fn start(cli: &Cli, namespace: &str, service: &str, remote_port: u16) -> Result<Self> {
        let port = free_port()?;
        let child = cli
            .command(
                &cli.kubectl,
                &[
                    "-n",
                    namespace,
                    "port-forward",
                    &format!("service/{service}"),
                    &format!("{port}:{remote_port}"),
                ],
            )
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let forward = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            ensure!(
                Instant::now() < deadline,
                "kubectl port-forward to {namespace}/{service} did not listen on {port} in 30 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(forward)
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// kubectl with the kubeconfig the hub hands out for an account, through a port-forward:
/// the server's host becomes the forwarded port, verified as the name in the hub's
/// certificate.
pub struct HubKubectl {
    kubeconfig: PathBuf,
    server: String,
    server_name: String,
}

impl HubKubectl {
    /// The kubeconfig of `account` from `scale-agent-hub kubeconfig`, run in the hub's pod
    /// (Deployment `scale-agent-hub` in `namespace`), saved in `dir`; `server_name` is the
    /// name in the hub's certificate.
    pub fn new(
        cli: &Cli,
        namespace: &str,
        dir: &Path,
        account: &str,
        server_name: &str,
    ) -> Result<Self> {
        let kubeconfig = cli.kubectl(&[
            "-n",
            namespace,
            "exec",
            "deploy/scale-agent-hub",
            "--",
            "scale-agent-hub",
            "kubeconfig",
            "--account",
            account,
        ])?;
        let server = kubeconfig
            .lines()
            .find_map(|line| line.trim().strip_prefix("server: "))
            .context("no server in the hub's kubeconfig")?
            .trim()
            .to_string();
        let path = dir.join(format!("{account}.kubeconfig"));
        std::fs::write(&path, &kubeconfig)?;
        Ok(Self {
            kubeconfig: path,
            server,
            server_name: server_name.to_string(),
        })
    }

    fn args(&self, forward: &PortForward, args: &[&str]) -> Vec<String> {
        let rest = self
            .server
            .strip_prefix("https://")
            .and_then(|s| s.split_once('/').map(|(_, path)| path))
            .unwrap_or_default();
        let mut all = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--server=https://127.0.0.1:{}/{rest}", forward.port),
            format!("--tls-server-name={}", self.server_name),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        all
    }

    /// kubectl `args` through the hub, reached at `forward`.
    pub fn run(
        &self,
        cli: &Cli,
        forward: &PortForward,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String> {
        self.run_with(cli, &cli.kubectl, forward, args, stdin)
    }

    /// Like [`Self::run`] with another kubectl (e.g. an older release, as Clouddriver ships).
    pub fn run_with(
        &self,
        cli: &Cli,
        kubectl: &Path,
        forward: &PortForward,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String> {
        let all = self.args(forward, args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        // KUBECONFIG is overridden by --kubeconfig: nothing of the admin's is used.
        cli.run(kubectl, &all, stdin)
    }
}
