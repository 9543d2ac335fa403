//! The hub's state at fleet scale: one account's work never makes another account wait, and
//! a paged LIST from the cache is the list of one resourceVersion however the cache moves
//! meanwhile.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{collections::BTreeMap, time::Duration};

use common::*;
use scale_agent_proto::v1::{
    self as pb, agent_message::Kind as Msg, kind_status::State, object_event::Type as EventType,
};
use scale_agent_testkit::https::{Https, Proto};

/// How long a cached GET may take while another account is busy: generous (the same GET
/// takes about a millisecond), so that only waiting for the other account fails it.
const GET_BOUND: Duration = Duration::from_secs(2);

fn cm(name: &str, rv: &str) -> Msg {
    cm_event("unused", EventType::Applied, name, rv, "web")
}

/// A ConfigMap event of `account`.
fn cm_of(account: &str, t: EventType, name: &str, rv: &str) -> Msg {
    let Msg::Object(mut ev) = cm(name, rv) else {
        unreachable!()
    };
    ev.account = account.into();
    ev.r#type = t as i32;
    Msg::Object(ev)
}

/// Snapshot of `objects` (name, resourceVersion) at `rv`, and the kind WATCHING: the
/// proxy reads it from the cache from then on.
async fn synced(agent: &mut FakeAgent, account: &str, objects: &[(&str, &str)], rv: &str) {
    agent.snapshot(account, objects, rv).await;
    agent
        .send(Msg::KindStatus(pb::KindStatus {
            account: account.into(),
            kind: Some(configmaps()),
            state: State::Watching as i32,
            message: String::new(),
            namespaces: Vec::new(),
        }))
        .await;
    agent.synced().await;
}

async fn cached_get(http: &Https, path: &str, token: &str) -> (u16, serde_json::Value) {
    let reply = http.get(path, Some(token)).await;
    assert_eq!(
        reply.header("x-scale-agent-cache").as_deref(),
        Some("hit"),
        "{path}: {}",
        reply.text()
    );
    (reply.status, reply.json())
}

