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
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use scale_agent_hub_replicas::Replicas;
use scale_agent_proto::v1::agent_hub_server::AgentHubServer;
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tonic::transport::{Server, server::TcpIncoming};

pub use crate::{
    config::{
        Args, Config, GrpcSecurity, HttpSecurity, LogFormat, ProxyHopTls, ProxyMode, TlsFiles,
        TlsMaterial,
    },
    error::{HubError, Result},
};
use crate::{metrics::Metrics, service::AgentHubService};

pub(crate) use scale_agent_hub_state::Live;

mod hub;
mod wiring;

pub(crate) use hub::Hub;
use wiring::{grpc_state, http_routes, proxy_listener, replica_settings, stream_settings};

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
