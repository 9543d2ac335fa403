//! The objects the operator wants for a ScaleAgent, built without a client: names, labels,
//! the agent config, the ServiceAccount, RBAC, the certificate Secret and the Deployment.
//!
//! This file holds the names, labels and owner metadata every object shares, what an account
//! implies (its kubeconfig Secret, kinds, namespaces), the ServiceAccount and the certificate
//! Secret; the agent config is built in `config`, the RBAC in `rbac` (and the callers' grant
//! in [`callers`]), the Deployment in `deployment` (its pod knobs and PodDisruptionBudget in
//! [`pod`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    ByteString,
    api::core::v1::{Secret, ServiceAccount},
};
use kube::{Resource, ResourceExt, api::ObjectMeta};
use scale_agent_crds::{
    AgentAccount, LABEL_COMPONENT, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_NAME, LABEL_PART_OF,
    MANAGED_BY, PART_OF, ScaleAgent, v1alpha1::CredentialsType,
};

use crate::error::{Error, Result};

pub mod callers;
mod config;
mod deployment;
pub mod pod;
mod rbac;

pub use config::{agent_config, config_map};
pub use deployment::deployment;
pub use rbac::{
    cluster_rbac, impersonated, impersonation_rbac, impersonation_rbac_name, namespaced_rbac,
    status_rbac, status_rbac_name,
};

/// Key of the agent config in its ConfigMap.
pub const CONFIG_KEY: &str = "scale-agent.yaml";
/// Where the config ConfigMap is mounted.
pub const CONFIG_DIR: &str = "/etc/scale-agent";
/// How long an agent drains on SIGTERM (its `--drain-timeout-seconds`): it hands its
/// accounts to the other replicas and finishes the operations and tunnelled requests in
/// flight, so a rolling update cuts none (e2e/tests/real_node/rollout.rs shows it on a real
/// node, with no LIST by the standby that takes over and none after the hub pod's
/// replacement).
pub const AGENT_DRAIN_SECONDS: i64 = 25;
/// The pod's terminationGracePeriodSeconds: room for the agent's default drain (25 s) plus
/// time to close the stream and exit, before the kubelet kills the container.
pub const AGENT_TERMINATION_GRACE_SECONDS: i64 = 35;
/// Where the client certificate Secret is mounted (`tls.crt`, `tls.key`, `ca.crt`).
pub const TLS_DIR: &str = "/var/run/scale-agent/tls";
/// Where the hub CA Secret is mounted.
pub const HUB_CA_DIR: &str = "/var/run/scale-agent/hub-ca";
/// Under which directory each kubeconfig Secret is mounted, one directory per Secret.
pub const KUBECONFIG_DIR: &str = "/var/run/scale-agent/kubeconfigs";
/// The agent's admin port: health, readiness and metrics.
pub const ADMIN_PORT: i32 = 8082;
/// Component label value of everything made for an agent.
pub const COMPONENT: &str = "agent";
/// Label naming the ScaleAgent's namespace on cluster-scoped RBAC and on Roles in other
/// namespaces, which cannot carry an owner reference; the finalizer selects them by it.
pub const OWNER_NAMESPACE_LABEL: &str = "scaleagent.dev/owner-namespace";
/// Finalizer that removes what owner references cannot.
pub const FINALIZER: &str = "scaleagent.dev/cleanup";

/// Name of the ServiceAccount, ConfigMap and Deployment: `<scaleagent>-agent`.
pub fn agent_name(agent: &ScaleAgent) -> String {
    format!("{}-agent", agent.name_any())
}

/// Name of the client certificate Secret: `<scaleagent>-agent-tls`.
pub fn tls_secret_name(agent: &ScaleAgent) -> String {
    format!("{}-agent-tls", agent.name_any())
}

/// Name of the ClusterRole(Binding), and of the Role(Binding) in each namespace:
/// `scale-agent:<namespace>:<scaleagent>`.
pub fn rbac_name(agent: &ScaleAgent) -> String {
    format!(
        "scale-agent:{}:{}",
        agent.namespace().unwrap_or_default(),
        agent.name_any()
    )
}

