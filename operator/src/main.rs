//! `scale-agent-operator`: reconciles ScaleAgent and AgentAccount resources.

use std::{net::SocketAddr, time::Duration};

use clap::{Parser, ValueEnum};

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

    /// Watch ScaleAgents and AgentAccounts in this namespace only; every namespace when
    /// unset.
    #[arg(long, env = "SCALE_AGENT_OPERATOR_NAMESPACE")]
    namespace: Option<String>,

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
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    let config = scale_agent_operator::Config {
        certificate_lifetime_override: args
            .certificate_lifetime_override_seconds
            .map(Duration::from_secs),
        resync: Duration::from_secs(args.resync_seconds),
        retry_max: Duration::from_secs(args.retry_max_seconds),
        instance: args.instance,
        namespace: args.namespace,
        ..Default::default()
    };
    let client = kube::Client::try_default().await?;
    scale_agent_operator::run(
        client,
        config,
        Some(args.metrics_address),
        shutdown_signal(),
    )
    .await?;
    Ok(())
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutting down");
}
