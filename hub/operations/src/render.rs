//! The response bodies of the operations API, typed: what `POST
//! /api/v1/accounts/{name}/operations` answers and `GET /api/v1/operations/{id}` returns.
//!
//! One struct covers every body; fields a body does not carry are `None` and left out of
//! the JSON, so each body keeps exactly the fields it has always had:
//!
//! | body | fields |
//! |---|---|
//! | [`OperationResponse::bad_request`] | state, executed, status, message |
//! | [`OperationResponse::task_failed`] | state, message |
//! | [`OperationResponse::running`] | id, account, type, state, replica, attempts |
//! | [`OperationResponse::finished`] | id, account, type, state, executed, replica, attempts, status, objects, deleted, text, and continue when a list has more |
//! | [`OperationResponse::hub_made`] | all of `finished`'s, plus message |

use scale_agent_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where an operation stands. The strings are part of the HTTP API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum State {
    /// Sent to a replica, no answer yet.
    Running,
    /// The agent ran it and the API server accepted it.
    Succeeded,
    /// Refused or failed (see the status), or whether it ran is unknown.
    Failed,
    /// The deadline passed (the agent's own 504, or the hub gave up waiting).
    TimedOut,
    /// No replica of the account could take it.
    NoAgent,
}

impl State {
    /// The name used in the JSON and as the metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
            State::TimedOut => "timedOut",
            State::NoAgent => "noAgent",
        }
    }

    /// The state of a finished result.
    pub fn of(result: &pb::OperationResult) -> State {
        if result.ok {
            State::Succeeded
        } else if result.status.as_ref().is_some_and(|s| s.code == 504) {
            State::TimedOut
        } else {
            State::Failed
        }
    }
}

/// One cause of a [`Status`] (a field the API server refused, ...).
// Fields in alphabetical order, like every struct here: the bodies used to be `json!` maps,
// which serde_json writes sorted, so this keeps them byte for byte.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    /// The field concerned, e.g. `spec.replicas`.
    pub field: String,
    pub message: String,
    /// A machine-readable reason, e.g. `FieldValueInvalid`.
    pub reason: String,
}

/// A Kubernetes-style status: the HTTP code, a reason such as `NotFound`, and a message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub causes: Vec<Cause>,
    /// The HTTP code (0 when the agent sent no status).
    pub code: i32,
    pub message: String,
    /// A machine-readable reason, e.g. `NotFound`.
    pub reason: String,
}

impl Status {
    /// A status without causes.
    pub fn new(code: u16, reason: &str, message: String) -> Status {
        Status {
            causes: Vec::new(),
            code: i32::from(code),
            message,
            reason: reason.to_string(),
        }
    }

    /// An agent's status; a result without one gets code 0 and empty texts.
    pub fn of(status: Option<&pb::OperationStatus>) -> Status {
        let Some(s) = status else {
            return Status::new(0, "", String::new());
        };
        Status {
            causes: s
                .causes
                .iter()
                .map(|c| Cause {
                    field: c.field.clone(),
                    message: c.message.clone(),
                    reason: c.reason.clone(),
                })
                .collect(),
            code: s.code,
            message: s.message.clone(),
            reason: s.reason.clone(),
        }
    }
}

/// What every body of one submission names.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    /// The operation id.
    pub id: &'a str,
    /// The account it was submitted to.
    pub account: &'a str,
    /// The operation type (`apply`, `get`, ...).
    pub op_type: &'a str,
}

/// A response body of the operations API (see the module docs for which fields each has).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationResponse {
    /// The account it was submitted to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Replicas tried so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<usize>,
    /// A list with a limit: the token that continues it (`"continue"` in the next request),
    /// when more items remain.
    #[serde(rename = "continue", default, skip_serializing_if = "Option::is_none")]
    pub continue_token: Option<String>,
    /// `Kind/namespace/name` of the objects deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted: Option<Vec<String>>,
    /// Whether the operation reached the cluster (false: certainly not run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executed: Option<bool>,
    /// The operation id (client-chosen, or made by the hub).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Set on the bodies the hub makes up; the same text as `status.message`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The objects the operation returned or wrote, as the API server sent them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<Vec<Value>>,
    /// `identity/replica` for a running operation; the agent's replica name once finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    pub state: State,
    /// The Kubernetes-style status of the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Text output (logs, rollout history or status, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The operation type (`apply`, `get`, ...).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub op_type: Option<String>,
}

