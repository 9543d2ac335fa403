//! apply (server-side or client-side), create, replace, patch and scale.

use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use scale_agent_proto::v1;
use serde_json::{Map, Value, json};

use super::{CONFLICT_RETRIES, Ctx, FIELD_MANAGER, Failure, OpResult, Output};
use crate::{convert::LAST_APPLIED, kinds::KindRef};

/// Splits manifests into objects: a JSON array or a `List` contributes its items.
pub fn documents(manifests: &[Vec<u8>]) -> OpResult<Vec<Value>> {
    let mut out = Vec::new();
    for (i, bytes) in manifests.iter().enumerate() {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            Failure::bad_request(format!("manifest {} is not valid JSON: {e}", i + 1))
        })?;
        let mut stack = vec![value];
        while let Some(v) = stack.pop() {
            match v {
                Value::Array(items) => stack.extend(items.into_iter().rev()),
                Value::Object(ref m)
                    if m.get("kind").and_then(Value::as_str) == Some("List")
                        || m.get("kind")
                            .and_then(Value::as_str)
                            .is_some_and(|k| k.ends_with("List") && m.contains_key("items")) =>
                {
                    let items = m
                        .get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    stack.extend(items.into_iter().rev());
                }
                Value::Object(_) => out.push(v),
                Value::Null => {}
                _ => {
                    return Err(Failure::bad_request(format!(
                        "manifest {} is not an object",
                        i + 1
                    )));
                }
            }
        }
    }
    if out.is_empty() {
        return Err(Failure::bad_request("no manifests to act on"));
    }
    Ok(out)
}

/// Kind, namespace and name of a manifest.
async fn identify(
    ctx: &Ctx<'_>,
    doc: &mut Value,
    default_namespace: &str,
    need_name: bool,
) -> OpResult<(KindRef, String, String)> {
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if api_version.is_empty() || kind.is_empty() {
        return Err(Failure::bad_request(
            "a manifest needs apiVersion and kind (Object 'Kind' is missing)",
        ));
    }
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), api_version.clone()),
    };
    let selector = v1::KindSelector {
        group,
        version,
        kind,
    };
    let kind = ctx.resolve(Some(&selector)).await?;
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if need_name && name.is_empty() {
        return Err(Failure::bad_request(format!(
            "a {} manifest needs metadata.name",
            kind.kind
        )));
    }
    let given = doc
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let ns = Ctx::namespace_for(
        &kind,
        if given.is_empty() {
            default_namespace
        } else {
            &given
        },
    );
    if kind.namespaced
        && let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut)
    {
        meta.insert("namespace".into(), Value::String(ns.clone()));
    }
    Ok((kind, ns, name))
}

fn manager(fm: &str) -> String {
    if fm.is_empty() {
        FIELD_MANAGER.into()
    } else {
        fm.into()
    }
}

fn to_dynamic(v: &Value) -> OpResult<DynamicObject> {
    serde_json::from_value(v.clone())
        .map_err(|e| Failure::bad_request(format!("invalid object: {e}")))
}

fn to_value(o: &DynamicObject) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}

pub async fn apply(ctx: &Ctx<'_>, op: v1::ApplyOp, out: &mut Output) -> OpResult<()> {
    let docs = documents(&op.manifests_json)?;
    let fm = manager(&op.field_manager);
    for mut doc in docs {
        let (kind, ns, name) = identify(ctx, &mut doc, &op.default_namespace, true).await?;
        let api = ctx.api(&kind, &ns);
        let result = if op.client_side {
            client_side_apply(ctx, &api, &name, doc, &fm, op.dry_run).await?
        } else {
            let mut pp = PatchParams::apply(&fm);
            pp.force = op.force;
            pp.dry_run = op.dry_run;
            ctx.hit();
            api.patch(&name, &pp, &Patch::Apply(&doc)).await?
        };
        out.object(&kind, to_value(&result));
    }
    Ok(())
}

