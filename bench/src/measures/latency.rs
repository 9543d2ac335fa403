//! Measure 1: change-to-hub latency, beside a raw kube-runtime watcher (the floor) and
//! Clouddriver's full LIST every period; and the watcher measure 2 uses too.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use futures::TryStreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
    runtime::watcher,
};
use rand::Rng as _;
use serde_json::{Value, json};

use super::{LONG, Seen, latencies, record, rv_num};
use crate::{
    Options,
    env::Env,
    procs::{self},
    report::{Percentiles, Row, ms},
};

/// A kube-runtime watcher of the namespace's ConfigMaps recording every applied object.
pub(super) fn spawn_watcher(
    env: &Env,
    namespace: &str,
    seen: Seen,
    synced: Arc<AtomicBool>,
    json_bytes: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let api = Api::<ConfigMap>::namespaced(env.admin.clone(), namespace);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Ok(Some(event)) = stream.try_next().await {
            let now = Instant::now();
            match event {
                watcher::Event::Apply(o) => {
                    json_bytes.fetch_add(
                        serde_json::to_vec(&o).map(|v| v.len()).unwrap_or(0),
                        Ordering::Relaxed,
                    );
                    let rv = rv_num(o.metadata.resource_version.as_deref());
                    record(&seen, o.metadata.name.unwrap_or_default(), rv, now);
                }
                watcher::Event::InitDone => synced.store(true, Ordering::SeqCst),
                _ => {}
            }
        }
    })
}

