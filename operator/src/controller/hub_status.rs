//! `status.hub` of the AgentAccounts of a ScaleAgent none of whose agent pods is ready
//! (issue 29). The agent writes `status.hub` from the hub's verdict, which only a running
//! agent hears; with no agent pod ready (Deployment scaled to 0, image pull failing, crash
//! loop, unschedulable) its last value (typically ACTIVE) would stand beside
//! `Connected=False` for as long as that lasts. After [`super::Config::agent_absent_grace`] without
//! a ready pod the operator, which sees the Deployment, writes `state: Unknown` and why.
//!
//! Ownership, so that neither side fights the other: the operator writes with a field
//! manager of its own, [`HUB_FIELD_MANAGER`], which owns `status.hub.replica`, `.state` and
//! `.stateReason` only while it says the agent is absent.
//! - It applies with force, taking those fields from the agent (`scale-agent-agent`), which
//!   cannot write meanwhile: no pod of it is ready.
//! - The agent applies with force too, on every write (a new replica writes at once; a
//!   streaming one re-writes at least every 30 s), so the first write of an agent that is
//!   back takes the fields back; the operator's manager then owns nothing.
//! - Once a pod is ready again, the operator applies an empty status with its manager, which
//!   releases what it still owns: an `Unknown` no agent has overwritten yet goes (an absent
//!   state for the moment rather than a "no pod ready" that is no longer true), and the rest of
//!   `status.hub` (counters, kinds) was the agent's throughout.
//!
//! The operator's other status writes (`scale-agent-operator`) never include `hub`.
//! "Since" is when this operator process first saw no ready pod: a restart or a new leader
//! starts the grace period again, so the reason never claims a longer absence than was seen.

use std::time::Duration;

use k8s_openapi::{api::apps::v1::Deployment, jiff::Timestamp};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use scale_agent_crds::{API_VERSION, AgentAccount, ScaleAgent};
use serde_json::json;

use super::Context;
use crate::{
    desired,
    error::{Result, kube_err},
};

/// The field manager of the operator's `status.hub`, apart from its other status writes so
/// that omitting `hub` there never removes the agent's.
pub const HUB_FIELD_MANAGER: &str = "scale-agent-operator-hub";
/// `status.hub.state` the operator writes: the agent's word for "the hub's state is unknown".
pub const HUB_STATE_UNKNOWN: &str = "Unknown";
/// How long no agent pod may be ready before the operator says so, by default.
pub const DEFAULT_AGENT_ABSENT_GRACE: Duration = Duration::from_secs(60);

