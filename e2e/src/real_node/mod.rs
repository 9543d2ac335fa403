//! A real Kubernetes node on this machine, beside KWOK's fake ones: containerd and runc run
//! the pods' containers from the images this build makes, kubelet (from the control
//! plane's multi-call binary) runs the pods, the CNI bridge plugin gives them addresses on
//! the bridge [`BRIDGE`], and kube-proxy (iptables mode) makes Services work. The control
//! plane is started for it ([`ControlPlaneOptions::with_real_node`]): the API server listens
//! on the bridge address too, so pods reach it through the `kubernetes` Service.
//!
//! Needs root (containers, a bridge, iptables); [`unavailable`] says when the machine
//! cannot run it, and the tests skip then. One real node per machine at a time: [`RealNode::start`]
//! takes a file lock. Dropping the node deletes its pods, stops kube-proxy, kubelet and
//! containerd, kills what they left, unmounts its volumes, deletes the bridge and puts the
//! machine's iptables rules and kernel settings back as they were ([`host`]), also when a
//! test fails (the drop runs while unwinding). A run killed outright leaves its saved
//! tables behind, and the next run restores them first.
//!
//! Identities are real: kubelet authenticates as `system:node:<name>` (Node authorizer),
//! kube-proxy as `system:kube-proxy` (the bootstrap `system:node-proxier` role), both with
//! client certificates from the control plane's CA; kubelet serves its API with a
//! certificate from the same CA, which the API server checks, and authenticates and
//! authorizes the API server's requests by webhook (TokenReview, SubjectAccessReview).

mod config;
mod host;
pub mod install;
pub mod metrics_server;
pub mod user;

use std::{
    fs::{self, File},
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Endpoints, Node};
use kube::{Api, Client};

use crate::{
    ControlPlane, ControlPlaneOptions,
    binaries::{Binaries, cache_root},
    error::{Error, Result, io_err},
    local_agent::free_port,
    pki::CertificateAuthority,
    process::{self, ManagedProcess},
};

/// The pods' bridge (the CNI bridge plugin's default name).
pub const BRIDGE: &str = "cni0";
/// The bridge's address: the pods' gateway, the node's InternalIP, where kubelet serves
/// and where the API server listens.
pub const BRIDGE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// Pod addresses (host-local).
pub const POD_SUBNET: &str = "10.244.0.0/24";
/// The `kubernetes` Service's ClusterIP: the first of the control plane's Service range
/// (10.0.0.0/24).
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// The names in the API server's serving certificate besides its addresses.
pub const APISERVER_NAMES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];
/// The node's name (kubelet's `--hostname-override`, its certificate's `system:node:` name).
pub const NODE_NAME: &str = "scale-agent-e2e-node";
/// The sandbox image containerd runs in every pod (e2e/node/install.sh builds it).
pub const PAUSE_IMAGE: &str = "localhost/scale-agent-e2e/pause:v3.10";
/// Debian's containernetworking-plugins put the plugins here.
const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// A node's working directory in the temporary directory: this and the owner's pid.
const NODE_DIR_PREFIX: &str = "scale-agent-e2e-node-";
/// containerd's namespace for the CRI's images and containers.
const CRI_NAMESPACE: &str = "k8s.io";
/// The lock held while a real node runs, and the network snapshot of a run that was
/// killed before it restored it.
const STATE_DIR: &str = "/run/scale-agent-e2e-real-node";

/// Why this machine cannot run a real node, or `None` when it can. Only a missing
/// privilege skips: missing parts are an error that says how to install them.
#[allow(unsafe_code)] // geteuid has no safe std wrapper.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some(
            "a real node needs root (containerd, runc, a network bridge and iptables rules); \
             run the test as root, as CI does"
                .into(),
        );
    }
    None
}

