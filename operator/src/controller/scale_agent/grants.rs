//! Applying the agent's RBAC under the operator's own. The API server refuses a Role or
//! ClusterRole whose rules the operator does not hold unless it may `escalate` it, and a
//! binding to it unless it may `bind` it; the shipped RBAC gives the operator those only in
//! the namespaces it was bound in (`scale-agent-operator-grants`) and on the ClusterRoles of
//! the ScaleAgents listed by name (`scale-agent-operator-cluster-grants`, Helm
//! `operator.clusterGrants`). A refusal is the ScaleAgent's problem, said in its status with
//! the way out, not a reconcile error retried blindly.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::{Api, Client, ResourceExt};
use scale_agent_crds::ScaleAgent;

use super::note;
use crate::{
    apply::apply,
    error::{Chain, Error, Result, is_forbidden, is_not_found},
    status::Problem,
};

/// What became of a Role and its binding in one namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum InNamespace {
    Applied,
    NamespaceNotFound,
    /// The operator may not grant there: a problem was reported.
    Forbidden,
}

/// Applies a ClusterRole and then its ClusterRoleBinding; `why` says what asks for them
/// (the scope, callers). When the operator may not grant them, reports
/// `ClusterGrantNotAllowed` and applies nothing more.
pub(super) async fn apply_cluster(
    agent: &ScaleAgent,
    client: &Client,
    (role, binding): (ClusterRole, ClusterRoleBinding),
    why: &str,
    applied: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) -> Result<()> {
    let name = role.name_any();
    let outcome = match apply(&Api::<ClusterRole>::all(client.clone()), &role).await {
        Ok((_, outcome)) => outcome,
        Err(error) => return refused(error, || cluster_refusal(agent, &name, why), problems),
    };
    note(applied, outcome, "ClusterRole");
    match apply(&Api::<ClusterRoleBinding>::all(client.clone()), &binding).await {
        Ok((_, outcome)) => note(applied, outcome, "ClusterRoleBinding"),
        Err(error) => return refused(error, || cluster_refusal(agent, &name, why), problems),
    }
    Ok(())
}

/// Applies a Role and then its RoleBinding in `namespace`.
pub(super) async fn apply_in_namespace(
    client: &Client,
    namespace: &str,
    (role, binding): (Role, RoleBinding),
    applied: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) -> Result<InNamespace> {
    let name = role.name_any();
    let roles = Api::<Role>::namespaced(client.clone(), namespace);
    match apply(&roles, &role).await {
        Ok((_, outcome)) => note(applied, outcome, "Role"),
        Err(Error::Kube { source, .. }) if is_not_found(&source) => {
            return Ok(InNamespace::NamespaceNotFound);
        }
        Err(error) => {
            refused(error, || namespace_refusal(&name, namespace), problems)?;
            return Ok(InNamespace::Forbidden);
        }
    }
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), namespace);
    match apply(&bindings, &binding).await {
        Ok((_, outcome)) => note(applied, outcome, "RoleBinding"),
        Err(error) => {
            refused(error, || namespace_refusal(&name, namespace), problems)?;
            return Ok(InNamespace::Forbidden);
        }
    }
    Ok(InNamespace::Applied)
}

/// A 403 becomes `problem`; any other error stays the reconcile's.
fn refused(
    error: Error,
    problem: impl FnOnce() -> Problem,
    problems: &mut Vec<Problem>,
) -> Result<()> {
    match &error {
        Error::Kube { source, .. } if is_forbidden(source) => {
            // The API server's text lists every rule the operator lacks: the log has it, the
            // status says what to do.
            tracing::warn!(error = %Chain(&error), "the operator may not grant this");
            problems.push(problem());
            Ok(())
        }
        _ => Err(error),
    }
}

fn cluster_refusal(agent: &ScaleAgent, name: &str, why: &str) -> Problem {
    let namespace = agent.namespace().unwrap_or_default();
    let agent_name = agent.name_any();
    Problem {
        // troubleshooting: ScaleAgent `Degraded=True`, reason `ClusterGrantNotAllowed`
        // The ScaleAgent needs a ClusterRole (`spec.scope.type: Cluster`, the default, or an
        // account with `callers: impersonate`), and the operator may escalate and bind only the
        // ClusterRoles of the ScaleAgents a cluster administrator listed (Helm:
        // `operator.clusterGrants`). Have it listed, or use `scope.type: Namespaces`.
        reason: "ClusterGrantNotAllowed",
        message: format!(
            "the operator may not grant ClusterRole {name} ({why}): it escalates and binds only \
             the ClusterRoles of the ScaleAgents a cluster administrator listed. Ask one to add \
             {namespace}/{agent_name} to the operator's cluster grants (Helm: \
             operator.clusterGrants; raw manifests: the resourceNames of ClusterRole \
             scale-agent-operator-cluster-grants), or use spec.scope.type Namespaces"
        ),
    }
}

fn namespace_refusal(name: &str, namespace: &str) -> Problem {
    Problem {
        // troubleshooting: ScaleAgent `Degraded=True`, reason `NamespaceGrantNotAllowed`
        // The operator's allow list lets it give the agent a Role in this namespace, but its own
        // RBAC does not: ClusterRole `scale-agent-operator-grants` is not bound there. Helm binds
        // it in the watched, grantable and impersonable namespaces; with the raw manifests, bind
        // it as manifests/operator/rbac.yaml says.
        reason: "NamespaceGrantNotAllowed",
        message: format!(
            "the operator may not grant Role {name} in namespace {namespace}: ClusterRole \
             scale-agent-operator-grants is not bound to it there. Ask a cluster administrator \
             to bind it (kubectl -n {namespace} create rolebinding scale-agent-operator-grants \
             --clusterrole=scale-agent-operator-grants --serviceaccount=<operator namespace>:\
             scale-agent-operator; Helm does it for operator.grantableNamespaces)"
        ),
    }
}
