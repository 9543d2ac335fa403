//! Authentication and roles of the hub's HTTP API (everything but `/healthz`, `/readyz`, the
//! Kubernetes API proxy, and `/metrics` when `--metrics-unauthenticated` opens it).
//!
//! A caller presents `Authorization: Bearer <token>`. The token is one of:
//! - the admin token (the admin token file, `<data-dir>/admin-token`): the built-in `admin`;
//! - an entry of the tokens file (`--api-tokens-file`: a YAML or JSON list of
//!   `{name, role, sha256}`, re-read when it changes);
//! - a token the hub issued (`scale-agent-hub token create`), kept hashed in its store
//!   ([`crate::tokens::Tokens`]).
//!
//! An OIDC ID token of `--authentication-config`'s issuers, its role from `--oidc-access`
//! ([`authorize_request`]).
//!
//! Roles are ordered: `metrics` (`GET /metrics` only) < `reader` < `operator` < `admin`. An
//! issued or file token may be limited to account globs: the account routes
//! (`/api/v1/accounts/<name>/...`) of other accounts answer 403. [`authorize`] is the one check every
//! handler (or the hub's per-route `api_auth::require` layer) calls; it answers 401 for a
//! missing or unknown token and 403 for a role that is too small. The proxy's per-account
//! tokens are a separate kind and open no API route, and API tokens open no proxy route.

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use scale_agent_hub_model::{HubError, time::reload_every};
use serde::{Deserialize, Serialize};

use crate::{
    book::AuthBook,
    tokens,
    watched_file::{self, Change, WatchedFile},
};

pub use scale_agent_hub_model::auth::{Caller, Role, Source};

/// How a caller gets a token, for 401 messages.
const GET_A_TOKEN: &str = "ask the hub's administrator for one (`scale-agent-hub token create \
     --name <who> --role <metrics|reader|operator|admin>`, or an entry of the hub's --api-tokens-file)";

/// Why a request was refused: 401 or 403, with a message that says what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub status: StatusCode,
    pub message: String,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let mut response = scale_agent_hub_net::http::error(self.status, self.message);
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"scale-agent-hub\""),
            );
        }
        response
    }
}

/// The check itself, pure: `caller` is who the presented token (if any) belongs to.
pub fn check(
    presented: bool,
    caller: Option<Caller>,
    needed: Role,
    what: &str,
) -> Result<Caller, Refused> {
    let caller = match (presented, caller) {
        (_, Some(caller)) => caller,
        (false, None) => {
            return Err(Refused {
                status: StatusCode::UNAUTHORIZED,
                message: format!(
                    // troubleshooting: REST API: HTTP 401
                    // Every route but health needs an API token. An admin issues one with
                    // `scale-agent-hub token create --name <who> --role <role>`; see [Give people
                    // access](../tasks/give-people-access.md).
                    "{what} needs `Authorization: Bearer <token>` with role {needed} or more: \
                     {GET_A_TOKEN}"
                ),
            });
        }
        (true, None) => {
            return Err(Refused {
                status: StatusCode::UNAUTHORIZED,
                message: format!(
                    // troubleshooting: REST API: HTTP 401
                    // The token is unknown, revoked, or a proxy token (proxy tokens open only
                    // `/clusters/<account>/`).
                    "the bearer token is not an API token of this hub (unknown, revoked, or a \
                     proxy token, which opens only /clusters/<account>/...); {what} needs role \
                     {needed} or more: {GET_A_TOKEN}"
                ),
            });
        }
    };
    if caller.role < needed {
        return Err(Refused {
            status: StatusCode::FORBIDDEN,
            message: format!(
                // troubleshooting: REST API: HTTP 403
                // Roles are ordered `metrics` < `reader` < `operator` < `admin`; the route needs a
                // larger one than the token has.
                "{what} needs role {needed}; token {:?} has role {}: use a token with role \
                 {needed} or more",
                caller.name, caller.role
            ),
        });
    }
    Ok(caller)
}

