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

/// Test 1: creates, updates and deletes of a Deployment, a ConfigMap and a custom resource
/// reach the hub's HTTP API, with a cluster-wide watch under a ClusterRole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_reflects_creates_updates_and_deletes() -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster("crud").await?;
    let gadget_resource = install_gadget_crd(&admin).await?;
    let s = setup("crud", &[]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &[
            "configmaps",
            "deployments.apps",
            &format!("gadgets.{GADGET_GROUP}"),
        ],
        s.dir.path(),
    )
    .await?;
    let account = unique("crud");
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([{
            "name": account,
            "kubeconfigFile": kubeconfig.display().to_string(),
            "kinds": ["configmaps", "deployments.apps"],
            "customResourceDefinitions": [{ "kind": format!("Gadget.{GADGET_GROUP}") }],
        }]),
    )?;
    let agent = Agent::start(s.dir.path(), &config, "crud-0", &s.tls).await?;
    eventually("the agent ready", || agent.ready()).await?;
    let hub = &s.hub;

    // Create.
    let pp = PostParams::default();
    let deployments = Api::<Deployment>::namespaced(admin.clone(), &ns);
    deployments
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": "web", "labels": { "app": "web" } },
                "spec": {
                    "replicas": 1,
                    "selector": { "matchLabels": { "app": "web" } },
                    "template": {
                        "metadata": { "labels": { "app": "web" } },
                        "spec": { "containers": [{ "name": "web", "image": "nginx:1.27" }] },
                    },
                },
            }))?,
        )
        .await?;
    create_configmap(&admin, &ns, "settings", json!({ "level": "one" })).await?;
    let gadgets = Api::<DynamicObject>::namespaced_with(admin.clone(), &ns, &gadget_resource);
    gadgets
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": format!("{GADGET_GROUP}/v1"), "kind": "Gadget",
                "metadata": { "name": "gear" }, "spec": { "teeth": 12 },
            }))?,
        )
        .await?;
    let acc = account.as_str();
    let ns_ = ns.as_str();
    eventually("the three creates in the hub", || async move {
        let d = hub.object(acc, "deployments", ns_, "web").await?;
        let c = hub.object(acc, "configmaps", ns_, "settings").await?;
        let g = hub.object(acc, "gadgets", ns_, "gear").await?;
        Ok(d.is_some_and(|d| d["spec"]["replicas"] == 1)
            && c.is_some_and(|c| c["data"]["level"] == "one")
            && g.is_some_and(|g| {
                g["spec"]["teeth"] == 12 && g["apiVersion"] == format!("{GADGET_GROUP}/v1")
            }))
    })
    .await?;
    // Objects keep their managedFields (the API server's object), and the group-qualified
    // and kind spellings of the API work too.
    let web = hub.object(acc, "apps/deployments", ns_, "web").await?;
    let web = web.ok_or_else(|| anyhow::anyhow!("no apps/deployments web"))?;
    assert!(
        web["metadata"]["managedFields"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "{web}"
    );
    assert_eq!(hub.objects(acc, "Gadget", ns_).await?.len(), 1);

    // Update.
    let params = PatchParams::default();
    deployments
        .patch("web", &params, &merge(json!({ "spec": { "replicas": 3 } })))
        .await?;
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .patch(
            "settings",
            &params,
            &merge(json!({ "data": { "level": "two" } })),
        )
        .await?;
    gadgets
        .patch("gear", &params, &merge(json!({ "spec": { "teeth": 24 } })))
        .await?;
    eventually("the three updates in the hub", || async move {
        let d = hub.object(acc, "deployments", ns_, "web").await?;
        let c = hub.object(acc, "configmaps", ns_, "settings").await?;
        let g = hub.object(acc, "gadgets", ns_, "gear").await?;
        Ok(d.is_some_and(|d| d["spec"]["replicas"] == 3)
            && c.is_some_and(|c| c["data"]["level"] == "two")
            && g.is_some_and(|g| g["spec"]["teeth"] == 24))
    })
    .await?;
    // The cache holds what the API server holds, resourceVersion included.
    let api_web = deployments.get("web").await?;
    let cached_web = hub
        .object(acc, "deployments", ns_, "web")
        .await?
        .unwrap_or_default();
    assert_eq!(
        cached_web["metadata"]["resourceVersion"].as_str(),
        api_web.metadata.resource_version.as_deref()
    );

    // Delete.
    let dp = DeleteParams::default();
    deployments.delete("web", &dp).await?;
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .delete("settings", &dp)
        .await?;
    gadgets.delete("gear", &dp).await?;
    eventually("the three deletes in the hub", || async move {
        Ok(hub.object(acc, "deployments", ns_, "web").await?.is_none()
            && hub
                .object(acc, "configmaps", ns_, "settings")
                .await?
                .is_none()
            && hub.object(acc, "gadgets", ns_, "gear").await?.is_none())
    })
    .await?;
    let view = hub.account(acc).await?.unwrap_or_default();
    assert_eq!(view["state"], "connected", "{view}");
    assert_eq!(view["streaming"]["replica"], "crud-0", "{view}");
    assert_eq!(view["streaming"]["identity"], "agent-crud", "{view}");
    drop(agent);
    Ok(())
}

