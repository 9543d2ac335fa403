//! Upgrading from 0.1.0 (issue 14, item 5): the Helm chart of the first release
//! (`tests/fixtures/v0.1.0/chart/`, with its CRDs in `tests/fixtures/v0.1.0/crds/`, copied
//! from commit 22a98d5, the last before CHANGELOG's `[0.1.0]` section was cut in 7b4ecb0;
//! there are no git tags) is installed with the real `helm`, with the hub on. ScaleAgents and
//! AgentAccounts are stored under its CRDs and reconciled, and the operator's agent runs (the
//! Deployment's pod as a real process, `scale_agent_e2e::local_agent`) and streams both
//! accounts to a real hub. Then the upgrade runs exactly as the chart's NOTES and README say:
//! this release's CRDs with `kubectl apply --server-side --force-conflicts -f
//! <chart>/crds/` (without `--force-conflicts` the apply fails: Helm created the CRDs and
//! owns `.spec.versions`), then `helm upgrade` to this release's chart, and the operator
//! restarted. Checked:
//! - Helm upgrades the release in place: the chart's Deployments keep their uid (a changed
//!   selector would make Helm fail or recreate them), now run this release's images, and the
//!   hub's volume claim (the embedded store's data) is the same object;
//! - the operator converges without recreating or rolling the agents (Deployment uid,
//!   generation and pod template unchanged) and without dropping an account (both still
//!   accepted and in the agent's config);
//! - across it the hub keeps both accounts ACTIVE and streamed by the same replica, and the
//!   agent does not list again (counted in the API server's audit log, not by our own
//!   counters).
//!
//! What this does not cover: the 0.1.0 operator binary itself (no image can be pulled here,
//! no kubelet runs the chart's pods, and building an old commit in a test is out of reach),
//! so the same operator code runs, as a process, before and after.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, PersistentVolumeClaim},
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, PostParams},
};
use scale_agent_crds::{
    AgentAccount, ScaleAgent,
    conditions::{ACCEPTED, find_condition},
};
use scale_agent_e2e::{
    Binaries, ControlPlane, ControlPlaneOptions, crds, fixtures,
    local_agent::{LocalAgent, LocalAgentOptions},
    operator::Operator,
    wait::wait_for,
};
use serde_json::{Value, json};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Runs `program` with `args`; its output when it succeeded, else an error with its output.
fn run(program: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(program).args(args).output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    anyhow::ensure!(
        output.status.success(),
        "{} {}: {text}",
        program.display(),
        args.join(" ")
    );
    Ok(text)
}

/// The chart of this release, and of 0.1.0 (the fixture).
fn charts() -> (PathBuf, PathBuf) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    (
        dir.join("../manifests/helm/scale-agent"),
        dir.join("tests/fixtures/v0.1.0/chart/scale-agent"),
    )
}

/// What the chart's upgrade must keep: the uids of its Deployments and of the hub's volume
/// claim, and the images the Deployments run.
#[derive(Debug)]
struct Release {
    operator: (Option<String>, String),
    hub: (Option<String>, String),
    hub_data: Option<String>,
}

async fn release(client: &Client, namespace: &str) -> anyhow::Result<Release> {
    let deployments = Api::<Deployment>::namespaced(client.clone(), namespace);
    let deployment = |name: &'static str| {
        let deployments = deployments.clone();
        async move {
            let object = deployments.get(name).await?;
            let image = object
                .spec
                .template
                .spec
                .and_then(|s| s.containers.into_iter().next())
                .and_then(|c| c.image)
                .unwrap_or_default();
            anyhow::Ok((object.metadata.uid, image))
        }
    };
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    Ok(Release {
        operator: deployment("scale-agent-operator").await?,
        hub: deployment("scale-agent-hub").await?,
        hub_data: claims
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .find(|c| {
                c.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.contains("hub"))
            })
            .and_then(|c| c.metadata.uid),
    })
}

