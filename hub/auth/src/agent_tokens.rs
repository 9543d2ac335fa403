//! Agent tokens: what the hub issues to let an agent in without a certificate it already
//! holds. Each is bound to an identity and an account-name pattern (a glob, as `--allow`),
//! and expires.
//!
//! - An *enrolment* token is used once: `Enroll` trades it and a CSR for a certificate of
//!   that identity, and the identity's pattern is remembered ([`EnrolledIdentity`]) to be
//!   enforced at every registration of that identity.
//! - A *bearer* token is presented on the stream (`authorization: Bearer`) until it expires
//!   or is revoked, instead of or besides a client certificate.
//!
//! Like the proxy's tokens, only the SHA-256 of a token is kept (32 random bytes: nothing
//! to guess, so a fast hash is enough); a used or expired token stays listed until revoked,
//! so a second use is refused with the reason rather than as unknown.

use std::collections::{BTreeMap, HashMap};

use base64::Engine as _;
use ring::digest;
use scale_agent_hub_model::{error::Result, store_op::StoreOp};

use crate::tokens::random_bytes;

/// Every agent token starts with this (secret scanners, logs).
pub const AGENT_TOKEN_PREFIX: &str = "saa_";

pub use scale_agent_hub_model::records::{AgentTokenKind, AgentTokenRecord, EnrolledIdentity};

/// Why a token was refused. The message says what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Not a token this hub issued (or revoked).
    Unknown(String),
    /// Known, but not usable: used, expired, or of the other kind.
    Unusable(String),
}

impl TokenRefusal {
    pub fn to_status(&self) -> tonic::Status {
        match self {
            TokenRefusal::Unknown(m) => tonic::Status::unauthenticated(m.clone()),
            TokenRefusal::Unusable(m) => tonic::Status::permission_denied(m.clone()),
        }
    }
}

fn hash(token: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, token.as_bytes()).as_ref());
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn time(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| unix.to_string())
}

/// The command that issues a new token for `identity`.
fn issue_hint(kind: AgentTokenKind, identity: &str, accounts: &str) -> String {
    format!(
        "issue a new one with `scale-agent-hub agent-token create --identity {identity} \
         --accounts '{accounts}' --ttl 1h{}`",
        if kind == AgentTokenKind::Enrolment {
            " --once"
        } else {
            ""
        }
    )
}

/// The hub's agent tokens and enrolled identities.
#[derive(Default)]
pub struct AgentTokens {
    records: BTreeMap<String, AgentTokenRecord>,
    by_hash: HashMap<String, String>,
    enrolled: BTreeMap<String, EnrolledIdentity>,
}

impl std::fmt::Debug for AgentTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTokens")
            .field("records", &self.records.len())
            .field("enrolled", &self.enrolled.len())
            .finish_non_exhaustive()
    }
}

impl AgentTokens {
    /// As stored.
    pub fn load(records: Vec<AgentTokenRecord>, enrolled: Vec<EnrolledIdentity>) -> Self {
        let mut tokens = AgentTokens::default();
        for record in records {
            tokens.insert(record);
        }
        for e in enrolled {
            tokens.enrolled.insert(e.identity.clone(), e);
        }
        tokens
    }

    /// Replaces every token and enrolment with the store's (replicas sharing a store: what
    /// the others issued, used and revoked).
    pub fn replace(&mut self, records: Vec<AgentTokenRecord>, enrolled: Vec<EnrolledIdentity>) {
        *self = AgentTokens::load(records, enrolled);
    }

    /// Adds (or brings up to date) a token looked up in the shared store.
    pub fn learn(&mut self, record: AgentTokenRecord) {
        if let Some(old) = self.records.remove(&record.id) {
            self.by_hash.remove(&old.sha256);
        }
        self.insert(record);
    }

    /// Adds (or brings up to date) an enrolment looked up in the shared store.
    pub fn learn_enrolled(&mut self, enrolled: EnrolledIdentity) {
        self.enrolled.insert(enrolled.identity.clone(), enrolled);
    }

