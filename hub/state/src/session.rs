//! The protocol state of one agent stream, without I/O: sequence numbers, registration,
//! snapshot staging, and validation of every message against the hub's state.
//!
//! Error policy: a message that breaks the stream contract (wrong sequence number, a second
//! Hello, an event for an account this stream does not stream, SnapshotEnd without
//! SnapshotBegin, an invalid kind or object, a snapshot whose object count does not match)
//! ends the stream with a gRPC status (`invalid_argument` for a malformed message,
//! `failed_precondition` for a message out of order) whose message names the problem.
//! Messages before it in the same batch are applied. A registration the hub refuses
//! (another cluster, not allowed, invalid name) is answered with a REJECTED assignment and
//! the stream goes on.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Instant, SystemTime},
};

use scale_agent_proto::v1::{
    self as pb, account_assignment::Role as PbRole, agent_message::Kind as Msg,
    hub_message::Kind as Out, kind_status::State as PbKindState,
};

use scale_agent_hub_cache::{
    AccountCache, Cache, CachedBytes, CachedObject, HistoryBudget, KindInfo, KindKey, KindState,
};
use scale_agent_hub_model::{identity::AllowRule, store_op::StoreOp};

use crate::{
    identity_use::StreamShare,
    registry::{Promotion, Registry, Role, SessionId},
};

/// Registry and cache in one place: the state as the store loads it, and the
/// single-threaded form [`Session::handle`] works on (tests). The running hub keeps them
/// apart ([`crate::Live`]): the registry behind one lock, each account's cache behind its
/// own.
#[derive(Debug, Default)]
pub struct HubState {
    pub registry: Registry,
    pub cache: Cache,
}

/// What a message that changes the registry (RegisterAccount, UnregisterAccount,
/// KindStatus, AccountUnavailable) works on: the registry, exclusively, and the cache of
/// the message's account.
pub struct Control<'a> {
    pub registry: &'a mut Registry,
    pub cache: &'a mut AccountCache,
}

/// What any other message works on: the registry, shared with the other streams' batches
/// and the readers, and the cache of the message's account under that account's lock.
pub struct Data<'a> {
    pub registry: &'a Registry,
    pub cache: &'a mut AccountCache,
    pub budget: &'a HistoryBudget,
    /// The hub-wide budget of cached object bytes (`--max-cached-mib`).
    pub cached_bytes: &'a CachedBytes,
}

/// Which lock a message needs ([`route`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route<'m> {
    /// [`Session::handle_control`], for the cache of this account.
    Control(&'m str),
    /// [`Session::handle_data`], for the cache of this account (`None`: a message of no
    /// account, such as a Heartbeat).
    Data(Option<&'m str>),
}

/// Which lock a message needs: a message that changes the registry takes it exclusively;
/// any other takes it shared, with the lock of its account's cache.
pub fn route(msg: &pb::AgentMessage) -> Route<'_> {
    match &msg.kind {
        Some(Msg::RegisterAccount(m)) => Route::Control(&m.account),
        Some(Msg::UnregisterAccount(m)) => Route::Control(&m.account),
        Some(Msg::KindStatus(m)) => Route::Control(&m.account),
        Some(Msg::AccountUnavailable(m)) => Route::Control(&m.account),
        Some(Msg::SnapshotBegin(m)) => Route::Data(Some(&m.account)),
        Some(Msg::Object(m)) => Route::Data(Some(&m.account)),
        Some(Msg::SnapshotEnd(m)) => Route::Data(Some(&m.account)),
        Some(Msg::Bookmark(m)) => Route::Data(Some(&m.account)),
        Some(Msg::OperationResult(m)) => Route::Data(Some(&m.account)),
        Some(Msg::DiscoveryChanged(m)) => Route::Data(Some(&m.account)),
        None
        | Some(
            Msg::Hello(_)
            | Msg::Heartbeat(_)
            | Msg::Tunnel(_)
            | Msg::RenewCertificate(_)
            | Msg::DynamicAccountStatus(_),
        ) => Route::Data(None),
    }
}

/// Why a stream is ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// The message itself is malformed.
    InvalidArgument(String),
    /// The message is valid but not allowed now.
    FailedPrecondition(String),
    /// The stream went past a limit that protects the hub's memory.
    ResourceExhausted(String),
}

