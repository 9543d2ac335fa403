//! The write path from the agents' streams to the store: a queue and one writer task that
//! commits whatever is queued in one transaction (group commit).
//!
//! Why: redb has one writer. With every stream holding one store lock across its own
//! commit (and its fsync, once a second), the slowest commit set the pace of every agent's
//! acknowledgements. Now a stream applies its batch to the cache and queues the batch's
//! changes under the state lock (so commits keep the order of the changes in memory), and
//! goes on; the writer commits the queue in order. A stream's Ack waits for the store only
//! while that stream has more than [`MAX_UNCOMMITTED_BYTES`] queued, or while the store
//! cannot commit at all ([`Progress::failing`]): then every stream's Ack is held until its
//! changes are committed, so agents stop at `max_unacked` and wait, instead of having their
//! streams ended and reconnecting in a storm.
//!
//! A commit that fails (a full disk) is retried with backoff, the same changes first, so
//! nothing is lost and nothing is reordered; after an I/O error the store opens redb again
//! and writes again the changes redb rolled back (see [`Store::try_commit`]).
//!
//! The hub holds it as `scale_agent_hub::commits` (its old path). The writer takes what it
//! uses, not the hub: the store behind its lock, the [`StoreMetrics`] it records and the
//! shutdown signal ([`Commits::run`]).

use std::{
    collections::VecDeque,
    path::PathBuf,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use tokio::sync::{Notify, watch};

use scale_agent_hub_model::{HubError, Result, error::Chain};

use crate::{
    Failed, Store, StoreOp, fenced_accounts, memory::release_free_memory, metrics::StoreMetrics,
};

/// Most bytes of changes one stream may have queued and not yet committed before its Acks
/// wait for the store.
pub const MAX_UNCOMMITTED_BYTES: u64 = 32 * 1024 * 1024;
/// Most bytes of changes queued for all streams together before every stream's Acks wait
/// for its own changes: bounds the queue's memory with many agents on a slow store.
pub const MAX_QUEUED_BYTES: u64 = 1024 * 1024 * 1024;
/// Most changes committed in one transaction: a larger queue is committed in several.
const MAX_GROUP_OPS: usize = 50_000;
/// First wait before a failed commit is tried again; doubled up to [`MAX_RETRY_WAIT`].
const FIRST_RETRY_WAIT: Duration = Duration::from_millis(100);
const MAX_RETRY_WAIT: Duration = Duration::from_secs(5);

/// A commit of at least this many bytes of changes (as [`op_bytes`] counts them: a
/// snapshot's objects) is followed by [`release_free_memory`].
const TRIM_AFTER_BYTES: u64 = 1024 * 1024;
/// At most one [`release_free_memory`] per this period: it walks the allocator's arenas,
/// holding each one's lock meanwhile.
const TRIM_PERIOD: Duration = Duration::from_secs(10);

/// Whether a commit of `bytes`, `since` the last trim (`None`: never), is followed by one.
fn should_trim(bytes: u64, since: Option<Duration>) -> bool {
    bytes >= TRIM_AFTER_BYTES && since.is_none_or(|s| s >= TRIM_PERIOD)
}

/// Where the writer stands, for the streams waiting to acknowledge.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Every ticket up to this one is committed.
    pub committed: u64,
    /// The last commit failed: the store cannot commit now.
    pub failing: bool,
}

/// What of the store fails, so that the messages built from [`Health`] name it: a replica
/// whose ownership look-ups fail has often committed nothing at all (nothing was queued), and
/// "has not committed" would send its operator to the wrong place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failing {
    /// Commits of the queued changes fail.
    Commits,
    /// The accounts' ownership cannot reach the store (a look-up or an acquisition failed,
    /// or the connection holding the locks broke), although no commit failed.
    Ownership,
}

impl Failing {
    /// What fails, for `seconds`: "the store {this} (its error)".
    pub fn for_seconds(self, seconds: u64) -> String {
        match self {
            Failing::Commits => format!("has not committed for {seconds} s"),
            Failing::Ownership => {
                format!("could not be reached for the accounts' ownership for {seconds} s")
            }
        }
    }
}

