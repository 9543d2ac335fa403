//! Measure 12's RSS trajectory: the hub's RSS sampled through the load, so that a long run
//! (the soak, `--fleet-seconds 1800`) says whether memory stays flat once warm: RSS at the
//! end of the warm-up (the first third of the window, or 10 minutes for windows of 30
//! minutes and more) and at the end, the growth between them in percent (issue 26's goal:
//! under 2 % over the last 20 minutes), its slope, and beside RSS what the hub says it holds
//! that may grow (watch histories, cached objects), so that growth can be told apart.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::{
    env::HubProc,
    procs::{metric_sum, proc_stats},
    report::mib,
};

/// RSS is read from `/proc` this often (cheap).
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// The hub's metrics are read with every this many RSS samples (a request through TLS), and
/// at the end of the warm-up and of the load.
const METRICS_EVERY: usize = 12;
/// The warm-up of windows this long or longer: the last 20 minutes of a 30-minute
/// soak.
const LONG_WINDOW: Duration = Duration::from_secs(30 * 60);
const LONG_WARM_UP: Duration = Duration::from_secs(10 * 60);
/// Samples kept in the JSON apart from the warm-up's and the end's: about one a minute.
const JSON_EVERY: Duration = Duration::from_secs(60);

/// One reading of the hub.
#[derive(Clone, Debug, Default)]
pub(super) struct Sample {
    /// Seconds since the load started.
    pub(super) seconds: f64,
    pub(super) rss_kib: u64,
    pub(super) rss_anon_kib: u64,
    /// `scale_agent_hub_watch_history_bytes`, `scale_agent_hub_cached_object_bytes` and
    /// `scale_agent_hub_objects_cached`, when the metrics were read with this sample.
    pub(super) held: Option<Held>,
}

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Held {
    pub(super) watch_history_bytes: f64,
    pub(super) cached_object_bytes: f64,
    pub(super) objects_cached: f64,
}

/// The samples of one load.
#[derive(Debug, Default)]
pub(super) struct Trajectory {
    pub(super) samples: Vec<Sample>,
    pub(super) warm_up: Duration,
}

/// Where the warm-up of a load of `window` ends.
pub(super) fn warm_up(window: Duration) -> Duration {
    if window >= LONG_WINDOW {
        LONG_WARM_UP
    } else {
        window / 3
    }
}

async fn read(hub: &HubProc, started: Instant, with_metrics: bool) -> Option<Sample> {
    let stats = proc_stats(hub.pid()).ok()?;
    let held = if with_metrics {
        hub.metrics().await.ok().map(|m| Held {
            watch_history_bytes: metric_sum(&m, "scale_agent_hub_watch_history_bytes", &[]),
            cached_object_bytes: metric_sum(&m, "scale_agent_hub_cached_object_bytes", &[]),
            objects_cached: metric_sum(&m, "scale_agent_hub_objects_cached", &[]),
        })
    } else {
        None
    };
    Some(Sample {
        seconds: started.elapsed().as_secs_f64(),
        rss_kib: stats.rss_kib,
        rss_anon_kib: stats.rss_anon_kib,
        held,
    })
}

/// Samples `hub` from now (the load's start) until `done` turns true, then once more.
pub(super) async fn sample(
    hub: &HubProc,
    window: Duration,
    mut done: watch::Receiver<bool>,
) -> Trajectory {
    let started = Instant::now();
    let warm_up = warm_up(window);
    let mut trajectory = Trajectory {
        samples: Vec::new(),
        warm_up,
    };
    let mut warm_read = false;
    for i in 0usize.. {
        let past_warm_up = !warm_read && started.elapsed() >= warm_up;
        warm_read |= past_warm_up;
        if let Some(s) = read(hub, started, i % METRICS_EVERY == 0 || past_warm_up).await {
            trajectory.samples.push(s);
        }
        let next = started + SAMPLE_EVERY * (i as u32 + 1);
        tokio::select! {
            () = tokio::time::sleep_until(next.into()) => {}
            _ = done.wait_for(|d| *d) => break,
        }
    }
    if let Some(s) = read(hub, started, true).await {
        trajectory.samples.push(s);
    }
    trajectory
}

