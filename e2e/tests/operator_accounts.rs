//! How the operator reads AgentAccounts (issue 11, operator defects 3 and 4), against a real
//! control plane whose API server writes an audit log: one AgentAccount the Rust type cannot
//! read gets a Warning Event and does not stop the others from being reconciled; reconciles
//! read the controllers' cache instead of LISTing every AgentAccount from the API server, and
//! reuse API discovery instead of running it each time. The counts come from the API
//! server's audit log, not from the operator's own counters.

use std::time::Instant;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use scale_agent_crds::{
    AgentAccount, ScaleAgent,
    conditions::{ACCEPTED, find_condition},
};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions, crds,
    operator::{Operator, wait_for_event},
    wait::wait_for,
};
use serde_json::{Value, json};

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(|| {
        ControlPlaneOptions::default().with_audit()
    })?)
}

/// An admin client, the CRDs installed, and a fresh namespace.
async fn setup(prefix: &str) -> anyhow::Result<(&'static ControlPlane, Client, String)> {
    let control_plane = control_plane()?;
    let client = control_plane.client().await?;
    crds::install(&client, &crds::read_crds(&crds::manifests_dir())?).await?;
    let namespace = control_plane.namespace(&client, prefix).await?;
    Ok((control_plane, client, namespace))
}

fn scale_agent(name: &str) -> Value {
    json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "ScaleAgent",
        "metadata": { "name": name },
        "spec": {
            "hub": { "address": "hub.spinnaker.example.com:9091" },
            "enrolment": { "tokenSecretRef": { "name": "enrolment-token" } },
        },
    })
}

fn agent_account(name: &str, account_name: &str) -> Value {
    json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "AgentAccount",
        "metadata": { "name": name },
        "spec": { "agentRef": "prod", "accountName": account_name, "kinds": ["ConfigMap"] },
    })
}

/// Untyped access to `K`, to store what the Rust type cannot read.
fn raw<K: kube::Resource<DynamicType = ()>>(
    client: &Client,
    namespace: &str,
) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &ApiResource::erase::<K>(&()))
}

/// Whether AgentAccount `name` has `Accepted=True`.
async fn accepted(client: &Client, namespace: &str, name: &str) -> anyhow::Result<bool> {
    let account = Api::<AgentAccount>::namespaced(client.clone(), namespace)
        .get(name)
        .await?;
    Ok(account
        .status
        .as_ref()
        .and_then(|s| find_condition(&s.conditions, ACCEPTED))
        .is_some_and(|c| c.status == "True"))
}

/// The agent config the operator rendered for ScaleAgent `prod`, as text.
async fn rendered_config(client: &Client, namespace: &str) -> anyhow::Result<Option<String>> {
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt("prod-agent")
        .await?;
    Ok(config_map
        .and_then(|c| c.data)
        .map(|data| data.into_values().collect::<Vec<_>>().join("\n")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_agent_account_gets_an_event_and_the_others_are_still_reconciled()
-> anyhow::Result<()> {
    let (_, client, ns) = setup("accounts-unreadable").await?;
    let accounts = raw::<AgentAccount>(&client, &ns);
    let post = PostParams::default();
    raw::<ScaleAgent>(&client, &ns)
        .create(&post, &serde_json::from_value(scale_agent("prod"))?)
        .await?;
    let broken_name = format!("{ns}-broken");
    accounts
        .create(
            &post,
            &serde_json::from_value(agent_account("broken", &broken_name))?,
        )
        .await?;
    // A condition's `lastTransitionTime` has `format: date-time` in the CRD's schema; the API
    // server accepts a time with ten fractional digits, but the Rust type (a jiff timestamp,
    // at most nanoseconds) cannot read it. Nothing in the schema is loosened.
    let condition = json!({
        "type": "Ready", "status": "False", "reason": "Set", "message": "by hand",
        "lastTransitionTime": "2024-01-01T00:00:00.1234567891Z",
    });
    accounts
        .patch_status(
            "broken",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "conditions": [condition] } })),
        )
        .await?;
    let unreadable = Api::<AgentAccount>::namespaced(client.clone(), &ns)
        .get("broken")
        .await;
    assert!(
        matches!(unreadable, Err(kube::Error::SerdeError(_))),
        "the premise: the Rust type must refuse the stored object, got {unreadable:?}"
    );
    let good_name = format!("{ns}-good");
    accounts
        .create(
            &post,
            &serde_json::from_value(agent_account("good", &good_name))?,
        )
        .await?;

    let operator = Operator::watching(client.clone(), &ns);
    // The readable account is reconciled and goes into its agent's config; the unreadable
    // one does not.
    wait_for("the readable AgentAccount accepted", || async {
        Ok(accepted(&client, &ns, "good").await?.then_some(()))
    })
    .await?;
    let config = wait_for("the agent config with the readable account", || async {
        Ok(rendered_config(&client, &ns)
            .await?
            .filter(|config| config.contains(&good_name)))
    })
    .await?;
    assert!(!config.contains(&broken_name), "{config}");

    // The unreadable one gets a Warning Event saying why and what to do.
    let event = wait_for_event(&client, &ns, "InvalidObject", "AgentAccount", "broken").await?;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    for part in [
        "cannot read this AgentAccount",
        "field status.conditions[0].lastTransitionTime",
        "fix status.conditions[0].lastTransitionTime",
        &format!("kubectl edit agentaccount -n {ns} broken"),
    ] {
        assert!(
            note.contains(part),
            "no {part:?} in the Event's note: {note}"
        );
    }
    operator.stop().await
}