/// An image to load into the node's containerd: an OCI layout (`images/image.sh layout`)
/// and the repository its tag is put under (e.g. `ghcr.io/scale-agent/hub`, giving
/// `ghcr.io/scale-agent/hub:v0.1.0`).
#[derive(Clone, Debug)]
pub struct NodeImage {
    pub repository: String,
    pub layout: PathBuf,
}

/// How long each part took to start.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeStartup {
    pub control_plane: Duration,
    pub containerd: Duration,
    pub images: Duration,
    /// From kubelet's start until the node is Ready without the not-ready taint.
    pub kubelet: Duration,
    pub kube_proxy: Duration,
    pub total: Duration,
}

/// A running real node and its control plane (with the API server's audit log on:
/// [`ControlPlane::audit_events`]).
pub struct RealNode {
    control_plane: ControlPlane,
    /// containerd, kubelet, kube-proxy, in start order.
    processes: Vec<ManagedProcess>,
    dir: PathBuf,
    containerd_socket: PathBuf,
    snapshot: host::HostSnapshot,
    startup: NodeStartup,
    /// Held until the node is gone: one real node per machine.
    _lock: File,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("dir", &self.dir)
            .field("control_plane", &self.control_plane)
            .finish_non_exhaustive()
    }
}

/// The API server's client certificate for kubelets' APIs (logs, exec, port-forward) and
/// the flags that use it; called by [`ControlPlane::start`] for a real node.
pub(crate) fn apiserver_kubelet_args(
    ca: &CertificateAuthority,
    run_dir: &Path,
) -> Result<Vec<String>> {
    let client = ca.client("kube-apiserver-kubelet-client", &["system:masters"])?;
    let cert = run_dir.join("apiserver-kubelet-client.crt");
    let key = run_dir.join("apiserver-kubelet-client.key");
    fs::write(&cert, &client.cert_pem).map_err(io_err(format!("write {}", cert.display())))?;
    fs::write(&key, &client.key_pem).map_err(io_err(format!("write {}", key.display())))?;
    Ok(vec![
        format!("--kubelet-client-certificate={}", cert.display()),
        format!("--kubelet-client-key={}", key.display()),
        format!(
            "--kubelet-certificate-authority={}",
            run_dir.join("ca.crt").display()
        ),
        "--kubelet-preferred-address-types=InternalIP".into(),
    ])
}

