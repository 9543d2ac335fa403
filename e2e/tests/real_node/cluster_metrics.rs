//! `kubectl top node` and `kubectl top pod -A --containers` through the hub for a
//! Cluster-scoped agent with `podMetrics: true`, against the real node's metrics-server,
//! compared with the same commands run directly as the admin (kubectl 1.37 and 1.22): the
//! same header, the same rows (nodes; namespace, pod and container), values aside (they are
//! read at different moments).
//!
//! What `kubectl top node` reads: `metrics.k8s.io` nodes (protobuf, `--use-protocol-buffers`
//! is on by default), then the Node objects for their allocatable (kubectl 1.37's typed
//! client asks in protobuf, 1.22's in JSON). The agent here does not watch Nodes, so both
//! are tunnelled and the agent needs the operator's Cluster-scope grant of `get` and `list`
//! on `metrics.k8s.io` nodes and pods and on core nodes (`operator/src/rbac.rs`,
//! `metrics_rules`); the API server's audit log shows the agent's ServiceAccount making
//! those reads with kubectl's User-Agent, answered 200.
//!
//! A namespace-scoped agent's account (a Role cannot grant cluster-scoped reads anyway) gets
//! its agent's own 403 for `kubectl top node` (a cluster-level request of an account limited
//! to namespaces, `agent/src/tunnel_scope.rs`), printed by kubectl, promptly; the API server
//! never sees the request.
//!
//! A step of the main real-node test, near its end, on its node and release: the chart's
//! `operator.clusterGrants` lists the Cluster-scoped agent (it had a node and a chart
//! install of its own until the fresh-clone time of `make test` asked for one fewer).

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

use super::{NAMESPACE, enrolment_secret_for, pod_metrics::kubectl_name};

/// The Cluster-scoped agent and its account (also the enrolment identity).
pub const CLUSTER: &str = "cluster-metrics";
/// The namespace-scoped agent and its account, reading team-a.
const TEAM: &str = "team-metrics";

/// ScaleAgent `name` (one agent, reading `scope`, a YAML flow mapping) and its AgentAccount
/// of the same name with `podMetrics: true`.
fn agent_with_metrics(name: &str, hub_ip: &str, scope: &str) -> String {
    format!(
        "apiVersion: scaleagent.dev/v1alpha1
kind: ScaleAgent
metadata:
  name: {name}
  namespace: {NAMESPACE}
spec:
  mode: Agent
  hub:
    address: {hub_ip}:9091
    tls:
      serverName: scale-agent-hub
      caSecretRef:
        name: hub-ca
  enrolment:
    tokenSecretRef:
      name: {name}-enrolment
  replicas: 1
  access: ReadOnly
  scope: {scope}
  defaults:
    kinds: [Deployment, ReplicaSet, Pod]
---
apiVersion: scaleagent.dev/v1alpha1
kind: AgentAccount
metadata:
  name: {name}
  namespace: {NAMESPACE}
spec:
  agentRef: {name}
  podMetrics: true
"
    )
}

/// The header and the rows' first `key_columns` columns of `kubectl top` output (the
/// values that follow differ between two reads).
fn shape(top: &str, key_columns: usize) -> (String, BTreeSet<Vec<String>>) {
    let mut lines = top.lines();
    let header = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let rows = lines
        .map(|line| {
            line.split_whitespace()
                .take(key_columns)
                .map(str::to_string)
                .collect()
        })
        .collect();
    (header, rows)
}

