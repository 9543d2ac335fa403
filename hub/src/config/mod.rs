//! The hub's configuration: [`Config`] (what [`crate::start`] needs, with its checks) and the
//! command line that builds it: [`Args`] (`args.rs`, every flag with an environment fallback,
//! in groups such as [`ListenerArgs`] and [`StoreArgs`]), turned into a [`Config`] of the
//! same groups ([`ListenerConfig`], [`StoreConfig`], ...) one group at a time by
//! `from_args.rs`, which reads the PEM files the TLS flags name with `tls_files.rs`.

mod args;
mod from_args;
mod tls_files;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use crate::{
    agent_ca::AgentCaSource,
    clouddriver::ClouddriverSettings,
    error::{HubError, Result},
    identity::AllowRule,
};
pub use args::{
    AgentArgs, ApiArgs, Args, ClouddriverArgs, ListenerArgs, LogArgs, OperationArgs,
    POSTGRES_URL_ENV, ReplicaArgs, StoreArgs, StoreKind, StreamArgs,
};
pub use scale_agent_hub_auth::grpc_security::{GrpcSecurity, ProxyMode};
pub use scale_agent_hub_net::{
    limits::ListenerLimits,
    tls::{HttpSecurity, ProxyHopTls, TlsFiles, TlsMaterial},
};

/// How often the TLS files are checked for changes by default (a Secret's mounted files
/// change within about a minute of the Secret itself).
pub const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// Default lifetime of the certificates the hub issues to agents.
pub const DEFAULT_AGENT_CERT_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);
/// Default `--agent-max-enrolment-age`: 366 days (an agent enrols again once a year).
pub const DEFAULT_AGENT_MAX_ENROLMENT_AGE: Duration = Duration::from_secs(366 * 24 * 3600);

/// Default of `--min-heartbeat-period`.
pub const DEFAULT_MIN_HEARTBEAT_PERIOD: Duration = Duration::from_secs(1);
/// Default of `--max-heartbeat-period` (the ScaleAgent's `heartbeat.periodSeconds` goes up
/// to 300).
pub const DEFAULT_MAX_HEARTBEAT_PERIOD: Duration = Duration::from_secs(300);

/// Longest heartbeat period accepted.
pub const MAX_HEARTBEAT_PERIOD: Duration = Duration::from_secs(3600);

/// Everything [`crate::start`] needs, in one group per part of the hub, as the flags are
/// grouped ([`Args`]): each part reads its own group.
#[derive(Clone, Debug)]
pub struct Config {
    /// The two listeners' addresses and TLS files (`ListenerArgs`).
    pub listeners: ListenerConfig,
    /// How agents are authenticated and which accounts they may register (`AgentArgs`).
    pub agents: AgentConfig,
    /// The REST API's URL, tokens and limits (`ApiArgs`).
    pub api: ApiConfig,
    /// Registration of accounts in Clouddriver (off unless a target is set).
    pub clouddriver: ClouddriverSettings,
    /// Where the hub keeps its state (`StoreArgs`).
    pub store: StoreConfig,
    /// This replica among the hub's replicas (`ReplicaArgs`).
    pub replicas: ReplicaConfig,
    /// Agents' streams: heartbeats, flow control, limits (`StreamArgs`).
    pub streams: StreamConfig,
    /// Operations' retention and sizes (`OperationArgs`).
    pub operations: OperationConfig,
}

/// The gRPC and HTTP listeners.
#[derive(Clone, Debug)]
pub struct ListenerConfig {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub http_security: HttpSecurity,
    /// Where the TLS material came from, to reload it when it changes.
    pub tls_files: TlsFiles,
    /// How often `tls_files` are checked for changes.
    pub tls_reload_interval: Duration,
    /// The gRPC listener's connection cap and header-read timeout.
    pub grpc_limits: ListenerLimits,
    /// The HTTP listener's connection cap and header-read timeout.
    pub http_limits: ListenerLimits,
}

