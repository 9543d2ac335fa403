//! rollout undo, pause, resume, restart, history and status, with `kubectl rollout`'s
//! semantics. Deployments get all of them; StatefulSets and DaemonSets get undo, restart,
//! history and status (pause and resume are for Deployments only, as in kubectl).
//!
//! - undo: the pod template of the ReplicaSet whose `deployment.kubernetes.io/revision` is
//!   the target (the previous revision when none is given) is copied into the Deployment
//!   (without the `pod-template-hash` label), as a read-modify-write retried on 409;
//! - restart: `kubectl.kubernetes.io/restartedAt` on the pod template;
//! - pause/resume: `spec.paused`;
//! - history: the ReplicaSets the Deployment controls, by revision, with change-cause;
//! - StatefulSets and DaemonSets: history from the ControllerRevisions they control; undo
//!   applies the target revision's data (kubectl's strategic merge patch).

use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use scale_agent_proto::v1::{self, rollout_op::Action};
use serde_json::{Value, json};

use super::{CONFLICT_RETRIES, Ctx, Failure, OpResult, Output};
use crate::kinds::KindRef;

pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const CHANGE_CAUSE: &str = "kubernetes.io/change-cause";
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

fn is_deployment(kind: &KindRef) -> bool {
    kind.group == "apps" && kind.kind == "Deployment"
}

fn has_template(kind: &KindRef) -> bool {
    kind.group == "apps"
        && matches!(
            kind.kind.as_str(),
            "Deployment" | "StatefulSet" | "DaemonSet"
        )
}

fn not_supported(kind: &KindRef, action: &str) -> Failure {
    Failure::bad_request(format!(
        "rollout {action} is not supported for {}.{}; it supports {}",
        kind.kind,
        kind.group,
        if matches!(action, "restart" | "status" | "undo" | "history") {
            "Deployments, StatefulSets and DaemonSets"
        } else {
            "Deployments"
        }
    ))
}

/// One revision: (revision, change-cause, ReplicaSet).
pub fn history_of(
    deployment: &DynamicObject,
    replica_sets: &[DynamicObject],
) -> Vec<(i64, String, DynamicObject)> {
    let uid = deployment.metadata.uid.clone().unwrap_or_default();
    let mut out: Vec<(i64, String, DynamicObject)> = replica_sets
        .iter()
        .filter(|rs| {
            rs.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|r| r.uid == uid && r.controller == Some(true)))
        })
        .filter_map(|rs| {
            let a = rs.metadata.annotations.as_ref()?;
            let rev = a.get(REVISION)?.parse::<i64>().ok()?;
            let cause = a.get(CHANGE_CAUSE).cloned().unwrap_or_default();
            Some((rev, cause, rs.clone()))
        })
        .collect();
    out.sort_by_key(|(r, _, _)| *r);
    out
}

/// `kubectl rollout history`'s table.
pub fn history_text(
    kind: &KindRef,
    name: &str,
    history: &[(i64, String, DynamicObject)],
) -> String {
    let mut text = format!(
        "{}.{}/{name}\nREVISION  CHANGE-CAUSE\n",
        kind.plural, kind.group
    );
    for (rev, cause, _) in history {
        let cause = if cause.is_empty() { "<none>" } else { cause };
        text.push_str(&format!("{rev:<9} {cause}\n"));
    }
    text
}

