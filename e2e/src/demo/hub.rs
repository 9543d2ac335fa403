//! The hub as a process (the real `scale-agent-hub` command, built as `e2e-hub`): gRPC with
//! mutual TLS for the agents, and one HTTPS listener for its REST API, its admin API and the
//! Kubernetes API proxy. [`Hub`] is how the other steps reach it: its REST API with an
//! operator token issued at start by `scale-agent-hub token create`, the way a platform team
//! gets one.

use std::{io::Write, net::SocketAddr, path::PathBuf, process::Command, time::Duration};

use serde_json::Value;

use super::{
    System,
    certificates::HubFiles,
    support::{command_failed, line, wait_ready},
};
use crate::{
    ControlPlane,
    binaries::product_binary,
    error::{Result, io_err},
    http::Call,
    local_agent::free_port,
    process::ManagedProcess,
};

/// Name of the REST API token the demo issues (role operator).
pub const API_TOKEN_NAME: &str = "demo";

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
    /// The operator token of the REST API (`scale-agent-hub token create`), and the file
    /// (mode 0600) the curl commands read it from.
    pub api_token: String,
    pub api_token_file: PathBuf,
}

impl Hub {
    /// `method <url><path>` to the REST API, trusting the hub's CA, with the operator token.
    pub fn call(&self, method: &str, path: &str) -> Call {
        Call::new(method, format!("{}{path}", self.url))
            .ca(&self.ca_pem)
            .bearer(&self.api_token)
    }

    /// `GET`s a JSON document: `None` on 404.
    pub async fn get_json(&self, path: &str) -> Result<Option<Value>> {
        Ok(self.call("GET", path).fetch_json().await?)
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
        format!(
            "curl --cacert {} {} {url}",
            self.ca_file.display(),
            self.authorization()
        )
    }

    /// The curl flag sending the operator token, read from its file.
    pub fn authorization(&self) -> String {
        format!(
            "-H \"Authorization: Bearer $(cat {})\"",
            self.api_token_file.display()
        )
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

    /// Runs the hub's own command with `args` (which end with [`Hub::admin_flags`]): its
    /// stdout and stderr, or an error naming `command` (how it was shown) with both when it
    /// fails.
    pub async fn run_admin(&self, args: &[String], command: &str) -> Result<(String, String)> {
        let output = tokio::process::Command::new(&self.binary)
            .args(args)
            .kill_on_drop(true)
            .output()
            .await
            .map_err(io_err(format!("run {}", self.binary.display())))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if !output.status.success() {
            return Err(command_failed(
                command,
                output.status.code(),
                &stdout,
                &stderr,
            ));
        }
        Ok((stdout, stderr))
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
        // The demo's agents carry certificates of that CA, whose identities register only
        // what an --allow rule names: every name, on this local demo.
        "--allow=*=*".to_string(),
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
    let mut hub = Hub {
        grpc_addr,
        url,
        ca_pem: files.serving_ca_pem.clone(),
        ca_file: files.serving_ca.clone(),
        admin_token_file: files.data_dir.join("admin-token"),
        binary,
        api_token: String::new(),
        api_token_file: run_dir.join("operator-token"),
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
    hub.api_token = create_api_token(&hub, out).await?;
    scale_agent_runtime::write_private(&hub.api_token_file, hub.api_token.as_bytes())
        .map_err(io_err(format!("write {}", hub.api_token_file.display())))?;
    line(
        out,
        format!(
            "    REST API token (role operator) in {} (mode 0600): the curl commands below send it",
            hub.api_token_file.display()
        ),
    );
    Ok(hub)
}

/// Runs `scale-agent-hub token create --name demo --role operator` (the real binary) and
/// returns the token it prints.
async fn create_api_token(hub: &Hub, out: &mut dyn Write) -> Result<String> {
    let mut args = vec![
        "token".to_string(),
        "create".into(),
        "--name".into(),
        API_TOKEN_NAME.into(),
        "--role".into(),
        "operator".into(),
    ];
    args.extend(hub.admin_flags());
    let command = format!("scale-agent-hub {}", args.join(" "));
    line(out, format!("    $ {command}"));
    let (stdout, stderr) = hub.run_admin(&args, &command).await?;
    let token = stdout.trim();
    if token.is_empty() {
        return Err(command_failed(&command, Some(0), &stdout, &stderr));
    }
    line(out, format!("      {}", stderr.trim()));
    Ok(token.to_string())
}
