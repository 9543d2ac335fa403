//! Impersonation on a real control plane under real RBAC: an account whose
//! `impersonateServiceAccount` may only manage ConfigMaps. Its operations and the writes
//! kubectl sends through the hub's Kubernetes API proxy run as that ServiceAccount, so a
//! Deployment is refused with the API server's own 403; the agent's watches and the proxy's
//! reads stay the agent's own (which may read Deployments but write nothing).

use std::{path::Path, time::Duration};

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap, rbac::v1::PolicyRule};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    fixtures::{self, TlsHub, temp_dir},
    kubectl::Kubectl,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(90);

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(ControlPlaneOptions::default)?)
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn configmap(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name, "namespace": namespace },
        "data": { "written-by": "spinnaker" },
    })
}

fn deployment(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{ "name": "main", "image": "registry.example/web:1" }] },
            },
        },
    })
}

/// The agent's rights: read ConfigMaps and Deployments, and impersonate exactly the
/// ServiceAccount `deployer` (the Role the operator grants for impersonation), no writes.
fn agent_rules() -> Vec<PolicyRule> {
    let mut rules = fixtures::read_rules(&["configmaps", "deployments.apps"]);
    rules.push(PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["serviceaccounts".into()]),
        verbs: vec!["impersonate".into()],
        resource_names: Some(vec!["deployer".into()]),
        ..Default::default()
    });
    rules
}

/// Submits an operation through the hub; returns the status code and the result.
async fn operation(hub: &TlsHub, account: &str, body: Value) -> anyhow::Result<(u16, Value)> {
    let response = hub
        .call("POST", &format!("/api/v1/accounts/{account}/operations"))
        .bearer(&hub.admin_token)
        .json(&body)
        .timeout(Duration::from_secs(120))
        .send()
        .await?;
    Ok((response.status, response.json_or_null()))
}

/// Whether the hub's cache of `account` holds Deployment `name` in `namespace`.
async fn cached_deployment(
    hub: &TlsHub,
    account: &str,
    namespace: &str,
    name: &str,
) -> anyhow::Result<bool> {
    let response = hub
        .call(
            "GET",
            &format!("/api/v1/accounts/{account}/objects?kind=deployments&namespace={namespace}"),
        )
        .bearer(&hub.admin_token)
        .send()
        .await?;
    let body = response.json_or_null();
    Ok(body["items"].as_array().is_some_and(|items| {
        items
            .iter()
            .any(|item| item["metadata"]["name"] == name || item["name"] == name)
    }))
}

async fn kubectl_apply(
    kubectl: &Kubectl,
    kubeconfig: &Path,
    manifest: &Value,
) -> anyhow::Result<scale_agent_e2e::kubectl::Outcome> {
    Ok(kubectl
        .run(
            kubeconfig,
            &args(&["apply", "-f", "-", "-v=6"]),
            Some(&manifest.to_string()),
            KUBECTL_TIMEOUT,
        )
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impersonating_account_writes_only_what_its_service_account_may() -> anyhow::Result<()> {
    scale_agent_e2e::fixtures::init_logs("warn");
    let control_plane = control_plane()?;
    let admin: Client = control_plane.client().await?;
    let namespace = control_plane.namespace(&admin, "impersonate").await?;
    let dir = temp_dir("scale-agent-e2e-impersonate")?;

    // `deployer` may manage ConfigMaps in the namespace and nothing else.
    fixtures::service_account_identity(
        control_plane,
        &admin,
        &namespace,
        "deployer",
        fixtures::Scope::Namespace,
        vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["*".into()],
            ..Default::default()
        }],
        dir.join("deployer.kubeconfig"),
    )
    .await?;
    let agent_kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin,
        &namespace,
        "agent",
        fixtures::Scope::Namespace,
        agent_rules(),
        dir.join("agent.kubeconfig"),
    )
    .await?;

    let hub = TlsHub::start(&dir, |_| {}).await?;
    let account = format!("imp-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let config = dir.join("agent.yaml");
    let mut entry = fixtures::account(
        &account,
        &agent_kubeconfig,
        &namespace,
        &["configmaps", "deployments.apps"],
    );
    entry["impersonateServiceAccount"] = json!({ "namespace": namespace, "name": "deployer" });
    fixtures::write_plaintext_agent_config(&config, hub.hub.grpc_addr, json!([entry]), 2)?;
    let agent = fixtures::start_agent_replica(&config, "impersonate-0").await?;
    hub.wait_connected(&account, 1).await?;
    let deployer = format!("system:serviceaccount:{namespace}:deployer");
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), &namespace);
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &namespace);

    // An operation the ServiceAccount may do: the agent itself could not (it has no write
    // rights at all), so this ran as `deployer`.
    let (code, result) = operation(
        &hub,
        &account,
        json!({"type": "apply", "manifest": configmap(&namespace, "by-operation")}),
    )
    .await?;
    assert_eq!(code, 200, "{result:#}");
    let written = configmaps.get("by-operation").await?;
    assert_eq!(
        written
            .data
            .unwrap_or_default()
            .get("written-by")
            .map(String::as_str),
        Some("spinnaker")
    );

    // One it may not: the API server's 403, naming the impersonated user.
    let (code, result) = operation(
        &hub,
        &account,
        json!({"type": "apply", "manifest": deployment(&namespace, "by-operation")}),
    )
    .await?;
    assert_eq!(code, 403, "{result:#}");
    assert_eq!(result["status"]["reason"], "Forbidden", "{result:#}");
    let message = result["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("User \"{deployer}\" cannot"))
            && message.contains("resource \"deployments\""),
        "{message}"
    );
    assert!(deployments.get_opt("by-operation").await?.is_none());

    // kubectl through the hub's proxy: the same rights.
    let kubectl = Kubectl::new(control_plane.binaries().kubectl(), dir.join("home"));
    let through_hub = hub
        .kubeconfig(&account, "impersonation", &dir.join("hub.kubeconfig"))
        .await?;
    let denied = kubectl_apply(
        &kubectl,
        &through_hub,
        &deployment(&namespace, "by-kubectl"),
    )
    .await?;
    assert!(!denied.success(), "{denied:?}");
    assert!(
        denied.stderr.contains("403 Forbidden"),
        "kubectl saw no 403: {}",
        denied.stderr
    );
    let messages = denied.messages();
    assert!(
        messages.contains("(Forbidden)") && messages.contains(&format!("User \"{deployer}\"")),
        "{messages}"
    );
    assert!(deployments.get_opt("by-kubectl").await?.is_none());
    let allowed =
        kubectl_apply(&kubectl, &through_hub, &configmap(&namespace, "by-kubectl")).await?;
    assert!(allowed.success(), "{}", allowed.messages());
    assert!(configmaps.get_opt("by-kubectl").await?.is_some());

    // Reads stay the agent's: `deployer` may not list Deployments, the agent may.
    let listed = kubectl
        .run(
            &through_hub,
            &args(&["get", "deployments", "-n", &namespace, "-o", "name"]),
            None,
            KUBECTL_TIMEOUT,
        )
        .await?;
    assert!(listed.success(), "{}", listed.messages());

    // And so does the agent's watch: a Deployment the admin creates reaches the hub.
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(deployment(&namespace, "by-admin"))?,
        )
        .await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cached_deployment(&hub, &account, &namespace, "by-admin").await? {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the agent's watch never brought Deployment by-admin to the hub"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        deployments.list(&ListParams::default()).await?.items.len(),
        1,
        "only the admin's Deployment exists"
    );

    agent.stop().await?;
    hub.hub.shutdown().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
