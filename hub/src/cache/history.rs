//! The recent events of a kind's cluster-wide watch, in the order the agent delivered them:
//! what the proxy's watches are served from (many watchers, one agent stream). Bounded; a
//! snapshot that replaces the kind (a relist) starts a new generation, which ends the
//! watches of the old one.

use std::collections::VecDeque;

use bytes::Bytes;

/// Events kept per kind at most.
pub const MAX_EVENTS: usize = 4096;
/// Bytes of event objects kept per kind at most.
pub const MAX_BYTES: usize = 32 * 1024 * 1024;

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
#[derive(Clone, Debug, Default)]
pub struct History {
    /// Bumped whenever the events stop being one unbroken sequence (a relist, a dropped
    /// scope, an event that cannot be kept): watchers of an older generation end.
    pub generation: u64,
    /// Every event after this resourceVersion is in `events`; `None` while that is unknown
    /// (no cluster-wide watch synced yet).
    pub start: Option<u64>,
    pub events: VecDeque<HistoryEvent>,
    bytes: usize,
}

impl History {
    /// Starts over from `start` (a finished snapshot's resourceVersion, or `None`).
    pub fn reset(&mut self, start: Option<u64>) {
        self.generation += 1;
        self.start = start;
        self.events.clear();
        self.bytes = 0;
    }

    /// Appends an event of the cluster-wide watch; one that cannot be kept in order breaks
    /// the sequence.
    pub fn push(&mut self, event: HistoryEvent) {
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
        self.events.push_back(event);
        while self.events.len() > MAX_EVENTS || self.bytes > MAX_BYTES {
            let Some(old) = self.events.pop_front() else {
                break;
            };
            self.bytes -= old.bytes();
            self.start = Some(old.resource_version);
        }
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

    #[test]
    fn events_after_a_version_while_they_are_kept() {
        let mut h = History::default();
        h.push(ev(5, 1));
        assert!(h.since(0).is_none(), "unknown start: nothing to serve");
        h.reset(Some(10));
        let g = h.generation;
        h.push(ev(11, 1));
        h.push(ev(13, 1));
        let rvs = |h: &History, rv| {
            h.since(rv)
                .map(|i| i.map(|e| e.resource_version).collect::<Vec<_>>())
        };
        assert_eq!(rvs(&h, 10), Some(vec![11, 13]));
        assert_eq!(rvs(&h, 11), Some(vec![13]));
        assert_eq!(rvs(&h, 20), Some(vec![]));
        assert_eq!(rvs(&h, 9), None);
        for rv in 14..14 + MAX_EVENTS as u64 {
            h.push(ev(rv, 1));
        }
        assert_eq!(h.events.len(), MAX_EVENTS);
        assert_eq!(rvs(&h, 12), None, "dropped from the window: 410");
        assert!(rvs(&h, 13).is_some());
        assert_eq!(h.generation, g);
        // Out of order: the sequence is broken, watchers end.
        h.push(ev(5, 1));
        assert_ne!(h.generation, g);
        assert!(h.since(100).is_none());
    }

    #[test]
    fn bytes_are_bounded() {
        let mut h = History::default();
        h.reset(Some(1));
        h.push(ev(2, MAX_BYTES / 2));
        h.push(ev(3, MAX_BYTES / 2));
        h.push(ev(4, 10));
        assert_eq!(h.events.len(), 2);
        assert_eq!(h.start, Some(2));
    }
}
