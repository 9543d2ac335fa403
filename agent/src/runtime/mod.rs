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

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use scale_agent_crds::agent_config::{AccountConfig, AgentConfig};
use scale_agent_proto::v1::{
    self, HubMessage, account_assignment::Role, agent_hub_client::AgentHubClient, agent_message,
    hub_message,
};
use tokio::{
    sync::{Semaphore, mpsc, watch},
    task::JoinHandle,
    time::Instant,
};
use tokio_stream::wrappers::WatchStream;
use tracing::Instrument as _;

use crate::{
    account::{self, Prepared},
    backoff::Backoff,
    config::{Options, diff_accounts},
    dynamic_accounts::DynamicAccounts,
    enrolment::{self, CertificateFiles},
    error::{Error, Result},
    hub_conn::{WELCOME_TIMEOUT, await_welcome, connect, describe_hub_error},
    session::Session,
    state::{self, ClusterView, Shared},
    streamer::{self, StreamerContext},
    watch::Outbound,
};

/// A stream that lasted this long resets the reconnect backoff.
pub const STABLE_STREAM: Duration = Duration::from_secs(30);
/// Largest message the agent decodes from the hub: well above the largest operation the hub
/// takes by default (its --max-request-bytes, 8 MiB, of manifests).
pub const MAX_HUB_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Used when the hub's Welcome gives no heartbeat period (a hub that never does so is
/// broken; this keeps the stream alive anyway).
const FALLBACK_HEARTBEAT_SECONDS: u32 = 15;

/// The heartbeat period of a stream: the one the hub granted in Welcome (which it chose
/// within its bounds from `requested`, the agent's `keepAliveHeartbeatSeconds`), else what
/// the agent asked for, else 15 s.
fn granted_period(requested: u32, granted: u32) -> u32 {
    match (granted, requested) {
        (0, 0) => FALLBACK_HEARTBEAT_SECONDS,
        (0, requested) => requested,
        (granted, _) => granted,
    }
}

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

