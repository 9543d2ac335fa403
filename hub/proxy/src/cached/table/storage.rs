//! The storage kinds' cells (PersistentVolumes, StorageClasses, VolumeAttachments,
//! CSIDrivers, CSINodes), ported from Kubernetes 1.37's
//! `pkg/printers/internalversion/printers.go` (sans-IO).

use serde_json::{Value, json};

use super::format::string;

/// `helper.GetAccessModesAsString`: the distinct modes, short, in a fixed order.
pub fn access_modes(modes: Option<&Value>) -> String {
    let modes: Vec<&str> = modes
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(long, _)| modes.contains(long))
    .map(|(_, short)| *short)
    .collect::<Vec<_>>()
    .join(",")
}

/// A volume's or claim's phase, `Terminating` while it is deleted.
pub fn phase(o: &Value) -> &str {
    let deleting = o
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|d| !d.is_null());
    if deleting {
        "Terminating"
    } else {
        string(o.pointer("/status/phase"))
    }
}

/// `GetPersistentVolumeClass` / `GetPersistentVolumeClaimClass`: the beta annotation first,
/// then `spec.storageClassName`.
pub fn class_of(o: &Value) -> &str {
    match o
        .pointer("/metadata/annotations")
        .and_then(|a| a.get("volume.beta.kubernetes.io/storage-class"))
        .and_then(Value::as_str)
    {
        Some(class) => class,
        None => string(o.pointer("/spec/storageClassName")),
    }
}

/// A boolean field behind a pointer, `default` when absent.
fn bool_or(value: Option<&Value>, default: bool) -> bool {
    value.and_then(Value::as_bool).unwrap_or(default)
}

/// `printPersistentVolume`: capacity, access modes, reclaim policy, phase (`Terminating`
/// while deleted), `namespace/name` of the claim, class (the beta annotation first).
pub fn persistent_volume(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let claim = match o.pointer("/spec/claimRef") {
        Some(c) if !c.is_null() => {
            format!("{}/{}", string(c.get("namespace")), string(c.get("name")))
        }
        _ => String::new(),
    };
    let (phase, class) = (phase(o), class_of(o));
    let or_unset = |p: &str| o.pointer(p).and_then(Value::as_str).unwrap_or("<unset>");
    vec![
        name,
        // `Quantity.String()` of a missing quantity is "0"; stored ones are canonical.
        json!(
            o.pointer("/spec/capacity/storage")
                .and_then(Value::as_str)
                .unwrap_or("0")
        ),
        json!(access_modes(o.pointer("/spec/accessModes"))),
        json!(string(o.pointer("/spec/persistentVolumeReclaimPolicy"))),
        json!(phase),
        json!(claim),
        json!(class),
        json!(or_unset("/spec/volumeAttributesClassName")),
        json!(string(o.pointer("/status/reason"))),
        age,
        json!(or_unset("/spec/volumeMode")),
    ]
}

/// `printStorageClass`: the defaults the API server fills in (`Delete`, `Immediate`,
/// `false`) when a field is unset. No "(default)" mark: the server passes no default.
pub fn storage_class(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let or = |key: &str, default: &'static str| {
        o.get(key)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_string()
    };
    vec![
        name,
        json!(string(o.get("provisioner"))),
        json!(or("reclaimPolicy", "Delete")),
        json!(or("volumeBindingMode", "Immediate")),
        json!(bool_or(o.get("allowVolumeExpansion"), false)),
        age,
    ]
}

/// `printVolumeAttachment`.
pub fn volume_attachment(o: &Value, name: Value, age: Value) -> Vec<Value> {
    vec![
        name,
        json!(string(o.pointer("/spec/attacher"))),
        json!(string(o.pointer("/spec/source/persistentVolumeName"))),
        json!(string(o.pointer("/spec/nodeName"))),
        json!(bool_or(o.pointer("/status/attached"), false)),
        age,
    ]
}

/// `printCSINode`: the number of drivers.
pub fn csi_node(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let drivers = o
        .pointer("/spec/drivers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    vec![name, json!(drivers), age]
}

/// `printCSIDriver`: the flags with their defaults, the token audiences (`<unset>` without
/// a list), the lifecycle modes (`<none>` without).
pub fn csi_driver(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let spec = o.get("spec");
    let field = |key: &str| spec.and_then(|s| s.get(key));
    let modes: Vec<&str> = field("volumeLifecycleModes")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let modes = if modes.is_empty() {
        "<none>".to_string()
    } else {
        modes.join(",")
    };
    let token_requests = match field("tokenRequests").and_then(Value::as_array) {
        Some(requests) => requests
            .iter()
            .map(|t| string(t.get("audience")))
            .collect::<Vec<_>>()
            .join(","),
        None => "<unset>".into(),
    };
    vec![
        name,
        json!(bool_or(field("attachRequired"), true)),
        json!(bool_or(field("podInfoOnMount"), false)),
        json!(bool_or(field("storageCapacity"), false)),
        json!(token_requests),
        json!(bool_or(field("requiresRepublish"), false)),
        json!(modes),
        age,
    ]
}
