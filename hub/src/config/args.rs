//! The command line: [`Args`], every flag with an environment fallback, in groups by the part
//! of the hub they configure (`--help` shows each group under its heading).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Parser;
use scale_agent_hub_net::limits;

use super::{DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_STAGED_BYTES, LogFormat, parse_duration};
use crate::{
    forwarded::{Cidr, ForwardedFormat},
    identity::AllowRule,
};

/// scale-agent-hub: accepts Scale Agent streams over mutual TLS, caches every agent's
/// cluster, and serves it over an HTTP API.
///
/// The flags come in groups, one per part of the hub they configure, each under its heading
/// in `--help`; [`Args::into_config`] turns each group into its part of the
/// [`Config`](super::Config).
#[derive(Clone, Debug, Parser)]
#[command(name = "scale-agent-hub", version, about, long_about = None)]
pub struct Args {
    #[command(flatten)]
    pub listeners: ListenerArgs,

    #[command(flatten)]
    pub agents: AgentArgs,

    #[command(flatten)]
    pub api: ApiArgs,

    #[command(flatten)]
    pub clouddriver: ClouddriverArgs,

    #[command(flatten)]
    pub store: StoreArgs,

    #[command(flatten)]
    pub replicas: ReplicaArgs,

    #[command(flatten)]
    pub streams: StreamArgs,

    #[command(flatten)]
    pub operations: OperationArgs,

    #[command(flatten)]
    pub logging: LogArgs,
}

/// The two listeners and their TLS: the gRPC listener agents connect to and the HTTP
/// listener of the REST API and the Kubernetes API proxy.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Listeners and TLS")]
pub struct ListenerArgs {
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

    /// PEM file with the gRPC server's certificate chain. Required unless
    /// --insecure-plaintext; with --forwarded-client-cert, TLS on the hop from the proxy.
    #[arg(long, env = "SCALE_AGENT_HUB_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM file with the gRPC server's private key. Required unless --insecure-plaintext;
    /// with --forwarded-client-cert, TLS on the hop from the proxy.
    #[arg(long, env = "SCALE_AGENT_HUB_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

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

    /// Most connections the gRPC listener serves at once (TLS handshakes included); one more
    /// is closed at accept and counted in scale_agent_hub_listener_connections_refused_total.
    /// Each agent process keeps one.
    #[arg(long, env = "SCALE_AGENT_HUB_GRPC_MAX_CONNECTIONS", default_value_t = limits::DEFAULT_GRPC_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_connections: u32,

    /// Most connections the HTTP listener serves at once (TLS handshakes included); one more
    /// is closed at accept and counted in scale_agent_hub_listener_connections_refused_total.
    #[arg(long, env = "SCALE_AGENT_HUB_HTTP_MAX_CONNECTIONS", default_value_t = limits::DEFAULT_HTTP_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub http_max_connections: u32,

    /// How long a connection to either listener may take, from its accept, to send the
    /// start of its first request (the TLS handshake included), and on HTTP/1.1 how long
    /// each request head may take: slower clients are disconnected (slowloris). Seconds, or
    /// a duration (1m30s, 250ms).
    #[arg(long, env = "SCALE_AGENT_HUB_HEADER_READ_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
}

/// How agents are authenticated and what they may register: the CAs of their certificates,
/// the certificates the hub issues, plaintext or a TLS-terminating gRPC proxy, the allow rules.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Agent authentication and the trusted gRPC proxy")]
pub struct AgentArgs {
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

    /// How long renewals may extend one enrolment: no certificate the hub issues outlives
    /// the agent's last enrolment by more than this, after which the agent enrols again with
    /// a one-time token. Bounds what a stolen agent key is worth, however often it renews.
    /// Same duration syntax as --agent-cert-lifetime; at least that lifetime.
    #[arg(long, env = "SCALE_AGENT_HUB_AGENT_MAX_ENROLMENT_AGE", default_value = "8784h", value_parser = parse_duration)]
    pub agent_max_enrolment_age: Duration,

