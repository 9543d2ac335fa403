//! The two controllers, their shared context, and the per-object retry backoff.

pub mod agent_account;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod hub_status;
pub mod scale_agent;
pub mod unwatched;

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{FutureExt, SinkExt, StreamExt, channel::mpsc, future::BoxFuture};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, ObjectReference, Secret, ServiceAccount},
    policy::v1::PodDisruptionBudget,
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, WatchParams},
    core::{DeserializeGuard, error_boundary::InvalidObject},
    runtime::{
        Controller, WatchStreamExt, controller,
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use scale_agent_crds::{AgentAccount, LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY, ScaleAgent};

use crate::{
    desired::OWNER_NAMESPACE_LABEL,
    error::{Chain, Result, kube_err},
    metrics::Metrics,
    policy::{self, WatchNamespaces},
    rbac, validate,
};

/// An AgentAccount as the controllers read it: one that does not fit the Rust type is kept
/// (and reported) instead of failing the list of all of them.
pub type GuardedAccount = DeserializeGuard<AgentAccount>;

/// The cache of the AgentAccounts of one watched namespace (or all).
pub type AccountStore = Store<GuardedAccount>;

/// An AgentAccount cache and whether it holds its first list yet.
///
/// Readiness is our own signal, not `Store::wait_until_ready`: kube-runtime wakes only the
/// last of several tasks waiting on that at once (it wraps a oneshot receiver), so a
/// reconcile waiting beside the controller's runner could wait forever.
#[derive(Clone)]
pub struct AccountCache {
    /// The accounts.
    pub store: AccountStore,
    /// True once the watch's first list is in.
    pub filled: tokio::sync::watch::Receiver<bool>,
}

/// How long discovery's answer is reused before the next reconcile that needs it asks again
/// (an account naming a kind it lacks asks again at once).
const DISCOVERY_MAX_AGE: Duration = Duration::from_secs(60);

/// Longest Event note, in bytes: the API server refuses a longer `note`.
const MAX_NOTE_BYTES: usize = 1000;

/// Settings of the controllers.
#[derive(Clone, Debug)]
pub struct Config {
    /// Overrides every ScaleAgent's `clientCertificate.lifetime` (whose schema minimum is
    /// 1h). For tests of certificate renewal only.
    pub certificate_lifetime_override: Option<Duration>,
    /// Reconcile every object at least this often, even without changes.
    pub resync: Duration,
    /// First delay before retrying a failed (or degraded) object; doubles per failure.
    pub retry_base: Duration,
    /// Longest delay between retries of one object.
    pub retry_max: Duration,
    /// Name of this operator instance in Events (e.g. the pod name).
    pub instance: Option<String>,
    /// The namespaces whose ScaleAgents and AgentAccounts are reconciled (account names are
    /// checked for duplicates among them); those elsewhere get a condition saying so. The
    /// command defaults to its own namespace; this library default is every namespace.
    pub watch_namespaces: WatchNamespaces,
    /// Agent images must start with one of these (see [`crate::policy::image_allowed`]).
    pub allowed_image_prefixes: Vec<String>,
    /// Honour `spec.clientCertificate` (the operator signs agent certificates with a CA key
    /// held in the cluster, for an identity the ScaleAgent chooses). Off by default: agents
    /// enrol with the hub (`spec.enrolment`).
    pub allow_operator_signed_certificates: bool,
    /// Where agents may be given Roles and whom they may impersonate (see
    /// [`crate::policy::Grants`]). Default: a ScaleAgent's own namespace only, never the
    /// reserved namespaces.
    pub grants: policy::Grants,
    /// How long no agent pod of a ScaleAgent may be ready before its AgentAccounts'
    /// `status.hub` says so (see [`hub_status`]).
    pub agent_absent_grace: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            certificate_lifetime_override: None,
            resync: Duration::from_secs(600),
            retry_base: Duration::from_secs(2),
            retry_max: Duration::from_secs(300),
            instance: None,
            watch_namespaces: WatchNamespaces::All,
            allowed_image_prefixes: policy::default_image_prefixes(),
            allow_operator_signed_certificates: false,
            grants: policy::Grants::default(),
            agent_absent_grace: hub_status::DEFAULT_AGENT_ABSENT_GRACE,
        }
    }
}

