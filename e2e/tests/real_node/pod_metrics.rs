//! Pod metrics as Clouddriver reads them (Armory's `metrics: true`, the AgentAccount's
//! `podMetrics`): `kubectl top pod --containers -n <namespace>` against the real node's
//! metrics-server (`RealNode::start_metrics_server`, scraping kubelet), first directly as the
//! admin, then through the hub's proxy with the account's kubeconfig, with this release's
//! kubectl and with kubectl 1.22 (the oldest Clouddriver ships): the same pods and
//! containers. The API server's audit log shows the agent's ServiceAccount reading
//! `metrics.k8s.io` for it. Then the account's `podMetrics` is turned off: the operator's
//! Role loses the metrics reads and the same command through the hub gets the API server's
//! 403, recorded as such in its audit log.

use std::{
    collections::BTreeSet,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure};
use scale_agent_e2e::real_node::{
    RealNode,
    user::{Cli, HubKubectl, PortForward},
};

use super::NAMESPACE;

/// Where the account reads and Clouddriver asks for metrics.
const TEAM: &str = "team-a";
/// The agents' ServiceAccount, as the API server names it.
const AGENT_USER: &str = "system:serviceaccount:scale-agent-system:real-node-agent";
/// The metrics API's path for the team's pods (what `kubectl top pod -n team-a` lists).
const TEAM_POD_METRICS: &str = "/apis/metrics.k8s.io/v1beta1/namespaces/team-a/pods";

/// What the pod metrics step measured.
pub struct PodMetrics {
    /// (pod, container) pairs `kubectl top pod --containers` printed, directly and through
    /// the hub alike.
    pub containers: usize,
    /// From the step's start until the direct command listed the web pod.
    pub first_metrics: Duration,
}

/// Whether the agents may list `pods.metrics.k8s.io` in the team's namespace, as the API
/// server answers a SubjectAccessReview. (`kubectl auth can-i` resolves the resource through
/// discovery first; a SubjectAccessReview asks RBAC alone.)
pub fn agents_may_read_pod_metrics(cli: &Cli) -> anyhow::Result<bool> {
    let allowed = cli.run(
        &cli.kubectl,
        &["create", "-f", "-", "-o", "jsonpath={.status.allowed}"],
        Some(&format!(
            "apiVersion: authorization.k8s.io/v1
kind: SubjectAccessReview
spec:
  user: {AGENT_USER}
  groups: [system:serviceaccounts, system:serviceaccounts:{NAMESPACE}, system:authenticated]
  resourceAttributes: {{group: metrics.k8s.io, resource: pods, verb: list, namespace: {TEAM}}}
"
        )),
    )?;
    Ok(allowed.trim() == "true")
}

/// The (pod, container) pairs of `kubectl top pod --containers` output, header left out.
fn containers(top: &str) -> BTreeSet<(String, String)> {
    top.lines()
        .skip(1)
        .filter_map(|line| {
            let mut columns = line.split_whitespace();
            Some((columns.next()?.to_string(), columns.next()?.to_string()))
        })
        .collect()
}

/// The agents' requests for the team's pod metrics in the audit log, with their status.
fn agent_metrics_reads(node: &RealNode) -> anyhow::Result<Vec<u16>> {
    Ok(node
        .control_plane()
        .audit_events()?
        .into_iter()
        .filter(|event| {
            event.user.username == AGENT_USER && event.request_uri.starts_with(TEAM_POD_METRICS)
        })
        .map(|event| event.response_status.map_or(0, |status| status.code))
        .collect())
}

