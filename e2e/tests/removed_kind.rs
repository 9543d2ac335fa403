//! A kind whose CustomResourceDefinition is deleted ends its watch quietly (issue 30): the
//! agent logs one info line instead of "404 Failed to parse error data" warnings until the
//! next rediscovery, the hub is told the kind is STOPPED and drops its objects, and when the
//! CRD comes back rediscovery watches it again and its objects reach the hub.
//!
//! Real parts: the shared control plane (kube-apiserver and etcd), the agent and the hub in
//! this process (plaintext), the agent as a ServiceAccount with a namespaced Role. The
//! agent's and the hub's log lines are captured (this binary's tracing subscriber writes them
//! to a buffer as well as to the test's output) and searched for warnings about the 404.

use std::{
    sync::{Mutex, OnceLock},
    time::Duration,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{DeleteParams, DynamicObject, PostParams},
    discovery::ApiResource,
};
use scale_agent_e2e::{
    ControlPlane,
    fixtures::{self, hub_get_json, start_plaintext_hub},
    wait,
};
use serde_json::{Value, json};

const GROUP: &str = "removedkind.scaleagent.dev";
/// Long enough for the agent's discovery poll (every 20 s) to see the CRD go and come back.
const WAIT: Duration = Duration::from_secs(120);
const EVERY: Duration = Duration::from_millis(250);

/// Every log line of this test binary.
fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(Mutex::default)
}

/// Writes each line to the captured buffer and to the test's output.
struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        logs()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        // The harness captures print! (not a raw stderr write): shown for a failed test.
        print!("{}", String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,scale_agent=debug".into()),
        )
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
}

/// The captured lines from `from` (a byte offset into the buffer) on.
fn lines_since(from: usize) -> Vec<String> {
    let logs = logs().lock().unwrap_or_else(|e| e.into_inner());
    String::from_utf8_lossy(&logs[from.min(logs.len())..])
        .lines()
        .map(str::to_string)
        .collect()
}

fn log_len() -> usize {
    logs().lock().unwrap_or_else(|e| e.into_inner()).len()
}

/// The hub's view of `plural` in `account` (`kinds[]` of `GET /api/v1/accounts/{name}`).
async fn hub_kind(hub: std::net::SocketAddr, account: &str, plural: &str) -> Option<Value> {
    let view = hub_get_json(hub, &format!("/api/v1/accounts/{account}"))
        .await
        .ok()
        .flatten()?;
    view["kinds"]
        .as_array()?
        .iter()
        .find(|k| k["plural"] == plural)
        .cloned()
}