impl RealNode {
    /// Starts the control plane, containerd (with `images` and the pause image loaded),
    /// kubelet and kube-proxy, and waits until the node is Ready and untainted and the
    /// `kubernetes` Service has the API server's bridge address as its endpoint.
    pub async fn start(images: &[NodeImage]) -> Result<RealNode> {
        if let Some(reason) = unavailable() {
            return Err(Error::NodeUnavailable { reason });
        }
        let started = Instant::now();
        let binaries = Binaries::locate()?;
        binaries.require(&["kubelet", "kube-proxy", "kube-scheduler"])?;
        let pause_layout = cache_root().join("node").join("pause");
        for part in [
            Path::new("/usr/bin/containerd"),
            Path::new("/usr/bin/ctr"),
            Path::new("/usr/sbin/runc"),
            Path::new("/usr/sbin/iptables"),
            &Path::new(CNI_BIN_DIR).join("bridge"),
            &pause_layout.join("index.json"),
        ] {
            if !part.exists() {
                return Err(Error::NodePartMissing {
                    path: part.to_path_buf(),
                });
            }
        }

        let state_dir = Path::new(STATE_DIR);
        fs::create_dir_all(state_dir).map_err(io_err(format!("create {STATE_DIR}")))?;
        let lock = File::create(state_dir.join("lock"))
            .map_err(io_err(format!("create {STATE_DIR}/lock")))?;
        if lock.try_lock().is_err() {
            eprintln!("[real-node] another real node runs on this machine: waiting for its lock");
            lock.lock()
                .map_err(io_err(format!("lock {STATE_DIR}/lock")))?;
        }
        let saved = state_dir.join("saved");
        remove_leftover_nodes();
        host::HostSnapshot::restore_leftover(&saved);
        let snapshot = host::HostSnapshot::take(&saved)?;
        host::create_bridge()?;

        let dir = std::env::temp_dir().join(format!("{NODE_DIR_PREFIX}{}", std::process::id()));
        if dir.exists() {
            host::unmount_under(&dir);
            fs::remove_dir_all(&dir).map_err(io_err(format!("clear {}", dir.display())))?;
        }
        let control_plane_started = Instant::now();
        let control_plane = match ControlPlane::start(
            // The audit log: tests prove from the API server's side what pods asked of it.
            ControlPlaneOptions {
                ready_timeout: Duration::from_secs(120),
                ..ControlPlaneOptions::default()
            }
            .with_real_node(BRIDGE_ADDRESS)
            .with_audit(),
        )
        .await
        {
            Ok(control_plane) => control_plane,
            Err(error) => {
                host::delete_bridge();
                snapshot.restore();
                return Err(error);
            }
        };
        let mut node = RealNode {
            control_plane,
            processes: Vec::new(),
            containerd_socket: dir.join("containerd").join("containerd.sock"),
            dir,
            snapshot,
            startup: NodeStartup {
                control_plane: control_plane_started.elapsed(),
                ..NodeStartup::default()
            },
            _lock: lock,
        };
        // From here on, a failure drops `node`, which cleans up what was started.
        node.start_containerd().await?;
        let images_started = Instant::now();
        node.import_image(&NodeImage {
            repository: PAUSE_IMAGE
                .rsplit_once(':')
                .map_or(PAUSE_IMAGE, |(repository, _)| repository)
                .to_string(),
            layout: pause_layout,
        })?;
        for image in images {
            node.import_image(image)?;
        }
        node.startup.images = images_started.elapsed();
        node.start_kubelet().await?;
        node.start_kube_proxy().await?;
        node.wait_for_kubernetes_endpoint().await?;
        node.startup.total = started.elapsed();
        eprintln!(
            "[real-node] node {NODE_NAME} Ready in {:.1} s (control plane {:.1} s, containerd {:.1} s, images {:.1} s, kubelet {:.1} s, kube-proxy {:.1} s); API server {}",
            node.startup.total.as_secs_f64(),
            node.startup.control_plane.as_secs_f64(),
            node.startup.containerd.as_secs_f64(),
            node.startup.images.as_secs_f64(),
            node.startup.kubelet.as_secs_f64(),
            node.startup.kube_proxy.as_secs_f64(),
            node.control_plane.server(),
        );
        Ok(node)
    }

    pub fn control_plane(&self) -> &ControlPlane {
        &self.control_plane
    }

    pub fn startup(&self) -> NodeStartup {
        self.startup
    }

    /// The node's working directory (containerd's root, kubelet's, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Fails with the component's log when containerd, kubelet or kube-proxy has exited,
    /// or one of the control plane's components.
    pub fn ensure_running(&mut self) -> Result<()> {
        self.control_plane.ensure_running()?;
        self.processes
            .iter_mut()
            .try_for_each(ManagedProcess::ensure_running)
    }

    /// `ctr` against this node's containerd, in the CRI's namespace.
    fn ctr(&self, args: &[&str]) -> Result<String> {
        let socket = self.containerd_socket.to_string_lossy().into_owned();
        let mut all = vec!["--address", &socket, "--namespace", CRI_NAMESPACE];
        all.extend_from_slice(args);
        host::run("/usr/bin/ctr", &all)
    }

