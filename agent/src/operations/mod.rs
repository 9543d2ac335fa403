//! Operations the hub sends (apply, delete, patch, scale, rollout, get, list, events, logs),
//! executed as the account's own credentials, with concurrency bounded per account (and
//! under an agent-wide ceiling: `tasks.operationsPerAccount`, `tasks.operationsTotal`) and
//! within each operation's deadline. Every outcome is an [`v1::OperationResult`] carrying the
//! Kubernetes status as the API server gave it (see the contract in the .proto).
//!
//! - kinds are resolved through discovery (cached per account, refreshed once when a kind
//!   is unknown): `Deployment`, `deployments`, `deploy`, `deployment.apps`,
//!   `deployments.v1.apps`, or group/version/kind from a manifest;
//! - results carry the resulting objects (scrubbed like watched objects: Secrets without
//!   data or managedFields) so the hub's cache reflects the write at once;
//! - a deadline that passes answers 504 with `executed` telling whether a request had
//!   reached the API server.

mod delete;
mod read;
mod rollout;
mod write;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use kube::{
    Api, Client,
    api::DynamicObject,
    core::{Status, response::StatusCause},
};
use prost::Message as _;
use scale_agent_proto::v1::{self, operation::Op};
use serde_json::Value;
use tokio::sync::Mutex;

use crate::{
    account,
    budget::Budget,
    convert::scrub,
    kinds::{Candidate, KindRef},
};

/// Results queued for the stream before an operation's task waits to hand its own over.
pub const RESULT_QUEUE: usize = 16;
/// Deadline of an operation that names none.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// Field manager when the operation names none.
pub const FIELD_MANAGER: &str = "scale-agent";
/// Attempts of a read-modify-write that meets 409 Conflict.
pub const CONFLICT_RETRIES: usize = 5;

/// Why an operation failed: a Kubernetes status.
#[derive(Clone, Debug)]
pub struct Failure {
    pub status: v1::OperationStatus,
}

impl Failure {
    pub fn new(code: i32, reason: &str, message: impl Into<String>) -> Self {
        Failure {
            status: v1::OperationStatus {
                code,
                reason: reason.into(),
                message: message.into(),
                causes: Vec::new(),
            },
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "NotFound", message)
    }

    pub fn code(&self) -> i32 {
        self.status.code
    }
}

fn cause(c: &StatusCause) -> v1::operation_status::Cause {
    v1::operation_status::Cause {
        reason: c.reason.clone(),
        message: c.message.clone(),
        field: c.field.clone(),
    }
}

/// The API server's status, as is.
pub fn status_failure(s: &Status) -> Failure {
    Failure {
        status: v1::OperationStatus {
            code: i32::from(s.code),
            reason: s.reason.clone(),
            message: s.message.clone(),
            causes: s
                .details
                .as_ref()
                .map(|d| d.causes.iter().map(cause).collect())
                .unwrap_or_default(),
        },
    }
}

impl From<kube::Error> for Failure {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => status_failure(&s),
            other => Failure::new(
                503,
                "ServiceUnavailable",
                format!("cannot reach the API server: {other}"),
            ),
        }
    }
}

pub type OpResult<T> = std::result::Result<T, Failure>;

/// What an operation produced so far (kept when it fails or times out midway).
#[derive(Debug, Default)]
pub struct Output {
    pub objects: Vec<(KindRef, Value)>,
    /// (label, kind, uid; empty while the object still exists)
    pub deleted: Vec<(String, KindRef, String)>,
    pub text: String,
    /// HTTP code of a success; 200 when unset.
    pub code: i32,
    /// A list with a limit that has more items: the API server's continue token.
    pub continue_token: String,
}

impl Output {
    pub fn object(&mut self, kind: &KindRef, mut value: Value) {
        scrub(kind, &mut value);
        self.objects.push((kind.clone(), value));
    }
}

/// `Deployment.apps/ns/name`, `Namespace/name`: how results name objects.
pub fn label(kind: &KindRef, namespace: &str, name: &str) -> String {
    let k = if kind.group.is_empty() {
        kind.kind.clone()
    } else {
        format!("{}.{}", kind.kind, kind.group)
    };
    if namespace.is_empty() {
        format!("{k}/{name}")
    } else {
        format!("{k}/{namespace}/{name}")
    }
}

