//! `scale-agent-hub`: accepts Scale Agent streams over mutual TLS, keeps a cache of every
//! agent's cluster (persisted with its resume points in an embedded redb store), serves it
//! over an HTTP API, and lets kubectl, Helm and Clouddriver reach every cluster through a
//! Kubernetes API proxy tunnelled over the agents' streams.
//!
//! Embedding (tests, e2e): build a [`Config`] (e.g. [`Config::new`] with addresses on
//! `127.0.0.1:0`), call [`start`], read the bound addresses from the [`RunningHub`], and
//! call [`RunningHub::shutdown`] at the end. The binary calls [`run`].

pub use scale_agent_hub_api::admin_api;
pub use scale_agent_hub_api::{agent_admin, identity_admin};
pub use scale_agent_hub_auth::agent_auth;
pub use scale_agent_hub_auth::agent_ca;
pub use scale_agent_hub_auth::agent_renewal;
pub use scale_agent_hub_auth::agent_tokens;
pub mod allocator;
pub use scale_agent_hub_api::api_auth;
pub mod audit;
pub mod audit_log;
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
/// The process's RSS, CPU, open files and threads, for `/metrics`.
pub mod process_metrics;
pub use scale_agent_hub_operations as operations;
pub use scale_agent_hub_proxy as proxy;
pub use scale_agent_hub_replicas::owners;
mod registrar_duty;
pub use scale_agent_hub_grpc as service;
pub use scale_agent_hub_net::serve;
pub use scale_agent_hub_replicas::sync as shared;
mod startup;
pub mod token_key;
pub use scale_agent_hub_state::registry;
pub use scale_agent_hub_state::session;
pub use scale_agent_hub_store as store;
pub mod tls_reload;
pub use scale_agent_hub_auth::tokens;
pub use scale_agent_hub_state::tunnel;

use std::{
    future::Future,
    net::SocketAddr,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

pub use crate::{
    config::{
        Args, Config, GrpcSecurity, HttpSecurity, ListenerLimits, LogFormat, ProxyHopTls,
        ProxyMode, TlsFiles, TlsMaterial,
    },
    error::{HubError, Result},
};

pub(crate) use scale_agent_hub_state::Live;

mod assemble;
mod duties;
mod hub;
mod serving;
mod wiring;

pub(crate) use hub::Hub;

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
    /// The live state (registry and the accounts' caches): for tests that hold one
    /// account's lock and show what does not wait for it.
    pub fn live(&self) -> Arc<Live> {
        self.hub.live.clone()
    }

    /// The store file.
    pub fn store_path(&self) -> &std::path::Path {
        &self.hub.store_path
    }

    /// The admin token file (created at start when missing): its token has role admin.
    pub fn admin_token_file(&self) -> Option<&std::path::Path> {
        self.hub.config.api.admin_token_file.as_deref()
    }

    /// Installs a test seam in the store's commit path ([`store::CommitHook`]): it may
    /// stall a commit or fail it.
    #[doc(hidden)]
    pub async fn set_store_commit_hook(&self, hook: Option<store::CommitHook>) {
        self.hub.store.lock().await.set_commit_hook(hook);
    }

    /// Owner lookups of requests this replica forwarded: (asked the ownership's store,
    /// answered from the owners it kept a short while).
    pub fn owner_lookups(&self) -> (u64, u64) {
        let lookups = &self.hub.replicas.owner_lookups;
        (lookups.queries(), lookups.hits())
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
            tracing::error!(error = %crate::error::Chain(e), data_dir = %self.hub.config.store.data_dir.display(), "cannot commit the last queued changes at shutdown; agents will replay them from older resume points");
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
// The handles are built by `assemble::assemble`, the servers spawned by
// `serving::spawn_servers`, the background duties by `duties::spawn`.
pub async fn start(config: Config) -> Result<RunningHub> {
    config.validate()?;
    let assemble::Assembled {
        hub,
        shutdown_tx,
        grpc,
        http,
        http_tls,
    } = assemble::assemble(config).await?;
    let (grpc_addr, http_addr) = (grpc.addr, http.addr);
    // The registrar's first pass must see the accounts loaded from the store: with no
    // accounts it would remove every account registered before this start from Clouddriver,
    // and register them again a moment later.
    hub.sync_clouddriver().await?;
    let (failed_tx, failed) = mpsc::channel(2);
    let (grpc, http) = serving::spawn_servers(&hub, grpc, http, http_tls, &failed_tx)?;
    let duties::Duties {
        maintenance,
        writer,
        registrar,
    } = duties::spawn(&hub).await;
    Ok(RunningHub {
        grpc_addr,
        http_addr,
        hub,
        shutdown_tx,
        grpc,
        http,
        maintenance,
        writer,
        registrar,
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
