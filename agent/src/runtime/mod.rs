//! The agent's runtime: owns the accounts and one outbound gRPC stream to the hub,
//! reconnected with jittered exponential backoff.
//!
//! Per stream it connects, sends Hello, waits for Welcome and registers every prepared
//! account (`Runtime::open`), then acts on what the hub sends (`Runtime::stream`):
//! assignments (STREAMING starts a streamer with the hub's resume points, STANDBY and
//! REJECTED stop it), acknowledgements and operations. Heartbeats go every period; a hub
//! silent for two periods is dead. When the stream ends every watch stops; they resume from
//! the hub's resume points on the next stream. Config changes add, re-prepare or remove
//! accounts, connected or not.
//!
//! This module holds the state and the reconnect loop; `Runtime`'s other methods live by
//! job in the child modules: `stream` (one stream: handshake, loop, the hub's messages),
//! `accounts` (the accounts' lifecycle and what the hub hears of them), `operations`
//! (the hub's operations), `renewal` (the client certificate's renewal) and `drain` (the
//! stream's graceful end on shutdown).

mod accounts;
mod drain;
mod operations;
mod renewal;
mod stream;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use scale_agent_crds::agent_config::{AccountConfig, AgentConfig};
use tokio::{
    sync::{Semaphore, mpsc, watch},
    task::JoinHandle,
    time::Instant,
};
use tokio_stream::wrappers::WatchStream;

use crate::{
    account::Prepared,
    backoff::Backoff,
    config::Options,
    dynamic_accounts::DynamicAccounts,
    enrolment::CertificateFiles,
    error::{Error, Result},
    hub_conn::describe_hub_error,
    state::{self, Shared},
};

/// A stream that lasted this long resets the reconnect backoff.
pub const STABLE_STREAM: Duration = Duration::from_secs(30);
/// Largest message the agent decodes from the hub: well above the largest operation the hub
/// takes by default (its --max-request-bytes, 8 MiB, of manifests).
pub const MAX_HUB_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
pub use drain::DEFAULT_DRAIN_TIMEOUT_SECONDS;

/// Completes when `shutdown` turns true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// How preparing an account (client and cluster identity) went, for the config generation
/// it was made: prepared, or why not (it is tried again).
struct Prep {
    account: String,
    generation: u64,
    outcome: std::result::Result<Arc<Prepared>, String>,
}

struct Entry {
    config: AccountConfig,
    generation: u64,
    prepared: Option<Arc<Prepared>>,
    preparing: Option<JoinHandle<()>>,
    streamer: Option<JoinHandle<()>>,
    /// Runs the hub's operations for this account, once prepared.
    executor: Option<Arc<crate::operations::Executor>>,
    /// Generation of the running streamer; 0 when none, so stale messages are dropped.
    stream_generation: u64,
    /// Why the account could not be prepared last (cleared once it is): the hub is told
    /// (AccountUnavailable), so the account shows FAILED there.
    failure: Option<String>,
}

impl Entry {
    fn stop_streaming(&mut self) {
        if let Some(streamer) = self.streamer.take() {
            streamer.abort();
        }
        self.stream_generation = 0;
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.stop_streaming();
        if let Some(preparing) = self.preparing.take() {
            preparing.abort();
        }
    }
}

/// How a stream ended.
enum End {
    Shutdown,
    HubChanged,
    Failed { welcomed: bool, error: Error },
}

/// Owns the accounts and the connection to the hub.
pub struct Runtime {
    options: Options,
    shared: Arc<Shared>,
    config_rx: watch::Receiver<Arc<AgentConfig>>,
    /// The config in use: the file's, plus the hub's dynamic accounts.
    config: Arc<AgentConfig>,
    /// The config file's, as last read.
    file_config: Arc<AgentConfig>,
    /// The accounts the hub pushed.
    dynamic: DynamicAccounts,
    accounts: BTreeMap<String, Entry>,
    total_budget: Arc<Semaphore>,
    /// The agent-wide ceiling of operations running at once; each account has its own
    /// limit under it.
    operations_total: Arc<Semaphore>,
    next_generation: u64,
    prep_tx: mpsc::UnboundedSender<Prep>,
    inputs: Option<Inputs>,
    /// Accounts removed while no stream was up, unregistered on the next stream.
    unregister_pending: BTreeSet<String>,
    /// The session token of the last stream's Welcome, presented in the next Hello.
    session_token: String,
    /// A renewal asked for on the current stream: where the certificate goes, and the new
    /// key it is for.
    renewal: Option<(CertificateFiles, String)>,
}

