//! The operator's controllers running inside a test's runtime, watching only the test's
//! namespace, so tests do not see each other's objects and an operator can be stopped and
//! started again (a restart, or an upgrade). Tests of the operator *process* (its flags,
//! `/readyz`, exit codes) start the binary instead.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::{
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
    events::v1::Event,
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use scale_agent_operator::{
    Config, Metrics,
    policy::{Grants, WatchNamespaces},
};
use serde_json::{Value, json};
use tokio::{sync::oneshot, task::JoinHandle};

use crate::ControlPlane;

/// How long [`Operator::stop`] waits for the controllers to end.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Controllers started by [`Operator::start`].
pub struct Operator {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<scale_agent_operator::Result<()>>,
    pub metrics: Arc<Metrics>,
}

impl Operator {
    /// The tests' configuration: only `namespace` watched, Roles grantable in every
    /// namespace but the reserved ones (the tests give agents rights in namespaces of their
    /// own), retries from 500 ms to 4 s, an instance label of its own, and an hour before an
    /// AgentAccount's `status.hub` says no agent pod is ready: most tests run their agents
    /// as local processes ([`crate::local_agent`]) beside a Deployment whose pods never run,
    /// which the operator cannot tell from an absent agent (`operator_hub_status.rs` sets
    /// its own).
    pub fn config(namespace: &str) -> Config {
        Config {
            watch_namespaces: WatchNamespaces::Only([namespace.to_owned()].into()),
            grants: Grants::every_namespace(),
            retry_base: Duration::from_millis(500),
            retry_max: Duration::from_secs(4),
            instance: Some(format!("e2e-{namespace}")),
            agent_absent_grace: Duration::from_secs(3600),
            ..Config::default()
        }
    }

    /// Starts the controllers with `config`.
    pub fn start(client: Client, config: Config) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let metrics = Arc::new(Metrics::new());
        let task = tokio::spawn(scale_agent_operator::run_controllers(
            client,
            config,
            metrics.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            stop: Some(stop),
            task,
            metrics,
        }
    }

    /// Starts the controllers with [`Self::config`] for `namespace`.
    pub fn watching(client: Client, namespace: &str) -> Self {
        Self::start(client, Self::config(namespace))
    }

    /// Stops the controllers and fails if they ended with an error or did not end in time.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(STOP_TIMEOUT, &mut self.task).await???;
        Ok(())
    }

    /// Reconciles counted for `controller` (`scaleagent`, `agentaccount`) since start.
    pub fn reconciles(&self, controller: &str) -> u64 {
        let prefix =
            format!("scale_agent_operator_reconciles_total{{controller=\"{controller}\"}} ");
        self.metrics
            .render()
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// Waits for the Event with `reason` about the `kind` object `name` in `namespace` (the
/// operator's Events on the objects it reads), and returns it.
pub async fn wait_for_event(
    client: &Client,
    namespace: &str,
    reason: &str,
    kind: &str,
    name: &str,
) -> anyhow::Result<Event> {
    let events = Api::<Event>::namespaced(client.clone(), namespace);
    crate::wait::wait_for(
        &format!("the {reason} Event on {kind} {namespace}/{name}"),
        || async {
            Ok(events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find(|e| {
                    let regarding = e.regarding.as_ref();
                    e.reason.as_deref() == Some(reason)
                        && regarding.and_then(|r| r.kind.as_deref()) == Some(kind)
                        && regarding.and_then(|r| r.name.as_deref()) == Some(name)
                }))
        },
    )
    .await
}

/// Whether the API server lets ServiceAccount `namespace/name` do what `attributes` say: a
/// SubjectAccessReview, the API server's own answer (its RBAC), not the operator's.
pub async fn service_account_may(
    admin: &Client,
    (namespace, name): (&str, &str),
    attributes: ResourceAttributes,
) -> anyhow::Result<bool> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{namespace}:{name}")),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(attributes),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Runs the control plane's kubectl as the admin and returns its stdout.
pub fn kubectl(control_plane: &ControlPlane, args: &[&str]) -> anyhow::Result<String> {
    let output = std::process::Command::new(control_plane.binaries().kubectl())
        .arg("--kubeconfig")
        .arg(control_plane.kubeconfig_path())
        .args(args)
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// Lists ScaleAgent `namespace/name` in the shipped ClusterRole
/// `scale-agent-operator-cluster-grants` with the `kubectl patch` manifests/operator/rbac.yaml
/// documents (replacing whatever it listed), so the operator may grant its two ClusterRoles.
pub fn list_in_cluster_grants(
    control_plane: &ControlPlane,
    namespace: &str,
    name: &str,
) -> anyhow::Result<()> {
    let names = json!([
        format!("scale-agent:{namespace}:{name}"),
        format!("scale-agent:{namespace}:{name}:callers"),
    ]);
    let patch = json!([{ "op": "add", "path": "/rules", "value": [
        { "apiGroups": ["rbac.authorization.k8s.io"],
          "resources": ["clusterroles", "clusterrolebindings"],
          "verbs": ["patch", "delete"], "resourceNames": names },
        { "apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
          "verbs": ["escalate", "bind"], "resourceNames": names },
    ]}]);
    kubectl(
        control_plane,
        &[
            "patch",
            "clusterrole",
            "scale-agent-operator-cluster-grants",
            "--type=json",
            "-p",
            &patch.to_string(),
        ],
    )?;
    Ok(())
}

/// Server-side applies `value` (a namespaced object with `metadata.name`) in `namespace`
/// as the tests' field manager, forced.
pub async fn apply_in<K>(client: &Client, namespace: &str, value: &Value) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
{
    let name = value["metadata"]["name"].as_str().unwrap_or_default();
    Api::<K>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply("scale-agent-e2e").force(),
            &Patch::Apply(value),
        )
        .await?;
    Ok(())
}

/// Applies the shipped manifests/operator with `kubectl apply -k`, as a user installs it, and
/// returns a client authenticated with a real token of the operator's ServiceAccount
/// (`scale-agent-system/scale-agent-operator`).
pub async fn shipped_operator(
    control_plane: &ControlPlane,
    admin: &Client,
) -> anyhow::Result<Client> {
    let operator_dir = crate::crds::manifests_dir()
        .parent()
        .map(|root| root.join("operator"))
        .ok_or_else(|| anyhow::anyhow!("no manifests directory"))?;
    kubectl(
        control_plane,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-k",
            &operator_dir.to_string_lossy(),
        ],
    )?;
    let token = control_plane
        .service_account_token(admin, "scale-agent-system", "scale-agent-operator")
        .await?;
    Ok(control_plane.client_for_token(&token).await?)
}

/// Binds the shipped ClusterRole `cluster_role` to the operator's ServiceAccount in
/// `namespace` with RoleBinding `binding`, the `kubectl create rolebinding` that
/// manifests/operator/rbac.yaml says to run for each watched or grantable namespace.
pub fn bind_operator(
    control_plane: &ControlPlane,
    namespace: &str,
    binding: &str,
    cluster_role: &str,
) -> anyhow::Result<()> {
    kubectl(
        control_plane,
        &[
            "-n",
            namespace,
            "create",
            "rolebinding",
            binding,
            &format!("--clusterrole={cluster_role}"),
            "--serviceaccount=scale-agent-system:scale-agent-operator",
        ],
    )?;
    Ok(())
}
