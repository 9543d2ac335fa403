//! The fleet install knobs of a ScaleAgent reach the agent pods, seen from the API server's
//! side: the operator's Deployment rolls out through the real kube-controller-manager,
//! kube-scheduler places the pods on KWOK's nodes (or leaves them Pending), the Priority
//! admission resolves the PriorityClass, and the disruption controller counts the pods the
//! PodDisruptionBudget selects. The CRD refuses what would take the operator's labels,
//! annotations or variables.

use std::time::Duration;

use k8s_openapi::api::{
    core::v1::{Node, Pod},
    policy::v1::PodDisruptionBudget,
    scheduling::v1::PriorityClass,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use scale_agent_crds::ScaleAgent;
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    control_plane::DEFAULT_CONTROLLERS,
    crds,
    operator::Operator,
    wait::{EVERY, wait_for_within},
};
use serde_json::{Value, json};

/// Generous: two cores are shared by many builds and tests.
const TIMEOUT: Duration = Duration::from_secs(180);

/// The label this test gives KWOK's first node, which the matching nodeSelector names.
const POOL_LABEL: &str = "scale-agent-e2e/pool";
/// The taint this test puts on KWOK's second node.
const TAINT_KEY: &str = "scale-agent-e2e/dedicated";

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(|| {
        let mut options = ControlPlaneOptions::default().with_kwok();
        options.controllers = DEFAULT_CONTROLLERS
            .iter()
            .chain(&["disruption-controller"])
            .map(|c| c.to_string())
            .collect();
        options
    })?)
}

async fn setup(prefix: &str) -> anyhow::Result<(Client, String)> {
    let control_plane = control_plane()?;
    let client = control_plane.client().await?;
    crds::install(&client, &crds::read_crds(&crds::manifests_dir())?).await?;
    let namespace = control_plane.namespace(&client, prefix).await?;
    Ok((client, namespace))
}

/// A ScaleAgent of one replica (no hub to reach: nothing here needs a connection) with
/// `knobs` among its spec fields.
fn scale_agent(name: &str, knobs: Value) -> Value {
    let mut spec = json!({
        "hub": { "address": "127.0.0.1:9", "tls": { "insecurePlaintext": true } },
        "replicas": 1,
    });
    if let (Some(spec), Some(knobs)) = (spec.as_object_mut(), knobs.as_object()) {
        spec.extend(knobs.clone());
    }
    json!({
        "apiVersion": "scaleagent.dev/v1alpha1", "kind": "ScaleAgent",
        "metadata": { "name": name },
        "spec": spec,
    })
}

async fn apply_agent(client: &Client, namespace: &str, value: &Value) -> anyhow::Result<()> {
    let name = value["metadata"]["name"].as_str().unwrap_or_default();
    Api::<ScaleAgent>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply("scale-agent-e2e").force(),
            &Patch::Apply(value),
        )
        .await?;
    Ok(())
}

/// The one pod of ScaleAgent `name`'s Deployment once `ready(pod)` holds.
async fn agent_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    what: &str,
    ready: impl Fn(&Pod) -> bool,
) -> anyhow::Result<Pod> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let selector = format!("app.kubernetes.io/instance={name},app.kubernetes.io/component=agent");
    wait_for_within(
        &format!("the agent pod of ScaleAgent {namespace}/{name} {what}"),
        TIMEOUT,
        EVERY,
        || async {
            let list = pods.list(&ListParams::default().labels(&selector)).await?;
            Ok(list.items.into_iter().find(&ready))
        },
    )
    .await
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

