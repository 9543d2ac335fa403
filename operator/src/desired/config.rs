//! The agent config a ScaleAgent renders into (`scale-agent.yaml`), one entry per accepted
//! AgentAccount, and the ConfigMap that carries it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use scale_agent_crds::{
    AgentAccount, ScaleAgent,
    agent_config::{
        AccountConfig, AdminServer, AgentConfig, Backoff, CustomResourceConfig,
        CustomResourceScope, DynamicAccountsConfig, HubConnection, HubTls, KubernetesConfig,
        StatusTarget, Tasks,
    },
    v1alpha1::Mode,
};

use super::{
    ADMIN_PORT, CONFIG_KEY, HUB_CA_DIR, KUBECONFIG_DIR, TLS_DIR, agent_name, effective_kinds,
    kubeconfig_of, owned_meta,
};
use crate::error::Result;

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

/// The agent config ConfigMap.
pub fn config_map(agent: &ScaleAgent, config: &AgentConfig) -> Result<ConfigMap> {
    Ok(ConfigMap {
        metadata: owned_meta(agent, agent_name(agent))?,
        data: Some([(CONFIG_KEY.to_owned(), config.to_yaml()?)].into()),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use scale_agent_crds::v1alpha1::Scope;

    use super::*;
    use crate::desired::{
        deployment, kubeconfig_secrets,
        tests::{account, agent, kubeconfig_account},
    };

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
}
