//! The in-memory registry of operations: attempts in flight (each waiting for its replica's
//! answer, joining the parts of a result the agent split) and the bodies of running and
//! finished operations, kept for lookups for the retention period and bounded in number and
//! in bytes.
//!
//! Records are keyed by id, account and submitter: a client-given id is the client's, per
//! account and per caller (issue 28, F18: another caller's id is another operation, and its
//! lookups do not see this one). An id is claimed (recorded as running) before anything is
//! sent, under the same lock as the lookup, so concurrent submissions of one id run it once.
//! Ids the hub makes are 128 random bits: nobody finds another caller's operation by
//! guessing.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    io,
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use scale_agent_hub_model::{auth::Submitter, records::SessionId};
use scale_agent_proto::v1 as pb;
use tokio::sync::{Notify, oneshot};

use super::{MAX_RETAINED, OperationResponse, State};

/// How an attempt ended.
#[derive(Debug)]
pub enum Outcome {
    Result(Box<pb::OperationResult>),
    /// The replica's stream ended before it answered; `sent` says whether the operation
    /// had been written to the stream.
    Dropped {
        sent: bool,
    },
    /// The result is larger than the hub takes: `message` names the limit and the flag.
    TooLarge {
        message: String,
    },
}

struct Pending {
    session: SessionId,
    sent: bool,
    tx: oneshot::Sender<Outcome>,
    /// The parts received so far of a result the agent split, and their size.
    partial: Option<pb::OperationResult>,
    partial_bytes: usize,
}

struct Record {
    finished: Option<Instant>,
    /// The HTTP code of a finished operation.
    code: u16,
    body: OperationResponse,
    /// The body's JSON size, counted against the byte bound.
    bytes: usize,
}

/// (id, account, submitter key): the ids of all accounts and submitters are next to each
/// other, for lookups by id alone.
type Key = (String, String, String);

/// Whose operation a record is: its account and the key of its submitter
/// ([`Submitter::key`]).
#[derive(Clone, Copy, Debug)]
pub struct Owner<'a> {
    pub account: &'a str,
    pub submitter: &'a str,
}

impl Owner<'_> {
    fn key(&self, id: &str) -> Key {
        (
            id.to_string(),
            self.account.to_string(),
            self.submitter.to_string(),
        )
    }
}

#[derive(Default)]
struct Inner {
    pending: HashMap<String, Pending>,
    records: BTreeMap<Key, Record>,
    order: VecDeque<Key>,
    /// Sum of the records' `bytes`.
    bytes: usize,
}

/// What [`Operations::claim`] found.
#[derive(Debug)]
pub enum Claim {
    /// The id was free and is now recorded as running: run the operation.
    New,
    /// Another submission of the id is running; its current body.
    Running(OperationResponse),
    /// The id finished within the retention period: its code and body.
    Finished(u16, OperationResponse),
}

/// The byte limits of the registry.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Largest result (all its parts) one operation may return.
    pub max_result_bytes: usize,
    /// Most bytes of bodies kept for lookups.
    pub max_records_bytes: usize,
}

/// Operations in flight and finished.
pub struct Operations {
    inner: Mutex<Inner>,
    bounds: Bounds,
    /// Where the hub's operation ids come from.
    random: ring::rand::SystemRandom,
    /// Woken when an operation finishes (submissions of a running id wait on it).
    finished: Notify,
    /// Records written to the store (see `persist`).
    writes: AtomicU64,
}

impl Default for Operations {
    fn default() -> Self {
        Operations::new(Bounds {
            max_result_bytes: usize::MAX,
            max_records_bytes: usize::MAX,
        })
    }
}

/// Counts the bytes written to it.
struct Counter(usize);

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The size of a body's JSON, without building it.
fn json_size(body: &OperationResponse) -> usize {
    let mut counter = Counter(0);
    let _ = serde_json::to_writer(&mut counter, body);
    counter.0
}