/// What the runtime waits on besides the hub (kept apart so `select!` can borrow them
/// while the handlers borrow the runtime).
struct Inputs {
    shutdown: watch::Receiver<bool>,
    configs: WatchStream<Arc<AgentConfig>>,
    prep_rx: mpsc::UnboundedReceiver<Prep>,
}

impl Runtime {
    /// A runtime for the config `config_rx` holds (and every later one), until `shutdown`
    /// turns true. Nothing runs before [`Runtime::run`].
    pub fn new(
        options: Options,
        shared: Arc<Shared>,
        config_rx: watch::Receiver<Arc<AgentConfig>>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let config = config_rx.borrow().clone();
        let (prep_tx, prep_rx) = mpsc::unbounded_channel();
        Self {
            options,
            shared,
            total_budget: crate::budget::total(config.tasks.total_budget),
            operations_total: crate::budget::total(config.tasks.operations_total),
            inputs: Some(Inputs {
                shutdown,
                configs: WatchStream::from_changes(config_rx.clone()),
                prep_rx,
            }),
            config_rx,
            config: Arc::new(AgentConfig::default()),
            file_config: Arc::new(AgentConfig::default()),
            dynamic: DynamicAccounts::default(),
            accounts: BTreeMap::new(),
            next_generation: 1,
            prep_tx,
            unregister_pending: BTreeSet::new(),
            session_token: String::new(),
            renewal: None,
        }
    }

    fn generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// Connects, streams, and reconnects until shut down.
    pub async fn run(mut self) -> Result<()> {
        let Some(mut inputs) = self.inputs.take() else {
            return Err(Error::Protocol("the runtime was started twice".into()));
        };
        let initial = self.config_rx.borrow().clone();
        self.apply_config(initial, None).await;
        let mut backoff = Backoff::from_config(&self.config.clouddriver.backoff);
        let mut first = true;
        loop {
            let stopping = *inputs.shutdown.borrow();
            if stopping {
                return Ok(());
            }
            if !first {
                self.shared.metrics.reconnects.inc();
            }
            first = false;
            let started = Instant::now();
            let end = self.session(&mut inputs).await;
            self.end_session();
            let error = match end {
                End::Shutdown => return Ok(()),
                End::HubChanged => {
                    tracing::info!("hub settings changed; reconnecting");
                    backoff = Backoff::from_config(&self.config.clouddriver.backoff);
                    continue;
                }
                End::Failed { welcomed, error } => {
                    if welcomed && started.elapsed() >= STABLE_STREAM {
                        backoff.reset();
                    }
                    let mut text = describe_hub_error(&error);
                    // A hub that refuses the client certificate often closes the connection
                    // before its TLS alert is read, leaving only "connection closed".
                    if !welcomed && !self.config.clouddriver.plaintext() && !text.contains(" (") {
                        text.push_str(" (the hub closed the connection before welcoming this agent: if this repeats, check that the hub trusts the agent's client certificate (its --client-ca) and that the agent trusts the hub's (clouddriver.tls.cacertFile))");
                    }
                    text
                }
            };
            self.shared
                .update(|view| view.hub_error = Some(error.clone()));
            let delay = backoff.next_delay();
            tracing::warn!(hub = %self.config.clouddriver.grpc, %error, "hub stream ended; reconnecting in {:.1} s", delay.as_secs_f64());
            let sleep = tokio::time::sleep(delay);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => break,
                    _ = stopped(&mut inputs.shutdown) => return Ok(()),
                    Some(config) = inputs.configs.next() => {
                        if self.apply_config(config, None).await {
                            backoff = Backoff::from_config(&self.config.clouddriver.backoff);
                            break;
                        }
                    }
                    Some(prep) = inputs.prep_rx.recv() => {
                        let _ = self.prepared(prep, None).await;
                    }
                }
            }
        }
    }

    fn end_session(&mut self) {
        for entry in self.accounts.values_mut() {
            entry.stop_streaming();
        }
        let metrics = &self.shared.metrics;
        metrics.hub_connected.set(0);
        metrics.unacked.set(0);
        for name in self.accounts.keys() {
            metrics
                .account_streaming
                .get_or_create(&crate::metrics::AccountLabels {
                    account: name.clone(),
                })
                .set(0);
        }
        self.shared.update(|view| {
            view.hub_connected = false;
            view.hub_replicas.clear();
            for account in &mut view.accounts {
                if account.role != state::ROLE_REJECTED {
                    account.role = state::ROLE_PENDING.into();
                }
                account.kinds.clear();
                account.kinds_started = false;
                // The hub's word no longer holds without a stream.
                account.hub_state = None;
            }
        });
    }
}
