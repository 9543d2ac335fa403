//! The hub's configuration: [`Config`] (what [`crate::start`] needs) and [`Args`] (the
//! command line, every flag with an environment fallback).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Parser;

use crate::{
    agent_ca::AgentCaSource,
    clouddriver::ClouddriverSettings,
    error::{HubError, Result},
    identity::AllowRule,
};

/// How the gRPC listener authenticates agents.
#[derive(Clone, Debug)]
pub enum GrpcSecurity {
    /// TLS with a client certificate required and verified against `client_ca_pem`.
    MutualTls(TlsMaterial),
    /// No TLS at all; every agent has the identity [`crate::identity::ANONYMOUS`].
    InsecurePlaintext,
}

/// PEM-encoded certificate material for the gRPC listener.
#[derive(Clone)]
pub struct TlsMaterial {
    /// The server certificate chain.
    pub cert_pem: Vec<u8>,
    /// The server's private key.
    pub key_pem: Vec<u8>,
    /// An external CA (or CAs) whose agent certificates are trusted besides the ones the hub
    /// issues: the operator-signed mode, an explicit opt-in (`--client-ca`). `None`: only
    /// certificates the hub issued.
    pub client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .field(
                "client_ca_pem",
                &format_args!("{} bytes", self.client_ca_pem.as_ref().map_or(0, Vec::len)),
            )
            .finish()
    }
}

/// How the HTTP listener (REST API and Kubernetes API proxy) is served.
#[derive(Clone)]
pub enum HttpSecurity {
    /// TLS with this certificate chain and key (PEM).
    Tls { cert_pem: Vec<u8>, key_pem: Vec<u8> },
    /// No TLS: bearer tokens cross the network in clear. Only behind an explicit flag.
    Plaintext,
}

impl std::fmt::Debug for HttpSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpSecurity::Tls { cert_pem, .. } => f
                .debug_struct("Tls")
                .field("cert_pem", &format_args!("{} bytes", cert_pem.len()))
                .field("key_pem", &"<redacted>")
                .finish(),
            HttpSecurity::Plaintext => f.write_str("Plaintext"),
        }
    }
}

/// Default lifetime of the certificates the hub issues to agents.
pub const DEFAULT_AGENT_CERT_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// Longest heartbeat period accepted.
pub const MAX_HEARTBEAT_PERIOD: Duration = Duration::from_secs(3600);

/// Everything [`crate::start`] needs.
#[derive(Clone, Debug)]
pub struct Config {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub security: GrpcSecurity,
    /// Holds `hub.redb`.
    pub data_dir: PathBuf,
    /// How long an account with no connected agent is kept.
    pub grace_period: Duration,
    pub heartbeat_period: Duration,
    pub max_unacked: u32,
    pub max_object_bytes: u64,
    /// Empty: only the account patterns of agent tokens and enrolments limit registrations.
    pub allow: Vec<AllowRule>,
    /// How long finished operations stay visible at `GET /api/v1/operations/{id}`.
    pub operation_retention: Duration,
    pub http_security: HttpSecurity,
    /// The HTTP listener's URL as clients reach it (`https://hub.example:8443`), for the
    /// kubeconfigs the hub hands out; unset: taken from each request's `Host`.
    pub public_url: Option<String>,
    /// PEM of the CA that signed the HTTP serving certificate, put into kubeconfigs; unset:
    /// kubeconfigs rely on the system roots.
    pub serving_ca_pem: Option<Vec<u8>>,
    /// File holding the admin token (created with a new token when missing); `None`: no
    /// admin token, so the admin API refuses every request.
    pub admin_token_file: Option<PathBuf>,
    /// Registration of accounts in Clouddriver (off unless a target is set).
    pub clouddriver: ClouddriverSettings,
    /// Where the CA that issues agents' certificates lives.
    pub agent_ca: AgentCaSource,
    /// Lifetime of the certificates the hub issues to agents.
    pub agent_cert_lifetime: Duration,
}

