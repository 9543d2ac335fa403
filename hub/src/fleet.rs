//! `GET /api/v1/agents` and `GET /api/v1/accounts` of replicas sharing a store: answered
//! for every replica, whichever one is asked.
//!
//! Why ask the replicas rather than the store: an agent stream lives in the memory of the
//! replica it reached (nothing of it is stored), and so do an account's state, its standbys
//! and its kinds' states, kept by its owner. So the replica asked reads the replicas alive
//! (`hub_replicas`, where each says it is alive every `--replica-sync-period`) and asks each
//! other one for its own view over the internal channel (`/internal/api/v1/...`, with the
//! replicas' secret, [`crate::owners::forward`]), concurrently, within [`ASK_TIMEOUT`].
//! Accounts come from the store (every stored account, with its owner from
//! `account_owners`), each shown as its owner sees it. A replica that does not answer is
//! listed as unreachable, never left out.

use std::{collections::BTreeMap, time::Duration};

use serde_json::{Value, json};

use crate::{Hub, error::Result};

/// How long a replica may take to answer.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// What every other live replica answered for `path`: (replica, its JSON or why not).
async fn ask_others(hub: &Hub, path: &str) -> Result<Vec<(String, Result<Value, String>)>> {
    let (Some(store), Some(forwarder)) = (&hub.replicas.shared, &hub.replicas.forwarder) else {
        return Ok(Vec::new());
    };
    let replicas = store
        .replicas(crate::shared::alive_within(hub.config.replica_sync_period))
        .await?;
    let asks = replicas
        .into_iter()
        .filter(|r| r.replica != hub.replicas.id())
        .map(|r| async move {
            let answer = forwarder
                .get_json(&r.replica, &r.address, path, ASK_TIMEOUT)
                .await;
            (r.replica, answer)
        });
    Ok(futures::future::join_all(asks).await)
}

fn with_replica(mut value: Value, replica: &str) -> Value {
    if let Some(map) = value.as_object_mut() {
        map.insert("hubReplica".into(), Value::String(replica.to_string()));
    }
    value
}

/// Every replica's agent streams, each with `hubReplica` (the replica it is connected to);
/// a replica that cannot be asked is one entry `{"hubReplica", "unreachable"}`.
pub(crate) async fn agents(hub: &Hub) -> Vec<Value> {
    let mut list: Vec<Value> = crate::http::local_agents(hub)
        .into_iter()
        .filter_map(|a| serde_json::to_value(a).ok())
        .map(|a| with_replica(a, hub.replicas.id()))
        .collect();
    let others = match ask_others(hub, "/api/v1/agents").await {
        Ok(others) => others,
        Err(e) => {
            list.push(json!({
                "hubReplica": "*",
                "unreachable": format!(
                    "cannot read the replicas from the shared store: {}",
                    crate::error::Chain(&e)
                ),
            }));
            return list;
        }
    };
    for (replica, answer) in others {
        match answer {
            Ok(Value::Array(agents)) => {
                list.extend(agents.into_iter().map(|a| with_replica(a, &replica)))
            }
            Ok(_) => list.push(json!({
                "hubReplica": replica,
                "unreachable": "its answer is not a list of agents",
            })),
            Err(why) => list.push(json!({ "hubReplica": replica, "unreachable": why })),
        }
    }
    list
}

/// Every account of the shared store (and every one a replica has a state for), as its
/// owner sees it, with `owner` (`{"replica", "epoch", "since"}`, null when no replica owns
/// it) and, when its owner cannot be asked, `ownerUnreachable` (the view then is the
/// stored record's).
pub(crate) async fn accounts(hub: &Hub) -> Result<Vec<Value>> {
    let Some(store) = &hub.replicas.shared else {
        return Ok(Vec::new());
    };
    let stored = store.accounts().await?;
    let owners = store.owners().await?;
    // Each replica's view, by replica, then by account.
    let mut views: BTreeMap<String, Result<BTreeMap<String, Value>, String>> = BTreeMap::new();
    let by_name = |list: Vec<Value>| -> BTreeMap<String, Value> {
        list.into_iter()
            .filter_map(|v| Some((v.get("name")?.as_str()?.to_string(), v)))
            .collect()
    };
    let local: Vec<Value> = crate::http::local_accounts(hub)
        .into_iter()
        .filter_map(|a| serde_json::to_value(a).ok())
        .collect();
    views.insert(hub.replicas.id().to_string(), Ok(by_name(local)));
    for (replica, answer) in ask_others(hub, "/api/v1/accounts").await? {
        let view = match answer {
            Ok(Value::Array(list)) => Ok(by_name(list)),
            Ok(_) => Err("its answer is not a list of accounts".to_string()),
            Err(why) => Err(why),
        };
        views.insert(replica, view);
    }
    let mut names: Vec<String> = stored.iter().map(|(name, _)| name.clone()).collect();
    for view in views.values().flatten() {
        names.extend(view.keys().cloned());
    }
    names.sort();
    names.dedup();
    let stored: BTreeMap<String, crate::registry::AccountRecord> = stored.into_iter().collect();
    let local_view = |name: &str| -> Option<Value> {
        views
            .get(hub.replicas.id())
            .and_then(|v| v.as_ref().ok())
            .and_then(|v| v.get(name))
            .cloned()
    };
    let mut list = Vec::new();
    for name in names {
        let owner = owners.get(&name);
        let (view, unreachable) = match owner {
            Some(owner) => match views.get(&owner.replica) {
                Some(Ok(view)) => (view.get(&name).cloned(), None),
                Some(Err(why)) => (None, Some(why.clone())),
                None => (
                    None,
                    Some(format!(
                        "hub replica {} owns it but has not said it is alive within {:?}",
                        owner.replica,
                        crate::shared::alive_within(hub.config.replica_sync_period)
                    )),
                ),
            },
            None => (None, None),
        };
        // No owner's view: the one of a replica that serves it, or this replica's, or the
        // stored record.
        let view = view
            .or_else(|| {
                views.values().flatten().find_map(|v| {
                    v.get(&name)
                        .filter(|a| a.get("state").and_then(Value::as_str) == Some("connected"))
                        .cloned()
                })
            })
            .or_else(|| local_view(&name))
            .or_else(|| {
                stored
                    .get(&name)
                    .and_then(|r| serde_json::to_value(crate::http::stored_view(&name, r)).ok())
            })
            .or_else(|| views.values().flatten().find_map(|v| v.get(&name).cloned()));
        let Some(mut view) = view else {
            continue;
        };
        if let Some(map) = view.as_object_mut() {
            map.insert(
                "owner".into(),
                owner.map_or(Value::Null, |o| {
                    json!({
                        "replica": o.replica,
                        "epoch": o.epoch,
                        "since": crate::http::rfc3339(o.since),
                    })
                }),
            );
            if let Some(why) = unreachable {
                map.insert("ownerUnreachable".into(), Value::String(why));
            }
        }
        list.push(view);
    }
    Ok(list)
}
