//! The agent's status writer on the real control plane, for an agent that never reaches its
//! hub (issue 12, item 1): a real agent process, authenticated as a ServiceAccount that may
//! only patch the status of its ScaleAgent and AgentAccount, writes `Connected=False`
//! `HubUnreachable` with its last connection error into both, so a wrong hub address shows in
//! `kubectl get` instead of an empty column.

use std::{path::Path, time::Duration};

use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams},
    core::{ApiResource, GroupVersionKind},
};
use scale_agent_e2e::{
    ControlPlane, crds,
    fixtures::{self, Scope},
    process::{self, ManagedProcess},
};
use serde_json::{Value, json};

const AGENT: &str = env!("CARGO_BIN_EXE_e2e-agent");
/// Generous: two cores shared by many tests.
const WAIT: Duration = Duration::from_secs(90);

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scaleagent.dev", "v1alpha1", kind),
        plural,
    )
}

async fn apply(client: &Client, ns: &str, api: &ApiResource, object: Value) -> anyhow::Result<()> {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, api)
        .patch(
            &name,
            &PatchParams::apply(crds::FIELD_MANAGER),
            &Patch::Apply(&object),
        )
        .await?;
    Ok(())
}

/// `(status, reason, message)` of the `Connected` condition of `name`, if written.
async fn connected(
    client: &Client,
    ns: &str,
    api: &ApiResource,
    name: &str,
) -> anyhow::Result<(Option<(String, String, String)>, Value)> {
    let object = Api::<DynamicObject>::namespaced_with(client.clone(), ns, api)
        .get(name)
        .await?;
    let status = object.data["status"].clone();
    let condition = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Connected")
        .map(|c| {
            let field = |f: &str| c[f].as_str().unwrap_or_default().to_string();
            (field("status"), field("reason"), field("message"))
        });
    Ok((condition, status))
}

async fn wait_unreachable(
    client: &Client,
    ns: &str,
    api: &ApiResource,
    name: &str,
    log: &Path,
) -> anyhow::Result<(String, Value)> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (condition, status) = connected(client, ns, api, name).await?;
        if let Some((state, reason, message)) = &condition
            && state == "False"
            && reason == "HubUnreachable"
        {
            return Ok((message.clone(), status));
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{name} never became Connected=False/HubUnreachable; status: {status}; agent log:\n{}",
            process::tail(log, 30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_reaches_the_hub_says_so_in_the_status() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared()?;
    let admin = control_plane.client().await?;
    crds::install(&admin, &crds::read_crds(&crds::manifests_dir())?).await?;
    let ns = control_plane.namespace(&admin, "never-connected").await?;
    let dir = fixtures::temp_dir("never-connected")?;
    let scale_agents = resource("ScaleAgent", "scaleagents");
    let agent_accounts = resource("AgentAccount", "agentaccounts");
    apply(
        &admin,
        &ns,
        &scale_agents,
        json!({
            "apiVersion": "scaleagent.dev/v1alpha1", "kind": "ScaleAgent",
            "metadata": { "name": "prod" },
            "spec": {
                "hub": { "address": "hub.spinnaker.example.com:9091" },
                "clientCertificate": { "issuerSecretRef": { "name": "agent-ca" } },
            },
        }),
    )
    .await?;
    apply(
        &admin,
        &ns,
        &agent_accounts,
        json!({
            "apiVersion": "scaleagent.dev/v1alpha1", "kind": "AgentAccount",
            "metadata": { "name": "one" },
            "spec": { "agentRef": "prod" },
        }),
    )
    .await?;
    // As the operator's Role has it: patch on these two status subresources, nothing else.
    let kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin,
        &ns,
        "agent",
        Scope::Namespace,
        vec![
            PolicyRule {
                api_groups: Some(vec!["scaleagent.dev".into()]),
                resources: Some(vec!["scaleagents/status".into()]),
                resource_names: Some(vec!["prod".into()]),
                verbs: vec!["patch".into()],
                ..Default::default()
            },
            PolicyRule {
                api_groups: Some(vec!["scaleagent.dev".into()]),
                resources: Some(vec!["agentaccounts/status".into()]),
                resource_names: Some(vec!["one".into()]),
                verbs: vec!["patch".into()],
                ..Default::default()
            },
        ],
        dir.join("agent-kubeconfig"),
    )
    .await?;

    // A hub address where nothing listens: every connection is refused.
    let port = scale_agent_e2e::local_agent::free_port()?;
    let hub = format!("127.0.0.1:{port}");
    let config = dir.join("agent.yaml");
    std::fs::write(
        &config,
        serde_json::to_string_pretty(&json!({
            "clouddriver": {
                "grpc": hub,
                "insecure": true,
                "backoff": { "baseDelay": "200ms", "maxDelay": "2s" },
            },
            "kubernetes": { "accounts": [{
                "name": format!("one-{ns}"),
                "kubeconfigFile": kubeconfig.display().to_string(),
                "agentAccount": "one",
            }] },
            "status": { "namespace": ns, "scaleAgent": "prod" },
        }))?,
    )?;
    let admin_port = scale_agent_e2e::local_agent::free_port()?;
    let mut command = std::process::Command::new(AGENT);
    command
        .arg(format!("--config={}", config.display()))
        .arg("--replica=never-0")
        .arg(format!("--admin-addr=127.0.0.1:{admin_port}"))
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info");
    let log = dir.join("agent.log");
    let mut agent = ManagedProcess::spawn_command("e2e-agent", command, log.clone())?;

    let (message, status) = wait_unreachable(&admin, &ns, &agent_accounts, "one", &log).await?;
    assert!(
        message.contains("never-0")
            && message.contains("has not reached the hub")
            && message.contains(&hub),
        "{message}"
    );
    assert!(status["hub"]["replica"] == "never-0", "{status}");
    let (message, status) = wait_unreachable(&admin, &ns, &scale_agents, "prod", &log).await?;
    assert!(
        message.contains("has not reached the hub") && message.contains(&hub),
        "{message}"
    );
    assert_eq!(status["connected"], 0, "{status}");

    agent.stop(Duration::from_secs(20));
    process::remove_at_exit(dir);
    Ok(())
}
