//! What every Scale Agent binary (agent, hub, operator, demo) shares: the `--log-format`
//! flag and log set-up, the shutdown signal, the version with its build-info metric, and
//! [`Chain`], which prints an error with its causes.

use clap::ValueEnum;
use prometheus_client::metrics::info::Info;
use tracing_subscriber::EnvFilter;

/// The version of every Scale Agent binary and image: the workspace's
/// (`[workspace.package] version` in Cargo.toml), as `--version` prints it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The build-info metric, `1` with the version as a label: registered as `build` under a
/// component's prefix it reads `scale_agent_hub_build_info{version="0.1.0"} 1`, so a
/// dashboard shows which version runs where.
pub fn build_info() -> Info<[(&'static str, &'static str); 1]> {
    Info::new([("version", VERSION)])
}

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

/// An error and its causes on one line (`cannot read /etc/agent.yaml: No such file or
/// directory (os error 2)`), for log fields, status messages and HTTP answers.
///
/// The crates' error types never repeat their `#[source]` in their own message, so each cause
/// appears once: the error's message, then every `source()` after a `: `. A layer whose
/// message is exactly the one before it is left out: some libraries wrap an error in another
/// with the same text (hyper-util's `tcp connect error: tcp connect error: Connection
/// refused`), which says nothing twice.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut last = self.0.to_string();
        f.write_str(&last)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            let text = cause.to_string();
            if text != last {
                write!(f, ": {text}")?;
                last = text;
            }
            source = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cause wrapped with what failed, its message leaving the cause out.
    #[derive(Debug)]
    struct Wrapped {
        what: &'static str,
        cause: Box<dyn std::error::Error + 'static>,
    }

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.what)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(self.cause.as_ref())
        }
    }

    #[test]
    fn chain_prints_each_cause_once_in_order() {
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let error = Wrapped {
            what: "cannot connect to the hub",
            cause: Box::new(Wrapped {
                what: "transport error",
                cause: Box::new(refused()),
            }),
        };
        assert_eq!(
            Chain(&error).to_string(),
            "cannot connect to the hub: transport error: refused"
        );
        assert_eq!(Chain(&refused()).to_string(), "refused");
    }

    /// A library layer that only repeats its cause's message is printed once; a cause that
    /// merely contains the message before it is still printed.
    #[test]
    fn chain_leaves_out_a_layer_that_repeats_the_one_before() {
        let error = Wrapped {
            what: "tcp connect error",
            cause: Box::new(Wrapped {
                what: "tcp connect error",
                cause: Box::new(std::io::Error::other("tcp connect error: reset")),
            }),
        };
        assert_eq!(
            Chain(&error).to_string(),
            "tcp connect error: tcp connect error: reset"
        );
    }
}
