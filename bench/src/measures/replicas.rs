//! Measure 11's rows on several hub replicas (issue 16): three hub processes on one
//! PostgreSQL from the e2e harness (`--store postgres`, `--replica-id`,
//! `--replica-address`, `--replica-secret-file`), with measure 10's simulated agents
//! (each its own client certificate and account) spread over them, agent `i` on replica
//! `i % 3` as a Service's connections would spread. Each agent streams `--agent-objects`
//! ConfigMaps, or with `--ha-objects` that many objects of measure 12's mix (issue 26: three
//! replicas holding the 1,000-account fleet of 2,000 objects each).
//!
//! - The fleet row: `--ha-fleet-agents` agents over the three replicas: time until every
//!   one streams with its snapshot acknowledged, until the stores committed it all (the
//!   objects per second the store took), the replicas' total RSS, then `--ha-churn-seconds`
//!   of the fleet's churn ([`churn`]); beside the same agents on one hub on the embedded
//!   store.
//! - The failover row: `--ha-failover-agents` agents over the three replicas, one replica
//!   killed with SIGKILL once everything is committed: time until every account it owned
//!   streams on another replica (its agents reconnect to another address, as real agents do
//!   through a Service when the endpoint is gone), and how many had to relist (no resume
//!   point from the new owner) ([`failover`]); beside one embedded hub killed the same way
//!   and restarted at once, its agents reconnecting to it.
//!
//! With as many agents in both rows, one fleet per side serves both ([`replicas`]).

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use scale_agent_e2e::postgres::PostgresServer;
use serde_json::json;

use super::{
    agent_objects::AgentObjects,
    soak::{Sim, connect_fleet},
};
use crate::{
    Options,
    env::{Env, HubProc},
    procs::metric_sum,
    report::{Percentiles, Row, mib, secs},
};

mod churn;
mod failover;
use churn::{Churned, churn};
use failover::{Recovery, recover};

/// Replicas of the hub in these rows.
const REPLICAS: usize = 3;
/// The hub's counter of snapshots begun (an agent relisting a kind).
const RELISTS: &str = "scale_agent_hub_relists_total";
/// Changes applied to a hub's cache and not yet committed to its store.
const QUEUED: &str = "scale_agent_hub_store_queued_changes";
/// How long the store may take to commit what the fleet sent, once every agent is
/// acknowledged, before the run gives up.
const STORED: Duration = Duration::from_secs(900);
/// The hub's store commits: how many, and the seconds they took.
const COMMITS: &str = "scale_agent_hub_store_commit_duration_seconds_count";
/// A hub whose store made no commit for this long, none queued, has committed everything.
const IDLE: Duration = Duration::from_secs(2);
/// Pause between an agent's attempts to reach a hub (the bench's agents' `baseDelay`).
const RETRY: Duration = Duration::from_millis(200);
/// Wait between the last snapshot acknowledged and the kill: past the embedded store's
/// durable commit (at least every second while data changes), so the kill finds steady
/// state, not the last second's non-durable commits (which a crash loses by design).
const SETTLE: Duration = Duration::from_secs(2);

/// Hub replicas sharing one PostgreSQL. The hubs are dropped (stopped) before the server.
struct Replicas {
    hubs: Vec<HubProc>,
    postgres: PostgresServer,
}

impl Replicas {
    async fn start(env: &Env, prefix: &str) -> Result<Self> {
        let postgres = PostgresServer::start().await?;
        let secret = env.dir.join(format!("{prefix}-replica-secret"));
        std::fs::write(
            &secret,
            format!(
                "{:032x}{:032x}",
                rand::random::<u128>(),
                rand::random::<u128>()
            ),
        )?;
        let mut hubs = Vec::with_capacity(REPLICAS);
        for i in 0..REPLICAS {
            hubs.push(
                env.hub_replica(&format!("{prefix}-{i}"), &postgres.url(), &secret)
                    .await?,
            );
        }
        Ok(Self { hubs, postgres })
    }