/// LIST requests for AgentAccounts in `namespace`, and discovery requests (`/api`, `/apis`),
/// that the API server's audit log holds so far.
fn audited_lists(control_plane: &ControlPlane, namespace: &str) -> anyhow::Result<(usize, usize)> {
    let events = control_plane.audit_events()?;
    let accounts = format!("/apis/scaleagent.dev/v1alpha1/namespaces/{namespace}/agentaccounts");
    let lists = events
        .iter()
        .filter(|e| e.verb == "list" && e.request_uri.starts_with(&accounts))
        .count();
    let discovery = events
        .iter()
        .filter(|e| {
            let path = e.request_uri.split('?').next().unwrap_or_default();
            e.verb == "get" && (path == "/api" || path == "/apis")
        })
        .count();
    Ok((lists, discovery))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciles_read_accounts_from_the_cache_and_reuse_discovery() -> anyhow::Result<()> {
    let (control_plane, client, ns) = setup("accounts-cached").await?;
    let post = PostParams::default();
    raw::<ScaleAgent>(&client, &ns)
        .create(&post, &serde_json::from_value(scale_agent("prod"))?)
        .await?;
    let names = ["one", "two", "three"];
    for name in names {
        raw::<AgentAccount>(&client, &ns)
            .create(
                &post,
                &serde_json::from_value(agent_account(name, &format!("{ns}-{name}")))?,
            )
            .await?;
    }
    let operator = Operator::watching(client.clone(), &ns);
    wait_for("every account in the agent config", || async {
        let config = rendered_config(&client, &ns).await?.unwrap_or_default();
        let all = names
            .iter()
            .all(|name| config.contains(&format!("{ns}-{name}")));
        Ok(all.then_some(()))
    })
    .await?;
    let (lists_at_start, discovery_at_start) = audited_lists(control_plane, &ns)?;

    // Each change of an account reconciles it and its agent.
    let accounts = Api::<AgentAccount>::namespaced(client.clone(), &ns);
    let touches = 6;
    let window = Instant::now();
    let agent_reconciles_before = operator.reconciles("scaleagent");
    let account_reconciles_before = operator.reconciles("agentaccount");
    for touch in 0..touches {
        let name = names[touch % names.len()];
        let seen = operator.reconciles("scaleagent");
        accounts
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "touch": touch.to_string() } } })),
            )
            .await?;
        wait_for(
            "the agent reconciled after a change of its account",
            || async { Ok((operator.reconciles("scaleagent") > seen).then_some(())) },
        )
        .await?;
    }
    let agent_reconciles = operator.reconciles("scaleagent") - agent_reconciles_before;
    let account_reconciles = operator.reconciles("agentaccount") - account_reconciles_before;
    let (lists, discovery) = audited_lists(control_plane, &ns)?;
    operator.stop().await?;

    // Before: every ScaleAgent and AgentAccount reconcile LISTed every AgentAccount (here at
    // least 12 LISTs), and every ScaleAgent reconcile ran discovery (2 requests each). Now
    // the only LISTs are the watch's (a relist if the API server ends it with 410 Gone); the
    // discovery count also holds the other test's operator in this binary, whose discovery
    // is cached as well.
    assert!(
        agent_reconciles >= touches as u64 && account_reconciles >= touches as u64,
        "the premise: each touch reconciles ({agent_reconciles} agent and \
         {account_reconciles} account reconciles for {touches} touches)"
    );
    let new_lists = lists - lists_at_start;
    assert!(
        new_lists <= 1,
        "{new_lists} LISTs of AgentAccounts for {agent_reconciles} agent and \
         {account_reconciles} account reconciles: reconciles must read the controllers' cache"
    );
    let new_discovery = discovery - discovery_at_start;
    // Two operators, two requests (/api, /apis) each, once a minute at most.
    let minutes = usize::try_from(window.elapsed().as_secs() / 60).unwrap_or(usize::MAX);
    let allowed = 4 * (1 + minutes);
    assert!(
        allowed < 2 * agent_reconciles as usize,
        "the premise: running discovery at each reconcile would exceed {allowed} requests"
    );
    assert!(
        new_discovery <= allowed,
        "{new_discovery} discovery requests for {agent_reconciles} agent reconciles: \
         discovery must be reused"
    );
    Ok(())
}
