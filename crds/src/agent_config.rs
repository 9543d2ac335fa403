//! The agent's config file (`scale-agent.yaml`), which the operator renders into the agent's
//! ConfigMap and the agent reads (and re-reads when it changes).
//!
//! It keeps the shape of Armory's `armory-agent.yaml` (`clouddriver.*`,
//! `kubernetes.accounts[]`, `tasks.*`, `server.*`) with Armory's meanings and defaults: keys
//! Armory spells differently are accepted as aliases, and keys this agent does not know are
//! ignored, as Armory's agent ignores them, but reported
//! ([`AgentConfig::from_yaml_reporting_unknown`]) so a typo does not pass silently. Armory
//! keys that would not be honoured are refused or reported by the agent
//! (`agent/src/config_armory.rs`).

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
    /// Concurrency budgets: initial LISTs, and the hub's operations.
    pub tasks: Tasks,
    /// The agent's admin listener (health, readiness, metrics, JSON views).
    pub server: AdminServer,
    /// Where the agent writes the hub's verdict (not in Armory's file: the operator renders
    /// it); no status is written when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusTarget>,
    /// Whether the agent serves the accounts the hub pushes, and which kubeconfig Secrets
    /// they may name (Armory's `dynamicAccounts.enabled`, off by default).
    #[serde(skip_serializing_if = "DynamicAccountsConfig::is_off")]
    pub dynamic_accounts: DynamicAccountsConfig,
}

/// `dynamicAccounts.*`. A pushed account makes the agent read a kubeconfig Secret with its
/// own credentials and act with what that kubeconfig holds, which may exceed the agent's own
/// rights (a Cluster API Secret is another cluster's admin): so the hub's admin may do that
/// only where this cluster's admin said so (issue 28, F13).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DynamicAccountsConfig {
    /// Serve the accounts the hub pushes. Off: each is reported `FAILED` with the reason.
    pub enabled: bool,
    /// The kubeconfig Secrets pushed accounts may name: `<name>` (in the agent's own
    /// namespace), `<namespace>/<name>` or `<namespace>/*`. Empty: none.
    pub kubeconfig_secrets: Vec<String>,
}

impl DynamicAccountsConfig {
    /// Off and with no Secrets: left out of a rendered config.
    pub fn is_off(&self) -> bool {
        *self == Self::default()
    }

    /// Whether Secret `name` in `namespace` (empty: the agent's own) is listed.
    pub fn allows_secret(&self, namespace: &str, name: &str) -> bool {
        self.kubeconfig_secrets.iter().any(|entry| {
            let entry = entry.trim();
            match entry.split_once('/') {
                Some((ns, n)) => ns == namespace && (n == "*" || n == name),
                None => namespace.is_empty() && entry == name,
            }
        })
    }
}

/// `status.*`: the custom resources whose status the agent writes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StatusTarget {
    /// Namespace of the ScaleAgent and its AgentAccounts.
    pub namespace: String,
    /// The ScaleAgent this agent runs for.
    pub scale_agent: String,
}

/// `clouddriver.*`: the one outbound gRPC connection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HubConnection {
    /// `host:port` of the hub's gRPC listener.
    pub grpc: String,
    /// Plaintext instead of TLS. The hub refuses plaintext unless it is started with its own
    /// explicit flag. Unset follows Armory's agent (1.0.47 and later): plaintext, unless a
    /// `tls` file or an enrolment token is configured (see [`HubConnection::plaintext`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure: Option<bool>,
    pub tls: HubTls,
    /// How the agent authenticates besides (or instead of) its client certificate.
    pub auth: HubAuth,
    /// The application heartbeat period (both ways; a silent peer is dead after two) that
    /// the agent asks the hub for in Hello. The hub grants it within its bounds
    /// (`--min-heartbeat-period`, `--max-heartbeat-period`) and the agent uses what it
    /// grants. Unset or `0`: the hub's `--heartbeat-period` (heartbeats cannot be turned
    /// off: they are how both ends notice a dead stream).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_alive_heartbeat_seconds: Option<u32>,
    /// Ignore `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` for the hub connection (Armory's key):
    /// connect directly.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_proxy: bool,
    /// Reconnect backoff, with grpc-go's semantics (as Armory's agent).
    pub backoff: Backoff,
}

