//! [`Live`]: the handle on the hub's live state that the rest of the hub is given instead of
//! the whole hub. The registry and cache, the running streams and the messages sent to them
//! ([`Control`], [`SessionHandle`]), the dynamic accounts, the accounts' state transitions,
//! the rotation over replicas, and the signals "replicas changed" (operations waiting for an
//! agent) and "agents came or went" (the ownership task).

use std::{
    collections::HashMap,
    sync::{
        Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Instant, SystemTime},
};

use scale_agent_hub_cache::SharedCache;
use scale_agent_proto::v1 as pb;
use tokio::sync::{Notify, mpsc};

use crate::{
    dynamic_accounts::DynamicAccounts,
    hearing::Hearing,
    metrics::StreamMetrics,
    registry::{self, Promotion, Registry, SessionId},
    session::HubState,
    tunnel,
};

/// A message to a running stream from elsewhere in the hub.
#[derive(Debug)]
pub enum Control {
    /// This stream now streams the account: send it a STREAMING assignment.
    Promote(String),
    /// End the stream with this status.
    Close(tonic::Status),
    /// Tell the agent an account's state.
    AccountState(pb::AccountState),
    /// Tell the agent which replicas of its identity are connected.
    AgentReplicas(pb::AgentReplicas),
    /// Send the agent its identity's dynamic accounts.
    DynamicAccounts(pb::DynamicAccounts),
}

/// What the rest of the hub holds of one agent stream.
pub struct SessionHandle {
    /// Promotions, replacement, account states: handled by the stream's loop.
    pub control: mpsc::Sender<Control>,
    /// The stream's outbound queue, for tunnel frames and operations, which must not wait
    /// for that loop (see `dispatch`).
    pub outbound: tunnel::AgentSender,
    /// The tunnel window when the agent announced the `http-tunnel` capability.
    pub tunnel_window: Option<u32>,
    /// When the stream last heard from its agent (its loop notes each message).
    pub hearing: std::sync::Arc<Hearing>,
}

/// An account's state as the wire carries it.
pub fn account_state_message(account: &str, record: &registry::StateRecord) -> pb::AccountState {
    use pb::account_state::State;
    let state = match record.state {
        registry::AccountState::Active => State::Active,
        registry::AccountState::Inactive => State::Inactive,
        registry::AccountState::Failed => State::Failed,
        registry::AccountState::Orphaned => State::Orphaned,
    };
    pb::AccountState {
        account: account.to_string(),
        state: state as i32,
        reason: record.reason.clone(),
        since_unix_millis: jiff::Timestamp::try_from(record.since)
            .map(|t| t.as_millisecond())
            .unwrap_or_default(),
    }
}

/// What the caches built on the live state (the Kubernetes API proxy's discovery documents
/// and its reads from the cache, in a crate above this one) hear of it. The hub gives
/// [`Live`] one at start-up; the stream loop and the ownership task tell it through `Live`
/// instead of reaching into the proxy.
pub trait CacheEvents: Send + Sync {
    /// The cache moved (a batch applied, an account taken over): reads waiting for a
    /// resourceVersion look again.
    fn cache_advanced(&self);
    /// The account left this replica (grace period over, or another replica owns it now):
    /// what was cached of its discovery goes.
    fn account_forgotten(&self, account: &str);
    /// The account's cluster serves other kinds now (a CRD came or went): what was cached of
    /// its discovery is stale.
    fn kinds_changed(&self, account: &str);
}

/// No cache listens (tests of the state alone).
struct NoCacheEvents;

impl CacheEvents for NoCacheEvents {
    fn cache_advanced(&self) {}
    fn account_forgotten(&self, _account: &str) {}
    fn kinds_changed(&self, _account: &str) {}
}

/// The live state of the agents' streams, shared by the gRPC service, the HTTP API, the
/// proxy, the operations and the background tasks.
///
/// Locks, in the order they are taken (see also [`SharedCache`]): the registry (shared by
/// the stream loops' batches and the proxy's reads, exclusive for registrations, streams
/// coming and going and ownership changes), then the cache's directory or one account's
/// cache, then the store's queue; `sessions` and `dynamic_accounts` are taken alone.
pub struct Live {
    registry: RwLock<Registry>,
    /// Every account's cache, each behind its own lock.
    cache: SharedCache,
    sessions: Mutex<HashMap<SessionId, SessionHandle>>,
    /// Accounts added through the dynamic accounts API, and the agents' reports on them.
    dynamic_accounts: Mutex<DynamicAccounts>,
    metrics: StreamMetrics,
    /// The rotation over an account's replicas ([`Live::pick`]).
    round_robin: AtomicU64,
    /// Woken when replicas connect or register (operations waiting for an agent).
    replicas: Notify,
    /// One replica owns every account (set at start-up): agents coming and going need no
    /// ownership work.
    owns_everything: bool,
    /// Wakes the ownership task (the hub's `owners::duty`) when agents come or go.
    owners_wake: Notify,
    /// The caches above that hear of changes ([`Live::set_cache_events`]).
    cache_events: std::sync::RwLock<std::sync::Arc<dyn CacheEvents>>,
    /// The streams and staged bytes of each agent identity (review F14).
    identity_use: std::sync::Arc<crate::identity_use::IdentityUse>,
}

