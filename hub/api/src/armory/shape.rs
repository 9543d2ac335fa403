//! Armory's account bodies mapped onto the hub's dynamic accounts, and back.
//!
//! Armory's plugin stores an account's whole `kubernetes.accounts[]` definition and sends it
//! to agents chosen by `zoneId`; the hub keeps a [`DynamicAccountSpec`] for one agent
//! identity, whose kubeconfig is a Secret in the agent's cluster. So:
//!
//! - `zoneId` is the agent identity (`GET /api/v1/agents` lists them). Without one, Armory
//!   broadcasts to every agent; the hub takes the one identity connected, and refuses when
//!   there are several (the request must say which).
//! - `kubeconfigFile`, `kubeconfigContents` and `kubeconfigAgent` (the agent's own, which
//!   wins) are accepted as Spinnaker's Kubernetes secret references,
//!   `encryptedFile:k8s!n:<secret>!k:<key>` and `encrypted:k8s!n:<secret>!k:<key>`: a Secret
//!   in the agent's namespace, which is what the hub's dynamic accounts read. A path or an
//!   inline kubeconfig is refused (the hub never carries kubeconfigs), as is
//!   `serviceAccount: true` (the agent's own ServiceAccount is declared in its config).
//! - `context`, `namespaces`, `omitNamespaces`, `kinds`, `omitKinds`,
//!   `onlyNamespacedResources` and `permissions` carry over as they are.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use scale_agent_hub_model::dynamic_accounts::{
    DynamicAccountRecord, DynamicAccountSpec, SecretKeyRef, parse_spec,
};
use scale_agent_hub_state::Live;

/// The fields carried over unchanged.
const SETTINGS: &[&str] = &[
    "context",
    "namespaces",
    "omitNamespaces",
    "kinds",
    "omitKinds",
    "onlyNamespacedResources",
    "permissions",
];

/// The fields Armory's dynamic routes take (beside [`SETTINGS`]): anything else in a body of
/// `POST`/`PUT /armory/accounts/dynamic` is refused with this list.
const ACCEPTED: &[&str] = &[
    "name",
    "type",
    "zoneId",
    "kubeconfigFile",
    "kubeconfigContents",
    "kubeconfigAgent",
    "serviceAccount",
];

/// A Spinnaker secret reference (`encrypted:` or `encryptedFile:`) of the Kubernetes secret
/// engine, as the Secret it names: `k8s!n:<name>!k:<key>`, in the agent's namespace.
pub(crate) fn secret_reference(field: &str, value: &str) -> Result<SecretKeyRef, String> {
    let refused = || {
        format!(
            "`{field}` {value:?} is not accepted: the hub never carries kubeconfigs, and a file \
             in the agent's pod is declared in the agent's own config. Store the kubeconfig in a \
             Secret in the agent's namespace and name it as \
             \"encryptedFile:k8s!n:<secret>!k:<key>\""
        )
    };
    let reference = value
        .strip_prefix("encryptedFile:")
        .or_else(|| value.strip_prefix("encrypted:"))
        .ok_or_else(refused)?;
    let mut parts = reference.split('!');
    let engine = parts.next().unwrap_or_default();
    if engine != "k8s" {
        return Err(format!(
            "`{field}` {value:?} uses the secret engine {engine:?}: only Kubernetes Secrets \
             (\"encryptedFile:k8s!n:<secret>!k:<key>\") map to the hub's dynamic accounts, \
             which the agent reads from its own cluster"
        ));
    }
    let (mut name, mut key) = (String::new(), String::new());
    for part in parts {
        match part.split_once(':') {
            Some(("n", v)) => name = v.to_string(),
            Some(("k", v)) => key = v.to_string(),
            _ => {
                return Err(format!(
                    "`{field}` {value:?}: {part:?} is not a parameter of the k8s secret engine \
                     (n:<secret name>, k:<key>)"
                ));
            }
        }
    }
    if name.is_empty() {
        return Err(format!(
            "`{field}` {value:?} names no Secret: add \"!n:<secret name>\""
        ));
    }
    Ok(SecretKeyRef {
        namespace: String::new(),
        name,
        key,
    })
}

