//! HorizontalPodAutoscalers' cells (`printHorizontalPodAutoscaler`, autoscaling/v2 field
//! names), ported from Kubernetes 1.37's `pkg/printers/internalversion/printers.go`.

use serde_json::{Value, json};

use super::format::{int, string};

/// The row's cells: the target as `Kind/name`, the metrics, min and max, current replicas.
pub fn cells(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let min = match o.pointer("/spec/minReplicas").and_then(Value::as_i64) {
        Some(n) => n.to_string(),
        None => "<unset>".into(),
    };
    vec![
        name,
        json!(format!(
            "{}/{}",
            string(o.pointer("/spec/scaleTargetRef/kind")),
            string(o.pointer("/spec/scaleTargetRef/name"))
        )),
        json!(hpa_metrics(
            o.pointer("/spec/metrics"),
            o.pointer("/status/currentMetrics")
        )),
        json!(min),
        json!(int(o.pointer("/spec/maxReplicas"))),
        json!(int(o.pointer("/status/currentReplicas"))),
        age,
    ]
}

/// `formatHPAMetrics` (autoscaling/v2): each metric's current value over its target, at most
/// two, then `+ N more...`; quantities as the API server stored them (canonical strings).
fn hpa_metrics(specs: Option<&Value>, statuses: Option<&Value>) -> String {
    let specs = specs
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if specs.is_empty() {
        return "<none>".into();
    }
    let statuses = statuses
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    // Go's `(*Quantity).String()`: `<nil>` for a missing pointer, `0` for a zero value.
    let quantity = |v: Option<&Value>, missing: &str| match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => missing.to_string(),
    };
    let mut list = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let status = statuses.get(i);
        let source = |key: &str| -> (Option<&Value>, Option<&Value>) {
            (
                spec.get(key),
                status.and_then(|s| s.get(key)).filter(|s| !s.is_null()),
            )
        };
        let text = match string(spec.get("type")) {
            kind @ ("External" | "Object") => {
                let key = if kind == "External" {
                    "external"
                } else {
                    "object"
                };
                let (spec, status) = source(key);
                let target = spec.and_then(|s| s.get("target"));
                let current = status.and_then(|s| s.get("current"));
                match target
                    .and_then(|t| t.get("averageValue"))
                    .filter(|v| !v.is_null())
                {
                    Some(average) => {
                        let current = current
                            .and_then(|c| c.get("averageValue"))
                            .filter(|v| !v.is_null())
                            .map_or("<unknown>".to_string(), |v| quantity(Some(v), "0"));
                        format!("{current}/{} (avg)", quantity(Some(average), "0"))
                    }
                    None => {
                        let current = match status {
                            Some(_) => quantity(current.and_then(|c| c.get("value")), "<nil>"),
                            None => "<unknown>".into(),
                        };
                        format!(
                            "{current}/{}",
                            quantity(target.and_then(|t| t.get("value")), "<nil>")
                        )
                    }
                }
            }
            "Pods" => {
                let (spec, status) = source("pods");
                let current = match status {
                    Some(s) => quantity(s.pointer("/current/averageValue"), "<nil>"),
                    None => "<unknown>".into(),
                };
                format!(
                    "{current}/{}",
                    quantity(
                        spec.and_then(|s| s.pointer("/target/averageValue")),
                        "<nil>"
                    )
                )
            }
            kind @ ("Resource" | "ContainerResource") => {
                let key = if kind == "Resource" {
                    "resource"
                } else {
                    "containerResource"
                };
                let (spec, status) = source(key);
                let resource = string(spec.and_then(|s| s.get("name")));
                let target = spec.and_then(|s| s.get("target"));
                match target
                    .and_then(|t| t.get("averageValue"))
                    .filter(|v| !v.is_null())
                {
                    Some(average) => {
                        let current = match status {
                            Some(s) => quantity(s.pointer("/current/averageValue"), "<nil>"),
                            None => "<unknown>".into(),
                        };
                        format!("{resource}: {current}/{}", quantity(Some(average), "0"))
                    }
                    None => {
                        let current = status
                            .and_then(|s| s.pointer("/current/averageUtilization"))
                            .and_then(Value::as_i64)
                            .map_or("<unknown>".to_string(), |u| format!("{u}%"));
                        let target = target
                            .and_then(|t| t.get("averageUtilization"))
                            .and_then(Value::as_i64)
                            .map_or("<auto>".to_string(), |u| format!("{u}%"));
                        format!("{resource}: {current}/{target}")
                    }
                }
            }
            _ => "<unknown type>".into(),
        };
        list.push(text);
    }
    let count = list.len();
    if count > 2 {
        list.truncate(2);
        format!("{} + {} more...", list.join(", "), count - 2)
    } else {
        list.join(", ")
    }
}
