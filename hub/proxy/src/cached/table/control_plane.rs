//! Cells of the kinds that describe the cluster itself rather than workloads:
//! CustomResourceDefinitions (apiextensions-apiserver's own convertor), APIServices
//! (kube-aggregator's), CertificateSigningRequests, ControllerRevisions and ResourceQuotas
//! (`pkg/printers/internalversion/printers.go`), StorageVersionMigrations (the same), all of
//! Kubernetes 1.37 (sans-IO).

use jiff::SignedDuration;
use serde_json::{Value, json};

use super::format::{self, string};

fn array(value: Option<&Value>) -> &[Value] {
    value
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The first condition of a type (Go's `getCondition` and loops that stop at the first).
fn condition<'a>(conditions: Option<&'a Value>, kind: &str) -> Option<&'a Value> {
    array(conditions)
        .iter()
        .find(|c| string(c.get("type")) == kind)
}

/// The CRDs' Table: scope, the served versions (`(storage)` marked) sorted, the creation
/// time in RFC 3339, and the wide group, kind, short names and Established.
pub fn custom_resource_definition(o: &Value, name: Value) -> Vec<Value> {
    let mut versions: Vec<String> = array(o.pointer("/spec/versions"))
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool) == Some(true))
        .map(|v| {
            let mut label = string(v.get("name")).to_string();
            if v.get("storage").and_then(Value::as_bool) == Some(true) {
                label.push_str("(storage)");
            }
            label
        })
        .collect();
    versions.sort();
    let short_names: Vec<&str> = array(o.pointer("/spec/names/shortNames"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let established = array(o.pointer("/status/conditions"))
        .iter()
        .any(|c| string(c.get("type")) == "Established" && string(c.get("status")) == "True");
    vec![
        name,
        json!(string(o.pointer("/spec/scope"))),
        json!(versions.join(",")),
        json!(format::rfc3339(o.pointer("/metadata/creationTimestamp"))),
        json!(string(o.pointer("/spec/group"))),
        json!(string(o.pointer("/spec/names/kind"))),
        json!(short_names.join(",")),
        json!(established),
    ]
}

/// APIServices' Table: the backing service as `namespace/name` (`Local` for none), the
/// Available condition (`False (Reason)` when not true and a reason is given).
pub fn api_service(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let service = match o.pointer("/spec/service") {
        Some(s) if !s.is_null() => {
            format!("{}/{}", string(s.get("namespace")), string(s.get("name")))
        }
        _ => "Local".into(),
    };
    let available = match condition(o.pointer("/status/conditions"), "Available") {
        None => "Unknown".to_string(),
        Some(c) => {
            let (status, reason) = (string(c.get("status")), string(c.get("reason")));
            if status != "True" && !reason.is_empty() {
                format!("{status} ({reason})")
            } else {
                status.to_string()
            }
        }
    };
    vec![name, json!(service), json!(available), age]
}

/// `printCertificateSigningRequest`: signer (`<none>` for empty), the requesting user, the
/// requested duration, and the condition (`extractCSRStatus`).
pub fn certificate_signing_request(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let has = |kind: &str| condition(o.pointer("/status/conditions"), kind).is_some();
    let mut status = if has("Denied") {
        "Denied"
    } else if has("Approved") {
        "Approved"
    } else {
        "Pending"
    }
    .to_string();
    if has("Failed") {
        status.push_str(",Failed");
    }
    if !string(o.pointer("/status/certificate")).is_empty() {
        status.push_str(",Issued");
    }
    let signer = match string(o.pointer("/spec/signerName")) {
        "" => "<none>",
        s => s,
    };
    let duration = match o.pointer("/spec/expirationSeconds").and_then(Value::as_i64) {
        Some(s) => format::human_duration(SignedDuration::from_secs(s)),
        None => "<none>".into(),
    };
    vec![
        name,
        age,
        json!(signer),
        json!(string(o.pointer("/spec/username"))),
        json!(duration),
        json!(status),
    ]
}

/// `printControllerRevision`: the controlling owner as `kind.group/name` in lower case
/// (`<none>` without one), the revision number.
pub fn controller_revision(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let owner = array(o.pointer("/metadata/ownerReferences"))
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true));
    let controller = match owner {
        None => "<none>".to_string(),
        Some(r) => {
            // `schema.ParseGroupVersion`: "v1" has no group, "apps/v1" the group "apps".
            let group = string(r.get("apiVersion"))
                .split_once('/')
                .map_or("", |(group, _)| group);
            let kind = string(r.get("kind"));
            let owner_name = string(r.get("name"));
            match (kind, group) {
                ("", "") => owner_name.to_string(),
                (kind, "") => format!("{}/{owner_name}", kind.to_lowercase()),
                (kind, group) => {
                    let kind_group = format!("{kind}.{group}").to_lowercase();
                    format!("{kind_group}/{owner_name}")
                }
            }
        }
    };
    vec![
        name,
        json!(controller),
        json!(format::int(o.get("revision"))),
        age,
    ]
}

/// `printResourceQuota`: `resource: used/hard` for every hard limit sorted by name,
/// `limits.*` in the Limit column, the rest in Request.
pub fn resource_quota(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let hard = o.pointer("/status/hard").and_then(Value::as_object);
    let used = o.pointer("/status/used");
    let mut resources: Vec<(&String, &Value)> = hard.into_iter().flatten().collect();
    resources.sort_by(|a, b| a.0.cmp(b.0));
    let (mut request, mut limit) = (Vec::new(), Vec::new());
    for (resource, hard) in resources {
        // A missing quantity prints as Go's zero Quantity, "0"; stored ones are canonical.
        let quantity = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("0").to_string();
        let used = quantity(used.and_then(|u| u.get(resource)));
        let text = format!("{resource}: {used}/{}", quantity(Some(hard)));
        let mut pieces = resource.split('.');
        match (pieces.next(), pieces.next()) {
            (Some("limits"), Some(_)) => limit.push(text),
            _ => request.push(text),
        }
    }
    vec![
        name,
        json!(request.join(", ")),
        json!(limit.join(", ")),
        age,
    ]
}

/// `printStorageVersionMigration`: the resource as `resource.group`, and the last condition
/// that is true among Running, Failed and Succeeded (`Unknown` without). No age.
pub fn storage_version_migration(o: &Value, name: Value) -> Vec<Value> {
    let resource = super::networking::group_resource(
        string(o.pointer("/spec/resource/group")),
        string(o.pointer("/spec/resource/resource")),
    );
    let status = array(o.pointer("/status/conditions"))
        .iter()
        .rev()
        .filter(|c| string(c.get("status")) == "True")
        .find_map(|c| match string(c.get("type")) {
            t @ ("Running" | "Failed" | "Succeeded") => Some(t),
            _ => None,
        })
        .unwrap_or("Unknown");
    vec![name, json!(resource), json!(status)]
}
