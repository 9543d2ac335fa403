//! What every Scale Agent binary (agent, hub, operator, demo) shares: the `--log-format`
//! flag and log set-up, and the shutdown signal.

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// Log output format (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Installs the global tracing subscriber: `RUST_LOG` filters (default `info`), in `format`,
/// colours only when writing to a terminal (never into log files or container logs).
pub fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Completes on SIGTERM or Ctrl-C (SIGINT), whichever comes first. If a signal handler
/// cannot be installed, only the other one ends it.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => tracing::info!("Ctrl-C received, shutting down"),
                _ = terminate.recv() => tracing::info!("SIGTERM received, shutting down"),
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops this process");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
