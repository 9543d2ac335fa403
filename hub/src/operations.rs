//! Operations: `POST /api/v1/accounts/{name}/operations` turns a JSON request into an
//! [`pb::Operation`], routes it to a connected replica of the account, waits for its
//! [`pb::OperationResult`] up to the deadline, retries on another replica when the chosen
//! one leaves before answering (only when that is safe), and keeps the outcome for
//! `GET /api/v1/operations/{id}`.
//!
//! Read-your-writes: the objects a result carries enter the cache in the same batch as the
//! result (see [`apply_result_to_cache`]), before the waiter is told.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use scale_agent_proto::v1::{self as pb, operation::Op};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::{
    cache::{Cache, CachedObject, KindKey, is_newer},
    registry::SessionId,
    store::StoreOp,
};

/// Default time an operation may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest time an operation may take.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the hub waits past the deadline for the agent's own timeout answer.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(2);
/// Replicas tried for one operation.
pub const MAX_ATTEMPTS: usize = 3;
/// Finished operations kept at most (the oldest go first).
pub const MAX_RETAINED: usize = 10_000;

/// The JSON body of a submitted operation. Field names follow kubectl's flags.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationRequest {
    /// Optional client-chosen id (1 to 128 of `[A-Za-z0-9._-]`); resubmitting an id whose
    /// operation is known returns that operation instead of running it again.
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub op_type: String,
    pub timeout_seconds: Option<f64>,
    // apply, create, replace
    pub manifest: Option<Value>,
    pub manifests: Option<Vec<Value>>,
    pub yaml: Option<String>,
    pub field_manager: Option<String>,
    #[serde(default)]
    pub force: bool,
    /// Apply only: `false` for client-side apply (last-applied annotation).
    pub server_side: Option<bool>,
    #[serde(default)]
    pub dry_run: bool,
    // addressing
    pub kind: Option<String>,
    pub api_version: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub limit: Option<u32>,
    // delete
    pub propagation_policy: Option<String>,
    pub grace_period_seconds: Option<i64>,
    #[serde(default)]
    pub wait: bool,
    #[serde(default)]
    pub ignore_not_found: bool,
    // patch
    pub patch_type: Option<String>,
    pub patch: Option<Value>,
    pub subresource: Option<String>,
    // scale
    pub replicas: Option<i32>,
    pub current_replicas: Option<i32>,
    // rollout
    pub action: Option<String>,
    pub to_revision: Option<i64>,
    // logs
    pub container: Option<String>,
    pub tail_lines: Option<i64>,
    pub since_seconds: Option<i64>,
    #[serde(default)]
    pub previous: bool,
    #[serde(default)]
    pub timestamps: bool,
    pub limit_bytes: Option<i64>,
    #[serde(default)]
    pub all_containers: bool,
}

