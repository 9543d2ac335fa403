//! Command-line options, the config file (Armory's shape, see
//! [`scale_agent_crds::agent_config::AgentConfig`]) at our path or Armory's, merged with its
//! local overlay as Armory merges `armory-agent-local.yaml`, flag/env overrides, and the
//! difference between two configs' accounts for hot reload.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use clap::Parser;
use scale_agent_crds::agent_config::{AccountConfig, AgentConfig, UnknownKey};
use serde_json::Value;

use crate::config_armory::{self, ArmoryNotice, Verdict};
use crate::error::{Error, Result};

/// Default location of the config file (the operator mounts the ConfigMap there).
pub const DEFAULT_CONFIG_PATH: &str = "/etc/scale-agent/scale-agent.yaml";

/// Armory's locations of the file, tried in this order when there is none at
/// [`DEFAULT_CONFIG_PATH`] and `--config` is not given: `/opt/armory/config/armory-agent.yml`
/// (or `.yaml`), then the pre-0.6 `kubesvc.yml` (or `.yaml`) in `/opt/spinnaker/config`.
pub const ARMORY_CONFIG_PATHS: &[&str] = &[
    "/opt/armory/config/armory-agent.yml",
    "/opt/armory/config/armory-agent.yaml",
    "/opt/spinnaker/config/kubesvc.yml",
    "/opt/spinnaker/config/kubesvc.yaml",
];

pub use scale_agent_runtime::LogFormat;

/// The agent's command line. Every flag also reads an environment variable; flags win over
/// the config file.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "scale-agent",
    version,
    about = "Scale Agent: streams a Kubernetes cluster to the Scale Agent hub"
)]
pub struct Options {
    /// Config file (Armory's `armory-agent.yaml` shape), re-read every 2 s, merged with its
    /// local overlay (`<name>-local.yml` or `.yaml` beside it) when there is one. Default
    /// `/etc/scale-agent/scale-agent.yaml`, else the first of Armory's paths that exists
    /// (`/opt/armory/config/armory-agent.yml`, ...), where a missing file means the defaults
    /// (no accounts); a path given here that does not exist is refused at start-up.
    #[arg(long, env = "SCALE_AGENT_CONFIG")]
    pub config: Option<PathBuf>,

    /// Hub gRPC address, `host:port` (overrides `clouddriver.grpc`).
    #[arg(long, env = "SCALE_AGENT_HUB")]
    pub hub: Option<String>,

    /// PEM CA bundle that signed the hub's certificate (overrides `clouddriver.tls.cacertFile`).
    #[arg(long, env = "SCALE_AGENT_HUB_CA")]
    pub hub_ca: Option<PathBuf>,

    /// PEM client certificate for mutual TLS (overrides `clouddriver.tls.clientCertFile`);
    /// re-read on every reconnect.
    #[arg(long, env = "SCALE_AGENT_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM (PKCS#8) key of the client certificate (overrides `clouddriver.tls.clientKeyFile`).
    #[arg(long, env = "SCALE_AGENT_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// Name to verify in the hub's certificate (overrides `clouddriver.tls.serverName`);
    /// the host of the hub address by default.
    #[arg(long, env = "SCALE_AGENT_HUB_SERVER_NAME")]
    pub hub_server_name: Option<String>,

    /// Talk to the hub without TLS. For tests only.
    #[arg(long, env = "SCALE_AGENT_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,

    /// This replica's name, sent in Hello (default: $POD_NAME, else the host name).
    #[arg(long, env = "SCALE_AGENT_REPLICA")]
    pub replica: Option<String>,

    /// Admin listener (health, readiness, metrics, /accounts); default `0.0.0.0:<server.port>`.
    /// Port 0 picks a free port.
    #[arg(long, env = "SCALE_AGENT_ADMIN_ADDR")]
    pub admin_addr: Option<SocketAddr>,

    /// Log format.
    #[arg(long, env = "SCALE_AGENT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// How often each streamed account repeats discovery, so kinds added (a CRD installed)
    /// or removed are picked up without a restart.
    #[arg(long, env = "SCALE_AGENT_REDISCOVER_SECONDS", default_value_t = 300)]
    pub rediscover_seconds: u64,

