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
    api::{ListParams, PostParams},
};
use scale_agent_operator::{
    Config, Metrics,
    policy::{Grants, WatchNamespaces},
};
use tokio::{sync::oneshot, task::JoinHandle};

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
    /// own), retries from 500 ms to 4 s, and an instance label of its own.
    pub fn config(namespace: &str) -> Config {
        Config {
            watch_namespaces: WatchNamespaces::Only([namespace.to_owned()].into()),
            grants: Grants::every_namespace(),
            retry_base: Duration::from_millis(500),
            retry_max: Duration::from_secs(4),
            instance: Some(format!("e2e-{namespace}")),
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
