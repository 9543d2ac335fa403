//! Errors the proxy itself answers, as Kubernetes `Status` objects, so kubectl prints them
//! the way it prints the API server's (`Error from server (Forbidden): …`) and Clouddriver's
//! checks on kubectl's output (`(NotFound)`, `forbidden`) keep working.

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;

/// `metav1.Status` with `status: Failure`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    kind: &'static str,
    api_version: &'static str,
    metadata: Metadata,
    status: &'static str,
    message: String,
    reason: &'static str,
    code: u16,
}

#[derive(Debug, Default, Serialize)]
struct Metadata {}

impl Status {
    /// A failure with `code`, the Kubernetes `reason` for it and a message that says what to
    /// do.
    pub fn failure(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Status {
            kind: "Status",
            api_version: "v1",
            metadata: Metadata::default(),
            status: "Failure",
            message: message.into(),
            reason,
            code,
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::failure(401, "Unauthorized", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::failure(403, "Forbidden", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::failure(404, "NotFound", message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::failure(503, "ServiceUnavailable", message)
    }

    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::failure(502, "InternalError", message)
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Self::failure(504, "Timeout", message)
    }

    pub fn code(&self) -> u16 {
        self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl Status {
    /// The same error as plain text: client-go's discovery client reads error bodies raw and
    /// keeps only text (a JSON Status there shows as "unknown"), so errors on discovery
    /// paths, the first request of every kubectl command, are sent as text.
    pub fn into_text_response(self) -> Response {
        let mut response = self.into_response();
        let message = response
            .extensions()
            .get::<Message>()
            .map(|m| m.0.clone())
            .unwrap_or_default();
        *response.body_mut() = axum::body::Body::from(format!("{message}\n"));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response.headers_mut().remove(header::CONTENT_LENGTH);
        response
    }
}

/// The message of a Status response, kept for [`Status::into_text_response`].
#[derive(Clone)]
struct Message(String);

impl IntoResponse for Status {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (code, body).into_response();
        response.extensions_mut().insert(Message(self.message));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if code == StatusCode::UNAUTHORIZED {
            // What the API server sends too; clients use it to tell a missing login apart.
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"scale-agent-hub\""),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_the_shape_kubectl_reads() {
        let status = Status::forbidden("token for account \"a\" cannot reach account \"b\"");
        let value = serde_json::to_value(&status).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "token for account \"a\" cannot reach account \"b\"",
                "reason": "Forbidden", "code": 403,
            })
        );
        let response = Status::unauthorized("no token").into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        assert!(response.headers().contains_key(header::WWW_AUTHENTICATE));

        let text = Status::forbidden("no").into_text_response();
        assert_eq!(text.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            text.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
    }
}
