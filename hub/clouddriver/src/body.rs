//! What the registrar sends, built without I/O: the `ManagedAccount` JSON body of the Account
//! Management API, the dynamic-config YAML, the body hash kept in the ledger, how a
//! Clouddriver answer is classified, and the retry delays.
//!
//! Sources (repository@commit path):
//! - the fields and their types: `spinnaker/clouddriver@0e494148` (and the same in
//!   `spinnaker/spinnaker@6f89b62d` under `clouddriver/`)
//!   `clouddriver-kubernetes/src/main/java/com/netflix/spinnaker/clouddriver/kubernetes/config/KubernetesAccountProperties.java`
//!   (`ManagedAccount`, `validate()`);
//! - the type discriminator: `spinnaker/clouddriver@ccf45789`
//!   `clouddriver-core/src/main/java/com/netflix/spinnaker/clouddriver/jackson/mixins/CredentialsDefinitionMixin.java`
//!   (`@JsonTypeInfo(use = NAME, property = "type")`), with `@JsonTypeName("kubernetes")` on
//!   `ManagedAccount`;
//! - unknown properties are ignored, not rejected: `spinnaker/clouddriver@1a81c481`
//!   `clouddriver-core/src/main/groovy/com/netflix/spinnaker/clouddriver/config/CloudDriverConfig.groovy`
//!   (`failOnUnknownProperties(false)`);
//! - permission keys: `spinnaker/fiat@04138a88`
//!   `fiat-core/src/main/java/com/netflix/spinnaker/fiat/model/Authorization.java` (`READ`,
//!   `WRITE`, `EXECUTE`, `CREATE`), the keys of `Permissions.Builder`
//!   (`.../model/resources/Permissions.java`, a `LinkedHashMap<Authorization, List<String>>`);
//! - answers: `spinnaker/spinnaker@0f06254e`
//!   `clouddriver/clouddriver-core/src/main/java/com/netflix/spinnaker/clouddriver/security/AccountDefinitionService.java`
//!   and `spinnaker/kork@261ccbac`
//!   `kork-web/src/main/java/com/netflix/spinnaker/kork/web/exceptions/GenericExceptionHandlers.java`.

use std::{
    collections::{BTreeMap, hash_map::RandomState},
    hash::{BuildHasher, Hasher},
    time::Duration,
};

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use super::{Backoff, DesiredAccount};

/// The type discriminator of `ManagedAccount` (`@JsonTypeName`).
pub const ACCOUNT_TYPE: &str = "kubernetes";

/// Clouddriver's `Authorization` values, the only keys `permissions` may have.
pub const AUTHORIZATIONS: [&str; 4] = ["READ", "WRITE", "EXECUTE", "CREATE"];

/// The JSON type of a `ManagedAccount` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    String,
    Bool,
    Integer,
    Strings,
    /// `Permissions.Builder`: `{READ: [roles], WRITE: [roles], ...}`.
    Permissions,
    /// A list of objects (`customResources`, `cachingPolicies`).
    Objects,
    /// One object (`rawResourcesEndpointConfig`).
    Object,
}

/// Every field of `ManagedAccount`, as Jackson names them. Lombok's `getOAuthServiceAccount`
/// makes Jackson 2 read `oauthServiceAccount`; both spellings are listed.
pub const MANAGED_ACCOUNT_FIELDS: &[(&str, FieldType)] = &[
    ("name", FieldType::String),
    ("environment", FieldType::String),
    ("accountType", FieldType::String),
    ("context", FieldType::String),
    ("oAuthServiceAccount", FieldType::String),
    ("oauthServiceAccount", FieldType::String),
    ("oAuthScopes", FieldType::Strings),
    ("oauthScopes", FieldType::Strings),
    ("kubeconfigFile", FieldType::String),
    ("kubeconfigContents", FieldType::String),
    ("kubectlExecutable", FieldType::String),
    ("kubectlRequestTimeoutSeconds", FieldType::Integer),
    ("serviceAccount", FieldType::Bool),
    ("namespaces", FieldType::Strings),
    ("omitNamespaces", FieldType::Strings),
    ("cacheThreads", FieldType::Integer),
    ("requiredGroupMembership", FieldType::Strings),
    ("permissions", FieldType::Permissions),
    ("namingStrategy", FieldType::String),
    ("debug", FieldType::Bool),
    ("metrics", FieldType::Bool),
    ("checkPermissionsOnStartup", FieldType::Bool),
    ("customResources", FieldType::Objects),
    ("cachingPolicies", FieldType::Objects),
    ("kinds", FieldType::Strings),
    ("omitKinds", FieldType::Strings),
    ("onlySpinnakerManaged", FieldType::Bool),
    ("cacheIntervalSeconds", FieldType::Integer),
    ("cacheAllApplicationRelationships", FieldType::Bool),
    ("rawResourcesEndpointConfig", FieldType::Object),
];

