//! The local control plane is real: CRDs generated from our types install and round-trip,
//! RBAC is enforced for a ServiceAccount acting with its own token, a watch from a compacted
//! resourceVersion gets 410 Gone, and killing the process that owns a control plane leaves
//! nothing running.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{
    core::v1::{ConfigMap, PodTemplate, ServiceAccount},
    rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams, VersionMatch, WatchEvent, WatchParams},
};
use scale_agent_crds::ScaleAgent;
use scale_agent_e2e::{ControlPlane, KUBERNETES_VERSION, crds, process};
use serde_json::json;

fn api_error_code(result: &Result<impl std::fmt::Debug, kube::Error>) -> Option<u16> {
    match result {
        Err(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

#[tokio::test]
async fn apiserver_reports_the_pinned_version() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared()?;
    let client = control_plane.client().await?;
    let version = client.apiserver_version().await?;
    assert_eq!(version.git_version, KUBERNETES_VERSION);
    Ok(())
}

#[tokio::test]
async fn generated_crd_installs_and_round_trips_a_scale_agent() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared()?;
    let client = control_plane.client().await?;
    let definitions = crds::read_crds(&crds::manifests_dir())?;
    let installed = crds::install(&client, &definitions).await?;
    assert!(
        installed.contains(&"scaleagents.scaleagent.dev".to_string()),
        "{installed:?}"
    );
    let namespace = control_plane.namespace(&client, "crd-round-trip").await?;

    let local: ScaleAgent = serde_json::from_value(json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "ScaleAgent",
        "metadata": { "name": "prod", "namespace": namespace },
        "spec": {
            "hub": { "address": "hub.spinnaker.svc:9091" },
            "clientCertificate": { "issuerSecretRef": { "name": "agent-ca" } },
            "replicas": 3,
        },
    }))?;
    let api = Api::<ScaleAgent>::namespaced(client.clone(), &namespace);
    let created = api.create(&PostParams::default(), &local).await?;
    let fetched = api.get("prod").await?;

    // The apiserver fills schema defaults in; our serde defaults must agree with them, so
    // what we send and what comes back are the same spec.
    assert_eq!(
        serde_json::to_value(&fetched.spec)?,
        serde_json::to_value(&local.spec)?
    );
    assert_eq!(fetched.spec.replicas, 3);
    assert_eq!(
        fetched.metadata.resource_version,
        created.metadata.resource_version
    );

    // Status is a subresource: a status write is kept, and the spec is not touched by it.
    let status_patch = json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "ScaleAgent",
        "status": { "observedGeneration": 1, "readyReplicas": 2, "replicas": 3 },
    });
    api.patch_status(
        "prod",
        &PatchParams::apply("scale-agent-e2e"),
        &Patch::Apply(&status_patch),
    )
    .await?;
    let with_status = api.get("prod").await?;
    let status = with_status.status.expect("status was written");
    assert_eq!(status.ready_replicas, 2);
    assert_eq!(with_status.spec.replicas, 3);
    Ok(())
}

