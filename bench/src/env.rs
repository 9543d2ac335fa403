//! The benchmark's world: a real control plane, certificates, the agent's ServiceAccount,
//! and helpers that start the hub and the agent as processes.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use scale_agent_e2e::{ControlPlane, ControlPlaneOptions, pki::CertificateAuthority};
use serde_json::json;

use crate::procs::{self, API_TOKEN, Proc, free_port, get_json, http, metric_sum, wait_for};

/// How long a process may take to be ready: a hub restarted on the store of measure 11's
/// failover at the size reloads 2 million objects first.
const READY: Duration = Duration::from_secs(600);

/// Files of the hub's and the agents' certificates.
pub struct PkiFiles {
    pub ca: CertificateAuthority,
    pub ca_file: PathBuf,
    pub hub_cert: PathBuf,
    pub hub_key: PathBuf,
    pub agent_cert: PathBuf,
    pub agent_key: PathBuf,
}

/// Everything the measures share.
pub struct Env {
    pub control_plane: ControlPlane,
    pub admin: Client,
    pub exe: PathBuf,
    pub dir: PathBuf,
    pub pki: PkiFiles,
    /// Kubeconfig of the agent's ServiceAccount (bound to cluster-admin through RBAC).
    pub agent_kubeconfig: PathBuf,
    pub kubernetes_version: String,
    /// Where hubs keep their stores (the work directory by default).
    pub store_dir: PathBuf,
}

