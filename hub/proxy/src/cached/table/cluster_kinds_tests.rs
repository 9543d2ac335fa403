//! The printers ported for the cluster's other built-in kinds (storage, endpoints, control
//! plane, admission, events.k8s.io), against the cells Kubernetes 1.37's `printers_test.go`
//! expects for the same objects (its cases, in JSON) and the Go code's other branches.

use serde_json::{Value, json};

use super::*;

pub(super) fn now() -> Timestamp {
    "2026-01-01T12:00:00Z".parse().unwrap()
}

/// Object `o` with a name and a creation time five minutes before [`now`].
pub(super) fn object(mut o: Value) -> Value {
    let meta = o
        .as_object_mut()
        .unwrap()
        .entry("metadata")
        .or_insert(json!({}));
    meta["creationTimestamp"] = json!("2026-01-01T11:55:00Z");
    if meta.get("name").is_none() {
        meta["name"] = json!("x");
    }
    o
}

fn cells(group: &str, resource: &str, o: Value) -> Vec<Value> {
    let kind = Builtin::of(group, resource).unwrap();
    let (cells, conditions) = kind.cells(&object(o), now());
    assert_eq!(conditions, None);
    assert_eq!(
        cells.len(),
        kind.columns().len(),
        "{kind:?}: one cell per column (the API server renders Tables wide)"
    );
    cells
}

#[test]
fn endpoints_as_printers_test_expects() {
    let ep = |subsets: Value| cells("", "endpoints", json!({"subsets": subsets}));
    assert_eq!(ep(json!(null)), [json!("x"), json!("<none>"), json!("5m")]);
    assert_eq!(
        ep(json!([{"addresses": [{"ip": "1.2.3.4"}, {"ip": "5.6.7.8"}]}]))[1],
        "1.2.3.4,5.6.7.8"
    );
    assert_eq!(
        ep(
            json!([{"addresses": [{"ip": "1.2.3.4"}, {"ip": "5.6.7.8"}], "ports": [{"port": 8001}]}])
        )[1],
        "1.2.3.4:8001,5.6.7.8:8001"
    );
    let four = json!([{"addresses": [{"ip": "1.2.3.4"}, {"ip": "5.6.7.8"}, {"ip": "9.8.7.6"}, {"ip": "6.6.6.6"}],
                       "ports": [{"port": 8001}]}]);
    assert_eq!(
        ep(four)[1],
        "1.2.3.4:8001,5.6.7.8:8001,9.8.7.6:8001 + 1 more..."
    );
    // Each port counts every address again; IPv6 in brackets (`net.JoinHostPort`).
    assert_eq!(
        ep(
            json!([{"addresses": [{"ip": "2001:db8::1"}, {"ip": "10.0.0.1"}],
                   "ports": [{"port": 80}, {"port": 443}]}])
        )[1],
        "[2001:db8::1]:80,10.0.0.1:80,[2001:db8::1]:443 + 1 more..."
    );
}

#[test]
fn endpoint_slices_as_printers_test_expects() {
    let slice = |ports: Value, endpoints: Value| {
        cells(
            "discovery.k8s.io",
            "endpointslices",
            json!({"addressType": "IPv4", "ports": ports, "endpoints": endpoints}),
        )
    };
    let two = json!([{"addresses": ["10.1.2.3", "2001:db8::1234:5678"]},
                     {"addresses": ["10.2.3.4", "2001:db8::2345:6789"]}]);
    assert_eq!(
        slice(
            json!([{"name": "http", "port": 80}]),
            json!([{"addresses": ["10.1.2.3", "2001:db8::1234:5678"]}])
        ),
        [
            json!("x"),
            json!("IPv4"),
            json!("80"),
            json!("10.1.2.3,2001:db8::1234:5678"),
            json!("5m")
        ]
    );
    let four_ports = json!([{"port": 80}, {"port": 443}, {"port": 3000}, {"port": 3001}]);
    let c = slice(four_ports, two);
    assert_eq!(c[2], "80,443,3000 + 1 more...");
    assert_eq!(c[3], "10.1.2.3,2001:db8::1234:5678,10.2.3.4 + 1 more...");
    // A port without a number prints its name, else `*`; nothing at all is `<unset>`.
    let c = slice(json!([{"name": "dns"}, {}]), json!([]));
    assert_eq!(c[2], "dns,*");
    assert_eq!(c[3], "<unset>");
}

