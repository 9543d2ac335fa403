//! Pure bookkeeping of connected agent streams and accounts: which cluster an account name is
//! bound to, which replica streams it, which ones stand by, and since when an account has had
//! no agent (for the grace period), and each account's lifecycle state (ACTIVE, INACTIVE,
//! FAILED, ORPHANED) with the time and reason of its last transition.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant, SystemTime},
};

pub use scale_agent_hub_model::records::{AccountBinding, AccountRecord, ClusterRecord, SessionId};

/// One connected agent stream.
#[derive(Clone, Debug)]
pub struct AgentSession {
    pub id: SessionId,
    pub identity: String,
    pub replica: String,
    pub agent_version: String,
    pub connected_since: SystemTime,
    /// The random token handed out in Welcome; a stream replacing this one must present it.
    pub session_token: String,
}

/// One account.
#[derive(Clone, Debug)]
pub struct Account {
    pub record: AccountRecord,
    pub streaming: Option<SessionId>,
    /// In registration order: the first is promoted first.
    pub standbys: Vec<SessionId>,
    /// Set while no agent serves the account.
    pub disconnected_since: Option<(Instant, SystemTime)>,
}

impl Account {
    fn role_of(&self, session: SessionId) -> Option<Role> {
        if self.streaming == Some(session) {
            Some(Role::Streaming)
        } else if self.standbys.contains(&session) {
            Some(Role::Standby)
        } else {
            None
        }
    }
}

/// A replica's role for an account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Streaming,
    Standby,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Streaming => "STREAMING",
            Role::Standby => "STANDBY",
        }
    }
}

/// The answer to a registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registration {
    Assigned(Role),
    Rejected(String),
}

/// A standby that now streams an account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Promotion {
    pub session: SessionId,
    pub account: String,
}

/// At most this many refused registrations are remembered (for FAILED), so an agent sending
/// many names it may not serve cannot grow the hub's memory.
pub const MAX_REJECTIONS: usize = 1024;

#[cfg(test)]
mod observe_tests;
mod states;

pub use states::{AccountState, StateRecord, Transition, credentials_refused};

/// Agents and accounts.
#[derive(Debug, Default)]
pub struct Registry {
    pub sessions: BTreeMap<SessionId, AgentSession>,
    pub accounts: BTreeMap<String, Account>,
    /// account → the identity it is bound to (persisted, outlives `accounts` entries).
    pub bindings: BTreeMap<String, AccountBinding>,
    /// account → its lifecycle state, brought up to date by [`Registry::observe`].
    pub states: BTreeMap<String, StateRecord>,
    /// account → the stream whose registration of it was refused last, and why. Dropped when
    /// that stream ends or registers the account successfully.
    rejections: BTreeMap<String, (SessionId, String)>,
    /// account → its streaming stream, whose API server refused the account's credentials
    /// (a kind FAILING with 401), and the API server's words. Dropped when that stream
    /// reports a kind WATCHING again, stops serving the account or ends. At most one entry
    /// per account a stream streams, so bounded by the accounts.
    credential_failures: BTreeMap<String, (SessionId, String)>,
    /// account → the stream that last reported it cannot serve it (its kubeconfig does not
    /// load, its API server refuses it), and why. Dropped when that stream registers or
    /// unregisters the account, or ends. At most [`MAX_REJECTIONS`] names.
    unavailable: BTreeMap<String, (SessionId, String)>,
    /// The accounts this hub replica owns (see the hub's `owners`); `None`: every account
    /// (one replica, the embedded store). Only an owned account has a STREAMING session;
    /// the sessions of an account owned elsewhere all stand by.
    owned: Option<std::collections::BTreeSet<String>>,
    /// The accounts whose state may have changed since the last [`Registry::observe`],
    /// which looks at these only: with 10,000 accounts, deriving every account's state on
    /// every stream's registration made each registration cost O(accounts) under the
    /// registry's lock (issue 26).
    changed: Changed,
    /// identity → its streams (in `sessions`): a stream's Hello looks up the streams of its
    /// identity three times, which was a walk over every stream of the hub.
    by_identity: HashMap<String, Vec<SessionId>>,
    next_id: SessionId,
}

/// Which accounts [`Registry::observe`] looks at.
#[derive(Debug)]
struct Changed {
    /// Every account: at start, before the first look (the store's bindings and accounts
    /// are loaded into the public fields directly).
    all: bool,
    names: BTreeSet<String>,
}

impl Default for Changed {
    fn default() -> Self {
        Changed {
            all: true,
            names: BTreeSet::new(),
        }
    }
}

