//! `helm upgrade` of the running release with changed values, as a platform team changes
//! its install: the operator's and the hub's pods roll to the new template (new pods, the
//! hub on the same volume), and the agents reconnect to the new hub pod and resume their
//! watches without a LIST (the API server's audit log).

use std::time::{Duration, Instant};

use anyhow::ensure;
use scale_agent_e2e::real_node::{
    RealNode,
    user::{Cli, HubKubectl, PortForward},
};

use super::{NAMESPACE, agent_lists, config_map, wait_rollout};

/// The names of the pods of a chart component (`operator` or `hub`).
pub(super) fn component_pods(cli: &Cli, component: &str) -> anyhow::Result<Vec<String>> {
    let mut pods: Vec<String> = cli
        .kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/component={component}"),
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}",
        ])?
        .lines()
        .map(str::to_string)
        .collect();
    pods.sort();
    Ok(pods)
}

/// Runs `helm upgrade --reuse-values` with a new pod annotation for the operator and the
/// hub, and checks the pods rolled and the agents resumed.
pub fn upgrade_release(
    node: &RealNode,
    cli: &Cli,
    hub: &HubKubectl,
    chart: &std::path::Path,
) -> anyhow::Result<()> {
    let (operators, hubs) = (
        component_pods(cli, "operator")?,
        component_pods(cli, "hub")?,
    );
    let lists_before = agent_lists(node)?;
    cli.helm(&[
        "upgrade",
        "scale-agent",
        &chart.to_string_lossy(),
        "-n",
        NAMESPACE,
        "--reuse-values",
        "--set",
        "operator.podAnnotations.upgraded-by=real-node-test",
        "--set",
        "hub.podAnnotations.upgraded-by=real-node-test",
        "--timeout",
        "5m",
    ])?;
    wait_rollout(cli, "scale-agent-operator")?;
    wait_rollout(cli, "scale-agent-hub")?;
    let revision = cli.helm(&["status", "scale-agent", "-n", NAMESPACE, "-o", "json"])?;
    let revision: serde_json::Value = serde_json::from_str(&revision)?;
    ensure!(
        revision["version"] == 2 && revision["info"]["status"] == "deployed",
        "the release after helm upgrade: {revision}"
    );
    // Rolled: none of the old pods is left, and the new ones carry the annotation.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (operators_now, hubs_now) = (
            component_pods(cli, "operator")?,
            component_pods(cli, "hub")?,
        );
        let rolled = operators_now.len() == 2
            && hubs_now.len() == 1
            && !operators_now.iter().any(|p| operators.contains(p))
            && !hubs_now.iter().any(|p| hubs.contains(p));
        if rolled {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "helm upgrade did not roll the pods: operator {operators:?} -> {operators_now:?}, hub {hubs:?} -> {hubs_now:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let annotated = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/part-of=scale-agent",
        "-o",
        "jsonpath={range .items[*]}{.metadata.labels.app\\.kubernetes\\.io/component}={.metadata.annotations.upgraded-by}{\"\\n\"}{end}",
    ])?;
    for component in ["operator", "hub"] {
        ensure!(
            annotated
                .lines()
                .filter(|l| l.starts_with(&format!("{component}=")))
                .all(|l| l.ends_with("=real-node-test")),
            "pods without the upgraded values' annotation:\n{annotated}"
        );
    }

    // The agents are back with the new hub pod: a ConfigMap written to the cluster after the
    // upgrade is in the hub's list, the account is Connected, and nothing was listed again.
    agents_resumed(
        node,
        cli,
        hub,
        "team-a",
        "after-helm-upgrade",
        &lists_before,
    )
}

/// The agents are back with the (new) hub pod after an upgrade: ConfigMap `name` written to
/// `namespace` now is in the hub's list through them, the account is Connected, and they
/// listed nothing since `lists_before` ([`agent_lists`]).
pub(super) fn agents_resumed(
    node: &RealNode,
    cli: &Cli,
    hub: &HubKubectl,
    namespace: &str,
    name: &str,
    lists_before: &[String],
) -> anyhow::Result<()> {
    let forward = PortForward::start(cli, NAMESPACE, "scale-agent-hub", 8443)?;
    cli.apply(&config_map(name).replace("namespace: team-a", &format!("namespace: {namespace}")))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = hub.run(
            cli,
            &forward,
            &["-n", namespace, "get", "configmaps", "-o", "name"],
            None,
        );
        match listed {
            Ok(listed) if listed.contains(&format!("configmap/{name}\n")) => break,
            other => ensure!(
                Instant::now() < deadline,
                "the upgraded hub does not list {namespace}'s ConfigMaps through the agents 2 min after the upgrade: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "wait",
        "--for=condition=Connected",
        "agentaccount/real-node",
        "--timeout=120s",
    ])?;
    let lists_after = agent_lists(node)?;
    ensure!(
        lists_after == lists_before,
        "the agents listed again after the upgrade: {:?}",
        &lists_after[lists_before.len().min(lists_after.len())..]
    );
    Ok(())
}