impl Config {
    /// Checks the values [`crate::start`] relies on.
    pub fn validate(&self) -> Result<()> {
        if self.heartbeat_period < Duration::from_secs(1)
            || self.heartbeat_period > MAX_HEARTBEAT_PERIOD
        {
            return Err(HubError::Config(format!(
                "the heartbeat period must be between 1s and 1h, not {:?}",
                self.heartbeat_period
            )));
        }
        if self.max_unacked == 0 {
            return Err(HubError::Config("--max-unacked must be at least 1".into()));
        }
        if self.agent_cert_lifetime < Duration::from_secs(10) {
            return Err(HubError::Config(format!(
                "--agent-cert-lifetime must be at least 10s, not {:?}",
                self.agent_cert_lifetime
            )));
        }
        if self.max_object_bytes == 0 {
            return Err(HubError::Config(
                "--max-object-bytes must be at least 1".into(),
            ));
        }
        self.clouddriver.validate()?;
        if self.clouddriver.enabled() && self.public_url.is_none() {
            return Err(HubError::Config(
                "registering accounts in Clouddriver (--clouddriver-url or \
                 --clouddriver-accounts-file) needs --public-url: the URL Clouddriver reaches \
                 the hub's HTTP listener at, e.g. https://scale-agent-hub.spinnaker:8443"
                    .into(),
            ));
        }
        Ok(())
    }

    /// A configuration with the defaults of the command line, for the given security and
    /// data directory (handy for tests: set the addresses to `127.0.0.1:0`). Unlike the
    /// command line, the HTTP listener is plaintext and there is no admin token file: set
    /// `http_security` and `admin_token_file` where a test needs them.
    pub fn new(security: GrpcSecurity, data_dir: impl Into<PathBuf>) -> Self {
        Config {
            grpc_addr: SocketAddr::from(([0, 0, 0, 0], 9091)),
            http_addr: SocketAddr::from(([0, 0, 0, 0], 8443)),
            security,
            data_dir: data_dir.into(),
            grace_period: Duration::from_secs(600),
            heartbeat_period: Duration::from_secs(15),
            max_unacked: 1000,
            max_object_bytes: 2 * 1024 * 1024,
            allow: Vec::new(),
            operation_retention: Duration::from_secs(15 * 60),
            http_security: HttpSecurity::Plaintext,
            public_url: None,
            serving_ca_pem: None,
            admin_token_file: None,
            clouddriver: ClouddriverSettings::default(),
            agent_ca: AgentCaSource::DataDir,
            agent_cert_lifetime: DEFAULT_AGENT_CERT_LIFETIME,
        }
    }
}

pub use scale_agent_runtime::LogFormat;

