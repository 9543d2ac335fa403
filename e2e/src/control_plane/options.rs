//! How a control plane is started ([`ControlPlaneOptions`]) and how long its components
//! took to become ready ([`StartupTimes`]).

use std::{fmt, net::Ipv4Addr, path::PathBuf, time::Duration};

use crate::kwok;

/// Set to `1` to start every control plane of a test run with the older API server
/// ([`ControlPlaneOptions::older_api_server`]): any KWOK test binary can then run against it,
/// e.g. `SCALE_AGENT_E2E_OLDER_API_SERVER=1 cargo test -p scale-agent-e2e --test operator`.
pub const OLDER_API_SERVER_ENV: &str = "SCALE_AGENT_E2E_OLDER_API_SERVER";

/// Controllers run when the controller manager is on: enough for Deployments to roll out,
/// for owner references to garbage-collect, and for namespaces to finish deleting.
pub const DEFAULT_CONTROLLERS: &[&str] = &[
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-token-controller",
];

/// How to start a control plane.
#[derive(Clone, Debug)]
pub struct ControlPlaneOptions {
    /// Also run kube-controller-manager with [`Self::controllers`].
    pub controller_manager: bool,
    /// The controllers kube-controller-manager runs (`--controllers`).
    pub controllers: Vec<String>,
    /// Also run kube-scheduler and KWOK with the fake nodes of [`kwok::NODES`], so pods are
    /// bound, become Running and Ready, and can have logs. Needs [`Self::controller_manager`]
    /// for anything but bare pods; [`Self::with_kwok`] sets both.
    pub kwok: bool,
    /// Write the API server's audit log (every request's URI, verb, user and user agent,
    /// as JSON lines), so tests can prove from the server's side what it received
    /// ([`ControlPlane::audit_events`](crate::ControlPlane::audit_events)).
    pub audit: bool,
    /// Budget for each component to become ready; contended 2-core machines have been seen
    /// to need 35 s for the apiserver.
    pub ready_timeout: Duration,
    /// Where certificates, kubeconfigs, logs and (unless on tmpfs already) etcd data go.
    /// By default a fresh directory under `/dev/shm`, removed when the process exits.
    pub run_dir: Option<PathBuf>,
    /// Serve a real node ([`crate::real_node`]): the API server listens and advertises on
    /// this address of the node's bridge (the `kubernetes` Service's endpoint, published by
    /// the lease endpoint reconciler, so pods reach it through the Service's ClusterIP),
    /// authorizes kubelets with the Node authorizer, reaches them with a client certificate
    /// and checks theirs, admits pods with their ServiceAccount's token, and serves
    /// aggregated APIs (the front proxy's flags: the real node's metrics-server).
    pub node_address: Option<Ipv4Addr>,
    /// Run kube-apiserver, kube-controller-manager and kube-scheduler of
    /// [`OLDER_KUBERNETES_VERSION`](crate::OLDER_KUBERNETES_VERSION) (a target cluster still in a major cloud's support
    /// window) instead of the pinned release; etcd and kwok stay the same. KWOK only: the
    /// real node's kubelet would be newer than the API server. Defaults to
    /// [`OLDER_API_SERVER_ENV`] being `1`.
    pub older_api_server: bool,
    /// kube-apiserver's `--runtime-config`, e.g.
    /// `admissionregistration.k8s.io/v1/validatingadmissionpolicies=false` for a server
    /// without ValidatingAdmissionPolicy v1.
    pub runtime_config: Option<String>,
    /// More admission plugins to switch off (`--disable-admission-plugins`), beside the ones
    /// a test cluster without a kubelet needs off.
    pub disable_admission_plugins: Vec<String>,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            controller_manager: false,
            controllers: DEFAULT_CONTROLLERS.iter().map(|c| c.to_string()).collect(),
            kwok: false,
            audit: false,
            ready_timeout: Duration::from_secs(60),
            run_dir: None,
            node_address: None,
            older_api_server: std::env::var(OLDER_API_SERVER_ENV).is_ok_and(|v| v == "1"),
            runtime_config: None,
            disable_admission_plugins: Vec::new(),
        }
    }
}

