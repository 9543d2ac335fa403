//! The built-in printers' cells, rows and Table bodies, against what Kubernetes 1.37's
//! printers produce for the same objects (`printers_test.go` cases where they exist).

use serde_json::{Value, json};

use super::*;

fn now() -> Timestamp {
    "2026-01-01T12:00:00Z".parse().unwrap()
}

fn cells(kind: Builtin, o: Value) -> Vec<Value> {
    let (cells, _) = kind.cells(&o, now());
    assert_eq!(
        cells.len(),
        kind.columns().len(),
        "{kind:?}: one cell per column (the API server renders Tables wide)"
    );
    cells
}

fn running(name: &str, ready: bool, restarts: i64, last_finished: Option<&str>) -> Value {
    let mut c = json!({"name": name, "ready": ready, "restartCount": restarts,
                       "state": {"running": {"startedAt": "2026-01-01T10:00:00Z"}}});
    if let Some(f) = last_finished {
        c["lastState"] = json!({"terminated": {"exitCode": 1, "finishedAt": f}});
    }
    c
}

fn pod(containers: usize, statuses: Vec<Value>, extra: Value) -> Value {
    let mut o = json!({
        "metadata": {"name": "p", "namespace": "ns", "creationTimestamp": "2026-01-01T11:55:00Z"},
        "spec": {"containers": (0..containers).map(|i| json!({"name": format!("c{i}"), "image": "nginx"})).collect::<Vec<_>>()},
        "status": {"phase": "Running", "podIPs": [{"ip": "10.1.2.3"}], "containerStatuses": statuses},
    });
    merge(&mut o, extra);
    o
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

#[test]
fn pods_ready_status_restarts_and_wide_cells() {
    let p = pod(
        2,
        vec![
            running("c0", true, 0, None),
            running("c1", false, 3, Some("2026-01-01T11:55:00Z")),
        ],
        json!({"spec": {"nodeName": "node-1"}}),
    );
    assert_eq!(
        cells(Builtin::Pod, p),
        [
            json!("p"),
            json!("1/2"),
            json!("Running"),
            json!("3 (5m ago)"),
            json!("5m"),
            json!("10.1.2.3"),
            json!("node-1"),
            json!("<none>"),
            json!("<none>"),
        ]
    );
    // Restarts without a last termination time: the count alone.
    let p = pod(1, vec![running("c0", true, 2, None)], json!({}));
    assert_eq!(cells(Builtin::Pod, p)[3], json!("2"));
    // Waiting and terminated containers give the status; the first container wins (Go
    // walks them backwards).
    let p = pod(
        2,
        vec![
            json!({"name": "c0", "restartCount": 5, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                   "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-01-01T09:00:00Z"}}}),
            json!({"name": "c1", "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}),
        ],
        json!({}),
    );
    let c = cells(Builtin::Pod, p);
    assert_eq!(
        (&c[1], &c[2], &c[3]),
        (
            &json!("0/2"),
            &json!("CrashLoopBackOff"),
            &json!("5 (3h ago)")
        )
    );
    // Terminating, and the phase when nothing else is known.
    let p = pod(
        1,
        vec![running("c0", true, 0, None)],
        json!({"metadata": {"deletionTimestamp": "2026-01-01T11:59:00Z"}}),
    );
    assert_eq!(cells(Builtin::Pod, p)[2], json!("Terminating"));
    let p = pod(
        1,
        vec![],
        json!({"status": {"phase": "Pending", "podIPs": null}}),
    );
    let c = cells(Builtin::Pod, p);
    assert_eq!(
        (&c[1], &c[2], &c[5]),
        (&json!("0/1"), &json!("Pending"), &json!("<none>"))
    );
    // Readiness gates: how many of them are True.
    let p = pod(
        1,
        vec![running("c0", true, 0, None)],
        json!({"spec": {"readinessGates": [{"conditionType": "a"}, {"conditionType": "b"}]},
               "status": {"conditions": [{"type": "a", "status": "True"}, {"type": "b", "status": "False"}]}}),
    );
    assert_eq!(cells(Builtin::Pod, p)[8], json!("1/2"));
}

#[test]
fn pods_initializing_and_sidecars() {
    let init = |statuses: Value| {
        pod(
            1,
            vec![
                json!({"name": "c0", "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}),
            ],
            json!({"spec": {"initContainers": [{"name": "i0"}, {"name": "i1"}]},
                   "status": {"phase": "Pending", "initContainerStatuses": statuses}}),
        )
    };
    let c = cells(
        Builtin::Pod,
        init(json!([
            {"name": "i0", "restartCount": 0, "state": {"terminated": {"exitCode": 0}}},
            {"name": "i1", "restartCount": 1, "state": {"running": {}}},
        ])),
    );
    assert_eq!((&c[2], &c[3]), (&json!("Init:1/2"), &json!("1")));
    let c = cells(
        Builtin::Pod,
        init(json!([{"name": "i0", "restartCount": 0, "state": {"terminated": {"exitCode": 2}}}])),
    );
    assert_eq!(c[2], json!("Init:ExitCode:2"));
    let c = cells(
        Builtin::Pod,
        init(
            json!([{"name": "i0", "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff"}}}]),
        ),
    );
    assert_eq!(c[2], json!("Init:ImagePullBackOff"));
    // A restartable init container (sidecar) counts as a container once started.
    let p = pod(
        1,
        vec![running("c0", true, 0, None)],
        json!({"spec": {"initContainers": [{"name": "side", "restartPolicy": "Always"}]},
               "status": {"conditions": [{"type": "Initialized", "status": "True"}],
                          "initContainerStatuses": [{"name": "side", "restartCount": 1, "started": true, "ready": true,
                                                     "lastState": {"terminated": {"finishedAt": "2026-01-01T11:58:00Z"}},
                                                     "state": {"running": {}}}]}}),
    );
    let c = cells(Builtin::Pod, p);
    assert_eq!(
        (&c[1], &c[2], &c[3]),
        (&json!("2/2"), &json!("Running"), &json!("1 (2m ago)"))
    );
    // Succeeded pods carry the Completed row condition.
    let (_, conditions) = Builtin::Pod.cells(&json!({"status": {"phase": "Succeeded"}}), now());
    assert_eq!(conditions.unwrap()[0]["reason"], "Succeeded");
}

#[test]
fn workloads() {
    let template = json!({"spec": {"containers": [{"name": "web", "image": "nginx:1"}, {"name": "log", "image": "busybox"}]}});
    let created = "2026-01-01T09:00:00Z";
    let d = json!({"metadata": {"name": "d", "creationTimestamp": created},
                   "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": template},
                   "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}});
    assert_eq!(
        cells(Builtin::Deployment, d),
        [
            json!("d"),
            json!("2/3"),
            json!(3),
            json!(2),
            json!("3h"),
            json!("web,log"),
            json!("nginx:1,busybox"),
            json!("app=web")
        ]
    );
    let rs = json!({"metadata": {"name": "rs", "creationTimestamp": created},
                    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web", "pod-template-hash": "abc"}}, "template": template},
                    "status": {"replicas": 1}});
    assert_eq!(
        cells(Builtin::ReplicaSet, rs),
        [
            json!("rs"),
            json!(1),
            json!(1),
            json!(0),
            json!("3h"),
            json!("web,log"),
            json!("nginx:1,busybox"),
            json!("app=web,pod-template-hash=abc")
        ]
    );
    let sts = json!({"metadata": {"name": "s", "creationTimestamp": created}, "spec": {"replicas": 2, "template": template}});
    assert_eq!(cells(Builtin::StatefulSet, sts)[1], json!("0/2"));
    let ds = json!({"metadata": {"name": "ds", "creationTimestamp": created},
                    "spec": {"selector": {"matchLabels": {"k": "v"}}, "template": {"spec": {"nodeSelector": {"os": "linux"}, "containers": []}}},
                    "status": {"desiredNumberScheduled": 1, "currentNumberScheduled": 1, "numberReady": 1, "updatedNumberScheduled": 1, "numberAvailable": 1}});
    assert_eq!(
        cells(Builtin::DaemonSet, ds),
        [
            json!("ds"),
            json!(1),
            json!(1),
            json!(1),
            json!(1),
            json!(1),
            json!("os=linux"),
            json!("3h"),
            json!(""),
            json!(""),
            json!("k=v")
        ]
    );
    let job = json!({"metadata": {"name": "j", "creationTimestamp": created},
                     "spec": {"completions": 1, "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u"}}, "template": template},
                     "status": {"succeeded": 1, "startTime": "2026-01-01T09:00:00Z", "completionTime": "2026-01-01T09:00:07Z",
                                "conditions": [{"type": "Complete", "status": "True"}]}});
    let c = cells(Builtin::Job, job);
    assert_eq!(
        (&c[1], &c[2], &c[3]),
        (&json!("Complete"), &json!("1/1"), &json!("7s"))
    );
    let running_job = json!({"metadata": {"name": "j"}, "spec": {"parallelism": 3},
                             "status": {"startTime": "2026-01-01T11:00:00Z"}});
    let c = cells(Builtin::Job, running_job);
    assert_eq!(
        (&c[1], &c[2], &c[3], &c[4]),
        (
            &json!("Running"),
            &json!("0/1 of 3"),
            &json!("60m"),
            &json!("<unknown>")
        )
    );
    let cj = json!({"metadata": {"name": "cj", "creationTimestamp": created},
                    "spec": {"schedule": "*/5 * * * *", "suspend": false, "jobTemplate": {"spec": {"template": template}}},
                    "status": {"active": [{"name": "x"}], "lastScheduleTime": "2026-01-01T11:55:00Z"}});
    assert_eq!(
        cells(Builtin::CronJob, cj),
        [
            json!("cj"),
            json!("*/5 * * * *"),
            json!("<none>"),
            json!("False"),
            json!(1),
            json!("5m"),
            json!("3h"),
            json!("web,log"),
            json!("nginx:1,busybox"),
            json!("<none>")
        ]
    );
    let pdb = json!({"metadata": {"name": "pdb", "creationTimestamp": created},
                     "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1}});
    assert_eq!(
        cells(Builtin::PodDisruptionBudget, pdb),
        [
            json!("pdb"),
            json!("50%"),
            json!("N/A"),
            json!(1),
            json!("3h")
        ]
    );
}

#[test]
fn services_ingresses_and_the_rest() {
    let created = "2026-01-01T11:59:30Z";
    let svc = |spec: Value, status: Value| json!({"metadata": {"name": "s", "creationTimestamp": created}, "spec": spec, "status": status});
    assert_eq!(
        cells(
            Builtin::Service,
            svc(
                json!({"type": "ClusterIP", "clusterIPs": ["10.96.0.10"], "selector": {"app": "web"},
                       "ports": [{"port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}),
                json!({})
            )
        ),
        [
            json!("s"),
            json!("ClusterIP"),
            json!("10.96.0.10"),
            json!("<none>"),
            json!("80/TCP,53/UDP"),
            json!("30s"),
            json!("app=web")
        ]
    );
    let lb = cells(
        Builtin::Service,
        svc(
            json!({"type": "LoadBalancer", "clusterIPs": ["10.96.0.11"], "ports": [{"port": 443, "nodePort": 31443, "protocol": "TCP"}]}),
            json!({"loadBalancer": {}}),
        ),
    );
    assert_eq!(
        (&lb[3], &lb[4], &lb[6]),
        (
            &json!("<pending>"),
            &json!("443:31443/TCP"),
            &json!("<none>")
        )
    );
    let headless = cells(
        Builtin::Service,
        svc(
            json!({"type": "ClusterIP", "clusterIPs": ["None"]}),
            json!({}),
        ),
    );
    assert_eq!(
        (&headless[2], &headless[4]),
        (&json!("None"), &json!("<none>"))
    );
    let external = cells(
        Builtin::Service,
        svc(
            json!({"type": "ExternalName", "externalName": "db.example.com"}),
            json!({}),
        ),
    );
    assert_eq!(
        (&external[2], &external[3]),
        (&json!("<none>"), &json!("db.example.com"))
    );
    let ing = json!({"metadata": {"name": "i", "creationTimestamp": created},
                     "spec": {"ingressClassName": "nginx", "tls": [{}],
                              "rules": [{"host": "a"}, {"host": "b"}, {}, {"host": "d"}, {"host": "e"}]},
                     "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}});
    assert_eq!(
        cells(Builtin::Ingress, ing),
        [
            json!("i"),
            json!("nginx"),
            json!("a,b,d + 2 more..."),
            json!("1.2.3.4"),
            json!("80, 443"),
            json!("30s")
        ]
    );
    let cm = json!({"metadata": {"name": "c", "creationTimestamp": created}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": ""}});
    assert_eq!(
        cells(Builtin::ConfigMap, cm),
        [json!("c"), json!(3), json!("30s")]
    );
    let ns = json!({"metadata": {"name": "n", "creationTimestamp": created}, "status": {"phase": "Active"}});
    assert_eq!(
        cells(Builtin::Namespace, ns),
        [json!("n"), json!("Active"), json!("30s")]
    );
    let rb = json!({"metadata": {"name": "rb", "creationTimestamp": created},
                    "roleRef": {"kind": "ClusterRole", "name": "view"},
                    "subjects": [{"kind": "User", "name": "u1"}, {"kind": "User", "name": "u2"},
                                 {"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]});
    assert_eq!(
        cells(Builtin::RoleBinding, rb),
        [
            json!("rb"),
            json!("ClusterRole/view"),
            json!("30s"),
            json!("u1, u2"),
            json!(""),
            json!("ns/sa")
        ]
    );
    let np = json!({"metadata": {"name": "np", "creationTimestamp": created}, "spec": {}});
    assert_eq!(cells(Builtin::NetworkPolicy, np)[1], json!("<none>"));
    let pvc = json!({"metadata": {"name": "data", "creationTimestamp": created},
                     "spec": {"volumeName": "pv-1", "storageClassName": "standard", "volumeMode": "Filesystem"},
                     "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany", "ReadWriteOnce"]}});
    assert_eq!(
        cells(Builtin::PersistentVolumeClaim, pvc),
        [
            json!("data"),
            json!("Bound"),
            json!("pv-1"),
            json!("1Gi"),
            json!("RWO,RWX"),
            json!("standard"),
            json!("<unset>"),
            json!("30s"),
            json!("Filesystem")
        ]
    );
}

#[test]
fn rows_and_tables_as_the_api_server_writes_them() {
    let o = json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "c", "namespace": "n", "resourceVersion": "7", "creationTimestamp": "2026-01-01T11:00:00Z"},
                   "data": {"k": "v"}});
    let context = |include| TableContext {
        form: TableForm {
            version: TableVersion::V1,
            include,
        },
        printer: Printer::Builtin(Builtin::ConfigMap),
    };
    let row_of = |include| -> Value {
        serde_json::from_slice(&row(&context(include), &o, now()).unwrap()).unwrap()
    };
    assert_eq!(
        row_of(IncludeObject::Metadata),
        json!({"cells": ["c", 1, "60m"], "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}})
    );
    assert_eq!(
        row_of(IncludeObject::None),
        json!({"cells": ["c", 1, "60m"], "object": null})
    );
    assert_eq!(row_of(IncludeObject::Object)["object"], o);
    let body = table_body(
        TableVersion::V1beta1,
        Some(&Printer::Default.columns()),
        "42",
        Some("tok"),
        Some(5),
        &[Bytes::from_static(b"{\"cells\":[]}")],
    );
    let table: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["apiVersion"], "meta.k8s.io/v1beta1");
    assert_eq!(
        table["metadata"],
        json!({"resourceVersion": "42", "continue": "tok", "remainingItemCount": 5})
    );
    assert_eq!(table["columnDefinitions"][1]["name"], "Created At");
    assert_eq!(table["columnDefinitions"][1]["type"], "date");
    assert_eq!(table["columnDefinitions"][0]["priority"], 0);
    assert_eq!(table["rows"], json!([{"cells": []}]));
    let (cells, _) = Printer::Default.cells(&o, now());
    assert_eq!(cells, [json!("c"), json!("2026-01-01T11:00:00Z")]);
    let (cells, _) = Printer::Default.cells(&json!({"metadata": {"name": "x"}}), now());
    assert_eq!(cells[1], json!("0001-01-01T00:00:00Z"));
}

#[test]
fn nodes_events_and_autoscalers() {
    let node = json!({
        "metadata": {"name": "n1", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/": "",
                                "kubernetes.io/role": "edge", "node-role.kubernetes.io/worker": ""}},
        "spec": {"unschedulable": true},
        "status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "False"}],
                   "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.5"}],
                   "nodeInfo": {"kubeletVersion": "v1.37.1", "kernelVersion": "6.1.0", "architecture": "amd64",
                                "osImage": "Debian GNU/Linux 12", "containerRuntimeVersion": "containerd://2.0.0"}},
    });
    assert_eq!(
        cells(Builtin::Node, node),
        [
            json!("n1"),
            json!("NotReady,SchedulingDisabled"),
            json!("control-plane,edge,worker"),
            json!("12h"),
            json!("v1.37.1"),
            json!("10.0.0.5"),
            json!("<none>"),
            json!("Debian GNU/Linux 12"),
            json!("6.1.0 (amd64)"),
            json!("containerd://2.0.0")
        ]
    );
    let bare = cells(Builtin::Node, json!({"metadata": {"name": "n2"}}));
    assert_eq!(
        (&bare[1], &bare[2], &bare[8]),
        (&json!("Unknown"), &json!("<none>"), &json!("<unknown>"))
    );
    let event = json!({
        "metadata": {"name": "web.1"}, "type": "Warning", "reason": "BackOff",
        "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{web}"},
        "source": {"component": "kubelet", "host": "n1"}, "message": " Back-off restarting \n",
        "firstTimestamp": "2026-01-01T11:00:00Z", "lastTimestamp": "2026-01-01T11:58:00Z", "count": 7,
    });
    assert_eq!(
        cells(Builtin::Event, event),
        [
            json!("2m"),
            json!("Warning"),
            json!("BackOff"),
            json!("pod/web"),
            json!("spec.containers{web}"),
            json!("kubelet, n1"),
            json!("Back-off restarting"),
            json!("60m"),
            json!(7),
            json!("web.1")
        ]
    );
    let new_api = json!({
        "metadata": {"name": "e"}, "eventTime": "2026-01-01T11:59:00.123456Z",
        "reportingComponent": "ctrl", "involvedObject": {"kind": "Node"},
        "series": {"count": 3, "lastObservedTime": "2026-01-01T11:59:50.000000Z"},
    });
    let c = cells(Builtin::Event, new_api);
    assert_eq!(
        (&c[0], &c[3], &c[5], &c[7], &c[8]),
        (
            &json!("10s"),
            &json!("node"),
            &json!("ctrl"),
            &json!("59s"),
            &json!(3)
        )
    );
    let single = cells(Builtin::Event, json!({"metadata": {"name": "s"}}));
    assert_eq!((&single[0], &single[8]), (&json!("<unknown>"), &json!(1)));
    let hpa = json!({
        "metadata": {"name": "web", "creationTimestamp": "2026-01-01T11:00:00Z"},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 10,
                 "metrics": [
                     {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}},
                     {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "1k"}}},
                     {"type": "External", "external": {"metric": {"name": "q"}, "target": {"type": "Value", "value": "30"}}},
                 ]},
        "status": {"currentReplicas": 2, "currentMetrics": [
            {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 45, "averageValue": "120m"}}},
        ]},
    });
    assert_eq!(
        cells(Builtin::HorizontalPodAutoscaler, hpa),
        [
            json!("web"),
            json!("Deployment/web"),
            json!("cpu: 45%/80%, <unknown>/1k + 1 more..."),
            json!("<unset>"),
            json!(10),
            json!(2),
            json!("60m")
        ]
    );
    let memory = json!({"spec": {"minReplicas": 1, "metrics": [
        {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "512Mi"}}},
        {"type": "Object", "object": {"target": {"type": "AverageValue", "averageValue": "2"}}},
    ]}});
    let c = cells(Builtin::HorizontalPodAutoscaler, memory);
    assert_eq!(
        (&c[2], &c[3]),
        (
            &json!("memory: <unknown>/512Mi, <unknown>/2 (avg)"),
            &json!("1")
        )
    );
    assert_eq!(
        cells(Builtin::HorizontalPodAutoscaler, json!({}))[2],
        json!("<none>")
    );
}
