//! The hub's configuration: [`Config`] (what [`crate::start`] needs) and [`Args`] (the
//! command line, every flag with an environment fallback).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::Parser;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};

use crate::{
    agent_ca::AgentCaSource,
    clouddriver::ClouddriverSettings,
    error::{HubError, Result},
    forwarded::{Cidr, ForwardedFormat, ProxyTrust},
    identity::AllowRule,
};
pub use scale_agent_hub_auth::grpc_security::{GrpcSecurity, ProxyMode};
pub use scale_agent_hub_net::tls::{HttpSecurity, ProxyHopTls, TlsFiles, TlsMaterial};

/// How often the TLS files are checked for changes by default (a Secret's mounted files
/// change within about a minute of the Secret itself).
pub const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// Default lifetime of the certificates the hub issues to agents.
pub const DEFAULT_AGENT_CERT_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// Default of `--min-heartbeat-period`.
pub const DEFAULT_MIN_HEARTBEAT_PERIOD: Duration = Duration::from_secs(1);
/// Default of `--max-heartbeat-period` (the ScaleAgent's `heartbeat.periodSeconds` goes up
/// to 300).
pub const DEFAULT_MAX_HEARTBEAT_PERIOD: Duration = Duration::from_secs(300);

/// Longest heartbeat period accepted.
pub const MAX_HEARTBEAT_PERIOD: Duration = Duration::from_secs(3600);

/// Everything [`crate::start`] needs.
#[derive(Clone, Debug)]
pub struct Config {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub security: GrpcSecurity,
    /// Holds `hub.redb` (the embedded store), the admin token and the agent CA.
    pub data_dir: PathBuf,
    /// Where the hub keeps its state (`--store`).
    pub store: crate::store::Backend,
    /// How long an account with no connected agent is kept.
    pub grace_period: Duration,
    /// The heartbeat period of agents that ask for none (older agents, or
    /// `keepAliveHeartbeatSeconds` unset).
    pub heartbeat_period: Duration,
    /// The shortest heartbeat period an agent is granted (`--min-heartbeat-period`).
    pub min_heartbeat_period: Duration,
    /// The longest heartbeat period an agent is granted (`--max-heartbeat-period`).
    pub max_heartbeat_period: Duration,
    pub max_unacked: u32,
    pub max_object_bytes: u64,
    /// Most bytes of objects one stream may hold in snapshots not yet ended.
    pub max_staged_bytes: u64,
    /// Most objects cached for one account (0: no limit).
    pub max_objects_per_account: u64,
    /// redb's page cache (`--store-cache-mib`).
    pub store_cache_bytes: usize,
    /// Bytes all the watch histories may hold together (`--watch-history-mib`; 0: only the
    /// per-kind limits).
    pub watch_history_bytes: usize,
    /// Largest body of a REST API request (an operation's manifests).
    pub max_request_bytes: usize,
    /// Empty: only the account patterns of agent tokens and enrolments limit registrations.
    pub allow: Vec<AllowRule>,
    /// How long finished operations stay visible at `GET /api/v1/operations/{id}`.
    pub operation_retention: Duration,
    /// Largest result one operation may return (objects and text of all its parts); a
    /// larger one ends that operation with 413.
    pub max_operation_result_bytes: usize,
    /// Most bytes (JSON) of operation bodies kept for lookups; the oldest finished go first.
    pub max_operation_records_bytes: usize,
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
    /// YAML or JSON list of API tokens (`{name, role, sha256}`), re-read when it changes.
    pub api_tokens_file: Option<PathBuf>,
    /// Serve `/metrics` without a token (for a scraper that cannot send one).
    pub metrics_unauthenticated: bool,
    /// Registration of accounts in Clouddriver (off unless a target is set).
    pub clouddriver: ClouddriverSettings,
    /// Where the CA that issues agents' certificates lives.
    pub agent_ca: AgentCaSource,
    /// Lifetime of the certificates the hub issues to agents.
    pub agent_cert_lifetime: Duration,
    /// Where the TLS material came from, to reload it when it changes.
    pub tls_files: TlsFiles,
    /// How often `tls_files` are checked for changes.
    pub tls_reload_interval: Duration,
    /// This replica's name among the hub's replicas (`--replica-id`; default: the hostname).
    pub replica_id: String,
    /// The base URL other replicas reach this one's HTTP listener at (`--replica-address`);
    /// needed when replicas share the store, to forward requests to an account's owner.
    pub replica_address: Option<String>,
    /// The name other replicas verify this one's serving certificate for
    /// (`--replica-server-name`); `None`: the host of its address.
    pub replica_server_name: Option<String>,
    /// How often replicas sharing a PostgreSQL store read each other's small tables again,
    /// say they are alive and sweep accounts nobody owns (`--replica-sync-period`;
    /// [`crate::shared`]).
    pub replica_sync_period: Duration,
    /// Where account ownership comes from ([`crate::owners`]).
    pub ownership: crate::owners::OwnershipSource,
    /// The secret replicas present to each other's internal routes
    /// (`--replica-secret-file`); needed when replicas share a store.
    pub replica_secret: Option<crate::owners::forward::ReplicaSecret>,
}