impl Registry {
    /// A registry of a replica that shares its accounts with other replicas: it owns none
    /// until [`Registry::acquired`].
    pub fn shared() -> Self {
        Registry {
            owned: Some(Default::default()),
            ..Registry::default()
        }
    }

    /// `name`'s state may have changed: the next [`Registry::observe`] looks at it. Every
    /// method of the registry that changes what an account's state derives from calls it;
    /// code changing the public fields directly calls it too.
    pub fn mark_changed(&mut self, name: &str) {
        if !self.changed.all && !self.changed.names.contains(name) {
            self.changed.names.insert(name.to_string());
        }
    }

    /// Sets `name`'s binding (as the store holds it).
    pub fn set_binding(&mut self, name: String, binding: AccountBinding) {
        self.mark_changed(&name);
        self.bindings.insert(name, binding);
    }

    /// Replaces every binding (the store's, at start): every account is looked at next.
    pub fn set_bindings(&mut self, bindings: BTreeMap<String, AccountBinding>) {
        self.bindings = bindings;
        self.changed.all = true;
    }

    /// Sets `name`'s binding unless it has one.
    pub fn set_binding_if_none(&mut self, name: &str, binding: AccountBinding) {
        if !self.bindings.contains_key(name) {
            self.set_binding(name.to_string(), binding);
        }
    }

    /// Removes `name`'s binding; returns it.
    pub fn remove_binding(&mut self, name: &str) -> Option<AccountBinding> {
        self.mark_changed(name);
        self.bindings.remove(name)
    }

    /// Whether this replica owns `account` (always, with one replica).
    pub fn owns(&self, account: &str) -> bool {
        self.owned
            .as_ref()
            .is_none_or(|owned| owned.contains(account))
    }