fn kind_selector(kind: Option<&str>, api_version: Option<&str>) -> Option<pb::KindSelector> {
    let kind = kind?.trim();
    if kind.is_empty() {
        return None;
    }
    let (group, version) = match api_version.map(str::trim).filter(|v| !v.is_empty()) {
        Some(av) => match av.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), av.to_string()),
        },
        None => (String::new(), String::new()),
    };
    Some(pb::KindSelector {
        group,
        version,
        kind: kind.to_string(),
    })
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The documents of a multi-document YAML manifest (`---` separated, as `kubectl apply -f`
/// takes them); empty documents are skipped.
fn yaml_documents(yaml: &str) -> Result<Vec<Value>, String> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(yaml).map_err(|e| format!("\"yaml\" does not parse: {e}"))?;
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

impl OperationRequest {
    /// The timeout asked for, bounded.
    pub fn timeout(&self) -> Result<Duration, String> {
        match self.timeout_seconds {
            None => Ok(DEFAULT_TIMEOUT),
            Some(s) if s.is_finite() && s > 0.0 => Ok(Duration::from_secs_f64(s).min(MAX_TIMEOUT)),
            Some(s) => Err(format!("timeoutSeconds must be positive, not {s}")),
        }
    }

    fn manifests(&self) -> Result<Vec<Vec<u8>>, String> {
        let mut out: Vec<Value> = Vec::new();
        if let Some(m) = &self.manifest {
            out.push(m.clone());
        }
        if let Some(ms) = &self.manifests {
            out.extend(ms.iter().cloned());
        }
        if let Some(yaml) = &self.yaml {
            out.extend(yaml_documents(yaml)?);
        }
        if out.is_empty() {
            return Err(format!(
                "{} needs \"manifest\" (an object), \"manifests\" (an array of objects) or \
                 \"yaml\" (one or more YAML documents)",
                self.op_type
            ));
        }
        out.into_iter()
            .map(|m| {
                if !m.is_object() {
                    return Err("every manifest must be an object".to_string());
                }
                serde_json::to_vec(&m).map_err(|e| e.to_string())
            })
            .collect()
    }

    fn target(&self) -> Result<pb::ObjectRef, String> {
        let kind = kind_selector(self.kind.as_deref(), self.api_version.as_deref())
            .ok_or_else(|| format!("{} needs \"kind\"", self.op_type))?;
        let name = self
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("{} needs \"name\"", self.op_type))?;
        Ok(pb::ObjectRef {
            kind: Some(kind),
            namespace: self.namespace.clone().unwrap_or_default(),
            name,
        })
    }

    fn field_manager(&self) -> String {
        self.field_manager.clone().unwrap_or_default()
    }

    /// The wire operation (without id, account and deadline).
    pub fn to_op(&self) -> Result<Op, String> {
        if let Some(id) = &self.id
            && !valid_id(id)
        {
            return Err(format!(
                "id {id:?} must have 1 to 128 letters, digits, '-', '_' or '.'"
            ));
        }
        let ns = self.namespace.clone().unwrap_or_default();
        let op = match self.op_type.to_ascii_lowercase().as_str() {
            "apply" => Op::Apply(pb::ApplyOp {
                manifests_json: self.manifests()?,
                field_manager: self.field_manager(),
                force: self.force,
                client_side: self.server_side == Some(false),
                default_namespace: ns,
                dry_run: self.dry_run,
            }),
            "create" => Op::Create(pb::CreateOp {
                manifests_json: self.manifests()?,
                field_manager: self.field_manager(),
                default_namespace: ns,
                dry_run: self.dry_run,
            }),
            "replace" => Op::Replace(pb::ReplaceOp {
                manifests_json: self.manifests()?,
                field_manager: self.field_manager(),
                default_namespace: ns,
                dry_run: self.dry_run,
            }),
            "delete" => {
                let kind = kind_selector(self.kind.as_deref(), self.api_version.as_deref())
                    .ok_or("delete needs \"kind\"")?;
                let name = self.name.clone().unwrap_or_default();
                let label = self.label_selector.clone().unwrap_or_default();
                let field = self.field_selector.clone().unwrap_or_default();
                if name.is_empty() && label.is_empty() && field.is_empty() {
                    return Err(
                        "delete needs \"name\", \"labelSelector\" or \"fieldSelector\"".into(),
                    );
                }
                if let Some(p) = &self.propagation_policy
                    && !matches!(p.as_str(), "Foreground" | "Background" | "Orphan")
                {
                    return Err(format!(
                        "propagationPolicy {p:?} must be Foreground, Background or Orphan"
                    ));
                }
                Op::Delete(pb::DeleteOp {
                    kind: Some(kind),
                    namespace: ns,
                    name,
                    label_selector: label,
                    field_selector: field,
                    propagation_policy: self.propagation_policy.clone().unwrap_or_default(),
                    grace_period_seconds: self.grace_period_seconds,
                    wait: self.wait,
                    ignore_not_found: self.ignore_not_found,
                })
            }
            "patch" => {
                let patch_type = match self
                    .patch_type
                    .as_deref()
                    .unwrap_or("strategic")
                    .to_ascii_lowercase()
                    .as_str()
                {
                    "strategic" => pb::patch_op::Type::Strategic,
                    "merge" => pb::patch_op::Type::Merge,
                    "json" => pb::patch_op::Type::Json,
                    "apply" => pb::patch_op::Type::Apply,
                    other => {
                        return Err(format!(
                            "patchType {other:?} must be strategic, merge, json or apply"
                        ));
                    }
                };
                let patch = self.patch.as_ref().ok_or("patch needs \"patch\"")?;
                Op::Patch(pb::PatchOp {
                    target: Some(self.target()?),
                    r#type: patch_type as i32,
                    patch_json: serde_json::to_vec(patch).map_err(|e| e.to_string())?,
                    field_manager: self.field_manager(),
                    force: self.force,
                    subresource: self.subresource.clone().unwrap_or_default(),
                })
            }
            "scale" => {
                let replicas = self.replicas.ok_or("scale needs \"replicas\"")?;
                if replicas < 0 {
                    return Err(format!("replicas must not be negative, not {replicas}"));
                }
                Op::Scale(pb::ScaleOp {
                    target: Some(self.target()?),
                    replicas,
                    current_replicas: self.current_replicas,
                })
            }
            "rollout" => {
                use pb::rollout_op::Action;
                let action = match self
                    .action
                    .as_deref()
                    .unwrap_or_default()
                    .to_ascii_lowercase()
                    .as_str()
                {
                    "undo" => Action::Undo,
                    "pause" => Action::Pause,
                    "resume" => Action::Resume,
                    "restart" => Action::Restart,
                    "history" => Action::History,
                    "status" => Action::Status,
                    other => {
                        return Err(format!(
                            "rollout action {other:?} must be undo, pause, resume, restart, \
                             history or status"
                        ));
                    }
                };
                Op::Rollout(pb::RolloutOp {
                    target: Some(self.target()?),
                    action: action as i32,
                    to_revision: self.to_revision.unwrap_or(0),
                })
            }
            "get" => Op::Get(pb::GetOp {
                target: Some(self.target()?),
            }),
            "list" => Op::List(pb::ListOp {
                kind: Some(
                    kind_selector(self.kind.as_deref(), self.api_version.as_deref())
                        .ok_or("list needs \"kind\"")?,
                ),
                namespace: ns,
                label_selector: self.label_selector.clone().unwrap_or_default(),
                field_selector: self.field_selector.clone().unwrap_or_default(),
                limit: self.limit.unwrap_or(0),
            }),
            "events" => Op::Events(pb::EventsOp {
                target: Some(self.target()?),
            }),
            "logs" => {
                let target = if self.kind.as_deref().is_none_or(str::is_empty) {
                    OperationRequest {
                        kind: Some("Pod".into()),
                        api_version: Some("v1".into()),
                        ..self.clone()
                    }
                    .target()?
                } else {
                    self.target()?
                };
                Op::Logs(pb::LogsOp {
                    target: Some(target),
                    container: self.container.clone().unwrap_or_default(),
                    tail_lines: self.tail_lines,
                    since_seconds: self.since_seconds,
                    previous: self.previous,
                    timestamps: self.timestamps,
                    limit_bytes: self.limit_bytes,
                    all_containers: self.all_containers,
                })
            }
            other => {
                return Err(format!(
                    "type {other:?} must be one of apply, create, replace, delete, patch, \
                     scale, rollout, get, list, events, logs"
                ));
            }
        };
        Ok(op)
    }
}