/// The merge patch that turns `last` into `new`: everything in `new`, and null for what
/// `last` had and `new` dropped (recursively through objects).
pub fn three_way(last: &Value, new: &Value) -> Value {
    match (last, new) {
        (Value::Object(l), Value::Object(n)) => {
            let mut patch = Map::new();
            for (k, nv) in n {
                let p = match l.get(k) {
                    Some(lv) => three_way(lv, nv),
                    None => nv.clone(),
                };
                patch.insert(k.clone(), p);
            }
            for k in l.keys() {
                if !n.contains_key(k) {
                    patch.insert(k.clone(), Value::Null);
                }
            }
            Value::Object(patch)
        }
        (_, n) => n.clone(),
    }
}

async fn client_side_apply(
    ctx: &Ctx<'_>,
    api: &kube::Api<DynamicObject>,
    name: &str,
    mut doc: Value,
    fm: &str,
    dry_run: bool,
) -> OpResult<DynamicObject> {
    // The annotation holds the manifest without the annotation itself.
    if let Some(a) = doc
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.remove(LAST_APPLIED);
    }
    let applied = serde_json::to_string(&doc).unwrap_or_default();
    if let Some(m) = doc.as_object_mut() {
        let meta = m.entry("metadata").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
            if let Some(a) = annotations.as_object_mut() {
                a.insert(LAST_APPLIED.into(), Value::String(applied));
            }
        }
    }
    ctx.hit();
    let current = api.get_opt(name).await?;
    let pp = PostParams {
        dry_run,
        field_manager: Some(fm.to_string()),
    };
    match current {
        None => Ok(api.create(&pp, &to_dynamic(&doc)?).await?),
        Some(live) => {
            let last: Value = live
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(LAST_APPLIED))
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or_else(|| json!({}));
            let patch = three_way(&last, &doc);
            let params = PatchParams {
                field_manager: Some(fm.to_string()),
                dry_run,
                ..PatchParams::default()
            };
            Ok(api.patch(name, &params, &Patch::Merge(&patch)).await?)
        }
    }
}

pub async fn create(ctx: &Ctx<'_>, op: v1::CreateOp, out: &mut Output) -> OpResult<()> {
    let docs = documents(&op.manifests_json)?;
    let pp = PostParams {
        dry_run: op.dry_run,
        field_manager: Some(manager(&op.field_manager)),
    };
    for mut doc in docs {
        let (kind, ns, _) = identify(ctx, &mut doc, &op.default_namespace, false).await?;
        let api = ctx.api(&kind, &ns);
        ctx.hit();
        let created = api.create(&pp, &to_dynamic(&doc)?).await?;
        out.object(&kind, to_value(&created));
    }
    out.code = 201;
    Ok(())
}

pub async fn replace(ctx: &Ctx<'_>, op: v1::ReplaceOp, out: &mut Output) -> OpResult<()> {
    let docs = documents(&op.manifests_json)?;
    let pp = PostParams {
        dry_run: op.dry_run,
        field_manager: Some(manager(&op.field_manager)),
    };
    for mut doc in docs {
        let (kind, ns, name) = identify(ctx, &mut doc, &op.default_namespace, true).await?;
        let api = ctx.api(&kind, &ns);
        let mut obj = to_dynamic(&doc)?;
        if obj.metadata.resource_version.is_none() {
            ctx.hit();
            let live = api.get(&name).await?;
            obj.metadata.resource_version = live.metadata.resource_version;
        }
        ctx.hit();
        let replaced = api.replace(&name, &pp, &obj).await?;
        out.object(&kind, to_value(&replaced));
    }
    Ok(())
}

