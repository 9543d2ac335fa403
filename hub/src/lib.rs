//! `scale-agent-hub`: accepts Scale Agent streams over mutual TLS, keeps a cache of every
//! agent's cluster (persisted with its resume points in an embedded redb store), serves it
//! over an HTTP API, and lets kubectl, Helm and Clouddriver reach every cluster through a
//! Kubernetes API proxy tunnelled over the agents' streams.
//!
//! Embedding (tests, e2e): build a [`Config`] (e.g. [`Config::new`] with addresses on
//! `127.0.0.1:0`), call [`start`], read the bound addresses from the [`RunningHub`], and
//! call [`RunningHub::shutdown`] at the end. The binary calls [`run`].

pub use scale_agent_hub_api::admin_api;
pub use scale_agent_hub_api::agent_admin;
pub use scale_agent_hub_auth::agent_auth;
pub use scale_agent_hub_auth::agent_ca;
pub use scale_agent_hub_auth::agent_renewal;
pub use scale_agent_hub_auth::agent_tokens;
pub mod allocator;
pub use scale_agent_hub_api::api_auth;
pub mod audit;
pub use scale_agent_hub_cache as cache;
pub mod cli;
pub use scale_agent_hub_clouddriver as clouddriver;
pub use scale_agent_hub_store::writer as commits;
pub mod config;
pub use scale_agent_hub_api::dynamic_accounts;
pub mod error;
pub use scale_agent_hub_api::fleet;
pub use scale_agent_hub_auth::forwarded;
mod health;
pub use scale_agent_hub_api::http;
pub use scale_agent_hub_api::kubeconfig;
pub use scale_agent_hub_model::identity;
pub mod metrics;
pub use scale_agent_hub_operations as operations;
pub use scale_agent_hub_proxy as proxy;
pub use scale_agent_hub_replicas::owners;
mod registrar_duty;
pub use scale_agent_hub_grpc as service;
pub use scale_agent_hub_net::serve;
pub use scale_agent_hub_replicas::sync as shared;
mod startup;
pub use scale_agent_hub_state::registry;
pub use scale_agent_hub_state::session;
pub use scale_agent_hub_store as store;
pub mod tls_reload;
pub use scale_agent_hub_auth::tokens;
pub use scale_agent_hub_state::tunnel;

use std::{
    future::Future,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use scale_agent_hub_auth::AuthBook;
use scale_agent_hub_replicas::{ReplicaSettings, Replicas};
use scale_agent_proto::v1::agent_hub_server::AgentHubServer;
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig, server::TcpIncoming};

use crate::{
    agent_auth::ClientCertificates,
    metrics::Metrics,
    service::AgentHubService,
    session::{HubState, Limits},
    store::{Store, StoreOp},
    tokens::Tokens,
};
pub use crate::{
    config::{
        Args, Config, GrpcSecurity, HttpSecurity, LogFormat, ProxyHopTls, ProxyMode, TlsFiles,
        TlsMaterial,
    },
    error::{HubError, Result},
};

pub(crate) use scale_agent_hub_state::Live;

/// The state shared by the gRPC service, the HTTP API and the background tasks.
pub(crate) struct Hub {
    pub(crate) config: Config,
    /// What the gRPC service reads of `config` ([`service::StreamSettings`]).
    pub(crate) stream_settings: service::StreamSettings,
    /// The registry and cache, the streams, the dynamic accounts ([`Live`]).
    pub(crate) live: Arc<Live>,
    /// The store. The agents' streams never take this lock: they queue their changes in
    /// [`Hub::commits`], whose writer commits them. Other writers hold it across their check
    /// and commit. Lock order: store, then state.
    pub(crate) store: Arc<tokio::sync::Mutex<Store>>,
    /// The queue of the streams' changes and its writer's progress.
    pub(crate) commits: Arc<commits::Commits>,
    pub(crate) metrics: Metrics,
    /// The Kubernetes API proxy's own state: its open exchanges, discovery documents and
    /// cached reads ([`proxy::ProxyState`]).
    pub(crate) proxy: Arc<proxy::ProxyState>,
    /// Tokens, the admin token and API tokens file, agents' tokens, the agent CA and the
    /// trusted client certificate issuers (replaced by [`tls_reload`]).
    pub(crate) auth: Arc<AuthBook>,
    /// Registers accounts in Clouddriver; `None` when no target is configured.
    pub(crate) registrar: Option<Arc<clouddriver::Registrar>>,
    /// Whether this replica is the one that registers ([`registrar_duty`]).
    pub(crate) registrar_duty: owners::singleton::Singleton,
    /// The accounts (name, settings) last handed to the registrar.
    registered_accounts: Mutex<Vec<(String, String)>>,
    /// Operations in flight and finished (the streams hand it results, the API looks up).
    pub(crate) operations: Arc<operations::Operations>,
    /// What submitting an operation works with ([`operations::submit`]).
    pub(crate) operation_driver: operations::Driver,
    /// Which accounts this replica owns, who it is to the others, the forwarder to their
    /// owners and the shared store's reads ([`Replicas`]).
    pub(crate) replicas: Arc<Replicas>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) grpc_listening: AtomicBool,
    pub(crate) store_open: AtomicBool,
    pub(crate) store_path: PathBuf,
}