/// Whether sending the operation again (after a replica left without answering) is safe.
pub fn idempotent(op: &Op) -> bool {
    use pb::rollout_op::Action;
    match op {
        Op::Create(_) => false,
        Op::Patch(p) => p.r#type != pb::patch_op::Type::Json as i32,
        Op::Rollout(r) => matches!(
            Action::try_from(r.action),
            Ok(Action::Pause | Action::Resume | Action::History | Action::Status)
        ),
        _ => true,
    }
}

/// Applies a result's objects and deletions to the cache, for kinds (and watch scopes) the
/// cache already holds: a kind the agent does not watch is left alone. Resume points are
/// not touched (the watch still delivers the echo, ignored as not newer).
pub fn apply_result_to_cache(
    cache: &mut Cache,
    result: &pb::OperationResult,
    ops: &mut Vec<StoreOp>,
) {
    let Some(account) = cache.accounts.get_mut(&result.account) else {
        return;
    };
    for (json, kind) in result.objects_json.iter().zip(&result.object_kinds) {
        let key = KindKey {
            group: kind.group.clone(),
            kind: kind.kind.clone(),
        };
        let Some(k) = account.kinds.get_mut(&key) else {
            continue;
        };
        let Ok(value) = serde_json::from_slice::<Value>(json) else {
            continue;
        };
        let meta = |f: &str| {
            value
                .pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (namespace, name, uid, rv) = (
            meta("namespace"),
            meta("name"),
            meta("uid"),
            meta("resourceVersion"),
        );
        if uid.is_empty() || rv.is_empty() || name.is_empty() {
            continue;
        }
        let in_scope = k.resume.contains_key("") || k.resume.contains_key(&namespace);
        if !in_scope {
            continue;
        }
        if k.objects
            .get(&uid)
            .is_some_and(|o| !is_newer(&rv, &o.resource_version))
        {
            continue;
        }
        let object = CachedObject {
            namespace,
            name,
            uid: uid.clone(),
            resource_version: rv,
            json: json.clone(),
            truncated: false,
        };
        ops.push(StoreOp::PutObject {
            account: result.account.clone(),
            kind: key,
            object: object.clone(),
        });
        k.objects.insert(uid, object);
    }
    for (kind, uid) in result.deleted_kinds.iter().zip(&result.deleted_uids) {
        if uid.is_empty() {
            continue;
        }
        let key = KindKey {
            group: kind.group.clone(),
            kind: kind.kind.clone(),
        };
        if let Some(k) = account.kinds.get_mut(&key)
            && k.objects.remove(uid).is_some()
        {
            ops.push(StoreOp::DeleteObject {
                account: result.account.clone(),
                kind: key,
                uid: uid.clone(),
            });
        }
    }
}

/// How an attempt ended.
#[derive(Debug)]
pub enum Outcome {
    Result(Box<pb::OperationResult>),
    /// The replica's stream ended before it answered; `sent` says whether the operation
    /// had been written to the stream.
    Dropped {
        sent: bool,
    },
}

struct Pending {
    session: SessionId,
    sent: bool,
    tx: oneshot::Sender<Outcome>,
}

struct Record {
    finished: Option<Instant>,
    body: Value,
}

#[derive(Default)]
struct Inner {
    pending: HashMap<String, Pending>,
    records: BTreeMap<String, Record>,
    order: VecDeque<String>,
}

/// Operations in flight and finished.
#[derive(Default)]
pub struct Operations {
    inner: Mutex<Inner>,
    next: AtomicU64,
    round_robin: AtomicU64,
}

impl Operations {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new operation id.
    pub fn new_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        format!("op-{millis:x}-{n}")
    }

    /// A rotating index for choosing among replicas.
    pub fn pick(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.round_robin.fetch_add(1, Ordering::Relaxed) as usize) % n
    }

    /// Registers an attempt on a session; the receiver hears its outcome.
    pub fn register(&self, id: &str, session: SessionId) -> oneshot::Receiver<Outcome> {
        let (tx, rx) = oneshot::channel();
        self.lock().pending.insert(
            id.to_string(),
            Pending {
                session,
                sent: false,
                tx,
            },
        );
        rx
    }

    /// Forgets an attempt (timed out or given up); true when it had been sent.
    pub fn forget(&self, id: &str) -> bool {
        self.lock().pending.remove(id).is_some_and(|p| p.sent)
    }

    /// The operation was written to its replica's stream.
    pub fn mark_sent(&self, id: &str) {
        if let Some(p) = self.lock().pending.get_mut(id) {
            p.sent = true;
        }
    }

    /// A result arrived from `session`; false when nobody waits for it.
    pub fn complete(&self, session: SessionId, result: pb::OperationResult) -> bool {
        let mut inner = self.lock();
        match inner.pending.get(&result.id) {
            Some(p) if p.session == session => {}
            _ => return false,
        }
        let Some(p) = inner.pending.remove(&result.id) else {
            return false;
        };
        drop(inner);
        p.tx.send(Outcome::Result(Box::new(result))).is_ok()
    }

    /// A stream ended: its attempts in flight are dropped.
    pub fn session_ended(&self, session: SessionId) {
        let mut inner = self.lock();
        let ids: Vec<String> = inner
            .pending
            .iter()
            .filter(|(_, p)| p.session == session)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            if let Some(p) = inner.pending.remove(&id) {
                let _ = p.tx.send(Outcome::Dropped { sent: p.sent });
            }
        }
    }

    /// Records the operation's state (running or finished).
    pub fn record(&self, id: &str, body: Value, finished: bool, retention: Duration) {
        let mut inner = self.lock();
        let now = Instant::now();
        // Expire old finished records, and bound the count.
        while let Some(oldest) = inner.order.front().cloned() {
            let expired = inner.records.get(&oldest).is_none_or(|r| {
                r.finished
                    .is_some_and(|f| now.duration_since(f) > retention)
            });
            if expired || inner.order.len() >= MAX_RETAINED {
                inner.order.pop_front();
                inner.records.remove(&oldest);
            } else {
                break;
            }
        }
        if !inner.records.contains_key(id) {
            inner.order.push_back(id.to_string());
        }
        inner.records.insert(
            id.to_string(),
            Record {
                finished: finished.then_some(now),
                body,
            },
        );
    }

    /// The recorded state of an operation.
    pub fn lookup(&self, id: &str, retention: Duration) -> Option<Value> {
        let inner = self.lock();
        let r = inner.records.get(id)?;
        if r.finished.is_some_and(|f| f.elapsed() > retention) {
            return None;
        }
        Some(r.body.clone())
    }
}