/// scale-agent-hub: accepts Scale Agent streams over mutual TLS, caches every agent's
/// cluster, and serves it over an HTTP API.
#[derive(Clone, Debug, Parser)]
#[command(name = "scale-agent-hub", version, about, long_about = None)]
pub struct Args {
    /// Address of the gRPC listener agents connect to.
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_GRPC_ADDR",
        default_value = "0.0.0.0:9091"
    )]
    pub grpc_addr: SocketAddr,

    /// Address of the HTTP listener: the Kubernetes API proxy (/clusters/<account>/...), the
    /// REST API, /healthz, /readyz and /metrics. TLS unless --http-plaintext.
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_HTTP_ADDR",
        default_value = "0.0.0.0:8443"
    )]
    pub http_addr: SocketAddr,

    /// PEM certificate chain of the HTTP listener; default: --tls-cert.
    #[arg(long, env = "SCALE_AGENT_HUB_HTTP_TLS_CERT")]
    pub http_tls_cert: Option<PathBuf>,

    /// PEM private key of the HTTP listener; default: --tls-key.
    #[arg(long, env = "SCALE_AGENT_HUB_HTTP_TLS_KEY")]
    pub http_tls_key: Option<PathBuf>,

    /// Serve HTTP without TLS: proxy tokens and cluster data cross the network in clear.
    /// For tests, or behind a TLS-terminating ingress on the same host only.
    #[arg(long, env = "SCALE_AGENT_HUB_HTTP_PLAINTEXT")]
    pub http_plaintext: bool,

    /// The HTTP listener's URL as kubectl and Clouddriver reach it, e.g.
    /// https://scale-agent-hub.spinnaker:8443; written into the kubeconfigs the hub hands
    /// out. Default: taken from the request asking for a kubeconfig.
    #[arg(long, env = "SCALE_AGENT_HUB_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// PEM file with the CA that signed the HTTP serving certificate, written into the
    /// kubeconfigs the hub hands out (certificate-authority-data). Default: none, clients
    /// use their system roots.
    #[arg(long, env = "SCALE_AGENT_HUB_SERVING_CA")]
    pub serving_ca: Option<PathBuf>,

    /// Register every account in Clouddriver's Account Management API at this URL
    /// (Clouddriver itself, e.g. http://spin-clouddriver:7002; Spinnaker 1.29+ with
    /// account.storage.enabled and account.storage.kubernetes.enabled), and remove it when
    /// its grace period ends. Needs --public-url.
    #[arg(long, env = "SCALE_AGENT_HUB_CLOUDDRIVER_URL")]
    pub clouddriver_url: Option<String>,

    /// Sent to Clouddriver as X-SPINNAKER-USER: with Fiat on, an account manager with a role
    /// the accounts' permissions grant.
    #[arg(long, env = "SCALE_AGENT_HUB_CLOUDDRIVER_USER")]
    pub clouddriver_user: Option<String>,

    /// Also (or instead) write every account to this YAML file for Clouddriver's
    /// dynamic-config.files (replaced atomically; mode 0600). It must be Clouddriver's only
    /// source of kubernetes.accounts. Needs --public-url.
    #[arg(long, env = "SCALE_AGENT_HUB_CLOUDDRIVER_ACCOUNTS_FILE")]
    pub clouddriver_accounts_file: Option<PathBuf>,

    /// YAML or JSON file of Clouddriver account fields added to every account
    /// (kubectlExecutable, cacheIntervalSeconds, onlySpinnakerManaged,
    /// checkPermissionsOnStartup, ...).
    #[arg(long, env = "SCALE_AGENT_HUB_CLOUDDRIVER_ACCOUNT_DEFAULTS")]
    pub clouddriver_account_defaults: Option<PathBuf>,

    /// PEM CA bundle trusted (besides the public roots) for an https --clouddriver-url.
    #[arg(long, env = "SCALE_AGENT_HUB_CLOUDDRIVER_CA")]
    pub clouddriver_ca: Option<PathBuf>,

    /// File with the admin token, which issues and revokes proxy tokens
    /// (`scale-agent-hub kubeconfig`, `scale-agent-hub token`). Created with a new random
    /// token (mode 0600) when missing. Default: <data-dir>/admin-token.
    #[arg(long, env = "SCALE_AGENT_HUB_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// PEM file with the gRPC server's certificate chain. Required unless
    /// --insecure-plaintext.
    #[arg(long, env = "SCALE_AGENT_HUB_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM file with the gRPC server's private key. Required unless --insecure-plaintext.
    #[arg(long, env = "SCALE_AGENT_HUB_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// PEM file with an external CA whose agent client certificates the hub trusts besides
    /// the ones it issues itself (the operator-signed mode). An explicit opt-in: without it
    /// only certificates the hub issued (by enrolment) are accepted.
    #[arg(long, env = "SCALE_AGENT_HUB_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,

    /// PEM certificate of the CA that issues agents' certificates (with --agent-ca-key), for
    /// example from a Secret in Spinnaker's cluster. Default: <data-dir>/agent-ca.crt, made
    /// at first start.
    #[arg(long, env = "SCALE_AGENT_HUB_AGENT_CA_CERT", requires = "agent_ca_key")]
    pub agent_ca_cert: Option<PathBuf>,

    /// PEM PKCS#8 private key of that CA (with --agent-ca-cert). Default:
    /// <data-dir>/agent-ca.key (mode 0600), made at first start.
    #[arg(long, env = "SCALE_AGENT_HUB_AGENT_CA_KEY", requires = "agent_ca_cert")]
    pub agent_ca_key: Option<PathBuf>,

    /// Lifetime of the certificates the hub issues to agents (agents renew at 2/3 of it).
    /// Seconds, or a number with ms, s, m or h.
    #[arg(long, env = "SCALE_AGENT_HUB_AGENT_CERT_LIFETIME", default_value = "720h", value_parser = parse_duration)]
    pub agent_cert_lifetime: Duration,

    /// Serve gRPC without TLS and without authenticating agents (every agent is
    /// "anonymous"). For local experiments only.
    #[arg(long, env = "SCALE_AGENT_HUB_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,

    /// Directory of the embedded store (file hub.redb): cached objects, resume points and
    /// account bindings survive restarts.
    #[arg(long, env = "SCALE_AGENT_HUB_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,

    /// How long an account with no connected agent is kept (cache and resume points
    /// included) before it is removed: seconds, or a number with ms, s, m or h.
    #[arg(long, env = "SCALE_AGENT_HUB_GRACE_PERIOD", default_value = "600s", value_parser = parse_duration)]
    pub grace_period: Duration,

    /// Period of application heartbeats, sent to agents in Welcome; a stream silent for two
    /// periods is ended. Seconds, or a number with ms, s, m or h.
    #[arg(long, env = "SCALE_AGENT_HUB_HEARTBEAT_PERIOD", default_value = "15s", value_parser = parse_duration)]
    pub heartbeat_period: Duration,

    /// Most messages an agent may send without an acknowledgement.
    #[arg(long, env = "SCALE_AGENT_HUB_MAX_UNACKED", default_value_t = 1000)]
    pub max_unacked: u32,

    /// Largest object payload in bytes; agents send larger objects truncated (metadata
    /// only).
    #[arg(long, env = "SCALE_AGENT_HUB_MAX_OBJECT_BYTES", default_value_t = 2 * 1024 * 1024)]
    pub max_object_bytes: u64,

    /// IDENTITY=PATTERN: the agent identity (from its client certificate or agent token) may
    /// register accounts whose name matches PATTERN. Both sides accept `*` wildcards.
    /// Repeatable; with no rule, only the account patterns of agent tokens and enrolments
    /// apply. Comma-separated in the environment variable.
    #[arg(long, env = "SCALE_AGENT_HUB_ALLOW", value_delimiter = ',', value_parser = AllowRule::parse)]
    pub allow: Vec<AllowRule>,

    /// How long finished operations stay visible at GET /api/v1/operations/{id} (at most
    /// 10000 are kept). Seconds, or a number with ms, s, m or h.
    #[arg(long, env = "SCALE_AGENT_HUB_OPERATION_RETENTION", default_value = "15m", value_parser = parse_duration)]
    pub operation_retention: Duration,

    /// Log format.
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

