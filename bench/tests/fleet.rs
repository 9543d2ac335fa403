//! Measure 12, the fleet, with tiny sizes (3 accounts of 100 objects over 4 namespaces, 6 s
//! of load with a cycle every 2 s): every row has both figures, every read through the
//! proxy was answered by the hub's cache, each side made cycles, GETs and matched watch
//! events, and the hub's memory figures were read, its RSS through the load too. No timing or
//! memory figure is asserted.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_fleet_reports_every_figure_beside_the_api_server() -> anyhow::Result<()> {
    let options = scale_agent_bench::Options {
        measures: vec![12],
        ..scale_agent_bench::Options::tiny(env!("CARGO_BIN_EXE_scale-agent-bench").into())
    };
    let report = scale_agent_bench::run(&options).await?;
    let table = report.table();
    eprintln!("{table}");
    let ids: Vec<&str> = report.rows.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "fleet-memory",
            "fleet-watch",
            "fleet-list-page",
            "fleet-get",
            "fleet-cycles"
        ],
        "{table}"
    );
    for row in &report.rows {
        assert!(
            !row.system.is_empty() && !row.baseline.is_empty(),
            "{table}"
        );
    }
    let row = |id: &str| &report.rows.iter().find(|r| r.id == id).unwrap().values;
    let memory = row("fleet-memory");
    assert!(memory["hub_rss_synced_kib"].as_u64() > Some(0), "{memory}");
    assert!(memory["json_bytes"].as_u64() > Some(0), "{memory}");
    // The RSS trajectory of the 6 s load: sampled at its start and end at least, the
    // warm-up's end (2 s in) and the end read.
    let trajectory = &memory["trajectory"];
    assert!(
        trajectory["samples_taken"].as_u64() >= Some(2),
        "{trajectory}"
    );
    assert!(
        trajectory["warm"]["hub_rss_kib"].as_u64() > Some(0),
        "{trajectory}"
    );
    assert!(
        trajectory["end"]["hub_rss_kib"].as_u64() > Some(0),
        "{trajectory}"
    );
    assert!(trajectory["growth_percent"].is_f64(), "{trajectory}");
    for id in ["fleet-watch", "fleet-list-page", "fleet-get"] {
        let v = row(id);
        assert!(v["system"]["count"].as_u64() > Some(0), "{id}: {v}");
        assert!(v["baseline"]["count"].as_u64() > Some(0), "{id}: {v}");
    }
    // Every page and GET through the proxy was the cache's answer, none tunnelled (the fake
    // agents answer no tunnel: a tunnelled read would have failed the run).
    let headers = row("fleet-list-page")["headers"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert!(!headers.is_empty(), "{table}");
    for (value, count) in &headers {
        assert!(
            value == "hit" || value == "get:hit",
            "a read answered by {value} ({count}): {table}"
        );
    }
    let cycles = row("fleet-cycles");
    assert_eq!(cycles["failed_reads"].as_u64(), Some(0), "{table}");
    assert_eq!(cycles["baseline_failed_reads"].as_u64(), Some(0), "{table}");
    assert!(cycles["cycles"].as_u64() >= Some(3), "{cycles}");
    assert!(cycles["baseline_cycles"].as_u64() >= Some(1), "{cycles}");
    Ok(())
}