impl ProtocolError {
    pub fn to_status(&self) -> tonic::Status {
        match self {
            ProtocolError::InvalidArgument(m) => tonic::Status::invalid_argument(m.clone()),
            ProtocolError::FailedPrecondition(m) => tonic::Status::failed_precondition(m.clone()),
            ProtocolError::ResourceExhausted(m) => tonic::Status::resource_exhausted(m.clone()),
        }
    }
}

fn invalid(message: String) -> ProtocolError {
    ProtocolError::InvalidArgument(message)
}

fn precondition(message: String) -> ProtocolError {
    ProtocolError::FailedPrecondition(message)
}

/// What handling messages produced, for the caller to carry out after the batch.
#[derive(Debug, Default)]
pub struct Effects {
    /// To persist, in one transaction.
    pub ops: Vec<StoreOp>,
    /// To send to this agent once the batch is stored.
    pub replies: Vec<pb::HubMessage>,
    /// Other streams to tell they now stream an account.
    pub promotions: Vec<Promotion>,
    /// Whether a message changed the registry (accounts' states may have changed).
    pub registry_changed: bool,
    /// Kinds handed out with a resume point.
    pub resumes: u64,
    /// Snapshots begun.
    pub relists: u64,
    /// Events ignored as replays.
    pub stale: u64,
    /// Operation results to hand to their waiters once the batch is stored.
    pub results: Vec<pb::OperationResult>,
    /// Accounts whose cluster's kinds changed (their cached discovery is dropped).
    pub discovery_changed: Vec<String>,
    /// CSRs of RenewCertificate messages, to answer once the batch is stored.
    pub renewals: Vec<String>,
    /// Accounts this stream registered (accepted or not): it is sent their state.
    pub registered: Vec<String>,
    /// Reports on dynamic accounts, for [`crate::dynamic_accounts`].
    pub dynamic_statuses: Vec<pb::DynamicAccountStatus>,
    /// The hub's own state of kinds (OVER_QUOTA and back), to send to this agent.
    pub kind_statuses: Vec<pb::KindStatus>,
}

/// Hub settings a stream needs.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_object_bytes: u64,
    /// Most bytes one stream may hold in open snapshots.
    pub max_staged_bytes: u64,
    /// Most objects cached per account (0: no limit).
    pub max_objects_per_account: u64,
    /// Most accounts bound to one agent identity (`--max-accounts-per-identity`; 0: no
    /// limit).
    pub max_accounts_per_identity: u64,
    pub allow: Vec<AllowRule>,
}

/// The metrics label of a message.
pub fn message_type(msg: &pb::AgentMessage) -> &'static str {
    match &msg.kind {
        None => "empty",
        Some(Msg::Hello(_)) => "hello",
        Some(Msg::RegisterAccount(_)) => "register_account",
        Some(Msg::UnregisterAccount(_)) => "unregister_account",
        Some(Msg::KindStatus(_)) => "kind_status",
        Some(Msg::SnapshotBegin(_)) => "snapshot_begin",
        Some(Msg::Object(_)) => "object",
        Some(Msg::SnapshotEnd(_)) => "snapshot_end",
        Some(Msg::Bookmark(_)) => "bookmark",
        Some(Msg::Heartbeat(_)) => "heartbeat",
        Some(Msg::OperationResult(_)) => "operation_result",
        Some(Msg::Tunnel(_)) => "tunnel",
        Some(Msg::DiscoveryChanged(_)) => "discovery_changed",
        Some(Msg::RenewCertificate(_)) => "renew_certificate",
        Some(Msg::DynamicAccountStatus(_)) => "dynamic_account_status",
        Some(Msg::AccountUnavailable(_)) => "account_unavailable",
    }
}

/// Most bytes of an AccountUnavailable reason the hub keeps.
const MAX_REASON_BYTES: usize = 4096;

