//! `scale-agent`: parses flags, sets up logging, runs the agent until SIGTERM or Ctrl-C.

use std::time::Duration;

use clap::Parser;
use scale_agent::{LogFormat, Options};
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<()> {
    let options = Options::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    match options.log_format {
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init(),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(scale_agent::run(options, shutdown_signal()));
    // Do not wait for stray blocking work once the agent has stopped.
    runtime.shutdown_timeout(Duration::from_millis(200));
    result?;
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