impl Default for HubConnection {
    fn default() -> Self {
        Self {
            grpc: "scale-agent-hub:9091".into(),
            insecure: None,
            tls: HubTls::default(),
            auth: HubAuth::default(),
            keep_alive_heartbeat_seconds: None,
            no_proxy: false,
            backoff: Backoff::default(),
        }
    }
}

impl HubConnection {
    /// Whether the connection is plaintext: `insecure` when set; otherwise plaintext unless
    /// TLS is evidently meant (a CA, a client certificate or key, a server name, or an
    /// enrolment token), which is how Armory's agent reads a missing `insecure`.
    pub fn plaintext(&self) -> bool {
        self.insecure.unwrap_or_else(|| {
            let tls = &self.tls;
            tls.server_name.is_none()
                && tls.cacert_file.is_none()
                && tls.client_cert_file.is_none()
                && tls.client_key_file.is_none()
                && self.auth.enrolment_token_file.is_none()
        })
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
    /// Ignore `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` for every account's API server (Armory's
    /// key; typical with `HTTPS_PROXY` set for the hub only).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_proxy: bool,
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
    /// Ignore `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` for this account's API server (Armory's
    /// key).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_proxy: bool,
    /// Spinnaker roles: `READ: [..]`, `WRITE: [..]`, as a map or as Armory's documented list
    /// of one-key maps (`[{READ: [..]}, {WRITE: [..]}]`); a permission listed twice gets the
    /// roles of both.
    #[serde(
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "permissions_value::deserialize"
    )]
    pub permissions: BTreeMap<String, Vec<String>>,
    /// Run operations and proxied writes as this ServiceAccount (`Impersonate-User`);
    /// watches and reads stay the account's own credentials.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impersonate_service_account: Option<crate::v1alpha1::ServiceAccountRef>,
    /// Who the cluster sees for a person's request through the hub's proxy (the
    /// AgentAccount's `callers`): `agent` (default) or `impersonate`. Not in Armory's file.
    #[serde(skip_serializing_if = "crate::v1alpha1::Callers::is_agent")]
    pub callers: crate::v1alpha1::Callers,
    /// Put before impersonated user and group names; `scale-agent:` when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caller_prefix: Option<String>,
    /// The people admitted by user for `callers: impersonate` (unprefixed; `*`: every person).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub caller_users: Vec<String>,
    /// The groups whose members are admitted, and which are passed on, for `callers:
    /// impersonate` (unprefixed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub caller_groups: Vec<String>,
    /// Let Secret data through the hub's Kubernetes API proxy (the AgentAccount's
    /// `allowSecretData`); the hub reads it from the account's registration. Not in Armory's
    /// file.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_secret_data: bool,
    /// The AgentAccount (in `status.namespace`) this account comes from, whose status the
    /// agent writes (not in Armory's file: the operator renders it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_account: Option<String>,
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
/// `budgetPerAccount` for one account; `0` means no limit (Armory's meaning). Watches are
/// free. Defaults are Armory's: 1000 and 50.
///
/// The hub's operations likewise: at most `operationsPerAccount` run at once for one account
/// (default [`OPERATIONS_PER_ACCOUNT`]) and `operationsTotal` across the agent (default
/// [`OPERATIONS_TOTAL`]); `0` means no limit. The limit is per account so that one account's
/// slow operations (`delete` with `wait` on an object a finalizer holds) never starve another
/// account of the same agent; an operation waiting for a slot waits within its deadline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Tasks {
    pub total_budget: u32,
    pub budget_per_account: u32,
    pub operations_per_account: u32,
    pub operations_total: u32,
}

/// Default of `tasks.operationsPerAccount`: what one agent process ran for all its accounts
/// together before the limit was per account.
pub const OPERATIONS_PER_ACCOUNT: u32 = 16;
/// Default of `tasks.operationsTotal`: room for sixteen accounts at their limit at once.
pub const OPERATIONS_TOTAL: u32 = 256;