/// What every reconcile needs.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Settings.
    pub config: Config,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Consecutive failures per object (`Kind/namespace/name`), for exponential backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The AgentAccounts of each watched namespace, filled by the one watch that also
    /// triggers the controllers: a reconcile sees at least what triggered it.
    accounts: Vec<AccountCache>,
    /// The kinds the cluster serves, and when discovery said so.
    served: tokio::sync::Mutex<Option<(Instant, Arc<Vec<rbac::ServedKind>>)>>,
    /// When this process first saw no ready agent pod, per ScaleAgent (`namespace/name`).
    absent_since: Mutex<HashMap<String, k8s_openapi::jiff::Timestamp>>,
}

impl Context {
    /// A context for `client`, whose reconciles read AgentAccounts from `accounts`.
    pub fn new(
        client: Client,
        config: Config,
        metrics: Arc<Metrics>,
        accounts: Vec<AccountCache>,
    ) -> Self {
        let reporter = Reporter {
            controller: MANAGED_BY.into(),
            instance: config.instance.clone(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config,
            metrics,
            failures: Mutex::default(),
            accounts,
            served: tokio::sync::Mutex::default(),
            absent_since: Mutex::default(),
        }
    }

    /// When no agent pod of ScaleAgent `key` was first seen ready by this process, `now`
    /// (to the second) if this is the first time.
    pub fn agent_absent_since(
        &self,
        key: &str,
        now: k8s_openapi::jiff::Timestamp,
    ) -> k8s_openapi::jiff::Timestamp {
        let mut absent = self
            .absent_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *absent.entry(key.to_owned()).or_insert_with(|| {
            k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now)
        })
    }

    /// ScaleAgent `key` has a ready agent pod (or is gone).
    pub fn agent_present(&self, key: &str) {
        self.absent_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
    }

    /// The readable AgentAccounts in the watched namespaces, from the controllers' cache,
    /// once it holds its first list: a ScaleAgent reconciled before that would lose its
    /// accounts for a moment (and write that).
    pub async fn watched_accounts(&self) -> Result<Vec<AgentAccount>> {
        for cache in &self.accounts {
            let mut filled = cache.filled.clone();
            let filled = filled.wait_for(|filled| *filled).await.is_ok();
            if !filled {
                return Err(crate::Error::AccountCacheStopped);
            }
        }
        Ok(self
            .accounts
            .iter()
            .flat_map(|cache| cache.store.state())
            .filter_map(|account| account.0.as_ref().ok().cloned())
            .collect())
    }

    /// Every kind the cluster serves (preferred versions), from discovery run at most every
    /// [`DISCOVERY_MAX_AGE`], or now with `refresh` (an account names a kind it lacked: a
    /// CRD installed since).
    pub async fn served_kinds(&self, refresh: bool) -> Result<Arc<Vec<rbac::ServedKind>>> {
        // Held across discovery, so concurrent reconciles run it once.
        let mut cached = self.served.lock().await;
        if let Some((at, served)) = cached.as_ref()
            && !refresh
            && at.elapsed() < DISCOVERY_MAX_AGE
        {
            return Ok(served.clone());
        }
        let served = Arc::new(discover_served_kinds(&self.client).await?);
        *cached = Some((Instant::now(), served.clone()));
        Ok(served)
    }

    /// Counts a failure of `key` and returns how long to wait before the next attempt:
    /// `retry_base × 2^(failures-1)`, at most `retry_max`.
    pub fn next_backoff(&self, key: &str) -> Duration {
        let failures = match self.failures.lock() {
            Ok(mut map) => {
                let count = map.entry(key.to_owned()).or_insert(0);
                *count = count.saturating_add(1);
                *count
            }
            Err(_) => 1,
        };
        backoff_delay(self.config.retry_base, self.config.retry_max, failures)
    }

    /// One API for `K` per watched namespace, or one for all namespaces.
    pub fn watched_apis<K>(&self) -> Vec<Api<K>>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        match &self.config.watch_namespaces {
            WatchNamespaces::Only(namespaces) => namespaces
                .iter()
                .map(|namespace| Api::namespaced(self.client.clone(), namespace))
                .collect(),
            WatchNamespaces::All => vec![Api::all(self.client.clone())],
        }
    }

    /// Forgets the failures of `key` after a success.
    pub fn reset_backoff(&self, key: &str) {
        if let Ok(mut map) = self.failures.lock() {
            map.remove(key);
        }
    }

    /// Publishes an Event about `regarding`, its note cut to [`MAX_NOTE_BYTES`] (on a character
    /// boundary); a failure is logged, never returned.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        mut note: String,
    ) {
        note.truncate(note.floor_char_boundary(MAX_NOTE_BYTES));
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(error = %Chain(&error), reason, "failed to publish event");
        }
    }
}

