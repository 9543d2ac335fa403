//! End-to-end streaming: the hub (`e2e-hub`) and the agent (`e2e-agent`) as real processes
//! against the real local control plane, over real mutual TLS, the agent authenticated with
//! a TokenRequest token of a ServiceAccount bound by RBAC made here.
//!
//! Everything is observed from the outside, as an operator would: the hub's HTTP API and its
//! store file, the agent's admin port (`/accounts`, `/metrics`), process signals, and a core
//! dump of the live agent.

use std::{
    collections::BTreeSet,
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Secret},
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use scale_agent::convert::LAST_APPLIED;
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    fixtures::{self, Scope},
    http,
    kubectl::Kubectl,
    metrics::metric_sum as metric,
    pki::CertificateAuthority,
    postgres::PostgresServer,
    process::{self, ManagedProcess},
    wait,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const HUB: &str = env!("CARGO_BIN_EXE_e2e-hub");
const AGENT: &str = env!("CARGO_BIN_EXE_e2e-agent");

// ---------------------------------------------------------------------------------------
// Files and certificates

/// A directory removed when dropped, unless the test failed an assertion or [`KEEP_ENV`] is set.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> anyhow::Result<Self> {
        Ok(Self(fixtures::temp_dir(&format!(
            "scale-agent-streaming-{name}"
        ))?))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

/// Set to keep every test's directory (logs, hub data) for a look afterwards.
const KEEP_ENV: &str = "SCALE_AGENT_E2E_KEEP";

