//! Reading a Kubernetes account's definition from Clouddriver's Account Management API, for
//! migrating it to the hub (Armory's `POST /armory/accounts`, served by the hub's API crate).
//! Clouddriver has no "get one definition" route: `GET /credentials/type/kubernetes` with
//! `limit=1&startingAccountName=<name>` answers the first definition at or after the name,
//! which is the account's own when it exists. Clouddriver answers only the definitions the
//! caller (`X-SPINNAKER-USER`) may write, so an account the hub's user may not see reads as
//! missing.

use serde_json::Value;

use crate::{Registrar, client::SendError};

/// Why a definition could not be read. Its own enum, beside the registrar's: the API crate
/// turns each into a status and a message saying what to change.
#[derive(Debug, thiserror::Error)]
pub enum DefinitionError {
    /// The hub writes to a file, or to nothing: there is no Account Management API to read.
    #[error(
        "the hub is not configured with Clouddriver's Account Management API: start it with \
         --clouddriver-url <Clouddriver's URL> (and --clouddriver-user when Fiat is on) to \
         migrate accounts from Clouddriver"
    )]
    NotConfigured,
    #[error("Clouddriver did not answer GET /credentials/type/kubernetes: {0}")]
    Unreachable(String),
    #[error("Clouddriver answered GET /credentials/type/kubernetes with {status}: {message}")]
    Refused { status: u16, message: String },
    #[error(
        "Clouddriver's answer to GET /credentials/type/kubernetes is not a list of definitions: {0}"
    )]
    Invalid(String),
}

impl Registrar {
    /// The definition of Kubernetes account `name` in Clouddriver's Account Management API
    /// (`None`: Clouddriver holds none by that name that its user may see). Secrets in it stay
    /// as Clouddriver stores them (`encrypted:`/`encryptedFile:` references).
    pub async fn kubernetes_definition(
        &self,
        name: &str,
    ) -> Result<Option<Value>, DefinitionError> {
        let client = self.client().ok_or(DefinitionError::NotConfigured)?;
        let answer = client
            .kubernetes_definition_from(name)
            .await
            .map_err(|e: SendError| DefinitionError::Unreachable(e.to_string()))?;
        if !(200..300).contains(&answer.status) {
            let body = String::from_utf8_lossy(&answer.body);
            let message = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_else(|| body.chars().take(300).collect());
            return Err(DefinitionError::Refused {
                status: answer.status,
                message,
            });
        }
        let list: Vec<Value> = serde_json::from_slice(&answer.body)
            .map_err(|e| DefinitionError::Invalid(e.to_string()))?;
        Ok(list
            .into_iter()
            .find(|d| d.get("name").and_then(Value::as_str) == Some(name)))
    }
}