impl Hub {
    /// The registry and cache ([`Live::state`]).
    pub(crate) fn state(&self) -> MutexGuard<'_, HubState> {
        self.live.state()
    }

    /// The proxy's tokens.
    pub(crate) fn tokens(&self) -> MutexGuard<'_, Tokens> {
        self.auth.tokens()
    }

    /// The issuers trusted for client certificates now (`None` with
    /// `--insecure-plaintext`).
    pub(crate) fn client_certificates(&self) -> Option<Arc<ClientCertificates>> {
        self.auth.client_certificates()
    }

    /// Brings the accounts' states up to date ([`Live::observe_states`]).
    pub(crate) fn observe_states(&self) {
        self.live.observe_states();
    }

    /// Removes accounts past their grace period, and makes recent commits durable.
    async fn maintain(&self) -> Result<()> {
        let expired = {
            let mut st = self.state();
            let names = st
                .registry
                .expired(Instant::now(), self.config.grace_period);
            // An account owned by another replica is only forgotten here: its owner keeps
            // it in the shared store.
            let owned: Vec<&String> = names.iter().filter(|n| st.registry.owns(n)).collect();
            let ops = owned
                .into_iter()
                .map(|account| StoreOp::DeleteAccount {
                    account: account.clone(),
                })
                .collect();
            for name in &names {
                st.registry.remove_account(name);
                st.cache.remove_account(name);
            }
            // Queued like the streams' changes, in the order of the changes in memory.
            self.commits.enqueue(ops);
            names
        };
        self.observe_states();
        for name in &expired {
            self.live.account_forgotten(name);
            tracing::info!(account = %name, grace_period = ?self.config.grace_period, "account removed: no agent within the grace period");
        }
        if self.commits.health().failure.is_none() {
            // Makes recent commits durable (the writer retries on its own while failing).
            self.store.lock().await.commit(Vec::new()).await?;
        }
        self.sync_clouddriver().await
    }

    /// Hands the registrar the accounts, when this replica registers them (see
    /// [`Hub::hand_accounts_to_registrar`]).
    async fn sync_clouddriver(&self) -> Result<()> {
        match &self.registrar {
            Some(registrar) if registrar.is_active() => self.hand_accounts_to_registrar().await,
            _ => Ok(()),
        }
    }

    /// Hands the registrar the accounts the hub serves, each with a kubeconfig carrying the
    /// account's derived Clouddriver token, when the set or an account's settings changed.
    /// The accounts are every account of a shared store (whichever replica streams it), or
    /// those of the registry with the embedded store.
    pub(crate) async fn hand_accounts_to_registrar(&self) -> Result<()> {
        let (Some(registrar), Some(public_url)) = (&self.registrar, &self.config.public_url) else {
            return Ok(());
        };
        // The shared store's reads have a connection of their own: this runs every tick on
        // the registrar, and must not hold the store's lock (the commits') over a query.
        let accounts: Vec<(String, serde_json::Value)> = match &self.replicas.shared {
            Some(shared) => shared
                .accounts()
                .await?
                .into_iter()
                .map(|(name, record)| (name, record.properties))
                .collect(),
            None => self
                .state()
                .registry
                .accounts
                .iter()
                .map(|(name, a)| (name.clone(), a.record.properties.clone()))
                .collect(),
        };
        // Cheap to compare every tick: the account, its settings and its token's hash (a
        // rotated token changes the kubeconfig, which must be registered again).
        let fingerprint = |tokens: &Tokens| -> Vec<(String, String)> {
            accounts
                .iter()
                .map(|(name, properties)| {
                    let token = tokens
                        .find(name, tokens::CLOUDDRIVER_TOKEN)
                        .map(|r| r.sha256.clone())
                        .unwrap_or_default();
                    (name.clone(), format!("{properties}\0{token}"))
                })
                .collect()
        };
        let before = fingerprint(&self.tokens());
        if *self
            .registered_accounts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            == before
        {
            return Ok(());
        }
        let mut store = self.store.lock().await;
        let mut ops = Vec::new();
        let mut desired = Vec::new();
        {
            let mut tokens = self.tokens();
            for (name, properties) in accounts.clone() {
                let (token, _, more) = tokens.derived(
                    &name,
                    tokens::CLOUDDRIVER_TOKEN,
                    jiff::Timestamp::now().as_second(),
                )?;
                ops.extend(more);
                let kubeconfig = kubeconfig::render(&kubeconfig::KubeconfigFor {
                    account: &name,
                    public_url,
                    ca_pem: self.config.serving_ca_pem.as_deref(),
                    token: &token,
                });
                desired.push(clouddriver::DesiredAccount {
                    name,
                    kubeconfig,
                    properties,
                });
            }
        }
        store.commit(ops).await?;
        drop(store);
        registrar.set_desired(desired);
        *self
            .registered_accounts
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = fingerprint(&self.tokens());
        Ok(())
    }

    /// Forgets what was last handed to the registrar, so the next hand-over happens even if
    /// nothing changed (a replica that just became the registrar).
    pub(crate) fn forget_registered_accounts(&self) {
        self.registered_accounts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// What the Kubernetes API proxy's routes work with ([`proxy::router`]).
    pub(crate) fn proxy_routes(&self) -> Arc<proxy::Proxy> {
        Arc::new(proxy::Proxy {
            live: self.live.clone(),
            auth: self.auth.clone(),
            replicas: self.replicas.clone(),
            state: self.proxy.clone(),
            metrics: self.metrics.proxy.clone(),
            shutdown: self.shutdown.clone(),
        })
    }

    /// Refreshes the gauges from the state.
    pub(crate) fn refresh_gauges(&self) {
        let st = self.state();
        self.metrics
            .connected_agents
            .set(st.registry.sessions.len() as i64);
        self.metrics.accounts.set(st.registry.accounts.len() as i64);
        for (state, count) in st.registry.state_counts() {
            self.metrics
                .accounts_by_state
                .get_or_create(&[("state", state.as_str())])
                .set(count as i64);
        }
        self.metrics
            .objects_cached
            .set(st.cache.object_count() as i64);
        let budget = &st.cache.history_budget;
        self.metrics.watch_history_bytes.set(budget.held() as i64);
        // Under the state lock: two scrapes do not add the same evictions twice.
        let counted = self.metrics.watch_history_evicted.get();
        self.metrics
            .watch_history_evicted
            .inc_by(budget.evicted().saturating_sub(counted));
        drop(st);
        self.metrics
            .proxy
            .exchanges_open
            .set(self.proxy.tunnels.len() as i64);
        self.metrics
            .refresh_certificate_expiry(jiff::Timestamp::now().as_second());
    }
}

