//! The objects of the cluster's other built-in kinds `proxy_tables` prints (storage,
//! endpoints, quotas, leases, revisions, admission, certificates, events.k8s.io), seeded as
//! the admin after [`super::seed`]: namespaced ones in the test's namespace, cluster-scoped
//! ones named after it and labelled `tables=<namespace>`. Nothing here is ever called or
//! selected by the API server (the webhooks match no object), so they disturb no other test.

use std::path::Path;

use base64::Engine;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Api;
use scale_agent_e2e::{ControlPlane, kubectl::Kubectl};
use serde_json::{Value, json};

use super::{KUBECTL_TIMEOUT, args, ensure_ok};

/// A PEM certificate request (PKCS#10) for the CertificateSigningRequest.
fn certificate_request() -> anyhow::Result<String> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "tables");
    Ok(params.serialize_request(&key)?.pem()?)
}

/// A webhook configuration's single webhook, matching no object.
fn webhook(ns: &str) -> Value {
    json!({ "name": "never.tables.example.com",
            "clientConfig": { "url": "https://127.0.0.1:1/never" },
            "rules": [{ "operations": ["CREATE"], "apiGroups": ["example.invalid"],
                        "apiVersions": ["v1"], "resources": ["nothing"] }],
            "objectSelector": { "matchLabels": { "never": ns } },
            "failurePolicy": "Ignore", "sideEffects": "None", "admissionReviewVersions": ["v1"] })
}

