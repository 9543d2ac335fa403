//! In-process micro-benchmark of the hub's cached objects (issue 13 item 7): the bytes an
//! object's JSON takes packed, and the time to render a LIST of 10,000 cached ConfigMaps
//! (the objects copied out as under the state lock, then `render::list_items`) with the
//! packed representation against the representation before it (the JSON kept as it is,
//! rendered by the same steps), in one process, alternating, median of the runs.
//!
//! `cargo run --release -p scale-agent-hub --example cached_list [-- <objects> <runs>]`

use std::time::{Duration, Instant};

use anyhow::Context as _;
use scale_agent_hub::{
    cache::{CachedObject, KindInfo, PackedJson},
    proxy::cached::{
        render,
        request::Form,
        selector::{FieldSelector, LabelSelector},
    },
};
use serde_json::{Value, json};

/// A ConfigMap as the agent streams it (no managedFields), `payload` in its data.
fn config_map(i: usize, payload: &str) -> (String, String, Vec<u8>) {
    let (ns, name) = ("bench-reads".to_string(), format!("cm-{i}"));
    let value = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": name, "namespace": ns, "uid": format!("5c4b2a{i:04}-3f0e-4d7a-9b61-8e2f{i:08x}"),
            "resourceVersion": (100_000 + i).to_string(),
            "creationTimestamp": "2026-11-27T10:12:31Z",
            "labels": { "app": "bench", "shard": (i % 8).to_string() },
        },
        "data": { "payload": payload },
    });
    (ns, name, serde_json::to_vec(&value).unwrap_or_default())
}