/// Every kind the cluster serves (preferred versions), for resolving account kind names to
/// their resources.
async fn discover_served_kinds(client: &Client) -> Result<Vec<rbac::ServedKind>> {
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run_aggregated()
        .await
        .map_err(kube_err("discover the API resources the cluster serves"))?;
    Ok(discovery
        .groups()
        .flat_map(|group| group.recommended_resources())
        .map(|(resource, capabilities)| rbac::ServedKind {
            kind: resource.kind.clone(),
            resolved: rbac::Resolved {
                group: resource.group.clone(),
                resource: resource.plural.clone(),
                namespaced: capabilities.scope == kube::discovery::Scope::Namespaced,
                scalable: capabilities
                    .subresources
                    .iter()
                    .any(|(sub, _)| sub.plural == "scale"),
            },
        })
        .collect())
}

/// Event reason on an object the operator cannot read.
pub const INVALID_OBJECT: &str = "InvalidObject";

/// A Warning Event `InvalidObject` on a `K` the operator cannot read (its JSON does not fit
/// the Rust type although the CRD's schema let it in), naming the field to fix.
pub(crate) async fn report_unreadable<K>(invalid: &InvalidObject, ctx: &Context)
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + serde::de::DeserializeOwned,
{
    let meta = &invalid.metadata;
    let kind = K::kind(&());
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    let field = unreadable_field::<K>(&ctx.client, namespace, name).await;
    let (what, fix) = match &field {
        Some(field) => (format!("field {field}: "), format!("fix {field}")),
        None => (String::new(), "fix the value the error names".to_owned()),
    };
    tracing::warn!(%kind, namespace, name, field, error = %invalid.error, "cannot read object; skipping it");
    let regarding = ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(kind.clone().into_owned()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        ..Default::default()
    };
    ctx.publish(
        &regarding,
        EventType::Warning,
        INVALID_OBJECT,
        "Read",
        format!(
            "the operator cannot read this {kind} ({what}{}); it is not reconciled until it \
             changes: {fix} (kubectl edit {} -n {namespace} {name})",
            invalid.error,
            kind.to_lowercase()
        ),
    )
    .await;
}

/// Where the Rust type fails on the stored `K` (e.g. `status.conditions[0].lastTransitionTime`),
/// found by reading it again untyped; `None` when that read fails or the object reads now.
async fn unreadable_field<K>(client: &Client, namespace: &str, name: &str) -> Option<String>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + serde::de::DeserializeOwned,
{
    let api = Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        namespace,
        &kube::api::ApiResource::erase::<K>(&()),
    );
    let stored = serde_json::to_value(api.get(name).await.ok()?).ok()?;
    serde_path_to_error::deserialize::<_, K>(stored)
        .err()
        .map(|error| error.path().to_string())
}

/// `base × 2^(failures-1)`, capped at `max`.
pub fn backoff_delay(base: Duration, max: Duration, failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(20);
    base.saturating_mul(1 << exponent).min(max)
}

/// The ScaleAgent a labelled RBAC object belongs to.
fn rbac_owner<K: Resource>(obj: &K) -> Option<ObjectRef<DeserializeGuard<ScaleAgent>>> {
    let labels = obj.meta().labels.as_ref()?;
    let name = labels.get(LABEL_INSTANCE)?;
    let namespace = labels.get(OWNER_NAMESPACE_LABEL)?;
    Some(ObjectRef::new(name).within(namespace))
}

type Shutdown = futures::future::Shared<Pin<Box<dyn Future<Output = ()> + Send + Sync>>>;

