//! The chaos test: a seeded random schedule of object churn on a private control plane
//! while the hub is killed (SIGKILL, restarted on the same data directory), the streaming
//! agent is killed (its standby takes over), an agent is paused (SIGSTOP, then SIGCONT),
//! kube-apiserver is restarted, and etcd is compacted while the agents are away. After each
//! round the hub's cache must equal the API server's state, kind by kind, by uid and
//! resourceVersion: nothing lost, nothing ghosted, nothing stale.
//!
//! The seed is printed first; `SCALE_AGENT_CHAOS_SEED=<seed>` replays a schedule (the
//! timing of the processes is the machine's, so a replay is the same schedule, not the same
//! interleaving). `ROUNDS` sets the number of rounds: `make test` runs a few with a fixed
//! seed, `make chaos ROUNDS=100` long ones with a random seed. The first five rounds of any
//! schedule take each disruption once, in a seeded order.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use rand::{Rng, SeedableRng, rngs::StdRng, seq::SliceRandom};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    fixtures::{self, Scope},
    fleet::{AgentProcess, HubProcess},
};
use serde_json::{Value, json};

/// The seed `make test` runs; `SCALE_AGENT_CHAOS_SEED` replaces it.
const DEFAULT_SEED: u64 = 20_261_127;
/// Rounds `make test` runs (each disruption once); `ROUNDS` replaces it.
const DEFAULT_ROUNDS: usize = 5;
/// How long the hub may take to catch up with the API server after a round.
const CONVERGE: Duration = Duration::from_secs(90);
/// Names each kind's objects are drawn from: small, so churn updates and deletes often.
const NAMES: usize = 8;

/// The kinds streamed: a plain one, Secrets (the agent strips their data), and PodTemplates,
/// whose watch cache the harness turns off, so a watch from a compacted resourceVersion
/// gets a real 410 Gone.
fn kinds() -> Vec<(ApiResource, &'static str)> {
    let core = |kind: &str, plural: &str| ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    vec![
        (core("ConfigMap", "configmaps"), "cm"),
        (core("Secret", "secrets"), "secret"),
        (core("PodTemplate", "podtemplates"), "pt"),
    ]
}

/// What happens to the system in a round, besides churn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Disruption {
    /// SIGKILL the hub, churn while it is down, start it again on the same data directory.
    KillHub,
    /// SIGKILL the replica that streams; the standby takes over; start it again.
    KillStreamingAgent,
    /// SIGSTOP the streaming replica past the hub's heartbeat timeout, then SIGCONT.
    PauseAgent,
    /// Stop and start kube-apiserver: every watch breaks.
    RestartApiServer,
    /// SIGKILL both replicas, churn, compact etcd, churn, start them again: their resume
    /// points are compacted away.
    CompactWhileAway,
}

const DISRUPTIONS: [Disruption; 5] = [
    Disruption::KillHub,
    Disruption::KillStreamingAgent,
    Disruption::PauseAgent,
    Disruption::RestartApiServer,
    Disruption::CompactWhileAway,
];

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

/// `(uid, resourceVersion)` by name.
type State = fixtures::UidVersions;

use fixtures::uid_versions as state_of;

/// Lost, ghosted and stale objects of the hub against the API server, or `None` when equal.
fn difference(api: &State, hub: &State) -> Option<String> {
    let lost: Vec<_> = api.keys().filter(|n| !hub.contains_key(*n)).collect();
    let ghosts: Vec<_> = hub.keys().filter(|n| !api.contains_key(*n)).collect();
    let stale: Vec<_> = api
        .iter()
        .filter_map(|(n, a)| hub.get(n).filter(|h| *h != a).map(|h| (n, a, h)))
        .collect();
    if lost.is_empty() && ghosts.is_empty() && stale.is_empty() {
        return None;
    }
    Some(format!(
        "lost (in the API server, not in the hub): {lost:?}; ghosts (in the hub, not in the \
         API server): {ghosts:?}; stale (name, API server's (uid, rv), hub's): {stale:?}"
    ))
}

