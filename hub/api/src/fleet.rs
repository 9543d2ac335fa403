//! `GET /api/v1/agents` and `GET /api/v1/accounts` of replicas sharing a store: answered
//! for every replica, whichever one is asked.
//!
//! Why ask the replicas rather than the store: an agent stream lives in the memory of the
//! replica it reached (nothing of it is stored), and so do an account's state, its standbys
//! and its kinds' states, kept by its owner. So the replica asked reads the replicas alive
//! (`hub_replicas`, where each says it is alive every `--replica-sync-period`) and asks each
//! other one for its own view over the internal channel (`/internal/api/v1/...`, with the
//! replicas' secret, [`scale_agent_hub_replicas::owners::forward`]), concurrently, within [`ASK_TIMEOUT`].
//! Accounts come from the store (every stored account, with its owner from
//! `account_owners`), each shown as its owner sees it. A replica that does not answer is
//! listed as unreachable, never left out.

use std::{collections::BTreeMap, time::Duration};

use scale_agent_hub_model::time::rfc3339;
use serde_json::{Value, json};

use scale_agent_hub_model::{Result, error::Chain, records::AccountRecord};
use scale_agent_hub_replicas::{Replicas, sync::alive_within};
use scale_agent_hub_state::Live;
use scale_agent_hub_store::OwnerRow;

use crate::http::views::{local_accounts, local_agents, stored_view};

