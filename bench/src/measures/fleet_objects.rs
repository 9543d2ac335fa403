//! The objects of measure 12's accounts: a mix of kinds and sizes as a Spinnaker-managed
//! cluster holds them (Pods and their ReplicaSets the bulk, Deployments, Services,
//! ConfigMaps, Secrets (as metadata, the agent's form), Events), shaped after real objects
//! as `kubectl apply` and Clouddriver write them: Spinnaker's labels and annotations, the
//! `last-applied-configuration` annotation where kubectl writes one, a full container spec
//! (env, probes, resources, volumes) in Pods and pod templates. Status is left out: the
//! bench's control plane runs no controllers, so the baseline's API server holds none either,
//! and both sides serve the same objects.
//!
//! Object `i` of an account is a pure function of `i` (kind, namespace, name, body), so a
//! churned update is the same object with a new `bench/stamp` annotation.

use serde_json::{Value, json};

/// One kind of the caching cycle.
pub(crate) struct FleetKind {
    /// Resource (plural) name, as in the path and the agent's `Kind.plural`.
    pub plural: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// Objects of this kind per 100 objects of an account.
    pub share: usize,
    /// Collection path with `{ns}` for the namespace.
    pub path: &'static str,
}

impl FleetKind {
    pub(crate) fn collection(&self, ns: &str) -> String {
        self.path.replace("{ns}", ns)
    }