impl Default for Tasks {
    fn default() -> Self {
        Self {
            total_budget: 1000,
            budget_per_account: 50,
            operations_per_account: OPERATIONS_PER_ACCOUNT,
            operations_total: OPERATIONS_TOTAL,
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

/// `permissions` as a map (`READ: [a]`) or as Armory's list of one-key maps (`- READ: [a]`).
mod permissions_value {
    use super::*;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Map(BTreeMap<String, Vec<String>>),
        List(Vec<BTreeMap<String, Vec<String>>>),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<String, Vec<String>>, D::Error> {
        let raw = Raw::deserialize(deserializer).map_err(|_| {
            serde::de::Error::custom(
                "permissions must be a map of permission to roles (READ: [role1], WRITE: [role2]) \
                 or a list of such maps (- READ: [role1])",
            )
        })?;
        Ok(match raw {
            Raw::Map(map) => map,
            Raw::List(items) => {
                let mut merged: BTreeMap<String, Vec<String>> = BTreeMap::new();
                for (permission, roles) in items.into_iter().flatten() {
                    merged.entry(permission).or_default().extend(roles);
                }
                merged
            }
        })
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

/// A key in a config file that no field of [`AgentConfig`] reads. Ignored (Armory keys this
/// agent does not support yet must not stop it), but worth a warning: `kindz:` for `kinds:`
/// silently leaves an account on the default kinds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownKey {
    /// Where the key is, e.g. `kubernetes.accounts[0].kindz`.
    pub path: String,
    /// The known key at the same place that is closest to it, when one is close enough to be
    /// a typo of it.
    pub suggestion: Option<&'static str>,
}

impl std::fmt::Display for UnknownKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.suggestion {
            Some(known) => write!(f, "{} (did you mean `{known}`?)", self.path),
            None => f.write_str(&self.path),
        }
    }
}

/// The keys each section of the file accepts (aliases included), by section path with list
/// indices written `[]`. A unit test checks it against the types.
const KNOWN_KEYS: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "clouddriver",
            "hub",
            "kubernetes",
            "tasks",
            "server",
            "status",
        ],
    ),
    ("status", &["namespace", "scaleAgent"]),
    (
        "clouddriver",
        &[
            "grpc",
            "insecure",
            "tls",
            "auth",
            "keepAliveHeartbeatSeconds",
            "noProxy",
            "backoff",
        ],
    ),
    (
        "clouddriver.tls",
        &[
            "serverName",
            "cacertFile",
            "caCertFile",
            "clientCertFile",
            "clientKeyFile",
        ],
    ),
    (
        "clouddriver.auth",
        &["token", "tokenFile", "enrolmentTokenFile"],
    ),
    (
        "clouddriver.backoff",
        &["baseDelay", "multiplier", "jitter", "maxDelay"],
    ),
    ("kubernetes", &["noProxy", "accounts"]),
    (
        "kubernetes.accounts[]",
        &[
            "name",
            "serviceAccount",
            "kubeconfigFile",
            "kubeConfigFile",
            "context",
            "namespaces",
            "omitNamespaces",
            "kinds",
            "omitKinds",
            "onlyNamespacedResources",
            "customResourceDefinitions",
            "metrics",
            "noProxy",
            "permissions",
            "impersonateServiceAccount",
            "allowSecretData",
            "callers",
            "callerPrefix",
            "callerUsers",
            "callerGroups",
            "agentAccount",
        ],
    ),
    (
        "kubernetes.accounts[].customResourceDefinitions[]",
        &["kind", "version", "scope"],
    ),
    (
        "kubernetes.accounts[].impersonateServiceAccount",
        &["namespace", "name"],
    ),
    (
        "tasks",
        &[
            "totalBudget",
            "budgetPerAccount",
            "operationsPerAccount",
            "operationsTotal",
        ],
    ),
    ("server", &["port"]),
];

/// The keys known in `section` (`hub` is read as `clouddriver`, its alias).
fn known_keys(section: &str) -> &'static [&'static str] {
    let section = match section.strip_prefix("hub") {
        Some(rest) if rest.is_empty() || rest.starts_with('.') => {
            return known_keys(&format!("clouddriver{rest}"));
        }
        _ => section,
    };
    KNOWN_KEYS
        .iter()
        .find(|(known, _)| *known == section)
        .map(|(_, keys)| *keys)
        .unwrap_or(&[])
}

