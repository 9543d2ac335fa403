//! Runs measure 9 (reads through the proxy as Clouddriver makes them) with tiny sizes against
//! the real control plane, hub and agent, and checks every row has both figures, the API
//! server's CPU and LIST counts, and the proxy's `x-scale-agent-cache` counts. No timing is
//! asserted: the machines are shared and noisy.
//!
//! The far rows need Toxiproxy (`make toxiproxy`, which `make bench` runs but `make test`
//! does not); without it they are left out and the test says so on stderr.

use std::collections::BTreeSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_run_reports_every_read_row_with_its_baseline() -> anyhow::Result<()> {
    let far = scale_agent_bench::toxiproxy::available();
    if !far {
        eprintln!(
            "Toxiproxy is not built ({}): the far rows are not run; `make toxiproxy` builds it",
            scale_agent_bench::toxiproxy::binary().display()
        );
    }
    let options = scale_agent_bench::Options {
        measures: vec![9],
        reads_round_trip_ms: if far { 50 } else { 0 },
        ..scale_agent_bench::Options::tiny(env!("CARGO_BIN_EXE_scale-agent-bench").into())
    };
    let report = scale_agent_bench::run(&options).await?;
    let table = report.table();
    eprintln!("{table}");

    let ids: BTreeSet<&str> = report.rows.iter().map(|r| r.id.as_str()).collect();
    let mut expected = vec![
        "reads-cycle",
        "reads-cycle-floor",
        "reads-list",
        "reads-table",
        "reads-accounts",
        "reads-watch",
    ];
    if far {
        expected.extend([
            "reads-cycle-far",
            "reads-cycle-floor-far",
            "reads-watch-far",
        ]);
    }
    assert_eq!(ids, expected.into_iter().collect(), "{table}");
    let is_floor = |id: &str| id.starts_with("reads-cycle-floor");
    // The floor: every timed cycle answered by nginx's cache, kubectl's CPU per cycle on
    // each of the three sides.
    for row in report.rows.iter().filter(|r| is_floor(&r.id)) {
        let statuses = &row.values["floor_cache_status"];
        assert!(
            statuses.get("HIT").and_then(serde_json::Value::as_u64) > Some(0)
                && statuses.as_object().is_some_and(|s| s.len() == 1),
            "row {}: nginx's cache answered not every timed request: {statuses}",
            row.id
        );
        for side in ["floor", "proxy", "direct"] {
            let cpu = &row.values[format!("{side}_kubectl_cpu_seconds")];
            assert!(
                cpu.as_array()
                    .is_some_and(|v| !v.is_empty() && v.iter().all(|s| s.as_f64() > Some(0.0))),
                "row {}: {side}'s kubectl CPU: {cpu}",
                row.id
            );
        }
    }
    for row in &report.rows {
        assert_eq!(row.measure, 9, "{}", row.id);
        for (what, text) in [
            ("system figure", &row.system),
            ("baseline figure", &row.baseline),
            ("baseline name", &row.baseline_name),
        ] {
            assert!(!text.trim().is_empty(), "row {} has no {what}", row.id);
        }
        assert!(
            table.contains(&row.system) && table.contains(&row.baseline),
            "{table}"
        );
        if is_floor(&row.id) {
            continue;
        }
        // Which path answered: at least one response counted, whatever the value.
        let header = &row.values["cache_header"];
        let counted = match header {
            serde_json::Value::Object(counts) => {
                counts.values().filter_map(serde_json::Value::as_u64).sum()
            }
            serde_json::Value::String(value) if !value.is_empty() => 1,
            _ => 0,
        };
        assert!(
            counted > 0,
            "row {} counts no x-scale-agent-cache: {header}",
            row.id
        );
        assert!(row.note.contains("x-scale-agent-cache"), "{}", row.note);
    }
    for row in report
        .rows
        .iter()
        .filter(|r| r.id != "reads-watch" && r.id != "reads-watch-far" && !is_floor(&r.id))
    {
        for figure in [
            "proxy_apiserver_cpu_seconds",
            "direct_apiserver_cpu_seconds",
            "proxy_apiserver_lists",
            "direct_apiserver_lists",
            "proxy_hub_cpu_seconds",
        ] {
            assert!(
                row.values[figure].as_f64().is_some(),
                "row {} has no {figure}: {}",
                row.id,
                row.values
            );
        }
        // The direct side's kubectl or client LISTs reach the API server: a count of zero
        // would mean the metric was not read.
        assert!(
            row.values["direct_apiserver_lists"].as_f64().unwrap_or(0.0) >= 1.0,
            "row {}: {}",
            row.id,
            row.values
        );
    }
    // kubectl's Tables through the proxy: printed by the hub from its cache.
    let table_row = report.rows.iter().find(|r| r.id == "reads-table");
    if let Some(row) = table_row {
        assert_eq!(
            row.values["cache_header"],
            serde_json::json!({ "hit": 3 }),
            "{}",
            row.note
        );
    }
    for row in report
        .rows
        .iter()
        .filter(|r| r.id.starts_with("reads-watch"))
    {
        assert_eq!(row.values["proxy_missed"], 0, "{}", row.note);
        assert_eq!(row.values["direct_missed"], 0, "{}", row.note);
        // Opened from the API server's resourceVersion, which is ahead of the quiet
        // namespace's resume point in the hub: still the cache's.
        assert_eq!(row.values["cache_header"], "hit", "{}", row.note);
    }
    assert!(!report.bottleneck.is_empty());
    Ok(())
}
