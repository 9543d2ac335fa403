//! `scale-agent-bench`: one table comparing Scale Agent with its baselines, measured side by
//! side in one run against a real local control plane. Meant to run in release:
//!
//! ```sh
//! cargo run --release -p scale-agent-bench -- --json target/bench/latest.json
//! ```
//!
//! The same executable also runs the hub, the agent and the watch floor as child processes
//! (selected by `SCALE_AGENT_BENCH_ROLE`), so each one's RSS and CPU are its own.

use std::{path::PathBuf, time::Duration};

use clap::Parser;
use scale_agent_bench::{Options, procs::ROLE_ENV};

/// Benchmarks Scale Agent beside the raw watch, Clouddriver-style polling, plain LISTs,
/// kubectl and the API server reached directly, and prints one table (plus JSON). Sizes are flags; the defaults take a few
/// minutes on two cores in a release build.
#[derive(Debug, Parser)]
#[command(name = "scale-agent-bench", version)]
struct Args {
    /// Where to write the report as JSON.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_JSON",
        default_value = "target/bench/latest.json"
    )]
    json: PathBuf,
    /// Work directory for certificates, configs, hub stores and logs (default: a temp dir,
    /// removed at the end).
    #[arg(long, env = "SCALE_AGENT_BENCH_WORK_DIR")]
    work_dir: Option<PathBuf>,
    /// Measure 1: number of ConfigMap updates.
    #[arg(long, default_value_t = 1000)]
    latency_updates: usize,
    /// Measure 1: updates per second (fixed rate).
    #[arg(long, default_value_t = 100.0)]
    latency_rate: f64,
    /// Measure 1: ConfigMaps the updates go round.
    #[arg(long, default_value_t = 10)]
    latency_objects: usize,
    /// Measure 1: milliseconds between two polls of the hub's HTTP API.
    #[arg(long, default_value_t = 2)]
    poll_interval_ms: u64,
    /// Measure 1: Clouddriver's full-LIST period, seconds, for the polling baseline.
    #[arg(long, default_value_t = 30)]
    list_period_secs: u64,
    /// Measure 2: ConfigMaps created as fast as the API server takes them.
    #[arg(long, default_value_t = 3000)]
    saturation_objects: usize,
    /// Requests in flight when creating or changing ConfigMaps.
    #[arg(long, default_value_t = 16)]
    writers: usize,
    /// Measure 2: ObjectEvents the synthetic source sends straight to the hub.
    #[arg(long, default_value_t = 50_000)]
    synthetic_events: usize,
    /// Measure 3: initial-sync sizes (comma-separated); the largest is also used for the
    /// resume and footprint-with-objects measures.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    sync_sizes: Vec<usize>,
    /// Measure 3: also sync 50,000 ConfigMaps (adds minutes and memory).
    #[arg(long)]
    sync_50k: bool,
    /// Bytes of data per ConfigMap in measures 2 to 5.
    #[arg(long, default_value_t = 1024)]
    object_bytes: usize,
    /// Measure 4: changes made while the hub is down.
    #[arg(long, default_value_t = 500)]
    resume_changes: usize,
    /// Measure 5 and 7: seconds of the idle windows.
    #[arg(long, default_value_t = 10)]
    idle_seconds: u64,
    /// Measure 7: simulated agents (up to 1000 or more).
    #[arg(long, default_value_t = 200)]
    agents: usize,
    /// Measure 7: objects in each simulated agent's snapshot.
    #[arg(long, default_value_t = 5)]
    agent_objects: usize,
    /// Measure 6: server-side applies through each path.
    #[arg(long, default_value_t = 20)]
    operations: usize,
    /// Measure 8 (proxy): sequential GETs of one ConfigMap per side, and GETs per side for
    /// the requests/s figure.
    #[arg(long, default_value_t = 1000)]
    proxy_requests: usize,
    /// Measure 8: concurrent clients for the requests/s figure.
    #[arg(long, default_value_t = 4)]
    proxy_clients: usize,
    /// Measure 8: `kubectl apply` runs of a Deployment per side.
    #[arg(long, default_value_t = 30)]
    proxy_applies: usize,
    /// Measure 8: ConfigMap updates seen by the watch through the proxy and the direct one.
    #[arg(long, default_value_t = 1000)]
    proxy_watch_updates: usize,
    /// Measure 8: updates per second (fixed rate).
    #[arg(long, default_value_t = 100.0)]
    proxy_watch_rate: f64,
    /// Measure 8: ConfigMaps in the large LIST.
    #[arg(long, default_value_t = 10_000)]
    proxy_list_objects: usize,
    /// Measure 8: bytes of data per ConfigMap of the large LIST.
    #[arg(long, default_value_t = 4096)]
    proxy_list_object_bytes: usize,
    /// Measure 8: large LISTs per side (the median is shown).
    #[arg(long, default_value_t = 3)]
    proxy_list_repeats: usize,
    /// Measure 9 (reads as Clouddriver makes them): objects, over eight kinds, in the
    /// account of the caching cycle.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_READS_CYCLE_OBJECTS",
        default_value_t = 10_000
    )]
    reads_cycle_objects: usize,
    /// Measure 9: caching cycles per side and setting (the median is shown).
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_READS_CYCLE_REPEATS",
        default_value_t = 3
    )]
    reads_cycle_repeats: usize,
    /// Measure 9: ConfigMaps of the LIST in pages of 500.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_READS_LIST_OBJECTS",
        default_value_t = 10_000
    )]
    reads_list_objects: usize,
    /// Measure 9: paged LISTs per side (the median is shown).
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_READS_LIST_REPEATS",
        default_value_t = 3
    )]
    reads_list_repeats: usize,
    /// Measure 9: accounts whose caching cycles run at once on one hub.
    #[arg(long, env = "SCALE_AGENT_BENCH_READS_ACCOUNTS", default_value_t = 100)]
    reads_accounts: usize,
    /// Measure 9: objects, over eight kinds, that each of those accounts holds.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_READS_ACCOUNT_OBJECTS",
        default_value_t = 80
    )]
    reads_account_objects: usize,
    /// Measure 9: ConfigMap updates the two watches see, per setting.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_READS_WATCH_UPDATES",
        default_value_t = 300
    )]
    reads_watch_updates: usize,
    /// Measure 9: watch updates per second (fixed rate).
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_READS_WATCH_RATE",
        default_value_t = 50.0
    )]
    reads_watch_rate: f64,
    /// Measure 9: round trip, milliseconds, that Toxiproxy adds in front of the API server
    /// and the hub's gRPC port for the far rows; 0 skips the far rows (and Toxiproxy).
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_READS_ROUND_TRIP_MS",
        default_value_t = 50
    )]
    reads_round_trip_ms: u64,
    /// Measure 10 (the soak): simulated agents connected for the whole soak.
    #[arg(long, env = "SCALE_AGENT_BENCH_SOAK_AGENTS", default_value_t = 1000)]
    soak_agents: usize,
    /// Measure 10: seconds the soak lasts.
    #[arg(long, env = "SCALE_AGENT_BENCH_SOAK_SECONDS", default_value_t = 600)]
    soak_seconds: u64,
    /// Measure 10: object updates per second over all agents.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_SOAK_EVENTS_PER_SECOND",
        default_value_t = 200.0
    )]
    soak_events_per_second: f64,
    /// Measure 10: agents that drop their stream and connect again, per minute.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_SOAK_RECONNECTS_PER_MINUTE",
        default_value_t = 60.0
    )]
    soak_reconnects_per_minute: f64,
    /// Measure 11: simulated agents over three hub replicas on one PostgreSQL, beside the
    /// same agents on one hub on the embedded store.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_HA_FLEET_AGENTS",
        default_value_t = 1000
    )]
    ha_fleet_agents: usize,
    /// Measure 11: simulated agents over three replicas when one replica is killed.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_HA_FAILOVER_AGENTS",
        default_value_t = 200
    )]
    ha_failover_agents: usize,
    /// Measure 11: seconds after the kill before an account not streaming again is
    /// reported as such.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_HA_FAILOVER_TIMEOUT_SECS",
        default_value_t = 120
    )]
    ha_failover_timeout_secs: u64,
    /// Measure 11: objects of measure 12's mix (over `--fleet-namespaces` namespaces, eight
    /// kinds) each simulated agent of the fleet and failover rows streams, instead of
    /// `--agent-objects` ConfigMaps: `--ha-fleet-agents 1000 --ha-failover-agents 1000
    /// --ha-objects 2000` is issue 26's three replicas holding the 2-million-object fleet.
    #[arg(long, env = "SCALE_AGENT_BENCH_HA_OBJECTS")]
    ha_objects: Option<usize>,
    /// Measure 11: seconds of the fleet's churn (`--fleet-churn-percent` of the objects per
    /// minute) on each side of the fleet row once it synced; 0 runs none.
    #[arg(long, env = "SCALE_AGENT_BENCH_HA_CHURN_SECONDS", default_value_t = 30)]
    ha_churn_seconds: u64,
    /// Measure 12 (the fleet): simulated agents, one account each.
    #[arg(long, env = "SCALE_AGENT_BENCH_FLEET_AGENTS", default_value_t = 100)]
    fleet_agents: usize,
    /// Measure 12: objects per account (Pods, ReplicaSets, Deployments, Services,
    /// ConfigMaps, Secrets as metadata, Events).
    #[arg(long, env = "SCALE_AGENT_BENCH_FLEET_OBJECTS", default_value_t = 2000)]
    fleet_objects: usize,
    /// Measure 12: namespaces per account.
    #[arg(long, env = "SCALE_AGENT_BENCH_FLEET_NAMESPACES", default_value_t = 20)]
    fleet_namespaces: usize,
    /// Measure 12: seconds of the load (churn, caching cycles, GETs and watches at once).
    #[arg(long, env = "SCALE_AGENT_BENCH_FLEET_SECONDS", default_value_t = 60)]
    fleet_seconds: u64,
    /// Measure 12: seconds between two caching cycles of an account.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_FLEET_CYCLE_SECS",
        default_value_t = 30.0
    )]
    fleet_cycle_secs: f64,
    /// Measure 12: seconds between two GETs by name of an account (WaitForManifestStable's
    /// poll).
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_FLEET_GET_PERIOD_SECS",
        default_value_t = 5.0
    )]
    fleet_get_period_secs: f64,
    /// Measure 12: percent of all objects changed per minute.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_FLEET_CHURN_PERCENT",
        default_value_t = 1.0
    )]
    fleet_churn_percent: f64,
    /// Measure 12: requests in flight at most over all accounts.
    #[arg(long, env = "SCALE_AGENT_BENCH_FLEET_CLIENTS", default_value_t = 32)]
    fleet_clients: usize,
    /// Measure 12: accounts whose changes are timed by watches through the proxy.
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_FLEET_WATCH_ACCOUNTS",
        default_value_t = 10
    )]
    fleet_watch_accounts: usize,
    /// The issue's big sizes: measure 12 with 1,000 accounts × 2,000 objects, and measure 7
    /// with 10,000 agents of 10 objects each (both added to the measures run).
    #[arg(long)]
    fleet_big: bool,
    /// Which measures to run (comma-separated numbers 1 to 12; 3, 4 and 5 share one setup;
    /// 8 is the Kubernetes API proxy, 9 reads through it as Clouddriver makes them:
    /// `--measures 8,9` runs only the proxy rows). Not in the default run: 10, the
    /// ten-minute soak, and 11, the hub on PostgreSQL and its replicas (events per second
    /// against embedded, 1,000 agents over three replicas, failover of 200 agents: a few
    /// minutes; `--measures 11`).
    #[arg(
        long,
        env = "SCALE_AGENT_BENCH_MEASURES",
        value_delimiter = ',',
        default_value = "1,2,3,4,5,6,7,8,9,12"
    )]
    measures: Vec<u8>,
    /// Run the hubs' stores on tmpfs (/dev/shm) instead of the work directory's disk.
    #[arg(long)]
    hub_store_on_tmpfs: bool,
}

