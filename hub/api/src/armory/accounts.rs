//! `/armory/accounts`: list every account (paged), migrate Clouddriver accounts, activate and
//! deactivate, delete, and show one dynamic account.

use std::{collections::HashMap, sync::Arc, time::Instant};

use axum::{
    Extension, Json,
    body::Bytes,
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use scale_agent_hub_auth::api_auth::Caller;
use scale_agent_hub_clouddriver::definitions::DefinitionError;
use scale_agent_hub_model::dynamic_accounts::SOURCE_CLOUDDRIVER;

use super::{
    Put, Refusal, agent_accounts, bad_body, commit, json_body, out_of_scope,
    shape::{self, Overrides},
};
use crate::http::{ApiState, error};

/// `page` when the query has none (Armory's default).
const DEFAULT_PAGE: usize = 1;
/// `limit` when the query has none (Armory's default).
const DEFAULT_LIMIT: usize = 100;
/// The largest `limit` taken.
const MAX_LIMIT: usize = 1000;

const MIGRATE_SHAPE: &str = "a non-empty JSON list of accounts to migrate, [{\"name\": \"<account>\", \"zoneId\": \
     \"<agent identity>\", \"kubeconfigFile\": \"encryptedFile:k8s!n:<secret>!k:<key>\"}] \
     (zoneId and kubeconfigFile optional)";
const STATE_SHAPE: &str = "a non-empty JSON list, [{\"name\": \"<account>\", \"state\": \
     \"ACTIVE|INACTIVE\"}] (zoneId and kubeconfigFile optional)";
const NAMES_SHAPE: &str = "a non-empty JSON list of account names, [\"<account>\", ...]";

/// Audits a refused change of each of `names` (one line with account `-` when the body
/// named none) and returns the refusal.
pub(crate) fn refused(
    caller: &Caller,
    route: &str,
    verb: &str,
    names: &[String],
    started: Instant,
    response: Response,
) -> Response {
    let unnamed = ["-".to_string()];
    let names = if names.is_empty() {
        &unnamed[..]
    } else {
        names
    };
    for name in names {
        crate::audit::account_change(
            caller,
            name,
            verb,
            route,
            response.status().as_u16(),
            started.elapsed(),
        );
    }
    response
}

/// A query number: absent is `default`; anything but a whole number from 1 is refused.
fn query_number(
    query: &HashMap<String, String>,
    key: &str,
    default: usize,
) -> Result<usize, Refusal> {
    match query.get(key) {
        None => Ok(default),
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| {
                Box::new(error(
                    StatusCode::BAD_REQUEST,
                    format!("`{key}` {text:?} must be a whole number from 1"),
                ))
            }),
    }
}

/// `GET /armory/accounts?page=&limit=`: every account this replica knows (those agents
/// registered from their configs, those the hub holds a state for, and the dynamic ones),
/// sorted by name, as `{items, page, limit, total}`; each item is the account's
/// `KubesvcAccount` ([`agent_accounts::kubesvc_account`]).
pub(crate) async fn list(
    State(api): State<Arc<ApiState>>,
    Query(query): Query<HashMap<String, String>>,
    axum::Extension(caller): axum::Extension<scale_agent_hub_model::auth::Caller>,
) -> Response {
    let page = match query_number(&query, "page", DEFAULT_PAGE) {
        Ok(page) => page,
        Err(response) => return *response,
    };
    let limit = match query_number(&query, "limit", DEFAULT_LIMIT) {
        Ok(limit) if limit > MAX_LIMIT => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("`limit` {limit} is more than {MAX_LIMIT}: page through the accounts"),
            );
        }
        Ok(limit) => limit,
        Err(response) => return *response,
    };
    let mut names = agent_accounts::all_names(&api.live);
    // A caller limited to account globs lists only those (the pages and `total` too).
    names.retain(|name| !caller.refuses_account(name));
    let total = names.len();
    let items: Vec<Value> = names
        .iter()
        .skip((page - 1).saturating_mul(limit))
        .take(limit)
        .filter_map(|name| agent_accounts::kubesvc_account(&api.live, name))
        .collect();
    Json(json!({ "items": items, "page": page, "limit": limit, "total": total })).into_response()
}

/// `GET /armory/accounts/{name}`: a dynamic account as Armory's bodies show it.
pub(crate) async fn get_one(
    State(api): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Response {
    let record = api.live.dynamic_accounts().get(&name).cloned();
    match record {
        Some(record) => Json(shape::definition_of(&api.live, &record)).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            format!(
                "no dynamic account {name:?} (GET /agents/kubernetes/accounts/{name} shows an \
                 account an agent declares in its config)"
            ),
        ),
    }
}

/// Whether an agent serves `name` now without it being a dynamic account (callers look
/// for a dynamic account first): declared in the agent's config, which the Armory routes
/// cannot change. An account only remembered (a state, a binding: its agent away, or a
/// dynamic account removed) is not: it may be migrated or added again.
pub(crate) fn declared_by_agent(api: &ApiState, name: &str) -> bool {
    api.live.registry_read().accounts.contains_key(name)
}

