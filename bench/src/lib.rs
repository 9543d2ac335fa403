//! Scale Agent's performance harness: starts a real local control plane, the hub and agents
//! (as processes), and measures this system beside its baselines in one run — the raw
//! Kubernetes watch (the floor), Clouddriver-style polling, plain LISTs, `kubectl apply`,
//! and requests straight to the API server beside the same through the hub's proxy.
//!
//! [`run`] returns a [`Report`] (a table plus JSON); `main` only parses flags. The hub, the
//! agent and the watch floor run as this same executable with [`procs::ROLE_ENV`] set, so
//! their RSS and CPU time are their own.

pub mod env;
pub mod fake;
pub mod floor;
pub mod measures;
pub mod procs;
pub mod report;
pub mod toxiproxy;

use std::{path::PathBuf, time::Duration};

use anyhow::Result;
use serde_json::json;

pub use crate::report::{Report, Row};

/// Sizes and knobs of a run. [`Options::default`] is the default run (a few minutes on
/// two cores in release); [`Options::tiny`] is the smoke test's.
#[derive(Clone, Debug)]
pub struct Options {
    /// The executable run as hub, agent and watch floor (this benchmark's binary).
    pub exe: PathBuf,
    /// Work directory (certificates, configs, hub stores, logs); a fresh temp dir if None.
    pub work_dir: Option<PathBuf>,
    pub latency_updates: usize,
    pub latency_rate: f64,
    pub latency_objects: usize,
    /// Sleep between two polls of the hub's HTTP API in the latency measure.
    pub poll_interval: Duration,
    /// Clouddriver's polling period for the list baseline.
    pub list_period: Duration,
    pub saturation_objects: usize,
    pub writers: usize,
    pub synthetic_events: usize,
    pub sync_sizes: Vec<usize>,
    pub object_bytes: usize,
    pub resume_changes: usize,
    pub idle_seconds: u64,
    pub agents: usize,
    pub agent_objects: usize,
    pub operations: usize,
    /// Measure 8: sequential GETs per side (and GETs per side with `proxy_clients`).
    pub proxy_requests: usize,
    /// Measure 8: concurrent clients for the requests/s figure.
    pub proxy_clients: usize,
    /// Measure 8: `kubectl apply` runs per side.
    pub proxy_applies: usize,
    /// Measure 8: ConfigMap updates the two watches see.
    pub proxy_watch_updates: usize,
    /// Measure 8: updates per second (fixed rate).
    pub proxy_watch_rate: f64,
    /// Measure 8: ConfigMaps in the large LIST.
    pub proxy_list_objects: usize,
    /// Measure 8: bytes of data per ConfigMap of the large LIST.
    pub proxy_list_object_bytes: usize,
    /// Measure 8: LISTs per side (the median is shown).
    pub proxy_list_repeats: usize,
    /// Measure 9: objects (over eight kinds) in the account of the caching cycle.
    pub reads_cycle_objects: usize,
    /// Measure 9: caching cycles per side and setting (the median is shown).
    pub reads_cycle_repeats: usize,
    /// Measure 9: ConfigMaps of the paged LIST.
    pub reads_list_objects: usize,
    /// Measure 9: paged LISTs per side (the median is shown), and `kubectl get` Tables of the
    /// same ConfigMaps.
    pub reads_list_repeats: usize,
    /// Measure 9: accounts whose caching cycles run at once on one hub.
    pub reads_accounts: usize,
    /// Measure 9: objects (over eight kinds) each of those accounts holds.
    pub reads_account_objects: usize,
    /// Measure 9: ConfigMap updates the two watches see, per setting.
    pub reads_watch_updates: usize,
    /// Measure 9: updates per second (fixed rate).
    pub reads_watch_rate: f64,
    /// Measure 9: round trip added by Toxiproxy for the far rows, milliseconds; 0 skips
    /// them (and Toxiproxy).
    pub reads_round_trip_ms: u64,
    /// Measure 10 (the soak): simulated agents connected throughout.
    pub soak_agents: usize,
    /// Measure 10: how long the soak lasts, seconds.
    pub soak_seconds: u64,
    /// Measure 10: object updates per second over all agents.
    pub soak_events_per_second: f64,
    /// Measure 10: agents that drop their stream and connect again, per minute.
    pub soak_reconnects_per_minute: f64,
    /// Measure 11: simulated agents over three hub replicas on PostgreSQL (and on one
    /// embedded hub, the baseline): time to all streaming, RSS.
    pub ha_fleet_agents: usize,
    /// Measure 11: simulated agents over three replicas when one is killed.
    pub ha_failover_agents: usize,
    /// Measure 11: seconds after the kill an account may take to stream again before the
    /// failover row reports it as not streaming.
    pub ha_failover_timeout_secs: u64,
    /// Measure 11: objects of measure 12's mix (over `fleet_namespaces` namespaces) each
    /// simulated agent of the fleet and failover rows streams; None: `agent_objects`
    /// ConfigMaps.
    pub ha_objects: Option<usize>,
    /// Measure 11: seconds of the fleet's churn (`fleet_churn_percent`) on each side of the
    /// fleet row once it synced; 0 runs none.
    pub ha_churn_seconds: u64,
    /// Measure 12 (the fleet): simulated agents, one account each.
    pub fleet_agents: usize,
    /// Measure 12: objects per account (a mix of kinds and sizes).
    pub fleet_objects: usize,
    /// Measure 12: namespaces per account the objects spread over.
    pub fleet_namespaces: usize,
    /// Measure 12: seconds of the load (churn, caching cycles, GETs, watches).
    pub fleet_seconds: u64,
    /// Measure 12: period of each account's caching cycle, seconds.
    pub fleet_cycle_secs: f64,
    /// Measure 12: period of each account's GET by name, seconds.
    pub fleet_get_period_secs: f64,
    /// Measure 12: percent of all objects changed per minute.
    pub fleet_churn_percent: f64,
    /// Measure 12: requests in flight at most over all accounts (the HTTPS client pool).
    pub fleet_clients: usize,
    /// Measure 12: accounts whose changes are timed by watches through the proxy.
    pub fleet_watch_accounts: usize,
    /// Which of the measures to run (1 to 9 and 12 by default; 10 is the ten-minute soak,
    /// 11 the hub on PostgreSQL and its replicas, a few minutes).
    pub measures: Vec<u8>,
    /// Hub stores on /dev/shm instead of the work directory (default: the work directory,
    /// a disk like a real hub's).
    pub hub_store_on_tmpfs: bool,
}

