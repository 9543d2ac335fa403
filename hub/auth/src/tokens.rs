//! Bearer tokens of the Kubernetes API proxy and of the HTTP API, and the admin token.
//!
//! Proxy tokens belong to an account; API tokens (issued with `scale-agent-hub token
//! create`) have a role instead ([`crate::api_auth`]) and no account. Both live in the same
//! store table and are hashed the same way; a proxy token opens no API route and an API token
//! opens no proxy route.
//!
//! Each token belongs to one account and has a name (who or what it is for); an account may
//! have several (Clouddriver's, a person's, a pipeline's). The hub keeps only the SHA-256 of a
//! token (a token is 32 random bytes, so a fast hash is enough: there is nothing to guess),
//! shows a token once when it is issued, and forgets it when revoked. Issuing a token under
//! a name the account already uses replaces (rotates) the old one.
//!
//! One kind of token is *derived* instead of random: the one the hub puts into the kubeconfig
//! it registers in Clouddriver. Its value is an HMAC of the account, name and a generation
//! under a key kept in the store, so the hub can render the same kubeconfig again after a
//! restart (Clouddriver keeps using it) without storing the token itself; rotating it bumps
//! the generation.
//!
//! Revoking a derived token leaves a tombstone record (no hash, the revoked generation) in
//! the store, one per account and name. A generation at or below a tombstone's is never
//! derived again nor accepted, on this replica, on the others (they read the store) and after
//! a restart: without it, the next derivation (the registrar's, within a second) would start
//! again at generation 1 and bring a leaked, revoked token back.

use std::collections::{BTreeMap, HashMap};

use base64::Engine as _;
use ring::{digest, hmac, rand::SecureRandom as _};
use scale_agent_hub_model::{
    auth::Role,
    error::{HubError, Result},
    store_op::StoreOp,
};

/// Every token starts with this, so a leaked one is recognisable (secret scanners, logs).
pub const TOKEN_PREFIX: &str = "sat_";
/// Name of the token in the kubeconfig the hub registers in Clouddriver for an account.
pub const CLOUDDRIVER_TOKEN: &str = "clouddriver";
/// Key in the store's metadata table of the key that derives tokens.
pub const DERIVATION_KEY: &str = "token-derivation-key";

pub use scale_agent_hub_model::records::TokenRecord;

/// SHA-256 of a presented token.
pub fn sha256(token: &str) -> [u8; 32] {
    hash(token)
}

/// SHA-256 of a token, lowercase hex (what the store and the tokens file keep).
pub fn sha256_hex(token: &str) -> String {
    hex(&hash(token))
}

/// A SHA-256 written as 64 hex digits (either case).
pub fn parse_sha256(text: &str) -> Option<[u8; 32]> {
    unhex(&text.trim().to_ascii_lowercase()).and_then(|h| <[u8; 32]>::try_from(h).ok())
}

fn hash(token: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, token.as_bytes()).as_ref());
    out
}

/// The hash a record keeps, as bytes.
fn stored_hash(record: &TokenRecord) -> Option<[u8; 32]> {
    unhex(&record.sha256).and_then(|h| <[u8; 32]>::try_from(h).ok())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `N` random bytes from the operating system (getrandom).
pub fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut out = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .map_err(|_| HubError::Random)?;
    Ok(out)
}

/// A new random token (`sat_` and 43 characters).
pub fn new_token() -> Result<String> {
    Ok(encode(&random_bytes::<32>()?))
}

fn encode(bytes: &[u8]) -> String {
    format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// What an issued token is limited to besides its account or role.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Unix seconds after which it opens nothing; `None`: it does not expire.
    pub expires: Option<i64>,
    /// API tokens: globs of the accounts it may address; empty: every account.
    pub accounts: Vec<String>,
}

/// What distinguishes a record [`Tokens::put`] writes: derived, API (a role), limited.
struct Fields {
    generation: Option<u32>,
    role: Option<Role>,
    limits: Limits,
}

/// How long a token issued for a person (a kubeconfig's, an API token) lasts unless the
/// request says otherwise: a working day, the way `kubectl oidc-login` sessions and cloud
/// consoles end. `0` asks for a token that does not expire.
pub const DEFAULT_PERSON_TTL_SECONDS: i64 = 12 * 3600;