/// `run`, again (up to 3 times) when kubectl did not reach the hub: `kubectl port-forward`
/// through the loaded node sometimes times the TLS handshake out (seen once, on a node at
/// 97 % CPU), which is the test's transport, not an answer of the hub.
fn through_port_forward(run: impl Fn() -> anyhow::Result<String>) -> anyhow::Result<String> {
    let mut attempt = 1;
    loop {
        match run() {
            Err(error)
                if attempt < 3
                    && format!("{error:#}").contains("Unable to connect to the server") =>
            {
                eprintln!(
                    "[real-node test] kubectl did not reach the hub (attempt {attempt}): {error:#}"
                );
                attempt += 1;
                std::thread::sleep(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

/// `args` directly and through the hub with `kubectl`: the same shape. The metrics of a
/// pod appear after two scrapes, so a pod can join between two reads: the direct read is
/// taken before and after the hub's, and the comparison retried while those two differ.
fn same_shape(
    cli: &Cli,
    kubectl: &Path,
    hub: &HubKubectl,
    forward: &PortForward,
    args: &[&str],
    key_columns: usize,
) -> anyhow::Result<(usize, String)> {
    let name = kubectl_name(kubectl);
    for _ in 0..10 {
        let before = cli.run(kubectl, args, None)?;
        let through_hub = through_port_forward(|| hub.run_with(cli, kubectl, forward, args, None))?;
        let after = cli.run(kubectl, args, None)?;
        let direct = shape(&before, key_columns);
        if direct != shape(&after, key_columns) {
            std::thread::sleep(Duration::from_secs(3));
            continue;
        }
        ensure!(
            shape(&through_hub, key_columns) == direct,
            "kubectl {} ({name}) through the hub differs from directly:\n{through_hub}\ndirectly:\n{before}",
            args.join(" ")
        );
        ensure!(
            !direct.1.is_empty(),
            "kubectl {} ({name}) printed no rows:\n{before}",
            args.join(" ")
        );
        eprintln!(
            "[real-node test] kubectl {} ({name}) through the hub:\n{through_hub}",
            args.join(" ")
        );
        return Ok((direct.1.len(), through_hub));
    }
    bail!(
        "kubectl {} ({name}) directly kept changing rows between reads",
        args.join(" ")
    )
}

/// The agent's requests on `prefix` made for kubectl (the tunnel replays kubectl's
/// User-Agent), as "verb URI status".
fn tunnelled_reads(node: &RealNode, agent: &str, prefix: &str) -> anyhow::Result<Vec<String>> {
    let user = format!("system:serviceaccount:{NAMESPACE}:{agent}-agent");
    Ok(node
        .control_plane()
        .audit_events()?
        .into_iter()
        .filter(|event| {
            event.user.username == user
                && event.user_agent.starts_with("kubectl")
                && event.request_uri.starts_with(prefix)
        })
        .map(|event| {
            format!(
                "{} {} {}",
                event.verb,
                event.request_uri,
                event.response_status.map_or(0, |s| s.code)
            )
        })
        .collect())
}

/// The step, on the node of the main test with the chart installed (its
/// `operator.clusterGrants` lists [`CLUSTER`]): both agents applied and Connected, then
/// `kubectl top` compared; returns a summary of the rows compared.
pub fn top_node_through_the_hub(
    node: &RealNode,
    cli: &Cli,
    dir: &Path,
    hub_ip: &str,
) -> anyhow::Result<String> {
    for (name, scope) in [
        (CLUSTER, "{type: Cluster}".to_string()),
        (TEAM, "{type: Namespaces, namespaces: [team-a]}".to_string()),
    ] {
        enrolment_secret_for(cli, &format!("{name}-enrolment"), name)?;
        cli.apply(&agent_with_metrics(name, hub_ip, &scope))?;
    }
    for name in [CLUSTER, TEAM] {
        if let Err(error) = cli.kubectl(&[
            "-n",
            NAMESPACE,
            "wait",
            "--for=condition=Connected",
            &format!("agentaccount/{name}"),
            "--timeout=300s",
        ]) {
            bail!("{error}\n{}", cli.describe(NAMESPACE));
        }
    }
    eprintln!("[real-node test] both cluster-metrics agent accounts Connected");

    // Directly first, until metrics-server has node and pod metrics (two scrapes).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let nodes = cli.kubectl(&["top", "node"]);
        let pods = cli.kubectl(&["top", "pod", "-A", "--containers"]);
        if let (Ok(nodes), Ok(pods)) = (&nodes, &pods)
            && shape(nodes, 1).1.len() == 1
            && pods.contains(&format!("{CLUSTER}-agent"))
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "no node or agent pod metrics directly after 120 s: {nodes:?} {pods:?}"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    eprintln!("[real-node test] kubectl top node and pod -A directly show metrics");
    let node_name = cli.kubectl(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"])?;

    let forward = PortForward::start(cli, NAMESPACE, "scale-agent-hub", 8443)?;
    let hub = HubKubectl::new(cli, NAMESPACE, dir, CLUSTER, "scale-agent-hub")?;
    let old_kubectl = cli.kubectl.with_file_name("kubectl-1.22");
    let mut rows = Vec::new();
    for kubectl in [cli.kubectl.as_path(), old_kubectl.as_path()] {
        let name = kubectl_name(kubectl);
        let (nodes, _) = same_shape(cli, kubectl, &hub, &forward, &["top", "node"], 1)?;
        let (named, out) = same_shape(
            cli,
            kubectl,
            &hub,
            &forward,
            &["top", "node", &node_name],
            1,
        )?;
        ensure!(
            named == 1 && out.contains(&node_name),
            "kubectl top node {node_name} ({name}) through the hub:\n{out}"
        );
        let (containers, _) = same_shape(
            cli,
            kubectl,
            &hub,
            &forward,
            &["top", "pod", "-A", "--containers"],
            3,
        )?;
        rows.push(format!("{name}: {nodes} node, {containers} containers"));
    }
    // From the API server's side: the agent made kubectl's reads, and was answered.
    for prefix in ["/apis/metrics.k8s.io/v1beta1/nodes", "/api/v1/nodes"] {
        let reads = tunnelled_reads(node, CLUSTER, prefix)?;
        eprintln!("[real-node test] the agent's reads of {prefix} for kubectl: {reads:?}");
        ensure!(
            reads.len() >= 4 && reads.iter().all(|read| read.ends_with(" 200")),
            "the audit log should show the Cluster-scoped agent reading {prefix} for kubectl (two commands, two kubectls), each answered 200: {reads:?}"
        );
    }

    // The namespace-scoped account: its agent refuses a cluster-level request itself
    // (`agent/src/tunnel_scope.rs`: the accounts of one agent share its ServiceAccount), with
    // a 403 kubectl prints, at once, and the API server never sees it.
    let team = HubKubectl::new(cli, NAMESPACE, dir, TEAM, "scale-agent-hub")?;
    let reads_before = tunnelled_reads(node, TEAM, "/apis/metrics.k8s.io")?;
    for kubectl in [cli.kubectl.as_path(), old_kubectl.as_path()] {
        let asked = Instant::now();
        let refused = match team.run_with(cli, kubectl, &forward, &["top", "node"], None) {
            Ok(out) => {
                bail!("kubectl top node through a namespace-scoped account succeeded:\n{out}")
            }
            Err(error) => format!("{error:#}"),
        };
        let took = asked.elapsed();
        ensure!(
            refused.contains("Forbidden")
                && refused.contains(&format!(
                    r#"account "{TEAM}" serves namespaces ["team-a"] only: GET /apis/metrics.k8s.io/v1beta1/nodes is a request across all namespaces or on cluster-scoped objects"#
                )),
            "kubectl top node ({}) through a namespace-scoped account should print the agent's 403: {refused}",
            kubectl_name(kubectl)
        );
        ensure!(took < Duration::from_secs(30), "the refusal took {took:?}");
        eprintln!(
            "[real-node test] kubectl top node ({}) through the namespace-scoped account, in {:.1} s: {refused}",
            kubectl_name(kubectl),
            took.as_secs_f64()
        );
    }
    let reads = tunnelled_reads(node, TEAM, "/apis/metrics.k8s.io")?;
    ensure!(
        reads == reads_before,
        "the namespace-scoped agent sent kubectl's metrics reads to the API server: {reads:?}"
    );
    drop(forward);
    Ok(rows.join("; "))
}