impl Trajectory {
    pub(super) fn peak_kib(&self) -> u64 {
        self.samples.iter().map(|s| s.rss_kib).max().unwrap_or(0)
    }

    /// The first sample at or past the warm-up's end (the end's when the load was shorter).
    pub(super) fn warm(&self) -> Option<&Sample> {
        let warm_up = self.warm_up.as_secs_f64();
        self.samples
            .iter()
            .find(|s| s.seconds >= warm_up)
            .or(self.samples.last())
    }

    pub(super) fn end(&self) -> Option<&Sample> {
        self.samples.last()
    }

    /// RSS growth from the warm-up's end to the end, percent of the warm-up's.
    pub(super) fn growth_percent(&self) -> Option<f64> {
        let (warm, end) = (self.warm()?, self.end()?);
        (warm.rss_kib > 0)
            .then(|| (end.rss_kib as f64 - warm.rss_kib as f64) / warm.rss_kib as f64 * 100.0)
    }

    /// Least-squares slope of RSS over the samples from the warm-up's end on, MiB per minute.
    pub(super) fn slope_mib_per_minute(&self) -> Option<f64> {
        let warm = self.warm()?.seconds;
        let points: Vec<(f64, f64)> = self
            .samples
            .iter()
            .filter(|s| s.seconds >= warm)
            .map(|s| (s.seconds / 60.0, s.rss_kib as f64 / 1024.0))
            .collect();
        let n = points.len() as f64;
        if points.len() < 2 {
            return None;
        }
        let (mx, my) = (
            points.iter().map(|p| p.0).sum::<f64>() / n,
            points.iter().map(|p| p.1).sum::<f64>() / n,
        );
        let var: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let cov: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        (var > 0.0).then(|| cov / var)
    }

    /// The last sample with the hub's metrics at or before `sample`'s time.
    fn held_by(&self, sample: &Sample) -> Option<Held> {
        self.samples
            .iter()
            .filter(|s| s.seconds <= sample.seconds)
            .filter_map(|s| s.held)
            .next_back()
    }

    /// The sentence for the memory row's note.
    pub(super) fn text(&self) -> String {
        let (Some(warm), Some(end)) = (self.warm(), self.end()) else {
            return "no RSS sample during the load".into();
        };
        let mut text = format!(
            "RSS during the load (every {} s): {} at the warm-up's end ({:.0} s in), {} at the end ({:.0} s): {:+.2} % over the last {:.0} s (goal: under 2 % over a soak's last 20 min), slope {:+.2} MiB/min; peak {}",
            SAMPLE_EVERY.as_secs(),
            mib(warm.rss_kib),
            warm.seconds,
            mib(end.rss_kib),
            end.seconds,
            self.growth_percent().unwrap_or(0.0),
            end.seconds - warm.seconds,
            self.slope_mib_per_minute().unwrap_or(0.0),
            mib(self.peak_kib()),
        );
        if let (Some(a), Some(b)) = (self.held_by(warm), self.held_by(end)) {
            text.push_str(&format!(
                "; over the same span the watch histories went from {} to {}, the cached objects' bytes from {} to {} ({} to {} objects)",
                mib_of(a.watch_history_bytes),
                mib_of(b.watch_history_bytes),
                mib_of(a.cached_object_bytes),
                mib_of(b.cached_object_bytes),
                a.objects_cached,
                b.objects_cached,
            ));
        }
        text
    }