/// How long an expired token stays in the store (and in `token list`, with its `expires`)
/// before the maintenance tick drops it: a week, so that whoever is asked on Monday why a
/// person's token was refused on Friday still finds it (its name, account and expiry), and
/// short enough that the tokens of `scale-agent-hub token credential`, one per kubectl
/// process and 12 h each, do not pile up (`--token-ttl` 12 h: a few dozen per person a week).
pub const EXPIRED_TOKEN_RETENTION_SECONDS: i64 = 7 * 24 * 3600;

/// A refusal of an expired token, with what to do: the text the proxy's 401 `Status` and the
/// API's 401 carry (kubectl prints it).
pub fn expired_message(record: &TokenRecord, get_new: &str) -> String {
    let when = record
        .expires
        .and_then(|at| jiff::Timestamp::from_second(at).ok())
        .map(|t| t.to_string())
        .unwrap_or_default();
    // troubleshooting: proxy or REST API: HTTP 401
    // Issued tokens expire (proxy tokens after 12 h by default). Get a new one, or use an
    // exec-plugin kubeconfig that fetches fresh tokens (`scale-agent-hub kubeconfig --exec`).
    format!("the token {:?} expired at {when}: {get_new}", record.name)
}

/// The tokens the hub has issued, indexed by hash (every proxy request) and by account and
/// name (rotation, and the Clouddriver kubeconfigs checked at every maintenance tick).
pub struct Tokens {
    records: BTreeMap<String, TokenRecord>,
    by_hash: HashMap<[u8; 32], String>,
    /// account → name → id.
    by_name: HashMap<String, HashMap<String, String>>,
    /// (account, name) → the tombstone of its last revoked derived token.
    tombstones: HashMap<(String, String), TokenRecord>,
    key: hmac::Key,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("records", &self.records.len())
            .finish_non_exhaustive()
    }
}

impl Tokens {
    /// Tokens as stored, with the derivation key (hex) from the store's metadata. Without a
    /// key (a new store) one is made; the returned ops persist it.
    pub fn load(records: Vec<TokenRecord>, key_hex: Option<&str>) -> Result<(Self, Vec<StoreOp>)> {
        let mut ops = Vec::new();
        let key_bytes = match key_hex.and_then(unhex).filter(|k| k.len() == 32) {
            Some(bytes) => bytes,
            None => {
                let bytes = random_bytes::<32>()?.to_vec();
                ops.push(StoreOp::PutMeta {
                    key: DERIVATION_KEY.into(),
                    value: hex(&bytes),
                });
                bytes
            }
        };
        let mut tokens = Tokens {
            records: BTreeMap::new(),
            by_hash: HashMap::new(),
            by_name: HashMap::new(),
            tombstones: HashMap::new(),
            key: hmac::Key::new(hmac::HMAC_SHA256, &key_bytes),
        };
        for record in records {
            tokens.insert(record);
        }
        Ok((tokens, ops))
    }

    fn insert(&mut self, record: TokenRecord) {
        if record.revoked {
            self.remember_tombstone(record);
            return;
        }
        if let Some(h) = stored_hash(&record) {
            self.by_hash.insert(h, record.id.clone());
        }
        self.by_name
            .entry(record.account.clone())
            .or_default()
            .insert(record.name.clone(), record.id.clone());
        self.records.insert(record.id.clone(), record);
    }

    /// Keeps the tombstone with the highest generation of its account and name.
    fn remember_tombstone(&mut self, record: TokenRecord) {
        let key = (record.account.clone(), record.name.clone());
        if self
            .tombstones
            .get(&key)
            .is_none_or(|kept| kept.generation < record.generation)
        {
            self.tombstones.insert(key, record);
        }
    }

    /// The highest revoked generation of the derived token of `account` named `name` (0
    /// when none was revoked).
    pub fn revoked_generation(&self, account: &str, name: &str) -> u32 {
        self.tombstones
            .get(&(account.to_string(), name.to_string()))
            .and_then(|t| t.generation)
            .unwrap_or(0)
    }

