//! `scale-agent-hub-clouddriver` (layer 3): registers the hub's accounts in Clouddriver, and
//! nothing else. It depends on the model crate (the error type, the time format), the net
//! crate (the HTTPS client) and the store crate (where its [`ledger`] is kept) only; the hub
//! hands it the accounts to register ([`Registrar::set_desired`]) and decides which replica
//! registers.
//!
//! Registers the hub's accounts in Spinnaker's Clouddriver, so that unmodified Clouddriver
//! (which reaches clusters only by running kubectl with one kubeconfig per account) reaches
//! every cluster through the hub's Kubernetes API proxy.
//!
//! The hub hands the [`Registrar`] the whole set of accounts it wants registered
//! ([`Registrar::set_desired`]), each with a kubeconfig pointing at the proxy; the registrar's
//! loop ([`Registrar::run`]) brings two independent targets in line, either or both:
//! - **the Account Management API** (`--clouddriver-url`; Spinnaker 1.29+ with
//!   `account.storage.enabled` and `account.storage.kubernetes.enabled`): `PUT /credentials`
//!   for each account whose body changed since it was last registered, `DELETE
//!   /credentials/{name}` for each account registered before and no longer wanted. What was
//!   registered is kept in a [`Ledger`] (the hub's store), so removals survive restarts and
//!   unchanged accounts are not sent again. Failures are retried per account, with
//!   exponential backoff and jitter; a refusal (4xx) is logged with what to change and
//!   retried slowly.
//! - **a dynamic-config file** (`--clouddriver-accounts-file`, for installs without the API):
//!   `kubernetes.accounts` as YAML, replaced atomically when its contents change, for
//!   Clouddriver's `dynamic-config.files`. Spring binds a list property from the
//!   highest-priority source that has it and replaces `kubernetes.accounts` as a whole, so
//!   this file must be the only source of that list: Kubernetes accounts defined in
//!   `clouddriver.yml` or elsewhere disappear while it is loaded (copy them into the
//!   agents' settings or the API instead). The file has mode 0600 (it holds tokens), so
//!   Clouddriver must run as the same user to read it.
//!
//! Files: [`body`] builds bodies, the file, hashes and classifies answers (pure); `client`
//! speaks HTTP; [`scale_agent_runtime::write_private`] writes the file atomically;
//! [`registrar`] is the loop; [`ledger`] keeps what was registered in the store;
//! [`metrics`]. Which replica of several registers (the registrar's duty) is decided in the
//! hub, which hands the registrar the accounts.
//!
//! Secrets: kubeconfigs carry bearer tokens. Bodies and the file are never logged;
//! [`DesiredAccount`]'s `Debug` hides the kubeconfig; Clouddriver's error messages are
//! scrubbed of the account's tokens before they are logged or shown.

pub mod body;
pub(crate) mod client;
pub mod definitions;
pub mod ledger;
pub mod metrics;
pub mod registrar;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, SystemTime},
};

use serde::Serialize;
use serde_json::{Map, Value};

pub use self::{metrics::ClouddriverMetrics, registrar::Registrar};
use scale_agent_hub_model::{HubError, Result};

/// Retry delays after failures: `initial × factor^(n-1)`, at most `max`, ±20% jitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub factor: u32,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            factor: 2,
            max: Duration::from_secs(300),
        }
    }
}

