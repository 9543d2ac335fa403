//! `scale-agent migrate`: turns an Armory agent's `armory-agent.yml` (with its local overlay,
//! and optionally the Kubernetes manifests that run it) into the `ScaleAgent` and
//! `AgentAccount` resources that reproduce it, with a YAML comment for every setting that has
//! no equivalent. Reading files is [`read_input`]; everything else is pure.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::ResourceRequirements;
use scale_agent_crds::{
    AgentAccount, AgentAccountSpec, ScaleAgent, ScaleAgentSpec,
    agent_config::{AccountConfig, AgentConfig, CustomResourceScope},
    v1alpha1::{
        Access, Backoff, CaSecretRef, Credentials, CustomResourceKind, Enrolment, Heartbeat, Hub,
        HubTls, KubeconfigSecretRef, ListBudget, Mode, OperationBudget, Permissions, Scope,
        TokenSecretRef,
    },
};
use serde_json::Value;

use crate::config::{merge_values, yaml_value};
use crate::config_armory::{self, Verdict};
use crate::error::{Error, Result};

/// Names of the agent's config file in Armory's ConfigMap (and on disk), the overlay's last.
const CONFIG_KEYS: &[&str] = &[
    "armory-agent.yml",
    "armory-agent.yaml",
    "kubesvc.yml",
    "kubesvc.yaml",
];
const OVERLAY_KEYS: &[&str] = &["armory-agent-local.yml", "armory-agent-local.yaml"];

/// Where the resources go.
#[derive(Clone, Debug)]
pub struct MigrateOptions {
    /// Name of the ScaleAgent (the AgentAccounts' `agentRef`).
    pub name: String,
    /// Namespace of every resource; else the Armory manifests' namespace; else none (kubectl's).
    pub namespace: Option<String>,
    /// The hub's gRPC address; else Armory's `clouddriver.grpc`.
    pub hub_address: Option<String>,
}

/// What was read from Armory's files.
#[derive(Clone, Debug, Default)]
pub struct ArmoryInput {
    /// The agent config, the overlay merged in (`null` when none was given).
    pub config: Value,
    /// Where the config came from, for the output's header.
    pub sources: Vec<String>,
    /// The agent's Deployment, when given.
    pub deployment: Option<Value>,
    /// ClusterRoles and Roles given (the agent's RBAC).
    pub roles: Vec<Value>,
    /// Namespace of the manifests given.
    pub namespace: Option<String>,
    /// Manifests not carried over, as `Kind name`.
    pub skipped: Vec<String>,
}

/// The resources that reproduce the Armory agent, and what could not be carried over.
#[derive(Clone, Debug)]
pub struct Migration {
    pub scale_agent: ScaleAgent,
    /// Settings of the agent with no equivalent, one line each.
    pub agent_notes: Vec<String>,
    /// Each account, with its own notes.
    pub accounts: Vec<(AgentAccount, Vec<String>)>,
    /// Where the config came from.
    pub sources: Vec<String>,
}

/// Reads Armory's files: agent configs (`armory-agent.yml`, `*-local.yml` overlays) and
/// Kubernetes manifests (the config ConfigMap, the Deployment, ClusterRoles and Roles),
/// several documents per file allowed.
pub fn read_input(paths: &[PathBuf]) -> Result<ArmoryInput> {
    let mut files = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
            what: "Armory file",
            path: path.clone(),
            source,
        })?;
        files.push((path.clone(), text));
    }
    parse_input(&files)
}

fn is_overlay_name(path: &Path) -> bool {
    path.file_stem()
        .is_some_and(|stem| stem.to_string_lossy().ends_with("-local"))
}

