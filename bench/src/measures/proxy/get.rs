//! Measure 8's GET rows: one object, one request at a time, and requests per second with
//! many clients at once, through the proxy beside straight to the API server.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

use anyhow::Result;
use futures::{StreamExt as _, TryStreamExt as _};
use serde_json::json;

use super::{
    MachineWindow, Side, Sides, WARM_UP, answered_by, cores_json, cpu_text, limit, pair, path_text,
    read, signed_ms,
};
use crate::{
    Options,
    procs::CpuWindow,
    report::{Percentiles, Row, bytes, ms},
};

pub(super) async fn get_one(
    sides: &Sides,
    o: &Options,
    collection: &str,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let n = o.proxy_requests.max(1);
    let mut size = 0;
    for i in 0..WARM_UP {
        for side in pair(i) {
            size = read(sides.client(side), collection, Some("get-target")).await?;
        }
    }
    let path = path_text(
        &answered_by(
            sides.client(Side::Proxy),
            collection,
            Some("get-target"),
            false,
        )
        .await?,
    );
    let (mut proxy_ms, mut direct_ms) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        for side in pair(i) {
            let started = Instant::now();
            read(sides.client(side), collection, Some("get-target")).await?;
            let elapsed = started.elapsed().as_secs_f64() * 1000.0;
            match side {
                Side::Proxy => proxy_ms.push(elapsed),
                Side::Direct => direct_ms.push(elapsed),
            }
        }
    }
    let (proxy_p, direct_p) = (Percentiles::of(&proxy_ms), Percentiles::of(&direct_ms));
    rows.push(Row {
        id: "proxy-get".into(),
        measure: 8,
        title: format!("GET of one ConfigMap (~{}) through the proxy, {n} sequential requests", bytes(size as f64)),
        system: proxy_p.display_ms(),
        baseline_name: "the same GET straight to the API server, same ServiceAccount".into(),
        baseline: direct_p.display_ms(),
        note: format!(
            "{path}; kube's client on both sides, one persistent HTTPS connection each ({WARM_UP} warm-up requests first, so no TLS handshake is timed), requests alternating between the sides; difference at p50 {}; max {} / {}",
            signed_ms(proxy_p.p50 - direct_p.p50),
            ms(proxy_p.max),
            ms(direct_p.max)
        ),
        values: json!({ "requests": n, "body_bytes": size, "proxy_ms": proxy_p, "direct_ms": direct_p }),
    });
    Ok(())
}

/// Requests/s with `o.proxy_clients` clients on each side; returns a sentence on the
/// bottleneck.
pub(super) async fn get_concurrent(
    sides: &Sides,
    o: &Options,
    collection: &str,
    pids: &[(String, u32)],
    rows: &mut Vec<Row>,
) -> Result<String> {
    let clients = o.proxy_clients.max(1);
    let n = o.proxy_requests.max(clients);
    let answered = answered_by(
        sides.client(Side::Proxy),
        collection,
        Some("get-target"),
        false,
    )
    .await?;
    let mut figures = HashMap::new();
    for side in [Side::Direct, Side::Proxy] {
        let client = sides.client(side);
        // Opens the pool's connections (one per client) before timing.
        let run = |total: usize| async move {
            let next = Arc::new(AtomicUsize::new(0));
            futures::stream::iter(0..clients)
                .map(|_| {
                    let next = next.clone();
                    async move {
                        while next.fetch_add(1, Ordering::Relaxed) < total {
                            read(client, collection, Some("get-target")).await?;
                        }
                        anyhow::Ok(())
                    }
                })
                .buffer_unordered(clients)
                .try_collect::<Vec<_>>()
                .await
        };
        run(WARM_UP * clients).await?;
        let cpu = CpuWindow::start(pids.to_vec());
        let machine = MachineWindow::start();
        let started = Instant::now();
        run(n).await?;
        let secs = started.elapsed().as_secs_f64();
        let (used, wall) = cpu.finish();
        figures.insert(side, (n as f64 / secs, used, wall, machine.finish()));
    }
    let (proxy_rate, proxy_cpu, proxy_wall, (proxy_busy, proxy_machine)) =
        figures.remove(&Side::Proxy).unwrap_or_default();
    let (direct_rate, direct_cpu, direct_wall, (_, direct_machine)) =
        figures.remove(&Side::Direct).unwrap_or_default();
    // CPU of every process of the run per request: what the proxy costs, whatever limited
    // the rate.
    let per_request = |cpu: &[(String, f64)], of: &[&str]| {
        cpu.iter()
            .filter(|(name, _)| of.is_empty() || of.contains(&name.as_str()))
            .map(|(_, s)| s)
            .sum::<f64>()
            * 1000.0
            / n as f64
    };
    let proxy_ms = per_request(&proxy_cpu, &[]);
    let direct_ms = per_request(&direct_cpu, &[]);
    let tunnel_ms = per_request(&proxy_cpu, &["hub", "agent"]);
    let cost = format!(
        "CPU per request, all processes: {proxy_ms:.2} ms through the proxy ({tunnel_ms:.2} ms in hub and agent) against {direct_ms:.2} ms directly"
    );
    rows.push(Row {
        id: "proxy-get-concurrent".into(),
        measure: 8,
        title: format!("GET of one ConfigMap through the proxy, {clients} concurrent clients ({n} requests)"),
        system: format!("{proxy_rate:.0} requests/s"),
        baseline_name: "the same GETs straight to the API server".into(),
        baseline: format!("{direct_rate:.0} requests/s"),
        note: format!(
            "x-scale-agent-cache: {answered}; one kube client per side, a keep-alive connection per concurrent request; {cost}; CPU cores through the proxy: {} ({proxy_machine}); directly: {} ({direct_machine})",
            cpu_text(&proxy_cpu, proxy_wall),
            cpu_text(&direct_cpu, direct_wall)
        ),
        values: json!({ "clients": clients, "requests": n, "proxy_per_sec": proxy_rate, "direct_per_sec": direct_rate,
            "proxy_cpu_cores": cores_json(&proxy_cpu, proxy_wall), "direct_cpu_cores": cores_json(&direct_cpu, direct_wall),
            "proxy_cpu_ms_per_request": proxy_ms, "proxy_hub_agent_cpu_ms_per_request": tunnel_ms, "direct_cpu_ms_per_request": direct_ms }),
    });
    Ok(format!(
        "GETs with {clients} clients reach {proxy_rate:.0}/s against {direct_rate:.0}/s directly, {}; {cost}.",
        limit(proxy_busy, &proxy_cpu, proxy_wall)
    ))
}