pub(crate) use scale_agent_hub_model::time::shutting_down;

/// A hub started by [`start`].
pub struct RunningHub {
    /// Where the gRPC listener is bound (useful with port 0).
    pub grpc_addr: SocketAddr,
    /// Where the HTTP API is bound.
    pub http_addr: SocketAddr,
    hub: Arc<Hub>,
    shutdown_tx: watch::Sender<bool>,
    grpc: JoinHandle<Result<()>>,
    http: JoinHandle<Result<()>>,
    maintenance: JoinHandle<()>,
    writer: JoinHandle<()>,
    registrar: Option<JoinHandle<()>>,
    failed: mpsc::Receiver<HubError>,
}

impl RunningHub {
    /// The store file.
    pub fn store_path(&self) -> &std::path::Path {
        &self.hub.store_path
    }

    /// The admin token file (created at start when missing): its token has role admin.
    pub fn admin_token_file(&self) -> Option<&std::path::Path> {
        self.hub.config.admin_token_file.as_deref()
    }

    /// Installs a test seam in the store's commit path ([`store::CommitHook`]): it may
    /// stall a commit or fail it.
    #[doc(hidden)]
    pub async fn set_store_commit_hook(&self, hook: Option<store::CommitHook>) {
        self.hub.store.lock().await.set_commit_hook(hook);
    }