/// How agents are authenticated, what they may register, and the certificates the hub
/// issues them.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// How the gRPC listener authenticates agents.
    pub security: GrpcSecurity,
    /// Empty: only the account patterns of agent tokens and enrolments limit registrations.
    pub allow: Vec<AllowRule>,
    /// Where the CA that issues agents' certificates lives.
    pub agent_ca: AgentCaSource,
    /// Lifetime of the certificates the hub issues to agents.
    pub agent_cert_lifetime: Duration,
    /// How long renewals may extend one enrolment (`--agent-max-enrolment-age`).
    pub agent_max_enrolment_age: Duration,
}

/// The REST API and the kubeconfigs it hands out.
#[derive(Clone, Debug)]
pub struct ApiConfig {
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
    /// `--authentication-config`: the OIDC issuers whose ID tokens the hub accepts.
    pub authentication_config: Option<PathBuf>,
    /// `--oidc-access`: the accounts and API role of people signed in with OIDC.
    pub oidc_access: Option<PathBuf>,
    /// Default lifetime of the tokens the hub issues for people; zero: no expiry.
    pub token_ttl: std::time::Duration,
    /// How long an expired token stays in the store (and `token list`) before the
    /// maintenance tick drops it ([`DEFAULT_EXPIRED_TOKEN_RETENTION`]; not a flag, tests
    /// shorten it).
    pub expired_token_retention: std::time::Duration,
    /// Serve `/metrics` without a token (for a scraper that cannot send one).
    pub metrics_unauthenticated: bool,
    /// Largest body of a REST API request (an operation's manifests).
    pub max_request_bytes: usize,
    /// Which proxied reads get an audit line (`--proxy-audit-reads`).
    pub proxy_audit_reads: crate::proxy::audit::AuditReads,
    /// The Clouddriver tokens' derivation key from `--token-key-file`; `None`: kept in the
    /// store.
    pub token_key: Option<crate::token_key::TokenKeyFile>,
}

/// Where the hub keeps its state.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// The embedded store or PostgreSQL (`--store`).
    pub backend: crate::store::Backend,
    /// Holds `hub.redb` (the embedded store), the admin token and the agent CA.
    pub data_dir: PathBuf,
    /// redb's page cache (`--store-cache-mib`).
    pub cache_bytes: usize,
}

/// This replica among the replicas sharing a PostgreSQL store.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// This replica's name among the hub's replicas (`--replica-id`; default: the hostname).
    pub id: String,
    /// The base URL other replicas reach this one's HTTP listener at (`--replica-address`);
    /// needed when replicas share the store, to forward requests to an account's owner.
    pub address: Option<String>,
    /// The name other replicas verify this one's serving certificate for
    /// (`--replica-server-name`); `None`: the host of its address.
    pub server_name: Option<String>,
    /// How often replicas sharing a PostgreSQL store read each other's small tables again,
    /// say they are alive and sweep accounts nobody owns (`--replica-sync-period`;
    /// [`crate::shared`]).
    pub sync_period: Duration,
    /// Where account ownership comes from ([`crate::owners`]); follows the store.
    pub ownership: crate::owners::OwnershipSource,
    /// The secret replicas present to each other's internal routes
    /// (`--replica-secret-file`); needed when replicas share a store.
    pub secret: Option<crate::owners::forward::ReplicaSecret>,
    /// How long the previous replica secret stays accepted (and offered) after this
    /// replica reads a new one from `--replica-secret-file` (no flag:
    /// [`crate::owners::secret::ROTATION_OVERLAP`]; the file is read every
    /// `tls_reload_interval`).
    pub secret_overlap: Duration,
    /// The only hosts (IP ranges) this replica forwards to (`--replica-peer-cidrs`); empty:
    /// any host of its own scheme.
    pub peer_cidrs: Vec<crate::forwarded::Cidr>,
}

