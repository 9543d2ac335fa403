//! What the agent is doing, shared by its tasks and shown on the admin port (`/accounts`,
//! `/readyz`).

use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use crate::{kinds::KindRef, metrics::Metrics};

/// State of one watch (one kind in one watch namespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum KindState {
    /// Waiting for the list budget or the first response.
    Starting,
    /// Listed or resumed, and watching.
    Watching,
    /// RBAC forbids list or watch; retried every few minutes and on config change.
    Forbidden,
    /// The API server failed; retried with backoff.
    Failing,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindView {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    /// Empty for a cluster-wide watch.
    pub watch_namespace: String,
    pub state: KindState,
    /// The API server's message for `forbidden` and `failing`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Last resourceVersion seen (the resume point the hub will hold).
    pub resource_version: String,
    /// Object events sent (snapshots and deltas).
    pub objects_sent: u64,
    pub lists: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    pub api_server_host: String,
    pub ca_fingerprint: String,
    pub kubernetes_version: String,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AccountView {
    pub name: String,
    /// `pending` (not registered or not answered yet), `streaming`, `standby` or `rejected`.
    pub role: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejection_reason: Option<String>,
    /// Why the account cannot be registered or discovered (bad credentials, unreachable
    /// API server, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterView>,
    /// Its credentials are loaded and its API server answered (the agent's own part, which
    /// `/readyz` reports; retried with backoff until it holds, the reason in `error`).
    pub prepared: bool,
    /// Discovery is done and the kinds' watches are started.
    pub kinds_started: bool,
    pub kinds: Vec<KindView>,
    /// The account's state as the hub last reported it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub_state: Option<HubAccountState>,
}

/// An account's lifecycle state in the hub (ACTIVE, INACTIVE, FAILED, ORPHANED).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HubAccountState {
    pub state: String,
    pub reason: String,
    pub since_unix_millis: i64,
}

impl AccountView {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            role: ROLE_PENDING.into(),
            rejection_reason: None,
            error: None,
            cluster: None,
            prepared: false,
            kinds_started: false,
            kinds: Vec::new(),
            hub_state: None,
        }
    }

    /// Its credentials or its API server failed the last attempt to prepare it (retried
    /// with backoff): the agent serves its other accounts meanwhile.
    pub fn failing(&self) -> bool {
        !self.prepared && self.error.is_some()
    }

    /// Registered and answered, with a streaming account's kinds all started.
    fn synced(&self) -> bool {
        match self.role.as_str() {
            ROLE_STREAMING => {
                self.kinds_started && self.kinds.iter().all(|k| k.state != KindState::Starting)
            }
            ROLE_STANDBY | ROLE_REJECTED => true,
            _ => false,
        }
    }
}

pub const ROLE_PENDING: &str = "pending";
pub const ROLE_STREAMING: &str = "streaming";
pub const ROLE_STANDBY: &str = "standby";
pub const ROLE_REJECTED: &str = "rejected";

/// The config file as the agent last read it.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigView {
    pub path: String,
    /// Why the config in use is not the file's current content (missing, unreadable,
    /// invalid) or is the defaults; absent when the file was read and applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Keys of the config in use that no setting reads, with the closest known key.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unknown_keys: Vec<String>,
    /// Armory keys of the config in use that have no effect here, with what to use instead.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub without_effect: Vec<String>,
}

/// The whole admin view.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentView {
    pub replica: String,
    pub hub: String,
    pub hub_connected: bool,
    /// Connected to the hub, every account answered and a streaming account's kinds all
    /// started ([`AgentView::synced`], filled in by [`Shared::view`]): what a script waits
    /// for before it reads the hub. Unlike `/readyz` this depends on the hub.
    pub synced: bool,
    /// The heartbeat period of the current (or last) stream, as the hub granted it in
    /// Welcome; 0 before the first.
    pub heartbeat_period_seconds: u32,
    /// The identity the hub read from the client certificate (Welcome).
    pub hub_identity: String,
    /// Why the last stream to the hub ended or could not start; kept while connected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub_error: Option<String>,
    /// The replicas of this agent's identity connected to the hub, as the hub last said.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hub_replicas: Vec<String>,
    pub config: ConfigView,
    pub accounts: Vec<AccountView>,
}

