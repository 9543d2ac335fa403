//! `helm upgrade` from the previous release's chart to this one, on a real node: the chart of
//! 0.1.0 (commit [`PREVIOUS_RELEASE`], the last before CHANGELOG's `[0.1.0]` section was cut,
//! as e2e/tests/upgrade.rs takes it; the chart's `version` has not changed since, so no later
//! commit marks a release) is taken out of git with `git archive`, installed with the hub on,
//! an agent enrols and streams, and then the upgrade runs as the chart's NOTES say: the new
//! CRDs with `kubectl apply --server-side --force-conflicts`, then `helm upgrade` to the
//! working tree's chart with the same values. Checked: the release is upgraded in place
//! (revision 2, deployed), the operator's and the hub's pods roll (the new chart's templates
//! and probes) and become Ready, the hub keeps its volume, the account is Connected again and
//! its objects reach the new hub pod, and the agents resumed their watches without a LIST
//! (the API server's audit log).
//!
//! What this does not cover: the previous release's images. No registry holds images of
//! 0.1.0 (nothing was ever published), so both charts run this build's images (tagged
//! `v0.1.0`, the old chart's appVersion, as the workspace version still is): the test proves
//! the chart's upgrade path and this build's binaries under the old chart's templates, RBAC
//! and probes, not an upgrade of the binaries.

use std::{path::Path, process::Command};

use anyhow::{Context as _, ensure};
use scale_agent_e2e::real_node::{
    RealNode,
    user::{Cli, HubKubectl},
};

use super::{
    NAMESPACE, agent_lists, enrolment_secret, hub_cluster_ip, hub_tls_secret, hub_volume,
    real_node_agent,
    upgrade::{agents_resumed, component_pods},
    wait_rollout,
};

/// The commit whose chart is the previous release's (0.1.0).
const PREVIOUS_RELEASE: &str = "22a98d5";

/// Extracts the chart of `commit` (and the CRDs its `crds/` symlinks point at) into `dir`
/// and returns the chart's directory.
fn chart_of(commit: &str, dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    let archive = Command::new("git")
        .arg("-C")
        .arg(super::repo_root())
        .args([
            "archive",
            "--format=tar",
            commit,
            "manifests/helm/scale-agent",
            "manifests/crds",
        ])
        .output()
        .context("git archive")?;
    ensure!(
        archive.status.success(),
        "git archive {commit} (the test needs the repository's history): {}",
        String::from_utf8_lossy(&archive.stderr)
    );
    let tar = dir.join("chart.tar");
    std::fs::write(&tar, &archive.stdout)?;
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(dir)
        .status()?;
    ensure!(untar.success(), "tar -xf {}", tar.display());
    Ok(dir.join("manifests/helm/scale-agent"))
}

/// Installs the previous release's chart, connects an agent, upgrades to `chart` (the
/// working tree's) and checks what the module's documentation lists.
fn upgrade_from_previous_release(
    node: &RealNode,
    cli: &Cli,
    chart: &Path,
    dir: &Path,
) -> anyhow::Result<()> {
    let previous = chart_of(PREVIOUS_RELEASE, &dir.join("previous-release"))?;
    cli.kubectl(&["create", "namespace", NAMESPACE])?;
    hub_tls_secret(cli, NAMESPACE, dir)?;
    hub_volume(cli, NAMESPACE, dir)?;
    // The same values before and after, as a platform team's values file.
    let release = |verb: &str, chart: &Path| {
        cli.helm(&[
            verb,
            "scale-agent",
            &chart.to_string_lossy(),
            "-n",
            NAMESPACE,
            "--set",
            "hub.enabled=true",
            "--timeout",
            "5m",
        ])
    };
    release("install", &previous)?;
    wait_rollout(cli, "scale-agent-operator")?;
    wait_rollout(cli, "scale-agent-hub")?;

    // An agent over the account's own namespace, as in the main test.
    enrolment_secret(cli)?;
    let hub_ip = hub_cluster_ip(cli)?;
    cli.apply(&real_node_agent(
        &hub_ip,
        "ReadOnly",
        NAMESPACE,
        "[ConfigMap]",
        "",
    ))?;
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "wait",
        "--for=condition=Connected",
        "agentaccount/real-node",
        "--timeout=300s",
    ])
    .with_context(|| cli.describe(NAMESPACE))?;
    let lists_before = agent_lists(node)?;
    ensure!(
        !lists_before.is_empty(),
        "the audit log holds no list request of the agents' ServiceAccount: the check below would prove nothing"
    );
    let (operators, hubs) = (
        component_pods(cli, "operator")?,
        component_pods(cli, "hub")?,
    );
    let claim = |cli: &Cli| {
        cli.kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            "pvc",
            "scale-agent-hub-data",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
    };
    let claim_before = claim(cli)?;

    // The upgrade, as NOTES say: CRDs first, then the chart.
    cli.kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        &chart.join("crds").to_string_lossy(),
    ])?;
    release("upgrade", chart)?;
    wait_rollout(cli, "scale-agent-operator")?;
    wait_rollout(cli, "scale-agent-hub")?;
    let status: serde_json::Value = serde_json::from_str(&cli.helm(&[
        "status",
        "scale-agent",
        "-n",
        NAMESPACE,
        "-o",
        "json",
    ])?)?;
    ensure!(
        status["version"] == 2 && status["info"]["status"] == "deployed",
        "the release after helm upgrade: {status}"
    );
    let (operators_now, hubs_now) = (
        component_pods(cli, "operator")?,
        component_pods(cli, "hub")?,
    );
    ensure!(
        !operators_now.is_empty()
            && !hubs_now.is_empty()
            && !operators_now.iter().any(|p| operators.contains(p))
            && !hubs_now.iter().any(|p| hubs.contains(p)),
        "helm upgrade did not roll the pods: operator {operators:?} -> {operators_now:?}, hub {hubs:?} -> {hubs_now:?}"
    );
    ensure!(
        claim(cli)? == claim_before,
        "the hub's volume claim was replaced"
    );

    // The agents are back with the new hub pod and listed nothing again.
    let hub = HubKubectl::new(cli, NAMESPACE, dir, "real-node", "scale-agent-hub")?;
    agents_resumed(
        node,
        cli,
        &hub,
        NAMESPACE,
        "after-upgrade-from-0-1-0",
        &lists_before,
    )
}

/// The module's test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_from_the_previous_release_on_a_real_node() -> anyhow::Result<()> {
    if let Some(reason) = scale_agent_e2e::real_node::unavailable() {
        eprintln!("skipping the real-node test: {reason}");
        return Ok(());
    }
    let _one_node = super::ONE_NODE_AT_A_TIME.lock().await;
    let started = std::time::Instant::now();
    let dir = scale_agent_e2e::fixtures::temp_dir("real-node-upgrade")?;
    let _remove_dir = super::RemoveOnDrop(dir.clone());
    let (node, cli) = super::start_node(&dir, started).await?;
    upgrade_from_previous_release(
        &node,
        &cli,
        &super::repo_root().join("manifests/helm/scale-agent"),
        &dir,
    )?;
    super::step(
        started,
        &format!(
            "helm upgrade from {}'s chart: pods rolled, the agents resumed without a LIST",
            PREVIOUS_RELEASE
        ),
    );
    drop(node);
    Ok(())
}
