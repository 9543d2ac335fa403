//! Measure 9's watch row: a watch's change-to-event latency through the proxy beside
//! straight to the API server.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ListParams, WatchParams},
    client::Body,
};
use serde_json::{Value, json};

use super::{CACHE_HEADER, KINDS, Setting, World, cache_header};
use crate::{
    measures::{Seen, latencies, paced_updates, record, rv_num, wait_delivered},
    report::{Percentiles, Row},
};

/// Opens a watch of the namespace's ConfigMaps from `rv` with kube's client and records
/// each object it delivers; returns the response's [`CACHE_HEADER`] once the watch is on.
async fn start_watch(
    client: &Client,
    ns: &str,
    rv: &str,
    seen: Seen,
) -> Result<(String, tokio::task::JoinHandle<()>)> {
    let collection = format!("/api/v1/namespaces/{ns}/configmaps");
    let request =
        kube::core::Request::new(&collection).watch(&WatchParams::default().timeout(290), rv)?;
    let response = client.send(request.map(Body::from)).await?;
    let header = cache_header(&response);
    if !response.status().is_success() {
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        bail!(
            "WATCH {collection}: HTTP {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    let mut body = response.into_body();
    let task = tokio::spawn(async move {
        let mut buffer = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            let now = Instant::now();
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buffer.extend_from_slice(&data);
            while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=end).collect();
                let Ok(event) = serde_json::from_slice::<Value>(&line) else {
                    continue;
                };
                if matches!(event["type"].as_str(), Some("ADDED" | "MODIFIED")) {
                    let meta = &event["object"]["metadata"];
                    let name = meta["name"].as_str().unwrap_or_default().to_string();
                    record(&seen, name, rv_num(meta["resourceVersion"].as_str()), now);
                }
            }
        }
    });
    Ok((header, task))
}

pub(super) async fn watch_row(
    w: &World<'_>,
    proxy: &Client,
    direct: &Client,
    ns: &str,
    setting: Setting,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let api = Api::<ConfigMap>::namespaced(w.env.admin.clone(), ns);
    // The cycle's ConfigMaps are objects 0, 8, 16, ...: the updates go round ten of them.
    let names: Vec<String> = (0..w.o.reads_cycle_objects.max(KINDS.len()))
        .step_by(KINDS.len())
        .take(10)
        .map(|i| format!("cycle-{i}"))
        .collect();
    let rv = api
        .list_metadata(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let (proxy_seen, direct_seen): (Seen, Seen) = (Arc::default(), Arc::default());
    let (header, proxy_watch) = start_watch(proxy, ns, &rv, proxy_seen.clone()).await?;
    let (_, direct_watch) = start_watch(direct, ns, &rv, direct_seen.clone()).await?;

    let n = w.o.reads_watch_updates.max(1);
    let tag = format!("{}-", setting.tag());
    let updates = paced_updates(&api, &names, n, w.o.reads_watch_rate, &tag).await?;
    wait_delivered(
        &updates,
        &[&proxy_seen, &direct_seen],
        Duration::from_secs(60),
    )
    .await;
    proxy_watch.abort();
    direct_watch.abort();
    let (proxy_ms, proxy_missed) = latencies(&updates, &proxy_seen);
    let (direct_ms, direct_missed) = latencies(&updates, &direct_seen);
    if proxy_ms.is_empty() || direct_ms.is_empty() {
        bail!(
            "the watches saw none of {n} updates (through the proxy missed {proxy_missed}, directly {direct_missed})"
        );
    }
    let (pp, dp) = (Percentiles::of(&proxy_ms), Percentiles::of(&direct_ms));
    rows.push(Row {
        id: format!("reads-watch{}", setting.id_suffix()),
        measure: 9,
        title: format!(
            "Watch of ConfigMaps through the proxy, change-to-event latency ({n} updates at {}/s), {}",
            w.o.reads_watch_rate,
            setting.title()
        ),
        system: pp.display_ms(),
        baseline_name: "the same watch straight to the API server (the floor)".into(),
        baseline: dp.display_ms(),
        note: format!(
            "from PATCH issued (by the bench, next to the API server) to the event read; both watches opened at once from the same resourceVersion with kube's client; missed: proxy {proxy_missed}, direct {direct_missed}; {CACHE_HEADER} on the proxied watch: {header}"
        ),
        values: json!({ "updates": n, "rate_per_sec": w.o.reads_watch_rate, "proxy_ms": pp, "direct_ms": dp,
            "proxy_missed": proxy_missed, "direct_missed": direct_missed, "cache_header": header }),
    });
    Ok(())
}