/// Per-operation context.
pub struct Ctx<'a> {
    pub exec: &'a Executor,
    executed: AtomicBool,
}

impl Ctx<'_> {
    /// Marks that a request goes to the API server now.
    pub fn hit(&self) {
        self.executed.store(true, Ordering::SeqCst);
    }

    pub fn client(&self) -> Client {
        self.exec.client.clone()
    }

    /// An API for the kind in `namespace` (empty: all namespaces, or cluster-scoped).
    pub fn api(&self, kind: &KindRef, namespace: &str) -> Api<DynamicObject> {
        let ar = kind.api_resource();
        if kind.namespaced && !namespace.is_empty() {
            Api::namespaced_with(self.client(), namespace, &ar)
        } else {
            Api::all_with(self.client(), &ar)
        }
    }

    /// The namespace an object of `kind` lives in: the given one, else `default` for
    /// namespaced kinds; empty for cluster-scoped ones.
    pub fn namespace_for(kind: &KindRef, given: &str) -> String {
        if !kind.namespaced {
            String::new()
        } else if given.is_empty() {
            "default".into()
        } else {
            given.to_string()
        }
    }

    pub async fn resolve(&self, selector: Option<&v1::KindSelector>) -> OpResult<KindRef> {
        let selector =
            selector.ok_or_else(|| Failure::bad_request("the operation names no kind"))?;
        self.exec.resolve(selector, self).await
    }

    pub async fn target(
        &self,
        target: Option<&v1::ObjectRef>,
    ) -> OpResult<(KindRef, String, String)> {
        let t = target.ok_or_else(|| Failure::bad_request("the operation names no object"))?;
        if t.name.is_empty() {
            return Err(Failure::bad_request(
                "the operation names no object (name is empty)",
            ));
        }
        let kind = self.resolve(t.kind.as_ref()).await?;
        let ns = Self::namespace_for(&kind, &t.namespace);
        Ok((kind, ns, t.name.clone()))
    }
}

/// Short names kubectl knows for built-in kinds.
const SHORT_NAMES: &[(&str, &str)] = &[
    ("deploy", "deployments"),
    ("sts", "statefulsets"),
    ("ds", "daemonsets"),
    ("rs", "replicasets"),
    ("svc", "services"),
    ("cm", "configmaps"),
    ("po", "pods"),
    ("ns", "namespaces"),
    ("sa", "serviceaccounts"),
    ("pvc", "persistentvolumeclaims"),
    ("pv", "persistentvolumes"),
    ("ing", "ingresses"),
    ("cj", "cronjobs"),
    ("hpa", "horizontalpodautoscalers"),
    ("crd", "customresourcedefinitions"),
    ("crds", "customresourcedefinitions"),
    ("ev", "events"),
    ("no", "nodes"),
    ("netpol", "networkpolicies"),
    ("pdb", "poddisruptionbudgets"),
    ("ep", "endpoints"),
    ("limits", "limitranges"),
    ("quota", "resourcequotas"),
    ("sc", "storageclasses"),
];

fn group_rank(group: &str) -> u8 {
    if group.is_empty() {
        0
    } else if !group.contains('.') {
        1
    } else if group.ends_with(".k8s.io") {
        2
    } else {
        3
    }
}