impl Options {
    pub fn new(exe: PathBuf) -> Self {
        Self {
            exe,
            work_dir: None,
            latency_updates: 1000,
            latency_rate: 100.0,
            latency_objects: 10,
            poll_interval: Duration::from_millis(2),
            list_period: Duration::from_secs(30),
            saturation_objects: 3000,
            writers: 16,
            synthetic_events: 50_000,
            sync_sizes: vec![1000, 10_000],
            object_bytes: 1024,
            resume_changes: 500,
            idle_seconds: 10,
            agents: 200,
            agent_objects: 5,
            operations: 20,
            proxy_requests: 1000,
            proxy_clients: 4,
            proxy_applies: 30,
            proxy_watch_updates: 1000,
            proxy_watch_rate: 100.0,
            proxy_list_objects: 10_000,
            proxy_list_object_bytes: 4096,
            proxy_list_repeats: 3,
            reads_cycle_objects: 10_000,
            reads_cycle_repeats: 3,
            reads_list_objects: 10_000,
            reads_list_repeats: 3,
            reads_accounts: 100,
            reads_account_objects: 80,
            reads_watch_updates: 300,
            reads_watch_rate: 50.0,
            reads_round_trip_ms: 50,
            soak_agents: 1000,
            soak_seconds: 600,
            soak_events_per_second: 200.0,
            soak_reconnects_per_minute: 60.0,
            ha_fleet_agents: 1000,
            ha_failover_agents: 200,
            ha_failover_timeout_secs: 120,
            ha_objects: None,
            ha_churn_seconds: 30,
            fleet_agents: 100,
            fleet_objects: 2000,
            fleet_namespaces: 20,
            fleet_seconds: 60,
            fleet_cycle_secs: 30.0,
            fleet_get_period_secs: 5.0,
            fleet_churn_percent: 1.0,
            fleet_clients: 32,
            fleet_watch_accounts: 10,
            measures: (1..=9).chain([12]).collect(),
            hub_store_on_tmpfs: false,
        }
    }

