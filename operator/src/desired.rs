//! The objects the operator wants for a ScaleAgent, built without a client: names, labels,
//! the agent config, the ServiceAccount, RBAC, the certificate Secret and the Deployment.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    ByteString,
    api::{
        apps::v1::{Deployment, DeploymentSpec},
        core::v1::{
            Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort,
            EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector,
            PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile, Secret,
            SecretVolumeSource, SecurityContext, ServiceAccount, Volume, VolumeMount,
        },
        rbac::v1::{
            ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
        },
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};
use kube::{Resource, ResourceExt, api::ObjectMeta};
use scale_agent_crds::{
    AgentAccount, LABEL_COMPONENT, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_NAME, LABEL_PART_OF,
    MANAGED_BY, PART_OF, ScaleAgent,
    agent_config::{
        AccountConfig, AdminServer, AgentConfig, Backoff, CustomResourceConfig,
        CustomResourceScope, DynamicAccountsConfig, HubConnection, HubTls, KubernetesConfig,
        StatusTarget, Tasks,
    },
    v1alpha1::{CredentialsType, Mode},
};

use crate::error::{Error, Result};

pub mod callers;
pub mod pod;

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

/// Renders the agent config from the ScaleAgent and its accepted accounts.
pub fn agent_config(agent: &ScaleAgent, accounts: &[&AgentAccount]) -> AgentConfig {
    let spec = &agent.spec;
    let insecure = spec.hub.tls.insecure_plaintext;
    let tls = HubTls {
        server_name: spec.hub.tls.server_name.clone(),
        cacert_file: spec
            .hub
            .tls
            .ca_secret_ref
            .as_ref()
            .filter(|_| !insecure)
            .map(|r| format!("{HUB_CA_DIR}/{}", r.key)),
        client_cert_file: (!insecure).then(|| format!("{TLS_DIR}/tls.crt")),
        client_key_file: (!insecure).then(|| format!("{TLS_DIR}/tls.key")),
    };
    let secs = |s: i32| std::time::Duration::from_secs(u64::try_from(s).unwrap_or(1));
    let clouddriver = HubConnection {
        grpc: spec.hub.address.clone(),
        insecure: Some(insecure),
        tls,
        auth: Default::default(),
        // The agent asks the hub for this period; the hub grants it within its bounds.
        keep_alive_heartbeat_seconds: u32::try_from(spec.heartbeat.period_seconds).ok(),
        no_proxy: false,
        backoff: Backoff {
            base_delay: secs(spec.backoff.base_seconds),
            multiplier: spec.backoff.factor,
            jitter: spec.backoff.jitter,
            max_delay: secs(spec.backoff.cap_seconds),
        },
    };
    let scope_namespaces =
        (spec.mode == Mode::Agent && !spec.scope.is_cluster()).then_some(&spec.scope.namespaces);
    let mut accounts: Vec<AccountConfig> = accounts
        .iter()
        .map(|account| account_config(agent, account, scope_namespaces))
        .collect();
    accounts.sort_by(|a, b| a.name.cmp(&b.name));
    AgentConfig {
        clouddriver,
        kubernetes: KubernetesConfig {
            no_proxy: false,
            accounts,
        },
        tasks: Tasks {
            total_budget: u32::try_from(spec.list_budget.total).unwrap_or(1),
            budget_per_account: u32::try_from(spec.list_budget.per_account).unwrap_or(1),
            operations_per_account: u32::try_from(spec.operation_budget.per_account).unwrap_or(1),
            operations_total: u32::try_from(spec.operation_budget.total).unwrap_or(1),
        },
        server: AdminServer {
            port: ADMIN_PORT as u16,
        },
        status: Some(StatusTarget {
            namespace: agent.namespace().unwrap_or_default(),
            scale_agent: agent.name_any(),
        }),
        // Accounts the hub pushes make the agent load kubeconfig Secrets: only as the
        // ScaleAgent says, a field the admission policy reserves to admins (F13).
        dynamic_accounts: DynamicAccountsConfig {
            enabled: spec.dynamic_accounts.enabled,
            kubeconfig_secrets: spec.dynamic_accounts.kubeconfig_secrets.clone(),
        },
    }
}