impl Config {
    /// Checks the values [`crate::start`] relies on.
    pub fn validate(&self) -> Result<()> {
        for (flag, period) in [
            ("--heartbeat-period", self.heartbeat_period),
            ("--min-heartbeat-period", self.min_heartbeat_period),
            ("--max-heartbeat-period", self.max_heartbeat_period),
        ] {
            if period < Duration::from_secs(1) || period > MAX_HEARTBEAT_PERIOD {
                return Err(HubError::Config(format!(
                    "{flag} must be between 1s and 1h, not {period:?}"
                )));
            }
        }
        if !(self.min_heartbeat_period <= self.heartbeat_period
            && self.heartbeat_period <= self.max_heartbeat_period)
        {
            return Err(HubError::Config(format!(
                "--heartbeat-period ({:?}) must lie within --min-heartbeat-period ({:?}) and \
                 --max-heartbeat-period ({:?})",
                self.heartbeat_period, self.min_heartbeat_period, self.max_heartbeat_period
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
        if self.max_staged_bytes < self.max_object_bytes {
            return Err(HubError::Config(format!(
                "--max-staged-bytes ({}) must be at least --max-object-bytes ({}): a snapshot \
                 holds at least one object",
                self.max_staged_bytes, self.max_object_bytes
            )));
        }
        if self.max_operation_result_bytes < 1024 || self.max_operation_records_bytes < 1024 {
            return Err(HubError::Config(format!(
                "--max-operation-result-bytes ({}) and --max-operation-records-bytes ({}) must \
                 be at least 1024",
                self.max_operation_result_bytes, self.max_operation_records_bytes
            )));
        }
        if self.max_request_bytes < 1024 {
            return Err(HubError::Config(format!(
                "--max-request-bytes ({}) must be at least 1024",
                self.max_request_bytes
            )));
        }
        self.clouddriver.validate()?;
        self.validate_replica()?;
        if let GrpcSecurity::TrustedProxy(proxy) = &self.security {
            proxy.validate()?;
        }
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
    /// command line, the HTTP listener is plaintext: set `http_security` where a test needs
    /// TLS. As on the command line, the admin token file is `<data_dir>/admin-token`.
    pub fn new(security: GrpcSecurity, data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        Config {
            grpc_addr: SocketAddr::from(([0, 0, 0, 0], 9091)),
            http_addr: SocketAddr::from(([0, 0, 0, 0], 8443)),
            security,
            admin_token_file: Some(data_dir.join("admin-token")),
            data_dir,
            store: crate::store::Backend::Embedded,
            grace_period: Duration::from_secs(600),
            heartbeat_period: Duration::from_secs(15),
            min_heartbeat_period: DEFAULT_MIN_HEARTBEAT_PERIOD,
            max_heartbeat_period: DEFAULT_MAX_HEARTBEAT_PERIOD,
            max_unacked: 1000,
            max_object_bytes: 2 * 1024 * 1024,
            max_staged_bytes: DEFAULT_MAX_STAGED_BYTES,
            max_objects_per_account: 0,
            store_cache_bytes: crate::store::DEFAULT_STORE_CACHE_BYTES,
            watch_history_bytes: crate::cache::history::DEFAULT_BUDGET_BYTES,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            allow: Vec::new(),
            operation_retention: Duration::from_secs(15 * 60),
            max_operation_result_bytes: crate::operations::DEFAULT_MAX_RESULT_BYTES,
            max_operation_records_bytes: crate::operations::DEFAULT_MAX_RECORDS_BYTES,
            http_security: HttpSecurity::Plaintext,
            public_url: None,
            serving_ca_pem: None,
            api_tokens_file: None,
            metrics_unauthenticated: false,
            clouddriver: ClouddriverSettings::default(),
            agent_ca: AgentCaSource::DataDir,
            agent_cert_lifetime: DEFAULT_AGENT_CERT_LIFETIME,
            tls_files: TlsFiles::default(),
            tls_reload_interval: TLS_RELOAD_INTERVAL,
            replica_id: crate::owners::hostname(),
            replica_address: None,
            replica_server_name: None,
            replica_sync_period: Duration::from_secs(2),
            ownership: crate::owners::OwnershipSource::Embedded,
            replica_secret: None,
        }
    }
}

impl Config {
    /// Checks `--replica-id` and `--replica-address`.
    fn validate_replica(&self) -> Result<()> {
        let id = &self.replica_id;
        if id.is_empty()
            || id.len() > 253
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(HubError::Config(format!(
                "--replica-id {id:?} must have 1 to 253 letters, digits, '-', '_' or '.' (the \
                 pod's name, which is the default, is)"
            )));
        }
        if let Some(address) = &self.replica_address {
            let uri: Option<http::Uri> = address.parse().ok();
            let valid = uri.as_ref().is_some_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https"))
                    && u.host().is_some_and(|h| !h.is_empty())
                    && u.path_and_query().is_none_or(|p| p.as_str() == "/")
            });
            if !valid {
                return Err(HubError::Config(format!(
                    "--replica-address {address:?} must be the base URL of this replica's HTTP \
                     listener, like https://10.1.2.3:8443 (no path)"
                )));
            }
        }
        if let Some(name) = &self.replica_server_name
            && rustls::pki_types::ServerName::try_from(name.as_str()).is_err()
        {
            return Err(HubError::Config(format!(
                "--replica-server-name {name:?} is not a DNS name or an IP address: give a \
                 name the replicas' serving certificate covers, like scale-agent-hub"
            )));
        }
        if self.replica_sync_period.is_zero() {
            return Err(HubError::Config(
                "--replica-sync-period must be more than 0 (e.g. 2s): it is how often a \
                 replica reads tokens, bindings and dynamic accounts the others wrote"
                    .into(),
            ));
        }
        // One replica on the shared store needs neither; several need both, to forward.
        if self.replica_address.is_some() != self.replica_secret.is_some() {
            return Err(HubError::Config(
                "replicas sharing a store forward requests to an account's owner: they need \
                 both --replica-address (the URL other replicas reach this one's HTTP \
                 listener at, e.g. https://$(POD_IP):8443) and --replica-secret-file (the \
                 secret they present to each other, one Secret mounted on every replica)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The heartbeat period of a stream whose agent asked for `requested_seconds` in Hello:
    /// the request within `--min-heartbeat-period` and `--max-heartbeat-period`, or
    /// `--heartbeat-period` when it asked for none (0, or an agent from before the field).
    pub fn granted_heartbeat_period(&self, requested_seconds: u32) -> Duration {
        match requested_seconds {
            0 => self.heartbeat_period,
            secs => Duration::from_secs(u64::from(secs))
                .clamp(self.min_heartbeat_period, self.max_heartbeat_period),
        }
    }
}

pub use scale_agent_runtime::LogFormat;

/// Default of `--max-staged-bytes`: 512 MiB.
pub const DEFAULT_MAX_STAGED_BYTES: u64 = 512 * 1024 * 1024;
/// Default of `--max-request-bytes`: 8 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;

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

    /// YAML or JSON list of API tokens, `[{name, role, sha256}]` with role reader, operator
    /// or admin and the token's SHA-256 in hex (`scale-agent-hub token hash`); re-read when it
    /// changes (a broken file keeps the previous tokens). A missing file holds no tokens
    /// until it appears.
    #[arg(long, env = "SCALE_AGENT_HUB_API_TOKENS_FILE")]
    pub api_tokens_file: Option<PathBuf>,

    /// Serve /metrics without a bearer token (by default it needs role reader).
    #[arg(long, env = "SCALE_AGENT_HUB_METRICS_UNAUTHENTICATED")]
    pub metrics_unauthenticated: bool,

    /// PEM file with the gRPC server's certificate chain. Required unless
    /// --insecure-plaintext; with --forwarded-client-cert, TLS on the hop from the proxy.
    #[arg(long, env = "SCALE_AGENT_HUB_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM file with the gRPC server's private key. Required unless --insecure-plaintext;
    /// with --forwarded-client-cert, TLS on the hop from the proxy.
    #[arg(long, env = "SCALE_AGENT_HUB_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// PEM file with an external CA whose agent client certificates the hub trusts besides
    /// the ones it issues itself (the operator-signed mode). An explicit opt-in: without it
    /// only certificates the hub issued (by enrolment) are accepted. Behind a
    /// TLS-terminating proxy (--forwarded-client-cert) forwarded certificates are verified
    /// against the same CAs.
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
    /// Seconds, or a duration as the agent's config writes it (1m30s, 1h30m, 250ms).
    #[arg(long, env = "SCALE_AGENT_HUB_AGENT_CERT_LIFETIME", default_value = "720h", value_parser = parse_duration)]
    pub agent_cert_lifetime: Duration,

    /// Serve gRPC without TLS and without authenticating agents (every agent is
    /// "anonymous"). For local experiments only.
    #[arg(long, env = "SCALE_AGENT_HUB_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,

    /// Run behind a gRPC proxy that terminates the agents' mutual TLS and forwards their
    /// client certificate: xfcc (Envoy's x-forwarded-client-cert) or escaped-pem (nginx's
    /// $ssl_client_escaped_cert). The certificate is verified against --client-ca; the
    /// header is honoured only from a --trusted-proxy-cidr or --trusted-proxy-identity.
    /// The gRPC listener is plaintext unless --tls-cert and --tls-key are set.
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_FORWARDED_CLIENT_CERT",
        value_enum,
        conflicts_with = "insecure_plaintext"
    )]
    pub forwarded_client_cert: Option<ForwardedFormat>,

    /// The header the proxy forwards the certificate in. Default: x-forwarded-client-cert
    /// (xfcc) or x-ssl-client-cert (escaped-pem).
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_FORWARDED_CLIENT_CERT_HEADER",
        requires = "forwarded_client_cert"
    )]
    pub forwarded_client_cert_header: Option<String>,

    /// Source address range (10.0.0.0/8, or one address) of a trusted proxy. Repeatable;
    /// comma-separated in the environment variable.
    #[arg(long, env = "SCALE_AGENT_HUB_TRUSTED_PROXY_CIDR", value_delimiter = ',', value_parser = Cidr::parse, requires = "forwarded_client_cert")]
    pub trusted_proxy_cidr: Vec<Cidr>,

    /// Identity (first DNS SAN, else CN; `*` wildcards) of a trusted proxy's client
    /// certificate on a mutual-TLS hop. Repeatable; comma-separated in the environment
    /// variable. Needs --tls-cert, --tls-key and --trusted-proxy-ca.
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_TRUSTED_PROXY_IDENTITY",
        value_delimiter = ',',
        requires = "forwarded_client_cert"
    )]
    pub trusted_proxy_identity: Vec<String>,

    /// PEM file with the CA that signs the proxies' client certificates (for
    /// --trusted-proxy-identity).
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_TRUSTED_PROXY_CA",
        requires = "forwarded_client_cert"
    )]
    pub trusted_proxy_ca: Option<PathBuf>,

    /// Directory of the embedded store (file hub.redb): cached objects, resume points and
    /// account bindings survive restarts.
    #[arg(long, env = "SCALE_AGENT_HUB_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,

    /// Where the hub keeps its state: `embedded` (a redb file in --data-dir; one replica) or
    /// `postgres` (a PostgreSQL database, reached at the URL in --postgres-url-file or in
    /// SCALE_AGENT_HUB_POSTGRES_URL).
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_STORE",
        value_enum,
        default_value = "embedded"
    )]
    pub store: StoreKind,

    /// A file holding the PostgreSQL URL, `postgres://user:password@host:port/database`
    /// (e.g. a key of a mounted Secret), for `--store postgres`. The URL is never taken
    /// from the command line and never logged.
    #[arg(long, env = "SCALE_AGENT_HUB_POSTGRES_URL_FILE")]
    pub postgres_url_file: Option<PathBuf>,

    /// PEM file with the CA that signed PostgreSQL's server certificate, for `--store
    /// postgres` when the URL has no `sslrootcert` (give it in one place only). With it,
    /// `sslmode` prefer and require check the certificate's chain as verify-ca does
    /// (libpq's behaviour); verify-full also checks that it names the URL's host.
    #[arg(long, env = "SCALE_AGENT_HUB_POSTGRES_CA")]
    pub postgres_ca: Option<PathBuf>,

    /// How long an account with no connected agent is kept (cache and resume points
    /// included) before it is removed: seconds, or a duration as the agent's config writes it
    /// (1m30s, 1h30m, 250ms).
    #[arg(long, env = "SCALE_AGENT_HUB_GRACE_PERIOD", default_value = "600s", value_parser = parse_duration)]
    pub grace_period: Duration,

    /// Period of application heartbeats for agents that ask for none (sent in Welcome); a
    /// stream silent for two periods is ended. Seconds, or a duration as the agent's config
    /// writes it (1m30s, 1h30m, 250ms).
    #[arg(long, env = "SCALE_AGENT_HUB_HEARTBEAT_PERIOD", default_value = "15s", value_parser = parse_duration)]
    pub heartbeat_period: Duration,

    /// Shortest heartbeat period granted to an agent that asks for one
    /// (`clouddriver.keepAliveHeartbeatSeconds`, the ScaleAgent's `heartbeat.periodSeconds`):
    /// a shorter request gets this.
    #[arg(long, env = "SCALE_AGENT_HUB_MIN_HEARTBEAT_PERIOD", default_value = "1s", value_parser = parse_duration)]
    pub min_heartbeat_period: Duration,

    /// Longest heartbeat period granted to an agent that asks for one: a longer request gets
    /// this (a dead stream is noticed after two periods).
    #[arg(long, env = "SCALE_AGENT_HUB_MAX_HEARTBEAT_PERIOD", default_value = "300s", value_parser = parse_duration)]
    pub max_heartbeat_period: Duration,

    /// Most messages an agent may send without an acknowledgement.
    #[arg(long, env = "SCALE_AGENT_HUB_MAX_UNACKED", default_value_t = 1000)]
    pub max_unacked: u32,

    /// Largest object payload in bytes; agents send larger objects truncated (metadata
    /// only).
    #[arg(long, env = "SCALE_AGENT_HUB_MAX_OBJECT_BYTES", default_value_t = 2 * 1024 * 1024)]
    pub max_object_bytes: u64,

    /// redb's page cache of the store, in MiB. The hub reads its store only at start-up;
    /// commits read the pages they change from this cache or else from the file (the
    /// kernel's page cache). A larger cache makes commits of very large stores read less
    /// from the file, at the cost of the hub's memory (up to the store's size).
    #[arg(long, env = "SCALE_AGENT_HUB_STORE_CACHE_MIB", default_value_t = crate::store::DEFAULT_STORE_CACHE_BYTES / (1024 * 1024))]
    pub store_cache_mib: usize,

    /// Most MiB of objects the watch histories of all accounts and kinds hold together
    /// (what the Kubernetes API proxy serves watches from; each kind also keeps at most the
    /// last 4096 events or 32 MiB). A history whose event takes the total past it drops its
    /// own oldest events, down to its newest 16: a watch from before them is answered 410
    /// Gone ("too old resource version") and lists again. 0 means no hub-wide limit.
    #[arg(long, env = "SCALE_AGENT_HUB_WATCH_HISTORY_MIB", default_value_t = crate::cache::history::DEFAULT_BUDGET_BYTES / (1024 * 1024))]
    pub watch_history_mib: usize,

    /// Most bytes of objects one agent stream may hold in snapshots it has begun and not
    /// ended (a relist is staged whole before it replaces the cache). A stream past it is
    /// ended with RESOURCE_EXHAUSTED naming the account and kind.
    #[arg(long, env = "SCALE_AGENT_HUB_MAX_STAGED_BYTES", default_value_t = DEFAULT_MAX_STAGED_BYTES)]
    pub max_staged_bytes: u64,

    /// Most objects the hub caches for one account; 0 (the default) means no limit. A kind
    /// whose objects would take an account past it is not cached at all (state OVER_QUOTA
    /// in /api/v1/accounts, sent to the agent; the proxy reads it from the cluster) until a
    /// relist of it fits. The hub keeps about as much memory per cached object as its
    /// JSON takes (bench measure 5).
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_MAX_OBJECTS_PER_ACCOUNT",
        default_value_t = 0
    )]
    pub max_objects_per_account: u64,

    /// Largest body of a REST API request, in bytes (an operation's manifests); larger
    /// requests get 413.
    #[arg(long, env = "SCALE_AGENT_HUB_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,

    /// IDENTITY=PATTERN: the agent identity (from its client certificate or agent token) may
    /// register accounts whose name matches PATTERN. Both sides accept `*` wildcards.
    /// Repeatable; with no rule, only the account patterns of agent tokens and enrolments
    /// apply. Comma-separated in the environment variable.
    #[arg(long, env = "SCALE_AGENT_HUB_ALLOW", value_delimiter = ',', value_parser = AllowRule::parse)]
    pub allow: Vec<AllowRule>,

    /// How long finished operations stay visible at GET /api/v1/operations/{id} (at most
    /// 10000 are kept). Seconds, or a duration as the agent's config writes it (1m30s, 1h30m,
    /// 250ms).
    #[arg(long, env = "SCALE_AGENT_HUB_OPERATION_RETENTION", default_value = "15m", value_parser = parse_duration)]
    pub operation_retention: Duration,

    /// Largest result one operation may return, in bytes (the objects and text of a list,
    /// logs, ...; agents send large results in parts below the gRPC message limit). A larger
    /// result ends that operation with 413, naming this flag; the stream is unaffected.
    #[arg(long, env = "SCALE_AGENT_HUB_MAX_OPERATION_RESULT_BYTES", default_value_t = crate::operations::DEFAULT_MAX_RESULT_BYTES)]
    pub max_operation_result_bytes: usize,

    /// Most bytes of operation bodies (their JSON) kept for GET /api/v1/operations/{id};
    /// the oldest finished ones go first. One body keeps at most an eighth of it; a larger
    /// one is kept without its objects and text.
    #[arg(long, env = "SCALE_AGENT_HUB_MAX_OPERATION_RECORDS_BYTES", default_value_t = crate::operations::DEFAULT_MAX_RECORDS_BYTES)]
    pub max_operation_records_bytes: usize,

    /// This replica's name among the hub's replicas: in the ownership table, in logs and in
    /// the x-scale-agent-replica header of proxied answers. Unique per replica. Default:
    /// the hostname (the pod's name in Kubernetes).
    #[arg(long, env = "SCALE_AGENT_HUB_REPLICA_ID")]
    pub replica_id: Option<String>,

    /// The base URL other replicas reach this replica's HTTP listener at, e.g.
    /// https://10.1.2.3:8443 from the pod's IP (its serving certificate must cover that
    /// name). Needed when replicas share a store: requests for an account owned by another
    /// replica are forwarded there.
    #[arg(long, env = "SCALE_AGENT_HUB_REPLICA_ADDRESS")]
    pub replica_address: Option<String>,

    /// The name a replica verifies the other replicas' serving certificates for when it
    /// forwards a request to them, instead of the host of their --replica-address: a pod IP
    /// is rarely in a certificate, the Service's name (e.g. scale-agent-hub) usually is.
    /// The same on every replica.
    #[arg(long, env = "SCALE_AGENT_HUB_REPLICA_SERVER_NAME")]
    pub replica_server_name: Option<String>,

    /// With replicas sharing a PostgreSQL store: how often each replica reads the tokens,
    /// agent tokens and enrolments, account bindings and dynamic accounts again (a credential
    /// it does not know is looked up in the store at once; a revocation elsewhere takes
    /// effect here within this period), says it is alive, and sweeps the accounts no
    /// replica owns past the grace period. Seconds, or a number with ms, s, m or h.
    #[arg(long, env = "SCALE_AGENT_HUB_REPLICA_SYNC_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub replica_sync_period: Duration,

    /// File with the secret the hub's replicas present to each other when one forwards a
    /// request to the owner of its account (one word of at least 32 characters, e.g. from
    /// `openssl rand -hex 32`, mounted from a Secret). Needed when replicas share a store.
    #[arg(long, env = "SCALE_AGENT_HUB_REPLICA_SECRET_FILE")]
    pub replica_secret_file: Option<PathBuf>,

    /// Log format.
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