#[tokio::test]
async fn service_account_token_is_bound_by_real_rbac() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared()?;
    let admin = control_plane.client().await?;
    let own = control_plane.namespace(&admin, "rbac-own").await?;
    let other = control_plane.namespace(&admin, "rbac-other").await?;

    let pp = PostParams::default();
    Api::<ServiceAccount>::namespaced(admin.clone(), &own)
        .create(
            &pp,
            &serde_json::from_value(json!({ "metadata": { "name": "reader" } }))?,
        )
        .await?;
    Api::<Role>::namespaced(admin.clone(), &own)
        .create(
            &pp,
            &Role {
                metadata: kube::api::ObjectMeta {
                    name: Some("configmap-reader".into()),
                    ..Default::default()
                },
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["configmaps".into()]),
                    verbs: vec!["get".into(), "list".into(), "watch".into()],
                    ..Default::default()
                }]),
            },
        )
        .await?;
    Api::<RoleBinding>::namespaced(admin.clone(), &own)
        .create(
            &pp,
            &RoleBinding {
                metadata: kube::api::ObjectMeta {
                    name: Some("reader".into()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: "configmap-reader".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: "reader".into(),
                    namespace: Some(own.clone()),
                    ..Default::default()
                }]),
            },
        )
        .await?;
    for namespace in [&own, &other] {
        Api::<ConfigMap>::namespaced(admin.clone(), namespace)
            .create(
                &pp,
                &serde_json::from_value(json!({
                    "metadata": { "name": "settings" },
                    "data": { "colour": "blue" },
                }))?,
            )
            .await?;
    }

    let token = control_plane
        .service_account_token(&admin, &own, "reader")
        .await?;
    assert!(!token.is_empty(), "TokenRequest returned no token");
    let reader = control_plane.client_for_token(&token).await?;

    let listed = Api::<ConfigMap>::namespaced(reader.clone(), &own)
        .list(&ListParams::default())
        .await?;
    let names: Vec<_> = listed
        .items
        .iter()
        .filter_map(|cm| cm.metadata.name.as_deref())
        .collect();
    assert!(names.contains(&"settings"), "{names:?}");

    let forbidden = Api::<ConfigMap>::namespaced(reader.clone(), &other)
        .list(&ListParams::default())
        .await;
    assert_eq!(api_error_code(&forbidden), Some(403), "{forbidden:?}");
    let message = format!("{forbidden:?}");
    assert!(
        message.contains(&format!("system:serviceaccount:{own}:reader")),
        "the 403 should name the ServiceAccount: {message}"
    );

    // The Role grants no write verbs.
    let write = Api::<ConfigMap>::namespaced(reader.clone(), &own)
        .create(
            &pp,
            &serde_json::from_value(json!({ "metadata": { "name": "intruder" } }))?,
        )
        .await;
    assert_eq!(api_error_code(&write), Some(403), "{write:?}");

    // A token the apiserver did not sign is not a ServiceAccount at all.
    let stranger = control_plane
        .client_for_token("eyJhbGciOiJFUzI1NiJ9.e30.c2lnbmF0dXJl")
        .await?;
    let unauthenticated = Api::<ConfigMap>::namespaced(stranger, &own)
        .list(&ListParams::default())
        .await;
    assert_eq!(
        api_error_code(&unauthenticated),
        Some(401),
        "{unauthenticated:?}"
    );
    Ok(())
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_gets_410_gone() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared()?;
    let client = control_plane.client().await?;
    let namespace = control_plane.namespace(&client, "gone").await?;
    let api = Api::<PodTemplate>::namespaced(client.clone(), &namespace);

    let template: PodTemplate = serde_json::from_value(json!({
        "metadata": { "name": "web" },
        "template": { "spec": { "containers": [{ "name": "web", "image": "nginx" }] } },
    }))?;
    let created = api.create(&PostParams::default(), &template).await?;
    let old_version = created
        .metadata
        .resource_version
        .clone()
        .expect("created objects have a resourceVersion");
    for revision in 0..3 {
        let patch = json!({ "metadata": { "labels": { "revision": revision.to_string() } } });
        api.patch("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }

    // Before compaction the old version is still watchable: the 410 below is caused by
    // the compaction, not by anything else about the request.
    let mut before = api
        .watch(&WatchParams::default().timeout(5), &old_version)
        .await?
        .boxed();
    match before.try_next().await? {
        Some(WatchEvent::Modified(_)) => {}
        other => panic!("expected the first update after {old_version}, got {other:?}"),
    }
    drop(before);

    let compacted_to = control_plane.compact_etcd().await?;
    assert!(
        compacted_to > old_version.parse::<i64>()?,
        "compacted to {compacted_to}, old version {old_version}"
    );

    let mut events = api
        .watch(&WatchParams::default().timeout(5), &old_version)
        .await?
        .boxed();
    match events.try_next().await? {
        Some(WatchEvent::Error(status)) => {
            assert_eq!(status.code, 410, "{status:?}");
            assert_eq!(status.reason, "Expired", "{status:?}");
        }
        other => panic!("expected a 410 error event, got {other:?}"),
    }

    // An exact-version LIST of a compacted version fails with HTTP 410 itself.
    let exact = api
        .list(&ListParams {
            resource_version: Some(old_version.clone()),
            version_match: Some(VersionMatch::Exact),
            ..Default::default()
        })
        .await;
    assert_eq!(api_error_code(&exact), Some(410), "{exact:?}");
    Ok(())
}

/// Runs `make demo`'s binary, checks a user's kubectl can reach its cluster, then kills the
/// demo with SIGKILL (no chance to clean up) and checks etcd and kube-apiserver die with it.
#[test]
fn killing_the_owner_leaves_no_control_plane_running() -> anyhow::Result<()> {
    struct RemoveOnDrop(std::path::PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let run_dir = std::env::temp_dir().join(format!("demo-kill-test-{}", std::process::id()));
    let _cleanup = RemoveOnDrop(run_dir.clone());
    let mut demo = process::spawn_tied_to_this_process({
        let mut command = Command::new(env!("CARGO_BIN_EXE_scale-agent-demo"));
        command
            .arg(format!("--run-dir={}", run_dir.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        command
    })?;
    let stdout = demo.stdout.take().expect("stdout is piped");

    let mut pids = Vec::new();
    let mut narration = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        if let [
            name @ ("etcd" | "kube-apiserver" | "kube-controller-manager"),
            "pid",
            pid,
        ] = words.as_slice()
        {
            pids.push((name.to_string(), pid.parse::<u32>()?));
        }
        let ready = line.starts_with("==> Press Ctrl-C");
        narration.push(line);
        if ready {
            break;
        }
    }
    let narration = narration.join("\n");
    assert_eq!(pids.len(), 3, "demo printed no pids:\n{narration}");
    assert!(
        narration.contains("scaleagents.scaleagent.dev"),
        "the demo's `kubectl get crds` did not list the CRD:\n{narration}"
    );

    // A user's kubectl, pointed at the kubeconfig the demo printed, reaches the cluster.
    let kubeconfig = run_dir.join("admin.kubeconfig");
    let kubectl = scale_agent_e2e::Binaries::locate()?.kubectl();
    let output = Command::new(kubectl)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["get", "crds", "-o", "name"])
        .output()?;
    let listed = String::from_utf8_lossy(&output.stdout);
    assert!(
        listed
            .contains("customresourcedefinition.apiextensions.k8s.io/agentaccounts.scaleagent.dev"),
        "kubectl get crds: {listed}{}",
        String::from_utf8_lossy(&output.stderr)
    );

    demo.kill()?;
    demo.wait()?;
    let alive = process::still_alive_after(&pids, Duration::from_secs(10));
    assert!(
        alive.is_empty(),
        "still running 10 s after their owner was killed: {alive:?}"
    );
    Ok(())
}