/// Sorts the documents of the files read into config, overlays and manifests.
pub fn parse_input(files: &[(PathBuf, String)]) -> Result<ArmoryInput> {
    let mut input = ArmoryInput::default();
    let mut configs: Vec<(String, Value)> = Vec::new();
    let mut overlays: Vec<(String, Value)> = Vec::new();
    for (path, text) in files {
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(text).map_err(|e| Error::ParseConfig {
                path: path.clone(),
                message: e.to_string(),
            })?;
        for document in documents.into_iter().filter(|d| !d.is_null()) {
            let kind = document.get("kind").and_then(Value::as_str);
            let is_manifest = kind.is_some() && document.get("apiVersion").is_some();
            if !is_manifest {
                let shown = path.display().to_string();
                if is_overlay_name(path) {
                    overlays.push((shown, document));
                } else {
                    configs.push((shown, document));
                }
                continue;
            }
            let name = document
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            if let Some(namespace) = document
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
            {
                input.namespace.get_or_insert_with(|| namespace.to_owned());
            }
            match kind.unwrap_or_default() {
                "ConfigMap" => {
                    let data = document.get("data");
                    let mut used = false;
                    for (keys, into) in [(CONFIG_KEYS, &mut configs), (OVERLAY_KEYS, &mut overlays)]
                    {
                        for key in keys {
                            if let Some(text) =
                                data.and_then(|d| d.get(*key)).and_then(Value::as_str)
                            {
                                let shown = format!("ConfigMap {name} key {key}");
                                into.push((shown, yaml_value(path, text)?));
                                used = true;
                            }
                        }
                    }
                    if !used {
                        input.skipped.push(format!("ConfigMap {name}"));
                    }
                }
                "Deployment" => input.deployment = Some(document),
                "ClusterRole" | "Role" => input.roles.push(document),
                other => input.skipped.push(format!("{other} {name}")),
            }
        }
    }
    let mut config = Value::Null;
    for (source, value) in configs.into_iter().chain(overlays) {
        merge_values(&mut config, value);
        input.sources.push(source);
    }
    input.config = config;
    Ok(input)
}

/// A name as a lowercase DNS label (what AgentAccount names must be): lowercase, other
/// characters as `-`, at most 63.
pub fn dns_label(name: &str) -> String {
    let mapped: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = mapped.trim_matches('-');
    let mut label: String = trimmed.chars().take(63).collect();
    while label.ends_with('-') {
        label.pop();
    }
    label
}

/// Seconds of a duration, at least 1, rounded up (the CRD counts whole seconds).
fn whole_seconds(duration: std::time::Duration) -> i32 {
    let seconds = duration.as_millis().div_ceil(1000).max(1);
    i32::try_from(seconds).unwrap_or(i32::MAX)
}

/// A list budget: Armory's 0 (no limit) has no ScaleAgent spelling but the largest limit.
fn budget(limit: u32) -> i32 {
    match limit {
        0 => i32::MAX,
        limit => i32::try_from(limit).unwrap_or(i32::MAX),
    }
}

/// Turns what was read into resources.
pub fn migrate(input: &ArmoryInput, options: &MigrateOptions) -> Result<Migration> {
    let invalid = |message: String| Error::ParseConfig {
        path: PathBuf::from(input.sources.first().map_or("(no config)", String::as_str)),
        message,
    };
    let (config, unknown) = AgentConfig::from_value_reporting_unknown(input.config.clone())
        .map_err(|e| invalid(e.to_string()))?;
    let namespace = options.namespace.clone().or(input.namespace.clone());
    let mut agent_notes = Vec::new();
    let mut account_notes: Vec<Vec<String>> = vec![Vec::new(); config.kubernetes.accounts.len()];
    // Notes found in the config go to the account they are about, else to the ScaleAgent.
    let mut note = |path: &str, text: String| {
        let index = path
            .strip_prefix("kubernetes.accounts[")
            .and_then(|rest| rest.split(']').next())
            .and_then(|i| i.parse::<usize>().ok());
        match index.and_then(|i| account_notes.get_mut(i)) {
            Some(notes) => notes.push(text),
            None => agent_notes.push(text),
        }
    };
    for notice in config_armory::check(&input.config) {
        let what = match notice.verdict {
            Verdict::Refused => "not supported",
            Verdict::NoEffect => "no effect",
        };
        note(
            &notice.path,
            format!("{}: {what}: {}", notice.path, notice.message),
        );
    }
    for key in unknown
        .iter()
        .filter(|key| !config_armory::covers(&key.path))
    {
        note(
            &key.path,
            format!("{key}: not a Scale Agent setting; not carried over"),
        );
    }

    let spec = scale_agent_spec(&config, input, options, &mut agent_notes);
    let spec_mode = spec.mode;
    let mut scale_agent = ScaleAgent::new(&options.name, spec);
    scale_agent.metadata.namespace = namespace.clone();

    let mut accounts = Vec::new();
    for (account, mut notes) in config.kubernetes.accounts.iter().zip(account_notes) {
        let resource = agent_account(account, input, options, &mut notes);
        if spec_mode == Mode::Infrastructure && account.kubeconfig_file.is_none() {
            notes.push("serviceAccount: true, but this ScaleAgent serves kubeconfig accounts (mode Infrastructure), for which the operator accepts only kubeconfig credentials: serve this account from a ScaleAgent in mode Agent in the cluster it reads".into());
        }
        let mut resource = AgentAccount::new(&dns_label(&account.name), resource);
        resource.metadata.namespace = namespace.clone();
        accounts.push((resource, notes));
    }
    for skipped in &input.skipped {
        agent_notes.push(format!(
            "{skipped}: not carried over; the operator makes the agent's ServiceAccount, RBAC, config and Deployment"
        ));
    }
    Ok(Migration {
        scale_agent,
        agent_notes,
        accounts,
        sources: input.sources.clone(),
    })
}