/// While one account's cache is locked (a batch of it being applied, made as long as the
/// test wants), another account's cached GETs are answered and its agent's batches are
/// applied and acknowledged: nothing on either path waits for a lock of all accounts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_account_does_not_delay_another_accounts_reads_or_batches() {
    let pki = Pki::new();
    let dir = data_dir("fleet-busy-account");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut big = tunnel_agent(&hub, &pki, "agent-big.test", "pod-1").await;
    big.register("big", "https://10.0.0.1:6443").await;
    synced(&mut big, "big", &[("b0", "5")], "10").await;
    let mut small = tunnel_agent(&hub, &pki, "agent-small.test", "pod-1").await;
    small.register("small", "https://10.0.0.2:6443").await;
    synced(&mut small, "small", &[("s0", "5")], "10").await;
    let token = token_for(&http, &admin, "small").await;
    let path = "/clusters/small/api/v1/namespaces/default/configmaps/s0";
    assert_eq!(cached_get(&http, path, &token).await.0, 200);

    // The big account's lock held, as by a batch of it that does not end.
    let live = hub.live();
    let slot = live.cache().account("big").unwrap();
    let held = std::thread::spawn(move || {
        let _busy = scale_agent_hub::cache::lock(&slot);
        std::thread::sleep(Duration::from_secs(4));
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = tokio::time::Instant::now();
    let (status, object) = tokio::time::timeout(GET_BOUND, cached_get(&http, path, &token))
        .await
        .expect("a cached GET of one account waited for another account's lock");
    assert_eq!(status, 200);
    assert_eq!(object["metadata"]["name"], "s0");
    // A batch of the small account is applied and acknowledged meanwhile, and read back.
    small
        .send(cm_of("small", EventType::Applied, "s1", "11"))
        .await;
    tokio::time::timeout(GET_BOUND, small.synced())
        .await
        .expect("a batch of one account waited for another account's lock");
    let path_s1 = "/clusters/small/api/v1/namespaces/default/configmaps/s1";
    let (status, _) = tokio::time::timeout(GET_BOUND, async {
        loop {
            let reply = http.get(path_s1, Some(&token)).await;
            if reply.status == 200 {
                return (reply.status, reply.json());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the small account's new object was not readable while the big one was busy");
    assert_eq!(status, 200);
    assert!(
        !held.is_finished(),
        "the big account's lock was released before the checks ended ({:?})",
        started.elapsed()
    );
    held.join().unwrap();
    drop((big, small));
    hub.shutdown().await.unwrap();
}

/// One account's huge relist (tens of thousands of objects in one snapshot, each packed as
/// it arrives) does not delay another account's cached GETs beyond a generous bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_huge_relist_of_one_account_does_not_delay_another_accounts_gets() {
    const HUGE: usize = 40_000;
    let pki = Pki::new();
    let dir = data_dir("fleet-huge-relist");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut small = tunnel_agent(&hub, &pki, "agent-small.test", "pod-1").await;
    small.register("small", "https://10.0.0.2:6443").await;
    synced(&mut small, "small", &[("s0", "5")], "10").await;
    let token = token_for(&http, &admin, "small").await;
    let path = "/clusters/small/api/v1/namespaces/default/configmaps/s0";
    cached_get(&http, path, &token).await;

    let mut big = tunnel_agent(&hub, &pki, "agent-big.test", "pod-1").await;
    big.register("big", "https://10.0.0.1:6443").await;
    let relist = tokio::spawn(async move {
        let names: Vec<String> = (0..HUGE).map(|i| format!("big-{i:06}")).collect();
        let objects: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "5")).collect();
        synced(&mut big, "big", &objects, "10").await;
        big
    });
    let mut slowest = Duration::ZERO;
    let mut gets = 0;
    while !relist.is_finished() {
        let started = tokio::time::Instant::now();
        let (status, _) = tokio::time::timeout(GET_BOUND, cached_get(&http, path, &token))
            .await
            .expect("a cached GET waited past the bound during another account's relist");
        assert_eq!(status, 200);
        slowest = slowest.max(started.elapsed());
        gets += 1;
    }
    let big = relist.await.unwrap();
    eprintln!("slowest of {gets} cached GETs during a relist of {HUGE} objects: {slowest:?}");
    assert!(gets > 0);
    assert_eq!(
        hub.live().cache().read("big", |a| a.object_count()),
        Some(HUGE)
    );
    drop(big);
    hub.shutdown().await.unwrap();
}

/// A paged LIST answered from the cache gives exactly the objects of its first page's
/// resourceVersion, at their versions then, while the agent changes, adds and deletes
/// objects between the pages; several such lists at once do not expire each other; a new
/// list shows the new state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paged_lists_are_snapshots_of_their_resource_version() {
    const OBJECTS: usize = 1_200;
    let pki = Pki::new();
    let dir = data_dir("fleet-paged-snapshot");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    let names: Vec<String> = (0..OBJECTS).map(|i| format!("cm-{i:05}")).collect();
    let objects: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "5")).collect();
    synced(&mut a, "prod", &objects, "100").await;
    let token = token_for(&http, &admin, "prod").await;
    let list = "/clusters/prod/api/v1/namespaces/default/configmaps?limit=100";
    let expected: BTreeMap<String, String> =
        names.iter().map(|n| (n.clone(), "5".to_string())).collect();

    // Three lists started, then taken page by page in turns, with writes between.
    let mut lists: Vec<(BTreeMap<String, String>, Option<String>, String)> = Vec::new();
    for _ in 0..3 {
        let (status, page) = cached_get(&http, list, &token).await;
        assert_eq!(status, 200, "{page}");
        lists.push((items(&page), continue_of(&page), rv_of(&page)));
    }
    let mut rv = 100;
    let mut open = true;
    while open {
        open = false;
        // Changes of objects every list has still to show, new ones and deletions.
        for i in 0..5 {
            rv += 1;
            let name = &names[(rv * 37 + i) % OBJECTS];
            let t = if i % 2 == 0 {
                EventType::Applied
            } else {
                EventType::Deleted
            };
            a.send(cm_of("prod", t, name, &rv.to_string())).await;
            rv += 1;
            a.send(cm_of(
                "prod",
                EventType::Applied,
                &format!("new-{rv}"),
                &rv.to_string(),
            ))
            .await;
        }
        a.synced().await;
        for (seen, next, first_rv) in &mut lists {
            let Some(token_) = next.take() else { continue };
            open = true;
            let path = format!(
                "/clusters/prod/api/v1/namespaces/default/configmaps?limit=100&continue={token_}"
            );
            let (status, page) = cached_get(&http, &path, &token).await;
            assert_eq!(status, 200, "{page}");
            assert_eq!(
                &rv_of(&page),
                first_rv,
                "every page has the list's resourceVersion"
            );
            seen.extend(items(&page));
            *next = continue_of(&page);
        }
    }
    for (seen, _, first_rv) in &lists {
        assert_eq!(first_rv, "100");
        assert_eq!(
            seen, &expected,
            "a paged list showed another version of the objects"
        );
    }
    // A new list shows the writes.
    let mut seen = BTreeMap::new();
    let mut path = list.to_string();
    loop {
        let (status, page) = cached_get(&http, &path, &token).await;
        assert_eq!(status, 200);
        seen.extend(items(&page));
        match continue_of(&page) {
            Some(next) => path = format!("{list}&continue={next}"),
            None => break,
        }
    }
    assert_ne!(seen, expected);
    assert!(seen.keys().any(|n| n.starts_with("new-")));
    drop(a);
    hub.shutdown().await.unwrap();
}