    /// Loads an OCI image layout into containerd (unpacked for the overlay snapshotter), as
    /// `<repository>:<the layout's tag>`; pods run it with `imagePullPolicy: IfNotPresent`
    /// or `Never`.
    pub fn import_image(&self, image: &NodeImage) -> Result<()> {
        let archive = self.dir.join(format!(
            "image-{}.tar",
            image.repository.replace(['/', ':'], "_")
        ));
        host::run(
            "tar",
            &[
                "-C",
                &image.layout.to_string_lossy(),
                "-cf",
                &archive.to_string_lossy(),
                ".",
            ],
        )?;
        let imported = self.ctr(&[
            "images",
            "import",
            "--base-name",
            &image.repository,
            &archive.to_string_lossy(),
        ]);
        let _ = fs::remove_file(&archive);
        let imported = imported?;
        eprintln!(
            "[real-node] imported {} from {}: {}",
            image.repository,
            image.layout.display(),
            imported.trim()
        );
        Ok(())
    }

    async fn start_containerd(&mut self) -> Result<()> {
        let started = Instant::now();
        let base = self.dir.join("containerd");
        let cni_conf = self.dir.join("cni").join("net.d");
        for dir in [&base, &cni_conf] {
            fs::create_dir_all(dir).map_err(io_err(format!("create {}", dir.display())))?;
        }
        let conflist = cni_conf.join("10-scale-agent-e2e.conflist");
        fs::write(
            &conflist,
            config::cni_conflist(&self.dir.join("cni").join("ipam")),
        )
        .map_err(io_err(format!("write {}", conflist.display())))?;
        let config_path = base.join("config.toml");
        fs::write(
            &config_path,
            config::containerd(
                &base.join("root"),
                &base.join("state"),
                &self.containerd_socket,
                &cni_conf,
            ),
        )
        .map_err(io_err(format!("write {}", config_path.display())))?;
        let mut command = Command::new("/usr/bin/containerd");
        command
            .arg("--config")
            .arg(&config_path)
            // runc and the shim are found on PATH.
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            );
        self.processes.push(ManagedProcess::spawn_command(
            "containerd",
            command,
            self.dir.join("containerd.log"),
        )?);
        let socket = self.containerd_socket.clone();
        self.wait_for("containerd", Duration::from_secs(60), || {
            let socket = socket.clone();
            async move {
                host::run(
                    "/usr/bin/ctr",
                    &["--address", &socket.to_string_lossy(), "version"],
                )
                .is_ok()
            }
        })
        .await?;
        self.startup.containerd = started.elapsed();
        Ok(())
    }

    async fn start_kubelet(&mut self) -> Result<()> {
        let started = Instant::now();
        let dir = self.dir.join("kubelet");
        fs::create_dir_all(&dir).map_err(io_err(format!("create {}", dir.display())))?;
        let ca = self.control_plane.certificate_authority();
        let write = |name: &str, contents: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            fs::write(&path, contents).map_err(io_err(format!("write {}", path.display())))?;
            Ok(path)
        };
        let client = ca.client(&format!("system:node:{NODE_NAME}"), &["system:nodes"])?;
        let client_cert = write("kubelet-client.crt", &client.cert_pem)?;
        let client_key = write("kubelet-client.key", &client.key_pem)?;
        let serving = ca.serving_with_ips(
            NODE_NAME,
            &[NODE_NAME],
            &[std::net::IpAddr::V4(BRIDGE_ADDRESS)],
        )?;
        let serving_cert = write("kubelet.crt", &serving.cert_pem)?;
        let serving_key = write("kubelet.key", &serving.key_pem)?;
        let kubeconfig = write(
            "kubelet.kubeconfig",
            &self
                .control_plane
                .kubeconfig_for_certificate(&client_cert, &client_key),
        )?;
        let healthz_port = free_port()?;
        let ca_file = self.control_plane.run_dir().join("ca.crt");
        let pod_logs = self.dir.join("pod-logs");
        let config = write(
            "kubelet-config.yaml",
            &config::kubelet(&config::KubeletFiles {
                ca: &ca_file,
                serving_cert: &serving_cert,
                serving_key: &serving_key,
                containerd_socket: &self.containerd_socket,
                pod_logs: &pod_logs,
                healthz_port,
            }),
        )?;
        let binary = self.control_plane.binaries().path("kubelet");
        self.processes.push(ManagedProcess::spawn(
            "kubelet",
            &binary,
            &[
                format!("--config={}", config.display()),
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--root-dir={}", dir.join("root").display()),
                format!("--cert-dir={}", dir.join("pki").display()),
                format!("--hostname-override={NODE_NAME}"),
                // The bridge address: the node's InternalIP, where the API server reaches
                // kubelet (127.0.0.1 is refused as a node address).
                format!("--node-ip={BRIDGE_ADDRESS}"),
                "--v=1".into(),
            ],
            self.dir.join("kubelet.log"),
        )?);
        let client = self.control_plane.client().await?;
        self.wait_for("kubelet", Duration::from_secs(180), || {
            let nodes: Api<Node> = Api::all(client.clone());
            async move {
                nodes
                    .get_opt(NODE_NAME)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|node| node_ready_and_untainted(&node))
            }
        })
        .await?;
        self.startup.kubelet = started.elapsed();
        Ok(())
    }

    async fn start_kube_proxy(&mut self) -> Result<()> {
        let started = Instant::now();
        let dir = self.dir.join("kube-proxy");
        fs::create_dir_all(&dir).map_err(io_err(format!("create {}", dir.display())))?;
        let identity = self
            .control_plane
            .certificate_authority()
            .client("system:kube-proxy", &[])?;
        let cert = dir.join("kube-proxy.crt");
        let key = dir.join("kube-proxy.key");
        fs::write(&cert, &identity.cert_pem)
            .map_err(io_err(format!("write {}", cert.display())))?;
        fs::write(&key, &identity.key_pem).map_err(io_err(format!("write {}", key.display())))?;
        let kubeconfig = dir.join("kube-proxy.kubeconfig");
        fs::write(
            &kubeconfig,
            self.control_plane.kubeconfig_for_certificate(&cert, &key),
        )
        .map_err(io_err(format!("write {}", kubeconfig.display())))?;
        let (healthz_port, metrics_port) = (free_port()?, free_port()?);
        let config = dir.join("kube-proxy-config.yaml");
        fs::write(
            &config,
            config::kube_proxy(&kubeconfig, healthz_port, metrics_port),
        )
        .map_err(io_err(format!("write {}", config.display())))?;
        let binary = self.control_plane.binaries().path("kube-proxy");
        self.processes.push(ManagedProcess::spawn(
            "kube-proxy",
            &binary,
            &[format!("--config={}", config.display()), "--v=1".into()],
            self.dir.join("kube-proxy.log"),
        )?);
        self.wait_for("kube-proxy", Duration::from_secs(60), || async move {
            crate::http::request(
                "GET",
                format!("127.0.0.1:{healthz_port}"),
                "/healthz",
                None,
                Duration::from_secs(2),
            )
            .await
            .is_ok_and(|response| response.status == 200)
        })
        .await?;
        self.startup.kube_proxy = started.elapsed();
        Ok(())
    }

    /// The lease endpoint reconciler publishes the API server's bridge address as the
    /// `kubernetes` Service's endpoint; pods' in-cluster configuration needs it.
    async fn wait_for_kubernetes_endpoint(&mut self) -> Result<()> {
        let client: Client = self.control_plane.client().await?;
        let expected = BRIDGE_ADDRESS.to_string();
        self.wait_for("kube-apiserver", Duration::from_secs(60), || {
            let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), "default");
            let expected = expected.clone();
            async move {
                endpoints
                    .get_opt("kubernetes")
                    .await
                    .ok()
                    .flatten()
                    .and_then(|e| e.subsets)
                    .into_iter()
                    .flatten()
                    .flat_map(|subset| subset.addresses.unwrap_or_default())
                    .any(|address| address.ip == expected)
            }
        })
        .await
    }

    /// Polls `ready` until it answers true, failing with the log of the last process
    /// started when it exits or `timeout` passes.
    async fn wait_for<F, Fut>(
        &mut self,
        component: &'static str,
        timeout: Duration,
        ready: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let Some(process) = self.processes.last_mut() else {
            return Ok(());
        };
        let log = process.log().to_path_buf();
        process::wait_ready(process, component, &log, timeout, ready).await
    }

    /// Deletes every pod through the API (kubelet stops their containers and tears down
    /// their sandboxes' networks), after cordoning the node so controllers' replacements
    /// stay Pending.
    fn delete_pods(&self) {
        let kubectl = self.control_plane.binaries().kubectl();
        let kubeconfig = self
            .control_plane
            .kubeconfig_path()
            .to_string_lossy()
            .into_owned();
        host::run_quietly(
            &kubectl,
            &["--kubeconfig", &kubeconfig, "cordon", NODE_NAME],
        );
        host::run_quietly(
            &kubectl,
            &[
                "--kubeconfig",
                &kubeconfig,
                "delete",
                "pods",
                "--all",
                "--all-namespaces",
                "--grace-period=5",
                "--timeout=90s",
                "--wait=true",
            ],
        );
    }

    /// Kills the containers kubelet did not stop (a failed test may leave kubelet stuck).
    fn kill_remaining_containers(&self) {
        let Ok(tasks) = self.ctr(&["tasks", "list", "--quiet"]) else {
            return;
        };
        for task in tasks.split_whitespace() {
            let _ = self.ctr(&["tasks", "kill", "--all", "--signal", "SIGKILL", task]);
        }
        std::thread::sleep(Duration::from_millis(500));
        for task in tasks.split_whitespace() {
            let _ = self.ctr(&["tasks", "delete", "--force", task]);
        }
    }
}