/// Picks the kind a selector names among discovered candidates (pure).
pub fn pick_kind(selector: &v1::KindSelector, candidates: &[Candidate]) -> Option<KindRef> {
    let name_of = |n: &str| -> String {
        let lower = n.to_ascii_lowercase();
        SHORT_NAMES
            .iter()
            .find(|(s, _)| *s == lower)
            .map(|(_, p)| p.to_string())
            .unwrap_or(lower)
    };
    let names = |c: &KindRef, n: &str| {
        c.kind.eq_ignore_ascii_case(n)
            || c.plural.eq_ignore_ascii_case(n)
            || c.kind.to_ascii_lowercase() == n
    };
    // (name, group filter, version filter) interpretations, in order.
    let mut tries: Vec<(String, Option<String>, Option<String>)> = Vec::new();
    let explicit = !selector.group.is_empty() || !selector.version.is_empty();
    if explicit {
        tries.push((
            name_of(&selector.kind),
            Some(selector.group.clone()),
            (!selector.version.is_empty()).then(|| selector.version.clone()),
        ));
    } else {
        let k = selector.kind.trim();
        match k.split_once('.') {
            None => tries.push((name_of(k), None, None)),
            Some((n, rest)) => {
                tries.push((name_of(n), Some(rest.to_string()), None));
                if let Some((v, g)) = rest.split_once('.') {
                    tries.push((name_of(n), Some(g.to_string()), Some(v.to_string())));
                } else {
                    // `deployments.v1` names the core group's version? Only for v1-like.
                    tries.push((name_of(n), Some(String::new()), Some(rest.to_string())));
                }
            }
        }
    }
    for (name, group, version) in tries {
        let mut found: Vec<&Candidate> = candidates
            .iter()
            .filter(|c| names(&c.kind, &name))
            .filter(|c| {
                group
                    .as_ref()
                    .is_none_or(|g| c.kind.group.eq_ignore_ascii_case(g))
            })
            .filter(|c| match &version {
                Some(v) => c.kind.version == *v,
                None => true,
            })
            .collect();
        if version.is_none() && found.iter().any(|c| c.preferred) {
            found.retain(|c| c.preferred);
        }
        found.sort_by_key(|c| (group_rank(&c.kind.group), c.kind.group.clone()));
        if let Some(c) = found.first() {
            return Some(c.kind.clone());
        }
    }
    None
}

/// Executes operations for one account.
pub struct Executor {
    pub account: String,
    pub replica: String,
    client: Client,
    /// This account's slots, under the agent-wide ceiling.
    budget: Budget,
    kinds: Mutex<Option<Arc<Vec<Candidate>>>>,
}

impl Executor {
    pub fn new(account: String, replica: String, client: Client, budget: Budget) -> Self {
        Executor {
            account,
            replica,
            client,
            budget,
            kinds: Mutex::new(None),
        }
    }

    async fn candidates(&self, refresh: bool, ctx: &Ctx<'_>) -> OpResult<Arc<Vec<Candidate>>> {
        let mut kinds = self.kinds.lock().await;
        if let (Some(k), false) = (kinds.as_ref(), refresh) {
            return Ok(k.clone());
        }
        ctx.hit();
        let found = account::discover(&self.account, &self.client)
            .await
            .map_err(|e| {
                Failure::new(
                    503,
                    "ServiceUnavailable",
                    crate::error::Chain(&e).to_string(),
                )
            })?;
        let found = Arc::new(found);
        *kinds = Some(found.clone());
        Ok(found)
    }

    async fn resolve(&self, selector: &v1::KindSelector, ctx: &Ctx<'_>) -> OpResult<KindRef> {
        for refresh in [false, true] {
            let candidates = self.candidates(refresh, ctx).await?;
            if let Some(k) = pick_kind(selector, &candidates) {
                return Ok(k);
            }
        }
        let named = if selector.group.is_empty() && selector.version.is_empty() {
            selector.kind.clone()
        } else {
            format!("{}/{} {}", selector.group, selector.version, selector.kind)
        };
        Err(Failure::not_found(format!(
            "the server doesn't have a resource type \"{named}\""
        )))
    }

