//! The agent's RBAC: the ClusterRole or per-namespace Roles of its accounts' rules, the Role
//! that lets it write AgentAccount status, and the Roles that let it impersonate the
//! ServiceAccounts its accounts name.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::{Resource, ResourceExt, api::ObjectMeta};
use scale_agent_crds::{AgentAccount, ScaleAgent, v1alpha1::CredentialsType};

use super::{agent_name, rbac_labels, rbac_name};
use crate::error::{Error, Result};

pub(super) fn subject(agent: &ScaleAgent) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: agent_name(agent),
        namespace: agent.namespace(),
        ..Default::default()
    }
}

pub(super) fn cluster_meta(agent: &ScaleAgent) -> ObjectMeta {
    ObjectMeta {
        name: Some(rbac_name(agent)),
        labels: Some(rbac_labels(agent)),
        ..Default::default()
    }
}

/// ClusterRole and ClusterRoleBinding for `Cluster` scope. Cluster-scoped objects cannot be
/// owned by a namespaced ScaleAgent: the finalizer deletes them.
pub fn cluster_rbac(
    agent: &ScaleAgent,
    rules: Vec<PolicyRule>,
) -> (ClusterRole, ClusterRoleBinding) {
    let role = ClusterRole {
        metadata: cluster_meta(agent),
        rules: Some(rules),
        ..Default::default()
    };
    let binding = ClusterRoleBinding {
        metadata: cluster_meta(agent),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: rbac_name(agent),
        },
        subjects: Some(vec![subject(agent)]),
    };
    (role, binding)
}

/// Role and RoleBinding in `namespace` for `Namespaces` scope. In the ScaleAgent's own
/// namespace they carry an owner reference; elsewhere the finalizer deletes them.
pub fn namespaced_rbac(
    agent: &ScaleAgent,
    namespace: &str,
    rules: Vec<PolicyRule>,
) -> Result<(Role, RoleBinding)> {
    role_and_binding(agent, namespace, rbac_name(agent), rules)
}

/// Name of the Role(Binding) letting the agent write the status of its ScaleAgent and
/// AgentAccounts: `scale-agent:<namespace>:<scaleagent>:status`.
pub fn status_rbac_name(agent: &ScaleAgent) -> String {
    format!("{}:status", rbac_name(agent))
}

/// Role and RoleBinding in the ScaleAgent's namespace granting the agent `patch` on the
/// status of its ScaleAgent and of the accepted AgentAccounts (by name), and nothing else.
pub fn status_rbac(agent: &ScaleAgent, accounts: &[&AgentAccount]) -> Result<(Role, RoleBinding)> {
    let names = accounts
        .iter()
        .filter_map(|a| a.metadata.name.clone())
        .collect();
    let rules = crate::rbac::status_rules(&agent.name_any(), &names);
    let namespace = agent
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace on the ScaleAgent"))?;
    role_and_binding(agent, &namespace, status_rbac_name(agent), rules)
}

/// Name of the Role(Binding) letting the agent impersonate ServiceAccounts of one
/// namespace: `scale-agent:<namespace>:<scaleagent>:impersonate`.
pub fn impersonation_rbac_name(agent: &ScaleAgent) -> String {
    format!("{}:impersonate", rbac_name(agent))
}

/// The ServiceAccounts the accounts of `agent` impersonate that the operator grants: those
/// of accounts using the agent's own ServiceAccount (a kubeconfig's identity is another
/// cluster's business), by namespace.
pub fn impersonated(accounts: &[&AgentAccount]) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_namespace: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for account in accounts {
        if account.spec.credentials.type_ != CredentialsType::ServiceAccount {
            continue;
        }
        if let Some(target) = &account.spec.impersonate_service_account {
            by_namespace
                .entry(target.namespace.clone())
                .or_default()
                .insert(target.name.clone());
        }
    }
    by_namespace
}