/// The names of the hub's cached `plural` objects of `account`.
async fn hub_names(hub: std::net::SocketAddr, account: &str, plural: &str) -> Vec<String> {
    let listed = hub_get_json(
        hub,
        &format!("/api/v1/accounts/{account}/objects?kind={plural}"),
    )
    .await
    .ok()
    .flatten()
    .unwrap_or(Value::Null);
    listed["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|o| o.pointer("/metadata/name").and_then(Value::as_str))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_crd_ends_its_watch_quietly_and_returns_with_the_crd() -> anyhow::Result<()> {
    init_logs();
    let control_plane = ControlPlane::shared()?;
    let admin = control_plane.client().await?;
    let namespace = control_plane.namespace(&admin, "removed-kind").await?;
    let dir = fixtures::temp_dir("scale-agent-e2e-removed-kind")?;
    let plural = "gadgets";
    let kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin,
        &namespace,
        "agent",
        fixtures::Scope::Namespace,
        fixtures::read_rules(&["configmaps", &format!("{plural}.{GROUP}")]),
        dir.join("kubeconfig"),
    )
    .await?;
    let crd = scale_agent_e2e::crds::schemaless_crd(GROUP, "Gadget", plural);
    let crd_name = format!("{plural}.{GROUP}");
    scale_agent_e2e::crds::install(&admin, std::slice::from_ref(&crd)).await?;
    let resource = ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: "Gadget".into(),
        plural: plural.into(),
    };
    let gadgets = Api::<DynamicObject>::namespaced_with(admin.clone(), &namespace, &resource);
    let create = async |name: &str| -> anyhow::Result<()> {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{GROUP}/v1"),
            "kind": "Gadget",
            "metadata": { "name": name },
            "spec": { "size": 3 },
        }))?;
        gadgets.create(&PostParams::default(), &object).await?;
        Ok(())
    };
    create("first").await?;

    let hub = start_plaintext_hub(&dir).await?;
    let account = format!("gone-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let config = dir.join("scale-agent.yaml");
    fixtures::write_plaintext_agent_config(
        &config,
        hub.grpc_addr,
        json!([{
            "name": account,
            "kubeconfigFile": kubeconfig.display().to_string(),
            "namespaces": [namespace],
            "kinds": ["configmaps"],
            "customResourceDefinitions": [{ "kind": format!("Gadget.{GROUP}") }],
        }]),
        5,
    )?;
    // The default rediscovery period (300 s): only the discovery poll (20 s) and the 404
    // itself act within this test, so what ends the watch is the 404, not rediscovery.
    let agent = fixtures::start_agent_replica(&config, "e2e-0").await?;
    let http = hub.http_addr;
    wait::until_within("the hub caches the first Gadget", WAIT, EVERY, async || {
        Ok(hub_names(http, &account, plural)
            .await
            .contains(&"first".to_string()))
    })
    .await?;

    // Delete the CRD (and with it every Gadget).
    let from = log_len();
    let deleted_at = std::time::Instant::now();
    Api::<CustomResourceDefinition>::all(admin.clone())
        .delete(&crd_name, &DeleteParams::default())
        .await?;
    wait::until_within(
        "the hub reports the Gadgets STOPPED with no objects",
        WAIT,
        EVERY,
        async || {
            Ok(hub_kind(http, &account, plural)
                .await
                .is_some_and(|k| k["state"] == "STOPPED" && k["objects"] == 0))
        },
    )
    .await?;
    let stopped_after = deleted_at.elapsed();
    let stopped = hub_kind(http, &account, plural).await;
    let message = stopped
        .as_ref()
        .and_then(|k| k["message"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        message.contains("404"),
        "the hub's kind says why it stopped: {stopped:?}"
    );
    // Stay past the next discovery poll, where the old agent kept warning until rediscovery.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let lines = lines_since(from);
    let warnings: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("WARN") && l.contains("404"))
        .collect();
    assert!(
        warnings.is_empty(),
        "no warnings about the 404 after the CRD is deleted: {warnings:#?}"
    );
    let ended: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("no longer serves this kind"))
        .collect();
    assert_eq!(
        ended.len(),
        1,
        "one info line for the one Gadget watch: {ended:#?}"
    );
    assert!(ended[0].contains(" INFO "), "{}", ended[0]);

    // The CRD comes back: discovery lists the kind again and its objects reach the hub.
    scale_agent_e2e::crds::install(&admin, std::slice::from_ref(&crd)).await?;
    create("second").await?;
    wait::until_within(
        "the hub caches the Gadget created after the CRD returned",
        WAIT,
        EVERY,
        async || {
            Ok(hub_names(http, &account, plural)
                .await
                .contains(&"second".to_string()))
        },
    )
    .await?;
    let watching = hub_kind(http, &account, plural).await;
    assert_eq!(
        watching.as_ref().map(|k| k["state"].clone()),
        Some(json!("WATCHING")),
        "{watching:?}"
    );
    let names = hub_names(http, &account, plural).await;
    assert!(
        !names.contains(&"first".to_string()),
        "the Gadget deleted with the CRD stays gone: {names:?}"
    );
    println!(
        "kind reported STOPPED {:.1} s after the CRD's deletion",
        stopped_after.as_secs_f64()
    );

    agent.stop().await?;
    hub.shutdown().await?;
    Api::<CustomResourceDefinition>::all(admin.clone())
        .delete(&crd_name, &DeleteParams::default())
        .await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