fn scale_agent_spec(
    config: &AgentConfig,
    input: &ArmoryInput,
    options: &MigrateOptions,
    notes: &mut Vec<String>,
) -> ScaleAgentSpec {
    let hub = &config.clouddriver;
    let address = match &options.hub_address {
        Some(address) => address.clone(),
        None => {
            notes.push(format!(
                "clouddriver.grpc: {:?} was Clouddriver's gRPC endpoint; spec.hub.address must point at the Scale Agent hub's gRPC listener (--hub-address)",
                hub.grpc
            ));
            hub.grpc
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_owned()
        }
    };
    let plaintext = hub.plaintext();
    let mut tls = HubTls {
        server_name: hub.tls.server_name.clone(),
        insecure_plaintext: plaintext,
        ca_secret_ref: None,
    };
    let mut enrolment = None;
    if plaintext {
        notes.push(
            "clouddriver.insecure: the Armory agent connected without TLS (insecure true or unset without TLS files); spec.hub.tls.insecurePlaintext is for tests, and the hub refuses it unless started to allow it: remove it and use spec.enrolment".into(),
        );
    } else {
        let secret = format!("{}-enrolment", options.name);
        notes.push(format!(
            "spec.enrolment: create Secret {secret} with key token holding a one-time token from `scale-agent-hub agent-token create --once`; the hub then issues the agent's client certificate"
        ));
        enrolment = Some(Enrolment {
            token_secret_ref: TokenSecretRef {
                name: secret,
                key: "token".into(),
            },
        });
        if let Some(ca) = &hub.tls.cacert_file {
            let secret = format!("{}-hub-ca", options.name);
            notes.push(format!(
                "clouddriver.tls.cacertFile: create Secret {secret} from it: kubectl create secret generic {secret} --from-file=ca.crt={ca}"
            ));
            tls.ca_secret_ref = Some(CaSecretRef {
                name: secret,
                key: "ca.crt".into(),
            });
        }
    }
    if hub.tls.client_cert_file.is_some() || hub.tls.client_key_file.is_some() {
        notes.push("clouddriver.tls.clientCertFile/clientKeyFile: not carried over; the hub issues the agent's certificate at enrolment".into());
    }
    if hub.auth.token.is_some() || hub.auth.token_file.is_some() {
        notes.push("clouddriver.auth.token/tokenFile: not carried over; the agent authenticates with the certificate it gets at enrolment".into());
    }
    let period = hub
        .keep_alive_heartbeat_seconds
        .unwrap_or(Heartbeat::default().period_seconds.unsigned_abs());
    if !(1..=300).contains(&period) {
        notes.push(format!(
            "clouddriver.keepAliveHeartbeatSeconds: {period} is outside 1..300 (0 disabled Armory's pings); the default period is used"
        ));
    }
    let heartbeat = Heartbeat {
        period_seconds: if (1..=300).contains(&period) {
            i32::try_from(period).unwrap_or(15)
        } else {
            Heartbeat::default().period_seconds
        },
    };
    let backoff = Backoff {
        base_seconds: whole_seconds(hub.backoff.base_delay),
        factor: hub.backoff.multiplier.clamp(1.0, 10.0),
        jitter: hub.backoff.jitter.clamp(0.0, 1.0),
        cap_seconds: whole_seconds(hub.backoff.max_delay)
            .max(whole_seconds(hub.backoff.base_delay)),
    };
    let tasks = &config.tasks;
    if [
        tasks.total_budget,
        tasks.budget_per_account,
        tasks.operations_total,
        tasks.operations_per_account,
    ]
    .contains(&0)
    {
        notes.push("tasks: 0 (no limit) is written as the largest limit".into());
    }
    let total = budget(tasks.total_budget);
    let list_budget = ListBudget {
        total,
        per_account: budget(tasks.budget_per_account).min(total),
    };
    let operations_total = budget(tasks.operations_total);
    let operation_budget = OperationBudget {
        total: operations_total,
        per_account: budget(tasks.operations_per_account).min(operations_total),
    };
    if config.server.port != 8082 {
        notes.push(format!(
            "server.port: {}: the operator's agents listen on 8082",
            config.server.port
        ));
    }
    let kubeconfig_accounts = config
        .kubernetes
        .accounts
        .iter()
        .filter(|a| a.kubeconfig_file.is_some())
        .count();
    let mode = if kubeconfig_accounts > 0 {
        Mode::Infrastructure
    } else {
        Mode::Agent
    };
    let (replicas, resources) = deployment_settings(input, notes);
    let (scope, access) = rbac_settings(input, notes);
    ScaleAgentSpec {
        mode,
        hub: Hub { address, tls },
        enrolment,
        client_certificate: None,
        replicas,
        image: None,
        image_pull_policy: Default::default(),
        resources,
        pod: Default::default(),
        scope,
        access,
        defaults: Default::default(),
        list_budget,
        operation_budget,
        heartbeat,
        backoff,
        // Pushed accounts stay off: an admin turns them on with the Secrets they may name.
        dynamic_accounts: Default::default(),
    }
}