/// Test 2: a Secret's data never reaches the hub (HTTP API, redb file) nor the agent's
/// memory (core dump of the live process), while a ConfigMap's data, the control, is found
/// in all three. Secrets made by client-side `kubectl apply` carry their whole data in the
/// last-applied annotation, which is metadata the agent does watch: some are applied before
/// the agent starts (they reach it in its LIST), others are created, updated and deleted
/// while it watches; none of their markers may be found, raw or base64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_data_never_reaches_the_hub_nor_the_agent_memory() -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster("secret").await?;
    let mut s = setup("secret", &[]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &["configmaps", "secrets"],
        s.dir.path(),
    )
    .await?;
    let secret_marker = format!("secret-marker-{:032x}", rand::random::<u128>());
    let control_marker = format!("control-marker-{:032x}", rand::random::<u128>());
    // Created through the API (no last-applied annotation carrying the data).
    Api::<Secret>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "credentials", "labels": { "kept": "yes" } },
                "stringData": { "password": secret_marker },
            }))?,
        )
        .await?;
    create_configmap(&admin, &ns, "control", json!({ "value": control_marker })).await?;
    let marker = |what: &str| format!("{what}-marker-{:032x}", rand::random::<u128>());
    let listed = marker("listed");
    let listed_updated = marker("listed-updated");
    let deleted = marker("deleted");
    let watched = marker("watched");
    let watched_updated = marker("watched-updated");
    let kubectl = Kubectl::new(
        control_plane.binaries().kubectl(),
        s.dir.path().join("kubectl-home"),
    );
    let apply = |name: &'static str, marker: String, version: &'static str, in_data: bool| {
        kubectl_apply_secret(
            &kubectl,
            control_plane.kubeconfig_path(),
            &ns,
            name,
            marker,
            version,
            in_data,
        )
    };
    // Before the agent starts: these reach it in its LIST.
    apply("applied-listed", listed.clone(), "1", true).await?;
    apply("applied-deleted", deleted.clone(), "1", false).await?;
    // The premise: kubectl copied the data into the annotation (base64 from `data`, clear
    // from `stringData`).
    let secrets = Api::<Secret>::namespaced(admin.clone(), &ns);
    for (name, needle) in [
        ("applied-listed", fixtures::base64(listed.as_bytes())),
        ("applied-deleted", deleted.clone()),
    ] {
        let applied = secrets.get(name).await?;
        let annotation = applied
            .metadata
            .annotations
            .unwrap_or_default()
            .remove(LAST_APPLIED)
            .unwrap_or_default();
        assert!(
            annotation.contains(&needle),
            "{name}: kubectl apply put the data in {LAST_APPLIED}: {annotation}"
        );
    }
    let account = unique("secret");
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([fixtures::account(
            &account,
            &kubeconfig,
            &ns,
            &["configmaps", "secrets"]
        )]),
    )?;
    let agent = Agent::start(s.dir.path(), &config, "secret-0", &s.tls).await?;
    let hub = &s.hub;
    let (acc, ns_) = (account.as_str(), ns.as_str());
    eventually("the Secrets and the ConfigMap in the hub", || async move {
        for name in ["credentials", "applied-listed", "applied-deleted"] {
            if hub.object(acc, "secrets", ns_, name).await?.is_none() {
                return Ok(false);
            }
        }
        Ok(hub
            .object(acc, "configmaps", ns_, "control")
            .await?
            .is_some())
    })
    .await?;

    // While the agent watches: a Secret created then updated, one listed before updated,
    // one deleted (its DELETE event carries its last state, annotation included).
    apply("applied-watched", watched.clone(), "1", false).await?;
    apply("applied-watched", watched_updated.clone(), "2", false).await?;
    apply("applied-listed", listed_updated.clone(), "2", true).await?;
    let deleted_by_kubectl = kubectl
        .run(
            control_plane.kubeconfig_path(),
            &[
                "delete".into(),
                "secret".into(),
                "applied-deleted".into(),
                format!("--namespace={ns}"),
            ],
            None,
            WAIT,
        )
        .await?;
    assert!(
        deleted_by_kubectl.success(),
        "kubectl delete: {}",
        deleted_by_kubectl.messages()
    );
    eventually("the watched changes in the hub", || async move {
        let version =
            |object: Option<Value>| object.map(|o| o["metadata"]["labels"]["version"].clone());
        Ok(
            version(hub.object(acc, "secrets", ns_, "applied-watched").await?) == Some(json!("2"))
                && version(hub.object(acc, "secrets", ns_, "applied-listed").await?)
                    == Some(json!("2"))
                && hub
                    .object(acc, "secrets", ns_, "applied-deleted")
                    .await?
                    .is_none(),
        )
    })
    .await?;
    // Every Secret value, raw and base64, with a name for the failure message.
    let mut needles = Vec::new();
    for (what, value) in [
        ("created through the API", &secret_marker),
        ("applied before the agent", &listed),
        (
            "applied before the agent, updated while watched",
            &listed_updated,
        ),
        ("applied before the agent, deleted while watched", &deleted),
        ("applied while watched", &watched),
        ("applied while watched, updated", &watched_updated),
    ] {
        needles.push((format!("{what} (raw)"), value.clone()));
        needles.push((
            format!("{what} (base64)"),
            fixtures::base64(value.as_bytes()),
        ));
    }

    // The hub's API: the Secret's metadata is there, its data is not.
    let secret = hub
        .object(acc, "secrets", ns_, "credentials")
        .await?
        .unwrap_or_default();
    assert_eq!(secret["metadata"]["labels"]["kept"], "yes", "{secret}");
    assert!(
        secret.get("data").is_none() && secret.get("stringData").is_none(),
        "{secret}"
    );
    let applied = hub
        .object(acc, "secrets", ns_, "applied-watched")
        .await?
        .unwrap_or_default();
    assert!(
        applied["metadata"]["annotations"]
            .get(LAST_APPLIED)
            .is_none(),
        "{applied}"
    );
    for path in [
        format!("/api/v1/accounts/{acc}/objects?kind=secrets"),
        format!("/api/v1/accounts/{acc}/objects?kind=configmaps"),
        format!("/api/v1/accounts/{acc}"),
        "/api/v1/accounts".to_string(),
        "/metrics".to_string(),
    ] {
        let (status, body) = hub_get(hub.http, &path).await?;
        assert_eq!(status, 200, "{path}: {body}");
        for (what, needle) in &needles {
            assert!(
                !body.contains(needle),
                "{path} holds a Secret's data: {what}"
            );
        }
    }
    let (_, configmaps) = hub_get(
        hub.http,
        &format!("/api/v1/accounts/{acc}/objects?kind=configmaps"),
    )
    .await?;
    assert!(
        configmaps.contains(&control_marker),
        "control: the ConfigMap's data is served"
    );

    // The agent's memory: dump the live process and search the core file.
    let core_prefix = s.dir.path().join("agent-core");
    let pid = agent.pid()?;
    let output = tokio::process::Command::new("gcore")
        .arg("-o")
        .arg(&core_prefix)
        .arg(pid.to_string())
        .output()
        .await?;
    let core = core_prefix.with_extension(pid.to_string());
    anyhow::ensure!(
        output.status.success() && core.is_file(),
        "gcore failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let core_size = std::fs::metadata(&core)?.len();
    let found_control = file_contains(&core, &control_marker)?;
    let found_secrets = found_in(&core, &needles)?;
    std::fs::remove_file(&core)?;
    eprintln!(
        "[streaming] core dump of the agent: {} MiB",
        core_size >> 20
    );
    assert!(
        found_control,
        "control: the ConfigMap's data is in the agent's memory"
    );
    assert!(
        found_secrets.is_empty(),
        "Secret data in the agent's memory: {found_secrets:?}"
    );
    assert!(process::is_alive(pid), "gcore must leave the agent running");
    assert!(
        agent.ready().await?,
        "the agent still serves after the dump"
    );

    // The hub's store: stop the hub (it flushes), then read the file's bytes.
    s.hub.stop();
    let store = s.hub.data_dir.join("hub.redb");
    let store_size = std::fs::metadata(&store)?.len();
    assert!(
        store_size > 16 * 1024,
        "the store is almost empty: {store_size} bytes"
    );
    // The file as it is, and the objects in it unpacked (they are kept compressed).
    let unpacked = s.hub.data_dir.join("store-objects-unpacked.json");
    let objects = unpack_store_objects(&s.hub.data_dir, &unpacked).await?;
    assert!(objects > 0, "the store holds no objects");
    assert!(
        file_contains(&unpacked, "credentials")?,
        "control: the Secret's metadata is stored"
    );
    assert!(
        file_contains(&unpacked, &control_marker)?,
        "control: the ConfigMap's data is stored"
    );
    for file in [&store, &unpacked] {
        let in_store = found_in(file, &needles)?;
        assert!(
            in_store.is_empty(),
            "Secret data in the hub's store ({}): {in_store:?}",
            file.display()
        );
    }
    // Nor do their logs.
    drop(agent);
    let mut logs = 0;
    for entry in std::fs::read_dir(s.dir.path())? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "log") {
            logs += 1;
            let in_log = found_in(&path, &needles)?;
            assert!(in_log.is_empty(), "{}: {in_log:?}", path.display());
        }
    }
    assert_eq!(logs, 2, "the hub's and the agent's logs");
    Ok(())
}

