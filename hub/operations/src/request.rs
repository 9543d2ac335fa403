//! The request side of an operation: the JSON body clients `POST`, checked and turned into
//! the wire [`Op`], and which ops are safe to send again.

use std::time::Duration;

use scale_agent_proto::v1::{self as pb, operation::Op};
use serde::Deserialize;
use serde_json::Value;

use super::{DEFAULT_TIMEOUT, MAX_TIMEOUT};

/// The JSON body of a submitted operation. Field names follow kubectl's flags.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationRequest {
    /// Optional client-chosen id (1 to 128 of `[A-Za-z0-9._-]`); resubmitting an id whose
    /// operation is known returns that operation instead of running it again.
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub op_type: String,
    pub timeout_seconds: Option<f64>,
    // apply, create, replace
    pub manifest: Option<Value>,
    pub manifests: Option<Vec<Value>>,
    pub yaml: Option<String>,
    pub field_manager: Option<String>,
    #[serde(default)]
    pub force: bool,
    /// Apply only: `false` for client-side apply (last-applied annotation).
    pub server_side: Option<bool>,
    #[serde(default)]
    pub dry_run: bool,
    // addressing
    pub kind: Option<String>,
    pub api_version: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub limit: Option<u32>,
    /// list: the `continue` of the previous page's answer.
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
    // delete
    pub propagation_policy: Option<String>,
    pub grace_period_seconds: Option<i64>,
    #[serde(default)]
    pub wait: bool,
    #[serde(default)]
    pub ignore_not_found: bool,
    // patch
    pub patch_type: Option<String>,
    pub patch: Option<Value>,
    pub subresource: Option<String>,
    // scale
    pub replicas: Option<i32>,
    pub current_replicas: Option<i32>,
    // rollout
    pub action: Option<String>,
    pub to_revision: Option<i64>,
    // logs
    pub container: Option<String>,
    pub tail_lines: Option<i64>,
    pub since_seconds: Option<i64>,
    #[serde(default)]
    pub previous: bool,
    #[serde(default)]
    pub timestamps: bool,
    pub limit_bytes: Option<i64>,
    #[serde(default)]
    pub all_containers: bool,
}

