//! What each agent identity holds on this hub across all its streams (review F14): how many
//! streams it has open (`--max-streams-per-identity`) and how many bytes their open
//! snapshots stage (`--max-staged-bytes`). Replica names are the agent's to choose, so a
//! bound per stream is no bound on one identity: an identity opening streams without end,
//! or staging the stream limit on each, would grow the hub's memory until it is killed.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

/// The identities with a stream open on this hub, and what they hold (one per hub, in
/// [`crate::Live`]).
#[derive(Debug, Default)]
pub struct IdentityUse {
    identities: Mutex<HashMap<String, Arc<Held>>>,
}

/// What one identity's streams hold together.
#[derive(Debug, Default)]
struct Held {
    /// Open streams (changed under [`IdentityUse::identities`]' lock only).
    streams: AtomicU64,
    /// Bytes staged in the open snapshots of all the streams.
    staged_bytes: AtomicU64,
}

/// Why a stream was refused: the identity has `open` streams, `max` allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManyStreams {
    pub open: u64,
    pub max: u64,
}

impl IdentityUse {
    /// A place for one more stream of `identity`, unless it has `max` open already (0: no
    /// limit). The place is given back when the returned share is dropped.
    pub fn join(self: &Arc<Self>, identity: &str, max: u64) -> Result<StreamShare, TooManyStreams> {
        let mut identities = self.lock();
        let held = identities.entry(identity.to_string()).or_default().clone();
        let open = held.streams.load(Ordering::Relaxed);
        if max > 0 && open >= max {
            return Err(TooManyStreams { open, max });
        }
        held.streams.fetch_add(1, Ordering::Relaxed);
        Ok(StreamShare {
            book: self.clone(),
            identity: identity.to_string(),
            held,
            staged: 0,
        })
    }

    /// The streams `identity` has open here.
    pub fn streams(&self, identity: &str) -> u64 {
        self.lock()
            .get(identity)
            .map_or(0, |held| held.streams.load(Ordering::Relaxed))
    }

    /// The bytes the open snapshots of `identity`'s streams stage together.
    pub fn staged_bytes(&self, identity: &str) -> u64 {
        self.lock()
            .get(identity)
            .map_or(0, |held| held.staged_bytes.load(Ordering::Relaxed))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Held>>> {
        // A panic elsewhere while holding the lock leaves counters that are still counters.
        self.identities
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One stream's place among its identity's streams, and its part of their staged bytes.
#[derive(Debug)]
pub struct StreamShare {
    book: Arc<IdentityUse>,
    identity: String,
    held: Arc<Held>,
    /// What this stream has said it stages ([`StreamShare::set_staged`]).
    staged: u64,
}

impl StreamShare {
    /// This stream now stages `bytes` in all its open snapshots.
    pub fn set_staged(&mut self, bytes: u64) {
        if bytes >= self.staged {
            self.held
                .staged_bytes
                .fetch_add(bytes - self.staged, Ordering::Relaxed);
        } else {
            self.held
                .staged_bytes
                .fetch_sub(self.staged - bytes, Ordering::Relaxed);
        }
        self.staged = bytes;
    }

    /// What the identity's other streams stage.
    pub fn others_staged(&self) -> u64 {
        self.held
            .staged_bytes
            .load(Ordering::Relaxed)
            .saturating_sub(self.staged)
    }

    /// The identity's open streams, this one included.
    pub fn streams(&self) -> u64 {
        self.held.streams.load(Ordering::Relaxed)
    }
}

impl Drop for StreamShare {
    /// The stream ended: its staged bytes and its place go back.
    fn drop(&mut self) {
        self.set_staged(0);
        let mut identities = self.book.lock();
        if self.held.streams.fetch_sub(1, Ordering::Relaxed) == 1 {
            identities.remove(&self.identity);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_counted_per_identity_and_given_back() {
        let book = Arc::new(IdentityUse::default());
        let a1 = book.join("a", 2).unwrap();
        let mut a2 = book.join("a", 2).unwrap();
        assert_eq!(
            book.join("a", 2).unwrap_err(),
            TooManyStreams { open: 2, max: 2 }
        );
        let b = book.join("b", 2).unwrap();
        assert_eq!((book.streams("a"), book.streams("b")), (2, 1));

        a2.set_staged(100);
        assert_eq!(a1.others_staged(), 100);
        assert_eq!(a2.others_staged(), 0);
        a2.set_staged(40);
        assert_eq!(book.staged_bytes("a"), 40);
        assert_eq!(b.others_staged(), 0);
        drop(a2);
        assert_eq!((book.streams("a"), book.staged_bytes("a")), (1, 0));
        let _a3 = book.join("a", 2).unwrap();
        drop(a1);
        drop(b);
        assert_eq!(book.streams("b"), 0);
        assert!(book.join("c", 0).is_ok(), "0: no limit");
    }
}
