//! Measure 9's many-accounts row: one caching cycle of each of many accounts at once on one
//! hub, served by one real agent process.

use std::{collections::BTreeMap, sync::Arc, time::Instant};

use anyhow::Result;
use scale_agent_e2e::kubectl::Kubectl;
use serde_json::{Value, json};

use super::{
    CACHE_HEADER, KINDS, LoadWindow, World, caching_cycle, create_objects, cycle_headers,
    header_text, merge,
};
use crate::{
    measures::LONG,
    procs::CpuWindow,
    report::{Row, secs},
};

/// One caching cycle of each of `o.reads_accounts` accounts at once on one hub, through the
/// proxy, beside the same cycles straight to the API server. The accounts are served by one
/// real agent process (its own, started here, reaching the hub on loopback), all watching
/// the same namespace of `o.reads_account_objects` objects; returns a summary sentence.
pub(super) async fn accounts_row(w: &World<'_>, rows: &mut Vec<Row>) -> Result<String> {
    let (env, o) = (w.env, w.o);
    let n = o.reads_accounts.max(1);
    let objects = o.reads_account_objects.max(KINDS.len());
    let ns = env.namespace("bench-reads-many").await?;
    create_objects(env, &ns, "acct", objects, o.writers).await?;
    let kinds: Vec<&str> = KINDS.iter().map(|(_, kind, _)| *kind).collect();
    let names: Vec<String> = (0..n).map(|i| format!("bench-reads-{i:03}")).collect();
    let accounts: Vec<Value> = names
        .iter()
        .map(|name| {
            json!({
                "name": name,
                "kubeconfigFile": env.agent_kubeconfig.display().to_string(),
                "namespaces": [ns],
                "kinds": kinds,
            })
        })
        .collect();
    let mut agent = env
        .agent_at("reads-agent-many", w.hub.grpc_addr, json!(accounts))
        .await?;
    agent.wait_ready(LONG).await?;
    let mut kubeconfigs = Vec::with_capacity(n);
    for name in &names {
        w.hub.wait_objects(name, objects as u64, LONG).await?;
        let path = env.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, w.hub.kubeconfig(name, "bench-reads").await?)?;
        kubeconfigs.push(path);
    }
    let binary = env.control_plane.binaries().kubectl();
    // One home per side, as one Clouddriver pod has one (kubectl keys its caches by server).
    let proxy_kubectl = Kubectl::new(binary.clone(), env.dir.join("kubectl-home-many-proxy"));
    let direct_kubectl = Kubectl::new(binary, env.dir.join("kubectl-home-many-direct"));
    let ns = Arc::new(ns);
    let all_at_once = |through_proxy: bool| {
        let (kubectl, ns) = (
            if through_proxy {
                &proxy_kubectl
            } else {
                &direct_kubectl
            },
            ns.clone(),
        );
        let kubeconfigs = &kubeconfigs;
        async move {
            let runs = (0..n).map(|i| {
                let kubeconfig = if through_proxy {
                    kubeconfigs[i].as_path()
                } else {
                    env.agent_kubeconfig.as_path()
                };
                caching_cycle(kubectl, kubeconfig, &ns, objects)
            });
            futures::future::try_join_all(runs).await
        }
    };
    // Warm-up: every account's discovery cache, untimed.
    all_at_once(true).await?;
    all_at_once(false).await?;
    let pids = vec![
        ("kube-apiserver".to_string(), w.apiserver),
        ("hub".to_string(), w.hub.pid()),
        ("agent".to_string(), agent.pid()),
    ];
    let pids = &pids;
    // (seconds in all, load, agent CPU seconds) of one side.
    let timed = |through_proxy: bool| async move {
        let window = LoadWindow::start(env, w.apiserver, w.hub.pid()).await?;
        let cpu = CpuWindow::start(pids.clone());
        let started = Instant::now();
        all_at_once(through_proxy).await?;
        let total = started.elapsed().as_secs_f64();
        let load = window.finish(env).await?;
        let (used, _) = cpu.finish();
        let agent_cpu = used
            .iter()
            .find(|(name, _)| name == "agent")
            .map(|(_, s)| *s)
            .unwrap_or(0.0);
        anyhow::Ok((total, load, agent_cpu))
    };
    let (ps, pl, pa) = timed(true).await?;
    let (ds, dl, _) = timed(false).await?;
    let mut headers = BTreeMap::new();
    for path in &kubeconfigs {
        let client = crate::measures::proxy::client_for(path).await?;
        merge(&mut headers, cycle_headers(&client, &ns).await?);
    }
    drop(agent);
    rows.push(Row {
        id: "reads-accounts".into(),
        measure: 9,
        title: format!(
            "{n} accounts × one caching cycle each ({objects} objects over {} kinds per account), all at once on one hub, through the proxy",
            KINDS.len()
        ),
        system: format!("{} in all; hub {:.2} CPU s; API server {:.2} CPU s, {:.0} LISTs", secs(ps), pl.hub_cpu, pl.apiserver_cpu, pl.lists),
        baseline_name: format!("the same {n} kubectl commands straight to the API server"),
        baseline: format!("{} in all; API server {:.2} CPU s, {:.0} LISTs", secs(ds), dl.apiserver_cpu, dl.lists),
        note: format!(
            "{n} kubectl processes at once per side, each as Clouddriver runs it, after one untimed round each; real agents: one agent process serves the {n} accounts (one ServiceAccount, all watching the same namespace, so the direct side loads one API server with every account's cycle), reaching the hub on loopback; agent CPU {pa:.2} s through the proxy; {CACHE_HEADER} on the same LISTs made once more through the proxy with kube's client: {}",
            header_text(&headers)
        ),
        values: json!({ "accounts": n, "objects_per_account": objects,
            "proxy_seconds": ps, "direct_seconds": ds, "proxy_hub_cpu_seconds": pl.hub_cpu, "proxy_agent_cpu_seconds": pa,
            "proxy_apiserver_cpu_seconds": pl.apiserver_cpu, "direct_apiserver_cpu_seconds": dl.apiserver_cpu,
            "proxy_apiserver_lists": pl.lists, "direct_apiserver_lists": dl.lists, "cache_header": headers }),
    });
    Ok(format!(
        "{n} accounts' caching cycles at once take {} through one hub ({:.2} hub CPU s) against {} directly.",
        secs(ps),
        pl.hub_cpu,
        secs(ds)
    ))
}