/// Who the bearer token in `headers` belongs to, if it is an API token; `presented` tells
/// whether there was a bearer token at all. An issued token past its expiry is refused here,
/// with its expiry in the message.
fn identify(book: &AuthBook, headers: &HeaderMap) -> Result<(bool, Option<Caller>), Refused> {
    let Some(token) = bearer_of(headers) else {
        return Ok((false, None));
    };
    if book.admin_token().is_some_and(|a| a.matches(token)) {
        return Ok((
            true,
            Some(Caller {
                name: "admin".into(),
                role: Role::Admin,
                source: Source::AdminTokenFile,
                accounts: Vec::new(),
            }),
        ));
    }
    if let Some(entry) = book.api_tokens_file().and_then(|f| f.verify(token)) {
        return Ok((
            true,
            Some(Caller {
                name: entry.name,
                role: entry.role,
                source: Source::TokensFile,
                accounts: entry.accounts,
            }),
        ));
    }
    let Some(record) = book.tokens().verify_api(token).cloned() else {
        return Ok((true, None));
    };
    if record.expired_at(jiff::Timestamp::now().as_second()) {
        return Err(Refused {
            status: StatusCode::UNAUTHORIZED,
            message: tokens::expired_message(
                &record,
                &format!("ask the hub's administrator for a new one ({GET_A_TOKEN})"),
            ),
        });
    }
    let caller = record.role.map(|role| Caller {
        name: record.name.clone(),
        role,
        source: Source::Hub,
        accounts: record.accounts.clone(),
    });
    Ok((true, caller))
}

fn bearer_of(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(tokens::bearer)
}

/// The guard every API handler calls: the caller, if its token has at least `needed`.
/// `what` names the request in messages (`GET /api/v1/agents`).
pub fn authorize(
    book: &AuthBook,
    headers: &HeaderMap,
    needed: Role,
    what: &str,
) -> Result<Caller, Refused> {
    identify(book, headers)
        .and_then(|(presented, caller)| check(presented, caller, needed, what))
        .inspect_err(|refused| {
            tracing::debug!(status = refused.status.as_u16(), %what, "API request refused");
        })
}

/// [`authorize`], plus OIDC ID tokens (their issuer's keys may have to be fetched, hence
/// async) and the caller's account globs: a request addressing `account` (the account
/// routes) is refused with 403 naming the globs when none admits it.
pub async fn authorize_request(
    book: &AuthBook,
    headers: &HeaderMap,
    needed: Role,
    what: &str,
    account: Option<&str>,
) -> Result<Caller, Refused> {
    let caller = match (bearer_of(headers), book.oidc()) {
        (Some(token), Some(oidc)) if crate::oidc::looks_like_jwt(token) => {
            let person = oidc.authenticate(token).await.map_err(|reason| Refused {
                status: StatusCode::UNAUTHORIZED,
                message: format!("the OIDC ID token is refused: {reason}"),
            })?;
            let Some((role, accounts)) = oidc.access().api_role(&person) else {
                return Err(Refused {
                    status: StatusCode::FORBIDDEN,
                    message: format!(
                        "{what}: {} (groups {:?}) has no API role: no rule of the hub's \
                         --oidc-access file with a role applies to that user or those groups",
                        person.user, person.groups
                    ),
                });
            };
            let caller = Caller {
                name: person.user,
                role,
                source: Source::Oidc,
                accounts,
            };
            check(true, Some(caller), needed, what)?
        }
        _ => authorize(book, headers, needed, what)?,
    };
    if let Some(account) = account
        && caller.refuses_account(account)
    {
        return Err(Refused {
            status: StatusCode::FORBIDDEN,
            message: format!(
                // troubleshooting: REST API: HTTP 403 on an account route
                // The API token (or the OIDC user's `--oidc-access` rule) is limited to account
                // globs, and the account in the path is outside them; listings show such a token
                // its accounts only. Use a token whose `accounts` admit the account (`scale-agent-
                // hub token create --accounts`).
                "{what}: {:?} is limited to accounts {:?}, which do not include {account:?}; \
                 use a token whose accounts do",
                caller.name, caller.accounts
            ),
        });
    }
    Ok(caller)
}

