//! Checks on AgentAccounts that CEL rules cannot do, shared by both controllers so the
//! agent's config and the account's status always agree. Pure.

use std::cmp::Ordering;

use k8s_openapi::api::core::v1::Secret;
use kube::{Resource, ResourceExt};

use crate::policy::Grants;
use scale_agent_crds::{
    AgentAccount, ScaleAgent,
    v1alpha1::{CredentialsType, Mode, is_dns1123_label},
};

/// Why an account is not accepted: a condition reason and a message that says what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// `PascalCase` reason for the `Accepted=False` condition.
    pub reason: &'static str,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Whether `account`'s agent reference names `agent`.
pub fn refers_to(account: &AgentAccount, agent: &ScaleAgent) -> bool {
    account.namespace() == agent.namespace() && account.spec.agent_ref == agent.name_any()
}

/// The account that holds `account`'s name first, if another one does: among accounts (in
/// every namespace the operator sees) with the same Spinnaker account name, the oldest wins,
/// then the first by namespace and name.
pub fn duplicate_of<'a>(
    account: &AgentAccount,
    all: &'a [AgentAccount],
) -> Option<&'a AgentAccount> {
    let name = account.account_name()?;
    all.iter()
        .filter(|other| other.meta().deletion_timestamp.is_none())
        .filter(|other| !same_object(account, other))
        .filter(|other| other.account_name() == Some(name))
        .find(|other| precedence(other, account) == Ordering::Less)
}

fn same_object(a: &AgentAccount, b: &AgentAccount) -> bool {
    a.namespace() == b.namespace() && a.name_any() == b.name_any()
}

fn precedence(a: &AgentAccount, b: &AgentAccount) -> Ordering {
    let key = |x: &AgentAccount| {
        (
            x.meta().creation_timestamp.clone(),
            x.namespace(),
            x.name_any(),
        )
    };
    key(a).cmp(&key(b))
}

/// Checks one account. `agent` is the ScaleAgent it names (if it exists), `all` every
/// AgentAccount the operator sees, `kubeconfig` the Secret its credentials name (if any and
/// if it exists), `grants` whom the operator lets agents impersonate.
pub fn check(
    account: &AgentAccount,
    agent: Option<&ScaleAgent>,
    all: &[AgentAccount],
    kubeconfig: Option<&Secret>,
    grants: &Grants,
) -> Result<(), Rejection> {
    let namespace = account.namespace().unwrap_or_default();
    let Some(agent) = agent.filter(|a| a.meta().deletion_timestamp.is_none()) else {
        return Err(Rejection {
            // troubleshooting: AgentAccount `Accepted=False`
            // The account names a ScaleAgent (`spec.agentRef`) that does not exist in its
            // namespace, or is being deleted. Nothing is rendered for the account until it does.
            reason: "AgentNotFound",
            message: format!(
                "ScaleAgent {} not found in namespace {namespace}: create it, or set \
                 spec.agentRef to the name of a ScaleAgent in this namespace",
                account.spec.agent_ref
            ),
        });
    };
    let Some(name) = account.account_name().filter(|n| is_dns1123_label(n)) else {
        return Err(Rejection {
            // troubleshooting: AgentAccount `Accepted=False`
            // The Spinnaker account name (`spec.accountName`, else the object's name) must be a
            // lowercase DNS label, as Spinnaker and the hub's `/clusters/<account>` paths need.
            reason: "InvalidAccountName",
            message: "the account name must be a lowercase DNS label: set spec.accountName, \
                      e.g. prod-eu-west-1"
                .into(),
        });
    };
    if let Some(other) = duplicate_of(account, all) {
        return Err(Rejection {
            // troubleshooting: AgentAccount `Accepted=False`
            // Account names are unique across the cluster (the hub binds each name to one cluster).
            // The older AgentAccount keeps the name.
            reason: "DuplicateAccountName",
            message: format!(
                "account name {name} is already used by AgentAccount {}/{}: set \
                 spec.accountName to a name unique across the cluster",
                other.namespace().unwrap_or_default(),
                other.name_any()
            ),
        });
    }
    let mode = agent.spec.mode;
    match (mode, account.spec.credentials.type_) {
        // troubleshooting: AgentAccount `Accepted=False`
        // A mode `Agent` ScaleAgent reaches its own cluster with its ServiceAccount; kubeconfig
        // credentials belong to `Infrastructure` and `SpinnakerService` agents.
        (Mode::Agent, CredentialsType::Kubeconfig) => {
            return Err(Rejection {
                reason: "CredentialsModeMismatch",
                message: format!(
                    "credentials.type is Kubeconfig but ScaleAgent {} runs in mode Agent, which \
                     uses its own ServiceAccount: set credentials.type to ServiceAccount, or \
                     point spec.agentRef at a ScaleAgent in mode Infrastructure or \
                     SpinnakerService",
                    agent.name_any()
                ),
            });
        }
        // troubleshooting: AgentAccount `Accepted=False`
        // An `Infrastructure` or `SpinnakerService` agent reaches other clusters through kubeconfig
        // Secrets, so each of its accounts needs one.
        (Mode::Infrastructure | Mode::SpinnakerService, CredentialsType::ServiceAccount) => {
            return Err(Rejection {
                reason: "CredentialsModeMismatch",
                message: format!(
                    "credentials.type is ServiceAccount but ScaleAgent {} runs in mode {mode:?}, \
                     which reaches clusters through kubeconfigs: set credentials.type to \
                     Kubeconfig with credentials.kubeconfigSecretRef",
                    agent.name_any()
                ),
            });
        }
        _ => {}
    }
    if let Some(rejection) = outside_scope(account, agent) {
        return Err(rejection);
    }
    // Only the agent's own ServiceAccount is granted `impersonate` by the operator; a
    // kubeconfig's identity (often another cluster's) must hold it already.
    if let Some(target) = &account.spec.impersonate_service_account
        && account.spec.credentials.type_ == CredentialsType::ServiceAccount
        && !grants.impersonable(&namespace, &target.namespace, &target.name)
    {
        return Err(Rejection {
            reason: "ImpersonationNotAllowed",
            message: grants.impersonation_refusal(&namespace, &target.namespace, &target.name),
        });
    }
    if let Some(secret_ref) = &account.spec.credentials.kubeconfig_secret_ref {
        let Some(secret) = kubeconfig else {
            return Err(Rejection {
                // troubleshooting: AgentAccount `Accepted=False`
                // The kubeconfig Secret the account names (`spec.credentials.kubeconfigSecretRef`)
                // is not in the account's namespace.
                reason: "KubeconfigSecretNotFound",
                message: format!(
                    "Secret {} not found in namespace {namespace}: create it with the kubeconfig \
                     under key {}",
                    secret_ref.name, secret_ref.key
                ),
            });
        };
        let has_key = secret
            .data
            .as_ref()
            .is_some_and(|d| d.contains_key(&secret_ref.key))
            || secret
                .string_data
                .as_ref()
                .is_some_and(|d| d.contains_key(&secret_ref.key));
        if !has_key {
            return Err(Rejection {
                // troubleshooting: AgentAccount `Accepted=False`
                // The kubeconfig Secret exists but holds no entry under the key the account names.
                reason: "KubeconfigKeyMissing",
                message: format!(
                    "Secret {} in namespace {namespace} has no key {}: add the kubeconfig under \
                     that key, or set credentials.kubeconfigSecretRef.key",
                    secret_ref.name, secret_ref.key
                ),
            });
        }
    }
    Ok(())
}