/// Edit distance (insertions, deletions, substitutions), ignoring ASCII case: `kubeconfigfile`
/// is a typo of `kubeconfigFile`, not a different key.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().map(|c| c.to_ascii_lowercase()).collect();
    let b: Vec<char> = b.chars().map(|c| c.to_ascii_lowercase()).collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

/// The key of `known` closest to `key`, if it is close enough to be a typo: at most 2 edits,
/// or a third of the key's length for long keys. Ties go to the first in `known`.
pub fn closest_key(key: &str, known: &[&'static str]) -> Option<&'static str> {
    let allowed = (key.chars().count() / 3).max(2);
    known
        .iter()
        .map(|candidate| (edit_distance(key, candidate), *candidate))
        .filter(|(distance, _)| *distance <= allowed)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// One step of a path into the file.
enum Step {
    Key(String),
    Index(usize),
}

fn steps(path: &serde_ignored::Path<'_>, out: &mut Vec<Step>) {
    match path {
        serde_ignored::Path::Root => {}
        serde_ignored::Path::Seq { parent, index } => {
            steps(parent, out);
            out.push(Step::Index(*index));
        }
        serde_ignored::Path::Map { parent, key } => {
            steps(parent, out);
            out.push(Step::Key(key.clone()));
        }
        serde_ignored::Path::Some { parent }
        | serde_ignored::Path::NewtypeStruct { parent }
        | serde_ignored::Path::NewtypeVariant { parent } => steps(parent, out),
    }
}

/// `kubernetes.accounts[0].kindz` and its suggestion, from serde_ignored's path.
fn unknown_key(path: &serde_ignored::Path<'_>) -> UnknownKey {
    let mut all = Vec::new();
    steps(path, &mut all);
    let mut shown = String::new();
    let mut section = String::new();
    let last = all.len().saturating_sub(1);
    let mut key = "";
    for (position, step) in all.iter().enumerate() {
        match step {
            Step::Key(name) => {
                if !shown.is_empty() {
                    shown.push('.');
                }
                shown.push_str(name);
                if position == last {
                    key = name;
                } else {
                    if !section.is_empty() {
                        section.push('.');
                    }
                    section.push_str(name);
                }
            }
            Step::Index(index) => {
                shown.push_str(&format!("[{index}]"));
                section.push_str("[]");
            }
        }
    }
    UnknownKey {
        path: shown,
        suggestion: closest_key(key, known_keys(&section)),
    }
}

impl AgentConfig {
    /// Parses a config file's YAML; an empty file is the default config. Unknown keys are
    /// ignored (see [`Self::from_yaml_reporting_unknown`] to hear about them).
    pub fn from_yaml(text: &str) -> Result<Self, crate::Error> {
        Self::from_yaml_reporting_unknown(text).map(|(config, _)| config)
    }

    /// Parses a config file's YAML and lists the keys it ignored, in the order they appear.
    pub fn from_yaml_reporting_unknown(
        text: &str,
    ) -> Result<(Self, Vec<UnknownKey>), crate::Error> {
        if text.trim().is_empty() {
            return Ok((Self::default(), Vec::new()));
        }
        let mut unknown = Vec::new();
        let config = serde_saphyr::with_deserializer_from_str(text, |deserializer| {
            serde_ignored::deserialize(deserializer, |path| unknown.push(unknown_key(&path)))
        })
        .map_err(|e| crate::Error::AgentConfig(e.to_string()))?;
        Ok((config, unknown))
    }

    /// Reads a config already parsed into a value (e.g. a file merged with its overlay) and
    /// lists the keys it ignored.
    pub fn from_value_reporting_unknown(
        value: serde_json::Value,
    ) -> Result<(Self, Vec<UnknownKey>), crate::Error> {
        if value.is_null() {
            return Ok((Self::default(), Vec::new()));
        }
        let mut unknown = Vec::new();
        let config = serde_ignored::deserialize(value, |path| unknown.push(unknown_key(&path)))
            .map_err(|e| crate::Error::AgentConfig(e.to_string()))?;
        Ok((config, unknown))
    }

    /// Renders the config as YAML, as the operator writes it into the agent's ConfigMap.
    pub fn to_yaml(&self) -> Result<String, crate::Error> {
        serde_saphyr::to_string(self).map_err(|e| crate::Error::AgentConfig(e.to_string()))
    }
}

#[cfg(test)]
mod tests;
