//! `POST` and `PUT /armory/accounts/dynamic`: accounts that were never in Clouddriver, added
//! INACTIVE (activated with `PATCH /armory/accounts`) and updated (sent to the agent at once
//! when active). A body is one account object, or a list of them (Armory's Swagger takes a
//! JsonNode; its "Manage" page sends one object).

use std::{sync::Arc, time::Instant};

use axum::{
    Extension, Json,
    body::Bytes,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::{Map, Value};

use scale_agent_hub_auth::api_auth::Caller;
use scale_agent_hub_model::dynamic_accounts::SOURCE_DYNAMIC;

use super::{
    Put, Refusal,
    accounts::{declared_by_agent, refused},
    bad_body, commit, json_body, out_of_scope,
    shape::{self, Overrides},
};
use crate::http::{ApiState, error};

const SHAPE: &str = "an account object, or a non-empty list of them: {\"name\": \"<account>\", \
     \"zoneId\": \"<agent identity>\", \"kubeconfigFile\": \
     \"encryptedFile:k8s!n:<secret>!k:<key>\"} and optionally context, namespaces, \
     omitNamespaces, kinds, omitKinds, onlyNamespacedResources, permissions";

/// The account objects of a body; 400 when it is neither an object nor a non-empty list of
/// objects with names.
fn accounts_of(body: &[u8]) -> Result<Vec<Map<String, Value>>, Refusal> {
    let bad = |why: &str| bad_body(SHAPE, why);
    let value = json_body(body, SHAPE)?;
    let list = match value {
        Value::Array(list) if list.is_empty() => return Err(bad("the list is empty")),
        Value::Array(list) => list,
        Value::Object(object) if object.is_empty() => return Err(bad("the object is empty")),
        object @ Value::Object(_) => vec![object],
        _ => return Err(bad("it is neither an object nor a list")),
    };
    list.into_iter()
        .map(|item| match item {
            Value::Object(object)
                if object
                    .get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| !n.is_empty()) =>
            {
                Ok(object)
            }
            other => Err(bad(&format!("{other} is not an object with a `name`"))),
        })
        .collect()
}

fn name_of(account: &Map<String, Value>) -> String {
    account
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// `POST /armory/accounts/dynamic`: adds accounts, INACTIVE. 202 `[]`; 409 with the accounts
/// that exist already (the others still added); 400, nothing added, when one does not map
/// onto a dynamic account.
pub(crate) async fn add(
    State(api): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Response {
    const ROUTE: &str = "POST /armory/accounts/dynamic";
    let started = Instant::now();
    let accounts = match accounts_of(&body) {
        Ok(accounts) => accounts,
        Err(response) => return refused(&caller, ROUTE, "add", &[], started, *response),
    };
    let names: Vec<String> = accounts.iter().map(name_of).collect();
    if let Some(response) = out_of_scope(&caller, ROUTE, &names) {
        return refused(&caller, ROUTE, "add", &names, started, response);
    }
    let (mut puts, mut conflicts, mut problems) = (Vec::new(), Vec::new(), Vec::new());
    for account in accounts {
        let name = name_of(&account);
        if api.live.dynamic_accounts().get(&name).is_some() || declared_by_agent(&api, &name) {
            conflicts.push(Value::Object(account));
            continue;
        }
        match shape::spec_of(&api.live, &account, &Overrides::default(), true) {
            Ok((spec, _)) => puts.push(Put {
                spec,
                inactive: true,
                source: SOURCE_DYNAMIC.into(),
                verb: "add",
            }),
            Err(problem) => problems.push(problem),
        }
    }
    if !problems.is_empty() {
        let response = error(StatusCode::BAD_REQUEST, problems.join("; "));
        return refused(&caller, ROUTE, "add", &names, started, response);
    }
    if !puts.is_empty() {
        let response = commit(&api, &caller, ROUTE, puts, Vec::new()).await;
        if response.status() != StatusCode::ACCEPTED {
            return response;
        }
    }
    if conflicts.is_empty() {
        return super::accepted();
    }
    let conflicted: Vec<String> = conflicts
        .iter()
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
        .collect();
    let response = (StatusCode::CONFLICT, Json(conflicts)).into_response();
    refused(&caller, ROUTE, "add", &conflicted, started, response)
}

/// `PUT /armory/accounts/dynamic`: replaces dynamic accounts' definitions, keeping their
/// state (an active account's agent is sent the change at once). 202 `[]`; 400 for an empty
/// body or a definition that does not map; 404, nothing changed, for names that are not
/// dynamic accounts; 409 for accounts an agent declares in its config.
pub(crate) async fn update(
    State(api): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Response {
    const ROUTE: &str = "PUT /armory/accounts/dynamic";
    let started = Instant::now();
    let accounts = match accounts_of(&body) {
        Ok(accounts) => accounts,
        Err(response) => return refused(&caller, ROUTE, "update", &[], started, *response),
    };
    let names: Vec<String> = accounts.iter().map(name_of).collect();
    let refuse = |status: StatusCode, message: String| {
        refused(
            &caller,
            ROUTE,
            "update",
            &names,
            started,
            error(status, message),
        )
    };
    if let Some(response) = out_of_scope(&caller, ROUTE, &names) {
        return refused(&caller, ROUTE, "update", &names, started, response);
    }
    let mut puts = Vec::new();
    for account in &accounts {
        let name = name_of(account);
        let record = api.live.dynamic_accounts().get(&name).cloned();
        let Some(record) = record else {
            return if declared_by_agent(&api, &name) {
                refuse(
                    StatusCode::CONFLICT,
                    format!(
                        "account {name:?} is declared in its agent's config, not dynamic: \
                         change it there"
                    ),
                )
            } else {
                refuse(
                    StatusCode::NOT_FOUND,
                    format!(
                        "no dynamic account {name:?}: add it with POST /armory/accounts/dynamic"
                    ),
                )
            };
        };
        // Without a zoneId the account stays with its agent.
        let overrides = Overrides {
            zone_id: Some(
                account
                    .get("zoneId")
                    .and_then(Value::as_str)
                    .unwrap_or(record.spec.agent.as_str()),
            ),
            kubeconfig_file: None,
        };
        match shape::spec_of(&api.live, account, &overrides, true) {
            Ok((spec, _)) => puts.push(Put {
                spec,
                inactive: record.inactive,
                source: record.source,
                verb: "update",
            }),
            Err(problem) => return refuse(StatusCode::BAD_REQUEST, problem),
        }
    }
    commit(&api, &caller, ROUTE, puts, Vec::new()).await
}