    fn remove(&mut self, id: &str) -> Option<TokenRecord> {
        let record = self.records.remove(id)?;
        if let Some(h) = stored_hash(&record) {
            self.by_hash.remove(&h);
        }
        if let Some(names) = self.by_name.get_mut(&record.account) {
            if names.get(&record.name).is_some_and(|i| i == id) {
                names.remove(&record.name);
            }
            if names.is_empty() {
                self.by_name.remove(&record.account);
            }
        }
        Some(record)
    }

    /// Replaces every record with the store's (replicas sharing a store: what the others
    /// issued and revoked); the derivation key stays.
    pub fn replace_records(&mut self, records: Vec<TokenRecord>) {
        self.records.clear();
        self.by_hash.clear();
        self.by_name.clear();
        self.tombstones.clear();
        for record in records {
            self.insert(record);
        }
    }

    /// Adds a record another replica issued (looked up in the shared store), replacing the
    /// one of the same account and name.
    pub fn learn(&mut self, record: TokenRecord) {
        if record.revoked {
            self.remember_tombstone(record);
            return;
        }
        if let Some(id) = self
            .find(&record.account, &record.name)
            .map(|r| r.id.clone())
        {
            self.remove(&id);
        }
        self.insert(record);
    }

    /// Whether the token with this id still opens anything: held, and (derived) above its
    /// name's revoked generation. False once it was revoked, rotated or pruned.
    pub fn opens(&self, id: &str) -> bool {
        self.records.get(id).is_some_and(|r| {
            !r.revoked
                && r.generation
                    .is_none_or(|g| g > self.revoked_generation(&r.account, &r.name))
        })
    }

    /// Whether `token` is one of the records held (proxy or API).
    pub fn knows(&self, token: &str) -> bool {
        self.verify_any(token).is_some()
    }

    /// The record of a presented proxy token, if it is one the hub issued and did not revoke.
    pub fn verify(&self, token: &str) -> Option<&TokenRecord> {
        self.verify_any(token).filter(|r| r.role.is_none())
    }

    /// The record of a presented API token (one with a role).
    pub fn verify_api(&self, token: &str) -> Option<&TokenRecord> {
        self.verify_any(token).filter(|r| r.role.is_some())
    }

    fn verify_any(&self, token: &str) -> Option<&TokenRecord> {
        if !token.starts_with(TOKEN_PREFIX) {
            return None;
        }
        self.by_hash
            .get(&hash(token))
            .and_then(|id| self.records.get(id))
            // A derived record at or below a revoked generation (one learnt from the store,
            // or written by a replica that had not seen the revocation yet) opens nothing.
            .filter(|r| {
                r.generation
                    .is_none_or(|g| g > self.revoked_generation(&r.account, &r.name))
            })
    }

    /// Issues a random API token named `name` with `role`; an API token of the same name is
    /// revoked (rotation). Returns the token (shown once), its record and the ops to store.
    pub fn issue_api(
        &mut self,
        name: &str,
        role: Role,
        now_unix: i64,
        limits: Limits,
    ) -> Result<(String, TokenRecord, Vec<StoreOp>)> {
        let token = encode(&random_bytes::<32>()?);
        // API tokens are indexed under the empty account, which no proxy token has (account
        // names are never empty).
        let what = Fields {
            generation: None,
            role: Some(role),
            limits,
        };
        self.put("", name, &token, now_unix, what)
    }

    /// The token of `account` named `name`, if any.
    pub fn find(&self, account: &str, name: &str) -> Option<&TokenRecord> {
        self.by_name
            .get(account)
            .and_then(|names| names.get(name))
            .and_then(|id| self.records.get(id))
    }

    /// Issues a random token; an existing token of `account` with the same `name` is
    /// revoked (rotation). Returns the token (shown once), its record and the ops to store.
    pub fn issue(
        &mut self,
        account: &str,
        name: &str,
        now_unix: i64,
        expires: Option<i64>,
    ) -> Result<(String, TokenRecord, Vec<StoreOp>)> {
        let token = encode(&random_bytes::<32>()?);
        let limits = Limits {
            expires,
            accounts: Vec::new(),
        };
        let what = Fields {
            generation: None,
            role: None,
            limits,
        };
        self.put(account, name, &token, now_unix, what)
    }

