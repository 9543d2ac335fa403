//! Time helpers every layer of the hub uses: the clock pair, RFC 3339, durations as the
//! agent's config writes them, and the shutdown signal.

use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

/// Now, as a monotonic instant (for deadlines) and a wall-clock time (for what is shown).
pub fn now() -> (Instant, SystemTime) {
    (Instant::now(), SystemTime::now())
}

/// RFC 3339 in UTC, seconds precision.
pub fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|t| format!("{t:.0}"))
        .unwrap_or_default()
}

/// Parses a duration as the agent's config file takes one (`600s`, `10m`, `1h30m`, `250ms`,
/// the form Go and Kubernetes write), or a bare number of seconds (`600`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(seconds) = s.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    let parsed: jiff::SignedDuration = s.parse().map_err(|e| {
        format!("{s:?} is not a duration ({e}): write it like 600s, 10m, 1h30m or 250ms")
    })?;
    Duration::try_from(parsed).map_err(|_| format!("{s:?}: a duration cannot be negative"))
}

/// Resolves once shutdown is requested.
pub async fn shutting_down(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Runs `reload` every `period` (first at once) until shutdown, each run on the blocking
/// pool: the files the hub re-reads by content are read with blocking I/O, kept off the
/// runtime's workers.
pub async fn reload_every(
    period: std::time::Duration,
    shutdown: watch::Receiver<bool>,
    reload: impl Fn() + Clone + Send + 'static,
) {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = shutting_down(shutdown);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = interval.tick() => {
                let _ = tokio::task::spawn_blocking(reload.clone()).await;
            }
        }
    }
}