impl Drop for TempDir {
    fn drop(&mut self) {
        // A failed assertion keeps the logs; so does KEEP_ENV.
        if std::thread::panicking() || std::env::var_os(KEEP_ENV).is_some() {
            eprintln!("[streaming] kept {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Certificates on disk: a CA, the hub's serving certificate (localhost, 127.0.0.1) and
/// client certificates for agents.
struct Pki {
    ca: CertificateAuthority,
    dir: PathBuf,
    ca_file: PathBuf,
    hub_cert: PathBuf,
    hub_key: PathBuf,
}

/// A client certificate and key on disk.
#[derive(Clone)]
struct ClientCert {
    cert: PathBuf,
    key: PathBuf,
}

impl Pki {
    fn new(dir: &Path, name: &str) -> anyhow::Result<Self> {
        let dir = dir.join(format!("pki-{name}"));
        std::fs::create_dir_all(&dir)?;
        let ca = CertificateAuthority::new(&format!("{name}-ca"))?;
        let serving = ca.serving("scale-agent-hub", &[])?;
        let ca_file = dir.join("ca.pem");
        let hub_cert = dir.join("hub.pem");
        let hub_key = dir.join("hub-key.pem");
        std::fs::write(&ca_file, &ca.cert_pem)?;
        std::fs::write(&hub_cert, &serving.cert_pem)?;
        std::fs::write(&hub_key, &serving.key_pem)?;
        Ok(Self {
            ca,
            dir,
            ca_file,
            hub_cert,
            hub_key,
        })
    }

    fn client(&self, identity: &str) -> anyhow::Result<ClientCert> {
        let issued = self.ca.client(identity, &[])?;
        let cert = self.dir.join(format!("{identity}.pem"));
        let key = self.dir.join(format!("{identity}-key.pem"));
        std::fs::write(&cert, &issued.cert_pem)?;
        std::fs::write(&key, &issued.key_pem)?;
        Ok(ClientCert { cert, key })
    }
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

// ---------------------------------------------------------------------------------------
// HTTP and metrics

/// GET, waiting up to 20 s for the answer: (status, body).
async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let response = http::request("GET", addr, path, None, Duration::from_secs(20)).await?;
    Ok((response.status, response.body))
}

/// GET on the hub's REST API (or /metrics), with the tests' API token.
async fn hub_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let response = fixtures::hub_call("GET", addr, path)
        .timeout(Duration::from_secs(20))
        .send()
        .await?;
    Ok((response.status, response.body))
}

/// [`wait::until_within`] every 100 ms for [`WAIT`], which panics when it times out (so the
/// test's directory and its logs are kept) with `what` and the last error.
async fn eventually<F, Fut>(what: &str, check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    if let Err(timeout) = wait::until_within(what, WAIT, Duration::from_millis(100), check).await {
        panic!("{timeout:#}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The hub process

/// `(namespace, name, resourceVersion)` of each object.
type Keys = BTreeSet<(String, String, String)>;

struct Hub {
    grpc: SocketAddr,
    http: SocketAddr,
    dir: PathBuf,
    data_dir: PathBuf,
    args: Vec<String>,
    starts: usize,
    process: Option<ManagedProcess>,
}

impl Hub {
    /// Starts the hub with mutual TLS (`pki`), fresh ports and data directory, 1 s
    /// heartbeats, and `extra` flags; waits for `/readyz`.
    async fn start(dir: &Path, pki: &Pki, extra: &[&str]) -> anyhow::Result<Self> {
        let client_ca = format!("--client-ca={}", pki.ca_file.display());
        // Identities of --client-ca register only what an --allow rule names.
        let extra: Vec<&str> = [client_ca.as_str(), "--allow=*=*"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        Self::start_trusting_only_itself(dir, pki, &extra).await
    }

    /// Like [`Hub::start`] but without `--client-ca`: only certificates the hub issued (by
    /// enrolment) authenticate agents.
    async fn start_trusting_only_itself(
        dir: &Path,
        pki: &Pki,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let (grpc, http) = (free_addr()?, free_addr()?);
        let data_dir = dir.join("hub-data");
        let mut args: Vec<String> = vec![
            format!("--grpc-addr={grpc}"),
            format!("--http-addr={http}"),
            format!("--tls-cert={}", pki.hub_cert.display()),
            format!("--tls-key={}", pki.hub_key.display()),
            format!("--data-dir={}", data_dir.display()),
            "--heartbeat-period=1s".into(),
            // These tests read the REST API in plaintext; the HTTP listener's TLS and the
            // proxy are tested in proxy.rs.
            "--http-plaintext".into(),
            format!(
                "--api-tokens-file={}",
                fixtures::write_api_tokens(dir)?.display()
            ),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut hub = Self {
            grpc,
            http,
            dir: dir.to_path_buf(),
            data_dir,
            args,
            starts: 0,
            process: None,
        };
        hub.start_again().await?;
        Ok(hub)
    }

    /// (Re)starts the process on the same ports and data directory.
    async fn start_again(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        let log = self.dir.join(format!("hub-{}.log", self.starts));
        self.process = Some(ManagedProcess::spawn(
            "e2e-hub",
            Path::new(HUB),
            &self.args,
            log,
        )?);
        let (pid, log) = match &self.process {
            Some(p) => (p.pid(), p.log().to_path_buf()),
            None => anyhow::bail!("the hub did not start"),
        };
        let http = self.http;
        eventually("the hub's /readyz", || {
            let log = log.clone();
            async move {
                // A hub that exits (a port taken) fails fast with its log.
                if !process::is_alive(pid) {
                    anyhow::bail!("the hub exited: {}", process::tail(&log, 20));
                }
                Ok(http_get(http, "/readyz").await.is_ok_and(|(s, _)| s == 200))
            }
        })
        .await
    }

    /// SIGTERM, and wait until the process has exited.
    fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop(Duration::from_secs(20));
        }
    }

    fn log(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                std::fs::read_to_string(self.dir.join(format!("hub-{n}.log"))).unwrap_or_default()
            })
            .collect()
    }

    async fn json(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        let (status, body) = hub_get(self.http, path).await?;
        Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
    }

    /// `GET /api/v1/accounts/{name}`; None when 404.
    async fn account(&self, name: &str) -> anyhow::Result<Option<Value>> {
        match self.json(&format!("/api/v1/accounts/{name}")).await? {
            (200, v) => Ok(Some(v)),
            (404, _) => Ok(None),
            (status, v) => anyhow::bail!("GET account {name}: {status} {v}"),
        }
    }

    /// The items of `GET /api/v1/accounts/{account}/objects?kind=…&namespace=…`; empty when
    /// the account or kind is not known (404).
    async fn objects(
        &self,
        account: &str,
        kind: &str,
        namespace: &str,
    ) -> anyhow::Result<Vec<Value>> {
        let mut path = format!("/api/v1/accounts/{account}/objects?kind={kind}");
        if !namespace.is_empty() {
            path.push_str(&format!("&namespace={namespace}"));
        }
        match self.json(&path).await? {
            (200, v) => Ok(v["items"].as_array().cloned().unwrap_or_default()),
            (404, _) => Ok(Vec::new()),
            (status, v) => anyhow::bail!("GET {path}: {status} {v}"),
        }
    }

    async fn object(
        &self,
        account: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<Option<Value>> {
        Ok(self
            .objects(account, kind, namespace)
            .await?
            .into_iter()
            .find(|o| o["metadata"]["name"] == name))
    }

    async fn keys(&self, account: &str, kind: &str, namespace: &str) -> anyhow::Result<Keys> {
        Ok(self
            .objects(account, kind, namespace)
            .await?
            .iter()
            .map(|o| key_of(&o["metadata"]))
            .collect())
    }
}

fn key_of(metadata: &Value) -> (String, String, String) {
    let field = |name: &str| metadata[name].as_str().unwrap_or_default().to_string();
    (field("namespace"), field("name"), field("resourceVersion"))
}

/// The API server's ConfigMaps in `namespace`, as [`Keys`].
async fn api_configmaps(admin: &Client, namespace: &str) -> anyhow::Result<Keys> {
    Ok(Api::<ConfigMap>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|cm| {
            let m = &cm.metadata;
            (
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
                m.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect())
}

/// Waits until the hub's ConfigMaps of `account` in `namespace` equal the API server's;
/// panics after [`WAIT`] with both sets.
async fn hub_equals_api(
    hub: &Hub,
    admin: &Client,
    account: &str,
    namespace: &str,
) -> anyhow::Result<()> {
    let what = format!("the hub's ConfigMaps of {account} to equal the API server's");
    eventually(&what, || async {
        let api = api_configmaps(admin, namespace).await?;
        let cached = hub.keys(account, "configmaps", namespace).await?;
        anyhow::ensure!(api == cached, "API server: {api:?}\nhub: {cached:?}");
        Ok(true)
    })
    .await
}

// ---------------------------------------------------------------------------------------
// The agent process

/// How the agent talks to the hub.
#[derive(Clone)]
struct AgentTls {
    ca_file: PathBuf,
    client: Option<ClientCert>,
}

struct Agent {
    admin: SocketAddr,
    args: Vec<String>,
    log: PathBuf,
    starts: usize,
    process: Option<ManagedProcess>,
}

impl Agent {
    /// Starts `e2e-agent` with `config`, as `replica`, and waits for its admin port.
    async fn start(
        dir: &Path,
        config: &Path,
        replica: &str,
        tls: &AgentTls,
    ) -> anyhow::Result<Self> {
        let admin = free_addr()?;
        let mut args = vec![
            format!("--config={}", config.display()),
            format!("--replica={replica}"),
            format!("--admin-addr={admin}"),
            format!("--hub-ca={}", tls.ca_file.display()),
            "--hub-server-name=localhost".into(),
        ];
        if let Some(client) = &tls.client {
            args.push(format!("--tls-cert={}", client.cert.display()));
            args.push(format!("--tls-key={}", client.key.display()));
        }
        let mut agent = Self {
            admin,
            args,
            log: dir.join(format!("agent-{replica}")),
            starts: 0,
            process: None,
        };
        agent.start_again().await?;
        Ok(agent)
    }

    async fn start_again(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        let log = self.log.with_extension(format!("{}.log", self.starts));
        let process = ManagedProcess::spawn("e2e-agent", Path::new(AGENT), &self.args, log)?;
        let pid = process.pid();
        let log = process.log().to_path_buf();
        self.process = Some(process);
        let admin = self.admin;
        eventually("the agent's admin port", || {
            let log = log.clone();
            async move {
                if !process::is_alive(pid) {
                    anyhow::bail!("the agent exited: {}", process::tail(&log, 20));
                }
                Ok(http_get(admin, "/healthz")
                    .await
                    .is_ok_and(|(s, _)| s == 200))
            }
        })
        .await
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.process
            .as_ref()
            .map(ManagedProcess::pid)
            .ok_or_else(|| anyhow::anyhow!("the agent is not running"))
    }

    /// SIGTERM, and wait until the process has exited.
    fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop(Duration::from_secs(20));
        }
    }

    /// SIGKILL: no goodbye to the hub.
    fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            process::send_signal(p.pid(), libc::SIGKILL);
            p.stop(Duration::from_secs(5));
        }
    }

    async fn metrics(&self) -> anyhow::Result<String> {
        let (status, body) = http_get(self.admin, "/metrics").await?;
        anyhow::ensure!(status == 200, "agent /metrics: {status}");
        Ok(body)
    }

    async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<f64> {
        Ok(metric(&self.metrics().await?, name, labels))
    }

    /// The `/accounts` admin view.
    async fn view(&self) -> anyhow::Result<Value> {
        let (status, body) = http_get(self.admin, "/accounts").await?;
        anyhow::ensure!(status == 200, "agent /accounts: {status}");
        Ok(serde_json::from_str(&body)?)
    }

    async fn account(&self, name: &str) -> anyhow::Result<Option<Value>> {
        let view = self.view().await?;
        Ok(view["accounts"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["name"] == name).cloned()))
    }

    /// `/readyz` answers 200 and `/accounts` says `synced` (connected, every account
    /// answered, watches started).
    async fn ready(&self) -> anyhow::Result<bool> {
        Ok(http_get(self.admin, "/readyz").await?.0 == 200 && self.view().await?["synced"] == true)
    }
}

/// Writes the agent's config (JSON is YAML) atomically, so the 2 s poll never sees half a
/// file.
fn write_agent_config(path: &Path, hub: &Hub, accounts: Value) -> anyhow::Result<()> {
    let config = json!({
        "clouddriver": {
            "grpc": hub.grpc.to_string(),
            "keepAliveHeartbeatSeconds": 1,
            "backoff": { "baseDelay": "200ms", "maxDelay": "1s" },
        },
        "kubernetes": { "accounts": accounts },
        "tasks": { "totalBudget": 8, "budgetPerAccount": 4 },
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&config)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Cluster identities

/// ServiceAccount `agent` in `namespace`, allowed get/list/watch on `resources`
/// (`plural` for the core group, else `plural.group`) per `scope`; returns a kubeconfig file
/// holding a real TokenRequest token for it.
async fn agent_identity(
    control_plane: &ControlPlane,
    admin: &Client,
    namespace: &str,
    scope: Scope,
    resources: &[&str],
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    fixtures::service_account_identity(
        control_plane,
        admin,
        namespace,
        "agent",
        scope,
        fixtures::read_rules(resources),
        dir.join(format!("kubeconfig-{namespace}")),
    )
    .await
}

async fn create_configmap(
    admin: &Client,
    namespace: &str,
    name: &str,
    data: Value,
) -> anyhow::Result<()> {
    Api::<ConfigMap>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": name }, "data": data }))?,
        )
        .await?;
    Ok(())
}

/// The shared control plane, an admin client and a fresh namespace `stream-<name>`.
async fn cluster(name: &str) -> anyhow::Result<(&'static ControlPlane, Client, String)> {
    let control_plane = ControlPlane::shared()?;
    let admin = control_plane.client().await?;
    let ns = control_plane
        .namespace(&admin, &format!("stream-{name}"))
        .await?;
    Ok((control_plane, admin, ns))
}

/// What changes while a component is down: ConfigMap `deleted` goes, `patched` gets
/// `v: "2"` and `created` is new with `v: "1"`.
async fn change_configmaps(
    admin: &Client,
    ns: &str,
    deleted: &str,
    patched: &str,
    created: &str,
) -> anyhow::Result<()> {
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), ns);
    configmaps.delete(deleted, &DeleteParams::default()).await?;
    configmaps
        .patch(
            patched,
            &PatchParams::default(),
            &merge(json!({ "data": { "v": "2" } })),
        )
        .await?;
    create_configmap(admin, ns, created, json!({ "v": "1" })).await?;
    Ok(())
}

fn merge(value: Value) -> Patch<Value> {
    Patch::Merge(value)
}

/// Whether `needle` occurs in the file, searched by `grep` (fast on a core file of
/// hundreds of megabytes, where a debug-built scan would not be).
fn file_contains(path: &Path, needle: &str) -> anyhow::Result<bool> {
    let status = std::process::Command::new("grep")
        .args(["-a", "-q", "-F", "-e", needle])
        .arg(path)
        .status()?;
    match status.code() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => anyhow::bail!("grep failed on {}: {status}", path.display()),
    }
}