    /// Runs one operation to its result.
    pub async fn execute(&self, operation: v1::Operation) -> v1::OperationResult {
        let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
        let budget = budget(&operation, now);
        let ctx = Ctx {
            exec: self,
            executed: AtomicBool::new(false),
        };
        let mut out = Output::default();
        let started = std::time::Instant::now();
        let kind = operation.op.as_ref().map(Op::name).unwrap_or("none");
        let list_continue = operation.list_continue;
        let work = async {
            // Waited for within the deadline: an account at its limit times out here,
            // "never reached the API server", without holding an agent-wide slot.
            let _permit =
                self.budget.acquire().await.ok_or_else(|| {
                    Failure::new(503, "ServiceUnavailable", "the agent is stopping")
                })?;
            run(&ctx, operation.op, list_continue, &mut out).await
        };
        // (Almost) no time left: not started at all. A timeout of zero would still poll it
        // once, which may send a request, and then "it never reached the API server" would
        // be wrong; a few milliseconds would start a request that is cut off in flight,
        // "may have run" where nothing needed to (scale_agent_proto::MIN_OPERATION_MILLIS).
        let outcome = if budget.as_millis() < u128::from(scale_agent_proto::MIN_OPERATION_MILLIS) {
            drop(work);
            Err(())
        } else {
            tokio::time::timeout(budget, work).await.map_err(|_| ())
        };
        let executed = ctx.executed.load(Ordering::SeqCst);
        let (ok, status) = match outcome {
            Ok(Ok(())) => (
                true,
                v1::OperationStatus {
                    code: if out.code == 0 { 200 } else { out.code },
                    reason: String::new(),
                    message: String::new(),
                    causes: Vec::new(),
                },
            ),
            Ok(Err(f)) => (false, f.status),
            Err(_) => (
                false,
                Failure::new(
                    504,
                    "Timeout",
                    format!(
                        "the {kind} operation did not finish within its deadline ({:.1} s); {}",
                        budget.as_secs_f64(),
                        if executed {
                            "it had reached the API server, so part of it may have been done"
                        } else {
                            "it never reached the API server"
                        }
                    ),
                )
                .status,
            ),
        };
        tracing::info!(
            r#type = kind,
            ok,
            code = status.code,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "operation done"
        );
        v1::OperationResult {
            id: operation.id,
            ok,
            status: Some(status),
            objects_json: out
                .objects
                .iter()
                .map(|(_, v)| serde_json::to_vec(v).unwrap_or_default())
                .collect(),
            object_kinds: out.objects.iter().map(|(k, _)| k.to_proto()).collect(),
            deleted: out.deleted.iter().map(|(l, _, _)| l.clone()).collect(),
            deleted_kinds: out.deleted.iter().map(|(_, k, _)| k.to_proto()).collect(),
            deleted_uids: out.deleted.iter().map(|(_, _, u)| u.clone()).collect(),
            text: out.text,
            executed,
            replica: self.replica.clone(),
            account: self.account.clone(),
            continue_token: out.continue_token,
            more: false,
        }
    }
}

/// The time an operation may take: `timeout_millis` from now when the hub sent it (relative,
/// so the two clocks need not agree), else until the absolute deadline by this agent's clock
/// (`now_millis`; an older hub), else the default.
pub fn budget(operation: &v1::Operation, now_millis: i64) -> Duration {
    if operation.timeout_millis > 0 {
        Duration::from_millis(operation.timeout_millis)
    } else if operation.deadline_unix_millis > 0 {
        Duration::from_millis(
            u64::try_from(operation.deadline_unix_millis.saturating_sub(now_millis)).unwrap_or(0),
        )
    } else {
        DEFAULT_DEADLINE
    }
}

/// Room kept in each message for everything but objects and text (status, names, kinds,
/// the envelope).
const PART_OVERHEAD: usize = 64 * 1024;

