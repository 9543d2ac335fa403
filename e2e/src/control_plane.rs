//! A real, local Kubernetes control plane: etcd (data on tmpfs), kube-apiserver with RBAC,
//! ServiceAccount token signing, a serving certificate and an admin identity, and optionally
//! kube-controller-manager so Deployments roll out to ReplicaSets and namespaces and owned
//! objects are garbage-collected, and optionally kube-scheduler with KWOK's fake nodes so
//! pods are bound, Running and Ready and have logs (see [`crate::kwok`]).
//!
//! Tests share one control plane per test binary ([`ControlPlane::shared`]) and isolate
//! themselves with a fresh namespace each ([`ControlPlane::namespace`]).

use std::{
    fmt, fs,
    io::Write as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::{Namespace, ServiceAccount},
};
use kube::{
    Client, Config,
    api::{Api, ObjectMeta, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use rand::Rng;

mod audit;
mod certificates;
mod etcd;
mod options;

pub use audit::{AuditEvent, AuditStatus, AuditUser};
use certificates::Certificates;
use etcd::Etcd;
pub use options::{ControlPlaneOptions, DEFAULT_CONTROLLERS, OLDER_API_SERVER_ENV, StartupTimes};

use crate::{
    binaries::{Binaries, KUBERNETES_VERSION, OLDER_KUBERNETES_VERSION},
    error::{Error, Result, io_err},
    kwok::{self, PodLog},
    local_agent::free_port,
    pki::CertificateAuthority,
    process::{self, ManagedProcess},
    real_node,
};

/// The resource whose watch cache is switched off, so a watch from a compacted
/// resourceVersion gets a real 410 Gone at once. With the cache on, the apiserver keeps
/// serving old events from memory after etcd compacts them.
pub const UNCACHED_RESOURCE: &str = "podtemplates";

/// Label put on every namespace made by [`ControlPlane::namespace`].
pub const TEST_NAMESPACE_LABEL: &str = "scaleagent.dev/e2e";

/// A running control plane. Dropping it stops the components in reverse start order (kwok,
/// scheduler, controller manager, apiserver, etcd) and removes its run directory.
pub struct ControlPlane {
    binaries: Binaries,
    /// Signs the certificates of the nodes' components ([`Self::certificate_authority`]).
    ca: CertificateAuthority,
    run_dir: PathBuf,
    /// In start order; stopped in reverse.
    processes: Mutex<Vec<ManagedProcess>>,
    server: String,
    etcd_endpoint: String,
    ca_pem: String,
    kubeconfig_path: PathBuf,
    kubeconfig_yaml: String,
    kwok: Option<KwokRun>,
    audit_log: Option<PathBuf>,
    startup: StartupTimes,
    /// What kube-apiserver was started with, for [`Self::restart_apiserver`].
    apiserver_args: Vec<String>,
    ready_timeout: Duration,
}

/// Where a running kwok serves the kubelet API, and where pod log files go.
#[derive(Clone, Debug)]
struct KwokRun {
    kubelet_port: u16,
    logs_dir: PathBuf,
}

impl fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlPlane")
            .field("server", &self.server)
            .field("run_dir", &self.run_dir)
            .field("startup", &self.startup)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// The control plane shared by every test in this test binary, started on first use
    /// (without the controller manager).
    pub fn shared() -> Result<&'static ControlPlane> {
        Self::shared_with(ControlPlaneOptions::default)
    }

    /// Like [`Self::shared`], with options; the first caller in a test binary decides them,
    /// so every test of one binary should pass the same.
    pub fn shared_with(
        options: impl FnOnce() -> ControlPlaneOptions,
    ) -> Result<&'static ControlPlane> {
        static SHARED: OnceLock<std::result::Result<ControlPlane, String>> = OnceLock::new();
        let shared = SHARED.get_or_init(|| {
            let options = options();
            // Tests run on their own Tokio runtimes, which die with each test: start on a
            // thread with a runtime of its own, and hand out clients per test.
            let started = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                runtime
                    .block_on(ControlPlane::start(options))
                    .map_err(|e| e.to_string())
            })
            .join()
            .unwrap_or_else(|_| Err("the control plane start-up thread panicked".into()));
            if let Ok(control_plane) = &started {
                process::remove_at_exit(control_plane.run_dir.clone());
                // Written straight to stderr so it shows in `cargo test` output uncaptured.
                let _ = writeln!(
                    std::io::stderr(),
                    "[e2e] Kubernetes {} control plane at {} {}",
                    control_plane.binaries.server_version(),
                    control_plane.server,
                    control_plane.startup
                );
            }
            started
        });
        shared
            .as_ref()
            .map_err(|message| Error::SharedStartFailed(message.clone()))
    }

    /// Starts etcd, kube-apiserver and (if asked) kube-controller-manager, kube-scheduler and
    /// kwok with its fake nodes, and waits until each is ready.
    pub async fn start(options: ControlPlaneOptions) -> Result<ControlPlane> {
        let mut binaries = Binaries::locate()?;
        if options.older_api_server {
            if options.node_address.is_some() {
                return Err(Error::OlderApiServerWithRealNode {
                    older: OLDER_KUBERNETES_VERSION,
                    pinned: KUBERNETES_VERSION,
                });
            }
            binaries = binaries.with_older_api_server()?;
        }
        if options.kwok {
            binaries.require(&[
                "kube-scheduler",
                "kwok",
                "kwok-config/stages.yaml",
                "kwok-config/logs-crd.yaml",
            ])?;
        }
        let started = Instant::now();
        let run_dir = match &options.run_dir {
            Some(dir) => {
                if dir.exists() {
                    fs::remove_dir_all(dir).map_err(io_err(format!("clear {}", dir.display())))?;
                }
                dir.clone()
            }
            None => new_run_dir()?,
        };
        fs::create_dir_all(&run_dir).map_err(io_err(format!("create {}", run_dir.display())))?;
        fs::write(run_dir.join("owner.pid"), std::process::id().to_string())
            .map_err(io_err("write owner.pid"))?;

        let write = |name: &str, contents: &str| -> Result<PathBuf> {
            let path = run_dir.join(name);
            fs::write(&path, contents).map_err(io_err(format!("write {}", path.display())))?;
            Ok(path)
        };

        let Certificates {
            ca,
            ca_file,
            serving_cert,
            serving_key,
            admin_cert,
            admin_key,
            sa_key,
            sa_pub,
        } = Certificates::write(&run_dir, options.node_address)?;

        let mut processes = Vec::new();

        // etcd: data on tmpfs and fsync off; a test cluster's data is thrown away anyway.
        let etcd_data = run_dir.join("etcd");
        let (etcd_client_port, etcd_peer_port) = (free_port()?, free_port()?);
        let etcd_endpoint = format!("http://127.0.0.1:{etcd_client_port}");
        let etcd_peer = format!("http://127.0.0.1:{etcd_peer_port}");
        let etcd_started = Instant::now();
        processes.push(ManagedProcess::spawn(
            "etcd",
            &binaries.etcd(),
            &[
                "--name=e2e".into(),
                format!("--data-dir={}", etcd_data.display()),
                format!("--listen-client-urls={etcd_endpoint}"),
                format!("--advertise-client-urls={etcd_endpoint}"),
                format!("--listen-peer-urls={etcd_peer}"),
                format!("--initial-advertise-peer-urls={etcd_peer}"),
                format!("--initial-cluster=e2e={etcd_peer}"),
                "--unsafe-no-fsync=true".into(),
                "--quota-backend-bytes=4294967296".into(),
                "--log-level=warn".into(),
            ],
            run_dir.join("etcd.log"),
        )?);
        let etcd = Etcd::new(&etcd_endpoint);
        wait_until("etcd", options.ready_timeout, &mut processes[0], || {
            etcd.healthy()
        })
        .await?;
        let etcd_ready = etcd_started.elapsed();

        let apiserver_port = free_port()?;
        let listen = options.node_address.unwrap_or(Ipv4Addr::LOCALHOST);
        let server = format!("https://{listen}:{apiserver_port}");
        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_endpoint}"),
            format!("--bind-address={listen}"),
            // Without a default route the apiserver cannot pick an address by itself.
            format!("--advertise-address={listen}"),
            format!("--secure-port={apiserver_port}"),
            format!("--cert-dir={}", run_dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", serving_cert.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!("--client-ca-file={}", ca_file.display()),
            format!(
                "--authorization-mode={}",
                if options.node_address.is_some() {
                    "Node,RBAC"
                } else {
                    "RBAC"
                }
            ),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            // No kubelet and no ServiceAccount controller: pods must not wait for a
            // `default` ServiceAccount that nothing creates. And no node-lifecycle
            // controller to lift the not-ready taint TaintNodesByCondition puts on every
            // new node, which would keep kwok's nodes unschedulable.
            // (A real node has both: every plugin stays on.)
            format!(
                "--disable-admission-plugins={}",
                match (options.node_address, options.kwok) {
                    (Some(_), _) => &[][..],
                    (None, true) => &["ServiceAccount", "TaintNodesByCondition"][..],
                    (None, false) => &["ServiceAccount"][..],
                }
                .iter()
                .map(|plugin| plugin.to_string())
                .chain(options.disable_admission_plugins.iter().cloned())
                .collect::<Vec<_>>()
                .join(",")
            ),
            format!(
                "--endpoint-reconciler-type={}",
                if options.node_address.is_some() {
                    "lease"
                } else {
                    "none"
                }
            ),
            format!("--watch-cache-sizes={UNCACHED_RESOURCE}#0"),
            // Priority and fairness only adds start-up work on a single-user test cluster.
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        if let Some(config) = &options.runtime_config {
            apiserver_args.push(format!("--runtime-config={config}"));
        }
        let audit_log = options.audit.then(|| run_dir.join("audit.log"));
        if let Some(log) = &audit_log {
            apiserver_args.extend(audit::apiserver_args(&run_dir, log)?);
        }
        if options.kwok {
            // `pods/log` goes to "the kubelet", which is kwok at 127.0.0.1 serving with a
            // certificate from this run's CA: verify it, and take the nodes' InternalIP (the
            // default order would try their host names first).
            apiserver_args.extend([
                format!("--kubelet-certificate-authority={}", ca_file.display()),
                "--kubelet-preferred-address-types=InternalIP".into(),
            ]);
        }
        if options.node_address.is_some() {
            apiserver_args.extend(real_node::apiserver_kubelet_args(&ca, &run_dir)?);
            apiserver_args.extend(certificates::aggregation_args(&run_dir)?);
        }
        let apiserver_started = Instant::now();
        processes.push(ManagedProcess::spawn(
            "kube-apiserver",
            &binaries.kube_apiserver(),
            &apiserver_args,
            run_dir.join("kube-apiserver.log"),
        )?);

        let kubeconfig_yaml = kubeconfig_yaml(
            &server,
            &ca_file,
            &format!(
                "client-certificate: {}\n    client-key: {}",
                admin_cert.display(),
                admin_key.display()
            ),
        );
        let kubeconfig_path = write("admin.kubeconfig", &kubeconfig_yaml)?;
        let admin_client = client_from_kubeconfig(&kubeconfig_yaml).await?;
        wait_until(
            "kube-apiserver",
            options.ready_timeout,
            &mut processes[1],
            || async {
                matches!(
                    admin_client
                        .request_text(http_get("/readyz")?)
                        .await
                        .as_deref(),
                    Ok("ok")
                )
                .then_some(())
                .ok_or(())
            },
        )
        .await?;
        let apiserver_ready = apiserver_started.elapsed();

        let mut kcm_ready = None;
        if options.controller_manager {
            let kcm_port = free_port()?;
            let kcm_started = Instant::now();
            processes.push(ManagedProcess::spawn(
                "kube-controller-manager",
                &binaries.kube_controller_manager(),
                &[
                    format!("--kubeconfig={}", kubeconfig_path.display()),
                    "--leader-elect=false".into(),
                    format!("--controllers={}", options.controllers.join(",")),
                    format!("--service-account-private-key-file={}", sa_key.display()),
                    format!("--root-ca-file={}", ca_file.display()),
                    "--use-service-account-credentials=false".into(),
                    "--bind-address=127.0.0.1".into(),
                    format!("--secure-port={kcm_port}"),
                    format!("--tls-cert-file={}", serving_cert.display()),
                    format!("--tls-private-key-file={}", serving_key.display()),
                    "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into(),
                    "--kube-api-qps=1000".into(),
                    "--kube-api-burst=1000".into(),
                    "--v=1".into(),
                ],
                run_dir.join("kube-controller-manager.log"),
            )?);
            wait_for_health_endpoint(
                "kube-controller-manager",
                options.ready_timeout,
                &mut processes,
                &kubeconfig_yaml,
                &server,
                kcm_port,
                "/healthz",
            )
            .await?;
            kcm_ready = Some(kcm_started.elapsed());
        }

        let (mut scheduler_ready, mut kwok_ready, mut kwok_run) = (None, None, None);
        if options.kwok || options.node_address.is_some() {
            let scheduler_port = free_port()?;
            let scheduler_started = Instant::now();
            processes.push(ManagedProcess::spawn(
                "kube-scheduler",
                &binaries.kube_scheduler(),
                &[
                    format!("--kubeconfig={}", kubeconfig_path.display()),
                    "--leader-elect=false".into(),
                    "--bind-address=127.0.0.1".into(),
                    format!("--secure-port={scheduler_port}"),
                    format!("--tls-cert-file={}", serving_cert.display()),
                    format!("--tls-private-key-file={}", serving_key.display()),
                    "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into(),
                    "--profiling=false".into(),
                    "--v=1".into(),
                ],
                run_dir.join("kube-scheduler.log"),
            )?);
            // /readyz, unlike /healthz, waits for the scheduler's informers to sync.
            wait_for_health_endpoint(
                "kube-scheduler",
                options.ready_timeout,
                &mut processes,
                &kubeconfig_yaml,
                &server,
                scheduler_port,
                "/readyz",
            )
            .await?;
            scheduler_ready = Some(scheduler_started.elapsed());
        }
        if options.kwok {
            let kwok_started = Instant::now();
            kwok::install_logs_crd(&admin_client, &binaries).await?;
            let kubelet_port = free_port()?;
            let logs_dir = run_dir.join("pod-logs");
            let logs_config = kwok::write_logs_config(&logs_dir)?;
            let mut command = std::process::Command::new(binaries.kwok());
            command
                .args(kwok::args(
                    &binaries,
                    &kubeconfig_path,
                    &logs_config,
                    kubelet_port,
                    &serving_cert,
                    &serving_key,
                ))
                // kwok also reads ~/.kwok/kwok.yaml when it exists: keep a user's out.
                .env("KWOK_WORKDIR", run_dir.join("kwok"));
            processes.push(ManagedProcess::spawn_command(
                "kwok",
                command,
                run_dir.join("kwok.log"),
            )?);
            let index = processes.len() - 1;
            wait_until("kwok", options.ready_timeout, &mut processes[index], || {
                kwok_healthy(kubelet_port)
            })
            .await?;
            kwok::create_nodes(&admin_client).await?;
            wait_until(
                "kwok",
                options.ready_timeout,
                &mut processes[index],
                || async {
                    kwok::nodes_ready(&admin_client, kubelet_port)
                        .await
                        .then_some(())
                        .ok_or(())
                },
            )
            .await?;
            kwok_ready = Some(kwok_started.elapsed());
            kwok_run = Some(KwokRun {
                kubelet_port,
                logs_dir,
            });
        }

        Ok(ControlPlane {
            binaries,
            run_dir,
            ca_pem: ca.cert_pem.clone(),
            ca,
            processes: Mutex::new(processes),
            server,
            etcd_endpoint,
            kubeconfig_path,
            kubeconfig_yaml,
            kwok: kwok_run,
            audit_log,
            apiserver_args,
            ready_timeout: options.ready_timeout,
            startup: StartupTimes {
                etcd: etcd_ready,
                kube_apiserver: apiserver_ready,
                kube_controller_manager: kcm_ready,
                kube_scheduler: scheduler_ready,
                kwok: kwok_ready,
                total: started.elapsed(),
            },
        })
    }

    /// The apiserver's URL, `https://127.0.0.1:<port>` (on a real node's bridge address
    /// with [`ControlPlaneOptions::node_address`]).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The PEM CA that signed the apiserver's serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA of this control plane: the API server trusts client certificates it signs (a
    /// kubelet's `system:node:<name>`, kube-proxy's `system:kube-proxy`) and checks kubelets'
    /// serving certificates against it.
    pub fn certificate_authority(&self) -> &CertificateAuthority {
        &self.ca
    }

    /// A kubeconfig for `user`, authenticating with a client certificate and key (files).
    pub fn kubeconfig_for_certificate(&self, certificate: &Path, key: &Path) -> String {
        kubeconfig_yaml(
            &self.server,
            &self.run_dir.join("ca.crt"),
            &format!(
                "client-certificate: {}\n    client-key: {}",
                certificate.display(),
                key.display()
            ),
        )
    }

    /// A kubeconfig file for the admin identity (`system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    pub fn startup(&self) -> StartupTimes {
        self.startup
    }

    /// Name and pid of each running component, in start order.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.processes
            .lock()
            .map(|ps| ps.iter().map(|p| (p.name(), p.pid())).collect())
            .unwrap_or_default()
    }

    /// Fails with the component's log when one of them has exited.
    pub fn ensure_running(&self) -> Result<()> {
        match self.processes.lock() {
            Ok(mut processes) => processes
                .iter_mut()
                .try_for_each(ManagedProcess::ensure_running),
            Err(_) => Ok(()),
        }
    }

    /// A new admin client. Make one per test: a client's connections belong to the Tokio
    /// runtime it was first used on.
    pub async fn client(&self) -> Result<Client> {
        client_from_kubeconfig(&self.kubeconfig_yaml).await
    }

    /// A kubeconfig that authenticates with a bearer `token`, for example a ServiceAccount's.
    pub fn kubeconfig_for_token(&self, token: &str) -> String {
        kubeconfig_yaml(
            &self.server,
            &self.run_dir.join("ca.crt"),
            &format!("token: {token}"),
        )
    }

    /// A client that authenticates with a bearer `token`, so RBAC applies to it.
    pub async fn client_for_token(&self, token: &str) -> Result<Client> {
        client_from_kubeconfig(&self.kubeconfig_for_token(token)).await
    }

    /// Mints a real token for ServiceAccount `namespace/name` with the TokenRequest API.
    pub async fn service_account_token(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
    ) -> Result<String> {
        token_request(client, namespace, name, Duration::from_secs(3600)).await
    }

    /// Creates a fresh namespace `<prefix>-<random>` for one test.
    pub async fn namespace(&self, client: &Client, prefix: &str) -> Result<String> {
        let prefix: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(50)
            .collect();
        let name = format!(
            "{}-{:06x}",
            prefix.trim_matches('-'),
            rand::rng().random_range(0..0x100_0000)
        );
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(TEST_NAMESPACE_LABEL.to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await?;
        Ok(name)
    }

    /// Whether kwok runs the fake nodes of [`kwok::NODES`] ([`ControlPlaneOptions::with_kwok`]).
    pub fn has_kwok(&self) -> bool {
        self.kwok.is_some()
    }

    /// Gives pod `namespace/pod` a log of its own, empty, and waits until kwok serves it:
    /// `kubectl logs` then prints what [`PodLog::append`] added, and `kubectl logs -f` streams
    /// it. The pod need not exist yet. Calling it again starts the log afresh.
    pub async fn pod_log(&self, client: &Client, namespace: &str, pod: &str) -> Result<PodLog> {
        let kwok = self
            .kwok
            .as_ref()
            .ok_or(Error::KwokNotRunning { what: "a pod log" })?;
        kwok::pod_log(client, &kwok.logs_dir, kwok.kubelet_port, namespace, pod).await
    }

    /// Every request the API server recorded in its audit log so far (empty without
    /// [`ControlPlaneOptions::audit`]). Lines it has not finished writing are skipped.
    pub fn audit_events(&self) -> Result<Vec<AuditEvent>> {
        let Some(log) = &self.audit_log else {
            return Ok(Vec::new());
        };
        audit::read_events(log)
    }

    /// Compacts etcd's history up to its current revision, so older resourceVersions are
    /// gone. Returns the revision compacted to.
    pub async fn compact_etcd(&self) -> Result<i64> {
        Etcd::new(&self.etcd_endpoint).compact_to_current().await
    }

    /// Stops kube-apiserver (SIGTERM, as a rolling update of the control plane does) and
    /// starts it again with the same flags, port, certificates and etcd, then waits until it
    /// is ready. Clients' connections and watches break and must be made again; etcd keeps
    /// the data and the ServiceAccount signing key stays, so tokens stay valid. Returns how
    /// long the API server did not answer.
    pub async fn restart_apiserver(&self) -> Result<Duration> {
        let position = |processes: &Vec<ManagedProcess>| {
            processes.iter().position(|p| p.name() == "kube-apiserver")
        };
        let mut old = {
            // A panic elsewhere while the lock was held does not matter to this list.
            let mut processes = self.processes.lock().unwrap_or_else(|e| e.into_inner());
            let index = position(&processes).ok_or(Error::NotRunning {
                component: "kube-apiserver",
            })?;
            processes.remove(index)
        };
        let down = Instant::now();
        old.stop(Duration::from_secs(10));
        let log = self.run_dir.join(format!(
            "kube-apiserver-{}.log",
            k8s_openapi::jiff::Timestamp::now().as_millisecond()
        ));
        let new = ManagedProcess::spawn(
            "kube-apiserver",
            &self.binaries.kube_apiserver(),
            &self.apiserver_args,
            log.clone(),
        )?;
        let pid = new.pid();
        // Back where it was, so `pids`, `ensure_running` and `stop` see it.
        {
            let mut processes = self.processes.lock().unwrap_or_else(|e| e.into_inner());
            let index = processes.len().min(1);
            processes.insert(index, new);
        }
        let client = self.client().await?;
        loop {
            if !process::is_alive(pid) {
                return Err(Error::NotReady {
                    component: "kube-apiserver",
                    waited_secs: down.elapsed().as_secs(),
                    log: log.clone(),
                    log_tail: process::tail(&log, 20),
                });
            }
            let ready = match http_get("/readyz") {
                Ok(request) => matches!(client.request_text(request).await.as_deref(), Ok("ok")),
                Err(()) => false,
            };
            if ready {
                return Ok(down.elapsed());
            }
            if down.elapsed() > self.ready_timeout {
                return Err(Error::NotReady {
                    component: "kube-apiserver",
                    waited_secs: self.ready_timeout.as_secs(),
                    log: log.clone(),
                    log_tail: process::tail(&log, 20),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the components in reverse start order; a component still running after its
    /// grace period is killed.
    pub fn stop(&self) {
        if let Ok(mut processes) = self.processes.lock() {
            while let Some(mut process) = processes.pop() {
                process.stop(Duration::from_secs(10));
            }
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.run_dir);
    }
}

/// Root of the per-run directories: tmpfs when the machine has one, so etcd writes to memory.
fn runs_root() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.join("scale-agent-e2e")
    } else {
        std::env::temp_dir().join("scale-agent-e2e")
    }
}

fn new_run_dir() -> Result<PathBuf> {
    let root = runs_root();
    process::sweep_stale_runs(&root, |_| {});
    let nanos = k8s_openapi::jiff::Timestamp::now().subsec_nanosecond();
    Ok(root.join(format!("{}-{nanos:09}", std::process::id())))
}

fn kubeconfig_yaml(server: &str, ca_file: &Path, user: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: scale-agent-e2e
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: scale-agent-e2e
  user:
    {user}
contexts:
- name: scale-agent-e2e
  context:
    cluster: scale-agent-e2e
    user: scale-agent-e2e
current-context: scale-agent-e2e
",
        ca = ca_file.display(),
    )
}

fn kubeconfig_yaml_with_server(yaml: &str, from: &str, to: &str) -> String {
    yaml.replace(&format!("server: {from}\n"), &format!("server: {to}\n"))
}

async fn client_from_kubeconfig(yaml: &str) -> Result<Client> {
    let kubeconfig = Kubeconfig::from_yaml(yaml)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

fn http_get(path: &str) -> std::result::Result<http::Request<Vec<u8>>, ()> {
    http::Request::get(path).body(Vec::new()).map_err(|_| ())
}

/// Waits until the last of `processes`, a component serving HTTPS on `port` with the
/// apiserver's certificate, answers `ok` on `path` (one of its always-allowed paths).
async fn wait_for_health_endpoint(
    component: &'static str,
    timeout: Duration,
    processes: &mut [ManagedProcess],
    kubeconfig_yaml: &str,
    server: &str,
    port: u16,
    path: &str,
) -> Result<()> {
    let client = client_from_kubeconfig(&kubeconfig_yaml_with_server(
        kubeconfig_yaml,
        server,
        &format!("https://127.0.0.1:{port}"),
    ))
    .await?;
    let Some(process) = processes.last_mut() else {
        return Ok(());
    };
    wait_until(component, timeout, process, || async {
        matches!(
            client.request_text(http_get(path)?).await.as_deref(),
            Ok("ok")
        )
        .then_some(())
        .ok_or(())
    })
    .await
}

/// kwok's `/healthz`, over plain HTTP (kwok serves HTTP and HTTPS on one port).
async fn kwok_healthy(port: u16) -> std::result::Result<(), ()> {
    match crate::http::request(
        "GET",
        format!("127.0.0.1:{port}"),
        "/healthz",
        None,
        Duration::from_secs(2),
    )
    .await
    {
        Ok(response) if response.status == 200 => Ok(()),
        _ => Err(()),
    }
}

/// [`process::wait_ready`] with the process's own log and a probe that answers `Ok(())`.
async fn wait_until<F, Fut>(
    component: &'static str,
    timeout: Duration,
    process: &mut ManagedProcess,
    mut probe: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<(), ()>>,
{
    let log = process.log().to_path_buf();
    process::wait_ready(process, component, &log, timeout, || {
        let answer = probe();
        async move { answer.await.is_ok() }
    })
    .await
}

/// A real token of ServiceAccount `namespace/name`, valid for `lifetime`, from the
/// TokenRequest API (no audiences: the token is for the apiserver's own audience).
pub async fn token_request(
    client: &Client,
    namespace: &str,
    name: &str,
    lifetime: Duration,
) -> Result<String> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(i64::try_from(lifetime.as_secs()).unwrap_or(3600)),
            ..Default::default()
        }),
        ..Default::default()
    };
    let response = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await?;
    response
        .status
        .and_then(|status| status.token)
        .ok_or_else(|| Error::NoToken {
            service_account: format!("{namespace}/{name}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_parses_and_server_can_be_swapped() {
        let yaml = kubeconfig_yaml(
            "https://127.0.0.1:6443",
            Path::new("/tmp/ca.crt"),
            "token: abc",
        );
        let parsed = Kubeconfig::from_yaml(&yaml).unwrap();
        assert_eq!(parsed.current_context.as_deref(), Some("scale-agent-e2e"));
        let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        let swapped =
            kubeconfig_yaml_with_server(&yaml, "https://127.0.0.1:6443", "https://127.0.0.1:1");
        assert!(
            swapped.contains("server: https://127.0.0.1:1\n"),
            "{swapped}"
        );
    }
}