/// One entry of the tokens file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileToken {
    pub name: String,
    pub role: Role,
    /// SHA-256 of the token, lowercase or uppercase hex (`scale-agent-hub token hash`).
    pub sha256: String,
    /// Globs of the accounts the token may address on the account routes; absent: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accounts: Vec<String>,
}

/// Parses the tokens file (YAML, of which JSON is a subset): a list of [`FileToken`]s, indexed
/// by hash. The error says where the file is wrong (line, when the parser knows it).
pub fn parse_tokens_file(text: &str) -> Result<HashMap<[u8; 32], FileToken>, String> {
    let entries: Vec<FileToken> = if text.trim().is_empty() {
        Vec::new()
    } else {
        serde_saphyr::from_str(text).map_err(|e| match e.location() {
            Some(at) => format!("line {}: {e}", at.line()),
            None => e.to_string(),
        })?
    };
    let mut by_hash = HashMap::new();
    let mut names = std::collections::HashSet::new();
    for (i, entry) in entries.into_iter().enumerate() {
        let n = i + 1;
        if entry.name.trim().is_empty() {
            return Err(format!("entry {n}: the name is empty"));
        }
        if !names.insert(entry.name.clone()) {
            return Err(format!(
                "entry {n}: the name {:?} is used twice; names must be unique",
                entry.name
            ));
        }
        let hash = tokens::parse_sha256(&entry.sha256).ok_or_else(|| {
            format!(
                "entry {n} ({:?}): sha256 must be 64 hex digits (the SHA-256 of the token, from \
                 `scale-agent-hub token hash`), never the token itself",
                entry.name
            )
        })?;
        by_hash.insert(hash, entry);
    }
    Ok(by_hash)
}

/// The tokens file, re-read when its content changes; a broken file keeps the previous good
/// set (and logs why), a deleted one holds no tokens once it has been missing for
/// [`watched_file::MISSING_GRACE`] (issue 28, F25).
#[derive(Debug)]
pub struct TokensFile {
    file: Mutex<WatchedFile>,
    by_hash: Mutex<HashMap<[u8; 32], FileToken>>,
}

/// How often the tokens file is checked for changes.
pub const TOKENS_FILE_POLL: Duration = Duration::from_secs(1);

