//! One `AgentAccount` per account of Armory's config, with a note for every setting that has
//! no equivalent.

use scale_agent_crds::{
    AgentAccountSpec,
    agent_config::{AccountConfig, CustomResourceScope},
    v1alpha1::{Credentials, CustomResourceKind, KubeconfigSecretRef, Permissions},
};

use super::{ArmoryInput, MigrateOptions, dns_label, scale_agent::mounted_secret};

pub(super) fn agent_account(
    account: &AccountConfig,
    input: &ArmoryInput,
    options: &MigrateOptions,
    notes: &mut Vec<String>,
) -> AgentAccountSpec {
    let label = dns_label(&account.name);
    if label != account.name {
        notes.push(format!(
            "name: {:?} is not a lowercase DNS label, which Spinnaker account names must be here: renamed to {label:?}; update pipelines that name the account",
            account.name
        ));
    }
    let credentials = match &account.kubeconfig_file {
        None => Credentials::default(),
        Some(path) => {
            let (name, key) = match input
                .deployment
                .as_ref()
                .and_then(|d| mounted_secret(d, path))
            {
                Some(found) => found,
                None => {
                    let name = format!("{label}-kubeconfig");
                    notes.push(format!(
                        "kubeconfigFile {path}: create Secret {name} from it: kubectl create secret generic {name} --from-file=kubeconfig={path}"
                    ));
                    (name, "kubeconfig".to_owned())
                }
            };
            Credentials::kubeconfig(KubeconfigSecretRef {
                name,
                key,
                context: account.context.clone(),
            })
        }
    };
    let mut omit_namespaces = account.omit_namespaces.clone();
    if !account.namespaces.is_empty() && !omit_namespaces.is_empty() {
        notes.push(
            "omitNamespaces: dropped, as namespaces already lists the namespaces to watch".into(),
        );
        omit_namespaces.clear();
    }
    let mut omit_kinds = account.omit_kinds.clone();
    if !account.kinds.is_empty() && !omit_kinds.is_empty() {
        notes.push("omitKinds: dropped, as kinds already lists the kinds to watch".into());
        omit_kinds.clear();
    }
    if account.kinds.is_empty() && omit_kinds.is_empty() {
        notes.push("kinds: unset, so the agent watches its default kinds (Deployment, ReplicaSet, StatefulSet, DaemonSet, Pod, Service, Ingress, Job, CronJob, ConfigMap, Secret, NetworkPolicy, HorizontalPodAutoscaler, Namespace); Armory's agent watched every kind it could list: set kinds: [\"*\"] for that".into());
    }
    let mut custom_resources = Vec::new();
    for crd in &account.custom_resource_definitions {
        match crd.kind.split_once('.') {
            Some((kind, group)) if !kind.is_empty() && !group.is_empty() => {
                custom_resources.push(CustomResourceKind {
                    kind: kind.to_owned(),
                    group: group.to_owned(),
                    version: crd.version.clone(),
                    namespaced: crd.scope != CustomResourceScope::Cluster,
                })
            }
            _ => notes.push(format!(
                "customResourceDefinitions kind {:?}: not Kind.group; add it to kinds or customResources by hand",
                crd.kind
            )),
        }
    }
    let mut permissions = Permissions::default();
    for (permission, roles) in &account.permissions {
        let roles: Vec<String> = roles
            .iter()
            .map(|r| r.trim().to_owned())
            .filter(|r| !r.is_empty())
            .collect();
        match permission.to_ascii_uppercase().as_str() {
            "READ" => permissions.read.extend(roles),
            "WRITE" => permissions.write.extend(roles),
            _ => notes.push(format!(
                "permissions.{permission}: only READ and WRITE are carried over"
            )),
        }
    }
    if account.service_account && account.kubeconfig_file.is_some() {
        notes.push("serviceAccount: true: the account's kubeconfigFile is used instead".into());
    }
    AgentAccountSpec {
        agent_ref: options.name.clone(),
        account_name: None,
        credentials,
        namespaces: account.namespaces.clone(),
        omit_namespaces,
        kinds: account.kinds.clone(),
        omit_kinds,
        deploy_kinds: None,
        custom_resources,
        only_namespaced_resources: account.only_namespaced_resources,
        permissions,
        pod_metrics: account.metrics,
        impersonate_service_account: account.impersonate_service_account.clone(),
        allow_secret_data: account.allow_secret_data,
        callers: account.callers,
        caller_prefix: account.caller_prefix.clone(),
        caller_users: account.caller_users.clone(),
        caller_groups: account.caller_groups.clone(),
    }
}