    /// Tiny sizes for the smoke test.
    pub fn tiny(exe: PathBuf) -> Self {
        Self {
            latency_updates: 20,
            latency_objects: 5,
            saturation_objects: 50,
            writers: 8,
            synthetic_events: 500,
            sync_sizes: vec![50],
            resume_changes: 20,
            idle_seconds: 1,
            agents: 20,
            agent_objects: 2,
            operations: 3,
            proxy_requests: 20,
            proxy_clients: 2,
            proxy_applies: 2,
            proxy_watch_updates: 20,
            proxy_list_objects: 50,
            proxy_list_repeats: 1,
            reads_cycle_objects: 80,
            reads_cycle_repeats: 1,
            reads_list_objects: 1100,
            reads_list_repeats: 1,
            reads_accounts: 3,
            reads_account_objects: 16,
            reads_watch_updates: 10,
            soak_agents: 10,
            // Past the hub's 15 s heartbeat period, so heartbeats and their acks interleave
            // with the churn (where the first full-size soak found a bug).
            soak_seconds: 17,
            soak_events_per_second: 50.0,
            soak_reconnects_per_minute: 120.0,
            ha_fleet_agents: 9,
            ha_failover_agents: 6,
            ha_failover_timeout_secs: 60,
            ha_churn_seconds: 3,
            fleet_agents: 3,
            fleet_objects: 100,
            fleet_namespaces: 4,
            fleet_seconds: 6,
            fleet_cycle_secs: 2.0,
            fleet_get_period_secs: 0.5,
            // Enough churn for watch events in a few seconds.
            fleet_churn_percent: 100.0,
            fleet_clients: 4,
            fleet_watch_accounts: 2,
            ..Self::new(exe)
        }
    }
}

/// Measure 12's settings, apart (one `json!` of every setting passes the macro's recursion
/// limit).
fn fleet_settings(o: &Options) -> serde_json::Value {
    json!({
        "agents": o.fleet_agents,
        "objects": o.fleet_objects,
        "namespaces": o.fleet_namespaces,
        "seconds": o.fleet_seconds,
        "cycle_secs": o.fleet_cycle_secs,
        "get_period_secs": o.fleet_get_period_secs,
        "churn_percent": o.fleet_churn_percent,
        "clients": o.fleet_clients,
        "watch_accounts": o.fleet_watch_accounts,
    })
}

/// Measure 11's settings, apart for the same reason.
fn ha_settings(o: &Options) -> serde_json::Value {
    json!({
        "fleet_agents": o.ha_fleet_agents,
        "failover_agents": o.ha_failover_agents,
        "failover_timeout_secs": o.ha_failover_timeout_secs,
        "objects": o.ha_objects,
        "churn_seconds": o.ha_churn_seconds,
    })
}

