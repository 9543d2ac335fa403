//! The recent events of a kind's cluster-wide watch, in the order the agent delivered them:
//! what the proxy's watches are served from (many watchers, one agent stream). Bounded per
//! kind, and all of a hub's histories together by a [`HistoryBudget`]; a snapshot that
//! replaces the kind (a relist) starts a new generation, which ends the watches of the old
//! one.

use std::{
    collections::VecDeque,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
};

use bytes::Bytes;

/// Events kept per kind at most.
pub const MAX_EVENTS: usize = 4096;
/// Bytes of event objects kept per kind at most.
pub const MAX_BYTES: usize = 32 * 1024 * 1024;
/// Events a history keeps however far the hub-wide budget is exceeded: its newest ones, so
/// that watchers keeping up with the kind are not ended at every event.
pub const MIN_EVENTS: usize = 16;
/// The hub-wide budget by default (`--watch-history-mib`).
pub const DEFAULT_BUDGET_BYTES: usize = 256 * 1024 * 1024;

/// The bytes of event objects held by all the histories of a hub, against a hub-wide limit
/// (shared: every clone counts the same bytes). A history that takes the total past the
/// limit drops its own oldest events, down to [`MIN_EVENTS`].
#[derive(Clone, Debug)]
pub struct HistoryBudget {
    inner: Arc<BudgetInner>,
}

#[derive(Debug)]
struct BudgetInner {
    limit: usize,
    held: AtomicUsize,
    evicted: AtomicU64,
}

impl Default for HistoryBudget {
    fn default() -> Self {
        HistoryBudget::new(DEFAULT_BUDGET_BYTES)
    }
}

impl HistoryBudget {
    /// A budget of `limit` bytes; 0 means none (the per-kind limits only).
    pub fn new(limit: usize) -> Self {
        HistoryBudget {
            inner: Arc::new(BudgetInner {
                limit: if limit == 0 { usize::MAX } else { limit },
                held: AtomicUsize::new(0),
                evicted: AtomicU64::new(0),
            }),
        }
    }

    /// Bytes held by all the histories now.
    pub fn held(&self) -> usize {
        self.inner.held.load(Ordering::Relaxed)
    }

    /// The limit (`usize::MAX` for none).
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// Events dropped because of the budget (not of the per-kind limits) so far.
    pub fn evicted(&self) -> u64 {
        self.inner.evicted.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.held() > self.inner.limit
    }

    fn hold(&self, bytes: usize) {
        self.inner.held.fetch_add(bytes, Ordering::Relaxed);
    }

    fn release(&self, bytes: usize) {
        self.inner.held.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn same(&self, other: &HistoryBudget) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// A watch event's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One event of the kind's watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEvent {
    pub resource_version: u64,
    pub event_type: EventType,
    pub namespace: String,
    /// The object as the event carries it.
    pub json: Bytes,
    /// The object as the cache held it before (for selectors: a watcher whose selector the
    /// change moves the object into sees ADDED, out of, DELETED).
    pub previous: Option<Bytes>,
}

impl HistoryEvent {
    fn bytes(&self) -> usize {
        self.json.len() + self.previous.as_ref().map_or(0, Bytes::len)
    }
}

/// The kind's recent events: complete for every resourceVersion after `start`.
#[derive(Debug, Default)]
pub struct History {
    /// Bumped whenever the events stop being one unbroken sequence (a relist, a dropped
    /// scope, an event that cannot be kept): watchers of an older generation end.
    pub generation: u64,
    /// Every event after this resourceVersion is in `events`; `None` while that is unknown
    /// (no cluster-wide watch synced yet).
    pub start: Option<u64>,
    pub events: VecDeque<HistoryEvent>,
    bytes: usize,
    /// The budget `bytes` are counted in (that of the last push).
    budget: Option<HistoryBudget>,
}

/// A copy counts in no budget until it is pushed to (its events' bytes are shared).
impl Clone for History {
    fn clone(&self) -> Self {
        History {
            generation: self.generation,
            start: self.start,
            events: self.events.clone(),
            bytes: self.bytes,
            budget: None,
        }
    }
}

/// A history dropped (its account or kind forgotten) gives its bytes back.
impl Drop for History {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.release(self.bytes);
        }
    }
}