/// `--store`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    Embedded,
    Postgres,
}

/// The environment variable that may hold the PostgreSQL URL instead of
/// `--postgres-url-file`.
pub const POSTGRES_URL_ENV: &str = "SCALE_AGENT_HUB_POSTGRES_URL";

impl Args {
    /// The store the flags choose; `url_env` is the value of [`POSTGRES_URL_ENV`].
    fn store_backend(&self, url_env: Option<String>) -> Result<crate::store::Backend> {
        use crate::store::{Backend, PostgresOptions};
        let url = match (&self.postgres_url_file, url_env) {
            (Some(path), _) => Some(
                std::fs::read_to_string(path)
                    .map_err(|source| HubError::ReadFile {
                        path: path.clone(),
                        source,
                    })?
                    .trim()
                    .to_string(),
            ),
            (None, env) => env.map(|url| url.trim().to_string()),
        };
        match (self.store, url) {
            (StoreKind::Embedded, None) if self.postgres_ca.is_some() => Err(HubError::Config(
                "--postgres-ca is for --store postgres: add --store postgres, or remove it".into(),
            )),
            (StoreKind::Embedded, None) => Ok(Backend::Embedded),
            (StoreKind::Embedded, Some(_)) => Err(HubError::Config(format!(
                "a PostgreSQL URL is set (--postgres-url-file or {POSTGRES_URL_ENV}) but the \
                 store is embedded: add --store postgres, or unset it"
            ))),
            (StoreKind::Postgres, Some(url)) if !url.is_empty() => {
                Ok(Backend::Postgres(PostgresOptions {
                    url,
                    ca_file: self.postgres_ca.clone(),
                }))
            }
            (StoreKind::Postgres, _) => Err(HubError::Config(format!(
                "--store postgres needs the database's URL: put \
                 postgres://user:password@host:port/database in a file named by \
                 --postgres-url-file, or in {POSTGRES_URL_ENV}"
            ))),
        }
    }