/// Runs every measure and returns the report. Progress goes to stderr.
pub async fn run(options: &Options) -> Result<Report> {
    let started = std::time::Instant::now();
    let dir = options.work_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("scale-agent-bench-{}", std::process::id()))
    });
    let _ = std::fs::remove_dir_all(&dir);
    let mut env = env::Env::start(options.exe.clone(), dir.clone()).await?;
    if options.hub_store_on_tmpfs {
        let shm =
            PathBuf::from("/dev/shm").join(format!("scale-agent-bench-{}", std::process::id()));
        std::fs::create_dir_all(&shm)?;
        env.store_dir = shm;
    }
    let machine = report::Machine::detect(env.kubernetes_version.clone());
    eprintln!(
        "[bench] {} build, Kubernetes {}, control plane {}",
        machine.build_profile,
        machine.kubernetes_version,
        env.control_plane.startup()
    );
    let mut rows = Vec::new();
    let step = |name: &str| eprintln!("[bench] {:>6.1} s: {name}", started.elapsed().as_secs_f64());

    let on = |m: u8| options.measures.contains(&m);
    let mut bottleneck = String::from("not measured (measure 2 not run)");
    if on(1) {
        step("1. change-to-hub latency");
        measures::latency(&env, options, &mut rows).await?;
    }
    if on(2) {
        step("2. events per second at saturation");
        bottleneck = measures::throughput(&env, options, &mut rows).await?;
        step("2. stream alone (synthetic source)");
        let ceiling = measures::synthetic(&env, options, &mut rows).await?;
        bottleneck = format!("{bottleneck}. {}", ceiling.sentence());
    }
    if on(11) {
        step("11. events into the hub on PostgreSQL and on the embedded store");
        measures::store_backends(&env, options, &mut rows).await?;
        step(
            "11. simulated agents over three hub replicas on PostgreSQL and on one embedded hub; failover: one of three replicas killed",
        );
        measures::replicas::replicas(&env, options, &mut rows).await?;
    }
    if on(3) || on(4) || on(5) {
        step("3-5. initial sync, resume, footprint with objects");
        measures::sync_and_resume(&env, options, &mut rows).await?;
    }
    if on(5) {
        step("5. idle footprint, 10 kinds");
        measures::idle_footprint(&env, options, &mut rows).await?;
    }
    if on(7) {
        step("7. many agents");
        measures::many_agents(&env, options, &mut rows).await?;
    }
    if on(6) {
        step("6. operations");
        measures::operations(&env, options, &mut rows).await?;
    }
    if on(8) {
        step("8. Kubernetes API proxy");
        let sentence = measures::proxy::proxy(&env, options, &mut rows).await?;
        bottleneck = if on(2) {
            format!("{bottleneck} {sentence}")
        } else {
            sentence
        };
    }
    if on(10) {
        step("10. soak");
        measures::soak::soak(&env, options, &mut rows).await?;
    }
    if on(12) {
        step("12. a fleet of simulated agents under Clouddriver's read load");
        measures::fleet::fleet(&env, options, &mut rows).await?;
    }
    if on(9) {
        step("9. reads through the proxy as Clouddriver makes them");
        let sentence = measures::reads::reads(&env, options, &mut rows).await?;
        bottleneck = if on(2) || on(8) {
            format!("{bottleneck} {sentence}")
        } else {
            sentence
        };
    }
    step("done");
    rows.sort_by_key(|r| r.measure);

    let report = Report {
        machine,
        settings: json!({
            "latency_updates": options.latency_updates,
            "latency_rate_per_sec": options.latency_rate,
            "latency_objects": options.latency_objects,
            "poll_interval_ms": options.poll_interval.as_secs_f64() * 1000.0,
            "list_period_secs": options.list_period.as_secs_f64(),
            "saturation_objects": options.saturation_objects,
            "writers": options.writers,
            "synthetic_events": options.synthetic_events,
            "sync_sizes": options.sync_sizes,
            "object_bytes": options.object_bytes,
            "resume_changes": options.resume_changes,
            "idle_seconds": options.idle_seconds,
            "agents": options.agents,
            "soak_agents": options.soak_agents,
            "soak_seconds": options.soak_seconds,
            "soak_events_per_second": options.soak_events_per_second,
            "soak_reconnects_per_minute": options.soak_reconnects_per_minute,
            "agent_objects": options.agent_objects,
            "operations": options.operations,
            "proxy_requests": options.proxy_requests,
            "proxy_clients": options.proxy_clients,
            "proxy_applies": options.proxy_applies,
            "proxy_watch_updates": options.proxy_watch_updates,
            "proxy_watch_rate_per_sec": options.proxy_watch_rate,
            "proxy_list_objects": options.proxy_list_objects,
            "proxy_list_object_bytes": options.proxy_list_object_bytes,
            "proxy_list_repeats": options.proxy_list_repeats,
            "reads_cycle_objects": options.reads_cycle_objects,
            "reads_cycle_repeats": options.reads_cycle_repeats,
            "reads_list_objects": options.reads_list_objects,
            "reads_list_repeats": options.reads_list_repeats,
            "reads_accounts": options.reads_accounts,
            "reads_account_objects": options.reads_account_objects,
            "reads_watch_updates": options.reads_watch_updates,
            "reads_watch_rate_per_sec": options.reads_watch_rate,
            "reads_round_trip_ms": options.reads_round_trip_ms,
            "fleet": fleet_settings(options),
            "ha": ha_settings(options),
            "measures": options.measures,
        }),
        rows,
        bottleneck,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    if options.hub_store_on_tmpfs {
        let _ = std::fs::remove_dir_all(&env.store_dir);
    }
    drop(env);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}