impl History {
    /// Starts over from `start` (a finished snapshot's resourceVersion, or `None`).
    pub fn reset(&mut self, start: Option<u64>) {
        self.generation += 1;
        self.start = start;
        self.events.clear();
        if let Some(budget) = &self.budget {
            budget.release(self.bytes);
        }
        self.bytes = 0;
    }

    /// Counts this history's bytes in `budget` (moved from another one's).
    fn attach(&mut self, budget: &HistoryBudget) {
        if self.budget.as_ref().is_some_and(|b| b.same(budget)) {
            return;
        }
        if let Some(old) = self.budget.take() {
            old.release(self.bytes);
        }
        budget.hold(self.bytes);
        self.budget = Some(budget.clone());
    }

    /// Appends an event of the cluster-wide watch; one that cannot be kept in order breaks
    /// the sequence. Past the per-kind limits, or with `budget` exceeded (down to
    /// [`MIN_EVENTS`]), the oldest events are dropped: `start` moves past them.
    pub fn push(&mut self, event: HistoryEvent, budget: &HistoryBudget) {
        self.attach(budget);
        let last = self
            .events
            .back()
            .map(|e| e.resource_version)
            .or(self.start);
        if self.start.is_none() || last.is_some_and(|l| event.resource_version <= l) {
            self.reset(None);
            return;
        }
        self.bytes += event.bytes();
        budget.hold(event.bytes());
        self.events.push_back(event);
        loop {
            let per_kind = self.events.len() > MAX_EVENTS || self.bytes > MAX_BYTES;
            let hub_wide = budget.over() && self.events.len() > MIN_EVENTS;
            if !per_kind && !hub_wide {
                break;
            }
            let Some(old) = self.events.pop_front() else {
                break;
            };
            self.bytes -= old.bytes();
            budget.release(old.bytes());
            if !per_kind {
                budget.inner.evicted.fetch_add(1, Ordering::Relaxed);
            }
            self.start = Some(old.resource_version);
        }
    }