/// Replicas and the agent container's resources from Armory's Deployment.
fn deployment_settings(
    input: &ArmoryInput,
    notes: &mut Vec<String>,
) -> (i32, Option<ResourceRequirements>) {
    let Some(deployment) = &input.deployment else {
        notes.push("spec.replicas: 2, so a standby takes over at once (Armory's manifests ran 1); no Deployment was given to read it from".into());
        return (2, None);
    };
    let replicas = deployment
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .and_then(|r| i32::try_from(r).ok())
        .unwrap_or(1)
        .max(1);
    let container = deployment.pointer("/spec/template/spec/containers/0");
    if let Some(image) = container
        .and_then(|c| c.get("image"))
        .and_then(Value::as_str)
    {
        notes.push(format!(
            "image {image}: not carried over; the operator runs the Scale Agent image"
        ));
    }
    let resources = container
        .and_then(|c| c.get("resources"))
        .and_then(|r| serde_json::from_value::<ResourceRequirements>(r.clone()).ok())
        .filter(|r| r.limits.is_some() || r.requests.is_some());
    (replicas, resources)
}

/// Scope and access from Armory's ClusterRole or Roles: Roles only means the namespaces they
/// are in; any write verb means Deploy.
fn rbac_settings(input: &ArmoryInput, notes: &mut Vec<String>) -> (Scope, Access) {
    if input.roles.is_empty() {
        notes.push("spec.access: Deploy, as Armory's agent deploys with whatever its RBAC allows; no ClusterRole or Role was given to read it from".into());
        return (Scope::cluster(), Access::Deploy);
    }
    let writes = input.roles.iter().any(|role| {
        role.get("rules")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|rule| rule.get("verbs").and_then(Value::as_array))
            .flatten()
            .filter_map(Value::as_str)
            .any(|verb| matches!(verb, "*" | "create" | "update" | "patch" | "delete"))
    });
    let access = if writes {
        Access::Deploy
    } else {
        Access::ReadOnly
    };
    let cluster = input
        .roles
        .iter()
        .any(|role| role.get("kind").and_then(Value::as_str) == Some("ClusterRole"));
    let scope = if cluster {
        Scope::cluster()
    } else {
        let mut namespaces: Vec<String> = input
            .roles
            .iter()
            .filter_map(|role| role.pointer("/metadata/namespace").and_then(Value::as_str))
            .map(str::to_owned)
            .collect();
        namespaces.sort();
        namespaces.dedup();
        if namespaces.is_empty() {
            Scope::cluster()
        } else {
            Scope::namespaces(namespaces)
        }
    };
    notes.push("RBAC: the operator generates the agent's rules from spec.scope, spec.access and each account's kinds; Armory's rules are not copied".into());
    (scope, access)
}

