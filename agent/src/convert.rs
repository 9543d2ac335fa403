//! Kubernetes objects to protocol messages: Secrets reduced to metadata, everything else kept
//! as the API server gave it (`managedFields` included: kubectl compares the object it read
//! with a patch's answer, and server-side diff tools read field ownership from it).

use scale_agent_proto::v1::{self, object_event};
use serde_json::Value;

use crate::kinds::KindRef;

/// Annotation `kubectl apply` writes; on a Secret it holds the data in clear text.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Annotations known to hold an applied manifest, so on a Secret its data (clear, base64 or
/// compressed), and dropped from Secrets with [`LAST_APPLIED`] (issue 28, F16): Carvel kapp's
/// original manifest and its diff, and Rancher wrangler's (Fleet's) applied object.
pub const MANIFEST_ANNOTATIONS: [&str; 4] = [
    LAST_APPLIED,
    "kapp.k14s.io/original",
    "kapp.k14s.io/original-diff",
    "objectset.rio.cattle.io/applied",
];

/// Whether `annotation` is one of [`MANIFEST_ANNOTATIONS`].
pub fn holds_a_manifest(annotation: &str) -> bool {
    MANIFEST_ANNOTATIONS.contains(&annotation)
}

/// Removes what must never leave the agent: from Secrets `data`, `stringData`,
/// `managedFields` (they name the data's keys) and the [`MANIFEST_ANNOTATIONS`]; other kinds
/// keep everything, `managedFields` included, so the hub's cache answers the API server's
/// objects. Sets `apiVersion` and `kind` (list items and metadata-only objects lack them or
/// name the wrong type).
pub fn scrub(kind: &KindRef, object: &mut Value) {
    let Some(map) = object.as_object_mut() else {
        return;
    };
    map.insert("apiVersion".into(), Value::String(kind.api_version()));
    map.insert("kind".into(), Value::String(kind.kind.clone()));
    if kind.is_secret()
        && let Some(metadata) = map.get_mut("metadata").and_then(Value::as_object_mut)
    {
        metadata.remove("managedFields");
        if let Some(annotations) = metadata
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
        {
            annotations.retain(|name, _| !holds_a_manifest(name));
            if annotations.is_empty() {
                metadata.remove("annotations");
            }
        }
    }
    if kind.is_secret() {
        map.remove("data");
        map.remove("stringData");
    }
}

fn meta_str(object: &Value, field: &str) -> String {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The object's `metadata.resourceVersion`.
pub fn resource_version(object: &Value) -> String {
    meta_str(object, "resourceVersion")
}

/// The object's `metadata.namespace` (empty for cluster-scoped objects).
pub fn namespace(object: &Value) -> String {
    meta_str(object, "namespace")
}

/// An ObjectEvent for `object` (scrubbed here). With `max_object_bytes` > 0 a larger payload
/// is dropped and the event marked `truncated`.
pub fn object_event(
    account: &str,
    kind: &KindRef,
    watch_namespace: &str,
    event_type: object_event::Type,
    mut object: Value,
    max_object_bytes: u64,
) -> v1::ObjectEvent {
    scrub(kind, &mut object);
    let json = serde_json::to_vec(&object).unwrap_or_default();
    let truncated = max_object_bytes > 0 && json.len() as u64 > max_object_bytes;
    v1::ObjectEvent {
        account: account.to_string(),
        kind: Some(kind.to_proto()),
        r#type: event_type as i32,
        namespace: meta_str(&object, "namespace"),
        name: meta_str(&object, "name"),
        uid: meta_str(&object, "uid"),
        resource_version: meta_str(&object, "resourceVersion"),
        object_json: if truncated { Vec::new() } else { json },
        truncated,
        watch_namespace: watch_namespace.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn secret_kind() -> KindRef {
        KindRef {
            group: String::new(),
            version: "v1".into(),
            kind: "Secret".into(),
            plural: "secrets".into(),
            namespaced: true,
        }
    }

    fn deployment_kind() -> KindRef {
        KindRef {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            plural: "deployments".into(),
            namespaced: true,
        }
    }

    #[test]
    fn secrets_lose_data_and_last_applied_but_keep_metadata() {
        let marker = "c2VjcmV0LW1hcmtlcg==";
        let secret = json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "db", "namespace": "web", "uid": "u1", "resourceVersion": "42",
                "labels": { "app": "db" },
                "annotations": { LAST_APPLIED: format!("{{\"data\":{{\"password\":\"{marker}\"}}}}") },
                "managedFields": [{ "manager": "kubectl" }],
            },
            "data": { "password": marker },
            "stringData": { "password": "plain" },
            "type": "Opaque",
        });
        let event = object_event(
            "prod",
            &secret_kind(),
            "",
            object_event::Type::Applied,
            secret,
            0,
        );
        let text = String::from_utf8(event.object_json.clone()).unwrap();
        assert!(!text.contains(marker), "{text}");
        assert!(!text.contains("plain"), "{text}");
        assert!(!text.contains("managedFields"), "{text}");
        assert!(!text.contains("last-applied"), "{text}");
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["apiVersion"], "v1");
        assert_eq!(value["kind"], "Secret");
        assert_eq!(value["metadata"]["labels"]["app"], "db");
        assert_eq!(value["type"], "Opaque");
        assert_eq!(event.name, "db");
        assert_eq!(event.namespace, "web");
        assert_eq!(event.uid, "u1");
        assert_eq!(event.resource_version, "42");
        assert_eq!(event.r#type, object_event::Type::Applied as i32);
    }

    #[test]
    fn other_kinds_keep_their_data_annotations_and_managed_fields() {
        let deployment = json!({
            "metadata": {
                "name": "web", "resourceVersion": "7",
                "annotations": { LAST_APPLIED: "{}" },
                "managedFields": [{ "manager": "kubectl" }],
            },
            "spec": { "replicas": 3 },
        });
        let event = object_event(
            "prod",
            &deployment_kind(),
            "ns",
            object_event::Type::Deleted,
            deployment,
            0,
        );
        let value: Value = serde_json::from_slice(&event.object_json).unwrap();
        assert_eq!(value["apiVersion"], "apps/v1");
        assert_eq!(value["spec"]["replicas"], 3);
        assert_eq!(
            value["metadata"]["managedFields"],
            serde_json::json!([{ "manager": "kubectl" }])
        );
        assert_eq!(value["metadata"]["annotations"][LAST_APPLIED], "{}");
        assert_eq!(event.watch_namespace, "ns");
        assert!(!event.truncated);
    }

    #[test]
    fn oversized_objects_are_sent_truncated_without_payload() {
        let big = json!({ "metadata": { "name": "big", "uid": "u", "resourceVersion": "9" }, "spec": { "blob": "x".repeat(2000) } });
        let event = object_event(
            "prod",
            &deployment_kind(),
            "",
            object_event::Type::Applied,
            big.clone(),
            1000,
        );
        assert!(event.truncated);
        assert!(event.object_json.is_empty());
        assert_eq!(event.name, "big");
        assert_eq!(event.resource_version, "9");
        let event = object_event(
            "prod",
            &deployment_kind(),
            "",
            object_event::Type::Applied,
            big,
            0,
        );
        assert!(!event.truncated);
    }
}