    /// Resolves when a server fails on its own (not after [`RunningHub::shutdown`]).
    pub async fn failed(&mut self) -> HubError {
        match self.failed.recv().await {
            Some(e) => e,
            None => std::future::pending().await,
        }
    }

    /// Ends every agent stream (status `unavailable`), stops the servers, and flushes and
    /// closes the store.
    pub async fn shutdown(self) -> Result<()> {
        let _ = self.shutdown_tx.send(true);
        let deadline = Duration::from_secs(10);
        let mut result = Ok(());
        for (name, task) in [("gRPC server", self.grpc), ("HTTP server", self.http)] {
            match tokio::time::timeout(deadline, task).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => result = Err(e),
                Ok(Err(e)) => result = Err(HubError::Task(format!("{name}: {e}"))),
                Err(_) => tracing::warn!("{name} did not stop within {deadline:?}"),
            }
        }
        self.maintenance.abort();
        let _ = self.maintenance.await;
        if let Some(registrar) = self.registrar
            && tokio::time::timeout(deadline, registrar).await.is_err()
        {
            tracing::warn!("the Clouddriver registrar did not stop within {deadline:?}");
        }
        // Another replica takes the registrar's duty at once.
        self.hub.registrar_duty.release().await;
        if tokio::time::timeout(deadline, self.writer).await.is_err() {
            tracing::warn!("the store writer did not stop within {deadline:?}");
        }
        self.hub.grpc_listening.store(false, Ordering::SeqCst);
        self.hub.store_open.store(false, Ordering::SeqCst);
        let mut store = self.hub.store.lock().await;
        let drained = self.hub.commits.drain(&mut store).await;
        if let Err(e) = &drained {
            tracing::error!(error = %crate::error::Chain(e), data_dir = %self.hub.config.data_dir.display(), "cannot commit the last queued changes at shutdown; agents will replay them from older resume points");
        }
        let closed = store.close().await;
        drop(store);
        // After the last changes are stored: the next owners load them.
        self.hub.replicas.ownership.close().await;
        tracing::info!("hub stopped; store flushed");
        result.and(drained).and(closed)
    }
}

/// What the replicas' handle reads of the configuration.
fn replica_settings(config: &Config) -> ReplicaSettings {
    ReplicaSettings {
        id: config.replica_id.clone(),
        address: config.replica_address.clone(),
        server_name: config.replica_server_name.clone(),
        secret: config.replica_secret.clone(),
        sync_period: config.replica_sync_period,
        grace_period: config.grace_period,
    }
}