/// Fields the hub owns: the account must reach its cluster through the hub's kubeconfig and
/// nothing else. `serviceAccount: true` would make kubectl use Clouddriver's own in-cluster
/// credentials, `kubeconfigFile` and `context` would point elsewhere, and the OAuth fields add
/// a `--token` of their own to every kubectl call.
pub const HUB_OWNED_FIELDS: &[&str] = &[
    "name",
    "kubeconfigContents",
    "kubeconfigFile",
    "serviceAccount",
    "context",
    "oAuthServiceAccount",
    "oauthServiceAccount",
    "oAuthScopes",
    "oauthScopes",
];

/// The type of a `ManagedAccount` field, `None` for a name Clouddriver does not know.
pub fn field_type(name: &str) -> Option<FieldType> {
    MANAGED_ACCOUNT_FIELDS
        .iter()
        .find(|(field, _)| *field == name)
        .map(|(_, t)| *t)
}

/// Checks that `value` has the JSON type of field `name`.
pub fn check_field(name: &str, value: &Value) -> Result<(), String> {
    let Some(expected) = field_type(name) else {
        return Err(format!(
            "{name:?} is not a field of Clouddriver's ManagedAccount"
        ));
    };
    let strings = |v: &Value| v.as_array().is_some_and(|a| a.iter().all(Value::is_string));
    let ok = match expected {
        FieldType::String => value.is_string(),
        FieldType::Bool => value.is_boolean(),
        FieldType::Integer => value.is_i64() || value.is_u64(),
        FieldType::Strings => strings(value),
        FieldType::Objects => value
            .as_array()
            .is_some_and(|a| a.iter().all(Value::is_object)),
        FieldType::Object => value.is_object(),
        FieldType::Permissions => {
            return permissions(value).map(|_| ());
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} must be {expected:?}, not {value}"))
    }
}

/// Validates the operator's `--clouddriver-account-defaults`: only `ManagedAccount` fields,
/// with their JSON types, none of those the hub owns, and not both halves of a pair that
/// `ManagedAccount.validate()` rejects together. Every problem is reported.
pub fn check_defaults(defaults: &Map<String, Value>) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    for (key, value) in defaults {
        if key == "type" || key == "@type" {
            problems.push(format!(
                "{key:?} is set by the hub (always \"{ACCOUNT_TYPE}\")"
            ));
        } else if HUB_OWNED_FIELDS.contains(&key.as_str()) {
            problems.push(format!(
                "{key:?} is set by the hub: every account reaches its cluster through the hub's proxy"
            ));
        } else if let Err(e) = check_field(key, value) {
            problems.push(e);
        }
    }
    if let Err(e) = check_pairs(defaults) {
        problems.push(e);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Why an account's body cannot be built; the account is not registered until its settings
/// change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("the account name is empty")]
    EmptyName,
    #[error("the kubeconfig is empty")]
    EmptyKubeconfig,
    #[error("account setting {field:?}: {message}")]
    Invalid { field: String, message: String },
    #[error("{0}")]
    Conflict(String),
}

/// Parses `permissions`: keys are upper-cased (Fiat's Spring binding accepts any case, Jackson
/// only the enum names) and must be `Authorization` values; values are lists of roles.
/// Dropping an unknown key would widen access, so it is an error instead.
fn permissions(value: &Value) -> Result<Map<String, Value>, String> {
    let Some(map) = value.as_object() else {
        return Err(format!("permissions must be an object, not {value}"));
    };
    let mut out = Map::new();
    for (key, roles) in map {
        let upper = key.to_ascii_uppercase();
        if !AUTHORIZATIONS.contains(&upper.as_str()) {
            return Err(format!(
                "permissions: {key:?} is not one of Clouddriver's authorizations {AUTHORIZATIONS:?}"
            ));
        }
        if !roles
            .as_array()
            .is_some_and(|a| a.iter().all(Value::is_string))
        {
            return Err(format!("permissions.{key} must be a list of roles"));
        }
        out.insert(upper, roles.clone());
    }
    Ok(out)
}