fn running_on(pod: &Pod, node: &str) -> bool {
    phase(pod) == Some("Running")
        && pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// Pending because kube-scheduler found no node for it (not merely not yet looked at).
fn unschedulable(pod: &Pod) -> bool {
    phase(pod) == Some("Pending")
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
}

/// Labels KWOK's first node into the pool and taints its second, once per control plane.
async fn prepare_nodes(client: &Client) -> anyhow::Result<(String, String)> {
    let nodes = Api::<Node>::all(client.clone());
    let (pool, tainted) = (
        scale_agent_e2e::kwok::NODES[0],
        scale_agent_e2e::kwok::NODES[1],
    );
    let params = PatchParams::apply("scale-agent-e2e-knobs").force();
    nodes
        .patch(
            pool,
            &params,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": pool, "labels": { POOL_LABEL: "agents" } },
            })),
        )
        .await?;
    nodes
        .patch(
            tainted,
            &params,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": tainted },
                "spec": { "taints": [{ "key": TAINT_KEY, "value": "agents", "effect": "NoSchedule" }] },
            })),
        )
        .await?;
    Ok((pool.to_owned(), tainted.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_knob_reaches_the_agent_pods_and_the_budget_follows_the_field() -> anyhow::Result<()> {
    let (client, ns) = setup("knobs").await?;
    let (pool_node, tainted_node) = prepare_nodes(&client).await?;
    let priority_class = format!("{ns}-agents");
    Api::<PriorityClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": priority_class },
                "value": 100_000,
            }))?,
        )
        .await?;
    let operator = Operator::watching(client.clone(), &ns);

    // Every knob at once, on a node the selector matches.
    apply_agent(
        &client,
        &ns,
        &scale_agent(
            "placed",
            json!({
                "nodeSelector": { POOL_LABEL: "agents" },
                "imagePullSecrets": [{ "name": "registry-credentials" }],
                "priorityClassName": priority_class,
                "podLabels": { "team": "platform" },
                "podAnnotations": { "example.com/scraped": "true" },
                "env": [
                    { "name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128" },
                    { "name": "NO_PROXY", "value": ".svc,.cluster.local,10.0.0.1" },
                ],
                "podDisruptionBudget": { "maxUnavailable": 1 },
            }),
        ),
    )
    .await?;
    // A selector no node matches: the pod stays Pending, unschedulable.
    apply_agent(
        &client,
        &ns,
        &scale_agent(
            "nowhere",
            json!({ "nodeSelector": { POOL_LABEL: "no-such-pool" } }),
        ),
    )
    .await?;
    // The tainted node, chosen by node affinity: only a pod that tolerates the taint runs.
    let on_tainted_node = json!({ "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{ "matchExpressions": [
            { "key": "kubernetes.io/hostname", "operator": "In", "values": [tainted_node] },
        ] }],
    } } });
    apply_agent(
        &client,
        &ns,
        &scale_agent(
            "tolerant",
            json!({
                "affinity": on_tainted_node,
                "tolerations": [{ "key": TAINT_KEY, "operator": "Equal", "value": "agents", "effect": "NoSchedule" }],
            }),
        ),
    )
    .await?;
    apply_agent(
        &client,
        &ns,
        &scale_agent("intolerant", json!({ "affinity": on_tainted_node })),
    )
    .await?;

    let placed = agent_pod(&client, &ns, "placed", "running on the pool's node", |p| {
        running_on(p, &pool_node)
    })
    .await?;
    let meta = &placed.metadata;
    let labels = meta.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("platform"));
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("scale-agent-operator")
    );
    assert_eq!(
        meta.annotations
            .clone()
            .unwrap_or_default()
            .get("example.com/scraped")
            .map(String::as_str),
        Some("true")
    );
    let spec = placed.spec.clone().unwrap_or_default();
    // The API server's Priority admission resolved the class: the pod carries its value.
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some(priority_class.as_str())
    );
    assert_eq!(spec.priority, Some(100_000));
    assert_eq!(
        spec.image_pull_secrets
            .unwrap_or_default()
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        ["registry-credentials"]
    );
    let env: Vec<(String, Option<String>)> = spec.containers[0]
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect();
    for expected in [
        ("HTTPS_PROXY", "http://proxy.example.com:3128"),
        ("NO_PROXY", ".svc,.cluster.local,10.0.0.1"),
    ] {
        assert!(
            env.contains(&(expected.0.to_owned(), Some(expected.1.to_owned()))),
            "{expected:?} not in the agent container's env {env:?}"
        );
    }
    assert_eq!(env[0].0, "POD_NAME", "the operator's variables come first");

    let nowhere = agent_pod(&client, &ns, "nowhere", "unschedulable", unschedulable).await?;
    assert!(nowhere.spec.and_then(|s| s.node_name).is_none());
    agent_pod(
        &client,
        &ns,
        "tolerant",
        "running on the tainted node",
        |p| running_on(p, &tainted_node),
    )
    .await?;
    let intolerant = agent_pod(&client, &ns, "intolerant", "unschedulable", unschedulable).await?;
    let message = intolerant
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .and_then(|c| c.message)
        .unwrap_or_default();
    assert!(
        message.contains("untolerated taint"),
        "the scheduler names the taint: {message:?}"
    );

    // The budget: owned by the ScaleAgent, and the disruption controller counts the agent
    // pod it selects.
    let budgets = Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns);
    let budget = wait_for_within(
        "the disruption controller to count the agent pod in PodDisruptionBudget placed-agent",
        TIMEOUT,
        EVERY,
        || async {
            let budget = budgets.get_opt("placed-agent").await?;
            Ok(budget.filter(|b| {
                b.status
                    .as_ref()
                    .is_some_and(|s| s.expected_pods == Some(1) && s.current_healthy == Some(1))
            }))
        },
    )
    .await?;
    let owner = budget
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .next();
    assert_eq!(
        owner.map(|o| (o.kind, o.name)),
        Some(("ScaleAgent".to_owned(), "placed".to_owned()))
    );
    assert_eq!(
        budget.spec.and_then(|s| s.max_unavailable),
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    assert!(
        budgets.get_opt("nowhere-agent").await?.is_none(),
        "no budget without the field"
    );

    // The field removed: the budget goes; the Deployment stays.
    let mut without = scale_agent(
        "placed",
        json!({ "nodeSelector": { POOL_LABEL: "agents" } }),
    );
    without["spec"]["priorityClassName"] = json!(priority_class);
    apply_agent(&client, &ns, &without).await?;
    wait_for_within(
        "PodDisruptionBudget placed-agent to be deleted with spec.podDisruptionBudget",
        TIMEOUT,
        EVERY,
        || async {
            Ok(budgets
                .get_opt("placed-agent")
                .await?
                .is_none()
                .then_some(()))
        },
    )
    .await?;

    operator.stop().await?;
    for name in ["placed", "nowhere", "tolerant", "intolerant"] {
        Api::<ScaleAgent>::namespaced(client.clone(), &ns)
            .delete(name, &DeleteParams::default())
            .await?;
    }
    Api::<PriorityClass>::all(client.clone())
        .delete(&priority_class, &DeleteParams::default())
        .await?;
    Ok(())
}

