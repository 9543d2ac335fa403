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
    error::{Chain, Error, Result, kube_err},
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
    tracing::warn!(agentaccount = %key(&*account), error = %Chain(error), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Reconciles one AgentAccount's status; one the operator cannot read (its JSON does not fit
/// the Rust type although the CRD's schema let it in) gets a Warning Event saying why, and
/// is looked at again only when it changes.
#[tracing::instrument(name = "reconcile_agentaccount", skip_all, fields(agentaccount = %key(&*account)))]
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
    let all = ctx.watched_accounts().await?;
    let kubeconfig = match &account.spec.credentials.kubeconfig_secret_ref {
        Some(r) => Api::<Secret>::namespaced(client.clone(), &namespace)
            .get_opt(&r.name)
            .await
            .map_err(kube_err(format!("get Secret {namespace}/{}", r.name)))?,
        None => None,
    };
    let verdict = validate::check(
        account,
        agent.as_ref(),
        &all,
        kubeconfig.as_ref(),
        &ctx.config.grants,
    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        controller::fixtures::{ApiServer, context, status_body},
        desired::tests::account,
    };

    const AGENT: &str = "/apis/scaleagent.dev/v1alpha1/namespaces/ns/scaleagents/prod";
    const STATUS: &str = "/apis/scaleagent.dev/v1alpha1/namespaces/ns/agentaccounts/web/status";

    fn guarded(account: &AgentAccount) -> Arc<GuardedAccount> {
        Arc::new(serde_json::from_value(serde_json::to_value(account).unwrap()).unwrap())
    }

    /// A server error fails the reconcile with what the operator was doing, counts a failure
    /// labelled `kube`, and retries with a backoff that doubles per failure.
    #[tokio::test]
    async fn a_server_error_is_retried_with_a_growing_backoff() {
        let web = account("web", "prod");
        let server = ApiServer::default()
            .expect(
                "GET",
                AGENT,
                500,
                status_body(500, "InternalError", "etcd timeout"),
            )
            .expect(
                "GET",
                AGENT,
                500,
                status_body(500, "InternalError", "etcd timeout"),
            );
        let ctx = context(&server, std::slice::from_ref(&web));
        let mut delays = Vec::new();
        for _ in 0..2 {
            let error = reconcile(guarded(&web), ctx.clone())
                .await
                .expect_err("the API server failed");
            assert_eq!(error.to_string(), "failed to get ScaleAgent ns/prod");
            assert!(
                Chain(&error).to_string().contains("etcd timeout"),
                "{error:?}"
            );
            delays.push(error_policy(guarded(&web), &error, ctx.clone()));
        }
        server.verify();
        assert_eq!(
            delays,
            [
                Action::requeue(std::time::Duration::from_secs(3)),
                Action::requeue(std::time::Duration::from_secs(6))
            ]
        );
        let metrics = ctx.metrics.render();
        let failures = "scale_agent_operator_reconcile_failures_total{controller=\"agentaccount\",error=\"kube\"} 2";
        assert!(metrics.contains(failures), "{metrics}");
    }

    /// A conflict on the status write (another writer got there first) fails this reconcile
    /// and is retried; nothing else is written, and no Event says the account was accepted.
    #[tokio::test]
    async fn a_conflicting_status_write_is_retried() {
        let web = account("web", "prod");
        let agent = crate::desired::tests::agent("prod");
        let server = ApiServer::default()
            .expect("GET", AGENT, 200, serde_json::to_value(&agent).unwrap())
            .expect(
                "PATCH",
                STATUS,
                409,
                status_body(409, "Conflict", "the object has been modified"),
            );
        let ctx = context(&server, std::slice::from_ref(&web));
        let error = reconcile(guarded(&web), ctx.clone())
            .await
            .expect_err("the status write conflicted");
        server.verify();
        assert_eq!(
            error.to_string(),
            "failed to patch status of AgentAccount web"
        );
        assert!(
            matches!(&error, Error::Kube { source: kube::Error::Api(status), .. } if status.code == 409),
            "{error:?}"
        );
        assert_eq!(
            error_policy(guarded(&web), &error, ctx),
            Action::requeue(std::time::Duration::from_secs(3))
        );
    }

    /// An account whose agent is gone is refused in its status, without another request.
    #[tokio::test]
    async fn an_account_whose_agent_is_missing_is_refused() {
        let web = account("web", "prod");
        let server = ApiServer::default()
            .expect(
                "GET",
                AGENT,
                404,
                status_body(404, "NotFound", "scaleagents \"prod\" not found"),
            )
            .expect("PATCH", STATUS, 200, serde_json::to_value(&web).unwrap())
            .expect(
                "POST",
                "/apis/events.k8s.io/v1/namespaces/ns/events",
                201,
                json_event(),
            );
        let ctx = context(&server, std::slice::from_ref(&web));
        let action = reconcile(guarded(&web), ctx).await.expect("reconciled");
        server.verify();
        // Retried with backoff: the agent may be created later.
        assert_eq!(action, Action::requeue(std::time::Duration::from_secs(3)));
    }

    fn json_event() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": { "name": "web.1", "namespace": "ns" }, "eventTime": null,
        })
    }
}
