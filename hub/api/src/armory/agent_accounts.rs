//! `GET /agents/kubernetes/accounts/{name}` and `.../namespaces`: an account's status as
//! Armory's Swagger models it (`KubesvcAccount`), and the namespaces its agent registered.
//!
//! The Swagger model and the "Manage" page's example differ; this follows the Swagger model.
//! Its fields the hub has no counterpart for are left out rather than filled with a constant:
//! `retryCount` (the agent retries a failing account, the hub does not count) and
//! `maxWatchAgeSeconds` (the agent's watches are re-opened, not aged out).

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use axum::{
    Json,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::{Map, Value, json};

use scale_agent_hub_model::time::rfc3339;
use scale_agent_hub_state::Live;

use super::shape;
use crate::http::{ApiState, error};

/// Every account this replica knows: registered by an agent, with a state, or dynamic;
/// sorted by name.
pub(crate) fn all_names(live: &Live) -> Vec<String> {
    let mut names: BTreeSet<String> = {
        let registry = live.registry_read();
        registry
            .accounts
            .keys()
            .chain(registry.states.keys())
            .cloned()
            .collect()
    };
    names.extend(live.dynamic_accounts().list().map(|r| r.spec.name.clone()));
    names.into_iter().collect()
}

/// The `KubesvcAccount` of `name`; `None` when the hub knows no such account.
pub(crate) fn kubesvc_account(live: &Live, name: &str) -> Option<Value> {
    let dynamic = live.dynamic_accounts().get(name).cloned();
    let dynamic_state = dynamic.as_ref().map(|r| shape::armory_state(live, r));
    let failures: Vec<String> = live
        .dynamic_accounts()
        .reports(name)
        .into_iter()
        .filter(|r| r.state == "FAILED" && !r.message.is_empty())
        .map(|r| format!("{}: {}", r.replica, r.message))
        .collect();
    let registry = live.registry_read();
    let account = registry.accounts.get(name).cloned();
    let state = registry.states.get(name).cloned();
    let account = account.as_ref();
    let state = state.as_ref();
    if dynamic.is_none() && account.is_none() && state.is_none() {
        return None;
    }
    let mut view = Map::new();
    view.insert("name".into(), json!(name));
    let status = dynamic_state
        .or_else(|| state.map(|s| s.state.as_str().to_string()))
        .unwrap_or_else(|| "ACTIVE".into());
    let zone = dynamic
        .as_ref()
        .map(|r| r.spec.agent.clone())
        .or_else(|| registry.bindings.get(name).map(|b| b.identity.clone()));
    if let Some(zone) = zone {
        view.insert("zoneId".into(), json!(zone));
    }
    let cluster = account
        .map(|a| a.record.cluster.clone())
        .or_else(|| state.and_then(|s| s.cluster.clone()));
    if let Some(cluster) = cluster {
        view.insert("kubeHost".into(), json!(cluster.api_server_host));
        view.insert("kubeVersion".into(), json!(cluster.kubernetes_version));
        view.insert("certFingerprint".into(), json!(cluster.ca_fingerprint));
    }
    let connections: Vec<Value> = account
        .map(|a| {
            let streaming = a.streaming.map(|id| (id, "STREAMING"));
            let standbys = a.standbys.iter().map(|id| (*id, "STANDBY"));
            streaming
                .into_iter()
                .chain(standbys)
                .filter_map(|(id, role)| {
                    registry.sessions.get(&id).map(
                        |s| json!({ "agentId": s.identity, "replica": s.replica, "role": role }),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    view.insert("connections".into(), json!(connections));
    let properties = account.map(|a| a.record.properties.clone());
    let definition = match &dynamic {
        Some(record) => {
            // definition_of reads the registry again: released first.
            drop(registry);
            shape::definition_of(live, record)
        }
        None => {
            drop(registry);
            properties.clone().unwrap_or(Value::Null)
        }
    };
    let permissions = definition
        .get("permissions")
        .or_else(|| properties.as_ref().and_then(|p| p.get("permissions")))
        .cloned()
        .unwrap_or_else(|| json!({}));
    view.insert("definitionAsString".into(), json!(definition.to_string()));
    view.insert("definition".into(), definition);
    if let Some(properties) = properties {
        view.insert("propertiesAsString".into(), json!(properties.to_string()));
        view.insert("properties".into(), properties);
    }
    view.insert("permissions".into(), permissions);
    view.insert("dynamic".into(), json!(dynamic.is_some()));
    let error_message = match state {
        Some(s) if status == "FAILED" && s.state.as_str() == "FAILED" => Some(s.reason.clone()),
        _ if status == "FAILED" => Some(failures.join("; ")),
        _ => None,
    };
    if let Some(message) = error_message.filter(|m| !m.is_empty()) {
        view.insert("errorMessage".into(), json!(message));
    }
    let updated = dynamic
        .as_ref()
        .and_then(|r| u64::try_from(r.updated).ok())
        .map(|secs| UNIX_EPOCH + Duration::from_secs(secs))
        .or_else(|| state.map(|s| s.since));
    if let Some(updated) = updated {
        view.insert("lastUpdated".into(), json!(rfc3339(updated)));
    }
    view.insert("status".into(), json!(status));
    Some(Value::Object(view))
}

/// `GET /agents/kubernetes/accounts/{name}`.
pub(crate) async fn status(State(api): State<Arc<ApiState>>, Path(name): Path<String>) -> Response {
    match kubesvc_account(&api.live, &name) {
        Some(view) => Json(view).into_response(),
        None => not_found(&name),
    }
}

fn not_found(name: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("no account {name:?} (GET /armory/accounts lists the accounts)"),
    )
}

/// `GET /agents/kubernetes/accounts/{name}/namespaces`: the namespaces the account's agent
/// registered; for a dynamic account no agent registered yet, the ones it is to watch.
pub(crate) async fn namespaces(
    State(api): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Response {
    let registered = api
        .live
        .registry_read()
        .accounts
        .get(&name)
        .map(|a| a.record.namespaces.clone());
    if let Some(namespaces) = registered {
        return Json(namespaces).into_response();
    }
    let configured = api
        .live
        .dynamic_accounts()
        .get(&name)
        .map(|r| r.spec.namespaces.clone());
    match configured {
        Some(namespaces) => Json(namespaces).into_response(),
        None => not_found(&name),
    }
}