/// The bytes a result part adds to a joined result.
fn part_bytes(part: &pb::OperationResult) -> usize {
    part.objects_json.iter().map(Vec::len).sum::<usize>()
        + part.text.len()
        + part.deleted.iter().map(String::len).sum::<usize>()
}

/// Appends a later part to the parts joined so far: lists in order; everything else (status,
/// ok, executed, continue token) from the later part.
fn join(mut joined: pb::OperationResult, part: pb::OperationResult) -> pb::OperationResult {
    joined.objects_json.extend(part.objects_json);
    joined.object_kinds.extend(part.object_kinds);
    joined.deleted.extend(part.deleted);
    joined.deleted_kinds.extend(part.deleted_kinds);
    joined.deleted_uids.extend(part.deleted_uids);
    joined.text.push_str(&part.text);
    joined.ok = part.ok;
    joined.status = part.status;
    joined.executed = joined.executed || part.executed;
    joined.continue_token = part.continue_token;
    joined.more = part.more;
    joined
}

impl Operations {
    pub fn new(bounds: Bounds) -> Self {
        Operations {
            inner: Mutex::new(Inner::default()),
            bounds,
            random: ring::rand::SystemRandom::new(),
            finished: Notify::new(),
            writes: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new operation id: `op-` and 128 random bits in hex, unique across replicas and
    /// restarts, and not guessable from the ids a caller saw (they were `op-<ms>-<n>`
    /// before, F18). The system's CSPRNG failing is not something to run on without.
    pub fn new_id(&self) -> String {
        use ring::rand::SecureRandom as _;
        let mut bytes = [0u8; 16];
        #[allow(clippy::expect_used)]
        self.random
            .fill(&mut bytes)
            .expect("the system's random number generator failed");
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!("op-{hex}")
    }

    /// Registers an attempt on a session under its wire id; the receiver hears its outcome.
    pub fn register(&self, wire_id: &str, session: SessionId) -> oneshot::Receiver<Outcome> {
        let (tx, rx) = oneshot::channel();
        self.lock().pending.insert(
            wire_id.to_string(),
            Pending {
                session,
                sent: false,
                tx,
                partial: None,
                partial_bytes: 0,
            },
        );
        rx
    }

    /// Forgets an attempt (timed out or given up); true when it had been sent.
    pub fn forget(&self, wire_id: &str) -> bool {
        self.lock().pending.remove(wire_id).is_some_and(|p| p.sent)
    }

    /// The operation was written to its replica's stream.
    pub fn mark_sent(&self, wire_id: &str) {
        if let Some(p) = self.lock().pending.get_mut(wire_id) {
            p.sent = true;
        }
    }

    /// A result (or a part of one) arrived from `session`; false when nobody waits for it.
    /// Parts are joined until the last; a joined result past the largest the hub takes ends
    /// the attempt with [`Outcome::TooLarge`], and its later parts find nobody waiting.
    pub fn complete(&self, session: SessionId, result: pb::OperationResult) -> bool {
        let mut inner = self.lock();
        let Some(p) = inner.pending.get_mut(&result.id) else {
            return false;
        };
        if p.session != session {
            return false;
        }
        p.partial_bytes += part_bytes(&result);
        if p.partial_bytes > self.bounds.max_result_bytes {
            let bytes = p.partial_bytes;
            let Some(p) = inner.pending.remove(&result.id) else {
                return false;
            };
            drop(inner);
            let message = format!(
                // troubleshooting: operation: HTTP 413, `state: failed`, reason `RequestEntityTooLarge`
                // The agent's result (a list, logs) grew past `--max-operation-result-bytes` while
                // it was being sent; what was sent so far is dropped.
                "the result is larger than the hub's limit of {} bytes (--max-operation-result-bytes; \
                 {bytes} bytes so far): narrow the question (a namespace, a label or field \
                 selector, a list limit with continue, logs with tailLines or limitBytes) or \
                 raise the limit",
                self.bounds.max_result_bytes
            );
            return p.tx.send(Outcome::TooLarge { message }).is_ok();
        }
        let joined = match p.partial.take() {
            Some(before) => join(before, result),
            None => result,
        };
        if joined.more {
            p.partial = Some(joined);
            return true;
        }
        let Some(p) = inner.pending.remove(&joined.id) else {
            return false;
        };
        drop(inner);
        p.tx.send(Outcome::Result(Box::new(joined))).is_ok()
    }

    /// A stream ended: its attempts in flight are dropped. `too_large` is set when the
    /// stream broke on a message past the hub's decode limit (an agent that does not split
    /// results): its attempts end with that instead, so the hub does not resend them to the
    /// next replica, whose stream the same result would break.
    pub fn session_ended(&self, session: SessionId, too_large: Option<&str>) {
        let mut inner = self.lock();
        let ids: Vec<String> = inner
            .pending
            .iter()
            .filter(|(_, p)| p.session == session)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            if let Some(p) = inner.pending.remove(&id) {
                let outcome = match too_large {
                    Some(message) if p.sent => Outcome::TooLarge {
                        message: message.to_string(),
                    },
                    _ => Outcome::Dropped { sent: p.sent },
                };
                let _ = p.tx.send(outcome);
            }
        }
    }

    /// Removes records past the retention period, then the oldest finished ones while the
    /// count or the bytes (with `room` more) are past the bounds. Running records stay: they
    /// are the claims that keep an id from running twice, and are small.
    fn evict(&self, inner: &mut Inner, retention: Duration, room: usize) {
        let now = Instant::now();
        let mut kept = VecDeque::with_capacity(inner.order.len());
        while let Some(key) = inner.order.pop_front() {
            let Some(record) = inner.records.get(&key) else {
                continue;
            };
            let expired = record
                .finished
                .is_some_and(|f| now.duration_since(f) > retention);
            let crowded = inner.records.len() >= MAX_RETAINED
                || inner.bytes.saturating_add(room) > self.bounds.max_records_bytes;
            if expired || (crowded && record.finished.is_some()) {
                if let Some(r) = inner.records.remove(&key) {
                    inner.bytes = inner.bytes.saturating_sub(r.bytes);
                }
                continue;
            }
            kept.push_back(key);
            if !crowded {
                // Records are in the order they were made: the rest are younger.
                break;
            }
        }
        kept.append(&mut inner.order);
        inner.order = kept;
    }

    fn insert(
        &self,
        inner: &mut Inner,
        key: Key,
        code: u16,
        body: OperationResponse,
        finished: bool,
    ) {
        let mut body = body;
        let mut bytes = json_size(&body);
        // One body may take at most an eighth of the bound, so a few large results do not
        // push every other record out; past that, the outcome is kept without its payload
        // (the claim on the id stays, and says why the rest is gone).
        let most = self.bounds.max_records_bytes / 8;
        if finished && bytes > most {
            body.objects = body.objects.as_ref().map(|_| Vec::new());
            body.text = body.text.as_ref().map(|_| String::new());
            let note = format!(
                "the result ({bytes} bytes) was returned to the submitter but is too large to \
                 keep for lookups (--max-operation-records-bytes {}): its objects and text are \
                 left out",
                self.bounds.max_records_bytes
            );
            body.message = Some(match body.message.take() {
                Some(m) if !m.is_empty() => format!("{m}; {note}"),
                _ => note,
            });
            bytes = json_size(&body);
        }
        if let Some(old) = inner.records.remove(&key) {
            inner.bytes = inner.bytes.saturating_sub(old.bytes);
        } else {
            inner.order.push_back(key.clone());
        }
        inner.bytes += bytes;
        inner.records.insert(
            key,
            Record {
                finished: finished.then(Instant::now),
                code,
                body,
                bytes,
            },
        );
    }

    /// Claims `id` for `owner`: records `running` unless the id is known (running, or
    /// finished within `retention`). The lookup and the claim are one step, so of concurrent
    /// submissions of one id exactly one gets [`Claim::New`].
    pub fn claim(
        &self,
        owner: Owner<'_>,
        id: &str,
        running: OperationResponse,
        retention: Duration,
    ) -> Claim {
        let mut inner = self.lock();
        let key = owner.key(id);
        if let Some(r) = inner.records.get(&key) {
            match r.finished {
                None => return Claim::Running(r.body.clone()),
                Some(f) if f.elapsed() <= retention => {
                    return Claim::Finished(r.code, r.body.clone());
                }
                Some(_) => {}
            }
        }
        let room = json_size(&running);
        self.evict(&mut inner, retention, room);
        self.insert(&mut inner, key, 0, running, false);
        Claim::New
    }

    /// Records an operation's state: running (an attempt started) or finished with `code`.
    pub fn record(
        &self,
        owner: Owner<'_>,
        id: &str,
        body: OperationResponse,
        finished: Option<u16>,
        retention: Duration,
    ) {
        {
            let mut inner = self.lock();
            let room = json_size(&body).min(self.bounds.max_records_bytes / 8);
            self.evict(&mut inner, retention, room);
            let key = owner.key(id);
            self.insert(
                &mut inner,
                key,
                finished.unwrap_or(0),
                body,
                finished.is_some(),
            );
        }
        if finished.is_some() {
            self.finished.notify_waiters();
        }
    }

    /// The recorded states of operation `id` that `viewer` may see (their own, or every
    /// one for an admin): of `account`, or of every account that has one when `account` is
    /// `None`.
    pub fn lookup(
        &self,
        account: Option<&str>,
        id: &str,
        viewer: &Submitter,
        retention: Duration,
    ) -> Vec<OperationResponse> {
        let inner = self.lock();
        let from = (
            id.to_string(),
            account.unwrap_or_default().to_string(),
            String::new(),
        );
        inner
            .records
            .range(from..)
            .take_while(|((i, a, _), _)| i == id && account.is_none_or(|want| want == a))
            .filter(|((_, _, submitter), _)| viewer.sees(submitter))
            .filter(|(_, r)| r.finished.is_none_or(|f| f.elapsed() <= retention))
            .map(|(_, r)| r.body.clone())
            .collect()
    }

    /// Waits until `id` of `owner` finishes, or `until`: its code and body, or `None` when
    /// it is still running (or no longer known) then.
    pub async fn wait_finished(
        &self,
        owner: Owner<'_>,
        id: &str,
        until: Instant,
    ) -> Option<(u16, OperationResponse)> {
        let key = owner.key(id);
        loop {
            let woken = self.finished.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            {
                let inner = self.lock();
                let r = inner.records.get(&key)?;
                if r.finished.is_some() {
                    return Some((r.code, r.body.clone()));
                }
            }
            if tokio::time::timeout_at(until.into(), woken).await.is_err() {
                return None;
            }
        }
    }

    /// Counts a write of a record to the store; the count before it.
    pub(crate) fn count_write(&self) -> u64 {
        self.writes.fetch_add(1, Ordering::Relaxed)
    }

    /// Puts back a record of a previous run of the hub, finished at `at`.
    pub(crate) fn restore(
        &self,
        owner: Owner<'_>,
        id: &str,
        code: u16,
        body: OperationResponse,
        at: Instant,
        retention: Duration,
    ) {
        let mut inner = self.lock();
        let room = json_size(&body).min(self.bounds.max_records_bytes / 8);
        self.evict(&mut inner, retention, room);
        let key = owner.key(id);
        self.insert(&mut inner, key.clone(), code, body, true);
        if let Some(r) = inner.records.get_mut(&key) {
            r.finished = Some(at);
        }
    }

    /// Bytes of the bodies kept (for tests and metrics).
    pub fn retained_bytes(&self) -> usize {
        self.lock().bytes
    }

    /// The state of a running or finished record (for tests).
    pub fn state_of(&self, owner: Owner<'_>, id: &str) -> Option<State> {
        self.lock()
            .records
            .get(&owner.key(id))
            .map(|r| r.body.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{State, Subject};

    /// Operations of account `account` submitted by `api:ci`.
    fn ci(account: &'static str) -> Owner<'static> {
        Owner {
            account,
            submitter: "api:ci",
        }
    }

    fn admin() -> Submitter {
        Submitter {
            key: "admin:admin".into(),
            admin: true,
        }
    }

    fn subject(id: &'static str) -> Subject<'static> {
        Subject {
            id,
            account: "a",
            op_type: "list",
        }
    }

    #[test]
    fn hub_made_ids_are_random() {
        let ops = Operations::default();
        let (a, b) = (ops.new_id(), ops.new_id());
        assert_ne!(a, b);
        for id in [&a, &b] {
            let hex = id.strip_prefix("op-").expect(id);
            assert_eq!(hex.len(), 32, "{id}");
            assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        }
        // 128 random bits: no two of many share their first half (a time or counter
        // prefix would).
        let prefixes: std::collections::HashSet<String> =
            (0..1000).map(|_| ops.new_id()[..19].to_string()).collect();
        assert_eq!(prefixes.len(), 1000);
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
        ops.session_ended(1, None);
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
        let retention = Duration::from_secs(60);
        ops.record(
            ci("a"),
            "y",
            OperationResponse::running(subject("y"), "agent/r", 1),
            None,
            retention,
        );
        assert_eq!(
            ops.lookup(Some("a"), "y", &admin(), Duration::ZERO)
                .first()
                .map(|b| b.state),
            Some(State::Running),
            "a running operation does not expire"
        );
        let done = pb::OperationResult {
            id: "y".into(),
            ok: true,
            ..Default::default()
        };
        ops.record(
            ci("a"),
            "y",
            OperationResponse::finished(subject("y"), &done, 1),
            Some(200),
            retention,
        );
        assert_eq!(
            ops.lookup(None, "y", &admin(), retention)
                .first()
                .map(|b| b.state),
            Some(State::Succeeded)
        );
        assert!(ops.lookup(Some("b"), "y", &admin(), retention).is_empty());
        assert!(ops.lookup(None, "z", &admin(), retention).is_empty());
    }

    #[test]
    fn ids_are_claimed_once_per_account() {
        let ops = Operations::default();
        let retention = Duration::from_secs(60);
        let running = || OperationResponse::running(subject("same"), "", 0);
        assert!(matches!(
            ops.claim(ci("a"), "same", running(), retention),
            Claim::New
        ));
        assert!(matches!(
            ops.claim(ci("a"), "same", running(), retention),
            Claim::Running(_)
        ));
        // Another account's id of the same name is another operation.
        assert!(matches!(
            ops.claim(ci("b"), "same", running(), retention),
            Claim::New
        ));
        assert_eq!(ops.lookup(None, "same", &admin(), retention).len(), 2);
        // Another caller's id of the same name in the same account is another operation,
        // and neither caller sees the other's (F18).
        let other = Owner {
            account: "a",
            submitter: "api:other",
        };
        assert!(matches!(
            ops.claim(other, "same", running(), retention),
            Claim::New
        ));
        let viewer = |key: &str| Submitter {
            key: key.into(),
            admin: false,
        };
        assert_eq!(
            ops.lookup(Some("a"), "same", &viewer("api:ci"), retention)
                .len(),
            1
        );
        assert_eq!(
            ops.lookup(Some("a"), "same", &viewer("api:other"), retention)
                .len(),
            1
        );
        assert!(
            ops.lookup(None, "same", &viewer("api:third"), retention)
                .is_empty()
        );
        assert_eq!(ops.lookup(None, "same", &admin(), retention).len(), 3);
        ops.record(
            ci("a"),
            "same",
            OperationResponse::finished(subject("same"), &pb::OperationResult::default(), 1),
            Some(201),
            retention,
        );
        assert!(matches!(
            ops.claim(ci("a"), "same", running(), retention),
            Claim::Finished(201, _)
        ));
    }

    #[test]
    fn parts_are_joined_and_a_result_past_the_limit_ends_only_its_attempt() {
        let ops = Operations::new(Bounds {
            max_result_bytes: 10,
            max_records_bytes: usize::MAX,
        });
        let part = |id: &str, object: &str, more: bool| pb::OperationResult {
            id: id.into(),
            ok: !more,
            objects_json: vec![object.as_bytes().to_vec()],
            object_kinds: vec![pb::Kind::default()],
            more,
            ..Default::default()
        };
        let mut rx = ops.register("x", 1);
        assert!(ops.complete(1, part("x", "1234", true)));
        assert!(rx.try_recv().is_err(), "not before the last part");
        assert!(ops.complete(1, part("x", "5678", false)));
        let Ok(Outcome::Result(joined)) = rx.try_recv() else {
            panic!("no joined result")
        };
        assert!(joined.ok && !joined.more);
        assert_eq!(joined.objects_json, [b"1234".to_vec(), b"5678".to_vec()]);
        assert_eq!(joined.object_kinds.len(), 2);

        let mut rx = ops.register("y", 1);
        let mut other = ops.register("z", 1);
        assert!(ops.complete(1, part("y", "123456", true)));
        assert!(ops.complete(1, part("y", "123456", true)));
        assert!(
            matches!(rx.try_recv(), Ok(Outcome::TooLarge { message }) if message.contains("--max-operation-result-bytes"))
        );
        // Later parts find nobody; the other operation of the stream is untouched.
        assert!(!ops.complete(1, part("y", "1", false)));
        assert!(ops.complete(1, part("z", "1", false)));
        assert!(matches!(other.try_recv(), Ok(Outcome::Result(_))));
    }

    #[test]
    fn records_are_bounded_by_bytes() {
        let ops = Operations::new(Bounds {
            max_result_bytes: usize::MAX,
            max_records_bytes: 64 * 1024,
        });
        let retention = Duration::from_secs(60);
        let result = pb::OperationResult {
            ok: true,
            text: "x".repeat(4000),
            ..Default::default()
        };
        for i in 0..100 {
            let id = format!("op-{i}");
            ops.record(
                ci("a"),
                &id,
                OperationResponse::finished(
                    Subject {
                        id: &id,
                        account: "a",
                        op_type: "logs",
                    },
                    &result,
                    1,
                ),
                Some(200),
                retention,
            );
            assert!(
                ops.retained_bytes() <= 64 * 1024,
                "{}",
                ops.retained_bytes()
            );
        }
        // The newest are kept, the oldest went.
        assert_eq!(ops.lookup(None, "op-99", &admin(), retention).len(), 1);
        assert!(ops.lookup(None, "op-0", &admin(), retention).is_empty());
        // A body past an eighth of the bound is kept without its payload.
        let big = pb::OperationResult {
            ok: true,
            text: "x".repeat(20_000),
            ..Default::default()
        };
        ops.record(
            ci("a"),
            "big",
            OperationResponse::finished(subject("big"), &big, 1),
            Some(200),
            retention,
        );
        let kept = ops.lookup(None, "big", &admin(), retention);
        assert_eq!(kept[0].text.as_deref(), Some(""));
        assert!(
            kept[0]
                .message
                .as_deref()
                .is_some_and(|m| m.contains("--max-operation-records-bytes"))
        );
        assert_eq!(kept[0].state, State::Succeeded);
    }
}
