//! Armory's plugin REST API for accounts, on the hub's API listener, for automation written
//! against Armory's Clouddriver plugin (port 7002): the same routes, bodies and status codes,
//! mapped onto the hub's accounts and dynamic accounts ([`crate::dynamic_accounts`]).
//!
//! - `GET /armory/accounts?page=&limit=`: every account, paged ([`accounts`]);
//! - `POST /armory/accounts`: migrate Clouddriver accounts (their definitions read from
//!   Clouddriver's Account Management API), added INACTIVE;
//! - `PATCH /armory/accounts`: activate (`state: ACTIVE`) or deactivate (`INACTIVE`);
//! - `DELETE /armory/accounts` (a list of names) and `DELETE /armory/accounts/{name}`;
//! - `GET /armory/accounts/{name}`: one dynamic account's definition;
//! - `POST` and `PUT /armory/accounts/dynamic`: add (INACTIVE) and update accounts
//!   ([`dynamic`]);
//! - `GET /agents/kubernetes/accounts/{name}` and `.../namespaces`: an account's status
//!   (Swagger's `KubesvcAccount`) and namespaces ([`agent_accounts`]).
//!
//! Where Armory's documents disagree, the routes follow its Swagger: `PATCH` is on
//! `/armory/accounts` only (the "Manage" page's `PATCH /armory/accounts/dynamic` is in no
//! Swagger file), `/agents/kubernetes/accounts/{name}` answers the Swagger model rather than
//! the "Manage" page's example, and the dynamic routes take a single object (Swagger's
//! JsonNode) or a list of them. `PATCH`'s `state` is the state wanted, as Armory's curl
//! examples send it (the migration page calls it the current state).
//!
//! Roles: reads need `reader`; changes need `admin`, as the hub's own dynamic accounts API
//! does: adding or moving an account binds it to an agent identity and points that agent
//! at a Secret of its cluster, which is an admin's decision, not an operator's (operators
//! run operations on accounts that exist). Every change is audited
//! ([`crate::audit::account_change`]).

pub(crate) mod accounts;
pub(crate) mod agent_accounts;
pub(crate) mod dynamic;
pub(crate) mod shape;

use std::{collections::BTreeSet, sync::Arc, time::Instant};

use axum::{
    Json, Router,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::Value;

use scale_agent_hub_auth::api_auth::Caller;
use scale_agent_hub_model::{
    dynamic_accounts::{DynamicAccountRecord, DynamicAccountSpec},
    error::Chain,
    store_op::StoreOp,
};
use scale_agent_hub_state::dynamic_accounts::push;

use crate::http::{ApiState, error};

/// The reads that list or show Armory's view of every account (role reader; answered by
/// this replica).
pub(crate) fn reads() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/armory/accounts", get(accounts::list))
        .route("/armory/accounts/{name}", get(accounts::get_one))
}

/// An account's status and namespaces (role reader): kept by its owner, so the caller
/// layers these with the owner forwarding of the hub's own account reads.
pub(crate) fn account_reads() -> Router<Arc<ApiState>> {
    Router::new()
        .route(
            "/agents/kubernetes/accounts/{name}",
            get(agent_accounts::status),
        )
        .route(
            "/agents/kubernetes/accounts/{name}/namespaces",
            get(agent_accounts::namespaces),
        )
}

/// The changes (role admin).
pub(crate) fn changes() -> Router<Arc<ApiState>> {
    Router::new()
        .route(
            "/armory/accounts",
            axum::routing::post(accounts::migrate)
                .patch(accounts::set_state)
                .delete(accounts::delete_many),
        )
        .route(
            "/armory/accounts/{name}",
            axum::routing::delete(accounts::delete_one),
        )
        .route(
            "/armory/accounts/dynamic",
            axum::routing::post(dynamic::add).put(dynamic::update),
        )
}

/// Armory's answer to an accepted change: 202 and an empty list.
pub(crate) fn accepted() -> Response {
    (StatusCode::ACCEPTED, Json(Vec::<Value>::new())).into_response()
}

/// One account to store: its spec, whether it is inactive, its source, and the verb of its
/// audit line (`migrate`, `add`, `update`, `activate`, `deactivate`).
pub(crate) struct Put {
    pub spec: DynamicAccountSpec,
    pub inactive: bool,
    pub source: String,
    pub verb: &'static str,
}