impl AgentView {
    /// What `/readyz` answers: the agent itself works, that is it has no account or at least
    /// one account's credentials are loaded and its API server answered. One unreachable
    /// target cluster must not make an agent serving many accounts NotReady (a rollout
    /// rolled back, a page for the others); the failing account shows on `/accounts`, in
    /// `scale_agent_agent_account_ready` and in its AgentAccount's `Connected` condition
    /// ([`AccountView::failing`]). The hub is not part of it either: a hub outage must not
    /// turn every agent pod in the fleet NotReady; the hub connection shows in
    /// `hub_connected`, the `scale_agent_agent_hub_connected` metric and the `Connected`
    /// condition the status writer keeps.
    pub fn ready(&self) -> bool {
        self.accounts.is_empty() || self.accounts.iter().any(|a| a.prepared)
    }

    /// The accounts not prepared yet, each with its last error: what `/readyz` lists.
    pub fn not_prepared(&self) -> Vec<String> {
        self.accounts
            .iter()
            .filter(|a| !a.prepared)
            .map(|a| match &a.error {
                Some(error) => format!("{} ({error})", a.name),
                None => a.name.clone(),
            })
            .collect()
    }

    /// Connected to the hub and every account answered, with a streaming account's kinds
    /// all started (watching, forbidden or failing, not still starting).
    pub fn synced(&self) -> bool {
        self.hub_connected && self.accounts.iter().all(AccountView::synced)
    }

    pub fn account(&self, name: &str) -> Option<&AccountView> {
        self.accounts.iter().find(|a| a.name == name)
    }

    /// The watch of `kind_label` (`plural` or `plural.group`) in `watch_namespace`.
    pub fn kind(
        &self,
        account: &str,
        kind_label: &str,
        watch_namespace: &str,
    ) -> Option<&KindView> {
        self.account(account)?.kinds.iter().find(|k| {
            let label = if k.group.is_empty() {
                k.plural.clone()
            } else {
                format!("{}.{}", k.plural, k.group)
            };
            label == kind_label && k.watch_namespace == watch_namespace
        })
    }
}

/// Metrics and admin view, shared by every task of one agent.
#[derive(Default)]
pub struct Shared {
    pub metrics: Metrics,
    view: Mutex<AgentView>,
}

impl Shared {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, AgentView> {
        // A panic while holding this lock leaves plain data behind; keep using it.
        self.view
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A copy of the admin view, with `synced` computed now.
    pub fn view(&self) -> AgentView {
        let mut view = self.lock().clone();
        view.synced = view.synced();
        view
    }

    /// The metrics in Prometheus text format, with the watches-by-state gauge refreshed
    /// from the admin view.
    pub fn encode_metrics(&self) -> String {
        let view = self.view();
        let watches = &self.metrics.watches;
        watches.clear();
        let account_ready = &self.metrics.account_ready;
        account_ready.clear();
        for account in &view.accounts {
            account_ready
                .get_or_create(&crate::metrics::AccountLabels {
                    account: account.name.clone(),
                })
                .set(i64::from(account.prepared));
            for state in [
                KindState::Starting,
                KindState::Watching,
                KindState::Forbidden,
                KindState::Failing,
            ] {
                let count = account.kinds.iter().filter(|k| k.state == state).count();
                if count > 0 {
                    let label = serde_json::to_value(state)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    watches
                        .get_or_create(&crate::metrics::WatchStateLabels {
                            account: account.name.clone(),
                            state: label,
                        })
                        .set(i64::try_from(count).unwrap_or(i64::MAX));
                }
            }
        }
        self.metrics.encode()
    }

    pub fn update<R>(&self, f: impl FnOnce(&mut AgentView) -> R) -> R {
        f(&mut self.lock())
    }

    /// Changes one account's view, creating it if needed.
    pub fn update_account(&self, name: &str, f: impl FnOnce(&mut AccountView)) {
        let mut view = self.lock();
        let index = match view.accounts.iter().position(|a| a.name == name) {
            Some(index) => index,
            None => {
                view.accounts.push(AccountView::new(name));
                view.accounts.sort_by(|a, b| a.name.cmp(&b.name));
                view.accounts
                    .iter()
                    .position(|a| a.name == name)
                    .unwrap_or_default()
            }
        };
        if let Some(account) = view.accounts.get_mut(index) {
            f(account);
        }
    }

    pub fn remove_account(&self, name: &str) {
        self.lock().accounts.retain(|a| a.name != name);
    }

    /// Forgets one watch's view.
    pub fn remove_kind(&self, account: &str, kind: &KindRef, watch_namespace: &str) {
        self.update_account(account, |view| {
            view.kinds.retain(|k| {
                !(k.group == kind.group
                    && k.plural == kind.plural
                    && k.watch_namespace == watch_namespace)
            });
        });
    }