/// The step: metrics directly and through the hub, then refused without `podMetrics`.
pub fn top_through_the_hub(
    node: &RealNode,
    cli: &Cli,
    hub: &HubKubectl,
) -> anyhow::Result<PodMetrics> {
    let started = Instant::now();
    let top = ["top", "pod", "--containers", "-n", TEAM];
    // metrics-server has two scrapes of a pod (10 s apart) before it serves its metrics.
    let deadline = started + Duration::from_secs(120);
    let direct = loop {
        match cli.kubectl(&top) {
            Ok(out)
                if containers(&out)
                    .iter()
                    .any(|(pod, _)| pod.starts_with("web-")) =>
            {
                break out;
            }
            other => ensure!(
                Instant::now() < deadline,
                "kubectl top pod --containers -n {TEAM} (directly, as the admin) shows no metrics of the web pod after 120 s: {other:?}\n{}",
                node_log_tail(node)
            ),
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    let first_metrics = started.elapsed();
    eprintln!("[real-node test] kubectl top directly:\n{direct}");
    let expected = containers(&direct);
    let web: BTreeSet<&str> = expected
        .iter()
        .filter(|(pod, _)| pod.starts_with("web-"))
        .map(|(_, container)| container.as_str())
        .collect();
    ensure!(
        web == BTreeSet::from(["sidecar", "web"]),
        "kubectl top pod --containers directly should list the web pod's two containers:\n{direct}"
    );

    let forward = PortForward::start(cli, NAMESPACE, "scale-agent-hub", 8443)?;
    let reads_before = agent_metrics_reads(node)?.len();
    let old_kubectl = cli.kubectl.with_file_name("kubectl-1.22");
    for kubectl in [cli.kubectl.as_path(), old_kubectl.as_path()] {
        let through_hub = hub.run_with(cli, kubectl, &forward, &top, None)?;
        eprintln!(
            "[real-node test] kubectl top through the hub ({}):\n{through_hub}",
            kubectl_name(kubectl)
        );
        ensure!(
            containers(&through_hub) == expected,
            "kubectl top pod --containers through the hub ({}) lists other pods or containers than directly:\n{through_hub}\ndirectly:\n{direct}",
            kubectl_name(kubectl)
        );
    }
    // From the API server's side: the agent read the metrics for the hub, and was answered.
    let reads = agent_metrics_reads(node)?;
    ensure!(
        reads.len() >= reads_before + 2 && reads[reads_before..].iter().all(|code| *code == 200),
        "the audit log should show the agents' two reads of {TEAM_POD_METRICS} answered 200; after the {reads_before} before: {:?}",
        &reads[reads_before.min(reads.len())..]
    );

    // Without podMetrics the operator's Role has no metrics reads, and the API server
    // refuses the agent what the hub tunnels.
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "patch",
        "agentaccount/real-node",
        "--type=merge",
        "-p",
        r#"{"spec":{"podMetrics":false}}"#,
    ])?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while agents_may_read_pod_metrics(cli)? {
        ensure!(
            Instant::now() < deadline,
            "the agents may still list pods.metrics.k8s.io in {TEAM} 60 s after podMetrics was turned off"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let reads_before = agent_metrics_reads(node)?.len();
    let refused = match hub.run(cli, &forward, &top, None) {
        Ok(out) => bail!("kubectl top through the hub succeeded without podMetrics:\n{out}"),
        Err(error) => format!("{error:#}"),
    };
    ensure!(
        refused.contains("Forbidden")
            && refused.contains(r#"cannot list resource "pods" in API group "metrics.k8s.io""#),
        "kubectl top through the hub without podMetrics should print the API server's 403: {refused}"
    );
    let reads = agent_metrics_reads(node)?;
    ensure!(
        reads[reads_before.min(reads.len())..].contains(&403),
        "the audit log has no 403 for the agents' read of {TEAM_POD_METRICS}: {:?}",
        &reads[reads_before.min(reads.len())..]
    );
    eprintln!("[real-node test] without podMetrics, through the hub: {refused}");
    Ok(PodMetrics {
        containers: expected.len(),
        first_metrics,
    })
}

/// A kubectl binary's file name (`kubectl`, `kubectl-1.22`), for messages.
pub fn kubectl_name(kubectl: &Path) -> String {
    kubectl
        .file_name()
        .map_or_else(String::new, |name| name.to_string_lossy().into_owned())
}

/// The end of metrics-server's log, for a failure's message.
fn node_log_tail(node: &RealNode) -> String {
    let log = node.dir().join("metrics-server.log");
    std::fs::read_to_string(&log).map_or_else(
        |e| format!("(no log at {}: {e})", log.display()),
        |text| {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(20)..].join("\n")
        },
    )
}