/// Stores `puts` and removes `deletes` in one commit of the store, then sends each agent
/// identity whose set changed its new set. Every account's binding is checked first (409:
/// bound to another identity). One audit line per account, naming `route`.
pub(crate) async fn commit(
    api: &ApiState,
    caller: &Caller,
    route: &str,
    puts: Vec<Put>,
    deletes: Vec<String>,
) -> Response {
    let started = Instant::now();
    let audited: Vec<(String, &'static str)> = puts
        .iter()
        .map(|p| (p.spec.name.clone(), p.verb))
        .chain(deletes.iter().map(|d| (d.clone(), "delete")))
        .collect();
    let answer = store(api, puts, deletes).await;
    let code = answer
        .as_ref()
        .map_or_else(|r| r.status(), |_| StatusCode::ACCEPTED);
    for (name, verb) in &audited {
        crate::audit::account_change(caller, name, verb, route, code.as_u16(), started.elapsed());
    }
    match answer {
        Ok(identities) => {
            for identity in identities {
                push(&api.live, &identity);
            }
            accepted()
        }
        Err(response) => *response,
    }
}

/// [`commit`]'s store step: the identities to send their sets to.
async fn store(
    api: &ApiState,
    puts: Vec<Put>,
    deletes: Vec<String>,
) -> Result<BTreeSet<String>, Refusal> {
    {
        let registry = api.live.registry_read();
        for put in &puts {
            if let Err(reason) = registry.check_binding(&put.spec.agent, &put.spec.name) {
                return Err(Box::new(error(
                    StatusCode::CONFLICT,
                    format!(
                        "account {:?} cannot be served by agent {:?} (zoneId): {reason}",
                        put.spec.name, put.spec.agent
                    ),
                )));
            }
        }
    }
    let now = jiff::Timestamp::now().as_second();
    let mut store = api.store.lock().await;
    let mut identities = BTreeSet::new();
    let mut ops = Vec::new();
    // Kept to undo the in-memory change if the store refuses the commit.
    let mut before: Vec<(String, Option<DynamicAccountRecord>)> = Vec::new();
    {
        let mut book = api.live.dynamic_accounts();
        for put in puts {
            let previous = book.get(&put.spec.name).cloned();
            if let Some(previous) = &previous {
                identities.insert(previous.spec.agent.clone());
            }
            before.push((put.spec.name.clone(), previous));
            let record = book.put_as(put.spec, put.inactive, put.source, now);
            identities.insert(record.spec.agent.clone());
            ops.push(StoreOp::PutDynamicAccount { record });
        }
        for name in deletes {
            if let Some(record) = book.remove(&name) {
                identities.insert(record.spec.agent.clone());
                before.push((name.clone(), Some(record)));
                ops.push(StoreOp::DeleteDynamicAccount { account: name });
            }
        }
    }
    if let Err(e) = store.commit(ops).await {
        let mut book = api.live.dynamic_accounts();
        for (name, previous) in before.into_iter().rev() {
            match previous {
                Some(record) => {
                    book.put_as(record.spec, record.inactive, record.source, record.updated);
                }
                None => {
                    book.remove(&name);
                }
            }
        }
        return Err(Box::new(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the accounts could not be stored (nothing changed): {}",
                Chain(&e)
            ),
        )));
    }
    drop(store);
    Ok(identities)
}

/// 403 when the caller's account globs leave out any of `names` (a token limited to
/// `team-a-*` changes no `team-b`). A body naming several accounts is refused whole, naming
/// those outside, so that a bulk request never half-applies; nothing is read from
/// Clouddriver or stored first. `route` names the request, as the API's other 403s do.
pub(crate) fn out_of_scope(caller: &Caller, route: &str, names: &[String]) -> Option<Response> {
    let outside: Vec<&str> = names
        .iter()
        .filter(|name| caller.refuses_account(name))
        .map(String::as_str)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if outside.is_empty() {
        return None;
    }
    // troubleshooting: REST API: HTTP 403 on an Armory account change
    // `POST`, `PATCH` or `DELETE /armory/accounts` or `POST`/`PUT /armory/accounts/dynamic`
    // named an account outside the token's account globs; a body naming several accounts
    // changes none when one is outside. Send those accounts with a token whose globs admit
    // them (an admin token without `accounts`), or leave them out of the body.
    Some(error(
        StatusCode::FORBIDDEN,
        format!(
            "{route}: {:?} is limited to accounts {:?}, which do not include {outside:?}; \
             nothing was changed: send those accounts with a token whose accounts do",
            caller.name, caller.accounts
        ),
    ))
}

/// A refusal, boxed (a `Response` is large for an `Err`).
pub(crate) type Refusal = Box<Response>;

/// A 400 saying the body must be `shape`, and why it is not.
pub(crate) fn bad_body(shape: &str, why: &str) -> Refusal {
    Box::new(error(
        StatusCode::BAD_REQUEST,
        format!("the body must be {shape}: {why}"),
    ))
}

/// Parses a JSON body, answering 400 with `shape` when it is not JSON.
pub(crate) fn json_body(body: &[u8], shape: &str) -> Result<Value, Refusal> {
    serde_json::from_slice(body).map_err(|e| bad_body(shape, &e.to_string()))
}
