//! The chaos test: a seeded random schedule of faults on hub replicas sharing a real
//! PostgreSQL ([`ReplicaFleet`]: two hub processes, two agent processes of one account
//! behind a load balancer, a private control plane with an audit log) while objects churn
//! ([`Churn`]: ConfigMaps, Secrets and PodTemplates). Each round takes one fault: the
//! replica owning the account killed (SIGKILL, started again on its data directory), the
//! streaming agent killed (its standby takes over), an agent paused (SIGSTOP, then SIGCONT),
//! kube-apiserver restarted, etcd compacted while the agents are away, and issue 29's
//! partial failures: the owning replica frozen (SIGSTOP until the other replica took the
//! account, then SIGCONT), the owning replica partitioned from PostgreSQL or from its agents
//! (a relay gone silent, then healed), PostgreSQL stopped for a while.
//!
//! After each round: the account streams again on some replica within [`STREAMS_AGAIN`] of
//! the fault's end (and, for the faults that take the owner away, on another replica within
//! [`TAKEN_OVER`] of the fault's start), and every replica names the same agent as the one
//! streaming it (a replica that lost the account and still served it would name its own);
//! every replica's cache equals the API server, kind
//! by kind, by uid and resourceVersion (nothing lost, nothing ghosted, nothing stale); the
//! agents made no LIST (the audit log), except in the rounds whose fault makes a relist the
//! right answer ([`Disruption::may_relist`]); `ownership_history` never has two replicas
//! owning the account at once.
//!
//! The seed is printed first; `SCALE_AGENT_CHAOS_SEED=<seed>` replays a schedule (the
//! timing of the processes is the machine's, so a replay is the same schedule, not the same
//! interleaving). `ROUNDS` sets the number of rounds: `make test` runs one round of each
//! fault with a fixed seed, `make chaos ROUNDS=100` long ones with a random seed. The first
//! [`DISRUPTIONS`]`.len()` rounds of any schedule take each fault once, in a seeded order.

use std::time::{Duration, Instant};

use anyhow::Context;
use rand::{Rng, SeedableRng, rngs::StdRng, seq::SliceRandom};
use scale_agent_e2e::{
    churn::{Churn, ChurnKind},
    fixtures,
    process::send_signal,
    replica_fleet::{FleetOptions, ReplicaFleet, history_without_overlap, owners},
};

/// The seed `make test` runs; `SCALE_AGENT_CHAOS_SEED` replaces it.
const DEFAULT_SEED: u64 = 20_261_127;
/// Rounds `make test` runs (each fault once); `ROUNDS` replaces it.
const DEFAULT_ROUNDS: usize = DISRUPTIONS.len();
/// How long the caches may take to catch up with the API server after a round.
const CONVERGE: Duration = Duration::from_secs(90);
/// How long after a round's fault ended the account may take to stream again.
const STREAMS_AGAIN: Duration = Duration::from_secs(60);
/// How long after a fault took its owner away (frozen, partitioned) the account may take to
/// stream on another replica. Issue 29's goal is 30 s, which holds while a standby agent is
/// connected to the other replica (the lock session's 15 s lease, or the HTTP/2 keepalive);
/// when both agents were on the replica taken away, a reconnection the load balancer sends
/// back to it waits out the agent's 30 s Welcome timeout first. The figure of each round
/// is printed.
const TAKEN_OVER: Duration = Duration::from_secs(60);
/// How long the replicas may take to agree on the agent that streams the account.
const AGREE: Duration = Duration::from_secs(15);
/// The account the agents stream.
const ACCOUNT: &str = "chaos";

/// The kinds streamed: a plain one, Secrets (the agent strips their data), and PodTemplates,
/// whose watch cache the harness turns off, so a watch from a compacted resourceVersion
/// gets a real 410 Gone.
fn kinds() -> Vec<ChurnKind> {
    vec![
        ChurnKind::config_maps(),
        ChurnKind::secrets(),
        ChurnKind::pod_templates(),
    ]
}

/// What happens to the system in a round, besides churn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Disruption {
    /// SIGKILL the replica owning the account; start it again on its data directory.
    KillHub,
    /// SIGKILL the agent that streams; its standby takes over; start it again.
    KillStreamingAgent,
    /// SIGSTOP the streaming agent past the hub's heartbeat timeout (sometimes), then SIGCONT.
    PauseAgent,
    /// Stop and start kube-apiserver: every watch breaks.
    RestartApiServer,
    /// SIGKILL both agents, compact etcd, start them again: their resume points are
    /// compacted away.
    CompactWhileAway,
    /// SIGSTOP the replica owning the account until the other one took it (its lock
    /// session's lease ends), then SIGCONT: it must stop serving what it no longer owns.
    FreezeReplica,
    /// Cut the replica owning the account off from PostgreSQL (its relay goes silent) until
    /// the other one took it, then heal.
    PartitionFromPostgres,
    /// Cut the replica owning the account off from its agents (their relay goes silent)
    /// until the other one took it, then heal.
    PartitionFromAgents,
    /// Stop PostgreSQL for a few seconds, then start it again.
    StopPostgres,
}

