//! The API server's cell formatting (sans-IO), ported from Kubernetes 1.37: ages
//! (`duration.HumanDuration`), label maps (`labels.FormatLabels`), label selectors
//! (`metav1.FormatLabelSelector`), container names and images (`layoutContainerCells`),
//! service ports (`makePortString`) and load-balancer addresses.

use jiff::{SignedDuration, Timestamp};
use serde_json::Value;

/// `duration.HumanDuration`: an elapsed time as `kubectl get` prints it.
pub fn human_duration(d: SignedDuration) -> String {
    // Go: `int(d.Seconds())`, truncated towards zero; up to 2 s in the future is "now".
    let seconds = d.as_secs();
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// A timestamp field (RFC 3339), `None` when absent, null or unparsable (Go's zero time).
pub fn timestamp(value: Option<&Value>) -> Option<Timestamp> {
    value.and_then(Value::as_str).and_then(|s| s.parse().ok())
}

/// `translateTimestampSince`: the age of a timestamp at `now`, `<unknown>` without one.
pub fn since(value: Option<&Value>, now: Timestamp) -> String {
    match timestamp(value) {
        Some(t) => human_duration(now.duration_since(t)),
        None => "<unknown>".into(),
    }
}

/// `Time.UTC().Format(time.RFC3339)` of a timestamp field: Go formats the zero time too,
/// `0001-01-01T00:00:00Z`.
pub fn rfc3339(value: Option<&Value>) -> String {
    timestamp(value)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| "0001-01-01T00:00:00Z".into())
}

/// `labels.FormatLabels`: `k=v,...` sorted by key, `<none>` for none.
pub fn labels(map: Option<&Value>) -> String {
    let mut pairs: Vec<(&str, &str)> = map
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    pairs.sort_unstable();
    let joined = pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    if joined.is_empty() {
        "<none>".into()
    } else {
        joined
    }
}

