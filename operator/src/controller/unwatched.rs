//! ScaleAgents and AgentAccounts outside the watched namespaces: the operator acts on none
//! of them, but says so in their status (and an Event) rather than ignoring them silently.
//!
//! This needs to read both kinds in every namespace and to patch their `status`
//! subresource, which carries no spec and creates nothing: the least the operator can hold
//! and still tell the user. Nothing else about these objects is read or written.
//!
//! Only objects with no conditions yet are refused: one that has any was reconciled (or
//! refused) by another operator watching its namespace, or by this one before its watch
//! changed, and several operators in one cluster must not overwrite each other's status.
//! A new object is left [`REFUSAL_GRACE`] to the operator that watches its namespace, so
//! that one's conditions come first instead of a passing refusal from this one.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Api, Resource, ResourceExt,
    core::DeserializeGuard,
    runtime::{Controller, controller::Action, events::EventType, watcher},
};
use scale_agent_crds::{AgentAccount, ScaleAgent};

use super::{Context, Shutdown};
use crate::{
    error::{Chain, Error, Result},
    policy::WatchNamespaces,
    status::{self, Problem},
    validate::Rejection,
};

/// Condition reason of an object in a namespace the operator does not watch.
pub const REASON: &str = "NamespaceNotWatched";

/// Runs the refusing controllers until shutdown. Only used with a namespace list.
pub(super) async fn run(ctx: Arc<Context>, shutdown: Shutdown) {
    // The API server leaves out the watched namespaces, whose objects the real controllers
    // handle.
    let outside =
        watcher::Config::default().fields(&outside_selector(&ctx.config.watch_namespaces));
    // Read per object, so one unreadable ScaleAgent does not fail the list of all.
    let agents = Controller::new(
        Api::<DeserializeGuard<ScaleAgent>>::all(ctx.client.clone()),
        outside.clone(),
    )
    .graceful_shutdown_on(shutdown.clone());
    let agent_store = agents.store();
    let agents = agents.run(refuse_readable_agent, retry, ctx.clone());
    let agents = super::stop_unfilled(
        agents,
        super::store_filled_now(agent_store),
        shutdown.clone(),
    )
    .for_each(|result| async move {
        if let Err(error) = result {
            super::log_controller_error("unwatched ScaleAgent", &error);
        }
    });
    let accounts = Controller::new(
        Api::<DeserializeGuard<AgentAccount>>::all(ctx.client.clone()),
        outside,
    )
    .graceful_shutdown_on(shutdown.clone());
    let account_store = accounts.store();
    let accounts = accounts.run(refuse_readable_account, retry, ctx);
    let accounts = super::stop_unfilled(accounts, super::store_filled_now(account_store), shutdown)
        .for_each(|result| async move {
            if let Err(error) = result {
                super::log_controller_error("unwatched AgentAccount", &error);
            }
        });
    futures::join!(agents, accounts);
}

/// `metadata.namespace!=a,metadata.namespace!=b,…`: objects outside the watched namespaces.
pub fn outside_selector(watch: &WatchNamespaces) -> String {
    match watch {
        WatchNamespaces::All => String::new(),
        WatchNamespaces::Only(names) => names
            .iter()
            .map(|n| format!("metadata.namespace!={n}"))
            .collect::<Vec<_>>()
            .join(","),
    }
}

fn retry<K>(_: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %Chain(error), "failed to report an object outside the watched namespaces");
    Action::requeue(ctx.config.retry_max)
}

/// How long a new object is left to the operator that watches its namespace before this one
/// says that none does.
const REFUSAL_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The rest of [`REFUSAL_GRACE`] for an object created `created` (Unix seconds) at `now`.
fn grace_left(created: Option<i64>, now: i64) -> Option<std::time::Duration> {
    let grace = i64::try_from(REFUSAL_GRACE.as_secs()).unwrap_or(i64::MAX);
    let age = now.saturating_sub(created?);
    (age < grace).then(|| std::time::Duration::from_secs(grace.abs_diff(age.max(0))))
}

fn created_at(object: &impl ResourceExt) -> Option<i64> {
    object
        .meta()
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
}