/// Runs both controllers until `shutdown` completes, with `metrics` saying whether they run
/// (for `/readyz`). Fails at start when the CRDs are not installed or the operator may not
/// list and watch a kind the controllers watch: those would never recover by retrying.
/// Errors of single objects are retried with backoff and never stop a controller.
pub async fn run_controllers(
    client: Client,
    config: Config,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let namespaces = namespaces_of(&config.watch_namespaces);
    let watches: Vec<AccountWatch> = namespaces
        .iter()
        .map(|namespace| AccountWatch::new(&client, namespace.as_deref()))
        .collect();
    let caches = watches.iter().map(AccountWatch::cache).collect();
    let ctx = Arc::new(Context::new(client.clone(), config, metrics, caches));
    check_watch_access(&ctx.client, &ctx.config.watch_namespaces).await?;
    let shutdown: Shutdown =
        (Box::pin(shutdown) as Pin<Box<dyn Future<Output = ()> + Send + Sync>>).shared();

    // One pair of controllers per watched namespace, so the operator needs rights on the
    // agents' Deployments, ConfigMaps and Secrets only there.
    let mut running = Vec::new();
    let mut caches = Vec::new();
    for (namespace, accounts) in namespaces.into_iter().zip(watches) {
        let (filled, run) = pair(ctx.clone(), namespace, accounts, shutdown.clone());
        caches.push(filled);
        running.push(run);
    }
    if let WatchNamespaces::Only(_) = ctx.config.watch_namespaces {
        running.push(unwatched::run(ctx.clone(), shutdown.clone()).boxed());
    }
    tracing::info!(watch_namespaces = %ctx.config.watch_namespaces, "controllers started");
    let mut running = std::pin::pin!(futures::future::join_all(running));
    tokio::select! {
        _ = &mut running => {}
        filled = futures::future::join_all(caches) => {
            if filled.into_iter().all(|filled| filled) {
                tracing::info!("controllers running: caches filled");
                ctx.metrics.set_controllers_running(true);
            }
            running.await;
        }
    }
    ctx.metrics.set_controllers_running(false);
    tracing::info!("controllers stopped");
    Ok(())
}

/// Lists and watches every kind the controllers watch, once, so that a missing CRD or a
/// missing permission stops the operator with an error that names it instead of leaving a
/// controller retrying in the background.
async fn check_watch_access(client: &Client, watch: &WatchNamespaces) -> Result<()> {
    // troubleshooting: the operator exits at start-up
    // The operator lists every kind it watches once before it starts; a missing CRD stops it,
    // naming the kind and namespace. Apply the CRDs (`kubectl apply --server-side -k manifests/`,
    // or the chart).
    const CRDS_HINT: &str = "are the CRDs installed? kubectl apply --server-side -f manifests/crds/; \
        does the operator's ServiceAccount have the rules of manifests/operator/rbac.yaml?";
    const RBAC_HINT: &str =
        "give the operator's ServiceAccount the rules of manifests/operator/rbac.yaml";
    for namespace in namespaces_of(watch) {
        let namespace = namespace.as_deref();
        check_kind(
            api_in::<ScaleAgent>(client, namespace),
            namespace,
            CRDS_HINT,
        )
        .await?;
        check_kind(
            api_in::<AgentAccount>(client, namespace),
            namespace,
            CRDS_HINT,
        )
        .await?;
        check_kind(
            api_in::<Deployment>(client, namespace),
            namespace,
            RBAC_HINT,
        )
        .await?;
        check_kind(api_in::<ConfigMap>(client, namespace), namespace, RBAC_HINT).await?;
        check_kind(api_in::<Secret>(client, namespace), namespace, RBAC_HINT).await?;
        check_kind(
            api_in::<ServiceAccount>(client, namespace),
            namespace,
            RBAC_HINT,
        )
        .await?;
        check_kind(
            api_in::<PodDisruptionBudget>(client, namespace),
            namespace,
            RBAC_HINT,
        )
        .await?;
    }
    // RBAC objects are watched in every namespace (their owner is found by label), and with a
    // namespace list so are ScaleAgents and AgentAccounts, to refuse those outside it.
    let all = Client::clone(client);
    check_kind(Api::<ClusterRole>::all(all.clone()), None, RBAC_HINT).await?;
    check_kind(Api::<ClusterRoleBinding>::all(all.clone()), None, RBAC_HINT).await?;
    check_kind(Api::<Role>::all(all.clone()), None, RBAC_HINT).await?;
    check_kind(Api::<RoleBinding>::all(all.clone()), None, RBAC_HINT).await?;
    if let WatchNamespaces::Only(_) = watch {
        check_kind(Api::<ScaleAgent>::all(all.clone()), None, CRDS_HINT).await?;
        check_kind(Api::<AgentAccount>::all(all), None, CRDS_HINT).await?;
    }
    Ok(())
}