/// Test 3: the hub restarts (SIGTERM, same ports and data dir): the agent reconnects and
/// resumes without a LIST. Then the agent stops, objects change while it is away, and after
/// its restart the hub is pruned and updated to the API server's state, again without a LIST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_and_agent_restarts_resume_without_relisting() -> anyhow::Result<()> {
    restarts_resume_without_relisting("restart", &[], None).await
}

/// Test 3 on PostgreSQL (`--store postgres`, the URL in a file): the hub's state lives in the
/// database, not in its data directory, and both restarts resume without a LIST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_on_postgres_restarts_and_resumes_without_relisting() -> anyhow::Result<()> {
    let postgres = PostgresServer::start().await?;
    let secrets = TempDir::new("pg-url")?;
    let url_file = secrets.path().join("postgres-url");
    std::fs::write(&url_file, format!("{}\n", postgres.url()))?;
    let flags = [
        "--store=postgres".to_string(),
        // The harness\'s PostgreSQL is plaintext on loopback.
        "--postgres-insecure-tls".to_string(),
        format!("--postgres-url-file={}", url_file.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    restarts_resume_without_relisting("pg-restart", &flags, Some(&postgres)).await
}

/// The body of test 3, with `hub_flags`; with `postgres`, also checks the hub keeps its
/// objects there and nothing in its data directory's store file.
async fn restarts_resume_without_relisting(
    name: &str,
    hub_flags: &[&str],
    postgres: Option<&PostgresServer>,
) -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster(name).await?;
    let flags: Vec<&str> = std::iter::once("--grace-period=60s")
        .chain(hub_flags.iter().copied())
        .collect();
    let mut s = setup(name, &flags).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &["configmaps", "deployments.apps"],
        s.dir.path(),
    )
    .await?;
    for name in ["alpha", "beta", "gamma"] {
        create_configmap(&admin, &ns, name, json!({ "v": "1" })).await?;
    }
    let account = unique(name);
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([fixtures::account(
            &account,
            &kubeconfig,
            &ns,
            &["configmaps", "deployments.apps"]
        )]),
    )?;
    let mut agent = Agent::start(s.dir.path(), &config, &format!("{name}-0"), &s.tls).await?;
    let acc = account.as_str();
    let hub = &s.hub;
    hub_equals_api(hub, &admin, acc, &ns).await?;
    let cm = [("account", acc), ("kind", "configmaps")];
    let deploy = [("account", acc), ("kind", "deployments.apps")];
    let before = agent.metrics().await?;
    let lists =
        |text: &str, labels: &[(&str, &str)]| metric(text, "scale_agent_agent_lists_total", labels);
    let resumes = |text: &str, labels: &[(&str, &str)]| {
        metric(text, "scale_agent_agent_watch_resumes_total", labels)
    };
    assert_eq!(
        lists(&before, &cm),
        1.0,
        "one LIST for the first snapshot:\n{before}"
    );
    assert_eq!(lists(&before, &deploy), 1.0, "{before}");

    // The hub holds a resume point for each watch before it goes.
    eventually("resume points for both kinds in the hub", || async move {
        let view = hub.account(acc).await?.unwrap_or_default();
        let kinds = view["kinds"].as_array().cloned().unwrap_or_default();
        Ok(kinds.len() == 2
            && kinds.iter().all(|k| {
                k["state"] == "WATCHING"
                    && k["resumePoints"].as_array().is_some_and(|r| !r.is_empty())
            }))
    })
    .await?;

    // Restart the hub; change things while it is down.
    s.hub.stop();
    let a = &agent;
    eventually("the agent to notice the hub is gone", || async move {
        Ok(a.metric("scale_agent_agent_hub_connected", &[]).await? == 0.0)
    })
    .await?;
    create_configmap(&admin, &ns, "delta", json!({ "v": "1" })).await?;
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .delete("gamma", &DeleteParams::default())
        .await?;
    s.hub.start_again().await?;
    let log = s.hub.log();
    assert!(log.contains("store loaded"), "{log}");
    if let Some(postgres) = postgres {
        assert!(
            !s.hub.data_dir.join("hub.redb").exists(),
            "the hub on PostgreSQL made an embedded store"
        );
        let sql = postgres.connect().await?;
        let stored: i64 = sql
            .query_one(
                "SELECT count(*) FROM objects WHERE account = $1 AND kind = '/ConfigMap'",
                &[&acc],
            )
            .await?
            .get(0);
        // At least alpha, beta and gamma (or delta, once the agent resumed).
        assert!(stored >= 3, "{stored} ConfigMaps in PostgreSQL");
        let resume_points: i64 = sql
            .query_one(
                "SELECT count(*) FROM resume_points WHERE account = $1",
                &[&acc],
            )
            .await?
            .get(0);
        assert!(resume_points >= 2, "{resume_points} resume points");
    }
    let a = &agent;
    eventually(
        "the agent to reconnect and resume both kinds",
        || async move {
            let text = a.metrics().await?;
            Ok(resumes(&text, &cm) >= 1.0 && resumes(&text, &deploy) >= 1.0)
        },
    )
    .await?;
    hub_equals_api(&s.hub, &admin, acc, &ns).await?;
    let after = agent.metrics().await?;
    assert_eq!(
        lists(&after, &cm),
        1.0,
        "no LIST after the hub restart:\n{after}"
    );
    assert_eq!(lists(&after, &deploy), 1.0, "{after}");
    assert!(
        metric(&after, "scale_agent_agent_reconnects_total", &[]) >= 1.0,
        "{after}"
    );
    let (_, hub_metrics) = hub_get(s.hub.http, "/metrics").await?;
    assert!(
        metric(&hub_metrics, "scale_agent_hub_resumes_total", &[]) >= 2.0,
        "{hub_metrics}"
    );
    assert_eq!(
        metric(&hub_metrics, "scale_agent_hub_relists_total", &[]),
        0.0,
        "{hub_metrics}"
    );

    // Stop the agent; delete and change objects while it is down.
    agent.stop();
    change_configmaps(&admin, &ns, "alpha", "beta", "epsilon").await?;
    let hub = &s.hub;
    eventually("the hub to keep the account, disconnected", || async move {
        let view = hub.account(acc).await?;
        anyhow::ensure!(view.is_some(), "dropped within the grace period");
        Ok(view.is_some_and(|v| v["state"] == "disconnected" && v["streaming"].is_null()))
    })
    .await?;
    agent.start_again().await?;
    let a = &agent;
    eventually("the restarted agent to resume both kinds", || async move {
        let text = a.metrics().await?;
        Ok(resumes(&text, &cm) >= 1.0 && resumes(&text, &deploy) >= 1.0)
    })
    .await?;
    hub_equals_api(&s.hub, &admin, acc, &ns).await?;
    let beta = s
        .hub
        .object(acc, "configmaps", &ns, "beta")
        .await?
        .unwrap_or_default();
    assert_eq!(beta["data"]["v"], "2", "{beta}");
    let restarted = agent.metrics().await?;
    assert_eq!(
        lists(&restarted, &cm),
        0.0,
        "no LIST after the agent restart:\n{restarted}"
    );
    assert_eq!(resumes(&restarted, &cm), 1.0, "{restarted}");
    assert_eq!(lists(&restarted, &deploy), 0.0, "{restarted}");
    Ok(())
}