/// What must survive the upgrade: the agent Deployment's identity and pod template, and the
/// accounts in the agent's config.
#[derive(Debug, PartialEq)]
struct AgentState {
    uid: Option<String>,
    generation: Option<i64>,
    template: Value,
    config: String,
}

async fn agent_state(client: &Client, namespace: &str) -> anyhow::Result<Option<AgentState>> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt("prod-agent")
        .await?;
    let config = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt("prod-agent")
        .await?
        .and_then(|c| c.data)
        .map(|data| data.into_values().collect::<Vec<_>>().join("\n"));
    Ok(match (deployment, config) {
        (Some(deployment), Some(config)) => Some(AgentState {
            uid: deployment.metadata.uid,
            generation: deployment.metadata.generation,
            template: serde_json::to_value(deployment.spec.template)?,
            config,
        }),
        _ => None,
    })
}

/// Whether both accounts are accepted and in the agent's config.
async fn converged(client: &Client, namespace: &str) -> anyhow::Result<Option<AgentState>> {
    let accounts = Api::<AgentAccount>::namespaced(client.clone(), namespace);
    for name in ["web", "api"] {
        let account = accounts.get(name).await?;
        let accepted = account
            .status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, ACCEPTED))
            .is_some_and(|c| c.status == "True");
        if !accepted {
            return Ok(None);
        }
    }
    Ok(agent_state(client, namespace).await?.filter(|state| {
        ["web", "api"]
            .iter()
            .all(|name| state.config.contains(&format!("{namespace}-{name}")))
    }))
}

/// LIST requests the agent's ServiceAccount made, per the API server's audit log.
fn lists_by_the_agent(control_plane: &ControlPlane, namespace: &str) -> anyhow::Result<usize> {
    let user = format!("system:serviceaccount:{namespace}:prod-agent");
    Ok(control_plane
        .audit_events()?
        .iter()
        .filter(|e| e.verb == "list" && e.user.username == user)
        .count())
}