/// One list and one (at once closed) watch of `api`, as the controller's watcher makes.
async fn check_kind<K>(api: Api<K>, namespace: Option<&str>, hint: &str) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let scope = match namespace {
        Some(namespace) => format!("in namespace {namespace}"),
        None => "in all namespaces".to_owned(),
    };
    let what = format!("{}s {scope} ({hint})", K::kind(&()));
    let list = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .map_err(kube_err(format!("list {what}")))?;
    let version = list.metadata.resource_version.unwrap_or_default();
    // The API server refuses a watch in the response head; the events are not needed.
    let events = api
        .watch_metadata(&WatchParams::default().timeout(1), &version)
        .await
        .map_err(kube_err(format!("watch {what}")))?;
    drop(events);
    Ok(())
}

/// `Some(namespace)` per watched namespace, or `None` for all of them.
fn namespaces_of(watch: &WatchNamespaces) -> Vec<Option<String>> {
    match watch {
        WatchNamespaces::All => vec![None],
        WatchNamespaces::Only(namespaces) => namespaces.iter().cloned().map(Some).collect(),
    }
}

/// An API for `K` in `namespace`, or in all namespaces.
fn api_in<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// The one AgentAccount watch of a namespace (or all), not yet running: its cache, and what
/// fills it.
struct AccountWatch {
    store: AccountStore,
    writer: reflector::store::Writer<GuardedAccount>,
    filled: tokio::sync::watch::Sender<bool>,
    api: Api<GuardedAccount>,
}

impl AccountWatch {
    fn new(client: &Client, namespace: Option<&str>) -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            writer,
            filled: tokio::sync::watch::Sender::new(false),
            api: api_in(client, namespace),
        }
    }

    fn cache(&self) -> AccountCache {
        AccountCache {
            store: self.store.clone(),
            filled: self.filled.subscribe(),
        }
    }
}

/// `events` (a reflector's), saying on `filled` when the first list is in.
fn signal_filled<K, S>(
    events: S,
    filled: tokio::sync::watch::Sender<bool>,
) -> impl futures::Stream<Item = S::Item>
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    events.inspect(move |event| {
        if let Ok(watcher::Event::InitDone) = event {
            filled.send_replace(true);
        }
    })
}

/// Room for changed AgentAccounts on their way to a controller; the watch waits when full.
const ACCOUNT_FAN_OUT: usize = 64;