/// The API server refuses what would take the operator's own labels, annotations or
/// variables, and a budget with both or neither bound, with a message that says what to
/// change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crd_keeps_the_operators_keys_and_wants_one_budget_bound() -> anyhow::Result<()> {
    let (client, ns) = setup("knobs-refused").await?;
    let api = Api::<ScaleAgent>::namespaced(client.clone(), &ns);
    let apply = |value: Value| {
        let api = api.clone();
        async move {
            let name = value["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            api.patch(
                &name,
                &PatchParams::apply("scale-agent-e2e"),
                &Patch::Apply(&value),
            )
            .await
        }
    };
    for (knobs, expected) in [
        (
            json!({ "podLabels": { "app.kubernetes.io/instance": "other" } }),
            "podLabels may not set app.kubernetes.io/name, instance",
        ),
        (
            json!({ "podLabels": { "scaleagent.dev/owner-namespace": "x" } }),
            "nor keys under scaleagent.dev/",
        ),
        (
            json!({ "podAnnotations": { "scaleagent.dev/desired-hash": "0" } }),
            "podAnnotations may not set keys under scaleagent.dev/",
        ),
        (
            json!({ "env": [{ "name": "POD_NAMESPACE", "value": "forged" }] }),
            "env may not set POD_NAME or POD_NAMESPACE",
        ),
        (
            json!({ "podDisruptionBudget": { "minAvailable": 1, "maxUnavailable": 1 } }),
            "exactly one of minAvailable and maxUnavailable",
        ),
        (
            json!({ "podDisruptionBudget": {} }),
            "exactly one of minAvailable and maxUnavailable",
        ),
        // k8s-openapi's schema, checked as in a pod spec.
        (
            json!({ "imagePullSecrets": [{}] }),
            "spec.imagePullSecrets[0].name: Required value",
        ),
    ] {
        let result = apply(scale_agent("refused", knobs.clone())).await;
        let message = match result {
            Err(kube::Error::Api(status)) if status.code == 422 => status.message,
            other => anyhow::bail!("{knobs} was not refused with 422: {other:?}"),
        };
        assert!(
            message.contains(expected),
            "{knobs}: {expected:?} not in {message:?}"
        );
    }
    // The same keys elsewhere are the user's.
    let accepted = scale_agent(
        "accepted",
        json!({
            "podLabels": { "app.kubernetes.io/version": "v1", "team": "platform" },
            "podAnnotations": { "example.com/owner": "platform" },
            "env": [{ "name": "POD_LABEL", "value": "x" }],
            "podDisruptionBudget": { "minAvailable": "50%" },
        }),
    );
    apply(accepted).await?;
    Ok(())
}
