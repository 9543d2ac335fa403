//! Jittered exponential backoff, with grpc-go's semantics (as Armory's agent):
//! `base × multiplier^attempt`, capped at `max`, then spread by ± `jitter`.

use std::time::Duration;

use scale_agent_crds::agent_config;

/// Backoff settings and the number of attempts made so far.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    multiplier: f64,
    jitter: f64,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, multiplier: f64, jitter: f64, max: Duration) -> Self {
        Self {
            base,
            multiplier: if multiplier.is_finite() && multiplier >= 1.0 {
                multiplier
            } else {
                1.0
            },
            jitter: jitter.clamp(0.0, 1.0),
            max,
            attempt: 0,
        }
    }

    /// The config file's `clouddriver.backoff`.
    pub fn from_config(config: &agent_config::Backoff) -> Self {
        Self::new(
            config.base_delay,
            config.multiplier,
            config.jitter,
            config.max_delay,
        )
    }

    /// The backoff for retrying a failing watch or discovery: 1 s, ×2, 20 % jitter, 60 s cap.
    pub fn for_retries() -> Self {
        Self::new(Duration::from_secs(1), 2.0, 0.2, Duration::from_secs(60))
    }

    /// Attempts made since the last reset.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The next delay with a random jitter, counting one more attempt.
    pub fn next_delay(&mut self) -> Duration {
        let sample = rand::random::<f64>() * 2.0 - 1.0;
        self.next_delay_with(sample)
    }

    /// The next delay for a jitter `sample` in `[-1, 1]` (pure, for tests).
    pub fn next_delay_with(&mut self, sample: f64) -> Duration {
        let delay = delay_for(
            self.base,
            self.multiplier,
            self.jitter,
            self.max,
            self.attempt,
            sample,
        );
        self.attempt = self.attempt.saturating_add(1);
        delay
    }
}

/// The delay before retry number `attempt` (0-based): `base × multiplier^attempt` capped at
/// `max`, then multiplied by `1 + jitter × sample` (`sample` in `[-1, 1]`), never above `max`.
pub fn delay_for(
    base: Duration,
    multiplier: f64,
    jitter: f64,
    max: Duration,
    attempt: u32,
    sample: f64,
) -> Duration {
    let max_secs = max.as_secs_f64();
    let exponent = i32::try_from(attempt).unwrap_or(i32::MAX);
    let raw = base.as_secs_f64() * multiplier.powi(exponent);
    let capped = if raw.is_finite() {
        raw.min(max_secs)
    } else {
        max_secs
    };
    let jittered = capped * (1.0 + jitter * sample.clamp(-1.0, 1.0));
    Duration::from_secs_f64(jittered.clamp(0.0, max_secs.max(0.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(d: Duration) -> f64 {
        d.as_secs_f64()
    }

    #[test]
    fn grows_by_the_multiplier_and_stops_at_the_cap() {
        let mut backoff = Backoff::from_config(&agent_config::Backoff::default());
        let delays: Vec<f64> = (0..20)
            .map(|_| secs(backoff.next_delay_with(0.0)))
            .collect();
        assert!((delays[0] - 1.0).abs() < 1e-9);
        assert!((delays[1] - 1.6).abs() < 1e-9);
        assert!((delays[2] - 2.56).abs() < 1e-9);
        assert!((delays[19] - 120.0).abs() < 1e-9);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn jitter_spreads_within_bounds_and_never_exceeds_the_cap() {
        let base = Duration::from_secs(10);
        let max = Duration::from_secs(100);
        assert!((secs(delay_for(base, 1.6, 0.2, max, 0, -1.0)) - 8.0).abs() < 1e-9);
        assert!((secs(delay_for(base, 1.6, 0.2, max, 0, 1.0)) - 12.0).abs() < 1e-9);
        assert!(secs(delay_for(base, 1.6, 0.2, max, 50, 1.0)) <= 100.0);
        for _ in 0..100 {
            let mut backoff = Backoff::new(base, 1.6, 0.2, max);
            let d = secs(backoff.next_delay());
            assert!((8.0..=12.0).contains(&d), "{d}");
        }
    }

    #[test]
    fn reset_starts_over_and_huge_attempts_do_not_overflow() {
        let mut backoff = Backoff::new(Duration::from_secs(1), 2.0, 0.0, Duration::from_secs(60));
        for _ in 0..5000 {
            backoff.next_delay_with(0.0);
        }
        assert_eq!(backoff.next_delay_with(0.0), Duration::from_secs(60));
        backoff.reset();
        assert_eq!(backoff.attempt(), 0);
        assert_eq!(backoff.next_delay_with(0.0), Duration::from_secs(1));
    }
}