fn non_empty(map: &Map<String, Value>, key: &str) -> bool {
    map.get(key)
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

/// `ManagedAccount.validate()`: not both `namespaces` and `omitNamespaces`, not both `kinds`
/// and `omitKinds`.
fn check_pairs(map: &Map<String, Value>) -> Result<(), String> {
    for (a, b) in [("namespaces", "omitNamespaces"), ("kinds", "omitKinds")] {
        if non_empty(map, a) && non_empty(map, b) {
            return Err(format!(
                "at most one of {a:?} and {b:?} can be set (ManagedAccount.validate())"
            ));
        }
    }
    Ok(())
}

fn strings_of(properties: &Map<String, Value>, key: &str) -> Result<Option<Value>, BodyError> {
    match properties.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) if v.as_array().is_some_and(|a| a.iter().all(Value::is_string)) => {
            Ok(v.as_array().filter(|a| !a.is_empty()).map(|_| v.clone()))
        }
        Some(v) => Err(BodyError::Invalid {
            field: key.into(),
            message: format!("must be a list of strings, not {v}"),
        }),
    }
}

/// The `ManagedAccount` fields for one account (no type discriminator): the defaults, then
/// what the agent's settings say, then the name and kubeconfig.
///
/// From the agent's settings only these are passed on, because only these mean the same in
/// Clouddriver:
/// - `permissions` (READ/WRITE/... roles; Fiat enforces them on the account);
/// - `namespaces` / `omitNamespaces` (plain namespace names in both; they limit what
///   Clouddriver caches and deploys to, as they limit what the agent watches).
///
/// Left out on purpose:
/// - `kinds` / `omitKinds`: the spellings differ. The agent accepts `Deployment`,
///   `deployments`, `Deployment.apps` and `deployments.apps`; Clouddriver's
///   `KubernetesKind.fromString` (`clouddriver-kubernetes/.../description/manifest/
///   KubernetesKind.java`) splits on the first `.` and matches only the singular kind or its
///   short alias (`deploy`), so `deployments` becomes an unknown kind (read at
///   `spinnaker/clouddriver@098ad77b`). The meaning differs too: in Clouddriver they limit
///   what the account may deploy (`KubernetesCredentials.getKindStatus` answers
///   `MISSING_FROM_ALLOWED_KINDS`), while the agent's limit only what it streams (the proxy
///   tunnels the other kinds). An operator who wants Clouddriver's limits sets them in the
///   defaults.
/// - `serviceAccount`, `kubeconfigFile`, `context`: they describe how the agent reaches its
///   cluster; passed on they would make Clouddriver bypass the hub (see
///   [`HUB_OWNED_FIELDS`]).
/// - `onlyNamespacedResources`, `customResourceDefinitions`, `metrics`: no `ManagedAccount`
///   field with that meaning (`metrics` there turns Clouddriver's `kubectl top` calls on).
///
/// The agent's `permissions` replace those of the defaults, and its `namespaces` or
/// `omitNamespaces` replace both of the defaults' (so the pair never conflicts).
pub fn managed_account(
    account: &DesiredAccount,
    defaults: &Map<String, Value>,
) -> Result<Map<String, Value>, BodyError> {
    if account.name.is_empty() {
        return Err(BodyError::EmptyName);
    }
    if account.kubeconfig.trim().is_empty() {
        return Err(BodyError::EmptyKubeconfig);
    }
    let empty = Map::new();
    let properties = match &account.properties {
        Value::Object(map) => map,
        Value::Null => &empty,
        other => {
            return Err(BodyError::Invalid {
                field: "properties".into(),
                message: format!("must be an object, not {other}"),
            });
        }
    };
    let mut body = defaults.clone();
    match properties.get("permissions") {
        None | Some(Value::Null) => {}
        Some(value) => {
            let perms = permissions(value).map_err(|message| BodyError::Invalid {
                field: "permissions".into(),
                message,
            })?;
            if !perms.is_empty() {
                body.insert("permissions".into(), Value::Object(perms));
            }
        }
    }
    let namespaces = strings_of(properties, "namespaces")?;
    let omit_namespaces = strings_of(properties, "omitNamespaces")?;
    if namespaces.is_some() || omit_namespaces.is_some() {
        body.remove("namespaces");
        body.remove("omitNamespaces");
    }
    if let Some(v) = namespaces {
        body.insert("namespaces".into(), v);
    }
    if let Some(v) = omit_namespaces {
        body.insert("omitNamespaces".into(), v);
    }
    check_pairs(&body).map_err(BodyError::Conflict)?;
    body.insert("name".into(), Value::String(account.name.clone()));
    body.insert(
        "kubeconfigContents".into(),
        Value::String(account.kubeconfig.clone()),
    );
    Ok(body)
}

