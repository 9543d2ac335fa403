//! Scale Agent operator: kube-runtime controllers that turn `ScaleAgent` and `AgentAccount`
//! resources (crate `scale-agent-crds`) into the agent's ServiceAccount, RBAC, config
//! ConfigMap, mTLS client certificate Secret and Deployment, with status conditions and
//! Events.
//!
//! The reconcile is a pipeline: dereference (accounts, issuer CA, current certificate) →
//! validate ([`validate`]) → build the desired objects without a client ([`desired`],
//! [`rbac`], [`pki`]) → apply only what changed ([`apply`]) → status ([`status`]).
//! [`run_controllers`] runs both controllers in-process, so tests can start and restart the
//! operator.

pub mod apply;
pub mod cli;
pub mod controller;
pub mod desired;
pub mod enrol;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod pki;
pub mod policy;
pub mod rbac;
pub mod status;
pub mod validate;

use std::{net::SocketAddr, sync::Arc};

pub use controller::{Config, Context, run_controllers};
pub use error::{Error, Result};
use futures::FutureExt;
pub use metrics::Metrics;

/// Runs the controllers (only while holding the Lease, with `election`), and the
/// metrics/health listener when `metrics_address` is set, until `shutdown` completes or
/// either fails: a failure of one ends the other, so the process exits with the error
/// instead of serving health for controllers that are gone.
pub async fn run(
    client: kube::Client,
    config: Config,
    election: Option<leader::LeaderElection>,
    metrics_address: Option<SocketAddr>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let metrics = Arc::new(Metrics::new());
    let shutdown = shutdown.shared();
    let controllers = match election {
        Some(election) => {
            leader::run_when_leading(client, config, metrics.clone(), election, shutdown.clone())
                .boxed()
        }
        None => run_controllers(client, config, metrics.clone(), shutdown.clone()).boxed(),
    };
    match metrics_address {
        Some(address) => {
            let server = metrics::serve(address, metrics, shutdown);
            futures::try_join!(controllers, server).map(|((), ())| ())
        }
        None => controllers.await,
    }
}
