//! The Pod printer's cells (`printPod` of Kubernetes 1.37, sans-IO): READY with restartable
//! init containers, the aggregate status reason, RESTARTS with the last one's age, the wide
//! cells, and the Completed row condition of finished pods.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::format::{self, int, since, string};

/// The first condition of `kind`: whether it is True (`None` when there is none).
pub(super) fn condition_true(conditions: Option<&Value>, kind: &str) -> Option<bool> {
    conditions
        .and_then(Value::as_array)?
        .iter()
        .find(|c| string(c.get("type")) == kind)
        .map(|c| string(c.get("status")) == "True")
}

/// `printPod`: Ready x/y, the aggregate status, restarts with the last one's age, and the
/// wide cells; Succeeded and Failed pods carry a Completed row condition.
pub fn cells(o: &Value, now: Timestamp) -> (Vec<Value>, Option<Value>) {
    let spec = o.get("spec").unwrap_or(&Value::Null);
    let status = o.get("status").unwrap_or(&Value::Null);
    let conditions = status.get("conditions");
    let phase = string(status.get("phase"));
    let mut reason = match string(status.get("reason")) {
        "" => phase.to_string(),
        r => r.to_string(),
    };
    for c in conditions.and_then(Value::as_array).into_iter().flatten() {
        if string(c.get("type")) == "PodScheduled" && string(c.get("reason")) == "SchedulingGated" {
            reason = "SchedulingGated".into();
        }
    }
    let row_conditions = match phase {
        "Succeeded" => Some(
            json!([{"type": "Completed", "status": "True", "reason": "Succeeded", "message": "The pod has completed successfully."}]),
        ),
        "Failed" => Some(
            json!([{"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}]),
        ),
        _ => None,
    };
    let list = |v: Option<&Value>| v.and_then(Value::as_array).cloned().unwrap_or_default();
    let init_containers = list(spec.get("initContainers"));
    let restartable = |name: &str| {
        init_containers
            .iter()
            .any(|c| string(c.get("name")) == name && string(c.get("restartPolicy")) == "Always")
    };
    let total = list(spec.get("containers")).len()
        + init_containers
            .iter()
            .filter(|c| string(c.get("restartPolicy")) == "Always")
            .count();
    let mut ready = 0usize;
    let mut restarts = 0i64;
    let mut restartable_restarts = 0i64;
    let mut last_restart: Option<Timestamp> = None;
    let mut last_restartable_restart: Option<Timestamp> = None;
    let later = |a: Option<Timestamp>, b: Option<Timestamp>| match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let finished = |c: &Value| format::timestamp(c.pointer("/lastState/terminated/finishedAt"));
    let mut initializing = false;
    let init_statuses = list(status.get("initContainerStatuses"));
    for (i, c) in init_statuses.iter().enumerate() {
        let count = int(c.get("restartCount"));
        restarts += count;
        last_restart = later(last_restart, finished(c));
        let is_restartable = restartable(string(c.get("name")));
        if is_restartable {
            restartable_restarts += count;
            last_restartable_restart = later(last_restartable_restart, finished(c));
        }
        let terminated = c.pointer("/state/terminated").filter(|t| !t.is_null());
        let waiting_reason = string(c.pointer("/state/waiting/reason"));
        if let Some(t) = terminated
            && int(t.get("exitCode")) == 0
        {
            continue;
        }
        if is_restartable && c.get("started").and_then(Value::as_bool) == Some(true) {
            if c.get("ready").and_then(Value::as_bool) == Some(true) {
                ready += 1;
            }
            continue;
        }
        if let Some(t) = terminated {
            reason = match string(t.get("reason")) {
                "" if int(t.get("signal")) != 0 => format!("Init:Signal:{}", int(t.get("signal"))),
                "" => format!("Init:ExitCode:{}", int(t.get("exitCode"))),
                r => format!("Init:{r}"),
            };
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            reason = format!("Init:{waiting_reason}");
        } else {
            reason = format!("Init:{i}/{}", init_containers.len());
        }
        initializing = true;
        break;
    }
    if !initializing || condition_true(conditions, "Initialized") == Some(true) {
        restarts = restartable_restarts;
        last_restart = last_restartable_restart;
        let mut has_running = false;
        let mut error_reason = String::new();
        for c in list(status.get("containerStatuses")).iter().rev() {
            restarts += int(c.get("restartCount"));
            last_restart = later(last_restart, finished(c));
            let waiting_reason = string(c.pointer("/state/waiting/reason"));
            let terminated = c.pointer("/state/terminated").filter(|t| !t.is_null());
            let running = c.pointer("/state/running").is_some_and(|r| !r.is_null());
            if c.pointer("/state/waiting").is_some_and(|w| !w.is_null())
                && !waiting_reason.is_empty()
            {
                reason = waiting_reason.to_string();
            } else if let Some(t) = terminated {
                reason = match string(t.get("reason")) {
                    "" if int(t.get("signal")) != 0 => format!("Signal:{}", int(t.get("signal"))),
                    "" => format!("ExitCode:{}", int(t.get("exitCode"))),
                    r => r.to_string(),
                };
                if int(t.get("exitCode")) != 0 {
                    error_reason = reason.clone();
                }
            } else if c.get("ready").and_then(Value::as_bool) == Some(true) && running {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" {
            if has_running && condition_true_any(conditions, "Ready") {
                reason = "Running".into();
            } else if !error_reason.is_empty() {
                reason = error_reason;
            } else if has_running {
                reason = "NotReady".into();
            }
        }
    }
    let deleting = o
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|d| !d.is_null());
    if deleting && string(status.get("reason")) == "NodeLost" {
        reason = "Unknown".into();
    } else if deleting && phase != "Failed" && phase != "Succeeded" {
        reason = "Terminating".into();
    }
    let restarts_text = match last_restart {
        Some(t) if restarts != 0 => {
            format!(
                "{restarts} ({} ago)",
                format::human_duration(now.duration_since(t))
            )
        }
        _ => restarts.to_string(),
    };
    let or_none = |s: &str| {
        if s.is_empty() {
            "<none>".to_string()
        } else {
            s.to_string()
        }
    };
    let gates = list(spec.get("readinessGates"));
    let readiness_gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let true_count = gates
            .iter()
            .filter(|g| condition_true(conditions, string(g.get("conditionType"))) == Some(true))
            .count();
        format!("{true_count}/{}", gates.len())
    };
    let cells = vec![
        json!(string(o.pointer("/metadata/name"))),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts_text),
        json!(since(o.pointer("/metadata/creationTimestamp"), now)),
        json!(or_none(string(status.pointer("/podIPs/0/ip")))),
        json!(or_none(string(spec.get("nodeName")))),
        json!(or_none(string(status.get("nominatedNodeName")))),
        json!(readiness_gates),
    ];
    (cells, row_conditions)
}

/// `hasPodReadyCondition`: any Ready condition that is True (unlike the first-match lookups).
fn condition_true_any(conditions: Option<&Value>, kind: &str) -> bool {
    conditions
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| string(c.get("type")) == kind && string(c.get("status")) == "True")
}