    /// Issues a random token of `account` named `name` that expires at `expires`, beside the
    /// account's other tokens of that name rather than replacing them: an exec credential
    /// plugin's (`scale-agent-hub token credential`), which each kubectl process may call,
    /// and which must not end the tokens other processes still hold. The expired tokens of
    /// the same account and name are dropped in the same ops, so these (one per kubectl
    /// command) do not pile up; other people's expired tokens stay listed until
    /// [`Tokens::prune_expired`] drops them after the retention.
    pub fn issue_session(
        &mut self,
        account: &str,
        name: &str,
        now_unix: i64,
        expires: i64,
    ) -> Result<(String, TokenRecord, Vec<StoreOp>)> {
        let expired: Vec<String> = self
            .records
            .values()
            .filter(|r| r.account == account && r.name == name && r.expired_at(now_unix))
            .map(|r| r.id.clone())
            .collect();
        let mut ops = Vec::new();
        for id in expired {
            self.remove(&id);
            ops.push(StoreOp::DeleteToken { id });
        }
        let token = encode(&random_bytes::<32>()?);
        let record = TokenRecord {
            id: hex(&random_bytes::<8>()?),
            account: account.to_string(),
            name: name.to_string(),
            sha256: hex(&hash(&token)),
            created: now_unix,
            generation: None,
            role: None,
            revoked: false,
            expires: Some(expires),
            accounts: Vec::new(),
        };
        ops.push(StoreOp::PutToken {
            record: record.clone(),
        });
        self.insert(record.clone());
        Ok((token, record, ops))
    }

    /// The derived token of `account` named `name` (see the module docs), creating its
    /// record when there is none: generation 1, or the one after the last revoked. The ops
    /// are empty when nothing changed.
    pub fn derived(
        &mut self,
        account: &str,
        name: &str,
        now_unix: i64,
    ) -> Result<(String, TokenRecord, Vec<StoreOp>)> {
        let floor = self.revoked_generation(account, name);
        let existing = self.find(account, name).cloned();
        if let Some(record) = existing.clone()
            && let Some(generation) = record.generation
            && generation > floor
        {
            let token = self.derive(account, name, generation);
            if hex(&hash(&token)) == record.sha256 {
                return Ok((token, record, Vec::new()));
            }
        }
        let generation = existing
            .and_then(|r| r.generation)
            .unwrap_or(1)
            .max(floor.saturating_add(1));
        if floor > 0 {
            tracing::info!(
                %account, token = %name, generation, revoked = floor,
                "deriving a new token: the earlier generations were revoked"
            );
        }
        let token = self.derive(account, name, generation);
        let what = Fields {
            generation: Some(generation),
            role: None,
            limits: Limits::default(),
        };
        self.put(account, name, &token, now_unix, what)
    }

    /// Replaces the derived token of `account` named `name` with the next generation.
    pub fn rotate_derived(
        &mut self,
        account: &str,
        name: &str,
        now_unix: i64,
    ) -> Result<(String, TokenRecord, Vec<StoreOp>)> {
        let generation = self
            .find(account, name)
            .and_then(|r| r.generation)
            .unwrap_or(0)
            .max(self.revoked_generation(account, name))
            .saturating_add(1);
        let token = self.derive(account, name, generation);
        let what = Fields {
            generation: Some(generation),
            role: None,
            limits: Limits::default(),
        };
        self.put(account, name, &token, now_unix, what)
    }

    fn derive(&self, account: &str, name: &str, generation: u32) -> String {
        let message = format!("scale-agent token\0{account}\0{name}\0{generation}");
        encode(hmac::sign(&self.key, message.as_bytes()).as_ref())
    }

    fn put(
        &mut self,
        account: &str,
        name: &str,
        token: &str,
        now_unix: i64,
        what: Fields,
    ) -> Result<(String, TokenRecord, Vec<StoreOp>)> {
        let Fields {
            generation,
            role,
            limits,
        } = what;
        let mut ops = Vec::new();
        if let Some(id) = self.find(account, name).map(|r| r.id.clone()) {
            self.remove(&id);
            ops.push(StoreOp::DeleteToken { id });
        }
        let record = TokenRecord {
            id: hex(&random_bytes::<8>()?),
            account: account.to_string(),
            name: name.to_string(),
            sha256: hex(&hash(token)),
            created: now_unix,
            generation,
            role,
            revoked: false,
            expires: limits.expires,
            accounts: limits.accounts,
        };
        ops.push(StoreOp::PutToken {
            record: record.clone(),
        });
        self.insert(record.clone());
        Ok((token.to_string(), record, ops))
    }

