//! The agent Deployment's pods, run as local processes: KWOK only fakes the pods' status, so
//! [`LocalAgent`] does what a kubelet would (mounts, ServiceAccount token, args, env) and
//! runs the real agent binary.

use std::io::Write;

use kube::Client;

use super::{NAMESPACE, System, WAIT, operator::AgentDeployment, support::line};
use crate::{
    ControlPlane,
    error::Result,
    local_agent::{LocalAgent, LocalAgentOptions},
};

/// Starts one local agent per replica of `deployment` and waits until all are connected to
/// the hub.
pub(super) async fn start(
    control_plane: &ControlPlane,
    client: &Client,
    deployment: &AgentDeployment,
    system: &mut System,
    out: &mut dyn Write,
) -> Result<()> {
    let AgentDeployment { name, replicas } = deployment;
    line(
        out,
        format!(
            "==> Starting the {replicas} agent pod(s) of Deployment {name} as local processes (KWOK runs no containers: the ConfigMap, the certificate Secret and a TokenRequest token for ServiceAccount {name} are written where the pod would mount them)"
        ),
    );
    for replica in 0..usize::try_from(*replicas).unwrap_or(1) {
        let pod_dir = control_plane
            .run_dir()
            .join("agents")
            .join(format!("{name}-local-{replica}"));
        let mut options = LocalAgentOptions::new(NAMESPACE, name, pod_dir).replica(replica);
        options.env.push(("RUST_LOG".into(), "info".into()));
        let agent = LocalAgent::start(control_plane, client, options).await?;
        line(
            out,
            format!(
                "    {:<24} pid {}   admin {}   log {}",
                agent.pod_name(),
                agent.pid(),
                agent.admin_url(),
                agent.log().display()
            ),
        );
        system.agents.push(agent);
    }
    for agent in &mut system.agents {
        agent.wait_ready(WAIT).await?;
    }
    line(out, "    ready: connected to the hub".into());
    Ok(())
}
