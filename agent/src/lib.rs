//! Scale Agent: watches a Kubernetes cluster as its own ServiceAccount and streams it to the
//! hub over one outbound gRPC stream (see `proto/scaleagent/v1/agent.proto`).
//!
//! Start it with [`run`] (as `main` does) or, in tests, with [`start`], which returns an
//! [`AgentHandle`] to read its metrics and admin view and to shut it down.

pub mod account;
pub mod admin;
pub mod backoff;
pub mod budget;
pub mod callers;
pub mod cli;
pub mod config;
pub mod config_armory;
pub mod convert;
pub mod dynamic_accounts;
pub mod egress;
pub mod enrolment;
pub mod error;
pub mod hub_conn;
pub mod kinds;
pub mod metrics;
pub mod migrate;
pub mod operations;
pub mod runtime;
pub mod session;
pub mod state;
pub mod status_writer;
pub mod streamer;
pub mod tunnel;
pub mod tunnel_scope;
pub mod watch;
pub mod wiping_alloc;

use std::{future::Future, net::SocketAddr, path::Path, sync::Arc, time::Duration};

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
    let loaded = options.load()?;
    let config = loaded.parsed.config.clone();
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
    let path = options.config_path();
    shared.update(|view| {
        view.replica = options.replica_name();
        view.hub = config.clouddriver.grpc.clone();
        view.config.path = path.display().to_string();
    });
    report_ignored_keys(&path, &loaded.parsed, &shared);
    if loaded.missing {
        let problem = format!(
            "no config file at {}: running on the defaults (no accounts) until one appears",
            path.display()
        );
        tracing::warn!(path = %path.display(), "{problem}");
        shared.metrics.config_errors.inc();
        shared.update(|view| view.config.problem = Some(problem));
    }
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
        ConfigPoll {
            last_files: loaded.files,
            last_problem: None,
            unreadable: loaded.missing,
        },
        config_tx,
        shared.clone(),
    ));
    let status_writer = tokio::spawn(status_writer::run(
        shared.clone(),
        config_rx.clone(),
        Duration::from_secs(options.status_interval_seconds),
        shutdown_rx.clone(),
    ));
    let runtime = runtime::Runtime::new(options, shared.clone(), config_rx, shutdown_rx);
    let task = tokio::spawn(async move {
        let result = runtime.run().await;
        tracing::debug!("runtime stopped");
        poller.abort();
        status_writer.abort();
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

/// Logs each key the config ignores once (this function runs once per distinct file
/// content), counts unknown ones as config errors, and shows them on `/accounts`.
fn report_ignored_keys(path: &Path, parsed: &config::ParsedConfig, shared: &Shared) {
    for notice in &parsed.without_effect {
        tracing::warn!(path = %path.display(), key = %notice.path, "Armory config key {notice}");
    }
    let unknown_keys = &parsed.unknown_keys;
    for key in unknown_keys {
        let suggestion = key.suggestion.unwrap_or_default();
        tracing::warn!(
            path = %path.display(),
            key = %key.path,
            suggestion,
            "unknown config key {key} ignored; fix or remove it (a key Armory's agent has that this one does not support is ignored too)"
        );
        shared.metrics.config_errors.inc();
    }
    let shown = unknown_keys.iter().map(ToString::to_string).collect();
    let without_effect = parsed
        .without_effect
        .iter()
        .map(ToString::to_string)
        .collect();
    shared.update(|view| {
        view.config.unknown_keys = shown;
        view.config.without_effect = without_effect;
    });
}

/// What the config poller remembers between reads.
struct ConfigPoll {
    /// The files last parsed (applied or refused), to notice changes.
    last_files: config::ConfigFiles,
    /// Why `last_files` were refused, if they were.
    last_problem: Option<String>,
    /// The file is missing or unreadable now (reported once, when it became so).
    unreadable: bool,
}

/// Re-reads the config file every [`CONFIG_POLL`] and publishes it when its content changed
/// and parses. An invalid, missing or unreadable file is logged, counted and shown on
/// `/accounts`, and the previous config stays: a ConfigMap unmounted or a rename in progress
/// must not stop every account.
async fn poll_config(
    options: Options,
    mut state: ConfigPoll,
    tx: signal::Sender<Arc<AgentConfig>>,
    shared: Arc<Shared>,
) {
    let mut interval = tokio::time::interval(CONFIG_POLL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        // Resolved on every read: with no --config, the file may appear at Armory's path.
        let path = options.config_path();
        let problem = match options.read_config() {
            Ok(files) if !files.is_missing() => {
                if state.unreadable {
                    state.unreadable = false;
                    tracing::info!(path = %path.display(), "the config file is readable again");
                    let problem = state.last_problem.clone();
                    shared.update(|view| view.config.problem = problem);
                }
                if files == state.last_files {
                    continue;
                }
                state.last_files = files;
                match options.parse_files(&state.last_files) {
                    Ok(parsed) => {
                        tracing::info!(path = %path.display(), "config file changed; applying it");
                        shared.metrics.config_reloads.inc();
                        state.last_problem = None;
                        shared.update(|view| view.config.problem = None);
                        report_ignored_keys(&path, &parsed, &shared);
                        if tx.send(Arc::new(parsed.config)).is_err() {
                            return;
                        }
                    }
                    Err(error) => {
                        shared.metrics.config_errors.inc();
                        let error = crate::error::Chain(&error).to_string();
                        tracing::error!(%error, "config file changed but is invalid; keeping the current config until it is fixed");
                        let problem = format!("{error}; keeping the previous config");
                        state.last_problem = Some(problem.clone());
                        shared.update(|view| view.config.problem = Some(problem));
                    }
                }
                continue;
            }
            Ok(_) => format!(
                "the config file {} does not exist (deleted, or its ConfigMap unmounted); keeping the last good config until it is back",
                path.display()
            ),
            Err(error) => format!(
                "{}; keeping the last good config until it can be read",
                crate::error::Chain(&error)
            ),
        };
        if !state.unreadable {
            state.unreadable = true;
            shared.metrics.config_errors.inc();
            tracing::warn!(path = %path.display(), "{problem}");
            shared.update(|view| view.config.problem = Some(problem));
        }
    }
}