/// A running Pod as the API server returns it: what real clusters mostly hold.
fn pod(i: usize) -> Vec<u8> {
    let value = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("web-7d4b9c8f5-{i:05x}"), "namespace": "shop", "generateName": "web-7d4b9c8f5-",
            "uid": format!("0b6f8c2e-{i:04x}-4f4e-a1d2-{:012x}", i * 7919),
            "resourceVersion": (5_000_000 + i).to_string(), "creationTimestamp": "2026-11-20T08:14:02Z",
            "labels": { "app": "web", "pod-template-hash": "7d4b9c8f5", "tier": "frontend" },
            "annotations": { "kubectl.kubernetes.io/restartedAt": "2026-11-20T08:13:55Z", "prometheus.io/scrape": "true", "prometheus.io/port": "9090" },
            "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c8f5", "uid": "6a1f0d3c-58b2-4c0e-9d7e-2b8f4e1a7c90", "controller": true, "blockOwnerDeletion": true }],
        },
        "spec": {
            "containers": [{
                "name": "web", "image": "registry.example.com/shop/web:1.42.3",
                "ports": [{ "name": "http", "containerPort": 8080, "protocol": "TCP" }, { "name": "metrics", "containerPort": 9090, "protocol": "TCP" }],
                "env": [{ "name": "SPRING_PROFILES_ACTIVE", "value": "prod" }, { "name": "JAVA_OPTS", "value": "-Xms512m -Xmx512m" }],
                "resources": { "limits": { "cpu": "1", "memory": "1Gi" }, "requests": { "cpu": "250m", "memory": "768Mi" } },
                "readinessProbe": { "httpGet": { "path": "/ready", "port": 8080, "scheme": "HTTP" }, "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3 },
                "volumeMounts": [{ "name": "kube-api-access-x7k2p", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount" }],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "web", "serviceAccount": "web", "nodeName": format!("ip-10-0-{}-{}.ec2.internal", i % 16, i % 250),
            "securityContext": {}, "schedulerName": "default-scheduler",
            "tolerations": [{ "key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300 }],
            "volumes": [{ "name": "kube-api-access-x7k2p", "projected": { "sources": [{ "serviceAccountToken": { "expirationSeconds": 3607, "path": "token" } }], "defaultMode": 420 } }],
            "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                { "type": "Initialized", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T08:14:02Z" },
                { "type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T08:14:19Z" },
                { "type": "ContainersReady", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T08:14:19Z" },
                { "type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T08:14:02Z" },
            ],
            "hostIP": format!("10.0.{}.{}", i % 16, i % 250), "podIP": format!("10.1.{}.{}", i % 200, i % 250),
            "podIPs": [{ "ip": format!("10.1.{}.{}", i % 200, i % 250) }], "startTime": "2026-11-20T08:14:02Z",
            "containerStatuses": [{
                "name": "web", "state": { "running": { "startedAt": "2026-11-20T08:14:09Z" } }, "lastState": {},
                "ready": true, "restartCount": 0, "image": "registry.example.com/shop/web:1.42.3",
                "imageID": "registry.example.com/shop/web@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                "containerID": format!("containerd://{:064x}", (i as u128) * 0x9E37_79B9_7F4A_7C15), "started": true,
            }],
            "qosClass": "Burstable",
        },
    });
    serde_json::to_vec(&value).unwrap_or_default()
}

/// The data of the bench's ConfigMaps (`scale_agent_bench::env::payload`, which this
/// example cannot depend on: the bench depends on the hub).
fn payload(seed: usize, bytes: usize) -> String {
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..bytes)
        .map(|j| alphabet[(seed.wrapping_mul(31).wrapping_add(j * 7)) % alphabet.len()] as char)
        .collect()
}

/// A payload that does not compress (what a ConfigMap of random tokens would hold).
fn random_payload(i: usize, bytes: usize) -> String {
    const DIGITS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut x = i as u64 + 0x9E37_79B9_7F4A_7C15;
    (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(DIGITS[(x >> 58) as usize])
        })
        .collect()
}

/// The JSON bytes and packed bytes per object of `objects`.
fn sizes(objects: &[Vec<u8>]) -> (f64, f64) {
    let json: usize = objects.iter().map(Vec::len).sum();
    let packed: usize = objects
        .iter()
        .map(|o| PackedJson::pack(o).packed_len())
        .sum();
    let n = objects.len().max(1) as f64;
    (json as f64 / n, packed as f64 / n)
}

/// An object as the cache held it before it packed JSON.
#[derive(Clone)]
struct Unpacked {
    namespace: String,
    name: String,
    json: Vec<u8>,
}

/// `render::list_items` as it was before the JSON was packed: the same steps on the JSON
/// kept as it is (the baseline).
fn list_items_unpacked(
    builtin: bool,
    mut objects: Vec<Unpacked>,
    labels: &LabelSelector,
    fields: &FieldSelector,
) -> anyhow::Result<Vec<Vec<u8>>> {
    objects.sort_by_cached_key(|o| format!("{}/{}", o.namespace, o.name));
    let mut items = Vec::with_capacity(objects.len());
    for object in objects {
        let mut value: Value = serde_json::from_slice(&object.json)?;
        let labels_of = value.pointer("/metadata/labels").and_then(Value::as_object);
        if !labels.matches(labels_of) || !fields.matches(&value) {
            continue;
        }
        if builtin {
            let map = value.as_object_mut().context("not an object")?;
            map.remove("apiVersion");
            map.remove("kind");
        }
        items.push(serde_json::to_vec(&value)?);
    }
    Ok(items)
}

/// The objects as the cache holds them.
fn packed(objects: &[Unpacked]) -> Vec<CachedObject> {
    objects
        .iter()
        .enumerate()
        .map(|(i, o)| CachedObject {
            namespace: o.namespace.clone(),
            name: o.name.clone(),
            uid: format!("uid-{i}"),
            resource_version: (100_000 + i).to_string(),
            json: PackedJson::pack(&o.json),
            truncated: false,
        })
        .collect()
}

fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000);
    let runs: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(15);

    println!("| objects | JSON per object | packed per object | packed / JSON |");
    println!("|---|---|---|---|");
    let samples: [(&str, Vec<Vec<u8>>); 3] = [
        (
            "ConfigMaps of the bench (1024 B payload, as measures 3-5 and 9)",
            (0..n).map(|i| config_map(i, &payload(i, 1024)).2).collect(),
        ),
        (
            "ConfigMaps with 1024 B of random base64 (does not compress)",
            (0..n)
                .map(|i| config_map(i, &random_payload(i, 1024)).2)
                .collect(),
        ),
        (
            "running Pods (as the API server returns them)",
            (0..n).map(pod).collect(),
        ),
    ];
    for (what, objects) in &samples {
        let (json, packed) = sizes(objects);
        println!(
            "| {what} | {json:.0} B | {packed:.0} B | {:.0} % |",
            packed / json * 100.0
        );
    }

    let info = KindInfo {
        group: String::new(),
        version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
        namespaced: true,
    };
    let unpacked: Vec<Unpacked> = (0..n)
        .map(|i| {
            let (namespace, name, json) = config_map(i, &payload(i, 1024));
            Unpacked {
                namespace,
                name,
                json,
            }
        })
        .collect();
    let packed = packed(&unpacked);
    let pods_unpacked: Vec<Unpacked> = (0..n)
        .map(|i| Unpacked {
            namespace: "shop".into(),
            name: format!("web-7d4b9c8f5-{i:05x}"),
            json: pod(i),
        })
        .collect();
    let pods_packed = self::packed(&pods_unpacked);
    let fields = FieldSelector::default();
    println!();
    println!(
        "| LIST of {n} objects rendered (copy out + list_items), median of {runs} | JSON kept as it is (before) | packed (after) |"
    );
    println!("|---|---|---|");
    for (what, selector) in [("ConfigMaps", ""), ("ConfigMaps", "shard=3"), ("Pods", "")] {
        let labels = LabelSelector::parse(selector).context("selector")?;
        let (unpacked, packed) = match what {
            "Pods" => (&pods_unpacked, &pods_packed),
            _ => (&unpacked, &packed),
        };
        let (mut before, mut after) = (Vec::new(), Vec::new());
        let mut counts = (0, 0);
        for run in 0..runs + 1 {
            // Alternate which goes first; the first round warms up and is not counted.
            let one = |packed_side: bool| -> anyhow::Result<(Duration, usize)> {
                let started = Instant::now();
                let count = if packed_side {
                    render::list_items(&info, packed.clone(), &labels, &fields, Form::Full)
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?
                        .len()
                } else {
                    list_items_unpacked(true, unpacked.clone(), &labels, &fields)?.len()
                };
                Ok((started.elapsed(), count))
            };
            let order = if run % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for packed_side in order {
                let (took, count) = one(packed_side)?;
                if run == 0 {
                    continue;
                }
                if packed_side {
                    after.push(took);
                    counts.1 = count;
                } else {
                    before.push(took);
                    counts.0 = count;
                }
            }
        }
        anyhow::ensure!(
            counts.0 == counts.1,
            "the two sides rendered {counts:?} items"
        );
        println!(
            "| {what}, {} ({} items) | {:.1} ms | {:.1} ms |",
            if selector.is_empty() {
                "no selector".to_string()
            } else {
                format!("labelSelector={selector}")
            },
            counts.0,
            median(before).as_secs_f64() * 1000.0,
            median(after).as_secs_f64() * 1000.0,
        );
    }
    Ok(())
}