/// How the hub registers its accounts in Clouddriver (from `--clouddriver-url`,
/// `--clouddriver-user`, `--clouddriver-accounts-file`, `--clouddriver-account-defaults`,
/// `--clouddriver-ca`). Nothing is registered when neither target is set.
#[derive(Clone, Debug)]
pub struct ClouddriverSettings {
    /// Account Management API base, e.g. `http://spin-clouddriver:7002` (Clouddriver itself,
    /// not Gate).
    pub api_url: Option<String>,
    /// Sent as `X-SPINNAKER-USER`: with Fiat on, an account manager (or admin) that has a
    /// role the accounts' permissions grant.
    pub user: Option<String>,
    /// YAML file for Clouddriver's `dynamic-config.files` (`dynamic-config.enabled: true`).
    /// Spring replaces the list `kubernetes.accounts` as a whole with the one of the
    /// highest-priority source, and this file is loaded first: it must be the only source of
    /// Kubernetes accounts, or the others disappear. Written with mode 0600 (it holds
    /// tokens): Clouddriver must run as the same user to read it.
    pub accounts_file: Option<PathBuf>,
    /// Extra `ManagedAccount` fields for every account (`kubectlExecutable`,
    /// `cacheIntervalSeconds`, `onlySpinnakerManaged`, `checkPermissionsOnStartup`, ...),
    /// checked by [`body::check_defaults`]; see [`load_account_defaults`].
    pub account_defaults: Map<String, Value>,
    /// PEM CA bundle trusted for an https `api_url`, besides the public web roots.
    pub ca_file: Option<PathBuf>,
    /// Deadline of one request.
    pub request_timeout: Duration,
    /// Retry delays after a failure (no answer, 5xx, 409, 429) or a failed file write.
    pub backoff: Backoff,
    /// Retry period after Clouddriver refused an account (another 4xx): it will not change
    /// its mind until someone changes its configuration, but it may (an account manager
    /// role granted, account storage turned on). A changed account is sent at once.
    pub rejected_retry: Duration,
    /// Requests in flight at once.
    pub concurrency: usize,
}

impl Default for ClouddriverSettings {
    fn default() -> Self {
        ClouddriverSettings {
            api_url: None,
            user: None,
            accounts_file: None,
            account_defaults: Map::new(),
            ca_file: None,
            request_timeout: Duration::from_secs(30),
            backoff: Backoff::default(),
            rejected_retry: Duration::from_secs(300),
            concurrency: 4,
        }
    }
}

impl ClouddriverSettings {
    /// Whether any target is configured.
    pub fn enabled(&self) -> bool {
        self.api_url.is_some() || self.accounts_file.is_some()
    }