pub async fn rollout(ctx: &Ctx<'_>, op: v1::RolloutOp, out: &mut Output) -> OpResult<()> {
    let (kind, ns, name) = ctx.target(op.target.as_ref()).await?;
    let api = ctx.api(&kind, &ns);
    let action = Action::try_from(op.action).unwrap_or(Action::Unspecified);
    let label = format!("{}.{}/{name}", kind.plural, kind.group);
    match action {
        Action::Unspecified => Err(Failure::bad_request("rollout needs an action")),
        Action::Pause | Action::Resume => {
            if !is_deployment(&kind) {
                return Err(not_supported(
                    &kind,
                    if action == Action::Pause {
                        "pause"
                    } else {
                        "resume"
                    },
                ));
            }
            let paused = action == Action::Pause;
            ctx.hit();
            let live = api.get(&name).await?;
            let now = live
                .data
                .pointer("/spec/paused")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if now == paused {
                out.text = format!(
                    "{label} is already {}",
                    if paused { "paused" } else { "resumed" }
                );
                out.object(&kind, serde_json::to_value(&live).unwrap_or_default());
                return Ok(());
            }
            ctx.hit();
            let result = api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({ "spec": { "paused": paused } })),
                )
                .await?;
            out.text = format!("{label} {}", if paused { "paused" } else { "resumed" });
            out.object(&kind, serde_json::to_value(&result).unwrap_or_default());
            Ok(())
        }
        Action::Restart => {
            if !has_template(&kind) {
                return Err(not_supported(&kind, "restart"));
            }
            ctx.hit();
            let live = api.get(&name).await?;
            if live.data.pointer("/spec/paused").and_then(Value::as_bool) == Some(true) {
                return Err(Failure::bad_request(format!(
                    "can't restart paused deployment (run rollout resume first): {label}"
                )));
            }
            let patch = json!({ "spec": { "template": { "metadata": { "annotations": { RESTARTED_AT: scale_agent_runtime::now_rfc3339() } } } } });
            ctx.hit();
            let result = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            out.text = format!("{label} restarted");
            out.object(&kind, serde_json::to_value(&result).unwrap_or_default());
            Ok(())
        }
        Action::History | Action::Undo if has_template(&kind) && !is_deployment(&kind) => {
            controller_revisions(ctx, &kind, &ns, &name, action, op.to_revision, out).await
        }
        Action::History | Action::Undo => {
            if !is_deployment(&kind) {
                return Err(not_supported(
                    &kind,
                    if action == Action::Undo {
                        "undo"
                    } else {
                        "history"
                    },
                ));
            }
            let rs_kind = KindRef {
                group: "apps".into(),
                version: "v1".into(),
                kind: "ReplicaSet".into(),
                plural: "replicasets".into(),
                namespaced: true,
            };
            let rs_api = ctx.api(&rs_kind, &ns);
            for attempt in 1..=CONFLICT_RETRIES {
                ctx.hit();
                let live = api.get(&name).await?;
                ctx.hit();
                let rss = rs_api.list(&ListParams::default()).await?.items;
                let history = history_of(&live, &rss);
                if action == Action::History {
                    out.text = history_text(&kind, &name, &history);
                    for (_, _, rs) in &history {
                        out.object(&rs_kind, serde_json::to_value(rs).unwrap_or_default());
                    }
                    return Ok(());
                }
                if live.data.pointer("/spec/paused").and_then(Value::as_bool) == Some(true) {
                    return Err(Failure::bad_request(format!(
                        "you cannot rollback a paused deployment; resume it first with 'rollout resume' and try again: {label}"
                    )));
                }
                let target = if op.to_revision > 0 {
                    history.iter().find(|(r, _, _)| *r == op.to_revision)
                } else {
                    // The revision before the current (highest) one.
                    history.iter().rev().nth(1)
                };
                let Some((rev, _, rs)) = target else {
                    return Err(if op.to_revision > 0 {
                        Failure::not_found(format!(
                            "unable to find specified revision {} in history",
                            op.to_revision
                        ))
                    } else {
                        Failure::bad_request(
                            "no rollout history found: there is no previous revision to roll back to",
                        )
                    });
                };
                let mut template = rs
                    .data
                    .pointer("/spec/template")
                    .cloned()
                    .unwrap_or(Value::Null);
                if let Some(labels) = template
                    .pointer_mut("/metadata/labels")
                    .and_then(Value::as_object_mut)
                {
                    labels.remove("pod-template-hash");
                }
                let current = live
                    .data
                    .pointer("/spec/template")
                    .cloned()
                    .unwrap_or(Value::Null);
                if current == template {
                    out.text = format!(
                        "{label} skipped rollback (current template already matches revision {rev})"
                    );
                    out.object(&kind, serde_json::to_value(&live).unwrap_or_default());
                    return Ok(());
                }
                let mut updated = live.clone();
                if let Some(spec) = updated.data.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.insert("template".into(), template);
                }
                ctx.hit();
                match api.replace(&name, &PostParams::default(), &updated).await {
                    Ok(result) => {
                        out.text = format!("{label} rolled back");
                        out.object(&kind, serde_json::to_value(&result).unwrap_or_default());
                        return Ok(());
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 && attempt < CONFLICT_RETRIES => {
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err(Failure::new(
                409,
                "Conflict",
                format!("{label} kept changing; rollback not done"),
            ))
        }
        Action::Status => {
            if !has_template(&kind) {
                return Err(not_supported(&kind, "status"));
            }
            ctx.hit();
            let live = api.get(&name).await?;
            let n = |p: &str| live.data.pointer(p).and_then(Value::as_i64).unwrap_or(0);
            let generation = live.metadata.generation.unwrap_or(0);
            let observed = n("/status/observedGeneration");
            let (want, updated, available) = (
                n("/spec/replicas"),
                n("/status/updatedReplicas"),
                n("/status/availableReplicas"),
            );
            out.text = if observed < generation {
                format!("Waiting for {label} spec update to be observed...")
            } else if updated < want {
                format!(
                    "Waiting for {label} rollout to finish: {updated} out of {want} new replicas have been updated..."
                )
            } else if available < updated {
                format!(
                    "Waiting for {label} rollout to finish: {available} of {updated} updated replicas are available..."
                )
            } else {
                format!("{label} successfully rolled out")
            };
            out.object(&kind, serde_json::to_value(&live).unwrap_or_default());
            Ok(())
        }
    }
}

/// StatefulSet and DaemonSet history lives in ControllerRevisions: `history` lists those the
/// object controls; `undo` applies the target revision's data (a strategic merge patch that
/// replaces the pod template), as kubectl does.
async fn controller_revisions(
    ctx: &Ctx<'_>,
    kind: &KindRef,
    ns: &str,
    name: &str,
    action: Action,
    to_revision: i64,
    out: &mut Output,
) -> OpResult<()> {
    let label = format!("{}.{}/{name}", kind.plural, kind.group);
    let api = ctx.api(kind, ns);
    let cr_kind = KindRef {
        group: "apps".into(),
        version: "v1".into(),
        kind: "ControllerRevision".into(),
        plural: "controllerrevisions".into(),
        namespaced: true,
    };
    ctx.hit();
    let live = api.get(name).await?;
    let uid = live.metadata.uid.clone().unwrap_or_default();
    ctx.hit();
    let mut revisions: Vec<(i64, String, DynamicObject)> = ctx
        .api(&cr_kind, ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|cr| {
            cr.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|r| r.uid == uid && r.controller == Some(true)))
        })
        .map(|cr| {
            let rev = cr.data.get("revision").and_then(Value::as_i64).unwrap_or(0);
            let cause = cr
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CHANGE_CAUSE))
                .cloned()
                .unwrap_or_default();
            (rev, cause, cr)
        })
        .collect();
    revisions.sort_by_key(|(r, _, _)| *r);
    if action == Action::History {
        out.text = history_text(kind, name, &revisions);
        for (_, _, cr) in &revisions {
            out.object(&cr_kind, serde_json::to_value(cr).unwrap_or_default());
        }
        return Ok(());
    }
    let target = if to_revision > 0 {
        revisions.iter().find(|(r, _, _)| *r == to_revision)
    } else {
        revisions.iter().rev().nth(1)
    };
    let Some((rev, _, cr)) = target else {
        return Err(if to_revision > 0 {
            Failure::not_found(format!(
                "unable to find specified revision {to_revision} in history"
            ))
        } else {
            Failure::bad_request(
                "no rollout history found: there is no previous revision to roll back to",
            )
        });
    };
    let patch = cr.data.get("data").cloned().unwrap_or(Value::Null);
    if !patch.is_object() {
        return Err(Failure::bad_request(format!(
            "revision {rev} of {label} holds no data to roll back to"
        )));
    }
    ctx.hit();
    let result = api
        .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    out.text = format!("{label} rolled back");
    out.object(kind, serde_json::to_value(&result).unwrap_or_default());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_follows_controlled_replica_sets() {
        let d: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "uid": "d1"}
        }))
        .unwrap();
        let rs = |name: &str, rev: &str, owner: &str| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": name, "annotations": {REVISION: rev, CHANGE_CAUSE: format!("c{rev}")},
                  "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": owner, "controller": true}]}
            }))
            .unwrap()
        };
        let h = history_of(
            &d,
            &[
                rs("b", "2", "d1"),
                rs("a", "1", "d1"),
                rs("x", "3", "other"),
            ],
        );
        assert_eq!(h.iter().map(|(r, _, _)| *r).collect::<Vec<_>>(), [1, 2]);
        let kind = KindRef {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            plural: "deployments".into(),
            namespaced: true,
        };
        let text = history_text(&kind, "web", &h);
        assert!(
            text.contains("REVISION  CHANGE-CAUSE\n1         c1\n2         c2\n"),
            "{text}"
        );
    }
}