const DISRUPTIONS: [Disruption; 9] = [
    Disruption::KillHub,
    Disruption::KillStreamingAgent,
    Disruption::PauseAgent,
    Disruption::RestartApiServer,
    Disruption::CompactWhileAway,
    Disruption::FreezeReplica,
    Disruption::PartitionFromPostgres,
    Disruption::PartitionFromAgents,
    Disruption::StopPostgres,
];

impl Disruption {
    /// Whether the agents may LIST again in this round: their resume points compacted away
    /// (410 Gone), or a restarted API server whose watch cache starts after them.
    fn may_relist(self) -> bool {
        matches!(
            self,
            Disruption::CompactWhileAway | Disruption::RestartApiServer
        )
    }
}

/// The schedule of `rounds` rounds from `seed`: each disruption once in a seeded order,
/// then seeded draws.
fn schedule(seed: u64, rounds: usize) -> Vec<Disruption> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut first = DISRUPTIONS.to_vec();
    first.shuffle(&mut rng);
    (0..rounds)
        .map(|round| match first.get(round) {
            Some(disruption) => *disruption,
            None => DISRUPTIONS[rng.random_range(0..DISRUPTIONS.len())],
        })
        .collect()
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// The world of one run.
struct Chaos {
    fleet: ReplicaFleet,
    rng: StdRng,
    /// What each round did, for the failure message.
    log: Vec<String>,
}

impl Chaos {
    async fn start(seed: u64) -> anyhow::Result<Chaos> {
        let dir = fixtures::temp_dir("scale-agent-chaos")?;
        let fleet = ReplicaFleet::start(
            &dir,
            FleetOptions {
                label: "chaos",
                accounts: vec![ACCOUNT.into()],
                kinds: kinds(),
                config_maps: 0,
                postgres_relays: true,
                converge: CONVERGE,
                ..FleetOptions::default()
            },
        )
        .await?;
        Ok(Chaos {
            fleet,
            rng: StdRng::seed_from_u64(seed),
            log: Vec::new(),
        })
    }

    /// The index of the replica owning the account (in `account_owners`).
    async fn owner(&self) -> anyhow::Result<usize> {
        let sql = self.fleet.sql().await?;
        let owners = owners(&sql).await?;
        let owner = owners
            .get(ACCOUNT)
            .ok_or_else(|| anyhow::anyhow!("nobody owns {ACCOUNT}: {owners:?}"))?;
        Ok(self.fleet.index(owner))
    }