impl OperationResponse {
    /// Only `state` set; the constructors fill in the rest.
    fn bare(state: State) -> OperationResponse {
        OperationResponse {
            account: None,
            attempts: None,
            continue_token: None,
            deleted: None,
            executed: None,
            id: None,
            message: None,
            objects: None,
            replica: None,
            state,
            status: None,
            text: None,
            op_type: None,
        }
    }

    /// A request the hub refuses before running it (HTTP 400).
    pub fn bad_request(message: String) -> OperationResponse {
        OperationResponse {
            executed: Some(false),
            status: Some(Status::new(400, "BadRequest", message.clone())),
            message: Some(message),
            ..OperationResponse::bare(State::Failed)
        }
    }

    /// The task running the operation failed (HTTP 500).
    pub fn task_failed(message: String) -> OperationResponse {
        OperationResponse {
            message: Some(message),
            ..OperationResponse::bare(State::Failed)
        }
    }

    /// Sent to `replica` (`identity/replica`), no answer yet.
    pub fn running(subject: Subject<'_>, replica: &str, attempts: usize) -> OperationResponse {
        OperationResponse {
            id: Some(subject.id.to_string()),
            account: Some(subject.account.to_string()),
            op_type: Some(subject.op_type.to_string()),
            replica: Some(replica.to_string()),
            attempts: Some(attempts),
            ..OperationResponse::bare(State::Running)
        }
    }

    /// An agent's answer. The id is the submission's (a client-given id travels to the agent
    /// under a hub-made wire id, since client ids are per account).
    pub fn finished(
        subject: Subject<'_>,
        result: &pb::OperationResult,
        attempts: usize,
    ) -> OperationResponse {
        OperationResponse {
            id: Some(subject.id.to_string()),
            account: Some(subject.account.to_string()),
            op_type: Some(subject.op_type.to_string()),
            executed: Some(result.executed),
            replica: Some(result.replica.clone()),
            attempts: Some(attempts),
            status: Some(Status::of(result.status.as_ref())),
            objects: Some(
                result
                    .objects_json
                    .iter()
                    .filter_map(|o| serde_json::from_slice(o).ok())
                    .collect(),
            ),
            deleted: Some(result.deleted.clone()),
            text: Some(result.text.clone()),
            continue_token: (!result.continue_token.is_empty())
                .then(|| result.continue_token.clone()),
            ..OperationResponse::bare(State::of(result))
        }
    }

    /// An answer the hub made up (no agent, deadline passed, replica lost, ...); the
    /// status message is repeated as `message`.
    pub fn hub_made(
        subject: Subject<'_>,
        state: State,
        executed: bool,
        status: Status,
        attempts: usize,
    ) -> OperationResponse {
        OperationResponse {
            id: Some(subject.id.to_string()),
            account: Some(subject.account.to_string()),
            op_type: Some(subject.op_type.to_string()),
            executed: Some(executed),
            replica: Some(String::new()),
            attempts: Some(attempts),
            message: Some(status.message.clone()),
            status: Some(status),
            objects: Some(Vec::new()),
            deleted: Some(Vec::new()),
            text: Some(String::new()),
            ..OperationResponse::bare(state)
        }
    }

    /// The HTTP code to answer a resubmission of this finished operation with: its status
    /// code, or 200 when it has none (a code under 100 is no HTTP code).
    pub fn recorded_code(&self) -> u16 {
        self.status
            .as_ref()
            .and_then(|s| u16::try_from(s.code).ok())
            .filter(|c| *c >= 100)
            .unwrap_or(200)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const SUBJECT: Subject<'static> = Subject {
        id: "op-1",
        account: "prod",
        op_type: "apply",
    };