    /// Changes one watch's view, creating it (state `starting`) if needed.
    pub fn update_kind(
        &self,
        account: &str,
        kind: &KindRef,
        watch_namespace: &str,
        f: impl FnOnce(&mut KindView),
    ) {
        self.update_account(account, |view| {
            let index = view.kinds.iter().position(|k| {
                k.group == kind.group
                    && k.plural == kind.plural
                    && k.watch_namespace == watch_namespace
            });
            let index = match index {
                Some(index) => index,
                None => {
                    view.kinds.push(KindView {
                        group: kind.group.clone(),
                        version: kind.version.clone(),
                        kind: kind.kind.clone(),
                        plural: kind.plural.clone(),
                        watch_namespace: watch_namespace.to_string(),
                        state: KindState::Starting,
                        message: String::new(),
                        resource_version: String::new(),
                        objects_sent: 0,
                        lists: 0,
                    });
                    view.kinds.len() - 1
                }
            };
            if let Some(kind_view) = view.kinds.get_mut(index) {
                f(kind_view);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configmaps() -> KindRef {
        KindRef {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        }
    }

    #[test]
    fn synced_needs_the_hub_and_every_account_started() {
        let shared = Shared::new();
        assert!(!shared.view().synced());
        shared.update(|v| v.hub_connected = true);
        assert!(shared.view().synced(), "no accounts: synced once connected");
        shared.update_account("prod", |a| a.prepared = true);
        assert!(!shared.view().synced(), "pending account");
        shared.update_account("prod", |a| {
            a.role = ROLE_STREAMING.into();
            a.kinds_started = true;
        });
        shared.update_kind("prod", &configmaps(), "", |_| {});
        assert!(!shared.view().synced(), "kind still starting");
        shared.update_kind("prod", &configmaps(), "", |k| {
            k.state = KindState::Forbidden
        });
        assert!(shared.view().synced());
        assert_eq!(serde_json::to_value(shared.view()).unwrap()["synced"], true);
        let metrics = shared.encode_metrics();
        assert!(
            metrics.contains(r#"scale_agent_agent_watches{account="prod",state="forbidden"} 1"#),
            "{metrics}"
        );
        let json = serde_json::to_value(shared.view()).unwrap();
        assert_eq!(json["accounts"][0]["kinds"][0]["state"], "forbidden");
        assert_eq!(json["accounts"][0]["role"], "streaming");
        assert!(shared.view().kind("prod", "configmaps", "").is_some());
    }

    /// A hub outage must not make every agent pod NotReady: readiness is the agent's own
    /// part (credentials loaded, API server answered), whatever the hub does.
    #[test]
    fn readiness_is_the_agents_own_and_not_the_hubs() {
        let shared = Shared::new();
        assert!(shared.view().ready(), "no accounts: nothing to wait for");
        shared.update_account("prod", |_| {});
        assert!(!shared.view().ready(), "credentials not loaded yet");
        shared.update_account("prod", |a| a.prepared = true);
        assert!(
            shared.view().ready(),
            "never connected to the hub, the account pending: still ready"
        );
        assert!(!shared.view().synced());
        shared.update(|v| v.hub_connected = true);
        shared.update_account("prod", |a| a.role = ROLE_STREAMING.into());
        assert!(shared.view().ready(), "kinds starting is the hub's stream");
        shared.update(|v| v.hub_connected = false);
        assert!(shared.view().ready(), "hub gone: still ready");
    }

    /// One unreachable target cluster must not make an agent serving many accounts
    /// NotReady: ready while at least one account works, the failing one reported.
    #[test]
    fn ready_while_at_least_one_account_works() {
        let shared = Shared::new();
        shared.update_account("good", |_| {});
        shared.update_account("bad", |a| a.error = Some("connection refused".into()));
        assert!(!shared.view().ready(), "no account prepared yet");
        assert_eq!(
            shared.view().not_prepared(),
            vec!["bad (connection refused)".to_string(), "good".to_string()]
        );
        shared.update_account("good", |a| a.prepared = true);
        let view = shared.view();
        assert!(view.ready(), "one account works");
        assert!(view.account("bad").is_some_and(AccountView::failing));
        assert!(!view.account("good").is_some_and(AccountView::failing));
        let metrics = shared.encode_metrics();
        assert!(
            metrics.contains(r#"scale_agent_agent_account_ready{account="bad"} 0"#),
            "{metrics}"
        );
        assert!(
            metrics.contains(r#"scale_agent_agent_account_ready{account="good"} 1"#),
            "{metrics}"
        );
        shared.update_account("good", |a| a.prepared = false);
        assert!(!shared.view().ready(), "every account failing");
    }
}
