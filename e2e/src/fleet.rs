//! The hub and its agents as real processes (`e2e-hub`, `e2e-agent`) that a test can kill
//! outright (SIGKILL), pause (SIGSTOP/SIGCONT) and start again where they were: the hub on
//! the same ports and data directory, an agent with the same config and replica name.
//!
//! Plaintext on loopback (`--insecure-plaintext`, `--http-plaintext`): what these
//! processes are for is failure and recovery, not TLS, which `streaming.rs` and `proxy.rs`
//! cover. The hub's REST API answers with [`crate::fixtures::API_TOKEN`].
//!
//! ```no_run
//! # async fn example(dir: &std::path::Path, config: &std::path::Path) -> anyhow::Result<()> {
//! use scale_agent_e2e::fleet::{AgentProcess, HubProcess};
//! let mut hub = HubProcess::start(dir, &[]).await?;
//! let mut agent = AgentProcess::start(dir, config, "r0").await?;
//! hub.kill();
//! hub.start_again().await?;
//! agent.pause();
//! agent.resume();
//! # Ok(()) }
//! ```

use std::{
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    binaries::product_binary,
    fixtures,
    process::{self, ManagedProcess},
};

/// How long a started process may take to answer on its port.
const START_TIMEOUT: Duration = Duration::from_secs(60);

fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// A process restarted in place: the same program and arguments, a log per start
/// (`<dir>/<name>-<n>.log`).
#[derive(Debug)]
struct Restartable {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    starts: usize,
    process: Option<ManagedProcess>,
    paused: bool,
}

impl Restartable {
    fn new(name: &'static str, dir: &Path, args: Vec<String>) -> anyhow::Result<Self> {
        Ok(Self {
            name,
            program: product_binary(name)?,
            args,
            dir: dir.to_path_buf(),
            starts: 0,
            process: None,
            paused: false,
        })
    }

    fn log_name(&self) -> String {
        format!("{}-{}", self.name, self.args_id())
    }

    /// Tells apart processes of one program sharing a directory (agent replicas).
    fn args_id(&self) -> String {
        self.args
            .iter()
            .find_map(|a| a.strip_prefix("--replica="))
            .unwrap_or("0")
            .to_string()
    }

    /// Starts the process and waits until `GET <addr><path>` answers 200, failing early
    /// with its log when it exits.
    async fn start(&mut self, addr: SocketAddr, path: &str) -> anyhow::Result<()> {
        self.starts += 1;
        let log = self
            .dir
            .join(format!("{}-{}.log", self.log_name(), self.starts));
        let process = ManagedProcess::spawn(self.name, &self.program, &self.args, log.clone())?;
        let pid = process.pid();
        self.process = Some(process);
        self.paused = false;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            anyhow::ensure!(
                process::is_alive(pid),
                "{} exited: {}",
                self.name,
                process::tail(&log, 20)
            );
            if crate::http::get(addr, path)
                .await
                .is_ok_and(|r| r.status == 200)
            {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} did not answer {path} within {START_TIMEOUT:?}: {}",
                self.name,
                process::tail(&log, 20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ManagedProcess::pid)
    }

    /// SIGKILL, and the process reaped: nothing said to anyone, nothing flushed.
    fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process::send_signal(process.pid(), libc::SIGKILL);
            process.stop(Duration::from_secs(5));
        }
        self.paused = false;
    }

    fn pause(&mut self) {
        if let Some(pid) = self.pid() {
            process::send_signal(pid, libc::SIGSTOP);
            self.paused = true;
        }
    }

    fn resume(&mut self) {
        if let Some(pid) = self.pid() {
            process::send_signal(pid, libc::SIGCONT);
        }
        self.paused = false;
    }

    /// The end of the latest log.
    fn log_tail(&self, lines: usize) -> String {
        self.process
            .as_ref()
            .map(|p| process::tail(p.log(), lines))
            .unwrap_or_default()
    }
}

impl Drop for Restartable {
    fn drop(&mut self) {
        // A stopped process would sit out the SIGTERM grace period before being killed.
        if self.paused {
            self.resume();
        }
    }
}

/// The hub as a process: plaintext gRPC and HTTP on fixed loopback ports, its store in
/// `<dir>/hub-data`, 1 s heartbeats (unless `extra` sets `--heartbeat-period`), the tests'
/// API token.
#[derive(Debug)]
pub struct HubProcess {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub data_dir: PathBuf,
    process: Restartable,
}

