//! `Hub`: the wiring of the hub's handles that `start` builds, and the facade's own duties on
//! them (the grace-period sweep, the hand-over to the Clouddriver registrar, the gauges).

use std::{
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard, RwLockWriteGuard, atomic::AtomicBool},
    time::Instant,
};

use scale_agent_hub_auth::AuthBook;
use scale_agent_hub_replicas::Replicas;
use tokio::sync::watch;

use crate::{
    Config, Live, Result,
    agent_auth::ClientCertificates,
    clouddriver, commits, kubeconfig,
    metrics::Metrics,
    operations, owners, proxy,
    registry::Registry,
    service,
    store::{Store, StoreOp},
    tokens,
    tokens::Tokens,
};

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
    pub(crate) registered_accounts: Mutex<Vec<(String, String)>>,
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
    /// The registry, exclusively ([`Live::registry`]).
    pub(crate) fn registry(&self) -> RwLockWriteGuard<'_, Registry> {
        self.live.registry()
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
    pub(crate) async fn maintain(&self) -> Result<()> {
        let expired = {
            // The registry exclusively, so no batch of these accounts is being applied.
            let mut registry = self.registry();
            let names = registry.expired(Instant::now(), self.config.streams.grace_period);
            // An account owned by another replica is only forgotten here: its owner keeps
            // it in the shared store.
            let owned: Vec<&String> = names.iter().filter(|n| registry.owns(n)).collect();
            let ops = owned
                .into_iter()
                .map(|account| StoreOp::DeleteAccount {
                    account: account.clone(),
                })
                .collect();
            for name in &names {
                registry.remove_account(name);
                self.live.cache().remove_account(name);
            }
            // Queued like the streams' changes, in the order of the changes in memory.
            self.commits.enqueue(ops);
            names
        };
        self.observe_states();
        self.prune_expired_tokens();
        // A token rotated (reissued under its name) opens nothing any more: what it holds
        // open ends here too, as a revocation's does at once (F17).
        self.auth.end_revoked_sessions();
        for name in &expired {
            self.live.account_forgotten(name);
            tracing::info!(account = %name, grace_period = ?self.config.streams.grace_period, "account removed: no agent within the grace period");
        }
        if self.commits.health().failure.is_none() {
            // Makes recent commits durable (the writer retries on its own while failing).
            self.store.lock().await.commit(Vec::new()).await?;
        }
        self.sync_clouddriver().await
    }

    /// Drops tokens expired longer than the retention from memory and the store. Every
    /// replica does it (deletions by id are idempotent, see [`Tokens::prune_expired`]); the
    /// others' memory follows at their next read of the shared store.
    fn prune_expired_tokens(&self) {
        let retention =
            i64::try_from(self.config.api.expired_token_retention.as_secs()).unwrap_or(i64::MAX);
        let ops = self
            .tokens()
            .prune_expired(jiff::Timestamp::now().as_second(), retention);
        // Queued like the streams' changes; ids are never reused, so no order matters.
        self.commits.enqueue(ops);
    }

    /// Hands the registrar the accounts, when this replica registers them (see
    /// [`Hub::hand_accounts_to_registrar`]).
    pub(crate) async fn sync_clouddriver(&self) -> Result<()> {
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
        let (Some(registrar), Some(public_url)) = (&self.registrar, &self.config.api.public_url)
        else {
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
                .registry()
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
                    ca_pem: self.config.api.serving_ca_pem.as_deref(),
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
            commits: self.commits.clone(),
            audit_reads: self.config.api.proxy_audit_reads,
        })
    }

    /// Refreshes the gauges from the state.
    pub(crate) fn refresh_gauges(&self) {
        // The writer sets it on commits; the ownership finding the store unreachable counts
        // too, although nothing was committed meanwhile.
        let failing = self.commits.health().failure.is_some();
        self.metrics.store.failing.set(i64::from(failing));
        let registry = self.live.registry_read();
        self.metrics
            .connected_agents
            .set(registry.sessions.len() as i64);
        self.metrics.accounts.set(registry.accounts.len() as i64);
        for (state, count) in registry.state_counts() {
            self.metrics
                .accounts_by_state
                .get_or_create(&[("state", state.as_str())])
                .set(count as i64);
        }
        drop(registry);
        // Each account's lock in turn, never the registry's: batches go on meanwhile.
        self.metrics
            .objects_cached
            .set(self.live.cache().object_count() as i64);
        let budget = self.live.cache().history_budget();
        self.metrics.watch_history_bytes.set(budget.held() as i64);
        self.metrics
            .discovery_cache_bytes
            .set(self.proxy.discovery.bytes() as i64);
        let cached_bytes = self.live.cache().cached_bytes();
        self.metrics
            .cached_object_bytes
            .set(i64::try_from(cached_bytes.held()).unwrap_or(i64::MAX));
        {
            // Under the registry's exclusive lock (briefly): two scrapes do not add the
            // same evictions twice.
            let _one_scrape = self.live.registry();
            let counted = self.metrics.watch_history_evicted.get();
            self.metrics
                .watch_history_evicted
                .inc_by(budget.evicted().saturating_sub(counted));
            let counted = self.metrics.discovery_cache_evicted.get();
            self.metrics
                .discovery_cache_evicted
                .inc_by(self.proxy.discovery.stats().evicted.saturating_sub(counted));
            let counted = self.metrics.cached_bytes_refusals.get();
            self.metrics
                .cached_bytes_refusals
                .inc_by(cached_bytes.refusals().saturating_sub(counted));
        }
        self.metrics
            .proxy
            .exchanges_open
            .set(self.proxy.tunnels.len() as i64);
        self.metrics
            .refresh_certificate_expiry(jiff::Timestamp::now().as_second());
    }
}
