//! Measures 3, 4 and 5: initial sync of each size, resume after a hub restart against a full
//! relist, the agent's idle footprint against a reflector process, and hub memory per object.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::Result;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

use super::{BYTES_SENT, LONG, rv_num};
use crate::{
    Options,
    env::{Env, HubProc, payload},
    floor,
    procs::{Proc, proc_stats},
    report::{Row, bytes, mib, secs},
};

const LISTS: &str = "scale_agent_agent_lists_total";
const RESUMES: &str = "scale_agent_agent_watch_resumes_total";

/// Starts the watch-floor process on `namespace` and waits for its initial lists.
async fn floor_process(
    env: &Env,
    name: &str,
    namespace: &str,
    kinds: &[(&str, &str, &str, &str)],
) -> Result<Proc> {
    let kubeconfig = env.agent_kubeconfig.display().to_string();
    let mut p = Proc::spawn(
        name,
        &env.exe,
        "watch-floor",
        &[],
        &[
            (floor::KUBECONFIG_ENV, kubeconfig),
            (floor::NAMESPACE_ENV, namespace.to_string()),
            (floor::KINDS_ENV, floor::kinds_env(kinds)),
        ],
        env.dir.join(format!("{name}.log")),
    )?;
    let deadline = Instant::now() + LONG;
    loop {
        p.ensure_running()?;
        if std::fs::read_to_string(&p.log)
            .unwrap_or_default()
            .contains(floor::SYNCED_MARKER)
        {
            return Ok(p);
        }
        if Instant::now() > deadline {
            anyhow::bail!("the watch floor did not sync");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// RSS and CPU share of a process over an idle window (CPU time has a resolution of one
/// clock tick, 10 ms).
pub(super) async fn idle(pid: u32, window: Duration) -> Result<(u64, f64)> {
    let before = proc_stats(pid)?;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let after = proc_stats(pid)?;
    Ok((
        after.rss_kib,
        (after.cpu_secs - before.cpu_secs) / started.elapsed().as_secs_f64(),
    ))
}

fn footprint_text(rss_kib: u64, cpu: f64, window: Duration) -> String {
    if cpu <= 0.0 {
        // Not one 10 ms clock tick in the window.
        format!(
            "RSS {}, CPU < {:.2} %",
            mib(rss_kib),
            1.0 / window.as_secs_f64().max(0.01)
        )
    } else {
        format!("RSS {}, CPU {:.2} %", mib(rss_kib), cpu * 100.0)
    }
}

pub async fn idle_footprint(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let ns = env.namespace("bench-idle").await?;
    env.create_configmaps(&ns, "idle", 10, o.object_bytes, 4)
        .await?;
    let hub = env.hub("idle-hub").await?;
    let kinds: Vec<&str> = floor::TEN_KINDS.iter().map(|k| k.2).collect();
    let mut agent = env
        .agent(
            "idle-agent",
            &hub,
            json!([env.account("bench-idle", &ns, &kinds)]),
        )
        .await?;
    agent.wait_ready(LONG).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let window = Duration::from_secs(o.idle_seconds.max(1));
    let (agent_rss, agent_cpu) = idle(agent.pid(), window).await?;
    // The anonymous part (heap, stacks) apart from the pages of the executable the process
    // touched: the two binaries differ in size, the state they keep per watched kind is
    // what the comparison is about.
    let agent_anon = proc_stats(agent.pid())?.rss_anon_kib;
    let floor = floor_process(env, "idle-floor", &ns, floor::TEN_KINDS).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (floor_rss, floor_cpu) = idle(floor.pid(), window).await?;
    let floor_anon = proc_stats(floor.pid())?.rss_anon_kib;
    rows.push(Row {
        id: "footprint-idle".into(),
        measure: 5,
        title: "Agent idle, 10 kinds watched (one namespace, 10 ConfigMaps)".into(),
        system: footprint_text(agent_rss, agent_cpu, window),
        baseline_name: "process with kube-runtime reflectors of the same 10 kinds".into(),
        baseline: footprint_text(floor_rss, floor_cpu, window),
        note: format!(
            "agent as a process (RSS from /proc/<pid>/status, CPU over {} s idle); anonymous (RssAnon: heap and stacks, without the executable's pages): agent {}, reflectors {}",
            window.as_secs(),
            mib(agent_anon),
            mib(floor_anon)
        ),
        values: json!({ "agent_rss_kib": agent_rss, "agent_rss_anon_kib": agent_anon, "agent_cpu_share": agent_cpu, "floor_rss_kib": floor_rss, "floor_rss_anon_kib": floor_anon, "floor_cpu_share": floor_cpu }),
    });
    drop(floor);
    drop(agent);
    drop(hub);
    Ok(())
}

/// Initial sync of each size; for the largest, also footprint with objects, hub memory per
/// object, and resume versus relist.
pub async fn sync_and_resume(env: &Env, o: &Options, rows: &mut Vec<Row>) -> Result<()> {
    let mut sizes = o.sync_sizes.clone();
    sizes.sort_unstable();
    let largest = sizes.last().copied().unwrap_or(0);
    // (objects, hub VmRSS and RssAnon growth in KiB) per sync size, for the slope.
    let mut growth: Vec<(usize, u64, u64)> = Vec::new();
    // (objects, sync seconds, LIST seconds) per sync size, for the split of the sync's time
    // into what any sync costs once and what each object costs.
    let mut timings: Vec<(usize, f64, f64)> = Vec::new();
    for n in sizes {
        let ns = env.namespace(&format!("bench-sync-{n}")).await?;
        let created = env
            .create_configmaps(&ns, "sync", n, o.object_bytes, o.writers)
            .await?;
        // Baseline: a plain paginated LIST of the same objects (best of two, warm).
        let (count, list_bytes, first) = env.list_configmaps(&ns).await?;
        let (_, _, second) = env.list_configmaps(&ns).await?;
        let list_secs = first.min(second).as_secs_f64();
        anyhow::ensure!(count == n, "listed {count} of {n} ConfigMaps");
        let mut hub = env.hub(&format!("sync-{n}-hub")).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let hub_before = hub.stats()?;
        let account = format!("bench-sync-{n}");
        let started = Instant::now();
        let mut agent = env
            .agent(
                &format!("sync-{n}-agent"),
                &hub,
                json!([env.account(&account, &ns, &["configmaps"])]),
            )
            .await?;
        let done = hub.wait_objects(&account, n as u64, LONG).await?;
        let sync_secs = done.duration_since(started).as_secs_f64();
        timings.push((n, sync_secs, list_secs));
        let split = time_split(&timings)
            .map(|split| {
                format!(
                    "; from the two largest sizes: {} once (process start, discovery, connections) and {:.1} µs per object, against the LIST's {} once and {:.1} µs per object ({:.2}× per object)",
                    secs(split.sync_once),
                    split.sync_per_object * 1e6,
                    secs(split.list_once),
                    split.list_per_object * 1e6,
                    split.sync_per_object / split.list_per_object
                )
            })
            .unwrap_or_default();
        rows.push(Row {
            id: format!("sync-{n}"),
            measure: 3,
            title: format!("Initial sync of {n} ConfigMaps of ~{} B (agent start → hub holds all)", o.object_bytes),
            system: format!("{} ({:.0} objects/s)", secs(sync_secs), n as f64 / sync_secs),
            baseline_name: "plain paginated LIST (500 per page) of the same objects".into(),
            baseline: format!("{} ({:.0} objects/s)", secs(list_secs), n as f64 / list_secs),
            note: format!(
                "includes the agent process start, discovery, LIST, stream and hub store; objects created at {:.0}/s{split}",
                n as f64 / created.as_secs_f64()
            ),
            values: json!({ "objects": n, "sync_seconds": sync_secs, "list_seconds": list_secs, "list_json_bytes": list_bytes }),
        });
        agent.wait_ready(LONG).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Hub memory per cached object: 1 s after the sync, and 3 s after, once the hub's
        // store has made the snapshot durable (a durable commit at least every second, made
        // by a task that runs every second) and let go of the copy of its changes it keeps
        // until then.
        let hub_after = hub.stats()?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let hub_settled = hub.stats()?;
        let growth_kib = |after: &crate::procs::ProcStats| {
            (
                after.rss_kib.saturating_sub(hub_before.rss_kib),
                after.rss_anon_kib.saturating_sub(hub_before.rss_anon_kib),
            )
        };
        let (settled_rss, settled_anon) = growth_kib(&hub_settled);
        growth.push((n, settled_rss, settled_anon));
        if n != largest {
            continue;
        }
        let per_object = |kib: u64| kib as f64 * 1024.0 / n as f64;
        let (after_rss, after_anon) = growth_kib(&hub_after);
        let json_per_object = list_bytes as f64 / n as f64;
        let slope = memory_slope(&growth);
        let slope_text = slope
            .map(|(small, rss, anon)| {
                format!(
                    "; 3 s after, slope from {small} to {n} objects: {} per object ({} anonymous)",
                    bytes(rss),
                    bytes(anon)
                )
            })
            .unwrap_or_default();
        rows.push(Row {
            id: "hub-memory".into(),
            measure: 5,
            title: format!("Hub RSS per cached object ({n} ConfigMaps)"),
            system: format!(
                "{} per object 1 s after the sync, {} 3 s after (RSS {} → {} → {}; anonymous {} and {} per object{slope_text})",
                bytes(per_object(after_rss)),
                bytes(per_object(settled_rss)),
                mib(hub_before.rss_kib),
                mib(hub_after.rss_kib),
                mib(hub_settled.rss_kib),
                bytes(per_object(after_anon)),
                bytes(per_object(settled_anon)),
            ),
            baseline_name: "the object's JSON size in a LIST".into(),
            baseline: format!("{} per object", bytes(json_per_object)),
            note: "hub as a process: VmRSS (and RssAnon, without the executable's pages the sync touched) before the agent connected, and 1 s and 3 s after it held all objects (by 3 s the store has made the snapshot durable and dropped the copy of its changes it kept until then), over the objects: the object in memory, redb's page cache of the store, allocator overhead, what the process first touches for an agent; the slope, with two sync sizes, is the difference in growth 3 s after over the difference in objects, without what does not grow with the objects".into(),
            values: json!({ "objects": n, "hub_rss_before_kib": hub_before.rss_kib, "hub_rss_after_kib": hub_after.rss_kib,
                "hub_rss_settled_kib": hub_settled.rss_kib,
                "hub_rss_anon_before_kib": hub_before.rss_anon_kib, "hub_rss_anon_after_kib": hub_after.rss_anon_kib,
                "hub_rss_anon_settled_kib": hub_settled.rss_anon_kib,
                "hub_bytes_per_object": per_object(after_rss), "hub_anon_bytes_per_object": per_object(after_anon),
                "hub_settled_bytes_per_object": per_object(settled_rss), "hub_settled_anon_bytes_per_object": per_object(settled_anon),
                "hub_settled_growth_kib_per_size": growth.iter().map(|(n, rss, anon)| json!({ "objects": n, "rss_kib": rss, "rss_anon_kib": anon })).collect::<Vec<_>>(),
                "hub_slope_bytes_per_object": slope.map(|s| s.1), "hub_anon_slope_bytes_per_object": slope.map(|s| s.2),
                "json_bytes_per_object": json_per_object }),
        });
        // Agent footprint with the objects watched, against the reflector floor.
        let window = Duration::from_secs(o.idle_seconds.max(1));
        let (agent_rss, agent_cpu) = idle(agent.pid(), window).await?;
        let floor_proc =
            floor_process(env, &format!("sync-{n}-floor"), &ns, &floor::TEN_KINDS[..1]).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (floor_rss, floor_cpu) = idle(floor_proc.pid(), window).await?;
        drop(floor_proc);
        rows.push(Row {
            id: "footprint-objects".into(),
            measure: 5,
            title: format!("Agent with {n} ConfigMaps watched, idle"),
            system: footprint_text(agent_rss, agent_cpu, window),
            baseline_name: "process with a kube-runtime reflector of the same ConfigMaps".into(),
            baseline: footprint_text(floor_rss, floor_cpu, window),
            note: format!("CPU over {} s idle after the sync", window.as_secs()),
            values: json!({ "objects": n, "agent_rss_kib": agent_rss, "agent_cpu_share": agent_cpu, "floor_rss_kib": floor_rss, "floor_cpu_share": floor_cpu }),
        });
        resume(env, o, &mut hub, &agent, &ns, &account, n, rows).await?;
    }
    Ok(())
}

/// Hub memory per object between the two largest sync sizes: (the smaller size, VmRSS
/// bytes per object, RssAnon bytes per object), from (objects, VmRSS growth KiB, RssAnon
/// growth KiB) per size, sorted by size; `None` with fewer than two sizes.
/// An initial sync's time and the LIST's as a cost paid once plus a cost per object, from
/// the two largest sizes measured: the line through them.
struct TimeSplit {
    sync_once: f64,
    sync_per_object: f64,
    list_once: f64,
    list_per_object: f64,
}

fn time_split(timings: &[(usize, f64, f64)]) -> Option<TimeSplit> {
    let [
        ..,
        (small, sync_small, list_small),
        (large, sync_large, list_large),
    ] = timings
    else {
        return None;
    };
    let objects = large.checked_sub(*small).filter(|d| *d > 0)? as f64;
    let sync_per_object = (sync_large - sync_small) / objects;
    let list_per_object = (list_large - list_small) / objects;
    (sync_per_object > 0.0 && list_per_object > 0.0).then(|| TimeSplit {
        sync_once: sync_small - sync_per_object * *small as f64,
        sync_per_object,
        list_once: list_small - list_per_object * *small as f64,
        list_per_object,
    })
}

fn memory_slope(growth: &[(usize, u64, u64)]) -> Option<(usize, f64, f64)> {
    let [
        ..,
        (small, rss_small, anon_small),
        (large, rss_large, anon_large),
    ] = growth
    else {
        return None;
    };
    let objects = large.checked_sub(*small).filter(|d| *d > 0)? as f64;
    let per_object = |a: u64, b: u64| (b as f64 - a as f64) * 1024.0 / objects;
    Some((
        *small,
        per_object(*rss_small, *rss_large),
        per_object(*anon_small, *anon_large),
    ))
}

/// Whether the hub holds the account's ConfigMaps up to `rv` with `n` objects.
async fn hub_consistent(hub: &HubProc, account: &str, n: usize, rv: u64) -> Result<bool> {
    let Some(view) = hub.account(account).await? else {
        return Ok(false);
    };
    let objects = view["objects"].as_u64().unwrap_or(0);
    let resumed = view["kinds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|k| k["plural"] == "configmaps")
        .flat_map(|k| k["resumePoints"].as_array().cloned().unwrap_or_default())
        .any(|p| rv_num(p["resourceVersion"].as_str()) >= rv);
    Ok(objects == n as u64 && resumed)
}

/// Objects whose resourceVersion at the hub differs from the API server's.
async fn mismatches(env: &Env, hub: &HubProc, account: &str, ns: &str) -> Result<usize> {
    let api = Api::<ConfigMap>::namespaced(env.admin.clone(), ns);
    let truth: HashMap<String, String> = api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|o| {
            (
                o.metadata.name.unwrap_or_default(),
                o.metadata.resource_version.unwrap_or_default(),
            )
        })
        .collect();
    let held = hub
        .get_json(&format!(
            "/api/v1/accounts/{account}/objects?kind=configmaps&namespace={ns}"
        ))
        .await?;
    let held: HashMap<String, String> = held["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    Ok(truth
        .iter()
        .filter(|(k, v)| held.get(*k) != Some(v))
        .count()
        + held.len().abs_diff(truth.len()))
}

#[allow(clippy::too_many_arguments)]
async fn resume(
    env: &Env,
    o: &Options,
    hub: &mut HubProc,
    agent: &crate::env::AgentProc,
    ns: &str,
    account: &str,
    n: usize,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let m = o.resume_changes.min(n);
    let round = |wipe: bool, r: usize| ResumeRound {
        env,
        o,
        agent,
        ns,
        account,
        n,
        m,
        wipe,
        round: r,
    };
    let (rs, rb, rl, rr, rw) = round(false, 1).run(hub).await?;
    let (fs, fb, fl, fr, fw) = round(true, 2).run(hub).await?;
    rows.push(Row {
        id: "resume".into(),
        measure: 4,
        title: format!("Hub restart after {m} changes while it was down ({n} objects)"),
        system: format!("resume: {}, {} sent, {rl:.0} LISTs, {rr:.0} watch resumes", secs(rs), bytes(rb)),
        baseline_name: "full relist of the same cluster (hub restarted without its store)".into(),
        baseline: format!("{}, {} sent, {fl:.0} LISTs, {fr:.0} watch resumes", secs(fs), bytes(fb)),
        note: format!(
            "from hub start to a cache with every change (resume point ≥ last change, all objects); includes the agent's reconnect backoff (200 ms × 1.6, max 1 s); objects differing from the API server afterwards: {rw} / {fw}"
        ),
        values: json!({ "changes": m, "objects": n,
            "resume": { "seconds": rs, "bytes": rb, "lists": rl, "watch_resumes": rr, "mismatches": rw },
            "relist": { "seconds": fs, "bytes": fb, "lists": fl, "watch_resumes": fr, "mismatches": fw } }),
    });
    Ok(())
}

/// One hub restart with `m` changes made while it was down.
struct ResumeRound<'a> {
    env: &'a Env,
    o: &'a Options,
    agent: &'a crate::env::AgentProc,
    ns: &'a str,
    account: &'a str,
    n: usize,
    m: usize,
    /// Restart without the hub's store: a full relist.
    wipe: bool,
    round: usize,
}

impl ResumeRound<'_> {
    /// (seconds, bytes sent, LISTs, watch resumes, objects differing afterwards).
    async fn run(&self, hub: &mut HubProc) -> Result<(f64, f64, f64, f64, usize)> {
        let agent = self.agent;
        let api = Api::<ConfigMap>::namespaced(self.env.admin.clone(), self.ns);
        let b0 = agent.metric(BYTES_SENT).await?;
        let l0 = agent.metric(LISTS).await?;
        let w0 = agent.metric(RESUMES).await?;
        hub.stop();
        let (r, bytes_per_object) = (self.round, self.o.object_bytes);
        let rvs: Vec<u64> = futures::stream::iter(0..self.m)
            .map(|i| {
                let api = api.clone();
                async move {
                    let patch =
                        json!({ "data": { "payload": payload(i + r * 7919, bytes_per_object) } });
                    let cm = api
                        .patch(
                            &format!("sync-{i}"),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await?;
                    anyhow::Ok(rv_num(cm.metadata.resource_version.as_deref()))
                }
            })
            .buffer_unordered(self.o.writers.max(1))
            .try_collect()
            .await?;
        let last = rvs.into_iter().max().unwrap_or(0);
        if self.wipe {
            crate::env::remove(&hub.data_dir);
        }
        let started = Instant::now();
        hub.start().await?;
        let hub_ref = &*hub;
        crate::procs::wait_for(
            "a consistent hub cache",
            LONG,
            Duration::from_millis(10),
            || async {
                Ok(hub_consistent(hub_ref, self.account, self.n, last)
                    .await?
                    .then_some(()))
            },
        )
        .await?;
        let secs = started.elapsed().as_secs_f64();
        let bytes_sent = agent.metric(BYTES_SENT).await? - b0;
        let lists = agent.metric(LISTS).await? - l0;
        let resumes = agent.metric(RESUMES).await? - w0;
        let wrong = mismatches(self.env, hub_ref, self.account, self.ns).await?;
        Ok((secs, bytes_sent, lists, resumes, wrong))
    }
}

#[cfg(test)]
mod tests {
    use super::{memory_slope, time_split};

    #[test]
    fn a_sync_splits_into_a_cost_paid_once_and_one_per_object() {
        assert!(time_split(&[(10_000, 0.5, 0.2)]).is_none(), "one size");
        // 0.1 s once and 40 µs per object; the LIST nothing once and 20 µs per object.
        let split = time_split(&[(1_000, 0.14, 0.02), (10_000, 0.5, 0.2)]).expect("two sizes");
        assert!((split.sync_once - 0.1).abs() < 1e-9, "{}", split.sync_once);
        assert!((split.sync_per_object - 40e-6).abs() < 1e-12);
        assert!(split.list_once.abs() < 1e-9, "{}", split.list_once);
        assert!((split.list_per_object - 20e-6).abs() < 1e-12);
        assert!(
            time_split(&[(1_000, 0.2, 0.02), (10_000, 0.1, 0.2)]).is_none(),
            "a larger sync that took less time has no per-object cost to give"
        );
    }

    #[test]
    fn the_slope_leaves_out_what_does_not_grow_with_the_objects() {
        assert_eq!(memory_slope(&[(10_000, 12_000, 9_000)]), None, "one size");
        // 2,000 KiB that any sync costs, then 1 KiB per object (0.75 anonymous).
        let growth = [
            (1_000, 2_000 + 1_000, 2_000 + 750),
            (10_000, 2_000 + 10_000, 2_000 + 7_500),
        ];
        assert_eq!(memory_slope(&growth), Some((1_000, 1024.0, 768.0)));
        assert_eq!(
            memory_slope(&[(5, 1, 1), (5, 2, 2)]),
            None,
            "one size twice"
        );
    }
}
