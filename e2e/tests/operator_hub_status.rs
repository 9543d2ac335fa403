//! An AgentAccount's `status.hub` while no agent pod serves it (issue 29), on a real control
//! plane with kube-controller-manager, kube-scheduler and KWOK's nodes: the agent's
//! Deployment rolls out for real, and its pod stays Pending (a nodeSelector no node matches)
//! or becomes Ready on a KWOK node. The operator's controllers run in the test with a short
//! grace period.
//!
//! The agent's own writes are made the way `agent/src/status_writer.rs` makes them (server-side
//! apply with field manager `scale-agent-agent`, forced): KWOK's pods run no process, so no
//! agent streams here; `agent_status.rs` covers the writer itself with real agents.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use scale_agent_crds::{AGENT_FIELD_MANAGER, AgentAccount, ScaleAgent};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions, crds,
    operator::{Operator, apply_in},
    wait::{EVERY, wait_for_within},
};
use scale_agent_operator::controller::hub_status::HUB_FIELD_MANAGER;
use serde_json::{Value, json};

/// The operator's grace period in this test (a minute by default).
const GRACE: Duration = Duration::from_secs(15);
/// Generous: two cores are shared by many builds and tests.
const TIMEOUT: Duration = Duration::from_secs(180);

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(|| {
        ControlPlaneOptions::default().with_kwok()
    })?)
}

fn scale_agent(node_selector: Option<Value>) -> Value {
    let mut spec = json!({
        "hub": { "address": "127.0.0.1:9", "tls": { "insecurePlaintext": true } },
        "replicas": 1,
    });
    if let Some(selector) = node_selector {
        spec["nodeSelector"] = selector;
    }
    json!({
        "apiVersion": "scaleagent.dev/v1alpha1", "kind": "ScaleAgent",
        "metadata": { "name": "prod" }, "spec": spec,
    })
}