    /// The record of a presented token, whatever its state.
    pub fn find(&self, token: &str) -> Option<&AgentTokenRecord> {
        self.by_hash
            .get(&hex(&hash(token)))
            .and_then(|id| self.records.get(id))
    }

    fn insert(&mut self, record: AgentTokenRecord) {
        self.by_hash
            .insert(record.sha256.clone(), record.id.clone());
        self.records.insert(record.id.clone(), record);
    }

    /// Issues a token. Returns the token (shown once), its record and the ops to store.
    pub fn issue(
        &mut self,
        kind: AgentTokenKind,
        identity: &str,
        accounts: &str,
        ttl_seconds: i64,
        now_unix: i64,
    ) -> Result<(String, AgentTokenRecord, Vec<StoreOp>)> {
        let token = format!(
            "{AGENT_TOKEN_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes::<32>()?)
        );
        let record = AgentTokenRecord {
            id: hex(&random_bytes::<8>()?),
            kind,
            identity: identity.to_string(),
            accounts: accounts.to_string(),
            sha256: hex(&hash(&token)),
            created: now_unix,
            expires: now_unix.saturating_add(ttl_seconds),
            used: None,
        };
        self.insert(record.clone());
        let ops = vec![StoreOp::PutAgentToken {
            record: record.clone(),
        }];
        Ok((token, record, ops))
    }

    /// The record of a presented token of `kind`, if it may be used now.
    pub fn check(
        &self,
        token: &str,
        kind: AgentTokenKind,
        now_unix: i64,
    ) -> Result<&AgentTokenRecord, TokenRefusal> {
        let record = self.find(token).ok_or_else(|| {
            TokenRefusal::Unknown(format!(
                "the {} token is not one this hub issued (or it was revoked); ask the hub's \
                     admin for a new one (`scale-agent-hub agent-token create`)",
                kind.as_str()
            ))
        })?;
        if record.kind != kind {
            return Err(TokenRefusal::Unusable(format!(
                // troubleshooting: an agent's stream or enrolment refused: gRPC `PERMISSION_DENIED`
                // An enrolment token was presented as a bearer token (`clouddriver.auth.tokenFile`)
                // or the reverse (`clouddriver.auth.enrolmentTokenFile`). Put it where its kind
                // goes, or issue one of the right kind.
                "token {} is {}, not {}; {}",
                record.id,
                record.kind.with_article(),
                kind.with_article(),
                issue_hint(kind, &record.identity, &record.accounts)
            )));
        }
        if let Some(used) = record.used {
            return Err(TokenRefusal::Unusable(format!(
                // troubleshooting: enrolment refused: gRPC `PERMISSION_DENIED`
                // An enrolment token works once. Issue a new one (`scale-agent-hub agent-token
                // create --once`); see [Identities and security](../concepts/identities.md).
                "enrolment token {} was already used at {} (an enrolment token works once); {}",
                record.id,
                time(used),
                issue_hint(kind, &record.identity, &record.accounts)
            )));
        }
        if now_unix >= record.expires {
            return Err(TokenRefusal::Unusable(format!(
                // troubleshooting: enrolment or stream refused: gRPC `PERMISSION_DENIED`
                // Agent tokens carry the `--ttl` they were issued with. Issue a new one.
                "{} token {} for identity {:?} expired at {}; {}",
                kind.as_str(),
                record.id,
                record.identity,
                time(record.expires),
                issue_hint(kind, &record.identity, &record.accounts)
            )));
        }
        Ok(record)
    }

    /// Marks an enrolment token used and remembers its identity's account pattern.
    pub fn consume(&mut self, id: &str, now_unix: i64) -> Vec<StoreOp> {
        let Some(record) = self.records.get_mut(id) else {
            return Vec::new();
        };
        record.used = Some(now_unix);
        let enrolled = EnrolledIdentity {
            identity: record.identity.clone(),
            accounts: record.accounts.clone(),
            enrolled: now_unix,
            token_id: record.id.clone(),
        };
        let ops = vec![
            StoreOp::PutAgentToken {
                record: record.clone(),
            },
            StoreOp::PutEnrolledIdentity {
                record: enrolled.clone(),
            },
        ];
        self.enrolled.insert(enrolled.identity.clone(), enrolled);
        ops
    }