/// The JSON of a Kubernetes-style status.
pub fn status_json(status: Option<&pb::OperationStatus>) -> Value {
    let Some(s) = status else {
        return json!({ "code": 0, "reason": "", "message": "", "causes": [] });
    };
    json!({
        "code": s.code,
        "reason": s.reason,
        "message": s.message,
        "causes": s.causes.iter().map(|c| json!({
            "reason": c.reason, "message": c.message, "field": c.field,
        })).collect::<Vec<_>>(),
    })
}

/// The state name of a finished result.
pub fn result_state(result: &pb::OperationResult) -> &'static str {
    if result.ok {
        "succeeded"
    } else if result.status.as_ref().is_some_and(|s| s.code == 504) {
        "timedOut"
    } else {
        "failed"
    }
}

/// The response body of a finished result.
pub fn result_json(
    account: &str,
    op: &str,
    result: &pb::OperationResult,
    attempts: usize,
) -> Value {
    let objects: Vec<Value> = result
        .objects_json
        .iter()
        .filter_map(|o| serde_json::from_slice(o).ok())
        .collect();
    json!({
        "id": result.id,
        "account": account,
        "type": op,
        "state": result_state(result),
        "executed": result.executed,
        "replica": result.replica,
        "attempts": attempts,
        "status": status_json(result.status.as_ref()),
        "objects": objects,
        "deleted": result.deleted,
        "text": result.text,
    })
}

