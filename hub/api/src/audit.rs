//! Audit lines: one structured tracing event, target `audit` ([`TARGET`]), per operation
//! submitted to the REST API, per account changed through Armory's account routes
//! ([`account_change`]), and per write through the Kubernetes API proxy (any method but
//! GET, HEAD and OPTIONS, and exec/attach/port-forward upgrades; those lines are the proxy's,
//! in its `audit` module, with the same target and fields). Fields:
//!
//! - `who`: the token's name; `token_kind`: `api`, `admin` or `proxy`;
//! - `account`, `verb` (the operation type, or the Kubernetes verb of a proxied request);
//! - `object`: `kind/namespace/name` where known (the resource, for the proxy), else the path;
//! - `code`: the HTTP status answered; `duration_ms`.
//!
//! The admin levers on agent identities and accounts ([`admin`]: disable, enable,
//! deny-certificate, delete-account) write one line each with `who`, `token_kind`, `verb`,
//! `object` (the identity or account) and `code`.
//!
//! Revoking a token or an agent token ([`revocation`]) writes one line with the same fields
//! and `ended`: the streams and sessions it ended.
//!
//! With `--log-format json` each is one JSON line whose `target` is `audit`, so a log
//! pipeline can route them apart.

use std::time::Duration;

use serde_json::Value;

use scale_agent_hub_auth::api_auth::Caller;
use scale_agent_hub_operations::OperationRequest;

/// The tracing target of audit events (the REST API's here, and the proxy's: the hub's
/// wiring checks that both say the same).
pub const TARGET: &str = "audit";

/// A duration as the audit lines' `duration_ms`.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What an audit line says an operation is: its verb and object, taken before the request
/// is handed to the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationSubject {
    pub verb: String,
    pub object: String,
}

impl OperationSubject {
    /// The subject of `request`; `None` is a body that did not parse (verb `invalid`).
    pub fn of(request: Option<&OperationRequest>) -> Self {
        OperationSubject {
            verb: request.map_or_else(|| "invalid".into(), |r| r.op_type.clone()),
            object: request.map(operation_object).unwrap_or_default(),
        }
    }
}

/// Audits a submitted operation.
pub fn operation(
    caller: &Caller,
    account: &str,
    subject: &OperationSubject,
    code: u16,
    duration: Duration,
) {
    let (verb, object) = (subject.verb.as_str(), subject.object.as_str());
    tracing::info!(
        target: TARGET,
        who = %caller.name,
        token_kind = caller.kind(),
        account,
        verb,
        object = %object,
        code,
        duration_ms = millis(duration),
        "operation"
    );
}

/// Audits a change of an account through Armory's account routes (`crate::armory`): `verb`
/// says which (`migrate`, `activate`, `deactivate`, `delete`, `add`, `update`), `object` is
/// the request's route.
pub fn account_change(
    caller: &Caller,
    account: &str,
    verb: &str,
    object: &str,
    code: u16,
    duration: Duration,
) {
    tracing::info!(
        target: TARGET,
        who = %caller.name,
        token_kind = caller.kind(),
        account,
        verb,
        object = %object,
        code,
        duration_ms = millis(duration),
        "account change"
    );
}

/// Audits an admin's change of an agent identity or account (issue 28, F17): `verb` is
/// `disable`, `enable`, `deny-certificate` or `delete-account`, `object` the identity or
/// account.
pub fn admin(caller: &Caller, verb: &str, object: &str, code: u16) {
    tracing::info!(
        target: TARGET,
        who = %caller.name,
        token_kind = caller.kind(),
        verb,
        object = %object,
        code,
        "admin"
    );
}

/// Audits the revocation of a token the hub issued or of an agent token (issue 28, F17):
/// `verb` is `revoke-token` or `revoke-agent-token`, `object` the token's id, `ended` how
/// many agent streams, watches and exec/attach/port-forward sessions opened with it were
/// ended on this replica (other replicas end theirs at their next read of the store).
pub fn revocation(caller: &Caller, verb: &str, object: &str, code: u16, ended: usize) {
    tracing::info!(
        target: TARGET,
        who = %caller.name,
        token_kind = caller.kind(),
        verb,
        object = %object,
        code,
        ended,
        "admin"
    );
}

/// `kind/namespace/name` of what an operation addresses, from its fields or its manifest(s).
pub fn operation_object(request: &OperationRequest) -> String {
    let of_manifest = |m: &Value| {
        let field = |p: &str| m.pointer(p).and_then(Value::as_str).unwrap_or("");
        join(
            field("/kind"),
            field("/metadata/namespace"),
            field("/metadata/name"),
        )
    };
    if let Some(manifest) = &request.manifest {
        return of_manifest(manifest);
    }
    if let Some(manifests) = &request.manifests {
        return manifests
            .iter()
            .map(of_manifest)
            .collect::<Vec<_>>()
            .join(",");
    }
    if request.yaml.is_some() {
        return "(yaml manifests)".into();
    }
    let kind = request.kind.as_deref().unwrap_or("");
    let namespace = request.namespace.as_deref().unwrap_or("");
    match (&request.name, &request.label_selector) {
        (Some(name), _) => join(kind, namespace, name),
        (None, Some(selector)) => format!("{}?labelSelector={selector}", join(kind, namespace, "")),
        (None, None) => join(kind, namespace, ""),
    }
}

fn join(kind: &str, namespace: &str, name: &str) -> String {
    [kind, namespace, name]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_name_their_object() {
        let request: OperationRequest = serde_json::from_value(serde_json::json!({
            "type": "apply",
            "manifest": {"kind": "ConfigMap", "metadata": {"namespace": "apps", "name": "web"}},
        }))
        .unwrap();
        assert_eq!(operation_object(&request), "ConfigMap/apps/web");
        let request: OperationRequest = serde_json::from_value(serde_json::json!({
            "type": "delete", "kind": "Pod", "namespace": "apps", "labelSelector": "app=web",
        }))
        .unwrap();
        assert_eq!(operation_object(&request), "Pod/apps?labelSelector=app=web");
        let request: OperationRequest = serde_json::from_value(serde_json::json!({
            "type": "scale", "kind": "Deployment", "namespace": "apps", "name": "web",
        }))
        .unwrap();
        assert_eq!(operation_object(&request), "Deployment/apps/web");
    }
}
