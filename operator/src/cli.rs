//! The `scale-agent-operator` command: flags, logging, run until SIGTERM or Ctrl-C.
//! `main.rs` only calls [`main`], so end-to-end tests can build the same command under
//! another name.

use std::{net::SocketAddr, time::Duration};

use clap::Parser;
use scale_agent_runtime::LogFormat;

use crate::policy::{Grants, WatchNamespaces};

/// Reconciles ScaleAgent and AgentAccount resources into agent Deployments, RBAC, config and
/// mTLS credentials.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address of the `/metrics`, `/healthz` and `/readyz` listener.
    #[arg(
        long,
        env = "SCALE_AGENT_OPERATOR_METRICS_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    metrics_address: SocketAddr,

    /// Log format.
    #[arg(long, env = "SCALE_AGENT_OPERATOR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    /// Reconcile every object at least this often, in seconds.
    #[arg(
        long,
        env = "SCALE_AGENT_OPERATOR_RESYNC_SECONDS",
        default_value_t = 600
    )]
    resync_seconds: u64,

    /// Longest delay between retries of a failing object, in seconds.
    #[arg(
        long,
        env = "SCALE_AGENT_OPERATOR_RETRY_MAX_SECONDS",
        default_value_t = 300
    )]
    retry_max_seconds: u64,

    /// How long no pod of a ScaleAgent's agent may be ready before its AgentAccounts'
    /// status.hub says state Unknown and why, in seconds.
    #[arg(
        long,
        env = "SCALE_AGENT_OPERATOR_AGENT_ABSENT_GRACE_SECONDS",
        default_value_t = 60
    )]
    agent_absent_grace_seconds: u64,

    /// Reconcile ScaleAgents and AgentAccounts only in these namespaces (comma-separated),
    /// or `*` for every namespace; those elsewhere get a condition saying so. Default: the
    /// operator's own namespace (its pod's, or the kubeconfig context's).
    #[arg(
        long,
        env = "SCALE_AGENT_OPERATOR_WATCH_NAMESPACES",
        value_delimiter = ','
    )]
    watch_namespaces: Option<Vec<String>>,

    /// Agent images a ScaleAgent may run (comma-separated prefixes). A prefix ending in `/`,
    /// `:` or `@` matches as written; any other is a repository and must be followed by a
    /// tag or digest. Other images get the condition `Degraded`, reason `ImageNotAllowed`.
    #[arg(
        long,
        env = "SCALE_AGENT_OPERATOR_ALLOWED_IMAGE_PREFIXES",
        value_delimiter = ',',
        default_value = scale_agent_crds::v1alpha1::DEFAULT_AGENT_REPOSITORY
    )]
    allowed_image_prefixes: Vec<String>,

    /// Namespaces the operator may create an agent's Roles in for `spec.scope.namespaces`
    /// besides the ScaleAgent's own (comma-separated), `*` for every namespace. kube-system,
    /// kube-public, kube-node-lease and the operator's own namespace only when named here.
    /// Others get the condition `Degraded`, reason `NamespaceNotGrantable`.
    #[arg(
        long,
        env = "SCALE_AGENT_OPERATOR_GRANTABLE_NAMESPACES",
        value_delimiter = ','
    )]
    grantable_namespaces: Vec<String>,

    /// ServiceAccounts an AgentAccount's `impersonateServiceAccount` may name besides those of
    /// its own namespace (comma-separated `namespace/name` or `namespace/*`). The reserved
    /// namespaces (kube-system, …, the operator's) only when named here. Others leave the
    /// account `Accepted=False`, reason `ImpersonationNotAllowed`.
    #[arg(
        long,
        env = "SCALE_AGENT_OPERATOR_IMPERSONABLE_SERVICE_ACCOUNTS",
        value_delimiter = ','
    )]
    impersonable_service_accounts: Vec<String>,

    /// Name of this instance in Events; the pod name in a Deployment.
    #[arg(long, env = "POD_NAME")]
    instance: Option<String>,

    /// Testing only: issue agent certificates with this lifetime in seconds, overriding
    /// every ScaleAgent's `clientCertificate.lifetime`.
    #[arg(
        long,
        env = "SCALE_AGENT_OPERATOR_CERTIFICATE_LIFETIME_OVERRIDE_SECONDS",
        hide = true
    )]
    certificate_lifetime_override_seconds: Option<u64>,

    /// Honour `spec.clientCertificate`: the operator signs agent certificates with a CA key
    /// held in this cluster, for an identity the ScaleAgent chooses. Off by default, so
    /// agents get their certificates from the hub by enrolment (`spec.enrolment`).
    #[arg(long, env = "SCALE_AGENT_OPERATOR_ALLOW_OPERATOR_SIGNED_CERTIFICATES")]
    allow_operator_signed_certificates: bool,

    /// Reconcile only while holding a coordination.k8s.io Lease, so several replicas can run:
    /// the others stand by (ready) and take over when the holder stops renewing it.
    #[arg(long, env = "SCALE_AGENT_OPERATOR_LEADER_ELECTION")]
    leader_election: bool,

    /// Name of the leader election Lease.
    #[arg(
        long,
        env = "SCALE_AGENT_OPERATOR_LEADER_ELECTION_LEASE",
        default_value = crate::leader::DEFAULT_LEASE
    )]
    leader_election_lease: String,

    /// The operator's own Deployment (in the Lease's namespace), made the Lease's owner so
    /// the Lease is garbage-collected with it (`helm uninstall`, `kubectl delete -k`). Unset:
    /// the Lease has no owner and stays after the operator is removed.
    #[arg(long, env = "SCALE_AGENT_OPERATOR_LEADER_ELECTION_OWNER_DEPLOYMENT")]
    leader_election_owner_deployment: Option<String>,

    /// Namespace of the leader election Lease. Default: the operator's own.
    #[arg(long, env = "SCALE_AGENT_OPERATOR_LEADER_ELECTION_NAMESPACE")]
    leader_election_namespace: Option<String>,

    /// Seconds the Lease holds without renewal: a standby takes over at most this long after
    /// the leader stopped renewing it.
    #[arg(
        long,
        env = "SCALE_AGENT_OPERATOR_LEADER_ELECTION_DURATION_SECONDS",
        default_value_t = 15
    )]
    leader_election_duration_seconds: u64,

    /// Seconds before expiry at which the leader renews the Lease.
    #[arg(
        long,
        env = "SCALE_AGENT_OPERATOR_LEADER_ELECTION_GRACE_SECONDS",
        default_value_t = 5
    )]
    leader_election_grace_seconds: u64,
}

