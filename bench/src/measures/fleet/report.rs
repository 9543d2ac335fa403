//! Measure 12's figures: what the fleet and the baseline measured, turned into the report's
//! rows beside each other.

use super::*;

pub(super) struct Figures {
    pub(super) empty_kib: u64,
    pub(super) synced_kib: u64,
    pub(super) loaded_kib: u64,
    /// The hub's RSS through the load.
    pub(super) trajectory: trajectory::Trajectory,
    pub(super) json_bytes: usize,
    pub(super) objects_total: usize,
    pub(super) sync_secs: f64,
    pub(super) fleet: Measured,
    pub(super) fleet_cpu: BTreeMap<String, f64>,
    pub(super) direct: Measured,
    pub(super) direct_cpu: BTreeMap<String, f64>,
    /// The baseline's load (`--fleet-seconds`, up to [`BASELINE_WINDOW`]).
    pub(super) direct_window: Duration,
}

pub(super) fn report(
    rows: &mut Vec<Row>,
    o: &Options,
    n: usize,
    watched: usize,
    sizes: &Sizes,
    f: Figures,
) -> Result<()> {
    // Failed reads are reported, not fatal: a run at the size takes many minutes,
    // and a few reads failing under the load is itself a figure (the test of the tiny fleet
    // asserts none failed).
    let errors: Vec<&String> = f.fleet.errors.iter().chain(&f.direct.errors).collect();
    let failed = match errors.first() {
        Some(first) => {
            eprintln!(
                "[bench] fleet: {} reads failed (hub {}, API server {}), the first: {first}",
                errors.len(),
                f.fleet.errors.len(),
                f.direct.errors.len()
            );
            format!(
                "; {} reads FAILED through the hub and {} straight to the API server, the first: {first}",
                f.fleet.errors.len(),
                f.direct.errors.len()
            )
        }
        None => String::new(),
    };
    let title_load = format!(
        "{n} accounts × {} objects over {} namespaces, {} % churn/min, a caching cycle every {} and a GET every {} per account, {} requests in flight, {}",
        sizes.objects,
        sizes.namespaces,
        sizes.churn_per_minute,
        secs(sizes.cycle.as_secs_f64()),
        secs(sizes.get_period.as_secs_f64()),
        sizes.clients,
        secs(sizes.window.as_secs_f64()),
    );
    let per_object_json = f.json_bytes as f64 / f.objects_total.max(1) as f64;
    let growth = f.synced_kib.saturating_sub(f.empty_kib) as f64 * 1024.0;
    let per_object = growth / f.objects_total.max(1) as f64;
    let peak_kib = f.trajectory.peak_kib().max(f.loaded_kib);
    // The baseline's load, when shorter than the fleet's.
    let direct_load = if f.direct_window < sizes.window {
        format!(" (its load for {})", secs(f.direct_window.as_secs_f64()))
    } else {
        String::new()
    };
    rows.push(Row {
        id: "fleet-memory".into(),
        measure: 12,
        title: format!("fleet: hub memory with {n} accounts × {} objects", sizes.objects),
        system: format!(
            "hub RSS {} synced ({} over the empty hub's {}: {} per object, {:.2}× the JSON); {} after the load, peak {}; all synced in {}",
            mib(f.synced_kib),
            bytes(growth),
            mib(f.empty_kib),
            bytes(per_object),
            per_object / per_object_json.max(1.0),
            mib(f.loaded_kib),
            mib(peak_kib),
            secs(f.sync_secs),
        ),
        baseline_name: "the objects' JSON as the agents sent it".into(),
        baseline: format!(
            "{} in all, {} per object",
            bytes(f.json_bytes as f64),
            bytes(per_object_json)
        ),
        note: format!(
            "RSS 3 s after the last snapshot's ack (past the store's durable commit); the growth counts everything the hub keeps per object (cache, indexes, watch history, store's page cache). {} (load: {title_load})",
            f.trajectory.text()
        ),
        values: json!({
            "agents": n, "objects_per_account": sizes.objects, "namespaces": sizes.namespaces,
            "hub_rss_empty_kib": f.empty_kib, "hub_rss_synced_kib": f.synced_kib,
            "hub_rss_after_load_kib": f.loaded_kib, "hub_rss_peak_kib": peak_kib,
            "trajectory": f.trajectory.values(),
            "json_bytes": f.json_bytes, "hub_bytes_per_object": per_object,
            "json_bytes_per_object": per_object_json, "sync_secs": f.sync_secs,
        }),
    });
    let pct = |v: &[f64]| Percentiles::of(v);
    let side = |v: &[f64], what: &str| {
        let p = pct(v);
        format!("{} (max {}; {} {what})", p.display_ms(), ms(p.max), p.count)
    };
    rows.push(Row {
        id: "fleet-watch".into(),
        measure: 12,
        title: format!("fleet: change → proxy watch event under the load ({title_load})"),
        system: side(&f.fleet.watch_ms, "events"),
        baseline_name: format!("one account's change (PATCH) → watch event straight from the API server under its own load{direct_load}"),
        baseline: side(&f.direct.watch_ms, "events"),
        note: format!(
            "from the ObjectEvent sent on the agent's stream to the event read through the proxy; cluster-wide watches of six kinds of {watched} accounts; {} of {} changes matched to an event (the rest were still in flight at the end or their watch restarted)",
            f.fleet.watch_ms.len(),
            f.fleet.changes_watched
        ),
        values: json!({
            "system": pct(&f.fleet.watch_ms), "baseline": pct(&f.direct.watch_ms),
            "changes": f.fleet.changes, "changes_watched": f.fleet.changes_watched,
            "baseline_changes": f.direct.changes,
        }),
    });
    rows.push(Row {
        id: "fleet-list-page".into(),
        measure: 12,
        title: format!("fleet: cached LIST page (limit 500) under the load ({title_load})"),
        system: side(&f.fleet.page_ms, "pages"),
        baseline_name: format!("the same pages of one account straight from the API server{direct_load}"),
        baseline: side(&f.direct.page_ms, "pages"),
        note: format!(
            "{} per page through the proxy, {} direct; answered by (x-scale-agent-cache): {}",
            bytes(f.fleet.page_bytes as f64 / f.fleet.pages.max(1) as f64),
            bytes(f.direct.page_bytes as f64 / f.direct.pages.max(1) as f64),
            header_text(&f.fleet.headers)
        ),
        values: json!({ "system": pct(&f.fleet.page_ms), "baseline": pct(&f.direct.page_ms), "headers": f.fleet.headers }),
    });
    rows.push(Row {
        id: "fleet-get".into(),
        measure: 12,
        title: format!("fleet: GET by name under the load ({title_load})"),
        system: side(&f.fleet.get_ms, "GETs"),
        baseline_name: format!("the same GETs of one account straight from the API server{direct_load}"),
        baseline: side(&f.direct.get_ms, "GETs"),
        note: "a random Deployment, ReplicaSet or Service of the account, as WaitForManifestStable polls it".into(),
        values: json!({ "system": pct(&f.fleet.get_ms), "baseline": pct(&f.direct.get_ms) }),
    });
    let cycles = |m: &Measured, cpu: f64| {
        let p = pct(&m.cycle_secs.iter().map(|s| s * 1000.0).collect::<Vec<_>>());
        format!(
            "{} cycles, {} inside {} ({} late); cycle {}; {:.3} CPU s per cycle",
            m.cycle_secs.len(),
            m.cycle_secs.len() - m.cycles_late,
            secs(sizes.cycle.as_secs_f64()),
            m.cycles_late,
            p.display_ms(),
            cpu / m.cycle_secs.len().max(1) as f64,
        )
    };
    let hub_cpu = f.fleet_cpu.get("hub").copied().unwrap_or(0.0);
    let server_cpu: f64 = f
        .direct_cpu
        .iter()
        .filter(|(name, _)| name.as_str() != "bench")
        .map(|(_, cpu)| cpu)
        .sum();
    rows.push(Row {
        id: "fleet-cycles".into(),
        measure: 12,
        title: format!("fleet: caching cycles ({} namespaces × 8 kinds each) under the load ({title_load})", sizes.namespaces),
        system: cycles(&f.fleet, hub_cpu),
        baseline_name: format!("one account's cycles straight from its API server (CPU: kube-apiserver + etcd){direct_load}"),
        baseline: cycles(&f.direct, server_cpu),
        note: format!(
            "hub CPU {hub_cpu:.1} s over the window (ingest of the churn and the watches included); the bench's own (clients, fake agents) {:.1} s on the same cores; every account's cycle inside its period: {}{failed}",
            f.fleet_cpu.get("bench").copied().unwrap_or(0.0),
            if f.fleet.cycles_late == 0 { "yes" } else { "no" },
        ),
        values: json!({
            "cycles": f.fleet.cycle_secs.len(), "cycles_late": f.fleet.cycles_late,
            "failed_reads": f.fleet.errors.len(), "baseline_failed_reads": f.direct.errors.len(),
            "baseline_cycles": f.direct.cycle_secs.len(), "baseline_cycles_late": f.direct.cycles_late,
            "hub_cpu_secs": hub_cpu, "hub_cpu_secs_per_cycle": hub_cpu / f.fleet.cycle_secs.len().max(1) as f64,
            "baseline_cpu": f.direct_cpu, "fleet_cpu": f.fleet_cpu,
            "cycle_ms": pct(&f.fleet.cycle_secs.iter().map(|s| s * 1000.0).collect::<Vec<_>>()),
            "settings": {
                "agents": n, "objects": sizes.objects, "namespaces": sizes.namespaces,
                "cycle_secs": sizes.cycle.as_secs_f64(), "get_period_secs": sizes.get_period.as_secs_f64(),
                "churn_percent_per_minute": sizes.churn_per_minute, "seconds": sizes.window.as_secs(),
                "clients": sizes.clients, "watch_accounts": o.fleet_watch_accounts,
                "baseline_seconds": f.direct_window.as_secs(),
            },
        }),
    });
    Ok(())
}

fn header_text(counts: &BTreeMap<String, usize>) -> String {
    counts
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