/// Agents' streams: heartbeats, flow control and the limits of what one stream may send.
#[derive(Clone, Debug)]
pub struct StreamConfig {
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
    /// Most bytes of objects the streams of one agent identity may hold together in
    /// snapshots not yet ended.
    pub max_staged_bytes: u64,
    /// Most objects cached for one account (0: no limit).
    pub max_objects_per_account: u64,
    /// Most accounts bound to one agent identity (`--max-accounts-per-identity`; 0: no
    /// limit).
    pub max_accounts_per_identity: u64,
    /// Most streams one agent identity may have open at once (`--max-streams-per-identity`;
    /// 0: no limit).
    pub max_streams_per_identity: u64,
    /// Bytes all the watch histories may hold together (`--watch-history-mib`; 0: only the
    /// per-kind limits).
    pub watch_history_bytes: usize,
    /// Bytes of discovery documents the proxy keeps for all accounts
    /// (`--discovery-cache-mib`; 0: only the per-account limit).
    pub discovery_cache_bytes: usize,
    /// Bytes the cache may hold for objects, all accounts together (`--max-cached-mib`;
    /// 0: no limit).
    pub max_cached_bytes: u64,
}

/// How long operations are kept and how large they may be.
#[derive(Clone, Debug)]
pub struct OperationConfig {
    /// How long finished operations stay visible at `GET /api/v1/operations/{id}`.
    pub retention: Duration,
    /// Largest result one operation may return (objects and text of all its parts); a
    /// larger one ends that operation with 413.
    pub max_result_bytes: usize,
    /// Most bytes (JSON) of operation bodies kept for lookups; the oldest finished go first.
    pub max_records_bytes: usize,
}

