//! `kubectl get -w` from the cache (issue 30): a watch asking for Tables
//! (`watch=true`, `Accept: ...;as=Table;...`) gets one event per object, each a one-row Table
//! of that object at its resourceVersion, the column definitions in the first event only
//! (`null` after, as the API server's watch encoder writes them), and a change streamed
//! while it watches arrives as a row too; a streaming list ends with its bookmark as a
//! Table. The hub serves HTTPS; the agent is a fake speaking
//! the real gRPC protocol over mutual TLS. (The e2e `proxy_tables` test compares kubectl's
//! output with the API server's.)

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use scale_agent_proto::v1::{
    self as pb, agent_message::Kind as Msg, kind_status::State as KindState, object_event::Type,
};
use serde_json::{Value, json};

fn applied(account: &str, name: &str, rv: u64, keys: usize) -> Msg {
    let data: serde_json::Map<String, Value> =
        (0..keys).map(|k| (format!("k{k}"), json!("v"))).collect();
    let object = json!({
        "apiVersion": "v1", "kind": "ConfigMap", "data": data,
        "metadata": {"name": name, "namespace": "web", "uid": format!("uid-{name}"),
                     "resourceVersion": rv.to_string(), "labels": {"app": "web"},
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
    });
    Msg::Object(pb::ObjectEvent {
        account: account.into(),
        kind: Some(configmaps()),
        r#type: Type::Applied as i32,
        namespace: "web".into(),
        name: name.to_string(),
        uid: format!("uid-{name}"),
        resource_version: rv.to_string(),
        object_json: serde_json::to_vec(&object).unwrap(),
        truncated: false,
        watch_namespace: String::new(),
    })
}

const KUBECTL_TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// The events of a watch that ends by its `timeoutSeconds`.
async fn watch_events(http: &Https, path: &str, token: &str) -> (Reply, Vec<Value>) {
    let response = http
        .send(
            http.request("GET", path)
                .header("authorization", format!("Bearer {token}"))
                .header("accept", KUBECTL_TABLE)
                .body(empty())
                .unwrap(),
        )
        .await;
    let reply = read_all(response).await;
    let events = reply
        .text()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    (reply, events)
}

#[tokio::test]
async fn kubectl_get_w_is_answered_with_tables_from_the_cache() {
    let pki = Pki::new();
    let dir = data_dir("proxy-table-watch");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut agent = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    agent
        .register_with("a", "https://10.0.0.1:6443", br#"{"kinds":["ConfigMap"]}"#)
        .await;
    agent
        .send(Msg::SnapshotBegin(pb::SnapshotBegin {
            account: "a".into(),
            kind: Some(configmaps()),
            watch_namespace: String::new(),
        }))
        .await;
    agent.send(applied("a", "one", 10, 1)).await;
    agent.send(applied("a", "two", 11, 2)).await;
    agent
        .send(Msg::SnapshotEnd(pb::SnapshotEnd {
            account: "a".into(),
            kind: Some(configmaps()),
            resource_version: "20".into(),
            object_count: 2,
            watch_namespace: String::new(),
        }))
        .await;
    agent
        .send(Msg::KindStatus(pb::KindStatus {
            account: "a".into(),
            kind: Some(configmaps()),
            state: KindState::Watching as i32,
            message: String::new(),
            namespaces: vec![],
        }))
        .await;
    agent.synced().await;
    let token = token_for(&http, &admin, "a").await;

    // From the start: ADDED for each object, each a Table of one row.
    let (reply, events) = watch_events(
        &http,
        "/clusters/a/api/v1/namespaces/web/configmaps?watch=true&timeoutSeconds=1&includeObject=None",
        &token,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("x-scale-agent-cache").as_deref(), Some("hit"));
    assert_eq!(events.len(), 2, "{events:?}");
    let (first, second) = (&events[0]["object"], &events[1]["object"]);
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(first["kind"], "Table");
    assert_eq!(first["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(first["metadata"], json!({"resourceVersion": "10"}));
    let columns: Vec<&str> = first["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Name", "Data", "Age"]);
    assert_eq!(
        (&first["rows"][0]["cells"][0], &first["rows"][0]["cells"][1]),
        (&json!("one"), &json!(1))
    );
    assert_eq!(
        first["rows"][0]["object"],
        Value::Null,
        "includeObject=None"
    );
    assert_eq!(second["columnDefinitions"], Value::Null);
    assert_eq!(second["metadata"]["resourceVersion"], "11");
    assert_eq!(
        (
            &second["rows"][0]["cells"][0],
            &second["rows"][0]["cells"][1]
        ),
        (&json!("two"), &json!(2))
    );

    // A streaming list in Table form (as the API server accepts it): the objects, then the
    // initial-events-end BOOKMARK at the resume point, a Table whose row is printed from
    // the empty object the API server's watch cache sends (no name, no data, no age).
    let (reply, events) = watch_events(
        &http,
        "/clusters/a/api/v1/namespaces/web/configmaps?watch=true&sendInitialEvents=true\
         &resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
        &token,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("x-scale-agent-cache").as_deref(), Some("hit"));
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["ADDED", "ADDED", "BOOKMARK"], "{events:?}");
    assert!(events[0]["object"]["columnDefinitions"].is_array());
    let bookmark = &events[2]["object"];
    assert_eq!(bookmark["kind"], "Table");
    assert_eq!(bookmark["metadata"], json!({"resourceVersion": "20"}));
    assert_eq!(bookmark["columnDefinitions"], Value::Null);
    assert_eq!(
        bookmark["rows"],
        json!([{
            "cells": ["", 0, "<unknown>"],
            "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": {"resourceVersion": "20",
                                    "annotations": {"k8s.io/initial-events-end": "true"}}},
        }])
    );

    // From the list's resourceVersion (kubectl's watch after its list): a change streamed
    // meanwhile, as the first (so column-carrying) event.
    let watcher = {
        let http = http.clone();
        let token = token.clone();
        tokio::spawn(async move {
            watch_events(
                &http,
                "/clusters/a/api/v1/namespaces/web/configmaps?watch=true&resourceVersion=20&timeoutSeconds=2",
                &token,
            )
            .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    agent.send(applied("a", "two", 21, 3)).await;
    let (reply, events) = watcher.await.unwrap();
    assert_eq!(reply.header("x-scale-agent-cache").as_deref(), Some("hit"));
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "MODIFIED");
    let table = &events[0]["object"];
    assert_eq!(table["metadata"]["resourceVersion"], "21");
    assert!(table["columnDefinitions"].is_array(), "{table}");
    assert_eq!(
        (&table["rows"][0]["cells"][0], &table["rows"][0]["cells"][1]),
        (&json!("two"), &json!(3))
    );
    assert_eq!(
        table["rows"][0]["object"]["kind"], "PartialObjectMetadata",
        "includeObject's default"
    );
}