/// Splits a result into parts that each fit in a message of `max_message_bytes` (the hub's
/// Welcome.max_message_bytes; 0: an older hub, which gets the result whole). Every part has
/// the result's id, status and names; objects, deleted names and text are spread over the
/// parts in order; all parts but the last have `more` set. A single object that cannot fit
/// turns the result into a 413 naming the limit (the hub would otherwise end the stream).
pub fn split(result: v1::OperationResult, max_message_bytes: u64) -> Vec<v1::OperationResult> {
    let Ok(max) = usize::try_from(max_message_bytes) else {
        return vec![result];
    };
    if max == 0 || result.encoded_len() <= max.saturating_sub(1024) {
        return vec![result];
    }
    let room = max.saturating_sub(PART_OVERHEAD).max(1024);
    if let Some(big) = result.objects_json.iter().map(Vec::len).find(|l| *l > room) {
        let message = format!(
            // troubleshooting: operation: HTTP 413 (from the agent)
            // One object of the result does not fit in one message to the hub even alone, so it
            // cannot be sent in parts either.
            "an object of the result is {big} bytes, more than fits in a message to the hub \
             ({max} bytes): raise the hub's --max-object-bytes (its message limit is that \
             plus 1 MiB)"
        );
        return vec![v1::OperationResult {
            id: result.id,
            ok: false,
            status: Some(Failure::new(413, "RequestEntityTooLarge", message).status),
            executed: result.executed,
            replica: result.replica,
            account: result.account,
            ..Default::default()
        }];
    }
    let empty = v1::OperationResult {
        id: result.id.clone(),
        ok: result.ok,
        status: result.status.clone(),
        executed: result.executed,
        replica: result.replica.clone(),
        account: result.account.clone(),
        more: true,
        ..Default::default()
    };
    let mut parts = Vec::new();
    let mut part = empty.clone();
    let mut used = 0;
    let mut flush = |part: &mut v1::OperationResult, used: &mut usize| {
        parts.push(std::mem::replace(part, empty.clone()));
        *used = 0;
    };
    let kinds = result
        .object_kinds
        .into_iter()
        .map(Some)
        .chain(std::iter::repeat(None));
    for (object, kind) in result.objects_json.into_iter().zip(kinds) {
        if used + object.len() > room {
            flush(&mut part, &mut used);
        }
        used += object.len();
        part.objects_json.push(object);
        part.object_kinds.extend(kind);
    }
    let uids = result
        .deleted_uids
        .into_iter()
        .map(Some)
        .chain(std::iter::repeat(None));
    let deleted_kinds = result
        .deleted_kinds
        .into_iter()
        .map(Some)
        .chain(std::iter::repeat(None));
    for ((name, kind), uid) in result.deleted.into_iter().zip(deleted_kinds).zip(uids) {
        if used + name.len() + 256 > room {
            flush(&mut part, &mut used);
        }
        used += name.len() + 256;
        part.deleted.push(name);
        part.deleted_kinds.extend(kind);
        part.deleted_uids.extend(uid);
    }
    let mut text = result.text.as_str();
    while !text.is_empty() {
        if used >= room {
            flush(&mut part, &mut used);
        }
        let mut end = text.len().min(room - used);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if end == 0 {
            flush(&mut part, &mut used);
            continue;
        }
        part.text.push_str(&text[..end]);
        used += end;
        text = &text[end..];
    }
    part.more = false;
    part.continue_token = result.continue_token;
    parts.push(part);
    parts
}

async fn run(
    ctx: &Ctx<'_>,
    op: Option<Op>,
    list_continue: String,
    out: &mut Output,
) -> OpResult<()> {
    let op = op.ok_or_else(|| Failure::bad_request("the operation has no content"))?;
    match op {
        Op::Apply(a) => write::apply(ctx, a, out).await,
        Op::Create(c) => write::create(ctx, c, out).await,
        Op::Replace(r) => write::replace(ctx, r, out).await,
        Op::Patch(p) => write::patch(ctx, p, out).await,
        Op::Scale(s) => write::scale(ctx, s, out).await,
        Op::Delete(d) => delete::delete(ctx, d, out).await,
        Op::Rollout(r) => rollout::rollout(ctx, r, out).await,
        Op::Get(g) => read::get(ctx, g, out).await,
        Op::List(l) => read::list(ctx, l, list_continue, out).await,
        Op::Events(e) => read::events(ctx, e, out).await,
        Op::Logs(l) => read::logs(ctx, l, out).await,
    }
}

/// A result for an operation this agent cannot run at all (account unknown or not ready).
pub fn refused(
    operation: &v1::Operation,
    replica: &str,
    code: i32,
    reason: &str,
    message: String,
) -> v1::OperationResult {
    v1::OperationResult {
        id: operation.id.clone(),
        ok: false,
        status: Some(Failure::new(code, reason, message).status),
        replica: replica.to_string(),
        account: operation.account.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