/// Test 4: two agent processes for one account; SIGKILL the one that streams, the standby
/// takes over from the hub's resume points and the cache follows the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_process_takes_over_when_the_streaming_one_is_killed() -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster("ha").await?;
    let s = setup("ha", &[]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &["configmaps"],
        s.dir.path(),
    )
    .await?;
    for name in ["one", "two", "three"] {
        create_configmap(&admin, &ns, name, json!({ "v": "1" })).await?;
    }
    let account = unique("ha");
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([fixtures::account(
            &account,
            &kubeconfig,
            &ns,
            &["configmaps"]
        )]),
    )?;
    let mut a = Agent::start(s.dir.path(), &config, "a", &s.tls).await?;
    let mut b = Agent::start(s.dir.path(), &config, "b", &s.tls).await?;
    let acc = account.as_str();
    let hub = &s.hub;
    eventually("one streaming replica and one standby", || async move {
        let view = hub.account(acc).await?.unwrap_or_default();
        Ok(view["streaming"]["replica"].is_string()
            && view["standbys"].as_array().is_some_and(|s| s.len() == 1))
    })
    .await?;
    hub_equals_api(hub, &admin, acc, &ns).await?;
    let view = hub.account(acc).await?.unwrap_or_default();
    let streaming = view["streaming"]["replica"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        view["standbys"][0]["replica"],
        if streaming == "a" { "b" } else { "a" },
        "{view}"
    );
    let (killed, standby) = if streaming == "a" {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    let standby_name = if streaming == "a" { "b" } else { "a" };
    eventually("the standby's own view to say standby", || async move {
        Ok(standby.account(acc).await?.unwrap_or_default()["role"] == "standby")
    })
    .await?;
    let text = standby.metrics().await?;
    assert_eq!(
        metric(&text, "scale_agent_agent_lists_total", &[("account", acc)]),
        0.0,
        "a standby does not watch:\n{text}"
    );

    killed.kill();
    change_configmaps(&admin, &ns, "one", "two", "four").await?;
    eventually("the standby promoted", || async move {
        let view = hub.account(acc).await?.unwrap_or_default();
        Ok(view["streaming"]["replica"] == standby_name)
    })
    .await?;
    hub_equals_api(hub, &admin, acc, &ns).await?;
    let role = standby.account(acc).await?.unwrap_or_default();
    assert_eq!(role["role"], "streaming", "{role}");
    let text = standby.metrics().await?;
    let cm = [("account", acc), ("kind", "configmaps")];
    assert_eq!(
        metric(&text, "scale_agent_agent_lists_total", &cm),
        0.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "scale_agent_agent_watch_resumes_total", &cm),
        1.0,
        "{text}"
    );
    // And it keeps following.
    create_configmap(&admin, &ns, "five", json!({ "v": "1" })).await?;
    hub_equals_api(hub, &admin, acc, &ns).await?;
    Ok(())
}