    /// Revokes the token with this id. A derived token leaves a tombstone of its generation
    /// (see the module docs) in place of the record.
    pub fn revoke(&mut self, id: &str) -> Option<(TokenRecord, Vec<StoreOp>)> {
        let record = self.remove(id)?;
        let mut ops = vec![StoreOp::DeleteToken { id: id.to_string() }];
        if let Some(generation) = record.generation {
            // One tombstone per account and name, under an id made from them, so that two
            // replicas revoking at once overwrite each other instead of adding up.
            let name_hash = sha256_hex(&format!("{}\0{}", record.account, record.name));
            let generation = generation.max(self.revoked_generation(&record.account, &record.name));
            let tombstone = TokenRecord {
                id: format!("revoked-{}", &name_hash[..16]),
                sha256: String::new(),
                generation: Some(generation),
                revoked: true,
                ..record.clone()
            };
            ops.push(StoreOp::PutToken {
                record: tombstone.clone(),
            });
            self.remember_tombstone(tombstone);
        }
        Some((record, ops))
    }

    /// Drops the tokens that expired `retention_seconds` or more before `now_unix` (see
    /// [`EXPIRED_TOKEN_RETENTION_SECONDS`]); returns the ops that delete them from the store.
    /// Deleting by id is idempotent and an id is never reused (rotation and re-issue make new
    /// ids), so replicas sharing a store may all prune: a replica whose view is behind
    /// deletes a row already gone, or one that expired all the same.
    pub fn prune_expired(&mut self, now_unix: i64, retention_seconds: i64) -> Vec<StoreOp> {
        let cutoff = now_unix.saturating_sub(retention_seconds);
        let old: Vec<String> = self
            .records
            .values()
            .filter(|r| r.expires.is_some_and(|expires| expires <= cutoff))
            .map(|r| r.id.clone())
            .collect();
        old.into_iter()
            .filter_map(|id| self.remove(&id))
            .map(|record| {
                tracing::info!(
                    account = %record.account, token = %record.name, id = %record.id,
                    expired = record.expires.unwrap_or_default(),
                    "expired token dropped from the store after its retention"
                );
                StoreOp::DeleteToken { id: record.id }
            })
            .collect()
    }

    /// Every token, ordered by account (API tokens, with none, first), then name.
    pub fn list(&self) -> Vec<TokenRecord> {
        let mut all: Vec<TokenRecord> = self.records.values().cloned().collect();
        all.sort_by(|a, b| (&a.account, &a.name).cmp(&(&b.account, &b.name)));
        all
    }
}

/// The admin token: it issues and revokes the proxy's tokens. Read from a file; a missing
/// file is created with a new random token (mode 0600), the way Argo CD and Jenkins hand out
/// their first admin secret, so a fresh hub is never open.
#[derive(Clone)]
pub struct AdminToken {
    sha256: [u8; 32],
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

impl AdminToken {
    /// An admin token with this value (tests, and the file's content).
    pub fn new(token: &str) -> Self {
        AdminToken {
            sha256: hash(token.trim()),
        }
    }

    /// Whether `presented` is the admin token. Comparing digests keeps the comparison's
    /// timing independent of how much of the token an attacker guessed.
    pub fn matches(&self, presented: &str) -> bool {
        hash(presented.trim()) == self.sha256
    }

    /// Reads the token from `path`, creating the file with a new token when it is missing.
    /// Returns the token and whether the file was created.
    pub fn read_or_create(path: &std::path::Path) -> std::io::Result<(String, bool)> {
        match std::fs::read_to_string(path) {
            Ok(text) if !text.trim().is_empty() => return Ok((text.trim().to_string(), false)),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let token = encode(&random_bytes::<32>().map_err(|_| {
            std::io::Error::other("the operating system's random number generator failed")
        })?);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        scale_agent_runtime::write_private(path, format!("{token}\n").as_bytes())?;
        Ok((token, true))
    }
}

/// The bearer token of an `Authorization` header value, if it has one.
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests;