pub async fn latency(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let ns = env.namespace("bench-latency").await?;
    let k = o.latency_objects.max(1);
    env.create_configmaps(&ns, "lat", k, 16, 4).await?;
    let hub = env.hub("latency-hub").await?;
    let account = "bench-latency";
    let mut agent = env
        .agent(
            "latency-agent",
            &hub,
            json!([env.account(account, &ns, &["configmaps"])]),
        )
        .await?;
    agent.wait_ready(LONG).await?;
    hub.wait_objects(account, k as u64, LONG).await?;

    let watch_seen: Seen = Arc::default();
    let hub_seen: Seen = Arc::default();
    let synced = Arc::new(AtomicBool::new(false));
    let watch = spawn_watcher(env, &ns, watch_seen.clone(), synced.clone(), Arc::default());
    let stop = Arc::new(AtomicBool::new(false));
    let polls = Arc::new(AtomicUsize::new(0));
    let poller = {
        let (stop, polls, seen) = (stop.clone(), polls.clone(), hub_seen.clone());
        let (addr, path) = (
            hub.http_addr,
            format!("/api/v1/accounts/{account}/objects?kind=configmaps&namespace={ns}"),
        );
        let interval = o.poll_interval;
        tokio::spawn(async move {
            let mut last: HashMap<String, u64> = HashMap::new();
            while !stop.load(Ordering::SeqCst) {
                if let Ok((200, body)) =
                    procs::http_with_token(addr, "GET", &path, None, Some(procs::API_TOKEN)).await
                {
                    let now = Instant::now();
                    polls.fetch_add(1, Ordering::Relaxed);
                    if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                        for item in v["items"].as_array().into_iter().flatten() {
                            let name = item["metadata"]["name"].as_str().unwrap_or_default();
                            let rv = rv_num(item["metadata"]["resourceVersion"].as_str());
                            if last.get(name) != Some(&rv) {
                                last.insert(name.to_string(), rv);
                                record(&seen, name.to_string(), rv, now);
                            }
                        }
                    }
                }
                tokio::time::sleep(interval).await;
            }
        })
    };
    crate::procs::wait_for(
        "the watcher's initial list",
        LONG,
        Duration::from_millis(10),
        || async { Ok(synced.load(Ordering::SeqCst).then_some(())) },
    )
    .await?;

    // A steady stream of updates at a fixed rate, each carrying its timestamp.
    let api = Api::<ConfigMap>::namespaced(env.admin.clone(), &ns);
    let period = Duration::from_secs_f64(1.0 / o.latency_rate.max(0.1));
    let started = Instant::now();
    let poll_started = polls.load(Ordering::Relaxed);
    let mut tasks = Vec::new();
    for i in 0..o.latency_updates {
        tokio::time::sleep_until((started + period * i as u32).into()).await;
        let api = api.clone();
        let name = format!("lat-{}", i % k);
        tasks.push(tokio::spawn(async move {
            let issued = Instant::now();
            let unix_nanos = k8s_openapi::jiff::Timestamp::now().as_nanosecond();
            let patch = json!({ "data": { "seq": i.to_string(), "updatedAtUnixNanos": unix_nanos.to_string() } });
            let cm = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            anyhow::Ok((name, rv_num(cm.metadata.resource_version.as_deref()), issued))
        }));
    }
    let mut updates = Vec::new();
    for t in tasks {
        updates.push(t.await??);
    }
    let sent_secs = started.elapsed().as_secs_f64();
    // Wait until both observers saw every update (or 30 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let (w, wm) = latencies(&updates, &watch_seen);
        let (h, hm) = latencies(&updates, &hub_seen);
        if wm == 0 && hm == 0 && !w.is_empty() && !h.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let observed_secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let _ = poller.await;
    watch.abort();
    let poll_cycle_ms =
        observed_secs * 1000.0 / (polls.load(Ordering::Relaxed) - poll_started).max(1) as f64;
    let (hub_lat, hub_missed) = latencies(&updates, &hub_seen);
    let (watch_lat, watch_missed) = latencies(&updates, &watch_seen);
    let hub_p = Percentiles::of(&hub_lat);
    let watch_p = Percentiles::of(&watch_lat);

    // Clouddriver's way: a full LIST every period, at a random phase. An update shows when
    // the next LIST after it has completed.
    let mut list_ms = Vec::new();
    for _ in 0..5 {
        list_ms.push(env.list_configmaps(&ns).await?.2.as_secs_f64() * 1000.0);
    }
    let list_p = Percentiles::of(&list_ms);
    let period_ms = o.list_period.as_secs_f64() * 1000.0;
    let mut rng = rand::rng();
    let mut poll_lat = Vec::new();
    for _ in 0..200 {
        let phase = rng.random_range(0.0..period_ms);
        for (_, _, issued) in &updates {
            let t = issued.duration_since(started).as_secs_f64() * 1000.0;
            let next = phase + ((t - phase) / period_ms).ceil().max(0.0) * period_ms;
            poll_lat.push(next - t + list_p.p50);
        }
    }
    let poll_p = Percentiles::of(&poll_lat);
    let title = format!(
        "Change-to-hub latency ({} ConfigMap updates at {}/s)",
        o.latency_updates, o.latency_rate
    );
    let values = json!({
        "updates": o.latency_updates, "rate_per_sec": o.latency_rate, "objects": k,
        "sent_seconds": sent_secs,
        "hub_ms": hub_p, "hub_missed": hub_missed,
        "raw_watch_ms": watch_p, "raw_watch_missed": watch_missed,
        "hub_poll_cycle_ms": poll_cycle_ms, "hub_poll_sleep_ms": o.poll_interval.as_secs_f64() * 1000.0,
        "list_every_ms": period_ms, "list_duration_ms": list_p, "list_every_ms_latency": poll_p,
    });
    rows.push(Row {
        id: "latency-watch".into(),
        measure: 1,
        title: title.clone(),
        system: hub_p.display_ms(),
        baseline_name: "raw kube-runtime watcher in the bench process (the floor)".into(),
        baseline: watch_p.display_ms(),
        note: format!(
            "from PATCH issued to the new resourceVersion visible at the hub's HTTP API, polled every {:.1} ms on average (adds about half of that); missed: hub {hub_missed}, watch {watch_missed}",
            poll_cycle_ms
        ),
        values: values.clone(),
    });
    rows.push(Row {
        id: "latency-list".into(),
        measure: 1,
        title,
        system: hub_p.display_ms(),
        baseline_name: format!(
            "Clouddriver-style full LIST every {:.0} s",
            o.list_period.as_secs_f64()
        ),
        baseline: poll_p.display_ms(),
        note: format!(
            "computed from the same update instants: next LIST at a random phase (200 phases) + one measured LIST of the same objects ({}); Clouddriver lists every kind, so this is a lower bound",
            ms(list_p.p50)
        ),
        values,
    });
    drop(agent);
    drop(hub);
    Ok(())
}
