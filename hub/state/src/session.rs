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
    collections::BTreeMap,
    time::{Instant, SystemTime},
};

use scale_agent_proto::v1::{
    self as pb, account_assignment::Role as PbRole, agent_message::Kind as Msg,
    hub_message::Kind as Out, kind_status::State as PbKindState, object_event::Type as PbType,
};

use scale_agent_hub_cache::{
    AccountCache, Applied, Cache, CachedObject, Event, KindInfo, KindKey, KindState, PackedJson,
};
use scale_agent_hub_model::{
    identity::{AllowRule, is_allowed},
    store_op::StoreOp,
};

use crate::registry::{
    AccountRecord, ClusterRecord, Promotion, Registration, Registry, Role, SessionId,
};

/// Registry and cache, guarded together by one lock.
#[derive(Debug, Default)]
pub struct HubState {
    pub registry: Registry,
    pub cache: Cache,
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

/// A STREAMING assignment with the hub's current resume points.
pub fn streaming_assignment(cache: &Cache, account: &str) -> pb::AccountAssignment {
    pb::AccountAssignment {
        account: account.to_string(),
        role: PbRole::Streaming as i32,
        reason: String::new(),
        resume_points: cache.resume_points(account),
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
    /// Account-name globs the stream's credentials allow (its agent token's, its enrolled
    /// identity's); every one must match, besides `--allow`.
    account_patterns: Vec<String>,
    next_seq: u64,
    /// Open snapshots by (account, kind, watch namespace).
    staging: BTreeMap<(String, KindKey, String), Staged>,
}

impl Session {
    /// After Hello (seq 1) was accepted.
    pub fn new(id: SessionId, identity: String) -> Self {
        Session {
            id,
            identity,
            account_patterns: Vec::new(),
            next_seq: 2,
            staging: BTreeMap::new(),
        }
    }

    /// Limits the accounts this stream may register to names matching every pattern.
    pub fn with_account_patterns(mut self, patterns: Vec<String>) -> Self {
        self.account_patterns = patterns;
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
        st: &HubState,
        account: &str,
        what: &str,
    ) -> Result<(), ProtocolError> {
        if st.registry.is_streaming(self.id, account) {
            return Ok(());
        }
        let role = match st.registry.role(self.id, account) {
            Some(Role::Standby) => "is STANDBY for it",
            Some(Role::Streaming) => "is STREAMING for it",
            None => "did not register it (or it was rejected)",
        };
        Err(precondition(format!(
            "{what} for account {account:?}, but this stream {role}; only the STREAMING replica \
             may send objects, snapshots, bookmarks and kind statuses"
        )))
    }

    /// Handles one message (after Hello).
    pub fn handle(
        &mut self,
        st: &mut HubState,
        limits: &Limits,
        msg: pb::AgentMessage,
        now: (Instant, SystemTime),
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        if msg.seq != self.next_seq {
            return Err(invalid(format!(
                "message seq {} ({}), expected {}: seq starts at 1 and increases by 1 on each stream",
                msg.seq,
                message_type(&msg),
                self.next_seq
            )));
        }
        self.next_seq += 1;
        let kind = msg
            .kind
            .ok_or_else(|| invalid(format!("message seq {} has no content", msg.seq)))?;
        match kind {
            Msg::Hello(_) => Err(precondition(
                "Hello is only allowed as the first message of a stream".into(),
            )),
            Msg::Heartbeat(_) => Ok(()),
            Msg::RegisterAccount(reg) => {
                self.register(st, limits, reg, now, fx);
                Ok(())
            }
            Msg::UnregisterAccount(un) => {
                self.on_unregister(st, un, now, fx);
                Ok(())
            }
            Msg::KindStatus(ks) => self.on_kind_status(st, ks, fx),
            Msg::SnapshotBegin(begin) => self.on_snapshot_begin(st, begin, fx),
            Msg::Object(ev) => self.object(st, limits, ev, fx),
            Msg::Tunnel(_) => Err(invalid(format!(
                "a TunnelFrame with seq {}: tunnel frames carry seq 0 (item 7 of the stream \
                 contract)",
                msg.seq
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
            Msg::AccountUnavailable(unavailable) => {
                self.on_unavailable(st, limits, unavailable, now, fx);
                Ok(())
            }
        }
    }

    /// The agent cannot serve an account at all: FAILED with its reason while no replica
    /// streams it. Only for a name this stream could register, so a stream cannot mark
    /// accounts of others FAILED.
    fn on_unavailable(
        &mut self,
        st: &mut HubState,
        limits: &Limits,
        unavailable: pb::AccountUnavailable,
        now: (Instant, SystemTime),
        fx: &mut Effects,
    ) {
        let name = unavailable.account;
        let may_register = validate_account_name(&name).is_ok()
            && is_allowed(&limits.allow, &self.identity, &name)
            && scale_agent_hub_model::names::accounts_allow(&self.account_patterns, &name)
            && st.registry.check_binding(&self.identity, &name).is_ok();
        if !may_register {
            tracing::debug!(account = %name, "AccountUnavailable for an account this stream may not register; ignored");
            return;
        }
        let reason = bounded_reason(&unavailable.reason);
        tracing::warn!(account = %name, %reason, "the agent cannot serve the account");
        self.staging.retain(|(a, _, _), _| *a != name);
        fx.promotions
            .extend(st.registry.note_unavailable(self.id, &name, &reason, now));
        // Told the account's state like a registration (the agent shows the hub's view).
        fx.registered.push(name);
    }

    /// Adds an object event to an open snapshot, within the stream's staging limit.
    fn stage(
        &mut self,
        scope: (String, KindKey, String),
        object: CachedObject,
        deleted: bool,
        limits: &Limits,
    ) -> Result<(), ProtocolError> {
        let others: u64 = self
            .staging
            .iter()
            .filter(|(k, _)| **k != scope)
            .map(|(_, s)| s.bytes)
            .sum();
        let Some(staged) = self.staging.get_mut(&scope) else {
            return Ok(());
        };
        staged.received += 1;
        let removed = staged
            .objects
            .remove(&object.uid)
            .map_or(0, |old| staged_size(&old));
        staged.bytes -= removed;
        if deleted {
            return Ok(());
        }
        let size = staged_size(&object);
        if others + staged.bytes + size > limits.max_staged_bytes {
            let (account, kind, namespace) = scope;
            return Err(ProtocolError::ResourceExhausted(format!(
                "the snapshots this stream has open hold more than the hub's limit of {} bytes \
                 (--max-staged-bytes), reached in the snapshot of account {account:?}, kind \
                 {kind}{}: raise --max-staged-bytes on the hub, or narrow the account's kinds \
                 or namespaces",
                limits.max_staged_bytes,
                if namespace.is_empty() {
                    String::new()
                } else {
                    format!(", namespace {namespace:?}")
                }
            )));
        }
        staged.bytes += size;
        staged.objects.insert(object.uid.clone(), object);
        Ok(())
    }

    fn on_unregister(
        &mut self,
        st: &mut HubState,
        un: pb::UnregisterAccount,
        now: (Instant, SystemTime),
        fx: &mut Effects,
    ) {
        self.staging.retain(|(a, _, _), _| *a != un.account);
        fx.promotions
            .extend(st.registry.unregister(self.id, &un.account, now));
    }

    fn on_kind_status(
        &mut self,
        st: &mut HubState,
        ks: pb::KindStatus,
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        self.require_streaming(st, &ks.account, "KindStatus")?;
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
                && let Some(kind) = st
                    .cache
                    .accounts
                    .get_mut(&ks.account)
                    .and_then(|a| a.kinds.get_mut(&key))
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

    fn on_snapshot_begin(
        &mut self,
        st: &HubState,
        b: pb::SnapshotBegin,
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        self.require_streaming(st, &b.account, "SnapshotBegin")?;
        let info = KindInfo::from_proto(b.kind.as_ref())
            .map_err(|e| invalid(format!("SnapshotBegin for account {:?}: {e}", b.account)))?;
        // A snapshot begun again (the agent retried its LIST) starts over.
        self.staging.insert(
            (b.account, info.key(), b.watch_namespace),
            Staged {
                info,
                objects: BTreeMap::new(),
                received: 0,
                bytes: 0,
            },
        );
        fx.relists += 1;
        Ok(())
    }

    fn on_operation_result(
        &mut self,
        st: &mut HubState,
        result: pb::OperationResult,
        fx: &mut Effects,
    ) {
        // Read-your-writes: the written objects enter the cache with this batch,
        // before the waiter hears of the result. Only accounts this stream
        // registered (as STREAMING or STANDBY) are touched.
        if st.registry.role(self.id, &result.account).is_some() {
            scale_agent_hub_cache::apply_result_to_cache(&mut st.cache, &result, &mut fx.ops);
        }
        fx.results.push(result);
    }

    fn on_snapshot_end(
        &mut self,
        st: &mut HubState,
        limits: &Limits,
        end: pb::SnapshotEnd,
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        self.require_streaming(st, &end.account, "SnapshotEnd")?;
        let info = KindInfo::from_proto(end.kind.as_ref())
            .map_err(|e| invalid(format!("SnapshotEnd for account {:?}: {e}", end.account)))?;
        let key = (end.account.clone(), info.key(), end.watch_namespace.clone());
        let staged = self.staging.remove(&key).ok_or_else(|| {
            precondition(format!(
                "SnapshotEnd for account {:?}, kind {}, watch namespace {:?} without a \
                 SnapshotBegin",
                end.account,
                info.key(),
                end.watch_namespace
            ))
        })?;
        if staged.received != end.object_count {
            return Err(precondition(format!(
                "SnapshotEnd for account {:?}, kind {}: object_count {} but {} objects \
                 were received; the snapshot is discarded",
                end.account,
                info.key(),
                end.object_count,
                staged.received
            )));
        }
        if end.resource_version.is_empty() {
            return Err(invalid(format!(
                "SnapshotEnd for account {:?}, kind {} has no resource_version",
                end.account,
                info.key()
            )));
        }
        let key = staged.info.key();
        let replaced = st
            .cache
            .accounts
            .get(&end.account)
            .and_then(|a| a.kinds.get(&key))
            .map_or(0, |k| {
                k.objects
                    .values()
                    .filter(|o| {
                        end.watch_namespace.is_empty() || o.namespace == end.watch_namespace
                    })
                    .count()
            });
        if !within_quota(
            st,
            limits,
            &end.account,
            &staged.info,
            staged.objects.len(),
            replaced,
            fx,
        ) {
            // Discarded whole: a snapshot is applied entirely or not at all.
            return Ok(());
        }
        let was_over = st
            .cache
            .accounts
            .get_mut(&end.account)
            .and_then(|a| a.kinds.get_mut(&key))
            .and_then(|k| k.over_quota.take())
            .is_some();
        st.cache.replace_scope(
            &end.account,
            &staged.info,
            &end.watch_namespace,
            staged.objects,
            &end.resource_version,
            &mut fx.ops,
        );
        if was_over {
            tracing::info!(account = %end.account, kind = %key, "kind cached again: its relist fits the account's object quota");
            fx.kind_statuses.push(pb::KindStatus {
                account: end.account.clone(),
                kind: Some(staged.info.to_proto()),
                state: PbKindState::Watching as i32,
                message: "cached again: the kind's relist fits the hub's \
                          --max-objects-per-account"
                    .into(),
                namespaces: Vec::new(),
            });
        }
        Ok(())
    }

    fn on_bookmark(
        &mut self,
        st: &mut HubState,
        bm: pb::Bookmark,
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        self.require_streaming(st, &bm.account, "Bookmark")?;
        let info = KindInfo::from_proto(bm.kind.as_ref())
            .map_err(|e| invalid(format!("Bookmark for account {:?}: {e}", bm.account)))?;
        if bm.resource_version.is_empty() {
            return Err(invalid(format!(
                "Bookmark for account {:?}, kind {} has no resource_version",
                bm.account,
                info.key()
            )));
        }
        if st.cache.is_over_quota(&bm.account, &info.key()) {
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

    fn register(
        &mut self,
        st: &mut HubState,
        limits: &Limits,
        reg: pb::RegisterAccount,
        now: (Instant, SystemTime),
        fx: &mut Effects,
    ) {
        let name = reg.account.clone();
        if let Err(reason) = validate_account_name(&name) {
            tracing::warn!(account = %name, %reason, "account rejected");
            fx.replies.push(assignment(&name, PbRole::Rejected, reason));
            return;
        }
        fx.registered.push(name.clone());
        // A refusal of a valid name is remembered: the account shows FAILED while nobody
        // streams it.
        let reject = |st: &mut HubState, reason: String, fx: &mut Effects| {
            tracing::warn!(account = %name, %reason, "account rejected");
            st.registry.note_rejection(self.id, &name, &reason);
            fx.replies.push(assignment(&name, PbRole::Rejected, reason));
        };
        if !is_allowed(&limits.allow, &self.identity, &name) {
            return reject(
                st,
                format!(
                    "identity {:?} may not register account {name:?} (no --allow rule matches)",
                    self.identity
                ),
                fx,
            );
        }
        if !scale_agent_hub_model::names::accounts_allow(&self.account_patterns, &name) {
            return reject(
                st,
                format!(
                    "identity {:?} may register accounts matching {} only (the pattern of its \
                     agent token or enrolment); issue a token with a wider --accounts pattern \
                     to serve {name:?}",
                    self.identity,
                    self.account_patterns.join(" and ")
                ),
                fx,
            );
        }
        let unbound = match st.registry.check_binding(&self.identity, &name) {
            Ok(unbound) => unbound,
            Err(reason) => return reject(st, reason, fx),
        };
        let Some(cluster) = reg.cluster.filter(|c| !c.api_server_host.is_empty()) else {
            return reject(
                st,
                format!("account {name:?} registered without cluster info (api_server_host)"),
                fx,
            );
        };
        let properties = if reg.properties_json.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&reg.properties_json).unwrap_or(serde_json::Value::Null)
        };
        let record = AccountRecord {
            cluster: ClusterRecord {
                api_server_host: cluster.api_server_host,
                ca_fingerprint: cluster.ca_fingerprint,
                kubernetes_version: cluster.kubernetes_version,
            },
            namespaces: reg.namespaces,
            properties,
        };
        let (registration, persist) = st.registry.register(self.id, &name, record);
        // Only an account's owner writes it (the shared store fences the others' writes);
        // a replica that takes the account over writes its record then
        // ([`crate::owners::duty`]).
        let owned = st.registry.owns(&name);
        if let Some(record) = persist.filter(|_| owned) {
            fx.ops.push(StoreOp::PutAccount {
                account: name.clone(),
                record,
            });
        }
        match registration {
            Registration::Rejected(reason) => {
                // A stream that served the account and now claims another cluster for it
                // stops serving it.
                self.staging.retain(|(a, _, _), _| *a != name);
                fx.promotions
                    .extend(st.registry.unregister(self.id, &name, now));
                reject(st, reason, fx)
            }
            Registration::Assigned(role) => {
                if unbound {
                    self.bind(st, &name, now, fx);
                }
                self.answer_assignment(st, &name, role, fx);
            }
        }
    }

    /// Binds an account to this stream's identity (its first registration).
    fn bind(&self, st: &mut HubState, name: &str, now: (Instant, SystemTime), fx: &mut Effects) {
        let since = jiff::Timestamp::try_from(now.1)
            .map(|t| t.as_second())
            .unwrap_or_default();
        let binding = st.registry.bind(name, &self.identity, since);
        tracing::info!(account = %name, "account bound to the identity that first registered it");
        if st.registry.owns(name) {
            fx.ops.push(StoreOp::PutBinding {
                account: name.to_string(),
                binding,
            });
        }
    }

    fn answer_assignment(&self, st: &HubState, name: &str, role: Role, fx: &mut Effects) {
        let name = name.to_string();
        match role {
            Role::Streaming => {
                let a = streaming_assignment(&st.cache, &name);
                fx.resumes += a.resume_points.len() as u64;
                tracing::info!(account = %name, resume_points = a.resume_points.len(), "account assigned: STREAMING");
                fx.replies.push(pb::HubMessage {
                    kind: Some(Out::Assignment(a)),
                });
            }
            Role::Standby => {
                tracing::info!(account = %name, "account assigned: STANDBY");
                fx.replies
                    .push(assignment(&name, PbRole::Standby, String::new()));
            }
        }
    }

    fn object(
        &mut self,
        st: &mut HubState,
        limits: &Limits,
        ev: pb::ObjectEvent,
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        self.require_streaming(st, &ev.account, "ObjectEvent")?;
        let info = KindInfo::from_proto(ev.kind.as_ref())
            .map_err(|e| invalid(format!("ObjectEvent for account {:?}: {e}", ev.account)))?;
        let deleted = match PbType::try_from(ev.r#type) {
            Ok(PbType::Applied) => false,
            Ok(PbType::Deleted) => true,
            _ => {
                return Err(invalid(format!(
                    "ObjectEvent for {}/{} in account {:?} has type {}; expected APPLIED or DELETED",
                    info.key(),
                    ev.name,
                    ev.account,
                    ev.r#type
                )));
            }
        };
        if ev.uid.is_empty() || ev.name.is_empty() || ev.resource_version.is_empty() {
            return Err(invalid(format!(
                "ObjectEvent for kind {} in account {:?} needs name, uid and resource_version \
                 (got name {:?}, uid {:?}, resource_version {:?})",
                info.key(),
                ev.account,
                ev.name,
                ev.uid,
                ev.resource_version
            )));
        }
        let mut truncated = ev.truncated;
        let mut json = ev.object_json;
        if json.len() as u64 > limits.max_object_bytes {
            tracing::warn!(account = %ev.account, kind = %info.key(), name = %ev.name, bytes = json.len(), "object larger than max_object_bytes; keeping its metadata only");
            truncated = true;
        }
        if truncated {
            json = Vec::new();
        } else if !deleted && serde_json::from_slice::<AnyJsonObject>(&json).is_err() {
            return Err(invalid(format!(
                "ObjectEvent for {} {:?} in account {:?}: object_json is not a JSON object",
                info.key(),
                ev.name,
                ev.account
            )));
        }
        let object = CachedObject {
            namespace: ev.namespace,
            name: ev.name,
            uid: ev.uid,
            resource_version: ev.resource_version,
            json: PackedJson::pack(&json),
            truncated,
        };
        let scope = (ev.account.clone(), info.key(), ev.watch_namespace.clone());
        if self.staging.contains_key(&scope) {
            return self.stage(scope, object, deleted, limits);
        }
        if st.cache.is_over_quota(&ev.account, &scope.1) {
            // Left out of the cache whole until a relist fits: deltas are dropped.
            fx.stale += 1;
            return Ok(());
        }
        if !deleted && limits.max_objects_per_account > 0 {
            let known = st
                .cache
                .accounts
                .get(&ev.account)
                .and_then(|a| a.kinds.get(&scope.1))
                .is_some_and(|k| k.objects.contains_key(&object.uid));
            if !known && !within_quota(st, limits, &ev.account, &info, 1, 0, fx) {
                return Ok(());
            }
        }
        let applied = st.cache.apply_event(
            &ev.account,
            &info,
            Event {
                deleted,
                object,
                watch_namespace: ev.watch_namespace,
            },
            &mut fx.ops,
        );
        if applied == Applied::Stale {
            fx.stale += 1;
        }
        Ok(())
    }
}

/// Whether `adding` objects may enter `info`'s cache of `account` in place of `replacing`
/// of its objects within `--max-objects-per-account`. Past it, the kind is left out of the
/// cache whole ([`Cache::exceed_quota`]) and the agent is told (KindStatus OVER_QUOTA).
fn within_quota(
    st: &mut HubState,
    limits: &Limits,
    account: &str,
    info: &KindInfo,
    adding: usize,
    replacing: usize,
    fx: &mut Effects,
) -> bool {
    let max = limits.max_objects_per_account;
    if max == 0 {
        return true;
    }
    let count = st
        .cache
        .accounts
        .get(account)
        .map_or(0, AccountCache::object_count);
    let after = count.saturating_sub(replacing) + adding;
    if after as u64 <= max {
        return true;
    }
    let reason = format!(
        "account {account:?} would hold {after} objects with kind {}, more than the hub's \
         --max-objects-per-account of {max}: the kind is not cached (the proxy reads it from \
         the cluster) until a relist of it fits; raise the limit on the hub, or narrow the \
         account's kinds or namespaces",
        info.key()
    );
    let already = st.cache.is_over_quota(account, &info.key());
    let dropped = st
        .cache
        .exceed_quota(account, info, reason.clone(), &mut fx.ops);
    if !already {
        tracing::warn!(%account, kind = %info.key(), objects = after, limit = max, dropped, "account over its object quota; kind left out of the cache");
        fx.kind_statuses.push(pb::KindStatus {
            account: account.to_string(),
            kind: Some(info.to_proto()),
            state: PbKindState::OverQuota as i32,
            message: reason,
            namespaces: Vec::new(),
        });
    }
    false
}

/// Accepts any JSON object without building it: the cache keeps the bytes, so parsing each
/// event into a map only to drop it cost the hub about 8 % of its CPU at saturation.
struct AnyJsonObject;

impl<'de> serde::Deserialize<'de> for AnyJsonObject {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = AnyJsonObject;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<AnyJsonObject, A::Error> {
                use serde::de::IgnoredAny;
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(AnyJsonObject)
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

#[cfg(test)]
mod tests;