/// Writes the objects a hub's store holds to `into` as JSON, one per line, and counts them:
/// the store keeps each object compressed, so its file's bytes alone show nothing of their
/// contents.
async fn unpack_store_objects(data_dir: &Path, into: &Path) -> anyhow::Result<usize> {
    let mut store = scale_agent_hub::store::Store::open(data_dir)?;
    let loaded = store.load().await?;
    store.close().await?;
    let mut text = Vec::new();
    let mut count = 0;
    for account in loaded.cache.accounts.values() {
        for kind in account.kinds.values() {
            for object in kind.objects.values() {
                let json = object.json.unpack().map_err(|e| anyhow::anyhow!("{e}"))?;
                text.extend_from_slice(&json);
                text.push(b'\n');
                count += 1;
            }
        }
    }
    std::fs::write(into, text)?;
    Ok(count)
}

/// Which of `needles` (what, text) occur in the file at `path`: the `what`s, in one pass.
fn found_in(path: &Path, needles: &[(String, String)]) -> anyhow::Result<BTreeSet<String>> {
    let mut grep = std::process::Command::new("grep");
    grep.args(["-a", "-o", "-F"]);
    for (_, needle) in needles {
        grep.arg("-e").arg(needle);
    }
    let output = grep.arg(path).output()?;
    match output.status.code() {
        Some(0 | 1) => {}
        _ => anyhow::bail!("grep failed on {}: {}", path.display(), output.status),
    }
    let matched: BTreeSet<&str> = std::str::from_utf8(&output.stdout)?.lines().collect();
    Ok(needles
        .iter()
        .filter(|(_, needle)| matched.contains(needle.as_str()))
        .map(|(what, _)| what.clone())
        .collect())
}