    /// Least time between two status writes to one AgentAccount or ScaleAgent for counters
    /// (objects streamed, last event); a change of the `Connected` condition is written
    /// within a second.
    #[arg(
        long,
        env = "SCALE_AGENT_STATUS_INTERVAL_SECONDS",
        default_value_t = 10
    )]
    pub status_interval_seconds: u64,

    /// On SIGTERM, the longest the agent drains before it stops: it unregisters its accounts
    /// (the hub routes new operations and tunnels to another replica of the identity, and a
    /// standby takes over the watches), finishes the operations and tunnelled requests
    /// already running, then ends its stream. Keep it below the pod's
    /// terminationGracePeriodSeconds (the operator sets that to 35 s). 0: no drain.
    #[arg(
        long,
        env = "SCALE_AGENT_DRAIN_TIMEOUT_SECONDS",
        default_value_t = crate::runtime::DEFAULT_DRAIN_TIMEOUT_SECONDS
    )]
    pub drain_timeout_seconds: u64,

    /// A command instead of running the agent.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Commands besides running the agent.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum Command {
    /// Print the ScaleAgent and AgentAccount resources that reproduce an Armory agent, from
    /// its armory-agent.yml (and armory-agent-local.yml) and, optionally, the Kubernetes
    /// manifests that run it (its ConfigMap, Deployment, ClusterRole or Roles). Settings with
    /// no equivalent are listed in YAML comments.
    Migrate(MigrateArgs),
}

/// `scale-agent migrate`'s arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct MigrateArgs {
    /// Armory files: armory-agent.yml, armory-agent-local.yml, and manifests (several
    /// documents per file allowed).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,

    /// Name of the ScaleAgent (and the AgentAccounts' agentRef).
    #[arg(long, env = "SCALE_AGENT_MIGRATE_NAME", default_value = "scale-agent")]
    pub name: String,

    /// Namespace of the resources; default: the manifests' namespace, else none (kubectl's
    /// current namespace when applied).
    #[arg(long, env = "SCALE_AGENT_MIGRATE_NAMESPACE")]
    pub namespace: Option<String>,

    /// The Scale Agent hub's gRPC address (host:port) for spec.hub.address; default:
    /// Armory's clouddriver.grpc, which names Clouddriver, with a comment to change it.
    #[arg(long, env = "SCALE_AGENT_MIGRATE_HUB_ADDRESS")]
    pub hub_address: Option<String>,
}

impl Options {
    /// Options for a config file, everything else default (handy in tests).
    pub fn for_config(path: impl Into<PathBuf>) -> Self {
        Self {
            config: Some(path.into()),
            hub: None,
            hub_ca: None,
            tls_cert: None,
            tls_key: None,
            hub_server_name: None,
            insecure_plaintext: false,
            replica: None,
            admin_addr: None,
            log_format: LogFormat::Text,
            rediscover_seconds: 300,
            status_interval_seconds: 10,
            drain_timeout_seconds: crate::runtime::DEFAULT_DRAIN_TIMEOUT_SECONDS,
            command: None,
        }
    }

    /// The replica name: the flag, else `$POD_NAME`, else the host name
    /// ([`scale_agent_runtime::hostname`]), else `scale-agent`.
    pub fn replica_name(&self) -> String {
        if let Some(replica) = self.replica.as_ref().filter(|r| !r.is_empty()) {
            return replica.clone();
        }
        if let Ok(pod) = std::env::var("POD_NAME")
            && !pod.is_empty()
        {
            return pod;
        }
        scale_agent_runtime::hostname().unwrap_or_else(|| "scale-agent".to_string())
    }