    /// Bytes of event objects held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The events after `rv`, or `None` when some of them are no longer kept.
    pub fn since(&self, rv: u64) -> Option<impl Iterator<Item = &HistoryEvent>> {
        let start = self.start?;
        if rv < start {
            return None;
        }
        let from = self.events.partition_point(|e| e.resource_version <= rv);
        Some(self.events.range(from..))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(rv: u64, size: usize) -> HistoryEvent {
        HistoryEvent {
            resource_version: rv,
            event_type: EventType::Modified,
            namespace: "ns".into(),
            json: Bytes::from(vec![b'x'; size]),
            previous: None,
        }
    }

    impl History {
        fn push_unbounded(&mut self, event: HistoryEvent) {
            self.push(event, &HistoryBudget::new(0));
        }
    }

    #[test]
    fn events_after_a_version_while_they_are_kept() {
        let mut h = History::default();
        h.push_unbounded(ev(5, 1));
        assert!(h.since(0).is_none(), "unknown start: nothing to serve");
        h.reset(Some(10));
        let g = h.generation;
        h.push_unbounded(ev(11, 1));
        h.push_unbounded(ev(13, 1));
        let rvs = |h: &History, rv| {
            h.since(rv)
                .map(|i| i.map(|e| e.resource_version).collect::<Vec<_>>())
        };
        assert_eq!(rvs(&h, 10), Some(vec![11, 13]));
        assert_eq!(rvs(&h, 11), Some(vec![13]));
        assert_eq!(rvs(&h, 20), Some(vec![]));
        assert_eq!(rvs(&h, 9), None);
        for rv in 14..14 + MAX_EVENTS as u64 {
            h.push_unbounded(ev(rv, 1));
        }
        assert_eq!(h.events.len(), MAX_EVENTS);
        assert_eq!(rvs(&h, 12), None, "dropped from the window: 410");
        assert!(rvs(&h, 13).is_some());
        assert_eq!(h.generation, g);
        // Out of order: the sequence is broken, watchers end.
        h.push_unbounded(ev(5, 1));
        assert_ne!(h.generation, g);
        assert!(h.since(100).is_none());
    }

    #[test]
    fn bytes_are_bounded() {
        let mut h = History::default();
        h.reset(Some(1));
        h.push_unbounded(ev(2, MAX_BYTES / 2));
        h.push_unbounded(ev(3, MAX_BYTES / 2));
        h.push_unbounded(ev(4, 10));
        assert_eq!(h.events.len(), 2);
        assert_eq!(h.start, Some(2));
    }

    /// Histories each pushed to in turn: the total never exceeds the hub-wide budget once
    /// every history holds more than its floor, each keeps its newest events in order, and
    /// a watcher from before a history's new start is told it is too old.
    #[test]
    fn histories_together_stay_within_the_budget() {
        const SIZE: usize = 1000;
        const HISTORIES: usize = 10;
        let budget = HistoryBudget::new(400 * SIZE);
        let mut histories: Vec<History> = (0..HISTORIES).map(|_| History::default()).collect();
        for h in &mut histories {
            h.reset(Some(0));
        }
        let generations: Vec<u64> = histories.iter().map(|h| h.generation).collect();
        for rv in 1..=2000u64 {
            for (i, h) in histories.iter_mut().enumerate() {
                h.push(ev(rv, SIZE + i), &budget);
                assert!(
                    budget.held() <= budget.limit() || h.events.len() <= MIN_EVENTS,
                    "over the budget with {} events kept",
                    h.events.len()
                );
            }
            let held: usize = histories.iter().map(History::bytes).sum();
            assert_eq!(budget.held(), held);
            assert!(held <= budget.limit(), "{held} bytes held");
        }
        for (h, g) in histories.iter().zip(&generations) {
            assert_eq!(h.generation, *g, "trimming is no relist");
            let start = h.start.unwrap();
            assert!(h.events.len() > MIN_EVENTS && start > 1900, "start {start}");
            assert!(h.since(start - 1).is_none(), "behind the window: 410");
            let kept: Vec<u64> = h
                .since(start)
                .unwrap()
                .map(|e| e.resource_version)
                .collect();
            assert_eq!(kept, (start + 1..=2000).collect::<Vec<_>>());
        }
        assert!(budget.evicted() > 0);
    }

    /// One history over the budget by itself keeps its newest events (the floor): the
    /// total exceeds the budget by at most those.
    #[test]
    fn a_history_keeps_its_newest_events_past_the_budget() {
        let budget = HistoryBudget::new(10);
        let mut h = History::default();
        h.reset(Some(0));
        for rv in 1..=100 {
            h.push(ev(rv, 100), &budget);
        }
        assert_eq!(h.events.len(), MIN_EVENTS);
        assert_eq!(budget.held(), MIN_EVENTS * 100);
        assert_eq!(h.start, Some(100 - MIN_EVENTS as u64));
        assert_eq!(budget.evicted(), 100 - MIN_EVENTS as u64);
    }

    /// Bytes come back when a history is reset or dropped; a copy counts in no budget.
    #[test]
    fn dropped_and_reset_histories_give_their_bytes_back() {
        let budget = HistoryBudget::new(0);
        let mut a = History::default();
        let mut b = History::default();
        a.reset(Some(0));
        b.reset(Some(0));
        a.push(ev(1, 10), &budget);
        a.push(ev(2, 20), &budget);
        b.push(ev(1, 5), &budget);
        assert_eq!(budget.held(), 35);
        let copy = a.clone();
        assert_eq!(budget.held(), 35);
        drop(copy);
        assert_eq!(budget.held(), 35);
        a.reset(Some(5));
        assert_eq!(budget.held(), 5);
        a.push(ev(6, 7), &budget);
        drop(a);
        assert_eq!(budget.held(), 5);
        // Out of order: the history starts over, empty.
        b.push(ev(1, 3), &budget);
        assert_eq!(budget.held(), 0);
        // A history moved to another budget takes its bytes along.
        let other = HistoryBudget::new(0);
        b.reset(Some(0));
        b.push(ev(1, 4), &budget);
        b.push(ev(2, 4), &other);
        assert_eq!((budget.held(), other.held()), (0, 8));
    }
}