fn kind_selector(kind: Option<&str>, api_version: Option<&str>) -> Option<pb::KindSelector> {
    let kind = kind?.trim();
    if kind.is_empty() {
        return None;
    }
    let (group, version) = match api_version.map(str::trim).filter(|v| !v.is_empty()) {
        Some(av) => match av.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), av.to_string()),
        },
        None => (String::new(), String::new()),
    };
    Some(pb::KindSelector {
        group,
        version,
        kind: kind.to_string(),
    })
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The documents of a multi-document YAML manifest (`---` separated, as `kubectl apply -f`
/// takes them); empty documents are skipped.
fn yaml_documents(yaml: &str) -> Result<Vec<Value>, String> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(yaml).map_err(|e| format!("\"yaml\" does not parse: {e}"))?;
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

impl OperationRequest {
    /// The timeout asked for, bounded.
    pub fn timeout(&self) -> Result<Duration, String> {
        match self.timeout_seconds {
            None => Ok(DEFAULT_TIMEOUT),
            // try_: a finite number of seconds can still be past what a Duration holds
            // (1e300), and a client's body must not panic the hub.
            Some(s) if s.is_finite() && s > 0.0 => {
                Ok(Duration::try_from_secs_f64(s).map_or(MAX_TIMEOUT, |d| d.min(MAX_TIMEOUT)))
            }
            Some(s) => Err(format!("timeoutSeconds must be positive, not {s}")),
        }
    }

    fn manifests(&self) -> Result<Vec<Vec<u8>>, String> {
        let mut out: Vec<Value> = Vec::new();
        if let Some(m) = &self.manifest {
            out.push(m.clone());
        }
        if let Some(ms) = &self.manifests {
            out.extend(ms.iter().cloned());
        }
        if let Some(yaml) = &self.yaml {
            out.extend(yaml_documents(yaml)?);
        }
        if out.is_empty() {
            return Err(format!(
                "{} needs \"manifest\" (an object), \"manifests\" (an array of objects) or \
                 \"yaml\" (one or more YAML documents)",
                self.op_type
            ));
        }
        out.into_iter()
            .map(|m| {
                if !m.is_object() {
                    return Err("every manifest must be an object".to_string());
                }
                serde_json::to_vec(&m).map_err(|e| e.to_string())
            })
            .collect()
    }

    fn target(&self) -> Result<pb::ObjectRef, String> {
        let kind = kind_selector(self.kind.as_deref(), self.api_version.as_deref())
            .ok_or_else(|| format!("{} needs \"kind\"", self.op_type))?;
        let name = self
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("{} needs \"name\"", self.op_type))?;
        Ok(pb::ObjectRef {
            kind: Some(kind),
            namespace: self.namespace.clone().unwrap_or_default(),
            name,
        })
    }

    fn field_manager(&self) -> String {
        self.field_manager.clone().unwrap_or_default()
    }

    /// The wire operation (without id, account and deadline).
    pub fn to_op(&self) -> Result<Op, String> {
        if let Some(id) = &self.id
            && !valid_id(id)
        {
            return Err(format!(
                "id {id:?} must have 1 to 128 letters, digits, '-', '_' or '.'"
            ));
        }
        let ns = self.namespace.clone().unwrap_or_default();
        if self.continue_token.is_some() && !self.op_type.eq_ignore_ascii_case("list") {
            return Err(format!(
                "\"continue\" is for list only (the token of the previous page), not {}",
                self.op_type
            ));
        }
        let op = match self.op_type.to_ascii_lowercase().as_str() {
            "apply" => Op::Apply(pb::ApplyOp {
                manifests_json: self.manifests()?,
                field_manager: self.field_manager(),
                force: self.force,
                client_side: self.server_side == Some(false),
                default_namespace: ns,
                dry_run: self.dry_run,
            }),
            "create" => Op::Create(pb::CreateOp {
                manifests_json: self.manifests()?,
                field_manager: self.field_manager(),
                default_namespace: ns,
                dry_run: self.dry_run,
            }),
            "replace" => Op::Replace(pb::ReplaceOp {
                manifests_json: self.manifests()?,
                field_manager: self.field_manager(),
                default_namespace: ns,
                dry_run: self.dry_run,
            }),
            "delete" => {
                let kind = kind_selector(self.kind.as_deref(), self.api_version.as_deref())
                    .ok_or("delete needs \"kind\"")?;
                let name = self.name.clone().unwrap_or_default();
                let label = self.label_selector.clone().unwrap_or_default();
                let field = self.field_selector.clone().unwrap_or_default();
                if name.is_empty() && label.is_empty() && field.is_empty() {
                    return Err(
                        "delete needs \"name\", \"labelSelector\" or \"fieldSelector\"".into(),
                    );
                }
                if let Some(p) = &self.propagation_policy
                    && !matches!(p.as_str(), "Foreground" | "Background" | "Orphan")
                {
                    return Err(format!(
                        "propagationPolicy {p:?} must be Foreground, Background or Orphan"
                    ));
                }
                Op::Delete(pb::DeleteOp {
                    kind: Some(kind),
                    namespace: ns,
                    name,
                    label_selector: label,
                    field_selector: field,
                    propagation_policy: self.propagation_policy.clone().unwrap_or_default(),
                    grace_period_seconds: self.grace_period_seconds,
                    wait: self.wait,
                    ignore_not_found: self.ignore_not_found,
                })
            }
            "patch" => {
                let patch_type = match self
                    .patch_type
                    .as_deref()
                    .unwrap_or("strategic")
                    .to_ascii_lowercase()
                    .as_str()
                {
                    "strategic" => pb::patch_op::Type::Strategic,
                    "merge" => pb::patch_op::Type::Merge,
                    "json" => pb::patch_op::Type::Json,
                    "apply" => pb::patch_op::Type::Apply,
                    other => {
                        return Err(format!(
                            "patchType {other:?} must be strategic, merge, json or apply"
                        ));
                    }
                };
                let patch = self.patch.as_ref().ok_or("patch needs \"patch\"")?;
                Op::Patch(pb::PatchOp {
                    target: Some(self.target()?),
                    r#type: patch_type as i32,
                    patch_json: serde_json::to_vec(patch).map_err(|e| e.to_string())?,
                    field_manager: self.field_manager(),
                    force: self.force,
                    subresource: self.subresource.clone().unwrap_or_default(),
                })
            }
            "scale" => {
                let replicas = self.replicas.ok_or("scale needs \"replicas\"")?;
                if replicas < 0 {
                    return Err(format!("replicas must not be negative, not {replicas}"));
                }
                Op::Scale(pb::ScaleOp {
                    target: Some(self.target()?),
                    replicas,
                    current_replicas: self.current_replicas,
                })
            }
            "rollout" => {
                use pb::rollout_op::Action;
                let action = match self
                    .action
                    .as_deref()
                    .unwrap_or_default()
                    .to_ascii_lowercase()
                    .as_str()
                {
                    "undo" => Action::Undo,
                    "pause" => Action::Pause,
                    "resume" => Action::Resume,
                    "restart" => Action::Restart,
                    "history" => Action::History,
                    "status" => Action::Status,
                    other => {
                        return Err(format!(
                            "rollout action {other:?} must be undo, pause, resume, restart, \
                             history or status"
                        ));
                    }
                };
                Op::Rollout(pb::RolloutOp {
                    target: Some(self.target()?),
                    action: action as i32,
                    to_revision: self.to_revision.unwrap_or(0),
                })
            }
            "get" => Op::Get(pb::GetOp {
                target: Some(self.target()?),
            }),
            "list" => Op::List(pb::ListOp {
                kind: Some(
                    kind_selector(self.kind.as_deref(), self.api_version.as_deref())
                        .ok_or("list needs \"kind\"")?,
                ),
                namespace: ns,
                label_selector: self.label_selector.clone().unwrap_or_default(),
                field_selector: self.field_selector.clone().unwrap_or_default(),
                limit: self.limit.unwrap_or(0),
            }),
            "events" => Op::Events(pb::EventsOp {
                target: Some(self.target()?),
            }),
            "logs" => {
                let target = if self.kind.as_deref().is_none_or(str::is_empty) {
                    OperationRequest {
                        kind: Some("Pod".into()),
                        api_version: Some("v1".into()),
                        ..self.clone()
                    }
                    .target()?
                } else {
                    self.target()?
                };
                Op::Logs(pb::LogsOp {
                    target: Some(target),
                    container: self.container.clone().unwrap_or_default(),
                    tail_lines: self.tail_lines,
                    since_seconds: self.since_seconds,
                    previous: self.previous,
                    timestamps: self.timestamps,
                    limit_bytes: self.limit_bytes,
                    all_containers: self.all_containers,
                })
            }
            other => {
                return Err(format!(
                    "type {other:?} must be one of apply, create, replace, delete, patch, \
                     scale, rollout, get, list, events, logs"
                ));
            }
        };
        Ok(op)
    }
}