/// The reference Armory's bodies use for `secret`.
pub(crate) fn reference_of(secret: &SecretKeyRef) -> String {
    let mut reference = format!("encryptedFile:k8s!n:{}", secret.name);
    if !secret.key.is_empty() {
        reference.push_str(&format!("!k:{}", secret.key));
    }
    reference
}

/// The agent identity for `zone_id`, or the one identity connected now.
pub(crate) fn agent_of(live: &Live, zone_id: Option<&str>) -> Result<String, String> {
    if let Some(zone) = zone_id.filter(|z| !z.trim().is_empty()) {
        return Ok(zone.to_string());
    }
    let identities: BTreeSet<String> = live
        .registry_read()
        .sessions
        .values()
        .map(|s| s.identity.clone())
        .collect();
    let mut identities = identities.into_iter();
    match (identities.next(), identities.next()) {
        (Some(only), None) => Ok(only),
        (None, _) => Err(
            "no `zoneId` and no agent connected: set `zoneId` to the identity of \
             the agent that serves the account (the hub sends an account to one agent \
             identity; it does not broadcast)"
                .into(),
        ),
        (Some(a), Some(b)) => Err(format!(
            "no `zoneId` and several agents are connected ({a:?}, {b:?}, ...): set `zoneId` to \
             the identity of the agent that serves the account (GET /api/v1/agents lists them)"
        )),
    }
}

/// What the request may override of a definition when migrating or activating it
/// (`AddAgentAccountRequest`: `zoneId`, `kubeconfigFile`).
#[derive(Debug, Default)]
pub(crate) struct Overrides<'a> {
    pub zone_id: Option<&'a str>,
    pub kubeconfig_file: Option<&'a str>,
}

/// A hub spec from an Armory (or Clouddriver) account `definition`. `strict`: refuse fields
/// that are neither mapped nor accepted (Armory's own routes); a definition read from
/// Clouddriver keeps its Clouddriver-only fields (caching, `providerVersion`, ...) there, and
/// they are returned as ignored.
pub(crate) fn spec_of(
    live: &Live,
    definition: &Map<String, Value>,
    overrides: &Overrides<'_>,
    strict: bool,
) -> Result<(DynamicAccountSpec, Vec<String>), String> {
    let name = definition
        .get("name")
        .and_then(Value::as_str)
        .ok_or("the account has no `name`")?;
    let mut ignored = Vec::new();
    for field in definition.keys() {
        if !SETTINGS.contains(&field.as_str()) && !ACCEPTED.contains(&field.as_str()) {
            ignored.push(field.clone());
        }
    }
    if strict && !ignored.is_empty() {
        return Err(format!(
            "account {name:?}: the hub does not apply {}; it takes {} and {}",
            ignored.join(", "),
            ACCEPTED.join(", "),
            SETTINGS.join(", ")
        ));
    }
    if let Some(kind) = definition.get("type").and_then(Value::as_str)
        && kind != "kubernetes"
    {
        return Err(format!(
            "account {name:?} has type {kind:?}: only Kubernetes accounts are served by agents"
        ));
    }
    if definition
        .get("serviceAccount")
        .is_some_and(|v| v.as_bool() != Some(false))
    {
        return Err(format!(
            "account {name:?} uses the agent's own ServiceAccount (`serviceAccount`): declare \
             it in the agent's config; a dynamic account names a kubeconfig Secret \
             (\"encryptedFile:k8s!n:<secret>!k:<key>\")"
        ));
    }
    let text = |field: &str| definition.get(field).and_then(Value::as_str);
    // The agent's own kubeconfig wins over the account's (Armory's `kubeconfigAgent`), and
    // the request's `kubeconfigFile` over the stored definition's.
    let source = [
        ("kubeconfigFile", overrides.kubeconfig_file),
        ("kubeconfigAgent", text("kubeconfigAgent")),
        ("kubeconfigFile", text("kubeconfigFile")),
        ("kubeconfigContents", text("kubeconfigContents")),
    ]
    .into_iter()
    .find_map(|(field, value)| value.filter(|v| !v.is_empty()).map(|v| (field, v)));
    let Some((field, value)) = source else {
        return Err(format!(
            "account {name:?} has no kubeconfig: set `kubeconfigFile` to the Secret holding it, \
             \"encryptedFile:k8s!n:<secret>!k:<key>\""
        ));
    };
    let secret = secret_reference(field, value).map_err(|e| format!("account {name:?}: {e}"))?;
    let zone = overrides.zone_id.or(text("zoneId"));
    let agent = agent_of(live, zone).map_err(|e| format!("account {name:?}: {e}"))?;
    let mut body = Map::new();
    body.insert("name".into(), json!(name));
    body.insert("agent".into(), json!(agent));
    body.insert(
        "kubeconfigSecret".into(),
        serde_json::to_value(&secret).unwrap_or_default(),
    );
    for field in SETTINGS {
        if let Some(value) = definition.get(*field).filter(|v| !v.is_null()) {
            body.insert((*field).into(), value.clone());
        }
    }
    let bytes = serde_json::to_vec(&Value::Object(body)).unwrap_or_default();
    let spec = parse_spec(&bytes).map_err(|e| format!("account {name:?}: {e}"))?;
    Ok((spec, ignored))
}