impl Live {
    /// `owns_everything`: one replica owns every account, so nobody waits on
    /// [`Live::owners_wake`].
    pub fn new(
        state: HubState,
        dynamic_accounts: DynamicAccounts,
        metrics: StreamMetrics,
        owns_everything: bool,
    ) -> Self {
        Live {
            registry: RwLock::new(state.registry),
            cache: SharedCache::new(state.cache),
            sessions: Mutex::new(HashMap::new()),
            dynamic_accounts: Mutex::new(dynamic_accounts),
            metrics,
            round_robin: AtomicU64::new(0),
            replicas: Notify::new(),
            owns_everything,
            owners_wake: Notify::new(),
            cache_events: std::sync::RwLock::new(std::sync::Arc::new(NoCacheEvents)),
            identity_use: Default::default(),
        }
    }

    /// Who hears of cache changes from now on (the hub sets the proxy's caches once, at
    /// start-up).
    pub fn set_cache_events(&self, events: std::sync::Arc<dyn CacheEvents>) {
        *self.cache_events.write().unwrap_or_else(|e| e.into_inner()) = events;
    }

    fn cache_events(&self) -> std::sync::Arc<dyn CacheEvents> {
        self.cache_events
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The cache moved: tells the caches above ([`CacheEvents::cache_advanced`]).
    pub fn cache_advanced(&self) {
        self.cache_events().cache_advanced();
    }

    /// The account left this replica: tells the caches above
    /// ([`CacheEvents::account_forgotten`]).
    pub fn account_forgotten(&self, account: &str) {
        self.cache_events().account_forgotten(account);
    }

    /// The account's cluster serves other kinds now: tells the caches above
    /// ([`CacheEvents::kinds_changed`]).
    pub fn kinds_changed(&self, account: &str) {
        self.cache_events().kinds_changed(account);
    }

    /// The streams and staged bytes of each agent identity: a stream joins at its start
    /// (`--max-streams-per-identity`) and its session counts what it stages.
    pub fn identity_use(&self) -> &std::sync::Arc<crate::identity_use::IdentityUse> {
        &self.identity_use
    }

    /// The registry, exclusively: for what changes it (a poisoned lock is taken over: the
    /// registry is kept consistent by each critical section, which never panics by design).
    pub fn registry(&self) -> RwLockWriteGuard<'_, Registry> {
        self.registry.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The registry, shared: for the stream loops' batches of objects and the reads, which
    /// never wait for each other on it.
    pub fn registry_read(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Every account's cache, each behind its own lock.
    pub fn cache(&self) -> &SharedCache {
        &self.cache
    }

    pub fn sessions(&self) -> MutexGuard<'_, HashMap<SessionId, SessionHandle>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Dynamic accounts and the agents' reports on them.
    pub fn dynamic_accounts(&self) -> MutexGuard<'_, DynamicAccounts> {
        self.dynamic_accounts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Agents came or went: the ownership task looks at what to acquire or release.
    pub fn agents_changed(&self) {
        if !self.owns_everything {
            self.owners_wake.notify_one();
        }
    }

    /// What the ownership task waits on besides its timer ([`Live::agents_changed`]).
    pub fn owners_wake(&self) -> &Notify {
        &self.owners_wake
    }

    /// Sends a control message to a stream without waiting.
    pub fn control(&self, session: SessionId, message: Control) {
        let Some(tx) = self.sessions().get(&session).map(|h| h.control.clone()) else {
            return;
        };
        if let Err(mpsc::error::TrySendError::Full(message)) = tx.try_send(message) {
            tokio::spawn(async move {
                let _ = tx.send(message).await;
            });
        }
    }

    pub fn deliver(&self, promotions: Vec<Promotion>) {
        for p in promotions {
            self.control(p.session, Control::Promote(p.account));
        }
    }

    /// Brings the accounts' states up to date: logs and counts each transition and tells the
    /// streams concerned. Called after anything that changes the registry.
    pub fn observe_states(&self) {
        // Operations waiting for an agent of an account look again.
        self.replicas_changed();
        let told = {
            let mut registry = self.registry();
            let transitions = registry.observe(SystemTime::now());
            transitions
                .into_iter()
                .map(|t| {
                    let sessions = registry.interested_in(&t.account);
                    (t, sessions)
                })
                .collect::<Vec<_>>()
        };
        for (t, sessions) in told {
            let from = t.from.map(|s| s.as_str()).unwrap_or("NEW");
            tracing::info!(account = %t.account, from, to = t.to.state.as_str(), reason = %t.to.reason, "account state changed");
            self.metrics
                .account_transitions
                .get_or_create(&[("state", t.to.state.as_str())])
                .inc();
            let message = account_state_message(&t.account, &t.to);
            for session in sessions {
                self.control(session, Control::AccountState(message.clone()));
            }
        }
    }

    /// Tells every stream of `identity` which of its replicas are connected now.
    pub fn announce_replicas(&self, identity: &str) {
        let replicas = self.registry_read().replicas_of_identity(identity);
        let message = pb::AgentReplicas {
            replicas: replicas.iter().map(|(_, r)| r.clone()).collect(),
        };
        for (session, _) in replicas {
            self.control(session, Control::AgentReplicas(message.clone()));
        }
    }

    /// The current state of each of `accounts`, as sent to agents.
    pub fn account_states(&self, accounts: &[String]) -> Vec<pb::AccountState> {
        let registry = self.registry_read();
        accounts
            .iter()
            .filter_map(|a| registry.states.get(a).map(|r| account_state_message(a, r)))
            .collect()
    }

    /// The streaming agent of `account` here, when its heartbeat is overdue (see
    /// [`Hearing::silent_since`]): since when it has been silent, and its heartbeat period.
    /// `None` when it is heard from, or no agent streams the account here.
    pub fn streaming_silent(&self, account: &str) -> Option<(Instant, std::time::Duration)> {
        let session = self.registry_read().accounts.get(account)?.streaming?;
        let hearing = self.sessions().get(&session)?.hearing.clone();
        hearing
            .silent_since()
            .map(|since| (since, hearing.period()))
    }

    /// A rotating index for choosing among `n` replicas: anything that sends work to an
    /// account's agents (`dispatch::pick_and_queue`, for the operations and the proxy) shares this
    /// rotation, so consecutive requests spread over the replicas.
    pub fn pick(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.round_robin.fetch_add(1, Ordering::Relaxed) as usize) % n
    }

    /// Replicas connected, registered or left: operations waiting for one look again.
    pub fn replicas_changed(&self) {
        self.replicas.notify_waiters();
    }

    /// Waits for [`Self::replicas_changed`] or `until`, whichever is first; false at `until`.
    /// `check` is called once the wait is armed, so no change between it and the wait is
    /// missed: true ends the wait at once.
    pub async fn wait_for_replicas(&self, until: Instant, check: impl FnOnce() -> bool) -> bool {
        let changed = self.replicas.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if check() {
            return true;
        }
        tokio::time::timeout_at(until.into(), changed).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;

    fn live(owns_everything: bool) -> Arc<Live> {
        Arc::new(Live::new(
            HubState::default(),
            DynamicAccounts::default(),
            StreamMetrics::default(),
            owns_everything,
        ))
    }

    #[tokio::test]
    async fn one_rotation_over_replicas_and_observing_states_wakes_waiting_operations() {
        let live = live(true);
        let picks: Vec<usize> = (0..4).map(|_| live.pick(3)).collect();
        assert_eq!(picks, [0, 1, 2, 0]);
        assert_eq!(live.pick(0), 0);

        let (armed_tx, armed) = std::sync::mpsc::channel();
        let waiter = tokio::spawn({
            let live = live.clone();
            async move {
                let until = Instant::now() + Duration::from_secs(30);
                live.wait_for_replicas(until, move || armed_tx.send(()).is_err())
                    .await
            }
        });
        while armed.try_recv().is_err() {
            tokio::task::yield_now().await;
        }
        live.observe_states();
        assert!(
            waiter.await.unwrap(),
            "woken by observe_states, not at the deadline"
        );
        let past = Instant::now();
        assert!(!live.wait_for_replicas(past, || false).await);
        assert!(live.wait_for_replicas(past, || true).await);
    }

    #[tokio::test]
    async fn agents_coming_and_going_wake_the_ownership_task_only_with_shared_ownership() {
        let woken = |live: Arc<Live>| async move {
            live.agents_changed();
            tokio::time::timeout(Duration::from_millis(20), live.owners_wake().notified())
                .await
                .is_ok()
        };
        assert!(woken(live(false)).await);
        assert!(!woken(live(true)).await);
    }
}