    /// Reads the files the flags name and builds the [`Config`].
    pub fn into_config(self) -> Result<Config> {
        let store = self.store_backend(std::env::var(POSTGRES_URL_ENV).ok())?;
        // Replicas sharing the PostgreSQL store own accounts through its advisory locks.
        let ownership = match &store {
            crate::store::Backend::Postgres(options) => crate::owners::OwnershipSource::Postgres {
                options: options.clone(),
            },
            crate::store::Backend::Embedded => crate::owners::OwnershipSource::Embedded,
        };
        let security = if self.insecure_plaintext {
            GrpcSecurity::InsecurePlaintext
        } else if let Some(format) = self.forwarded_client_cert {
            GrpcSecurity::TrustedProxy(self.proxy_mode(format)?)
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
                    cert_pem: read_certs("--tls-cert", cert)?,
                    key_pem: read_key("--tls-key", key)?,
                    client_ca_pem: self
                        .client_ca
                        .as_ref()
                        .map(|ca| read_certs("--client-ca", ca))
                        .transpose()?,
                }),
                _ => {
                    return Err(HubError::Config(format!(
                        "mutual TLS needs {} (or pass --insecure-plaintext to serve without TLS)",
                        missing.join(", ")
                    )));
                }
            }
        };
        let mut tls_files = TlsFiles::default();
        if let (GrpcSecurity::MutualTls(_), Some(cert), Some(key)) =
            (&security, &self.tls_cert, &self.tls_key)
        {
            tls_files.grpc = Some((cert.clone(), key.clone()));
            tls_files.client_ca = self.client_ca.clone();
        }
        let http_security = if self.http_plaintext {
            HttpSecurity::Plaintext
        } else {
            let cert = (self.http_tls_cert.as_ref().map(|c| ("--http-tls-cert", c)))
                .or(self.tls_cert.as_ref().map(|c| ("--tls-cert", c)));
            let key = (self.http_tls_key.as_ref().map(|k| ("--http-tls-key", k)))
                .or(self.tls_key.as_ref().map(|k| ("--tls-key", k)));
            match (cert, key) {
                (Some((cert_flag, cert)), Some((key_flag, key))) => {
                    tls_files.http = Some((cert.clone(), key.clone()));
                    HttpSecurity::Tls {
                        cert_pem: read_certs(cert_flag, cert)?,
                        key_pem: read_key(key_flag, key)?,
                    }
                }
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
        let serving_ca_pem = self
            .serving_ca
            .as_ref()
            .map(|ca| read_certs("--serving-ca", ca))
            .transpose()?;
        // The agent CA is loaded after the store is opened; check its files now so a wrong
        // path fails before anything else.
        if let (Some(cert), Some(key)) = (&self.agent_ca_cert, &self.agent_ca_key) {
            read_certs("--agent-ca-cert", cert)?;
            read_key("--agent-ca-key", key)?;
        }
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
            store,
            grace_period: self.grace_period,
            heartbeat_period: self.heartbeat_period,
            min_heartbeat_period: self.min_heartbeat_period,
            max_heartbeat_period: self.max_heartbeat_period,
            max_unacked: self.max_unacked,
            max_object_bytes: self.max_object_bytes,
            max_staged_bytes: self.max_staged_bytes,
            max_objects_per_account: self.max_objects_per_account,
            store_cache_bytes: self.store_cache_mib.saturating_mul(1024 * 1024),
            watch_history_bytes: self.watch_history_mib.saturating_mul(1024 * 1024),
            max_request_bytes: self.max_request_bytes,
            allow: self.allow,
            operation_retention: self.operation_retention,
            max_operation_result_bytes: self.max_operation_result_bytes,
            max_operation_records_bytes: self.max_operation_records_bytes,
            http_security,
            public_url: self.public_url,
            serving_ca_pem,
            admin_token_file,
            api_tokens_file: self.api_tokens_file,
            metrics_unauthenticated: self.metrics_unauthenticated,
            clouddriver,
            agent_ca: match (self.agent_ca_cert, self.agent_ca_key) {
                (Some(cert), Some(key)) => AgentCaSource::Files { cert, key },
                _ => AgentCaSource::DataDir,
            },
            agent_cert_lifetime: self.agent_cert_lifetime,
            tls_files,
            tls_reload_interval: TLS_RELOAD_INTERVAL,
            replica_id: self.replica_id.unwrap_or_else(crate::owners::hostname),
            replica_address: self.replica_address,
            replica_server_name: self.replica_server_name,
            replica_sync_period: self.replica_sync_period,
            // Replicas sharing the PostgreSQL store own accounts through its advisory locks.
            ownership,
            replica_secret: self
                .replica_secret_file
                .as_deref()
                .map(crate::owners::forward::ReplicaSecret::read)
                .transpose()?,
        };
        config.validate()?;
        Ok(config)
    }
}

