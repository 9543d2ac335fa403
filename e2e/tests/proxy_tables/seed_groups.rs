//! The objects of the built-in groups whose printers the hub ported last (admission
//! policies, flow control, `resource.k8s.io`, ClusterTrustBundles, VolumeAttributesClasses,
//! StorageVersionMigrations) and of the kinds printed with the API server's default Table
//! (LimitRanges, CSIStorageCapacities), seeded as the admin: namespaced ones in the test's namespace,
//! cluster-scoped ones named after it and labelled `tables=<namespace>`. Nothing here acts
//! on anything: the policies match only namespaces labelled `never=<namespace>` (none is),
//! the FlowSchema only a user nobody is, the migration a resource no controller migrates
//! here (no kube-controller-manager runs on this control plane), and no DRA driver runs.
//!
//! Not seeded: PodCertificateRequests (only a node's kubelet can create one: the API server
//! checks the pod, node and ServiceAccount UIDs and a proof of possession), whose printer
//! the unit tests cover; ServiceCIDRs and IPAddresses are the API server's own (the
//! `kubernetes` ServiceCIDR, the seeded Services' cluster IPs), printed by name.

use std::path::Path;

use scale_agent_e2e::{ControlPlane, kubectl::Kubectl};
use serde_json::{Value, json};

use super::{KUBECTL_TIMEOUT, args, ensure_ok};

/// A self-signed CA certificate in PEM, the ClusterTrustBundle's content.
fn ca_certificate() -> anyhow::Result<String> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "tables CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    Ok(params.self_signed(&key)?.pem())
}

/// Match constraints of a policy that matches nothing: configmaps in namespaces labelled
/// `never=<namespace>`.
fn never(ns: &str) -> Value {
    json!({ "resourceRules": [{ "apiGroups": [""], "apiVersions": ["v1"],
                                "operations": ["CREATE"], "resources": ["configmaps"] }],
            "namespaceSelector": { "matchLabels": { "never": ns } } })
}

