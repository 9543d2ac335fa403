//! The operator as a process, the sample `ScaleAgent` and `AgentAccount`, and what the
//! operator makes of them (ServiceAccount, RBAC, ConfigMap, certificate Secret, Deployment).

use std::{io::Write, net::SocketAddr, process::Command, time::Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use kube::{Api, Client, api::ListParams};
use scale_agent_crds::{
    ScaleAgent,
    conditions::{CERTIFICATE_READY, is_true},
};

use super::{
    ACCOUNT, NAMESPACE, SCALE_AGENT, System,
    hub::Hub,
    support::{line, run_admin_kubectl, wait_for, wait_ready, write_file},
};
use crate::{
    ControlPlane, binaries::product_binary, error::Result, http::Call, local_agent::free_port,
    process::ManagedProcess,
};

/// The label the operator puts on everything it makes.
pub(super) const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=scale-agent-operator";

/// The agent Deployment the operator made for the sample ScaleAgent.
pub(super) struct AgentDeployment {
    pub name: String,
    pub replicas: i32,
}

/// Starts the operator (as the admin) and waits until it is ready.
pub(super) async fn start(
    control_plane: &ControlPlane,
    system: &mut System,
    out: &mut dyn Write,
) -> Result<()> {
    line(out, "==> Starting the operator".into());
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let mut command = Command::new(product_binary("e2e-operator")?);
    command
        .arg(format!("--metrics-address={metrics}"))
        .arg("--retry-max-seconds=10")
        // The admin kubeconfig's namespace is not the demo's: say which one to reconcile.
        .arg(format!("--watch-namespaces={NAMESPACE}"))
        // The demo's ScaleAgent uses the operator-signed mode (its hub trusts agent-ca).
        .arg("--allow-operator-signed-certificates")
        .env("KUBECONFIG", control_plane.kubeconfig_path())
        .env("RUST_LOG", "info");
    let operator = system.operator.insert(ManagedProcess::spawn_command(
        "scale-agent-operator",
        command,
        control_plane.run_dir().join("operator.log"),
    )?);
    wait_ready(
        operator,
        Call::new("GET", format!("http://{metrics}/readyz")),
    )
    .await?;
    line(
        out,
        format!("    scale-agent-operator     pid {}", operator.pid()),
    );
    line(
        out,
        "    it runs as the admin (KUBECONFIG=admin.kubeconfig), so its own RBAC from manifests/operator is not applied here".into(),
    );
    line(out, format!("    metrics: http://{metrics}/metrics"));
    Ok(())
}

/// Applies the sample resources with the admin's kubectl, waits for the operator to
/// reconcile them and for the agent Deployment's (fake) pods to be Ready, and shows the
/// result.
pub(super) async fn apply_sample(
    control_plane: &ControlPlane,
    client: &Client,
    hub: &Hub,
    out: &mut dyn Write,
) -> Result<AgentDeployment> {
    let sample = control_plane.run_dir().join("sample.yaml");
    write_file(&sample, &sample_yaml(hub.grpc_addr.port()))?;
    line(
        out,
        format!(
            "==> Applying a sample ScaleAgent ({SCALE_AGENT}, mode Agent, access Deploy, 2 replicas, hub localhost:{}) and AgentAccount ({ACCOUNT}) from {}",
            hub.grpc_addr.port(),
            sample.display()
        ),
    );
    line(
        out,
        "    access: Deploy, not the default ReadOnly: the agent's RBAC then also allows create, update, patch and delete, which the deployments through the hub below need".into(),
    );
    run_admin_kubectl(
        control_plane,
        out,
        &["apply", "--server-side", "-f", &sample.to_string_lossy()],
    )?;

    let deployment = wait_for_operator(client, out).await?;
    run_admin_kubectl(
        control_plane,
        out,
        &["get", "scaleagents,agentaccounts", "-n", NAMESPACE],
    )?;
    line(
        out,
        format!(
            "    (READY {}: KWOK reports the Deployment's pods Running and Ready on its fake nodes, but no container runs; the agents run as local processes below)",
            deployment.replicas
        ),
    );
    run_admin_kubectl(
        control_plane,
        out,
        &[
            "get",
            "sa,cm,secret,deploy,rs",
            "-n",
            NAMESPACE,
            "-l",
            MANAGED_BY_SELECTOR,
        ],
    )?;
    Ok(deployment)
}

/// Waits until the operator has reconciled the sample (status, certificate, ReplicaSet) and
/// the agent Deployment's KWOK pods are Ready, so READY says the same on every run.
async fn wait_for_operator(client: &Client, out: &mut dyn Write) -> Result<AgentDeployment> {
    line(
        out,
        "==> Waiting for the operator: ServiceAccount, RBAC, ConfigMap, certificate Secret, Deployment".into(),
    );
    let started = Instant::now();
    let name = format!("{SCALE_AGENT}-agent");
    let agents = Api::<ScaleAgent>::namespaced(client.clone(), NAMESPACE);
    let replicas = wait_for("the operator's objects", || async {
        let agent = agents.get(SCALE_AGENT).await?;
        let status_ok = agent
            .status
            .as_ref()
            .is_some_and(|s| s.accounts == 1 && is_true(&s.conditions, CERTIFICATE_READY));
        let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), NAMESPACE)
            .list(&ListParams::default().labels(MANAGED_BY_SELECTOR))
            .await?;
        let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
            .get_opt(&name)
            .await?;
        Ok((status_ok && !replica_sets.items.is_empty())
            .then_some(deployment.and_then(|d| d.spec.replicas))
            .flatten())
    })
    .await?;
    line(
        out,
        format!("    reconciled in {:.1} s", started.elapsed().as_secs_f64()),
    );
    wait_for("the agent Deployment's pods to be Ready (KWOK)", || async {
        let agent = agents.get(SCALE_AGENT).await?;
        Ok(agent
            .status
            .is_some_and(|s| s.ready_replicas == replicas)
            .then_some(()))
    })
    .await?;
    Ok(AgentDeployment { name, replicas })
}

/// The sample ScaleAgent and AgentAccount, pointing at the local hub.
fn sample_yaml(hub_port: u16) -> String {
    format!(
        "# The demo's ScaleAgent: two agent replicas streaming the whole cluster to the local hub.
apiVersion: scaleagent.dev/v1alpha1
kind: ScaleAgent
metadata:
  name: {SCALE_AGENT}
  namespace: {NAMESPACE}
spec:
  mode: Agent
  hub:
    address: localhost:{hub_port}
    tls:
      caSecretRef:
        name: hub-ca
  clientCertificate:
    issuerSecretRef:
      name: agent-ca
  replicas: 2
  # Deploy (not the default ReadOnly): the agent may also write, for operations through the hub.
  access: Deploy
  scope:
    type: Cluster
  defaults:
    kinds: [Namespace, Deployment, ReplicaSet, Pod, ConfigMap, Service]
---
apiVersion: scaleagent.dev/v1alpha1
kind: AgentAccount
metadata:
  name: {ACCOUNT}
  namespace: {NAMESPACE}
spec:
  agentRef: {SCALE_AGENT}
  permissions:
    read: [everyone]
"
    )
}