/// What the store's health looks like from outside (readiness, logs).
#[derive(Clone, Debug, Default)]
pub struct Health {
    /// Why the last commit failed, while commits fail (else why the ownership could not
    /// reach the store, while it cannot).
    pub failure: Option<String>,
    /// Which of the two `failure` is (a failing commit first).
    pub failing: Option<Failing>,
    /// When the first of the failing commits failed, while commits fail: the cache has not
    /// been durable since (what the proxy's stale answers say).
    pub failing_since: Option<std::time::Instant>,
    /// Changes queued and not yet committed.
    pub queued: usize,
}

/// Changes queued by [`Commits::enqueue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queued {
    pub ticket: u64,
    /// Their size, as [`op_bytes`] counts it.
    pub bytes: u64,
}

#[derive(Default)]
struct Queue {
    next_ticket: u64,
    /// (ticket, changes, bytes).
    entries: VecDeque<(u64, Vec<StoreOp>, u64)>,
    queued_ops: usize,
    queued_bytes: u64,
    failure: Option<String>,
    failing_since: Option<std::time::Instant>,
    /// Set while the replicas' ownership cannot reach the same PostgreSQL ([`Commits::unreachable`]):
    /// nothing may be committed for the accounts no replica can own, although no commit
    /// failed (nothing was queued).
    unreachable: Option<(std::time::Instant, String)>,
}

/// The queue of changes to commit, and the writer's progress.
pub struct Commits {
    queue: Mutex<Queue>,
    wake: Notify,
    progress: watch::Sender<Progress>,
    data_dir: PathBuf,
}

/// The bytes a change holds (an object as kept: compressed), for [`MAX_UNCOMMITTED_BYTES`].
pub fn op_bytes(op: &StoreOp) -> u64 {
    const OVERHEAD: u64 = 128;
    match op {
        StoreOp::PutObject { object, .. } => OVERHEAD + object.json.packed_len() as u64,
        _ => OVERHEAD,
    }
}

