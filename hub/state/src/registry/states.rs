//! Each account's lifecycle state as Armory users know it (ACTIVE, INACTIVE, FAILED,
//! ORPHANED): what the registry derives from its streams, refusals and the agents' reports,
//! and the transitions observed since the last look.

use std::{
    collections::BTreeMap,
    time::{Instant, SystemTime},
};

use scale_agent_proto::v1::kind_status::State as KindStatusState;

use super::{ClusterRecord, MAX_REJECTIONS, Promotion, Registry, SessionId};

/// An account's lifecycle state, as Armory users know them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AccountState {
    /// A replica streams it.
    Active,
    /// No agent serves it; its cache is kept until the grace period ends.
    Inactive,
    /// Its last registration was rejected (and no agent serves it), a replica reported it
    /// cannot serve it at all (and no agent serves it: AccountUnavailable), or the API
    /// server refuses the credentials of the replica streaming it (401 Unauthorized).
    Failed,
    /// Its agent left and none took over within the grace period: the cache is gone, the
    /// binding to its identity is kept.
    Orphaned,
}

impl AccountState {
    pub const ALL: [AccountState; 4] = [
        AccountState::Active,
        AccountState::Inactive,
        AccountState::Failed,
        AccountState::Orphaned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AccountState::Active => "ACTIVE",
            AccountState::Inactive => "INACTIVE",
            AccountState::Failed => "FAILED",
            AccountState::Orphaned => "ORPHANED",
        }
    }
}

/// An account's state and its last transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateRecord {
    pub state: AccountState,
    /// Why the account entered the state, in words for people.
    pub reason: String,
    pub since: SystemTime,
    /// The cluster last registered for it, kept for ORPHANED accounts (whose record is gone);
    /// `None` when unknown (an ORPHANED account loaded at start-up from its binding only).
    pub cluster: Option<ClusterRecord>,
}

/// An account changed state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub account: String,
    pub from: Option<AccountState>,
    pub to: StateRecord,
}

/// Whether a KindStatus FAILING message says the API server refused the credentials: the
/// agent reports API errors as `<code> <reason>: <message>` (stream contract, item 11).
pub fn credentials_refused(message: &str) -> bool {
    message.starts_with("401 ")
}

impl Registry {
    /// Remembers that `session`'s registration of `name` was refused (FAILED while no agent
    /// streams the account). Not remembered past [`MAX_REJECTIONS`] names.
    pub fn note_rejection(&mut self, session: SessionId, name: &str, reason: &str) {
        if self.rejections.len() >= MAX_REJECTIONS && !self.rejections.contains_key(name) {
            return;
        }
        self.mark_changed(name);
        self.rejections
            .insert(name.to_string(), (session, reason.to_string()));
    }

    /// `session` cannot serve `name` at all (AccountUnavailable, checked against the allow
    /// rules and bindings by the caller): it stops serving it if it did, and the account is
    /// FAILED with `reason` while no replica streams it. Returns the promotions. Not
    /// remembered past [`MAX_REJECTIONS`] names.
    pub fn note_unavailable(
        &mut self,
        session: SessionId,
        name: &str,
        reason: &str,
        now: (Instant, SystemTime),
    ) -> Vec<Promotion> {
        let promotions = self.stop_serving(session, name, now);
        self.mark_changed(name);
        if self.unavailable.len() < MAX_REJECTIONS || self.unavailable.contains_key(name) {
            self.unavailable
                .insert(name.to_string(), (session, reason.to_string()));
        }
        promotions
    }

    /// A kind's status from `session`, which streams `name` (checked by the caller): FAILING
    /// with a 401 means the API server refuses the account's credentials (FAILED); WATCHING
    /// means they work again. Other states say nothing about the credentials.
    pub fn note_kind_status(
        &mut self,
        session: SessionId,
        name: &str,
        state: KindStatusState,
        message: &str,
    ) {
        self.mark_changed(name);
        match state {
            KindStatusState::Failing if credentials_refused(message) => {
                self.credential_failures
                    .insert(name.to_string(), (session, message.to_string()));
            }
            KindStatusState::Watching
                if self
                    .credential_failures
                    .get(name)
                    .is_some_and(|(s, _)| *s == session) =>
            {
                self.credential_failures.remove(name);
            }
            _ => {}
        }
    }