/// Each element of a JSON list of objects, with its `name`; 400 naming `shape` otherwise.
fn named_objects(body: &[u8], shape: &str) -> Result<Vec<(String, Value)>, Refusal> {
    let bad = |why: String| bad_body(shape, &why);
    let value = json_body(body, shape)?;
    let list = value
        .as_array()
        .ok_or_else(|| bad("it is not a list".into()))?;
    if list.is_empty() {
        return Err(bad("the list is empty".into()));
    }
    list.iter()
        .map(|item| {
            let name = item
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| bad(format!("{item} has no `name`")))?;
            Ok((name.to_string(), item.clone()))
        })
        .collect()
}

/// `POST /armory/accounts`: migrates Clouddriver accounts. Each definition is read from
/// Clouddriver's Account Management API and added INACTIVE (Clouddriver's copy is left as it
/// is). 202 `[]`; 409 with the already-migrated (or agent-declared) entries, the others
/// still migrated; 400, nothing migrated, when an entry is not in Clouddriver or does not
/// map onto a dynamic account; 501 when the hub has no Account Management API to read; 502
/// when Clouddriver does not answer.
pub(crate) async fn migrate(
    State(api): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Response {
    const ROUTE: &str = "POST /armory/accounts";
    let started = Instant::now();
    let items = match named_objects(&body, MIGRATE_SHAPE) {
        Ok(items) => items,
        Err(response) => return refused(&caller, ROUTE, "migrate", &[], started, *response),
    };
    let names: Vec<String> = items.iter().map(|(n, _)| n.clone()).collect();
    if let Some(response) = out_of_scope(&caller, ROUTE, &names) {
        return refused(&caller, ROUTE, "migrate", &names, started, response);
    }
    let Some(registrar) = api.registrar.clone() else {
        let response = error(
            StatusCode::NOT_IMPLEMENTED,
            DefinitionError::NotConfigured.to_string(),
        );
        return refused(&caller, ROUTE, "migrate", &names, started, response);
    };
    let mut conflicts = Vec::new();
    let mut problems = Vec::new();
    let mut puts = Vec::new();
    for (name, item) in items {
        let dynamic = api.live.dynamic_accounts().get(&name).is_some();
        if dynamic || declared_by_agent(&api, &name) {
            conflicts.push(item);
            continue;
        }
        let definition = match registrar.kubernetes_definition(&name).await {
            Ok(Some(definition)) => definition,
            Ok(None) => {
                problems.push(format!(
                    "account {name:?} is not defined in Clouddriver (its Account Management API \
                     has no Kubernetes account by that name that the hub's user may write)"
                ));
                continue;
            }
            Err(e @ DefinitionError::NotConfigured) => {
                let response = error(StatusCode::NOT_IMPLEMENTED, e.to_string());
                return refused(&caller, ROUTE, "migrate", &names, started, response);
            }
            Err(e) => {
                let response = error(StatusCode::BAD_GATEWAY, e.to_string());
                return refused(&caller, ROUTE, "migrate", &names, started, response);
            }
        };
        let Some(definition) = definition.as_object() else {
            problems.push(format!(
                "Clouddriver's definition of {name:?} is not an object"
            ));
            continue;
        };
        let overrides = Overrides {
            zone_id: item.get("zoneId").and_then(Value::as_str),
            kubeconfig_file: item.get("kubeconfigFile").and_then(Value::as_str),
        };
        match shape::spec_of(&api.live, definition, &overrides, false) {
            Ok((spec, ignored)) => {
                if !ignored.is_empty() {
                    tracing::info!(account = %name, ignored = %ignored.join(","), "migrated account: Clouddriver-only fields stay in Clouddriver's definition");
                }
                puts.push(Put {
                    spec,
                    inactive: true,
                    source: SOURCE_CLOUDDRIVER.into(),
                    verb: "migrate",
                });
            }
            Err(problem) => problems.push(problem),
        }
    }
    if !problems.is_empty() {
        let response = error(StatusCode::BAD_REQUEST, problems.join("; "));
        return refused(&caller, ROUTE, "migrate", &names, started, response);
    }
    if !puts.is_empty() {
        let response = commit(&api, &caller, ROUTE, puts, Vec::new()).await;
        if response.status() != StatusCode::ACCEPTED {
            return response;
        }
    }
    if conflicts.is_empty() {
        super::accepted()
    } else {
        let conflicted: Vec<String> = conflicts
            .iter()
            .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
            .collect();
        let response = (StatusCode::CONFLICT, Json(conflicts)).into_response();
        refused(&caller, ROUTE, "migrate", &conflicted, started, response)
    }
}

/// `PATCH /armory/accounts`: sets each dynamic account ACTIVE (sent to its agent) or
/// INACTIVE (withdrawn from it); `zoneId` and `kubeconfigFile`, when given, change the
/// agent and the Secret. 202 `[]`; 400 for a state other than ACTIVE or INACTIVE; 404, nothing
/// changed, for names that are not dynamic accounts; 409 for accounts an agent declares in
/// its config (always active while that agent runs).
pub(crate) async fn set_state(
    State(api): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Response {
    const ROUTE: &str = "PATCH /armory/accounts";
    let started = Instant::now();
    let items = match named_objects(&body, STATE_SHAPE) {
        Ok(items) => items,
        Err(response) => return refused(&caller, ROUTE, "activate", &[], started, *response),
    };
    let names: Vec<String> = items.iter().map(|(n, _)| n.clone()).collect();
    let refuse = |status: StatusCode, message: String| {
        refused(
            &caller,
            ROUTE,
            "activate",
            &names,
            started,
            error(status, message),
        )
    };
    if let Some(response) = out_of_scope(&caller, ROUTE, &names) {
        return refused(&caller, ROUTE, "activate", &names, started, response);
    }
    let mut puts = Vec::new();
    let (mut missing, mut declared) = (Vec::new(), Vec::new());
    for (name, item) in &items {
        let inactive = match item.get("state").and_then(Value::as_str) {
            Some("ACTIVE") => false,
            Some("INACTIVE") => true,
            other => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "account {name:?}: `state` {other:?} is not accepted: send \"ACTIVE\" to \
                         activate the account or \"INACTIVE\" to deactivate it"
                    ),
                );
            }
        };
        let record = api.live.dynamic_accounts().get(name).cloned();
        let Some(record) = record else {
            if declared_by_agent(&api, name) {
                declared.push(name.clone());
            } else {
                missing.push(name.clone());
            }
            continue;
        };
        let mut spec = record.spec;
        if let Some(zone) = item.get("zoneId").and_then(Value::as_str) {
            spec.agent = zone.to_string();
        }
        if let Some(file) = item.get("kubeconfigFile").and_then(Value::as_str) {
            match shape::secret_reference("kubeconfigFile", file) {
                Ok(secret) => spec.kubeconfig_secret = secret,
                Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("account {name:?}: {e}")),
            }
        }
        puts.push(Put {
            spec,
            inactive,
            source: record.source,
            verb: if inactive { "deactivate" } else { "activate" },
        });
    }
    if !missing.is_empty() {
        return refuse(
            StatusCode::NOT_FOUND,
            format!(
                "no dynamic account {missing:?}: migrate it with POST /armory/accounts or add it \
                 with POST /armory/accounts/dynamic"
            ),
        );
    }
    if !declared.is_empty() {
        return refuse(
            StatusCode::CONFLICT,
            format!(
                "{declared:?} are declared in their agents' configs: they are active while the \
                 agent serves them; change them there"
            ),
        );
    }
    commit(&api, &caller, ROUTE, puts, Vec::new()).await
}