impl Args {
    /// Reads the files the flags name and builds the [`Config`].
    pub fn into_config(self) -> Result<Config> {
        let security = if self.insecure_plaintext {
            GrpcSecurity::InsecurePlaintext
        } else {
            let missing: Vec<&str> = [
                ("--tls-cert", self.tls_cert.is_none()),
                ("--tls-key", self.tls_key.is_none()),
            ]
            .into_iter()
            .filter_map(|(flag, missing)| missing.then_some(flag))
            .collect();
            match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => GrpcSecurity::MutualTls(TlsMaterial {
                    cert_pem: read(cert)?,
                    key_pem: read(key)?,
                    client_ca_pem: self.client_ca.as_ref().map(read).transpose()?,
                }),
                _ => {
                    return Err(HubError::Config(format!(
                        "mutual TLS needs {} (or pass --insecure-plaintext to serve without TLS)",
                        missing.join(", ")
                    )));
                }
            }
        };
        let http_security = if self.http_plaintext {
            HttpSecurity::Plaintext
        } else {
            let cert = self.http_tls_cert.as_ref().or(self.tls_cert.as_ref());
            let key = self.http_tls_key.as_ref().or(self.tls_key.as_ref());
            match (cert, key) {
                (Some(cert), Some(key)) => HttpSecurity::Tls {
                    cert_pem: read(cert)?,
                    key_pem: read(key)?,
                },
                _ => {
                    return Err(HubError::Config(
                        "the HTTP listener serves TLS: give it a certificate and key \
                         (--http-tls-cert and --http-tls-key, or --tls-cert and --tls-key), or \
                         pass --http-plaintext to serve it without TLS"
                            .into(),
                    ));
                }
            }
        };
        if let Some(url) = &self.public_url
            && !(url.starts_with("https://") || url.starts_with("http://"))
        {
            return Err(HubError::Config(format!(
                "--public-url {url:?} must start with https:// (or http:// with --http-plaintext)"
            )));
        }
        let serving_ca_pem = self.serving_ca.as_ref().map(read).transpose()?;
        let admin_token_file = Some(
            self.admin_token_file
                .clone()
                .unwrap_or_else(|| self.data_dir.join("admin-token")),
        );
        let clouddriver = ClouddriverSettings {
            api_url: self.clouddriver_url,
            user: self.clouddriver_user,
            accounts_file: self.clouddriver_accounts_file,
            account_defaults: match &self.clouddriver_account_defaults {
                Some(path) => crate::clouddriver::load_account_defaults(path)?,
                None => serde_json::Map::new(),
            },
            ca_file: self.clouddriver_ca,
            ..ClouddriverSettings::default()
        };
        let config = Config {
            grpc_addr: self.grpc_addr,
            http_addr: self.http_addr,
            security,
            data_dir: self.data_dir,
            grace_period: self.grace_period,
            heartbeat_period: self.heartbeat_period,
            max_unacked: self.max_unacked,
            max_object_bytes: self.max_object_bytes,
            allow: self.allow,
            operation_retention: self.operation_retention,
            http_security,
            public_url: self.public_url,
            serving_ca_pem,
            admin_token_file,
            clouddriver,
            agent_ca: match (self.agent_ca_cert, self.agent_ca_key) {
                (Some(cert), Some(key)) => AgentCaSource::Files { cert, key },
                _ => AgentCaSource::DataDir,
            },
            agent_cert_lifetime: self.agent_cert_lifetime,
        };
        config.validate()?;
        Ok(config)
    }
}