    /// The JSON text of a body, and of the `json!` value the hub used to build it: equal text
    /// means equal bytes on the wire.
    fn same(body: &OperationResponse, before: Value) {
        let text = serde_json::to_string(body).unwrap();
        assert_eq!(text, serde_json::to_string(&before).unwrap());
        let back: OperationResponse = serde_json::from_str(&text).unwrap();
        assert_eq!(&back, body);
    }

    #[test]
    fn bodies_keep_the_json_they_had_when_built_by_hand() {
        let message = "no".to_string();
        same(
            &OperationResponse::bad_request(message.clone()),
            json!({ "state": "failed", "executed": false, "status": { "code": 400, "reason": "BadRequest", "message": message, "causes": [] }, "message": message }),
        );
        same(
            &OperationResponse::task_failed(message.clone()),
            json!({ "state": "failed", "message": message }),
        );
        same(
            &OperationResponse::running(SUBJECT, "agent/pod-a", 2),
            json!({ "id": "op-1", "account": "prod", "type": "apply", "state": "running", "replica": "agent/pod-a", "attempts": 2 }),
        );
        same(
            &OperationResponse::hub_made(
                SUBJECT,
                State::TimedOut,
                true,
                Status::new(504, "Timeout", message.clone()),
                1,
            ),
            json!({
                "id": "op-1", "account": "prod", "type": "apply", "state": "timedOut",
                "executed": true, "replica": "", "attempts": 1,
                "status": { "code": 504, "reason": "Timeout", "message": message, "causes": [] },
                "objects": [], "deleted": [], "text": "", "message": message,
            }),
        );
        let result = pb::OperationResult {
            id: "op-1".into(),
            executed: true,
            replica: "pod-a".into(),
            status: Some(pb::OperationStatus {
                code: 422,
                reason: "Invalid".into(),
                message: "bad".into(),
                causes: vec![pb::operation_status::Cause {
                    reason: "FieldValueInvalid".into(),
                    message: "must be positive".into(),
                    field: "spec.replicas".into(),
                }],
            }),
            objects_json: vec![br#"{"kind":"ConfigMap"}"#.to_vec(), b"not json".to_vec()],
            deleted: vec!["ConfigMap/ns/a".into()],
            text: "log".into(),
            ..Default::default()
        };
        same(
            &OperationResponse::finished(SUBJECT, &result, 3),
            json!({
                "id": "op-1", "account": "prod", "type": "apply", "state": "failed",
                "executed": true, "replica": "pod-a", "attempts": 3,
                "status": { "code": 422, "reason": "Invalid", "message": "bad", "causes": [
                    { "reason": "FieldValueInvalid", "message": "must be positive", "field": "spec.replicas" },
                ] },
                "objects": [{ "kind": "ConfigMap" }], "deleted": ["ConfigMap/ns/a"], "text": "log",
            }),
        );
        same(
            &OperationResponse::finished(SUBJECT, &pb::OperationResult::default(), 1),
            json!({
                "id": "op-1", "account": "prod", "type": "apply", "state": "failed",
                "executed": false, "replica": "", "attempts": 1,
                "status": { "code": 0, "reason": "", "message": "", "causes": [] },
                "objects": [], "deleted": [], "text": "",
            }),
        );
    }

    #[test]
    fn states_and_codes() {
        for (state, name) in [
            (State::Running, "running"),
            (State::Succeeded, "succeeded"),
            (State::Failed, "failed"),
            (State::TimedOut, "timedOut"),
            (State::NoAgent, "noAgent"),
        ] {
            assert_eq!(state.as_str(), name);
            assert_eq!(serde_json::to_value(state).unwrap(), json!(name));
        }
        let timed_out = pb::OperationResult {
            status: Some(pb::OperationStatus {
                code: 504,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(State::of(&timed_out), State::TimedOut);
        let ok = pb::OperationResult {
            ok: true,
            ..Default::default()
        };
        assert_eq!(State::of(&ok), State::Succeeded);
        assert_eq!(
            OperationResponse::finished(SUBJECT, &timed_out, 1).recorded_code(),
            504
        );
        assert_eq!(
            OperationResponse::finished(SUBJECT, &ok, 1).recorded_code(),
            200
        );
    }
}