    /// Serve gRPC without TLS and without authenticating agents (every agent is
    /// "anonymous", which registers only the accounts an `--allow anonymous=...` rule
    /// names). For local experiments only; refused together with the flags of an
    /// authenticating mode (--client-ca, --tls-cert, --tls-key, --forwarded-client-cert).
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_INSECURE_PLAINTEXT",
        conflicts_with_all = ["client_ca", "tls_cert", "tls_key"]
    )]
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

    /// IDENTITY=PATTERN: the agent identity (from its client certificate or agent token) may
    /// register accounts whose name matches PATTERN. Both sides accept `*` wildcards; prefer
    /// exact names or a separator (`prod-eu-west-1-*`, not `prod-eu-west-1*`, which also
    /// matches prod-eu-west-10). Repeatable; with no rule, only the account patterns of agent
    /// tokens and enrolments apply. Identities whose credentials carry no pattern (a
    /// certificate of --client-ca, `anonymous`) register only what a rule names.
    /// Comma-separated in the environment variable.
    #[arg(long, env = "SCALE_AGENT_HUB_ALLOW", value_delimiter = ',', value_parser = AllowRule::parse)]
    pub allow: Vec<AllowRule>,
}

/// The HTTP API: the URL the hub hands out, its tokens and its request limit.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "HTTP API and tokens")]
pub struct ApiArgs {
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

    /// File with the admin token, which issues and revokes proxy tokens
    /// (`scale-agent-hub kubeconfig`, `scale-agent-hub token`). Created with a new random
    /// token (mode 0600) when missing. Read again every 10 s: a new token there replaces the
    /// old one; a file deleted for 5 s leaves no admin token. Default: <data-dir>/admin-token.
    #[arg(long, env = "SCALE_AGENT_HUB_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// YAML or JSON list of API tokens, `[{name, role, sha256, accounts}]` with role metrics,
    /// reader, operator or admin, optional account globs limiting the account routes it
    /// opens, and the token's SHA-256 in hex (`scale-agent-hub token hash`); re-read when it
    /// changes (a broken file keeps the previous tokens). A missing file holds no tokens
    /// until it appears; one deleted for 5 s holds none from then on.
    #[arg(long, env = "SCALE_AGENT_HUB_API_TOKENS_FILE")]
    pub api_tokens_file: Option<PathBuf>,

    /// The Kubernetes API server's structured authentication configuration
    /// (`kind: AuthenticationConfiguration`, `jwt:` issuers with url, audiences,
    /// certificateAuthority and username/groups claim mappings): the proxy and the REST API
    /// accept those issuers' OIDC ID tokens. Fields the hub does not support are refused by
    /// name. Read again every 10 s: a changed file that parses replaces the issuers, a broken
    /// or missing one keeps them. See the guide, "Give people access".
    #[arg(long, env = "SCALE_AGENT_HUB_AUTHENTICATION_CONFIG")]
    pub authentication_config: Option<PathBuf>,

    /// YAML list of rules giving people signed in with OIDC their accounts and API role:
    /// `[{groups: [...], users: [...], accounts: [globs], role: reader}]` (names after the
    /// issuer's prefixes). Without it they reach nothing. Read again every 10 s, as
    /// --authentication-config.
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_OIDC_ACCESS",
        requires = "authentication_config"
    )]
    pub oidc_access: Option<PathBuf>,

    /// How long a token the hub issues for a person lasts (a kubeconfig's token other than
    /// Clouddriver's, an API token) unless the request asks for another `ttl`; `0s`: no
    /// expiry. Clouddriver's token never expires: the hub renders and rotates it itself.
    #[arg(long, env = "SCALE_AGENT_HUB_TOKEN_TTL", default_value = "12h", value_parser = parse_duration)]
    pub token_ttl: std::time::Duration,

    /// Serve /metrics without a bearer token (by default it needs role metrics or more).
    #[arg(long, env = "SCALE_AGENT_HUB_METRICS_UNAUTHENTICATED")]
    pub metrics_unauthenticated: bool,

    /// File with the key that derives the Clouddriver tokens (32 bytes as 64 hex
    /// characters, e.g. `openssl rand -hex 32`, mounted from a Secret), kept out of the store
    /// so that a reader of the store cannot derive them. Default: the key is kept in the
    /// store. A store that holds the same key has it removed; one holding another key is
    /// refused unless --token-key-replaces-stored.
    #[arg(long, env = "SCALE_AGENT_HUB_TOKEN_KEY_FILE")]
    pub token_key_file: Option<PathBuf>,

    /// With --token-key-file: when the store holds another derivation key, remove it and
    /// derive with the file's key (every Clouddriver token changes; the registrar registers
    /// the new kubeconfigs). Without it such a start is refused.
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_TOKEN_KEY_REPLACES_STORED",
        requires = "token_key_file"
    )]
    pub token_key_replaces_stored: bool,

    /// Largest body of a REST API request, in bytes (an operation's manifests); larger
    /// requests get 413.
    #[arg(long, env = "SCALE_AGENT_HUB_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,

    /// Which reads through the Kubernetes API proxy get an audit line (every write does):
    /// all, writes-only, or sample:N (one read in N, its line saying sampled=N). Lines are
    /// JSON with --log-format json, target `audit`.
    #[arg(long, env = "SCALE_AGENT_HUB_PROXY_AUDIT_READS", default_value = "all")]
    pub proxy_audit_reads: crate::proxy::audit::AuditReads,
}