    /// The admin listener's address.
    pub fn admin_addr(&self, config: &AgentConfig) -> SocketAddr {
        self.admin_addr
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], config.server.port)))
    }

    /// Applies the flags on top of a config read from the file.
    pub fn apply_overrides(&self, config: &mut AgentConfig) {
        if let Some(hub) = &self.hub {
            config.clouddriver.grpc = hub.clone();
        }
        let tls = &mut config.clouddriver.tls;
        if let Some(ca) = &self.hub_ca {
            tls.cacert_file = Some(ca.display().to_string());
        }
        if let Some(cert) = &self.tls_cert {
            tls.client_cert_file = Some(cert.display().to_string());
        }
        if let Some(key) = &self.tls_key {
            tls.client_key_file = Some(key.display().to_string());
        }
        if let Some(name) = &self.hub_server_name {
            tls.server_name = Some(name.clone());
        }
        if self.insecure_plaintext {
            config.clouddriver.insecure = Some(true);
        }
    }

    /// The config file: `--config`, else [`DEFAULT_CONFIG_PATH`] when it exists, else the
    /// first of [`ARMORY_CONFIG_PATHS`] that exists, else [`DEFAULT_CONFIG_PATH`].
    pub fn config_path(&self) -> PathBuf {
        if let Some(path) = &self.config {
            return path.clone();
        }
        let candidates: Vec<PathBuf> = std::iter::once(DEFAULT_CONFIG_PATH)
            .chain(ARMORY_CONFIG_PATHS.iter().copied())
            .map(PathBuf::from)
            .collect();
        first_existing(&candidates).unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
    }

    /// Reads the config file and its overlay.
    pub fn read_config(&self) -> Result<ConfigFiles> {
        read_config_files(&self.config_path())
    }

    /// Reads and parses the config file (and its overlay), then applies the flags. No file at
    /// the default paths is the default config (Armory's agent also starts without one); a
    /// missing file the operator named with `--config` is an error, as it is surely a mistake.
    pub fn load(&self) -> Result<LoadedConfig> {
        let files = self.read_config()?;
        if files.is_missing() && self.config.is_some() {
            return Err(Error::ConfigMissing {
                path: self.config_path(),
            });
        }
        Ok(LoadedConfig {
            parsed: self.parse_files(&files)?,
            missing: files.is_missing(),
            files,
        })
    }

    /// Parses one file's text (no overlay) and applies the flags.
    pub fn parse_text(&self, text: &str) -> Result<ParsedConfig> {
        self.parse_files(&ConfigFiles {
            main: Some((self.config_path(), text.to_owned())),
            overlay: None,
        })
    }

    /// Parses the files read and applies the flags.
    pub fn parse_files(&self, files: &ConfigFiles) -> Result<ParsedConfig> {
        let mut parsed = parse_config_files(files)?;
        self.apply_overrides(&mut parsed.config);
        Ok(parsed)
    }
}

/// A parsed config and the keys it ignored.
#[derive(Clone, Debug)]
pub struct ParsedConfig {
    pub config: AgentConfig,
    /// Keys no setting reads (typos, or Armory keys this agent does not know); ignored,
    /// and worth a warning each.
    pub unknown_keys: Vec<UnknownKey>,
    /// Armory keys that have no effect here (those refused stop the parse instead); worth a
    /// warning each.
    pub without_effect: Vec<ArmoryNotice>,
}

/// The config the agent starts with.
#[derive(Clone, Debug)]
pub struct LoadedConfig {
    pub parsed: ParsedConfig,
    /// The files as read (none when there is no file), to notice changes.
    pub files: ConfigFiles,
    /// No file at the default paths: running on the defaults.
    pub missing: bool,
}

/// The config file and its local overlay, each with its path, as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigFiles {
    pub main: Option<(PathBuf, String)>,
    /// `<name>-local.yml` (or `.yaml`) beside the main file, whose keys win (Armory reads
    /// `armory-agent-local.yaml` so, e.g. for accounts rendered by the Vault Agent Injector).
    pub overlay: Option<(PathBuf, String)>,
}

impl ConfigFiles {
    /// Neither file exists.
    pub fn is_missing(&self) -> bool {
        self.main.is_none() && self.overlay.is_none()
    }

