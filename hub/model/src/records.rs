//! The records the hub persists about accounts, the proxy's tokens and the agents' tokens:
//! what the store writes and reads back, and what the in-memory books hold.

use serde::{Deserialize, Serialize};

use crate::auth::Role;

/// Identifies one gRPC stream for the hub's lifetime.
pub type SessionId = u64;

/// The cluster an account is bound to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRecord {
    pub api_server_host: String,
    pub ca_fingerprint: String,
    pub kubernetes_version: String,
}

impl ClusterRecord {
    /// Same cluster: same API server host and CA fingerprint (the version may change).
    pub fn same_cluster(&self, other: &ClusterRecord) -> bool {
        self.api_server_host == other.api_server_host && self.ca_fingerprint == other.ca_fingerprint
    }

    pub fn describe(&self) -> String {
        if self.ca_fingerprint.is_empty() {
            format!("{} (CA: system roots)", self.api_server_host)
        } else {
            format!(
                "{} (CA sha256 {})",
                self.api_server_host, self.ca_fingerprint
            )
        }
    }
}

/// An account as persisted: its binding and the agent's last registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccountRecord {
    pub cluster: ClusterRecord,
    pub namespaces: Vec<String>,
    /// RegisterAccount.properties_json, parsed (null when empty or not JSON).
    pub properties: serde_json::Value,
}

/// The agent identity an account is bound to: the first that registered it. Kept after the
/// account's cache is removed at the end of the grace period; only an admin moves it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccountBinding {
    pub identity: String,
    /// Unix seconds.
    pub since: i64,
}

/// A token the hub issued, as stored (never the token itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRecord {
    /// Random id, for listing and revoking.
    pub id: String,
    /// The account a proxy token belongs to; empty for an API token.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub account: String,
    pub name: String,
    /// SHA-256 of the token, lowercase hex.
    pub sha256: String,
    /// Unix seconds.
    pub created: i64,
    /// Set for derived tokens (see the module docs): the generation it was derived for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
    /// Set for API tokens: what the token may do on the HTTP API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// A tombstone: the derived token of this account and name was revoked at `generation`.
    /// It opens nothing (its `sha256` is empty) and stays in the store so that no replica,
    /// now or after a restart, derives that generation or an earlier one again.
    #[serde(default, skip_serializing_if = "is_false")]
    pub revoked: bool,
    /// Unix seconds after which the token opens nothing. `None`: it does not expire (the
    /// Clouddriver token, and every record written before tokens had an expiry, which keep
    /// working as they did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<i64>,
    /// API tokens only: globs (`*` any run of characters) of the accounts the token may
    /// address on the account routes (`/api/v1/accounts/<name>/...`); empty: every account.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accounts: Vec<String>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl TokenRecord {
    /// `proxy` or `api`.
    pub fn kind(&self) -> &'static str {
        if self.role.is_some() { "api" } else { "proxy" }
    }

    /// Whether the token has expired at `now_unix` (Unix seconds).
    pub fn expired_at(&self, now_unix: i64) -> bool {
        self.expires.is_some_and(|expires| now_unix >= expires)
    }
}

/// What a token is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AgentTokenKind {
    /// One-time, for `Enroll`.
    Enrolment,
    /// Reusable until it expires, presented on the stream.
    Bearer,
}

impl AgentTokenKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentTokenKind::Enrolment => "enrolment",
            AgentTokenKind::Bearer => "bearer",
        }
    }

    /// "an enrolment token", "a bearer token".
    pub fn with_article(self) -> &'static str {
        match self {
            AgentTokenKind::Enrolment => "an enrolment token",
            AgentTokenKind::Bearer => "a bearer token",
        }
    }
}

/// An agent token as stored (never the token itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentTokenRecord {
    pub id: String,
    pub kind: AgentTokenKind,
    /// The identity an agent presenting the token gets.
    pub identity: String,
    /// Glob of the account names that identity may register.
    pub accounts: String,
    /// SHA-256 of the token, lowercase hex.
    pub sha256: String,
    /// Unix seconds.
    pub created: i64,
    pub expires: i64,
    /// When an enrolment token was used (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<i64>,
}

/// An identity that enrolled, with the account pattern of the token it enrolled with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnrolledIdentity {
    pub identity: String,
    pub accounts: String,
    /// Unix seconds of the last enrolment.
    pub enrolled: i64,
    /// The enrolment token's id.
    pub token_id: String,
}

/// What an admin decided about an agent identity (issue 28, F4/F17): disabled, or some of
/// its certificates denied by serial. Checked at stream authentication, at enrolment and at
/// every renewal; kept in the store so that it holds across restarts and replicas. An
/// identity without a record is enabled with no certificate denied.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentIdentityState {
    pub identity: String,
    /// When an admin disabled the identity (Unix seconds); `None`: enabled. A disabled
    /// identity opens no stream, enrols with no token and renews no certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<i64>,
    /// Why, as the admin said (shown in the refusals).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Serial numbers (lowercase hex, no leading zeros) of this identity's certificates
    /// that are refused wherever they are presented.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied_serials: Vec<String>,
    /// Unix seconds of the last change.
    pub updated: i64,
}

impl AgentIdentityState {
    /// Normalizes a serial as an admin may write it (`0A:1b`, `0x0a1b`, `a1b`) to the form
    /// kept: lowercase hex without separators or leading zeros. `None` when it is not hex.
    pub fn normalize_serial(serial: &str) -> Option<String> {
        let trimmed = serial.trim();
        let trimmed = trimmed
            .strip_prefix("0x")
            .or_else(|| trimmed.strip_prefix("0X"))
            .unwrap_or(trimmed);
        let hex: String = trimmed
            .chars()
            .filter(|c| !matches!(c, ':' | ' ' | '-'))
            .collect();
        if hex.is_empty() || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let hex = hex.to_ascii_lowercase();
        let stripped = hex.trim_start_matches('0');
        Some(if stripped.is_empty() { "0" } else { stripped }.to_string())
    }

    /// Whether the certificate of serial `serial` (normalized) is denied.
    pub fn denies_serial(&self, serial: &str) -> bool {
        self.denied_serials.iter().any(|s| s == serial)
    }
}
