//! The first half of `start`: the store opened and loaded, the replicas' handle, the
//! credentials, both listeners bound, and every handle the parts work with built into
//! [`Hub`]. Nothing serves yet.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, atomic::AtomicBool},
};

use scale_agent_hub_replicas::Replicas;
use tokio::{net::TcpListener, sync::watch};

use crate::{
    Config, Hub, Live, Result, clouddriver, commits, dynamic_accounts,
    metrics::Metrics,
    operations, owners, proxy, registrar_duty, startup,
    store::Store,
    wiring::{replica_settings, stream_settings},
};

/// A listener bound and the address it got.
pub(crate) struct Bound {
    pub(crate) listener: TcpListener,
    pub(crate) addr: SocketAddr,
}

/// What `start` serves with.
pub(crate) struct Assembled {
    pub(crate) hub: Arc<Hub>,
    /// Sends `true` to stop everything [`Hub::shutdown`] is watched by.
    pub(crate) shutdown_tx: watch::Sender<bool>,
    pub(crate) grpc: Bound,
    pub(crate) http: Bound,
    /// The HTTP listener's TLS (`None` with `--http-plaintext`).
    pub(crate) http_tls: Option<Arc<rustls::ServerConfig>>,
}

/// Opens the store, loads the cache and the credentials, binds both listeners and builds
/// the hub's handles (`config` is validated by the caller).
pub(crate) async fn assemble(config: Config) -> Result<Assembled> {
    let startup::OpenedStore {
        mut store,
        path: store_path,
        location: store_location,
        mut loaded,
        operation_records,
    } = startup::open_store(&config).await?;
    let replicas = Replicas::open(
        replica_settings(&config),
        &config.replicas.ownership,
        config.api.serving_ca_pem.as_deref(),
        &mut store,
    )
    .await?;
    let state = startup::live_state(&config, &mut loaded, &replicas, &store_location);
    let registrations = std::mem::take(&mut loaded.registrations);
    let auth = startup::load_auth(&config, &mut loaded, &mut store).await?;
    let http_tls = startup::http_tls(&config)?;
    let (listener, addr) = startup::bind(config.listeners.grpc_addr, "gRPC").await?;
    let grpc = Bound { listener, addr };
    let (listener, addr) = startup::bind(config.listeners.http_addr, "HTTP").await?;
    let http = Bound { listener, addr };

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let store = Arc::new(tokio::sync::Mutex::new(store));
    let registrar = registrar(&config, &store, registrations)?;
    let registrar_duty = registrar_duty(&config, registrar.as_ref(), &replicas)?;
    let metrics = Metrics::new();
    if let Some(registrar) = &registrar {
        metrics.add_clouddriver(registrar.metrics());
    }
    let operations = Arc::new(operations::Operations::new(operations::Bounds {
        max_result_bytes: config.operations.max_result_bytes,
        max_records_bytes: config.operations.max_records_bytes,
    }));
    operations::persist::restore(&operations, operation_records, config.operations.retention);
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
            retention: config.operations.retention,
        },
    };
    let proxy = Arc::new(proxy::ProxyState {
        discovery: proxy::discovery::DiscoveryCache::with_limits(
            proxy::discovery::MAX_ENTRY_BYTES,
            proxy::discovery::MAX_ACCOUNT_BYTES,
            config.streams.discovery_cache_bytes,
        ),
        ..Default::default()
    });
    let hub = Arc::new(Hub {
        stream_settings: stream_settings(&config),
        live,
        store,
        commits: Arc::new(commits::Commits::new(config.store.data_dir.clone())),
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
    // The proxy's cached reads follow the cache through this seam (`CacheEvents`).
    hub.live.set_cache_events(proxy);
    Ok(Assembled {
        hub,
        shutdown_tx,
        grpc,
        http,
        http_tls,
    })
}

/// The Clouddriver registrar, when a target is configured, with its ledger in the store.
fn registrar(
    config: &Config,
    store: &Arc<tokio::sync::Mutex<Store>>,
    registrations: std::collections::BTreeMap<String, String>,
) -> Result<Option<Arc<clouddriver::Registrar>>> {
    if !config.clouddriver.enabled() {
        return Ok(None);
    }
    let ledger = clouddriver::ledger::StoreLedger::new(
        store.clone(),
        registrations,
        tokio::runtime::Handle::current(),
    );
    Ok(Some(Arc::new(clouddriver::Registrar::new(
        config.clouddriver.clone(),
        Arc::new(ledger),
    )?)))
}

/// Whether this replica registers: with replicas sharing PostgreSQL, the one holding a lock
/// of its own does (the others wait, their registrar inactive); otherwise always.
fn registrar_duty(
    config: &Config,
    registrar: Option<&Arc<clouddriver::Registrar>>,
    replicas: &Replicas,
) -> Result<owners::singleton::Singleton> {
    Ok(match (registrar, &config.replicas.ownership) {
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
    })
}