    /// The accounts this replica serves agents of but does not own: the ones to acquire.
    pub fn to_acquire(&self) -> Vec<String> {
        let Some(owned) = &self.owned else {
            return Vec::new();
        };
        self.accounts
            .iter()
            .filter(|(name, a)| !a.standbys.is_empty() && !owned.contains(*name))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The accounts this replica owns but no agent of which is connected here: the ones to
    /// release, so that the replica their agent reaches next can take them.
    pub fn to_release(&self) -> Vec<String> {
        let Some(owned) = &self.owned else {
            return Vec::new();
        };
        owned
            .iter()
            .filter(|name| {
                self.accounts
                    .get(*name)
                    .is_none_or(|a| a.streaming.is_none() && a.standbys.is_empty())
            })
            .cloned()
            .collect()
    }

    /// This replica took ownership of `account`: its first standby streams it.
    pub fn acquired(&mut self, name: &str) -> Option<Promotion> {
        self.owned.as_mut()?.insert(name.to_string());
        self.mark_changed(name);
        let account = self.accounts.get_mut(name)?;
        if account.streaming.is_some() || account.standbys.is_empty() {
            return None;
        }
        let next = account.standbys.remove(0);
        account.streaming = Some(next);
        account.disconnected_since = None;
        Some(Promotion {
            session: next,
            account: name.to_string(),
        })
    }

    /// This replica gave up or lost ownership of `account`: the session that streamed it
    /// (returned, to be ended so its agent reconnects) stands by.
    pub fn released(&mut self, name: &str) -> Option<SessionId> {
        self.owned.as_mut()?.remove(name);
        self.mark_changed(name);
        let account = self.accounts.get_mut(name)?;
        let streaming = account.streaming.take()?;
        account.standbys.insert(0, streaming);
        self.credential_failures.remove(name);
        Some(streaming)
    }

    /// Every account this replica owned was lost at once: the sessions that streamed them.
    pub fn lost_all(&mut self) -> Vec<SessionId> {
        let owned: Vec<String> = match &self.owned {
            Some(owned) => owned.iter().cloned().collect(),
            None => return Vec::new(),
        };
        let mut sessions: Vec<SessionId> = owned
            .iter()
            .filter_map(|name| self.released(name))
            .collect();
        sessions.sort_unstable();
        sessions.dedup();
        sessions
    }

    /// An account loaded from the store at start-up: no agent yet, so its grace period
    /// starts now.
    pub fn load(&mut self, name: String, record: AccountRecord, now: (Instant, SystemTime)) {
        self.mark_changed(&name);
        self.accounts.insert(
            name,
            Account {
                record,
                streaming: None,
                standbys: Vec::new(),
                disconnected_since: Some(now),
            },
        );
    }

    /// A new stream said Hello. An older stream with the same identity and replica is removed
    /// (returned, to be ended) along with the promotions its removal causes.
    pub fn connect(
        &mut self,
        identity: &str,
        replica: &str,
        agent_version: &str,
        now: (Instant, SystemTime),
    ) -> (SessionId, Option<SessionId>, Vec<Promotion>) {
        let old = self.session_of(identity, replica).map(|s| s.id);
        let promotions = old.map(|id| self.disconnect(id, now)).unwrap_or_default();
        self.next_id += 1;
        let id = self.next_id;
        self.by_identity
            .entry(identity.to_string())
            .or_default()
            .push(id);
        self.sessions.insert(
            id,
            AgentSession {
                id,
                identity: identity.to_string(),
                replica: replica.to_string(),
                agent_version: agent_version.to_string(),
                connected_since: now.1,
                session_token: String::new(),
            },
        );
        (id, old, promotions)
    }

    /// Whether a new stream of `identity` and `replica` that presented `session_token` may
    /// start: when a live stream of the same identity and replica exists, only by presenting
    /// that stream's token (item 10 of the stream contract). The error says what to do.
    pub fn may_replace(
        &self,
        identity: &str,
        replica: &str,
        session_token: &str,
    ) -> Result<(), String> {
        let Some(live) = self.session_of(identity, replica) else {
            return Ok(());
        };
        // Digests are compared, so the time the comparison takes says nothing about the token.
        let digest = |t: &str| ring::digest::digest(&ring::digest::SHA256, t.as_bytes());
        if !live.session_token.is_empty()
            && digest(&live.session_token).as_ref() == digest(session_token).as_ref()
        {
            return Ok(());
        }
        Err(format!(
            "a stream of identity {identity:?} and replica {replica:?} is live, and this one did \
             not present its session token (Hello.session_token, from that stream's Welcome). \
             An agent reconnecting presents it itself; a new agent process waits until the old \
             stream ends (two heartbeat periods after it went silent). Two agents sharing an \
             identity need distinct replica names (the pod name)"
        ))
    }

    /// The live stream of `identity` and `replica`, if any.
    fn session_of(&self, identity: &str, replica: &str) -> Option<&AgentSession> {
        self.by_identity
            .get(identity)?
            .iter()
            .filter_map(|id| self.sessions.get(id))
            .find(|s| s.replica == replica)
    }

    /// Records the session token handed to a stream in Welcome.
    pub fn set_session_token(&mut self, session: SessionId, token: String) {
        if let Some(s) = self.sessions.get_mut(&session) {
            s.session_token = token;
        }
    }

    /// Whether `identity` may register `name` as far as bindings go: `Ok(true)` when the
    /// account is not bound yet (the caller binds it with [`Registry::bind`] once the
    /// registration is accepted).
    pub fn check_binding(&self, identity: &str, name: &str) -> Result<bool, String> {
        match self.bindings.get(name) {
            None => Ok(true),
            Some(b) if b.identity == identity => Ok(false),
            Some(b) => Err(format!(
                // troubleshooting: AgentAccount `Connected=False`, reason `Rejected`
                // An account name is bound to the first agent identity that registered it, so
                // another agent cannot take it over. If the account really moved, an admin moves
                // the binding (`scale-agent-hub account rebind`).
                "account {name:?} is bound to agent identity {:?} (the first identity that \
                 registered it); this agent's identity is {identity:?}. If the account really \
                 moved to this agent, an admin moves the binding: `scale-agent-hub account \
                 rebind {name} --identity {identity}`",
                b.identity
            )),
        }
    }

    /// Binds `name` to `identity`; returns the binding to persist.
    pub fn bind(&mut self, name: &str, identity: &str, now_unix: i64) -> AccountBinding {
        let binding = AccountBinding {
            identity: identity.to_string(),
            since: now_unix,
        };
        self.mark_changed(name);
        self.bindings.insert(name.to_string(), binding.clone());
        binding
    }

    /// The sessions of identities other than `identity` that serve `name` (after a rebind,
    /// they no longer may).
    pub fn sessions_of_others(&self, name: &str, identity: &str) -> Vec<SessionId> {
        self.replicas(name)
            .into_iter()
            .filter(|id| {
                self.sessions
                    .get(id)
                    .is_some_and(|s| s.identity != identity)
            })
            .collect()
    }

    /// A stream registers an account (already checked against the allow-list). Returns the
    /// answer and, when accepted, the record to persist.
    pub fn register(
        &mut self,
        session: SessionId,
        name: &str,
        record: AccountRecord,
    ) -> (Registration, Option<AccountRecord>) {
        if !self.sessions.contains_key(&session) {
            return (
                Registration::Rejected("the stream is no longer registered".into()),
                None,
            );
        }
        self.mark_changed(name);
        if self
            .rejections
            .get(name)
            .is_some_and(|(s, _)| *s == session)
        {
            self.rejections.remove(name);
        }
        if self
            .unavailable
            .get(name)
            .is_some_and(|(s, _)| *s == session)
        {
            self.unavailable.remove(name);
        }
        match self.accounts.get_mut(name) {
            Some(account) => {
                if !account.record.cluster.same_cluster(&record.cluster) {
                    let reason = format!(
                        // troubleshooting: AgentAccount `Connected=False`, reason `Rejected`
                        // An account name is bound to the first cluster (API server and CA) that
                        // registered it, until its grace period ends with no agent. Rename one of
                        // the two accounts.
                        "account {name:?} is bound to cluster {}; this agent's cluster is {}. \
                         Rename the account, or remove it from the agent that serves the other \
                         cluster and wait for the hub's grace period to expire",
                        account.record.cluster.describe(),
                        record.cluster.describe()
                    );
                    return (Registration::Rejected(reason), None);
                }
                account.record = record.clone();
                account.disconnected_since = None;
                let owned = self.owned.as_ref().is_none_or(|owned| owned.contains(name));
                let role = match account.role_of(session) {
                    Some(role) => role,
                    None if account.streaming.is_none() && owned => {
                        account.streaming = Some(session);
                        Role::Streaming
                    }
                    None => {
                        account.standbys.push(session);
                        Role::Standby
                    }
                };
                (Registration::Assigned(role), Some(record))
            }
            None => {
                let role = if self.owns(name) {
                    Role::Streaming
                } else {
                    Role::Standby
                };
                let (streaming, standbys) = match role {
                    Role::Streaming => (Some(session), Vec::new()),
                    Role::Standby => (None, vec![session]),
                };
                self.accounts.insert(
                    name.to_string(),
                    Account {
                        record: record.clone(),
                        streaming,
                        standbys,
                        disconnected_since: None,
                    },
                );
                (Registration::Assigned(role), Some(record))
            }
        }
    }

    /// Whether `session` is the account's streaming replica.
    pub fn is_streaming(&self, session: SessionId, account: &str) -> bool {
        self.accounts
            .get(account)
            .is_some_and(|a| a.streaming == Some(session))
    }

    /// The session's role for an account, if it registered it.
    pub fn role(&self, session: SessionId, account: &str) -> Option<Role> {
        self.accounts.get(account).and_then(|a| a.role_of(session))
    }

    /// The sessions that can act on an account's cluster: the STREAMING one first, then the
    /// STANDBYs in registration order (standbys hold credentials too, so they can run
    /// requests). Empty for an unknown account.
    pub fn replicas(&self, account: &str) -> Vec<SessionId> {
        self.accounts
            .get(account)
            .map(|a| a.streaming.iter().chain(&a.standbys).copied().collect())
            .unwrap_or_default()
    }

    /// Whether a stream of `identity` serves or stands by for `account` on this replica.
    pub fn has_stream_of(&self, account: &str, identity: &str) -> bool {
        self.replicas(account).into_iter().any(|id| {
            self.sessions
                .get(&id)
                .is_some_and(|s| s.identity == identity)
        })
    }

    /// `identity/replica` of a session, as logs and operation bodies name it; empty when
    /// the session is gone.
    pub fn replica_label(&self, session: SessionId) -> String {
        self.sessions
            .get(&session)
            .map(|s| format!("{}/{}", s.identity, s.replica))
            .unwrap_or_default()
    }

    /// The accounts a session serves, with its role.
    pub fn accounts_of(&self, session: SessionId) -> Vec<(String, Role)> {
        self.accounts
            .iter()
            .filter_map(|(name, a)| a.role_of(session).map(|r| (name.clone(), r)))
            .collect()
    }

    /// A stream stops serving an account.
    pub fn unregister(
        &mut self,
        session: SessionId,
        name: &str,
        now: (Instant, SystemTime),
    ) -> Vec<Promotion> {
        if self
            .unavailable
            .get(name)
            .is_some_and(|(s, _)| *s == session)
        {
            self.unavailable.remove(name);
        }
        self.stop_serving(session, name, now)
    }

    /// `session` no longer serves `name` (a standby takes over, or the grace period starts);
    /// what it reported of the account stays.
    fn stop_serving(
        &mut self,
        session: SessionId,
        name: &str,
        now: (Instant, SystemTime),
    ) -> Vec<Promotion> {
        self.mark_changed(name);
        let Some(account) = self.accounts.get_mut(name) else {
            return Vec::new();
        };
        account.standbys.retain(|s| *s != session);
        let mut promotions = Vec::new();
        if account.streaming == Some(session) {
            account.streaming = None;
            // Only an owned account was streamed: the standby takes its place here.
            if !account.standbys.is_empty() {
                let next = account.standbys.remove(0);
                account.streaming = Some(next);
                promotions.push(Promotion {
                    session: next,
                    account: name.to_string(),
                });
            }
        }
        // With another replica owning the account, the standbys here serve it still.
        if account.streaming.is_none()
            && account.standbys.is_empty()
            && account.disconnected_since.is_none()
        {
            account.disconnected_since = Some(now);
        }
        if self
            .credential_failures
            .get(name)
            .is_some_and(|(s, _)| *s == session)
        {
            self.credential_failures.remove(name);
        }
        promotions
    }

    /// A stream ended: its accounts are handed to standbys or start their grace period.
    pub fn disconnect(&mut self, session: SessionId, now: (Instant, SystemTime)) -> Vec<Promotion> {
        let Some(removed) = self.sessions.remove(&session) else {
            return Vec::new();
        };
        if let Some(ids) = self.by_identity.get_mut(&removed.identity) {
            ids.retain(|id| *id != session);
            if ids.is_empty() {
                self.by_identity.remove(&removed.identity);
            }
        }
        let mut forgotten = Vec::new();
        for reports in [
            &mut self.rejections,
            &mut self.credential_failures,
            &mut self.unavailable,
        ] {
            reports.retain(|name, (s, _)| {
                let keep = *s != session;
                if !keep {
                    forgotten.push(name.clone());
                }
                keep
            });
        }
        for name in forgotten {
            self.mark_changed(&name);
        }
        let names: Vec<String> = self
            .accounts
            .iter()
            .filter(|(_, a)| a.role_of(session).is_some())
            .map(|(n, _)| n.clone())
            .collect();
        names
            .iter()
            .flat_map(|name| self.unregister(session, name, now))
            .collect()
    }

    /// Accounts without an agent for longer than `grace`.
    pub fn expired(&self, now: Instant, grace: Duration) -> Vec<String> {
        self.accounts
            .iter()
            .filter(|(_, a)| {
                a.disconnected_since
                    .is_some_and(|(since, _)| now.saturating_duration_since(since) >= grace)
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    pub fn remove_account(&mut self, name: &str) {
        self.mark_changed(name);
        self.accounts.remove(name);
    }

    /// Streams of `identity` and their replica names, sorted by replica.
    pub fn replicas_of_identity(&self, identity: &str) -> Vec<(SessionId, String)> {
        let mut replicas: Vec<(SessionId, String)> = self
            .by_identity
            .get(identity)
            .into_iter()
            .flatten()
            .filter_map(|id| self.sessions.get(id))
            .map(|s| (s.id, s.replica.clone()))
            .collect();
        replicas.sort_by(|a, b| a.1.cmp(&b.1));
        replicas
    }
}

#[cfg(test)]
mod tests {
    use scale_agent_proto::v1::kind_status::State as KindStatusState;

    use super::*;

    fn rec(host: &str) -> AccountRecord {
        AccountRecord {
            cluster: ClusterRecord {
                api_server_host: host.into(),
                ca_fingerprint: "ff".into(),
                kubernetes_version: "v1.37.0".into(),
            },
            namespaces: vec![],
            properties: serde_json::Value::Null,
        }
    }

    fn now() -> (Instant, SystemTime) {
        (Instant::now(), SystemTime::now())
    }

    #[test]
    fn roles_promotion_and_grace() {
        let mut r = Registry::default();
        let (a, _, _) = r.connect("agent", "pod-a", "v", now());
        let (b, _, _) = r.connect("agent", "pod-b", "v", now());
        assert_eq!(
            r.register(a, "prod", rec("h1")).0,
            Registration::Assigned(Role::Streaming)
        );
        assert_eq!(
            r.register(b, "prod", rec("h1")).0,
            Registration::Assigned(Role::Standby)
        );
        // Registering again keeps the role.
        assert_eq!(
            r.register(a, "prod", rec("h1")).0,
            Registration::Assigned(Role::Streaming)
        );
        assert!(r.is_streaming(a, "prod"));
        assert!(!r.is_streaming(b, "prod"));

        let promotions = r.disconnect(a, now());
        assert_eq!(
            promotions,
            vec![Promotion {
                session: b,
                account: "prod".into()
            }]
        );
        assert!(r.is_streaming(b, "prod"));
        assert!(r.expired(Instant::now(), Duration::ZERO).is_empty());

        assert!(r.disconnect(b, now()).is_empty());
        assert_eq!(
            r.expired(Instant::now(), Duration::ZERO),
            vec!["prod".to_string()]
        );
        assert!(
            r.expired(Instant::now(), Duration::from_secs(60))
                .is_empty()
        );

        // Reconnecting within the grace period keeps the account.
        let (c, _, _) = r.connect("agent", "pod-c", "v", now());
        assert_eq!(
            r.register(c, "prod", rec("h1")).0,
            Registration::Assigned(Role::Streaming)
        );
        assert!(r.expired(Instant::now(), Duration::ZERO).is_empty());
    }

    /// Credentials refused are the streaming replica's: a standby promoted in its place
    /// streams, so the account is ACTIVE again; a standby's report changes nothing.
    #[test]
    fn refused_credentials_fail_the_account_only_while_their_replica_streams_it() {
        let mut r = Registry::default();
        let (a, _, _) = r.connect("agent", "pod-a", "v", now());
        let (b, _, _) = r.connect("agent", "pod-b", "v", now());
        r.register(a, "prod", rec("h1"));
        r.register(b, "prod", rec("h1"));
        let state = |r: &mut Registry| {
            r.observe(SystemTime::now());
            r.states["prod"].state
        };
        assert_eq!(state(&mut r), AccountState::Active);
        r.note_kind_status(a, "prod", KindStatusState::Forbidden, "401 looks alike");
        r.note_kind_status(a, "prod", KindStatusState::Failing, "500 InternalError: x");
        assert_eq!(state(&mut r), AccountState::Active);
        r.note_kind_status(a, "prod", KindStatusState::Failing, "401 Unauthorized: y");
        assert_eq!(state(&mut r), AccountState::Failed);
        assert!(r.states["prod"].reason.contains("agent/pod-a"));
        // Another replica watching says nothing about pod-a's credentials.
        r.note_kind_status(b, "prod", KindStatusState::Watching, "");
        assert_eq!(state(&mut r), AccountState::Failed);
        r.disconnect(a, now());
        assert_eq!(state(&mut r), AccountState::Active);
        assert!(r.credential_failures.is_empty());
    }

    /// An account a replica cannot serve (AccountUnavailable) is FAILED with its reason
    /// while nobody streams it; the replica stops serving it (its standby takes over); the
    /// report ends when the replica registers the account or its stream ends.
    #[test]
    fn an_account_a_replica_cannot_serve_is_failed_until_someone_streams_it() {
        use AccountState::*;
        let mut r = Registry::default();
        let (a, _, _) = r.connect("agent", "pod-a", "v", now());
        let (b, _, _) = r.connect("agent", "pod-b", "v", now());
        // Never registered: FAILED with the agent's words, and the reporter is told.
        assert!(
            r.note_unavailable(a, "new", "kubeconfig /k: no such file", now())
                .is_empty()
        );
        assert_eq!(states(&mut r), vec![("new".into(), None, Failed)]);
        let reason = &r.states["new"].reason;
        assert!(
            reason.contains("agent/pod-a") && reason.contains("/k: no such file"),
            "{reason}"
        );
        assert_eq!(r.interested_in("new"), vec![a]);
        // Once it can, it registers: ACTIVE.
        r.register(a, "new", rec("h"));
        assert_eq!(states(&mut r), vec![("new".into(), Some(Failed), Active)]);

        // The streaming replica's kubeconfig breaks: the standby streams, ACTIVE stays.
        r.register(b, "new", rec("h"));
        let promotions = r.note_unavailable(a, "new", "401 Unauthorized", now());
        assert_eq!(
            promotions,
            vec![Promotion {
                session: b,
                account: "new".into()
            }]
        );
        assert!(states(&mut r).is_empty());
        assert!(r.is_streaming(b, "new"));
        assert_eq!(r.role(a, "new"), None);
        // The standby's stream ends too: nobody serves it, FAILED with pod-a's reason.
        r.disconnect(b, now());
        assert_eq!(states(&mut r), vec![("new".into(), Some(Active), Failed)]);
        assert!(r.states["new"].reason.contains("401 Unauthorized"));
        // pod-a's stream ends: its report goes with it, INACTIVE (cache kept for the grace).
        r.disconnect(a, now());
        assert_eq!(states(&mut r), vec![("new".into(), Some(Failed), Inactive)]);
        assert!(r.unavailable.is_empty());
    }

    #[test]
    fn other_cluster_is_rejected() {
        let mut r = Registry::default();
        let (a, _, _) = r.connect("agent", "x", "v", now());
        let (b, _, _) = r.connect("other", "x", "v", now());
        r.register(a, "prod", rec("https://h1"));
        let (reg, persist) = r.register(b, "prod", rec("https://h2"));
        assert!(persist.is_none());
        match reg {
            Registration::Rejected(reason) => {
                assert!(reason.contains("https://h1"), "{reason}");
                assert!(reason.contains("https://h2"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        // A new Kubernetes version of the same cluster is fine.
        let mut newer = rec("https://h1");
        newer.cluster.kubernetes_version = "v1.38.0".into();
        assert_eq!(
            r.register(b, "prod", newer).0,
            Registration::Assigned(Role::Standby)
        );
        assert_eq!(
            r.accounts["prod"].record.cluster.kubernetes_version,
            "v1.38.0"
        );
    }

    #[test]
    fn same_identity_and_replica_replaces() {
        let mut r = Registry::default();
        let (a, _, _) = r.connect("agent", "x", "v", now());
        r.register(a, "prod", rec("h"));
        let (a2, old, promotions) = r.connect("agent", "x", "v", now());
        assert_eq!(old, Some(a));
        assert!(promotions.is_empty());
        assert!(!r.sessions.contains_key(&a));
        assert_eq!(r.accounts["prod"].streaming, None);
        assert_eq!(
            r.register(a2, "prod", rec("h")).0,
            Registration::Assigned(Role::Streaming)
        );
        // A different replica does not replace.
        let (_, old, _) = r.connect("agent", "y", "v", now());
        assert_eq!(old, None);
    }

    fn states(r: &mut Registry) -> Vec<(String, Option<AccountState>, AccountState)> {
        r.observe(SystemTime::now())
            .into_iter()
            .map(|t| (t.account, t.from, t.to.state))
            .collect()
    }

    #[test]
    fn lifecycle_active_inactive_orphaned_and_back() {
        use AccountState::*;
        let mut r = Registry::default();
        let (a, _, _) = r.connect("agent", "pod-a", "v", now());
        r.register(a, "prod", rec("h"));
        r.bind("prod", "agent", 0);
        assert_eq!(states(&mut r), vec![("prod".into(), None, Active)]);
        assert!(r.states["prod"].reason.contains("agent/pod-a"));
        // Nothing changed: no transition, and the time of the last one is kept.
        let since = r.states["prod"].since;
        assert!(states(&mut r).is_empty());
        assert_eq!(r.states["prod"].since, since);
        assert_eq!(r.interested_in("prod"), vec![a]);

        r.disconnect(a, now());
        assert_eq!(
            states(&mut r),
            vec![("prod".into(), Some(Active), Inactive)]
        );
        assert!(r.states["prod"].reason.contains("grace period"));

        // The grace period ends: the record goes, the binding stays.
        r.remove_account("prod");
        assert_eq!(
            states(&mut r),
            vec![("prod".into(), Some(Inactive), Orphaned)]
        );
        let orphaned = &r.states["prod"];
        assert!(orphaned.reason.contains("\"agent\""), "{}", orphaned.reason);
        assert_eq!(
            orphaned
                .cluster
                .as_ref()
                .map(|c| c.api_server_host.as_str()),
            Some("h")
        );
        assert_eq!(r.state_counts()[&Orphaned], 1);
        assert_eq!(r.state_counts()[&Active], 0);

        // Its agent returns.
        let (b, _, _) = r.connect("agent", "pod-b", "v", now());
        r.register(b, "prod", rec("h"));
        assert_eq!(
            states(&mut r),
            vec![("prod".into(), Some(Orphaned), Active)]
        );
    }

    #[test]
    fn rejection_fails_an_account_nobody_streams() {
        use AccountState::*;
        let mut r = Registry::default();
        let (a, _, _) = r.connect("agent", "a", "v", now());
        let (other, _, _) = r.connect("other", "x", "v", now());
        r.register(a, "prod", rec("h1"));
        states(&mut r);
        // A clash while the owner streams: the account stays ACTIVE, the claimant is told.
        r.note_rejection(other, "prod", "bound to cluster h1");
        assert!(states(&mut r).is_empty());
        assert_eq!(r.interested_in("prod"), vec![a, other]);
        // The owner leaves: the last word is the rejection.
        r.disconnect(a, now());
        assert_eq!(states(&mut r), vec![("prod".into(), Some(Active), Failed)]);
        assert!(r.states["prod"].reason.contains("other/x"));
        assert!(r.states["prod"].reason.contains("bound to cluster h1"));
        // The claimant leaves: INACTIVE again.
        r.disconnect(other, now());
        assert_eq!(
            states(&mut r),
            vec![("prod".into(), Some(Failed), Inactive)]
        );

        // A name the hub knows only through a rejection is forgotten with the stream.
        let (c, _, _) = r.connect("other", "y", "v", now());
        r.note_rejection(c, "unknown", "not allowed");
        assert_eq!(states(&mut r), vec![("unknown".into(), None, Failed)]);
        r.disconnect(c, now());
        assert!(states(&mut r).is_empty());
        assert!(!r.states.contains_key("unknown"));

        // Rejections are bounded.
        let (d, _, _) = r.connect("other", "z", "v", now());
        for i in 0..MAX_REJECTIONS + 10 {
            r.note_rejection(d, &format!("n{i}"), "no");
        }
        states(&mut r);
        assert_eq!(r.state_counts()[&Failed], MAX_REJECTIONS);
    }

    /// A replica sharing its accounts streams only those it owns: the agents of others stand
    /// by, the first is promoted when it acquires, and streams stand by again when it loses
    /// the account; it releases what no agent of its own serves.
    #[test]
    fn shared_replicas_stream_only_what_they_own() {
        use AccountState::*;
        let mut r = Registry::shared();
        let (a, _, _) = r.connect("agent", "a", "v", now());
        let (b, _, _) = r.connect("agent", "b", "v", now());
        assert_eq!(
            r.register(a, "prod", rec("h")).0,
            Registration::Assigned(Role::Standby)
        );
        assert_eq!(
            r.register(b, "prod", rec("h")).0,
            Registration::Assigned(Role::Standby)
        );
        assert!(!r.owns("prod"));
        assert_eq!(r.to_acquire(), vec!["prod".to_string()]);
        assert!(r.to_release().is_empty());
        // Served elsewhere: ACTIVE, and no grace period while its agents stand by here.
        assert_eq!(states(&mut r), vec![("prod".into(), None, Active)]);
        assert!(r.states["prod"].reason.contains("another hub replica"));
        assert!(r.unregister(b, "prod", now()).is_empty());
        assert!(r.expired(Instant::now(), Duration::ZERO).is_empty());
        r.register(b, "prod", rec("h"));

        assert_eq!(
            r.acquired("prod"),
            Some(Promotion {
                session: a,
                account: "prod".into()
            })
        );
        assert!(r.owns("prod") && r.is_streaming(a, "prod"));
        assert!(r.to_acquire().is_empty());

        // Lost: the streaming session stands by first, to be ended.
        assert_eq!(r.lost_all(), vec![a]);
        assert!(!r.owns("prod"));
        assert_eq!(r.accounts["prod"].standbys, vec![a, b]);
        assert_eq!(r.acquired("prod").map(|p| p.session), Some(a));

        // The agents leave: the account is released and its grace period starts.
        r.disconnect(a, now());
        assert!(r.is_streaming(b, "prod"));
        r.disconnect(b, now());
        assert_eq!(r.to_release(), vec!["prod".to_string()]);
        assert_eq!(r.released("prod"), None);
        assert!(r.to_release().is_empty());
        assert_eq!(
            r.expired(Instant::now(), Duration::ZERO),
            vec!["prod".to_string()]
        );

        // One replica owns everything and never acquires or releases.
        let mut one = Registry::default();
        let (c, _, _) = one.connect("agent", "c", "v", now());
        one.register(c, "prod", rec("h"));
        assert!(one.owns("prod") && one.is_streaming(c, "prod"));
        assert!(one.to_acquire().is_empty() && one.to_release().is_empty());
        assert!(one.lost_all().is_empty());
    }

    #[test]
    fn unregister_promotes() {
        let mut r = Registry::default();
        let (a, _, _) = r.connect("agent", "a", "v", now());
        let (b, _, _) = r.connect("agent", "b", "v", now());
        r.register(a, "prod", rec("h"));
        r.register(b, "prod", rec("h"));
        assert_eq!(r.accounts_of(b), vec![("prod".to_string(), Role::Standby)]);
        assert_eq!(r.replicas("prod"), vec![a, b]);
        assert_eq!(r.replica_label(b), "agent/b");
        let p = r.unregister(a, "prod", now());
        assert_eq!(p.len(), 1);
        assert_eq!(r.role(b, "prod"), Some(Role::Streaming));
        assert_eq!(r.role(a, "prod"), None);
        assert_eq!(r.replicas("prod"), vec![b]);
        assert!(r.replicas("other").is_empty());
        assert_eq!(r.replica_label(999), "");
    }
}
