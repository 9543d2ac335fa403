//! The `ScaleAgent` spec from Armory's agent config, Deployment and RBAC manifests, with a
//! note for every setting that has no equivalent.

use k8s_openapi::api::core::v1::ResourceRequirements;
use scale_agent_crds::{
    ScaleAgentSpec,
    agent_config::AgentConfig,
    v1alpha1::{
        Access, Backoff, CaSecretRef, Enrolment, Heartbeat, Hub, HubTls, ListBudget, Mode,
        OperationBudget, Scope, TokenSecretRef,
    },
};
use serde_json::Value;

use super::{ArmoryInput, MigrateOptions, budget, whole_seconds};

pub(super) fn scale_agent_spec(
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
pub(super) fn mounted_secret(deployment: &Value, path: &str) -> Option<(String, String)> {
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