/// The state Armory shows for a dynamic account: INACTIVE until activated; once active, the
/// hub's state of the account when an agent registered it, FAILED when an agent reported it
/// could not load it, else ACTIVATING (Armory's transient state: sent, not yet registered).
pub(crate) fn armory_state(live: &Live, record: &DynamicAccountRecord) -> String {
    if record.inactive {
        return "INACTIVE".into();
    }
    let name = &record.spec.name;
    if let Some(state) = live.registry_read().states.get(name) {
        return state.state.as_str().into();
    }
    if live
        .dynamic_accounts()
        .reports(name)
        .iter()
        .any(|r| r.state == "FAILED")
    {
        return "FAILED".into();
    }
    "ACTIVATING".into()
}

/// A dynamic account as Armory's bodies show it (`GET /armory/accounts/{name}`): the fields
/// Armory's dynamic routes take, and its state.
pub(crate) fn definition_of(live: &Live, record: &DynamicAccountRecord) -> Value {
    let spec = &record.spec;
    let mut body = json!({
        "name": spec.name,
        "type": "kubernetes",
        "zoneId": spec.agent,
        "kubeconfigFile": reference_of(&spec.kubeconfig_secret),
        "state": armory_state(live, record),
        "source": if record.source.is_empty() { "hub" } else { record.source.as_str() },
    });
    let settings = serde_json::to_value(spec).unwrap_or_default();
    for field in SETTINGS {
        if let Some(value) = settings.get(*field) {
            body[*field] = value.clone();
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_secret_references_name_a_secret_and_others_say_what_to_send() {
        let secret =
            secret_reference("kubeconfigFile", "encryptedFile:k8s!n:kc-prod!k:config").unwrap();
        assert_eq!(
            (secret.name.as_str(), secret.key.as_str()),
            ("kc-prod", "config")
        );
        assert_eq!(
            reference_of(&secret),
            "encryptedFile:k8s!n:kc-prod!k:config"
        );
        let secret = secret_reference("kubeconfigContents", "encrypted:k8s!n:kc").unwrap();
        assert_eq!((secret.name.as_str(), secret.key.as_str()), ("kc", ""));
        let err = secret_reference("kubeconfigFile", "/home/spinnaker/.kube/config").unwrap_err();
        assert!(err.contains("Store the kubeconfig in a Secret"), "{err}");
        let err = secret_reference("kubeconfigFile", "encryptedFile:s3!r:us!b:x!f:y").unwrap_err();
        assert!(err.contains("secret engine \"s3\""), "{err}");
        let err = secret_reference("kubeconfigFile", "encrypted:k8s!k:config").unwrap_err();
        assert!(err.contains("names no Secret"), "{err}");
    }
}
