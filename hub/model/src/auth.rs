//! Who calls the hub's HTTP API: roles, where a token comes from, and the caller as
//! handlers and audit lines see it.

use serde::{Deserialize, Serialize};

/// What a token may do. The order matters: a larger role may do what a smaller one may.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// `GET /metrics` and nothing else (a Prometheus scraper).
    Metrics,
    /// Agents, accounts, objects, Clouddriver registration status, metrics.
    Reader,
    /// Plus submitting and reading operations.
    Operator,
    /// Plus the admin API: issuing and revoking tokens and kubeconfigs.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Metrics => "metrics",
            Role::Reader => "reader",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an API token comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The admin token file: the built-in `admin`.
    AdminTokenFile,
    /// The tokens file (`--api-tokens-file`).
    TokensFile,
    /// Issued by the hub and kept in its store.
    Hub,
    /// An OIDC ID token from an issuer of `--authentication-config`, its role from
    /// `--oidc-access`.
    Oidc,
}

/// Who called: the token's name, role and source. Handlers find it in the request's
/// extensions after `require` (the API crate's middleware).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub role: Role,
    pub source: Source,
    /// Globs of the accounts the caller may address on the account routes; empty: every
    /// account.
    pub accounts: Vec<String>,
}

impl Caller {
    /// The token kind audit lines name: `admin` for the admin token file, `api` otherwise.
    pub fn kind(&self) -> &'static str {
        match self.source {
            Source::AdminTokenFile => "admin",
            Source::TokensFile | Source::Hub => "api",
            Source::Oidc => "oidc",
        }
    }

    /// Whether the caller has account globs and none admits `account`.
    pub fn refuses_account(&self, account: &str) -> bool {
        !self.accounts.is_empty()
            && !self
                .accounts
                .iter()
                .any(|p| crate::identity::glob_match(p, account))
    }
}

/// Who submitted an operation, as the operations remember it (issue 28, F18): the caller's
/// token kind and name (`api:ci`, `oidc:alice@example.com`, `admin:admin`). Operation ids and
/// client ids are scoped to it: another caller looking one up finds nothing (404, so an id is
/// not even confirmed), and the same client id from two callers is two operations. A caller
/// with the admin role sees every caller's operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitter {
    /// `<kind>:<name>`, as [`Caller::kind`] and [`Caller::name`].
    pub key: String,
    /// The caller has the admin role: lookups see every submitter's operations.
    pub admin: bool,
}

impl Submitter {
    /// The submitter a caller authenticated on this replica is.
    pub fn of(caller: &Caller) -> Self {
        Submitter {
            key: format!("{}:{}", caller.kind(), caller.name),
            admin: caller.role >= Role::Admin,
        }
    }

    /// Whether this caller may see an operation `key` submitted.
    pub fn sees(&self, key: &str) -> bool {
        self.admin || self.key == key
    }

    /// The form replicas forward it in (`<role>;<key>`; the key may hold any character but
    /// control characters, which a header value cannot carry).
    pub fn to_header(&self) -> String {
        let role = if self.admin { "admin" } else { "operator" };
        format!("{role};{}", self.key)
    }

    /// Reads [`Submitter::to_header`]'s form; `None` when it is not that.
    pub fn from_header(value: &str) -> Option<Self> {
        let (role, key) = value.split_once(';')?;
        let admin = match role {
            "admin" => true,
            "operator" => false,
            _ => return None,
        };
        (!key.is_empty()).then(|| Submitter {
            key: key.to_string(),
            admin,
        })
    }
}

/// Who reached an account through the proxy, as the hub authenticated them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyCaller {
    /// The token's name for a hub-issued token (the agent's own identity for Clouddriver's
    /// account token), or the OIDC username after the issuer's prefix is applied.
    pub user: String,
    /// Groups: the OIDC groups claim after its prefix; empty for hub-issued tokens.
    pub groups: Vec<String>,
    /// A person (OIDC, or a token issued for a person) rather than Clouddriver's machine token.
    pub person: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(name: &str, role: Role, source: Source) -> Caller {
        Caller {
            name: name.into(),
            role,
            source,
            accounts: Vec::new(),
        }
    }

    #[test]
    fn submitters_cross_replicas_as_they_are() {
        let ci = Submitter::of(&caller("ci", Role::Operator, Source::Hub));
        assert_eq!(ci.key, "api:ci");
        assert!(!ci.admin && ci.sees("api:ci") && !ci.sees("api:other"));
        // An OIDC name may hold `;`, `:` and any UTF-8.
        let alice = Submitter::of(&caller("oidc:al;ice é", Role::Admin, Source::Oidc));
        assert_eq!(alice.key, "oidc:oidc:al;ice é");
        assert!(alice.admin && alice.sees("api:ci"));
        for submitter in [ci, alice] {
            assert_eq!(
                Submitter::from_header(&submitter.to_header()),
                Some(submitter)
            );
        }
        for bad in ["", "admin", "root;api:x", "operator;"] {
            assert_eq!(Submitter::from_header(bad), None, "{bad}");
        }
    }
}