    /// The path named in messages: the main file's, else the overlay's.
    pub fn path(&self) -> PathBuf {
        self.main
            .as_ref()
            .or(self.overlay.as_ref())
            .map(|(path, _)| path.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
    }
}

/// The first of `candidates` that exists.
pub fn first_existing(candidates: &[PathBuf]) -> Option<PathBuf> {
    candidates.iter().find(|path| path.exists()).cloned()
}

/// The overlays of `main`, in the order tried: `<stem>-local.yml`, then `<stem>-local.yaml`,
/// in its directory.
pub fn overlay_paths(main: &Path) -> Vec<PathBuf> {
    let stem = main
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = main.parent().unwrap_or_else(|| Path::new(""));
    ["yml", "yaml"]
        .iter()
        .map(|ext| dir.join(format!("{stem}-local.{ext}")))
        .collect()
}

/// Reads `main` and the first of its [`overlay_paths`] that exists.
pub fn read_config_files(main: &Path) -> Result<ConfigFiles> {
    let mut overlay = None;
    for path in overlay_paths(main) {
        if let Some(text) = read_config_text(&path)? {
            overlay = Some((path, text));
            break;
        }
    }
    Ok(ConfigFiles {
        main: read_config_text(main)?.map(|text| (main.to_path_buf(), text)),
        overlay,
    })
}

/// The file's text; `None` when it does not exist.
pub fn read_config_text(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::ReadConfig {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// A file's YAML as a value (`null` when empty).
pub fn yaml_value(path: &Path, text: &str) -> Result<Value> {
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_saphyr::from_str(text).map_err(|e| Error::ParseConfig {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Merges `overlay` into `base` as Armory merges its local file: maps key by key, at every
/// depth; anything else (a scalar, a list such as `kubernetes.accounts`) is replaced whole.
pub fn merge_values(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (_, Value::Null) => {}
        (Value::Object(base), Value::Object(overlay)) => {
            for (key, value) in overlay {
                match base.get_mut(&key) {
                    Some(existing) => merge_values(existing, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, overlay) => *base = overlay,
    }
}

/// Parses and validates config text (one file, no overlay).
pub fn parse_config(path: &Path, text: &str) -> Result<ParsedConfig> {
    parse_config_files(&ConfigFiles {
        main: Some((path.to_path_buf(), text.to_owned())),
        overlay: None,
    })
}

/// Parses the files (the overlay merged into the main file), refuses Armory keys that
/// would not be honoured as written, and validates what the types cannot.
pub fn parse_config_files(files: &ConfigFiles) -> Result<ParsedConfig> {
    let path = files.path();
    let invalid = |message: String| Error::ParseConfig {
        path: path.clone(),
        message,
    };
    let mut raw = match &files.main {
        Some((path, text)) => yaml_value(path, text)?,
        None => Value::Null,
    };
    let (config, mut unknown_keys) = match (&files.main, &files.overlay) {
        // One file: parse its text, whose errors carry line and column.
        (Some((_, text)), None) => AgentConfig::from_yaml_reporting_unknown(text),
        (_, Some((overlay_path, text))) => {
            merge_values(&mut raw, yaml_value(overlay_path, text)?);
            AgentConfig::from_value_reporting_unknown(raw.clone())
        }
        (None, None) => Ok((AgentConfig::default(), Vec::new())),
    }
    .map_err(|e| invalid(e.to_string()))?;
    let (refused, without_effect): (Vec<_>, Vec<_>) = config_armory::check(&raw)
        .into_iter()
        .partition(|notice| notice.verdict == Verdict::Refused);
    if !refused.is_empty() {
        let messages: Vec<String> = refused.iter().map(ToString::to_string).collect();
        return Err(invalid(messages.join("; ")));
    }
    unknown_keys.retain(|key| !config_armory::covers(&key.path));
    validate(&config).map_err(invalid)?;
    Ok(ParsedConfig {
        config,
        unknown_keys,
        without_effect,
    })
}

/// Checks what the types cannot: account names present and unique, and role names without
/// surrounding whitespace.
pub fn validate(config: &AgentConfig) -> std::result::Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for (index, account) in config.kubernetes.accounts.iter().enumerate() {
        if account.name.trim().is_empty() {
            return Err(format!(
                "kubernetes.accounts[{index}] has no name: give every account a unique `name`"
            ));
        }
        if !seen.insert(account.name.as_str()) {
            return Err(format!(
                "account name {:?} appears twice in kubernetes.accounts: account names must be unique",
                account.name
            ));
        }
        for (permission, roles) in &account.permissions {
            // Armory's agent silently drops permissions whose roles carry whitespace, which
            // opens the account to everyone (a documented known issue).
            if let Some(role) = roles
                .iter()
                .find(|r| r.trim() != r.as_str() || r.is_empty())
            {
                return Err(format!(
                    "kubernetes.accounts[{index}].permissions.{permission} has the role {role:?}: \
                     role names must not be empty or have surrounding whitespace; remove the spaces"
                ));
            }
        }
    }
    Ok(())
}

/// How the accounts of two configs differ.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AccountDiff {
    pub added: Vec<AccountConfig>,
    pub changed: Vec<AccountConfig>,
    pub removed: Vec<String>,
}

impl AccountDiff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// Accounts added, changed (any setting differs) and removed from `old` to `new`, by name.
pub fn diff_accounts(old: &[AccountConfig], new: &[AccountConfig]) -> AccountDiff {
    let old_by_name: BTreeMap<&str, &AccountConfig> =
        old.iter().map(|a| (a.name.as_str(), a)).collect();
    let new_by_name: BTreeMap<&str, &AccountConfig> =
        new.iter().map(|a| (a.name.as_str(), a)).collect();
    let mut diff = AccountDiff::default();
    for (name, account) in &new_by_name {
        match old_by_name.get(name) {
            None => diff.added.push((*account).clone()),
            Some(previous) if previous != account => diff.changed.push((*account).clone()),
            Some(_) => {}
        }
    }
    diff.removed = old_by_name
        .keys()
        .filter(|name| !new_by_name.contains_key(*name))
        .map(|name| name.to_string())
        .collect();
    diff
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(name: &str) -> AccountConfig {
        AccountConfig {
            name: name.into(),
            service_account: true,
            ..Default::default()
        }
    }

    #[test]
    fn flags_override_the_file() {
        let mut options = Options::for_config("/nonexistent/scale-agent.yaml");
        options.hub = Some("hub.example:9091".into());
        options.hub_ca = Some("/ca.pem".into());
        options.insecure_plaintext = true;
        let config = options
            .parse_text("clouddriver:\n  grpc: file:9091\n  tls:\n    cacertFile: /file-ca.pem\n    clientCertFile: /c.pem\n")
            .unwrap()
            .config;
        assert_eq!(config.clouddriver.grpc, "hub.example:9091");
        assert_eq!(
            config.clouddriver.tls.cacert_file.as_deref(),
            Some("/ca.pem")
        );
        assert_eq!(
            config.clouddriver.tls.client_cert_file.as_deref(),
            Some("/c.pem")
        );
        assert!(config.clouddriver.plaintext());
    }

    #[test]
    fn a_missing_file_at_the_default_path_is_the_default_config() {
        let mut options = Options::for_config("x");
        options.config = None;
        assert_eq!(options.config_path(), Path::new(DEFAULT_CONFIG_PATH));
        // The test machine has no agent config at the default path.
        let loaded = options.load().unwrap();
        assert!(loaded.missing);
        assert!(loaded.files.is_missing());
        let config = loaded.parsed.config;
        assert!(config.kubernetes.accounts.is_empty());
        assert_eq!(
            options.admin_addr(&config),
            "0.0.0.0:8082".parse::<SocketAddr>().unwrap()
        );
    }

    #[test]
    fn a_missing_file_given_with_config_is_refused_with_what_to_do() {
        let options = Options::for_config("/nonexistent/scale-agent.yaml");
        let err = options.load().unwrap_err().to_string();
        assert!(err.contains("/nonexistent/scale-agent.yaml"), "{err}");
        assert!(err.contains("--config"), "{err}");
        assert!(err.contains("SCALE_AGENT_CONFIG"), "{err}");
    }

    #[test]
    fn unknown_keys_come_with_the_parsed_config() {
        let options = Options::for_config("a.yaml");
        let parsed = options
            .parse_text("kubernetes:\n  accounts:\n    - name: a\n      kindz: [Deployment]\n")
            .unwrap();
        let unknown: Vec<String> = parsed
            .unknown_keys
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            unknown,
            ["kubernetes.accounts[0].kindz (did you mean `kinds`?)"]
        );
    }

    #[test]
    fn duplicate_or_unnamed_accounts_are_refused_with_a_hint() {
        let options = Options::for_config("a.yaml");
        let err = options
            .parse_text("kubernetes:\n  accounts:\n    - name: a\n    - name: a\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be unique"), "{err}");
        let err = options
            .parse_text("kubernetes:\n  accounts:\n    - serviceAccount: true\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("has no name"), "{err}");
        let err = options.parse_text("kubernetes: [").unwrap_err().to_string();
        assert!(err.contains("a.yaml"), "{err}");
    }

    #[test]
    fn diff_finds_added_changed_and_removed_accounts() {
        let old = vec![account("a"), account("b"), account("c")];
        let mut b = account("b");
        b.kinds = vec!["Deployment".into()];
        let new = vec![account("a"), b.clone(), account("d")];
        let diff = diff_accounts(&old, &new);
        assert_eq!(diff.added, vec![account("d")]);
        assert_eq!(diff.changed, vec![b]);
        assert_eq!(diff.removed, vec!["c".to_string()]);
        assert!(diff_accounts(&new, &new).is_empty());
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("scale-agent-config-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_local_overlay_is_merged_key_by_key_and_wins() {
        let dir = temp_dir("overlay");
        let main = dir.join("armory-agent.yml");
        std::fs::write(
            &main,
            "clouddriver:\n  grpc: hub:9091\n  insecure: true\nkubernetes:\n  accounts:\n    - name: static\n      serviceAccount: true\n",
        )
        .unwrap();
        let options = Options::for_config(&main);
        let alone = options.load().unwrap();
        assert_eq!(alone.parsed.config.kubernetes.accounts[0].name, "static");
        assert!(alone.files.overlay.is_none());
        // What a Vault Agent Injector template renders beside it.
        std::fs::write(
            dir.join("armory-agent-local.yml"),
            "clouddriver:\n  grpc: other:9091\nkubernetes:\n  accounts:\n    - name: from-vault\n      kubeconfigFile: /vault/kubeconfig\n",
        )
        .unwrap();
        let merged = options.load().unwrap();
        let config = &merged.parsed.config;
        assert_eq!(config.clouddriver.grpc, "other:9091");
        assert_eq!(
            config.clouddriver.insecure,
            Some(true),
            "kept from the main file"
        );
        let names: Vec<&str> = config
            .kubernetes
            .accounts
            .iter()
            .map(|a| a.name.as_str())
            .collect();
        assert_eq!(names, ["from-vault"], "lists are replaced whole");
        assert_ne!(
            merged.files, alone.files,
            "a change of the overlay is a change"
        );
        assert_eq!(overlay_paths(&main)[1], dir.join("armory-agent-local.yaml"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_first_existing_path_is_read_in_armorys_order() {
        let dir = temp_dir("paths");
        let candidates: Vec<PathBuf> = ["scale-agent.yaml", "armory-agent.yml", "kubesvc.yml"]
            .iter()
            .map(|name| dir.join(name))
            .collect();
        assert_eq!(first_existing(&candidates), None);
        std::fs::write(&candidates[2], "").unwrap();
        assert_eq!(first_existing(&candidates), Some(candidates[2].clone()));
        std::fs::write(&candidates[1], "").unwrap();
        assert_eq!(first_existing(&candidates), Some(candidates[1].clone()));
        std::fs::write(&candidates[0], "").unwrap();
        assert_eq!(first_existing(&candidates), Some(candidates[0].clone()));
        assert!(ARMORY_CONFIG_PATHS[0].ends_with("/opt/armory/config/armory-agent.yml"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refused_armory_keys_stop_the_parse_with_what_to_do_and_others_warn() {
        let options = Options::for_config("armory-agent.yml");
        let err = options
            .parse_text("clouddriver:\n  auth:\n    tokenCommand:\n      command: /bin/token\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("armory-agent.yml"), "{err}");
        assert!(
            err.contains("clouddriver.auth.tokenCommand is not supported: commands are not run: have the command (a sidecar or a CronJob) write the token to a file and set clouddriver.auth.tokenFile"),
            "{err}"
        );
        let parsed = options
            .parse_text("kubernetes:\n  retries:\n    maxRetries: 3\n  accounts:\n    - name: a\n      oAuthScopes: [x]\n      kindz: [pod]\nprometheus:\n  enabled: true\n")
            .unwrap();
        let warned: Vec<String> = parsed
            .without_effect
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(warned.len(), 3, "{warned:#?}");
        assert!(warned[0].starts_with("kubernetes.retries has no effect: not configurable"));
        assert!(warned[1].starts_with("kubernetes.accounts[0].oAuthScopes has no effect"));
        assert!(
            warned[2].starts_with(
                "prometheus has no effect: metrics are always served on the admin port"
            )
        );
        // Only the typo is left as an unknown key.
        let unknown: Vec<String> = parsed
            .unknown_keys
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            unknown,
            ["kubernetes.accounts[0].kindz (did you mean `kinds`?)"]
        );
    }

    #[test]
    fn roles_with_whitespace_are_refused_instead_of_opening_the_account() {
        let options = Options::for_config("a.yaml");
        let err = options
            .parse_text("kubernetes:\n  accounts:\n    - name: a\n      permissions:\n        - READ: ['role1', ' role2']\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("kubernetes.accounts[0].permissions.READ has the role \" role2\""),
            "{err}"
        );
        assert!(err.contains("remove the spaces"), "{err}");
    }

    #[test]
    fn replica_flag_wins() {
        let mut options = Options::for_config("x");
        options.replica = Some("agent-0".into());
        assert_eq!(options.replica_name(), "agent-0");
        options.replica = None;
        assert!(!options.replica_name().is_empty());
    }
}
