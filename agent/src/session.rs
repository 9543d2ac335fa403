//! The hub session: one outbound gRPC stream, reconnected with jittered exponential backoff.
//!
//! The runtime owns the accounts. Per stream it sends Hello, waits for Welcome, registers
//! every prepared account and acts on assignments (STREAMING starts a streamer with the
//! hub's resume points, STANDBY and REJECTED stop it). Messages carry sequence numbers from
//! 1; at most `Welcome.max_unacked` stay unacknowledged, and while at that limit the watches'
//! bounded channel is not read, so a slow hub slows the watches. Heartbeats go every period;
//! a hub silent for two periods is dead. When the stream ends every watch stops; they resume
//! from the hub's resume points on the next stream.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::StreamExt;
use prost::Message as _;
use scale_agent_crds::agent_config::{AccountConfig, AgentConfig, HubConnection};
use scale_agent_proto::v1::{
    self, AgentMessage, HubMessage, account_assignment::Role, agent_hub_client::AgentHubClient,
    agent_message, hub_message,
};
use tokio::{
    sync::{Semaphore, mpsc, watch},
    task::JoinHandle,
    time::Instant,
};
use tokio_stream::wrappers::{ReceiverStream, WatchStream};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::{
    account::{self, Prepared},
    backoff::Backoff,
    config::{Options, diff_accounts},
    error::{Error, Result},
    state::{self, ClusterView, Shared},
    streamer::{self, StreamerContext},
    watch::Outbound,
};

/// Capabilities announced in Hello.
pub const CAPABILITIES: &[&str] = &[
    "resume",
    "bookmarks",
    "truncated-objects",
    "secrets-metadata-only",
    "operations",
    "http-tunnel",
];
/// Used when Welcome leaves max_unacked at 0.
pub const DEFAULT_MAX_UNACKED: u64 = 1000;
/// Capacity of the channel from the watches to the session.
pub const EVENT_CHANNEL: usize = 256;
/// A stream that lasted this long resets the reconnect backoff.
pub const STABLE_STREAM: Duration = Duration::from_secs(30);
const WELCOME_TIMEOUT: Duration = Duration::from_secs(30);

/// The hub's URL for `address` (`host:port`, or a URL whose scheme is replaced).
pub fn hub_url(address: &str, insecure: bool) -> String {
    let rest = address
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let scheme = if insecure { "http" } else { "https" };
    format!("{scheme}://{rest}")
}

fn read(what: &'static str, path: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::ReadFile {
        what,
        path: path.into(),
        source,
    })
}

/// TLS settings for the hub, read from disk now (so rotated files are picked up on every
/// reconnect). Without a CA file the hub is verified against the public web PKI roots
/// compiled into the agent (a hub behind a publicly trusted load balancer), which does not
/// depend on what the container image ships in /etc/ssl.
pub fn tls_config(hub: &HubConnection, host: &str) -> Result<ClientTlsConfig> {
    let server_name = hub
        .tls
        .server_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| host.to_string());
    let mut tls = ClientTlsConfig::new().domain_name(server_name);
    tls = match hub.tls.cacert_file.as_deref() {
        Some(ca_file) => tls.ca_certificate(Certificate::from_pem(read("hub CA", ca_file)?)),
        None => tls.with_webpki_roots(),
    };
    match (&hub.tls.client_cert_file, &hub.tls.client_key_file) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(
                read("client certificate", cert)?,
                read("client key", key)?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(Error::InvalidConfig(
                "set both clouddriver.tls.clientCertFile and clientKeyFile (or --tls-cert and --tls-key), or neither".into(),
            ));
        }
    }
    Ok(tls)
}

/// Opens the gRPC channel to the hub.
pub async fn connect(hub: &HubConnection) -> Result<Channel> {
    let url = hub_url(&hub.grpc, hub.insecure);
    let address_error = |message: String| Error::HubAddress {
        address: hub.grpc.clone(),
        message,
    };
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| address_error(e.to_string()))?
        .connect_timeout(Duration::from_secs(10))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true);
    if !hub.insecure {
        let host = endpoint
            .uri()
            .host()
            .map(str::to_string)
            .ok_or_else(|| address_error("no host".into()))?;
        endpoint = endpoint
            .tls_config(tls_config(hub, &host)?)
            .map_err(|source| Error::Connect {
                address: url.clone(),
                source,
            })?;
    }
    endpoint.connect().await.map_err(|source| Error::Connect {
        address: url,
        source,
    })
}