    /// Checks what [`Registrar::new`] relies on (URL, defaults, durations, the CA file).
    pub fn validate(&self) -> Result<()> {
        if let Some(url) = &self.api_url {
            client::parse_api_url(url).map_err(HubError::Config)?;
        }
        if self.user.is_some() && self.api_url.is_none() {
            return Err(HubError::Config(
                "--clouddriver-user needs --clouddriver-url".into(),
            ));
        }
        if let Some(path) = &self.accounts_file
            && (path.file_name().is_none() || path.as_os_str().is_empty())
        {
            return Err(HubError::Config(format!(
                "--clouddriver-accounts-file {} is not a file path",
                path.display()
            )));
        }
        body::check_defaults(&self.account_defaults).map_err(|problems| {
            HubError::Config(format!(
                "--clouddriver-account-defaults: {}",
                problems.join("; ")
            ))
        })?;
        if self.backoff.initial.is_zero() || self.backoff.max < self.backoff.initial {
            return Err(HubError::Config(
                "the Clouddriver backoff needs 0 < initial <= max".into(),
            ));
        }
        if self.request_timeout.is_zero() || self.rejected_retry.is_zero() || self.concurrency == 0
        {
            return Err(HubError::Config(
                "the Clouddriver request timeout, rejected-retry period and concurrency must be \
                 positive"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Reads `--clouddriver-account-defaults`: a YAML (or JSON) mapping of `ManagedAccount` fields,
/// e.g. `kubectlExecutable: kubectl-1.29` and `cacheIntervalSeconds: 60`.
pub fn load_account_defaults(path: &Path) -> Result<Map<String, Value>> {
    let text = std::fs::read_to_string(path).map_err(|source| HubError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    let value: Value = if text.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_saphyr::from_str(&text).map_err(|e| {
            HubError::Config(format!(
                "--clouddriver-account-defaults {}: {e}",
                path.display()
            ))
        })?
    };
    let Value::Object(map) = value else {
        return Err(HubError::Config(format!(
            "--clouddriver-account-defaults {}: expected a mapping of ManagedAccount fields",
            path.display()
        )));
    };
    body::check_defaults(&map).map_err(|problems| {
        HubError::Config(format!(
            "--clouddriver-account-defaults {}: {}",
            path.display(),
            problems.join("; ")
        ))
    })?;
    Ok(map)
}

/// One account the hub wants registered.
#[derive(Clone, PartialEq)]
pub struct DesiredAccount {
    /// The Spinnaker account name.
    pub name: String,
    /// A complete kubeconfig pointing at the hub's proxy with a per-account token (made by
    /// the hub). Secret.
    pub kubeconfig: String,
    /// The agent's account settings as JSON, camelCase (`permissions`, `namespaces`, ...);
    /// what is passed on is described at [`body::managed_account`].
    pub properties: Value,
}

impl std::fmt::Debug for DesiredAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DesiredAccount")
            .field("name", &self.name)
            .field(
                "kubeconfig",
                &format_args!("<{} bytes, redacted>", self.kubeconfig.len()),
            )
            .field("properties", &self.properties)
            .finish()
    }
}

/// A persisted record of the accounts registered through the API and the hash of the body
/// last PUT for each ([`body::body_hash`]), so that removals survive hub restarts and
/// unchanged accounts are not sent again. Calls are short and synchronous; the registrar
/// makes them on a blocking thread.
pub trait Ledger: Send + Sync {
    /// Every account recorded, with its body hash.
    fn load(&self) -> Result<BTreeMap<String, String>>;
    /// `name` was registered with a body of this hash.
    fn record(&self, name: &str, body_hash: &str) -> Result<()>;
    /// `name` was removed.
    fn forget(&self, name: &str) -> Result<()>;
}

/// A [`Ledger`] in memory: for tests, and for a hub without a store (a restart then forgets
/// what to remove).
#[derive(Debug, Default)]
pub struct MemoryLedger {
    entries: Mutex<BTreeMap<String, String>>,
}

impl MemoryLedger {
    /// A ledger that starts with these entries (as if loaded from a store).
    pub fn with_entries(entries: BTreeMap<String, String>) -> Self {
        MemoryLedger {
            entries: Mutex::new(entries),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Ledger for MemoryLedger {
    fn load(&self) -> Result<BTreeMap<String, String>> {
        Ok(self.entries().clone())
    }

    fn record(&self, name: &str, body_hash: &str) -> Result<()> {
        self.entries().insert(name.into(), body_hash.into());
        Ok(())
    }

    fn forget(&self, name: &str) -> Result<()> {
        self.entries().remove(name);
        Ok(())
    }
}

/// Where one account stands on one target, for the hub's REST API. For the file, the
/// attempt fields count rewrites of the whole file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetStatus {
    /// Clouddriver has the account (some version of it) from this target.
    pub registered: bool,
    /// Nothing left to do: registered with the current settings, or removed when no longer
    /// wanted.
    pub in_sync: bool,
    /// Attempts since the hub started.
    pub attempts: u64,
    /// Failed attempts since the last success.
    pub consecutive_failures: u32,
    /// When the last attempt started (RFC 3339).
    #[serde(serialize_with = "timestamp")]
    pub last_attempt: Option<SystemTime>,
    /// When the last attempt succeeded (RFC 3339).
    #[serde(serialize_with = "timestamp")]
    pub last_success: Option<SystemTime>,
    /// Why the last attempt failed, with what to change when Clouddriver refused it.
    pub last_error: Option<String>,
}

/// One account's registration, for the hub's REST API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationStatus {
    pub account: String,
    /// The hub wants the account registered (otherwise it is being removed).
    pub desired: bool,
    /// The Account Management API, when configured.
    pub api: Option<TargetStatus>,
    /// The dynamic-config file, when configured.
    pub file: Option<TargetStatus>,
}

fn timestamp<S: serde::Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&scale_agent_hub_model::time::rfc3339(*t)),
        None => s.serialize_none(),
    }
}
