//! Test support for Scale Agent: a real local Kubernetes control plane (etcd,
//! kube-apiserver, optionally kube-controller-manager, and kube-scheduler with KWOK fake
//! nodes so pods run) built from Go modules by `e2e/control-plane/build.sh`, plus helpers to
//! act as ServiceAccounts under real RBAC, and a real node ([`real_node::RealNode`]: kubelet,
//! kube-proxy, containerd and runc running the images this build makes; needs root).
//!
//! ```no_run
//! # async fn example() -> scale_agent_e2e::Result<()> {
//! use scale_agent_e2e::ControlPlane;
//! let control_plane = ControlPlane::shared()?;
//! let client = control_plane.client().await?;
//! let namespace = control_plane.namespace(&client, "my-test").await?;
//! # Ok(()) }
//! ```

pub mod argocd;
pub mod binaries;
pub mod churn;
pub mod control_plane;
pub mod crds;
pub mod demo;
pub mod error;
pub mod fixtures;
pub mod fleet;
pub mod http;
pub mod hub_replica;
pub mod kubectl;
pub mod kwok;
pub mod local_agent;
pub mod metrics;
pub mod nginx;
pub mod oci;
pub mod operator;
pub mod pki;
pub mod postgres;
pub mod process;
pub mod proxy_stack;
pub mod real_node;
pub mod relay;
pub mod replica_fleet;
pub mod tinyproxy;
pub mod wait;

pub use binaries::{Binaries, KUBERNETES_VERSION, KWOK_VERSION, OLDER_KUBERNETES_VERSION};
pub use control_plane::{
    AuditEvent, ControlPlane, ControlPlaneOptions, OLDER_API_SERVER_ENV, StartupTimes,
};
pub use error::{Error, Result};
pub use kwok::PodLog;

/// This checkout's root (the manifests, the chart, the docs and the scripts the tests read).
pub fn repo_root() -> &'static std::path::Path {
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}
