//! The few calls the harness makes to etcd (health, compaction), through its JSON gateway.

use std::time::Duration;

use crate::error::{Error, Result};

/// How long one call to etcd may take.
const ETCD_TIMEOUT: Duration = Duration::from_secs(30);

/// The few calls the harness makes to etcd, through its JSON gateway (gRPC-gateway on the
/// client URL), which needs no etcd client library.
pub(super) struct Etcd {
    endpoint: String,
}

impl Etcd {
    pub(super) fn new(endpoint: &str) -> Self {
        Self {
            endpoint: endpoint.to_string(),
        }
    }

    fn error(&self, message: impl Into<String>) -> Error {
        Error::Etcd {
            endpoint: self.endpoint.clone(),
            message: message.into(),
        }
    }

    pub(super) async fn healthy(&self) -> std::result::Result<(), ()> {
        match self.post("/health", None).await {
            Ok(body) if body.get("health").and_then(|h| h.as_str()) == Some("true") => Ok(()),
            _ => Err(()),
        }
    }

    pub(super) async fn compact_to_current(&self) -> Result<i64> {
        // Any range answers with the store's current revision in its header.
        let range = self
            .post(
                "/v3/kv/range",
                Some(serde_json::json!({ "key": "AA==", "limit": 1 })),
            )
            .await?;
        let revision = range
            .pointer("/header/revision")
            .and_then(|r| r.as_str().and_then(|s| s.parse().ok()).or(r.as_i64()))
            .ok_or_else(|| self.error(format!("no revision in {range}")))?;
        self.post(
            "/v3/kv/compaction",
            Some(serde_json::json!({ "revision": revision.to_string(), "physical": true })),
        )
        .await?;
        Ok(revision)
    }

    async fn post(&self, path: &str, body: Option<serde_json::Value>) -> Result<serde_json::Value> {
        let authority = self.endpoint.trim_start_matches("http://");
        let method = if body.is_some() { "POST" } else { "GET" };
        let body = body.map(|b| b.to_string());
        let response = crate::http::request(method, authority, path, body.as_deref(), ETCD_TIMEOUT)
            .await
            .map_err(|e| self.error(e.to_string()))?;
        if !(200..300).contains(&response.status) {
            return Err(self.error(format!(
                "{method} {path}: {}: {}",
                response.status, response.body
            )));
        }
        serde_json::from_str(&response.body)
            .map_err(|e| self.error(format!("{method} {path}: {e}")))
    }
}
