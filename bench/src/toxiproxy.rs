//! Toxiproxy (`make toxiproxy` builds it): TCP proxies on loopback whose latency toxics add
//! round-trip time between two processes of the run, since this machine's kernel has no
//! `netem` qdisc. The server is driven through its HTTP API.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use serde_json::json;

use crate::procs::{Proc, free_port, http, wait_for};

/// The pinned release, as `bench/toxiproxy/build.sh` builds it.
pub const VERSION: &str = include_str!("../toxiproxy/toxiproxy-version").trim_ascii();

/// Overrides where the server binary is taken from.
pub const BIN_ENV: &str = "SCALE_AGENT_TOXIPROXY_BIN";

/// The server binary: [`BIN_ENV`], else where `bench/toxiproxy/build.sh` puts it (keep the
/// two in step).
pub fn binary() -> PathBuf {
    std::env::var_os(BIN_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            scale_agent_e2e::binaries::cache_root()
                .join("toxiproxy")
                .join(VERSION)
                .join("bin")
                .join("toxiproxy-server")
        })
}

/// Whether the server binary is built.
pub fn available() -> bool {
    binary().is_file()
}

/// A running Toxiproxy server; stopped when dropped.
pub struct Toxiproxy {
    _proc: Proc,
    api: SocketAddr,
}

impl Toxiproxy {
    /// Starts the server on a free loopback port, logging to `log`.
    pub async fn start(log: PathBuf) -> Result<Self> {
        let exe = binary();
        if !exe.is_file() {
            bail!(
                "Toxiproxy is not built ({} is missing): run `make toxiproxy` (bench/toxiproxy/build.sh), or set {BIN_ENV}",
                exe.display()
            );
        }
        let api: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let proc = Proc::spawn(
            "toxiproxy-server",
            &exe,
            "toxiproxy",
            &["-host=127.0.0.1".into(), format!("-port={}", api.port())],
            &[],
            log,
        )?;
        wait_for(
            "Toxiproxy's API",
            Duration::from_secs(60),
            Duration::from_millis(20),
            || async { Ok((http(api, "GET", "/version", None).await?.0 == 200).then_some(())) },
        )
        .await
        .with_context(|| scale_agent_e2e::process::tail(Path::new(&proc.log), 20))?;
        Ok(Self { _proc: proc, api })
    }

    async fn call(&self, method: &str, path: &str, body: serde_json::Value) -> Result<()> {
        let body = serde_json::to_vec(&body)?;
        let (status, answer) = http(self.api, method, path, Some(&body)).await?;
        if !(200..300).contains(&status) {
            bail!(
                "Toxiproxy {method} {path}: HTTP {status}: {}",
                String::from_utf8_lossy(&answer)
            );
        }
        Ok(())
    }

    /// A new proxy `name` listening on a free loopback port and forwarding to `upstream`;
    /// returns where it listens.
    pub async fn proxy(&self, name: &str, upstream: SocketAddr) -> Result<SocketAddr> {
        let listen: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        self.call(
            "POST",
            "/proxies",
            json!({ "name": name, "listen": listen.to_string(), "upstream": upstream.to_string(), "enabled": true }),
        )
        .await?;
        Ok(listen)
    }

    /// Adds `round_trip` to proxy `name`: half as a latency toxic on each direction, so a
    /// request and its answer together wait `round_trip` more (connections already open
    /// included).
    pub async fn add_round_trip(&self, name: &str, round_trip: Duration) -> Result<()> {
        let one_way = round_trip.as_millis() / 2;
        for stream in ["upstream", "downstream"] {
            self.call(
                "POST",
                &format!("/proxies/{name}/toxics"),
                json!({
                    "name": format!("latency-{stream}"),
                    "type": "latency",
                    "stream": stream,
                    "toxicity": 1.0,
                    "attributes": { "latency": one_way, "jitter": 0 },
                }),
            )
            .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_pinned_once() {
        assert!(VERSION.starts_with("v2."), "{VERSION}");
        assert!(
            binary().ends_with(format!("{VERSION}/bin/toxiproxy-server"))
                || std::env::var_os(BIN_ENV).is_some()
        );
    }
}
