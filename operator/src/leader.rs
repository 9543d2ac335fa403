//! Leader election through a `coordination.k8s.io` Lease (crate `kube-lease-manager`), so
//! several operator replicas can run and only the one holding the Lease reconciles: the
//! others stand by and take over once the holder stops renewing it (killed, or partitioned)
//! and the Lease expires. The leader stops its controllers as soon as it learns it lost the
//! Lease, so two replicas never write at once for longer than the renewal margin (`grace`).

use std::{sync::Arc, time::Duration};

use futures::FutureExt;
use k8s_openapi::api::{apps::v1::Deployment, coordination::v1::Lease};
use kube::api::{Patch, PatchParams};
use kube_lease_manager::LeaseManagerBuilder;

use crate::{Config, Error, Metrics, Result, run_controllers};

/// Where the Lease is and how long it lasts.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Namespace of the Lease (the operator's own).
    pub namespace: String,
    /// Name of the Lease.
    pub lease: String,
    /// The operator's Deployment, made the Lease's owner (see [`give_lease_to_deployment`]).
    pub owner_deployment: Option<String>,
    /// This replica's name in `holderIdentity` (its pod name).
    pub identity: String,
    /// How long the Lease holds without renewal: a standby takes over at most this long
    /// after the leader stopped renewing.
    pub duration: Duration,
    /// The leader renews this long before the Lease would expire.
    pub grace: Duration,
}

/// Default Lease name.
pub const DEFAULT_LEASE: &str = "scale-agent-operator";

/// Runs the controllers whenever this replica holds the Lease, until `shutdown` completes.
/// The Lease is released on shutdown, so a standby takes over at once after a clean stop.
pub async fn run_when_leading(
    client: kube::Client,
    config: Config,
    metrics: Arc<Metrics>,
    election: LeaderElection,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let shutdown = shutdown.shared();
    let lease_error = |e: kube_lease_manager::LeaseManagerError| {
        Error::LeaderElection(format!(
            "Lease {}/{}: {e}; the operator needs get, create, update and patch on \
             coordination.k8s.io leases in namespace {} (manifests/operator/rbac.yaml)",
            election.namespace, election.lease, election.namespace
        ))
    };
    let manager = LeaseManagerBuilder::new(client.clone(), &election.lease)
        .with_namespace(&election.namespace)
        .with_identity(&election.identity)
        .with_duration(election.duration.as_secs().max(1))
        .with_grace(election.grace.as_secs().max(1))
        .with_field_manager(scale_agent_crds::FIELD_MANAGER)
        .build()
        .await
        .map_err(lease_error)?;
    if let Some(deployment) = &election.owner_deployment {
        // Not fatal: leader election works without it; only the clean-up on removal is lost.
        match give_lease_to_deployment(&client, &election, deployment).await {
            Ok(()) => {
                tracing::info!(lease = %election.lease, %deployment, "the Lease is owned by the operator's Deployment")
            }
            Err(error) => {
                tracing::warn!(%error, "the Lease stays behind when the operator is removed")
            }
        }
    }
    let (leading, lease_task) = manager.watch().await;
    tracing::info!(lease = %election.lease, namespace = %election.namespace, identity = %election.identity, "standing by until this replica holds the Lease");
    metrics.set_standby(true);
    let result = async {
        loop {
            let mut wait = leading.clone();
            tokio::select! {
                () = shutdown.clone() => return Ok(()),
                became = wait.wait_for(|l| *l) => {
                    if became.is_err() {
                        return Err(Error::LeaderElection(format!(
                            "Lease {}/{}: the lease manager stopped",
                            election.namespace, election.lease
                        )));
                    }
                }
            }
            tracing::info!(identity = %election.identity, "this replica holds the Lease: starting the controllers");
            metrics.set_standby(false);
            // The controllers stop on shutdown or when the Lease is lost (told through a
            // oneshot: the controllers need a `Sync` future).
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let mut lost = leading.clone();
            let stopping = shutdown.clone();
            let watcher = tokio::spawn(async move {
                tokio::select! {
                    () = stopping => {}
                    _ = lost.wait_for(|l| !*l) => {}
                }
                let _ = stop_tx.send(());
            });
            let stop = async move {
                let _ = stop_rx.await;
            };
            let ran = run_controllers(client.clone(), config.clone(), metrics.clone(), stop).await;
            watcher.abort();
            ran?;
            if shutdown.clone().now_or_never().is_some() {
                return Ok(());
            }
            tracing::warn!(identity = %election.identity, "this replica lost the Lease: controllers stopped; standing by");
            metrics.set_standby(true);
        }
    }
    .await;
    metrics.set_standby(false);
    // Closing the channel makes the lease task release the Lease.
    drop(leading);
    match lease_task.await {
        Ok(Ok(_)) => tracing::info!(lease = %election.lease, "Lease released"),
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot release the Lease; it expires on its own"),
        Err(e) => tracing::warn!(error = %e, "the lease task failed"),
    }
    result
}

/// Makes the operator's Deployment the owner of the Lease the lease manager has just made
/// (it makes the Lease itself at run time), so the garbage collector deletes the Lease with
/// the Deployment: `helm uninstall` and `kubectl delete -k manifests/operator` leave no Lease.
///
/// Why an owner and neither of the alternatives:
/// - deleting the Lease on shutdown would strand a standby: the lease manager creates the
///   Lease only when it starts, so a standby whose Lease vanished (the leader stopped by a
///   rolling update or a node drain) retries the missing Lease forever and never leads;
/// - a Lease in the chart would be Helm's object: `helm upgrade` from a release whose
///   operator had already made the Lease fails on adoption (the object lacks Helm's
///   ownership metadata), and every upgrade would reset the holder the replicas write.
///
/// The owner reference has no `blockOwnerDeletion`, so the operator needs no permission on
/// the Deployment's finalizers: `get` on the Deployment and `patch` on the Lease.
async fn give_lease_to_deployment(
    client: &kube::Client,
    election: &LeaderElection,
    deployment: &str,
) -> Result<()> {
    let namespace = &election.namespace;
    let owner = kube::Api::<Deployment>::namespaced(client.clone(), namespace)
        .get(deployment)
        .await
        .map_err(|e| {
            Error::LeaderElection(format!(
                "cannot read the operator's Deployment {namespace}/{deployment} to own the Lease \
                 {namespace}/{}: {e}; the operator needs get on apps deployments {deployment} in \
                 namespace {namespace} (manifests/operator/rbac.yaml), or \
                 --leader-election-owner-deployment must name its Deployment",
                election.lease
            ))
        })?;
    let uid = owner.metadata.uid.ok_or_else(|| {
        Error::LeaderElection(format!(
            "the Deployment {namespace}/{deployment} has no uid"
        ))
    })?;
    let patch = serde_json::json!({
        "metadata": {
            "ownerReferences": [{
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": deployment,
                "uid": uid,
            }]
        }
    });
    kube::Api::<Lease>::namespaced(client.clone(), namespace)
        .patch(
            &election.lease,
            &PatchParams {
                field_manager: Some(scale_agent_crds::FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            },
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| {
            Error::LeaderElection(format!(
                "cannot make the Deployment {deployment} the owner of the Lease \
                 {namespace}/{}: {e}; the operator needs patch on coordination.k8s.io leases \
                 in namespace {namespace}",
                election.lease
            ))
        })?;
    Ok(())
}