    fn grpc_addrs(&self) -> Vec<SocketAddr> {
        self.hubs.iter().map(|h| h.grpc_addr).collect()
    }

    /// Accounts some replica owns (`account_owners` rows): none when the replicas run
    /// without ownership, each then streaming whatever it is given.
    async fn owned_accounts(&self) -> Result<i64> {
        let client = self.postgres.connect().await?;
        let row = client
            .query_one("SELECT count(*) FROM account_owners", &[])
            .await?;
        Ok(row.get(0))
    }
}

/// Agents connected to each hub (`GET /api/v1/agents`).
async fn connected(hubs: &[&HubProc]) -> Result<Vec<usize>> {
    let mut counts = Vec::with_capacity(hubs.len());
    for hub in hubs {
        counts.push(hub.agents_connected().await?);
    }
    Ok(counts)
}

/// The objects each simulated agent of these rows streams: `--ha-objects` of measure 12's
/// mix, or (by default) `--agent-objects` ConfigMaps.
fn agent_objects(o: &Options) -> AgentObjects {
    match o.ha_objects {
        Some(objects) => AgentObjects::Mix {
            objects: objects.max(1),
            namespaces: o.fleet_namespaces.max(1),
        },
        None => AgentObjects::ConfigMaps(o.agent_objects.max(1)),
    }
}

/// Sum of one metric over `hubs`.
async fn metric_over(hubs: &[&HubProc], name: &str) -> Result<f64> {
    let mut sum = 0.0;
    for hub in hubs {
        sum += hub.metric(name).await?;
    }
    Ok(sum)
}