/// Registration of accounts in Clouddriver.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Clouddriver")]
pub struct ClouddriverArgs {
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
}

/// Where the hub keeps its state: the embedded store or PostgreSQL.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Store and PostgreSQL")]
pub struct StoreArgs {
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

    /// Accept a PostgreSQL connection below sslmode=verify-full (disable, prefer, require,
    /// verify-ca; no sslmode means prefer): without it the hub refuses to start, since
    /// whoever sits on the path to PostgreSQL could then read and write the store (tokens,
    /// bindings, owners' addresses). With it a warning is logged at start. For a
    /// database on the same host or a network you trust, and tests.
    #[arg(long, env = "SCALE_AGENT_HUB_POSTGRES_INSECURE_TLS")]
    pub postgres_insecure_tls: bool,

    /// redb's page cache of the store, in MiB. The hub reads its store only at start-up;
    /// commits read the pages they change from this cache or else from the file (the
    /// kernel's page cache). A larger cache makes commits of very large stores read less
    /// from the file, at the cost of the hub's memory (up to the store's size).
    #[arg(long, env = "SCALE_AGENT_HUB_STORE_CACHE_MIB", default_value_t = crate::store::DEFAULT_STORE_CACHE_BYTES / (1024 * 1024))]
    pub store_cache_mib: usize,
}

/// Several replicas sharing a PostgreSQL store: who this one is and how it reaches the others.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Replicas")]
pub struct ReplicaArgs {
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
    /// Read again every 10 s: after a change the previous secret stays accepted, and is sent
    /// beside the new one, for 5 minutes, so that replicas keep forwarding while each one's
    /// copy of the Secret changes.
    #[arg(long, env = "SCALE_AGENT_HUB_REPLICA_SECRET_FILE")]
    pub replica_secret_file: Option<PathBuf>,

    /// The IP ranges (CIDR, comma-separated; e.g. the cluster's pod CIDR) of the other
    /// replicas' --replica-address hosts: a replica forwards requests, with the replica
    /// secret, only to owner addresses inside them. Default: any host of this replica's own
    /// scheme (https:// unless --http-plaintext), verified against --serving-ca only.
    #[arg(long, env = "SCALE_AGENT_HUB_REPLICA_PEER_CIDRS", value_delimiter = ',', value_parser = Cidr::parse)]
    pub replica_peer_cidrs: Vec<Cidr>,
}

/// The agents' streams: heartbeats, flow control, how long an account outlives its agent, and
/// the limits of what the hub holds for them.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Agent streams and limits")]
pub struct StreamArgs {
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

    /// Most bytes of objects the streams of one agent identity may hold together in
    /// snapshots they have begun and not ended (a relist is staged whole before it replaces
    /// the cache). The stream that goes past it is ended with RESOURCE_EXHAUSTED naming the
    /// identity, account and kind.
    #[arg(long, env = "SCALE_AGENT_HUB_MAX_STAGED_BYTES", default_value_t = DEFAULT_MAX_STAGED_BYTES)]
    pub max_staged_bytes: u64,