pub async fn patch(ctx: &Ctx<'_>, op: v1::PatchOp, out: &mut Output) -> OpResult<()> {
    use v1::patch_op::Type;
    let (kind, ns, name) = ctx.target(op.target.as_ref()).await?;
    let api = ctx.api(&kind, &ns);
    let body: Value = serde_json::from_slice(&op.patch_json)
        .map_err(|e| Failure::bad_request(format!("the patch is not valid JSON: {e}")))?;
    let mut pp = PatchParams::default();
    if !op.field_manager.is_empty() {
        pp.field_manager = Some(op.field_manager.clone());
    }
    let ty = Type::try_from(op.r#type).unwrap_or(Type::Strategic);
    ctx.hit();
    let result: DynamicObject = match ty {
        Type::Json => {
            if !body.is_array() {
                return Err(Failure::bad_request(
                    "a json patch is an array of operations",
                ));
            }
            let request = kube::core::Request::new(api.resource_url());
            let mut req = if op.subresource.is_empty() {
                request.patch(&name, &pp, &Patch::Merge(&body))
            } else {
                request.patch_subresource(&op.subresource, &name, &pp, &Patch::Merge(&body))
            }
            .map_err(|e| Failure::bad_request(e.to_string()))?;
            *req.body_mut() = op.patch_json.clone();
            req.headers_mut().insert(
                "content-type",
                "application/json-patch+json"
                    .parse()
                    .map_err(|_| Failure::bad_request("content type"))?,
            );
            ctx.client().request(req).await?
        }
        Type::Apply => {
            let mut ap = PatchParams::apply(&manager(&op.field_manager));
            ap.force = op.force;
            if op.subresource.is_empty() {
                api.patch(&name, &ap, &Patch::Apply(&body)).await?
            } else {
                api.patch_subresource(&op.subresource, &name, &ap, &Patch::Apply(&body))
                    .await?
            }
        }
        Type::Merge => {
            if op.subresource.is_empty() {
                api.patch(&name, &pp, &Patch::Merge(&body)).await?
            } else {
                api.patch_subresource(&op.subresource, &name, &pp, &Patch::Merge(&body))
                    .await?
            }
        }
        Type::Strategic | Type::Unspecified => {
            if op.subresource.is_empty() {
                api.patch(&name, &pp, &Patch::Strategic(&body)).await?
            } else {
                api.patch_subresource(&op.subresource, &name, &pp, &Patch::Strategic(&body))
                    .await?
            }
        }
    };
    if op.subresource.is_empty() || op.subresource == "status" {
        out.object(&kind, to_value(&result));
    } else {
        out.text = serde_json::to_string(&result).unwrap_or_default();
    }
    Ok(())
}

pub async fn scale(ctx: &Ctx<'_>, op: v1::ScaleOp, out: &mut Output) -> OpResult<()> {
    let (kind, ns, name) = ctx.target(op.target.as_ref()).await?;
    let api = ctx.api(&kind, &ns);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut patch = json!({ "spec": { "replicas": op.replicas } });
        if let Some(expected) = op.current_replicas {
            ctx.hit();
            let current = api.get_subresource("scale", &name).await?;
            let now = current
                .data
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if now != i64::from(expected) {
                return Err(Failure::new(
                    409,
                    "Conflict",
                    format!("Expected replicas to be {expected}, was {now}"),
                ));
            }
            // The resourceVersion makes the patch conditional: a change in between is a 409.
            patch["metadata"] = json!({ "resourceVersion": current.metadata.resource_version });
        }
        ctx.hit();
        match api
            .patch_subresource(
                "scale",
                &name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                out.text = format!("{}/{} scaled to {}", kind.plural, name, op.replicas);
                break;
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < CONFLICT_RETRIES => {
                tracing::debug!(%name, "scale met a conflict; retrying");
                continue;
            }
            Err(e) if matches!(&e, kube::Error::Api(s) if s.code == 404) => {
                // No scale subresource, or no object: say which.
                ctx.hit();
                api.get(&name).await?;
                return Err(Failure::bad_request(format!(
                    "{} {name:?} has no scale subresource: it cannot be scaled",
                    kind.kind
                )));
            }
            Err(e) => return Err(e.into()),
        }
    }
    ctx.hit();
    let parent = api.get(&name).await?;
    out.object(&kind, to_value(&parent));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_flatten_lists_and_arrays() {
        let docs = documents(&[
            br#"[{"kind":"A"},{"kind":"List","items":[{"kind":"B"},{"kind":"C"}]}]"#.to_vec(),
            br#"{"kind":"D"}"#.to_vec(),
        ])
        .unwrap();
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["A", "B", "C", "D"]);
        assert!(documents(&[b"nope".to_vec()]).is_err());
        assert!(documents(&[b"[]".to_vec()]).is_err());
    }

    #[test]
    fn three_way_removes_what_was_dropped() {
        let last = json!({"data": {"a": "1", "b": "2"}, "metadata": {"labels": {"x": "y"}}});
        let new = json!({"data": {"a": "3"}, "metadata": {}});
        assert_eq!(
            three_way(&last, &new),
            json!({"data": {"a": "3", "b": null}, "metadata": {"labels": null}})
        );
    }
}
