//! How a control plane is started ([`ControlPlaneOptions`]) and how long its components
//! took to become ready ([`StartupTimes`]).

use std::{fmt, net::Ipv4Addr, path::PathBuf, time::Duration};

use crate::kwok;

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
