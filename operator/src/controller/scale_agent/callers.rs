//! Applies the operator's grant for `callers: impersonate` ([`desired::callers`]): the
//! ClusterRole and ClusterRoleBinding letting the agent impersonate exactly the people its
//! accounts admit, or their removal when no account admits anyone (or the agent is not in
//! `Agent` mode: a kubeconfig's identity is another cluster's business).

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::{Api, Client};
use scale_agent_crds::{AgentAccount, ScaleAgent};

use super::{delete_existing, grants};
use crate::{desired, error::Result, status::Problem};

pub(super) async fn reconcile(
    agent: &ScaleAgent,
    client: &Client,
    agent_mode: bool,
    accepted: &[&AgentAccount],
    applied: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) -> Result<()> {
    let cluster_roles = Api::<ClusterRole>::all(client.clone());
    let cluster_bindings = Api::<ClusterRoleBinding>::all(client.clone());
    let name = desired::callers::callers_rbac_name(agent);
    let admitted = if agent_mode {
        desired::callers::admitted(accepted)
    } else {
        Default::default()
    };
    match desired::callers::callers_rbac(agent, &admitted) {
        Some(rbac) => {
            grants::apply_cluster(
                agent,
                client,
                rbac,
                "an account's callers: impersonate",
                applied,
                problems,
            )
            .await?;
        }
        None => {
            delete_existing(&cluster_bindings, &name).await?;
            delete_existing(&cluster_roles, &name).await?;
        }
    }
    Ok(())
}