    /// Most objects the hub caches for one account (0: no limit). A kind
    /// whose objects would take an account past it is not cached at all (state OVER_QUOTA
    /// in /api/v1/accounts, sent to the agent; the proxy reads it from the cluster) until a
    /// relist of it fits. The hub keeps about as much memory per cached object as its
    /// JSON takes (bench measure 5).
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_MAX_OBJECTS_PER_ACCOUNT",
        default_value_t = super::DEFAULT_MAX_OBJECTS_PER_ACCOUNT
    )]
    pub max_objects_per_account: u64,

    /// Most accounts one agent identity may have bound to it (the names it registered
    /// first, kept until an admin releases them). A registration past it is rejected with a
    /// message naming this flag, so that one compromised identity cannot register names
    /// without end, each holding up to --max-objects-per-account objects. 0 means no limit.
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_MAX_ACCOUNTS_PER_IDENTITY",
        default_value_t = super::DEFAULT_MAX_ACCOUNTS_PER_IDENTITY
    )]
    pub max_accounts_per_identity: u64,

    /// Most streams one agent identity may have open on this hub replica at once (replica
    /// names are the agent's to choose, so without it one identity could open streams
    /// without end, each staging snapshots). A stream past it is refused with
    /// RESOURCE_EXHAUSTED naming this flag. 0 means no limit.
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_MAX_STREAMS_PER_IDENTITY",
        default_value_t = super::DEFAULT_MAX_STREAMS_PER_IDENTITY
    )]
    pub max_streams_per_identity: u64,

    /// Most MiB of objects the watch histories of all accounts and kinds hold together
    /// (what the Kubernetes API proxy serves watches from; each kind also keeps at most the
    /// last 4096 events or 32 MiB). A history whose event takes the total past it drops its
    /// own oldest events, down to its newest 16: a watch from before them is answered 410
    /// Gone ("too old resource version") and lists again. 0 means no hub-wide limit.
    #[arg(long, env = "SCALE_AGENT_HUB_WATCH_HISTORY_MIB", default_value_t = crate::cache::history::DEFAULT_BUDGET_BYTES / (1024 * 1024))]
    pub watch_history_mib: usize,

    /// Most MiB of discovery and OpenAPI documents the Kubernetes API proxy keeps for all
    /// accounts together (each account keeps at most 256 MiB, each document at most 64 MiB).
    /// Past it the documents used longest ago go, whichever account holds them, and are
    /// fetched from their cluster again when asked for. 0 means no hub-wide limit.
    #[arg(long, env = "SCALE_AGENT_HUB_DISCOVERY_CACHE_MIB", default_value_t = crate::proxy::discovery::DEFAULT_TOTAL_BYTES / (1024 * 1024))]
    pub discovery_cache_mib: usize,

    /// Most MiB the cache holds for objects, all accounts together (their packed JSON,
    /// names and indexes), so that many agent identities, or one with many accounts, cannot
    /// take the hub's memory. A snapshot or object that would take the cache past it is
    /// refused like one past --max-objects-per-account: its kind is not cached for that
    /// account (state OVER_QUOTA, sent to the agent; the proxy reads it from the cluster)
    /// until a relist of it fits; other accounts and kinds keep their cache. The default, 8 GiB,
    /// is more than twice what the largest fleet measured counts (2 million objects of
    /// about 2.5 KB of JSON: about 3 GiB of hub memory in all, see the sizing page), so it
    /// refuses no such fleet; set it below the hub's memory limit. 0 means no limit.
    #[arg(long, env = "SCALE_AGENT_HUB_MAX_CACHED_MIB", default_value_t = super::DEFAULT_MAX_CACHED_MIB)]
    pub max_cached_mib: u64,
}

/// Operations (`POST /api/v1/accounts/{name}/operations`): how large their results and
/// records may be and how long they are kept.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Operations")]
pub struct OperationArgs {
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
}

