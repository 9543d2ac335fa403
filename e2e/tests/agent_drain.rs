//! The agent's drain on shutdown (SIGTERM), end to end: the real hub and agents in-process,
//! a real API server. A replica that stops finishes the operation it is running (it does not
//! leave it to be resent), and a rolling update of the replicas while operations are
//! submitted in a loop cuts none of them: every create answered 201 and in the API server.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::{core::v1::ConfigMap, rbac::v1::PolicyRule};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use scale_agent::AgentHandle;
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    fixtures::{self, start_plaintext_hub},
    wait::{until, wait_for_within},
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
/// Submitters creating ConfigMaps at once during the rolling update.
const SUBMITTERS: usize = 3;

/// One request to the hub: the status code and the body as JSON.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> anyhow::Result<(u16, Value)> {
    let mut call = fixtures::hub_call(method, addr, path).timeout(Duration::from_secs(120));
    if let Some(body) = body {
        call.body = Some(body.to_string().into_bytes());
        call = call.header("content-type", "application/json");
    }
    let response = call.send().await?;
    let value = serde_json::from_str(&response.body).unwrap_or(Value::String(response.body));
    Ok((response.status, value))
}

async fn op(hub: SocketAddr, account: &str, body: Value) -> anyhow::Result<(u16, Value)> {
    let path = format!("/api/v1/accounts/{account}/operations");
    http(hub, "POST", &path, Some(&body)).await
}

/// Waits until `replicas` replicas serve `account` (one streaming, the others standby).
async fn wait_replicas(hub: SocketAddr, account: &str, replicas: usize) -> anyhow::Result<()> {
    let account = account.to_string();
    until("the account's replicas", || {
        let account = account.clone();
        async move {
            let (code, a) = http(hub, "GET", &format!("/api/v1/accounts/{account}"), None).await?;
            let connected = usize::from(a["streaming"].is_object())
                + a["standbys"].as_array().map(Vec::len).unwrap_or(0);
            Ok(code == 200 && connected == replicas)
        }
    })
    .await
}