/// Waits until no hub of `hubs` has a change queued for its store (everything the agents
/// sent committed); returns when. The gauge is set as each commit ends, to what is queued
/// then: a hub is done when it reads 0 after a commit that ended after this call, or, with
/// no commit for [`IDLE`] (its writer commits at once whatever is queued), as of this call.
async fn wait_stored(hubs: &[&HubProc]) -> Result<Instant> {
    let started = Instant::now();
    let deadline = started + STORED;
    let mut waiting = Vec::with_capacity(hubs.len());
    for hub in hubs {
        waiting.push((*hub, hub.metric(COMMITS).await?));
    }
    let mut last = started;
    while !waiting.is_empty() {
        let mut still = Vec::with_capacity(waiting.len());
        for (hub, before) in waiting {
            let metrics = hub.metrics().await?;
            let committed_since = metric_sum(&metrics, COMMITS, &[]) > before;
            if metric_sum(&metrics, QUEUED, &[]) > 0.0 {
                still.push((hub, before));
            } else if committed_since {
                last = Instant::now();
            } else if started.elapsed() < IDLE {
                still.push((hub, before));
            }
        }
        waiting = still;
        if Instant::now() > deadline {
            bail!("the hubs' stores still had changes queued {STORED:?} after the fleet synced");
        }
        if !waiting.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(last)
}

/// One side of the fleet row: agents connected, seconds until all streamed and were
/// acknowledged and until their stores had committed everything, RSS (KiB) once settled,
/// and the fleet's churn.
struct FleetSide {
    seconds: f64,
    stored_seconds: f64,
    rss_kib: u64,
    connected: Vec<usize>,
    churn: Churned,
}

impl FleetSide {
    /// Objects (and registrations) the store took per second while the fleet connected.
    fn events_per_sec(&self, events: usize) -> f64 {
        events as f64 / self.stored_seconds.max(0.001)
    }

    fn text(&self, events: usize, rss: &str) -> String {
        format!(
            "all streaming and acknowledged in {}, all committed in {} ({:.0} objects/s); {rss} {}; {}",
            secs(self.seconds),
            secs(self.stored_seconds),
            self.events_per_sec(events),
            mib(self.rss_kib),
            self.churn.text()
        )
    }

    fn values(&self, events: usize) -> serde_json::Value {
        json!({
            "seconds": self.seconds,
            "stored_seconds": self.stored_seconds,
            "objects_per_sec_stored": self.events_per_sec(events),
            "rss_kib": self.rss_kib,
            "connected": self.connected,
            "churn": self.churn.values(),
        })
    }
}

/// What one side (the replicas, or one embedded hub) measured.
struct Side {
    /// The fleet row's figures, when this side ran them.
    fleet: Option<FleetSide>,
    /// The failover row's, when this side ran it.
    recovery: Option<Recovery>,
}

/// Which rows one fleet of agents serves, on each side.
#[derive(Clone, Copy)]
struct Rows {
    fleet: bool,
    failover: bool,
}

/// Connects `sims` (agent `i` to `addrs[i % len]`), waits until `hubs` committed what they
/// sent and, for the fleet row, reads the hubs' RSS and agents and runs the churn.
async fn fleet_side(
    sims: Vec<Sim>,
    addrs: &[SocketAddr],
    hubs: &[&HubProc],
    ca: &str,
    objects: AgentObjects,
    o: &Options,
    rows: Rows,
) -> Result<(Option<FleetSide>, Vec<Sim>)> {
    let started = Instant::now();
    let mut sims = connect_fleet(sims, |i| addrs[i % addrs.len()], ca, objects).await?;
    let seconds = started.elapsed().as_secs_f64();
    let stored_seconds = wait_stored(hubs)
        .await?
        .duration_since(started)
        .as_secs_f64();
    if !rows.fleet {
        return Ok((None, sims));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut rss_kib = 0;
    for hub in hubs {
        rss_kib += hub.stats()?.rss_kib;
    }
    let connected = connected(hubs).await?;
    let churn = churn(&mut sims, objects, o, hubs).await?;
    let side = FleetSide {
        seconds,
        stored_seconds,
        rss_kib,
        connected,
        churn,
    };
    Ok((Some(side), sims))
}

/// `n` agents over three replicas on one PostgreSQL: the fleet row's figures, then (after
/// the churn, everything committed) replica 0 killed and its agents' recovery. Also returns
/// the accounts some replica owned once all streamed.
async fn on_replicas(
    env: &Env,
    o: &Options,
    prefix: &str,
    n: usize,
    rows: Rows,
) -> Result<(Side, i64)> {
    let objects = agent_objects(o);
    let ca = env.pki.ca.cert_pem.clone();
    let mut replicas = Replicas::start(env, prefix).await?;
    let addrs = replicas.grpc_addrs();
    let hubs: Vec<&HubProc> = replicas.hubs.iter().collect();
    let sims = Sim::fleet(env, prefix, n)?;
    let (fleet, sims) = fleet_side(sims, &addrs, &hubs, &ca, objects, o, rows).await?;
    let owned = replicas.owned_accounts().await?;
    if let Some(side) = &fleet {
        eprintln!(
            "[bench] {prefix}: replicas {}",
            side.text(n * objects.count(), "hubs' total RSS")
        );
    }
    if !rows.failover {
        return Ok((
            Side {
                fleet,
                recovery: None,
            },
            owned,
        ));
    }
    // Steady state: everything the agents sent (the churn too) is in PostgreSQL.
    wait_stored(&hubs).await?;
    let before = metric_over(&hubs[1..], RELISTS).await?;
    let (mut victims, others): (Vec<_>, Vec<_>) = sims
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % REPLICAS == 0);
    let survivors: Vec<SocketAddr> = addrs[1..].to_vec();
    let timeout = Duration::from_secs(o.ha_failover_timeout_secs.max(1));
    tokio::time::sleep(SETTLE).await;
    replicas.hubs[0].kill();
    let killed_at = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    // Every agent of the killed replica at once, as their streams all end together; each
    // starts with a different survivor, as a Service spreads new connections.
    let outcomes = futures::future::join_all(victims.iter_mut().map(|(i, sim)| {
        recover(
            sim,
            &survivors,
            *i / REPLICAS,
            &ca,
            objects,
            killed_at,
            deadline,
        )
    }))
    .await;
    let survivors: Vec<&HubProc> = replicas.hubs[1..].iter().collect();
    let after = metric_over(&survivors, RELISTS).await?;
    let recovery = Recovery::of(outcomes, after - before);
    eprintln!("[bench] {prefix}: replicas {}", recovery.text(timeout));
    drop(victims);
    drop(others);
    Ok((
        Side {
            fleet,
            recovery: Some(recovery),
        },
        owned,
    ))
}

/// The same `n` agents on one hub on the embedded store: the fleet row's figures, then the
/// hub killed and restarted at once on its data, every agent reconnecting to it.
async fn on_embedded(env: &Env, o: &Options, prefix: &str, n: usize, rows: Rows) -> Result<Side> {
    let objects = agent_objects(o);
    let ca = env.pki.ca.cert_pem.clone();
    let mut hub = env.hub(&format!("{prefix}-embedded")).await?;
    let grpc = hub.grpc_addr;
    let sims = Sim::fleet(env, prefix, n)?;
    let (fleet, mut sims) = fleet_side(sims, &[grpc], &[&hub], &ca, objects, o, rows).await?;
    if !rows.failover {
        return Ok(Side {
            fleet,
            recovery: None,
        });
    }
    wait_stored(&[&hub]).await?;
    let timeout = Duration::from_secs(o.ha_failover_timeout_secs.max(1));
    tokio::time::sleep(SETTLE).await;
    hub.kill();
    let killed_at = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let addrs = [grpc];
    let agents = futures::future::join_all(
        sims.iter_mut()
            .map(|sim| recover(sim, &addrs, 0, &ca, objects, killed_at, deadline)),
    );
    // Restarted at once on the same ports and data, as a pod restarted in place with its
    // volume (Kubernetes' own restart delay not counted).
    let (restarted, outcomes) = tokio::join!(hub.start(), agents);
    restarted?;
    // The restarted process counts from zero.
    let hub_relists = metric_over(&[&hub], RELISTS).await?;
    drop(sims);
    Ok(Side {
        fleet,
        recovery: Some(Recovery::of(outcomes, hub_relists)),
    })
}

/// Measure 11's fleet and failover rows. With `--ha-fleet-agents` equal to
/// `--ha-failover-agents` one fleet per side serves both (the failover kills a replica of
/// the fleet row's, after its churn), which halves a run at the size; otherwise each
/// row connects its own.
pub async fn replicas(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let fleet_n = o.ha_fleet_agents.max(REPLICAS);
    let failover_n = o.ha_failover_agents.max(REPLICAS);
    let rows_of = |fleet, failover| Rows { fleet, failover };
    let runs = if fleet_n == failover_n {
        vec![("ha-fleet", fleet_n, rows_of(true, true))]
    } else {
        vec![
            ("ha-fleet", fleet_n, rows_of(true, false)),
            ("ha-failover", failover_n, rows_of(false, true)),
        ]
    };
    for (prefix, n, which) in runs {
        let (replicated, owned) = on_replicas(env, o, prefix, n, which).await?;
        let embedded = on_embedded(env, o, prefix, n, which).await?;
        if which.fleet {
            rows.push(fleet_row(o, n, &replicated, &embedded, owned)?);
        }
        if which.failover {
            let after_churn = which.fleet;
            rows.push(failover_row(
                o,
                n,
                &replicated,
                &embedded,
                owned,
                after_churn,
            )?);
        }
    }
    Ok(())
}

fn fleet_row(o: &Options, n: usize, replicated: &Side, embedded: &Side, owned: i64) -> Result<Row> {
    let (Some(replicated), Some(embedded)) = (&replicated.fleet, &embedded.fleet) else {
        bail!("the fleet row was not measured on both sides");
    };
    let objects = agent_objects(o);
    let events = n * objects.count();
    let per_replica = replicated
        .connected
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" + ");
    Ok(Row {
        id: "ha-fleet".into(),
        measure: 11,
        title: format!(
            "{n} simulated agents over {REPLICAS} hub replicas on one PostgreSQL ({} each, {} connecting at a time), then the fleet's churn ({} % of the objects per minute)",
            objects.describe(),
            super::soak::CONNECTING,
            o.fleet_churn_percent,
        ),
        system: format!(
            "{} ({per_replica} agents connected)",
            replicated.text(events, "hubs' total RSS")
        ),
        baseline_name: format!("the same {n} agents on one hub on the embedded store"),
        baseline: format!(
            "{} ({} agents connected)",
            embedded.text(events, "hub RSS"),
            embedded.connected.iter().sum::<usize>()
        ),
        note: format!(
            "agent i connects to replica i % 3 (as a Service spreads connections); {owned} accounts in account_owners once all streamed{}; committed: no change queued for any hub's store (scale_agent_hub_store_queued_changes), objects/s = the {events} objects over that time; the churn's commits, acks held and queue from the hubs' metrics; the fake agents' TLS and protobuf run in the bench process on the same cores; PostgreSQL's own memory is not in the replicas' RSS",
            if owned == 0 {
                " (the replicas took no ownership: each streamed whatever it was given)"
            } else {
                ""
            }
        ),
        values: json!({
            "agents": n,
            "objects_per_agent": objects.count(),
            "objects": objects.describe(),
            "replicas": REPLICAS,
            "replicated_seconds": replicated.seconds,
            "replicated_rss_kib": replicated.rss_kib,
            "replicated_connected": replicated.connected,
            "replicated": replicated.values(events),
            "owned_accounts": owned,
            "embedded_seconds": embedded.seconds,
            "embedded_rss_kib": embedded.rss_kib,
            "embedded_connected": embedded.connected,
            "embedded": embedded.values(events),
        }),
    })
}

