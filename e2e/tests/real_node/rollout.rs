//! A rolling update of the agents under load: operations through the hub from several
//! clients at once and writes straight to the cluster, while the operator's agent pods drain
//! on SIGTERM (`SCALE_AGENT_DRAIN_TIMEOUT_SECONDS`). No operation may fail, every write must
//! reach the hub's cache, the standby that takes the watches over must resume them (no LIST
//! in the API server's audit log), and the stopping pods' own logs must show they drained.

use std::{
    fs::File,
    process::{Child, Stdio},
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, ensure};
use scale_agent_e2e::real_node::{
    self, RealNode,
    user::{Cli, HubKubectl, PortForward},
};

use super::{NAMESPACE, agent_lists, config_map};

/// Clients sending operations through the hub at once, each as fast as kubectl goes.
const WRITERS: usize = 3;
/// The node label the agents' new nodeSelector matches.
const POOL_LABEL: &str = "scale-agent-e2e/pool";
/// The taint the agents' new pods tolerate.
const TAINT_KEY: &str = "scale-agent-e2e/dedicated";

/// The agent pods' names.
fn agent_pods(cli: &Cli) -> anyhow::Result<Vec<String>> {
    Ok(cli
        .kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/instance=real-node",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}",
        ])?
        .lines()
        .map(str::to_string)
        .collect())
}

/// `kubectl logs -f` of a pod into a file, until the container exits (or dropped).
struct FollowedLog {
    pod: String,
    path: std::path::PathBuf,
    child: Child,
}

impl Drop for FollowedLog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the rolling update showed.
pub struct Rollout {
    /// Requests through the hub during the rollout (all succeeded): applies and 4 s watches.
    pub operations: usize,
    /// Operations and tunnelled requests the stopping agent pods had in flight when SIGTERM
    /// came (their drain log), all finished: no request through the hub failed.
    pub in_flight_at_sigterm: usize,
    /// Operation results the stopping pods sent while draining.
    pub results_sent_while_draining: usize,
}

