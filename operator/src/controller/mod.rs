//! The two controllers, their shared context, and the per-object retry backoff.

pub mod agent_account;
pub mod scale_agent;
pub mod unwatched;

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{FutureExt, StreamExt, future::BoxFuture};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, ObjectReference, Secret, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, WatchParams},
    core::DeserializeGuard,
    runtime::{
        Controller, controller,
        events::{Event, EventType, Recorder, Reporter},
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use scale_agent_crds::{AgentAccount, LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY, ScaleAgent};

use crate::{
    desired::OWNER_NAMESPACE_LABEL,
    error::{Result, kube_err},
    metrics::Metrics,
    policy::{self, WatchNamespaces},
    validate,
};

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
}

impl Context {
    /// A context for `client`.
    pub fn new(client: Client, config: Config, metrics: Arc<Metrics>) -> Self {
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
        }
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

    /// Every `K` in the watched namespaces.
    pub async fn list_watched<K>(&self) -> Result<Vec<K>>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let mut items = Vec::new();
        for api in self.watched_apis::<K>() {
            items.extend(
                api.list(&ListParams::default())
                    .await
                    .map_err(kube_err(format!("list {}s", K::kind(&()))))?
                    .items,
            );
        }
        Ok(items)
    }

    /// Forgets the failures of `key` after a success.
    pub fn reset_backoff(&self, key: &str) {
        if let Ok(mut map) = self.failures.lock() {
            map.remove(key);
        }
    }

    /// Publishes an Event about `regarding`; a failure is logged, never returned.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let mut note = note;
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(%error, reason, "failed to publish event");
        }
    }
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
    let ctx = Arc::new(Context::new(client.clone(), config, metrics));
    check_watch_access(&ctx.client, &ctx.config.watch_namespaces).await?;
    let shutdown: Shutdown =
        (Box::pin(shutdown) as Pin<Box<dyn Future<Output = ()> + Send + Sync>>).shared();

    // One pair of controllers per watched namespace, so the operator needs rights on the
    // agents' Deployments, ConfigMaps and Secrets only there.
    let mut running = Vec::new();
    let mut caches = Vec::new();
    for namespace in namespaces_of(&ctx.config.watch_namespaces) {
        let (filled, run) = pair(ctx.clone(), namespace, shutdown.clone());
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

/// The ScaleAgent and AgentAccount controllers of one namespace (or all): a future that
/// completes once both caches hold their first list (true) or a cache is gone (false), and
/// the future that runs them until shutdown.
fn pair(
    ctx: Arc<Context>,
    namespace: Option<String>,
    shutdown: Shutdown,
) -> (BoxFuture<'static, bool>, BoxFuture<'static, ()>) {
    let namespace = namespace.as_deref();
    let agents = api_in::<DeserializeGuard<ScaleAgent>>(&ctx.client, namespace);
    let accounts = api_in::<AgentAccount>(&ctx.client, namespace);
    let account_controller =
        Controller::new(accounts.clone(), watcher::Config::default().any_semantic());
    let account_store = account_controller.store();
    let agent_controller =
        scale_agent_controller(&ctx, namespace, account_store.clone(), shutdown.clone());
    let filled = {
        let agent_store = agent_controller.store();
        let account_store = account_store.clone();
        async move {
            let (agents, accounts) = futures::join!(
                agent_store.wait_until_ready(),
                account_store.wait_until_ready()
            );
            agents.is_ok() && accounts.is_ok()
        }
    };
    let account_controller = account_controller
        .watches(agents, watcher::Config::default(), {
            let store = account_store.clone();
            move |agent: DeserializeGuard<ScaleAgent>| match agent.0 {
                Ok(agent) => store
                    .state()
                    .into_iter()
                    .filter(|a| validate::refers_to(a, &agent))
                    .map(|a| ObjectRef::from_obj(&*a))
                    .collect::<Vec<_>>(),
                // Accounts of an unreadable agent are reconciled on their own changes.
                Err(_) => Vec::new(),
            }
        })
        .watches(accounts, watcher::Config::default(), {
            let store = account_store.clone();
            move |changed: AgentAccount| same_account_name(&store, &changed)
        })
        .graceful_shutdown_on(shutdown.clone());

    let agent_store = agent_controller.store();
    let agents_done = agent_controller.run(
        scale_agent::reconcile_guarded,
        scale_agent::error_policy,
        ctx.clone(),
    );
    let agents_done =
        stop_unfilled(agents_done, agent_store, shutdown.clone()).for_each(|result| async move {
            if let Err(error) = result {
                log_controller_error("ScaleAgent", &error);
            }
        });
    let accounts_done =
        account_controller.run(agent_account::reconcile, agent_account::error_policy, ctx);
    let accounts_done =
        stop_unfilled(accounts_done, account_store, shutdown).for_each(|result| async move {
            if let Err(error) = result {
                log_controller_error("AgentAccount", &error);
            }
        });
    let running = futures::future::join(agents_done, accounts_done).map(|_| ());
    (filled.boxed(), running.boxed())
}

/// A controller's results until it ends by itself or, at shutdown, at once when its cache was
/// never filled.
///
/// kube-runtime's graceful shutdown ends the watches and then waits for the runner, which
/// starts only once the cache holds its first list: a controller stopped before that (a slow
/// LIST under load, or one that keeps failing) would wait forever. No reconcile has run
/// then, so there is nothing to wait for.
pub(crate) fn stop_unfilled<K, S>(
    results: S,
    store: Store<K>,
    shutdown: Shutdown,
) -> impl futures::Stream<Item = S::Item>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
    S: futures::Stream,
{
    let unfilled_at_shutdown = async move {
        shutdown.await;
        if matches!(store.wait_until_ready().now_or_never(), Some(Ok(()))) {
            // Filled: the graceful shutdown finishes the reconciles in flight, then ends.
            std::future::pending::<()>().await;
        }
        tracing::debug!("controller stopped before its cache was filled");
    };
    results.take_until(unfilled_at_shutdown)
}

/// Logs an error of a controller's stream: at `warn` when the controller cannot watch (a
/// watch forbidden, an object that cannot be read) — it retries, but nothing else would say
/// so; at `debug` a failed reconcile (the error policy logs it) or an object gone meanwhile.
pub(crate) fn log_controller_error<Q: std::error::Error>(
    controller: &str,
    error: &controller::Error<crate::Error, Q>,
) {
    match error {
        controller::Error::QueueError(_) | controller::Error::RunnerError(_) => {
            tracing::warn!(%error, controller, "controller cannot watch; retrying");
        }
        controller::Error::ReconcilerFailed(..) | controller::Error::ObjectNotFound(_) => {
            tracing::debug!(%error, controller, "controller event");
        }
    }
}

/// Accounts sharing `changed`'s Spinnaker account name: a change to one can change which of
/// them is the duplicate.
fn same_account_name(
    store: &Store<AgentAccount>,
    changed: &AgentAccount,
) -> Vec<ObjectRef<AgentAccount>> {
    let Some(name) = changed.account_name() else {
        return Vec::new();
    };
    store
        .state()
        .into_iter()
        .filter(|a| a.account_name() == Some(name))
        .filter(|a| a.namespace() != changed.namespace() || a.name_any() != changed.name_any())
        .map(|a| ObjectRef::from_obj(&*a))
        .collect()
}

fn scale_agent_controller(
    ctx: &Context,
    namespace: Option<&str>,
    account_store: Store<AgentAccount>,
    shutdown: Shutdown,
) -> Controller<DeserializeGuard<ScaleAgent>> {
    let client = &ctx.client;
    let owned = watcher::Config::default()
        .labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"))
        .any_semantic();
    // Read per object: one ScaleAgent that does not fit the Rust type must not fail the list
    // of all of them.
    Controller::new(
        api_in::<DeserializeGuard<ScaleAgent>>(client, namespace),
        watcher::Config::default().any_semantic(),
    )
    .owns(api_in::<Deployment>(client, namespace), owned.clone())
    .owns(api_in::<ConfigMap>(client, namespace), owned.clone())
    .owns(api_in::<Secret>(client, namespace), owned.clone())
    .owns(api_in::<ServiceAccount>(client, namespace), owned.clone())
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
    .watches(
        api_in::<AgentAccount>(client, namespace),
        watcher::Config::default(),
        move |account: AgentAccount| {
            // Its own agent, and the agents of accounts whose duplicate status it may change.
            let mut refs = vec![agent_of(&account)];
            refs.extend(
                same_account_name(&account_store, &account)
                    .into_iter()
                    .filter_map(|r| account_store.get(&r))
                    .map(|a| agent_of(&a)),
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
