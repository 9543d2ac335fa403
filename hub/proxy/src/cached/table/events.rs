//! Events' cells (`printEvent`, Kubernetes 1.37's `pkg/printers/internalversion`), for core
//! Events and, under their other field names, `events.k8s.io` Events (sans-IO).

use jiff::Timestamp;
use serde_json::{Value, json};

use super::format::{self, int, string};

/// An `events.k8s.io/v1` Event under the core/v1 field names the printer reads (the API
/// server prints both from the same internal Event).
pub fn core_event_of(o: &Value) -> Value {
    let mut core = serde_json::Map::new();
    for (from, to) in [
        ("metadata", "metadata"),
        ("regarding", "involvedObject"),
        ("note", "message"),
        ("type", "type"),
        ("reason", "reason"),
        ("deprecatedSource", "source"),
        ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"),
        ("deprecatedCount", "count"),
        ("eventTime", "eventTime"),
        ("series", "series"),
        ("reportingController", "reportingComponent"),
        ("reportingInstance", "reportingInstance"),
    ] {
        if let Some(v) = o.get(from) {
            core.insert(to.into(), v.clone());
        }
    }
    Value::Object(core)
}

/// `printEvent` (core/v1 Events): last and first seen (the event time or the series' last
/// observation when set), the involved object as `kind/name`, the source, the count.
pub fn event(o: &Value, now: Timestamp) -> Vec<Value> {
    let seen = |t: Option<Timestamp>| match t {
        Some(t) => format::human_duration(now.duration_since(t)),
        None => "<unknown>".to_string(),
    };
    let first_time = format::timestamp(o.get("firstTimestamp"));
    let first = match first_time {
        Some(t) => seen(Some(t)),
        None => seen(format::timestamp(o.get("eventTime"))),
    };
    let mut last = match format::timestamp(o.get("lastTimestamp")) {
        Some(t) => seen(Some(t)),
        None => first.clone(),
    };
    let mut count = int(o.get("count"));
    match o.get("series").filter(|s| !s.is_null()) {
        Some(series) => {
            last = seen(format::timestamp(series.get("lastObservedTime")));
            count = int(series.get("count"));
        }
        None if count == 0 => count = 1,
        None => {}
    }
    let kind = string(o.pointer("/involvedObject/kind")).to_lowercase();
    let target = match string(o.pointer("/involvedObject/name")) {
        "" => kind,
        name => format!("{kind}/{name}"),
    };
    let first_non_empty = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            a.to_string()
        }
    };
    let component = first_non_empty(
        string(o.pointer("/source/component")),
        // The core/v1 JSON name of `ReportingController`.
        string(o.get("reportingComponent")),
    );
    let instance = first_non_empty(
        string(o.pointer("/source/host")),
        string(o.get("reportingInstance")),
    );
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last),
        json!(string(o.get("type"))),
        json!(string(o.get("reason"))),
        json!(target),
        json!(string(o.pointer("/involvedObject/fieldPath"))),
        json!(source),
        json!(string(o.get("message")).trim()),
        json!(first),
        json!(count),
        json!(string(o.pointer("/metadata/name"))),
    ]
}