/// The Secret and key that Armory's Deployment mounts at `path`, if it does.
fn mounted_secret(deployment: &Value, path: &str) -> Option<(String, String)> {
    let pod = deployment.pointer("/spec/template/spec")?;
    let mounts = pod
        .get("containers")?
        .as_array()?
        .iter()
        .filter_map(|c| c.get("volumeMounts").and_then(Value::as_array))
        .flatten();
    for mount in mounts {
        let mount_path = mount.get("mountPath")?.as_str()?.trim_end_matches('/');
        let Some(rest) = path.strip_prefix(&format!("{mount_path}/")) else {
            continue;
        };
        let volume_name = mount.get("name")?.as_str()?;
        let volume = pod
            .get("volumes")?
            .as_array()?
            .iter()
            .find(|v| v.get("name").and_then(Value::as_str) == Some(volume_name))?;
        let secret = volume.get("secret")?;
        let name = secret.get("secretName")?.as_str()?.to_owned();
        // A Secret volume with `items` maps keys to paths.
        let key = secret
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|item| item.get("path").and_then(Value::as_str) == Some(rest))
            .and_then(|item| item.get("key").and_then(Value::as_str))
            .unwrap_or(rest)
            .to_owned();
        return Some((name, key));
    }
    None
}

fn agent_account(
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

fn comment_block(out: &mut String, heading: &str, notes: &[String]) {
    out.push_str(&format!("# {heading}\n"));
    if notes.is_empty() {
        out.push_str("#   (every setting carried over)\n");
    }
    for note in notes {
        out.push_str(&format!("#   - {}\n", note.replace('\n', " ")));
    }
}

/// The resources as YAML documents, each under a comment listing its settings that have no
/// equivalent or need a step by hand.
pub fn render(migration: &Migration) -> Result<String> {
    let mut out = String::new();
    let sources = if migration.sources.is_empty() {
        "no agent config (defaults)".to_owned()
    } else {
        migration.sources.join(", ")
    };
    out.push_str(&format!(
        "# Generated by `scale-agent migrate` from {sources}.\n"
    ));
    comment_block(
        &mut out,
        &format!(
            "ScaleAgent {}: settings with no equivalent, or a step to do by hand:",
            migration.scale_agent.metadata.name.as_deref().unwrap_or("")
        ),
        &migration.agent_notes,
    );
    out.push_str(&to_yaml(&migration.scale_agent)?);
    for (account, notes) in &migration.accounts {
        out.push_str("---\n");
        comment_block(
            &mut out,
            &format!(
                "AgentAccount {}: settings with no equivalent, or a step to do by hand:",
                account.metadata.name.as_deref().unwrap_or("")
            ),
            notes,
        );
        out.push_str(&to_yaml(account)?);
    }
    Ok(out)
}

fn to_yaml<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_saphyr::to_string(value).map_err(|e| Error::Migrate(e.to_string()))
}

