//! Measure 11's rows on several hub replicas (issue 16): three hub processes on one
//! PostgreSQL from the e2e harness (`--store postgres`, `--replica-id`,
//! `--replica-address`, `--replica-secret-file`), with measure 10's simulated agents
//! (each its own client certificate and account) spread over them, agent `i` on replica
//! `i % 3` as a Service's connections would spread.
//!
//! - [`fleet`]: `--ha-fleet-agents` agents over the three replicas: time until every one
//!   streams with its snapshot acknowledged, and the replicas' total RSS; beside the same
//!   agents on one hub on the embedded store.
//! - [`failover`]: `--ha-failover-agents` agents over the three replicas, one replica
//!   killed with SIGKILL: time until every account it owned streams on another replica (its
//!   agents reconnect to another address, as real agents do through a Service when the
//!   endpoint is gone), and how many had to relist (no resume point from the new owner);
//!   beside one embedded hub killed the same way and restarted at once, its agents
//!   reconnecting to it.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::Result;
use scale_agent_e2e::postgres::PostgresServer;
use serde_json::json;

use super::{
    LONG,
    soak::{Sim, connect_fleet},
};
use crate::{
    Options,
    env::{Env, HubProc},
    fake::{FakeAgent, configmaps},
    report::{Percentiles, Row, mib, secs},
};