/// An account of an agent with `scope.type: Namespaces` (mode Agent) that names namespaces
/// outside the scope: the agent has no rights there, so its watches and operations there
/// would only ever be refused.
fn outside_scope(account: &AgentAccount, agent: &ScaleAgent) -> Option<Rejection> {
    let scope = &agent.spec.scope;
    if agent.spec.mode != Mode::Agent || scope.is_cluster() {
        return None;
    }
    let outside: Vec<&str> = account
        .spec
        .namespaces
        .iter()
        .filter(|n| !scope.namespaces.contains(n))
        .map(String::as_str)
        .collect();
    (!outside.is_empty()).then(|| Rejection {
        // troubleshooting: AgentAccount `Accepted=False`
        // The account's namespaces must lie within its ScaleAgent's `spec.scope.namespaces`: the
        // operator grants the agent Roles there only, so a watch elsewhere would only be refused.
        reason: "NamespaceOutOfScope",
        message: format!(
            "spec.namespaces names {} outside ScaleAgent {}'s spec.scope.namespaces [{}], where \
             the agent has no rights: remove them from spec.namespaces, or add them to the \
             ScaleAgent's spec.scope.namespaces",
            outside.join(", "),
            agent.name_any(),
            scope.namespaces.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::{account, agent, kubeconfig_account};
    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn created_at(mut a: AgentAccount, seconds: i64) -> AgentAccount {
        a.metadata.creation_timestamp = Some(Time(Timestamp::from_second(seconds).unwrap()));
        a
    }

    #[test]
    fn accepts_a_plain_account() {
        let agent = agent("prod");
        let a = account("web", "prod");
        assert_eq!(
            check(
                &a,
                Some(&agent),
                std::slice::from_ref(&a),
                None,
                &Grants::default()
            ),
            Ok(())
        );
    }

    #[test]
    fn rejects_unknown_agents_and_mode_mismatches() {
        let a = account("web", "prod");
        let err = check(&a, None, &[], None, &Grants::default()).unwrap_err();
        assert_eq!(err.reason, "AgentNotFound");
        assert!(
            err.message
                .contains("ScaleAgent prod not found in namespace ns"),
            "{}",
            err.message
        );

        let kc = kubeconfig_account("remote", "prod", "remote-kc");
        let err = check(&kc, Some(&agent("prod")), &[], None, &Grants::default()).unwrap_err();
        assert_eq!(err.reason, "CredentialsModeMismatch");

        let mut infra = agent("prod");
        infra.spec.mode = Mode::Infrastructure;
        assert_eq!(
            check(&a, Some(&infra), &[], None, &Grants::default())
                .unwrap_err()
                .reason,
            "CredentialsModeMismatch"
        );
        let err = check(&kc, Some(&infra), &[], None, &Grants::default()).unwrap_err();
        assert_eq!(err.reason, "KubeconfigSecretNotFound");
        assert!(
            err.message.contains("Secret remote-kc not found"),
            "{}",
            err.message
        );
        let mut secret = Secret::default();
        assert_eq!(
            check(&kc, Some(&infra), &[], Some(&secret), &Grants::default())
                .unwrap_err()
                .reason,
            "KubeconfigKeyMissing"
        );
        secret.data = Some([("kubeconfig".to_string(), ByteString(b"x".to_vec()))].into());
        assert_eq!(
            check(&kc, Some(&infra), &[], Some(&secret), &Grants::default()),
            Ok(())
        );
    }

    #[test]
    fn namespaces_outside_the_scope_are_rejected_with_what_to_change() {
        let mut scoped = agent("prod");
        scoped.spec.scope = serde_json::from_value(
            serde_json::json!({"type": "Namespaces", "namespaces": ["team-a", "team-b"]}),
        )
        .unwrap();
        let mut a = account("web", "prod");
        a.spec.namespaces = vec!["team-a".into()];
        assert_eq!(
            check(&a, Some(&scoped), &[], None, &Grants::default()),
            Ok(())
        );
        a.spec.namespaces = vec!["team-a".into(), "team-c".into()];
        let err = check(&a, Some(&scoped), &[], None, &Grants::default()).unwrap_err();
        assert_eq!(err.reason, "NamespaceOutOfScope");
        assert!(
            err.message.contains(
                "spec.namespaces names team-c outside ScaleAgent prod's \
                 spec.scope.namespaces [team-a, team-b]"
            ) && err.message.contains(
                "remove them from spec.namespaces, or add them to the ScaleAgent's \
                 spec.scope.namespaces"
            ),
            "{}",
            err.message
        );
        // Cluster scope reaches every namespace.
        assert_eq!(
            check(&a, Some(&agent("prod")), &[], None, &Grants::default()),
            Ok(())
        );
    }

    #[test]
    fn the_oldest_account_keeps_a_duplicate_name() {
        let agent = agent("prod");
        let first = created_at(account("web", "prod"), 100);
        let mut second = created_at(account("web-2", "prod"), 200);
        second.spec.account_name = Some("web".into());
        let all = vec![first.clone(), second.clone()];
        assert_eq!(
            check(&first, Some(&agent), &all, None, &Grants::default()),
            Ok(())
        );
        let err = check(&second, Some(&agent), &all, None, &Grants::default()).unwrap_err();
        assert_eq!(err.reason, "DuplicateAccountName");
        assert!(
            err.message.contains("already used by AgentAccount ns/web"),
            "{}",
            err.message
        );
    }

    #[test]
    fn impersonating_outside_the_own_namespace_needs_the_operator_allow_list() {
        let agent = agent("prod");
        let mut a = account("web", "prod");
        a.spec.impersonate_service_account = Some(
            serde_json::from_value(serde_json::json!({"namespace": "ns", "name": "deployer"}))
                .unwrap(),
        );
        assert_eq!(
            check(&a, Some(&agent), &[], None, &Grants::default()),
            Ok(())
        );
        a.spec.impersonate_service_account = Some(
            serde_json::from_value(
                serde_json::json!({"namespace": "kube-system", "name": "replicaset-controller"}),
            )
            .unwrap(),
        );
        let err = check(&a, Some(&agent), &[], None, &Grants::default()).unwrap_err();
        assert_eq!(err.reason, "ImpersonationNotAllowed");
        assert!(
            err.message
                .contains("names kube-system/replicaset-controller")
                && err.message.contains("--impersonable-service-accounts"),
            "{}",
            err.message
        );
        // A kubeconfig's identity impersonates, not the agent: not the operator's grant.
        let mut remote = a.clone();
        remote.spec.credentials = serde_json::from_value(serde_json::json!({
            "type": "Kubeconfig",
            "kubeconfigSecretRef": {"name": "remote-kc"}
        }))
        .unwrap();
        let mut infra = agent.clone();
        infra.spec.mode = Mode::Infrastructure;
        let secret = Secret {
            data: Some([("kubeconfig".to_string(), ByteString(b"x".to_vec()))].into()),
            ..Default::default()
        };
        assert_eq!(
            check(
                &remote,
                Some(&infra),
                &[],
                Some(&secret),
                &Grants::default()
            ),
            Ok(())
        );
        let listed =
            Grants::parse(&[], &["kube-system/replicaset-controller".into()], None).unwrap();
        assert_eq!(check(&a, Some(&agent), &[], None, &listed), Ok(()));
    }
}