/// The labels on every object made for `agent`.
pub fn labels(agent: &ScaleAgent) -> BTreeMap<String, String> {
    [
        (LABEL_NAME, PART_OF.to_owned()),
        (LABEL_INSTANCE, agent.name_any()),
        (LABEL_COMPONENT, COMPONENT.to_owned()),
        (LABEL_MANAGED_BY, MANAGED_BY.to_owned()),
        (LABEL_PART_OF, PART_OF.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The Deployment's selector: name, instance and component.
pub fn selector_labels(agent: &ScaleAgent) -> BTreeMap<String, String> {
    let mut labels = labels(agent);
    labels.retain(|k, _| k == LABEL_NAME || k == LABEL_INSTANCE || k == LABEL_COMPONENT);
    labels
}

/// Labels of RBAC objects, which also name the owner's namespace.
pub fn rbac_labels(agent: &ScaleAgent) -> BTreeMap<String, String> {
    let mut labels = labels(agent);
    labels.insert(
        OWNER_NAMESPACE_LABEL.into(),
        agent.namespace().unwrap_or_default(),
    );
    labels
}

/// Label selector for the RBAC objects of `agent`, in any namespace.
pub fn rbac_selector(agent: &ScaleAgent) -> String {
    format!(
        "{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_INSTANCE}={},{OWNER_NAMESPACE_LABEL}={}",
        agent.name_any(),
        agent.namespace().unwrap_or_default()
    )
}

/// Metadata of an owned object in the agent's namespace.
fn owned_meta(agent: &ScaleAgent, name: String) -> Result<ObjectMeta> {
    let owner = agent
        .controller_owner_ref(&())
        .ok_or(Error::MissingField("metadata.uid on the ScaleAgent"))?;
    Ok(ObjectMeta {
        name: Some(name),
        namespace: agent.namespace(),
        labels: Some(labels(agent)),
        owner_references: Some(vec![owner]),
        ..Default::default()
    })
}

/// Whether the account uses a kubeconfig Secret, and which.
fn kubeconfig_of(account: &AgentAccount) -> Option<(&str, &str)> {
    match account.spec.credentials.type_ {
        CredentialsType::Kubeconfig => account
            .spec
            .credentials
            .kubeconfig_secret_ref
            .as_ref()
            .map(|r| (r.name.as_str(), r.key.as_str())),
        CredentialsType::ServiceAccount => None,
    }
}

/// The kubeconfig Secrets to mount, sorted.
pub fn kubeconfig_secrets(accounts: &[&AgentAccount]) -> BTreeSet<String> {
    accounts
        .iter()
        .filter_map(|a| kubeconfig_of(a).map(|(name, _)| name.to_owned()))
        .collect()
}

/// Kinds and omitKinds in effect for an account: its own, else the agent defaults.
pub fn effective_kinds(agent: &ScaleAgent, account: &AgentAccount) -> (Vec<String>, Vec<String>) {
    if account.spec.kinds.is_empty() && account.spec.omit_kinds.is_empty() {
        (
            agent.spec.defaults.kinds.clone(),
            agent.spec.defaults.omit_kinds.clone(),
        )
    } else {
        (account.spec.kinds.clone(), account.spec.omit_kinds.clone())
    }
}

/// Whether `account` reads or deploys in `namespace` (of its ScaleAgent's scope): it lists no
/// namespaces and does not omit this one, or it lists it.
pub fn covers_namespace(account: &AgentAccount, namespace: &str) -> bool {
    let spec = &account.spec;
    if spec.namespaces.is_empty() {
        !spec.omit_namespaces.iter().any(|n| n == namespace)
    } else {
        spec.namespaces.iter().any(|n| n == namespace)
    }
}

/// Whether Spinnaker's writes through `account` run as the agent's own ServiceAccount, so
/// the agent needs write rules for them: access `Deploy` and no `impersonateServiceAccount`.
pub fn writes_as_agent(agent: &ScaleAgent, account: &AgentAccount) -> bool {
    agent.spec.access == scale_agent_crds::v1alpha1::Access::Deploy
        && account.spec.impersonate_service_account.is_none()
}

/// The ServiceAccount the agent runs as.
pub fn service_account(agent: &ScaleAgent) -> Result<ServiceAccount> {
    Ok(ServiceAccount {
        metadata: owned_meta(agent, agent_name(agent))?,
        ..Default::default()
    })
}

/// The client certificate Secret (`kubernetes.io/tls` with `ca.crt`).
pub fn tls_secret(
    agent: &ScaleAgent,
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
) -> Result<Secret> {
    let data = [
        ("tls.crt", cert_pem),
        ("tls.key", key_pem),
        ("ca.crt", ca_pem),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
    .collect();
    Ok(Secret {
        metadata: owned_meta(agent, tls_secret_name(agent))?,
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use scale_agent_crds::v1alpha1::{Credentials, KubeconfigSecretRef};
    use serde_json::json;

    pub(crate) fn agent(name: &str) -> ScaleAgent {
        let mut agent: ScaleAgent = serde_json::from_value(json!({
            "apiVersion": "scaleagent.dev/v1alpha1",
            "kind": "ScaleAgent",
            "metadata": { "name": name, "namespace": "ns", "uid": "uid-1" },
            "spec": {
                "hub": { "address": "hub.example.com:9091", "tls": { "caSecretRef": { "name": "hub-ca" } } },
                "clientCertificate": { "issuerSecretRef": { "name": "agent-ca" } },
            },
        }))
        .unwrap();
        agent.metadata.generation = Some(1);
        agent
    }

    pub(crate) fn account(name: &str, agent: &str) -> AgentAccount {
        serde_json::from_value(json!({
            "apiVersion": "scaleagent.dev/v1alpha1",
            "kind": "AgentAccount",
            "metadata": { "name": name, "namespace": "ns", "uid": format!("uid-{name}") },
            "spec": { "agentRef": agent },
        }))
        .unwrap()
    }

    pub(crate) fn kubeconfig_account(name: &str, agent: &str, secret: &str) -> AgentAccount {
        let mut account = account(name, agent);
        account.spec.credentials = Credentials::kubeconfig(KubeconfigSecretRef {
            name: secret.into(),
            key: "kubeconfig".into(),
            context: Some("admin".into()),
        });
        account
    }

    #[test]
    fn an_account_covers_the_namespaces_it_reads_and_deploys_in() {
        let mut a = account("web", "prod");
        assert!(covers_namespace(&a, "team-a"), "no namespaces: every one");
        a.spec.omit_namespaces = vec!["team-b".into()];
        assert!(covers_namespace(&a, "team-a"));
        assert!(!covers_namespace(&a, "team-b"));
        a.spec.omit_namespaces.clear();
        a.spec.namespaces = vec!["team-a".into()];
        assert!(covers_namespace(&a, "team-a"));
        assert!(!covers_namespace(&a, "team-b"));
    }

    #[test]
    fn only_deploy_accounts_that_do_not_impersonate_write_as_the_agent() {
        let mut deploy = agent("prod");
        let mut a = account("web", "prod");
        assert!(!writes_as_agent(&deploy, &a), "ReadOnly is the default");
        deploy.spec.access = scale_agent_crds::v1alpha1::Access::Deploy;
        assert!(writes_as_agent(&deploy, &a));
        a.spec.impersonate_service_account = Some(
            serde_json::from_value(json!({"namespace": "team-a", "name": "deployer"})).unwrap(),
        );
        assert!(
            !writes_as_agent(&deploy, &a),
            "writes run as the impersonated account"
        );
    }

    #[test]
    fn names_and_labels_are_deterministic() {
        let agent = agent("prod");
        assert_eq!(agent_name(&agent), "prod-agent");
        assert_eq!(tls_secret_name(&agent), "prod-agent-tls");
        assert_eq!(rbac_name(&agent), "scale-agent:ns:prod");
        let labels = labels(&agent);
        assert_eq!(labels[LABEL_INSTANCE], "prod");
        assert_eq!(labels[LABEL_MANAGED_BY], "scale-agent-operator");
        assert_eq!(labels.len(), 5);
        assert!(rbac_selector(&agent).contains("scaleagent.dev/owner-namespace=ns"));
    }
}