    /// The agent the owner says streams the account.
    async fn streaming_agent(&self) -> anyhow::Result<usize> {
        let deadline = Instant::now() + STREAMS_AGAIN;
        loop {
            let owner = self.owner().await.ok();
            if let Some(owner) = owner
                && let Ok(Some(replica)) = self.fleet.hubs[owner].streaming_replica(ACCOUNT).await
                && let Some(index) = self.agents().iter().position(|a| a.replica == replica)
            {
                return Ok(index);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no agent streams {ACCOUNT} after {STREAMS_AGAIN:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn agents(&self) -> &[scale_agent_e2e::fleet::AgentProcess] {
        &self.fleet.accounts[0].agents
    }

    fn agent(&mut self, index: usize) -> &mut scale_agent_e2e::fleet::AgentProcess {
        &mut self.fleet.accounts[0].agents[index]
    }

    /// A pause of `min..max` ms, seeded.
    async fn pause_for(&mut self, min: u64, max: u64) -> Duration {
        let pause = Duration::from_millis(self.rng.random_range(min..max));
        tokio::time::sleep(pause).await;
        pause
    }

    /// Waits until a replica other than `victim` owns and streams the account, as the
    /// replicas other than `victim` answer; how long since `since`.
    async fn taken_over(&self, victim: usize, since: Instant) -> anyhow::Result<Duration> {
        let sql = self.fleet.sql().await?;
        let others: Vec<usize> = (0..self.fleet.hubs.len())
            .filter(|i| *i != victim)
            .collect();
        let victim = self.fleet.names[victim].clone();
        let took = self
            .fleet
            .all_streaming(
                &sql,
                since,
                TAKEN_OVER,
                Some(others.as_slice()),
                |_, owner| owner != victim,
            )
            .await?;
        Ok(took.values().copied().max().unwrap_or_default())
    }

    /// Waits until every replica names the same agent as the account's streaming one: a
    /// replica that lost the account (frozen, cut off) and still served it would name the
    /// agent connected to it.
    async fn one_streaming_agent(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + AGREE;
        loop {
            let mut views = Vec::new();
            for hub in &self.fleet.hubs {
                views.push(hub.streaming_replica(ACCOUNT).await.ok().flatten());
            }
            if views[0].is_some() && views.iter().all(|v| *v == views[0]) {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "after {AGREE:?} the replicas {:?} name these streaming agents: {views:?}\n{}",
                self.fleet.names,
                self.fleet.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Runs `disruption` under the churn; returns when the fault is over (healed, restarted).
    async fn disrupt(&mut self, disruption: Disruption) -> anyhow::Result<Instant> {
        match disruption {
            Disruption::KillHub => {
                let owner = self.owner().await?;
                self.fleet.hubs[owner].kill();
                let down = self.pause_for(0, 1500).await;
                self.fleet.hubs[owner].start_again().await?;
                self.log.push(format!(
                    "  {} (the owner) killed, down {down:?} and more",
                    self.fleet.names[owner]
                ));
            }
            Disruption::KillStreamingAgent => {
                let index = self.streaming_agent().await?;
                self.agent(index).kill();
                let gone = self.pause_for(200, 2000).await;
                self.agent(index).start_again().await?;
                let replica = self.agents()[index].replica.clone();
                self.log
                    .push(format!("  killed agent {replica}, gone {gone:?} and more"));
            }
            Disruption::PauseAgent => {
                let index = self.streaming_agent().await?;
                self.agent(index).pause();
                // The hub ends a stream silent for two heartbeats (1 s each): sometimes
                // less, sometimes more.
                let paused = self.pause_for(500, 5000).await;
                self.agent(index).resume();
                let replica = self.agents()[index].replica.clone();
                self.log
                    .push(format!("  paused agent {replica} for {paused:?}"));
            }
            Disruption::RestartApiServer => {
                let down = self.fleet.control_plane.restart_apiserver().await?;
                self.log
                    .push(format!("  kube-apiserver restarted, down {down:?}"));
            }
            Disruption::CompactWhileAway => {
                for index in 0..self.agents().len() {
                    self.agent(index).kill();
                }
                self.pause_for(300, 1500).await;
                let revision = self.fleet.control_plane.compact_etcd().await?;
                self.pause_for(300, 1500).await;
                for index in 0..self.agents().len() {
                    self.agent(index).start_again().await?;
                }
                self.log.push(format!(
                    "  etcd compacted to {revision} while both agents were away"
                ));
            }
            Disruption::FreezeReplica => {
                let owner = self.owner().await?;
                let pid = self.fleet.hubs[owner]
                    .pid()
                    .ok_or_else(|| anyhow::anyhow!("the owner does not run"))?;
                send_signal(pid, libc::SIGSTOP);
                let frozen = Instant::now();
                let took = self.taken_over(owner, frozen).await;
                let more = self.pause_for(0, 3000).await;
                // Thawed even when the take-over failed: a stopped process would outlive
                // the test.
                send_signal(pid, libc::SIGCONT);
                let took = took?;
                self.log.push(format!(
                    "  {} (the owner) frozen; the account streamed elsewhere after {took:?}; \
                     thawed {more:?} later",
                    self.fleet.names[owner]
                ));
            }
            Disruption::PartitionFromPostgres | Disruption::PartitionFromAgents => {
                let owner = self.owner().await?;
                let (relays, from) = if disruption == Disruption::PartitionFromPostgres {
                    (&self.fleet.postgres_relays, "PostgreSQL")
                } else {
                    (&self.fleet.relays, "its agents")
                };
                relays[owner].blackhole();
                let cut = Instant::now();
                let took = self.taken_over(owner, cut).await;
                let more = self.pause_for(0, 3000).await;
                let relays = if disruption == Disruption::PartitionFromPostgres {
                    &self.fleet.postgres_relays
                } else {
                    &self.fleet.relays
                };
                relays[owner].restore();
                let took = took?;
                self.log.push(format!(
                    "  {} (the owner) cut off from {from}; the account streamed elsewhere \
                     after {took:?}; healed {more:?} later",
                    self.fleet.names[owner]
                ));
            }
            Disruption::StopPostgres => {
                self.fleet.postgres.stop().await;
                let down = self.pause_for(5000, 20_000).await;
                self.fleet.postgres.start_again().await?;
                self.log
                    .push(format!("  PostgreSQL stopped for {down:?} and more"));
            }
        }
        Ok(Instant::now())
    }

    /// One round: `disruption` under churn, then the checks. How long the account took to
    /// stream again after the fault and the caches to catch up after the churn.
    async fn round(
        &mut self,
        seed: u64,
        round: usize,
        disruption: Disruption,
    ) -> anyhow::Result<(Duration, Duration)> {
        let lists_before = self.fleet.lists()?;
        let churn = Churn::start_kinds(
            self.fleet.namespaces(),
            seed.wrapping_add(round as u64 * 1000),
            kinds(),
        );
        self.pause_for(300, 1500).await;
        let healed = self.disrupt(disruption).await?;
        self.pause_for(300, 1500).await;
        let changes = churn.finish().await?;
        self.log
            .push(format!("  {changes} changes across the round"));
        for agent in self.agents() {
            anyhow::ensure!(
                agent.is_running(),
                "agent {} exited by itself: {}",
                agent.replica,
                agent.log_tail(30)
            );
        }
        let sql = self.fleet.sql().await?;
        let again = self
            .fleet
            .all_streaming(&sql, healed, STREAMS_AGAIN, None, |_, _| true)
            .await?;
        self.one_streaming_agent().await?;
        let caught_up = self.fleet.converged().await?;
        let lists = self.fleet.lists()?;
        anyhow::ensure!(
            disruption.may_relist() || lists == lists_before,
            "the agents LISTed again: {lists_before:?} before the round, {lists:?} after"
        );
        history_without_overlap(&sql).await?;
        Ok((again.values().copied().max().unwrap_or_default(), caught_up))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_round_of_chaos_ends_streaming_equal_to_the_api_server_without_relists_or_overlap()
-> anyhow::Result<()> {
    let seed = env_or("SCALE_AGENT_CHAOS_SEED", DEFAULT_SEED);
    let rounds = env_or("ROUNDS", DEFAULT_ROUNDS);
    let plan = schedule(seed, rounds);
    eprintln!(
        "[chaos] seed {seed}, {rounds} rounds (replay: SCALE_AGENT_CHAOS_SEED={seed} ROUNDS={rounds})"
    );
    let started = Instant::now();
    let mut chaos = Chaos::start(seed).await?;
    let sql = chaos.fleet.sql().await?;
    chaos
        .fleet
        .all_streaming(&sql, started, Duration::from_secs(120), None, |_, _| true)
        .await?;
    drop(sql);
    let settled = chaos.fleet.converged().await?;
    eprintln!(
        "[chaos] streaming and caches equal in {:?} ({settled:?} after streaming)",
        started.elapsed()
    );
    for (round, disruption) in plan.into_iter().enumerate() {
        let round = round + 1;
        chaos.log.push(format!("round {round}: {disruption:?}"));
        let began = Instant::now();
        let (again, caught_up) = chaos
            .round(seed, round, disruption)
            .await
            .with_context(|| {
                format!(
                    "round {round} of seed {seed} (replay: SCALE_AGENT_CHAOS_SEED={seed} \
                     ROUNDS={round} cargo test -p scale-agent-e2e --test chaos; logs kept in \
                     {dir}); schedule so far:\n{log}",
                    dir = chaos.fleet.dir.display(),
                    log = chaos.log.join("\n"),
                )
            })?;
        eprintln!(
            "[chaos] round {round}/{rounds} {disruption:?}: {:?}; streaming again {again:?} \
             after the fault, caches equal {caught_up:?} after the churn\n{}",
            began.elapsed(),
            chaos
                .log
                .iter()
                .rev()
                .take_while(|l| l.starts_with("  "))
                .cloned()
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    eprintln!(
        "[chaos] seed {seed}: {rounds} rounds in {:?}, after each the account streamed, the \
         caches equal to the API server, no relist but where due, no overlapping ownership",
        started.elapsed()
    );
    chaos.fleet.passed = true;
    Ok(())
}

#[test]
fn every_schedule_takes_each_disruption_in_its_first_rounds() {
    let n = DISRUPTIONS.len();
    for seed in [0, 1, DEFAULT_SEED, u64::MAX] {
        let plan = schedule(seed, n + 7);
        assert_eq!(plan.len(), n + 7);
        for disruption in DISRUPTIONS {
            assert!(plan[..n].contains(&disruption), "{seed}: {plan:?}");
        }
        assert_eq!(plan, schedule(seed, n + 7), "a seed replays its schedule");
    }
    assert_eq!(schedule(DEFAULT_SEED, DEFAULT_ROUNDS).len(), n);
}
