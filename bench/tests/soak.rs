//! Measure 10, the soak, with tiny sizes (10 agents for 17 s, past the hub's heartbeat period,
//! a reconnect every half second):
//! its row has both figures, every agent is connected at the end, the reconnects were made,
//! and the hub ended no stream on its own. No timing or memory figure is asserted.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_soak_reports_memory_and_reconnects() -> anyhow::Result<()> {
    let options = scale_agent_bench::Options {
        measures: vec![10],
        ..scale_agent_bench::Options::tiny(env!("CARGO_BIN_EXE_scale-agent-bench").into())
    };
    let report = scale_agent_bench::run(&options).await?;
    let table = report.table();
    eprintln!("{table}");
    let [row] = report.rows.as_slice() else {
        panic!("one row expected:\n{table}")
    };
    assert_eq!(row.id, "soak");
    assert!(
        !row.system.is_empty() && !row.baseline.is_empty(),
        "{table}"
    );
    let v = &row.values;
    assert_eq!(v["connected_at_end"], options.soak_agents, "{v}");
    assert!(v["reconnects"].as_u64() >= Some(1), "{v}");
    assert_eq!(v["streams_ended_by_hub"], 0, "{v}");
    assert!(v["updates"].as_u64() >= Some(1), "{v}");
    assert!(v["hub_rss_end_kib"].as_u64() > Some(0), "{v}");
    assert!(!v["samples"].as_array().is_none_or(Vec::is_empty), "{v}");
    Ok(())
}
