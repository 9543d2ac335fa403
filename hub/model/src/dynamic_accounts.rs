//! Dynamic accounts as the hub keeps them (Armory's dynamic accounts API): the spec an
//! admin submits, its validation, and the record the store persists.

use std::collections::BTreeMap;

use scale_agent_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The key of the Secret's data read when the request names none.
pub const DEFAULT_SECRET_KEY: &str = "kubeconfig";

/// Where the agent runs relative to the account's cluster; both read a kubeconfig. `Agent`
/// mode (the agent's own ServiceAccount) is declared in the agent's config, not pushed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DynamicMode {
    /// The agent runs in an infrastructure cluster and reaches the account's cluster with
    /// the kubeconfig.
    #[default]
    Infrastructure,
    /// The agent runs next to Spinnaker and reaches the account's cluster with the
    /// kubeconfig.
    SpinnakerService,
}

/// A key of a Secret in the agent's cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// Empty: the agent's own namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    /// Default `kubeconfig`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
}

/// One dynamic account as the API takes it: the agent identity that serves it, the Secret
/// with its kubeconfig, and the settings of the agent config's `kubernetes.accounts[]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DynamicAccountSpec {
    pub name: String,
    /// The agent identity (its certificate's or token's identity) that serves the account.
    pub agent: String,
    #[serde(default)]
    pub mode: DynamicMode,
    pub kubeconfig_secret: SecretKeyRef,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub context: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omit_namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omit_kinds: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub only_namespaced_resources: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub permissions: BTreeMap<String, Vec<String>>,
}

impl DynamicAccountSpec {
    /// The settings the agent applies, in its config's `kubernetes.accounts[]` shape
    /// (credentials apart: they are the Secret).
    fn settings(&self) -> Value {
        serde_json::json!({
            "namespaces": self.namespaces,
            "omitNamespaces": self.omit_namespaces,
            "kinds": self.kinds,
            "omitKinds": self.omit_kinds,
            "onlyNamespacedResources": self.only_namespaced_resources,
            "permissions": self.permissions,
        })
    }

    /// What the agent is sent.
    pub fn to_proto(&self) -> pb::DynamicAccount {
        pb::DynamicAccount {
            account: self.name.clone(),
            settings_json: serde_json::to_vec(&self.settings()).unwrap_or_default(),
            kubeconfig_secret: Some(pb::SecretKeySelector {
                namespace: self.kubeconfig_secret.namespace.clone(),
                name: self.kubeconfig_secret.name.clone(),
                key: self.kubeconfig_secret.key.clone(),
            }),
            context: self.context.clone(),
        }
    }
}

/// Fields of Armory's API this one refuses, each with what to send instead.
const REFUSED_FIELDS: &[(&str, &str)] = &[
    (
        "kubeconfigContents",
        "the hub never carries kubeconfigs: store the kubeconfig in a Secret in the agent's \
         cluster and name it in `kubeconfigSecret` ({\"namespace\", \"name\", \"key\"})",
    ),
    (
        "kubeconfigFile",
        "name the Secret holding the kubeconfig in `kubeconfigSecret` ({\"namespace\", \
         \"name\", \"key\"}); a file in the agent's pod is declared in the agent's own config",
    ),
    (
        "serviceAccount",
        "an account that uses the agent's own ServiceAccount (Agent mode) is declared in the \
         agent's config or as an AgentAccount; a dynamic account names a kubeconfig Secret in \
         `kubeconfigSecret`",
    ),
];

const SHAPE: &str = "{\"name\": \"<account>\", \"agent\": \"<agent identity>\", \"mode\": \
     \"Infrastructure|SpinnakerService\", \"kubeconfigSecret\": {\"namespace\": \"<ns>\", \
     \"name\": \"<secret>\", \"key\": \"kubeconfig\"}, and optionally context, namespaces, \
     omitNamespaces, kinds, omitKinds, onlyNamespacedResources, permissions}";

/// Parses and checks a request body; the error says what to change.
pub fn parse_spec(body: &[u8]) -> Result<DynamicAccountSpec, String> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| format!("the body must be a JSON object {SHAPE}: {e}"))?;
    if let Some(object) = value.as_object() {
        for (field, instead) in REFUSED_FIELDS {
            if object.contains_key(*field) {
                return Err(format!("field `{field}` is not accepted: {instead}"));
            }
        }
        if object.get("mode").and_then(Value::as_str) == Some("Agent") {
            return Err(format!(
                "mode Agent is not accepted: {}",
                REFUSED_FIELDS[2].1
            ));
        }
    }
    let spec: DynamicAccountSpec = serde_json::from_value(value)
        .map_err(|e| format!("the body must be a JSON object {SHAPE}: {e}"))?;
    crate::names::validate_account_name(&spec.name)?;
    if spec.agent.trim().is_empty() {
        return Err(
            "`agent` is empty: name the agent identity that serves the account (as \
             GET /api/v1/agents lists it)"
                .into(),
        );
    }
    let secret = &spec.kubeconfig_secret;
    let dns_label = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    if !dns_label(&secret.name) || !(secret.namespace.is_empty() || dns_label(&secret.namespace)) {
        return Err(format!(
            "kubeconfigSecret {{namespace: {:?}, name: {:?}}} is not a valid Secret reference: \
             the name (and the namespace, when given) are lowercase DNS names",
            secret.namespace, secret.name
        ));
    }
    if !secret.key.is_empty()
        && !secret
            .key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "kubeconfigSecret.key {:?} is not a valid Secret key (letters, digits, '-', '_' \
             and '.')",
            secret.key
        ));
    }
    if !spec.kinds.is_empty() && !spec.omit_kinds.is_empty() {
        return Err("set `kinds` or `omitKinds`, not both".into());
    }
    Ok(spec)
}

/// A dynamic account as the hub keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DynamicAccountRecord {
    pub spec: DynamicAccountSpec,
    /// Unix seconds.
    pub created: i64,
    pub updated: i64,
}

/// What one replica last reported about a dynamic account.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentReport {
    pub replica: String,
    /// `LOADING`, `REGISTERED`, `FAILED` or `OVERRIDDEN`.
    pub state: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    pub time: String,
}