impl Env {
    pub async fn start(exe: PathBuf, dir: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let control_plane = ControlPlane::start(ControlPlaneOptions {
            ready_timeout: Duration::from_secs(120),
            ..ControlPlaneOptions::default()
        })
        .await
        .context(
            "start the control plane (etcd + kube-apiserver); `make control-plane` builds it",
        )?;
        let admin = control_plane.client().await?;
        let version = admin.apiserver_version().await?.git_version;

        let ca = CertificateAuthority::new("scale-agent-bench-ca")?;
        let hub = ca.serving("scale-agent-hub", &["hub.bench"])?;
        let agent = ca.client("bench-agent", &[])?;
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, text)?;
            Ok(path)
        };
        let pki = PkiFiles {
            ca_file: write("ca.pem", &ca.cert_pem)?,
            hub_cert: write("hub.pem", &hub.cert_pem)?,
            hub_key: write("hub-key.pem", &hub.key_pem)?,
            agent_cert: write("agent.pem", &agent.cert_pem)?,
            agent_key: write("agent-key.pem", &agent.key_pem)?,
            ca,
        };

        // The agent's identity: a ServiceAccount with a real token, bound by RBAC.
        let sa_namespace = control_plane.namespace(&admin, "bench-agent").await?;
        let pp = PostParams::default();
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), &sa_namespace)
            .create(
                &pp,
                &serde_json::from_value(json!({ "metadata": { "name": "scale-agent" } }))?,
            )
            .await?;
        Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin.clone())
            .create(
                &pp,
                &serde_json::from_value(json!({
                    "metadata": { "name": format!("bench-agent-{sa_namespace}") },
                    "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
                    "subjects": [{ "kind": "ServiceAccount", "name": "scale-agent", "namespace": sa_namespace }],
                }))?,
            )
            .await?;
        let token = control_plane
            .service_account_token(&admin, &sa_namespace, "scale-agent")
            .await?;
        let agent_kubeconfig = write(
            "agent.kubeconfig",
            &control_plane.kubeconfig_for_token(&token),
        )?;
        Ok(Self {
            control_plane,
            admin,
            exe,
            pki,
            agent_kubeconfig,
            kubernetes_version: version,
            store_dir: dir.clone(),
            dir,
        })
    }

    pub async fn namespace(&self, prefix: &str) -> Result<String> {
        Ok(self.control_plane.namespace(&self.admin, prefix).await?)
    }

    /// (name, pid) of etcd and kube-apiserver.
    pub fn control_plane_pids(&self) -> Vec<(String, u32)> {
        self.control_plane
            .pids()
            .into_iter()
            .map(|(n, p)| (n.to_string(), p))
            .collect()
    }

    /// Starts a hub process with a fresh data directory under `name`, its HTTP listener in
    /// plaintext (the REST API the measures poll).
    pub async fn hub(&self, name: &str) -> Result<HubProc> {
        self.hub_with(name, HttpListener::Plaintext, Vec::new())
            .await
    }

    /// [`Self::hub`] with its store in PostgreSQL at `url` (`--store postgres`, the URL in a
    /// file of the work directory).
    pub async fn hub_on_postgres(&self, name: &str, url: &str) -> Result<HubProc> {
        let url_file = self.dir.join(format!("{name}-postgres-url"));
        std::fs::write(&url_file, url)?;
        let args = vec![
            "--store=postgres".into(),
            // The bench's PostgreSQL is plaintext on loopback.
            "--postgres-insecure-tls".into(),
            format!("--postgres-url-file={}", url_file.display()),
        ];
        self.hub_with(name, HttpListener::Plaintext, args).await
    }

    /// One of several hub replicas sharing the PostgreSQL at `url` (`--store postgres`):
    /// `--replica-id` is `name`, `--replica-address` its plaintext HTTP listener on
    /// loopback, and `secret_file` the replicas' shared `--replica-secret-file`.
    pub async fn hub_replica(&self, name: &str, url: &str, secret_file: &Path) -> Result<HubProc> {
        let url_file = self.dir.join(format!("{name}-postgres-url"));
        std::fs::write(&url_file, url)?;
        let http_addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let args = vec![
            "--store=postgres".into(),
            // The bench's PostgreSQL is plaintext on loopback.
            "--postgres-insecure-tls".into(),
            format!("--postgres-url-file={}", url_file.display()),
            format!("--replica-id={name}"),
            format!("--replica-address=http://{http_addr}"),
            format!("--replica-secret-file={}", secret_file.display()),
        ];
        let mut hub = self
            .hub_at(name, HttpListener::Plaintext, args, http_addr)
            .await?;
        hub.replica = Some(name.to_string());
        Ok(hub)
    }

    /// Starts a hub process whose HTTP listener serves TLS, as in production: the serving
    /// certificate is the gRPC one (loopback names, signed by the bench CA), and the CA goes
    /// into the kubeconfigs it issues (`--serving-ca`). For the Kubernetes API proxy.
    pub async fn tls_hub(&self, name: &str) -> Result<HubProc> {
        let listener = HttpListener::Tls {
            ca_pem: self.pki.ca.cert_pem.clone(),
            ca_file: self.pki.ca_file.clone(),
        };
        self.hub_with(name, listener, Vec::new()).await
    }

    async fn hub_with(
        &self,
        name: &str,
        listener: HttpListener,
        extra_args: Vec<String>,
    ) -> Result<HubProc> {
        let http_addr = format!("127.0.0.1:{}", free_port()?).parse()?;
        self.hub_at(name, listener, extra_args, http_addr).await
    }

    async fn hub_at(
        &self,
        name: &str,
        listener: HttpListener,
        extra_args: Vec<String>,
        http_addr: SocketAddr,
    ) -> Result<HubProc> {
        let data_dir = self.store_dir.join(format!("{name}-data"));
        let _ = std::fs::remove_dir_all(&data_dir);
        let mut hub = HubProc {
            proc: None,
            name: name.to_string(),
            exe: self.exe.clone(),
            grpc_addr: format!("127.0.0.1:{}", free_port()?).parse()?,
            http_addr,
            data_dir,
            log_dir: self.dir.clone(),
            args_tls: vec![
                format!("--tls-cert={}", self.pki.hub_cert.display()),
                format!("--tls-key={}", self.pki.hub_key.display()),
                format!("--client-ca={}", self.pki.ca_file.display()),
                // The bench's agents carry certificates of --client-ca, which grant no account
                // by themselves (issue 28, F7): an --allow rule names what they may serve.
                "--allow=*=*".to_string(),
            ],
            listener,
            extra_args,
            starts: 0,
            replica: None,
        };
        hub.start().await?;
        Ok(hub)
    }

    /// Starts an agent process streaming `accounts` (JSON array of account configs) to `hub`.
    pub async fn agent(
        &self,
        name: &str,
        hub: &HubProc,
        accounts: serde_json::Value,
    ) -> Result<AgentProc> {
        self.agent_at(name, hub.grpc_addr, accounts).await
    }

    /// [`Self::agent`] with the hub's gRPC address given: a latency proxy's in front of it.
    pub async fn agent_at(
        &self,
        name: &str,
        hub_grpc: SocketAddr,
        accounts: serde_json::Value,
    ) -> Result<AgentProc> {
        let config = self.dir.join(format!("{name}.yaml"));
        let text = serde_json::to_string_pretty(&json!({
            "clouddriver": {
                "grpc": hub_grpc.to_string(),
                "keepAliveHeartbeatSeconds": 15,
                "backoff": { "baseDelay": "200ms", "maxDelay": "1s" },
            },
            "kubernetes": { "accounts": accounts },
            "tasks": { "totalBudget": 4, "budgetPerAccount": 4 },
        }))?;
        std::fs::write(&config, text)?;
        let admin_addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let proc = Proc::spawn(
            name,
            &self.exe,
            "agent",
            &[
                format!("--config={}", config.display()),
                format!("--hub-ca={}", self.pki.ca_file.display()),
                format!("--tls-cert={}", self.pki.agent_cert.display()),
                format!("--tls-key={}", self.pki.agent_key.display()),
                "--hub-server-name=localhost".into(),
                format!("--admin-addr={admin_addr}"),
                format!("--replica={name}"),
            ],
            &[],
            self.dir.join(format!("{name}.log")),
        )?;
        Ok(AgentProc {
            proc,
            admin_addr,
            started: Instant::now(),
        })
    }

    /// An account of the agent limited to `namespace` and `kinds`.
    pub fn account(&self, name: &str, namespace: &str, kinds: &[&str]) -> serde_json::Value {
        json!({
            "name": name,
            "kubeconfigFile": self.agent_kubeconfig.display().to_string(),
            "namespaces": [namespace],
            "kinds": kinds,
        })
    }

    /// Creates `n` ConfigMaps `<prefix>-<i>` of about `bytes` bytes of data with
    /// `writers` requests in flight; returns how long it took.
    pub async fn create_configmaps(
        &self,
        namespace: &str,
        prefix: &str,
        n: usize,
        bytes: usize,
        writers: usize,
    ) -> Result<Duration> {
        let api = Api::<ConfigMap>::namespaced(self.admin.clone(), namespace);
        let started = Instant::now();
        futures::stream::iter(0..n)
            .map(|i| {
                let api = api.clone();
                async move {
                    let cm: ConfigMap = serde_json::from_value(json!({
                        "metadata": { "name": format!("{prefix}-{i}"), "labels": { "app": "bench" } },
                        "data": { "payload": payload(i, bytes) },
                    }))?;
                    api.create(&PostParams::default(), &cm).await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(writers.max(1))
            .try_collect::<Vec<_>>()
            .await?;
        Ok(started.elapsed())
    }

    /// A paginated LIST (500 per page) of the namespace's ConfigMaps: (objects, bytes of
    /// JSON, time).
    pub async fn list_configmaps(&self, namespace: &str) -> Result<(usize, usize, Duration)> {
        let api = Api::<ConfigMap>::namespaced(self.admin.clone(), namespace);
        let started = Instant::now();
        let mut params = ListParams::default().limit(500);
        let (mut count, mut size) = (0, 0);
        loop {
            let page = api.list(&params).await?;
            count += page.items.len();
            size += page
                .items
                .iter()
                .map(|o| serde_json::to_vec(o).map(|v| v.len()).unwrap_or(0))
                .sum::<usize>();
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        Ok((count, size, started.elapsed()))
    }
}

/// Deterministic filler of `bytes` characters.
pub fn payload(seed: usize, bytes: usize) -> String {
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..bytes)
        .map(|j| alphabet[(seed.wrapping_mul(31).wrapping_add(j * 7)) % alphabet.len()] as char)
        .collect()
}

/// How a hub's HTTP listener (REST API, admin API, Kubernetes API proxy) serves.
#[derive(Clone, Debug)]
pub enum HttpListener {
    /// `--http-plaintext`.
    Plaintext,
    /// TLS (the hub's default) with the gRPC serving certificate; clients trust `ca_pem`.
    Tls { ca_pem: String, ca_file: PathBuf },
}

/// A hub process; can be stopped and started again on the same ports and data.
pub struct HubProc {
    proc: Option<Proc>,
    name: String,
    exe: PathBuf,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub data_dir: PathBuf,
    log_dir: PathBuf,
    args_tls: Vec<String>,
    listener: HttpListener,
    /// More flags (the store's).
    extra_args: Vec<String>,
    starts: usize,
    /// `--replica-id` of a replica sharing a store: its `/api/v1/agents` lists every
    /// replica's agents, each with `hubReplica`.
    replica: Option<String>,
}

impl HubProc {
    pub async fn start(&mut self) -> Result<()> {
        self.starts += 1;
        let mut args = self.args_tls.clone();
        args.extend([
            format!("--grpc-addr={}", self.grpc_addr),
            format!("--http-addr={}", self.http_addr),
            format!("--data-dir={}", self.data_dir.display()),
            "--grace-period=1h".into(),
            format!(
                "--api-tokens-file={}",
                scale_agent_e2e::fixtures::write_api_tokens(&self.data_dir)?.display()
            ),
        ]);
        match &self.listener {
            // The measures read the REST API in plaintext, as they did before the listener
            // became TLS by default.
            HttpListener::Plaintext => args.push("--http-plaintext".into()),
            HttpListener::Tls { ca_file, .. } => {
                args.push(format!("--serving-ca={}", ca_file.display()));
            }
        }
        args.extend(self.extra_args.iter().cloned());
        let proc = Proc::spawn(
            "scale-agent-hub",
            &self.exe,
            "hub",
            &args,
            &[],
            self.log_dir
                .join(format!("{}-{}.log", self.name, self.starts)),
        )?;
        self.proc = Some(proc);
        let this = &*self;
        wait_for(
            "the hub's /readyz",
            READY,
            Duration::from_millis(10),
            || async {
                Ok((this.request("GET", "/readyz", None, None).await?.0 == 200).then_some(()))
            },
        )
        .await
        .with_context(|| self.log_tail())?;
        Ok(())
    }

    /// One request to the hub's HTTP listener, over TLS when it serves TLS (a new
    /// connection each time: these are the harness's own calls, never timed), with `bearer`
    /// or else the bench's API token: (status, body).
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        bearer: Option<&str>,
    ) -> Result<(u16, Vec<u8>)> {
        let call = match &self.listener {
            HttpListener::Plaintext => scale_agent_testkit::http::Call::new(
                method,
                format!("http://{}{path}", self.http_addr),
            ),
            HttpListener::Tls { ca_pem, .. } => scale_agent_testkit::http::Call::new(
                method,
                format!("https://{}{path}", self.http_addr),
            )
            .ca(ca_pem.as_str()),
        };
        procs::send(call, body, Some(bearer.unwrap_or(API_TOKEN))).await
    }

    /// A kubeconfig for the Kubernetes API proxy of `account` (a new token named
    /// `token_name`), issued by the admin API with the admin token the hub wrote to its data
    /// directory.
    pub async fn kubeconfig(&self, account: &str, token_name: &str) -> Result<String> {
        let admin = std::fs::read_to_string(self.data_dir.join("admin-token"))
            .context("read the hub's admin token file")?;
        let (status, body) = self
            .request(
                "POST",
                &format!("/api/v1/accounts/{account}/kubeconfig?tokenName={token_name}"),
                None,
                Some(admin.trim()),
            )
            .await?;
        let text = String::from_utf8_lossy(&body).into_owned();
        anyhow::ensure!(
            status == 200,
            "the hub refused a kubeconfig for {account}: HTTP {status}: {text}"
        );
        Ok(text)
    }

    /// SIGKILL (`kill -9`) and wait: no flush, no goodbye to agents or to PostgreSQL.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// SIGTERM and wait (the hub flushes its store).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop(Duration::from_secs(15));
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.as_ref().map(Proc::pid).unwrap_or(0)
    }

    pub fn stats(&self) -> Result<procs::ProcStats> {
        procs::proc_stats(self.pid())
    }

    pub fn log_tail(&self) -> String {
        self.proc
            .as_ref()
            .map(|p| scale_agent_e2e::process::tail(&p.log, 20))
            .unwrap_or_default()
    }

    /// The account's view, or None while unknown.
    pub async fn account(&self, account: &str) -> Result<Option<serde_json::Value>> {
        let (status, body) = self
            .request("GET", &format!("/api/v1/accounts/{account}"), None, None)
            .await?;
        match status {
            200 => Ok(Some(serde_json::from_slice(&body)?)),
            404 => Ok(None),
            s => bail!("account {account}: HTTP {s}"),
        }
    }

    /// Objects the hub holds for the account.
    pub async fn object_count(&self, account: &str) -> Result<u64> {
        Ok(self
            .account(account)
            .await?
            .and_then(|a| a["objects"].as_u64())
            .unwrap_or(0))
    }

    /// Waits until the hub holds `n` objects of the account; returns when it did.
    pub async fn wait_objects(&self, account: &str, n: u64, timeout: Duration) -> Result<Instant> {
        wait_for(
            &format!("the hub to hold {n} objects of {account}"),
            timeout,
            Duration::from_millis(10),
            || async { Ok((self.object_count(account).await? >= n).then(Instant::now)) },
        )
        .await
    }

    pub async fn metrics(&self) -> Result<String> {
        let (_, body) = self.request("GET", "/metrics", None, None).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    pub async fn metric(&self, name: &str) -> Result<f64> {
        Ok(metric_sum(&self.metrics().await?, name, &[]))
    }

    /// Agent streams connected to this hub process (`GET /api/v1/agents`; a replica lists
    /// every replica's, so only its own are counted).
    pub async fn agents_connected(&self) -> Result<usize> {
        let agents = self.get_json("/api/v1/agents").await?;
        let agents = agents.as_array().map(Vec::as_slice).unwrap_or_default();
        Ok(match &self.replica {
            Some(replica) => agents
                .iter()
                .filter(|a| a["hubReplica"] == replica.as_str() && a.get("unreachable").is_none())
                .count(),
            None => agents.len(),
        })
    }

    pub async fn get_json(&self, path: &str) -> Result<serde_json::Value> {
        match self.listener {
            HttpListener::Plaintext => get_json(self.http_addr, path).await,
            HttpListener::Tls { .. } => {
                let (status, body) = self.request("GET", path, None, None).await?;
                if status != 200 {
                    bail!(
                        "GET {path}: HTTP {status}: {}",
                        String::from_utf8_lossy(&body)
                    );
                }
                Ok(serde_json::from_slice(&body)?)
            }
        }
    }
}

/// An agent process.
pub struct AgentProc {
    pub proc: Proc,
    pub admin_addr: SocketAddr,
    pub started: Instant,
}

impl AgentProc {
    pub async fn metrics(&self) -> Result<String> {
        let (_, body) = http(self.admin_addr, "GET", "/metrics", None).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    pub async fn metric(&self, name: &str) -> Result<f64> {
        Ok(metric_sum(&self.metrics().await?, name, &[]))
    }

    /// Waits for `/readyz` (connected, every kind past starting).
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let addr = self.admin_addr;
        let deadline = Instant::now() + timeout;
        loop {
            self.proc.ensure_running()?;
            if matches!(http(addr, "GET", "/readyz", None).await, Ok((200, _))) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the agent was not ready within {timeout:?}; end of its log:\n{}",
                    scale_agent_e2e::process::tail(&self.proc.log, 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }
}

/// Removes a directory tree, ignoring errors.
pub fn remove(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}