#[test]
fn persistent_volumes_and_storage() {
    let pv = cells(
        "",
        "persistentvolumes",
        json!({"metadata": {"name": "pv"},
               "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteMany", "ReadWriteOnce", "ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain", "claimRef": {"namespace": "ns", "name": "data"},
                        "storageClassName": "fast", "volumeMode": "Block"},
               "status": {"phase": "Failed", "reason": "Broken"}}),
    );
    assert_eq!(
        pv,
        [
            "pv", "5Gi", "RWO,RWX", "Retain", "Failed", "ns/data", "fast", "<unset>", "Broken",
            "5m", "Block"
        ]
        .map(|s| json!(s))
    );
    let deleting = cells(
        "",
        "persistentvolumes",
        json!({"metadata": {"deletionTimestamp": "2026-01-01T11:59:00Z",
                            "annotations": {"volume.beta.kubernetes.io/storage-class": "beta"}},
               "spec": {"storageClassName": "fast", "volumeAttributesClassName": "gold"},
               "status": {"phase": "Bound"}}),
    );
    assert_eq!(
        deleting,
        [
            "x",
            "0",
            "",
            "",
            "Terminating",
            "",
            "beta",
            "gold",
            "",
            "5m",
            "<unset>"
        ]
        .map(|s| json!(s))
    );
    assert_eq!(
        cells(
            "storage.k8s.io",
            "storageclasses",
            json!({"provisioner": "csi.example.com"})
        ),
        [
            json!("x"),
            json!("csi.example.com"),
            json!("Delete"),
            json!("Immediate"),
            json!(false),
            json!("5m")
        ]
    );
    assert_eq!(
        cells(
            "storage.k8s.io",
            "storageclasses",
            json!({"provisioner": "p", "reclaimPolicy": "Retain",
                   "volumeBindingMode": "WaitForFirstConsumer", "allowVolumeExpansion": true})
        )[2..5],
        [json!("Retain"), json!("WaitForFirstConsumer"), json!(true)]
    );
    assert_eq!(
        cells(
            "storage.k8s.io",
            "volumeattachments",
            json!({"spec": {"attacher": "csi.example.com", "nodeName": "n1",
                            "source": {"persistentVolumeName": "pv"}},
                   "status": {"attached": true}})
        ),
        [
            json!("x"),
            json!("csi.example.com"),
            json!("pv"),
            json!("n1"),
            json!(true),
            json!("5m")
        ]
    );
    assert_eq!(
        cells(
            "storage.k8s.io",
            "csinodes",
            json!({"spec": {"drivers": [{"name": "a"}, {"name": "b"}]}})
        ),
        [json!("x"), json!(2), json!("5m")]
    );
    // The defaults: attach required, no pod info, no capacity, tokens unset, no modes.
    assert_eq!(
        cells("storage.k8s.io", "csidrivers", json!({"spec": {}})),
        [
            json!("x"),
            json!(true),
            json!(false),
            json!(false),
            json!("<unset>"),
            json!(false),
            json!("<none>"),
            json!("5m")
        ]
    );
    assert_eq!(
        cells(
            "storage.k8s.io",
            "csidrivers",
            json!({"spec": {"attachRequired": false, "podInfoOnMount": true, "storageCapacity": true,
                            "tokenRequests": [{"audience": "a"}, {"audience": "b"}], "requiresRepublish": true,
                            "volumeLifecycleModes": ["Persistent", "Ephemeral"]}})
        ),
        [
            json!("x"),
            json!(false),
            json!(true),
            json!(true),
            json!("a,b"),
            json!(true),
            json!("Persistent,Ephemeral"),
            json!("5m")
        ]
    );
}

