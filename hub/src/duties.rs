//! The hub's background duties, spawned by `start` once both servers run: the API tokens
//! file's, the admin token file's, the OIDC files' and the replica secret file's watches, the Clouddriver registrar (and its hand-over between replicas), the
//! grace-period sweep, the store writer, and with replicas the ownership duty and the
//! shared store's reads.

use std::{sync::Arc, time::Duration};

use tokio::task::JoinHandle;

use crate::{Hub, owners, registrar_duty, shared};

/// The duties `RunningHub::shutdown` waits for; the others end with the shutdown signal.
pub(crate) struct Duties {
    pub(crate) maintenance: JoinHandle<()>,
    pub(crate) writer: JoinHandle<()>,
    pub(crate) registrar: Option<JoinHandle<()>>,
}

/// Spawns every background duty of `hub`.
pub(crate) async fn spawn(hub: &Arc<Hub>) -> Duties {
    if let Some(file) = hub.auth.api_tokens_file().cloned() {
        tokio::spawn(file.watch(hub.shutdown.clone()));
    }
    // The admin token is read again as often as the TLS files (issue 28, F25).
    if let Some(file) = hub.auth.admin_token().cloned() {
        let period = hub.config.listeners.tls_reload_interval;
        tokio::spawn(file.watch(period, hub.shutdown.clone()));
    }
    // And the OIDC issuers and access rules.
    if hub.auth.oidc_files().is_some() {
        let (auth, period) = (hub.auth.clone(), hub.config.listeners.tls_reload_interval);
        let shutdown = hub.shutdown.clone();
        tokio::spawn(scale_agent_hub_model::time::reload_every(
            period,
            shutdown,
            move || auth.reload_oidc(),
        ));
    }
    // So is the replicas' secret, which rotates with an overlap (`owners::secret`).
    if let Some(forwarder) = &hub.replicas.forwarder {
        let period = hub.config.listeners.tls_reload_interval;
        tokio::spawn(
            forwarder
                .secret()
                .clone()
                .watch(period, hub.shutdown.clone()),
        );
    }
    let registrar = hub.registrar.clone().map(|registrar| {
        if matches!(
            hub.registrar_duty,
            owners::singleton::Singleton::Postgres(_)
        ) {
            tokio::spawn(registrar_duty::run(hub.clone(), registrar.clone()));
        }
        tokio::spawn(registrar.run(hub.shutdown.clone()))
    });
    let maintenance = spawn_maintenance(hub.clone());
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
    spawn_replica_duties(hub).await;
    Duties {
        maintenance,
        writer,
        registrar,
    }
}

/// The grace-period sweep and the gauges ([`Hub::maintain`]), a few times per grace period.
fn spawn_maintenance(hub: Arc<Hub>) -> JoinHandle<()> {
    let tick = (hub.config.streams.grace_period / 4)
        .clamp(Duration::from_millis(50), Duration::from_secs(1));
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            if let Err(e) = hub.maintain().await {
                tracing::error!(error = %crate::error::Chain(&e), "store maintenance failed");
            }
        }
    })
}

/// With replicas: the ownership duty (unless this replica owns everything) and, on a shared
/// store, keeping in step with what the others wrote.
async fn spawn_replica_duties(hub: &Arc<Hub>) {
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
            shared::run(
                &hub.replicas,
                &hub.live,
                &hub.auth,
                &hub.commits,
                &hub.store,
                shutdown,
            )
            .await;
        });
    }
}
