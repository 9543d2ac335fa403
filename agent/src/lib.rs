//! Scale Agent: watches a Kubernetes cluster as its own ServiceAccount and streams it to the
//! hub over one outbound gRPC stream (see `proto/scaleagent/v1/agent.proto`).
//!
//! Start it with [`run`] (as `main` does) or, in tests, with [`start`], which returns an
//! [`AgentHandle`] to read its metrics and admin view and to shut it down.

pub mod account;
pub mod admin;
pub mod backoff;
pub mod budget;
pub mod cli;
pub mod config;
pub mod convert;
pub mod enrolment;
pub mod error;
pub mod hub_conn;
pub mod kinds;
pub mod metrics;
pub mod operations;
pub mod runtime;
pub mod session;
pub mod state;
pub mod streamer;
pub mod tunnel;
pub mod watch;

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use scale_agent_crds::agent_config::AgentConfig;
use tokio::{sync::watch as signal, task::JoinHandle};

pub use crate::{
    config::{LogFormat, Options},
    error::{Error, Result},
    metrics::Metrics,
    state::{AgentView, Shared},
};

/// How often the config file is re-read (a mounted ConfigMap changes by symlink swap, so
/// the content is polled rather than watched with inotify).
pub const CONFIG_POLL: Duration = Duration::from_secs(2);

/// A running agent.
pub struct AgentHandle {
    shared: Arc<Shared>,
    admin_addr: SocketAddr,
    shutdown: signal::Sender<bool>,
    task: JoinHandle<Result<()>>,
}

impl AgentHandle {
    /// Where the admin listener listens (useful with `--admin-addr 127.0.0.1:0`).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The agent's metrics (also served on `/metrics`).
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The metrics as `/metrics` serves them (Prometheus text).
    pub fn metrics_text(&self) -> String {
        self.shared.encode_metrics()
    }

    /// A copy of the admin view (also served on `/accounts`).
    pub fn view(&self) -> AgentView {
        self.shared.view()
    }

    /// Metrics and admin view together.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Asks the agent to stop; [`Self::stopped`] waits for it.
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Waits until the agent has stopped.
    pub async fn stopped(self) -> Result<()> {
        match self.task.await {
            Ok(result) => result,
            Err(join) if join.is_cancelled() => Ok(()),
            Err(join) => Err(Error::Protocol(format!("the agent task failed: {join}"))),
        }
    }

    /// Stops the agent and waits for it.
    pub async fn stop(self) -> Result<()> {
        self.shutdown();
        self.stopped().await
    }
}

/// Loads the config, binds the admin listener and starts the agent in the background.
pub async fn start(options: Options) -> Result<AgentHandle> {
    let (config, text) = options.load()?;
    let admin_addr = options.admin_addr(&config);
    let listener = tokio::net::TcpListener::bind(admin_addr)
        .await
        .map_err(|source| Error::Admin {
            addr: admin_addr.to_string(),
            source,
        })?;
    let admin_addr = listener.local_addr().map_err(|source| Error::Admin {
        addr: admin_addr.to_string(),
        source,
    })?;
    let shared = Shared::new();
    shared.update(|view| {
        view.replica = options.replica_name();
        view.hub = config.clouddriver.grpc.clone();
    });
    for account in &config.kubernetes.accounts {
        shared.update_account(&account.name, |_| {});
    }
    let (shutdown_tx, shutdown_rx) = signal::channel(false);
    let (config_tx, config_rx) = signal::channel(Arc::new(config));

    let admin = {
        let mut stop = shutdown_rx.clone();
        let router = admin::router(shared.clone());
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let Err(error) = axum::serve(listener, router)
                .with_graceful_shutdown(stopped)
                .await
            {
                tracing::error!(%error, "admin listener failed");
            }
        })
    };
    let poller = tokio::spawn(poll_config(
        options.clone(),
        text,
        config_tx,
        shared.clone(),
    ));
    let runtime = runtime::Runtime::new(options, shared.clone(), config_rx, shutdown_rx);
    let task = tokio::spawn(async move {
        let result = runtime.run().await;
        tracing::debug!("runtime stopped");
        poller.abort();
        let _ = admin.await;
        tracing::debug!("admin listener stopped");
        result
    });
    tracing::info!(admin = %admin_addr, "scale-agent started");
    Ok(AgentHandle {
        shared,
        admin_addr,
        shutdown: shutdown_tx,
        task,
    })
}

/// Runs the agent until `shutdown` completes (for example on SIGTERM).
pub async fn run(options: Options, shutdown: impl Future<Output = ()>) -> Result<()> {
    let mut handle = start(options).await?;
    tokio::select! {
        _ = shutdown => {
            tracing::info!("shutting down");
            handle.stop().await
        }
        result = &mut handle.task => match result {
            Ok(result) => result,
            Err(join) => Err(Error::Protocol(format!("the agent task failed: {join}"))),
        },
    }
}

/// Re-reads the config file every [`CONFIG_POLL`] and publishes it when its content changed
/// and parses; an invalid file is logged and the previous config stays.
async fn poll_config(
    options: Options,
    mut last: String,
    tx: signal::Sender<Arc<AgentConfig>>,
    shared: Arc<Shared>,
) {
    let mut interval = tokio::time::interval(CONFIG_POLL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let text = match config::read_config_text(&options.config) {
            Ok(text) => text,
            Err(error) => {
                tracing::warn!(%error, "cannot re-read the config file; keeping the current config");
                continue;
            }
        };
        if text == last {
            continue;
        }
        last = text;
        match options.parse_text(&last) {
            Ok(config) => {
                tracing::info!(path = %options.config.display(), "config file changed; applying it");
                shared.metrics.config_reloads.inc();
                if tx.send(Arc::new(config)).is_err() {
                    return;
                }
            }
            Err(error) => {
                shared.metrics.config_errors.inc();
                tracing::error!(%error, "config file changed but is invalid; keeping the current config until it is fixed");
            }
        }
    }
}