/// The ScaleAgent and AgentAccount controllers of one namespace (or all): a future that
/// completes once both caches hold their first list (true) or a cache is gone (false), and
/// the future that runs them until shutdown.
///
/// One AgentAccount watch fills the cache every reconcile reads, then hands each changed
/// account to both controllers: a reconcile never sees a cache older than its trigger.
fn pair(
    ctx: Arc<Context>,
    namespace: Option<String>,
    accounts: AccountWatch,
    shutdown: Shutdown,
) -> (BoxFuture<'static, bool>, BoxFuture<'static, ()>) {
    let namespace = namespace.as_deref();
    let agents = api_in::<DeserializeGuard<ScaleAgent>>(&ctx.client, namespace);
    let AccountWatch {
        store: account_store,
        writer,
        filled: accounts_filled,
        api,
    } = accounts;
    let accounts_filled_rx = accounts_filled.subscribe();
    let (to_accounts, for_accounts) = mpsc::channel::<GuardedAccount>(ACCOUNT_FAN_OUT);
    let (to_peers, for_peers) = mpsc::channel::<GuardedAccount>(ACCOUNT_FAN_OUT);
    let (to_agents, for_agents) = mpsc::channel::<GuardedAccount>(ACCOUNT_FAN_OUT);
    let feed = signal_filled(
        reflector::reflector(
            writer,
            watcher::watcher(api, watcher::Config::default().any_semantic()),
        )
        .default_backoff(),
        accounts_filled,
    )
    .touched_objects()
    .take_until(shutdown.clone())
    .for_each(move |touched| {
        let mut senders = [to_accounts.clone(), to_peers.clone(), to_agents.clone()];
        async move {
            match touched {
                Ok(account) => {
                    for sender in &mut senders {
                        // A controller that has stopped takes no more; the others still do.
                        let _ = sender.send(account.clone()).await;
                    }
                }
                Err(error) => {
                    tracing::warn!(error = %Chain(&error), "cannot watch AgentAccounts; retrying");
                }
            }
        }
    });
    let (agents_filled, agents_filled_rx) = tokio::sync::watch::channel(false);
    let agent_controller = scale_agent_controller(
        &ctx,
        namespace,
        agents_filled,
        for_agents,
        account_store.clone(),
        shutdown.clone(),
    );
    let filled = {
        let mut agents = agents_filled_rx.clone();
        let mut accounts = accounts_filled_rx.clone();
        async move {
            let (agents, accounts) = futures::join!(
                async { agents.wait_for(|filled| *filled).await.is_ok() },
                async { accounts.wait_for(|filled| *filled).await.is_ok() }
            );
            agents && accounts
        }
    };
    let account_controller = Controller::for_stream(
        for_accounts.map(Ok::<_, watcher::Error>),
        account_store.clone(),
    )
    .watches(agents, watcher::Config::default(), {
        let store = account_store.clone();
        move |agent: DeserializeGuard<ScaleAgent>| match agent.0 {
            Ok(agent) => store
                .state()
                .into_iter()
                .filter(|a| a.0.as_ref().is_ok_and(|a| validate::refers_to(a, &agent)))
                .map(|a| ObjectRef::from_obj(&*a))
                .collect::<Vec<_>>(),
            // Accounts of an unreadable agent are reconciled on their own changes.
            Err(_) => Vec::new(),
        }
    })
    .watches_stream(for_peers.map(Ok::<_, watcher::Error>), {
        let store = account_store.clone();
        move |changed: GuardedAccount| same_account_name(&store, &changed)
    })
    .graceful_shutdown_on(shutdown.clone());

    let agents_done = agent_controller.run(
        scale_agent::reconcile_guarded,
        scale_agent::error_policy,
        ctx.clone(),
    );
    let agents_done = stop_unfilled(agents_done, filled_now(agents_filled_rx), shutdown.clone())
        .for_each(|result| async move {
            if let Err(error) = result {
                log_controller_error("ScaleAgent", &error);
            }
        });
    let accounts_done =
        account_controller.run(agent_account::reconcile, agent_account::error_policy, ctx);
    let accounts_done = stop_unfilled(accounts_done, filled_now(accounts_filled_rx), shutdown)
        .for_each(|result| async move {
            if let Err(error) = result {
                log_controller_error("AgentAccount", &error);
            }
        });
    let running = futures::future::join3(feed, agents_done, accounts_done).map(|_| ());
    (filled.boxed(), running.boxed())
}

/// A controller's results until it ends by itself or, at shutdown, at once when its cache was
/// never filled.
///
/// kube-runtime's graceful shutdown ends the watches and then waits for the runner, which
/// starts only once the cache holds its first list: a controller stopped before that (a slow
/// LIST under load, or one that keeps failing) would wait forever. No reconcile has run
/// then, so there is nothing to wait for.
pub(crate) fn stop_unfilled<S>(
    results: S,
    filled: impl FnOnce() -> bool + Send + 'static,
    shutdown: Shutdown,
) -> impl futures::Stream<Item = S::Item>
where
    S: futures::Stream,
{
    let unfilled_at_shutdown = async move {
        shutdown.await;
        if filled() {
            // Filled: the graceful shutdown finishes the reconciles in flight, then ends.
            std::future::pending::<()>().await;
        }
        tracing::debug!("controller stopped before its cache was filled");
    };
    results.take_until(unfilled_at_shutdown)
}

/// Whether the cache behind `filled` holds its first list, when asked.
fn filled_now(filled: tokio::sync::watch::Receiver<bool>) -> impl FnOnce() -> bool + Send {
    move || *filled.borrow()
}

/// Whether `store` holds its first list, when asked. Only at shutdown: the poll takes the
/// runner's place as the one task kube-runtime wakes when the store fills.
pub(crate) fn store_filled_now<K>(store: Store<K>) -> impl FnOnce() -> bool + Send
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    move || matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// Logs an error of a controller's stream: at `warn` when the controller cannot watch (a
/// watch forbidden, an object that cannot be read) — it retries, but nothing else would say
/// so; at `debug` a failed reconcile (the error policy logs it) or an object gone meanwhile.
pub(crate) fn log_controller_error<Q: std::error::Error + 'static>(
    controller: &str,
    error: &controller::Error<crate::Error, Q>,
) {
    match error {
        controller::Error::QueueError(_) | controller::Error::RunnerError(_) => {
            tracing::warn!(error = %Chain(error), controller, "controller cannot watch; retrying");
        }
        controller::Error::ReconcilerFailed(..) | controller::Error::ObjectNotFound(_) => {
            tracing::debug!(error = %Chain(error), controller, "controller event");
        }
    }
}

