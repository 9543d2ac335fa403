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
    /// Armory's INACTIVE: kept, but not sent to the agent (Armory's `POST /armory/accounts`
    /// and `POST /armory/accounts/dynamic` add accounts inactive; `PATCH /armory/accounts`
    /// activates and deactivates them). Accounts of the hub's own API are active.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inactive: bool,
    /// Where the account came from: [`SOURCE_CLOUDDRIVER`] (migrated with Armory's `POST
    /// /armory/accounts`), [`SOURCE_DYNAMIC`] (Armory's `POST /armory/accounts/dynamic`), or
    /// empty (the hub's own `/api/v1/dynamic-accounts`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

/// [`DynamicAccountRecord::source`] of an account migrated from Clouddriver.
pub const SOURCE_CLOUDDRIVER: &str = "clouddriver";
/// [`DynamicAccountRecord::source`] of an account added with Armory's dynamic route.
pub const SOURCE_DYNAMIC: &str = "dynamic";

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

#[cfg(test)]
mod tests {
    use super::*;

    fn body(value: Value) -> Vec<u8> {
        serde_json::to_vec(&value).unwrap()
    }

    fn valid() -> Value {
        serde_json::json!({
            "name": "dyn-a",
            "agent": "prod-agent",
            "mode": "SpinnakerService",
            "kubeconfigSecret": {"namespace": "spinnaker", "name": "dyn-a-kubeconfig"},
            "kinds": ["ConfigMap"],
            "namespaces": ["team-a"],
        })
    }

    #[test]
    fn a_valid_body_becomes_what_the_agent_is_sent() {
        let spec = parse_spec(&body(valid())).unwrap();
        assert_eq!(spec.mode, DynamicMode::SpinnakerService);
        let proto = spec.to_proto();
        assert_eq!(proto.account, "dyn-a");
        let secret = proto.kubeconfig_secret.unwrap();
        assert_eq!(
            (
                secret.namespace.as_str(),
                secret.name.as_str(),
                secret.key.as_str()
            ),
            ("spinnaker", "dyn-a-kubeconfig", "")
        );
        let settings: Value = serde_json::from_slice(&proto.settings_json).unwrap();
        assert_eq!(settings["kinds"], serde_json::json!(["ConfigMap"]));
        assert_eq!(settings["namespaces"], serde_json::json!(["team-a"]));
        let mut default_mode = valid();
        default_mode.as_object_mut().unwrap().remove("mode");
        assert_eq!(
            parse_spec(&body(default_mode)).unwrap().mode,
            DynamicMode::Infrastructure
        );
    }

    #[test]
    fn refusals_say_what_to_send_instead() {
        let with = |field: &str, value: Value| {
            let mut v = valid();
            v[field] = value;
            parse_spec(&body(v)).unwrap_err()
        };
        let err = with("kubeconfigContents", serde_json::json!("apiVersion: v1"));
        assert!(err.contains("kubeconfigSecret"), "{err}");
        assert!(err.contains("never carries kubeconfigs"), "{err}");
        let err = with("serviceAccount", serde_json::json!(true));
        assert!(err.contains("AgentAccount"), "{err}");
        let err = with("mode", serde_json::json!("Agent"));
        assert!(err.contains("mode Agent"), "{err}");
        let err = with("kindz", serde_json::json!(["Pod"]));
        assert!(err.contains("unknown field `kindz`"), "{err}");
        let err = with("agent", serde_json::json!(" "));
        assert!(err.contains("agent identity"), "{err}");
        let err = with("name", serde_json::json!("Not A Name"));
        assert!(err.contains("Not A Name"), "{err}");
        let err = with("kubeconfigSecret", serde_json::json!({"name": "Bad_Name"}));
        assert!(err.contains("lowercase DNS names"), "{err}");
        let err = with("omitKinds", serde_json::json!(["Secret"]));
        assert!(err.contains("not both"), "{err}");
        let err = parse_spec(b"[1]").unwrap_err();
        assert!(err.contains("kubeconfigSecret"), "{err}");
    }
}