    /// The JSON: the warm-up's and the end's figures, and about one sample a minute.
    pub(super) fn values(&self) -> Value {
        let warm_seconds = self.warm().map_or(0.0, |s| s.seconds);
        let mut next = 0.0;
        let last = self.samples.len().saturating_sub(1);
        let kept: Vec<Value> = self
            .samples
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                let keep = s.seconds >= next || s.seconds == warm_seconds || *i == last;
                if s.seconds >= next {
                    next = s.seconds + JSON_EVERY.as_secs_f64();
                }
                keep
            })
            .map(|(_, s)| sample_json(s))
            .collect();
        json!({
            "warm_up_seconds": self.warm_up.as_secs_f64(),
            "warm": self.warm().map(sample_json),
            "end": self.end().map(sample_json),
            "growth_percent": self.growth_percent(),
            "slope_mib_per_minute": self.slope_mib_per_minute(),
            "peak_kib": self.peak_kib(),
            "samples_taken": self.samples.len(),
            "samples": kept,
        })
    }
}

fn mib_of(bytes: f64) -> String {
    mib((bytes / 1024.0) as u64)
}

fn sample_json(s: &Sample) -> Value {
    let mut v = json!({
        "seconds": s.seconds,
        "hub_rss_kib": s.rss_kib,
        "hub_rss_anon_kib": s.rss_anon_kib,
    });
    if let Some(h) = s.held {
        v["watch_history_bytes"] = json!(h.watch_history_bytes);
        v["cached_object_bytes"] = json!(h.cached_object_bytes);
        v["objects_cached"] = json!(h.objects_cached);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trajectory(points: &[(f64, u64)], warm_up: Duration) -> Trajectory {
        Trajectory {
            samples: points
                .iter()
                .map(|&(seconds, rss_kib)| Sample {
                    seconds,
                    rss_kib,
                    ..Sample::default()
                })
                .collect(),
            warm_up,
        }
    }

    #[test]
    fn the_warm_up_is_a_third_of_the_window_or_ten_minutes_of_a_soak() {
        assert_eq!(warm_up(Duration::from_secs(60)), Duration::from_secs(20));
        assert_eq!(warm_up(Duration::from_secs(1800)), Duration::from_secs(600));
        assert_eq!(warm_up(Duration::from_secs(3600)), Duration::from_secs(600));
    }

    #[test]
    fn growth_and_slope_count_from_the_first_sample_past_the_warm_up() {
        // 1,000 MiB until 20 s in, then 1 MiB more a minute (every 30 s half of one).
        let points: Vec<(f64, u64)> = (0..=10)
            .map(|i| {
                let seconds = f64::from(i) * 30.0;
                let rss = if seconds < 20.0 {
                    1000 * 1024
                } else {
                    1000 * 1024 + (seconds / 60.0 * 1024.0) as u64
                };
                (seconds, rss)
            })
            .collect();
        let t = trajectory(&points, Duration::from_secs(20));
        let warm = t.warm().unwrap();
        assert_eq!(warm.seconds, 30.0);
        assert_eq!(t.end().unwrap().seconds, 300.0);
        // 1000.5 MiB at 30 s, 1005 MiB at 300 s.
        let growth = t.growth_percent().unwrap();
        assert!((growth - 4.5 / 1000.5 * 100.0).abs() < 1e-9, "{growth}");
        let slope = t.slope_mib_per_minute().unwrap();
        assert!((slope - 1.0).abs() < 1e-9, "{slope}");
        assert_eq!(t.peak_kib(), 1005 * 1024);
    }

    #[test]
    fn a_load_shorter_than_its_warm_up_reports_no_growth_and_the_json_keeps_a_sample_a_minute() {
        let t = trajectory(&[(0.0, 100), (5.0, 120)], Duration::from_secs(600));
        assert_eq!(t.warm().unwrap().seconds, 5.0);
        assert_eq!(t.growth_percent(), Some(0.0));
        assert_eq!(t.slope_mib_per_minute(), None);
        let points: Vec<(f64, u64)> = (0..=360).map(|i| (f64::from(i) * 5.0, 1024)).collect();
        let long = trajectory(&points, Duration::from_secs(600));
        let v = long.values();
        let kept = v["samples"].as_array().unwrap();
        // One a minute over 30 minutes, the first and the last: 31.
        assert_eq!(kept.len(), 31, "{v}");
        assert_eq!(v["warm"]["seconds"], 600.0);
        assert_eq!(v["growth_percent"], 0.0);
    }
}