    /// The state an account is in now, with its reason; `None` for a name the hub knows
    /// nothing of.
    pub(super) fn derive_state(&self, name: &str) -> Option<(AccountState, String)> {
        let account = self.accounts.get(name);
        if let Some(session) = account.and_then(|a| a.streaming) {
            if let Some((_, message)) = self
                .credential_failures
                .get(name)
                .filter(|(s, _)| *s == session)
            {
                return Some((
                    AccountState::Failed,
                    format!(
                        "the API server refuses the account's credentials on replica {} ({message}): \
                         renew the token or client certificate in its kubeconfig; the agent \
                         retries and the account is ACTIVE again once a kind is watched",
                        self.replica_label(session)
                    ),
                ));
            }
            return Some((
                AccountState::Active,
                format!("streamed by replica {}", self.replica_label(session)),
            ));
        }
        if let Some(standby) = account
            .filter(|_| !self.owns(name))
            .and_then(|a| a.standbys.first())
        {
            return Some((
                AccountState::Active,
                format!(
                    "streamed through another hub replica, which owns it; replica {} stands \
                     by on this one",
                    self.replica_label(*standby)
                ),
            ));
        }
        if let Some((session, reason)) = self.unavailable.get(name) {
            return Some((
                AccountState::Failed,
                format!(
                    "replica {} cannot serve it: {reason}. Fix the account's kubeconfig or \
                     credentials in the agent's config; the agent keeps trying, and the \
                     account is ACTIVE once it registers",
                    self.replica_label(*session)
                ),
            ));
        }
        if let Some((session, reason)) = self.rejections.get(name) {
            return Some((
                AccountState::Failed,
                format!(
                    "the registration by replica {} was rejected: {reason}",
                    self.replica_label(*session)
                ),
            ));
        }
        if account.is_some() {
            return Some((
                AccountState::Inactive,
                "no agent serves it; its cache is kept until the grace period ends".to_string(),
            ));
        }
        self.bindings.get(name).map(|b| {
            (
                AccountState::Orphaned,
                format!(
                    "no agent took it over within the grace period, so its cache was removed; \
                     it stays bound to identity {:?}, whose agent makes it ACTIVE again by \
                     registering it",
                    b.identity
                ),
            )
        })
    }

    /// Brings the state of every account changed since the last look
    /// ([`Registry::mark_changed`]) up to date; returns the transitions, oldest state first.
    /// Call after anything that changes sessions, accounts, bindings or rejections.
    pub fn observe(&mut self, now: SystemTime) -> Vec<Transition> {
        let changed = std::mem::replace(
            &mut self.changed,
            super::Changed {
                all: false,
                names: Default::default(),
            },
        );
        let names: Vec<String> = if changed.all {
            let mut names: Vec<String> = self
                .accounts
                .keys()
                .chain(self.bindings.keys())
                .chain(self.rejections.keys())
                .chain(self.unavailable.keys())
                .chain(self.states.keys())
                .cloned()
                .collect();
            names.sort();
            names.dedup();
            names
        } else {
            changed.names.into_iter().collect()
        };
        let mut transitions = Vec::new();
        for name in names {
            let cluster = self.accounts.get(&name).map(|a| a.record.cluster.clone());
            let Some((state, reason)) = self.derive_state(&name) else {
                self.states.remove(&name);
                continue;
            };
            let previous = self.states.get_mut(&name);
            let from = previous.as_ref().map(|p| p.state);
            if let Some(previous) = previous {
                if cluster.is_some() {
                    previous.cluster = cluster.clone();
                }
                if previous.state == state {
                    // The same state for another reason (another replica streams it, or
                    // another hub replica took it): the words follow, the time stays.
                    previous.reason = reason;
                    continue;
                }
            }
            let cluster =
                cluster.or_else(|| self.states.get(&name).and_then(|p| p.cluster.clone()));
            let record = StateRecord {
                state,
                reason,
                since: now,
                cluster,
            };
            self.states.insert(name.clone(), record.clone());
            transitions.push(Transition {
                account: name,
                from,
                to: record,
            });
        }
        transitions
    }

    /// The streams to tell about an account's state: those serving it, the one whose
    /// registration of it was refused and the one that reported it cannot serve it.
    pub fn interested_in(&self, name: &str) -> Vec<SessionId> {
        let mut sessions = self.replicas(name);
        for (session, _) in self
            .rejections
            .get(name)
            .into_iter()
            .chain(self.unavailable.get(name))
        {
            if !sessions.contains(session) {
                sessions.push(*session);
            }
        }
        sessions
    }

    /// How many accounts are in each state.
    pub fn state_counts(&self) -> BTreeMap<AccountState, usize> {
        let mut counts: BTreeMap<AccountState, usize> =
            AccountState::ALL.iter().map(|s| (*s, 0)).collect();
        for record in self.states.values() {
            *counts.entry(record.state).or_default() += 1;
        }
        counts
    }
}