/// Test 5: an agent of a second cluster claiming an existing account name is rejected with
/// the reason; agents without a client certificate, or with one from another CA, never
/// connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_cluster_and_untrusted_clients_are_rejected() -> anyhow::Result<()> {
    // The second cluster starts while the first agent gets going.
    let second_cluster = tokio::spawn(ControlPlane::start(ControlPlaneOptions::default()));
    let (control_plane, admin, ns) = cluster("claim").await?;
    let s = setup("claim", &[]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &["configmaps"],
        s.dir.path(),
    )
    .await?;
    create_configmap(&admin, &ns, "first-cluster", json!({})).await?;
    let account = unique("claimed");
    let acc = account.as_str();
    let first_config = s.dir.path().join("first.yaml");
    let account_config = |kubeconfig: &Path, namespace: &str| {
        json!([fixtures::account(
            &account,
            kubeconfig,
            namespace,
            &["configmaps"]
        )])
    };
    write_agent_config(&first_config, &s.hub, account_config(&kubeconfig, &ns))?;
    let first = Agent::start(s.dir.path(), &first_config, "first", &s.tls).await?;
    let hub = &s.hub;
    let ns_ = ns.as_str();
    eventually("the first cluster's ConfigMap in the hub", || async move {
        Ok(hub
            .object(acc, "configmaps", ns_, "first-cluster")
            .await?
            .is_some())
    })
    .await?;

    let second_cluster = second_cluster.await??;
    let second_admin = second_cluster.client().await?;
    let second_ns = second_cluster
        .namespace(&second_admin, "stream-claim")
        .await?;
    let second_kubeconfig = agent_identity(
        &second_cluster,
        &second_admin,
        &second_ns,
        Scope::Cluster,
        &["configmaps"],
        s.dir.path(),
    )
    .await?;
    create_configmap(&second_admin, &second_ns, "second-cluster", json!({})).await?;
    let second_config = s.dir.path().join("second.yaml");
    write_agent_config(
        &second_config,
        &s.hub,
        account_config(&second_kubeconfig, &second_ns),
    )?;
    // The same identity in another cluster (another identity is refused by the account's
    // identity binding first; enrolled_and_token_agents_stream_and_accounts_stay_bound).
    let second_tls = AgentTls {
        ca_file: s.pki.ca_file.clone(),
        client: s.tls.client.clone(),
    };
    let second = Agent::start(s.dir.path(), &second_config, "second", &second_tls).await?;
    let second_ = &second;
    eventually("the second cluster's claim rejected", || async move {
        let view = second_.account(acc).await?.unwrap_or_default();
        Ok(view["role"] == "rejected")
    })
    .await?;
    let view = second.account(acc).await?.unwrap_or_default();
    let reason = view["rejectionReason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(control_plane.server()) && reason.contains(second_cluster.server()),
        "the reason names both clusters: {view}"
    );
    assert_eq!(
        second
            .metric("scale_agent_agent_account_rejected", &[("account", acc)])
            .await?,
        1.0
    );
    // A rejected account is not watched.
    let text = second.metrics().await?;
    assert_eq!(
        metric(&text, "scale_agent_agent_lists_total", &[("account", acc)]),
        0.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "scale_agent_agent_account_streaming",
            &[("account", acc)]
        ),
        0.0
    );
    // The hub still serves the first cluster, and says why it refused.
    let held = hub.account(acc).await?.unwrap_or_default();
    assert_eq!(
        held["cluster"]["apiServerHost"],
        control_plane.server(),
        "{held}"
    );
    assert_eq!(held["streaming"]["replica"], "first", "{held}");
    assert!(
        held["standbys"].as_array().is_none_or(Vec::is_empty),
        "{held}"
    );
    let log = hub.log();
    assert!(
        log.lines()
            .any(|l| l.contains("account rejected") && l.contains(acc)),
        "the hub logs the rejection:\n{log}"
    );
    assert!(
        hub.object(acc, "configmaps", "", "second-cluster")
            .await?
            .is_none()
    );
    assert!(
        hub.object(acc, "configmaps", ns_, "first-cluster")
            .await?
            .is_some()
    );
    assert_eq!(
        first.account(acc).await?.unwrap_or_default()["role"],
        "streaming"
    );

    // No client certificate, or one from another CA: never connected.
    let stranger = Pki::new(s.dir.path(), "stranger")?;
    let untrusted = [
        (
            "no-cert",
            AgentTls {
                ca_file: s.pki.ca_file.clone(),
                client: None,
            },
        ),
        (
            "other-ca",
            AgentTls {
                ca_file: s.pki.ca_file.clone(),
                client: Some(stranger.client("agent-claim")?),
            },
        ),
    ];
    let intruder_config = s.dir.path().join("intruder.yaml");
    let intruder = unique("intruder");
    write_agent_config(
        &intruder_config,
        hub,
        json!([fixtures::account(
            &intruder,
            &kubeconfig,
            &ns,
            &["configmaps"]
        )]),
    )?;
    let mut agents = Vec::new();
    for (replica, tls) in &untrusted {
        agents.push(Agent::start(s.dir.path(), &intruder_config, replica, tls).await?);
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        for agent in &agents {
            let connected = agent.metric("scale_agent_agent_hub_connected", &[]).await?;
            assert_eq!(
                connected,
                0.0,
                "an untrusted agent connected: {}",
                agent.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for agent in &agents {
        let view = agent.view().await?;
        assert_eq!(view["hubConnected"], false, "{view}");
        assert!(
            agent
                .metric("scale_agent_agent_reconnects_total", &[])
                .await?
                >= 1.0,
            "it did try: {view}"
        );
    }
    assert!(hub.account(&intruder).await?.is_none());
    let (_, agents_json) = hub.json("/api/v1/agents").await?;
    let replicas: Vec<&str> = agents_json
        .as_array()
        .map(|a| a.iter().filter_map(|a| a["replica"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        !replicas.contains(&"no-cert") && !replicas.contains(&"other-ca"),
        "{agents_json}"
    );
    drop(second);
    drop(second_cluster);
    Ok(())
}

/// Test 6: a ServiceAccount with a Role in one namespace: the namespace is streamed, and
/// what it may not watch cluster-wide is reported FORBIDDEN with the API server's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_role_streams_its_namespace_and_reports_forbidden_kinds() -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster("role").await?;
    let s = setup("role", &[]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Namespace,
        &["configmaps", "deployments.apps"],
        s.dir.path(),
    )
    .await?;
    create_configmap(&admin, &ns, "visible", json!({ "v": "1" })).await?;
    let scoped = unique("scoped");
    let wide = unique("wide");
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([
            fixtures::account(&scoped, &kubeconfig, &ns, &["configmaps", "deployments.apps"]),
            {
                "name": wide,
                "kubeconfigFile": kubeconfig.display().to_string(),
                "kinds": ["configmaps", "namespaces"],
            },
        ]),
    )?;
    let agent = Agent::start(s.dir.path(), &config, "role-0", &s.tls).await?;
    let hub = &s.hub;
    let (scoped_, wide_) = (scoped.as_str(), wide.as_str());
    hub_equals_api(hub, &admin, scoped_, &ns).await?;
    let kind_state = |view: &Value, plural: &str| -> (String, String) {
        view["kinds"]
            .as_array()
            .and_then(|k| k.iter().find(|k| k["plural"] == plural))
            .map(|k| {
                (
                    k["state"].as_str().unwrap_or_default().to_string(),
                    k["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .unwrap_or_default()
    };
    eventually(
        "FORBIDDEN for the cluster-wide kinds in the hub",
        || async move {
            let view = hub.account(wide_).await?.unwrap_or_default();
            Ok(kind_state(&view, "configmaps").0 == "FORBIDDEN"
                && kind_state(&view, "namespaces").0 == "FORBIDDEN")
        },
    )
    .await?;
    let view = hub.account(wide_).await?.unwrap_or_default();
    let user = format!("system:serviceaccount:{ns}:agent");
    for plural in ["configmaps", "namespaces"] {
        let (_, message) = kind_state(&view, plural);
        assert!(
            message.contains(&user) && message.contains("cannot list") && message.contains(plural),
            "the API server's message for {plural}: {view}"
        );
    }
    assert_eq!(view["objects"], 0, "{view}");
    eventually(
        "both kinds of the namespace WATCHING in the hub",
        || async move {
            let view = hub.account(scoped_).await?.unwrap_or_default();
            Ok(kind_state(&view, "configmaps").0 == "WATCHING"
                && kind_state(&view, "deployments").0 == "WATCHING")
        },
    )
    .await?;
    let scoped_view = hub.account(scoped_).await?.unwrap_or_default();
    assert_eq!(scoped_view["namespaces"], json!([ns]), "{scoped_view}");
    // The agent's own view agrees, and it does not retry in a hot loop.
    let agent_ = &agent;
    eventually("the agent's view to say forbidden", || async move {
        let view = agent_.account(wide_).await?.unwrap_or_default();
        Ok(view["kinds"].as_array().is_some_and(|k| {
            k.len() == 2
                && k.iter()
                    .all(|k| k["state"] == "forbidden" && k["message"].is_string())
        }))
    })
    .await?;
    create_configmap(&admin, &ns, "later", json!({ "v": "1" })).await?;
    hub_equals_api(hub, &admin, scoped_, &ns).await?;
    let text = agent.metrics().await?;
    assert_eq!(
        metric(
            &text,
            "scale_agent_agent_lists_total",
            &[("account", wide_), ("kind", "namespaces")]
        ),
        1.0,
        "{text}"
    );
    Ok(())
}

/// Test 7: an account removed from the config file stops being watched at once, and the hub
/// forgets it when the (shortened) grace period ends (ACTIVE, INACTIVE, ORPHANED); put back
/// in the config, it is ACTIVE again with its cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_account_stops_and_the_hub_drops_it_after_the_grace_period() -> anyhow::Result<()> {
    const GRACE: Duration = Duration::from_secs(3);
    let (control_plane, admin, ns) = cluster("remove").await?;
    let s = setup("remove", &["--grace-period=3s"]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &["configmaps"],
        s.dir.path(),
    )
    .await?;
    create_configmap(&admin, &ns, "kept", json!({})).await?;
    let (keep, remove) = (unique("keep"), unique("remove"));
    let account = |name: &str| fixtures::account(name, &kubeconfig, &ns, &["configmaps"]);
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(&config, &s.hub, json!([account(&keep), account(&remove)]))?;
    let agent = Agent::start(s.dir.path(), &config, "remove-0", &s.tls).await?;
    let hub = &s.hub;
    hub_equals_api(hub, &admin, &keep, &ns).await?;
    hub_equals_api(hub, &admin, &remove, &ns).await?;
    let watching = |text: &str, account: &str| {
        metric(
            text,
            "scale_agent_agent_watches",
            &[("account", account), ("state", "watching")],
        )
    };
    let (agent_, remove_) = (&agent, remove.as_str());
    eventually("the account's watch running", || async move {
        Ok(watching(&agent_.metrics().await?, remove_) == 1.0)
    })
    .await?;

    write_agent_config(&config, &s.hub, json!([account(&keep)]))?;
    eventually("the agent to drop the account", || async move {
        Ok(agent_.account(remove_).await?.is_none())
    })
    .await?;
    let dropped_at = Instant::now();
    let text = agent.metrics().await?;
    assert_eq!(
        watching(&text, remove_),
        0.0,
        "its watches stopped:\n{text}"
    );
    assert_eq!(watching(&text, &keep), 1.0, "{text}");
    let events = |text: &str| {
        metric(
            text,
            "scale_agent_agent_events_sent_total",
            &[("account", remove_)],
        )
    };
    let events_at_removal = events(&text);
    // Within the grace period the hub keeps it, without an agent.
    let mut last = Value::Null;
    while dropped_at.elapsed() < GRACE - Duration::from_secs(1) {
        match hub.account(remove_).await? {
            Some(view) if view["state"] == "disconnected" => {
                last = view;
                break;
            }
            Some(view) => last = view,
            None => anyhow::bail!("dropped at once, not after the grace period: {last}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !last.is_null() {
        assert_eq!(last["state"], "disconnected", "{last}");
        assert!(last["streaming"].is_null(), "{last}");
        assert!(last["disconnectedSince"].is_string(), "{last}");
    }
    // Dropped: no cache, no replicas; listed as ORPHANED (bound to its identity) until its
    // agent registers it again.
    eventually("the hub to drop the account (ORPHANED)", || async move {
        Ok(hub
            .account(remove_)
            .await?
            .is_some_and(|a| a["accountState"] == "ORPHANED" && a["objects"] == 0))
    })
    .await?;
    let gone_after = dropped_at.elapsed();
    assert!(
        gone_after + Duration::from_secs(1) >= GRACE,
        "dropped before the grace period: {gone_after:?}"
    );
    let (status, _) = hub
        .json(&format!(
            "/api/v1/accounts/{remove_}/objects?kind=configmaps"
        ))
        .await?;
    assert_eq!(status, 404);
    // The other account goes on; the removed one's watch saw nothing more.
    create_configmap(&admin, &ns, "after", json!({})).await?;
    hub_equals_api(hub, &admin, &keep, &ns).await?;
    assert_eq!(events(&agent.metrics().await?), events_at_removal);
    assert!(hub.log().contains("no agent within the grace period"));

    // And back: the account in the agent's config again is ACTIVE, its cache filled again.
    write_agent_config(&config, &s.hub, json!([account(&keep), account(&remove)]))?;
    eventually("the account to be ACTIVE again", || async move {
        Ok(hub
            .account(remove_)
            .await?
            .is_some_and(|a| a["accountState"] == "ACTIVE"))
    })
    .await?;
    hub_equals_api(hub, &admin, &remove, &ns).await?;
    Ok(())
}

/// Measures the initial sync of many small ConfigMaps created before the agent starts: from
/// the agent process's start to the hub holding all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_sync_of_many_configmaps() -> anyhow::Result<()> {
    const COUNT: usize = 2000;
    let (control_plane, admin, ns) = cluster("sync").await?;
    let s = setup("sync", &[]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Cluster,
        &["configmaps"],
        s.dir.path(),
    )
    .await?;
    let created = Instant::now();
    futures::stream::iter(0..COUNT)
        .map(|i| {
            let admin = &admin;
            let ns = &ns;
            async move {
                create_configmap(
                    admin,
                    ns,
                    &format!("cm-{i:05}"),
                    json!({ "i": i.to_string() }),
                )
                .await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    eprintln!(
        "[streaming] created {COUNT} ConfigMaps in {:.2} s",
        created.elapsed().as_secs_f64()
    );
    let account = unique("sync");
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([fixtures::account(
            &account,
            &kubeconfig,
            &ns,
            &["configmaps"]
        )]),
    )?;
    let started = Instant::now();
    let agent = Agent::start(s.dir.path(), &config, "sync-0", &s.tls).await?;
    let hub = &s.hub;
    let acc = account.as_str();
    eventually("all ConfigMaps in the hub", || async move {
        let view = hub.account(acc).await?.unwrap_or_default();
        Ok(view["objects"].as_u64() == Some(COUNT as u64))
    })
    .await?;
    let synced = started.elapsed();
    eprintln!(
        "[streaming] initial sync of {COUNT} ConfigMaps: {:.2} s from agent process start to the hub holding all",
        synced.as_secs_f64()
    );
    hub_equals_api(hub, &admin, acc, &ns).await?;
    let text = agent.metrics().await?;
    assert_eq!(
        metric(
            &text,
            "scale_agent_agent_lists_total",
            &[("account", acc), ("kind", "configmaps")]
        ),
        1.0
    );
    Ok(())
}

/// The hub's audit lines (`--log-format json`, target `audit`) in its log.
fn audit_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "audit")
        .collect()
}

/// Audit: an operation submitted with an API token and a write through the Kubernetes API
/// proxy with a proxy token are each one JSON line with target `audit` naming who (token and
/// kind), the account, the verb, the object, the API server's code and the duration; with
/// `--proxy-audit-reads writes-only` a read through the proxy is not audited (reads are by
/// default: e2e/tests/proxy_callers.rs). With `--audit-log-path` the binary writes the same
/// lines (their fields) to the audit file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_and_proxied_writes_are_audited() -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster("audit").await?;
    let audit_dir = fixtures::temp_dir("scale-agent-e2e-audit-file")?;
    let audit_file = audit_dir.join("audit.log");
    let audit_flag = format!("--audit-log-path={}", audit_file.display());
    let s = setup(
        "audit",
        &[
            "--log-format=json",
            "--proxy-audit-reads=writes-only",
            &audit_flag,
        ],
    )
    .await?;
    let writer = k8s_openapi::api::rbac::v1::PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["configmaps".into()]),
        verbs: vec!["*".into()],
        ..Default::default()
    };
    let kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin,
        &ns,
        "agent",
        Scope::Namespace,
        vec![writer],
        s.dir.path().join("kubeconfig-audit"),
    )
    .await?;
    let account = unique("audit");
    let config = s.dir.path().join("agent.yaml");
    write_agent_config(
        &config,
        &s.hub,
        json!([{
            "name": account,
            "kubeconfigFile": kubeconfig.display().to_string(),
            "namespaces": [ns],
            "kinds": ["configmaps"],
        }]),
    )?;
    let agent = Agent::start(s.dir.path(), &config, "audit-0", &s.tls).await?;
    eventually("the agent ready", || agent.ready()).await?;
    let hub = &s.hub;

    // An operation, with the tests' API token (name "e2e", role operator).
    let manifest = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "audited-op", "namespace": ns },
        "data": { "a": "1" },
    });
    let submitted = fixtures::hub_call(
        "POST",
        hub.http,
        &format!("/api/v1/accounts/{account}/operations"),
    )
    .json(&json!({ "type": "apply", "manifest": manifest }))
    .timeout(WAIT)
    .send()
    .await?;
    assert_eq!(submitted.status, 200, "{}", submitted.body);

    // A proxy token from the admin API, with the admin token the hub wrote at start.
    let admin_token = std::fs::read_to_string(hub.data_dir.join("admin-token"))?;
    let issued = http::Call::new(
        "POST",
        format!(
            "http://{}/api/v1/accounts/{account}/kubeconfig?tokenName=auditor",
            hub.http
        ),
    )
    .bearer(admin_token.trim())
    .send()
    .await?;
    assert_eq!(issued.status, 200, "{}", issued.body);
    let proxy_token = issued
        .body
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .ok_or_else(|| anyhow::anyhow!("no token in {}", issued.body))?
        .to_string();
    let collection = format!("/clusters/{account}/api/v1/namespaces/{ns}/configmaps");
    let created = http::Call::new("POST", format!("http://{}{collection}", hub.http))
        .bearer(&proxy_token)
        .json(&json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "audited-proxy" },
        }))
        .timeout(WAIT)
        .send()
        .await?;
    assert_eq!(created.status, 201, "{}", created.body);
    let read = http::Call::new(
        "GET",
        format!("http://{}{collection}/audited-proxy", hub.http),
    )
    .bearer(&proxy_token)
    .timeout(WAIT)
    .send()
    .await?;
    assert_eq!(read.status, 200, "{}", read.body);
    // A write the API server refuses is audited with its code too.
    let forbidden = http::Call::new(
        "DELETE",
        format!(
            "http://{}/clusters/{account}/api/v1/namespaces/{ns}/secrets/x",
            hub.http
        ),
    )
    .bearer(&proxy_token)
    .timeout(WAIT)
    .send()
    .await?;
    assert_eq!(forbidden.status, 403, "{}", forbidden.body);

    let mut lines = Vec::new();
    eventually("three audit lines in the hub's log", || {
        // The account's first binding has its own line (issue 28, F15); this test is about
        // operations and proxied requests.
        lines = audit_lines(&hub.log())
            .into_iter()
            .filter(|l| l["fields"]["message"] != "account bound")
            .collect();
        let count = lines.len();
        async move { Ok(count >= 3) }
    })
    .await?;
    assert_eq!(lines.len(), 3, "the GET is not audited: {lines:#?}");
    let fields: Vec<&Value> = lines.iter().map(|l| &l["fields"]).collect();
    let operation = fields[0];
    assert_eq!(operation["message"], "operation", "{operation}");
    assert_eq!(operation["who"], fixtures::API_TOKEN_NAME, "{operation}");
    assert_eq!(operation["token_kind"], "api", "{operation}");
    assert_eq!(operation["account"], account.as_str(), "{operation}");
    assert_eq!(operation["verb"], "apply", "{operation}");
    assert_eq!(
        operation["object"],
        format!("ConfigMap/{ns}/audited-op"),
        "{operation}"
    );
    assert_eq!(operation["code"], 200, "{operation}");
    assert!(operation["duration_ms"].is_u64(), "{operation}");
    let write = fields[1];
    assert_eq!(write["message"], "proxied write", "{write}");
    assert_eq!(write["who"], "auditor", "{write}");
    assert_eq!(write["token_kind"], "proxy", "{write}");
    assert_eq!(write["account"], account.as_str(), "{write}");
    assert_eq!(write["verb"], "create", "{write}");
    assert_eq!(write["object"], format!("configmaps/{ns}"), "{write}");
    assert_eq!(write["code"], 201, "{write}");
    assert!(write["duration_ms"].is_u64(), "{write}");
    let refused = fields[2];
    assert_eq!(
        (&refused["verb"], &refused["object"], &refused["code"]),
        (
            &json!("delete"),
            &json!(format!("secrets/{ns}/x")),
            &json!(403)
        ),
        "{refused}"
    );
    assert!(
        !hub.log().contains(fixtures::API_TOKEN) && !hub.log().contains(&proxy_token),
        "a token in the hub's log"
    );
    // The audit file holds the same lines, field for field (the request ids included).
    let in_file: Vec<Value> = std::fs::read_to_string(&audit_file)?
        .lines()
        .map(serde_json::from_str::<Value>)
        .collect::<Result<_, _>>()?;
    let file_fields: Vec<&Value> = in_file
        .iter()
        .inspect(|l| assert_eq!(l["target"], "audit", "{l}"))
        .map(|l| &l["fields"])
        .filter(|f| f["message"] != "account bound")
        .collect();
    assert_eq!(file_fields, fields, "the audit file and the log disagree");
    assert!(
        write["request_id"]
            .as_str()
            .is_some_and(|id| id.len() == 36),
        "{write}"
    );
    drop(agent);
    let _ = std::fs::remove_dir_all(&audit_dir);
    Ok(())
}