/// How long a replica may take to answer.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// What every other live replica answered for `path`: (replica, its JSON or why not).
async fn ask_others(
    replicas: &Replicas,
    path: &str,
) -> Result<Vec<(String, Result<Value, String>)>> {
    let (Some(store), Some(forwarder)) = (&replicas.shared, &replicas.forwarder) else {
        return Ok(Vec::new());
    };
    let alive = store
        .replicas(alive_within(replicas.settings.sync_period))
        .await?;
    let asks = alive
        .into_iter()
        .filter(|r| r.replica != replicas.id())
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
pub(crate) async fn agents(replicas: &Replicas, live: &Live) -> Vec<Value> {
    let mut list: Vec<Value> = local_agents(live)
        .into_iter()
        .filter_map(|a| serde_json::to_value(a).ok())
        .map(|a| with_replica(a, replicas.id()))
        .collect();
    let others = match ask_others(replicas, "/api/v1/agents").await {
        Ok(others) => others,
        Err(e) => {
            list.push(json!({
                "hubReplica": "*",
                "unreachable": format!(
                    "cannot read the replicas from the shared store: {}",
                    Chain(&e)
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
pub(crate) async fn accounts(replicas: &Replicas, live: &Live) -> Result<Vec<Value>> {
    let Some(store) = &replicas.shared else {
        return Ok(Vec::new());
    };
    let stored = store.accounts().await?;
    let owners = store.owners().await?;
    let mut views = Views::new();
    let local: Vec<Value> = local_accounts(live)
        .into_iter()
        .filter_map(|a| serde_json::to_value(a).ok())
        .collect();
    views.insert(replicas.id().to_string(), Ok(by_name(local)));
    for (replica, answer) in ask_others(replicas, "/api/v1/accounts").await? {
        let view = match answer {
            Ok(Value::Array(list)) => Ok(by_name(list)),
            Ok(_) => Err("its answer is not a list of accounts".to_string()),
            Err(why) => Err(why),
        };
        views.insert(replica, view);
    }
    let alive_within = alive_within(replicas.settings.sync_period);
    Ok(merge_accounts(
        replicas.id(),
        stored,
        &owners,
        &views,
        alive_within,
    ))
}

/// Each replica's view of the accounts, by replica, then by account name; `Err` says why a
/// replica's view could not be had.
type Views = BTreeMap<String, std::result::Result<BTreeMap<String, Value>, String>>;

/// A list of account views by their `name`.
fn by_name(list: Vec<Value>) -> BTreeMap<String, Value> {
    list.into_iter()
        .filter_map(|v| Some((v.get("name")?.as_str()?.to_string(), v)))
        .collect()
}

/// The listing of [`accounts`] from what was read: the stored accounts, their owners, each
/// replica's view (`this_replica`'s among them) and how recently an owner must have said it
/// is alive. Every account stored or seen by a replica, by name, each as its owner sees it.
fn merge_accounts(
    this_replica: &str,
    stored: Vec<(String, AccountRecord)>,
    owners: &BTreeMap<String, OwnerRow>,
    views: &Views,
    alive_within: Duration,
) -> Vec<Value> {
    let mut names: Vec<String> = stored.iter().map(|(name, _)| name.clone()).collect();
    for view in views.values().flatten() {
        names.extend(view.keys().cloned());
    }
    names.sort();
    names.dedup();
    let stored: BTreeMap<String, AccountRecord> = stored.into_iter().collect();
    let local_view = |name: &str| -> Option<Value> {
        views
            .get(this_replica)
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
                        owner.replica, alive_within
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
                    .and_then(|r| serde_json::to_value(stored_view(&name, r)).ok())
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
                        "since": rfc3339(o.since),
                    })
                }),
            );
            if let Some(why) = unreachable {
                map.insert("ownerUnreachable".into(), Value::String(why));
            }
        }
        list.push(view);
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use scale_agent_hub_model::records::ClusterRecord;

    fn owner(replica: &str) -> OwnerRow {
        OwnerRow {
            replica: replica.into(),
            address: format!("https://{replica}:8443"),
            epoch: 3,
            since: std::time::UNIX_EPOCH,
        }
    }

    #[test]
    fn each_account_is_listed_as_its_owner_sees_it() {
        let record = AccountRecord {
            cluster: ClusterRecord {
                api_server_host: "https://dev:6443".into(),
                ca_fingerprint: "ab".into(),
                kubernetes_version: "v1.31.0".into(),
            },
            namespaces: vec!["apps".into()],
            properties: json!({"team": "web"}),
        };
        let stored = vec![("dev".to_string(), record)];
        let owners: BTreeMap<String, OwnerRow> = [
            ("dev".to_string(), owner("c")),
            ("prod".to_string(), owner("b")),
            ("stage".to_string(), owner("a")),
        ]
        .into_iter()
        .collect();
        let mut views = Views::new();
        views.insert(
            "a".into(),
            Ok(by_name(vec![
                json!({"name": "orphan", "state": "disconnected"}),
                json!({"name": "prod", "state": "disconnected", "seenBy": "a"}),
                json!({"name": "stage", "state": "connected", "seenBy": "a"}),
            ])),
        );
        views.insert("b".into(), Err("it did not answer within 5s".into()));
        let list = merge_accounts("a", stored, &owners, &views, Duration::from_secs(10));
        let names: Vec<&str> = list.iter().filter_map(|v| v["name"].as_str()).collect();
        assert_eq!(names, ["dev", "orphan", "prod", "stage"]);

        // Its owner is not alive: the stored record, and why the owner was not asked.
        assert_eq!(list[0]["accountState"], "INACTIVE");
        assert_eq!(list[0]["namespaces"], json!(["apps"]));
        assert_eq!(
            list[0]["owner"],
            json!({"replica": "c", "epoch": 3, "since": "1970-01-01T00:00:00Z"})
        );
        assert_eq!(
            list[0]["ownerUnreachable"],
            "hub replica c owns it but has not said it is alive within 10s"
        );
        // Nobody owns it: a replica's view, no owner.
        assert_eq!(list[1]["owner"], Value::Null);
        assert!(list[1].get("ownerUnreachable").is_none());
        // Its owner cannot be asked: this replica's view, and why.
        assert_eq!(list[2]["seenBy"], "a");
        assert_eq!(list[2]["owner"]["replica"], "b");
        assert_eq!(list[2]["ownerUnreachable"], "it did not answer within 5s");
        // Its owner answered: its view.
        assert_eq!(list[3]["state"], "connected");
        assert_eq!(list[3]["owner"]["replica"], "a");
        assert!(list[3].get("ownerUnreachable").is_none());
    }
}
