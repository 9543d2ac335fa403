//! The agent's config file (`scale-agent.yaml`), which the operator renders into the agent's
//! ConfigMap and the agent reads (and re-reads when it changes).
//!
//! It keeps the shape of Armory's `armory-agent.yaml` (`clouddriver.*`,
//! `kubernetes.accounts[]`, `tasks.*`, `server.*`), so a migration is a copy: keys Armory
//! spells differently are accepted as aliases, and keys this agent does not know are
//! ignored, as Armory's agent ignores them.

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The whole config file. Every section may be left out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AgentConfig {
    /// How to reach the hub. Armory's name for this section is kept (`clouddriver`);
    /// `hub` is accepted as well.
    #[serde(alias = "hub")]
    pub clouddriver: HubConnection,
    pub kubernetes: KubernetesConfig,
    /// Concurrency budget for initial LISTs.
    pub tasks: Tasks,
    /// The agent's admin listener (health, readiness, metrics, JSON views).
    pub server: AdminServer,
}

/// `clouddriver.*`: the one outbound gRPC connection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HubConnection {
    /// `host:port` of the hub's gRPC listener.
    pub grpc: String,
    /// Plaintext instead of TLS. For tests only: the hub refuses plaintext unless it is
    /// started with its own explicit flag. Unlike Armory's agent, the default is TLS.
    pub insecure: bool,
    pub tls: HubTls,
    /// How the agent authenticates besides (or instead of) its client certificate.
    pub auth: HubAuth,
    /// Period of the application heartbeat both ways; a silent peer is dead after two.
    pub keep_alive_heartbeat_seconds: u32,
    /// Reconnect backoff, with grpc-go's semantics (as Armory's agent).
    pub backoff: Backoff,
}

impl Default for HubConnection {
    fn default() -> Self {
        Self {
            grpc: "scale-agent-hub:9091".into(),
            insecure: false,
            tls: HubTls::default(),
            auth: HubAuth::default(),
            keep_alive_heartbeat_seconds: 15,
            backoff: Backoff::default(),
        }
    }
}

/// `clouddriver.tls.*`. File paths are re-read when the files change (certificate rotation).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HubTls {
    /// Name to verify in the hub's certificate, when it differs from the host in `grpc`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// CA bundle (PEM) that signed the hub's certificate; the system roots when unset.
    #[serde(alias = "caCertFile", skip_serializing_if = "Option::is_none")]
    pub cacert_file: Option<String>,
    /// The agent's client certificate (PEM) for mutual TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cert_file: Option<String>,
    /// The client certificate's private key (PEM, PKCS#8).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_key_file: Option<String>,
}

/// `clouddriver.auth.*`: agent tokens the hub issued (`scale-agent-hub agent-token create`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HubAuth {
    /// A bearer token, literally (Armory's key). Prefer `tokenFile`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// File holding a bearer token, sent as `authorization: Bearer` on every connection
    /// (read again on every connect, so a rotated token is used from the next one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// File holding a one-time enrolment token. When set and the agent has no valid client
    /// certificate, it makes a key, enrols, and writes the key and the certificate the hub
    /// issued to `clouddriver.tls.clientKeyFile` and `clientCertFile` (which must be set, in
    /// a writable directory); it renews that certificate over its stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enrolment_token_file: Option<String>,
}

/// Reconnect backoff: `baseDelay × multiplier^attempt`, at most `maxDelay`, ± `jitter`.
/// Delays accept Armory's integer nanoseconds or a duration such as `1s`, `500ms`, `2m`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Backoff {
    #[serde(with = "duration_value")]
    pub base_delay: Duration,
    pub multiplier: f64,
    pub jitter: f64,
    #[serde(with = "duration_value")]
    pub max_delay: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base_delay: Duration::from_secs(1),
            multiplier: 1.6,
            jitter: 0.2,
            max_delay: Duration::from_secs(120),
        }
    }
}

/// `kubernetes.*`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubernetesConfig {
    pub accounts: Vec<AccountConfig>,
}