impl Args {
    /// The proxy mode the flags describe (validated by [`Config::validate`]).
    fn proxy_mode(&self, format: ForwardedFormat) -> Result<ProxyMode> {
        let Some(client_ca) = &self.client_ca else {
            return Err(HubError::Config(
                "--forwarded-client-cert needs --client-ca: the hub verifies every forwarded \
                 certificate against the CA that signs agents' certificates"
                    .into(),
            ));
        };
        let client_ca_pem = read_certs("--client-ca", client_ca)?;
        let trust = ProxyTrust::new(
            format,
            self.forwarded_client_cert_header.as_deref(),
            &client_ca_pem,
            self.trusted_proxy_cidr.clone(),
            self.trusted_proxy_identity.clone(),
        )
        .map_err(HubError::Config)?;
        let hop_tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(ProxyHopTls {
                cert_pem: read_certs("--tls-cert", cert)?,
                key_pem: read_key("--tls-key", key)?,
                proxy_ca_pem: self
                    .trusted_proxy_ca
                    .as_ref()
                    .map(|ca| read_certs("--trusted-proxy-ca", ca))
                    .transpose()?,
            }),
            (None, None) if self.trusted_proxy_ca.is_none() => None,
            _ => {
                return Err(HubError::Config(
                    "TLS between the proxy and the hub needs both --tls-cert and --tls-key \
                     (--trusted-proxy-ca needs them too); set both, or neither for a \
                     plaintext hop"
                        .into(),
                ));
            }
        };
        Ok(ProxyMode {
            trust,
            client_ca_pem,
            hop_tls,
        })
    }
}

