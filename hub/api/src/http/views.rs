//! The agent and account views of the REST API: what `/api/v1/agents`, `/api/v1/accounts`
//! and `/api/v1/accounts/{name}` show of this replica's live state, and of an account only
//! the shared store holds. [`crate::fleet`] builds the listings of every replica from them.
//! Reads the live state ([`Live`]) and nothing else of the hub.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use scale_agent_hub_cache::{AccountCache, KindCache, KindState, SharedCache};
use scale_agent_hub_model::time::rfc3339;
use scale_agent_hub_state::{
    Live,
    registry::{
        Account, AccountRecord, AccountState, ClusterRecord, Registry, SessionId, StateRecord,
    },
};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgentView {
    identity: String,
    replica: String,
    agent_version: String,
    connected_since: String,
    accounts: Vec<AgentAccountView>,
}

#[derive(Serialize)]
struct AgentAccountView {
    name: String,
    role: &'static str,
}

/// The agent streams connected to this replica.
pub(crate) fn local_agents(live: &Live) -> Vec<AgentView> {
    let registry = live.registry_read();
    registry
        .sessions
        .values()
        .map(|s| AgentView {
            identity: s.identity.clone(),
            replica: s.replica.clone(),
            agent_version: s.agent_version.clone(),
            connected_since: rfc3339(s.connected_since),
            accounts: registry
                .accounts_of(s.id)
                .into_iter()
                .map(|(name, role)| AgentAccountView {
                    name,
                    role: role.as_str(),
                })
                .collect(),
        })
        .collect()
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReplicaView {
    identity: String,
    replica: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResumePointView {
    watch_namespace: String,
    resource_version: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KindView {
    group: String,
    version: String,
    kind: String,
    plural: String,
    namespaced: bool,
    objects: usize,
    /// WATCHING, FORBIDDEN, FAILING, STOPPED; null when the agent has not reported it. With
    /// several scopes, the one that most needs attention (FORBIDDEN/FAILING first).
    /// OVER_QUOTA (the hub's own) while the kind is left out of the cache for
    /// `--max-objects-per-account`.
    state: Option<String>,
    message: String,
    namespaces: Vec<String>,
    /// Every scope's own state (namespaces empty: cluster-wide).
    scopes: Vec<KindState>,
    resume_points: Vec<ResumePointView>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AccountView {
    name: String,
    cluster: ClusterRecord,
    namespaces: Vec<String>,
    properties: Value,
    /// "connected" or "disconnected".
    state: &'static str,
    /// ACTIVE, INACTIVE, FAILED or ORPHANED; null until the hub first observed the account.
    account_state: Option<&'static str>,
    /// Why the account entered `accountState`.
    state_reason: String,
    /// When it did (RFC 3339).
    state_since: Option<String>,
    disconnected_since: Option<String>,
    streaming: Option<ReplicaView>,
    standbys: Vec<ReplicaView>,
    objects: usize,
    object_counts: BTreeMap<String, usize>,
    kinds: Vec<KindView>,
    /// Why this replica's cache of the account may be stale although an agent streams it:
    /// the store cannot commit, so the agents' acknowledgements are held (absent otherwise).
    /// The proxy's cached answers carry the same in a `Warning` header.
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_stale: Option<String>,
}

impl AccountView {
    /// Says so when the store cannot commit (see [`AccountView::cache_stale`]).
    pub(crate) fn with_store_health(
        mut self,
        commits: &scale_agent_hub_store::writer::Commits,
    ) -> Self {
        let health = commits.health();
        let what = health
            .failing
            .unwrap_or(scale_agent_hub_store::writer::Failing::Commits);
        self.cache_stale = health.failure.map(|failure| {
            let since = health
                .failing_since
                .map(|s| s.elapsed().as_secs())
                .unwrap_or_default();
            format!(
                "the store {} ({failure}): the agents' streams are held, reads through the \
                 proxy are flagged stale and writes refused",
                what.for_seconds(since)
            )
        });
        self
    }
}

fn replica(registry: &Registry, id: SessionId) -> Option<ReplicaView> {
    registry.sessions.get(&id).map(|s| ReplicaView {
        identity: s.identity.clone(),
        replica: s.replica.clone(),
    })
}

fn kind_view(k: &KindCache) -> KindView {
    KindView {
        group: k.info.group.clone(),
        version: k.info.version.clone(),
        kind: k.info.kind.clone(),
        plural: k.info.plural.clone(),
        namespaced: k.info.namespaced,
        objects: k.objects.len(),
        state: match &k.over_quota {
            Some(_) => Some("OVER_QUOTA".to_string()),
            None => k.summary_status().map(|s| s.state.clone()),
        },
        message: match &k.over_quota {
            Some(reason) => reason.clone(),
            None => k
                .summary_status()
                .map(|s| s.message.clone())
                .unwrap_or_default(),
        },
        namespaces: k
            .summary_status()
            .map(|s| s.namespaces.clone())
            .unwrap_or_default(),
        scopes: k.statuses.values().cloned().collect(),
        resume_points: k
            .resume
            .iter()
            .map(|(ns, rv)| ResumePointView {
                watch_namespace: ns.clone(),
                resource_version: rv.clone(),
            })
            .collect(),
    }
}

fn account_view(
    registry: &Registry,
    name: &str,
    a: &Account,
    cache: Option<&AccountCache>,
) -> AccountView {
    let connected = a.streaming.is_some() || !a.standbys.is_empty();
    let kinds: Vec<&KindCache> = cache
        .map(|c| c.kinds.values().collect())
        .unwrap_or_default();
    let lifecycle = registry.states.get(name);
    AccountView {
        name: name.to_string(),
        cluster: a.record.cluster.clone(),
        namespaces: a.record.namespaces.clone(),
        properties: a.record.properties.clone(),
        state: if connected {
            "connected"
        } else {
            "disconnected"
        },
        account_state: lifecycle.map(|l| l.state.as_str()),
        state_reason: lifecycle.map(|l| l.reason.clone()).unwrap_or_default(),
        state_since: lifecycle.map(|l| rfc3339(l.since)),
        disconnected_since: a.disconnected_since.map(|(_, t)| rfc3339(t)),
        streaming: a.streaming.and_then(|id| replica(registry, id)),
        standbys: a
            .standbys
            .iter()
            .filter_map(|id| replica(registry, *id))
            .collect(),
        objects: kinds.iter().map(|k| k.objects.len()).sum(),
        object_counts: kinds
            .iter()
            .map(|k| (k.info.key().to_string(), k.objects.len()))
            .collect(),
        kinds: kinds.into_iter().map(kind_view).collect(),
        cache_stale: None,
    }
}

/// An account the hub keeps a state for but no record (ORPHANED, or FAILED for a name it
/// never accepted): the last cluster known, no replicas, no objects.
fn stateless_view(name: &str, lifecycle: &StateRecord) -> AccountView {
    let cluster = lifecycle.cluster.clone().unwrap_or(ClusterRecord {
        api_server_host: String::new(),
        ca_fingerprint: String::new(),
        kubernetes_version: String::new(),
    });
    let mut view = agentless_view(name, cluster, lifecycle.state, lifecycle.reason.clone());
    view.state_since = Some(rfc3339(lifecycle.since));
    view
}

/// An account no agent serves here: `cluster`, `state` for `reason`, nothing else.
fn agentless_view(
    name: &str,
    cluster: ClusterRecord,
    state: AccountState,
    reason: String,
) -> AccountView {
    AccountView {
        name: name.to_string(),
        cluster,
        namespaces: Vec::new(),
        properties: Value::Null,
        state: "disconnected",
        account_state: Some(state.as_str()),
        state_reason: reason,
        state_since: None,
        disconnected_since: None,
        streaming: None,
        standbys: Vec::new(),
        objects: 0,
        object_counts: BTreeMap::new(),
        kinds: Vec::new(),
        cache_stale: None,
    }
}

/// The view of one account: from its record, or from its state alone; `None` when the hub
/// has neither.
pub(crate) fn view_of(registry: &Registry, cache: &SharedCache, name: &str) -> Option<AccountView> {
    match registry.accounts.get(name) {
        Some(a) => {
            let slot = cache.account(name);
            let guard = slot.as_deref().map(scale_agent_hub_cache::lock);
            Some(account_view(registry, name, a, guard.as_deref()))
        }
        None => registry.states.get(name).map(|l| stateless_view(name, l)),
    }
}

/// The accounts this replica has a record or a state for.
pub(crate) fn local_accounts(live: &Live) -> Vec<AccountView> {
    let registry = live.registry_read();
    let mut names: Vec<&String> = registry
        .accounts
        .keys()
        .chain(registry.states.keys())
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|n| view_of(&registry, live.cache(), n))
        .collect()
}

/// An account the shared store holds and no replica serves: its stored record, no agent.
pub(crate) fn stored_view(name: &str, record: &AccountRecord) -> AccountView {
    let mut view = agentless_view(
        name,
        record.cluster.clone(),
        AccountState::Inactive,
        "no agent serves it on any replica; its cache is kept in the shared store until the \
         grace period ends"
            .into(),
    );
    view.namespaces = record.namespaces.clone();
    view.properties = record.properties.clone();
    view
}

#[cfg(test)]
mod tests {
    use super::*;
    use scale_agent_hub_cache::{Cache, KindInfo};

    #[test]
    fn timestamps() {
        use std::time::UNIX_EPOCH;
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        // To the second: the fraction is cut, not rounded up.
        let t = UNIX_EPOCH + std::time::Duration::from_millis(1_795_000_000_999);
        assert_eq!(rfc3339(t), "2026-11-18T11:06:40Z");
        let leap = UNIX_EPOCH + std::time::Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn each_scope_of_a_kind_keeps_its_state() {
        let info = KindInfo {
            group: String::new(),
            version: "v1".into(),
            kind: "Secret".into(),
            plural: "secrets".into(),
            namespaced: true,
        };
        let mut cache = Cache::default();
        let mut ops = Vec::new();
        let state = |state: &str, message: &str, ns: &str| KindState {
            state: state.into(),
            message: message.into(),
            namespaces: vec![ns.into()],
        };
        cache.set_status("prod", &info, state("WATCHING", "", "web"), &mut ops);
        cache.set_status(
            "prod",
            &info,
            state("FORBIDDEN", "secrets is forbidden", "db"),
            &mut ops,
        );
        // A later WATCHING elsewhere does not hide the forbidden scope.
        cache.set_status("prod", &info, state("WATCHING", "", "web"), &mut ops);
        let view = kind_view(&cache.accounts["prod"].kinds[&info.key()]);
        assert_eq!(view.state.as_deref(), Some("FORBIDDEN"));
        assert_eq!(view.namespaces, ["db"]);
        assert_eq!(view.message, "secrets is forbidden");
        let scopes: Vec<(&str, &[String])> = view
            .scopes
            .iter()
            .map(|s| (s.state.as_str(), s.namespaces.as_slice()))
            .collect();
        assert_eq!(
            scopes,
            [
                ("FORBIDDEN", &["db".to_string()][..]),
                ("WATCHING", &["web".to_string()][..])
            ]
        );
    }
}
