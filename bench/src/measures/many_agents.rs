//! Measure 7: many simulated agents on one hub beside the same hub with one agent.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;
use serde_json::{Value, json};

use super::{LONG, footprint::idle};
use crate::{
    Options,
    env::Env,
    fake::FakeAgent,
    report::{Row, bytes, mib, secs},
};

pub async fn many_agents(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let mut figures = Vec::new();
    for n in [1, o.agents.max(1)] {
        let hub = env.hub(&format!("many-{n}-hub")).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = hub.stats()?;
        let certs: Vec<_> = (0..n)
            .map(|i| env.pki.ca.client(&format!("bench-sim-{n}-{i}"), &[]))
            .collect::<Result<_, _>>()?;
        let ca = Arc::new(env.pki.ca.cert_pem.clone());
        let agent_objects = o.agent_objects;
        let started = Instant::now();
        let tasks: Vec<_> = certs
            .into_iter()
            .enumerate()
            .map(|(i, cert)| {
                let (addr, ca) = (hub.grpc_addr, ca.clone());
                tokio::spawn(async move {
                    let mut fake =
                        FakeAgent::connect(addr, &ca, &cert.cert_pem, &cert.key_pem, "sim-0")
                            .await?;
                    let account = format!("sim-{n}-{i}");
                    fake.register(&account, &format!("https://sim-{i}.bench:443"))
                        .await?;
                    fake.snapshot(&account, agent_objects, 1).await?;
                    fake.synced(LONG).await?;
                    anyhow::Ok(fake)
                })
            })
            .collect();
        let mut agents = Vec::new();
        for t in tasks {
            agents.push(t.await??);
        }
        let secs = started.elapsed().as_secs_f64();
        let registered = hub.stats()?;
        let connected = hub.agents_connected().await?;
        let window = Duration::from_secs(o.idle_seconds.max(1));
        let (rss, idle_cpu) = idle(hub.pid(), window).await?;
        figures.push(json!({
            "agents": n, "connected": connected, "seconds": secs,
            "hub_rss_before_kib": before.rss_kib, "hub_rss_kib": rss,
            "hub_cpu_secs_to_register": registered.cpu_secs - before.cpu_secs, "hub_idle_cpu_share": idle_cpu,
        }));
        drop(agents);
        drop(hub);
    }
    let idle_window = Duration::from_secs(o.idle_seconds.max(1));
    let text = |f: &Value| {
        format!(
            "{} connected in {}; hub RSS {} (from {}), CPU {:.2} s to register, {} idle",
            f["connected"],
            secs(f["seconds"].as_f64().unwrap_or(0.0)),
            mib(f["hub_rss_kib"].as_u64().unwrap_or(0)),
            mib(f["hub_rss_before_kib"].as_u64().unwrap_or(0)),
            f["hub_cpu_secs_to_register"].as_f64().unwrap_or(0.0),
            match f["hub_idle_cpu_share"].as_f64().unwrap_or(0.0) {
                0.0 => format!("CPU < {:.2} %", 1.0 / idle_window.as_secs_f64().max(0.01)),
                share => format!("CPU {:.2} %", share * 100.0),
            },
        )
    };
    let per_agent = match (figures.first(), figures.last()) {
        (Some(one), Some(many)) if o.agents > 1 => {
            let d = many["hub_rss_kib"].as_f64().unwrap_or(0.0)
                - one["hub_rss_kib"].as_f64().unwrap_or(0.0);
            d * 1024.0 / (o.agents - 1) as f64
        }
        _ => 0.0,
    };
    rows.push(Row {
        id: "many-agents".into(),
        measure: 7,
        title: format!(
            "{} simulated agents (mTLS, one account and {} objects each) on one hub",
            o.agents, o.agent_objects
        ),
        system: text(figures.last().unwrap_or(&Value::Null)),
        baseline_name: "the same hub with 1 agent".into(),
        baseline: text(figures.first().unwrap_or(&Value::Null)),
        note: format!(
            "all connect at once; about {} of hub RSS per extra agent; the fake agents' TLS runs in the bench process on the same cores",
            bytes(per_agent)
        ),
        values: json!({ "runs": figures, "hub_bytes_per_extra_agent": per_agent }),
    });
    Ok(())
}
