//! Measure 6: a server-side apply through the hub's operations API beside a `kubectl apply
//! --server-side` process per operation.

use std::time::Instant;

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

use super::LONG;
use crate::{
    Options,
    env::Env,
    procs::{self},
    report::{Percentiles, Row},
};

pub async fn operations(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let ns = env.namespace("bench-ops").await?;
    let kubectl = scale_agent_e2e::Binaries::locate()?.kubectl();
    let kubeconfig = env.control_plane.kubeconfig_path().to_path_buf();
    let manifest = |i: usize, name: &str| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": name, "namespace": ns },
            "data": { "seq": i.to_string() },
        })
    };
    // Baseline: one `kubectl apply --server-side` process per operation.
    let mut kubectl_ms = Vec::new();
    for i in 0..o.operations {
        let file = env.dir.join("kubectl-apply.json");
        std::fs::write(&file, serde_json::to_vec(&manifest(i, "by-kubectl"))?)?;
        let started = Instant::now();
        let out = tokio::process::Command::new(&kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["apply", "--server-side", "--field-manager=bench", "-f"])
            .arg(&file)
            .output()
            .await
            .context("run kubectl")?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl apply failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        kubectl_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let kubectl_p = Percentiles::of(&kubectl_ms);

    // This system: POST the apply to the hub, which relays it to the agent.
    let hub = env.hub("ops-hub").await?;
    let account = "bench-ops";
    let mut agent = env
        .agent(
            "ops-agent",
            &hub,
            json!([env.account(account, &ns, &["configmaps"])]),
        )
        .await?;
    agent.wait_ready(LONG).await?;
    let path = format!("/api/v1/accounts/{account}/operations");
    let mut hub_ms = Vec::new();
    let mut unavailable = None;
    for i in 0..o.operations {
        let body = serde_json::to_vec(&operation_body(&manifest(i, "by-hub")))?;
        let started = Instant::now();
        let (status, reply) = procs::http_with_token(
            hub.http_addr,
            "POST",
            &path,
            Some(&body),
            Some(procs::API_TOKEN),
        )
        .await?;
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        let reply_json = serde_json::from_slice::<Value>(&reply).ok();
        match status {
            200..=299 => hub_ms.push(elapsed),
            // No route at all (a hub without the operations API): an empty 404 or a 405.
            404 | 405 if reply_json.is_none() => {
                unavailable = Some((
                    "not measured: operations API not available".to_string(),
                    format!("HTTP {status} from POST {path}"),
                ));
                break;
            }
            s => {
                unavailable = Some((
                    format!("not measured: operation {i} failed (HTTP {s})"),
                    String::from_utf8_lossy(&reply)
                        .chars()
                        .take(300)
                        .collect::<String>(),
                ));
                break;
            }
        }
    }
    let hub_p = Percentiles::of(&hub_ms);
    let system = match &unavailable {
        Some((system, _)) => system.clone(),
        None => hub_p.display_ms(),
    };
    rows.push(Row {
        id: "operations".into(),
        measure: 6,
        title: format!("Server-side apply round trip ({} operations)", o.operations),
        system,
        baseline_name: "`kubectl apply --server-side` process per operation (Clouddriver's way)".into(),
        baseline: kubectl_p.display_ms(),
        note: match unavailable {
            Some((_, why)) => format!("{why}; kubectl measured against the API server directly"),
            None => "hub HTTP API → agent over the stream → API server → result back; kubectl talks to the API server directly".into(),
        },
        values: json!({ "operations": o.operations, "hub_ms": hub_p, "kubectl_ms": kubectl_p }),
    });
    drop(agent);
    drop(hub);
    Ok(())
}

/// The body of a server-side apply for the hub's operations API.
fn operation_body(manifest: &Value) -> Value {
    json!({
        "type": "apply",
        "manifest": manifest,
        "fieldManager": "bench",
        "force": true,
        "serverSide": true,
        "timeoutSeconds": 30,
    })
}