impl ControlPlaneOptions {
    /// Also write the API server's audit log.
    pub fn with_audit(mut self) -> Self {
        self.audit = true;
        self
    }

    /// Also run kube-controller-manager.
    pub fn with_controller_manager(mut self) -> Self {
        self.controller_manager = true;
        self
    }

    /// A control plane for a real node on `address` ([`Self::node_address`]): with
    /// kube-scheduler and kube-controller-manager running every controller (the root CA
    /// publisher for projected tokens, the ServiceAccount controller, the node lifecycle
    /// controller that lifts the not-ready taint, the PersistentVolume binder).
    pub fn with_real_node(mut self, address: Ipv4Addr) -> Self {
        self.controller_manager = true;
        self.controllers = vec!["*".into()];
        self.node_address = Some(address);
        self
    }

    /// Run the API server (and controller manager and scheduler) of
    /// [`OLDER_KUBERNETES_VERSION`](crate::OLDER_KUBERNETES_VERSION) ([`Self::older_api_server`]).
    pub fn with_older_api_server(mut self) -> Self {
        self.older_api_server = true;
        self
    }

    /// Start kube-apiserver with `--runtime-config=<config>` ([`Self::runtime_config`]).
    pub fn with_runtime_config(mut self, config: &str) -> Self {
        self.runtime_config = Some(config.into());
        self
    }

    /// Serve no ValidatingAdmissionPolicy API, as Kubernetes 1.28/1.29 without their beta API:
    /// the v1 kinds off (`--runtime-config`) and the admission plugin off. With the kinds off
    /// and the plugin on, the plugin's informer never syncs, every write is refused with
    /// "not yet ready to handle request" and the API server exits at its post-start hooks
    /// (seen on v1.32.13).
    pub fn without_validating_admission_policy(mut self) -> Self {
        self.runtime_config = Some(
            "admissionregistration.k8s.io/v1/validatingadmissionpolicies=false,\
             admissionregistration.k8s.io/v1/validatingadmissionpolicybindings=false"
                .into(),
        );
        self.disable_admission_plugins
            .push("ValidatingAdmissionPolicy".into());
        self
    }

    /// Also run kube-controller-manager, kube-scheduler and KWOK, so Deployments roll out to
    /// pods that run: `availableReplicas` counts them and `kubectl rollout status` finishes.
    pub fn with_kwok(mut self) -> Self {
        self.controller_manager = true;
        self.kwok = true;
        self
    }
}

/// How long each component took to become ready.
#[derive(Clone, Copy, Debug, Default)]
pub struct StartupTimes {
    pub etcd: Duration,
    pub kube_apiserver: Duration,
    pub kube_controller_manager: Option<Duration>,
    /// Until `/readyz` answers ok (informers synced).
    pub kube_scheduler: Option<Duration>,
    /// From installing kwok's `Logs` CRD until every fake node is Ready.
    pub kwok: Option<Duration>,
    pub total: Duration,
}

impl fmt::Display for StartupTimes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ready in {:.2} s (etcd {:.2} s, kube-apiserver {:.2} s",
            self.total.as_secs_f64(),
            self.etcd.as_secs_f64(),
            self.kube_apiserver.as_secs_f64()
        )?;
        if let Some(kcm) = self.kube_controller_manager {
            write!(f, ", kube-controller-manager {:.2} s", kcm.as_secs_f64())?;
        }
        if let Some(scheduler) = self.kube_scheduler {
            write!(f, ", kube-scheduler {:.2} s", scheduler.as_secs_f64())?;
        }
        if let Some(kwok) = self.kwok {
            write!(
                f,
                ", kwok with {} nodes Ready {:.2} s",
                kwok::NODES.len(),
                kwok.as_secs_f64()
            )?;
        }
        write!(f, ")")
    }
}