fn read(path: &PathBuf) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| HubError::ReadFile {
        path: path.clone(),
        source,
    })
}

/// Parses `600`, `600s`, `10m`, `1h` or `250ms`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration: expected e.g. 600, 600s, 10m, 1h, 250ms"))?;
    let d = match unit.trim() {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        other => {
            return Err(format!("{s:?}: unknown unit {other:?} (use ms, s, m or h)"));
        }
    };
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("600").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("600s").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5d").is_err());
    }

    #[test]
    fn defaults_and_missing_tls() {
        let args = Args::try_parse_from(["scale-agent-hub"]).unwrap();
        assert_eq!(args.grpc_addr.port(), 9091);
        assert_eq!(args.http_addr.port(), 8443);
        assert_eq!(args.grace_period, Duration::from_secs(600));
        assert_eq!(args.heartbeat_period, Duration::from_secs(15));
        assert_eq!(args.max_unacked, 1000);
        assert_eq!(args.max_object_bytes, 2 * 1024 * 1024);
        assert_eq!(args.agent_cert_lifetime, DEFAULT_AGENT_CERT_LIFETIME);
        let err = args.into_config().unwrap_err().to_string();
        assert!(err.contains("--tls-cert, --tls-key"), "{err}");
        assert!(!err.contains("--client-ca"), "{err}");

        // Plaintext gRPC still needs TLS material for HTTP, or the explicit flag.
        let args = Args::try_parse_from(["scale-agent-hub", "--insecure-plaintext"]).unwrap();
        let err = args.into_config().unwrap_err().to_string();
        assert!(err.contains("--http-plaintext"), "{err}");

        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--insecure-plaintext",
            "--http-plaintext",
            "--allow",
            "agent-a=prod-*",
            "--allow",
            "*=dev",
            "--grace-period",
            "2m",
        ])
        .unwrap();
        let config = args.into_config().unwrap();
        assert!(matches!(config.security, GrpcSecurity::InsecurePlaintext));
        assert_eq!(config.allow.len(), 2);
        assert_eq!(config.grace_period, Duration::from_secs(120));
        assert!(!format!("{config:?}").contains("PRIVATE"));

        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--insecure-plaintext",
            "--http-plaintext",
            "--heartbeat-period",
            "5000h",
        ])
        .unwrap();
        let err = args.into_config().unwrap_err().to_string();
        assert!(err.contains("heartbeat period"), "{err}");
    }
}