/// Role and RoleBinding in `namespace` granting the agent `impersonate` on exactly the
/// ServiceAccounts `names` there (`resourceNames`), and nothing else.
pub fn impersonation_rbac(
    agent: &ScaleAgent,
    namespace: &str,
    names: &BTreeSet<String>,
) -> Result<(Role, RoleBinding)> {
    let rule = PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["serviceaccounts".into()]),
        verbs: vec!["impersonate".into()],
        resource_names: Some(names.iter().cloned().collect()),
        ..Default::default()
    };
    role_and_binding(agent, namespace, impersonation_rbac_name(agent), vec![rule])
}

fn role_and_binding(
    agent: &ScaleAgent,
    namespace: &str,
    name: String,
    rules: Vec<PolicyRule>,
) -> Result<(Role, RoleBinding)> {
    let mut meta = cluster_meta(agent);
    meta.name = Some(name.clone());
    meta.namespace = Some(namespace.to_owned());
    if agent.namespace().as_deref() == Some(namespace) {
        let owner = agent
            .controller_owner_ref(&())
            .ok_or(Error::MissingField("metadata.uid on the ScaleAgent"))?;
        meta.owner_references = Some(vec![owner]);
    }
    let role = Role {
        metadata: meta.clone(),
        rules: Some(rules),
    };
    let binding = RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name,
        },
        subjects: Some(vec![subject(agent)]),
    };
    Ok((role, binding))
}

#[cfg(test)]
mod tests {
    use scale_agent_crds::v1alpha1::ServiceAccountRef;

    use super::*;
    use crate::desired::{
        agent_config,
        tests::{account, agent, kubeconfig_account},
    };

    #[test]
    fn impersonation_is_granted_on_exactly_the_named_service_accounts() {
        let agent = agent("prod");
        let mut deployer = account("deployer", "prod");
        deployer.spec.impersonate_service_account = Some(ServiceAccountRef {
            namespace: "team-a".into(),
            name: "spinnaker".into(),
        });
        let mut remote = kubeconfig_account("remote", "prod", "kc");
        remote.spec.impersonate_service_account = Some(ServiceAccountRef {
            namespace: "team-b".into(),
            name: "spinnaker".into(),
        });
        let plain = account("plain", "prod");
        let wanted = impersonated(&[&deployer, &remote, &plain]);
        assert_eq!(wanted.keys().collect::<Vec<_>>(), ["team-a"], "{wanted:?}");
        let (role, binding) = impersonation_rbac(&agent, "team-a", &wanted["team-a"]).unwrap();
        assert_eq!(
            role.metadata.name.as_deref(),
            Some("scale-agent:ns:prod:impersonate")
        );
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].verbs, ["impersonate"]);
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["serviceaccounts".to_string()][..])
        );
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&["spinnaker".to_string()][..])
        );
        assert_eq!(binding.role_ref.name, "scale-agent:ns:prod:impersonate");
        let config = agent_config(&agent, &[&deployer]);
        assert_eq!(
            config.kubernetes.accounts[0]
                .impersonate_service_account
                .as_ref()
                .map(|sa| sa.username()),
            Some("system:serviceaccount:team-a:spinnaker".to_string())
        );
    }

    #[test]
    fn rbac_in_other_namespaces_has_no_owner() {
        let agent = agent("prod");
        let (own, _) = namespaced_rbac(&agent, "ns", vec![]).unwrap();
        assert!(own.metadata.owner_references.is_some());
        let (other, binding) = namespaced_rbac(&agent, "team-a", vec![]).unwrap();
        assert!(other.metadata.owner_references.is_none());
        assert_eq!(
            binding.subjects.unwrap()[0].namespace.as_deref(),
            Some("ns")
        );
        let (cluster_role, _) = cluster_rbac(&agent, vec![]);
        assert_eq!(
            cluster_role.metadata.name.as_deref(),
            Some("scale-agent:ns:prod")
        );
    }
}