/// The hub's logs.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Log format.
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// Also write every audit line (proxied requests, operations, account changes, admin
    /// levers) to this file, one JSON object a line with the fields of the log's audit
    /// lines, whatever RUST_LOG and --log-format say. Default: the hub's log only.
    #[arg(long, env = "SCALE_AGENT_HUB_AUDIT_LOG_PATH")]
    pub audit_log_path: Option<PathBuf>,

    /// With --audit-log-path: before the file would grow past this many MiB it becomes
    /// <path>.1 (the older ones <path>.2, ...) and a new one starts; 0: never rotated.
    #[arg(long, env = "SCALE_AGENT_HUB_AUDIT_LOG_MAX_SIZE", default_value_t = crate::audit_log::DEFAULT_MAX_SIZE_MIB)]
    pub audit_log_max_size: u64,

    /// With --audit-log-path: how many rotated files to keep (<path>.1 is the newest); 0:
    /// none, the file starts over.
    #[arg(long, env = "SCALE_AGENT_HUB_AUDIT_LOG_MAX_BACKUPS", default_value_t = crate::audit_log::DEFAULT_MAX_BACKUPS)]
    pub audit_log_max_backups: usize,
}

impl LogArgs {
    /// What `--audit-log-path` and its limits ask for (`None`: no audit file).
    pub fn audit_log(&self) -> Option<crate::audit_log::AuditLogOptions> {
        self.audit_log_path
            .clone()
            .map(|path| crate::audit_log::AuditLogOptions {
                path,
                max_bytes: self.audit_log_max_size.saturating_mul(1024 * 1024),
                max_backups: self.audit_log_max_backups,
            })
    }
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    /// Clap's own checks of the command (every id a `requires` or `conflicts_with` names
    /// exists, across the groups too), and what the hub's flags promise: each has an
    /// environment variable named after it, a doc, and a group's heading in `--help`; the
    /// groups' doc comments do not replace the command's description.
    #[test]
    fn every_flag_has_an_environment_variable_a_doc_and_a_heading() {
        let command = Args::command();
        command.clone().debug_assert();
        assert_eq!(
            command.get_about().map(ToString::to_string).as_deref(),
            Some(env!("CARGO_PKG_DESCRIPTION"))
        );
        assert!(command.get_long_about().is_none());
        let flags: Vec<_> = command
            .get_arguments()
            .filter(|arg| !matches!(arg.get_id().as_str(), "help" | "version"))
            .collect();
        assert_eq!(flags.len(), 71);
        for arg in flags {
            let id = arg.get_id().as_str();
            let long = arg
                .get_long()
                .unwrap_or_else(|| panic!("{id}: no long name"));
            assert_eq!(long, id.replace('_', "-"));
            let env = format!("SCALE_AGENT_HUB_{}", id.to_uppercase());
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(env.as_str()),
                "--{long}"
            );
            assert!(
                arg.get_help().is_some_and(|h| !h.to_string().is_empty()),
                "--{long}: no doc"
            );
            assert!(arg.get_help_heading().is_some(), "--{long}: no group");
        }
    }

    /// `requires` and `conflicts_with` hold across the groups as they did in one struct.
    #[test]
    fn relations_between_flags_hold_across_groups() {
        use clap::error::ErrorKind;
        let kind = |argv: &[&str]| {
            let mut full = vec!["scale-agent-hub"];
            full.extend_from_slice(argv);
            Args::try_parse_from(full).err().map(|e| e.kind())
        };
        assert_eq!(
            kind(&["--insecure-plaintext", "--forwarded-client-cert", "xfcc"]),
            Some(ErrorKind::ArgumentConflict)
        );
        for argv in [
            &["--agent-ca-cert", "ca.crt"][..],
            &["--agent-ca-key", "ca.key"],
            &["--forwarded-client-cert-header", "x-client"],
            &["--trusted-proxy-cidr", "10.0.0.0/8"],
            &["--trusted-proxy-identity", "envoy"],
            &["--trusted-proxy-ca", "ca.crt"],
        ] {
            assert_eq!(
                kind(argv),
                Some(ErrorKind::MissingRequiredArgument),
                "{argv:?}"
            );
        }
        assert_eq!(
            kind(&["--agent-ca-cert", "ca.crt", "--agent-ca-key", "ca.key"]),
            None
        );
    }
}