    /// Secrets are read (and cached) as metadata only; the others in full.
    pub(crate) fn metadata_only(&self) -> bool {
        self.plural == "secrets"
    }

    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// The eight kinds Clouddriver lists per namespace on every caching cycle, with the mix of
/// objects an account holds (StatefulSets none: listed, empty, as in most namespaces).
pub(crate) const KINDS: [FleetKind; 8] = [
    FleetKind {
        plural: "pods",
        group: "",
        version: "v1",
        kind: "Pod",
        share: 35,
        path: "/api/v1/namespaces/{ns}/pods",
    },
    FleetKind {
        plural: "replicasets",
        group: "apps",
        version: "v1",
        kind: "ReplicaSet",
        share: 20,
        path: "/apis/apps/v1/namespaces/{ns}/replicasets",
    },
    FleetKind {
        plural: "deployments",
        group: "apps",
        version: "v1",
        kind: "Deployment",
        share: 8,
        path: "/apis/apps/v1/namespaces/{ns}/deployments",
    },
    FleetKind {
        plural: "services",
        group: "",
        version: "v1",
        kind: "Service",
        share: 7,
        path: "/api/v1/namespaces/{ns}/services",
    },
    FleetKind {
        plural: "configmaps",
        group: "",
        version: "v1",
        kind: "ConfigMap",
        share: 12,
        path: "/api/v1/namespaces/{ns}/configmaps",
    },
    FleetKind {
        plural: "secrets",
        group: "",
        version: "v1",
        kind: "Secret",
        share: 8,
        path: "/api/v1/namespaces/{ns}/secrets",
    },
    FleetKind {
        plural: "events",
        group: "",
        version: "v1",
        kind: "Event",
        share: 10,
        path: "/api/v1/namespaces/{ns}/events",
    },
    FleetKind {
        plural: "statefulsets",
        group: "apps",
        version: "v1",
        kind: "StatefulSet",
        share: 0,
        path: "/apis/apps/v1/namespaces/{ns}/statefulsets",
    },
];

/// Accept header of the metadata-only form (Secrets), as the agent and kubectl ask for it.
pub(crate) const METADATA_ACCEPT: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

/// Where object `i` of an account sits: its kind (index into [`KINDS`]), namespace, name.
pub(crate) struct Slot {
    pub kind: usize,
    pub namespace: String,
    pub name: String,
}

/// The kind, namespace and name of object `i` among `namespaces` namespaces.
pub(crate) fn slot(i: usize, namespaces: usize) -> Slot {
    let mut at = i % 100;
    let mut kind = 0;
    for (k, info) in KINDS.iter().enumerate() {
        if at < info.share {
            kind = k;
            break;
        }
        at -= info.share;
    }
    Slot {
        kind,
        namespace: namespace(i % namespaces.max(1)),
        name: format!("{}-{i}", app(i)),
    }
}

pub(crate) fn namespace(n: usize) -> String {
    format!("team-{n:02}")
}

/// The application an object belongs to (ten objects to an application).
fn app(i: usize) -> String {
    format!("svc{:04}", i / 10)
}

/// Object `i`'s manifest as the API server would hold it (no uid or resourceVersion), its
/// `bench/stamp` annotation `stamp` (changed by every churned update).
pub(crate) fn manifest(i: usize, namespaces: usize, stamp: u64) -> Value {
    let slot = slot(i, namespaces);
    let info = &KINDS[slot.kind];
    let (ns, name, app) = (slot.namespace.as_str(), slot.name.as_str(), app(i));
    let labels = json!({
        "app": app,
        "app.kubernetes.io/name": app,
        "app.kubernetes.io/managed-by": "spinnaker",
        "app.kubernetes.io/version": "1.42.0",
    });
    let mut annotations = json!({
        "artifact.spinnaker.io/location": ns,
        "artifact.spinnaker.io/name": app,
        "artifact.spinnaker.io/type": format!("kubernetes/{}", info.kind.to_lowercase()),
        "artifact.spinnaker.io/version": "v042",
        "moniker.spinnaker.io/application": app,
        "moniker.spinnaker.io/cluster": format!("{} {app}", info.kind.to_lowercase()),
        "bench/stamp": stamp.to_string(),
    });
    let metadata = |annotations: Value| json!({ "name": name, "namespace": ns, "labels": labels, "annotations": annotations });
    let pod_spec = pod_spec(&app, i);
    let body = match info.kind {
        "Pod" => {
            let mut m = metadata(annotations);
            m["labels"]["pod-template-hash"] = json!("7d4b9c8f6");
            m["generateName"] = json!(format!("{app}-7d4b9c8f6-"));
            m["ownerReferences"] = json!([{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-7d4b9c8f6"),
                "uid": format!("00000000-0000-4000-8000-{:012}", i / 10),
                "controller": true, "blockOwnerDeletion": true,
            }]);
            json!({ "metadata": m, "spec": pod_spec })
        }
        "ReplicaSet" | "Deployment" => {
            let mut spec = json!({
                "replicas": 3,
                "revisionHistoryLimit": 10,
                "selector": { "matchLabels": { "app": app } },
                "template": { "metadata": { "labels": labels, "annotations": { "prometheus.io/scrape": "true", "prometheus.io/port": "9090" } }, "spec": pod_spec },
            });
            let mut m = metadata(annotations.clone());
            if info.kind == "Deployment" {
                spec["strategy"] = json!({ "type": "RollingUpdate", "rollingUpdate": { "maxSurge": "25%", "maxUnavailable": "25%" } });
                spec["progressDeadlineSeconds"] = json!(600);
                let applied = json!({ "apiVersion": "apps/v1", "kind": "Deployment", "metadata": { "name": name, "namespace": ns, "labels": labels }, "spec": spec });
                m["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
                    json!(applied.to_string());
            } else {
                m["annotations"]["deployment.kubernetes.io/revision"] = json!("42");
                m["annotations"]["deployment.kubernetes.io/desired-replicas"] = json!("3");
                m["annotations"]["deployment.kubernetes.io/max-replicas"] = json!("4");
                spec["selector"]["matchLabels"]["pod-template-hash"] = json!("7d4b9c8f6");
                spec["template"]["metadata"]["labels"]["pod-template-hash"] = json!("7d4b9c8f6");
            }
            json!({ "metadata": m, "spec": spec })
        }
        "Service" => {
            // Headless, so no cluster IP is allocated from the test cluster's small range.
            let spec = json!({
                "clusterIP": "None", "selector": { "app": app },
                "ports": [{ "name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP" },
                          { "name": "metrics", "port": 9090, "targetPort": 9090, "protocol": "TCP" }],
                "sessionAffinity": "None", "type": "ClusterIP",
            });
            let applied = json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": name, "namespace": ns }, "spec": spec });
            annotations["kubectl.kubernetes.io/last-applied-configuration"] =
                json!(applied.to_string());
            json!({ "metadata": metadata(annotations), "spec": spec })
        }
        "ConfigMap" => {
            let data = json!({
                "application.yaml": crate::env::payload(i, 900 + (i * 37) % 1400),
                "log-level": "info",
                "feature-flags": "checkout-v2=true,search-ranking=false,new-pricing=true",
            });
            json!({ "metadata": metadata(annotations), "data": data })
        }
        "Secret" => json!({ "metadata": metadata(annotations), "type": "Opaque" }),
        "Event" => {
            let mut m = metadata(json!({ "bench/stamp": stamp.to_string() }));
            m["labels"] = json!(null);
            json!({
                "metadata": m,
                "involvedObject": { "kind": "Pod", "namespace": ns, "name": format!("{app}-7d4b9c8f6-x{i}"), "apiVersion": "v1", "fieldPath": "spec.containers{app}" },
                "reason": "Pulled", "type": "Normal", "count": 1,
                "message": format!("Container image \"registry.example.com/team/{app}:1.42.0\" already present on machine"),
                "source": { "component": "kubelet", "host": format!("node-{}", i % 50) },
                "firstTimestamp": "2026-12-01T10:00:00Z", "lastTimestamp": "2026-12-01T10:00:00Z",
                "reportingComponent": "kubelet", "reportingInstance": format!("node-{}", i % 50),
            })
        }
        _ => json!({ "metadata": metadata(annotations) }),
    };
    let mut body = body;
    body["apiVersion"] = json!(info.api_version());
    body["kind"] = json!(info.kind);
    body
}

/// The form the agent sends and the cache holds: the manifest with a uid and a
/// resourceVersion; Secrets as `PartialObjectMetadata`, as the agent streams them.
pub(crate) fn streamed(i: usize, namespaces: usize, stamp: u64, uid: &str, rv: u64) -> Value {
    let mut body = manifest(i, namespaces, stamp);
    body["metadata"]["uid"] = json!(uid);
    body["metadata"]["resourceVersion"] = json!(rv.to_string());
    body["metadata"]["creationTimestamp"] = json!("2026-12-01T10:00:00Z");
    if KINDS[slot(i, namespaces).kind].metadata_only() {
        return json!({ "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": body["metadata"] });
    }
    body
}

fn pod_spec(app: &str, i: usize) -> Value {
    let env: Vec<Value> = [
        ("SPRING_PROFILES_ACTIVE", "production"),
        ("JAVA_OPTS", "-XX:MaxRAMPercentage=75 -XX:+UseG1GC"),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://otel-collector.observability:4317",
        ),
        ("OTEL_SERVICE_NAME", app),
        ("DB_HOST", "postgres.data.svc.cluster.local"),
        ("REDIS_URL", "redis://redis.data.svc.cluster.local:6379"),
    ]
    .iter()
    .map(|(k, v)| json!({ "name": k, "value": v }))
    .collect();
    let probe = |path: &str, delay: u32| {
        json!({ "httpGet": { "path": path, "port": 8080, "scheme": "HTTP" }, "initialDelaySeconds": delay,
                "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3 })
    };
    json!({
        "containers": [{
            "name": "app",
            "image": format!("registry.example.com/team/{app}:1.42.{}", i % 7),
            "imagePullPolicy": "IfNotPresent",
            "ports": [{ "name": "http", "containerPort": 8080, "protocol": "TCP" },
                      { "name": "metrics", "containerPort": 9090, "protocol": "TCP" }],
            "env": env,
            "envFrom": [{ "secretRef": { "name": format!("{app}-credentials") } }],
            "resources": { "requests": { "cpu": "250m", "memory": "256Mi" }, "limits": { "memory": "512Mi" } },
            "readinessProbe": probe("/actuator/health/readiness", 10),
            "livenessProbe": probe("/actuator/health/liveness", 30),
            "volumeMounts": [{ "name": "config", "mountPath": "/etc/app", "readOnly": true },
                             { "name": "tmp", "mountPath": "/tmp" }],
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
        }],
        "volumes": [{ "name": "config", "configMap": { "name": format!("{app}-config"), "defaultMode": 420 } },
                    { "name": "tmp", "emptyDir": {} }],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "securityContext": { "runAsNonRoot": true, "runAsUser": 10001, "fsGroup": 10001 },
        "tolerations": [{ "key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300 },
                        { "key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300 }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_covers_every_kind_but_statefulsets_and_every_namespace() {
        let mut per_kind = [0usize; 8];
        let mut namespaces = std::collections::BTreeSet::new();
        for i in 0..2000 {
            let s = slot(i, 20);
            per_kind[s.kind] += 1;
            namespaces.insert(s.namespace);
        }
        assert_eq!(per_kind, [700, 400, 160, 140, 240, 160, 200, 0]);
        assert_eq!(namespaces.len(), 20);
    }

    #[test]
    fn a_streamed_secret_is_metadata_and_a_stamp_changes_only_the_annotation() {
        let secret = (0..100).find(|i| slot(*i, 20).kind == 5).unwrap();
        let v = streamed(secret, 20, 1, "u", 7);
        assert_eq!(v["kind"], "PartialObjectMetadata");
        assert_eq!(v["metadata"]["resourceVersion"], "7");
        let (a, b) = (manifest(3, 20, 1), manifest(3, 20, 2));
        assert_ne!(a, b);
        assert_eq!(b["metadata"]["annotations"]["bench/stamp"], "2");
    }
}