/// `kubernetes.accounts[]`: one Spinnaker account, i.e. one cluster as one identity.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AccountConfig {
    /// The Spinnaker account name; unique across all clusters.
    pub name: String,
    /// Use the pod's own ServiceAccount (Agent mode).
    pub service_account: bool,
    /// A kubeconfig file to use instead (Infrastructure and SpinnakerService modes).
    #[serde(alias = "kubeConfigFile", skip_serializing_if = "Option::is_none")]
    pub kubeconfig_file: Option<String>,
    /// Context of `kubeconfigFile`; its current context when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Watch only these namespaces (each on its own watch); all when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Watch every namespace but these.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub omit_namespaces: Vec<String>,
    /// Cache only these kinds (`Deployment`, `deployments`, `Deployment.apps` or
    /// `deployments.apps`); all the account may list when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    /// Cache every kind but these.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub omit_kinds: Vec<String>,
    /// Ignore cluster-scoped kinds.
    pub only_namespaced_resources: bool,
    /// Custom resources to cache, as Armory spells them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub custom_resource_definitions: Vec<CustomResourceConfig>,
    /// Send pod metrics to the hub.
    pub metrics: bool,
    /// Spinnaker roles: `READ: [..]`, `WRITE: [..]`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub permissions: BTreeMap<String, Vec<String>>,
    /// Run operations and proxied writes as this ServiceAccount (`Impersonate-User`);
    /// watches and reads stay the account's own credentials.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impersonate_service_account: Option<crate::v1alpha1::ServiceAccountRef>,
}

/// `kubernetes.accounts[].customResourceDefinitions[]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CustomResourceConfig {
    /// `Kind.group`, e.g. `ServiceMonitor.monitoring.coreos.com`.
    pub kind: String,
    /// Version to watch; the group's preferred version when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `Namespaced` (default) or `Cluster`.
    pub scope: CustomResourceScope,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CustomResourceScope {
    #[default]
    Namespaced,
    Cluster,
}

/// `tasks.*`: at most `totalBudget` initial LISTs run at once, and at most
/// `budgetPerAccount` for one account. Watches are free.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Tasks {
    pub total_budget: u32,
    pub budget_per_account: u32,
}

impl Default for Tasks {
    fn default() -> Self {
        Self {
            total_budget: 20,
            budget_per_account: 5,
        }
    }
}

/// `server.*`: the agent's only listener.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AdminServer {
    pub port: u16,
}

impl Default for AdminServer {
    fn default() -> Self {
        Self { port: 8082 }
    }
}

/// A duration written as integer nanoseconds (Armory's agent) or as text (`1s`, `1m30s`).
mod duration_value {
    use super::*;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Nanos(u64),
        Text(String),
    }

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        // Whole milliseconds read best; nothing here needs finer resolution.
        let millis = value.as_millis();
        if millis.is_multiple_of(1000) {
            serializer.serialize_str(&format!("{}s", millis / 1000))
        } else {
            serializer.serialize_str(&format!("{millis}ms"))
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        match Raw::deserialize(deserializer)? {
            Raw::Nanos(nanos) => Ok(Duration::from_nanos(nanos)),
            Raw::Text(text) => {
                let parsed: kube::core::Duration = text.parse().map_err(|e| {
                    serde::de::Error::custom(format!(
                        "'{text}' is not a duration ({e}): write it like 1s, 500ms or 2m"
                    ))
                })?;
                if parsed.is_negative() {
                    return Err(serde::de::Error::custom(format!(
                        "'{text}' is negative: write a positive duration"
                    )));
                }
                Ok(parsed.into())
            }
        }
    }
}