/// Reads the PEM file `flag` names and checks it holds at least one certificate, so a wrong
/// file fails here, naming the flag, rather than later in rustls with "no root trust anchors".
fn read_certs(flag: &'static str, path: &Path) -> Result<Vec<u8>> {
    let pem = read_tls_file(flag, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| tls_file_error(flag, path, format!("not valid PEM ({e})")))?;
    if certs.is_empty() {
        return Err(tls_file_error(
            flag,
            path,
            format!(
                "no certificate in the file: point {flag} at a PEM file with a \"BEGIN CERTIFICATE\" block"
            ),
        ));
    }
    Ok(pem)
}

/// Reads the PEM file `flag` names and checks it holds a private key.
fn read_key(flag: &'static str, path: &Path) -> Result<Vec<u8>> {
    let pem = read_tls_file(flag, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        tls_file_error(
            flag,
            path,
            format!("no private key in the file ({e}): point {flag} at the PEM private key"),
        )
    })?;
    Ok(pem)
}

fn read_tls_file(flag: &'static str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| tls_file_error(flag, path, format!("cannot be read: {e}")))
}

fn tls_file_error(flag: &'static str, path: &Path, problem: String) -> HubError {
    HubError::TlsFile {
        flag,
        path: path.to_path_buf(),
        problem,
    }
}

