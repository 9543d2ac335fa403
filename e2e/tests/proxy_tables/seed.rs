//! The objects `proxy_tables` prints: one or more of every kind, with statuses written
//! through the status subresource as controllers and kubelets would (none run here).

use std::path::Path;

use scale_agent_e2e::{ControlPlane, kubectl::Kubectl};
use serde_json::json;

use super::{KUBECTL_TIMEOUT, args, ensure_ok};

/// Objects of every printed kind in `ns`, with statuses as controllers and kubelets would
/// write them (there are none here): ready and restarted containers, a waiting one, a
/// load balancer's address.
pub async fn seed(
    control_plane: &ControlPlane,
    dir: &Path,
    ns: &str,
    widget_group: &str,
) -> anyhow::Result<()> {
    let admin = control_plane.client().await?;
    let mut crd = scale_agent_e2e::crds::schemaless_crd(widget_group, "Widget", "widgets");
    crd.spec.versions[0].additional_printer_columns = Some(serde_json::from_value(json!([
        { "name": "Size", "type": "string", "jsonPath": ".spec.size" },
        { "name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas" },
        { "name": "Enabled", "type": "boolean", "jsonPath": ".spec.enabled" },
        { "name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status" },
        { "name": "First", "type": "string", "jsonPath": ".spec.items[0].name", "priority": 1 },
        { "name": "Since", "type": "date", "jsonPath": ".status.since" },
        { "name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp" },
    ]))?);
    scale_agent_e2e::crds::install(&admin, &[crd]).await?;
    let label = |app: &str| json!({ "tables": ns, "app": app });
    let template = json!({
        "metadata": { "labels": { "app": "web" } },
        "spec": { "containers": [
            { "name": "web", "image": "nginx:1.27" },
            { "name": "log", "image": "busybox:1.36" },
        ] },
    });
    let selector = json!({
        "matchLabels": { "app": "web" },
        "matchExpressions": [{ "key": "tier", "operator": "NotIn", "values": ["db", "cache"] }],
    });
    let mut items = vec![
        json!({ "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": { "name": "web", "labels": label("web") },
                "spec": { "replicas": 3, "selector": selector, "template": template } }),
        json!({ "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": { "name": "web-5d4f", "labels": label("web") },
                "spec": { "replicas": 2, "selector": selector, "template": template } }),
        json!({ "apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": { "name": "db", "labels": label("db") },
                "spec": { "replicas": 2, "serviceName": "db", "selector": { "matchLabels": { "app": "web" } },
                          "template": template } }),
        json!({ "apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": { "name": "node-agent", "labels": label("agent") },
                "spec": { "selector": { "matchLabels": { "app": "web" } },
                          "template": { "metadata": template["metadata"],
                                        "spec": { "nodeSelector": { "kubernetes.io/os": "linux", "disk": "ssd" },
                                                  "containers": template["spec"]["containers"] } } } }),
        json!({ "apiVersion": "batch/v1", "kind": "Job",
                "metadata": { "name": "once", "labels": label("batch") },
                "spec": { "completions": 1, "parallelism": 3,
                          "template": { "spec": { "restartPolicy": "Never",
                                                  "containers": [{ "name": "run", "image": "busybox:1.36" }] } } } }),
        json!({ "apiVersion": "batch/v1", "kind": "CronJob",
                "metadata": { "name": "tick", "labels": label("batch") },
                "spec": { "schedule": "*/5 * * * *", "timeZone": "Etc/UTC",
                          "jobTemplate": { "spec": { "template": { "spec": { "restartPolicy": "Never",
                                                  "containers": [{ "name": "run", "image": "busybox:1.36" }] } } } } } }),
        json!({ "apiVersion": "v1", "kind": "Service",
                "metadata": { "name": "web", "labels": label("web") },
                "spec": { "selector": { "app": "web", "tier": "front" },
                          "ports": [{ "name": "http", "port": 80 }, { "name": "dns", "port": 53, "protocol": "UDP" }] } }),
        json!({ "apiVersion": "v1", "kind": "Service",
                "metadata": { "name": "lb", "labels": label("web") },
                "spec": { "type": "LoadBalancer", "selector": { "app": "web" }, "ports": [{ "port": 443 }] } }),
        json!({ "apiVersion": "v1", "kind": "Service",
                "metadata": { "name": "external", "labels": label("db") },
                "spec": { "type": "ExternalName", "externalName": "db.example.com" } }),
        json!({ "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "metadata": { "name": "web", "labels": label("web") },
                "spec": { "ingressClassName": "nginx", "tls": [{ "hosts": ["a.example.com"] }],
                          "rules": [{ "host": "a.example.com" }, { "host": "b.example.com" }, {},
                                    { "host": "d.example.com" }, { "host": "e.example.com" }] } }),
        json!({ "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": { "name": "builder", "labels": label("batch") } }),
        json!({ "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": { "name": "data", "labels": label("db") },
                "spec": { "accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
                          "resources": { "requests": { "storage": "1Gi" } } } }),
        json!({ "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": { "name": "deny", "labels": label("web") },
                "spec": { "podSelector": { "matchLabels": { "app": "web" } } } }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": { "name": "reader", "labels": label("web") },
                "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["get"] }] }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": { "name": "reader", "labels": label("web") },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader" },
                "subjects": [
                    { "kind": "User", "name": "ann", "apiGroup": "rbac.authorization.k8s.io" },
                    { "kind": "User", "name": "bob", "apiGroup": "rbac.authorization.k8s.io" },
                    { "kind": "Group", "name": "devs", "apiGroup": "rbac.authorization.k8s.io" },
                    { "kind": "ServiceAccount", "name": "builder", "namespace": ns },
                ] }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": { "name": format!("{ns}-reader"), "labels": label("web") },
                "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["get"] }] }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": { "name": format!("{ns}-reader"), "labels": label("web") },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{ns}-reader") },
                "subjects": [{ "kind": "Group", "name": "devs", "apiGroup": "rbac.authorization.k8s.io" }] }),
        json!({ "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": { "name": "web", "labels": label("web") },
                "spec": { "minAvailable": "50%", "selector": { "matchLabels": { "app": "web" } } } }),
        json!({ "apiVersion": format!("{widget_group}/v1"), "kind": "Widget",
                "metadata": { "name": "w-1", "labels": label("web") },
                "spec": { "size": "large", "replicas": 3, "enabled": true, "items": [{ "name": "first" }] },
                "status": { "since": "2026-01-01T00:00:00Z",
                            "conditions": [{ "type": "Synced", "status": "False" }, { "type": "Ready", "status": "True" }] } }),
        json!({ "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                "metadata": { "name": "web", "labels": label("web") },
                "spec": { "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "web" },
                          "minReplicas": 2, "maxReplicas": 10, "metrics": [
                    { "type": "Resource", "resource": { "name": "cpu", "target": { "type": "Utilization", "averageUtilization": 80 } } },
                    { "type": "Pods", "pods": { "metric": { "name": "qps" }, "target": { "type": "AverageValue", "averageValue": "1k" } } },
                    { "type": "External", "external": { "metric": { "name": "queue" }, "target": { "type": "Value", "value": "30" } } },
                ] } }),
        json!({ "apiVersion": "v1", "kind": "Event",
                "metadata": { "name": "running.backoff", "labels": label("web") },
                "involvedObject": { "kind": "Pod", "namespace": ns, "name": "running", "fieldPath": "spec.containers{web}" },
                "type": "Warning", "reason": "BackOff", "message": "Back-off restarting failed container",
                "source": { "component": "kubelet", "host": format!("{ns}-node") }, "count": 7,
                "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:10:00Z" }),
        json!({ "apiVersion": "v1", "kind": "Event",
                "metadata": { "name": "web.scaled", "labels": label("web") },
                "involvedObject": { "kind": "Deployment", "namespace": ns, "name": "web" },
                "type": "Normal", "reason": "ScalingReplicaSet", "message": "Scaled up replica set web-5d4f to 3",
                "reportingComponent": "deployment-controller", "reportingInstance": "kcm-1",
                "eventTime": "2026-01-01T00:00:00.000000Z", "action": "Scale" }),
        json!({ "apiVersion": format!("{widget_group}/v1"), "kind": "Widget",
                "metadata": { "name": "w-2", "labels": label("db") },
                "spec": { "size": 7 } }),
    ];
    for i in 0..5 {
        items.push(json!({ "apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": { "name": format!("settings-{i}"), "labels": label("web") },
                           "data": (0..i).map(|k| (format!("k{k}"), json!("v"))).collect::<serde_json::Map<_, _>>() }));
    }
    for (name, app) in [("running", "web"), ("crashing", "web"), ("pending", "db")] {
        items.push(json!({ "apiVersion": "v1", "kind": "Pod",
                           "metadata": { "name": name, "labels": label(app) },
                           "spec": { "nodeName": "node-a", "containers": template["spec"]["containers"] } }));
    }
    let admin_kubectl = Kubectl::new(control_plane.binaries().kubectl(), dir.join("home-admin"));
    let kubeconfig = control_plane.kubeconfig_path().to_path_buf();
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": items }).to_string();
    ensure_ok(
        "create the objects",
        &admin_kubectl
            .run(
                &kubeconfig,
                &args(&["create", "-n", ns, "-f", "-"]),
                Some(&list),
                KUBECTL_TIMEOUT,
            )
            .await?,
    )?;
    let now = jiff::Timestamp::now().as_second();
    let ago = |secs: i64| {
        jiff::Timestamp::from_second(now - secs)
            .map(|t| t.to_string())
            .unwrap_or_default()
    };
    let running = |name: &str, ready: bool, restarts: i64| {
        let mut c = json!({ "name": name, "image": "nginx:1.27", "imageID": "", "ready": ready,
                            "started": true, "restartCount": restarts,
                            "state": { "running": { "startedAt": ago(600) } } });
        if restarts > 0 {
            c["lastState"] = json!({ "terminated": { "exitCode": 1, "reason": "Error",
                                                     "startedAt": ago(900), "finishedAt": ago(330) } });
        }
        c
    };
    let statuses = [
        (
            "pods",
            "running",
            json!({ "status": {
            "phase": "Running", "podIP": "10.1.2.3", "podIPs": [{ "ip": "10.1.2.3" }], "hostIP": "192.0.2.1",
            "conditions": [{ "type": "Ready", "status": "True" }],
            "containerStatuses": [running("web", true, 3), running("log", true, 0)] } }),
        ),
        (
            "pods",
            "crashing",
            json!({ "status": {
            "phase": "Running", "podIP": "10.1.2.4", "podIPs": [{ "ip": "10.1.2.4" }],
            "containerStatuses": [
                { "name": "web", "image": "nginx:1.27", "imageID": "", "ready": false, "restartCount": 12,
                  "state": { "waiting": { "reason": "CrashLoopBackOff" } },
                  "lastState": { "terminated": { "exitCode": 2, "startedAt": ago(7300), "finishedAt": ago(7200) } } },
                running("log", true, 0),
            ] } }),
        ),
        (
            "deployments",
            "web",
            json!({ "status": {
            "replicas": 3, "readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2 } }),
        ),
        (
            "services",
            "lb",
            json!({ "status": { "loadBalancer": { "ingress": [
            { "ip": "203.0.113.10" }, { "hostname": "lb.example.com" } ] } } }),
        ),
    ];
    for (kind, name, status) in statuses {
        ensure_ok(
            &format!("status of {kind}/{name}"),
            &admin_kubectl
                .run(
                    &kubeconfig,
                    &args(&[
                        "patch",
                        kind,
                        name,
                        "-n",
                        ns,
                        "--subresource=status",
                        "--type=merge",
                        "-p",
                        &status.to_string(),
                    ]),
                    None,
                    KUBECTL_TIMEOUT,
                )
                .await?,
        )?;
    }
    let node = json!({ "apiVersion": "v1", "kind": "Node",
                       "metadata": { "name": format!("{ns}-node"), "labels": {
                           "tables": ns, "app": "web", "node-role.kubernetes.io/control-plane": "",
                           "kubernetes.io/role": "edge" } },
                       "spec": { "unschedulable": true } })
    .to_string();
    ensure_ok(
        "create the node",
        &admin_kubectl
            .run(
                &kubeconfig,
                &args(&["create", "-f", "-"]),
                Some(&node),
                KUBECTL_TIMEOUT,
            )
            .await?,
    )?;
    let node_status = json!({ "status": {
        "conditions": [{ "type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "none",
                         "lastHeartbeatTime": ago(10), "lastTransitionTime": ago(10) }],
        "addresses": [{ "type": "InternalIP", "address": "192.0.2.7" }, { "type": "Hostname", "address": "n" }],
        "nodeInfo": { "kubeletVersion": "v1.37.1", "kernelVersion": "6.1.0-13", "architecture": "amd64",
                      "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://2.0.0",
                      "operatingSystem": "linux", "machineID": "", "systemUUID": "", "bootID": "",
                      "kubeProxyVersion": "" } } });
    let hpa_status = json!({ "status": { "currentReplicas": 2, "desiredReplicas": 2, "currentMetrics": [
        { "type": "Resource", "resource": { "name": "cpu", "current": { "averageUtilization": 45, "averageValue": "120m" } } },
    ] } });
    for (kind, name, namespace, status) in [
        ("nodes", format!("{ns}-node"), None, node_status),
        (
            "horizontalpodautoscalers",
            "web".to_string(),
            Some(ns),
            hpa_status,
        ),
    ] {
        patch_status(&admin_kubectl, &kubeconfig, kind, &name, namespace, &status).await?;
    }
    ensure_ok(
        "label the namespace",
        &admin_kubectl
            .run(
                &kubeconfig,
                &args(&["label", "namespace", ns, &format!("tables={ns}"), "app=web"]),
                None,
                KUBECTL_TIMEOUT,
            )
            .await?,
    )?;
    Ok(())
}

/// Writes an object's status through the status subresource, as its controller would.
pub async fn patch_status(
    kubectl: &Kubectl,
    kubeconfig: &Path,
    kind: &str,
    name: &str,
    namespace: Option<&str>,
    status: &serde_json::Value,
) -> anyhow::Result<()> {
    let mut command = args(&[
        "patch",
        kind,
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
    if let Some(namespace) = namespace {
        command.extend(args(&["-n", namespace]));
    }
    ensure_ok(
        &format!("status of {kind}/{name}"),
        &kubectl
            .run(kubeconfig, &command, None, KUBECTL_TIMEOUT)
            .await?,
    )
}
