//! The operations routes: `POST /api/v1/accounts/{name}/operations` (run on the account's
//! owner, forwarded there from another replica, audited either way) and the operations'
//! records by id (`GET /api/v1/operations/{id}`, `GET /api/v1/accounts/{name}/operations/{id}`).

use std::{sync::Arc, time::Duration};

use axum::{
    Json,
    extract::{FromRequest as _, Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::json;

use scale_agent_hub_operations::{self as operations, OperationRequest, OperationResponse};

use scale_agent_hub_model::auth::Submitter;

use crate::api_auth::Caller;

use super::{ApiState, error};

/// A 413 as a Kubernetes `Status` (reason `RequestEntityTooLarge`, what the API server
/// answers), which also carries the API's usual `error` field for clients that read only it.
fn too_large(message: String) -> Response {
    let status =
        scale_agent_hub_net::status::Status::failure(413, "RequestEntityTooLarge", &message);
    let mut body = serde_json::to_value(&status).unwrap_or_else(|_| json!({}));
    body["error"] = json!(message);
    (StatusCode::PAYLOAD_TOO_LARGE, Json(body)).into_response()
}

/// Who an operation (or a lookup) is for: the caller authenticated here, or, on the owner
/// of an account, the caller the forwarding replica authenticated.
fn submitter_of(caller: &Caller, forwarded: Option<axum::Extension<Submitter>>) -> Submitter {
    match forwarded {
        Some(axum::Extension(submitter)) => submitter,
        None => Submitter::of(caller),
    }
}

pub(super) async fn submit_operation(
    State(api): State<Arc<ApiState>>,
    Path(name): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
    forwarded: Option<axum::Extension<Submitter>>,
    request: axum::extract::Request,
) -> Response {
    let submitter = submitter_of(&caller, forwarded);
    let started = std::time::Instant::now();
    // Operations run where the account's agents stream: on its owner.
    if let Some(owner) = api
        .replicas
        .owner_elsewhere(&api.live, &name, request.extensions())
        .await
        && api.replicas.forwarder.is_some()
    {
        let answer = api
            .replicas
            .forward(&owner, &name, Some(&caller), request, false)
            .await
            .unwrap_or_else(IntoResponse::into_response);
        let subject = crate::audit::OperationSubject::of(None);
        crate::audit::operation(
            &caller,
            &name,
            &subject,
            answer.status().as_u16(),
            started.elapsed(),
        );
        return answer;
    }
    // As the proxy refuses writes while the store fails: the outcome could be neither
    // recorded (client ids, GET /api/v1/operations/{id}) nor shown, and the account's agents
    // stand by while no replica can take it, so the operation would only wait for none.
    if let Some(failure) = api.commits.health().failure {
        let subject = crate::audit::OperationSubject::of(None);
        crate::audit::operation(&caller, &name, &subject, 503, started.elapsed());
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the hub's store is failing ({failure}): operations are refused until it \
                 commits again; fix the store (PostgreSQL up and reachable, volume not full), \
                 then retry"
            ),
        );
    }
    let body = axum::body::Bytes::from_request(request, &()).await;
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let status = rejection.status();
            let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
                format!(
                    // troubleshooting: REST API: HTTP 413
                    // Split the manifests into several operations, or raise `--max-request-bytes`.
                    "the operation request is larger than the hub's limit of {} bytes \
                     (--max-request-bytes): split the manifests into several operations, or \
                     raise the limit",
                    api.settings.max_request_bytes
                )
            } else {
                format!("cannot read the operation request: {rejection}")
            };
            let subject = crate::audit::OperationSubject::of(None);
            crate::audit::operation(&caller, &name, &subject, status.as_u16(), started.elapsed());
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                return too_large(message);
            }
            return error(status, message);
        }
    };
    let request: OperationRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let body = OperationResponse::bad_request(format!("invalid operation request: {e}"));
            let subject = crate::audit::OperationSubject::of(None);
            crate::audit::operation(&caller, &name, &subject, 400, started.elapsed());
            return (StatusCode::BAD_REQUEST, Json(body)).into_response();
        }
    };
    let subject = crate::audit::OperationSubject::of(Some(&request));
    // Run apart from the request: a client that goes away does not abandon the operation,
    // which still finishes, is recorded for GET /api/v1/operations/{id}, and is audited.
    let task = tokio::spawn(async move {
        let answer = operations::submit(&api.operations, &name, &submitter, request).await;
        crate::audit::operation(&caller, &name, &subject, answer.0, started.elapsed());
        answer
    });
    let (code, body) = match task.await {
        Ok(answer) => answer,
        Err(e) => (
            500,
            OperationResponse::task_failed(format!("the operation task failed: {e}")),
        ),
    };
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(body)).into_response()
}

/// An operation by id alone: a hub-made id, or a client id that one account has. A caller
/// sees only the operations they submitted (an admin sees all), and a caller limited to
/// account globs only those of accounts they admit: the others are not found, as if they
/// did not exist (404, not 403, so an id is not confirmed; F18).
pub(super) async fn operation(
    State(api): State<Arc<ApiState>>,
    Path(id): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Response {
    let retention = api.settings.operation_retention;
    let viewer = Submitter::of(&caller);
    let mut found = api
        .operations
        .operations
        .lookup(None, &id, &viewer, retention);
    found.retain(|op| {
        op.account
            .as_deref()
            .is_none_or(|account| !caller.refuses_account(account))
    });
    match found.len() {
        0 => operation_not_found(&id, retention),
        1 => Json(found.remove(0)).into_response(),
        _ => {
            let mut accounts: Vec<String> = found.into_iter().filter_map(|b| b.account).collect();
            accounts.dedup();
            let message = if accounts.len() > 1 {
                format!(
                    "operation id {id:?} is used by several accounts ({}): ids are per account, \
                     so ask GET /api/v1/accounts/{{account}}/operations/{id}",
                    accounts.join(", ")
                )
            } else {
                format!(
                    "operation id {id:?} of account {} was submitted by several callers: \
                     client ids are per caller, so ask with the token of the one whose \
                     operation you want",
                    accounts.join(", ")
                )
            };
            error(StatusCode::CONFLICT, message)
        }
    }
}

/// An operation of one account (client ids are per account and caller): the caller's own
/// (an admin's lookup sees every caller's; several answer 409).
pub(super) async fn account_operation(
    State(api): State<Arc<ApiState>>,
    Path((name, id)): Path<(String, String)>,
    axum::Extension(caller): axum::Extension<Caller>,
    forwarded: Option<axum::Extension<Submitter>>,
) -> Response {
    let retention = api.settings.operation_retention;
    let viewer = submitter_of(&caller, forwarded);
    let mut found = api
        .operations
        .operations
        .lookup(Some(&name), &id, &viewer, retention);
    match found.len() {
        0 => operation_not_found(&id, retention),
        1 => Json(found.remove(0)).into_response(),
        n => error(
            StatusCode::CONFLICT,
            format!(
                "operation id {id:?} of account {name:?} was submitted by several callers \
                 ({n}): client ids are per caller, so ask with the token of the one whose operation you \
                 want"
            ),
        ),
    }
}

fn operation_not_found(id: &str, retention: Duration) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!(
            "no operation {id:?} (unknown, or finished longer ago than the retention of \
             {retention:?})"
        ),
    )
}