impl Config {
    /// Checks the values [`crate::start`] relies on, one group at a time.
    pub fn validate(&self) -> Result<()> {
        self.streams.validate()?;
        self.agents.validate()?;
        self.api.validate()?;
        self.operations.validate()?;
        self.clouddriver.validate()?;
        self.replicas.validate()?;
        if self.clouddriver.enabled() && self.api.public_url.is_none() {
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
    /// command line, the HTTP listener is plaintext: set `listeners.http_security` where a
    /// test needs TLS. As on the command line, the admin token file is
    /// `<data_dir>/admin-token`.
    pub fn new(security: GrpcSecurity, data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        Config {
            listeners: ListenerConfig {
                grpc_addr: SocketAddr::from(([0, 0, 0, 0], 9091)),
                http_addr: SocketAddr::from(([0, 0, 0, 0], 8443)),
                http_security: HttpSecurity::Plaintext,
                tls_files: TlsFiles::default(),
                tls_reload_interval: TLS_RELOAD_INTERVAL,
                grpc_limits: ListenerLimits::grpc_default(),
                http_limits: ListenerLimits::http_default(),
            },
            agents: AgentConfig {
                security,
                allow: Vec::new(),
                agent_ca: AgentCaSource::DataDir,
                agent_cert_lifetime: DEFAULT_AGENT_CERT_LIFETIME,
                agent_max_enrolment_age: DEFAULT_AGENT_MAX_ENROLMENT_AGE,
            },
            api: ApiConfig {
                public_url: None,
                serving_ca_pem: None,
                admin_token_file: Some(data_dir.join("admin-token")),
                api_tokens_file: None,
                authentication_config: None,
                oidc_access: None,
                token_ttl: DEFAULT_TOKEN_TTL,
                expired_token_retention: DEFAULT_EXPIRED_TOKEN_RETENTION,
                metrics_unauthenticated: false,
                max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
                proxy_audit_reads: Default::default(),
                token_key: None,
            },
            clouddriver: ClouddriverSettings::default(),
            store: StoreConfig {
                backend: crate::store::Backend::Embedded,
                data_dir,
                cache_bytes: crate::store::DEFAULT_STORE_CACHE_BYTES,
            },
            replicas: ReplicaConfig {
                id: crate::owners::hostname(),
                address: None,
                server_name: None,
                sync_period: Duration::from_secs(2),
                ownership: crate::owners::OwnershipSource::Embedded,
                secret: None,
                secret_overlap: crate::owners::secret::ROTATION_OVERLAP,
                peer_cidrs: Vec::new(),
            },
            streams: StreamConfig {
                grace_period: Duration::from_secs(600),
                heartbeat_period: Duration::from_secs(15),
                min_heartbeat_period: DEFAULT_MIN_HEARTBEAT_PERIOD,
                max_heartbeat_period: DEFAULT_MAX_HEARTBEAT_PERIOD,
                max_unacked: 1000,
                max_object_bytes: 2 * 1024 * 1024,
                max_staged_bytes: DEFAULT_MAX_STAGED_BYTES,
                max_objects_per_account: DEFAULT_MAX_OBJECTS_PER_ACCOUNT,
                max_accounts_per_identity: DEFAULT_MAX_ACCOUNTS_PER_IDENTITY,
                max_streams_per_identity: DEFAULT_MAX_STREAMS_PER_IDENTITY,
                watch_history_bytes: crate::cache::history::DEFAULT_BUDGET_BYTES,
                discovery_cache_bytes: crate::proxy::discovery::DEFAULT_TOTAL_BYTES,
                max_cached_bytes: DEFAULT_MAX_CACHED_MIB * 1024 * 1024,
            },
            operations: OperationConfig {
                retention: Duration::from_secs(15 * 60),
                max_result_bytes: crate::operations::DEFAULT_MAX_RESULT_BYTES,
                max_records_bytes: crate::operations::DEFAULT_MAX_RECORDS_BYTES,
            },
        }
    }
}

impl StreamConfig {
    /// Checks the heartbeat bounds and the limits.
    fn validate(&self) -> Result<()> {
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
        Ok(())
    }

    /// The heartbeat period of a stream whose agent asked for `requested_seconds` in Hello:
    /// the request within `--min-heartbeat-period` and `--max-heartbeat-period`, or
    /// `--heartbeat-period` when it asked for none (0, or an agent from before the field).
    pub fn granted_heartbeat_period(&self, requested_seconds: u32) -> Duration {
        self.heartbeat_bounds().grant(requested_seconds)
    }

    /// The bounds the gRPC service grants heartbeat periods within.
    pub fn heartbeat_bounds(&self) -> crate::service::HeartbeatBounds {
        crate::service::HeartbeatBounds {
            default: self.heartbeat_period,
            min: self.min_heartbeat_period,
            max: self.max_heartbeat_period,
        }
    }
}

impl AgentConfig {
    /// Checks the certificates' lifetime and the trusted proxy's settings.
    fn validate(&self) -> Result<()> {
        if self.agent_cert_lifetime < Duration::from_secs(10) {
            return Err(HubError::Config(format!(
                "--agent-cert-lifetime must be at least 10s, not {:?}",
                self.agent_cert_lifetime
            )));
        }
        if self.agent_max_enrolment_age < self.agent_cert_lifetime {
            return Err(HubError::Config(format!(
                "--agent-max-enrolment-age ({:?}) must be at least --agent-cert-lifetime \
                 ({:?}): renewals would cut every certificate short",
                self.agent_max_enrolment_age, self.agent_cert_lifetime
            )));
        }
        if let GrpcSecurity::TrustedProxy(proxy) = &self.security {
            proxy.validate()?;
        }
        Ok(())
    }
}

impl ApiConfig {
    /// Checks the request limit.
    fn validate(&self) -> Result<()> {
        if self.max_request_bytes < 1024 {
            return Err(HubError::Config(format!(
                "--max-request-bytes ({}) must be at least 1024",
                self.max_request_bytes
            )));
        }
        Ok(())
    }
}

impl OperationConfig {
    /// Checks the size limits.
    fn validate(&self) -> Result<()> {
        if self.max_result_bytes < 1024 || self.max_records_bytes < 1024 {
            return Err(HubError::Config(format!(
                "--max-operation-result-bytes ({}) and --max-operation-records-bytes ({}) must \
                 be at least 1024",
                self.max_result_bytes, self.max_records_bytes
            )));
        }
        Ok(())
    }
}

impl ReplicaConfig {
    /// Checks `--replica-id`, `--replica-address` and what goes with them.
    fn validate(&self) -> Result<()> {
        let id = &self.id;
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
        if let Some(address) = &self.address {
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
        if let Some(name) = &self.server_name
            && rustls::pki_types::ServerName::try_from(name.as_str()).is_err()
        {
            return Err(HubError::Config(format!(
                "--replica-server-name {name:?} is not a DNS name or an IP address: give a \
                 name the replicas' serving certificate covers, like scale-agent-hub"
            )));
        }
        if self.sync_period.is_zero() {
            return Err(HubError::Config(
                "--replica-sync-period must be more than 0 (e.g. 2s): it is how often a \
                 replica reads tokens, bindings and dynamic accounts the others wrote"
                    .into(),
            ));
        }
        // One replica on the shared store needs neither; several need both, to forward.
        if self.address.is_some() != self.secret.is_some() {
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
}

pub use scale_agent_runtime::LogFormat;

/// Default of `--max-staged-bytes`: 512 MiB.
pub const DEFAULT_MAX_STAGED_BYTES: u64 = 512 * 1024 * 1024;

/// Default `--max-objects-per-account` (review F14: one agent must not grow the hub's
/// memory without bound): far above any account of the benchmarks (50,000 in measure 3,
/// 2,000 in the fleet) and of a Clouddriver-cached cluster, about 0.5 GB of JSON at 2 KiB
/// an object.
pub const DEFAULT_MAX_OBJECTS_PER_ACCOUNT: u64 = 250_000;
/// Default `--max-cached-mib` (review F14: many identities together must not take the
/// hub's memory): 8 GiB of cached objects as the cache counts them (packed JSON, strings,
/// indexes). The sizing page's largest fleet, 2 million objects of about 2.5 KB of JSON,
/// held about 3 GiB of RSS (1,579 B per object, all of the hub), so it counts well under
/// 3.2 GB here: the default never refuses it, with room for objects twice as large,
/// and stops a hub from caching without end past what such a fleet needs.
pub const DEFAULT_MAX_CACHED_MIB: u64 = 8192;
/// Default of `--max-accounts-per-identity`: well above what one agent serves (an
/// infrastructure-mode agent has one account per namespace or kubeconfig Secret it is given,
/// tens to a few hundred), while one compromised identity registering names without end
/// (review F14: each account may hold --max-objects-per-account objects) is stopped.
pub const DEFAULT_MAX_ACCOUNTS_PER_IDENTITY: u64 = 1000;
/// Default of `--max-streams-per-identity` (review F14): an agent runs one stream per pod
/// (two or three replicas, one more for a moment while a pod is replaced), so 16 leaves room
/// for rollouts and reconnections, while one identity cannot multiply the staging limit
/// and the hub's per-stream state without end.
pub const DEFAULT_MAX_STREAMS_PER_IDENTITY: u64 = 16;
/// Default of `--max-request-bytes`: 8 MiB.
/// Default lifetime of the tokens the hub issues for people (`--token-ttl`): a working day.
pub const DEFAULT_TOKEN_TTL: std::time::Duration =
    std::time::Duration::from_secs(scale_agent_hub_auth::tokens::DEFAULT_PERSON_TTL_SECONDS as u64);
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;
/// How long expired tokens stay in the store: a week (see
/// [`scale_agent_hub_auth::tokens::EXPIRED_TOKEN_RETENTION_SECONDS`] for why).
pub const DEFAULT_EXPIRED_TOKEN_RETENTION: std::time::Duration = std::time::Duration::from_secs(
    scale_agent_hub_auth::tokens::EXPIRED_TOKEN_RETENTION_SECONDS as u64,
);

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
}