fn account_config(
    agent: &ScaleAgent,
    account: &AgentAccount,
    scope_namespaces: Option<&Vec<String>>,
) -> AccountConfig {
    let spec = &account.spec;
    let (kinds, omit_kinds) = effective_kinds(agent, account);
    let kubeconfig = kubeconfig_of(account);
    // With namespace scope the agent may only read the scope's namespaces: an account that
    // names none sees those, and cluster-scoped kinds are out of reach.
    let namespaces = match scope_namespaces {
        Some(scope) if spec.namespaces.is_empty() => scope.clone(),
        _ => spec.namespaces.clone(),
    };
    let mut permissions = BTreeMap::new();
    if !spec.permissions.read.is_empty() {
        permissions.insert("READ".to_owned(), spec.permissions.read.clone());
    }
    if !spec.permissions.write.is_empty() {
        permissions.insert("WRITE".to_owned(), spec.permissions.write.clone());
    }
    AccountConfig {
        name: account.account_name().unwrap_or_default().to_owned(),
        service_account: kubeconfig.is_none(),
        kubeconfig_file: kubeconfig.map(|(name, key)| format!("{KUBECONFIG_DIR}/{name}/{key}")),
        context: spec
            .credentials
            .kubeconfig_secret_ref
            .as_ref()
            .and_then(|r| r.context.clone()),
        agent_account: account.metadata.name.clone(),
        namespaces,
        omit_namespaces: spec.omit_namespaces.clone(),
        kinds,
        omit_kinds,
        only_namespaced_resources: spec.only_namespaced_resources || scope_namespaces.is_some(),
        custom_resource_definitions: spec
            .custom_resources
            .iter()
            .map(|cr| CustomResourceConfig {
                kind: format!("{}.{}", cr.kind, cr.group),
                version: cr.version.clone(),
                scope: if cr.namespaced {
                    CustomResourceScope::Namespaced
                } else {
                    CustomResourceScope::Cluster
                },
            })
            .collect(),
        metrics: spec.pod_metrics,
        no_proxy: false,
        permissions,
        impersonate_service_account: spec.impersonate_service_account.clone(),
        callers: spec.callers,
        caller_prefix: spec.caller_prefix.clone(),
        caller_users: spec.caller_users.clone(),
        caller_groups: spec.caller_groups.clone(),
        allow_secret_data: spec.allow_secret_data,
    }
}

/// The ServiceAccount the agent runs as.
pub fn service_account(agent: &ScaleAgent) -> Result<ServiceAccount> {
    Ok(ServiceAccount {
        metadata: owned_meta(agent, agent_name(agent))?,
        ..Default::default()
    })
}

/// The agent config ConfigMap.
pub fn config_map(agent: &ScaleAgent, config: &AgentConfig) -> Result<ConfigMap> {
    Ok(ConfigMap {
        metadata: owned_meta(agent, agent_name(agent))?,
        data: Some([(CONFIG_KEY.to_owned(), config.to_yaml()?)].into()),
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

fn subject(agent: &ScaleAgent) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: agent_name(agent),
        namespace: agent.namespace(),
        ..Default::default()
    }
}

fn cluster_meta(agent: &ScaleAgent) -> ObjectMeta {
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

fn mount(name: &str, path: String) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path,
        read_only: Some(true),
        ..Default::default()
    }
}

