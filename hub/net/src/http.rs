//! The hub's REST API error body, shared by every router that answers one (the API's
//! authentication, the admin, agent-admin and dynamic-accounts APIs).

use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::json;

/// The API's error body: `{"error": message}`.
pub fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}