/// Accounts sharing `changed`'s Spinnaker account name: a change to one can change which of
/// them is the duplicate.
fn same_account_name(
    store: &AccountStore,
    changed: &GuardedAccount,
) -> Vec<ObjectRef<GuardedAccount>> {
    let Ok(changed) = &changed.0 else {
        return Vec::new();
    };
    let Some(name) = changed.account_name() else {
        return Vec::new();
    };
    store
        .state()
        .into_iter()
        .filter(|guarded| {
            guarded.0.as_ref().is_ok_and(|a| {
                a.account_name() == Some(name)
                    && (a.namespace() != changed.namespace() || a.name_any() != changed.name_any())
            })
        })
        .map(|guarded| ObjectRef::from_obj(&*guarded))
        .collect()
}

/// The ScaleAgent controller of `namespace` (or all), its cache filled by its own watch,
/// which says on `filled` when the first list is in.
fn scale_agent_controller(
    ctx: &Context,
    namespace: Option<&str>,
    filled: tokio::sync::watch::Sender<bool>,
    changed_accounts: mpsc::Receiver<GuardedAccount>,
    account_store: AccountStore,
    shutdown: Shutdown,
) -> Controller<DeserializeGuard<ScaleAgent>> {
    let client = &ctx.client;
    let owned = watcher::Config::default()
        .labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"))
        .any_semantic();
    // Read per object: one ScaleAgent that does not fit the Rust type must not fail the list
    // of all of them.
    let (store, writer) = reflector::store();
    let agents = signal_filled(
        reflector::reflector(
            writer,
            watcher::watcher(
                api_in::<DeserializeGuard<ScaleAgent>>(client, namespace),
                watcher::Config::default().any_semantic(),
            ),
        )
        .default_backoff(),
        filled,
    )
    .touched_objects();
    Controller::for_stream(agents, store)
        .owns(api_in::<Deployment>(client, namespace), owned.clone())
        .owns(api_in::<ConfigMap>(client, namespace), owned.clone())
        .owns(api_in::<Secret>(client, namespace), owned.clone())
        .owns(api_in::<ServiceAccount>(client, namespace), owned.clone())
        .owns(
            api_in::<PodDisruptionBudget>(client, namespace),
            owned.clone(),
        )
        .watches(
            Api::<ClusterRole>::all(client.clone()),
            owned.clone(),
            |o| rbac_owner(&o),
        )
        .watches(
            Api::<ClusterRoleBinding>::all(client.clone()),
            owned.clone(),
            |o| rbac_owner(&o),
        )
        .watches(Api::<Role>::all(client.clone()), owned.clone(), |o| {
            rbac_owner(&o)
        })
        .watches(Api::<RoleBinding>::all(client.clone()), owned, |o| {
            rbac_owner(&o)
        })
        .watches_stream(
            changed_accounts.map(Ok::<_, watcher::Error>),
            move |guarded: GuardedAccount| {
                // An unreadable account names no agent; it is left out of every agent's config
                // at the agent's next reconcile.
                let Ok(account) = &guarded.0 else {
                    return Vec::new();
                };
                // Its own agent, and the agents of accounts whose duplicate status it may change.
                let mut refs = vec![agent_of(account)];
                refs.extend(
                    same_account_name(&account_store, &guarded)
                        .into_iter()
                        .filter_map(|r| account_store.get(&r))
                        .filter_map(|a| a.0.as_ref().ok().map(agent_of)),
                );
                refs.sort_by_key(|r| (r.namespace.clone(), r.name.clone()));
                refs.dedup();
                refs
            },
        )
        .graceful_shutdown_on(shutdown)
}

fn agent_of(account: &AgentAccount) -> ObjectRef<DeserializeGuard<ScaleAgent>> {
    let r = ObjectRef::new(&account.spec.agent_ref);
    match account.namespace() {
        Some(ns) => r.within(&ns),
        None => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let base = Duration::from_secs(2);
        let max = Duration::from_secs(60);
        let delays: Vec<_> = (1..=7)
            .map(|n| backoff_delay(base, max, n).as_secs())
            .collect();
        assert_eq!(delays, [2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(backoff_delay(base, max, u32::MAX), max);
    }
}