impl TokensFile {
    /// The file at `path`, read once now: a broken file is an error at start; a missing one
    /// holds no tokens until it appears (a Kubernetes Secret mounted as optional).
    pub fn open(path: &Path) -> scale_agent_hub_model::Result<Self> {
        let (content, by_hash) = match std::fs::read(path) {
            Ok(content) => {
                let parsed = std::str::from_utf8(&content)
                    .map_err(|e| e.to_string())
                    .and_then(parse_tokens_file)
                    .map_err(|e| {
                        HubError::Config(format!("the API tokens file {}: {e}", path.display()))
                    })?;
                tracing::info!(path = %path.display(), tokens = parsed.len(), "API tokens file loaded");
                (Some(content), parsed)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(path = %path.display(), "the API tokens file does not exist (yet); it holds no tokens until it appears");
                (None, HashMap::new())
            }
            Err(source) => {
                return Err(HubError::ReadFile {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        Ok(TokensFile {
            file: Mutex::new(WatchedFile::new(path, content)),
            by_hash: Mutex::new(by_hash),
        })
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], FileToken>> {
        self.by_hash.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The entry whose hash is the presented token's.
    pub fn verify(&self, token: &str) -> Option<FileToken> {
        self.tokens().get(&tokens::sha256(token)).cloned()
    }

    /// Every entry, ordered by name.
    pub fn list(&self) -> Vec<FileToken> {
        let mut all: Vec<FileToken> = self.tokens().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Reads the file again; takes the new set when it changed and parses, keeps the old one
    /// (logging why) when it does not parse. A file missing for a moment keeps the old set
    /// (a Secret volume's symlink swap); one missing for [`watched_file::MISSING_GRACE`]
    /// was deleted, and its tokens stop working.
    pub fn reload(&self) {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let path = file.path().display().to_string();
        let content = match file.read() {
            Change::Unchanged => return,
            Change::Changed(content) => content,
            Change::Gone => {
                let revoked = std::mem::take(&mut *self.tokens()).len();
                tracing::warn!(%path, revoked, grace = ?watched_file::MISSING_GRACE, "the API tokens file is gone; its tokens no longer work");
                return;
            }
            Change::Unreadable(error) => {
                tracing::error!(%path, %error, "cannot read the API tokens file; keeping the tokens read before");
                return;
            }
        };
        // The broken content is remembered by the watched file, so it is reported once, not
        // every poll.
        match std::str::from_utf8(&content)
            .map_err(|e| e.to_string())
            .and_then(parse_tokens_file)
        {
            Ok(by_hash) => {
                tracing::info!(%path, tokens = by_hash.len(), "API tokens file reloaded");
                *self.tokens() = by_hash;
            }
            Err(error) => {
                tracing::error!(%path, %error, "the API tokens file is broken; keeping the tokens read before");
            }
        }
    }

    /// Re-reads the file every [`TOKENS_FILE_POLL`] until shutdown.
    pub async fn watch(self: Arc<Self>, shutdown: tokio::sync::watch::Receiver<bool>) {
        reload_every(TOKENS_FILE_POLL, shutdown, move || self.reload()).await;
    }
}

/// A tokens-file entry (one YAML list item) for `name` with `role` whose secret is `token`.
pub fn file_entry(name: &str, role: Role, token: &str) -> String {
    scoped_file_entry(name, role, &[], token)
}

/// [`file_entry`] limited to the account globs `accounts` (none: every account).
pub fn scoped_file_entry(name: &str, role: Role, accounts: &[String], token: &str) -> String {
    let name = serde_json::to_string(name).unwrap_or_default();
    let accounts = if accounts.is_empty() {
        String::new()
    } else {
        format!(
            ", accounts: {}",
            serde_json::to_string(accounts).unwrap_or_default()
        )
    };
    format!(
        "- {{name: {name}, role: {role}, sha256: {}{accounts}}}\n",
        tokens::sha256_hex(token)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(role: Role) -> Caller {
        Caller {
            name: "ci".into(),
            role,
            source: Source::TokensFile,
            accounts: Vec::new(),
        }
    }

    #[test]
    fn roles_are_ordered_and_refusals_say_what_to_change() {
        assert!(Role::Reader < Role::Operator && Role::Operator < Role::Admin);
        let none = check(false, None, Role::Reader, "GET /api/v1/agents").unwrap_err();
        assert_eq!(none.status, StatusCode::UNAUTHORIZED);
        assert!(
            none.message.contains("Authorization: Bearer"),
            "{}",
            none.message
        );
        assert!(
            none.message.contains("scale-agent-hub token create"),
            "{}",
            none.message
        );
        let unknown = check(true, None, Role::Reader, "GET /api/v1/agents").unwrap_err();
        assert_eq!(unknown.status, StatusCode::UNAUTHORIZED);
        assert!(
            unknown.message.contains("not an API token"),
            "{}",
            unknown.message
        );
        let small = check(
            true,
            Some(caller(Role::Reader)),
            Role::Operator,
            "POST /api/v1/accounts/prod/operations",
        )
        .unwrap_err();
        assert_eq!(small.status, StatusCode::FORBIDDEN);
        assert!(
            small.message.contains("needs role operator")
                && small.message.contains("\"ci\" has role reader"),
            "{}",
            small.message
        );
        assert_eq!(
            check(true, Some(caller(Role::Admin)), Role::Operator, "x").map(|c| c.role),
            Ok(Role::Admin)
        );
        assert_eq!(caller(Role::Admin).kind(), "api");
    }

    #[test]
    fn tokens_files_parse_as_yaml_or_json_and_name_the_bad_line() {
        let hash = tokens::sha256_hex("sat_secret");
        let yaml = format!(
            "# CI and dashboards\n- name: ci\n  role: operator\n  sha256: {hash}\n- {{name: grafana, role: reader, sha256: {}}}\n",
            tokens::sha256_hex("other")
        );
        let parsed = parse_tokens_file(&yaml).unwrap();
        assert_eq!(parsed.len(), 2);
        let ci = &parsed[&tokens::sha256("sat_secret")];
        assert_eq!((ci.name.as_str(), ci.role), ("ci", Role::Operator));
        let json = format!(r#"[{{"name": "ci", "role": "admin", "sha256": "{hash}"}}]"#);
        assert_eq!(parse_tokens_file(&json).unwrap().len(), 1);
        assert!(parse_tokens_file("").unwrap().is_empty());

        let bad_role = format!(
            "- name: ci\n  role: operator\n  sha256: {hash}\n- name: x\n  role: root\n  sha256: {hash}\n"
        );
        let error = parse_tokens_file(&bad_role).unwrap_err();
        assert!(error.contains("line 5"), "{error}");
        let clear = "- name: ci\n  role: reader\n  sha256: sat_the-token-itself\n";
        let error = parse_tokens_file(clear).unwrap_err();
        assert!(error.contains("64 hex digits"), "{error}");
        let twice = format!(
            "- {{name: a, role: reader, sha256: {hash}}}\n- {{name: a, role: reader, sha256: {hash}}}\n"
        );
        assert!(
            parse_tokens_file(&twice)
                .unwrap_err()
                .contains("used twice")
        );

        let entry = file_entry("ci", Role::Operator, "sat_secret");
        let parsed = parse_tokens_file(&entry).unwrap();
        assert_eq!(parsed[&tokens::sha256("sat_secret")].name, "ci");
        let entry = scoped_file_entry("ci", Role::Reader, &["prod-*".into()], "sat_secret");
        let parsed = parse_tokens_file(&entry).unwrap();
        assert_eq!(parsed[&tokens::sha256("sat_secret")].accounts, ["prod-*"]);
    }

    #[test]
    fn a_broken_tokens_file_keeps_the_previous_set() {
        let dir = std::env::temp_dir().join(format!("hub-api-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens.yaml");
        std::fs::write(&path, file_entry("ci", Role::Reader, "sat_one")).unwrap();
        let file = TokensFile::open(&path).unwrap();
        assert_eq!(file.verify("sat_one").map(|e| e.role), Some(Role::Reader));
        std::fs::write(&path, "- name: [broken\n").unwrap();
        file.reload();
        assert!(file.verify("sat_one").is_some(), "kept the good set");
        std::fs::write(&path, file_entry("ci", Role::Admin, "sat_two")).unwrap();
        file.reload();
        assert!(file.verify("sat_one").is_none());
        assert_eq!(file.verify("sat_two").map(|e| e.role), Some(Role::Admin));
        std::fs::remove_file(&path).unwrap();
        file.reload();
        assert!(
            file.verify("sat_two").is_some(),
            "a vanished file keeps the set"
        );
        assert!(
            TokensFile::open(&dir.join("missing.yaml"))
                .unwrap()
                .list()
                .is_empty()
        );
        std::fs::write(&path, "- name: [broken\n").unwrap();
        assert!(
            TokensFile::open(&path).is_err(),
            "broken at start is an error"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