pub fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run_from_args(Args::parse()))
}

async fn run_from_args(args: Args) -> anyhow::Result<()> {
    scale_agent_runtime::init_tracing(args.log_format);
    let client = kube::Client::try_default().await?;
    // In a pod the client's default namespace is the pod's own (from its ServiceAccount).
    let watch_namespaces = args
        .watch_namespaces
        .unwrap_or_else(|| vec![client.default_namespace().to_owned()]);
    let allowed_image_prefixes: Vec<String> = args
        .allowed_image_prefixes
        .into_iter()
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect();
    anyhow::ensure!(
        !allowed_image_prefixes.is_empty(),
        "--allowed-image-prefixes is empty: give at least one image prefix"
    );
    anyhow::ensure!(
        !args.leader_election
            || args.leader_election_grace_seconds < args.leader_election_duration_seconds,
        "--leader-election-grace-seconds ({}) must be less than \
         --leader-election-duration-seconds ({}): the leader renews that long before the Lease \
         expires",
        args.leader_election_grace_seconds,
        args.leader_election_duration_seconds
    );
    let election = args.leader_election.then(|| crate::leader::LeaderElection {
        namespace: args
            .leader_election_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned()),
        lease: args.leader_election_lease.clone(),
        owner_deployment: args.leader_election_owner_deployment.clone(),
        identity: args
            .instance
            .clone()
            .unwrap_or_else(|| format!("scale-agent-operator-{}", std::process::id())),
        duration: Duration::from_secs(args.leader_election_duration_seconds),
        grace: Duration::from_secs(args.leader_election_grace_seconds),
    });
    let config = crate::Config {
        certificate_lifetime_override: args
            .certificate_lifetime_override_seconds
            .map(Duration::from_secs),
        resync: Duration::from_secs(args.resync_seconds),
        retry_max: Duration::from_secs(args.retry_max_seconds),
        agent_absent_grace: Duration::from_secs(args.agent_absent_grace_seconds),
        instance: args.instance,
        watch_namespaces: WatchNamespaces::parse(&watch_namespaces).map_err(anyhow::Error::msg)?,
        allowed_image_prefixes,
        allow_operator_signed_certificates: args.allow_operator_signed_certificates,
        grants: Grants::parse(
            &args.grantable_namespaces,
            &args.impersonable_service_accounts,
            Some(client.default_namespace().to_owned()),
        )
        .map_err(anyhow::Error::msg)?,
        ..Default::default()
    };
    let result = crate::run(
        client,
        config,
        election,
        Some(args.metrics_address),
        scale_agent_runtime::shutdown_signal(),
    )
    .await;
    if let Err(error) = &result {
        // Also in the log (JSON in a cluster), not only on stderr as the exit error.
        tracing::error!(error = %crate::error::Chain(error), "operator stopped");
    }
    Ok(result?)
}
