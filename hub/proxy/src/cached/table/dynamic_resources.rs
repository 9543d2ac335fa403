//! The `resource.k8s.io` kinds' Tables (dynamic resource allocation): DeviceClasses,
//! ResourceClaims, ResourceClaimTemplates, ResourceSlices and DeviceTaintRules, ported from
//! Kubernetes 1.37's `pkg/printers/internalversion/printers.go` (sans-IO).

use jiff::Timestamp;
use serde_json::{Value, json};

use super::{
    Column,
    columns::{CREATED_DOC, NAME_DOC, col},
    format::{since, string},
};

/// A `resource.k8s.io` kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DynamicResource {
    DeviceClass,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
    DeviceTaintRule,
}

/// `deviceClassColumnDefinitions` and `resourceClaimTemplateColumnDefinitions`.
#[rustfmt::skip]
const NAME_AGE: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `resourceClaimColumnDefinitions`.
#[rustfmt::skip]
const RESOURCE_CLAIM: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("State", "string", "", 0, "A summary of the current state (allocated, pending, reserved, etc.)."),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `nodeResourceSliceColumnDefinitions`.
#[rustfmt::skip]
const RESOURCE_SLICE: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Node", "string", "", 0, "NodeName identifies the node which provides the resources in this pool. A field selector can be used to list only ResourceSlice objects belonging to a certain node.\n\nThis field can be used to limit access from nodes to ResourceSlices with the same node name. It also indicates to autoscalers that adding new nodes of the same type as some old node might also make new resources available.\n\nExactly one of NodeName, NodeSelector, AllNodes, and PerDeviceNodeSelection must be set. This field is immutable."),
    col("Driver", "string", "", 0, "Driver identifies the DRA driver providing the capacity information. A field selector can be used to list only ResourceSlice objects with a certain driver name.\n\nMust be a DNS subdomain and should end with a DNS domain owned by the vendor of the driver. It should use only lower case characters. This field is immutable."),
    col("Pool", "string", "", 0, "Name is used to identify the pool. For node-local devices, this is often the node name, but this is not required. A field selector can be used to list only ResourceSlice objects belonging to a certain pool.\n\nIt must not be longer than 253 characters and must consist of one or more DNS sub-domains separated by slashes. This field is immutable."),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `deviceTaintColumnDefinitions`.
#[rustfmt::skip]
const DEVICE_TAINT_RULE: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Key", "string", "", 0, "The taint key to be applied to a device. Must be a label name."),
    col("Value", "string", "", 0, "The taint value corresponding to the taint key. Must be a label value."),
    col("Effect", "string", "", 0, "The effect of the taint on claims that do not tolerate the taint and through such claims on the pods using them.\n\nValid effects are None, NoSchedule and NoExecute. PreferNoSchedule as used for nodes is not valid here. More effects may get added in the future. Consumers must treat unknown effects like None."),
    col("TimeAdded", "string", "", 0, "TimeAdded represents the time at which the taint was added or (only in a DeviceTaintRule) the effect was modified. Added automatically during create or update if not set.\n\nIn addition, in a DeviceTaintRule a value provided during an update gets replaced with the current time if the provided value is the same as the old one and the new effect is different. Changing the key and/or value while keeping the effect unchanged is possible and does not update the time stamp because the eviction which uses it is either already started (NoExecute) or not started yet (NoEffect, NoSchedule)."),
    col("Age", "string", "", 0, CREATED_DOC),
];

impl DynamicResource {
    /// The kind of a resource of `resource.k8s.io`.
    pub fn of(resource: &str) -> Option<DynamicResource> {
        Some(match resource {
            "deviceclasses" => DynamicResource::DeviceClass,
            "resourceclaims" => DynamicResource::ResourceClaim,
            "resourceclaimtemplates" => DynamicResource::ResourceClaimTemplate,
            "resourceslices" => DynamicResource::ResourceSlice,
            "devicetaintrules" => DynamicResource::DeviceTaintRule,
            _ => return None,
        })
    }

    pub fn columns(self) -> &'static [Column] {
        match self {
            DynamicResource::DeviceClass | DynamicResource::ResourceClaimTemplate => NAME_AGE,
            DynamicResource::ResourceClaim => RESOURCE_CLAIM,
            DynamicResource::ResourceSlice => RESOURCE_SLICE,
            DynamicResource::DeviceTaintRule => DEVICE_TAINT_RULE,
        }
    }

    pub fn cells(self, o: &Value, name: Value, age: Value, now: Timestamp) -> Vec<Value> {
        match self {
            DynamicResource::DeviceClass | DynamicResource::ResourceClaimTemplate => {
                vec![name, age]
            }
            DynamicResource::ResourceClaim => vec![name, json!(claim_state(o)), age],
            // `printResourceSlice`: the node ("" for a pool not on one node), driver, pool.
            DynamicResource::ResourceSlice => vec![
                name,
                json!(string(o.pointer("/spec/nodeName"))),
                json!(string(o.pointer("/spec/driver"))),
                json!(string(o.pointer("/spec/pool/name"))),
                age,
            ],
            // `printDeviceTaint`: the taint, and the age of its time added ("" without).
            DynamicResource::DeviceTaintRule => {
                let added = match o.pointer("/spec/taint/timeAdded") {
                    Some(t) if !t.is_null() => since(Some(t), now),
                    _ => String::new(),
                };
                vec![
                    name,
                    json!(string(o.pointer("/spec/taint/key"))),
                    json!(string(o.pointer("/spec/taint/value"))),
                    json!(string(o.pointer("/spec/taint/effect"))),
                    json!(added),
                    age,
                ]
            }
        }
    }
}

/// `resourceClaimState`: `deleted` while deleted, then `pending` (not while deleted) or
/// `allocated` and `reserved` when reserved for a consumer, comma-separated.
fn claim_state(o: &Value) -> String {
    let deleted = o
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|d| !d.is_null());
    let mut states = Vec::new();
    if deleted {
        states.push("deleted");
    }
    match o.pointer("/status/allocation") {
        Some(a) if !a.is_null() => {
            states.push("allocated");
            let reserved = o
                .pointer("/status/reservedFor")
                .and_then(Value::as_array)
                .is_some_and(|r| !r.is_empty());
            if reserved {
                states.push("reserved");
            }
        }
        _ if !deleted => states.push("pending"),
        _ => {}
    }
    states.join(",")
}