    /// The account pattern of an enrolled identity.
    pub fn enrolled(&self, identity: &str) -> Option<&EnrolledIdentity> {
        self.enrolled.get(identity)
    }

    /// Whether this hub issues credentials to `identity`: it enrolled, or an agent token
    /// (of either kind, in any state) names it. Such an identity is the hub's own, and a
    /// certificate of the external CA may not take it.
    pub fn issued_to(&self, identity: &str) -> bool {
        self.enrolled.contains_key(identity)
            || self.records.values().any(|r| r.identity == identity)
    }

    /// Every token, oldest first.
    pub fn list(&self) -> Vec<AgentTokenRecord> {
        let mut list: Vec<_> = self.records.values().cloned().collect();
        list.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        list
    }

    /// Whether the token with this id is held (not revoked).
    pub fn holds(&self, id: &str) -> bool {
        self.records.contains_key(id)
    }

    /// Forgets a token.
    pub fn revoke(&mut self, id: &str) -> Option<(AgentTokenRecord, Vec<StoreOp>)> {
        let record = self.records.remove(id)?;
        self.by_hash.remove(&record.sha256);
        Some((
            record,
            vec![StoreOp::DeleteAgentToken { id: id.to_string() }],
        ))
    }
}

pub use scale_agent_hub_model::names::accounts_allow;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enrolment_tokens_work_once_and_expire() {
        let mut tokens = AgentTokens::default();
        let (token, record, ops) = tokens
            .issue(AgentTokenKind::Enrolment, "prod-agent", "prod-*", 60, 1000)
            .unwrap();
        assert!(token.starts_with(AGENT_TOKEN_PREFIX));
        assert_eq!(ops.len(), 1);
        assert!(!record.sha256.contains(&token));
        let ok = tokens
            .check(&token, AgentTokenKind::Enrolment, 1010)
            .unwrap();
        assert_eq!(ok.identity, "prod-agent");
        let err = tokens
            .check(&token, AgentTokenKind::Bearer, 1010)
            .unwrap_err();
        assert!(matches!(err, TokenRefusal::Unusable(m) if m.contains("not a bearer token")));
        let err = tokens
            .check(&token, AgentTokenKind::Enrolment, 1060)
            .unwrap_err();
        assert!(
            matches!(&err, TokenRefusal::Unusable(m) if m.contains("expired") && m.contains("agent-token create --identity prod-agent --accounts 'prod-*' --ttl 1h --once")),
            "{err:?}"
        );
        let ops = tokens.consume(&record.id, 1020);
        assert_eq!(ops.len(), 2);
        assert_eq!(tokens.enrolled("prod-agent").unwrap().accounts, "prod-*");
        let err = tokens
            .check(&token, AgentTokenKind::Enrolment, 1021)
            .unwrap_err();
        assert!(
            matches!(&err, TokenRefusal::Unusable(m) if m.contains("already used")),
            "{err:?}"
        );
        let err = tokens
            .check("saa_nope", AgentTokenKind::Enrolment, 1021)
            .unwrap_err();
        assert!(matches!(err, TokenRefusal::Unknown(_)));
        assert!(tokens.revoke(&record.id).is_some());
        assert!(matches!(
            tokens.check(&token, AgentTokenKind::Enrolment, 1021),
            Err(TokenRefusal::Unknown(_))
        ));
    }

    #[test]
    fn patterns() {
        assert!(accounts_allow(&[], "x"));
        assert!(accounts_allow(&["prod-*".into()], "prod-eu"));
        assert!(!accounts_allow(
            &["prod-*".into(), "*-us".into()],
            "prod-eu"
        ));
        // Alternatives: the exact name and the names below it, not a longer sibling.
        let exact_or_below = ["prod-eu-west-1,prod-eu-west-1-*".to_string()];
        assert!(accounts_allow(&exact_or_below, "prod-eu-west-1"));
        assert!(accounts_allow(&exact_or_below, "prod-eu-west-1-team-a"));
        assert!(!accounts_allow(&exact_or_below, "prod-eu-west-10"));
    }
}
