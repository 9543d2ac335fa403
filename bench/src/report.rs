//! The result of a run: machine details, one row per measure (this system and its
//! baseline side by side), rendered as a Markdown table and as JSON.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

/// Where the figures were measured.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
    /// `release` or `debug` (figures from a debug build are not representative).
    pub build_profile: String,
    pub kubernetes_version: String,
    /// UTC start time of the run.
    pub started_at: String,
}

impl Machine {
    pub fn detect(kubernetes_version: String) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|rest| rest.split_once(':'))
            .map(|(_, m)| m.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Self {
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            cpu_model,
            memory_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel,
            build_profile: build_profile().into(),
            kubernetes_version,
            started_at: utc_now(),
        }
    }
}

/// The profile this executable was built with.
pub fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ`, now.
pub fn utc_now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// One line of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Stable identifier (`latency-watch`, `sync-1000`, ...).
    pub id: String,
    /// Which of the seven measures of issue 6 (1 to 7).
    pub measure: u8,
    pub title: String,
    /// This system's figure.
    pub system: String,
    /// What the baseline is.
    pub baseline_name: String,
    /// The baseline's figure, measured in the same run.
    pub baseline: String,
    pub note: String,
    /// The numbers behind the figures.
    pub values: Value,
}

/// A whole run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub settings: Value,
    pub rows: Vec<Row>,
    /// The biggest bottleneck seen in this run, in a sentence.
    pub bottleneck: String,
    pub wall_seconds: f64,
}

impl Report {
    /// The rows as a Markdown table with a header naming the machine.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Scale Agent benchmark, {} build{} | Kubernetes {} | {} CPUs ({}) | {} GiB RAM | Linux {} | {}",
            m.build_profile,
            if m.build_profile == "debug" {
                " (NOT REPRESENTATIVE: run with `cargo run --release -p scale-agent-bench`)"
            } else {
                ""
            },
            m.kubernetes_version,
            m.cpus,
            m.cpu_model,
            m.memory_gib,
            m.kernel,
            m.started_at
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| # | Measure | Scale Agent | Baseline | Baseline figure | Notes |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|");
        for r in &self.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                r.measure,
                cell(&r.title),
                cell(&r.system),
                cell(&r.baseline_name),
                cell(&r.baseline),
                cell(&r.note)
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "Bottleneck: {}", self.bottleneck);
        let _ = writeln!(out, "Run took {:.0} s.", self.wall_seconds);
        out
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Percentiles of a sample (nearest rank); empty samples give zeros.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |p: f64| {
            let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
            v[rank.clamp(1, v.len()) - 1]
        };
        Self {
            count: v.len(),
            p50: at(50.0),
            p95: at(95.0),
            p99: at(99.0),
            max: v[v.len() - 1],
        }
    }

    /// `p50 / p95 / p99` in milliseconds, or seconds when large.
    pub fn display_ms(&self) -> String {
        format!(
            "p50 {} / p95 {} / p99 {}",
            ms(self.p50),
            ms(self.p95),
            ms(self.p99)
        )
    }
}

/// Milliseconds given in milliseconds, shown in a readable unit.
pub fn ms(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} s", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

/// Seconds in a readable unit.
pub fn secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

/// KiB as MiB.
pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Bytes in a readable unit.
pub fn bytes(b: f64) -> String {
    if b >= 10.0 * 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1024.0 / 1024.0)
    } else if b >= 10.0 * 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&v);
        assert_eq!((p.p50, p.p95, p.p99, p.max), (50.0, 95.0, 99.0, 100.0));
        assert_eq!(Percentiles::of(&[]).count, 0);
    }

    #[test]
    fn utc_now_is_iso() {
        let s = utc_now();
        assert_eq!(s.len(), 20, "{s}");
        assert!(s.starts_with("20") && s.ends_with('Z'), "{s}");
    }
}