/// Pods of the agent's Deployment that are ready.
pub fn ready_pods(deployment: Option<&Deployment>) -> i32 {
    deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

/// `status.hub.stateReason` for the accounts of `agent` while no pod of `deployment` is
/// ready, since `since`.
pub fn absent_reason(agent: &ScaleAgent, deployment: Option<&Deployment>, since: &str) -> String {
    let namespace = agent.namespace().unwrap_or_default();
    let deployment_name = desired::agent_name(agent);
    let wanted = deployment
        .and_then(|d| d.spec.replicas)
        .unwrap_or(agent.spec.replicas);
    let pods = match deployment {
        None => format!("Deployment {deployment_name} does not exist"),
        Some(_) if wanted == 0 => format!("Deployment {deployment_name} is scaled to 0"),
        Some(_) => format!("0 of {wanted} pods of Deployment {deployment_name} ready"),
    };
    format!(
        // troubleshooting: AgentAccount `status.hub.state` `Unknown`, "no agent pod of ScaleAgent … is ready"
        // No pod of the agent's Deployment has been ready for the operator's grace period
        // (`--agent-absent-grace-seconds`, a minute by default): nothing streams the account, and
        // the hub's state of it is unknown (after its own grace period the hub says ORPHANED).
        // Look at the agent's pods and Deployment: image pull errors, crash loops, unschedulable
        // pods, a quota. The agent's own value returns with its first write once a pod streams
        // again.
        "no agent pod of ScaleAgent {namespace}/{name} is ready since {since} ({pods}): nothing \
         streams this account to the hub, so its state there is unknown (the hub says ORPHANED \
         after its grace period without an agent). Check the agent's pods and Deployment: \
         kubectl -n {namespace} describe deployment {deployment_name}, and kubectl -n \
         {namespace} get events (image pull errors, crash loops, unschedulable pods)",
        name = agent.name_any(),
    )
}

/// Whether the operator's hub manager still owns part of `account`'s `status.hub`.
pub fn operator_holds_hub(account: &AgentAccount) -> bool {
    account.managed_fields().iter().any(|entry| {
        entry.manager.as_deref() == Some(HUB_FIELD_MANAGER)
            && entry
                .fields_v1
                .as_ref()
                .and_then(|fields| fields.0.get("f:status"))
                .and_then(|status| status.get("f:hub"))
                .is_some()
    })
}

/// Writes or releases `status.hub` of `accounts` (those `agent` serves) after looking at
/// its Deployment. Returns how soon to look again while the grace period runs.
pub async fn reconcile(
    agent: &ScaleAgent,
    ctx: &Context,
    deployment: Option<&Deployment>,
    accounts: &[&AgentAccount],
) -> Result<Option<Duration>> {
    let key = format!(
        "{}/{}",
        agent.namespace().unwrap_or_default(),
        agent.name_any()
    );
    if ready_pods(deployment) > 0 {
        ctx.agent_present(&key);
        for account in accounts.iter().filter(|a| operator_holds_hub(a)) {
            apply(ctx, account, json!({})).await?;
        }
        return Ok(None);
    }
    let now = Timestamp::now();
    let since = ctx.agent_absent_since(&key, now);
    let absent =
        Duration::from_secs(u64::try_from(now.as_second() - since.as_second()).unwrap_or(0));
    let grace = ctx.config.agent_absent_grace;
    if absent < grace {
        return Ok(Some(grace - absent + Duration::from_secs(1)));
    }
    let reason = absent_reason(agent, deployment, &since.to_string());
    for account in accounts {
        let hub = account.status.as_ref().and_then(|s| s.hub.as_ref());
        let said = hub.is_some_and(|hub| {
            hub.state.as_deref() == Some(HUB_STATE_UNKNOWN)
                && hub.state_reason.as_deref() == Some(reason.as_str())
        });
        if said && operator_holds_hub(account) {
            continue;
        }
        let hub =
            json!({ "hub": { "replica": "", "state": HUB_STATE_UNKNOWN, "stateReason": reason } });
        apply(ctx, account, hub).await?;
        tracing::info!(agentaccount = %account.name_any(), "no agent pod ready: status.hub Unknown");
    }
    Ok(None)
}

/// Server-side apply of `status` with [`HUB_FIELD_MANAGER`], forced: the fields it names
/// become the operator's, and those it no longer names are released.
async fn apply(ctx: &Context, account: &AgentAccount, status: serde_json::Value) -> Result<()> {
    let name = account.name_any();
    let api = Api::<AgentAccount>::namespaced(
        ctx.client.clone(),
        &account.namespace().unwrap_or_default(),
    );
    let body = json!({ "apiVersion": API_VERSION, "kind": "AgentAccount", "status": status });
    api.patch_status(
        &name,
        &PatchParams::apply(HUB_FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(kube_err(format!("apply status.hub of AgentAccount {name}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use serde_json::json;

    use super::*;
    use crate::desired::tests::{account, agent};

    fn deployment(replicas: i32, ready: Option<i32>) -> Deployment {
        serde_json::from_value(json!({
            "metadata": { "name": "prod-agent", "namespace": "ns" },
            "spec": { "replicas": replicas, "selector": {}, "template": {} },
            "status": { "readyReplicas": ready },
        }))
        .unwrap()
    }

    #[test]
    fn the_reason_says_which_scale_agent_since_when_and_what_to_check() {
        let agent = agent("prod");
        assert_eq!(ready_pods(None), 0);
        assert_eq!(ready_pods(Some(&deployment(2, None))), 0);
        assert_eq!(ready_pods(Some(&deployment(2, Some(1)))), 1);
        let reason = absent_reason(&agent, Some(&deployment(2, None)), "2026-12-07T18:00:00Z");
        for part in [
            "no agent pod of ScaleAgent ns/prod is ready since 2026-12-07T18:00:00Z",
            "(0 of 2 pods of Deployment prod-agent ready)",
            "kubectl -n ns describe deployment prod-agent",
            "ORPHANED",
        ] {
            assert!(reason.contains(part), "{part:?} not in {reason}");
        }
        let reason = absent_reason(&agent, None, "2026-12-07T18:00:00Z");
        assert!(
            reason.contains("(Deployment prod-agent does not exist)"),
            "{reason}"
        );
    }

    #[test]
    fn only_fields_under_status_hub_count_as_the_operators_hub() {
        let entry = |manager: &str, fields: serde_json::Value| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            subresource: Some("status".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        };
        let mut web = account("web", "prod");
        assert!(!operator_holds_hub(&web));
        web.metadata.managed_fields = Some(vec![
            entry(
                HUB_FIELD_MANAGER,
                json!({ "f:status": { "f:conditions": {} } }),
            ),
            entry(
                "scale-agent-agent",
                json!({ "f:status": { "f:hub": { "f:state": {} } } }),
            ),
        ]);
        assert!(!operator_holds_hub(&web));
        web.metadata.managed_fields = Some(vec![entry(
            HUB_FIELD_MANAGER,
            json!({ "f:status": { "f:hub": { "f:state": {} } } }),
        )]);
        assert!(operator_holds_hub(&web));
    }
}
