//! The hub-wide budget of cached object bytes (`--max-cached-mib`, issue 28, review F14):
//! two agent identities, each with an account, together past a small budget. The snapshot
//! that would take the cache past it is refused the way the per-account object quota
//! refuses (the kind OVER_QUOTA for that account, the agent told with a message naming the
//! flag, a metric), while the first account's cached reads are still served through the
//! proxy; once the first account's objects are deleted the second one's relist fits. Real
//! TLS on both listeners, the protocol-level fake agent, real proxy tokens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use scale_agent_proto::v1::{self as pb, agent_message::Kind as Msg, kind_status::State};
use serde_json::Value;

/// The budget: one account's snapshot fits, two do not.
const BUDGET: u64 = 160 * 1024;
/// Objects per snapshot, and the bytes of incompressible data in each.
const OBJECTS: usize = 60;
const DATA_BYTES: usize = 2048;

/// A ConfigMap whose data does not compress (so its packed JSON is about its size).
fn big_configmap(account: &str, n: usize, rv: &str) -> Msg {
    let mut state = (n as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ account.len() as u64;
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let data: String = (0..DATA_BYTES)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            alphabet[(state >> 58) as usize] as char
        })
        .collect();
    let name = format!("cm-{n}");
    Msg::Object(pb::ObjectEvent {
        account: account.into(),
        kind: Some(configmaps()),
        r#type: pb::object_event::Type::Applied as i32,
        namespace: "default".into(),
        name: name.clone(),
        uid: format!("{account}-uid-{n}"),
        resource_version: rv.into(),
        object_json: serde_json::to_vec(&serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "uid": format!("{account}-uid-{n}"), "resourceVersion": rv},
            "data": {"blob": data},
        }))
        .unwrap(),
        truncated: false,
        watch_namespace: String::new(),
    })
}

/// A relist of `objects` large ConfigMaps of `account`.
async fn relist(a: &mut FakeAgent, account: &str, objects: usize, rv: &str) {
    a.send(Msg::SnapshotBegin(pb::SnapshotBegin {
        account: account.into(),
        kind: Some(configmaps()),
        watch_namespace: String::new(),
    }))
    .await;
    for n in 0..objects {
        a.send(big_configmap(account, n, rv)).await;
    }
    a.send(Msg::SnapshotEnd(pb::SnapshotEnd {
        account: account.into(),
        kind: Some(configmaps()),
        resource_version: rv.into(),
        object_count: objects as u64,
        watch_namespace: String::new(),
    }))
    .await;
    a.synced().await;
}

/// The agent reports the kind WATCHING: the proxy answers its reads from the cache.
async fn watching(a: &mut FakeAgent, account: &str) {
    a.send(Msg::KindStatus(pb::KindStatus {
        account: account.into(),
        kind: Some(configmaps()),
        state: State::Watching as i32,
        message: String::new(),
        namespaces: Vec::new(),
    }))
    .await;
    a.synced().await;
}

async fn account_json(http: &Https, admin: &str, name: &str) -> Value {
    let reply = http.get("/api/v1/accounts", Some(admin)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == name)
        .cloned()
        .unwrap()
}

fn configmap_state(account: &Value) -> Value {
    account["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == "ConfigMap")
        .cloned()
        .unwrap_or(Value::Null)
}

/// A metric's value on `/metrics`.
async fn metric(http: &Https, admin: &str, name: &str) -> u64 {
    let reply = http.get("/metrics", Some(admin)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let text = reply.text();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} not on /metrics"))
        .trim()
        .parse()
        .unwrap()
}

/// The ConfigMaps `token` lists through the proxy, and who answered.
async fn proxy_list(http: &Https, account: &str, token: &str) -> (usize, String) {
    let reply = http
        .get(
            &format!("/clusters/{account}/api/v1/configmaps"),
            Some(token),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let served = reply.header("x-scale-agent-cache").unwrap_or_default();
    (reply.json()["items"].as_array().unwrap().len(), served)
}

#[tokio::test]
async fn a_snapshot_past_the_hub_wide_cached_bytes_is_refused_and_fits_once_room_is_made() {
    let pki = Pki::new();
    let dir = data_dir("cached-bytes-budget");
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.streams.max_cached_bytes = BUDGET;
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H1);
    let admin = admin_token(&dir);

    // Identity A's account fits.
    let mut a = agent(&hub, &pki, "team-a.test", "pod-1").await;
    a.register("team-a", "https://10.0.0.1:6443").await;
    relist(&mut a, "team-a", OBJECTS, "100").await;
    watching(&mut a, "team-a").await;
    assert!(a.kind_statuses.is_empty(), "{:?}", a.kind_statuses);
    let held = metric(&http, &admin, "scale_agent_hub_cached_object_bytes").await;
    assert!(
        held > (OBJECTS * DATA_BYTES / 2) as u64 && held <= BUDGET,
        "{held} bytes held"
    );
    let token_a = token_for(&http, &admin, "team-a").await;
    assert_eq!(
        proxy_list(&http, "team-a", &token_a).await,
        (OBJECTS, "hit".into())
    );

    // Identity B's snapshot would take the hub past the budget: refused, B told why.
    let mut b = agent(&hub, &pki, "team-b.test", "pod-1").await;
    b.register("team-b", "https://10.0.0.2:6443").await;
    relist(&mut b, "team-b", OBJECTS, "200").await;
    let status = b.kind_statuses.pop_front().expect("the agent is told");
    assert_eq!(status.state, State::OverQuota as i32, "{status:?}");
    for needle in ["--max-cached-mib", "account \"team-b\"", "ConfigMap"] {
        assert!(status.message.contains(needle), "{}", status.message);
    }
    let account = account_json(&http, &admin, "team-b").await;
    assert_eq!(
        configmap_state(&account)["state"],
        "OVER_QUOTA",
        "{account}"
    );
    assert_eq!(account["objects"], 0, "{account}");
    assert!(metric(&http, &admin, "scale_agent_hub_cached_bytes_refusals_total").await >= 1);
    assert_eq!(
        metric(&http, &admin, "scale_agent_hub_cached_object_bytes").await,
        held,
        "nothing of B entered the cache, nothing of A left it"
    );
    // A is still served from the cache, whole.
    assert_eq!(
        proxy_list(&http, "team-a", &token_a).await,
        (OBJECTS, "hit".into())
    );
    assert!(a.kind_statuses.is_empty(), "{:?}", a.kind_statuses);

    // A's objects are deleted (its relist is empty): B's next relist fits and is cached.
    relist(&mut a, "team-a", 0, "101").await;
    assert_eq!(
        proxy_list(&http, "team-a", &token_a).await,
        (0, "hit".into())
    );
    relist(&mut b, "team-b", OBJECTS, "201").await;
    let status = b
        .kind_statuses
        .pop_front()
        .expect("told it is cached again");
    assert_eq!(status.state, State::Watching as i32, "{status:?}");
    watching(&mut b, "team-b").await;
    let account = account_json(&http, &admin, "team-b").await;
    assert_eq!(account["objects"], OBJECTS, "{account}");
    let token_b = token_for(&http, &admin, "team-b").await;
    assert_eq!(
        proxy_list(&http, "team-b", &token_b).await,
        (OBJECTS, "hit".into())
    );
    drop((a, b));
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