/// Patches the ScaleAgent's resources (a new pod template: the Deployment rolls) and loads
/// the hub meanwhile; returns once the old pods have exited and every write is in the
/// hub's list.
pub fn roll_agents_under_load(
    node: &RealNode,
    cli: &Cli,
    hub: &HubKubectl,
    forward: &PortForward,
    dir: &std::path::Path,
) -> anyhow::Result<Rollout> {
    let old_pods = agent_pods(cli)?;
    let mut logs = Vec::new();
    for pod in &old_pods {
        let path = dir.join(format!("{pod}.log"));
        let child = cli
            .command(&cli.kubectl, &["-n", NAMESPACE, "logs", "-f", pod])
            .stdout(File::create(&path)?)
            .stderr(Stdio::null())
            .spawn()?;
        logs.push(FollowedLog {
            pod: pod.clone(),
            path,
            child,
        });
    }
    let lists_before = agent_lists(node)?;
    // The new pod template carries the fleet knobs, which kubelet must honour to start it:
    // the node is labelled and tainted (NoSchedule) first, so only a pod with the
    // nodeSelector's match and the toleration lands; the pull secret is referenced (the image
    // is already on the node); the env switches the agent's log to JSON (checked in its
    // log); and a PodDisruptionBudget.
    let node_name = real_node::NODE_NAME;
    cli.kubectl(&["label", "node", node_name, &format!("{POOL_LABEL}=agents")])?;
    cli.kubectl(&[
        "taint",
        "node",
        node_name,
        &format!("{TAINT_KEY}=agents:NoSchedule"),
    ])?;
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "create",
        "secret",
        "docker-registry",
        "registry-credentials",
        "--docker-server=registry.example.com",
        "--docker-username=scale-agent",
        "--docker-password=not-used-the-image-is-on-the-node",
    ])?;
    let patch = serde_json::json!({
        "spec": {
            "resources": {
                "requests": { "cpu": "20m", "memory": "48Mi" },
                "limits": { "memory": "512Mi" },
            },
            "nodeSelector": { POOL_LABEL: "agents" },
            "tolerations": [{ "key": TAINT_KEY, "operator": "Equal", "value": "agents", "effect": "NoSchedule" }],
            "imagePullSecrets": [{ "name": "registry-credentials" }],
            "env": [{ "name": "SCALE_AGENT_LOG_FORMAT", "value": "json" }],
            "podDisruptionBudget": { "maxUnavailable": 1 },
        }
    });
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "patch",
        "scaleagent",
        "real-node",
        "--type=merge",
        "-p",
        &patch.to_string(),
    ])?;
    let rolling = AtomicBool::new(true);
    let written = Mutex::new(Vec::<String>::new());
    let failures = Mutex::new(Vec::<String>::new());
    let operations = std::sync::atomic::AtomicUsize::new(0);
    let rolled = std::thread::scope(|scope| -> anyhow::Result<std::process::ExitStatus> {
        for writer in 0..WRITERS {
            let (rolling, written, failures, operations) =
                (&rolling, &written, &failures, &operations);
            scope.spawn(move || {
                let mut index = 0;
                while rolling.load(Ordering::Relaxed) {
                    let name = format!("during-rollout-hub-{writer}-{index}");
                    index += 1;
                    match hub.run(
                        cli,
                        forward,
                        &["apply", "-f", "-"],
                        Some(&config_map(&name)),
                    ) {
                        Ok(_) => written
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(name),
                        Err(error) => failures
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(format!("{name}: {error:#}")),
                    }
                    operations.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // Clients whose requests last: watches of team-a's Events (a kind the hub does not
        // cache, so tunnelled to an agent) that the API server ends after 4 s, so a stopping
        // pod has one in flight at SIGTERM, which its drain must let finish. Two clients, 2 s
        // apart: with one, the gap while kubectl starts its next watch left both stopping pods
        // with nothing in flight in 1 of 3 runs.
        for offset in [Duration::ZERO, Duration::from_secs(2)] {
            let (rolling, failures, operations) = (&rolling, &failures, &operations);
            scope.spawn(move || {
                std::thread::sleep(offset);
                while rolling.load(Ordering::Relaxed) {
                    let watch = hub.run(
                        cli,
                        forward,
                        &[
                            "get",
                            "--raw",
                            "/api/v1/namespaces/team-a/events?watch=true&timeoutSeconds=4",
                        ],
                        None,
                    );
                    if let Err(error) = watch {
                        failures
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(format!("a 4 s watch of team-a's Events: {error:#}"));
                    }
                    operations.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let status = (|| {
            let mut rollout = cli
                .command(
                    &cli.kubectl,
                    &[
                        "-n",
                        NAMESPACE,
                        "rollout",
                        "status",
                        "deployment/real-node-agent",
                        "--timeout=240s",
                    ],
                )
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let mut index = 0;
            loop {
                if let Some(status) = rollout.try_wait()? {
                    // The old pods may still be draining: keep the load on until they exit.
                    wait_gone(cli, &old_pods)?;
                    return Ok(status);
                }
                let direct = format!("during-rollout-direct-{index}");
                cli.apply(&config_map(&direct))?;
                written
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(direct);
                index += 1;
                std::thread::sleep(Duration::from_millis(300));
            }
        })();
        rolling.store(false, Ordering::Relaxed);
        status
    })?;
    ensure!(
        rolled.success(),
        "the agents' rolling update failed: {}",
        cli.describe(NAMESPACE)
    );
    // The taint goes (the hub's replacement pod comes later and does not tolerate it).
    cli.kubectl(&[
        "taint",
        "node",
        node_name,
        &format!("{TAINT_KEY}=agents:NoSchedule-"),
    ])?;
    knobs_honoured(cli)?;
    // The stopping pods' own account of their drain, from their logs.
    let mut in_flight_at_sigterm = 0;
    let mut results_sent_while_draining = 0;
    for log in &logs {
        let text = std::fs::read_to_string(&log.path)
            .with_context(|| format!("the log of {}", log.pod))?;
        let start = text
            .lines()
            .find(|l| l.contains("unregistering the accounts and finishing the work in flight"));
        let end = text.lines().find(|l| l.contains("drained"));
        eprintln!(
            "[real-node test] {} drained: {}\n    {}",
            log.pod,
            start.unwrap_or("(no drain start logged)"),
            end.unwrap_or("(no drain end logged)")
        );
        ensure!(
            start.is_some() && end.is_some() && !text.contains("the drain timed out"),
            "agent pod {} did not drain to the end on SIGTERM; its log:\n{text}",
            log.pod
        );
        let start = start.unwrap_or_default();
        in_flight_at_sigterm += field(start, "operations") + field(start, "exchanges");
        results_sent_while_draining += field(end.unwrap_or_default(), "results_sent");
    }
    let failures = failures
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    ensure!(
        failures.is_empty(),
        "operations through the hub failed during the agents' rolling update (the agents drain on SIGTERM: none may be cut):\n{}",
        failures.join("\n")
    );
    let operations = operations.into_inner();
    ensure!(
        operations > 0,
        "the rolling update ended before an operation could go through the hub"
    );

    drop(logs);
    ensure!(
        in_flight_at_sigterm > 0,
        "no stopping agent pod had a request in flight at SIGTERM (the 4 s watches should keep one running): the rollout proved nothing about the drain"
    );

    let written = written.into_inner().unwrap_or_else(PoisonError::into_inner);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = hub.run(
            cli,
            forward,
            &["-n", "team-a", "get", "configmaps", "-o", "name"],
            None,
        )?;
        let missing: Vec<&String> = written
            .iter()
            .filter(|name| !listed.contains(&format!("configmap/{name}\n")))
            .collect();
        if missing.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the hub's list lacks {missing:?} a minute after the agents' rolling update:\n{listed}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // The standby promoted when the streaming pod drained resumed the watches from the
    // hub's resume points; the new pods registered as standbys and listed nothing.
    let lists_after = agent_lists(node)?;
    ensure!(
        lists_after == lists_before,
        "the agents listed during their rolling update: {:?}",
        &lists_after[lists_before.len().min(lists_after.len())..]
    );
    Ok(Rollout {
        operations,
        in_flight_at_sigterm,
        results_sent_while_draining,
    })
}

/// The knobs of the new pod template as kubelet and the controllers applied them: both pods
/// Running and Ready on the labelled, tainted node, the pull secret on the pod, the env in
/// the agent process (its log is JSON), and the PodDisruptionBudget counting both pods.
fn knobs_honoured(cli: &Cli) -> anyhow::Result<()> {
    let pods = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/instance=real-node",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.nodeName} {.spec.imagePullSecrets[0].name} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
    ])?;
    let expected = format!(
        " Running {} registry-credentials True",
        real_node::NODE_NAME
    );
    ensure!(
        pods.lines().count() == 2 && pods.lines().all(|line| line.ends_with(&expected)),
        "the agents' pods with the new knobs (name, phase, node, pull secret, Ready):\n{pods}\n{}",
        cli.describe(NAMESPACE)
    );
    for pod in pods
        .lines()
        .filter_map(|line| line.split_whitespace().next())
    {
        let log = cli.kubectl(&["-n", NAMESPACE, "logs", pod, "--tail=5"])?;
        ensure!(
            !log.trim().is_empty()
                && log
                    .lines()
                    .all(|line| serde_json::from_str::<serde_json::Value>(line).is_ok()),
            "SCALE_AGENT_LOG_FORMAT=json from spec.env did not reach agent {pod}: its log:\n{log}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let healthy = cli.kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            "poddisruptionbudget",
            "real-node-agent",
            "-o",
            "jsonpath={.spec.maxUnavailable} {.status.currentHealthy} {.status.disruptionsAllowed}",
        ]);
        if let Ok(healthy) = &healthy
            && healthy == "1 2 1"
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the agents' PodDisruptionBudget (maxUnavailable, currentHealthy, disruptionsAllowed): {healthy:?}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Waits until none of `pods` exists any more (their containers exited).
fn wait_gone(cli: &Cli, pods: &[String]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left: Vec<&String> = pods
            .iter()
            .filter(|pod| {
                cli.kubectl(&[
                    "-n",
                    NAMESPACE,
                    "get",
                    "pod",
                    pod,
                    "--ignore-not-found",
                    "-o",
                    "name",
                ])
                .map_or(true, |out| !out.trim().is_empty())
            })
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the old agent pods {left:?} still exist 90 s after the rollout (terminationGracePeriodSeconds is 35)"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A numeric field `name=N` of a log line (the agent's text log format).
fn field(line: &str, name: &str) -> usize {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(&format!("{name}=")))
        .and_then(|value| {
            value
                .trim_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .ok()
        })
        .unwrap_or(0)
}