/// `(accountState, streaming replica)` of an account in the hub's REST API.
async fn hub_account(
    hub: &scale_agent_hub::RunningHub,
    account: &str,
) -> anyhow::Result<(String, String)> {
    let view = fixtures::hub_get_json(hub.http_addr, &format!("/api/v1/accounts/{account}"))
        .await?
        .unwrap_or_default();
    let field = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Ok((
        field(&view["accountState"]),
        field(&view["streaming"]["replica"]),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_the_chart_from_0_1_0_keeps_agents_and_accounts() -> anyhow::Result<()> {
    // This test binary's own control plane, with an audit log: the CRDs are cluster-wide
    // and this test changes them.
    let control_plane = ControlPlane::shared_with(|| ControlPlaneOptions::default().with_audit())?;
    let client = control_plane.client().await?;
    let binaries = Binaries::locate()?;
    let (helm, kubectl) = (binaries.helm(), binaries.kubectl());
    let kubeconfig = control_plane
        .kubeconfig_path()
        .to_string_lossy()
        .into_owned();
    let (chart, old_chart) = charts();
    let namespace = control_plane.namespace(&client, "upgrade").await?;
    let system = control_plane.namespace(&client, "system").await?;
    let values = fixtures::temp_dir("upgrade-values")?.join("values.yaml");
    std::fs::write(
        &values,
        format!("hub:\n  enabled: true\noperator:\n  watchNamespaces: [{namespace}]\n"),
    )?;
    let helm_release = |action: &'static str, chart: &Path| {
        let (chart, values) = (chart.to_string_lossy(), values.to_string_lossy());
        run(
            &helm,
            &[
                action,
                "scale-agent",
                &chart,
                "--kubeconfig",
                &kubeconfig,
                "--namespace",
                &system,
                "--values",
                &values,
                "--timeout",
                "2m",
            ],
        )
    };
    // 0.1.0 as its users installed it: the chart, which creates its CRDs.
    helm_release("install", &old_chart)?;
    let installed = release(&client, &system).await?;
    assert_eq!(
        installed.operator.1, "ghcr.io/scale-agent/operator:v0.1.0",
        "the premise: the 0.1.0 chart is installed"
    );
    assert!(
        installed.hub_data.is_some(),
        "the premise: the 0.1.0 hub has a volume claim: {installed:?}"
    );
    // The ScaleAgent CRD as the API server has it.
    let scale_agent_crd = || {
        run(
            &kubectl,
            &[
                "--kubeconfig",
                &kubeconfig,
                "get",
                "crd/scaleagents.scaleagent.dev",
                "-o",
                "json",
            ],
        )
    };
    let old_crd = scale_agent_crd()?;
    let old_crds =
        crds::read_crds(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0/crds"))?;
    assert_eq!(old_crds.len(), 2, "the premise: both 0.1.0 CRDs");
    assert!(
        !old_crd.contains("operationBudget"),
        "the premise: Helm installed the 0.1.0 CRDs, which lack this release's fields"
    );
    let dir = fixtures::temp_dir("upgrade")?;
    let hub = fixtures::start_plaintext_hub(&dir).await?;

    // Stored under the 0.1.0 schema, untyped: exactly what a 0.1.0 user applied.
    let post = PostParams::default();
    let raw = |resource: ApiResource| {
        Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &resource)
    };
    raw(ApiResource::erase::<ScaleAgent>(&()))
        .create(
            &post,
            &serde_json::from_value(json!({
                "apiVersion": "scaleagent.dev/v1alpha1", "kind": "ScaleAgent",
                "metadata": { "name": "prod" },
                "spec": {
                    "hub": {
                        "address": hub.grpc_addr.to_string(),
                        "tls": { "insecurePlaintext": true },
                    },
                    "replicas": 2,
                },
            }))?,
        )
        .await?;
    let accounts = ["web", "api"].map(|name| format!("{namespace}-{name}"));
    for (name, account) in ["web", "api"].iter().zip(&accounts) {
        raw(ApiResource::erase::<AgentAccount>(&()))
            .create(
                &post,
                &serde_json::from_value(json!({
                    "apiVersion": "scaleagent.dev/v1alpha1", "kind": "AgentAccount",
                    "metadata": { "name": name },
                    "spec": {
                        "agentRef": "prod",
                        "accountName": account,
                        "namespaces": [namespace],
                        "kinds": ["ConfigMap", "Deployment"],
                    },
                }))?,
            )
            .await?;
    }
    let operator = Operator::watching(client.clone(), &namespace);
    let before = wait_for("the agent and both accounts under the 0.1.0 CRDs", || {
        converged(&client, &namespace)
    })
    .await?;

    // The agent the operator made streams both accounts to the hub.
    let mut agent = LocalAgent::start(
        control_plane,
        &client,
        LocalAgentOptions::new(&namespace, "prod-agent", dir.join("prod-agent-0")),
    )
    .await?;
    let replica = agent.pod_name().to_string();
    for account in &accounts {
        wait_for(&format!("the hub to have {account} ACTIVE"), || async {
            let (state, streaming) = hub_account(&hub, account).await?;
            Ok((state == "ACTIVE" && streaming == replica).then_some(()))
        })
        .await?;
    }
    agent.wait_ready(Duration::from_secs(90)).await?;
    // The agent's LISTs at rest: the same count for 3 s.
    let mut seen = (usize::MAX, tokio::time::Instant::now());
    let lists_before = wait_for("the agent's LISTs to come to rest", || {
        let count = lists_by_the_agent(control_plane, &namespace);
        let now = tokio::time::Instant::now();
        let result = count.map(|count| {
            if count != seen.0 {
                seen = (count, now);
            }
            (now - seen.1 >= Duration::from_secs(3)).then_some(count)
        });
        async move { result }
    })
    .await?;
    assert!(
        lists_before > 0,
        "the premise: the audit log shows the agent's initial LISTs"
    );
    operator.stop().await?;

    // The hub's view of both accounts, sampled every 200 ms all through the upgrade (an
    // agent away for 3 s shows as INACTIVE samples; the audit log below catches a relist).
    let samples = Arc::new(Mutex::new(Vec::<(String, String, String)>::new()));
    let sampler = tokio::spawn({
        let (samples, accounts, addr) = (samples.clone(), accounts.clone(), hub.http_addr);
        async move {
            loop {
                for account in &accounts {
                    // A request that failed (a loaded machine) says nothing either way;
                    // a 404 (the account gone) is a sample.
                    let Ok(view) =
                        fixtures::hub_get_json(addr, &format!("/api/v1/accounts/{account}")).await
                    else {
                        continue;
                    };
                    let view = view.unwrap_or_default();
                    let field = |v: &Value| v.as_str().unwrap_or_default().to_string();
                    if let Ok(mut samples) = samples.lock() {
                        samples.push((
                            account.clone(),
                            field(&view["accountState"]),
                            field(&view["streaming"]["replica"]),
                        ));
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });

    // The upgrade, as the chart's NOTES say: this release's CRDs (Helm never upgrades
    // them), then the chart; then the operator again.
    run(
        &kubectl,
        &[
            "--kubeconfig",
            &kubeconfig,
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &chart.join("crds").to_string_lossy(),
        ],
    )?;
    helm_release("upgrade", &chart)?;
    let upgraded = release(&client, &system).await?;
    assert_eq!(
        (&upgraded.operator.0, &upgraded.hub.0, &upgraded.hub_data),
        (&installed.operator.0, &installed.hub.0, &installed.hub_data),
        "helm upgrade recreated a Deployment or the hub's volume claim: before {installed:?}, \
         after {upgraded:?}"
    );
    assert_eq!(
        (upgraded.operator.1.as_str(), upgraded.hub.1.as_str()),
        (
            format!("ghcr.io/scale-agent/operator:v{VERSION}").as_str(),
            format!("ghcr.io/scale-agent/hub:v{VERSION}").as_str()
        ),
    );
    let new_crd = scale_agent_crd()?;
    assert!(
        new_crd.contains("operationBudget"),
        "kubectl apply --server-side left the 0.1.0 CRD in place"
    );
    let operator = Operator::watching(client.clone(), &namespace);
    wait_for(
        "the upgraded operator to reconcile the agent and both accounts",
        || async {
            Ok(
                (operator.reconciles("scaleagent") >= 1
                    && operator.reconciles("agentaccount") >= 2)
                    .then_some(()),
            )
        },
    )
    .await?;
    let after = wait_for("the agent and both accounts after the upgrade", || {
        converged(&client, &namespace)
    })
    .await?;
    // What a kubelet would do with whatever the operator wrote, then time for the agent to
    // re-read its config (every 2 s) and act on it.
    agent.sync_volumes(&client).await?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    operator.stop().await?;
    sampler.abort();
    assert_eq!(
        before, after,
        "the upgrade recreated or rolled the agent, or changed its accounts"
    );
    let samples = samples
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    assert!(
        samples.len() >= 2 * accounts.len(),
        "the premise: the hub was sampled through the upgrade ({} samples)",
        samples.len()
    );
    let dropped: Vec<_> = samples
        .iter()
        .filter(|(_, state, streaming)| state != "ACTIVE" || *streaming != replica)
        .collect();
    assert!(
        dropped.is_empty(),
        "the hub saw an account leave ACTIVE or change replica during the upgrade, {} of {} \
         samples, first: {:?}",
        dropped.len(),
        samples.len(),
        &dropped[..dropped.len().min(4)]
    );
    assert_eq!(
        lists_by_the_agent(control_plane, &namespace)?,
        lists_before,
        "the agent listed again across the upgrade (a relist)"
    );
    agent.ensure_running()?;

    agent.stop();
    hub.shutdown().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