/// Creates ConfigMaps `{prefix}-1`, `-2`, ... until `stop`; every answer.
async fn create_until(
    hub: SocketAddr,
    account: String,
    namespace: String,
    prefix: String,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Vec<(String, u16, Value)>> {
    let mut answers = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let name = format!("{prefix}-{i}");
        let (code, body) = op(
            hub,
            &account,
            json!({"type": "create", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}}}),
        )
        .await?;
        answers.push((name, code, body));
    }
    Ok(answers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_replica_finishes_its_operations_and_a_rolling_update_cuts_none()
-> anyhow::Result<()> {
    fixtures::init_logs("scale_agent=info,scale_agent_hub=info");
    let control_plane = ControlPlane::shared_with(ControlPlaneOptions::default)?;
    let admin = control_plane.client().await?;
    let namespace = control_plane.namespace(&admin, "drain").await?;
    let dir: PathBuf = fixtures::temp_dir("scale-agent-e2e-drain")?;
    let kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin,
        &namespace,
        "deployer",
        fixtures::Scope::Namespace,
        vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["*".into()]),
            verbs: vec!["*".into()],
            ..Default::default()
        }],
        dir.join("kubeconfig-deployer"),
    )
    .await?;
    let hub = start_plaintext_hub(&dir).await?;
    let addr = hub.http_addr;
    let account = format!("drain-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let config = dir.join("agent.yaml");
    fixtures::write_plaintext_agent_config(
        &config,
        hub.grpc_addr,
        json!([fixtures::account(
            &account,
            &kubeconfig,
            &namespace,
            &["configmaps"]
        )]),
        2,
    )?;
    let mut agents: Vec<(String, AgentHandle)> = Vec::new();
    for replica in ["old-0", "old-1"] {
        agents.push((
            replica.into(),
            fixtures::start_agent_replica(&config, replica).await?,
        ));
    }
    wait_replicas(addr, &account, 2).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), &namespace);

    // 1. A delete held by a finalizer runs on one replica; that replica is stopped: it
    //    drains, so the delete finishes there (one attempt), not cut and resent.
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "slow", "finalizers": ["example.com/hold"]}}),
            )?,
        )
        .await?;
    let id = format!("drain-{:08x}", rand::random::<u32>());
    let (a, n, i) = (account.clone(), namespace.clone(), id.clone());
    let pending = tokio::spawn(async move {
        op(addr, &a, json!({"id": i, "type": "delete", "kind": "ConfigMap", "namespace": n, "name": "slow", "wait": true, "timeoutSeconds": 50})).await
    });
    let running_on = wait_for_within(
        "the delete to run on a replica",
        WAIT,
        Duration::from_millis(50),
        || async {
            let (code, state) =
                http(addr, "GET", &format!("/api/v1/operations/{id}"), None).await?;
            let replica = state["replica"].as_str().unwrap_or_default();
            let running = code == 200 && state["state"] == "running" && !replica.is_empty();
            Ok(running.then(|| replica.to_string()))
        },
    )
    .await?;
    let cms = configmaps.clone();
    until("the delete to reach the API server", || {
        let cms = cms.clone();
        async move { Ok(cms.get("slow").await?.metadata.deletion_timestamp.is_some()) }
    })
    .await?;
    let index = agents
        .iter()
        .position(|(r, _)| running_on.ends_with(&format!("/{r}")))
        .ok_or_else(|| anyhow::anyhow!("replica {running_on} unknown"))?;
    let (stopped, agent) = agents.remove(index);
    let stopping = tokio::spawn(agent.stop());
    tokio::time::sleep(Duration::from_secs(2)).await;
    anyhow::ensure!(
        !stopping.is_finished(),
        "replica {stopped} stopped with a delete in flight instead of draining"
    );
    configmaps
        .patch(
            "slow",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    let (code, r) = pending.await??;
    anyhow::ensure!(code == 200, "the delete: {code} {r:#}");
    anyhow::ensure!(r["attempts"] == 1, "resent instead of finished: {r:#}");
    anyhow::ensure!(
        r["replica"]
            .as_str()
            .unwrap_or_default()
            .ends_with(&stopped),
        "{r:#}"
    );
    tokio::time::timeout(Duration::from_secs(10), stopping).await???;

    // 2. A rolling update under load: a new replica comes, an old one drains and goes,
    //    while creates (not safe to resend) are submitted in a loop.
    agents.push((
        "new-0".into(),
        fixtures::start_agent_replica(&config, "new-0").await?,
    ));
    wait_replicas(addr, &account, 2).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let submitters: Vec<_> = (0..SUBMITTERS)
        .map(|n| {
            tokio::spawn(create_until(
                addr,
                account.clone(),
                namespace.clone(),
                format!("load-{n}"),
                stop.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let index = agents
        .iter()
        .position(|(r, _)| r.starts_with("old-"))
        .ok_or_else(|| anyhow::anyhow!("no old replica left"))?;
    let (_, old) = agents.remove(index);
    old.stop().await?;
    agents.push((
        "new-1".into(),
        fixtures::start_agent_replica(&config, "new-1").await?,
    ));
    wait_replicas(addr, &account, 2).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for submitter in submitters {
        answers.extend(submitter.await??);
    }
    let failed: Vec<_> = answers.iter().filter(|(_, code, _)| *code != 201).collect();
    anyhow::ensure!(
        failed.is_empty(),
        "{} of {} creates failed during the rolling update: {failed:#?}",
        failed.len(),
        answers.len()
    );
    let in_cluster: Vec<String> = configmaps
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .collect();
    for (name, _, _) in &answers {
        anyhow::ensure!(in_cluster.contains(name), "{name} not in the API server");
    }
    eprintln!(
        "{} creates during the rolling update, none failed",
        answers.len()
    );

    for (_, agent) in agents {
        agent.stop().await?;
    }
    hub.shutdown().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