pub use scale_agent_hub_model::time::parse_duration;

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
        // As the agent's config file (Go's form) writes them.
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        let refused = parse_duration("ten").unwrap_err();
        assert!(
            refused.contains("\"ten\" is not a duration") && refused.contains("1h30m"),
            "{refused}"
        );
        let negative = parse_duration("-5s").unwrap_err();
        assert!(negative.contains("cannot be negative"), "{negative}");
    }

    #[test]
    fn store_flags() {
        use crate::store::Backend;
        let args = Args::try_parse_from(["scale-agent-hub"]).unwrap();
        assert!(matches!(
            args.store_backend(None).unwrap(),
            Backend::Embedded
        ));
        let err = args
            .store_backend(Some("postgres://u:p@h/d".into()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--store postgres"), "{err}");

        let args = Args::try_parse_from(["scale-agent-hub", "--store", "postgres"]).unwrap();
        let err = args.store_backend(None).unwrap_err().to_string();
        assert!(err.contains("--postgres-url-file"), "{err}");
        let Backend::Postgres(options) = args
            .store_backend(Some(" postgres://u:p@h/d\n".into()))
            .unwrap()
        else {
            panic!("not postgres");
        };
        assert_eq!(options.url, "postgres://u:p@h/d");

        // The file wins over the environment, trimmed like a Secret's key with a newline.
        let file = std::env::temp_dir().join(format!("hub-pg-url-{}", std::process::id()));
        std::fs::write(&file, "postgres://f:s3cret@db:5433/hub\n").unwrap();
        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--store",
            "postgres",
            "--postgres-url-file",
            file.to_str().unwrap(),
        ])
        .unwrap();
        let backend = args.store_backend(Some("postgres://env/x".into())).unwrap();
        std::fs::remove_file(&file).unwrap();
        let Backend::Postgres(options) = &backend else {
            panic!("not postgres");
        };
        assert_eq!(options.url, "postgres://f:s3cret@db:5433/hub");
        assert!(!format!("{backend:?}").contains("s3cret"));
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
        assert_eq!(args.store_cache_mib, 2);
        assert_eq!(args.watch_history_mib, 256);
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
        assert!(err.contains("--heartbeat-period"), "{err}");
    }

    /// An agent's requested heartbeat period is granted within the hub's bounds; no request
    /// gets the hub's period; bounds that exclude the default period are refused.
    #[test]
    fn heartbeat_requests_are_clamped_to_the_bounds() {
        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--insecure-plaintext",
            "--http-plaintext",
            "--heartbeat-period=10s",
            "--min-heartbeat-period=5s",
            "--max-heartbeat-period=60s",
        ])
        .unwrap();
        let config = args.into_config().unwrap();
        let secs = Duration::from_secs;
        assert_eq!(config.granted_heartbeat_period(0), secs(10));
        assert_eq!(config.granted_heartbeat_period(1), secs(5));
        assert_eq!(config.granted_heartbeat_period(20), secs(20));
        assert_eq!(config.granted_heartbeat_period(3600), secs(60));
        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--insecure-plaintext",
            "--http-plaintext",
            "--heartbeat-period=15s",
            "--max-heartbeat-period=10s",
        ])
        .unwrap();
        let err = args.into_config().unwrap_err().to_string();
        assert!(err.contains("--max-heartbeat-period"), "{err}");
        let defaults = Args::try_parse_from(["scale-agent-hub"]).unwrap();
        assert_eq!(defaults.min_heartbeat_period, DEFAULT_MIN_HEARTBEAT_PERIOD);
        assert_eq!(defaults.max_heartbeat_period, DEFAULT_MAX_HEARTBEAT_PERIOD);
    }

    /// Every TLS file flag is checked when the flags are read, before the store is opened,
    /// and a file without what it should hold is refused naming the flag and the file.
    #[test]
    fn tls_files_without_a_certificate_or_key_are_refused_naming_flag_and_file() {
        let dir =
            std::env::temp_dir().join(format!("scale-agent-hub-tlsfiles-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["hub.test".to_string()]).unwrap();
        let cert = dir.join("tls.crt");
        std::fs::write(&cert, params.self_signed(&key).unwrap().pem()).unwrap();
        let key_file = dir.join("tls.key");
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let (cert, key_file, empty) = (
            cert.display().to_string(),
            key_file.display().to_string(),
            empty.display().to_string(),
        );
        let parse = |extra: &[&str]| {
            let mut argv = vec!["scale-agent-hub"];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv).unwrap().into_config()
        };
        let good = ["--tls-cert", cert.as_str(), "--tls-key", key_file.as_str()];
        assert!(parse(&good).is_ok());
        let cases: [(&[&str], &str, &str, &str); 5] = [
            (
                &["--client-ca", &empty],
                "--client-ca",
                &empty,
                "no certificate",
            ),
            (
                &["--agent-ca-cert", &empty, "--agent-ca-key", &key_file],
                "--agent-ca-cert",
                &empty,
                "no certificate",
            ),
            (
                &["--agent-ca-cert", &cert, "--agent-ca-key", &cert],
                "--agent-ca-key",
                &cert,
                "no private key",
            ),
            (
                &["--http-tls-key", &empty],
                "--http-tls-key",
                &empty,
                "no private key",
            ),
            (
                &["--client-ca", "/nonexistent/ca.pem"],
                "--client-ca",
                "/nonexistent/ca.pem",
                "cannot be read",
            ),
        ];
        for (extra, flag, file, problem) in cases {
            let mut argv = good.to_vec();
            argv.extend_from_slice(extra);
            let err = parse(&argv).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("{flag} {file}: {problem}")),
                "{err}"
            );
        }
        let err = parse(&["--tls-cert", &empty, "--tls-key", &key_file])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("--tls-cert {empty}: no certificate")),
            "{err}"
        );
        assert!(err.contains("point --tls-cert at a PEM file"), "{err}");
        let err = parse(&["--tls-cert", &cert, "--tls-key", &empty])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("point --tls-key at the PEM private key"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn proxy_mode_flags() {
        let dir =
            std::env::temp_dir().join(format!("scale-agent-hub-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        std::fs::write(&ca, params.self_signed(&key).unwrap().pem()).unwrap();
        let ca = ca.display().to_string();
        let key_path = dir.join("ca.key");
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        let key_path = key_path.display().to_string();
        let parse = |extra: &[&str]| {
            let mut argv = vec![
                "scale-agent-hub",
                "--http-plaintext",
                "--forwarded-client-cert",
            ];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv).unwrap().into_config()
        };

        let err = parse(&["escaped-pem", "--trusted-proxy-cidr", "10.0.0.0/8"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs --client-ca"), "{err}");
        let err = parse(&["escaped-pem", "--client-ca", &ca])
            .unwrap_err()
            .to_string();
        assert!(err.contains("set --trusted-proxy-cidr"), "{err}");
        let err = parse(&[
            "xfcc",
            "--client-ca",
            &ca,
            "--trusted-proxy-identity",
            "envoy.spinnaker",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("--trusted-proxy-ca"), "{err}");
        let err = parse(&[
            "xfcc",
            "--client-ca",
            &ca,
            "--trusted-proxy-cidr",
            "10.0.0.0/8",
            "--tls-cert",
            &ca,
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("both --tls-cert and --tls-key"), "{err}");

        let config = parse(&[
            "escaped-pem",
            "--client-ca",
            &ca,
            "--trusted-proxy-cidr",
            "10.0.0.0/8,127.0.0.2",
        ])
        .unwrap();
        let GrpcSecurity::TrustedProxy(proxy) = &config.security else {
            panic!("not proxy mode: {:?}", config.security);
        };
        assert!(proxy.hop_tls.is_none());
        assert_eq!(proxy.trust.header(), "x-ssl-client-cert");

        let config = parse(&[
            "xfcc",
            "--client-ca",
            &ca,
            "--trusted-proxy-identity",
            "envoy.spinnaker",
            "--tls-cert",
            &ca,
            "--tls-key",
            &key_path,
            "--trusted-proxy-ca",
            &ca,
        ])
        .unwrap();
        let GrpcSecurity::TrustedProxy(proxy) = &config.security else {
            panic!("not proxy mode: {:?}", config.security);
        };
        assert!(proxy.hop_tls.as_ref().unwrap().proxy_ca_pem.is_some());
        assert!(proxy.trust.trusts_only_identities());

        let err = Args::try_parse_from([
            "scale-agent-hub",
            "--insecure-plaintext",
            "--forwarded-client-cert",
            "xfcc",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("cannot be used with"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