fn items(page: &serde_json::Value) -> BTreeMap<String, String> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap().to_string(),
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect()
}

fn continue_of(page: &serde_json::Value) -> Option<String> {
    page["metadata"]["continue"]
        .as_str()
        .filter(|c| !c.is_empty())
        .map(str::to_string)
}

fn rv_of(page: &serde_json::Value) -> String {
    page["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A paged LIST's token expires (410 Expired, as the API server answers once etcd compacted
/// the list's revision) when the kind's events since its first page stop being one unbroken
/// sequence: here the agent relists the kind (its own watch got 410). Writes alone, however
/// many, never expire it (above); a list started after the relist pages to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relist_expires_the_tokens_of_lists_taken_before_it() {
    let pki = Pki::new();
    let dir = data_dir("fleet-relist-gap");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    let names: Vec<String> = (0..30).map(|i| format!("cm-{i:03}")).collect();
    let objects: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "5")).collect();
    synced(&mut a, "prod", &objects, "100").await;
    let token = token_for(&http, &admin, "prod").await;
    let list = "/clusters/prod/api/v1/namespaces/default/configmaps?limit=10";

    let (status, first) = cached_get(&http, list, &token).await;
    assert_eq!(status, 200, "{first}");
    let next = continue_of(&first).expect("a token for the second page");
    // Before the gap the token is good (and stays good: it is asked for again below).
    let page2 = format!("{list}&continue={next}");
    assert_eq!(cached_get(&http, &page2, &token).await.0, 200);

    // The agent relists the kind: a new snapshot, at a resourceVersion the cache cannot
    // reach from the list's by events.
    synced(&mut a, "prod", &objects[..20], "500").await;
    let reply = http.get(&page2, Some(&token)).await;
    assert_eq!(reply.status, 410, "{}", reply.text());
    let status = reply.json();
    assert_eq!(status["reason"], "Expired", "{status}");

    // A list taken after the relist pages to its end.
    let mut seen = BTreeMap::new();
    let mut path = list.to_string();
    loop {
        let (status, page) = cached_get(&http, &path, &token).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(rv_of(&page), "500");
        seen.extend(items(&page));
        match continue_of(&page) {
            Some(next) => path = format!("{list}&continue={next}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), 20);
    drop(a);
    hub.shutdown().await.unwrap();
}