/// `kubectl apply` (client side: kubectl copies the manifest, data included, into the
/// last-applied annotation) of Secret `name` holding `marker` as `password`, in `data`
/// (base64) or `stringData` (clear), labelled `version`.
async fn kubectl_apply_secret(
    kubectl: &Kubectl,
    kubeconfig: &Path,
    ns: &str,
    name: &str,
    marker: String,
    version: &str,
    in_data: bool,
) -> anyhow::Result<()> {
    let mut manifest = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": name, "namespace": ns, "labels": { "version": version } },
    });
    if in_data {
        manifest["data"] = json!({ "password": fixtures::base64(marker.as_bytes()) });
    } else {
        manifest["stringData"] = json!({ "password": marker });
    }
    let outcome = kubectl
        .run(
            kubeconfig,
            &["apply".into(), "-f".into(), "-".into()],
            Some(&manifest.to_string()),
            WAIT,
        )
        .await?;
    anyhow::ensure!(
        outcome.success(),
        "kubectl apply of Secret {name}: {}",
        outcome.messages()
    );
    Ok(())
}

const GADGET_GROUP: &str = "streamtest.scaleagent.dev";

/// A small namespaced custom resource of this test file's own, installed once.
async fn install_gadget_crd(admin: &Client) -> anyhow::Result<ApiResource> {
    let crd = scale_agent_e2e::crds::schemaless_crd(GADGET_GROUP, "Gadget", "gadgets");
    scale_agent_e2e::crds::install(admin, &[crd]).await?;
    Ok(ApiResource {
        group: GADGET_GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GADGET_GROUP}/v1"),
        kind: "Gadget".into(),
        plural: "gadgets".into(),
    })
}

// ---------------------------------------------------------------------------------------
// Tests

/// A hub, a client certificate and a cluster identity: what most tests start from.
/// Fields drop in order: the hub stops before its directory goes.
struct Setup {
    hub: Hub,
    tls: AgentTls,
    pki: Pki,
    dir: TempDir,
}

async fn setup(name: &str, hub_flags: &[&str]) -> anyhow::Result<Setup> {
    let dir = TempDir::new(name)?;
    let pki = Pki::new(dir.path(), name)?;
    let hub = Hub::start(dir.path(), &pki, hub_flags).await?;
    let tls = AgentTls {
        ca_file: pki.ca_file.clone(),
        client: Some(pki.client(&format!("agent-{name}"))?),
    };
    Ok(Setup { hub, tls, pki, dir })
}

#[path = "streaming/access.rs"]
mod access;
#[path = "streaming/accounts.rs"]
mod accounts;
#[path = "streaming/audit.rs"]
mod audit;
#[path = "streaming/enrolment.rs"]
mod enrolment;
#[path = "streaming/mirror.rs"]
mod mirror;
#[path = "streaming/restarts.rs"]
mod restarts;
#[path = "streaming/secrets.rs"]
mod secrets;