fn main() -> anyhow::Result<()> {
    match std::env::var(ROLE_ENV).as_deref() {
        Ok("hub") => return scale_agent_hub::cli::main(),
        Ok("agent") => return scale_agent::cli::main(),
        Ok("watch-floor") => return scale_agent_bench::floor::main(),
        _ => {}
    }
    let args = Args::parse();
    let mut sync_sizes = args.sync_sizes.clone();
    if args.sync_50k && !sync_sizes.contains(&50_000) {
        sync_sizes.push(50_000);
    }
    let mut measures = args.measures.clone();
    let (mut fleet_agents, mut agents, mut agent_objects) =
        (args.fleet_agents, args.agents, args.agent_objects);
    if args.fleet_big {
        (fleet_agents, agents, agent_objects) = (1000, 10_000, 10);
        for m in [7, 12] {
            if !measures.contains(&m) {
                measures.push(m);
            }
        }
    }
    let options = Options {
        work_dir: args.work_dir,
        latency_updates: args.latency_updates,
        latency_rate: args.latency_rate,
        latency_objects: args.latency_objects,
        poll_interval: Duration::from_millis(args.poll_interval_ms),
        list_period: Duration::from_secs(args.list_period_secs),
        saturation_objects: args.saturation_objects,
        writers: args.writers,
        synthetic_events: args.synthetic_events,
        sync_sizes,
        object_bytes: args.object_bytes,
        resume_changes: args.resume_changes,
        idle_seconds: args.idle_seconds,
        agents,
        agent_objects,
        operations: args.operations,
        proxy_requests: args.proxy_requests,
        proxy_clients: args.proxy_clients,
        proxy_applies: args.proxy_applies,
        proxy_watch_updates: args.proxy_watch_updates,
        proxy_watch_rate: args.proxy_watch_rate,
        proxy_list_objects: args.proxy_list_objects,
        proxy_list_object_bytes: args.proxy_list_object_bytes,
        proxy_list_repeats: args.proxy_list_repeats,
        reads_cycle_objects: args.reads_cycle_objects,
        reads_cycle_repeats: args.reads_cycle_repeats,
        reads_list_objects: args.reads_list_objects,
        reads_list_repeats: args.reads_list_repeats,
        reads_accounts: args.reads_accounts,
        reads_account_objects: args.reads_account_objects,
        reads_watch_updates: args.reads_watch_updates,
        reads_watch_rate: args.reads_watch_rate,
        reads_round_trip_ms: args.reads_round_trip_ms,
        soak_agents: args.soak_agents,
        soak_seconds: args.soak_seconds,
        soak_events_per_second: args.soak_events_per_second,
        soak_reconnects_per_minute: args.soak_reconnects_per_minute,
        ha_fleet_agents: args.ha_fleet_agents,
        ha_failover_agents: args.ha_failover_agents,
        ha_failover_timeout_secs: args.ha_failover_timeout_secs,
        ha_objects: args.ha_objects,
        ha_churn_seconds: args.ha_churn_seconds,
        fleet_agents,
        fleet_objects: args.fleet_objects,
        fleet_namespaces: args.fleet_namespaces,
        fleet_seconds: args.fleet_seconds,
        fleet_cycle_secs: args.fleet_cycle_secs,
        fleet_get_period_secs: args.fleet_get_period_secs,
        fleet_churn_percent: args.fleet_churn_percent,
        fleet_clients: args.fleet_clients,
        fleet_watch_accounts: args.fleet_watch_accounts,
        measures,
        hub_store_on_tmpfs: args.hub_store_on_tmpfs,
        ..Options::new(std::env::current_exe()?)
    };
    if cfg!(debug_assertions) {
        eprintln!(
            "[bench] WARNING: debug build; figures are not representative. Run `cargo run --release -p scale-agent-bench`."
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(scale_agent_bench::run(&options))?;
    println!("{}", report.table());
    if let Some(parent) = args.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.json, serde_json::to_vec_pretty(&report)?)?;
    eprintln!("[bench] JSON written to {}", args.json.display());
    Ok(())
}