/// What a streaming agent replica writes: the hub's verdict, with the agent's field manager.
async fn agent_writes(
    accounts: &Api<AgentAccount>,
    replica: &str,
    state: &str,
    objects: i64,
) -> anyhow::Result<()> {
    let body = json!({
        "apiVersion": "scaleagent.dev/v1alpha1", "kind": "AgentAccount",
        "status": { "hub": {
            "replica": replica, "state": state, "stateReason": "the hub accepted the account",
            "objectsStreamed": objects, "kindsWatched": ["configmaps"],
        } },
    });
    accounts
        .patch_status(
            "web",
            &PatchParams::apply(AGENT_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    Ok(())
}

/// The `status.hub` fields field manager `manager` owns on `account`.
fn owned_hub_fields(account: &AgentAccount, manager: &str) -> Vec<String> {
    account
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|entry| entry.manager.as_deref() == Some(manager))
        .filter_map(|entry| entry.fields_v1.as_ref())
        .filter_map(|fields| fields.0.pointer("/f:status/f:hub")?.as_object())
        .flat_map(|hub| hub.keys().filter(|key| *key != ".").cloned())
        .collect()
}

fn hub_state(account: &AgentAccount) -> Option<(String, String)> {
    let hub = account.status.as_ref()?.hub.as_ref()?;
    Some((
        hub.state.clone().unwrap_or_default(),
        hub.state_reason.clone().unwrap_or_default(),
    ))
}

async fn ready_pods(deployments: &Api<Deployment>) -> anyhow::Result<i32> {
    Ok(deployments
        .get_opt("prod-agent")
        .await?
        .and_then(|d| d.status)
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_without_a_ready_agent_pod_says_unknown_until_the_agent_writes_again()
-> anyhow::Result<()> {
    scale_agent_e2e::fixtures::init_logs("error");
    let control_plane = control_plane()?;
    let client = control_plane.client().await?;
    crds::install(&client, &crds::read_crds(&crds::manifests_dir())?).await?;
    let ns = control_plane.namespace(&client, "op-hub-status").await?;
    let accounts = Api::<AgentAccount>::namespaced(client.clone(), &ns);
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);

    // An agent that ran and streamed: its last verdict is ACTIVE.
    apply_in::<AgentAccount>(
        &client,
        &ns,
        &json!({
            "apiVersion": "scaleagent.dev/v1alpha1", "kind": "AgentAccount",
            "metadata": { "name": "web" },
            "spec": { "agentRef": "prod", "kinds": ["ConfigMap"] },
        }),
    )
    .await?;
    // Its pod can be scheduled nowhere: no agent pod is ever ready.
    let nowhere = json!({ "scale-agent-e2e/pool": "nowhere" });
    apply_in::<ScaleAgent>(&client, &ns, &scale_agent(Some(nowhere))).await?;
    let config = scale_agent_operator::Config {
        agent_absent_grace: GRACE,
        ..Operator::config(&ns)
    };
    let operator = Operator::start(client.clone(), config);
    let started = Instant::now();
    wait_for_within("the agent's Deployment", TIMEOUT, EVERY, || async {
        Ok(deployments.get_opt("prod-agent").await?.map(|_| ()))
    })
    .await?;
    agent_writes(&accounts, "prod-agent-5d9c-old", "ACTIVE", 12).await?;

    let (state, reason) = wait_for_within(
        "status.hub.state Unknown from the operator",
        GRACE + TIMEOUT,
        EVERY,
        || async {
            let account = accounts.get("web").await?;
            Ok(hub_state(&account).filter(|(state, _)| state == "Unknown"))
        },
    )
    .await?;
    let waited = started.elapsed();
    assert!(
        waited >= GRACE - Duration::from_secs(1),
        "Unknown after {waited:?}, before the grace period of {GRACE:?}"
    );
    assert_eq!(ready_pods(&deployments).await?, 0);
    assert_eq!(state, "Unknown");
    for part in [
        format!("no agent pod of ScaleAgent {ns}/prod is ready since "),
        "0 of 1 pods of Deployment prod-agent ready".to_owned(),
        format!("kubectl -n {ns} describe deployment prod-agent"),
        "ORPHANED".to_owned(),
    ] {
        assert!(reason.contains(&part), "{part:?} not in {reason:?}");
    }
    let account = accounts.get("web").await?;
    let hub = account
        .status
        .as_ref()
        .and_then(|s| s.hub.as_ref())
        .ok_or_else(|| anyhow::anyhow!("no status.hub"))?;
    // Only what says the state changed hands; the agent's counters are the agent's still.
    assert_eq!(hub.replica, "");
    assert_eq!(hub.objects_streamed, 12);
    let mut operator_fields = owned_hub_fields(&account, HUB_FIELD_MANAGER);
    operator_fields.sort();
    assert_eq!(operator_fields, ["f:replica", "f:state", "f:stateReason"]);
    let agent_fields = owned_hub_fields(&account, AGENT_FIELD_MANAGER);
    assert!(
        agent_fields.contains(&"f:objectsStreamed".to_owned())
            && !agent_fields.contains(&"f:state".to_owned()),
        "{agent_fields:?}"
    );
    // The operator's other status writes leave it alone: its conditions are still written.
    assert!(account.status.as_ref().is_some_and(|s| s.accepted));

    // The pod can run again: KWOK makes it Ready, and the agent's first write is the state.
    apply_in::<ScaleAgent>(&client, &ns, &scale_agent(None)).await?;
    wait_for_within("an agent pod ready", TIMEOUT, EVERY, || async {
        Ok((ready_pods(&deployments).await? > 0).then_some(()))
    })
    .await?;
    agent_writes(&accounts, "prod-agent-7f4b-new", "ACTIVE", 3).await?;
    wait_for_within(
        "the agent's ACTIVE, and nothing of status.hub owned by the operator",
        TIMEOUT,
        EVERY,
        || async {
            let account = accounts.get("web").await?;
            let active = hub_state(&account).is_some_and(|(state, _)| state == "ACTIVE");
            let released = owned_hub_fields(&account, HUB_FIELD_MANAGER).is_empty();
            Ok((active && released).then_some(()))
        },
    )
    .await?;
    // And it stays the agent's while the pod is ready: past another grace period, with the
    // operator reconciling (a ScaleAgent change makes it look at once).
    let ready_since = Instant::now();
    let mut touched = false;
    while ready_since.elapsed() < GRACE + Duration::from_secs(5) {
        if !touched && ready_since.elapsed() > GRACE / 2 {
            let mut agent = scale_agent(None);
            agent["metadata"]["annotations"] = json!({ "e2e/poke": "1" });
            apply_in::<ScaleAgent>(&client, &ns, &agent).await?;
            touched = true;
        }
        let account = accounts.get("web").await?;
        let hub = account.status.as_ref().and_then(|s| s.hub.as_ref());
        assert!(
            hub.is_some_and(
                |h| h.state.as_deref() == Some("ACTIVE") && h.replica == "prod-agent-7f4b-new"
            ),
            "{hub:?}"
        );
        tokio::time::sleep(EVERY).await;
    }
    operator.stop().await
}
