//! Command-line options, the config file (Armory's shape, see
//! [`scale_agent_crds::agent_config::AgentConfig`]), flag/env overrides, and the difference
//! between two configs' accounts for hot reload.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use clap::Parser;
use scale_agent_crds::agent_config::{AccountConfig, AgentConfig, UnknownKey};

use crate::error::{Error, Result};

/// Default location of the config file (the operator mounts the ConfigMap there).
pub const DEFAULT_CONFIG_PATH: &str = "/etc/scale-agent/scale-agent.yaml";

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
    /// Config file (Armory's `armory-agent.yaml` shape), re-read every 2 s. Default
    /// `/etc/scale-agent/scale-agent.yaml`, where a missing file means the defaults (no
    /// accounts); a path given here that does not exist is refused at start-up.
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
        }
    }

    /// The replica name: the flag, else `$POD_NAME`, else the host name, else `scale-agent`.
    pub fn replica_name(&self) -> String {
        if let Some(replica) = self.replica.as_ref().filter(|r| !r.is_empty()) {
            return replica.clone();
        }
        if let Ok(pod) = std::env::var("POD_NAME")
            && !pod.is_empty()
        {
            return pod;
        }
        if let Ok(host) = std::env::var("HOSTNAME")
            && !host.is_empty()
        {
            return host;
        }
        std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "scale-agent".to_string())
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
            config.clouddriver.insecure = true;
        }
    }

    /// The config file: `--config`, else [`DEFAULT_CONFIG_PATH`].
    pub fn config_path(&self) -> &Path {
        self.config
            .as_deref()
            .unwrap_or_else(|| Path::new(DEFAULT_CONFIG_PATH))
    }

    /// Reads and parses the config file, then applies the flags. A missing file at the
    /// default path is the default config (Armory's agent also starts without one); a
    /// missing file the operator named with `--config` is an error, as it is surely a mistake.
    pub fn load(&self) -> Result<LoadedConfig> {
        let path = self.config_path();
        let text = match read_config_text(path)? {
            Some(text) => text,
            None if self.config.is_some() => {
                return Err(Error::ConfigMissing {
                    path: path.to_path_buf(),
                });
            }
            None => {
                return Ok(LoadedConfig {
                    parsed: self.parse_text("")?,
                    text: String::new(),
                    missing: true,
                });
            }
        };
        Ok(LoadedConfig {
            parsed: self.parse_text(&text)?,
            text,
            missing: false,
        })
    }

    /// Parses config text and applies the flags.
    pub fn parse_text(&self, text: &str) -> Result<ParsedConfig> {
        let mut parsed = parse_config(self.config_path(), text)?;
        self.apply_overrides(&mut parsed.config);
        Ok(parsed)
    }
}

/// A parsed config and the keys it ignored.
#[derive(Clone, Debug)]
pub struct ParsedConfig {
    pub config: AgentConfig,
    /// Keys no setting reads (typos, or Armory keys this agent does not support); ignored,
    /// and worth a warning each.
    pub unknown_keys: Vec<UnknownKey>,
}

/// The config the agent starts with.
#[derive(Clone, Debug)]
pub struct LoadedConfig {
    pub parsed: ParsedConfig,
    /// The file's text (empty when there is no file), to notice changes.
    pub text: String,
    /// No file at the default path: running on the defaults.
    pub missing: bool,
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

/// Parses and validates config text.
pub fn parse_config(path: &Path, text: &str) -> Result<ParsedConfig> {
    let (config, unknown_keys) =
        AgentConfig::from_yaml_reporting_unknown(text).map_err(|e| Error::ParseConfig {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    validate(&config).map_err(|message| Error::ParseConfig {
        path: path.to_path_buf(),
        message,
    })?;
    Ok(ParsedConfig {
        config,
        unknown_keys,
    })
}

/// Checks what the types cannot: account names present and unique.
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
        assert!(config.clouddriver.insecure);
    }

    #[test]
    fn a_missing_file_at_the_default_path_is_the_default_config() {
        let mut options = Options::for_config("x");
        options.config = None;
        assert_eq!(options.config_path(), Path::new(DEFAULT_CONFIG_PATH));
        // The test machine has no agent config at the default path.
        let loaded = options.load().unwrap();
        assert!(loaded.missing);
        assert!(loaded.text.is_empty());
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

    #[test]
    fn replica_flag_wins() {
        let mut options = Options::for_config("x");
        options.replica = Some("agent-0".into());
        assert_eq!(options.replica_name(), "agent-0");
        options.replica = None;
        assert!(!options.replica_name().is_empty());
    }
}