/// How `rendered` (the config the operator renders from the migrated resources) differs
/// from the Armory config it came from, in what the agent does; empty when equivalent.
/// Account names compare as [`dns_label`]s and kubeconfig paths by presence (the operator
/// mounts Secrets at its own paths); settings noted as having no equivalent are skipped.
pub fn differences(armory: &AgentConfig, rendered: &AgentConfig) -> Vec<String> {
    let mut out = Vec::new();
    let mut differ = |what: &str, a: String, b: String| {
        if a != b {
            out.push(format!("{what}: {a} became {b}"));
        }
    };
    let (a, b) = (&armory.clouddriver, &rendered.clouddriver);
    differ(
        "clouddriver.grpc",
        a.grpc
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .into(),
        b.grpc.clone(),
    );
    differ(
        "plaintext",
        a.plaintext().to_string(),
        b.plaintext().to_string(),
    );
    differ(
        "tls.serverName",
        format!("{:?}", a.tls.server_name),
        format!("{:?}", b.tls.server_name),
    );
    differ(
        "backoff",
        format!(
            "{} {} {} {}",
            whole_seconds(a.backoff.base_delay),
            a.backoff.multiplier,
            a.backoff.jitter,
            whole_seconds(a.backoff.max_delay)
        ),
        format!(
            "{} {} {} {}",
            whole_seconds(b.backoff.base_delay),
            b.backoff.multiplier,
            b.backoff.jitter,
            whole_seconds(b.backoff.max_delay)
        ),
    );
    // Armory's 0 and the ScaleAgent's largest limit both mean no limit.
    let unlimited = |limit: u32| {
        if limit == 0 || limit >= i32::MAX as u32 {
            u32::MAX
        } else {
            limit
        }
    };
    let (ta, tb) = (&armory.tasks, &rendered.tasks);
    differ(
        "tasks",
        format!(
            "{} {}",
            unlimited(ta.total_budget),
            unlimited(ta.budget_per_account).min(unlimited(ta.total_budget))
        ),
        format!(
            "{} {}",
            unlimited(tb.total_budget),
            unlimited(tb.budget_per_account)
        ),
    );
    let mut armory_accounts: Vec<&AccountConfig> = armory.kubernetes.accounts.iter().collect();
    armory_accounts.sort_by_key(|a| dns_label(&a.name));
    let names = |accounts: &[&AccountConfig]| -> Vec<String> {
        accounts.iter().map(|a| dns_label(&a.name)).collect()
    };
    let rendered_accounts: Vec<&AccountConfig> = rendered.kubernetes.accounts.iter().collect();
    differ(
        "accounts",
        names(&armory_accounts).join(","),
        names(&rendered_accounts).join(","),
    );
    for (a, b) in armory_accounts.iter().zip(&rendered_accounts) {
        let name = &b.name;
        let key = |account: &AccountConfig| {
            let mut permissions = account.permissions.clone();
            for roles in permissions.values_mut() {
                *roles = roles.iter().map(|r| r.trim().to_owned()).collect();
            }
            let omit_kinds = if account.kinds.is_empty() {
                account.omit_kinds.clone()
            } else {
                Vec::new()
            };
            let crds: Vec<String> = account
                .custom_resource_definitions
                .iter()
                .map(|c| format!("{} {:?} {:?}", c.kind, c.version, c.scope))
                .collect();
            format!(
                "kubeconfig={} serviceAccount={} context={:?} namespaces={:?} kinds={:?} omitKinds={:?} onlyNamespaced={} crds={crds:?} metrics={} permissions={permissions:?}",
                account.kubeconfig_file.is_some(),
                account.kubeconfig_file.is_none(),
                account.context,
                account.namespaces,
                account.kinds,
                omit_kinds,
                account.only_namespaced_resources,
                account.metrics,
            )
        };
        differ(&format!("account {name}"), key(a), key(b));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> MigrateOptions {
        MigrateOptions {
            name: "armory".into(),
            namespace: Some("spinnaker".into()),
            hub_address: None,
        }
    }

    #[test]
    fn names_become_dns_labels() {
        assert_eq!(dns_label("agentAccount"), "agentaccount");
        assert_eq!(dns_label("my_k8s.account-"), "my-k8s-account");
        assert_eq!(dns_label(&"a".repeat(70)).len(), 63);
    }

    #[test]
    fn the_overlay_wins_key_by_key_and_replaces_lists() {
        let input = parse_input(&[
            (
                PathBuf::from("armory-agent.yml"),
                "clouddriver:\n  grpc: a:9091\n  insecure: true\nkubernetes:\n  accounts:\n    - name: one\n      serviceAccount: true\n".into(),
            ),
            (
                PathBuf::from("armory-agent-local.yml"),
                "clouddriver:\n  grpc: b:9091\nkubernetes:\n  accounts:\n    - name: two\n      kubeconfigFile: /kubeconfigfiles/two\n".into(),
            ),
        ])
        .unwrap();
        assert_eq!(input.config["clouddriver"]["grpc"], "b:9091");
        assert_eq!(input.config["clouddriver"]["insecure"], true);
        assert_eq!(input.config["kubernetes"]["accounts"][0]["name"], "two");
        let migration = migrate(&input, &options()).unwrap();
        assert_eq!(migration.accounts.len(), 1);
        assert_eq!(migration.scale_agent.spec.mode, Mode::Infrastructure);
        let (account, notes) = &migration.accounts[0];
        let secret = account
            .spec
            .credentials
            .kubeconfig_secret_ref
            .as_ref()
            .unwrap();
        assert_eq!(secret.name, "two-kubeconfig");
        assert!(notes.iter().any(|n| n.contains("kubectl create secret generic two-kubeconfig --from-file=kubeconfig=/kubeconfigfiles/two")), "{notes:#?}");
    }
}
