//! The AgentAccount reconcile: check the account (`crate::validate`) and report `Accepted`
//! or why not, and `Ready` when its agent is.

use std::{sync::Arc, time::Instant};

use k8s_openapi::{
    api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    runtime::{controller::Action, events::EventType},
};
use scale_agent_crds::{
    AgentAccount, ScaleAgent,
    conditions::{ACCEPTED, READY, is_true},
};

use super::{Context, GuardedAccount};
use crate::{
    error::{Error, Result, kube_err},
    status, validate,
};

const CONTROLLER: &str = "agentaccount";

fn key(account: &impl ResourceExt) -> String {
    format!(
        "AgentAccount/{}/{}",
        account.namespace().unwrap_or_default(),
        account.name_any()
    )
}

/// Logs, counts, and retries the object with its own exponential backoff.
pub fn error_policy(account: Arc<GuardedAccount>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(CONTROLLER, error);
    let delay = ctx.next_backoff(&key(&*account));
    tracing::warn!(agentaccount = %key(&*account), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Reconciles one AgentAccount's status; one the operator cannot read (its JSON does not fit
/// the Rust type although the CRD's schema let it in) gets a Warning Event saying why, and
/// is looked at again only when it changes.
pub async fn reconcile(account: Arc<GuardedAccount>, ctx: Arc<Context>) -> Result<Action> {
    let account = match &account.0 {
        Ok(account) => account,
        Err(invalid) => {
            super::report_unreadable::<AgentAccount>(invalid, &ctx).await;
            return Ok(Action::await_change());
        }
    };
    let started = Instant::now();
    let result = reconcile_inner(account, &ctx).await;
    ctx.metrics.reconciled(CONTROLLER, started.elapsed());
    result
}

async fn reconcile_inner(account: &AgentAccount, ctx: &Context) -> Result<Action> {
    if account.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let client = &ctx.client;
    let namespace = account
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let agent = Api::<ScaleAgent>::namespaced(client.clone(), &namespace)
        .get_opt(&account.spec.agent_ref)
        .await
        .map_err(kube_err(format!(
            "get ScaleAgent {namespace}/{}",
            account.spec.agent_ref
        )))?;
    let all = ctx.watched_accounts();
    let kubeconfig = match &account.spec.credentials.kubeconfig_secret_ref {
        Some(r) => Api::<Secret>::namespaced(client.clone(), &namespace)
            .get_opt(&r.name)
            .await
            .map_err(kube_err(format!("get Secret {namespace}/{}", r.name)))?,
        None => None,
    };
    let verdict = validate::check(account, agent.as_ref(), &all, kubeconfig.as_ref());
    let agent_ready = agent
        .as_ref()
        .and_then(|a| a.status.as_ref())
        .is_some_and(|s| is_true(&s.conditions, READY));
    let new_status =
        status::agent_account_status(account, &verdict, agent_ready, Time(Timestamp::now()));
    let api = Api::<AgentAccount>::namespaced(client.clone(), &namespace);
    let wrote = status::patch_status(&api, account, account.status.as_ref(), &new_status).await?;

    if wrote {
        let before = account
            .status
            .as_ref()
            .and_then(|s| status::condition(&s.conditions, ACCEPTED));
        let after = status::condition(&new_status.conditions, ACCEPTED);
        if let Some(after) = after
            && before.is_none_or(|b| b.status != after.status || b.reason != after.reason)
        {
            let (type_, reason) = match &verdict {
                Ok(()) => (EventType::Normal, "Accepted"),
                Err(rejection) => (EventType::Warning, rejection.reason),
            };
            ctx.publish(
                &account.object_ref(&()),
                type_,
                reason,
                "Validate",
                after.message.clone(),
            )
            .await;
        }
    }

    let key = key(account);
    Ok(match verdict {
        // Missing Secrets are not watched: look again, backing off.
        Err(_) => Action::requeue(ctx.next_backoff(&key)),
        Ok(()) => {
            ctx.reset_backoff(&key);
            Action::requeue(ctx.config.resync)
        }
    })
}