/// Opens the store, loads the cache, binds both listeners and starts serving.
pub async fn start(config: Config) -> Result<RunningHub> {
    config.validate()?;
    let startup::OpenedStore {
        mut store,
        path: store_path,
        location: store_location,
        mut loaded,
        operation_records,
    } = startup::open_store(&config).await?;
    let replicas = Replicas::open(
        replica_settings(&config),
        &config.ownership,
        config.serving_ca_pem.as_deref(),
        &mut store,
    )
    .await?;
    let state = startup::live_state(&config, &mut loaded, &replicas, &store_location);
    let registrations = std::mem::take(&mut loaded.registrations);
    let auth = startup::load_auth(&config, &mut loaded, &mut store).await?;
    let http_tls = startup::http_tls(&config)?;
    let (grpc_listener, grpc_addr) = startup::bind(config.grpc_addr, "gRPC").await?;
    let (http_listener, http_addr) = startup::bind(config.http_addr, "HTTP").await?;

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let store = Arc::new(tokio::sync::Mutex::new(store));
    let registrar = if config.clouddriver.enabled() {
        let ledger = clouddriver::ledger::StoreLedger::new(
            store.clone(),
            registrations,
            tokio::runtime::Handle::current(),
        );
        Some(Arc::new(clouddriver::Registrar::new(
            config.clouddriver.clone(),
            Arc::new(ledger),
        )?))
    } else {
        None
    };
    // With replicas sharing PostgreSQL, one registers (a lock of its own); the others wait.
    let registrar_duty = match (&registrar, &config.ownership) {
        (Some(registrar), owners::OwnershipSource::Postgres { options }) => {
            registrar.set_active(false);
            owners::singleton::Singleton::Postgres(Box::new(
                owners::singleton::PostgresSingleton::new(
                    options,
                    replicas.id(),
                    registrar_duty::NAME,
                )?,
            ))
        }
        _ => owners::singleton::Singleton::Always,
    };
    let metrics = Metrics::new();
    if let Some(registrar) = &registrar {
        metrics.add_clouddriver(registrar.metrics());
    }
    let operations = Arc::new(operations::Operations::new(operations::Bounds {
        max_result_bytes: config.max_operation_result_bytes,
        max_records_bytes: config.max_operation_records_bytes,
    }));
    operations::persist::restore(&operations, operation_records, config.operation_retention);
    let live = Arc::new(Live::new(
        state,
        dynamic_accounts::DynamicAccounts::load(std::mem::take(&mut loaded.dynamic_accounts)),
        metrics.stream.clone(),
        replicas.ownership.owns_everything(),
    ));
    let operation_driver = operations::Driver {
        operations: operations.clone(),
        live: live.clone(),
        store: store.clone(),
        metrics: metrics.operations.clone(),
        settings: operations::OperationSettings {
            retention: config.operation_retention,
        },
    };
    let proxy = Arc::new(proxy::ProxyState::default());
    let hub = Arc::new(Hub {
        stream_settings: stream_settings(&config),
        live,
        store,
        commits: Arc::new(commits::Commits::new(config.data_dir.clone())),
        metrics,
        proxy: proxy.clone(),
        auth: Arc::new(auth),
        registrar,
        registrar_duty,
        registered_accounts: Mutex::new(Vec::new()),
        operations,
        operation_driver,
        replicas: Arc::new(replicas),
        shutdown: shutdown_rx,
        grpc_listening: AtomicBool::new(false),
        store_open: AtomicBool::new(true),
        store_path,
        config,
    });
    hub.live.set_cache_events(proxy);
    // The registrar's first pass must see the accounts loaded from the store: with no
    // accounts it would remove every account registered before this start from Clouddriver,
    // and register them again a moment later.
    hub.sync_clouddriver().await?;

    let (keepalive_interval, keepalive_timeout) = hub.stream_settings.keepalive();
    let mut builder = Server::builder()
        .http2_keepalive_interval(Some(keepalive_interval))
        .http2_keepalive_timeout(Some(keepalive_timeout))
        .tcp_keepalive(Some(Duration::from_secs(60)));
    if let GrpcSecurity::TrustedProxy(proxy) = &hub.config.security {
        builder = proxy_listener(builder, proxy)?;
    }
    // TLS is terminated here rather than by tonic: client certificates are optional at the
    // TLS layer (enrolling and token-authenticated agents have none) and checked per stream.
    let grpc_tls = match (&hub.config.security, hub.client_certificates()) {
        (GrpcSecurity::MutualTls(tls), Some(clients)) => Some(agent_auth::server_tls_config(
            &tls.cert_pem,
            &tls.key_pem,
            &clients,
        )?),
        (GrpcSecurity::TrustedProxy(_), _) => None,
        _ => {
            tracing::warn!(
                "--insecure-plaintext: gRPC without TLS; agents without an agent token are not \
                 authenticated and their traffic is readable on the network"
            );
            None
        }
    };
    let max_message = hub.stream_settings.max_message_bytes();
    let service = AgentHubServer::new(AgentHubService::new(grpc_state(&hub)))
        .max_decoding_message_size(max_message);
    let (failed_tx, failed) = mpsc::channel(2);

    let shutdown = hub.shutdown.clone();
    let router = builder.add_service(service);
    let failed_grpc = failed_tx.clone();
    // Both listeners take their TLS configuration from a watch channel that the reloader
    // replaces when the certificate files change: new connections get the new one.
    let grpc_tls = grpc_tls.map(watch::channel);
    let http_tls = http_tls.map(watch::channel);
    if let Some(reloader) = tls_reload::Reloader::new(
        hub.clone(),
        grpc_tls.as_ref().map(|(tx, _)| tx.clone()),
        http_tls.as_ref().map(|(tx, _)| tx.clone()),
    ) {
        tokio::spawn(reloader.run(hub.shutdown.clone()));
    }
    let grpc_tls = grpc_tls.map(|(_, rx)| rx);
    let http_tls = http_tls.map(|(_, rx)| rx);
    let grpc = tokio::spawn(async move {
        let result = match grpc_tls {
            Some(tls) => {
                router
                    .serve_with_incoming_shutdown(
                        agent_auth::tls_incoming(grpc_listener, tls),
                        shutting_down(shutdown),
                    )
                    .await
            }
            None => {
                let incoming = TcpIncoming::from(grpc_listener).with_nodelay(Some(true));
                router
                    .serve_with_incoming_shutdown(incoming, shutting_down(shutdown))
                    .await
            }
        }
        .map_err(|e| HubError::Grpc(Box::new(e)));
        if let Err(e) = &result {
            let _ = failed_grpc.try_send(HubError::Task(crate::error::Chain(e).to_string()));
        }
        result
    });
    hub.grpc_listening.store(true, Ordering::SeqCst);
    tracing::info!(%grpc_addr, mtls = matches!(hub.config.security, GrpcSecurity::MutualTls(_)), "gRPC listening");

    let app = http_routes(&hub);
    let shutdown = hub.shutdown.clone();
    let tls = http_tls.is_some();
    if !tls {
        tracing::warn!(
            "--http-plaintext: the HTTP listener has no TLS; proxy tokens and cluster data cross \
             the network in clear"
        );
    }
    let http = tokio::spawn(async move {
        let result = serve::serve(http_listener, app, http_tls, shutting_down(shutdown)).await;
        if let Err(e) = &result {
            let _ = failed_tx.try_send(HubError::Task(format!(
                "HTTP server: {}",
                crate::error::Chain(e)
            )));
        }
        result
    });
    tracing::info!(%http_addr, tls, "HTTP listening (REST API and Kubernetes API proxy)");

    if let Some(file) = hub.auth.api_tokens_file().cloned() {
        tokio::spawn(file.watch(hub.shutdown.clone()));
    }
    let registrar_task = hub.registrar.clone().map(|registrar| {
        let shutdown = hub.shutdown.clone();
        if matches!(
            hub.registrar_duty,
            owners::singleton::Singleton::Postgres(_)
        ) {
            tokio::spawn(registrar_duty::run(hub.clone(), registrar.clone()));
        }
        tokio::spawn(registrar.run(shutdown))
    });
    let tick =
        (hub.config.grace_period / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let maintained = hub.clone();
    let maintenance = tokio::spawn(async move {
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            if let Err(e) = maintained.maintain().await {
                tracing::error!(error = %crate::error::Chain(&e), "store maintenance failed");
            }
        }
    });

    // The writer borrows the store, its metrics and the shutdown signal from the hub.
    let writer = tokio::spawn({
        let hub = hub.clone();
        async move {
            let shutdown = hub.shutdown.clone();
            hub.commits
                .run(&hub.store, &hub.metrics.store, shutdown)
                .await;
        }
    });
    if !hub.replicas.ownership.owns_everything() {
        let shared_store = hub.store.lock().await.loads_accounts_separately();
        let source: Arc<dyn owners::AccountSource> = if shared_store {
            Arc::new(owners::StoreAccounts(hub.store.clone()))
        } else {
            Arc::new(owners::MemoryIsCurrent)
        };
        // The ownership task borrows the replicas, the live state, the commit queue and the
        // shutdown signal from the hub.
        let hub = hub.clone();
        tokio::spawn(async move {
            let shutdown = hub.shutdown.clone();
            owners::duty::run(&hub.replicas, &hub.live, &hub.commits, &*source, shutdown).await;
        });
    }
    if hub.replicas.shared.is_some() {
        // Keeping in step borrows the replicas, the live state, the credentials, the store's
        // lock and the shutdown signal from the hub.
        let hub = hub.clone();
        tokio::spawn(async move {
            let shutdown = hub.shutdown.clone();
            shared::run(&hub.replicas, &hub.live, &hub.auth, &hub.store, shutdown).await;
        });
    }

    Ok(RunningHub {
        grpc_addr,
        http_addr,
        hub,
        shutdown_tx,
        grpc,
        http,
        maintenance,
        writer,
        registrar: registrar_task,
        failed,
    })
}

