//! [`Hearing`]: when a stream last heard from its agent, shared between the stream's loop
//! (which notes every message) and whoever must not trust a silent stream: the proxy flags
//! the reads of an account whose streaming agent went silent, as a replica cut off from its
//! agents by a silent network partition would otherwise answer from a cache that stopped
//! moving, as fresh, until the stream's two periods of silence end it.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// An agent that sends nothing for this many heartbeat periods (a half period late) is
/// silent: its heartbeat is overdue, although the stream is not ended yet (that takes two).
const SILENT_AFTER_PERIODS: f64 = 1.5;

/// When one stream last heard from its agent.
#[derive(Debug)]
pub struct Hearing {
    started: Instant,
    /// Milliseconds after `started` of the agent's last message.
    last_ms: AtomicU64,
    /// The heartbeat period granted to the stream.
    period: Duration,
}

impl Hearing {
    /// A stream that just heard Hello, with the heartbeat period it was granted.
    pub fn new(period: Duration) -> Self {
        Hearing {
            started: Instant::now(),
            last_ms: AtomicU64::new(0),
            period,
        }
    }

    /// A message arrived.
    pub fn heard(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// When the agent's last message arrived.
    pub fn last_heard(&self) -> Instant {
        self.started + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// The heartbeat period granted to the stream.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Since when the agent has been silent, when its heartbeat is overdue by half a
    /// period or more.
    pub fn silent_since(&self) -> Option<Instant> {
        let last = self.last_heard();
        (last.elapsed() > self.period.mul_f64(SILENT_AFTER_PERIODS)).then_some(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silent_once_the_heartbeat_is_half_a_period_late() {
        let hearing = Hearing::new(Duration::from_millis(40));
        hearing.heard();
        assert_eq!(hearing.silent_since(), None);
        std::thread::sleep(Duration::from_millis(70));
        let since = hearing.silent_since().expect("silent after 1.75 periods");
        assert!(since.elapsed() >= Duration::from_millis(70));
        hearing.heard();
        assert_eq!(hearing.silent_since(), None, "a message ends the silence");
    }
}