/// The body of `PUT /credentials`: the `ManagedAccount` fields plus the type discriminator.
///
/// Jackson reads the discriminator from `type` (Clouddriver's `CredentialsDefinitionMixin`,
/// and the payloads in its own tests); spinnaker.io's account-management page documents
/// `@type`. Clouddriver ignores unknown properties, so both are sent: whichever one a
/// Clouddriver version reads, the other is ignored.
pub fn api_body(
    account: &DesiredAccount,
    defaults: &Map<String, Value>,
) -> Result<Map<String, Value>, BodyError> {
    managed_account(account, defaults).map(with_type)
}

/// `ManagedAccount` fields plus the type discriminator (see [`api_body`]).
pub fn with_type(mut managed: Map<String, Value>) -> Map<String, Value> {
    managed.insert("type".into(), Value::String(ACCOUNT_TYPE.into()));
    managed.insert("@type".into(), Value::String(ACCOUNT_TYPE.into()));
    managed
}

/// Object keys sorted at every level, so equal bodies hash equal whatever the map order.
fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, Value> =
                map.iter().map(|(k, v)| (k, canonical(v))).collect();
            Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 (hex) of the canonical JSON of `body`: what the ledger keeps. It covers the
/// kubeconfig, so a rotated token is registered again. The body itself (a bearer token) is
/// never stored.
pub fn body_hash(body: &Map<String, Value>) -> String {
    let text = canonical(&Value::Object(body.clone())).to_string();
    hex(ring::digest::digest(&ring::digest::SHA256, text.as_bytes()).as_ref())
}

/// SHA-256 (hex) of some bytes (the file's contents).
pub fn bytes_hash(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// One account in the dynamic-config file: `name` first, the kubeconfig as a `|` block.
struct FileAccount<'a>(&'a Map<String, Value>);

impl Serialize for FileAccount<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        if let Some(name) = self.0.get("name") {
            map.serialize_entry("name", name)?;
        }
        if let Some(Value::String(k)) = self.0.get("kubeconfigContents") {
            map.serialize_entry("kubeconfigContents", &serde_saphyr::LitStr(k))?;
        }
        for (key, value) in self.0 {
            if key != "name" && key != "kubeconfigContents" {
                map.serialize_entry(key, value)?;
            }
        }
        map.end()
    }
}

#[derive(serde::Serialize)]
struct FileDoc<'a> {
    kubernetes: FileKubernetes<'a>,
}

#[derive(serde::Serialize)]
struct FileKubernetes<'a> {
    accounts: Vec<FileAccount<'a>>,
}

/// The first lines of the file: it is generated, and it owns `kubernetes.accounts`.
pub const FILE_HEADER: &str = "\
# Written by scale-agent-hub: every Kubernetes account Clouddriver reaches through the hub.
# Do not edit: the hub rewrites this file whenever its accounts change. Spring replaces the
# list kubernetes.accounts as a whole, so accounts defined elsewhere are hidden while this
# file is loaded.
";

/// The dynamic-config YAML for these accounts (`ManagedAccount` fields each, in the given
/// order): `kubernetes: accounts: [...]`, loaded by Clouddriver's
/// `ModifiableFilePropertySources` as its highest-priority property source.
pub fn accounts_file(accounts: &[Map<String, Value>]) -> Result<String, String> {
    let doc = FileDoc {
        kubernetes: FileKubernetes {
            accounts: accounts.iter().map(FileAccount).collect(),
        },
    };
    let mut options = serde_saphyr::SerializerOptions::default();
    // Only the kubeconfig is a block scalar; other long strings stay plain scalars.
    options.prefer_block_scalars = false;
    let yaml = serde_saphyr::to_string_with_options(&doc, options).map_err(|e| e.to_string())?;
    Ok(format!("{FILE_HEADER}{yaml}"))
}

/// An HTTP method the registrar uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Put,
    Delete,
    /// Reading definitions (`GET /credentials/type/{type}`, for migrating accounts).
    Get,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Get => "GET",
        }
    }
}

/// What to do after Clouddriver answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Registered, or removed.
    Done,
    /// Clouddriver is busy, restarting or failing: retry with backoff.
    Retry { status: u16, message: String },
    /// Clouddriver refused the request: retrying soon will not help; an operator must change
    /// something (`hint` says what).
    Rejected {
        status: u16,
        message: String,
        hint: &'static str,
    },
}

