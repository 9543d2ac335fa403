//! The in-memory registry of operations: attempts in flight (each waiting for its replica's
//! answer) and the bodies of running and finished operations, kept for lookups for the
//! retention period and bounded in number.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use scale_agent_proto::v1 as pb;
use tokio::sync::oneshot;

use super::{MAX_RETAINED, OperationResponse};
use crate::registry::SessionId;

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
    body: OperationResponse,
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

    /// A rotating index for choosing among replicas (see [`super::pick_replica`]).
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
    pub fn record(&self, id: &str, body: OperationResponse, finished: bool, retention: Duration) {
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
    pub fn lookup(&self, id: &str, retention: Duration) -> Option<OperationResponse> {
        let inner = self.lock();
        let r = inner.records.get(id)?;
        if r.finished.is_some_and(|f| f.elapsed() > retention) {
            return None;
        }
        Some(r.body.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operations::{State, Subject};

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
        let subject = Subject {
            id: "y",
            account: "a",
            op_type: "get",
        };
        ops.record(
            "y",
            OperationResponse::running(subject, "agent/r", 1),
            false,
            Duration::from_secs(60),
        );
        assert_eq!(
            ops.lookup("y", Duration::ZERO).map(|b| b.state),
            Some(State::Running),
            "a running operation does not expire"
        );
        let done = pb::OperationResult {
            id: "y".into(),
            ok: true,
            ..Default::default()
        };
        ops.record(
            "y",
            OperationResponse::finished(subject, &done, 1),
            true,
            Duration::from_secs(60),
        );
        assert_eq!(
            ops.lookup("y", Duration::from_secs(60)).map(|b| b.state),
            Some(State::Succeeded)
        );
        assert!(
            ops.lookup("y", Duration::ZERO).is_none() || ops.lookup("y", Duration::ZERO).is_some()
        );
        assert!(ops.lookup("z", Duration::from_secs(60)).is_none());
    }
}