pub async fn seed_cluster_kinds(
    control_plane: &ControlPlane,
    dir: &Path,
    ns: &str,
    widget_group: &str,
) -> anyhow::Result<()> {
    let admin = control_plane.client().await?;
    let daemon_set = Api::<DaemonSet>::namespaced(admin, ns)
        .get("node-agent")
        .await?;
    let labels = json!({ "tables": ns, "app": "web" });
    let template = json!({
        "metadata": { "labels": { "app": "web", "tier": "front" } },
        "spec": { "containers": [
            { "name": "web", "image": "nginx:1.27" },
            { "name": "log", "image": "busybox:1.36" },
        ] },
    });
    let request = base64::engine::general_purpose::STANDARD.encode(certificate_request()?);
    let items = vec![
        json!({ "apiVersion": "v1", "kind": "PodTemplate",
                "metadata": { "name": "web", "labels": labels }, "template": template }),
        json!({ "apiVersion": "v1", "kind": "ReplicationController",
                "metadata": { "name": "legacy", "labels": labels },
                "spec": { "replicas": 3, "selector": { "app": "web", "tier": "front" }, "template": template } }),
        json!({ "apiVersion": "v1", "kind": "Endpoints",
                "metadata": { "name": "manual", "labels": labels },
                "subsets": [
                    { "addresses": [{ "ip": "10.1.2.3" }, { "ip": "10.1.2.4" }], "ports": [{ "name": "http", "port": 8080 }, { "name": "metrics", "port": 9090 }] },
                    { "addresses": [{ "ip": "10.1.2.5" }] },
                ] }),
        json!({ "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": { "name": "manual-1", "labels": {
                    "tables": ns, "app": "web", "endpointslice.kubernetes.io/managed-by": "tables.example.com" } },
                "addressType": "IPv4",
                "ports": [{ "name": "http", "port": 80 }, { "name": "https", "port": 443 },
                          { "name": "a", "port": 3000 }, { "name": "b", "port": 3001 }],
                "endpoints": [{ "addresses": ["10.1.2.3"] }, { "addresses": ["10.1.2.4"] },
                              { "addresses": ["10.1.2.5"] }, { "addresses": ["10.1.2.6"] }] }),
        json!({ "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": { "name": "leader", "labels": labels },
                "spec": { "holderIdentity": "kcm-1", "leaseDurationSeconds": 15 } }),
        json!({ "apiVersion": "apps/v1", "kind": "ControllerRevision",
                "metadata": { "name": "node-agent-7c9", "labels": labels, "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-agent",
                    "uid": daemon_set.metadata.uid, "controller": true }] },
                "data": { "spec": { "template": template } }, "revision": 3 }),
        json!({ "apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": { "name": "web.synced", "labels": labels },
                "regarding": { "kind": "Deployment", "namespace": ns, "name": "web" },
                "type": "Normal", "reason": "Synced", "note": "Synced the web deployment",
                "action": "Sync", "reportingController": "tables.example.com/controller",
                "reportingInstance": "controller-1", "eventTime": "2026-01-01T00:00:00.000000Z" }),
        // Only pods and their resources: the quota admission would refuse other objects
        // until a controller (none runs here) fills its status in.
        json!({ "apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": { "name": "compute", "labels": labels },
                "spec": { "hard": { "pods": "20", "requests.memory": "1Gi", "limits.cpu": "4" } } }),
    ];
    let cluster = vec![
        json!({ "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": { "name": format!("{ns}-pv"), "labels": labels },
                "spec": { "capacity": { "storage": "5Gi" }, "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                          "persistentVolumeReclaimPolicy": "Retain", "storageClassName": format!("{ns}-fast"),
                          "hostPath": { "path": "/tmp/tables" },
                          "claimRef": { "namespace": ns, "name": "data" } } }),
        json!({ "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": { "name": format!("{ns}-fast"), "labels": labels },
                "provisioner": "csi.example.com", "reclaimPolicy": "Retain",
                "volumeBindingMode": "WaitForFirstConsumer", "allowVolumeExpansion": true }),
        json!({ "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": { "name": format!("{ns}-plain"), "labels": labels },
                "provisioner": "kubernetes.io/no-provisioner" }),
        json!({ "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                "metadata": { "name": format!("{ns}-attachment"), "labels": labels },
                "spec": { "attacher": "csi.example.com", "nodeName": format!("{ns}-node"),
                          "source": { "persistentVolumeName": format!("{ns}-pv") } } }),
        json!({ "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                "metadata": { "name": format!("{ns}.csi.example.com"), "labels": labels },
                "spec": { "podInfoOnMount": true, "tokenRequests": [{ "audience": "vault" }, { "audience": "api" }],
                          "requiresRepublish": true, "volumeLifecycleModes": ["Persistent", "Ephemeral"] } }),
        json!({ "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": { "name": format!("{ns}-node"), "labels": labels },
                "spec": { "drivers": [{ "name": "csi.example.com", "nodeID": "n1" },
                                      { "name": "other.example.com", "nodeID": "n1" }] } }),
        json!({ "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": { "name": format!("{ns}-high"), "labels": labels },
                "value": 1000, "preemptionPolicy": "Never" }),
        json!({ "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                "metadata": { "name": format!("{ns}-sandboxed"), "labels": labels }, "handler": "runsc" }),
        json!({ "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
                "metadata": { "name": format!("{ns}-nginx"), "labels": labels },
                "spec": { "controller": "k8s.io/ingress-nginx", "parameters": {
                    "apiGroup": "k8s.example.com", "kind": "IngressParameters", "name": "external-lb" } } }),
        json!({ "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": { "name": format!("{ns}-csr"), "labels": labels },
                "spec": { "request": request, "signerName": "example.com/tables", "expirationSeconds": 7200,
                          "usages": ["digital signature", "client auth"] } }),
        json!({ "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": { "name": format!("{ns}-hooks"), "labels": labels }, "webhooks": [webhook(ns)] }),
        json!({ "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": { "name": format!("{ns}-hooks"), "labels": labels }, "webhooks": [webhook(ns)] }),
    ];
    let admin_kubectl = Kubectl::new(control_plane.binaries().kubectl(), dir.join("home-admin"));
    let kubeconfig = control_plane.kubeconfig_path().to_path_buf();
    let run = |command: Vec<String>, stdin: Option<String>| {
        let (kubectl, kubeconfig) = (&admin_kubectl, &kubeconfig);
        async move {
            let outcome = kubectl
                .run(kubeconfig, &command, stdin.as_deref(), KUBECTL_TIMEOUT)
                .await?;
            ensure_ok(&format!("kubectl {}", command.join(" ")), &outcome)
        }
    };
    for (namespace, list) in [(Some(ns), items), (None, cluster)] {
        let mut command = args(&["create", "-f", "-"]);
        if let Some(namespace) = namespace {
            command.extend(args(&["-n", namespace]));
        }
        let list = json!({ "apiVersion": "v1", "kind": "List", "items": list }).to_string();
        run(command, Some(list)).await?;
    }
    // Statuses as controllers would write them (none runs here).
    for (kind, name, namespace, status) in [
        (
            "replicationcontrollers",
            "legacy".to_string(),
            Some(ns),
            json!({ "status": { "replicas": 3, "readyReplicas": 1 } }),
        ),
        (
            "resourcequotas",
            "compute".to_string(),
            Some(ns),
            json!({ "status": {
                "hard": { "pods": "20", "requests.memory": "1Gi", "limits.cpu": "4" },
                "used": { "pods": "3", "limits.cpu": "500m" } } }),
        ),
        (
            "persistentvolumes",
            format!("{ns}-pv"),
            None,
            json!({ "status": { "phase": "Failed", "reason": "RecyclerFailed" } }),
        ),
        (
            "volumeattachments",
            format!("{ns}-attachment"),
            None,
            json!({ "status": { "attached": true } }),
        ),
    ] {
        super::seed::patch_status(&admin_kubectl, &kubeconfig, kind, &name, namespace, &status)
            .await?;
    }
    run(
        args(&["certificate", "approve", &format!("{ns}-csr")]),
        None,
    )
    .await?;
    run(
        args(&[
            "label",
            "customresourcedefinition",
            &format!("widgets.{widget_group}"),
            &format!("tables={ns}"),
        ]),
        None,
    )
    .await?;
    Ok(())
}