/// An error on the hub connection as one line: every cause in its source chain (tonic's own
/// message is only "transport error"), and for the usual TLS mistakes, what to change.
/// With TLS 1.3 a client certificate the hub refuses surfaces on the first read of the
/// stream, not at connect, so this describes every way a stream ends.
pub fn describe_hub_error(error: &(dyn std::error::Error + 'static)) -> String {
    let mut causes = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !causes.iter().any(|known| known.contains(&text)) {
            causes.push(text);
        }
        source = cause.source();
    }
    let chain = causes.join(": ");
    let lower = chain.to_ascii_lowercase();
    let hint = if lower.contains("unknownissuer") || lower.contains("unknown issuer") {
        Some(
            "the hub's certificate is not signed by the CA this agent trusts: set clouddriver.tls.cacertFile (--hub-ca) to the CA that signed it",
        )
    } else if lower.contains("notvalidforname") || lower.contains("not valid for name") {
        Some(
            "the hub's certificate does not name the host dialled: set clouddriver.tls.serverName (--hub-server-name) to a name in it",
        )
    } else if lower.contains("certificaterequired") || lower.contains("certificate required") {
        Some(
            "the hub requires a client certificate: set clouddriver.tls.clientCertFile and clientKeyFile (--tls-cert, --tls-key)",
        )
    } else if lower.contains("unknownca")
        || lower.contains("unknown ca")
        || lower.contains("badcertificate")
        || lower.contains("bad certificate")
    {
        Some(
            "the hub refused this agent's client certificate: it must be signed by the CA the hub trusts (the hub's --client-ca)",
        )
    } else if lower.contains("expired") {
        Some(
            "a certificate has expired: renew the agent's client certificate or the hub's serving certificate",
        )
    } else if lower.contains("connection refused") {
        Some(
            "nothing listens at the hub address: check clouddriver.grpc (--hub) and that the hub runs",
        )
    } else {
        None
    };
    match hint {
        Some(hint) => format!("{chain} ({hint})"),
        None => chain,
    }
}

/// Reads the hub's first messages up to Welcome; heartbeats before it are tolerated.
async fn await_welcome(inbound: &mut tonic::Streaming<HubMessage>) -> Result<v1::Welcome> {
    loop {
        match inbound.next().await {
            Some(Ok(HubMessage {
                kind: Some(hub_message::Kind::Welcome(welcome)),
            })) => return Ok(welcome),
            Some(Ok(HubMessage {
                kind: Some(hub_message::Kind::Heartbeat(_)),
            })) => {}
            Some(Ok(other)) => {
                return Err(Error::Protocol(format!(
                    "expected Welcome first, got {other:?}"
                )));
            }
            Some(Err(status)) => return Err(Error::Stream(status)),
            None => {
                return Err(Error::Protocol(
                    "the hub closed the stream before Welcome".into(),
                ));
            }
        }
    }
}

/// Completes when `shutdown` turns true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// The sending half of one stream: sequence numbers and acknowledgements.
struct Session {
    tx: mpsc::Sender<AgentMessage>,
    seq: u64,
    acked: u64,
    max_unacked: u64,
    max_object_bytes: u64,
    events_tx: mpsc::Sender<Outbound>,
    shared: Arc<Shared>,
    /// Results of operations, sent as they finish.
    results_tx: mpsc::Sender<v1::OperationResult>,
    /// Operations running for this stream; dropped (aborted) with it.
    operations: tokio::task::JoinSet<()>,
    /// Tunnelled HTTP exchanges of the hub's Kubernetes API proxy; dropped (aborted) with
    /// the stream.
    tunnel: crate::tunnel::Tunnel,
}

impl Session {
    fn unacked(&self) -> u64 {
        self.seq.saturating_sub(self.acked)
    }

    async fn send(&mut self, kind: agent_message::Kind) -> Result<()> {
        self.seq += 1;
        let message = AgentMessage {
            seq: self.seq,
            kind: Some(kind),
        };
        let metrics = &self.shared.metrics;
        metrics.bytes_sent.inc_by(message.encoded_len() as u64);
        metrics.messages_sent.inc();
        metrics
            .unacked
            .set(i64::try_from(self.unacked()).unwrap_or(i64::MAX));
        self.tx
            .send(message)
            .await
            .map_err(|_| Error::Protocol("the stream to the hub closed".into()))
    }