/// Refuses a ScaleAgent the operator can read; one it cannot is only logged (no operator
/// acts on it here, and the one watching its namespace reports it).
async fn refuse_readable_agent(
    agent: Arc<DeserializeGuard<ScaleAgent>>,
    ctx: Arc<Context>,
) -> Result<Action> {
    match &agent.0 {
        Ok(readable) => refuse_agent(Arc::new(readable.clone()), ctx).await,
        Err(invalid) => {
            tracing::warn!(
                namespace = invalid.metadata.namespace.as_deref().unwrap_or_default(),
                name = invalid.metadata.name.as_deref().unwrap_or_default(),
                error = %invalid.error,
                "cannot read a ScaleAgent outside the watched namespaces; skipping it"
            );
            Ok(Action::await_change())
        }
    }
}

#[tracing::instrument(name = "refuse_unwatched", skip_all, fields(scaleagent = %format!("{}/{}", agent.namespace().unwrap_or_default(), agent.name_any())))]
async fn refuse_agent(agent: Arc<ScaleAgent>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = agent
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    if ctx.config.watch_namespaces.contains(&namespace)
        || agent
            .status
            .as_ref()
            .is_some_and(|s| !s.conditions.is_empty())
    {
        return Ok(Action::await_change());
    }
    if let Some(left) = grace_left(created_at(&*agent), Timestamp::now().as_second()) {
        return Ok(Action::requeue(left));
    }
    let problem = Problem {
        reason: REASON,
        message: ctx
            .config
            .watch_namespaces
            .refusal("ScaleAgent", &namespace),
    };
    let new_status = status::refused_agent_status(&agent, &problem, Time(Timestamp::now()));
    let api = Api::<ScaleAgent>::namespaced(ctx.client.clone(), &namespace);
    if status::patch_status(&api, &*agent, agent.status.as_ref(), &new_status).await? {
        tracing::info!("refused: namespace not watched");
        ctx.publish(
            &agent.object_ref(&()),
            EventType::Warning,
            REASON,
            "Refuse",
            problem.message,
        )
        .await;
    }
    Ok(Action::await_change())
}

/// Refuses an AgentAccount the operator can read; one it cannot is only logged, as for
/// ScaleAgents.
async fn refuse_readable_account(
    account: Arc<DeserializeGuard<AgentAccount>>,
    ctx: Arc<Context>,
) -> Result<Action> {
    match &account.0 {
        Ok(readable) => refuse_account(Arc::new(readable.clone()), ctx).await,
        Err(invalid) => {
            tracing::warn!(
                namespace = invalid.metadata.namespace.as_deref().unwrap_or_default(),
                name = invalid.metadata.name.as_deref().unwrap_or_default(),
                error = %invalid.error,
                "cannot read an AgentAccount outside the watched namespaces; skipping it"
            );
            Ok(Action::await_change())
        }
    }
}

async fn refuse_account(account: Arc<AgentAccount>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = account
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    if ctx.config.watch_namespaces.contains(&namespace)
        || account
            .status
            .as_ref()
            .is_some_and(|s| !s.conditions.is_empty())
    {
        return Ok(Action::await_change());
    }
    if let Some(left) = grace_left(created_at(&*account), Timestamp::now().as_second()) {
        return Ok(Action::requeue(left));
    }
    let rejection = Rejection {
        reason: REASON,
        message: ctx
            .config
            .watch_namespaces
            .refusal("AgentAccount", &namespace),
    };
    let verdict = Err(rejection.clone());
    let new_status =
        status::agent_account_status(&account, &verdict, false, Time(Timestamp::now()));
    let api = Api::<AgentAccount>::namespaced(ctx.client.clone(), &namespace);
    if status::patch_status(&api, &*account, account.status.as_ref(), &new_status).await? {
        ctx.publish(
            &account.object_ref(&()),
            EventType::Warning,
            REASON,
            "Refuse",
            rejection.message,
        )
        .await;
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_objects_are_left_to_their_own_operator_first() {
        assert_eq!(grace_left(Some(100), 100), Some(REFUSAL_GRACE));
        assert_eq!(
            grace_left(Some(100), 107),
            Some(std::time::Duration::from_secs(3))
        );
        assert_eq!(grace_left(Some(100), 110), None);
        assert_eq!(grace_left(None, 110), None);
    }

    #[test]
    fn the_watch_leaves_out_the_watched_namespaces() {
        let watch = WatchNamespaces::parse(&["b".into(), "a".into()]).unwrap();
        assert_eq!(
            outside_selector(&watch),
            "metadata.namespace!=a,metadata.namespace!=b"
        );
    }
}