/// `scale-agent-hub agent-token create` against the hub's admin API (the real command, as an
/// admin runs it); returns the token it printed.
fn create_agent_token(hub: &Hub, args: &[&str]) -> anyhow::Result<String> {
    let output = std::process::Command::new(HUB)
        .args(["agent-token", "create"])
        .args(args)
        .arg(format!("--hub-url=http://{}", hub.http))
        .arg(format!("--data-dir={}", hub.data_dir.display()))
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "agent-token create failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?.trim().to_string())
}

/// Item 3 and 6 of the security issue with real processes: an agent enrols with a one-time
/// token, streams with the certificate the hub issued, renews it over its stream and comes
/// back with it after a restart (the token is gone by then); an agent with a bearer token
/// streams; and that second identity may not join the first one's account, even as a
/// standby of the same cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrolled_and_token_agents_stream_and_accounts_stay_bound() -> anyhow::Result<()> {
    let (control_plane, admin, ns) = cluster("enrol").await?;
    let dir = TempDir::new("enrol")?;
    let pki = Pki::new(dir.path(), "enrol")?;
    // 30 s certificates: the agent renews after about 20 s.
    let hub =
        Hub::start_trusting_only_itself(dir.path(), &pki, &["--agent-cert-lifetime=30s"]).await?;
    let kubeconfig = agent_identity(
        control_plane,
        &admin,
        &ns,
        Scope::Namespace,
        &["configmaps"],
        dir.path(),
    )
    .await?;
    create_configmap(&admin, &ns, "seen", json!({ "v": "1" })).await?;
    let account = unique("enrol");
    let accounts = json!([fixtures::account(
        &account,
        &kubeconfig,
        &ns,
        &["configmaps"]
    )]);

    let token_file = dir.path().join("enrolment-token");
    std::fs::write(
        &token_file,
        create_agent_token(
            &hub,
            &[
                "--identity=enrolled-agent",
                "--accounts=enrol-*",
                "--ttl=10m",
                "--once",
            ],
        )?,
    )?;
    let cert_dir = dir.path().join("enrolled");
    let client = ClientCert {
        cert: cert_dir.join("tls.crt"),
        key: cert_dir.join("tls.key"),
    };
    let config = dir.path().join("enrolled.yaml");
    std::fs::write(
        &config,
        serde_json::to_string(&json!({
            "clouddriver": {
                "grpc": hub.grpc.to_string(),
                "keepAliveHeartbeatSeconds": 1,
                "backoff": { "baseDelay": "200ms", "maxDelay": "1s" },
                "auth": { "enrolmentTokenFile": token_file.display().to_string() },
            },
            "kubernetes": { "accounts": accounts },
        }))?,
    )?;
    let tls = AgentTls {
        ca_file: pki.ca_file.clone(),
        client: Some(client.clone()),
    };
    let mut enrolled = Agent::start(dir.path(), &config, "enrolled-0", &tls).await?;
    eventually("the enrolled agent streaming", || async {
        Ok(hub
            .account(&account)
            .await?
            .is_some_and(|a| a["streaming"]["identity"] == "enrolled-agent"))
    })
    .await?;
    eventually("the account's ConfigMap in the hub", || async {
        Ok(hub
            .object(&account, "configmaps", &ns, "seen")
            .await?
            .is_some())
    })
    .await?;
    let first_cert = std::fs::read(&client.cert)?;
    let used_token = std::fs::read_to_string(&token_file)?;
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&client.key)?.permissions().mode() & 0o777,
        0o600
    );

    // The token worked once; the agent renews over its stream and keeps the new certificate.
    std::fs::remove_file(&token_file)?;
    eventually("the certificate renewed over the stream", || async {
        Ok(std::fs::read(&client.cert)? != first_cert)
    })
    .await?;
    // Restarted, it connects with the renewed certificate: there is no token to enrol with.
    enrolled.stop();
    enrolled.start_again().await?;
    eventually("the restarted agent streaming again", || async {
        Ok(enrolled.ready().await?
            && hub
                .account(&account)
                .await?
                .is_some_and(|a| a["streaming"]["identity"] == "enrolled-agent"))
    })
    .await?;

    // A bearer-token agent of another identity on the same cluster: it streams its own
    // account, but the first one's is refused, as STANDBY too.
    let bearer_file = dir.path().join("bearer-token");
    std::fs::write(
        &bearer_file,
        create_agent_token(
            &hub,
            &["--identity=token-agent", "--accounts=*", "--ttl=10m"],
        )?,
    )?;
    let own = unique("token");
    let config = dir.path().join("token.yaml");
    std::fs::write(
        &config,
        serde_json::to_string(&json!({
            "clouddriver": {
                "grpc": hub.grpc.to_string(),
                "keepAliveHeartbeatSeconds": 1,
                "backoff": { "baseDelay": "200ms", "maxDelay": "1s" },
                "auth": { "tokenFile": bearer_file.display().to_string() },
            },
            "kubernetes": { "accounts": [
                fixtures::account(&account, &kubeconfig, &ns, &["configmaps"]),
                fixtures::account(&own, &kubeconfig, &ns, &["configmaps"]),
            ] },
        }))?,
    )?;
    let token_tls = AgentTls {
        ca_file: pki.ca_file.clone(),
        client: None,
    };
    let token_agent = Agent::start(dir.path(), &config, "token-0", &token_tls).await?;
    eventually("the token agent streaming its own account", || async {
        Ok(hub
            .account(&own)
            .await?
            .is_some_and(|a| a["streaming"]["identity"] == "token-agent"))
    })
    .await?;
    eventually("the bound account refused to the token agent", || async {
        Ok(token_agent
            .metric(
                "scale_agent_agent_account_rejected",
                &[("account", &account)],
            )
            .await?
            == 1.0)
    })
    .await?;
    let held = hub.account(&account).await?.unwrap_or_default();
    assert_eq!(held["streaming"]["identity"], "enrolled-agent", "{held}");
    assert!(
        held["standbys"].as_array().is_none_or(Vec::is_empty),
        "{held}"
    );
    let log = hub.log();
    assert!(
        log.lines().any(|l| l.contains("account rejected")
            && l.contains(&account)
            && l.contains("scale-agent-hub account rebind")),
        "the hub says why and what to do:\n{log}"
    );

    // An agent given the used token: refused, and its log says why and what to set.
    let reused_file = dir.path().join("reused-token");
    std::fs::write(&reused_file, &used_token)?;
    let config = dir.path().join("reused.yaml");
    std::fs::write(
        &config,
        serde_json::to_string(&json!({
            "clouddriver": {
                "grpc": hub.grpc.to_string(),
                "keepAliveHeartbeatSeconds": 1,
                "backoff": { "baseDelay": "200ms", "maxDelay": "1s" },
                "auth": { "enrolmentTokenFile": reused_file.display().to_string() },
            },
            "kubernetes": { "accounts": [] },
        }))?,
    )?;
    let reused_dir = dir.path().join("reused");
    let reused_tls = AgentTls {
        ca_file: pki.ca_file.clone(),
        client: Some(ClientCert {
            cert: reused_dir.join("tls.crt"),
            key: reused_dir.join("tls.key"),
        }),
    };
    let reused = Agent::start(dir.path(), &config, "reused-0", &reused_tls).await?;
    let reused_log = reused
        .process
        .as_ref()
        .map(|p| p.log().to_path_buf())
        .ok_or_else(|| anyhow::anyhow!("the agent is not running"))?;
    eventually("the refused enrolment in the agent's log", || async {
        let text = std::fs::read_to_string(&reused_log)?;
        Ok(text.contains("the hub refused the enrolment")
            && text.contains("already used")
            && text.contains(&format!(
                "Put a new one-time token (`scale-agent-hub agent-token create --once`) into {}",
                reused_file.display()
            )))
    })
    .await?;
    assert!(!reused_dir.join("tls.crt").exists());
    assert_eq!(reused.view().await?["hubConnected"], false);

    // A client that does not speak TLS: the hub logs the failed handshake with the peer.
    {
        use tokio::io::AsyncWriteExt as _;
        let mut tcp = tokio::net::TcpStream::connect(hub.grpc).await?;
        tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
        let peer = tcp.local_addr()?.to_string();
        eventually("the failed handshake in the hub's log", || async {
            Ok(hub
                .log()
                .lines()
                .any(|l| l.contains("gRPC TLS handshake failed") && l.contains(&peer)))
        })
        .await?;
    }
    Ok(())
}