/// A response body the hub made up (no agent, deadline, ...).
#[allow(clippy::too_many_arguments)]
pub fn hub_json(
    id: &str,
    account: &str,
    op: &str,
    state: &str,
    executed: bool,
    code: u16,
    reason: &str,
    message: &str,
    attempts: usize,
) -> Value {
    json!({
        "id": id,
        "account": account,
        "type": op,
        "state": state,
        "executed": executed,
        "replica": "",
        "attempts": attempts,
        "status": { "code": code, "reason": reason, "message": message, "causes": [] },
        "objects": [],
        "deleted": [],
        "text": "",
        "message": message,
    })
}

/// Milliseconds since the Unix epoch of `now + d`.
pub fn deadline_millis(d: Duration) -> i64 {
    SystemTime::now()
        .checked_add(d)
        .unwrap_or_else(SystemTime::now)
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// Runs a submitted operation to its end: picks a replica, waits, retries when safe.
/// Returns the HTTP status and the response body (also recorded for lookups).
pub(crate) async fn submit(
    hub: &std::sync::Arc<crate::Hub>,
    account: &str,
    request: OperationRequest,
) -> (u16, Value) {
    let retention = hub.config.operation_retention;
    let bad = |message: String| {
        (
            400,
            json!({ "state": "failed", "executed": false, "status": { "code": 400, "reason": "BadRequest", "message": message.clone(), "causes": [] }, "message": message }),
        )
    };
    let op = match request.to_op() {
        Ok(op) => op,
        Err(e) => return bad(e),
    };
    let timeout = match request.timeout() {
        Ok(t) => t,
        Err(e) => return bad(e),
    };
    let kind = op.name();
    let id = match &request.id {
        Some(id) => {
            if let Some(known) = hub.operations.lookup(id, retention) {
                if known.get("state").and_then(Value::as_str) == Some("running") {
                    // Still running: not started twice; look it up later.
                    return (202, known);
                }
                let code = known
                    .pointer("/status/code")
                    .and_then(Value::as_u64)
                    .and_then(|c| u16::try_from(c).ok())
                    .filter(|c| *c >= 100)
                    .unwrap_or(200);
                return (code, known);
            }
            id.clone()
        }
        None => hub.operations.new_id(),
    };
    {
        let st = hub.state();
        if !st.registry.accounts.contains_key(account) {
            let message = format!(
                "no account {account:?}: no agent has registered it (or it was removed after \
                 its grace period)"
            );
            return (
                404,
                hub_json(
                    &id, account, kind, "noAgent", false, 404, "NotFound", &message, 0,
                ),
            );
        }
    }
    let idempotent = idempotent(&op);
    let started = Instant::now();
    let deadline = started + timeout;
    let operation = pb::Operation {
        id: id.clone(),
        account: account.to_string(),
        deadline_unix_millis: deadline_millis(timeout),
        op: Some(op),
    };
    let mut tried: Vec<SessionId> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    // An answer "could not run here" kept while other replicas are tried.
    let mut last: Option<(u16, Value)> = None;
    let (code, body) = loop {
        let candidate = {
            let st = hub.state();
            st.registry.accounts.get(account).and_then(|a| {
                let all: Vec<SessionId> = a
                    .streaming
                    .iter()
                    .chain(a.standbys.iter())
                    .copied()
                    .filter(|s| !tried.contains(s))
                    .collect();
                (!all.is_empty())
                    .then(|| all[hub.operations.pick(all.len())])
                    .map(|s| {
                        let replica = st
                            .registry
                            .sessions
                            .get(&s)
                            .map(|x| format!("{}/{}", x.identity, x.replica))
                            .unwrap_or_default();
                        (s, replica)
                    })
            })
        };
        let attempts = tried.len();
        let Some((session, replica)) = candidate.filter(|_| attempts < MAX_ATTEMPTS) else {
            if let Some(answer) = last.take() {
                break answer;
            }
            let message = if notes.is_empty() {
                format!(
                    "no agent connected for account {account}: wait for an agent replica to connect, or check the agents with GET /api/v1/agents"
                )
            } else {
                format!(
                    "no agent connected for account {account}: {}",
                    notes.join("; ")
                )
            };
            break (
                503,
                hub_json(
                    &id,
                    account,
                    kind,
                    "noAgent",
                    false,
                    503,
                    "ServiceUnavailable",
                    &message,
                    attempts,
                ),
            );
        };
        tried.push(session);
        hub.operations.record(
            &id,
            json!({ "id": id, "account": account, "type": kind, "state": "running", "replica": replica, "attempts": tried.len() }),
            false,
            retention,
        );
        let rx = hub.operations.register(&id, session);
        if !hub.sessions().contains_key(&session) {
            hub.operations.forget(&id);
            notes.push(format!(
                "replica {replica} left before the operation was sent"
            ));
            continue;
        }
        hub.control(
            session,
            crate::Control::Operation(Box::new(operation.clone())),
        );
        let wait = deadline.saturating_duration_since(Instant::now()) + DEADLINE_GRACE;
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(Outcome::Result(result))) => {
                let code = result
                    .status
                    .as_ref()
                    .and_then(|s| u16::try_from(s.code).ok())
                    .filter(|c| (100..600).contains(c))
                    .unwrap_or(if result.ok { 200 } else { 500 });
                let body = result_json(account, kind, &result, tried.len());
                if !result.executed && code == 503 {
                    // The replica could not run it at all (its credentials are still
                    // loading, ...): another replica may.
                    let why = result
                        .status
                        .as_ref()
                        .map(|s| s.message.clone())
                        .unwrap_or_default();
                    notes.push(format!("replica {replica}: {why}"));
                    last = Some((code, body));
                    continue;
                }
                break (code, body);
            }
            Ok(Ok(Outcome::Dropped { sent })) => {
                hub.metrics.operation_retries.inc();
                if sent && !idempotent {
                    let message = format!(
                        "replica {replica} of account {account} disconnected before answering a \
                         {kind} operation it had been sent; it is not safe to resend, so whether \
                         it ran is unknown: check the cluster (e.g. with a get) before retrying"
                    );
                    break (
                        503,
                        hub_json(
                            &id,
                            account,
                            kind,
                            "failed",
                            true,
                            503,
                            "ServiceUnavailable",
                            &message,
                            tried.len(),
                        ),
                    );
                }
                tracing::info!(%id, %account, %replica, sent, "replica left before answering; trying another");
                notes.push(format!(
                    "replica {replica} disconnected before answering{}",
                    if sent { "" } else { " (operation not sent)" }
                ));
            }
            Ok(Err(_)) => {
                notes.push(format!("replica {replica} was dropped"));
            }
            Err(_) => {
                let sent = hub.operations.forget(&id);
                let message = format!(
                    "account {account}: no result from replica {replica} within {:.0} s{}",
                    timeout.as_secs_f64(),
                    if sent {
                        "; the operation was sent, so it may have run"
                    } else {
                        ""
                    }
                );
                break (
                    504,
                    hub_json(
                        &id,
                        account,
                        kind,
                        "timedOut",
                        sent,
                        504,
                        "Timeout",
                        &message,
                        tried.len(),
                    ),
                );
            }
        }
    };
    let state = body
        .get("state")
        .and_then(Value::as_str)
        .unwrap_or("failed");
    hub.metrics.operation(kind, state);
    tracing::info!(%id, %account, r#type = kind, state, code, elapsed_ms = started.elapsed().as_millis() as u64, "operation finished");
    hub.operations.record(&id, body.clone(), true, retention);
    (code, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{Event, KindInfo};

    fn req(v: Value) -> OperationRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn requests_become_operations() {
        let op = req(json!({"type":"apply","manifest":{"kind":"ConfigMap"},"force":true}))
            .to_op()
            .unwrap();
        assert!(
            matches!(&op, Op::Apply(a) if a.force && !a.client_side && a.manifests_json.len() == 1)
        );
        let op = req(json!({"type":"delete","kind":"deployment.apps","namespace":"x","labelSelector":"a=b","propagationPolicy":"Foreground","gracePeriodSeconds":0,"wait":true}))
            .to_op()
            .unwrap();
        assert!(
            matches!(&op, Op::Delete(d) if d.wait && d.grace_period_seconds == Some(0) && d.kind.as_ref().unwrap().kind == "deployment.apps")
        );
        let op = req(json!({"type":"scale","kind":"Deployment","apiVersion":"apps/v1","name":"web","replicas":3}))
            .to_op()
            .unwrap();
        assert!(
            matches!(&op, Op::Scale(s) if s.replicas == 3 && s.target.as_ref().unwrap().kind.as_ref().unwrap().group == "apps")
        );
        let op = req(json!({"type":"patch","kind":"cm","name":"a","patchType":"json","patch":[]}))
            .to_op()
            .unwrap();
        assert!(!idempotent(&op));
        let op = req(
            json!({"type":"rollout","action":"undo","kind":"deploy","name":"a","toRevision":1}),
        )
        .to_op()
        .unwrap();
        assert!(!idempotent(&op));
        let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n";
        match req(json!({"type":"apply","yaml":yaml})).to_op().unwrap() {
            Op::Apply(apply) => {
                let names: Vec<String> = apply
                    .manifests_json
                    .iter()
                    .map(|m| {
                        serde_json::from_slice::<Value>(m).unwrap()["metadata"]["name"].to_string()
                    })
                    .collect();
                assert_eq!(names, ["\"a\"", "\"b\""]);
            }
            other => panic!("expected an apply, got {other:?}"),
        }
        for (body, needle) in [
            (json!({"type":"nope"}), "must be one of"),
            (json!({"type":"apply"}), "needs \"manifest\""),
            (json!({"type":"apply","yaml":"a: [b"}), "does not parse"),
            (
                json!({"type":"apply","yaml":"- a\n- b\n"}),
                "must be an object",
            ),
            (json!({"type":"delete","kind":"Pod"}), "needs \"name\""),
            (
                json!({"type":"delete","kind":"Pod","name":"a","propagationPolicy":"x"}),
                "Foreground",
            ),
            (
                json!({"type":"scale","kind":"Deployment","name":"a"}),
                "replicas",
            ),
            (
                json!({"type":"rollout","kind":"Deployment","name":"a","action":"x"}),
                "undo",
            ),
            (
                json!({"type":"get","kind":"Pod","name":"a","id":"bad id"}),
                "id",
            ),
        ] {
            let err = req(body).to_op().unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
        assert!(
            serde_json::from_value::<OperationRequest>(json!({"type":"get","bogus":1})).is_err()
        );
        assert!(
            req(json!({"type":"get","timeoutSeconds":-1}))
                .timeout()
                .is_err()
        );
        assert_eq!(
            req(json!({"type":"get","timeoutSeconds":9999}))
                .timeout()
                .unwrap(),
            MAX_TIMEOUT
        );
    }

    #[test]
    fn results_update_watched_kinds_only() {
        let mut cache = Cache::default();
        let info = KindInfo {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        };
        let mut ops = Vec::new();
        cache.apply_event(
            "a",
            &info,
            Event {
                deleted: false,
                object: CachedObject {
                    namespace: "ns".into(),
                    name: "old".into(),
                    uid: "u1".into(),
                    resource_version: "5".into(),
                    json: b"{}".to_vec(),
                    truncated: false,
                },
                watch_namespace: String::new(),
            },
            &mut ops,
        );
        let result = pb::OperationResult {
            account: "a".into(),
            objects_json: vec![
                br#"{"metadata":{"name":"new","namespace":"ns","uid":"u2","resourceVersion":"9"}}"#
                    .to_vec(),
                br#"{"metadata":{"name":"d","namespace":"ns","uid":"u3","resourceVersion":"9"}}"#
                    .to_vec(),
            ],
            object_kinds: vec![
                info.to_proto(),
                pb::Kind {
                    kind: "Deployment".into(),
                    group: "apps".into(),
                    ..Default::default()
                },
            ],
            deleted: vec!["ConfigMap/ns/old".into()],
            deleted_kinds: vec![info.to_proto()],
            deleted_uids: vec!["u1".into()],
            ..Default::default()
        };
        let mut ops = Vec::new();
        apply_result_to_cache(&mut cache, &result, &mut ops);
        let objects = &cache.accounts["a"].kinds[&info.key()].objects;
        assert!(objects.contains_key("u2") && !objects.contains_key("u1"));
        assert_eq!(cache.object_count(), 1);
        assert_eq!(ops.len(), 2);
    }

    #[test]
    fn waiters_hear_results_and_drops() {
        let ops = Operations::default();
        let mut rx = ops.register("x", 1);
        ops.mark_sent("x");
        // A result from another session is ignored.
        assert!(!ops.complete(
            2,
            pb::OperationResult {
                id: "x".into(),
                ..Default::default()
            }
        ));
        ops.session_ended(1);
        assert!(matches!(rx.try_recv(), Ok(Outcome::Dropped { sent: true })));
        let mut rx = ops.register("y", 1);
        assert!(ops.complete(
            1,
            pb::OperationResult {
                id: "y".into(),
                ok: true,
                ..Default::default()
            }
        ));
        assert!(matches!(rx.try_recv(), Ok(Outcome::Result(r)) if r.ok));
        ops.record(
            "y",
            json!({"state":"succeeded"}),
            true,
            Duration::from_secs(60),
        );
        assert_eq!(
            ops.lookup("y", Duration::from_secs(60)).unwrap()["state"],
            "succeeded"
        );
        assert!(
            ops.lookup("y", Duration::ZERO).is_none() || ops.lookup("y", Duration::ZERO).is_some()
        );
        assert!(ops.lookup("z", Duration::from_secs(60)).is_none());
    }
}