/// The directories of real nodes whose process was killed before it cleaned up (holding the
/// lock, no other node runs): their containers, still running under their shims, are
/// killed, their mounts undone and the directories removed.
fn remove_leftover_nodes() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(NODE_DIR_PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || process::is_alive(pid) {
            continue;
        }
        let dir = entry.path();
        eprintln!(
            "[real-node] removing what the killed run {pid} left: {}",
            dir.display()
        );
        host::kill_shims(&dir.to_string_lossy());
        host::unmount_under(&dir);
        let _ = fs::remove_dir_all(&dir);
    }
    host::remove_empty_container_cgroups();
}

/// Ready, and without the taints a node carries until the node lifecycle controller and
/// kubelet have seen it work (`node.kubernetes.io/not-ready`, `.../network-unavailable`).
fn node_ready_and_untainted(node: &Node) -> bool {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| {
            taints
                .iter()
                .any(|t| t.key.starts_with("node.kubernetes.io/") && t.effect == "NoSchedule")
        });
    ready && !tainted
}

impl Drop for RealNode {
    fn drop(&mut self) {
        let started = Instant::now();
        self.delete_pods();
        // kube-proxy, then kubelet; containerd stays up to kill what is left.
        while self.processes.len() > 1 {
            if let Some(mut process) = self.processes.pop() {
                process.stop(Duration::from_secs(10));
            }
        }
        self.kill_remaining_containers();
        self.snapshot.delete_new_network_namespaces();
        if let Some(mut containerd) = self.processes.pop() {
            containerd.stop(Duration::from_secs(10));
        }
        host::kill_shims(&self.containerd_socket.to_string_lossy());
        host::remove_empty_container_cgroups();
        host::unmount_under(&self.dir);
        if let Err(error) = fs::remove_dir_all(&self.dir) {
            eprintln!(
                "[real-node] clean-up: remove {}: {error}",
                self.dir.display()
            );
        }
        self.control_plane.stop();
        host::delete_bridge();
        self.snapshot.restore();
        eprintln!(
            "[real-node] stopped and cleaned up in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
}