    fn ack(&mut self, seq: u64) {
        self.acked = self.acked.max(seq.min(self.seq));
        self.shared
            .metrics
            .unacked
            .set(i64::try_from(self.unacked()).unwrap_or(i64::MAX));
    }
}

/// A prepared account (client and cluster identity), for the config generation it was made.
struct Prep {
    account: String,
    generation: u64,
    prepared: Arc<Prepared>,
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
    config: Arc<AgentConfig>,
    accounts: BTreeMap<String, Entry>,
    total_budget: Arc<Semaphore>,
    /// Bounds the operations running at once.
    operation_budget: Arc<Semaphore>,
    next_generation: u64,
    prep_tx: mpsc::UnboundedSender<Prep>,
    inputs: Option<Inputs>,
    /// Accounts removed while no stream was up, unregistered on the next stream.
    unregister_pending: BTreeSet<String>,
}

/// What the runtime waits on besides the hub (kept apart so `select!` can borrow them
/// while the handlers borrow the runtime).
struct Inputs {
    shutdown: watch::Receiver<bool>,
    configs: WatchStream<Arc<AgentConfig>>,
    prep_rx: mpsc::UnboundedReceiver<Prep>,
}

impl Runtime {
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
            operation_budget: Arc::new(Semaphore::new(crate::operations::CONCURRENCY)),
            inputs: Some(Inputs {
                shutdown,
                configs: WatchStream::from_changes(config_rx.clone()),
                prep_rx,
            }),
            config_rx,
            config: Arc::new(AgentConfig::default()),
            accounts: BTreeMap::new(),
            next_generation: 1,
            prep_tx,
            unregister_pending: BTreeSet::new(),
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
                    if !welcomed && !self.config.clouddriver.insecure && !text.contains(" (") {
                        text.push_str(" (the hub closed the connection before welcoming this agent: if this repeats, check that the hub trusts the agent's client certificate (its --client-ca) and that the agent trusts the hub's (clouddriver.tls.cacertFile))");
                    }
                    text
                }
            };
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
            for account in &mut view.accounts {
                if account.role != state::ROLE_REJECTED {
                    account.role = state::ROLE_PENDING.into();
                }
                account.kinds.clear();
                account.kinds_started = false;
            }
        });
    }

    async fn session(&mut self, inputs: &mut Inputs) -> End {
        let failed = |welcomed: bool| move |error: Error| End::Failed { welcomed, error };
        let hub = self.config.clouddriver.clone();
        let channel = tokio::select! {
            channel = connect(&hub) => match channel {
                Ok(channel) => channel,
                Err(error) => return failed(false)(error),
            },
            _ = stopped(&mut inputs.shutdown) => return End::Shutdown,
        };
        let (tx, rx) = mpsc::channel::<AgentMessage>(64);
        let (events_tx, mut events_rx) = mpsc::channel::<Outbound>(EVENT_CHANNEL);
        let (results_tx, mut results_rx) =
            mpsc::channel::<v1::OperationResult>(crate::operations::CONCURRENCY);
        let mut session = Session {
            tx: tx.clone(),
            seq: 0,
            acked: 0,
            max_unacked: DEFAULT_MAX_UNACKED,
            max_object_bytes: 0,
            events_tx,
            shared: self.shared.clone(),
            results_tx,
            operations: tokio::task::JoinSet::new(),
            tunnel: crate::tunnel::Tunnel::new(
                tx.clone(),
                crate::tunnel::DEFAULT_WINDOW_BYTES,
                self.shared.clone(),
            ),
        };
        let hello = agent_message::Kind::Hello(v1::Hello {
            replica: self.options.replica_name(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            capabilities: CAPABILITIES.iter().map(|c| c.to_string()).collect(),
        });
        if let Err(error) = session.send(hello).await {
            return failed(false)(error);
        }
        let mut client = AgentHubClient::new(channel);
        let response = tokio::select! {
            response = tokio::time::timeout(WELCOME_TIMEOUT, client.session(ReceiverStream::new(rx))) => response,
            _ = stopped(&mut inputs.shutdown) => return End::Shutdown,
        };
        let mut inbound = match response {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => return failed(false)(Error::Stream(status)),
            Err(_) => {
                return failed(false)(Error::Protocol(format!(
                    "the hub did not answer within {} s",
                    WELCOME_TIMEOUT.as_secs()
                )));
            }
        };
        let welcome = tokio::select! {
            welcome = tokio::time::timeout(WELCOME_TIMEOUT, await_welcome(&mut inbound)) => match welcome {
                Ok(Ok(welcome)) => welcome,
                Ok(Err(error)) => return failed(false)(error),
                Err(_) => return failed(false)(Error::Protocol(format!("no Welcome within {} s", WELCOME_TIMEOUT.as_secs()))),
            },
            _ = stopped(&mut inputs.shutdown) => return End::Shutdown,
        };
        if welcome.max_unacked > 0 {
            session.max_unacked = u64::from(welcome.max_unacked);
        }
        session.max_object_bytes = welcome.max_object_bytes;
        session.tunnel = crate::tunnel::Tunnel::new(
            session.tx.clone(),
            welcome.tunnel_window_bytes,
            self.shared.clone(),
        );
        let period_secs = match welcome.heartbeat_period_seconds {
            0 => self.config.clouddriver.keep_alive_heartbeat_seconds.max(1),
            secs => secs,
        };
        let period = Duration::from_secs(u64::from(period_secs));
        tracing::info!(hub = %hub.grpc, identity = %welcome.identity, hub_version = %welcome.hub_version,
            max_unacked = session.max_unacked, heartbeat_seconds = period_secs, "connected to the hub");
        self.shared.metrics.hub_connected.set(1);
        self.shared.update(|view| {
            view.hub_connected = true;
            view.hub_identity = welcome.identity.clone();
        });

        // Accounts removed from the config while disconnected.
        for name in std::mem::take(&mut self.unregister_pending) {
            let unregister =
                agent_message::Kind::UnregisterAccount(v1::UnregisterAccount { account: name });
            if let Err(error) = session.send(unregister).await {
                return failed(true)(error);
            }
        }
        let names: Vec<String> = self.accounts.keys().cloned().collect();
        for name in names {
            if let Err(error) = self.register(&name, &mut session).await {
                return failed(true)(error);
            }
        }

        let mut heartbeat = tokio::time::interval_at(Instant::now() + period, period);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_heard = Instant::now();
        loop {
            let open = session.unacked() < session.max_unacked;
            tokio::select! {
                biased;
                _ = stopped(&mut inputs.shutdown) => return End::Shutdown,
                message = inbound.next() => {
                    let result = match message {
                        None => Err(Error::Protocol("the hub closed the stream".into())),
                        Some(Err(status)) => Err(Error::Stream(status)),
                        Some(Ok(message)) => {
                            last_heard = Instant::now();
                            self.handle(message, &mut session).await
                        }
                    };
                    if let Err(error) = result {
                        return failed(true)(error);
                    }
                }
                _ = heartbeat.tick() => {
                    if last_heard.elapsed() > period * 2 {
                        return failed(true)(Error::Protocol(format!(
                            "the hub sent nothing for {} s (two heartbeat periods)", last_heard.elapsed().as_secs()
                        )));
                    }
                    let beat = agent_message::Kind::Heartbeat(v1::Heartbeat { sent_at_unix_millis: now_millis() });
                    if let Err(error) = session.send(beat).await {
                        return failed(true)(error);
                    }
                }
                Some(result) = results_rx.recv() => {
                    if let Err(error) = session.send(agent_message::Kind::OperationResult(result)).await {
                        return failed(true)(error);
                    }
                }
                Some(_) = session.operations.join_next(), if !session.operations.is_empty() => {}
                Some(outbound) = events_rx.recv(), if open => {
                    let current = self
                        .accounts
                        .get(&outbound.account)
                        .is_some_and(|entry| entry.stream_generation == outbound.generation);
                    if current {
                        let is_object = matches!(outbound.message, agent_message::Kind::Object(_));
                        if let Err(error) = session.send(outbound.message).await {
                            return failed(true)(error);
                        }
                        if is_object {
                            self.shared.metrics.events_sent
                                .get_or_create(&crate::metrics::AccountLabels { account: outbound.account })
                                .inc();
                        }
                    }
                }
                Some(config) = inputs.configs.next() => {
                    if self.apply_config(config, Some(&mut session)).await {
                        return End::HubChanged;
                    }
                }
                Some(prep) = inputs.prep_rx.recv() => {
                    if let Err(error) = self.prepared(prep, Some(&mut session)).await {
                        return failed(true)(error);
                    }
                }
            }
        }
    }

    async fn handle(&mut self, message: HubMessage, session: &mut Session) -> Result<()> {
        match message.kind {
            Some(hub_message::Kind::Ack(ack)) => session.ack(ack.seq),
            Some(hub_message::Kind::Assignment(assignment)) => self.assign(assignment, session),
            Some(hub_message::Kind::Operation(operation)) => self.operate(operation, session),
            Some(hub_message::Kind::Tunnel(frame)) => {
                let accounts = &self.accounts;
                session.tunnel.handle(frame, |account| {
                    accounts
                        .get(account)
                        .and_then(|entry| entry.prepared.as_ref())
                        .map(|prepared| prepared.proxy_client.clone())
                });
            }
            Some(hub_message::Kind::Heartbeat(_)) | Some(hub_message::Kind::Welcome(_)) | None => {}
        }
        Ok(())
    }

    /// Starts an operation; its result goes back on this stream when it finishes.
    fn operate(&mut self, operation: v1::Operation, session: &mut Session) {
        let replica = self.options.replica_name();
        let executor = self
            .accounts
            .get(&operation.account)
            .map(|entry| entry.executor.clone());
        let tx = session.results_tx.clone();
        let executor = match executor {
            Some(Some(executor)) => executor,
            found => {
                let (code, reason, message) = if found.is_none() {
                    (
                        404,
                        "NotFound",
                        format!(
                            "this agent (replica {replica}) does not serve account {:?}",
                            operation.account
                        ),
                    )
                } else {
                    (
                        503,
                        "ServiceUnavailable",
                        format!(
                            "account {:?} is not ready on replica {replica}: its credentials are still loading",
                            operation.account
                        ),
                    )
                };
                let result =
                    crate::operations::refused(&operation, &replica, code, reason, message);
                session.operations.spawn(async move {
                    let _ = tx.send(result).await;
                });
                return;
            }
        };
        tracing::info!(account = %operation.account, id = %operation.id,
            r#type = operation.op.as_ref().map(scale_agent_proto::v1::operation::Op::name).unwrap_or("none"), "operation received");
        let shared = self.shared.clone();
        session.operations.spawn(async move {
            let metrics = &shared.metrics;
            let kind = operation
                .op
                .as_ref()
                .map(scale_agent_proto::v1::operation::Op::name)
                .unwrap_or("none");
            let account = operation.account.clone();
            // Decremented on drop too: the task is aborted when the stream ends.
            struct Running<'a>(&'a prometheus_client::metrics::gauge::Gauge);
            impl Drop for Running<'_> {
                fn drop(&mut self) {
                    self.0.dec();
                }
            }
            metrics.operations_running.inc();
            let running = Running(&metrics.operations_running);
            let result = executor.execute(operation).await;
            drop(running);
            let outcome = match result.status.as_ref().map(|s| s.code) {
                _ if result.ok => "succeeded",
                Some(504) => "timedOut",
                _ => "failed",
            };
            metrics
                .operations
                .get_or_create(&crate::metrics::OperationLabels {
                    account,
                    r#type: kind.into(),
                    outcome: outcome.into(),
                })
                .inc();
            let _ = tx.send(result).await;
        });
    }

    fn assign(&mut self, assignment: v1::AccountAssignment, session: &Session) {
        let name = assignment.account.clone();
        let generation = self.generation();
        let Some(entry) = self.accounts.get_mut(&name) else {
            tracing::warn!(account = %name, "assignment for an account this agent does not serve; ignored");
            return;
        };
        entry.stop_streaming();
        let role = Role::try_from(assignment.role).unwrap_or(Role::Unspecified);
        let labels = crate::metrics::AccountLabels {
            account: name.clone(),
        };
        let metrics = &self.shared.metrics;
        metrics
            .account_rejected
            .get_or_create(&labels)
            .set(i64::from(role == Role::Rejected));
        metrics
            .account_streaming
            .get_or_create(&labels)
            .set(i64::from(role == Role::Streaming));
        let role_name = match role {
            Role::Streaming => state::ROLE_STREAMING,
            Role::Standby => state::ROLE_STANDBY,
            Role::Rejected => state::ROLE_REJECTED,
            Role::Unspecified => state::ROLE_PENDING,
        };
        self.shared.update_account(&name, |view| {
            view.role = role_name.into();
            view.rejection_reason = (role == Role::Rejected).then(|| assignment.reason.clone());
            view.kinds.clear();
            view.kinds_started = false;
        });
        match role {
            Role::Streaming => {
                let Some(prepared) = entry.prepared.clone() else {
                    tracing::warn!(account = %name, "STREAMING assignment for an account not prepared; ignored");
                    return;
                };
                tracing::info!(account = %name, resume_points = assignment.resume_points.len(), "streaming this account");
                entry.stream_generation = generation;
                entry.streamer = Some(tokio::spawn(streamer::run(StreamerContext {
                    account: entry.config.clone(),
                    prepared,
                    generation,
                    tx: session.events_tx.clone(),
                    shared: self.shared.clone(),
                    total_budget: self.total_budget.clone(),
                    budget_per_account: self.config.tasks.budget_per_account,
                    max_object_bytes: session.max_object_bytes,
                    resume_points: assignment.resume_points,
                    rediscover: Duration::from_secs(self.options.rediscover_seconds.max(1)),
                })));
            }
            Role::Standby => {
                tracing::info!(account = %name, "standby: another replica streams this account");
            }
            Role::Rejected => {
                tracing::error!(account = %name, reason = %assignment.reason,
                    "the hub rejected this account; it is not streamed until the config changes or the agent reconnects");
            }
            Role::Unspecified => {
                tracing::warn!(account = %name, role = assignment.role, "assignment with an unknown role; ignored");
            }
        }
    }

    async fn register(&mut self, name: &str, session: &mut Session) -> Result<()> {
        let Some(entry) = self.accounts.get(name) else {
            return Ok(());
        };
        let Some(prepared) = &entry.prepared else {
            return Ok(());
        };
        let register = v1::RegisterAccount {
            account: name.to_string(),
            cluster: Some(prepared.cluster.clone()),
            namespaces: entry.config.namespaces.clone(),
            properties_json: serde_json::to_vec(&entry.config).unwrap_or_default(),
        };
        self.shared.update_account(name, |view| {
            view.role = state::ROLE_PENDING.into();
            view.rejection_reason = None;
        });
        tracing::info!(account = %name, "registering account");
        session
            .send(agent_message::Kind::RegisterAccount(register))
            .await
    }

    async fn prepared(&mut self, prep: Prep, session: Option<&mut Session>) -> Result<()> {
        let Some(entry) = self.accounts.get_mut(&prep.account) else {
            return Ok(());
        };
        if entry.generation != prep.generation {
            return Ok(());
        }
        entry.executor = Some(Arc::new(crate::operations::Executor::new(
            prep.account.clone(),
            self.options.replica_name(),
            prep.prepared.client.clone(),
            self.operation_budget.clone(),
        )));
        entry.prepared = Some(prep.prepared);
        entry.preparing = None;
        match session {
            Some(session) => self.register(&prep.account, session).await,
            None => Ok(()),
        }
    }

    fn spawn_prepare(&self, config: AccountConfig, generation: u64) -> JoinHandle<()> {
        let tx = self.prep_tx.clone();
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let name = config.name.clone();
            let mut backoff = Backoff::for_retries();
            loop {
                match account::prepare(&config).await {
                    Ok(prepared) => {
                        tracing::info!(account = %name, api_server = %prepared.cluster.api_server_host,
                            version = %prepared.cluster.kubernetes_version, "account credentials loaded");
                        shared.update_account(&name, |view| {
                            view.error = None;
                            view.cluster = Some(ClusterView {
                                api_server_host: prepared.cluster.api_server_host.clone(),
                                ca_fingerprint: prepared.cluster.ca_fingerprint.clone(),
                                kubernetes_version: prepared.cluster.kubernetes_version.clone(),
                            });
                        });
                        let _ = tx.send(Prep {
                            account: name,
                            generation,
                            prepared: Arc::new(prepared),
                        });
                        return;
                    }
                    Err(error) => {
                        let delay = backoff.next_delay();
                        tracing::warn!(account = %name, %error, "account not usable; retrying in {:.1} s", delay.as_secs_f64());
                        shared.update_account(&name, |view| view.error = Some(error.to_string()));
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        })
    }

    /// Applies the latest config: accounts added, changed (re-prepared and re-registered)
    /// or removed (watches stopped, UnregisterAccount sent). True when the hub settings
    /// changed, which needs a new stream.
    async fn apply_config(
        &mut self,
        new: Arc<AgentConfig>,
        mut session: Option<&mut Session>,
    ) -> bool {
        let hub_changed = new.clouddriver != self.config.clouddriver;
        let diff = diff_accounts(&self.config.kubernetes.accounts, &new.kubernetes.accounts);
        self.config = new;
        for name in diff.removed {
            tracing::info!(account = %name, "account removed from the config; stopping its watches");
            self.accounts.remove(&name);
            self.shared.remove_account(&name);
            let labels = crate::metrics::AccountLabels {
                account: name.clone(),
            };
            self.shared
                .metrics
                .account_streaming
                .get_or_create(&labels)
                .set(0);
            self.shared
                .metrics
                .account_rejected
                .get_or_create(&labels)
                .set(0);
            match session.as_deref_mut() {
                Some(session) => {
                    let unregister =
                        agent_message::Kind::UnregisterAccount(v1::UnregisterAccount {
                            account: name.clone(),
                        });
                    if session.send(unregister).await.is_err() {
                        // The stream is gone: tell the next one.
                        self.unregister_pending.insert(name);
                    }
                }
                None => {
                    self.unregister_pending.insert(name);
                }
            }
        }
        for config in diff.added.into_iter().chain(diff.changed) {
            let name = config.name.clone();
            tracing::info!(account = %name, "account added or changed; (re)loading its credentials");
            let generation = self.generation();
            self.unregister_pending.remove(&name);
            // Replacing the entry drops the old one, which stops its watches.
            self.accounts.remove(&name);
            self.shared.update_account(&name, |view| {
                view.role = state::ROLE_PENDING.into();
                view.rejection_reason = None;
                view.kinds.clear();
                view.kinds_started = false;
            });
            let preparing = self.spawn_prepare(config.clone(), generation);
            self.accounts.insert(
                name,
                Entry {
                    config,
                    generation,
                    prepared: None,
                    preparing: Some(preparing),
                    streamer: None,
                    executor: None,
                    stream_generation: 0,
                },
            );
        }
        hub_changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_urls_take_the_scheme_from_the_tls_setting() {
        assert_eq!(hub_url("hub:9091", false), "https://hub:9091");
        assert_eq!(hub_url("hub:9091", true), "http://hub:9091");
        assert_eq!(
            hub_url("https://hub.example:443/", true),
            "http://hub.example:443"
        );
    }

    #[test]
    fn hub_errors_name_every_cause_and_say_what_to_change() {
        #[derive(Debug)]
        struct Layer(&'static str, Option<Box<Layer>>);
        impl std::fmt::Display for Layer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Layer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|l| l as _)
            }
        }
        let error = Layer(
            "transport error",
            Some(Box::new(Layer(
                "invalid peer certificate: UnknownIssuer",
                None,
            ))),
        );
        let text = describe_hub_error(&error);
        assert!(
            text.starts_with("transport error: invalid peer certificate: UnknownIssuer"),
            "{text}"
        );
        assert!(
            text.contains("set clouddriver.tls.cacertFile (--hub-ca)"),
            "{text}"
        );
        let refused = Layer("received fatal alert: UnknownCA", None);
        assert!(describe_hub_error(&refused).contains("the hub's --client-ca"));
        assert_eq!(
            describe_hub_error(&Layer("stream reset", None)),
            "stream reset"
        );
    }

    #[test]
    fn tls_uses_the_ca_file_or_public_roots_and_needs_both_halves_of_the_identity() {
        let mut hub = HubConnection::default();
        // No CA file: the public roots compiled in.
        assert!(tls_config(&hub, "hub").is_ok());
        hub.tls.cacert_file = Some("/nonexistent/ca.pem".into());
        let err = tls_config(&hub, "hub")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
        let dir = std::env::temp_dir().join(format!("scale-agent-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["hub".into()]).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, cert.cert.pem()).unwrap();
        hub.tls.cacert_file = Some(ca.display().to_string());
        assert!(tls_config(&hub, "hub").is_ok());
        hub.tls.client_cert_file = Some(ca.display().to_string());
        let err = tls_config(&hub, "hub")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("clientKeyFile"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