/// The gRPC listener behind a TLS-terminating proxy: plaintext, or TLS whose client is the
/// proxy (its certificate required when only proxy identities are trusted, optional when
/// an address range is trusted too).
fn proxy_listener(builder: Server, proxy: &ProxyMode) -> Result<Server> {
    let header = proxy.trust.header();
    let Some(hop) = &proxy.hop_tls else {
        tracing::info!(%header, "gRPC behind a TLS-terminating proxy: plaintext hop; agents are identified by the forwarded certificate from trusted proxies only");
        return Ok(builder);
    };
    let mut tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&hop.cert_pem, &hop.key_pem))
        .timeout(Duration::from_secs(10));
    if let Some(ca) = &hop.proxy_ca_pem {
        tls = tls
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(!proxy.trust.trusts_only_identities());
    }
    tracing::info!(%header, proxy_certificates = hop.proxy_ca_pem.is_some(), "gRPC behind a TLS-terminating proxy: TLS hop");
    builder
        .tls_config(tls)
        .map_err(|e| HubError::Grpc(Box::new(e)))
}

/// What the gRPC service works with: the hub's handles it uses, its settings and metrics.
fn grpc_state(hub: &Hub) -> service::GrpcState {
    service::GrpcState {
        live: hub.live.clone(),
        auth: hub.auth.clone(),
        replicas: hub.replicas.clone(),
        operations: hub.operations.clone(),
        commits: hub.commits.clone(),
        store: hub.store.clone(),
        tunnels: hub.proxy.tunnels.clone(),
        settings: hub.stream_settings.clone(),
        metrics: hub.metrics.grpc.clone(),
        shutdown: hub.shutdown.clone(),
    }
}

