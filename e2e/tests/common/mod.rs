//! What the tests of the caller's identity in the target cluster share (issue 31:
//! proxy_callers.rs with hub-issued tokens, people_end_to_end.rs with OIDC): the hub's audit
//! lines captured in this process, kubectl runs, and the API server's audit event of a
//! request the hub named.

// Each test file uses only some of these.
#![allow(dead_code)]

use std::{
    io::Write,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use scale_agent_e2e::{
    ControlPlane,
    control_plane::AuditEvent,
    kubectl::{Kubectl, Outcome},
};
use serde_json::{Value, json};

pub const KUBECTL_TIMEOUT: Duration = Duration::from_secs(90);
pub const WAIT: Duration = Duration::from_secs(30);

/// The hub runs in this process: its audit lines (JSON, target `audit`) are kept here.
#[derive(Clone, Default)]
pub struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// The `fields` of every audit line so far.
    pub fn audit(&self) -> Vec<Value> {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["target"] == "audit")
            .map(|v| v["fields"].clone())
            .collect()
    }
}

pub fn capture_audit_lines() -> Lines {
    let lines = Lines::default();
    let writer = lines.clone();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter("warn,audit=info")
        .with_writer(move || writer.clone())
        .init();
    lines
}

pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

pub fn deployment(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{ "name": "main", "image": "registry.example/web:1" }] },
            },
        },
    })
}

pub async fn kubectl(
    kubectl: &Kubectl,
    kubeconfig: &Path,
    list: &[&str],
    stdin: Option<&str>,
) -> anyhow::Result<Outcome> {
    Ok(kubectl
        .run(kubeconfig, &args(list), stdin, KUBECTL_TIMEOUT)
        .await?)
}

/// Waits for the hub's audit line that `pick` finds (lines are written when a response's
/// body ends, just after kubectl read it).
pub async fn hub_line(
    lines: &Lines,
    what: &str,
    pick: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(line) = lines.audit().into_iter().find(|l| pick(l)) {
            return Ok(line);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no hub audit line for {what}: {:#?}",
            lines.audit()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The API server's audit event of the request the hub named `request_id`.
pub async fn target_event(
    control_plane: &ControlPlane,
    request_id: &str,
) -> anyhow::Result<AuditEvent> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(event) = control_plane
            .audit_events()?
            .into_iter()
            .find(|e| e.audit_id == request_id)
        {
            return Ok(event);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the API server's audit log has no request with audit id {request_id}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Lets `subject` (`kind` `User` or `Group`, as the agent names the caller) edit ConfigMaps and
/// Deployments in `namespace` and nothing else: the RoleBinding a GitOps repository would hold.
/// A Role of its own (`role`): the built-in `edit` is aggregated by the controller manager,
/// which this control plane does not run.
pub async fn grant_edit(
    admin: &Client,
    namespace: &str,
    role: &str,
    binding: &str,
    (kind, subject): (&str, &str),
) -> anyhow::Result<()> {
    let pp = PostParams::default();
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(
            &pp,
            &Role {
                metadata: ObjectMeta {
                    name: Some(role.into()),
                    ..Default::default()
                },
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec![String::new(), "apps".into()]),
                    resources: Some(vec!["configmaps".into(), "deployments".into()]),
                    verbs: vec!["*".into()],
                    ..Default::default()
                }]),
            },
        )
        .await?;
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(
            &pp,
            &RoleBinding {
                metadata: ObjectMeta {
                    name: Some(binding.into()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: role.into(),
                },
                subjects: Some(vec![Subject {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: kind.into(),
                    name: subject.into(),
                    ..Default::default()
                }]),
            },
        )
        .await?;
    Ok(())
}