/// Replicas of the hub in these rows.
const REPLICAS: usize = 3;
/// The hub's counter of snapshots begun (an agent relisting a kind).
const RELISTS: &str = "scale_agent_hub_relists_total";
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

    /// `n` agents `<prefix>-<i>` connected, agent `i` to replica `i % 3`.
    async fn connect(
        &self,
        env: &Env,
        prefix: &str,
        n: usize,
        ca: &str,
        objects: usize,
    ) -> Result<Vec<Sim>> {
        let addrs = self.grpc_addrs();
        connect_fleet(
            Sim::fleet(env, prefix, n)?,
            |i| addrs[i % addrs.len()],
            ca,
            objects,
        )
        .await
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

    /// Total RSS of the replicas still running, KiB.
    fn rss_kib(&self) -> Result<u64> {
        self.hubs
            .iter()
            .filter(|h| h.pid() != 0)
            .map(|h| Ok(h.stats()?.rss_kib))
            .sum()
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

/// One side of the fleet row: agents connected, seconds until all streamed and were
/// acknowledged, RSS (KiB) once settled.
struct FleetSide {
    seconds: f64,
    rss_kib: u64,
    connected: Vec<usize>,
}

/// `--ha-fleet-agents` agents over three replicas on PostgreSQL beside the same agents on
/// one hub on the embedded store.
pub async fn fleet(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let n = o.ha_fleet_agents.max(1);
    let objects = o.agent_objects.max(1);
    let ca = env.pki.ca.cert_pem.clone();
    let (replicated, owned) = {
        let replicas = Replicas::start(env, "ha-fleet").await?;
        let started = Instant::now();
        let sims = replicas.connect(env, "ha-fleet", n, &ca, objects).await?;
        let seconds = started.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let side = FleetSide {
            seconds,
            rss_kib: replicas.rss_kib()?,
            connected: connected(&replicas.hubs.iter().collect::<Vec<_>>()).await?,
        };
        let owned = replicas.owned_accounts().await?;
        drop(sims);
        (side, owned)
    };
    let embedded = {
        let hub = env.hub("ha-fleet-embedded").await?;
        let grpc = hub.grpc_addr;
        let started = Instant::now();
        let sims = connect_fleet(Sim::fleet(env, "ha-fleet", n)?, |_| grpc, &ca, objects).await?;
        let seconds = started.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let side = FleetSide {
            seconds,
            rss_kib: hub.stats()?.rss_kib,
            connected: connected(&[&hub]).await?,
        };
        drop(sims);
        side
    };
    let per_replica = replicated
        .connected
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" + ");
    rows.push(Row {
        id: "ha-fleet".into(),
        measure: 11,
        title: format!(
            "{n} simulated agents over {REPLICAS} hub replicas on one PostgreSQL ({objects} ConfigMaps each, {} connecting at a time)",
            super::soak::CONNECTING
        ),
        system: format!(
            "all streaming and acknowledged in {}; hubs' total RSS {} ({per_replica} agents connected)",
            secs(replicated.seconds),
            mib(replicated.rss_kib),
        ),
        baseline_name: format!("the same {n} agents on one hub on the embedded store"),
        baseline: format!(
            "all streaming and acknowledged in {}; hub RSS {} ({} agents connected)",
            secs(embedded.seconds),
            mib(embedded.rss_kib),
            embedded.connected.iter().sum::<usize>()
        ),
        note: format!(
            "agent i connects to replica i % 3 (as a Service spreads connections); {owned} accounts in account_owners once all streamed{}; the fake agents' TLS and protobuf run in the bench process on the same cores; PostgreSQL's own memory is not in the replicas' RSS",
            if owned == 0 {
                " (the replicas took no ownership: each streamed whatever it was given)"
            } else {
                ""
            }
        ),
        values: json!({
            "agents": n,
            "replicas": REPLICAS,
            "replicated_seconds": replicated.seconds,
            "replicated_rss_kib": replicated.rss_kib,
            "replicated_connected": replicated.connected,
            "owned_accounts": owned,
            "embedded_seconds": embedded.seconds,
            "embedded_rss_kib": embedded.rss_kib,
            "embedded_connected": embedded.connected,
        }),
    });
    Ok(())
}

/// What became of one agent whose hub was killed.
enum Outcome {
    Streaming {
        /// Seconds from the kill until its stream ended.
        ended: f64,
        /// Seconds from the kill until a hub assigned it STREAMING.
        streaming: f64,
        /// The assignment carried a resume point for its kind (else it relisted).
        resumed: bool,
    },
    Failed(String),
}

/// Agent `sim`, whose hub was just killed, notices its stream end and reconnects to
/// `addrs` (from `first` on, round the list, every [`RETRY`] while none answers) until an
/// assignment STREAMING, then resumes or relists as the assignment says.
async fn recover(
    sim: &mut Sim,
    addrs: &[SocketAddr],
    first: usize,
    ca: &str,
    objects: usize,
    killed_at: Instant,
    deadline: tokio::time::Instant,
) -> Outcome {
    let Some(old) = sim.fake.take() else {
        return Outcome::Failed(format!("{}: was not connected", sim.account));
    };
    if tokio::time::timeout_at(deadline, old.ended())
        .await
        .is_err()
    {
        return Outcome::Failed(format!(
            "{}: its stream to the killed hub did not end",
            sim.account
        ));
    }
    let ended = killed_at.elapsed().as_secs_f64();
    let token = old.session_token.clone();
    drop(old);
    let (cert, key) = (&sim.cert.0, &sim.cert.1);
    let host = format!("https://{}.bench:443", sim.account);
    let mut last_error = String::from("no attempt");
    for attempt in 0.. {
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        let addr = addrs[(first + attempt) % addrs.len()];
        let connected = tokio::time::timeout_at(
            deadline,
            FakeAgent::reconnect(addr, ca, cert, key, "ha-0", token.clone()),
        )
        .await;
        let mut fake = match connected {
            Ok(Ok(fake)) => fake,
            Ok(Err(e)) => {
                last_error = format!("connect to {addr}: {e:#}");
                tokio::time::sleep(RETRY).await;
                continue;
            }
            Err(_) => break,
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let assignment = match fake.register_streaming(&sim.account, &host, left).await {
            Ok(a) => a,
            Err(e) => {
                last_error = format!("register on {addr}: {e:#}");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let streaming = killed_at.elapsed().as_secs_f64();
        let kind = configmaps();
        let resumed = assignment.resume_points.iter().any(|p| {
            p.kind
                .as_ref()
                .is_some_and(|k| k.group == kind.group && k.plural == kind.plural)
        });
        if !resumed {
            // No resume point: a real agent lists the kind again.
            sim.rv += 1;
            if let Err(e) = fake.snapshot(&sim.account, objects, sim.rv).await {
                return Outcome::Failed(format!("{}: relist: {e:#}", sim.account));
            }
        }
        if let Err(e) = fake.synced(LONG).await {
            return Outcome::Failed(format!("{}: after streaming: {e:#}", sim.account));
        }
        sim.fake = Some(fake);
        return Outcome::Streaming {
            ended,
            streaming,
            resumed,
        };
    }
    Outcome::Failed(format!(
        "{}: not streaming {} after the kill (last: {last_error})",
        sim.account,
        secs(killed_at.elapsed().as_secs_f64())
    ))
}

/// The outcomes of one kill, summed up.
struct Recovery {
    agents: usize,
    streaming: Vec<f64>,
    ended: Vec<f64>,
    relists: usize,
    failures: Vec<String>,
    hub_relists: f64,
}

impl Recovery {
    fn of(outcomes: Vec<Outcome>, hub_relists: f64) -> Self {
        let mut r = Recovery {
            agents: outcomes.len(),
            streaming: Vec::new(),
            ended: Vec::new(),
            relists: 0,
            failures: Vec::new(),
            hub_relists,
        };
        for outcome in outcomes {
            match outcome {
                Outcome::Streaming {
                    ended,
                    streaming,
                    resumed,
                } => {
                    r.ended.push(ended);
                    r.streaming.push(streaming);
                    r.relists += usize::from(!resumed);
                }
                Outcome::Failed(e) => r.failures.push(e),
            }
        }
        r
    }

    fn last(&self) -> f64 {
        self.streaming.iter().copied().fold(0.0, f64::max)
    }

    fn text(&self, timeout: Duration) -> String {
        let p = Percentiles::of(&self.streaming);
        let head = if self.failures.is_empty() {
            format!(
                "all {} accounts streaming again {} after the kill (p50 {})",
                self.agents,
                secs(self.last()),
                secs(p.p50)
            )
        } else {
            format!(
                "{} of {} accounts NOT streaming within {} of the kill ({} were, the last after {}; first failure: {})",
                self.failures.len(),
                self.agents,
                secs(timeout.as_secs_f64()),
                self.streaming.len(),
                secs(self.last()),
                self.failures[0]
            )
        };
        format!(
            "{head}; {} relists (assignments without a resume point; the hubs counted {} snapshots begun)",
            self.relists, self.hub_relists
        )
    }

    fn values(&self) -> serde_json::Value {
        json!({
            "agents": self.agents,
            "streaming_seconds": self.streaming,
            "stream_ended_seconds": self.ended,
            "last_streaming_seconds": self.last(),
            "relists": self.relists,
            "hub_relists": self.hub_relists,
            "failures": self.failures,
        })
    }
}

/// Sum of the hubs' relist counters.
async fn relists(hubs: &[&HubProc]) -> Result<f64> {
    let mut sum = 0.0;
    for hub in hubs {
        sum += hub.metric(RELISTS).await?;
    }
    Ok(sum)
}

/// `--ha-failover-agents` agents over three replicas, one killed, beside one embedded hub
/// killed and restarted.
pub async fn failover(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let n = o.ha_failover_agents.max(REPLICAS);
    let objects = o.agent_objects.max(1);
    let timeout = Duration::from_secs(o.ha_failover_timeout_secs.max(1));
    let ca = env.pki.ca.cert_pem.clone();

    let (replicated, owned) = {
        let mut replicas = Replicas::start(env, "ha-failover").await?;
        let sims = replicas
            .connect(env, "ha-failover", n, &ca, objects)
            .await?;
        let addrs = replicas.grpc_addrs();
        let (mut victims, others): (Vec<_>, Vec<_>) = sims
            .into_iter()
            .enumerate()
            .partition(|(i, _)| i % REPLICAS == 0);
        let survivors: Vec<SocketAddr> = addrs[1..].to_vec();
        let owned = replicas.owned_accounts().await?;
        let before = relists(&replicas.hubs[1..].iter().collect::<Vec<_>>()).await?;
        tokio::time::sleep(SETTLE).await;
        replicas.hubs[0].kill();
        let killed_at = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        // Every agent of the killed replica at once, as their streams all end together;
        // each starts with a different survivor, as a Service spreads new connections.
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
        let after = relists(&replicas.hubs[1..].iter().collect::<Vec<_>>()).await?;
        let recovery = Recovery::of(outcomes, after - before);
        drop(victims);
        drop(others);
        drop(replicas);
        (recovery, owned)
    };

    let embedded = {
        let mut hub = env.hub("ha-failover-embedded").await?;
        let grpc = hub.grpc_addr;
        let mut sims =
            connect_fleet(Sim::fleet(env, "ha-failover", n)?, |_| grpc, &ca, objects).await?;
        tokio::time::sleep(SETTLE).await;
        hub.kill();
        let killed_at = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let addrs = [grpc];
        let agents = futures::future::join_all(
            sims.iter_mut()
                .map(|sim| recover(sim, &addrs, 0, &ca, objects, killed_at, deadline)),
        );
        // Restarted at once on the same ports and data, as a pod restarted in place with
        // its volume (Kubernetes' own restart delay not counted).
        let (restarted, outcomes) = tokio::join!(hub.start(), agents);
        restarted?;
        // The restarted process counts from zero.
        let hub_relists = relists(&[&hub]).await?;
        let recovery = Recovery::of(outcomes, hub_relists);
        drop(sims);
        recovery
    };

    rows.push(Row {
        id: "ha-failover".into(),
        measure: 11,
        title: format!(
            "Failover: {n} simulated agents over {REPLICAS} hub replicas on one PostgreSQL, one replica killed (SIGKILL); its {} agents reconnect to another replica",
            replicated.agents
        ),
        system: replicated.text(timeout),
        baseline_name: format!(
            "one hub on the embedded store with the same {n} agents, killed (SIGKILL) and restarted at once on its data; all {n} reconnect to it"
        ),
        baseline: embedded.text(timeout),
        note: format!(
            "killed {} s after the last snapshot was acknowledged; {owned} accounts in account_owners before the kill{}; times from the kill to the STREAMING assignment on the agent's side; streams ended p50 {} after the kill (replicas) and {} (embedded); an agent whose stream ended tries a surviving replica's address, the next one every {} ms while it gets no STREAMING; a STANDBY answer is waited out (the replica promotes it when the killed replica's lock frees); an agent given no resume point sends a new snapshot (a relist); the baseline's time includes the hub process's start",
            SETTLE.as_secs(),
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
            "owned_accounts_before_kill": owned,
            "replicated": replicated.values(),
            "embedded": embedded.values(),
        }),
    });
    Ok(())
}
