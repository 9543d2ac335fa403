//! The Helm chart renders the same objects as the kustomize install: same kinds and names,
//! same specs, RBAC rules and bindings. Rendered with the real `helm` and `kubectl kustomize`
//! built with the control plane.

// Helpers outside #[test] fns panic on purpose too; clippy's test allowance does not see them.
#![allow(clippy::expect_used)]

use std::{collections::BTreeMap, path::Path, process::Command};

use scale_agent_e2e::Binaries;
use serde_json::Value;

/// What an API server of Kubernetes 1.30+ tells Helm (`helm template` has no cluster to ask):
/// the chart installs the admission policies only where ValidatingAdmissionPolicy is served.
const SERVES_POLICY_V1: &str =
    "--api-versions=admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

fn run(program: &Path, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(scale_agent_e2e::repo_root())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    assert!(
        output.status.success(),
        "{} {args:?} failed: {}",
        program.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("rendered YAML is UTF-8")
}

/// Rendered objects by (kind, name). Namespaces are left out: kustomize creates the
/// operator's, Helm installs into the release's (`--create-namespace`).
fn objects(yaml: &str) -> BTreeMap<(String, String), Value> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("rendered YAML parses");
    documents
        .into_iter()
        .filter(|doc| !doc.is_null())
        .filter(|doc| doc["kind"] != "Namespace")
        .map(|doc| {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let name = doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            ((kind, name), doc)
        })
        .collect()
}

/// The parts of an object that make it behave: everything but metadata (Helm adds its own
/// labels; namespaces differ by design).
fn behaviour(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("metadata");
        // Subjects name the operator's namespace, which is the release namespace under Helm.
        if let Some(subjects) = map.get_mut("subjects").and_then(Value::as_array_mut) {
            for subject in subjects {
                if let Some(subject) = subject.as_object_mut() {
                    subject.remove("namespace");
                }
            }
        }
    }
    object
}

/// The first path where two values differ, numbers compared by value (kustomize re-emits
/// `1.0` as `1`), or None when they agree.
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<_> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|key| {
                first_difference(
                    x.get(key).unwrap_or(&Value::Null),
                    y.get(key).unwrap_or(&Value::Null),
                    &format!("{path}.{key}"),
                )
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, &format!("{path}[{i}]"))),
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if a == b => None,
        _ => Some(format!("{path}: chart {a} vs kustomize {b}")),
    }
}

fn assert_same(helm: &str, kustomize: &str, what: &str) {
    let helm = objects(helm);
    let kustomize = objects(kustomize);
    // The comparison means nothing if a render came out empty: each must hold a Deployment.
    for (side, rendered) in [("the chart", &helm), ("kustomize", &kustomize)] {
        assert!(
            rendered.keys().any(|(kind, _)| kind == "Deployment"),
            "{what}: {side} rendered no Deployment ({} objects)",
            rendered.len()
        );
    }
    assert_eq!(
        helm.keys().collect::<Vec<_>>(),
        kustomize.keys().collect::<Vec<_>>(),
        "{what}: the chart and kustomize render different objects"
    );
    for (key, object) in &helm {
        let difference = first_difference(&behaviour(object), &behaviour(&kustomize[key]), "");
        assert!(
            difference.is_none(),
            "{what}: {key:?} differs between the chart and kustomize at {}",
            difference.unwrap_or_default()
        );
    }
}

#[test]
fn helm_chart_renders_what_kustomize_renders() {
    let binaries = Binaries::locate().expect("control-plane binaries (make control-plane)");
    let chart = "manifests/helm/scale-agent";
    let namespace = "--namespace=scale-agent-system";

    let operator_only = run(
        &binaries.helm(),
        &[
            "template",
            "scale-agent",
            chart,
            namespace,
            "--include-crds",
            SERVES_POLICY_V1,
        ],
    );
    let base = run(&binaries.kubectl(), &["kustomize", "manifests"]);
    assert_same(&operator_only, &base, "default values vs manifests/");

    let with_hub = run(
        &binaries.helm(),
        &[
            "template",
            "scale-agent",
            chart,
            namespace,
            "--include-crds",
            SERVES_POLICY_V1,
            "--set=hub.enabled=true",
        ],
    );
    let spinnaker = run(
        &binaries.kubectl(),
        &["kustomize", "manifests/overlays/spinnaker"],
    );
    assert_same(
        &with_hub,
        &spinnaker,
        "hub.enabled=true vs overlays/spinnaker",
    );

    // The highly available hub: replicas on PostgreSQL, the PDB, no volume claim.
    let with_ha_hub = run(
        &binaries.helm(),
        &[
            "template",
            "scale-agent",
            chart,
            namespace,
            "--include-crds",
            SERVES_POLICY_V1,
            "--set=hub.enabled=true",
            "--set=hub.store=postgres",
            "--set=hub.replicas=3",
            "--set=hub.postgres.urlSecret=scale-agent-hub-postgres",
            "--set=hub.replicaSecret.name=scale-agent-hub-replica",
            "--set=hub.agentCaSecret=scale-agent-hub-agent-ca",
        ],
    );
    let spinnaker_postgres = run(
        &binaries.kubectl(),
        &["kustomize", "manifests/overlays/spinnaker-postgres"],
    );
    assert!(
        spinnaker_postgres.contains("kind: PodDisruptionBudget")
            && !spinnaker_postgres.contains("kind: PersistentVolumeClaim"),
        "overlays/spinnaker-postgres has a PDB and no volume claim"
    );
    assert_same(
        &with_ha_hub,
        &spinnaker_postgres,
        "hub.store=postgres vs overlays/spinnaker-postgres",
    );
}