fn secret_volume(name: &str, secret: &str) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The agent Deployment.
pub fn deployment(agent: &ScaleAgent, kubeconfig_secrets: &BTreeSet<String>) -> Result<Deployment> {
    let spec = &agent.spec;
    let selector = selector_labels(agent);
    let insecure = spec.hub.tls.insecure_plaintext;
    let mut volumes = vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: agent_name(agent),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
    ];
    let mut mounts = vec![
        mount("config", CONFIG_DIR.into()),
        VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..Default::default()
        },
    ];
    if !insecure {
        volumes.push(secret_volume("tls", &tls_secret_name(agent)));
        mounts.push(mount("tls", TLS_DIR.into()));
        if let Some(ca) = &spec.hub.tls.ca_secret_ref {
            volumes.push(secret_volume("hub-ca", &ca.name));
            mounts.push(mount("hub-ca", HUB_CA_DIR.into()));
        }
    }
    if spec.mode != Mode::Agent {
        for (index, secret) in kubeconfig_secrets.iter().enumerate() {
            let name = format!("kubeconfig-{index}");
            volumes.push(secret_volume(&name, secret));
            mounts.push(mount(&name, format!("{KUBECONFIG_DIR}/{secret}")));
        }
    }
    let probe = |path: &str, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("admin".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(3),
        ..Default::default()
    };
    let field_env = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let container = Container {
        name: "agent".into(),
        image: Some(spec.image_or_default().to_owned()),
        image_pull_policy: Some(spec.image_pull_policy.as_str().to_owned()),
        args: Some(vec![
            "--config".into(),
            format!("{CONFIG_DIR}/{CONFIG_KEY}"),
        ]),
        env: Some(
            [
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
                // Set here, beside the grace period it must stay below (older agents
                // ignore it).
                EnvVar {
                    name: "SCALE_AGENT_DRAIN_TIMEOUT_SECONDS".into(),
                    value: Some(AGENT_DRAIN_SECONDS.to_string()),
                    ..Default::default()
                },
            ]
            .into_iter()
            .chain(pod::extra_env(agent))
            .collect(),
        ),
        ports: Some(vec![ContainerPort {
            name: Some("admin".into()),
            container_port: ADMIN_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(probe("/readyz", 5)),
        liveness_probe: Some(probe("/healthz", 10)),
        resources: spec.resources.clone(),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    let mut pod = PodSpec {
        service_account_name: Some(agent_name(agent)),
        // Only mode Agent talks to this cluster's API with its own token.
        automount_service_account_token: Some(spec.mode == Mode::Agent),
        containers: vec![container],
        volumes: Some(volumes),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            run_as_group: Some(65532),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        topology_spread_constraints: Some(pod::topology_spread(agent)),
        termination_grace_period_seconds: Some(AGENT_TERMINATION_GRACE_SECONDS),
        ..Default::default()
    };
    pod::place(agent, &mut pod);
    Ok(Deployment {
        metadata: owned_meta(agent, agent_name(agent))?,
        spec: DeploymentSpec {
            replicas: Some(spec.replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod::pod_labels(agent)),
                    annotations: pod::pod_annotations(agent),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        },
        ..Default::default()
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use scale_agent_crds::v1alpha1::{Credentials, KubeconfigSecretRef, Scope, ServiceAccountRef};
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

    #[test]
    fn renders_accounts_into_the_agent_config() {
        let mut agent = agent("prod");
        agent.spec.defaults.kinds = vec!["Deployment".into()];
        agent.spec.scope = Scope::namespaces(["team-a"]);
        let mut web = account("web", "prod");
        web.spec.omit_kinds = vec!["Event".into()];
        web.spec.permissions.read = vec!["dev".into()];
        let api = account("api", "prod");
        let config = agent_config(&agent, &[&web, &api]);
        assert_eq!(config.clouddriver.grpc, "hub.example.com:9091");
        assert_eq!(
            config.clouddriver.tls.client_cert_file.as_deref(),
            Some("/var/run/scale-agent/tls/tls.crt")
        );
        assert_eq!(
            config.clouddriver.tls.cacert_file.as_deref(),
            Some("/var/run/scale-agent/hub-ca/ca.crt")
        );
        let names: Vec<_> = config
            .kubernetes
            .accounts
            .iter()
            .map(|a| a.name.as_str())
            .collect();
        assert_eq!(names, ["api", "web"]);
        let api = &config.kubernetes.accounts[0];
        assert!(api.service_account);
        assert_eq!(api.kinds, ["Deployment"], "agent defaults");
        assert_eq!(api.namespaces, ["team-a"], "scope namespaces");
        assert!(api.only_namespaced_resources);
        let web = &config.kubernetes.accounts[1];
        assert!(web.kinds.is_empty());
        assert_eq!(web.omit_kinds, ["Event"]);
        assert_eq!(web.permissions["READ"], ["dev"]);
        let yaml = config.to_yaml().unwrap();
        assert_eq!(AgentConfig::from_yaml(&yaml).unwrap(), config);
        assert!(
            !config.dynamic_accounts.enabled,
            "off unless the ScaleAgent says so"
        );
        assert!(!yaml.contains("dynamicAccounts"), "{yaml}");
        agent.spec.dynamic_accounts.enabled = true;
        agent.spec.dynamic_accounts.kubeconfig_secrets = vec!["clusters/*".into()];
        let config = agent_config(&agent, &[]);
        assert!(config.dynamic_accounts.enabled);
        assert_eq!(config.dynamic_accounts.kubeconfig_secrets, ["clusters/*"]);
    }

    #[test]
    fn kubeconfig_accounts_point_at_mounted_files() {
        let mut agent = agent("infra");
        agent.spec.mode = Mode::Infrastructure;
        let remote = kubeconfig_account("remote", "infra", "remote-kc");
        let config = agent_config(&agent, &[&remote]);
        let account = &config.kubernetes.accounts[0];
        assert!(!account.service_account);
        assert_eq!(
            account.kubeconfig_file.as_deref(),
            Some("/var/run/scale-agent/kubeconfigs/remote-kc/kubeconfig")
        );
        assert_eq!(account.context.as_deref(), Some("admin"));
        let deployment = deployment(&agent, &kubeconfig_secrets(&[&remote])).unwrap();
        let pod = deployment.spec.template.spec.unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        let volumes = pod.volumes.unwrap();
        assert!(
            volumes
                .iter()
                .any(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref())
                    == Some("remote-kc"))
        );
    }

    #[test]
    fn deployment_is_hardened_and_probed() {
        let agent = agent("prod");
        let deployment = deployment(&agent, &BTreeSet::new()).unwrap();
        assert_eq!(
            deployment.metadata.owner_references.as_ref().unwrap()[0].uid,
            "uid-1"
        );
        let spec = deployment.spec;
        assert_eq!(spec.replicas, Some(2));
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("prod-agent"));
        assert_eq!(
            pod.topology_spread_constraints.unwrap()[0].topology_key,
            "kubernetes.io/hostname"
        );
        let container = &pod.containers[0];
        assert_eq!(
            container.args.as_ref().unwrap(),
            &["--config", "/etc/scale-agent/scale-agent.yaml"]
        );
        let security = container.security_context.as_ref().unwrap();
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(
            security.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
        assert_eq!(
            container
                .readiness_probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .as_deref(),
            Some("/readyz")
        );
        assert_eq!(container.env.as_ref().unwrap()[0].name, "POD_NAME");
        // The drain on SIGTERM fits in the grace period.
        let drain = container
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|e| e.name == "SCALE_AGENT_DRAIN_TIMEOUT_SECONDS")
            .and_then(|e| e.value.as_deref())
            .unwrap()
            .parse::<i64>()
            .unwrap();
        let grace = pod.termination_grace_period_seconds.unwrap();
        assert!(
            drain > 0 && drain + 5 <= grace,
            "drain {drain} s, grace {grace} s"
        );
        let mounts: Vec<_> = container
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(
            mounts,
            [
                "/etc/scale-agent",
                "/tmp",
                "/var/run/scale-agent/tls",
                "/var/run/scale-agent/hub-ca"
            ]
        );
    }

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
