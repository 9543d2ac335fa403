//! Runs the whole benchmark with tiny sizes against the real control plane and checks the
//! report has every measure with both a system figure and a baseline figure. No timing is
//! asserted: the machines are shared and noisy.

use std::collections::BTreeSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_run_reports_every_measure_with_its_baseline() -> anyhow::Result<()> {
    // Measure 9 has a smoke test of its own (tests/reads.rs).
    let options = scale_agent_bench::Options {
        measures: (1..=8).collect(),
        ..scale_agent_bench::Options::tiny(env!("CARGO_BIN_EXE_scale-agent-bench").into())
    };
    let report = scale_agent_bench::run(&options).await?;
    let table = report.table();
    eprintln!("{table}");

    let ids: BTreeSet<&str> = report.rows.iter().map(|r| r.id.as_str()).collect();
    for id in [
        "latency-watch",
        "latency-list",
        "throughput-live",
        "throughput-synthetic",
        "sync-50",
        "resume",
        "footprint-idle",
        "footprint-objects",
        "hub-memory",
        "wire-bytes",
        "operations",
        "many-agents",
        "proxy-get",
        "proxy-get-concurrent",
        "proxy-apply",
        "proxy-watch",
        "proxy-list",
    ] {
        assert!(ids.contains(id), "no row {id} in\n{table}");
    }
    let measures: BTreeSet<u8> = report.rows.iter().map(|r| r.measure).collect();
    assert_eq!(measures, (1..=8).collect(), "{table}");
    for row in &report.rows {
        assert!(
            !row.system.trim().is_empty(),
            "row {} has no system figure",
            row.id
        );
        assert!(
            !row.baseline.trim().is_empty(),
            "row {} has no baseline figure",
            row.id
        );
        assert!(
            !row.baseline_name.trim().is_empty(),
            "row {} names no baseline",
            row.id
        );
        assert!(
            table.contains(&row.system) && table.contains(&row.baseline),
            "{table}"
        );
    }
    assert!(!report.bottleneck.is_empty());

    let json: serde_json::Value = serde_json::to_value(&report)?;
    assert_eq!(
        json["rows"].as_array().map(Vec::len),
        Some(report.rows.len())
    );
    for field in [
        "cpus",
        "cpu_model",
        "memory_gib",
        "build_profile",
        "kubernetes_version",
    ] {
        assert!(!json["machine"][field].is_null(), "machine.{field} missing");
    }
    for row in json["rows"].as_array().into_iter().flatten() {
        assert!(
            row["system"].is_string() && row["baseline"].is_string(),
            "{row}"
        );
    }
    Ok(())
}