/// `reason` cut to [`MAX_REASON_BYTES`] at a character boundary; "no reason given" when empty.
fn bounded_reason(reason: &str) -> String {
    let reason = reason.trim();
    if reason.is_empty() {
        return "no reason given".into();
    }
    let mut end = reason.len().min(MAX_REASON_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    if end < reason.len() {
        format!("{}…", &reason[..end])
    } else {
        reason.to_string()
    }
}

/// Checks the first message of a stream: Hello with seq 1.
pub fn check_hello(msg: pb::AgentMessage) -> Result<pb::Hello, ProtocolError> {
    match msg.kind {
        Some(Msg::Hello(hello)) if msg.seq == 1 => Ok(hello),
        Some(Msg::Hello(_)) => Err(invalid(format!(
            "Hello has seq {}; the first message of a stream has seq 1",
            msg.seq
        ))),
        _ => Err(precondition(format!(
            "the first message of a stream must be Hello, got {}",
            message_type(&msg)
        ))),
    }
}

pub use scale_agent_hub_model::names::validate_account_name;

/// A STREAMING assignment with the hub's current resume points (`cache`: the account's).
pub fn streaming_assignment(cache: &AccountCache, account: &str) -> pb::AccountAssignment {
    pb::AccountAssignment {
        account: account.to_string(),
        role: PbRole::Streaming as i32,
        reason: String::new(),
        resume_points: cache.resume_points(),
    }
}

fn assignment(account: &str, role: PbRole, reason: String) -> pb::HubMessage {
    pb::HubMessage {
        kind: Some(Out::Assignment(pb::AccountAssignment {
            account: account.to_string(),
            role: role as i32,
            reason,
            resume_points: Vec::new(),
        })),
    }
}

#[derive(Debug)]
struct Staged {
    info: KindInfo,
    objects: BTreeMap<String, CachedObject>,
    received: u64,
    /// What `objects` holds, as counted by [`staged_size`].
    bytes: u64,
}

/// The bytes a staged object holds (its packed JSON and identifying strings).
fn staged_size(object: &CachedObject) -> u64 {
    (object.json.packed_len()
        + object.namespace.len()
        + object.name.len()
        + object.uid.len()
        + object.resource_version.len()) as u64
}

/// One stream's protocol state.
#[derive(Debug)]
pub struct Session {
    pub id: SessionId,
    pub identity: String,
    /// The account names the stream's credentials grant (its agent token's and enrolled
    /// identity's patterns, or only what `--allow` names, or nothing), besides `--allow`.
    grant: scale_agent_hub_model::names::AccountGrant,
    next_seq: u64,
    /// Open snapshots by (account, kind, watch namespace).
    staging: BTreeMap<(String, KindKey, String), Staged>,
    /// Accounts this stream served and then unregistered (an agent draining on shutdown):
    /// results of the operations routed to it before still update the cache.
    unregistered: BTreeSet<String>,
    /// The stream's place among its identity's streams: what they stage together is held
    /// to `--max-staged-bytes` (`None`: the session's tests, one stream alone).
    share: Option<StreamShare>,
}

impl Session {
    /// After Hello (seq 1) was accepted.
    pub fn new(id: SessionId, identity: String) -> Self {
        Session {
            id,
            identity,
            // What the session's tests start with; the gRPC service always sets the grant of
            // the stream's credentials (`with_grant`).
            grant: scale_agent_hub_model::names::AccountGrant::Patterns(Vec::new()),
            next_seq: 2,
            staging: BTreeMap::new(),
            unregistered: BTreeSet::new(),
            share: None,
        }
    }

    /// Counts what this stream stages with its identity's other streams (`share`, from
    /// [`crate::identity_use::IdentityUse::join`]).
    pub fn with_share(mut self, share: StreamShare) -> Self {
        self.share = Some(share);
        self
    }

    /// What the identity's other streams stage (0 without a share).
    fn others_staged(&self) -> u64 {
        self.share.as_ref().map_or(0, StreamShare::others_staged)
    }

    /// Tells the identity's share what this stream stages now (after a message, which may
    /// have begun, filled, ended or dropped snapshots).
    fn report_staged(&mut self) {
        if let Some(share) = &mut self.share {
            share.set_staged(self.staging.values().map(|s| s.bytes).sum());
        }
    }

    /// Limits the accounts this stream may register to what its credentials grant.
    pub fn with_grant(mut self, grant: scale_agent_hub_model::names::AccountGrant) -> Self {
        self.grant = grant;
        self
    }

    /// The sequence number of the last message handled.
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Number of snapshots open.
    pub fn open_snapshots(&self) -> usize {
        self.staging.len()
    }

    fn require_streaming(
        &self,
        registry: &Registry,
        account: &str,
        what: &str,
    ) -> Result<(), ProtocolError> {
        if registry.is_streaming(self.id, account) {
            return Ok(());
        }
        let role = match registry.role(self.id, account) {
            Some(Role::Standby) => "is STANDBY for it",
            Some(Role::Streaming) => "is STREAMING for it",
            None => "did not register it (or it was rejected)",
        };
        Err(precondition(format!(
            "{what} for account {account:?}, but this stream {role}; only the STREAMING replica \
             may send objects, snapshots, bookmarks and kind statuses"
        )))
    }

    /// Checks the message's sequence number and takes its content.
    fn next(&mut self, msg: pb::AgentMessage) -> Result<Msg, ProtocolError> {
        if msg.seq != self.next_seq {
            return Err(invalid(format!(
                "message seq {} ({}), expected {}: seq starts at 1 and increases by 1 on each stream",
                msg.seq,
                message_type(&msg),
                self.next_seq
            )));
        }
        self.next_seq += 1;
        msg.kind
            .ok_or_else(|| invalid(format!("message seq {} has no content", msg.seq)))
    }

    /// Handles one message (after Hello) on the single-threaded state: takes the lock
    /// [`route`] names, as the stream loop does on the live one.
    pub fn handle(
        &mut self,
        st: &mut HubState,
        limits: &Limits,
        msg: pb::AgentMessage,
        now: (Instant, SystemTime),
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        let budget = st.cache.history_budget.clone();
        let cached_bytes = st.cache.cached_bytes.clone();
        let mut scratch = AccountCache::default();
        let account = match route(&msg) {
            Route::Control(a) | Route::Data(Some(a)) => Some(a.to_string()),
            Route::Data(None) => None,
        };
        let cache = match account {
            Some(a)
                if st.cache.accounts.contains_key(&a)
                    || st.registry.role(self.id, &a).is_some() =>
            {
                st.cache.account_mut(&a)
            }
            _ => &mut scratch,
        };
        if matches!(route(&msg), Route::Control(_)) {
            fx.registry_changed = true;
            let mut control = Control {
                registry: &mut st.registry,
                cache,
            };
            let handled = self.handle_control(&mut control, limits, msg, now, fx);
            cached_bytes.settle(control.cache);
            handled
        } else {
            let mut data = Data {
                registry: &st.registry,
                cache,
                budget: &budget,
                cached_bytes: &cached_bytes,
            };
            let handled = self.handle_data(&mut data, limits, msg, None, fx);
            cached_bytes.settle(data.cache);
            handled
        }
    }

    /// Handles a message that changes the registry ([`Route::Control`]).
    pub fn handle_control(
        &mut self,
        st: &mut Control<'_>,
        limits: &Limits,
        msg: pb::AgentMessage,
        now: (Instant, SystemTime),
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        let handled = self.control_message(st, limits, msg, now, fx);
        self.report_staged();
        handled
    }

    fn control_message(
        &mut self,
        st: &mut Control<'_>,
        limits: &Limits,
        msg: pb::AgentMessage,
        now: (Instant, SystemTime),
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        match self.next(msg)? {
            Msg::RegisterAccount(reg) => {
                self.register(st, limits, reg, now, fx);
                Ok(())
            }
            Msg::UnregisterAccount(un) => {
                self.on_unregister(st, un, now, fx);
                Ok(())
            }
            Msg::KindStatus(ks) => self.on_kind_status(st, ks, fx),
            Msg::AccountUnavailable(unavailable) => {
                self.on_unavailable(st, limits, unavailable, now, fx);
                Ok(())
            }
            other => Err(precondition(format!(
                "{} routed as a registry change (a bug in the hub's stream loop)",
                message_type(&pb::AgentMessage {
                    seq: 0,
                    kind: Some(other)
                })
            ))),
        }
    }

    /// Handles any other message ([`Route::Data`]); `prepared` is what [`prepare`] made of
    /// it before the lock was taken (`None`: it is prepared here).
    pub fn handle_data(
        &mut self,
        st: &mut Data<'_>,
        limits: &Limits,
        msg: pb::AgentMessage,
        prepared: Option<Result<PreparedObject, ProtocolError>>,
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        let handled = self.data_message(st, limits, msg, prepared, fx);
        self.report_staged();
        handled
    }

    fn data_message(
        &mut self,
        st: &mut Data<'_>,
        limits: &Limits,
        msg: pb::AgentMessage,
        prepared: Option<Result<PreparedObject, ProtocolError>>,
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        let seq = msg.seq;
        match self.next(msg)? {
            Msg::Hello(_) => Err(precondition(
                "Hello is only allowed as the first message of a stream".into(),
            )),
            Msg::Heartbeat(_) => Ok(()),
            Msg::SnapshotBegin(begin) => self.on_snapshot_begin(st, begin, fx),
            Msg::Object(ev) => self.object(st, limits, ev, prepared, fx),
            Msg::Tunnel(_) => Err(invalid(format!(
                "a TunnelFrame with seq {seq}: tunnel frames carry seq 0 (item 7 of the stream \
                 contract)"
            ))),
            Msg::DiscoveryChanged(changed) => {
                if st.registry.role(self.id, &changed.account).is_some() {
                    fx.discovery_changed.push(changed.account);
                }
                Ok(())
            }
            Msg::OperationResult(result) => {
                self.on_operation_result(st, result, fx);
                Ok(())
            }
            Msg::SnapshotEnd(end) => self.on_snapshot_end(st, limits, end, fx),
            Msg::RenewCertificate(renew) => {
                fx.renewals.push(renew.csr_pem);
                Ok(())
            }
            Msg::Bookmark(bm) => self.on_bookmark(st, bm, fx),
            Msg::DynamicAccountStatus(status) => {
                fx.dynamic_statuses.push(status);
                Ok(())
            }
            other @ (Msg::RegisterAccount(_)
            | Msg::UnregisterAccount(_)
            | Msg::KindStatus(_)
            | Msg::AccountUnavailable(_)) => Err(precondition(format!(
                "{} routed without the registry's lock (a bug in the hub's stream loop)",
                message_type(&pb::AgentMessage {
                    seq,
                    kind: Some(other)
                })
            ))),
        }
    }

    fn on_kind_status(
        &mut self,
        st: &mut Control<'_>,
        ks: pb::KindStatus,
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        self.require_streaming(st.registry, &ks.account, "KindStatus")?;
        let info = KindInfo::from_proto(ks.kind.as_ref())
            .map_err(|e| invalid(format!("KindStatus for account {:?}: {e}", ks.account)))?;
        let parsed = PbKindState::try_from(ks.state);
        if let Ok(state) = parsed {
            st.registry
                .note_kind_status(self.id, &ks.account, state, &ks.message);
        }
        let state = parsed
            .map(|s| s.as_str_name().to_string())
            .unwrap_or_else(|_| format!("UNKNOWN({})", ks.state));
        if parsed == Ok(PbKindState::Stopped) {
            let key = info.key();
            self.staging.retain(|(a, k, ns), _| {
                !(*a == ks.account
                    && *k == key
                    && (ks.namespaces.is_empty() || ks.namespaces.contains(ns)))
            });
            st.cache
                .drop_scope(&ks.account, &info, &ks.namespaces, &mut fx.ops);
            if ks.namespaces.is_empty()
                && let Some(kind) = st.cache.kinds.get_mut(&key)
            {
                // No longer watched at all: nothing is left out of the cache any more.
                kind.over_quota = None;
            }
        }
        st.cache.set_status(
            &ks.account,
            &info,
            KindState {
                state,
                message: ks.message,
                namespaces: ks.namespaces,
            },
            &mut fx.ops,
        );
        Ok(())
    }

    fn on_operation_result(
        &mut self,
        st: &mut Data<'_>,
        result: pb::OperationResult,
        fx: &mut Effects,
    ) {
        // Read-your-writes: the written objects enter the cache with this batch,
        // before the waiter hears of the result. Only accounts this stream
        // registered (as STREAMING or STANDBY), or served until it unregistered them, are
        // touched.
        if st.registry.role(self.id, &result.account).is_some()
            || self.served_before(st.registry, &result.account)
        {
            scale_agent_hub_cache::apply_result_to_account(st.cache, &result, &mut fx.ops);
        }
        fx.results.push(result);
    }

    fn on_bookmark(
        &mut self,
        st: &mut Data<'_>,
        bm: pb::Bookmark,
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        self.require_streaming(st.registry, &bm.account, "Bookmark")?;
        let info = KindInfo::from_proto(bm.kind.as_ref())
            .map_err(|e| invalid(format!("Bookmark for account {:?}: {e}", bm.account)))?;
        if bm.resource_version.is_empty() {
            return Err(invalid(format!(
                "Bookmark for account {:?}, kind {} has no resource_version",
                bm.account,
                info.key()
            )));
        }
        if st.cache.is_over_quota(&info.key()) {
            // No resume point for a kind left out of the cache: the agent relists it.
            return Ok(());
        }
        st.cache.bookmark(
            &bm.account,
            &info,
            &bm.watch_namespace,
            &bm.resource_version,
            &mut fx.ops,
        );
        Ok(())
    }
}

mod registration;
mod snapshot;
pub use snapshot::{PreparedObject, prepare};
#[cfg(test)]
mod tests;
