//! get, list, events and logs.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use scale_agent_proto::v1;
use serde_json::Value;

use super::{Ctx, Failure, OpResult, Output};
use crate::kinds::KindRef;

pub async fn get(ctx: &Ctx<'_>, op: v1::GetOp, out: &mut Output) -> OpResult<()> {
    let (kind, ns, name) = ctx.target(op.target.as_ref()).await?;
    ctx.hit();
    let obj = ctx.api(&kind, &ns).get(&name).await?;
    out.object(&kind, serde_json::to_value(&obj).unwrap_or_default());
    Ok(())
}

fn params(label: &str, field: &str, limit: u32) -> ListParams {
    let mut lp = ListParams::default();
    if !label.is_empty() {
        lp = lp.labels(label);
    }
    if !field.is_empty() {
        lp = lp.fields(field);
    }
    if limit > 0 {
        lp = lp.limit(limit);
    }
    lp
}

/// Items per request when a list names no limit: the API server sends the list in pages
/// (continue tokens) instead of building one response of every item.
const PAGE: u32 = 500;

/// A list: every item (fetched in pages), or with a limit one page and the continue token
/// of the next (`list_continue` starts from a previous page's token).
pub async fn list(
    ctx: &Ctx<'_>,
    op: v1::ListOp,
    list_continue: String,
    out: &mut Output,
) -> OpResult<()> {
    let kind = ctx.resolve(op.kind.as_ref()).await?;
    let ns = if kind.namespaced {
        op.namespace.clone()
    } else {
        String::new()
    };
    let api = ctx.api(&kind, &ns);
    let limit = if op.limit > 0 { op.limit } else { PAGE };
    let mut token = list_continue;
    loop {
        let mut lp = params(&op.label_selector, &op.field_selector, limit);
        if !token.is_empty() {
            lp = lp.continue_token(&token);
        }
        ctx.hit();
        let list = api.list(&lp).await?;
        for item in list.items {
            out.object(&kind, serde_json::to_value(&item).unwrap_or_default());
        }
        let next = list.metadata.continue_.unwrap_or_default();
        if op.limit > 0 {
            out.continue_token = next;
            return Ok(());
        }
        if next.is_empty() {
            return Ok(());
        }
        token = next;
    }
}

fn event_kind() -> KindRef {
    KindRef {
        group: String::new(),
        version: "v1".into(),
        kind: "Event".into(),
        plural: "events".into(),
        namespaced: true,
    }
}

pub async fn events(ctx: &Ctx<'_>, op: v1::EventsOp, out: &mut Output) -> OpResult<()> {
    let (kind, ns, name) = ctx.target(op.target.as_ref()).await?;
    let field = format!(
        "involvedObject.name={name},involvedObject.kind={}",
        kind.kind
    );
    let ek = event_kind();
    ctx.hit();
    let mut items = ctx.api(&ek, &ns).list(&params("", &field, 0)).await?.items;
    let when = |e: &kube::api::DynamicObject| {
        ["/lastTimestamp", "/eventTime", "/firstTimestamp"]
            .iter()
            .find_map(|p| {
                e.data
                    .pointer(p)
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .or_else(|| {
                e.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
            })
            .unwrap_or_default()
    };
    items.sort_by_key(when);
    let mut text = String::from("TYPE\tREASON\tOBJECT\tMESSAGE\n");
    for e in &items {
        let s = |p: &str| {
            e.data
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        text.push_str(&format!(
            "{}\t{}\t{}/{}\t{}\n",
            s("/type"),
            s("/reason"),
            kind.kind.to_ascii_lowercase(),
            name,
            s("/message")
        ));
        out.object(&ek, serde_json::to_value(e).unwrap_or_default());
    }
    out.text = text;
    Ok(())
}

fn log_params(op: &v1::LogsOp, container: Option<String>) -> LogParams {
    LogParams {
        container,
        tail_lines: op.tail_lines,
        since_seconds: op.since_seconds,
        previous: op.previous,
        timestamps: op.timestamps,
        limit_bytes: op.limit_bytes,
        ..LogParams::default()
    }
}

fn containers(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}

async fn pod_logs(
    ctx: &Ctx<'_>,
    pods: &Api<Pod>,
    pod: &Pod,
    op: &v1::LogsOp,
    prefix: bool,
) -> OpResult<String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let wanted: Vec<Option<String>> = if op.all_containers {
        containers(pod).into_iter().map(Some).collect()
    } else if !op.container.is_empty() {
        vec![Some(op.container.clone())]
    } else {
        vec![None]
    };
    let mut text = String::new();
    let many = prefix || wanted.len() > 1;
    for c in wanted {
        ctx.hit();
        let logs = pods.logs(&name, &log_params(op, c.clone())).await?;
        if many {
            for line in logs.lines() {
                text.push_str(&format!(
                    "[pod/{name}/{}] {line}\n",
                    c.as_deref().unwrap_or("")
                ));
            }
        } else {
            text.push_str(&logs);
        }
    }
    Ok(text)
}

/// Logs of a pod, or of the pods a Job, Deployment, ... selects (`spec.selector`).
pub async fn logs(ctx: &Ctx<'_>, op: v1::LogsOp, out: &mut Output) -> OpResult<()> {
    let (kind, ns, name) = ctx.target(op.target.as_ref()).await?;
    let pods: Api<Pod> = Api::namespaced(ctx.client(), &ns);
    if kind.group.is_empty() && kind.kind == "Pod" {
        ctx.hit();
        let pod = pods.get(&name).await?;
        out.text = pod_logs(ctx, &pods, &pod, &op, false).await?;
        return Ok(());
    }
    ctx.hit();
    let owner = ctx.api(&kind, &ns).get(&name).await?;
    let selector = owner
        .data
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .filter(|m| !m.is_empty())
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .ok_or_else(|| {
            Failure::bad_request(format!(
                "cannot get logs of {} {name:?}: it has no spec.selector.matchLabels to find its pods",
                kind.kind
            ))
        })?;
    ctx.hit();
    let mut list = pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    if list.is_empty() {
        return Err(Failure::not_found(format!(
            "no pods found for {}/{name} (selector {selector})",
            kind.kind.to_ascii_lowercase()
        )));
    }
    list.sort_by_key(|p| p.metadata.name.clone());
    let mut text = String::new();
    for pod in &list {
        text.push_str(&pod_logs(ctx, &pods, pod, &op, true).await?);
    }
    out.text = text;
    Ok(())
}