/// What the gRPC service reads of the configuration.
fn stream_settings(config: &Config) -> service::StreamSettings {
    service::StreamSettings {
        heartbeat: service::HeartbeatBounds {
            default: config.heartbeat_period,
            min: config.min_heartbeat_period,
            max: config.max_heartbeat_period,
        },
        max_unacked: config.max_unacked,
        limits: Limits {
            max_object_bytes: config.max_object_bytes,
            max_staged_bytes: config.max_staged_bytes,
            max_objects_per_account: config.max_objects_per_account,
            allow: config.allow.clone(),
        },
        agent_cert_lifetime: config.agent_cert_lifetime,
        trusted_proxy: match &config.security {
            GrpcSecurity::TrustedProxy(proxy) => Some(proxy.trust.clone()),
            GrpcSecurity::MutualTls(_) | GrpcSecurity::InsecurePlaintext => None,
        },
    }
}

/// What the REST API reads of the configuration.
fn api_settings(config: &Config) -> http::ApiSettings {
    http::ApiSettings {
        public_url: config.public_url.clone(),
        https: matches!(config.http_security, HttpSecurity::Tls { .. }),
        serving_ca_pem: config.serving_ca_pem.clone(),
        max_request_bytes: config.max_request_bytes,
        operation_retention: config.operation_retention,
        metrics_unauthenticated: config.metrics_unauthenticated,
    }
}

/// The HTTP listener's routes: the REST API's ([`http::router`], with the handles it works
/// with and the hub answering its health routes) and the Kubernetes API proxy's, at
/// `/clusters/...` and, for other replicas, behind the replicas' secret under
/// [`owners::forward::INTERNAL_PREFIX`]. Each router has its own state.
fn http_routes(hub: &Arc<Hub>) -> axum::Router {
    let api = http::router(http::ApiState {
        live: hub.live.clone(),
        auth: hub.auth.clone(),
        store: hub.store.clone(),
        commits: hub.commits.clone(),
        replicas: hub.replicas.clone(),
        operations: hub.operation_driver.clone(),
        registrar: hub.registrar.clone(),
        settings: api_settings(&hub.config),
        health: hub.clone(),
    });
    let internal_proxy = proxy::router(hub.proxy_routes()).route_layer(
        axum::middleware::from_fn_with_state(hub.replicas.clone(), owners::forward::internal_auth),
    );
    let proxy =
        proxy::router(hub.proxy_routes()).nest(owners::forward::INTERNAL_PREFIX, internal_proxy);
    api.merge(proxy)
}

/// Runs the hub until `shutdown` resolves (or a server fails), then stops it cleanly.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<()> {
    let mut hub = start(config).await?;
    let failure = tokio::select! {
        () = shutdown => None,
        e = hub.failed() => Some(e),
    };
    tracing::info!("shutting down");
    let stopped = hub.shutdown().await;
    match failure {
        Some(e) => Err(e),
        None => stopped,
    }
}