/// The world of one run.
struct Chaos {
    control_plane: ControlPlane,
    admin: Client,
    namespace: String,
    account: String,
    hub: HubProcess,
    agents: Vec<AgentProcess>,
    rng: StdRng,
    /// What each round did, for the failure message.
    log: Vec<String>,
    seed: u64,
    dir: PathBuf,
}

impl Chaos {
    fn api(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.admin.clone(), &self.namespace, resource)
    }

    /// One random create, update or delete; retried while the API server is coming back.
    async fn churn_once(&mut self) -> anyhow::Result<()> {
        let kinds = kinds();
        let (resource, prefix) = &kinds[self.rng.random_range(0..kinds.len())];
        let name = format!("{prefix}-{}", self.rng.random_range(0..NAMES));
        let value = self.rng.random_range(0..1_000_000u32).to_string();
        let delete = self.rng.random_bool(0.3);
        let api = self.api(resource);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self
                .apply_change(&api, resource, &name, &value, delete)
                .await
            {
                Ok(()) => return Ok(()),
                Err(e) if attempt < 50 => {
                    tracing::debug!("churn on {name}: {e}; again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e.context(format!("churn on {}/{name}", resource.plural))),
            }
        }
    }

    async fn apply_change(
        &self,
        api: &Api<DynamicObject>,
        resource: &ApiResource,
        name: &str,
        value: &str,
        delete: bool,
    ) -> anyhow::Result<()> {
        let exists = api.get_opt(name).await?.is_some();
        match (exists, delete) {
            (true, true) => {
                api.delete(name, &DeleteParams::default()).await?;
            }
            (true, false) => {
                let change = match resource.kind.as_str() {
                    "ConfigMap" => json!({ "data": { "v": value } }),
                    "Secret" => json!({ "stringData": { "v": value } }),
                    _ => json!({ "metadata": { "labels": { "v": value } } }),
                };
                api.patch(name, &PatchParams::default(), &Patch::Merge(change))
                    .await?;
            }
            (false, _) => {
                let mut object = json!({
                    "apiVersion": resource.api_version,
                    "kind": resource.kind,
                    "metadata": { "name": name, "labels": { "v": value } },
                });
                match resource.kind.as_str() {
                    "ConfigMap" => object["data"] = json!({ "v": value }),
                    "Secret" => object["stringData"] = json!({ "v": value }),
                    _ => {
                        object["template"] = json!({
                            "spec": { "containers": [{ "name": "c", "image": "nginx" }] }
                        })
                    }
                }
                let object: DynamicObject = serde_json::from_value(object)?;
                match api.create(&PostParams::default(), &object).await {
                    // Created by an attempt whose answer was lost.
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    other => {
                        other?;
                    }
                }
            }
        }
        Ok(())
    }

    async fn churn(&mut self, what: &str) -> anyhow::Result<()> {
        let n = self.rng.random_range(2..8);
        for _ in 0..n {
            self.churn_once().await?;
        }
        self.log.push(format!("  {n} changes {what}"));
        Ok(())
    }

    /// The replica the hub says streams the account, waiting for one to.
    async fn streaming(&self) -> anyhow::Result<usize> {
        let deadline = Instant::now() + CONVERGE;
        loop {
            if let Ok(Some(replica)) = self.hub.streaming_replica(&self.account).await
                && let Some(index) = self.agents.iter().position(|a| a.replica == replica)
            {
                return Ok(index);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no replica streams {} after {CONVERGE:?}",
                self.account
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn disrupt(&mut self, disruption: Disruption) -> anyhow::Result<()> {
        match disruption {
            Disruption::KillHub => {
                self.churn("before").await?;
                self.hub.kill();
                self.churn("while the hub is down").await?;
                let down = Duration::from_millis(self.rng.random_range(0..1500));
                tokio::time::sleep(down).await;
                self.hub.start_again().await?;
                self.log.push(format!("  hub killed, down {down:?} more"));
                self.churn("after").await?;
            }
            Disruption::KillStreamingAgent => {
                self.churn("before").await?;
                let index = self.streaming().await?;
                self.agents[index].kill();
                self.log
                    .push(format!("  killed {}", self.agents[index].replica));
                self.churn("while it is gone").await?;
                self.agents[index].start_again().await?;
                self.churn("after").await?;
            }
            Disruption::PauseAgent => {
                let index = self.streaming().await?;
                self.agents[index].pause();
                // The hub ends a stream silent for two heartbeats (1 s each): sometimes
                // less, sometimes more.
                let paused = Duration::from_millis(self.rng.random_range(500..5000));
                self.churn("while paused").await?;
                tokio::time::sleep(paused).await;
                self.agents[index].resume();
                self.log.push(format!(
                    "  paused {} for {paused:?} and more",
                    self.agents[index].replica
                ));
                self.churn("after").await?;
            }
            Disruption::RestartApiServer => {
                self.churn("before").await?;
                let down = self.control_plane.restart_apiserver().await?;
                self.log
                    .push(format!("  kube-apiserver restarted, down {down:?}"));
                self.churn("after").await?;
            }
            Disruption::CompactWhileAway => {
                self.churn("before").await?;
                for agent in &mut self.agents {
                    agent.kill();
                }
                self.churn("while the agents are away").await?;
                let revision = self.control_plane.compact_etcd().await?;
                self.churn("after compaction").await?;
                for agent in &mut self.agents {
                    agent.start_again().await?;
                }
                self.log.push(format!(
                    "  etcd compacted to {revision} while both agents were away"
                ));
            }
        }
        Ok(())
    }

    /// Waits until the hub's cache equals the API server's for every kind; fails with the
    /// seed, the rounds so far and the difference.
    async fn converged(&self, round: usize) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let mut differences = Vec::new();
            for (resource, _) in kinds() {
                let api = self.api(&resource).list(&ListParams::default()).await;
                let hub = self
                    .hub
                    .objects(&self.account, &resource.plural, &self.namespace)
                    .await;
                match (api, hub) {
                    (Ok(api), Ok(hub)) => {
                        let api: Vec<Value> = api
                            .items
                            .iter()
                            .map(serde_json::to_value)
                            .collect::<Result<_, _>>()?;
                        if let Some(d) = difference(&state_of(&api), &state_of(&hub)) {
                            differences.push(format!("{}: {d}", resource.kind));
                        }
                    }
                    (api, hub) => differences.push(format!(
                        "{}: not read (API server: {:?}, hub: {:?})",
                        resource.kind,
                        api.err(),
                        hub.err()
                    )),
                }
            }
            if differences.is_empty() {
                return Ok(started.elapsed());
            }
            if started.elapsed() > CONVERGE {
                anyhow::bail!(
                    "round {round} of seed {seed}: after {CONVERGE:?} the hub's cache differs \
                     from the API server's (replay: SCALE_AGENT_CHAOS_SEED={seed} ROUNDS={rounds} \
                     cargo test -p scale-agent-e2e --test chaos; logs kept in {dir}):\n{diff}\n\
                     schedule so far:\n{log}\nhub log:\n{hub}\n{agents}",
                    seed = self.seed,
                    rounds = round + 1,
                    dir = self.dir.display(),
                    diff = differences.join("\n"),
                    log = self.log.join("\n"),
                    hub = self.hub.log_tail(20),
                    agents = self
                        .agents
                        .iter()
                        .map(|a| format!("agent {} log:\n{}", a.replica, a.log_tail(20)))
                        .collect::<Vec<_>>()
                        .join("\n"),
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// An agent that exited by itself (not killed by the schedule) is a failure.
    fn agents_alive(&self) -> anyhow::Result<()> {
        for agent in &self.agents {
            anyhow::ensure!(
                agent.is_running(),
                "agent {} exited by itself: {}",
                agent.replica,
                agent.log_tail(30)
            );
        }
        Ok(())
    }
}

/// A directory for the logs and the hub's data, kept unless the run passed (or always,
/// with `SCALE_AGENT_E2E_KEEP`).
struct RunDir {
    path: PathBuf,
    passed: bool,
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.passed || std::env::var_os("SCALE_AGENT_E2E_KEEP").is_some() {
            eprintln!("[chaos] kept {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

async fn start(seed: u64, dir: &Path) -> anyhow::Result<Chaos> {
    let control_plane = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let admin = control_plane.client().await?;
    let namespace = control_plane.namespace(&admin, "chaos").await?;
    let kubeconfig = fixtures::service_account_identity(
        &control_plane,
        &admin,
        &namespace,
        "agent",
        Scope::Namespace,
        fixtures::read_rules(&["configmaps", "secrets", "podtemplates"]),
        dir.join("agent.kubeconfig"),
    )
    .await?;
    let hub = HubProcess::start(dir, &[]).await?;
    let account = "chaos".to_string();
    let config = dir.join("agent.yaml");
    let kinds = kinds();
    let kind_names: Vec<&str> = kinds.iter().map(|(r, _)| r.kind.as_str()).collect();
    fixtures::write_plaintext_agent_config(
        &config,
        hub.grpc,
        json!([fixtures::account(
            &account,
            &kubeconfig,
            &namespace,
            &kind_names
        )]),
        1,
    )?;
    let mut agents = Vec::new();
    for replica in ["r0", "r1"] {
        agents.push(AgentProcess::start(dir, &config, replica).await?);
    }
    Ok(Chaos {
        control_plane,
        admin,
        namespace,
        account,
        hub,
        agents,
        rng: StdRng::seed_from_u64(seed),
        log: Vec::new(),
        seed,
        dir: dir.to_path_buf(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_cache_equals_the_api_server_after_every_round_of_chaos() -> anyhow::Result<()> {
    let seed = env_or("SCALE_AGENT_CHAOS_SEED", DEFAULT_SEED);
    let rounds = env_or("ROUNDS", DEFAULT_ROUNDS);
    let plan = schedule(seed, rounds);
    eprintln!(
        "[chaos] seed {seed}, {rounds} rounds (replay: SCALE_AGENT_CHAOS_SEED={seed} ROUNDS={rounds})"
    );
    let mut dir = RunDir {
        path: fixtures::temp_dir("scale-agent-chaos")?,
        passed: false,
    };
    let started = Instant::now();
    let mut chaos = start(seed, &dir.path).await?;
    let settled = chaos.converged(0).await?;
    eprintln!("[chaos] initial sync in {settled:?}");
    for (round, disruption) in plan.into_iter().enumerate() {
        let round = round + 1;
        chaos.log.push(format!("round {round}: {disruption:?}"));
        let began = Instant::now();
        chaos.disrupt(disruption).await?;
        chaos.agents_alive()?;
        let caught_up = chaos.converged(round).await?;
        eprintln!(
            "[chaos] round {round}/{rounds} {disruption:?}: {:?}, hub caught up in {caught_up:?}",
            began.elapsed()
        );
    }
    eprintln!(
        "[chaos] seed {seed}: {rounds} rounds in {:?}, the hub's cache equal to the API server's after each",
        started.elapsed()
    );
    dir.passed = true;
    Ok(())
}

#[test]
fn every_schedule_takes_each_disruption_in_its_first_five_rounds() {
    for seed in [0, 1, DEFAULT_SEED, u64::MAX] {
        let plan = schedule(seed, 12);
        assert_eq!(plan.len(), 12);
        for disruption in DISRUPTIONS {
            assert!(plan[..5].contains(&disruption), "{seed}: {plan:?}");
        }
        assert_eq!(plan, schedule(seed, 12), "a seed replays its schedule");
    }
}

#[test]
fn differences_name_lost_ghosted_and_stale_objects() {
    let state = |items: &[(&str, &str, &str)]| -> State {
        items
            .iter()
            .map(|(n, u, r)| (n.to_string(), (u.to_string(), r.to_string())))
            .collect()
    };
    let api = state(&[("a", "u1", "5"), ("b", "u2", "6"), ("c", "u3", "7")]);
    assert_eq!(difference(&api, &api.clone()), None);
    let hub = state(&[("a", "u1", "5"), ("c", "u9", "7"), ("d", "u4", "8")]);
    let d = difference(&api, &hub).unwrap();
    assert!(
        d.contains(r#"lost (in the API server, not in the hub): ["b"]"#),
        "{d}"
    );
    assert!(
        d.contains(r#"ghosts (in the hub, not in the API server): ["d"]"#),
        "{d}"
    );
    assert!(d.contains(r#""c""#) && d.contains("u9"), "{d}");
}