impl Commits {
    pub fn new(data_dir: PathBuf) -> Self {
        Commits {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            progress: watch::Sender::new(Progress::default()),
            data_dir,
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues changes for the writer; returns their ticket (`None` for no changes). Call it
    /// in the same critical section as the change to the cache, so that changes are
    /// committed in the order they were made.
    pub fn enqueue(&self, ops: Vec<StoreOp>) -> Option<Queued> {
        if ops.is_empty() {
            return None;
        }
        let bytes = ops.iter().map(op_bytes).sum();
        let ticket = {
            let mut q = self.queue();
            q.next_ticket += 1;
            let ticket = q.next_ticket;
            q.queued_ops += ops.len();
            q.queued_bytes += bytes;
            q.entries.push_back((ticket, ops, bytes));
            ticket
        };
        self.wake.notify_one();
        Some(Queued { ticket, bytes })
    }

    /// The ticket of the changes queued last (0: none yet): once it is committed, so is
    /// everything queued before.
    pub fn last_ticket(&self) -> u64 {
        self.queue().next_ticket
    }

    /// Bytes of changes queued and not yet committed, all streams together.
    pub fn queued_bytes(&self) -> u64 {
        self.queue().queued_bytes
    }

    /// Follows the writer's progress.
    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// Waits until `ticket` is committed; `Err` (the failure) as soon as a commit fails (the
    /// changes stay queued and are committed when the store recovers).
    pub async fn committed_or_failing(&self, ticket: u64) -> Result<(), String> {
        let mut progress = self.subscribe();
        let result = progress
            .wait_for(|p| p.committed >= ticket || p.failing)
            .await
            .map(|p| p.committed >= ticket);
        match result {
            Ok(true) => Ok(()),
            _ => Err(self
                .health()
                .failure
                .unwrap_or_else(|| "the hub is shutting down".into())),
        }
    }

    /// The commits' health; a store the ownership cannot reach counts as failing too.
    pub fn health(&self) -> Health {
        let q = self.queue();
        let unreachable = q.unreachable.as_ref();
        Health {
            failure: q
                .failure
                .clone()
                .or_else(|| unreachable.map(|(_, reason)| reason.clone())),
            failing: match (&q.failure, unreachable) {
                (Some(_), _) => Some(Failing::Commits),
                (None, Some(_)) => Some(Failing::Ownership),
                (None, None) => None,
            },
            failing_since: match (q.failing_since, unreachable.map(|(since, _)| *since)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            queued: q.queued_ops,
        }
    }

    /// The replicas' ownership cannot reach the store (PostgreSQL down or cut off): no
    /// replica can take the accounts, so their agents stand by and nothing of theirs is
    /// committed. Reported as the store failing (readiness, `store_failing`, the proxy's
    /// stale reads) until [`Self::reachable`], although no commit failed.
    pub fn unreachable(&self, reason: String) {
        let first = {
            let mut q = self.queue();
            let first = q.unreachable.is_none();
            let since = q
                .unreachable
                .as_ref()
                .map_or_else(std::time::Instant::now, |(since, _)| *since);
            q.unreachable = Some((since, reason.clone()));
            first
        };
        if first {
            tracing::error!(error = %reason, "the store cannot be reached for the accounts' ownership; reads are served from memory, flagged as stale, writes refused");
        }
    }

    /// Whether the ownership found the store unreachable last (see [`Self::unreachable`]).
    pub fn is_unreachable(&self) -> bool {
        self.queue().unreachable.is_some()
    }

    /// The ownership reached the store again (see [`Self::unreachable`]).
    pub fn reachable(&self) {
        if self.queue().unreachable.take().is_some() {
            tracing::info!("the store is reachable again for the accounts' ownership");
        }
    }

    /// The changes queued, oldest first, up to [`MAX_GROUP_OPS`] (at least one entry).
    fn take_group(&self) -> Option<(u64, Vec<StoreOp>, u64)> {
        let mut q = self.queue();
        let mut last = None;
        let mut ops = Vec::new();
        let mut bytes = 0;
        while let Some((ticket, _, _)) = q.entries.front() {
            if last.is_some() && ops.len() >= MAX_GROUP_OPS {
                break;
            }
            last = Some(*ticket);
            if let Some((_, mut more, size)) = q.entries.pop_front() {
                ops.append(&mut more);
                bytes += size;
            }
        }
        last.map(|last| (last, ops, bytes))
    }

    /// Changes dropped from the queue without being committed.
    fn forget(&self, count: usize) {
        let mut q = self.queue();
        q.queued_ops = q.queued_ops.saturating_sub(count);
    }

    /// Puts a group that could not be committed back at the head of the queue.
    fn put_back(&self, last: u64, ops: Vec<StoreOp>, bytes: u64) {
        self.queue().entries.push_front((last, ops, bytes));
    }

    fn committed(&self, last: u64, count: usize, bytes: u64, metrics: &StoreMetrics) {
        let recovered = {
            let mut q = self.queue();
            q.queued_ops = q.queued_ops.saturating_sub(count);
            q.queued_bytes = q.queued_bytes.saturating_sub(bytes);
            metrics.queued_changes.set(q.queued_ops as i64);
            q.failing_since = None;
            q.failure.take().is_some()
        };
        if recovered {
            tracing::info!(data_dir = %self.data_dir.display(), "the store commits again; agents' acknowledgements resume");
            metrics.failing.set(0);
        }
        self.progress.send_replace(Progress {
            committed: last,
            failing: false,
        });
    }

    fn failed(&self, error: &HubError, metrics: &StoreMetrics) {
        metrics.commit_failures.inc();
        metrics.failing.set(1);
        let first = {
            let mut q = self.queue();
            metrics.queued_changes.set(q.queued_ops as i64);
            q.failing_since.get_or_insert_with(std::time::Instant::now);
            q.failure.replace(Chain(error).to_string()).is_none()
        };
        if first {
            tracing::error!(data_dir = %self.data_dir.display(), error = %Chain(error), "the store cannot commit (is the data directory's volume full, or PostgreSQL unreachable?); reads are served from memory, agents' acknowledgements are held so they slow down, and the commit is retried until it succeeds");
        } else {
            tracing::warn!(data_dir = %self.data_dir.display(), error = %Chain(error), "the store still cannot commit; retrying");
        }
        self.progress.send_modify(|p| p.failing = true);
    }

    /// The writer: commits the queue in order into `store` until `shutdown`; a failed commit
    /// is retried (the same changes first) with backoff. It records `metrics`.
    pub async fn run(
        &self,
        store: &tokio::sync::Mutex<Store>,
        metrics: &StoreMetrics,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut wait = FIRST_RETRY_WAIT;
        let mut last_trim: Option<std::time::Instant> = None;
        loop {
            let notified = self.wake.notified();
            if *shutdown.borrow() {
                // What is still queued is committed by [`Commits::drain`] at shutdown.
                return;
            }
            let Some((last, ops, bytes)) = self.take_group() else {
                tokio::select! {
                    () = notified => {}
                    _ = shutdown.changed() => {}
                }
                continue;
            };
            let count = ops.len();
            // While failing, every try is durable: once one succeeds, nothing committed
            // before it can be rolled back by a later reopen of the store.
            let failing = self.progress.borrow().failing;
            let result = {
                let mut store = store.lock().await;
                let began = std::time::Instant::now();
                let result = store.try_commit(ops, failing).await;
                metrics
                    .commit_seconds
                    .observe(began.elapsed().as_secs_f64());
                result
            };
            match result {
                Ok(()) => {
                    wait = FIRST_RETRY_WAIT;
                    self.committed(last, count, bytes, metrics);
                    if should_trim(bytes, last_trim.map(|t| t.elapsed())) {
                        last_trim = Some(std::time::Instant::now());
                        // Off the runtime's threads: it takes a few milliseconds per GiB.
                        tokio::task::spawn_blocking(release_free_memory);
                    }
                }
                Err(Failed {
                    error: HubError::Fenced { accounts, .. },
                    ops,
                }) => {
                    // Changes of accounts another replica took over: that replica's state is
                    // the account's now, and its agent resumes from it. They are dropped;
                    // the rest of the group is committed.
                    let (dropped, kept): (Vec<StoreOp>, Vec<StoreOp>) =
                        ops.into_iter().partition(|op| {
                            fenced_accounts(std::slice::from_ref(op))
                                .iter()
                                .any(|a| accounts.iter().any(|f| f == a))
                        });
                    tracing::warn!(
                        ?accounts,
                        dropped = dropped.len(),
                        "changes of accounts another hub replica took over are dropped (the store's fencing refused them)"
                    );
                    self.forget(dropped.len());
                    self.put_back(last, kept, bytes);
                }
                Err(Failed { error, ops }) => {
                    self.put_back(last, ops, bytes);
                    self.failed(&error, metrics);
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        _ = shutdown.changed() => {}
                    }
                    wait = (wait * 2).min(MAX_RETRY_WAIT);
                }
            }
        }
    }

    /// Commits everything queued (at shutdown, after the streams ended).
    pub async fn drain(&self, store: &mut Store) -> Result<()> {
        while let Some((last, ops, bytes)) = self.take_group() {
            let count = ops.len();
            if let Err(Failed { error, ops }) = store.try_commit(ops, true).await {
                self.put_back(last, ops, bytes);
                return Err(error);
            }
            let mut q = self.queue();
            q.queued_ops = q.queued_ops.saturating_sub(count);
            q.queued_bytes = q.queued_bytes.saturating_sub(bytes);
            drop(q);
            self.progress.send_modify(|p| p.committed = last);
        }
        Ok(())
    }
}

/// One stream's acknowledgements: which of its changes are still queued, and the Ack it
/// owes. See the module's documentation for when an Ack waits.
#[derive(Debug, Default)]
pub struct AckGate {
    /// (ticket, bytes) of this stream's changes not yet known to be committed.
    queued: VecDeque<(u64, u64)>,
    queued_bytes: u64,
    /// The sequence number to acknowledge once allowed.
    owed: Option<u64>,
    /// Whether the Ack was held (for logging once per hold).
    pub held: bool,
}

impl AckGate {
    /// A batch up to `seq` was applied and its changes (if any) queued.
    pub fn batch(&mut self, seq: u64, queued: Option<Queued>) {
        if let Some(Queued { ticket, bytes }) = queued {
            self.queued.push_back((ticket, bytes));
            self.queued_bytes += bytes;
        }
        self.owed = Some(seq);
    }

    /// Whether an Ack is owed.
    pub fn owes(&self) -> bool {
        self.owed.is_some()
    }

    /// The sequence number to acknowledge now, if any, with `total` bytes queued for all
    /// streams.
    pub fn ready(&mut self, progress: &Progress, total: u64) -> Option<u64> {
        while let Some((ticket, bytes)) = self.queued.front().copied() {
            if ticket > progress.committed {
                break;
            }
            self.queued.pop_front();
            self.queued_bytes -= bytes;
        }
        let allowed = self.queued.is_empty()
            || (!progress.failing
                && self.queued_bytes <= MAX_UNCOMMITTED_BYTES
                && total <= MAX_QUEUED_BYTES);
        if allowed {
            self.held = false;
            self.owed.take()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_commits_are_followed_by_a_trim_at_most_every_period() {
        assert!(should_trim(TRIM_AFTER_BYTES, None));
        assert!(!should_trim(TRIM_AFTER_BYTES - 1, None), "small commits");
        assert!(!should_trim(u64::MAX, Some(TRIM_PERIOD / 2)), "too soon");
        assert!(should_trim(u64::MAX, Some(TRIM_PERIOD)));
        // Callable from any thread (the writer runs it on a blocking thread).
        std::thread::spawn(release_free_memory).join().unwrap();
    }

    #[test]
    fn an_unreachable_store_counts_as_failing_until_reached_again() {
        let commits = Commits::new(PathBuf::from("/nowhere"));
        assert!(commits.health().failure.is_none());
        commits.unreachable("connection refused".into());
        let since = commits.health().failing_since.expect("failing");
        commits.unreachable("still refused".into());
        let health = commits.health();
        assert_eq!(health.failure.as_deref(), Some("still refused"));
        assert_eq!(
            health.failing,
            Some(Failing::Ownership),
            "nothing failed to commit: the ownership did"
        );
        assert_eq!(
            Failing::Ownership.for_seconds(3),
            "could not be reached for the accounts' ownership for 3 s"
        );
        assert_eq!(health.failing_since, Some(since), "since the first failure");
        assert!(commits.is_unreachable());
        commits.reachable();
        assert!(commits.health().failure.is_none());
        assert!(commits.health().failing_since.is_none());
        assert!(commits.health().failing.is_none());
    }

    #[test]
    fn acks_wait_for_a_failing_store_or_a_large_backlog() {
        let mut gate = AckGate::default();
        let healthy = Progress {
            committed: 0,
            failing: false,
        };
        let queued = |ticket, bytes| Some(Queued { ticket, bytes });
        gate.batch(3, queued(1, 100));
        assert_eq!(
            gate.ready(&healthy, 100),
            Some(3),
            "a small backlog is acknowledged"
        );
        gate.batch(4, queued(2, 100));
        assert_eq!(
            gate.ready(&healthy, MAX_QUEUED_BYTES + 1),
            None,
            "all streams together over the bound: wait for the store"
        );
        gate.batch(5, queued(3, MAX_UNCOMMITTED_BYTES));
        assert_eq!(
            gate.ready(&healthy, 0),
            None,
            "over the bound: wait for the store"
        );
        let failing = Progress {
            committed: 2,
            failing: true,
        };
        assert_eq!(gate.ready(&failing, 0), None);
        let caught_up = Progress {
            committed: 3,
            failing: true,
        };
        assert_eq!(
            gate.ready(&caught_up, 0),
            Some(5),
            "committed: acknowledged even while later commits fail"
        );
        gate.batch(6, None);
        assert_eq!(gate.ready(&caught_up, 0), Some(6), "nothing queued");
        assert!(!gate.owes());
    }
}
