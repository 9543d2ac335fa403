//! A real forward proxy on loopback: Debian's tinyproxy (unpacked by
//! `e2e/tinyproxy/install.sh` into the cache), its configuration, pid and log in the test's
//! directory, in the foreground. Its log names every `CONNECT host:port` it is asked for,
//! which is how a test proves from the proxy's side which connections went through it.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use crate::{
    binaries::cached_program,
    error::{Error, Result, io_err},
    process::ManagedProcess,
};

/// How long tinyproxy may take to listen.
const READY: Duration = Duration::from_secs(20);

/// The tinyproxy binary `make tinyproxy` unpacks.
pub fn binary() -> Result<PathBuf> {
    cached_program("tinyproxy/current/usr/bin/tinyproxy", |path| {
        Error::TinyproxyMissing { path }
    })
}

/// A running tinyproxy.
pub struct Tinyproxy {
    process: ManagedProcess,
    log: PathBuf,
    addr: SocketAddr,
}

impl Tinyproxy {
    /// Starts tinyproxy in `dir` on a free loopback port, allowing CONNECT to any port and
    /// keeping idle tunnels (long gRPC streams and watches) open for an hour.
    pub async fn start(dir: &Path) -> Result<Tinyproxy> {
        let binary = binary()?;
        std::fs::create_dir_all(dir).map_err(io_err(format!("create {}", dir.display())))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(io_err("pick a free port for tinyproxy"))?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = dir.join("tinyproxy.log");
        // No ConnectPort line: CONNECT to every port is allowed. LogLevel Connect logs each
        // request line, CONNECT ones included.
        let conf = format!(
            "Port {port}\n\
             Listen 127.0.0.1\n\
             Timeout 3600\n\
             MaxClients 256\n\
             Allow 127.0.0.1\n\
             DisableViaHeader Yes\n\
             LogLevel Connect\n\
             LogFile \"{}\"\n\
             PidFile \"{}\"\n",
            log.display(),
            dir.join("tinyproxy.pid").display()
        );
        let conf_file = dir.join("tinyproxy.conf");
        std::fs::write(&conf_file, conf)
            .map_err(io_err(format!("write {}", conf_file.display())))?;
        let mut command = Command::new(&binary);
        command.arg("-d").arg("-c").arg(&conf_file);
        let mut process =
            ManagedProcess::spawn_command("tinyproxy", command, dir.join("tinyproxy.out"))?;
        crate::process::wait_listening(&mut process, addr, "tinyproxy", &log, READY).await?;
        Ok(Tinyproxy { process, log, addr })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its URL, for `HTTPS_PROXY`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many tunnels to `target` (`host:port`) it was asked to open so far.
    pub fn connects_to(&self, target: &str) -> usize {
        let needle = format!("CONNECT {target} ");
        self.log().lines().filter(|l| l.contains(&needle)).count()
    }

    /// Stops it.
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(5));
    }
}