#[test]
fn quotas_revisions_and_requests() {
    // printers_test.go's TestPrintResourceQuota.
    let quota = cells(
        "",
        "resourcequotas",
        json!({"metadata": {"name": "test-resourcequota"}, "status": {
            "used": {"cpu": "1", "memory": "1Gi", "pods": "1", "services": "1", "replicationcontrollers": "1",
                     "resourcequotas": "1", "limits.cpu": "2", "limits.memory": "2Gi"},
            "hard": {"cpu": "100", "memory": "4Gi", "pods": "10", "services": "10", "replicationcontrollers": "10",
                     "resourcequotas": "1", "limits.cpu": "200", "limits.memory": "8Gi"}}}),
    );
    assert_eq!(
        quota,
        [
            "test-resourcequota",
            "cpu: 1/100, memory: 1Gi/4Gi, pods: 1/10, replicationcontrollers: 1/10, resourcequotas: 1/1, services: 1/10",
            "limits.cpu: 2/200, limits.memory: 2Gi/8Gi",
            "5m"
        ]
        .map(|s| json!(s))
    );
    // Not yet counted by the controller: used is Go's zero Quantity.
    assert_eq!(
        cells(
            "",
            "resourcequotas",
            json!({"status": {"hard": {"pods": "3"}}})
        )[1..3],
        [json!("pods: 0/3"), json!("")]
    );
    // printers_test.go's TestPrintControllerRevision.
    let revision = |owners: Value, n: i64| {
        cells(
            "apps",
            "controllerrevisions",
            json!({"metadata": {"ownerReferences": owners}, "revision": n}),
        )
    };
    assert_eq!(
        revision(
            json!([{"controller": true, "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "foo"}]),
            1
        ),
        [
            json!("x"),
            json!("daemonset.apps/foo"),
            json!(1),
            json!("5m")
        ]
    );
    assert_eq!(
        revision(
            json!([{"controller": false, "kind": "ABC", "name": "foo"}]),
            2
        )[1],
        "<none>"
    );
    assert_eq!(revision(json!(null), 4)[1], "<none>");
    assert_eq!(
        revision(
            json!([{"controller": true, "apiVersion": "v1", "kind": "Pod", "name": "p"}]),
            5
        )[1],
        "pod/p"
    );
    let csr = |spec: Value, status: Value| {
        cells(
            "certificates.k8s.io",
            "certificatesigningrequests",
            json!({"spec": spec, "status": status}),
        )
    };
    assert_eq!(
        csr(json!({"username": "CSRRequestor"}), json!({})),
        ["x", "5m", "<none>", "CSRRequestor", "<none>", "Pending"].map(|s| json!(s))
    );
    assert_eq!(
        csr(
            json!({"signerName": "example.com/signer", "username": "u", "expirationSeconds": 7200}),
            json!({"conditions": [{"type": "Approved"}, {"type": "Failed"}], "certificate": "Y2VydA=="})
        )[2..],
        ["example.com/signer", "u", "120m", "Approved,Failed,Issued"].map(|s| json!(s))
    );
    assert_eq!(
        csr(
            json!({}),
            json!({"conditions": [{"type": "Approved"}, {"type": "Denied"}]})
        )[5],
        "Denied"
    );
}

#[test]
fn control_plane_kinds() {
    let crd = cells(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        json!({"metadata": {"name": "widgets.example.com"},
               "spec": {"group": "example.com", "scope": "Namespaced",
                        "names": {"kind": "Widget", "shortNames": ["wd", "wg"]},
                        "versions": [{"name": "v2", "served": true, "storage": false},
                                     {"name": "v1", "served": true, "storage": true},
                                     {"name": "v0", "served": false, "storage": false}]},
               "status": {"conditions": [{"type": "NamesAccepted", "status": "True"},
                                         {"type": "Established", "status": "True"}]}}),
    );
    assert_eq!(
        crd,
        [
            json!("widgets.example.com"),
            json!("Namespaced"),
            json!("v1(storage),v2"),
            json!("2026-01-01T11:55:00Z"),
            json!("example.com"),
            json!("Widget"),
            json!("wd,wg"),
            json!(true)
        ]
    );
    let api_service = |spec: Value, conditions: Value| {
        cells(
            "apiregistration.k8s.io",
            "apiservices",
            json!({"spec": spec, "status": {"conditions": conditions}}),
        )
    };
    assert_eq!(
        api_service(
            json!({}),
            json!([{"type": "Available", "status": "True", "reason": "Local"}])
        ),
        [json!("x"), json!("Local"), json!("True"), json!("5m")]
    );
    assert_eq!(
        api_service(
            json!({"service": {"namespace": "kube-system", "name": "metrics-server"}}),
            json!([{"type": "Available", "status": "False", "reason": "MissingEndpoints"}])
        )[1..3],
        [
            json!("kube-system/metrics-server"),
            json!("False (MissingEndpoints)")
        ]
    );
    assert_eq!(api_service(json!({}), json!(null))[2], "Unknown");
    for resource in [
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
    ] {
        assert_eq!(
            cells(
                "admissionregistration.k8s.io",
                resource,
                json!({"webhooks": [{"name": "a"}, {"name": "b"}]})
            ),
            [json!("x"), json!(2), json!("5m")]
        );
    }
    assert_eq!(
        cells(
            "coordination.k8s.io",
            "leases",
            json!({"spec": {"holderIdentity": "kcm-1"}})
        ),
        [json!("x"), json!("kcm-1"), json!("5m")]
    );
    assert_eq!(
        cells("coordination.k8s.io", "leases", json!({"spec": {}}))[1],
        ""
    );
    assert_eq!(
        cells(
            "scheduling.k8s.io",
            "priorityclasses",
            json!({"value": 1000, "globalDefault": true, "preemptionPolicy": "Never"})
        ),
        [
            json!("x"),
            json!(1000),
            json!(true),
            json!("5m"),
            json!("Never")
        ]
    );
    assert_eq!(
        cells("scheduling.k8s.io", "priorityclasses", json!({"value": -5}))[1..],
        [json!(-5), json!(false), json!("5m"), json!("")]
    );
    assert_eq!(
        cells("node.k8s.io", "runtimeclasses", json!({"handler": "runc"})),
        [json!("x"), json!("runc"), json!("5m")]
    );
}

#[test]
fn workload_templates_and_classes() {
    let template = json!({"metadata": {"labels": {"b": "2", "a": "1"}},
                          "spec": {"containers": [{"name": "c1", "image": "i1"}, {"name": "c2", "image": "i2"}]}});
    assert_eq!(
        cells("", "podtemplates", json!({"template": template})),
        [json!("x"), json!("c1,c2"), json!("i1,i2"), json!("a=1,b=2")]
    );
    assert_eq!(
        cells("", "podtemplates", json!({"template": {}}))[1..],
        [json!(""), json!(""), json!("<none>")]
    );
    assert_eq!(
        cells(
            "",
            "replicationcontrollers",
            json!({"spec": {"replicas": 5, "selector": {"app": "web"}, "template": template},
                   "status": {"replicas": 3, "readyReplicas": 2}})
        ),
        [
            json!("x"),
            json!(5),
            json!(3),
            json!(2),
            json!("5m"),
            json!("c1,c2"),
            json!("i1,i2"),
            json!("app=web")
        ]
    );
    let class = |meta: Value, spec: Value| {
        cells(
            "networking.k8s.io",
            "ingressclasses",
            json!({"metadata": meta, "spec": spec}),
        )
    };
    assert_eq!(
        class(
            json!({"name": "nginx"}),
            json!({"controller": "k8s.io/ingress-nginx"})
        ),
        [
            json!("nginx"),
            json!("k8s.io/ingress-nginx"),
            json!("<none>"),
            json!("5m")
        ]
    );
    let default = json!({"name": "nginx", "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}});
    assert_eq!(
        class(
            default,
            json!({"controller": "c", "parameters": {"apiGroup": "k8s.example.com", "kind": "IngressParameters", "name": "external-lb"}})
        )[..3],
        [
            json!("nginx (default)"),
            json!("c"),
            json!("IngressParameters.k8s.example.com/external-lb")
        ]
    );
    assert_eq!(
        class(
            json!({}),
            json!({"parameters": {"kind": "ConfigMap", "name": "cm"}})
        )[2],
        "ConfigMap/cm"
    );
}

/// An `events.k8s.io/v1` Event prints as the same event in core/v1 does.
#[test]
fn events_k8s_io_events_print_as_core_events() {
    let core = json!({"metadata": {"name": "e"},
        "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{web}"},
        "type": "Warning", "reason": "BackOff", "message": " Back-off ",
        "source": {"component": "kubelet", "host": "n1"}, "count": 7,
        "firstTimestamp": "2026-01-01T11:00:00Z", "lastTimestamp": "2026-01-01T11:50:00Z"});
    let v1 = json!({"metadata": {"name": "e"},
        "regarding": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{web}"},
        "type": "Warning", "reason": "BackOff", "note": " Back-off ",
        "deprecatedSource": {"component": "kubelet", "host": "n1"}, "deprecatedCount": 7,
        "deprecatedFirstTimestamp": "2026-01-01T11:00:00Z", "deprecatedLastTimestamp": "2026-01-01T11:50:00Z"});
    let printed = cells("events.k8s.io", "events", v1);
    assert_eq!(printed, cells("", "events", core));
    assert_eq!(
        printed,
        [
            json!("10m"),
            json!("Warning"),
            json!("BackOff"),
            json!("pod/web"),
            json!("spec.containers{web}"),
            json!("kubelet, n1"),
            json!("Back-off"),
            json!("60m"),
            json!(7),
            json!("e")
        ]
    );
    // The new API's series and reporting controller.
    let series = cells(
        "events.k8s.io",
        "events",
        json!({"regarding": {"kind": "Deployment", "name": "web"}, "type": "Normal", "reason": "Scaled",
               "note": "n", "eventTime": "2026-01-01T11:00:00.000000Z", "reportingController": "deployment-controller",
               "reportingInstance": "kcm-1", "series": {"count": 4, "lastObservedTime": "2026-01-01T11:58:00.000000Z"}}),
    );
    assert_eq!(series[0], "2m");
    assert_eq!(series[5], "deployment-controller, kcm-1");
    assert_eq!(series[7], "60m");
    assert_eq!(series[8], 4);
}

/// Which kinds have a printer, which the API server's default Table, which are tunnelled.
#[test]
fn printers_of_the_cluster_kinds() {
    for (group, resource) in [
        ("", "podtemplates"),
        ("", "replicationcontrollers"),
        ("", "endpoints"),
        ("", "persistentvolumes"),
        ("", "resourcequotas"),
        ("events.k8s.io", "events"),
        ("networking.k8s.io", "ingressclasses"),
        ("discovery.k8s.io", "endpointslices"),
        ("storage.k8s.io", "storageclasses"),
        ("storage.k8s.io", "volumeattachments"),
        ("storage.k8s.io", "csidrivers"),
        ("storage.k8s.io", "csinodes"),
        ("coordination.k8s.io", "leases"),
        ("scheduling.k8s.io", "priorityclasses"),
        ("node.k8s.io", "runtimeclasses"),
        ("apps", "controllerrevisions"),
        ("certificates.k8s.io", "certificatesigningrequests"),
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
        ),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
        ),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("apiregistration.k8s.io", "apiservices"),
        (
            "admissionregistration.k8s.io",
            "validatingadmissionpolicies",
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingadmissionpolicybindings",
        ),
        ("flowcontrol.apiserver.k8s.io", "flowschemas"),
        ("networking.k8s.io", "ipaddresses"),
        ("certificates.k8s.io", "clustertrustbundles"),
        ("resource.k8s.io", "resourceslices"),
        ("storage.k8s.io", "volumeattributesclasses"),
        ("storagemigration.k8s.io", "storageversionmigrations"),
    ] {
        assert!(
            Builtin::of(group, resource).is_some(),
            "{group}/{resource} has a printer"
        );
    }
    for (group, resource) in [
        ("", "secrets"),
        ("", "componentstatuses"),
        ("storage.k8s.io", "csistoragecapacities"),
        ("coordination.k8s.io", "leasecandidates"),
        ("internal.apiserver.k8s.io", "storageversions"),
        ("resource.k8s.io", "resourcepoolstatusrequests"),
        ("scheduling.k8s.io", "workloads"),
        ("networking.k8s.io", "somethingelse"),
    ] {
        assert_eq!(Builtin::of(group, resource), None, "{group}/{resource}");
    }
}
