//! The printers of the groups ported last (admission policies, flow control, the Service IP
//! allocator, certificates, `resource.k8s.io`, VolumeAttributesClasses,
//! StorageVersionMigrations), and every printer's row of the empty object a bookmark
//! carries, against the cells Kubernetes 1.37's own printers
//! (`pkg/printers/internalversion`, run on the same objects converted to their internal
//! types, `Wide` as the API server renders Tables) make of them.

use serde_json::{Value, json};

use super::{
    cluster_kinds_tests::{now, object},
    *,
};

/// The cells of `o` (named `x`, created five minutes before [`now`]) as a `group/resource`
/// (unlike the built-in kinds' older printers, some write more cells than they declare
/// columns: IPAddresses).
fn cells(group: &str, resource: &str, o: Value) -> Vec<Value> {
    let kind = Builtin::of(group, resource).unwrap();
    let (cells, conditions) = kind.cells(&object(o), now());
    assert_eq!(conditions, None);
    cells
}

const ADMISSION: &str = "admissionregistration.k8s.io";

#[test]
fn admission_policies_and_bindings() {
    let policy = |spec: Value| {
        cells(
            ADMISSION,
            "validatingadmissionpolicies",
            json!({"spec": spec}),
        )
    };
    assert_eq!(
        policy(
            json!({"validations": [{"expression": "true"}, {"expression": "false"}],
                      "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}})
        ),
        [json!("x"), json!(2), json!("v1/ConfigMap"), json!("5m")]
    );
    assert_eq!(
        policy(json!({})),
        [json!("x"), json!(0), json!("<unset>"), json!("5m")]
    );
    let mutating = |spec: Value| {
        cells(
            ADMISSION,
            "mutatingadmissionpolicies",
            json!({"spec": spec}),
        )
    };
    assert_eq!(
        mutating(json!({"mutations": [{"patchType": "ApplyConfiguration"}]})),
        [json!("x"), json!(1), json!("<unset>"), json!("5m")]
    );
    assert_eq!(
        mutating(json!({"paramKind": {"apiVersion": "example.com/v1", "kind": "Params"}}))[1..3],
        [json!(0), json!("example.com/v1/Params")]
    );
    let binding = |resource: &str, param_ref: Value| {
        let spec = match param_ref {
            Value::Null => json!({"policyName": "p"}),
            r => json!({"policyName": "p", "paramRef": r}),
        };
        cells(ADMISSION, resource, json!({"spec": spec}))
    };
    for resource in [
        "validatingadmissionpolicybindings",
        "mutatingadmissionpolicybindings",
    ] {
        assert_eq!(
            binding(resource, json!({"name": "cfg", "namespace": "ns"})),
            [json!("x"), json!("p"), json!("ns/cfg"), json!("5m")]
        );
        assert_eq!(binding(resource, json!({"name": "cfg"}))[2], "*/cfg");
        assert_eq!(binding(resource, Value::Null)[2], "<unset>");
        assert_eq!(
            binding(
                resource,
                json!({"selector": {"matchLabels": {"b": "2", "a": "1"},
                                    "matchExpressions": [
                                        {"key": "env", "operator": "In", "values": ["prod", "dev"]},
                                        {"key": "gpu", "operator": "Exists"}]}})
            )[2],
            "&LabelSelector{MatchLabels:map[string]string{a: 1,b: 2,},MatchExpressions:[]LabelSelectorRequirement{LabelSelectorRequirement{Key:env,Operator:In,Values:[prod dev],},LabelSelectorRequirement{Key:gpu,Operator:Exists,Values:[],},},}"
        );
        assert_eq!(
            binding(resource, json!({"selector": {}}))[2],
            "&LabelSelector{MatchLabels:map[string]string{},MatchExpressions:[]LabelSelectorRequirement{},}"
        );
    }
}

#[test]
fn flow_schemas_and_priority_levels() {
    const GROUP: &str = "flowcontrol.apiserver.k8s.io";
    let schema = |o: Value| cells(GROUP, "flowschemas", o);
    assert_eq!(
        schema(json!({
            "spec": {"priorityLevelConfiguration": {"name": "workload-low"}, "matchingPrecedence": 9000,
                     "distinguisherMethod": {"type": "ByUser"}},
            "status": {"conditions": [{"type": "Other", "status": "True"},
                                      {"type": "Dangling", "status": "False"},
                                      {"type": "Dangling", "status": "True"}]},
        })),
        [
            json!("x"),
            json!("workload-low"),
            json!(9000),
            json!("ByUser"),
            json!("5m"),
            json!("False")
        ]
    );
    assert_eq!(
        schema(
            json!({"spec": {"priorityLevelConfiguration": {"name": "exempt"}, "matchingPrecedence": 1}})
        ),
        [
            json!("x"),
            json!("exempt"),
            json!(1),
            json!("<none>"),
            json!("5m"),
            json!("?")
        ]
    );
    let level = |spec: Value| cells(GROUP, "prioritylevelconfigurations", json!({"spec": spec}));
    assert_eq!(
        level(
            json!({"type": "Limited", "limited": {"nominalConcurrencyShares": 30, "limitResponse": {
            "type": "Queue", "queuing": {"queues": 64, "handSize": 6, "queueLengthLimit": 50}}}})
        ),
        [
            json!("x"),
            json!("Limited"),
            json!(30),
            json!(64),
            json!(6),
            json!(50),
            json!("5m")
        ]
    );
    assert_eq!(
        level(
            json!({"type": "Limited", "limited": {"nominalConcurrencyShares": 5,
                                                    "limitResponse": {"type": "Reject"}}})
        ),
        [
            json!("x"),
            json!("Limited"),
            json!(5),
            json!("<none>"),
            json!("<none>"),
            json!("<none>"),
            json!("5m")
        ]
    );
    assert_eq!(
        level(json!({"type": "Exempt", "exempt": {}})),
        [
            json!("x"),
            json!("Exempt"),
            json!("<none>"),
            json!("<none>"),
            json!("<none>"),
            json!("<none>"),
            json!("5m")
        ]
    );
}

#[test]
fn service_cidrs_and_ip_addresses() {
    const GROUP: &str = "networking.k8s.io";
    assert_eq!(
        cells(
            GROUP,
            "servicecidrs",
            json!({"spec": {"cidrs": ["10.96.0.0/12", "fd00::/108"]}})
        ),
        [json!("x"), json!("10.96.0.0/12,fd00::/108"), json!("5m")]
    );
    assert_eq!(cells(GROUP, "servicecidrs", json!({}))[1], "");
    let ip = |spec: Value| cells(GROUP, "ipaddresses", json!({"spec": spec}));
    // Three cells for two columns, as the API server writes them.
    assert_eq!(
        ip(
            json!({"parentRef": {"group": "", "resource": "Services", "namespace": "default", "name": "kubernetes"}})
        ),
        [
            json!("x"),
            json!("services/default/kubernetes"),
            json!("5m")
        ]
    );
    assert_eq!(
        ip(
            json!({"parentRef": {"group": "Gateway.Networking.k8s.io", "resource": "gateways", "name": "gw"}})
        )[1],
        "gateways.gateway.networking.k8s.io/gw"
    );
    assert_eq!(ip(json!({}))[1], "<none>");
    assert_eq!(
        Builtin::of(GROUP, "ipaddresses").unwrap().columns().len(),
        2
    );
}

#[test]
fn trust_bundles_and_pod_certificate_requests() {
    const GROUP: &str = "certificates.k8s.io";
    let bundle = |spec: Value| cells(GROUP, "clustertrustbundles", json!({"spec": spec}));
    assert_eq!(
        bundle(json!({"signerName": "example.com/foo", "trustBundle": "x"})),
        [json!("x"), json!("example.com/foo")]
    );
    assert_eq!(bundle(json!({"trustBundle": "x"}))[1], "<none>");
    let request = |o: Value| cells(GROUP, "podcertificaterequests", o);
    // The last of Issued, Denied and Failed wins whatever its status, as in Go.
    assert_eq!(
        request(json!({
            "spec": {"podName": "p", "serviceAccountName": "sa", "nodeName": "n1", "signerName": "example.com/s",
                     "unverifiedUserAnnotations": {"b.example.com/y": "2", "a.example.com/x": "1"}},
            "status": {"conditions": [{"type": "Issued", "status": "True"}, {"type": "Failed", "status": "False"}]},
        })),
        [
            json!("x"),
            json!("p"),
            json!("sa"),
            json!("n1"),
            json!("example.com/s"),
            json!("Failed"),
            json!("a.example.com/x=1,b.example.com/y=2")
        ]
    );
    assert_eq!(
        request(json!({"spec": {"podName": "p"}})),
        [
            json!("x"),
            json!("p"),
            json!(""),
            json!(""),
            json!(""),
            json!("Pending"),
            json!("<none>")
        ]
    );
}

#[test]
fn dynamic_resource_allocation_kinds() {
    const GROUP: &str = "resource.k8s.io";
    assert_eq!(
        cells(GROUP, "deviceclasses", json!({"spec": {}})),
        [json!("x"), json!("5m")]
    );
    assert_eq!(
        cells(
            GROUP,
            "resourceclaimtemplates",
            json!({"spec": {"spec": {}}})
        ),
        [json!("x"), json!("5m")]
    );
    let claim = |deleted: bool, status: Value| {
        let mut o = json!({"spec": {}, "status": status});
        if deleted {
            o["metadata"] = json!({"deletionTimestamp": "2026-01-01T11:59:50Z"});
        }
        cells(GROUP, "resourceclaims", o)[1].clone()
    };
    let allocated = json!({"allocation": {"devices": {}}});
    let reserved = json!({"allocation": {"devices": {}},
                          "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]});
    assert_eq!(claim(false, json!({})), "pending");
    assert_eq!(claim(true, json!({})), "deleted");
    assert_eq!(claim(false, allocated), "allocated");
    assert_eq!(claim(false, reserved.clone()), "allocated,reserved");
    assert_eq!(claim(true, reserved), "deleted,allocated,reserved");
    let slice = |spec: Value| cells(GROUP, "resourceslices", json!({"spec": spec}));
    assert_eq!(
        slice(json!({"nodeName": "worker-1", "driver": "gpu.example.com",
                     "pool": {"name": "pool-a", "generation": 1, "resourceSliceCount": 1}})),
        [
            json!("x"),
            json!("worker-1"),
            json!("gpu.example.com"),
            json!("pool-a"),
            json!("5m")
        ]
    );
    assert_eq!(
        slice(json!({"allNodes": true, "driver": "gpu.example.com",
                     "pool": {"name": "shared", "generation": 1, "resourceSliceCount": 1}}))[1],
        ""
    );
    let taint = |taint: Value| cells(GROUP, "devicetaintrules", json!({"spec": {"taint": taint}}));
    assert_eq!(
        taint(
            json!({"key": "example.com/broken", "value": "yes", "effect": "NoExecute",
                     "timeAdded": "2026-01-01T10:00:00Z"})
        ),
        [
            json!("x"),
            json!("example.com/broken"),
            json!("yes"),
            json!("NoExecute"),
            json!("120m"),
            json!("5m")
        ]
    );
    assert_eq!(
        taint(json!({"key": "k", "effect": "NoSchedule"})),
        [
            json!("x"),
            json!("k"),
            json!(""),
            json!("NoSchedule"),
            json!(""),
            json!("5m")
        ]
    );
}

#[test]
fn volume_attributes_classes_and_storage_version_migrations() {
    assert_eq!(
        cells(
            "storage.k8s.io",
            "volumeattributesclasses",
            json!({"driverName": "csi.example.com", "parameters": {"iops": "100"}})
        ),
        [json!("x"), json!("csi.example.com"), json!("5m")]
    );
    let migration = |resource: Value, conditions: Value| {
        cells(
            "storagemigration.k8s.io",
            "storageversionmigrations",
            json!({"spec": {"resource": resource}, "status": {"conditions": conditions}}),
        )
    };
    assert_eq!(
        migration(
            json!({"group": "apps", "resource": "deployments"}),
            json!([{"type": "Running", "status": "True"}, {"type": "Succeeded", "status": "True"},
                   {"type": "Failed", "status": "False"}])
        ),
        [json!("x"), json!("deployments.apps"), json!("Succeeded")]
    );
    assert_eq!(
        migration(
            json!({"group": "", "resource": "configmaps"}),
            json!([{"type": "Running", "status": "False"}])
        ),
        [json!("x"), json!("configmaps"), json!("Unknown")]
    );
}

/// Every printer's row of the empty object (only a resourceVersion) that the API server's
/// watch cache sends as a bookmark, which it prints like any object in a Table watch
/// (`autoscaling/v2` HPAs and `events.k8s.io` Events through their printers as here).
#[test]
fn every_printer_prints_the_empty_object_of_a_bookmark_as_kubernetes_does() {
    let empty = json!({"metadata": {"resourceVersion": "5"}});
    let expected = [
        (
            "",
            "pods",
            json!([
                "",
                "0/0",
                "",
                "0",
                "<unknown>",
                "<none>",
                "<none>",
                "<none>",
                "<none>"
            ]),
        ),
        (
            "apps",
            "deployments",
            json!(["", "0/0", 0, 0, "<unknown>", "", "", ""]),
        ),
        (
            "apps",
            "replicasets",
            json!(["", 0, 0, 0, "<unknown>", "", "", "<none>"]),
        ),
        (
            "apps",
            "statefulsets",
            json!(["", "0/0", "<unknown>", "", ""]),
        ),
        (
            "apps",
            "daemonsets",
            json!(["", 0, 0, 0, 0, 0, "<none>", "<unknown>", "", "", "<none>"]),
        ),
        (
            "batch",
            "jobs",
            json!(["", "Running", "0/1", "", "<unknown>", "", "", "<none>"]),
        ),
        (
            "batch",
            "cronjobs",
            json!([
                "",
                "",
                "<none>",
                "<unset>",
                0,
                "<none>",
                "<unknown>",
                "",
                "",
                "<none>"
            ]),
        ),
        (
            "",
            "services",
            json!([
                "",
                "",
                "<none>",
                "<unknown>",
                "<none>",
                "<unknown>",
                "<none>"
            ]),
        ),
        (
            "networking.k8s.io",
            "ingresses",
            json!(["", "<none>", "*", "", "80", "<unknown>"]),
        ),
        ("", "namespaces", json!(["", "", "<unknown>"])),
        ("", "serviceaccounts", json!(["", "<unknown>"])),
        (
            "",
            "persistentvolumeclaims",
            json!(["", "", "", "", "", "", "<unset>", "<unknown>", "<unset>"]),
        ),
        ("", "configmaps", json!(["", 0, "<unknown>"])),
        (
            "networking.k8s.io",
            "networkpolicies",
            json!(["", "<none>", "<unknown>"]),
        ),
        (
            "rbac.authorization.k8s.io",
            "rolebindings",
            json!(["", "/", "<unknown>", "", "", ""]),
        ),
        (
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            json!(["", "/", "<unknown>", "", "", ""]),
        ),
        (
            "policy",
            "poddisruptionbudgets",
            json!(["", "N/A", "N/A", 0, "<unknown>"]),
        ),
        (
            "",
            "nodes",
            json!([
                "",
                "Unknown",
                "<none>",
                "<unknown>",
                "",
                "<none>",
                "<none>",
                "<unknown>",
                "<unknown>",
                "<unknown>"
            ]),
        ),
        (
            "",
            "events",
            json!(["<unknown>", "", "", "", "", "", "", "<unknown>", 1, ""]),
        ),
        (
            "autoscaling",
            "horizontalpodautoscalers",
            json!(["", "/", "<none>", "<unset>", 0, 0, "<unknown>"]),
        ),
        (
            "events.k8s.io",
            "events",
            json!(["<unknown>", "", "", "", "", "", "", "<unknown>", 1, ""]),
        ),
        ("", "podtemplates", json!(["", "", "", "<none>"])),
        (
            "",
            "replicationcontrollers",
            json!(["", 0, 0, 0, "<unknown>", "", "", "<none>"]),
        ),
        (
            "networking.k8s.io",
            "ingressclasses",
            json!(["", "", "<none>", "<unknown>"]),
        ),
        ("", "endpoints", json!(["", "<none>", "<unknown>"])),
        (
            "discovery.k8s.io",
            "endpointslices",
            json!(["", "", "<unset>", "<unset>", "<unknown>"]),
        ),
        (
            "",
            "persistentvolumes",
            json!([
                "",
                "0",
                "",
                "",
                "",
                "",
                "",
                "<unset>",
                "",
                "<unknown>",
                "<unset>"
            ]),
        ),
        (
            "storage.k8s.io",
            "storageclasses",
            json!(["", "", "Delete", "Immediate", false, "<unknown>"]),
        ),
        (
            "storage.k8s.io",
            "volumeattachments",
            json!(["", "", "", "", false, "<unknown>"]),
        ),
        (
            "storage.k8s.io",
            "csidrivers",
            json!([
                "",
                true,
                false,
                false,
                "<unset>",
                false,
                "<none>",
                "<unknown>"
            ]),
        ),
        ("storage.k8s.io", "csinodes", json!(["", 0, "<unknown>"])),
        ("", "resourcequotas", json!(["", "", "", "<unknown>"])),
        (
            "coordination.k8s.io",
            "leases",
            json!(["", "", "<unknown>"]),
        ),
        (
            "scheduling.k8s.io",
            "priorityclasses",
            json!(["", 0, false, "<unknown>", ""]),
        ),
        (
            "node.k8s.io",
            "runtimeclasses",
            json!(["", "", "<unknown>"]),
        ),
        (
            "apps",
            "controllerrevisions",
            json!(["", "<none>", 0, "<unknown>"]),
        ),
        (
            "certificates.k8s.io",
            "certificatesigningrequests",
            json!(["", "<unknown>", "<none>", "", "<none>", "Pending"]),
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            json!(["", 0, "<unknown>"]),
        ),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            json!(["", 0, "<unknown>"]),
        ),
        (
            "storage.k8s.io",
            "volumeattributesclasses",
            json!(["", "", "<unknown>"]),
        ),
        (
            "storagemigration.k8s.io",
            "storageversionmigrations",
            json!(["", "", "Unknown"]),
        ),
        (
            "admissionregistration.k8s.io",
            "validatingadmissionpolicies",
            json!(["", 0, "<unset>", "<unknown>"]),
        ),
        (
            "admissionregistration.k8s.io",
            "validatingadmissionpolicybindings",
            json!(["", "", "<unset>", "<unknown>"]),
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingadmissionpolicies",
            json!(["", 0, "<unset>", "<unknown>"]),
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingadmissionpolicybindings",
            json!(["", "", "<unset>", "<unknown>"]),
        ),
        (
            "flowcontrol.apiserver.k8s.io",
            "flowschemas",
            json!(["", "", 0, "<none>", "<unknown>", "?"]),
        ),
        (
            "flowcontrol.apiserver.k8s.io",
            "prioritylevelconfigurations",
            json!(["", "", "<none>", "<none>", "<none>", "<none>", "<unknown>"]),
        ),
        (
            "networking.k8s.io",
            "servicecidrs",
            json!(["", "", "<unknown>"]),
        ),
        (
            "networking.k8s.io",
            "ipaddresses",
            json!(["", "<none>", "<unknown>"]),
        ),
        (
            "certificates.k8s.io",
            "clustertrustbundles",
            json!(["", "<none>"]),
        ),
        (
            "certificates.k8s.io",
            "podcertificaterequests",
            json!(["", "", "", "", "", "Pending", "<none>"]),
        ),
        ("resource.k8s.io", "deviceclasses", json!(["", "<unknown>"])),
        (
            "resource.k8s.io",
            "resourceclaims",
            json!(["", "pending", "<unknown>"]),
        ),
        (
            "resource.k8s.io",
            "resourceclaimtemplates",
            json!(["", "<unknown>"]),
        ),
        (
            "resource.k8s.io",
            "resourceslices",
            json!(["", "", "", "", "<unknown>"]),
        ),
        (
            "resource.k8s.io",
            "devicetaintrules",
            json!(["", "", "", "", "", "<unknown>"]),
        ),
    ];
    for (group, resource, cells) in expected {
        let kind = Builtin::of(group, resource).unwrap();
        assert_eq!(
            kind.cells(&empty, now()),
            (cells.as_array().unwrap().clone(), None),
            "{group}/{resource}"
        );
    }
}

/// A page of FlowSchemas is printed by matching precedence, then name, as
/// `printFlowSchemaList` sorts it; other kinds' rows stay in list order.
#[test]
fn flow_schema_pages_are_ordered_by_precedence_then_name() {
    let context = |printer| TableContext {
        form: TableForm {
            version: TableVersion::V1,
            include: IncludeObject::None,
        },
        printer,
    };
    let schemas = context(Printer::Builtin(Builtin::FlowControl(
        flow_control::FlowControl::FlowSchema,
    )));
    let rows: Vec<Bytes> = [("a", 20), ("b", 10), ("global-default", 9900), ("c", 10)]
        .iter()
        .map(|(name, precedence)| {
            let o = json!({"metadata": {"name": name},
                           "spec": {"matchingPrecedence": precedence,
                                    "priorityLevelConfiguration": {"name": "pl"}}});
            Bytes::from(row(&schemas, &o, now()).unwrap())
        })
        .collect();
    let names = |rows: &[Bytes]| -> Vec<String> {
        rows.iter()
            .map(|r| {
                let r: Value = serde_json::from_slice(r).unwrap();
                r["cells"][0].as_str().unwrap().to_string()
            })
            .collect()
    };
    assert_eq!(
        names(&schemas.page_order(&rows)),
        ["b", "c", "a", "global-default"]
    );
    let config_maps = context(Printer::Builtin(Builtin::ConfigMap));
    assert_eq!(
        names(&config_maps.page_order(&rows)),
        ["a", "b", "global-default", "c"]
    );
}