/// Resolves when an enrolled agent's certificate is due for renewal (never without one).
async fn sleep_until_renewal(renew: &Option<(CertificateFiles, Instant)>) {
    match renew {
        Some((_, at)) => tokio::time::sleep_until(*at).await,
        None => std::future::pending().await,
    }
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

/// What the stream loop needs once the handshake is done.
struct Open {
    session: Session,
    inbound: tonic::Streaming<HubMessage>,
    /// The heartbeat period agreed in Welcome.
    period: Duration,
    events: mpsc::Receiver<Outbound>,
    results: mpsc::Receiver<v1::OperationResult>,
    /// Enrolled agents: their certificate files, and when to renew the certificate.
    renew: Option<(CertificateFiles, Instant)>,
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

    /// One stream, from connecting to its end. Its span names the hub and this replica, and
    /// the identity the hub knows it by once welcomed; the accounts' streamers and the
    /// operations started on the stream log inside it.
    #[tracing::instrument(
        name = "hub_stream",
        skip_all,
        fields(hub = %self.config.clouddriver.grpc, replica = %self.options.replica_name(), identity = tracing::field::Empty)
    )]
    async fn session(&mut self, inputs: &mut Inputs) -> End {
        match self.open(inputs).await {
            Ok(open) => self.stream(open, inputs).await,
            Err(end) => end,
        }
    }

    /// The handshake: connects, sends Hello, waits for Welcome, then unregisters the
    /// accounts removed while disconnected and registers every prepared account. The
    /// error is how the stream ended (shut down, or failed before or after Welcome).
    async fn open(&mut self, inputs: &mut Inputs) -> std::result::Result<Open, End> {
        let failed = |welcomed: bool| move |error: Error| End::Failed { welcomed, error };
        let hub = self.config.clouddriver.clone();
        let certificate_files = CertificateFiles::from_config(&hub).map_err(failed(false))?;
        if let Some(files) = &certificate_files {
            tokio::select! {
                enrolled = enrolment::ensure_certificate(&hub, files) => enrolled.map_err(failed(false))?,
                _ = stopped(&mut inputs.shutdown) => return Err(End::Shutdown),
            }
        }
        let bearer = enrolment::bearer_token(&hub).map_err(failed(false))?;
        let channel = tokio::select! {
            channel = connect(&hub) => channel.map_err(failed(false))?,
            _ = stopped(&mut inputs.shutdown) => return Err(End::Shutdown),
        };
        let (mut session, receivers) = Session::new(self.shared.clone());
        let requested = hub.keep_alive_heartbeat_seconds.unwrap_or(0);
        session
            .hello(
                self.options.replica_name(),
                self.session_token.clone(),
                requested,
            )
            .await
            .map_err(failed(false))?;
        // tonic's default of 4 MiB would refuse an operation carrying the manifests the hub
        // accepts (--max-request-bytes, 8 MiB by default) and end the stream; the hub bounds
        // what it sends.
        let mut client =
            AgentHubClient::new(channel).max_decoding_message_size(MAX_HUB_MESSAGE_BYTES);
        let mut request = tonic::Request::new(scale_agent_proto::tunnel::outbound(
            receivers.outgoing,
            receivers.tunnel_outgoing,
        ));
        if let Some(token) = bearer {
            let value = format!("Bearer {token}").parse().map_err(|_| {
                failed(false)(Error::InvalidConfig(
                    "the agent token (clouddriver.auth.token or tokenFile) holds characters a \
                     header cannot carry"
                        .into(),
                ))
            })?;
            request.metadata_mut().insert("authorization", value);
        }
        let response = tokio::select! {
            response = tokio::time::timeout(WELCOME_TIMEOUT, client.session(request)) => response,
            _ = stopped(&mut inputs.shutdown) => return Err(End::Shutdown),
        };
        let mut inbound = match response {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => return Err(failed(false)(Error::Stream(status))),
            Err(_) => {
                return Err(failed(false)(Error::Protocol(format!(
                    "the hub did not answer within {} s",
                    WELCOME_TIMEOUT.as_secs()
                ))));
            }
        };
        let welcome = tokio::select! {
            welcome = tokio::time::timeout(WELCOME_TIMEOUT, await_welcome(&mut inbound)) => match welcome {
                Ok(Ok(welcome)) => welcome,
                Ok(Err(error)) => return Err(failed(false)(error)),
                Err(_) => return Err(failed(false)(Error::Protocol(format!("no Welcome within {} s", WELCOME_TIMEOUT.as_secs())))),
            },
            _ = stopped(&mut inputs.shutdown) => return Err(End::Shutdown),
        };
        session.welcome(&welcome);
        self.dynamic.stream_started();
        self.session_token = welcome.session_token.clone();
        self.renewal = None;
        let renew = certificate_files.and_then(|files| {
            let renew_at = enrolment::renew_at(&std::fs::read(&files.cert).ok()?)?;
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            let wait = u64::try_from(renew_at - now).unwrap_or(0);
            Some((files, Instant::now() + Duration::from_secs(wait)))
        });
        let period_secs = granted_period(requested, welcome.heartbeat_period_seconds);
        if requested > 0 && period_secs != requested {
            // The hub clamped the request to its bounds (or is older and does not read it).
            tracing::info!(
                requested_seconds = requested,
                granted_seconds = period_secs,
                "the hub set another heartbeat period than clouddriver.keepAliveHeartbeatSeconds asks for; using the hub's"
            );
        }
        let period = Duration::from_secs(u64::from(period_secs));
        tracing::Span::current().record("identity", tracing::field::display(&welcome.identity));
        tracing::info!(hub_version = %welcome.hub_version,
            max_unacked = session.max_unacked, heartbeat_seconds = period_secs, "connected to the hub");
        self.shared.metrics.hub_connected.set(1);
        self.shared.update(|view| {
            view.hub_connected = true;
            view.hub_identity = welcome.identity.clone();
            view.heartbeat_period_seconds = period_secs;
        });

        // Accounts removed from the config while disconnected.
        for name in std::mem::take(&mut self.unregister_pending) {
            let unregister =
                agent_message::Kind::UnregisterAccount(v1::UnregisterAccount { account: name });
            session.send(unregister).await.map_err(failed(true))?;
        }
        let names: Vec<String> = self.accounts.keys().cloned().collect();
        for name in names {
            self.register(&name, &mut session)
                .await
                .map_err(failed(true))?;
        }
        Ok(Open {
            session,
            inbound,
            period,
            events: receivers.events,
            results: receivers.results,
            renew,
        })
    }

    /// The stream after the handshake, until it ends: the hub's messages, heartbeats,
    /// operation results, the watches' events (while the hub has acknowledged enough),
    /// config changes and accounts that finished preparing.
    async fn stream(&mut self, open: Open, inputs: &mut Inputs) -> End {
        let failed = |error: Error| End::Failed {
            welcomed: true,
            error,
        };
        let Open {
            mut session,
            mut inbound,
            period,
            mut events,
            mut results,
            mut renew,
        } = open;
        let mut heartbeat = tokio::time::interval_at(Instant::now() + period, period);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_heard = Instant::now();
        loop {
            let room = session.has_room();
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
                        return failed(error);
                    }
                }
                _ = heartbeat.tick() => {
                    if last_heard.elapsed() > period * 2 {
                        return failed(Error::Protocol(format!(
                            "the hub sent nothing for {} s (two heartbeat periods)", last_heard.elapsed().as_secs()
                        )));
                    }
                    if let Err(error) = session.heartbeat().await {
                        return failed(error);
                    }
                    if let Err(error) = self.report_dynamic(&mut session).await {
                        return failed(error);
                    }
                }
                Some(result) = results.recv() => {
                    // In parts below the hub's message limit: one large list must not end
                    // the stream (and every account on it).
                    for part in crate::operations::split(result, session.max_message_bytes) {
                        if let Err(error) = session.send(agent_message::Kind::OperationResult(part)).await {
                            return failed(error);
                        }
                    }
                }
                Some(_) = session.operations.join_next(), if !session.operations.is_empty() => {}
                () = sleep_until_renewal(&renew), if renew.is_some() => {
                    // Once per stream: a refused renewal is tried again on the next one.
                    if let Some((files, _)) = renew.take()
                        && let Err(error) = self.ask_renewal(files, &mut session).await
                    {
                        return failed(error);
                    }
                }
                Some(outbound) = events.recv(), if room => {
                    let current = self
                        .accounts
                        .get(&outbound.account)
                        .is_some_and(|entry| entry.stream_generation == outbound.generation);
                    if current {
                        let is_object = matches!(outbound.message, agent_message::Kind::Object(_));
                        if let Err(error) = session.send(outbound.message).await {
                            return failed(error);
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
                        return failed(error);
                    }
                }
            }
        }
    }

    async fn handle(&mut self, message: HubMessage, session: &mut Session) -> Result<()> {
        match message.kind {
            Some(hub_message::Kind::Ack(ack)) => session.ack(ack.seq),
            Some(hub_message::Kind::Assignment(assignment)) => {
                self.assign(assignment, session);
                self.report_dynamic(session).await?;
            }
            Some(hub_message::Kind::DynamicAccounts(set)) => {
                self.dynamic.replace(set);
                // Same file, so the hub settings did not change.
                self.apply_config(self.file_config.clone(), Some(session))
                    .await;
                self.report_dynamic(session).await?;
            }
            Some(hub_message::Kind::Operation(operation)) => self.operate(operation, session),
            Some(hub_message::Kind::Tunnel(frame)) => {
                let accounts = &self.accounts;
                session.tunnel.handle(frame, |account, write| {
                    accounts
                        .get(account)
                        .and_then(|entry| entry.prepared.as_ref())
                        .map(|prepared| prepared.proxy_client_for(write))
                });
            }
            Some(hub_message::Kind::CertificateRenewal(renewal)) => self.renewed(renewal),
            Some(hub_message::Kind::AccountState(state)) => self.hub_account_state(state),
            Some(hub_message::Kind::KindStatus(status)) => {
                // The hub left the kind out of its cache (its object quota) or took it back;
                // the watch goes on either way: the hub asks for a relist by withholding
                // the kind's resume point on the next assignment.
                let state = v1::kind_status::State::try_from(status.state)
                    .map(|s| s.as_str_name())
                    .unwrap_or("STATE_UNSPECIFIED");
                let kind = status
                    .kind
                    .as_ref()
                    .map(|k| k.kind.as_str())
                    .unwrap_or_default();
                tracing::warn!(account = %status.account, kind, state, message = %status.message, "the hub reports a kind's state");
            }
            Some(hub_message::Kind::Capabilities(capabilities)) => {
                session.hub_reads_unavailable = capabilities
                    .capabilities
                    .iter()
                    .any(|c| c == scale_agent_proto::ACCOUNT_UNAVAILABLE_CAPABILITY);
                // The accounts that failed before this stream (or before the hub said it
                // reads the report).
                let names: Vec<String> = self.accounts.keys().cloned().collect();
                for name in names {
                    self.report_unavailable(&name, session).await?;
                }
            }
            Some(hub_message::Kind::AgentReplicas(replicas)) => {
                self.shared
                    .update(|view| view.hub_replicas = replicas.replicas);
            }
            Some(hub_message::Kind::Heartbeat(_)) | Some(hub_message::Kind::Welcome(_)) | None => {}
        }
        Ok(())
    }

    /// Tells the hub how the dynamic accounts fare, where that changed.
    async fn report_dynamic(&mut self, session: &mut Session) -> Result<()> {
        for status in self.dynamic.changed(&self.file_config, &self.shared.view()) {
            session
                .send(agent_message::Kind::DynamicAccountStatus(status))
                .await?;
        }
        Ok(())
    }

    /// Sends RenewCertificate with a CSR for a new key, kept until the answer arrives.
    async fn ask_renewal(&mut self, files: CertificateFiles, session: &mut Session) -> Result<()> {
        let (key_pem, csr_pem) = enrolment::key_and_csr()?;
        tracing::info!(cert = %files.cert.display(), "renewing the client certificate over the stream");
        self.renewal = Some((files, key_pem));
        session
            .send(agent_message::Kind::RenewCertificate(
                v1::RenewCertificate { csr_pem },
            ))
            .await
    }

    /// Keeps a renewed certificate (used from the next connection on).
    /// Records the hub's state of an account (for the admin view and the status writer).
    fn hub_account_state(&mut self, state: v1::AccountState) {
        let name = v1::account_state::State::try_from(state.state)
            .map(|s| s.as_str_name())
            .unwrap_or("STATE_UNSPECIFIED");
        tracing::debug!(account = %state.account, state = name, reason = %state.reason, "hub account state");
        if !self.accounts.contains_key(&state.account) {
            return;
        }
        self.shared.update_account(&state.account, |view| {
            view.hub_state = Some(state::HubAccountState {
                state: name.to_string(),
                reason: state.reason,
                since_unix_millis: state.since_unix_millis,
            });
        });
    }

    fn renewed(&mut self, renewal: v1::CertificateRenewal) {
        let Some((files, key_pem)) = self.renewal.take() else {
            tracing::warn!("the hub sent a certificate renewal nobody asked for; ignored");
            return;
        };
        match renewal.certificate {
            Some(certificate) => {
                match enrolment::store(&files, &key_pem, &certificate.certificate_chain_pem) {
                    Ok(()) => {
                        tracing::info!(identity = %certificate.identity, not_after = certificate.not_after_unix, "client certificate renewed; the next connection uses it")
                    }
                    Err(error) => {
                        tracing::warn!(error = %crate::error::Chain(&error), "cannot keep the renewed certificate")
                    }
                }
            }
            None => {
                tracing::warn!(reason = %renewal.refused, "the hub refused to renew the client certificate; the agent enrols again with clouddriver.auth.enrolmentTokenFile once it expires")
            }
        }
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
        let span =
            tracing::info_span!("operation", account = %operation.account, id = %operation.id);
        span.in_scope(|| {
            tracing::info!(
                r#type = operation
                    .op
                    .as_ref()
                    .map(scale_agent_proto::v1::operation::Op::name)
                    .unwrap_or("none"),
                "operation received"
            );
        });
        let shared = self.shared.clone();
        session.operations.spawn(
            async move {
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
            }
            .instrument(span),
        );
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
                // Created here, inside the stream's span, so the account's events carry both.
                let span = tracing::info_span!("account", account = %name);
                entry.streamer = Some(tokio::spawn(
                    streamer::run(StreamerContext {
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
                    })
                    .instrument(span),
                ));
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
        // The registration ends at the hub what this stream reported of the account: a
        // later failure is reported again, whatever its reason.
        session.reported_unavailable.remove(name);
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
        let prepared = match prep.outcome {
            Ok(prepared) => prepared,
            Err(reason) => {
                entry.failure = Some(reason);
                return match session {
                    Some(session) => self.report_unavailable(&prep.account, session).await,
                    None => Ok(()),
                };
            }
        };
        entry.failure = None;
        entry.executor = Some(Arc::new(crate::operations::Executor::new(
            prep.account.clone(),
            self.options.replica_name(),
            prepared.operations_client.clone(),
            crate::budget::Budget::for_account(
                self.operations_total.clone(),
                self.config.tasks.operations_per_account,
            ),
        )));
        entry.prepared = Some(prepared);
        entry.preparing = None;
        match session {
            Some(session) => self.register(&prep.account, session).await,
            None => Ok(()),
        }
    }

    /// Tells the hub the account cannot be served (AccountUnavailable), if its preparation
    /// failed, the hub reads the message, and this stream has not been told this reason yet.
    async fn report_unavailable(&mut self, name: &str, session: &mut Session) -> Result<()> {
        let Some(reason) = self
            .accounts
            .get(name)
            .filter(|entry| entry.prepared.is_none())
            .and_then(|entry| entry.failure.clone())
        else {
            return Ok(());
        };
        if !session.hub_reads_unavailable || session.reported_unavailable.get(name) == Some(&reason)
        {
            return Ok(());
        }
        tracing::info!(account = %name, %reason, "telling the hub the account cannot be served");
        session
            .reported_unavailable
            .insert(name.to_string(), reason.clone());
        session
            .send(agent_message::Kind::AccountUnavailable(
                v1::AccountUnavailable {
                    account: name.to_string(),
                    reason,
                },
            ))
            .await
    }

    fn spawn_prepare(&self, config: AccountConfig, generation: u64) -> JoinHandle<()> {
        let tx = self.prep_tx.clone();
        let shared = self.shared.clone();
        let span = tracing::info_span!("account", account = %config.name);
        tokio::spawn(async move {
            let name = config.name.clone();
            let mut backoff = Backoff::for_retries();
            loop {
                match account::prepare(&config).await {
                    Ok(prepared) => {
                        tracing::info!(api_server = %prepared.cluster.api_server_host,
                            version = %prepared.cluster.kubernetes_version, "account credentials loaded");
                        shared.update_account(&name, |view| {
                            view.error = None;
                            view.prepared = true;
                            view.cluster = Some(ClusterView {
                                api_server_host: prepared.cluster.api_server_host.clone(),
                                ca_fingerprint: prepared.cluster.ca_fingerprint.clone(),
                                kubernetes_version: prepared.cluster.kubernetes_version.clone(),
                            });
                        });
                        let _ = tx.send(Prep {
                            account: name,
                            generation,
                            outcome: Ok(Arc::new(prepared)),
                        });
                        return;
                    }
                    Err(error) => {
                        let delay = backoff.next_delay();
                        let error = crate::error::Chain(&error).to_string();
                        tracing::warn!(%error, "account not usable; retrying in {:.1} s", delay.as_secs_f64());
                        shared.update_account(&name, |view| view.error = Some(error.clone()));
                        let _ = tx.send(Prep {
                            account: name.clone(),
                            generation,
                            outcome: Err(error),
                        });
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        }.instrument(span))
    }

    /// Applies the latest config: accounts added, changed (re-prepared and re-registered)
    /// or removed (watches stopped, UnregisterAccount sent). True when the hub settings
    /// changed, which needs a new stream.
    async fn apply_config(
        &mut self,
        new: Arc<AgentConfig>,
        mut session: Option<&mut Session>,
    ) -> bool {
        self.file_config = new.clone();
        let mut new = self.dynamic.merged(&new);
        if new.kubernetes.no_proxy {
            // Armory's kubernetes.noProxy is every account's noProxy (a change re-prepares
            // the accounts, as any change of theirs does).
            for account in &mut Arc::make_mut(&mut new).kubernetes.accounts {
                account.no_proxy = true;
            }
        }
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
                    // The hub forgets what this stream reported of it, too.
                    session.reported_unavailable.remove(&name);
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
                view.prepared = false;
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
                    failure: None,
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
    fn the_hubs_grant_wins_then_the_request_then_the_fallback() {
        assert_eq!(granted_period(20, 30), 30, "the hub clamped the request");
        assert_eq!(granted_period(0, 7), 7, "no request: the hub's period");
        assert_eq!(granted_period(20, 0), 20, "a Welcome without a period");
        assert_eq!(granted_period(0, 0), FALLBACK_HEARTBEAT_SECONDS);
    }
}
