//! delete: by name or selectors, with propagation policy and grace period, optionally
//! waiting (within the deadline) until the objects are gone.

use std::time::Duration;

use kube::api::{DeleteParams, ListParams, PropagationPolicy};
use scale_agent_proto::v1;

use super::{Ctx, Failure, OpResult, Output, label};

/// How often a waiting delete looks again.
const POLL: Duration = Duration::from_millis(250);

pub async fn delete(ctx: &Ctx<'_>, op: v1::DeleteOp, out: &mut Output) -> OpResult<()> {
    let kind = ctx.resolve(op.kind.as_ref()).await?;
    let ns = if op.name.is_empty() && op.namespace.is_empty() {
        String::new()
    } else {
        Ctx::namespace_for(&kind, &op.namespace)
    };
    let api = ctx.api(&kind, &ns);
    let propagation_policy = match op.propagation_policy.as_str() {
        "" => None,
        "Foreground" => Some(PropagationPolicy::Foreground),
        "Background" => Some(PropagationPolicy::Background),
        "Orphan" => Some(PropagationPolicy::Orphan),
        other => {
            return Err(Failure::bad_request(format!(
                "propagationPolicy {other:?} must be Foreground, Background or Orphan"
            )));
        }
    };
    let dp = DeleteParams {
        propagation_policy,
        grace_period_seconds: op
            .grace_period_seconds
            .map(|g| u32::try_from(g.max(0)).unwrap_or(u32::MAX)),
        ..DeleteParams::default()
    };
    // (namespace, name) of each object to delete.
    let targets: Vec<(String, String)> = if op.name.is_empty() {
        let mut lp = ListParams::default();
        if !op.label_selector.is_empty() {
            lp = lp.labels(&op.label_selector);
        }
        if !op.field_selector.is_empty() {
            lp = lp.fields(&op.field_selector);
        }
        ctx.hit();
        api.list(&lp)
            .await?
            .items
            .into_iter()
            .map(|o| {
                (
                    o.metadata.namespace.unwrap_or_default(),
                    o.metadata.name.unwrap_or_default(),
                )
            })
            .collect()
    } else {
        vec![(ns.clone(), op.name.clone())]
    };
    // (namespace, name, uid) still to wait for.
    let mut waiting = Vec::new();
    for (object_ns, name) in targets {
        let api = ctx.api(&kind, &object_ns);
        ctx.hit();
        match api
            .delete(&name, &dp)
            .await
            .map(|e| e.either(Ok, |s| Err(Box::new(s))))
        {
            Ok(Ok(obj)) => {
                // Accepted; the object lives on (finalizers, foreground dependents, grace).
                let uid = obj.metadata.uid.clone().unwrap_or_default();
                out.object(&kind, serde_json::to_value(&obj).unwrap_or_default());
                if op.wait {
                    waiting.push((object_ns, name, uid));
                } else {
                    out.deleted.push((
                        label(&kind, &object_ns, &name),
                        kind.clone(),
                        String::new(),
                    ));
                }
            }
            Ok(Err(status)) => {
                let uid = status.details.map(|d| d.uid).unwrap_or_default();
                out.deleted
                    .push((label(&kind, &object_ns, &name), kind.clone(), uid));
            }
            Err(kube::Error::Api(s))
                if s.code == 404 && (op.ignore_not_found || op.name.is_empty()) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for (object_ns, name, uid) in waiting {
        let api = ctx.api(&kind, &object_ns);
        loop {
            ctx.hit();
            match api.get_opt(&name).await? {
                Some(o) if o.metadata.uid.as_deref() == Some(uid.as_str()) => {
                    tokio::time::sleep(POLL).await;
                }
                _ => break,
            }
        }
        // Gone: drop the terminating copy from the objects, report it deleted.
        out.objects.retain(|(_, v)| {
            v.pointer("/metadata/uid")
                .and_then(serde_json::Value::as_str)
                != Some(uid.as_str())
        });
        out.deleted
            .push((label(&kind, &object_ns, &name), kind.clone(), uid));
    }
    Ok(())
}