/// `metav1.LabelSelectorAsSelector(selector).String()`: requirements sorted by key,
/// `matchLabels` as `k=v`, expressions as `k in (a,b)`, `k notin (a,b)`, `k`, `!k`; `""` for
/// no selector or an empty one, `None` for an operator the API server refuses too.
pub fn label_selector(selector: Option<&Value>) -> Option<String> {
    let Some(selector) = selector.filter(|s| !s.is_null()) else {
        return Some(String::new());
    };
    let mut requirements: Vec<(String, String)> = Vec::new();
    if let Some(m) = selector.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            requirements.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or_default())));
        }
    }
    if let Some(exprs) = selector.get("matchExpressions").and_then(Value::as_array) {
        for e in exprs {
            let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
            let mut values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            values.sort_unstable();
            let text = match e.get("operator").and_then(Value::as_str) {
                Some("In") => format!("{key} in ({})", values.join(",")),
                Some("NotIn") => format!("{key} notin ({})", values.join(",")),
                Some("Exists") => key.to_string(),
                Some("DoesNotExist") => format!("!{key}"),
                _ => return None,
            };
            requirements.push((key.to_string(), text));
        }
    }
    // Go sorts by key only (`sort.Sort(ByKey)`); a stable sort keeps ties as declared.
    requirements.sort_by(|a, b| a.0.cmp(&b.0));
    Some(
        requirements
            .into_iter()
            .map(|(_, text)| text)
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// `metav1.FormatLabelSelector`: [`label_selector`], `<none>` for empty, `<error>` for an
/// invalid one.
pub fn format_label_selector(selector: Option<&Value>) -> String {
    match label_selector(selector) {
        Some(s) if s.is_empty() => "<none>".into(),
        Some(s) => s,
        None => "<error>".into(),
    }
}

/// `layoutContainerCells`: the containers' names and images, comma-separated.
pub fn containers(containers: Option<&Value>) -> (String, String) {
    let list = containers
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let field = |f: &str| {
        list.iter()
            .map(|c| c.get(f).and_then(Value::as_str).unwrap_or_default())
            .collect::<Vec<_>>()
            .join(",")
    };
    (field("name"), field("image"))
}

/// `makePortString`: `port/PROTOCOL` or `port:nodePort/PROTOCOL`, comma-separated.
pub fn service_ports(ports: Option<&Value>) -> String {
    ports
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let port = int(p.get("port"));
            let protocol = p
                .get("protocol")
                .and_then(Value::as_str)
                .unwrap_or_default();
            match int(p.get("nodePort")) {
                n if n > 0 => format!("{port}:{n}/{protocol}"),
                _ => format!("{port}/{protocol}"),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `loadBalancerStatusStringer`: the distinct IPs (else hostnames) sorted, clipped to 16
/// bytes unless `wide` (the API server renders Tables wide).
pub fn load_balancer(status: Option<&Value>, wide: bool) -> String {
    let mut found: Vec<&str> = status
        .and_then(|s| s.get("ingress"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|i| {
            let ip = i.get("ip").and_then(Value::as_str).unwrap_or_default();
            let host = i
                .get("hostname")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !ip.is_empty() {
                Some(ip)
            } else if !host.is_empty() {
                Some(host)
            } else {
                None
            }
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    let joined = found.join(",");
    if !wide && joined.len() > 16 {
        // Go slices bytes; addresses and hostnames are ASCII.
        format!("{}...", joined.get(..13).unwrap_or(&joined))
    } else {
        joined
    }
}

/// An integer field, 0 when absent (Go's zero value).
pub fn int(value: Option<&Value>) -> i64 {
    value.and_then(Value::as_i64).unwrap_or_default()
}

/// A string field, "" when absent.
pub fn string(value: Option<&Value>) -> &str {
    value.and_then(Value::as_str).unwrap_or_default()
}

/// `intstr.IntOrString.String()`.
pub fn int_or_string(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.as_i64().unwrap_or_default().to_string(),
    }
}

/// `printBoolPtr`: `True`/`False`, `<unset>` when absent.
pub fn bool_ptr(value: Option<&Value>) -> String {
    match value.and_then(Value::as_bool) {
        Some(true) => "True".into(),
        Some(false) => "False".into(),
        None => "<unset>".into(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ages_as_the_api_server_prints_them() {
        let s = SignedDuration::from_secs;
        for (secs, text) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (599, "9m59s"),
            (600, "10m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60 * 7, "3h7m"),
            (8 * 3600, "8h"),
            (47 * 3600 + 59 * 60, "47h"),
            (48 * 3600, "2d"),
            (50 * 3600, "2d2h"),
            (8 * 86400, "8d"),
            (729 * 86400, "729d"),
            (730 * 86400, "2y"),
            (731 * 86400, "2y1d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(human_duration(s(secs)), text, "{secs}s");
        }
        // Fractions are truncated like Go's int(d.Seconds()).
        assert_eq!(human_duration(SignedDuration::from_millis(1999)), "1s");
        let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        assert_eq!(since(Some(&json!("2026-01-01T00:00:00Z")), now), "10m");
        assert_eq!(since(None, now), "<unknown>");
        assert_eq!(since(Some(&Value::Null), now), "<unknown>");
    }

    #[test]
    fn labels_and_selectors() {
        assert_eq!(labels(Some(&json!({"b": "2", "a": "1"}))), "a=1,b=2");
        assert_eq!(labels(Some(&json!({}))), "<none>");
        assert_eq!(labels(None), "<none>");
        let selector = json!({
            "matchLabels": {"tier": "web", "app": "x"},
            "matchExpressions": [
                {"key": "env", "operator": "In", "values": ["prod", "dev"]},
                {"key": "zone", "operator": "NotIn", "values": ["b"]},
                {"key": "gpu", "operator": "Exists"},
                {"key": "old", "operator": "DoesNotExist"},
            ],
        });
        assert_eq!(
            format_label_selector(Some(&selector)),
            "app=x,env in (dev,prod),gpu,!old,tier=web,zone notin (b)"
        );
        assert_eq!(format_label_selector(Some(&json!({}))), "<none>");
        assert_eq!(format_label_selector(None), "<none>");
        assert_eq!(
            format_label_selector(Some(
                &json!({"matchExpressions": [{"key": "a", "operator": "Near"}]})
            )),
            "<error>"
        );
        assert_eq!(label_selector(None), Some(String::new()));
    }

    #[test]
    fn containers_ports_and_addresses() {
        assert_eq!(
            containers(Some(&json!([
                {"name": "web", "image": "nginx:1.27"},
                {"name": "sidecar", "image": "envoy"},
            ]))),
            ("web,sidecar".to_string(), "nginx:1.27,envoy".to_string())
        );
        assert_eq!(containers(None), (String::new(), String::new()));
        assert_eq!(
            service_ports(Some(&json!([
                {"port": 80, "protocol": "TCP"},
                {"port": 53, "nodePort": 30053, "protocol": "UDP"},
            ]))),
            "80/TCP,53:30053/UDP"
        );
        assert_eq!(service_ports(Some(&json!([]))), "");
        let status = json!({"ingress": [
            {"ip": "10.0.0.2"}, {"hostname": "lb.example.com"}, {"ip": "10.0.0.2"},
        ]});
        assert_eq!(
            load_balancer(Some(&status), true),
            "10.0.0.2,lb.example.com"
        );
        assert_eq!(load_balancer(Some(&status), false), "10.0.0.2,lb.e...");
        assert_eq!(int_or_string(&json!("25%")), "25%");
        assert_eq!(int_or_string(&json!(2)), "2");
        assert_eq!(bool_ptr(Some(&json!(false))), "False");
        assert_eq!(bool_ptr(None), "<unset>");
    }
}
