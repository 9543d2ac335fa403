//! Measure 8's watch row: a watch's change-to-event latency through the proxy beside
//! straight to the API server.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ListParams, WatchEvent, WatchParams},
};
use serde_json::json;

use super::{MachineWindow, Sides, answered_by};
use crate::{
    Options,
    env::Env,
    measures::{Seen, latencies, paced_updates, record, rv_num, wait_delivered},
    report::{Percentiles, Row, ms},
};

/// Opens a watch of the namespace's ConfigMaps from `rv` on `client` and records each
/// object it delivers; returns once the watch's response has started (the watch is on).
async fn start_watch(
    client: Client,
    ns: &str,
    rv: &str,
    seen: Seen,
) -> Result<tokio::task::JoinHandle<()>> {
    let api = Api::<ConfigMap>::namespaced(client, ns);
    let params = WatchParams::default().timeout(290);
    let stream = api.watch(&params, rv).await?.boxed();
    Ok(tokio::spawn(async move {
        let mut stream = stream;
        while let Some(Ok(event)) = stream.next().await {
            let now = Instant::now();
            if let WatchEvent::Added(o) | WatchEvent::Modified(o) = event {
                let rv = rv_num(o.metadata.resource_version.as_deref());
                record(&seen, o.metadata.name.unwrap_or_default(), rv, now);
            }
        }
    }))
}

pub(super) async fn watch(
    env: &Env,
    sides: &Sides,
    o: &Options,
    ns: &str,
    k: usize,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let api = Api::<ConfigMap>::namespaced(env.admin.clone(), ns);
    let rv = api
        .list_metadata(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let collection = format!("/api/v1/namespaces/{ns}/configmaps");
    let answered = answered_by(&sides.proxy, &collection, None, true).await?;
    let (proxy_seen, direct_seen): (Seen, Seen) = (Arc::default(), Arc::default());
    let proxy_watch = start_watch(sides.proxy.clone(), ns, &rv, proxy_seen.clone()).await?;
    let direct_watch = start_watch(sides.direct.clone(), ns, &rv, direct_seen.clone()).await?;

    // The same steady stream of updates as measure 1, seen by both watches.
    let n = o.proxy_watch_updates.max(1);
    let names: Vec<String> = (0..k).map(|i| format!("watch-{i}")).collect();
    let machine = MachineWindow::start();
    let started = Instant::now();
    let updates = paced_updates(&api, &names, n, o.proxy_watch_rate, "").await?;
    wait_delivered(
        &updates,
        &[&proxy_seen, &direct_seen],
        Duration::from_secs(30),
    )
    .await;
    let (machine_cores, machine_text) = machine.finish();
    proxy_watch.abort();
    direct_watch.abort();
    let (proxy_lat, proxy_missed) = latencies(&updates, &proxy_seen);
    let (direct_lat, direct_missed) = latencies(&updates, &direct_seen);
    let (proxy_p, direct_p) = (Percentiles::of(&proxy_lat), Percentiles::of(&direct_lat));
    // The per-update difference shows what the tunnel adds to each event, free of the
    // API server's own spread that both watches share.
    let index = |seen: &Seen| {
        let mut first: HashMap<(String, u64), Instant> = HashMap::new();
        for (name, rv, at) in seen.lock().map(|s| s.clone()).unwrap_or_default() {
            first.entry((name, rv)).or_insert(at);
        }
        first
    };
    let (proxy_first, direct_first) = (index(&proxy_seen), index(&direct_seen));
    // (seconds from the first update, extra milliseconds) per update seen by both.
    let timed_extra: Vec<(f64, f64)> = updates
        .iter()
        .filter_map(|(name, rv, issued)| {
            let key = (name.clone(), *rv);
            let (p, d) = (proxy_first.get(&key)?, direct_first.get(&key)?);
            Some((
                issued.duration_since(started).as_secs_f64(),
                p.saturating_duration_since(*d).as_secs_f64() * 1000.0,
            ))
        })
        .collect();
    let extra: Vec<f64> = timed_extra.iter().map(|(_, e)| *e).collect();
    let extra_p = Percentiles::of(&extra);
    // The slowest, with when they happened: periodic ones point at something periodic on
    // the path (the hub's durable store commit every second, a heartbeat).
    let mut slowest = timed_extra.clone();
    slowest.sort_by(|a, b| b.1.total_cmp(&a.1));
    slowest.truncate(10);
    rows.push(Row {
        id: "proxy-watch".into(),
        measure: 8,
        title: format!(
            "Watch of ConfigMaps through the proxy: change-to-event latency ({n} updates at {}/s)",
            o.proxy_watch_rate
        ),
        system: proxy_p.display_ms(),
        baseline_name: "the same watch straight to the API server, same update instants".into(),
        baseline: direct_p.display_ms(),
        note: format!(
            "x-scale-agent-cache on the proxied watch: {answered}; from PATCH issued to the event read by the client; both watches open at once from the same resourceVersion (kube's client, one raw watch each); the agent streams the same changes to the hub's cache on the same gRPC stream; per event the proxy adds p50 {} / p99 {}; {machine_text}; missed: proxy {proxy_missed}, direct {direct_missed}",
            ms(extra_p.p50),
            ms(extra_p.p99)
        ),
        values: json!({ "updates": n, "rate_per_sec": o.proxy_watch_rate, "objects": k,
            "proxy_ms": proxy_p, "direct_ms": direct_p, "proxy_extra_ms": extra_p,
            "proxy_extra_slowest_at_s_ms": slowest, "machine_busy_cores": machine_cores,
            "proxy_missed": proxy_missed, "direct_missed": direct_missed }),
    });
    Ok(())
}
