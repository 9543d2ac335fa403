//! The hub as a process (the real `scale-agent-hub` command, built as `e2e-hub`): gRPC with
//! mutual TLS for the agents, and one HTTPS listener for its REST API, its admin API and the
//! Kubernetes API proxy. [`Hub`] is how the other steps reach it.

use std::{io::Write, net::SocketAddr, path::PathBuf, process::Command, time::Duration};

use serde_json::Value;

use super::{System, certificates::HubFiles, support::line, support::wait_ready};
use crate::{
    ControlPlane, binaries::product_binary, error::Result, http::Call, local_agent::free_port,
    process::ManagedProcess,
};

/// The running hub, as clients reach it.
pub(super) struct Hub {
    /// Where agents connect (gRPC, mutual TLS).
    pub grpc_addr: SocketAddr,
    /// The HTTPS listener, `https://127.0.0.1:<port>`: also its `--public-url`, so the
    /// kubeconfigs it hands out point here.
    pub url: String,
    /// The CA of its serving certificate, which every call trusts (PEM, and the file).
    pub ca_pem: String,
    pub ca_file: PathBuf,
    /// The admin token the hub wrote at start (its default `<data-dir>/admin-token`).
    pub admin_token_file: PathBuf,
    /// The binary, for the admin commands (`kubeconfig`, `token`).
    pub binary: PathBuf,
}

impl Hub {
    /// `method <url><path>`, trusting the hub's CA.
    pub fn call(&self, method: &str, path: &str) -> Call {
        Call::new(method, format!("{}{path}", self.url)).ca(&self.ca_pem)
    }

    /// `GET`s a JSON document: `None` on 404.
    pub async fn get_json(&self, path: &str) -> Result<Option<Value>> {
        self.call("GET", path).fetch_json().await
    }

    /// `POST`s a JSON document, waiting up to `timeout`; the status and the answer as JSON.
    pub async fn post_json(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<(u16, Value)> {
        let response = self
            .call("POST", path)
            .json(body)
            .timeout(timeout)
            .send()
            .await?;
        Ok((response.status, response.json_or_null()))
    }

    /// The curl command for `GET <path>`, as a user types it.
    pub fn curl(&self, path: &str) -> String {
        let url = format!("{}{path}", self.url);
        // A query string would be cut by the shell at `&`.
        let url = if url.contains('&') {
            format!("'{url}'")
        } else {
            url
        };
        format!("curl --cacert {} {url}", self.ca_file.display())
    }

    /// The flags (and their values, as separate arguments) that point an admin command at
    /// this hub.
    pub fn admin_flags(&self) -> Vec<String> {
        vec![
            "--hub-url".into(),
            self.url.clone(),
            "--ca-file".into(),
            self.ca_file.display().to_string(),
            "--admin-token-file".into(),
            self.admin_token_file.display().to_string(),
        ]
    }
}

/// Starts the hub with `files` on free loopback ports and waits until it is ready.
pub(super) async fn start(
    control_plane: &ControlPlane,
    files: &HubFiles,
    system: &mut System,
    out: &mut dyn Write,
) -> Result<Hub> {
    let run_dir = control_plane.run_dir();
    let grpc_addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let http_addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let url = format!("https://{http_addr}");
    line(
        out,
        "==> Starting the hub (mutual TLS for agents, HTTPS for its API)".into(),
    );
    // The HTTP listener serves the same certificate as gRPC (--http-tls-cert and
    // --http-tls-key default to --tls-cert and --tls-key).
    let args = vec![
        format!("--grpc-addr={grpc_addr}"),
        format!("--http-addr={http_addr}"),
        format!("--tls-cert={}", files.cert.display()),
        format!("--tls-key={}", files.key.display()),
        format!("--client-ca={}", files.client_ca.display()),
        format!("--serving-ca={}", files.serving_ca.display()),
        format!("--public-url={url}"),
        format!("--data-dir={}", files.data_dir.display()),
    ];
    let binary = product_binary("e2e-hub")?;
    let mut command = Command::new(&binary);
    command.args(&args).env("RUST_LOG", "info");
    let process = system.hub.insert(ManagedProcess::spawn_command(
        "scale-agent-hub",
        command,
        run_dir.join("hub.log"),
    )?);
    let hub = Hub {
        grpc_addr,
        url,
        ca_pem: files.serving_ca_pem.clone(),
        ca_file: files.serving_ca.clone(),
        admin_token_file: files.data_dir.join("admin-token"),
        binary,
    };
    wait_ready(process, hub.call("GET", "/readyz")).await?;
    line(
        out,
        format!("    scale-agent-hub          pid {}", process.pid()),
    );
    line(
        out,
        format!(
            "    agents connect to {grpc_addr} (gRPC); REST API, admin API and Kubernetes API proxy on {} (HTTPS, the same serving certificate; --public-url)",
            hub.url
        ),
    );
    line(
        out,
        format!(
            "    admin token: {} (the hub made it at start, mode 0600; it issues and revokes proxy tokens)",
            hub.admin_token_file.display()
        ),
    );
    Ok(hub)
}