impl HubProcess {
    /// Starts it with `extra` flags (`{http}` in them stands for its HTTP listener's
    /// address, e.g. for `--replica-address=http://{http}`) and waits for `/readyz`.
    pub async fn start(dir: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        let (grpc, http) = (free_addr()?, free_addr()?);
        let data_dir = dir.join("hub-data");
        let mut args: Vec<String> = vec![
            format!("--grpc-addr={grpc}"),
            format!("--http-addr={http}"),
            "--insecure-plaintext".into(),
            // Every agent is `anonymous`, which registers only what an --allow rule names.
            "--allow=*=*".into(),
            "--http-plaintext".into(),
            format!("--data-dir={}", data_dir.display()),
            format!(
                "--api-tokens-file={}",
                fixtures::write_api_tokens(dir)?.display()
            ),
        ];
        if !extra.iter().any(|a| a.starts_with("--heartbeat-period")) {
            args.push("--heartbeat-period=1s".into());
        }
        args.extend(extra.iter().map(|a| a.replace("{http}", &http.to_string())));
        let mut hub = Self {
            grpc,
            http,
            data_dir,
            process: Restartable::new("e2e-hub", dir, args)?,
        };
        hub.start_again().await?;
        Ok(hub)
    }

    /// Starts it again on the same ports and data directory; waits for `/readyz`.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        self.process.start(self.http, "/readyz").await
    }

    /// SIGKILL: no goodbye to the agents, nothing flushed beyond what the store committed.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The end of the current process's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// `GET /api/v1/accounts/{name}`; `None` when the hub does not know it.
    pub async fn account(&self, name: &str) -> anyhow::Result<Option<Value>> {
        Ok(fixtures::hub_get_json(self.http, &format!("/api/v1/accounts/{name}")).await?)
    }

    /// The replica streaming `account`, if any.
    pub async fn streaming_replica(&self, account: &str) -> anyhow::Result<Option<String>> {
        Ok(self
            .account(account)
            .await?
            .and_then(|view| view["streaming"]["replica"].as_str().map(str::to_string)))
    }

    /// The cached objects of `kind` (kind or plural, optionally `group/`) of `account` in
    /// `namespace`; empty when the hub does not know the account or kind.
    pub async fn objects(
        &self,
        account: &str,
        kind: &str,
        namespace: &str,
    ) -> anyhow::Result<Vec<Value>> {
        let path = format!("/api/v1/accounts/{account}/objects?kind={kind}&namespace={namespace}");
        Ok(fixtures::hub_get_json(self.http, &path)
            .await?
            .and_then(|list| list["items"].as_array().cloned())
            .unwrap_or_default())
    }
}

/// An agent replica as a process, on a config file the caller writes (for example with
/// [`fixtures::write_plaintext_agent_config`]).
#[derive(Debug)]
pub struct AgentProcess {
    pub replica: String,
    pub admin: SocketAddr,
    process: Restartable,
}

impl AgentProcess {
    /// Starts replica `replica` on `config` and waits for its admin port (not for the
    /// hub: an agent starts whether or not the hub is up).
    pub async fn start(dir: &Path, config: &Path, replica: &str) -> anyhow::Result<Self> {
        let admin = free_addr()?;
        let args = vec![
            format!("--config={}", config.display()),
            format!("--replica={replica}"),
            format!("--admin-addr={admin}"),
        ];
        let mut agent = Self {
            replica: replica.to_string(),
            admin,
            process: Restartable::new("e2e-agent", dir, args)?,
        };
        agent.start_again().await?;
        Ok(agent)
    }

    /// Starts it again with the same config, replica name and admin port.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        self.process.start(self.admin, "/healthz").await
    }

    /// Whether a process is running (paused counts).
    pub fn is_running(&self) -> bool {
        self.process.pid().is_some_and(process::is_alive)
    }

    /// SIGKILL: its stream ends without a goodbye, as when a node dies.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// SIGSTOP: the process holds its connections but says nothing, as a stalled node or a
    /// long garbage-collection pause would.
    pub fn pause(&mut self) {
        self.process.pause();
    }

    /// SIGCONT after [`Self::pause`].
    pub fn resume(&mut self) {
        self.process.resume();
    }

    /// The end of the current process's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}
