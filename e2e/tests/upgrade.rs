//! Upgrading from 0.1.0 (issue 14, item 5), in part: the CRDs of the first release
//! (`tests/fixtures/v0.1.0/crds/`, copied from commit 22a98d5, the last before CHANGELOG's
//! `[0.1.0]` section was cut in 7b4ecb0; there are no git tags) are installed, ScaleAgents and
//! AgentAccounts are stored under them and reconciled, the CRDs are upgraded to this
//! release's and the operator restarted: it converges without recreating or rolling the
//! agents (Deployment uid, generation and pod template unchanged) and without dropping an
//! account (both still accepted and in the agent's config).
//!
//! What this does not cover: the 0.1.0 operator binary itself (no image can be pulled here
//! and building an old commit in a test is out of reach), so the same operator code runs
//! before and after; and the hub's side of the accounts (no agent process runs here).

use std::{
    future::Future,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, PostParams},
};
use scale_agent_crds::{
    AgentAccount, ScaleAgent,
    conditions::{ACCEPTED, find_condition},
};
use scale_agent_e2e::{ControlPlane, crds};
use scale_agent_operator::{Config, Metrics, policy::WatchNamespaces};
use serde_json::{Value, json};
use tokio::{sync::oneshot, task::JoinHandle};

const TIMEOUT: Duration = Duration::from_secs(90);

/// An operator running in this test's runtime, watching one namespace.
struct Operator {
    stop: oneshot::Sender<()>,
    task: JoinHandle<scale_agent_operator::Result<()>>,
    metrics: Arc<Metrics>,
}

impl Operator {
    fn start(client: Client, namespace: &str) -> Self {
        let config = Config {
            watch_namespaces: WatchNamespaces::Only([namespace.to_owned()].into()),
            retry_base: Duration::from_millis(500),
            retry_max: Duration::from_secs(4),
            instance: Some(format!("e2e-{namespace}")),
            ..Config::default()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let metrics = Arc::new(Metrics::new());
        let task = tokio::spawn(scale_agent_operator::run_controllers(
            client,
            config,
            metrics.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            stop,
            task,
            metrics,
        }
    }

    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(60), self.task).await???;
        Ok(())
    }

    fn reconciles(&self, controller: &str) -> u64 {
        let prefix =
            format!("scale_agent_operator_reconciles_total{{controller=\"{controller}\"}} ");
        self.metrics
            .render()
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "timed out after {TIMEOUT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_the_crds_from_0_1_0_keeps_agents_and_accounts() -> anyhow::Result<()> {
    // This test binary's own control plane: the CRDs are cluster-wide and this test changes
    // them.
    let control_plane = ControlPlane::shared()?;
    let client = control_plane.client().await?;
    let old = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0/crds");
    let old_crds = crds::read_crds(&old)?;
    assert_eq!(old_crds.len(), 2, "the premise: both 0.1.0 CRDs");
    crds::install(&client, &old_crds).await?;
    let namespace = control_plane.namespace(&client, "upgrade").await?;

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
                    "hub": { "address": "hub.spinnaker.example.com:9091" },
                    "enrolment": { "tokenSecretRef": { "name": "enrolment-token" } },
                    "replicas": 2,
                },
            }))?,
        )
        .await?;
    for name in ["web", "api"] {
        raw(ApiResource::erase::<AgentAccount>(&()))
            .create(
                &post,
                &serde_json::from_value(json!({
                    "apiVersion": "scaleagent.dev/v1alpha1", "kind": "AgentAccount",
                    "metadata": { "name": name },
                    "spec": {
                        "agentRef": "prod",
                        "accountName": format!("{namespace}-{name}"),
                        "kinds": ["ConfigMap", "Deployment"],
                    },
                }))?,
            )
            .await?;
    }
    let operator = Operator::start(client.clone(), &namespace);
    let before = wait_for("the agent and both accounts under the 0.1.0 CRDs", || {
        converged(&client, &namespace)
    })
    .await?;
    operator.stop().await?;

    // The upgrade: this release's CRDs, then the operator again.
    crds::install(&client, &crds::read_crds(&crds::manifests_dir())?).await?;
    let operator = Operator::start(client.clone(), &namespace);
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
    operator.stop().await?;
    assert_eq!(
        before, after,
        "the upgrade recreated or rolled the agent, or changed its accounts"
    );
    Ok(())
}