/// `helm template` of the chart with the hub on and `extra` values.
fn hub_render(binaries: &Binaries, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "template",
        "scale-agent",
        "manifests/helm/scale-agent",
        "--namespace=scale-agent-system",
        "--include-crds",
        SERVES_POLICY_V1,
        "--set=hub.enabled=true",
    ];
    args.extend_from_slice(extra);
    Command::new(binaries.helm())
        .args(&args)
        .current_dir(scale_agent_e2e::repo_root())
        .output()
        .expect("run helm")
}

/// The hub's container and pod volumes in a render.
fn hub_pod(yaml: &str) -> (Value, Value) {
    let objects = objects(yaml);
    let pod = &objects[&("Deployment".to_string(), "scale-agent-hub".to_string())]["spec"]["template"]
        ["spec"];
    (pod["containers"][0].clone(), pod["volumes"].clone())
}

/// The audit file (issue 31): the chart's `hub.auditLog` and kustomize's `hub/audit-log`
/// component render the same hub (the flags, an emptyDir of its own sized to the file and
/// its backups, the root filesystem still read-only); a path on the data volume mounts
/// nothing more; a path among the read-only mounts is refused.
#[test]
fn the_audit_file_is_on_a_volume_of_its_own_in_both_installs() {
    let binaries = Binaries::locate().expect("control-plane binaries (make control-plane)");
    let text = |output: std::process::Output| {
        assert!(
            output.status.success(),
            "helm template: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("rendered YAML is UTF-8")
    };
    let with_audit = text(hub_render(&binaries, &["--set=hub.auditLog.enabled=true"]));
    let overlay = run(
        &binaries.kubectl(),
        &["kustomize", "manifests/overlays/spinnaker-audit-log"],
    );
    assert_same(
        &with_audit,
        &overlay,
        "hub.auditLog.enabled=true vs overlays/spinnaker-audit-log",
    );
    let (container, volumes) = hub_pod(&with_audit);
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for flag in [
        "--audit-log-path=/var/log/scale-agent-hub/audit.log",
        "--audit-log-max-size=100",
        "--audit-log-max-backups=5",
    ] {
        assert!(args.contains(&flag), "{flag} in {args:?}");
    }
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert!(
        container["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .any(|m| m["name"] == "audit-log"
                && m["mountPath"] == "/var/log/scale-agent-hub"
                && m["readOnly"].is_null()),
        "{}",
        container["volumeMounts"]
    );
    let audit_volume = |volumes: &Value| {
        volumes
            .as_array()
            .expect("volumes")
            .iter()
            .find(|v| v["name"] == "audit-log")
            .cloned()
    };
    assert_eq!(
        audit_volume(&volumes).expect("an audit-log volume")["emptyDir"]["sizeLimit"],
        "600Mi"
    );

    // Other limits size the volume; no rotation, no limit.
    for (limits, empty_dir) in [
        (
            [
                "--set=hub.auditLog.maxSizeMiB=10",
                "--set=hub.auditLog.maxBackups=2",
            ],
            serde_json::json!({ "sizeLimit": "30Mi" }),
        ),
        (
            [
                "--set=hub.auditLog.maxSizeMiB=0",
                "--set=hub.auditLog.maxBackups=2",
            ],
            serde_json::json!({}),
        ),
    ] {
        let mut values = vec!["--set=hub.auditLog.enabled=true"];
        values.extend(limits);
        let (_, volumes) = hub_pod(&text(hub_render(&binaries, &values)));
        assert_eq!(
            audit_volume(&volumes).expect("an audit-log volume")["emptyDir"],
            empty_dir,
            "{limits:?}"
        );
    }

    // On the data volume (the embedded store's claim): the flag, no other volume.
    let (container, volumes) = hub_pod(&text(hub_render(
        &binaries,
        &[
            "--set=hub.auditLog.enabled=true",
            "--set=hub.auditLog.path=/var/lib/scale-agent-hub/audit.log",
        ],
    )));
    assert!(
        container["args"]
            .as_array()
            .expect("args")
            .iter()
            .any(|a| a == "--audit-log-path=/var/lib/scale-agent-hub/audit.log")
    );
    assert!(audit_volume(&volumes).is_none(), "{volumes}");
    // Off by default.
    let (container, volumes) = hub_pod(&text(hub_render(&binaries, &[])));
    assert!(
        !container["args"].to_string().contains("--audit-log") && audit_volume(&volumes).is_none(),
        "{container}"
    );

    // Refused: among the read-only mounts, or not an absolute file path.
    for (value, expected) in [
        (
            "--set=hub.auditLog.path=/var/run/scale-agent-hub/audit.log",
            "is among the hub's read-only mounts",
        ),
        (
            "--set=hub.auditLog.path=/var/lib/scale-agent-hub/audit/audit.log",
            "a directory of the data volume the hub does not create",
        ),
        ("--set=hub.auditLog.path=audit.log", "/hub/auditLog/path"),
    ] {
        let output = hub_render(&binaries, &["--set=hub.auditLog.enabled=true", value]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(expected),
            "{value}: {stderr}"
        );
    }
}

/// The premise check above: two empty renders are not "the same objects".
#[test]
#[should_panic(expected = "the chart rendered no Deployment (0 objects)")]
fn the_comparison_fails_when_both_render_nothing() {
    assert_same("", "---\n", "empty renders");
}