/// Whether sending the operation again (after a replica left without answering) is safe.
pub fn idempotent(op: &Op) -> bool {
    use pb::rollout_op::Action;
    match op {
        Op::Create(_) => false,
        Op::Patch(p) => p.r#type != pb::patch_op::Type::Json as i32,
        Op::Rollout(r) => matches!(
            Action::try_from(r.action),
            Ok(Action::Pause | Action::Resume | Action::History | Action::Status)
        ),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn req(v: Value) -> OperationRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn requests_become_operations() {
        let op = req(json!({"type":"apply","manifest":{"kind":"ConfigMap"},"force":true}))
            .to_op()
            .unwrap();
        assert!(
            matches!(&op, Op::Apply(a) if a.force && !a.client_side && a.manifests_json.len() == 1)
        );
        let op = req(json!({"type":"delete","kind":"deployment.apps","namespace":"x","labelSelector":"a=b","propagationPolicy":"Foreground","gracePeriodSeconds":0,"wait":true}))
            .to_op()
            .unwrap();
        assert!(
            matches!(&op, Op::Delete(d) if d.wait && d.grace_period_seconds == Some(0) && d.kind.as_ref().unwrap().kind == "deployment.apps")
        );
        let op = req(json!({"type":"scale","kind":"Deployment","apiVersion":"apps/v1","name":"web","replicas":3}))
            .to_op()
            .unwrap();
        assert!(
            matches!(&op, Op::Scale(s) if s.replicas == 3 && s.target.as_ref().unwrap().kind.as_ref().unwrap().group == "apps")
        );
        let op = req(json!({"type":"patch","kind":"cm","name":"a","patchType":"json","patch":[]}))
            .to_op()
            .unwrap();
        assert!(!idempotent(&op));
        let op = req(
            json!({"type":"rollout","action":"undo","kind":"deploy","name":"a","toRevision":1}),
        )
        .to_op()
        .unwrap();
        assert!(!idempotent(&op));
        let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n";
        match req(json!({"type":"apply","yaml":yaml})).to_op().unwrap() {
            Op::Apply(apply) => {
                let names: Vec<String> = apply
                    .manifests_json
                    .iter()
                    .map(|m| {
                        serde_json::from_slice::<Value>(m).unwrap()["metadata"]["name"].to_string()
                    })
                    .collect();
                assert_eq!(names, ["\"a\"", "\"b\""]);
            }
            other => panic!("expected an apply, got {other:?}"),
        }
        for (body, needle) in [
            (json!({"type":"nope"}), "must be one of"),
            (json!({"type":"apply"}), "needs \"manifest\""),
            (json!({"type":"apply","yaml":"a: [b"}), "does not parse"),
            (
                json!({"type":"apply","yaml":"- a\n- b\n"}),
                "must be an object",
            ),
            (json!({"type":"delete","kind":"Pod"}), "needs \"name\""),
            (
                json!({"type":"delete","kind":"Pod","name":"a","propagationPolicy":"x"}),
                "Foreground",
            ),
            (
                json!({"type":"scale","kind":"Deployment","name":"a"}),
                "replicas",
            ),
            (
                json!({"type":"rollout","kind":"Deployment","name":"a","action":"x"}),
                "undo",
            ),
            (
                json!({"type":"get","kind":"Pod","name":"a","id":"bad id"}),
                "id",
            ),
        ] {
            let err = req(body).to_op().unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
        assert!(
            serde_json::from_value::<OperationRequest>(json!({"type":"get","bogus":1})).is_err()
        );
        assert!(
            req(json!({"type":"get","timeoutSeconds":-1}))
                .timeout()
                .is_err()
        );
        assert_eq!(
            req(json!({"type":"get","timeoutSeconds":9999}))
                .timeout()
                .unwrap(),
            MAX_TIMEOUT
        );
    }
}
