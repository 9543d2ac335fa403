//! The hub's view of the cluster (its REST API, over HTTPS), and a scripted change made
//! with the admin client, seen through it.

use std::{
    collections::BTreeMap,
    io::Write,
    time::{Duration, Instant},
};

use kube::Client;
use serde_json::{Value, json};

use super::{
    ACCOUNT, APPS_NAMESPACE, SCRIPTED_DEPLOYMENT,
    hub::Hub,
    support::{apply_object, create_namespace, line, text, wait_for},
};
use crate::error::Result;

/// How often the scripted change polls the hub.
const POLL: Duration = Duration::from_millis(100);
/// How long the hub's counts must stay the same to count as settled.
const SETTLED: Duration = Duration::from_millis(1500);
/// How long one change may take to reach the hub.
const CHANGE_WAIT: Duration = Duration::from_secs(20);

fn account_path() -> String {
    format!("/api/v1/accounts/{ACCOUNT}")
}

/// Waits until the account is connected with every kind watched, then shows the agents and
/// the account; returns the account's view.
pub(super) async fn show(hub: &Hub, out: &mut dyn Write) -> Result<Value> {
    let view = wait_for("the account in the hub with its kinds watched", || async {
        let view = hub.get_json(&account_path()).await?;
        Ok(view.filter(|v| {
            let kinds = v["kinds"].as_array().cloned().unwrap_or_default();
            v["state"] == "connected"
                && v["objects"].as_u64().unwrap_or(0) > 0
                && !kinds.is_empty()
                && kinds
                    .iter()
                    .all(|k| k["state"] == "WATCHING" || k["state"] == "FORBIDDEN")
        }))
    })
    .await?;
    line(
        out,
        format!(
            "==> The hub's view ({} and /api/v1/accounts)",
            hub.curl("/api/v1/agents")
        ),
    );
    if let Some(agents) = hub.get_json("/api/v1/agents").await? {
        for agent in agents.as_array().cloned().unwrap_or_default() {
            let accounts: Vec<String> = agent["accounts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|a| format!("{} {}", text(&a["name"]), text(&a["role"])))
                .collect();
            line(
                out,
                format!(
                    "    agent {} replica {}: {}",
                    text(&agent["identity"]),
                    text(&agent["replica"]),
                    accounts.join(", ")
                ),
            );
        }
    }
    print_account(out, &view);
    Ok(view)
}

/// Creates a namespace, a Deployment and three ConfigMaps with the admin client, one at a
/// time, and shows how the hub's counts follow each.
pub(super) async fn scripted_change(
    client: &Client,
    hub: &Hub,
    view: &Value,
    out: &mut dyn Write,
) -> Result<()> {
    line(
        out,
        format!(
            "==> A change in the cluster: namespace {APPS_NAMESPACE}, Deployment {SCRIPTED_DEPLOYMENT} (2 replicas) and 3 ConfigMaps; the hub is polled every 0.1 s"
        ),
    );
    create_namespace(client, APPS_NAMESPACE).await?;
    let mut counts = object_counts(view);
    for (what, object) in scripted_objects() {
        apply_object(client, &object).await?;
        line(out, format!("    created {what} in {APPS_NAMESPACE}"));
        counts = follow_counts(hub, counts, out).await?;
    }
    if let Some(view) = hub.get_json(&account_path()).await? {
        print_account(out, &view);
    }
    Ok(())
}

/// The scripted change's objects, in order, each with how the narration names it.
fn scripted_objects() -> Vec<(String, Value)> {
    std::iter::once((
        format!("deployment/{SCRIPTED_DEPLOYMENT}"),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": SCRIPTED_DEPLOYMENT, "namespace": APPS_NAMESPACE },
            "spec": {
                "replicas": 2,
                "selector": { "matchLabels": { "app": SCRIPTED_DEPLOYMENT } },
                "template": {
                    "metadata": { "labels": { "app": SCRIPTED_DEPLOYMENT } },
                    "spec": { "containers": [{ "name": "web", "image": "nginx:1.27" }] },
                },
            },
        }),
    ))
    .chain((1..=3).map(|i| {
        (
            format!("configmap/settings-{i}"),
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": format!("settings-{i}"), "namespace": APPS_NAMESPACE },
                "data": { "greeting": format!("hello {i}") },
            }),
        )
    }))
    .collect()
}

/// Polls the hub until its object counts change from `before` and then settle (a
/// Deployment brings a ReplicaSet and Pods after it), narrates the difference and returns
/// the new counts.
async fn follow_counts(
    hub: &Hub,
    before: BTreeMap<String, u64>,
    out: &mut dyn Write,
) -> Result<BTreeMap<String, u64>> {
    let changed_at = Instant::now();
    let mut latest = before.clone();
    let deadline = Instant::now() + CHANGE_WAIT;
    let mut first_change = None;
    let mut last_change = None;
    while Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
        let now = hub
            .get_json(&account_path())
            .await?
            .map(|v| object_counts(&v))
            .unwrap_or_default();
        if now != latest {
            latest = now;
            first_change.get_or_insert_with(|| changed_at.elapsed());
            last_change = Some(Instant::now());
        } else if last_change.is_some_and(|t| t.elapsed() > SETTLED) {
            break;
        }
    }
    let changes: Vec<String> = latest
        .iter()
        .filter(|(kind, n)| before.get(*kind) != Some(n))
        .map(|(kind, n)| format!("{kind} {} -> {n}", before.get(kind).copied().unwrap_or(0)))
        .collect();
    line(
        out,
        match first_change {
            Some(after) => format!(
                "    hub: {} (first change seen after {:.2} s)",
                changes.join(", "),
                after.as_secs_f64()
            ),
            None => format!("    hub: no change within {} s", CHANGE_WAIT.as_secs()),
        },
    );
    Ok(latest)
}

fn object_counts(view: &Value) -> BTreeMap<String, u64> {
    view["objectCounts"]
        .as_object()
        .map(|counts| {
            counts
                .iter()
                .map(|(kind, n)| (kind.clone(), n.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

fn print_account(out: &mut dyn Write, view: &Value) {
    line(
        out,
        format!(
            "    account {}: {}, streamed by {} ({}), {} objects; cluster {} {}",
            text(&view["name"]),
            text(&view["state"]),
            text(&view["streaming"]["replica"]),
            text(&view["streaming"]["identity"]),
            view["objects"].as_u64().unwrap_or(0),
            text(&view["cluster"]["apiServerHost"]),
            text(&view["cluster"]["kubernetesVersion"]),
        ),
    );
    for kind in view["kinds"].as_array().cloned().unwrap_or_default() {
        let group = text(&kind["group"]);
        let name = if group.is_empty() {
            text(&kind["kind"])
        } else {
            format!("{}/{}", group, text(&kind["kind"]))
        };
        line(
            out,
            format!(
                "      {name:<20} {:>5} objects  {}",
                kind["objects"].as_u64().unwrap_or(0),
                text(&kind["state"])
            ),
        );
    }
}
