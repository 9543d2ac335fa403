//! Measure 8's large-LIST row: a LIST of many objects tunnelled through the proxy beside
//! straight to the API server, with what limits it.

use std::{collections::HashMap, time::Instant};

use anyhow::Result;
use serde_json::json;

use super::{
    MachineWindow, Side, Sides, answered_by, binary_size, cores_json, cpu_text, limit, pair, read,
};
use crate::{
    Options,
    env::Env,
    procs::CpuWindow,
    report::{Percentiles, Row, ms},
};

/// Returns a sentence on what limits the LIST through the proxy.
pub(super) async fn list(
    env: &Env,
    sides: &Sides,
    ns: &str,
    o: &Options,
    pids: &[(String, u32)],
    rows: &mut Vec<Row>,
) -> Result<String> {
    // `ns`: a namespace whose ConfigMaps the agent does not watch (see `run`).
    let n = o.proxy_list_objects.max(1);
    env.create_configmaps(ns, "big", n, o.proxy_list_object_bytes, o.writers)
        .await?;
    let collection = format!("/api/v1/namespaces/{ns}/configmaps");
    for side in [Side::Direct, Side::Proxy] {
        read(sides.client(side), &collection, None).await?;
    }
    let answered = answered_by(sides.client(Side::Proxy), &collection, None, false).await?;
    let repeats = o.proxy_list_repeats.max(1);
    let mut secs: HashMap<Side, Vec<f64>> = HashMap::new();
    let mut size = 0;
    let mut cpu: HashMap<Side, (Vec<(String, f64)>, f64)> = HashMap::new();
    let mut busy: HashMap<Side, f64> = HashMap::new();
    for i in 0..repeats {
        for side in pair(i) {
            let window = CpuWindow::start(pids.to_vec());
            let machine = MachineWindow::start();
            let started = Instant::now();
            size = read(sides.client(side), &collection, None).await?;
            let (machine_cores, _) = machine.finish();
            *busy.entry(side).or_default() += machine_cores / repeats as f64;
            secs.entry(side)
                .or_default()
                .push(started.elapsed().as_secs_f64());
            let (used, wall) = window.finish();
            let entry = cpu.entry(side).or_insert_with(|| (Vec::new(), 0.0));
            for (name, s) in used {
                match entry.0.iter_mut().find(|(n, _)| *n == name) {
                    Some(slot) => slot.1 += s,
                    None => entry.0.push((name, s)),
                }
            }
            entry.1 += wall;
        }
    }
    // Two LISTs at once per side: if one exchange's window capped the tunnel, two exchanges
    // (two windows) would carry about twice as much; if CPU is the limit, they would not.
    let mut two_at_once = HashMap::new();
    for side in [Side::Proxy, Side::Direct] {
        let client = sides.client(side);
        let started = Instant::now();
        let (a, b) = futures::try_join!(
            read(client, &collection, None),
            read(client, &collection, None)
        )?;
        two_at_once.insert(
            side,
            (a + b) as f64 / 1_000_000.0 / started.elapsed().as_secs_f64().max(1e-9),
        );
    }
    let proxy_two = two_at_once.get(&Side::Proxy).copied().unwrap_or(0.0);
    let direct_two = two_at_once.get(&Side::Direct).copied().unwrap_or(0.0);
    let median = |side: Side| {
        let p = Percentiles::of(secs.get(&side).map(Vec::as_slice).unwrap_or(&[]));
        p.p50
    };
    let (proxy_secs, direct_secs) = (median(Side::Proxy), median(Side::Direct));
    let rate = |s: f64| size as f64 / 1_000_000.0 / s.max(1e-9);
    let (proxy_rate, direct_rate) = (rate(proxy_secs), rate(direct_secs));
    let (proxy_cpu, proxy_wall) = cpu.remove(&Side::Proxy).unwrap_or_default();
    let (direct_cpu, direct_wall) = cpu.remove(&Side::Direct).unwrap_or_default();
    // CPU of every process of the run per MB carried.
    let megabytes = size as f64 * repeats as f64 / 1_000_000.0;
    let per_mb = |cpu: &[(String, f64)], of: &[&str]| {
        cpu.iter()
            .filter(|(name, _)| of.is_empty() || of.contains(&name.as_str()))
            .map(|(_, s)| s)
            .sum::<f64>()
            * 1000.0
            / megabytes.max(1e-9)
    };
    let cost = format!(
        "CPU per MB, all processes: {} through the proxy ({} in hub and agent) against {} directly",
        ms(per_mb(&proxy_cpu, &[])),
        ms(per_mb(&proxy_cpu, &["hub", "agent"])),
        ms(per_mb(&direct_cpu, &[]))
    );
    let proxy_busy = busy.get(&Side::Proxy).copied().unwrap_or(0.0);
    rows.push(Row {
        id: "proxy-list".into(),
        measure: 8,
        title: format!(
            "One LIST of {n} ConfigMaps of ~{} B ({:.1} MB of JSON) through the proxy",
            o.proxy_list_object_bytes,
            size as f64 / 1_000_000.0
        ),
        system: format!("{proxy_rate:.0} MB/s ({})", crate::report::secs(proxy_secs)),
        baseline_name: "the same LIST straight to the API server".into(),
        baseline: format!("{direct_rate:.0} MB/s ({})", crate::report::secs(direct_secs)),
        note: format!(
            "x-scale-agent-cache: {answered}; one unpaginated LIST, body read as it streams; median of {repeats} per side, alternating; the tunnel carries it in frames of at most {} within a {} window per exchange; two LISTs at once: {proxy_two:.0} MB/s in all through the proxy, {direct_two:.0} MB/s directly; {cost}; CPU cores through the proxy: {} ({:.2} busy on the machine); directly: {} ({:.2} busy on the machine)",
            // The hub's figures, so the note follows them if they change.
            binary_size(scale_agent_hub::tunnel::MAX_FRAME_BYTES as u64),
            binary_size(u64::from(scale_agent_hub::tunnel::WINDOW_BYTES)),
            cpu_text(&proxy_cpu, proxy_wall),
            busy.get(&Side::Proxy).copied().unwrap_or(0.0),
            cpu_text(&direct_cpu, direct_wall),
            busy.get(&Side::Direct).copied().unwrap_or(0.0)
        ),
        values: json!({ "objects": n, "object_bytes": o.proxy_list_object_bytes, "body_bytes": size, "repeats": repeats,
            "proxy_seconds": secs.get(&Side::Proxy), "direct_seconds": secs.get(&Side::Direct),
            "proxy_mb_per_sec": proxy_rate, "direct_mb_per_sec": direct_rate,
            "two_at_once_proxy_mb_per_sec": proxy_two, "two_at_once_direct_mb_per_sec": direct_two,
            "proxy_cpu_cores": cores_json(&proxy_cpu, proxy_wall), "direct_cpu_cores": cores_json(&direct_cpu, direct_wall),
            "proxy_cpu_ms_per_mb": per_mb(&proxy_cpu, &[]), "proxy_hub_agent_cpu_ms_per_mb": per_mb(&proxy_cpu, &["hub", "agent"]),
            "direct_cpu_ms_per_mb": per_mb(&direct_cpu, &[]), "proxy_machine_busy_cores": proxy_busy }),
    });
    Ok(format!(
        "A {:.1} MB LIST streams at {proxy_rate:.0} MB/s against {direct_rate:.0} MB/s directly ({proxy_two:.0} against {direct_two:.0} MB/s with two at once), {}; {cost}.",
        size as f64 / 1_000_000.0,
        limit(proxy_busy, &proxy_cpu, proxy_wall)
    ))
}
