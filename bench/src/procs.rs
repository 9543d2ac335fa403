//! Child processes (hub, agent, watch floor) started from this very executable, their
//! resource use read from `/proc`, and a tiny HTTP/1.0 client for their HTTP endpoints.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use scale_agent_testkit::http::Call;

/// Environment variable that makes the bench executable act as another program.
pub const ROLE_ENV: &str = "SCALE_AGENT_BENCH_ROLE";

/// Clock ticks per second of `/proc/<pid>/stat` times (USER_HZ, 100 on every Linux port).
const USER_HZ: f64 = 100.0;

/// Memory and CPU time of one process.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ProcStats {
    /// Resident set size (VmRSS), KiB.
    pub rss_kib: u64,
    /// Anonymous resident memory (heap, stacks), KiB.
    pub rss_anon_kib: u64,
    /// User plus system CPU time, seconds.
    pub cpu_secs: f64,
    /// User plus system CPU time of its children that have ended and been waited for
    /// (`getrusage(RUSAGE_CHILDREN)`), seconds.
    pub children_cpu_secs: f64,
}

/// Reads `/proc/<pid>/status` and `/proc/<pid>/stat`.
pub fn proc_stats(pid: u32) -> Result<ProcStats> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("unexpected /proc/{pid}/stat"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| -> f64 {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0) as f64
    };
    Ok(ProcStats {
        rss_kib: field("VmRSS:"),
        rss_anon_kib: field("RssAnon:"),
        // utime and stime: fields 14 and 15 of stat, 11 and 12 after the command name.
        cpu_secs: (ticks(11) + ticks(12)) / USER_HZ,
        // cutime and cstime: fields 16 and 17.
        children_cpu_secs: (ticks(13) + ticks(14)) / USER_HZ,
    })
}

/// CPU seconds used by several processes between two samples.
#[derive(Debug)]
pub struct CpuWindow {
    pids: Vec<(String, u32)>,
    start: Vec<f64>,
    started: Instant,
}

impl CpuWindow {
    pub fn start(pids: Vec<(String, u32)>) -> Self {
        let start = pids
            .iter()
            .map(|(_, pid)| proc_stats(*pid).map(|s| s.cpu_secs).unwrap_or(0.0))
            .collect();
        Self {
            pids,
            start,
            started: Instant::now(),
        }
    }

    /// (name, CPU seconds) per process, and the wall time of the window.
    pub fn finish(&self) -> (Vec<(String, f64)>, f64) {
        let used = self
            .pids
            .iter()
            .zip(&self.start)
            .map(|((name, pid), start)| {
                let now = proc_stats(*pid).map(|s| s.cpu_secs).unwrap_or(*start);
                (name.clone(), (now - start).max(0.0))
            })
            .collect();
        (used, self.started.elapsed().as_secs_f64())
    }
}

/// CPU seconds of this process's children that have ended and been waited for: around one
/// child run alone (the long-lived hub, agent and control plane have not ended), the
/// difference is that child's own user and system CPU time.
pub fn ended_children_cpu() -> f64 {
    proc_stats(std::process::id())
        .map(|s| s.children_cpu_secs)
        .unwrap_or(0.0)
}

/// A loopback port free right now.
pub use scale_agent_testkit::free_port;

/// A child process that dies with this process and is stopped when dropped.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Runs `exe` (this benchmark's executable) as `role` with `args` and extra `env`.
    pub fn spawn(
        name: &str,
        exe: &Path,
        role: &str,
        args: &[String],
        env: &[(&str, String)],
        log: PathBuf,
    ) -> Result<Self> {
        let out =
            std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut command = Command::new(exe);
        command
            .args(args)
            .env(ROLE_ENV, role)
            .env(
                "RUST_LOG",
                std::env::var("SCALE_AGENT_BENCH_CHILD_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        for (k, v) in env {
            command.env(k, v);
        }
        let child = scale_agent_e2e::process::spawn_tied_to_this_process(command)
            .with_context(|| format!("start {name} ({})", exe.display()))?;
        Ok(Self {
            name: name.to_string(),
            child,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stats(&self) -> Result<ProcStats> {
        proc_stats(self.pid())
    }

    /// Fails with the end of the log when the process has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); end of {}:\n{}",
                self.name,
                self.log.display(),
                scale_agent_e2e::process::tail(&self.log, 20)
            );
        }
        Ok(())
    }

    /// SIGKILL (`kill -9`: no shutdown of any kind) and wait for the exit.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then SIGKILL after `grace`; waits for the exit.
    pub fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        scale_agent_e2e::process::send_signal(self.pid(), 15);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_)) | Err(_)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// The token of the bench's hubs' REST API (role operator), from the tokens file
/// [`scale_agent_e2e::fixtures::write_api_tokens`] writes.
pub use scale_agent_e2e::fixtures::API_TOKEN;

/// How long the bench's own HTTP calls wait for an answer (an operation through the hub
/// may take a while on a loaded machine).
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(120);

/// One plain-HTTP request with the tests' client ([`scale_agent_testkit::http::Call`]), a new
/// connection each time: (status, body).
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> Result<(u16, Vec<u8>)> {
    http_with_token(addr, method, path, body, None).await
}

/// [`http`] with `Authorization: Bearer <token>` (the hub's REST API).
pub async fn http_with_token(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    token: Option<&str>,
) -> Result<(u16, Vec<u8>)> {
    send(
        Call::new(method, format!("http://{addr}{path}")),
        body,
        token,
    )
    .await
}

/// Sends `call` with a JSON `body` and a bearer `token` when given: (status, body).
pub async fn send(
    mut call: Call,
    body: Option<&[u8]>,
    token: Option<&str>,
) -> Result<(u16, Vec<u8>)> {
    if let Some(token) = token {
        call = call.bearer(token);
    }
    if let Some(body) = body {
        call = call.header("content-type", "application/json");
        call.body = Some(body.to_vec());
    }
    let response = call.timeout(HTTP_TIMEOUT).send().await?;
    Ok((response.status, response.body.into_bytes()))
}

/// GET on the hub's REST API (with the bench's API token) returning the body as JSON;
/// fails on a status other than 200.
pub async fn get_json(addr: SocketAddr, path: &str) -> Result<serde_json::Value> {
    scale_agent_e2e::fixtures::hub_get_json(addr, path)
        .await?
        .ok_or_else(|| anyhow!("GET {path}: HTTP 404"))
}

pub use scale_agent_testkit::metrics::metric_sum;

/// Polls `check` every `every` until it returns `Some`, or fails after `timeout`.
pub use scale_agent_testkit::wait::wait_for_within as wait_for;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_own_stats() {
        let s = proc_stats(std::process::id()).unwrap();
        assert!(s.rss_kib > 0);
    }
}
