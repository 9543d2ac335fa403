//! Measure 11 with tiny sizes: the hub on PostgreSQL (from the e2e harness) and on its
//! embedded store, a few simulated agents over three replicas beside one embedded hub, then
//! the fleet's churn, and the failover of one killed replica beside an embedded hub killed
//! and restarted, each row with both figures. The agents stream measure 12's mix of eight
//! kinds (`--ha-objects`, issue 26's run), so a failover resumes or relists each kind. No
//! timing is asserted: the machines are shared.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_run_reports_the_hub_on_postgres_beside_embedded() -> anyhow::Result<()> {
    let options = scale_agent_bench::Options {
        measures: vec![11],
        ha_objects: Some(40),
        ..scale_agent_bench::Options::tiny(env!("CARGO_BIN_EXE_scale-agent-bench").into())
    };
    let report = scale_agent_bench::run(&options).await?;
    let table = report.table();
    eprintln!("{table}");
    let row = |id: &str| {
        report
            .rows
            .iter()
            .find(|r| r.id == id)
            .ok_or_else(|| anyhow::anyhow!("no row {id} in\n{table}"))
    };
    for id in ["store-postgres-events", "ha-fleet", "ha-failover"] {
        let row = row(id)?;
        assert_eq!(row.measure, 11);
        assert!(
            table.contains(&row.system) && table.contains(&row.baseline),
            "{table}"
        );
    }
    let events = &row("store-postgres-events")?.values;
    for key in ["postgres_events_per_sec", "embedded_events_per_sec"] {
        let rate = events[key].as_f64().unwrap_or_default();
        assert!(rate > 0.0, "{key} {rate} in\n{table}");
    }
    // Every agent streamed on both sides: the replicas' counts add up to all of them.
    let fleet = &row("ha-fleet")?.values;
    let agents = fleet["agents"].as_u64().unwrap_or_default();
    for key in ["replicated_connected", "embedded_connected"] {
        let connected: u64 = fleet[key]
            .as_array()
            .map(|a| a.iter().filter_map(|c| c.as_u64()).sum())
            .unwrap_or_default();
        assert_eq!(connected, agents, "{key} in\n{table}");
    }
    // Each side's store committed the fleet, and the churn's updates were all sent on live
    // streams (acknowledged, or the run would have failed).
    for side in ["replicated", "embedded"] {
        let s = &fleet[side];
        assert!(s["stored_seconds"].as_f64() > Some(0.0), "{side}: {s}");
        assert!(
            s["objects_per_sec_stored"].as_f64() > Some(0.0),
            "{side}: {s}"
        );
        assert_eq!(s["churn"]["lost"].as_u64(), Some(0), "{side}: {s}");
        assert!(s["churn"]["sent"].as_u64() > Some(0), "{side}: {s}");
    }
    // The failover row accounts for every agent of the killed hub on each side: streaming
    // again, or named among the failures (the row reports them rather than failing).
    let failover = &row("ha-failover")?.values;
    for side in ["replicated", "embedded"] {
        let s = &failover[side];
        let accounted = s["streaming_seconds"].as_array().map_or(0, Vec::len)
            + s["failures"].as_array().map_or(0, Vec::len);
        assert!(accounted > 0, "{side} in\n{table}");
        assert_eq!(
            accounted as u64,
            s["agents"].as_u64().unwrap_or_default(),
            "{side}"
        );
    }
    Ok(())
}
