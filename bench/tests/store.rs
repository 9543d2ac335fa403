//! Measure 11 with tiny sizes: the hub on PostgreSQL (from the e2e harness) and on its
//! embedded store, each with a figure. No timing is asserted: the machines are shared.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_run_reports_the_hub_on_postgres_beside_embedded() -> anyhow::Result<()> {
    let options = scale_agent_bench::Options {
        measures: vec![11],
        ..scale_agent_bench::Options::tiny(env!("CARGO_BIN_EXE_scale-agent-bench").into())
    };
    let report = scale_agent_bench::run(&options).await?;
    let table = report.table();
    eprintln!("{table}");
    let row = report
        .rows
        .iter()
        .find(|r| r.id == "store-postgres-events")
        .ok_or_else(|| anyhow::anyhow!("no row store-postgres-events in\n{table}"))?;
    assert_eq!(row.measure, 11);
    for key in ["postgres_events_per_sec", "embedded_events_per_sec"] {
        let rate = row.values[key].as_f64().unwrap_or_default();
        assert!(rate > 0.0, "{key} {rate} in\n{table}");
    }
    assert!(
        table.contains(&row.system) && table.contains(&row.baseline),
        "{table}"
    );
    Ok(())
}
