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
            // troubleshooting: an agent's stream refused: gRPC `PERMISSION_DENIED`
            // Another process with the same identity and replica name holds a live stream. Usually
            // two pods sharing a replica name, or a process started while the old stream has not
            // yet timed out.
            "a stream of identity {identity:?} and replica {replica:?} is live, and this one did \
             not present its session token (Hello.session_token, from that stream's Welcome). \
             An agent reconnecting presents it itself; a new agent process waits until the old \
             stream ends (two heartbeat periods after it went silent). Two agents sharing an \
             identity need distinct replica names (the pod name)"
        ))
    }

    /// The live stream of `identity` and `replica`, if any.
    /// Whether `identity` has a stream of `replica` (which a new one of it replaces).
    pub fn has_session(&self, identity: &str, replica: &str) -> bool {
        self.session_of(identity, replica).is_some()
    }

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
mod tests;