fn failover_row(
    o: &Options,
    n: usize,
    replicated: &Side,
    embedded: &Side,
    owned: i64,
    after_churn: bool,
) -> Result<Row> {
    let (Some(replicated), Some(embedded)) = (&replicated.recovery, &embedded.recovery) else {
        bail!("the failover row was not measured on both sides");
    };
    let objects = agent_objects(o);
    let timeout = Duration::from_secs(o.ha_failover_timeout_secs.max(1));
    Ok(Row {
        id: "ha-failover".into(),
        measure: 11,
        title: format!(
            "Failover: {n} simulated agents ({} each) over {REPLICAS} hub replicas on one PostgreSQL, one replica killed (SIGKILL); its {} agents reconnect to another replica",
            objects.describe(),
            replicated.agents
        ),
        system: replicated.text(timeout),
        baseline_name: format!(
            "one hub on the embedded store with the same {n} agents, killed (SIGKILL) and restarted at once on its data; all {n} reconnect to it"
        ),
        baseline: embedded.text(timeout),
        note: format!(
            "killed {} s after the last snapshot{} was acknowledged and every hub's store had committed it (no change queued); {owned} accounts in account_owners before the kill{}; times from the kill to the STREAMING assignment on the agent's side; streams ended p50 {} after the kill (replicas) and {} (embedded); an agent whose stream ended tries a surviving replica's address, the next one every {} ms while it gets no STREAMING; a STANDBY answer is waited out (the replica promotes it when the killed replica's lock frees and it has loaded the account); an agent given no resume point for a kind sends that kind's snapshot again (a relist); the baseline's time includes the hub process's start",
            SETTLE.as_secs(),
            if after_churn {
                " (and the fleet row's churn)"
            } else {
                ""
            },
            if owned == 0 {
                " (the replicas took no ownership: a survivor streams a reconnected agent at once, from what it loaded at its start)"
            } else {
                ""
            },
            secs(Percentiles::of(&replicated.ended).p50),
            secs(Percentiles::of(&embedded.ended).p50),
            RETRY.as_millis()
        ),
        values: json!({
            "agents": n,
            "replicas": REPLICAS,
            "timeout_seconds": timeout.as_secs_f64(),
            "objects_per_agent": objects.count(),
            "objects": objects.describe(),
            "after_fleet_row": after_churn,
            "owned_accounts_before_kill": owned,
            "replicated": replicated.values(),
            "embedded": embedded.values(),
        }),
    })
}