impl AgentConfig {
    /// Parses a config file's YAML; an empty file is the default config.
    pub fn from_yaml(text: &str) -> Result<Self, crate::Error> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        serde_saphyr::from_str(text).map_err(|e| crate::Error::AgentConfig(e.to_string()))
    }

    /// Renders the config as YAML, as the operator writes it into the agent's ConfigMap.
    pub fn to_yaml(&self) -> Result<String, crate::Error> {
        serde_saphyr::to_string(self).map_err(|e| crate::Error::AgentConfig(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn armory_agent_yaml_parses_as_is() {
        let armory = r#"
clouddriver:
  grpc: spin-clouddriver-grpc:9091
  insecure: false
  tls:
    serverName: clouddriver.example.com
    cacertFile: /opt/ca.pem
    clientCertFile: /opt/tls.crt
    clientKeyFile: /opt/tls.key
  keepAliveHeartbeatSeconds: 20
  auth:
    token: literal-token
  backoff:
    baseDelay: 1000000000
    multiplier: 1.6
    jitter: 0.2
    maxDelay: 120000000000
kubernetes:
  accounts:
    - name: prod
      serviceAccount: true
      kinds: [deployment, replicaSet]
      permissions:
        READ: [dev]
        WRITE: [ops]
    - name: staging
      kubeConfigFile: /kubeconfigfiles/staging
      context: admin@staging
      namespaces: [web]
      customResourceDefinitions:
        - kind: ServiceMonitor.monitoring.coreos.com
      oAuthScopes: [ignored]
tasks:
  totalBudget: 1000
  budgetPerAccount: 50
server:
  port: 8082
"#;
        let config = AgentConfig::from_yaml(armory).unwrap();
        assert_eq!(config.clouddriver.grpc, "spin-clouddriver-grpc:9091");
        assert_eq!(
            config.clouddriver.backoff.base_delay,
            Duration::from_secs(1)
        );
        assert_eq!(
            config.clouddriver.backoff.max_delay,
            Duration::from_secs(120)
        );
        assert_eq!(
            config.clouddriver.tls.cacert_file.as_deref(),
            Some("/opt/ca.pem")
        );
        let staging = &config.kubernetes.accounts[1];
        assert_eq!(
            staging.kubeconfig_file.as_deref(),
            Some("/kubeconfigfiles/staging")
        );
        assert_eq!(
            staging.custom_resource_definitions[0].scope,
            CustomResourceScope::Namespaced
        );
        assert_eq!(config.kubernetes.accounts[0].permissions["WRITE"], ["ops"]);
        assert_eq!(config.tasks.total_budget, 1000);
        assert_eq!(
            config.clouddriver.auth.token.as_deref(),
            Some("literal-token")
        );
        let ours = AgentConfig::from_yaml(
            "clouddriver:\n  auth:\n    tokenFile: /t\n    enrolmentTokenFile: /e\n",
        )
        .unwrap();
        assert_eq!(ours.clouddriver.auth.token_file.as_deref(), Some("/t"));
        assert_eq!(
            ours.clouddriver.auth.enrolment_token_file.as_deref(),
            Some("/e")
        );
    }

    #[test]
    fn empty_file_is_the_default_and_rendering_round_trips() {
        assert_eq!(AgentConfig::from_yaml("").unwrap(), AgentConfig::default());
        let mut config = AgentConfig::default();
        config.clouddriver.backoff.base_delay = Duration::from_millis(250);
        config.kubernetes.accounts.push(AccountConfig {
            name: "prod".into(),
            service_account: true,
            omit_kinds: vec!["Event".into()],
            impersonate_service_account: Some(crate::v1alpha1::ServiceAccountRef {
                namespace: "team-a".into(),
                name: "deployer".into(),
            }),
            ..Default::default()
        });
        let yaml = config.to_yaml().unwrap();
        assert!(yaml.contains("baseDelay: 250ms"), "{yaml}");
        assert!(yaml.contains("impersonateServiceAccount:"), "{yaml}");
        assert_eq!(AgentConfig::from_yaml(&yaml).unwrap(), config);
    }

    #[test]
    fn bad_durations_say_how_to_write_them() {
        let err = AgentConfig::from_yaml("clouddriver:\n  backoff:\n    baseDelay: soon\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("write it like 1s"), "{err}");
    }
}