pub async fn seed_group_kinds(
    control_plane: &ControlPlane,
    dir: &Path,
    ns: &str,
    widget_group: &str,
) -> anyhow::Result<()> {
    let labels = json!({ "tables": ns, "app": "web" });
    let name = |suffix: &str| format!("{ns}-{suffix}");
    let metadata = |suffix: &str| json!({ "name": name(suffix), "labels": labels });
    let admission = "admissionregistration.k8s.io/v1";
    let flow = "flowcontrol.apiserver.k8s.io/v1";
    let dra = "resource.k8s.io/v1";
    let items = vec![
        // The kinds with the API server's default Table (Name, Created At). The range
        // bounds claims only, after the test's claims are made, and defaults nothing.
        json!({ "apiVersion": "v1", "kind": "LimitRange",
                "metadata": { "name": "claims", "labels": labels },
                "spec": { "limits": [{ "type": "PersistentVolumeClaim", "max": { "storage": "100Gi" } }] } }),
        json!({ "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
                "metadata": { "name": "fast-capacity", "labels": labels },
                "storageClassName": name("fast"), "capacity": "10Gi" }),
        json!({ "apiVersion": dra, "kind": "ResourceClaimTemplate",
                "metadata": { "name": "gpu-template", "labels": labels },
                "spec": { "spec": { "devices": { "requests": [
                    { "name": "gpu", "exactly": { "deviceClassName": name("gpu") } }] } } } }),
        json!({ "apiVersion": dra, "kind": "ResourceClaim",
                "metadata": { "name": "gpu-claim", "labels": labels },
                "spec": { "devices": { "requests": [
                    { "name": "gpu", "exactly": { "deviceClassName": name("gpu") } }] } } }),
    ];
    let cluster = vec![
        json!({ "apiVersion": admission, "kind": "ValidatingAdmissionPolicy", "metadata": metadata("policy"),
                "spec": { "failurePolicy": "Ignore", "matchConstraints": never(ns),
                          "paramKind": { "apiVersion": "v1", "kind": "ConfigMap" },
                          "validations": [{ "expression": "true" }, { "expression": "object.metadata.name != ''" }] } }),
        json!({ "apiVersion": admission, "kind": "ValidatingAdmissionPolicyBinding", "metadata": metadata("by-name"),
                "spec": { "policyName": name("policy"), "validationActions": ["Warn"],
                          "paramRef": { "name": "settings-1", "namespace": ns, "parameterNotFoundAction": "Allow" } } }),
        json!({ "apiVersion": admission, "kind": "ValidatingAdmissionPolicyBinding", "metadata": metadata("by-selector"),
                "spec": { "policyName": name("policy"), "validationActions": ["Audit"],
                          "paramRef": { "selector": { "matchLabels": { "app": "web" },
                                                      "matchExpressions": [{ "key": "tier", "operator": "In", "values": ["front", "back"] }] },
                                        "parameterNotFoundAction": "Allow" } } }),
        json!({ "apiVersion": admission, "kind": "MutatingAdmissionPolicy", "metadata": metadata("mutation"),
                "spec": { "failurePolicy": "Ignore", "reinvocationPolicy": "Never", "matchConstraints": never(ns),
                          "mutations": [{ "patchType": "ApplyConfiguration", "applyConfiguration": {
                              "expression": "Object{metadata: Object.metadata{labels: {\"mutated\": \"yes\"}}}" } }] } }),
        json!({ "apiVersion": admission, "kind": "MutatingAdmissionPolicyBinding", "metadata": metadata("mutation"),
                "spec": { "policyName": name("mutation") } }),
        json!({ "apiVersion": flow, "kind": "PriorityLevelConfiguration", "metadata": metadata("queued"),
                "spec": { "type": "Limited", "limited": { "nominalConcurrencyShares": 5, "limitResponse": {
                    "type": "Queue", "queuing": { "queues": 16, "handSize": 4, "queueLengthLimit": 20 } } } } }),
        json!({ "apiVersion": flow, "kind": "PriorityLevelConfiguration", "metadata": metadata("rejected"),
                "spec": { "type": "Limited", "limited": { "nominalConcurrencyShares": 2,
                                                          "limitResponse": { "type": "Reject" } } } }),
        json!({ "apiVersion": flow, "kind": "FlowSchema", "metadata": metadata("nobody"),
                "spec": { "priorityLevelConfiguration": { "name": name("queued") }, "matchingPrecedence": 9000,
                          "distinguisherMethod": { "type": "ByUser" },
                          "rules": [{ "subjects": [{ "kind": "User", "user": { "name": name("nobody") } }],
                                      "resourceRules": [{ "verbs": ["get"], "apiGroups": ["*"], "resources": ["*"],
                                                          "namespaces": ["*"] }] }] } }),
        json!({ "apiVersion": flow, "kind": "FlowSchema", "metadata": metadata("dangling"),
                "spec": { "priorityLevelConfiguration": { "name": name("missing") }, "matchingPrecedence": 9001,
                          "rules": [{ "subjects": [{ "kind": "User", "user": { "name": name("nobody") } }],
                                      "nonResourceRules": [{ "verbs": ["get"], "nonResourceURLs": ["/never"] }] }] } }),
        json!({ "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttributesClass", "metadata": metadata("gold"),
                "driverName": "csi.example.com", "parameters": { "iops": "3000" } }),
        json!({ "apiVersion": "certificates.k8s.io/v1", "kind": "ClusterTrustBundle",
                "metadata": { "name": format!("example.com:tables:{ns}"), "labels": labels },
                "spec": { "signerName": "example.com/tables", "trustBundle": ca_certificate()? } }),
        json!({ "apiVersion": "certificates.k8s.io/v1", "kind": "ClusterTrustBundle", "metadata": metadata("roots"),
                "spec": { "trustBundle": ca_certificate()? } }),
        json!({ "apiVersion": dra, "kind": "DeviceClass", "metadata": metadata("gpu"),
                "spec": { "selectors": [{ "cel": { "expression": "device.driver == 'gpu.example.com'" } }] } }),
        json!({ "apiVersion": dra, "kind": "ResourceSlice", "metadata": metadata("node-slice"),
                "spec": { "driver": "gpu.example.com", "nodeName": name("node"),
                          "pool": { "name": "pool-a", "generation": 1, "resourceSliceCount": 1 },
                          "devices": [{ "name": "dev-0" }] } }),
        json!({ "apiVersion": dra, "kind": "ResourceSlice", "metadata": metadata("shared-slice"),
                "spec": { "driver": "gpu.example.com", "allNodes": true,
                          "pool": { "name": "shared", "generation": 1, "resourceSliceCount": 1 } } }),
        json!({ "apiVersion": dra, "kind": "DeviceTaintRule", "metadata": metadata("broken"),
                "spec": { "deviceSelector": { "driver": "gpu.example.com", "pool": "pool-a", "device": "dev-0" },
                          "taint": { "key": "example.com/broken", "value": "yes", "effect": "NoSchedule" } } }),
        json!({ "apiVersion": "storagemigration.k8s.io/v1", "kind": "StorageVersionMigration",
                "metadata": metadata("widgets"),
                "spec": { "resource": { "group": widget_group, "resource": "widgets" } } }),
    ];
    let kubectl = Kubectl::new(control_plane.binaries().kubectl(), dir.join("home-admin"));
    let kubeconfig = control_plane.kubeconfig_path().to_path_buf();
    for (namespace, list) in [(Some(ns), items), (None, cluster)] {
        let mut command = args(&["create", "-f", "-"]);
        if let Some(namespace) = namespace {
            command.extend(args(&["-n", namespace]));
        }
        let list = json!({ "apiVersion": "v1", "kind": "List", "items": list }).to_string();
        ensure_ok(
            "create the groups' objects",
            &kubectl
                .run(&kubeconfig, &command, Some(&list), KUBECTL_TIMEOUT)
                .await?,
        )?;
    }
    // A migration that finished, as the migrator would have written it.
    let succeeded = json!({ "status": { "conditions": [
        { "type": "Running", "status": "False", "reason": "Done", "message": "",
          "lastTransitionTime": "2026-01-01T00:00:00Z" },
        { "type": "Succeeded", "status": "True", "reason": "Done", "message": "",
          "lastTransitionTime": "2026-01-01T00:00:00Z" },
    ] } });
    super::seed::patch_status(
        &kubectl,
        &kubeconfig,
        "storageversionmigrations",
        &name("widgets"),
        None,
        &succeeded,
    )
    .await
}