/// The `message` of a Spring/kork error body (`{"error":..,"message":..,"status":..}`, see
/// kork-web `GenericExceptionHandlers`), else the start of the text.
pub fn error_message(body: &[u8]) -> String {
    const MAX: usize = 300;
    let text = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            v.get("message")
                .and_then(Value::as_str)
                .or_else(|| v.get("error").and_then(Value::as_str))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
    if text.chars().count() > MAX {
        let cut: String = text.chars().take(MAX).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// Classifies Clouddriver's answer (`CredentialsController`, `AccountDefinitionService`,
/// kork-web's `GenericExceptionHandlers`).
pub fn classify(method: Method, status: u16, body: &[u8]) -> Outcome {
    if (200..300).contains(&status) {
        return Outcome::Done;
    }
    let message = error_message(body);
    if method == Method::Delete
        && (status == 404 || (status == 400 && message.contains("does not exist")))
    {
        // Already gone (404; Spinnaker 1.28's deleteAccount answered 400 "Cannot delete an
        // account which does not exist").
        return Outcome::Done;
    }
    if message.contains("AccountDefinitionService") {
        // validateAccountStorageEnabled(): a ConfigurationException, whatever its status.
        return Outcome::Rejected {
            status,
            message,
            hint: "Clouddriver's account storage is off: set account.storage.enabled and \
                   account.storage.kubernetes.enabled (and an SQL connection pool) in \
                   clouddriver-local.yml, or use --clouddriver-accounts-file instead",
        };
    }
    match status {
        408 | 409 | 425 | 429 => Outcome::Retry { status, message },
        s if s >= 500 => Outcome::Retry { status, message },
        401 => Outcome::Rejected {
            status,
            message,
            hint: "Clouddriver wants authentication: point --clouddriver-url at Clouddriver \
                   itself (port 7002), not at Gate",
        },
        403 => Outcome::Rejected {
            status,
            message,
            hint: "the --clouddriver-user is not allowed: with Fiat it must be an account manager \
                   (or admin) and have WRITE on accounts it overwrites",
        },
        400 if message.contains("permissions for current user") => Outcome::Rejected {
            status,
            message,
            hint: "the account's permissions must grant a role of --clouddriver-user (or make \
                   that user a Spinnaker admin)",
        },
        404 | 405 => Outcome::Rejected {
            status,
            message,
            hint: "no Account Management API there: --clouddriver-url must be Clouddriver's base \
                   URL, and Spinnaker must be 1.29 or later (PUT /credentials upserts since then)",
        },
        _ => Outcome::Rejected {
            status,
            message,
            hint: "Clouddriver refused the account definition: check \
                   --clouddriver-account-defaults and the agent's account settings",
        },
    }
}

/// The delay before retry number `failures` (1 = after the first failure): `initial ×
/// factor^(failures-1)`, at most `max`, then ±20% jitter (`unit` in [0, 1)).
pub fn backoff_delay(backoff: &Backoff, failures: u32, unit: f64) -> Duration {
    let exponent = failures.saturating_sub(1).min(63);
    let factor = f64::from(backoff.factor.max(1)).powi(exponent as i32);
    let base = (backoff.initial.as_secs_f64() * factor).min(backoff.max.as_secs_f64());
    let jittered = base * (0.8 + 0.4 * unit.clamp(0.0, 1.0));
    Duration::from_secs_f64(jittered.max(0.0))
}

/// A random number in [0, 1) from the standard library's per-process random keys (good
/// enough to spread retries; no extra dependency).
pub fn jitter_unit() -> f64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u8(0);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The secrets in a kubeconfig (`token:`, `password:` and `client-key-data:` values), to
/// scrub from error messages.
pub fn kubeconfig_secrets(kubeconfig: &str) -> Vec<String> {
    kubeconfig
        .lines()
        .filter_map(|line| {
            let line = line.trim().trim_start_matches("- ");
            ["token:", "password:", "client-key-data:"]
                .iter()
                .find_map(|key| line.strip_prefix(key))
        })
        .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
        .filter(|v| v.len() >= 8)
        .collect()
}

/// Replaces every secret in `text` (Clouddriver may quote parts of a body it failed to read).
pub fn redact(text: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .fold(text.to_owned(), |t, s| t.replace(s.as_str(), "<redacted>"))
}

/// Percent-encodes an account name for a URL path segment.
pub fn path_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests;
