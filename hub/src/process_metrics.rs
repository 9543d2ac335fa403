//! The hub process's own figures for an SRE sizing it: resident memory, CPU seconds, open
//! file descriptors and threads, read from `/proc/self` at each scrape (no crate of its own:
//! four small reads of procfs). On a system without procfs they stay 0.

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};
use std::sync::atomic::AtomicU64;

/// Clock ticks per second of `/proc/self/stat`'s utime and stime (`sysconf(_SC_CLK_TCK)`).
#[allow(unsafe_code)] // A call into libc.
fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions; a negative answer means unknown.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// The process gauges (cheap to clone: clones share their values).
#[derive(Clone, Debug, Default)]
pub struct ProcessMetrics {
    resident_memory_bytes: Gauge,
    cpu_seconds: Counter<f64, AtomicU64>,
    open_fds: Gauge,
    threads: Gauge,
}

/// What `/proc/self` says now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessSample {
    pub resident_memory_bytes: i64,
    pub cpu_seconds: f64,
    pub open_fds: i64,
    pub threads: i64,
}

impl ProcessSample {
    /// Reads `/proc/self`; a part that cannot be read is 0.
    pub fn read() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| -> i64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // The fields after the command name (which may hold spaces and parentheses):
        // state is field 3, utime 14 and stime 15.
        let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
        let fields: Vec<&str> = after.split_whitespace().collect();
        let tick = |i: usize| -> f64 {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count() as i64)
            .unwrap_or(0);
        ProcessSample {
            resident_memory_bytes: field("VmRSS:") * 1024,
            cpu_seconds: (tick(11) + tick(12)) / clock_ticks(),
            open_fds,
            threads: field("Threads:"),
        }
    }
}

impl ProcessMetrics {
    /// Adds the metrics to `registry` (the hub's, prefixed `scale_agent_hub`), as
    /// `process_resident_memory_bytes`, `process_cpu_seconds_total`, `process_open_fds` and
    /// `process_threads`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory of the hub process (VmRSS), bytes",
            self.resident_memory_bytes.clone(),
        );
        registry.register(
            "process_cpu_seconds",
            "User and system CPU seconds the hub process has used",
            self.cpu_seconds.clone(),
        );
        registry.register(
            "process_open_fds",
            "File descriptors the hub process has open (connections included)",
            self.open_fds.clone(),
        );
        registry.register(
            "process_threads",
            "Threads of the hub process",
            self.threads.clone(),
        );
    }

    /// Sets the metrics from `sample` (the CPU counter moves forward only).
    pub fn set(&self, sample: ProcessSample) {
        self.resident_memory_bytes.set(sample.resident_memory_bytes);
        let delta = sample.cpu_seconds - self.cpu_seconds.get();
        if delta > 0.0 {
            self.cpu_seconds.inc_by(delta);
        }
        self.open_fds.set(sample.open_fds);
        self.threads.set(sample.threads);
    }

    /// Reads `/proc/self` and sets the metrics (at each scrape).
    pub fn refresh(&self) {
        self.set(ProcessSample::read());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_cpu_files_and_threads() {
        // Some CPU to count.
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let sample = ProcessSample::read();
        assert!(sample.resident_memory_bytes > 1 << 20, "{sample:?}");
        assert!(sample.open_fds >= 3, "{sample:?}");
        assert!(sample.threads >= 1, "{sample:?}");
        assert!(sample.cpu_seconds > 0.0, "{sample:?}");
    }

    #[test]
    fn the_cpu_counter_never_goes_back() {
        let m = ProcessMetrics::default();
        let at = |cpu_seconds| ProcessSample {
            cpu_seconds,
            ..ProcessSample::default()
        };
        m.set(at(2.5));
        m.set(at(1.0));
        assert_eq!(m.cpu_seconds.get(), 2.5);
        m.set(at(3.0));
        assert_eq!(m.cpu_seconds.get(), 3.0);
    }
}
