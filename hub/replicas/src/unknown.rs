//! What a credential nobody knows may cost the shared store (review F10). A replica looks a
//! proxy, API or agent token it does not know up in PostgreSQL before refusing it, so that
//! one issued on another replica works at once ([`crate::sync::learn_token`]); but anyone
//! who reaches the HTTP or gRPC port can present random `sat_…`/`saa_…` tokens, each one a
//! database query. Two bounds, for unknown credentials only (a known one is never held up):
//! - a **negative cache**: a hash that was not in the store is not looked up again for a
//!   sync period (the refresh brings a token issued since, within that period anyway);
//! - a **hub-wide rate** of lookups ([`LOOKUPS_PER_SECOND`], burst [`BURST`]): past it an
//!   unknown credential is refused without a lookup, and is known here from the next
//!   refresh if it was real. Logged at most once a second.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

/// Store lookups of unknown credentials per second, hub-wide (on each replica).
pub const LOOKUPS_PER_SECOND: f64 = 20.0;
/// Lookups allowed at once after a quiet period.
pub const BURST: f64 = 20.0;
/// Hashes remembered as unknown at most (random tokens must not grow memory).
const MAX_MISSES: usize = 10_000;

/// The guard of lookups of unknown credentials (one per replica).
#[derive(Debug)]
pub struct UnknownCredentials {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Hash → when the store said it did not hold it.
    misses: HashMap<String, Instant>,
    /// Lookups allowed now (a token bucket).
    allowance: f64,
    refilled: Instant,
    /// When a refusal was last logged.
    logged: Option<Instant>,
}

impl Default for UnknownCredentials {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                misses: HashMap::new(),
                allowance: BURST,
                refilled: Instant::now(),
                logged: None,
            }),
        }
    }
}

impl UnknownCredentials {
    /// Whether the credential with `hash` may be looked up in the store now: not when it
    /// was missing there within `remember` (the sync period), nor past the rate.
    pub fn may_look_up(&self, hash: &str, remember: Duration) -> bool {
        let now = Instant::now();
        let Ok(mut inner) = self.inner.lock() else {
            return false;
        };
        if inner
            .misses
            .get(hash)
            .is_some_and(|missed| now.duration_since(*missed) < remember)
        {
            return false;
        }
        let elapsed = now.duration_since(inner.refilled).as_secs_f64();
        inner.allowance = (inner.allowance + elapsed * LOOKUPS_PER_SECOND).min(BURST);
        inner.refilled = now;
        if inner.allowance < 1.0 {
            if inner
                .logged
                .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
            {
                inner.logged = Some(now);
                tracing::warn!(
                    rate = LOOKUPS_PER_SECOND,
                    "more unknown tokens than {LOOKUPS_PER_SECOND} a second: refused without a \
                     store lookup (a flood of guessed tokens?); a token issued on another \
                     replica works here from the next --replica-sync-period"
                );
            }
            return false;
        }
        inner.allowance -= 1.0;
        true
    }

    /// The store does not hold `hash`: remember it for a while.
    pub fn missed(&self, hash: &str, remember: Duration) {
        let now = Instant::now();
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if inner.misses.len() >= MAX_MISSES {
            inner
                .misses
                .retain(|_, missed| now.duration_since(*missed) < remember);
            if inner.misses.len() >= MAX_MISSES {
                inner.misses.clear();
            }
        }
        inner.misses.insert(hash.to_string(), now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_hash_is_not_looked_up_again_and_a_flood_is_capped() {
        let guard = UnknownCredentials::default();
        let remember = Duration::from_secs(60);
        assert!(guard.may_look_up("h0", remember));
        guard.missed("h0", remember);
        assert!(!guard.may_look_up("h0", remember), "negative cache");
        // A flood of distinct hashes: at most the burst (plus what refills meanwhile).
        let allowed = (1..1000)
            .filter(|i| guard.may_look_up(&format!("h{i}"), remember))
            .count();
        assert!(allowed < BURST as usize + 5, "{allowed}");
        // Forgotten after `remember`.
        guard.missed("h1", Duration::ZERO);
        std::thread::sleep(Duration::from_millis(1100));
        assert!(guard.may_look_up("h1", Duration::ZERO));
    }
}