/// Removes dynamic accounts: their agents stop watching them. 404, nothing removed, for
/// names that are not dynamic accounts; 409 for accounts an agent declares in its config.
async fn delete(api: &ApiState, caller: &Caller, route: &str, names: Vec<String>) -> Response {
    let started = Instant::now();
    if let Some(response) = out_of_scope(caller, route, &names) {
        return refused(caller, route, "delete", &names, started, response);
    }
    let (mut missing, mut declared) = (Vec::new(), Vec::new());
    for name in &names {
        if api.live.dynamic_accounts().get(name).is_some() {
            continue;
        }
        if declared_by_agent(api, name) {
            declared.push(name.clone());
        } else {
            missing.push(name.clone());
        }
    }
    if !missing.is_empty() {
        let response = error(
            StatusCode::NOT_FOUND,
            format!("no dynamic account {missing:?} (GET /armory/accounts lists the accounts)"),
        );
        return refused(caller, route, "delete", &names, started, response);
    }
    if !declared.is_empty() {
        let response = error(
            StatusCode::CONFLICT,
            format!(
                "{declared:?} are declared in their agents' configs, not dynamic: remove them \
                 there"
            ),
        );
        return refused(caller, route, "delete", &names, started, response);
    }
    commit(api, caller, route, Vec::new(), names).await
}

/// `DELETE /armory/accounts` with a list of names.
pub(crate) async fn delete_many(
    State(api): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Response {
    const ROUTE: &str = "DELETE /armory/accounts";
    let names = json_body(&body, NAMES_SHAPE).and_then(|value| {
        let names: Option<Vec<String>> = value.as_array().and_then(|list| {
            list.iter()
                .map(|n| n.as_str().filter(|n| !n.is_empty()).map(str::to_string))
                .collect()
        });
        names
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad_body(NAMES_SHAPE, "it is not a non-empty list of names"))
    });
    match names {
        Ok(names) => delete(&api, &caller, ROUTE, names).await,
        Err(response) => refused(&caller, ROUTE, "delete", &[], Instant::now(), *response),
    }
}

/// `DELETE /armory/accounts/{name}`.
pub(crate) async fn delete_one(
    State(api): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Response {
    delete(&api, &caller, "DELETE /armory/accounts/{name}", vec![name]).await
}
