//! The ScaleAgent reconcile: dereference (accounts, issuer, existing certificate) → build the
//! desired objects (pure, `crate::desired`) → apply what changed → status and Events. The
//! client certificate (enrolment with the hub, or the operator's own CA) is planned in
//! `certificate`.

mod callers;
mod certificate;
mod grants;

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        core::v1::{ConfigMap, ObjectReference, Secret, ServiceAccount},
        policy::v1::PodDisruptionBudget,
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding},
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    core::DeserializeGuard,
    runtime::{
        controller::Action,
        events::EventType,
        finalizer::{self, Event as Finalizer, finalizer},
    },
};
use scale_agent_crds::{
    AgentAccount, ScaleAgent,
    conditions::{DEGRADED, READY, STATUS_TRUE},
    v1alpha1::{Mode, ScaleAgentStatus},
};

use self::{
    certificate::{CertificatePlan, plan_certificate},
    grants::InNamespace,
};
use super::Context;
use crate::{
    apply::{Outcome, apply, delete_if_exists, list},
    desired::{self, FINALIZER},
    error::{Chain, Error, Result, kube_err},
    policy, rbac,
    status::{self, CertificateState, Observed, Problem},
    validate,
};

const CONTROLLER: &str = "scaleagent";

fn key(agent: &impl ResourceExt) -> String {
    format!(
        "ScaleAgent/{}/{}",
        agent.namespace().unwrap_or_default(),
        agent.name_any()
    )
}

/// Reconciles a ScaleAgent the operator could read; one it cannot (its JSON does not fit
/// the Rust type although the CRD's schema let it in) gets a Warning Event saying why, and
/// is looked at again only when it changes. Read per object, so such an object does not
/// fail the list of all the others.
pub async fn reconcile_guarded(
    agent: Arc<DeserializeGuard<ScaleAgent>>,
    ctx: Arc<Context>,
) -> Result<Action> {
    match &agent.0 {
        Ok(readable) => reconcile(Arc::new(readable.clone()), ctx).await,
        Err(invalid) => {
            super::report_unreadable::<ScaleAgent>(invalid, &ctx).await;
            Ok(Action::await_change())
        }
    }
}

/// Reconciles one ScaleAgent (the finalizer's apply or cleanup). Its span names the object
/// for every event logged inside.
#[tracing::instrument(name = "reconcile_scaleagent", skip_all, fields(scaleagent = %key(&*agent)))]
pub async fn reconcile(agent: Arc<ScaleAgent>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let namespace = agent
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let api = Api::<ScaleAgent>::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, FINALIZER, agent, |event| async {
        match event {
            Finalizer::Apply(agent) => apply_agent(&agent, &ctx).await,
            Finalizer::Cleanup(agent) => cleanup(&agent, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics.reconciled(CONTROLLER, started.elapsed());
    result
}

/// Logs, counts, and retries the object with its own exponential backoff.
pub fn error_policy(
    agent: Arc<DeserializeGuard<ScaleAgent>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    // Adding the finalizer races with a store that has not seen the previous add yet (the
    // JSON patch's `test` fails with 422): not a failure, just look again.
    if let Error::Finalizer(inner) = error
        && let finalizer::Error::AddFinalizer(kube::Error::Api(status)) = inner.as_ref()
        && (status.code == 422 || status.code == 409)
    {
        tracing::debug!(scaleagent = %key(&*agent), "finalizer changed meanwhile; retrying");
        return Action::requeue(Duration::from_secs(1));
    }
    ctx.metrics.failed(CONTROLLER, error);
    let delay = ctx.next_backoff(&key(&*agent));
    tracing::warn!(scaleagent = %key(&*agent), error = %Chain(error), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// The accepted accounts with their watched and deployed kinds resolved (an account naming
/// a kind the cluster does not serve is reported and left out), and the non-core API groups
/// the cluster serves (for accounts that watch or deploy everything). Discovery's cached
/// answer is asked again once when an account names a kind it lacks.
async fn resolve_account_kinds<'a>(
    agent: &ScaleAgent,
    ctx: &Context,
    accepted: &[&'a AgentAccount],
    problems: &mut Vec<Problem>,
) -> Result<(Vec<(&'a AgentAccount, rbac::AccountKinds)>, Vec<String>)> {
    let mut served = ctx.served_kinds(false).await?;
    let mut resolved = resolve_kinds(agent, accepted, &served);
    if !resolved.1.is_empty() {
        // A CRD installed since discovery last ran.
        served = ctx.served_kinds(true).await?;
        resolved = resolve_kinds(agent, accepted, &served);
    }
    let (resolved, unknown) = resolved;
    problems.extend(unknown);
    let mut groups: Vec<String> = served
        .iter()
        .map(|s| s.resolved.group.clone())
        .filter(|g| !g.is_empty())
        .collect();
    groups.sort();
    groups.dedup();
    Ok((resolved, groups))
}

/// Each accepted account's watched and deployed kinds among `served`; a problem per account
/// that names a kind `served` lacks.
fn resolve_kinds<'a>(
    agent: &ScaleAgent,
    accepted: &[&'a AgentAccount],
    served: &[rbac::ServedKind],
) -> (Vec<(&'a AgentAccount, rbac::AccountKinds)>, Vec<Problem>) {
    let mut resolved = Vec::new();
    let mut problems = Vec::new();
    for account in accepted {
        let (kinds, omit_kinds) = desired::effective_kinds(agent, account);
        let custom: Vec<(String, String)> = account
            .spec
            .custom_resources
            .iter()
            .map(|cr| (cr.kind.clone(), cr.group.clone()))
            .collect();
        let account_kinds =
            rbac::watched(&kinds, &omit_kinds, &custom, served).and_then(|watched| {
                let deployed = if desired::writes_as_agent(agent, account) {
                    let deploy_kinds = account.spec.deploy_kinds.as_deref();
                    Some(rbac::deployed(deploy_kinds, &watched, served)?)
                } else {
                    None
                };
                Ok(rbac::AccountKinds { watched, deployed })
            });
        match account_kinds {
            Ok(account_kinds) => resolved.push((*account, account_kinds)),
            Err(unknown) => problems.push(Problem {
                // troubleshooting: ScaleAgent `Degraded=True`
                // A kind in an account's `kinds`, `omitKinds` or `deployKinds` is not served by the
                // cluster (a typo, a CRD not installed), or is served by several API groups. The
                // other accounts and kinds are granted meanwhile.
                reason: "UnknownKind",
                message: format!(
                    "AgentAccount {} names kinds this cluster does not serve, or that several \
                     API groups serve: {}; check the spelling of kinds, omitKinds and \
                     deployKinds and that the CRD is installed, and write a kind served by \
                     several groups as resource.group, e.g. certificates.cert-manager.io",
                    account.name_any(),
                    unknown.join(", ")
                ),
            }),
        }
    }
    (resolved, problems)
}

/// The rules of a Role in `namespace`: what the accounts that read or deploy there need.
fn namespace_rules(
    accounts: &[(&AgentAccount, rbac::AccountKinds)],
    namespace: &str,
    groups: &[String],
) -> Vec<PolicyRule> {
    let here: Vec<&(&AgentAccount, rbac::AccountKinds)> = accounts
        .iter()
        .filter(|(account, _)| desired::covers_namespace(account, namespace))
        .collect();
    let pod_metrics = here.iter().any(|(account, _)| account.spec.pod_metrics);
    let kinds: Vec<rbac::AccountKinds> = here.into_iter().map(|(_, kinds)| kinds.clone()).collect();
    let mut rules = rbac::rules(&kinds, false, groups);
    rules.extend(rbac::metrics_rules(pod_metrics, false));
    rules
}

/// Applies the RBAC the scope asks for and removes the RBAC it no longer asks for.
async fn reconcile_rbac(
    agent: &ScaleAgent,
    ctx: &Context,
    accepted: &[&AgentAccount],
    problems: &mut Vec<Problem>,
    applied: &mut Vec<String>,
) -> Result<()> {
    let client = &ctx.client;
    let name = desired::rbac_name(agent);
    let selector = desired::rbac_selector(agent);
    let agent_mode = agent.spec.mode == Mode::Agent;
    let want_cluster = agent_mode && agent.spec.scope.is_cluster();
    let own_namespace = agent.namespace().unwrap_or_default();
    let mut want_namespaces: BTreeSet<String> = if agent_mode && !want_cluster {
        agent.spec.scope.namespaces.iter().cloned().collect()
    } else {
        BTreeSet::new()
    };
    // Nothing outside the operator's allow list, whatever the CR's author may write: a Role
    // there would hand the agent (and whoever drives it) that namespace's Secrets.
    let refused: Vec<String> = want_namespaces
        .iter()
        .filter(|n| !ctx.config.grants.namespace_grantable(&own_namespace, n))
        .cloned()
        .collect();
    if !refused.is_empty() {
        let refused: Vec<&str> = refused.iter().map(String::as_str).collect();
        problems.push(
            ctx.config
                .grants
                .namespace_refusal(&own_namespace, &refused),
        );
        want_namespaces.retain(|n| !refused.contains(&n.as_str()));
    }
    let cluster_roles = Api::<ClusterRole>::all(client.clone());
    let cluster_bindings = Api::<ClusterRoleBinding>::all(client.clone());
    if want_cluster {
        let (accounts, groups) = resolve_account_kinds(agent, ctx, accepted, problems).await?;
        let pod_metrics = accounts.iter().any(|(account, _)| account.spec.pod_metrics);
        let kinds: Vec<rbac::AccountKinds> = accounts.into_iter().map(|(_, kinds)| kinds).collect();
        let mut rules = rbac::rules(&kinds, true, &groups);
        rules.extend(rbac::metrics_rules(pod_metrics, true));
        grants::apply_cluster(
            agent,
            client,
            desired::cluster_rbac(agent, rules),
            "spec.scope.type Cluster, the default",
            applied,
            problems,
        )
        .await?;
    } else {
        delete_existing(&cluster_bindings, &name).await?;
        delete_existing(&cluster_roles, &name).await?;
    }
    if !want_namespaces.is_empty() {
        let (accounts, groups) = resolve_account_kinds(agent, ctx, accepted, problems).await?;
        for namespace in &want_namespaces {
            let rules = namespace_rules(&accounts, namespace, &groups);
            let rbac = desired::namespaced_rbac(agent, namespace, rules)?;
            let outcome =
                grants::apply_in_namespace(client, namespace, rbac, applied, problems).await?;
            if outcome == InNamespace::NamespaceNotFound {
                problems.push(Problem {
                    reason: "NamespaceNotFound",
                    message: format!(
                        // troubleshooting: ScaleAgent `Degraded=True`, reason `NamespaceNotFound`
                        // The operator cannot create the agent's Role in a namespace that does not
                        // exist; it retries when the namespace appears.
                        "namespace {namespace} in spec.scope.namespaces does not exist: \
                         create it, or remove it from spec.scope.namespaces"
                    ),
                });
            }
        }
    }
    // The right to impersonate exactly the ServiceAccounts the accounts name, per namespace.
    let mut keep: BTreeSet<(String, String)> = want_namespaces
        .iter()
        .map(|namespace| (namespace.clone(), name.clone()))
        .collect();
    // The right to write the hub's verdict into the status of exactly its own objects.
    let (status_role, status_binding) = desired::status_rbac(agent, accepted)?;
    let roles = Api::<Role>::namespaced(client.clone(), &own_namespace);
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), &own_namespace);
    note(applied, apply(&roles, &status_role).await?.1, "Role");
    note(
        applied,
        apply(&bindings, &status_binding).await?.1,
        "RoleBinding",
    );
    keep.insert((own_namespace, desired::status_rbac_name(agent)));
    let impersonation_name = desired::impersonation_rbac_name(agent);
    let impersonated = if agent_mode {
        desired::impersonated(accepted)
    } else {
        Default::default()
    };
    for (namespace, service_accounts) in &impersonated {
        let rbac = desired::impersonation_rbac(agent, namespace, service_accounts)?;
        let outcome =
            grants::apply_in_namespace(client, namespace, rbac, applied, problems).await?;
        if outcome == InNamespace::NamespaceNotFound {
            problems.push(Problem {
                reason: "NamespaceNotFound",
                message: format!(
                    // troubleshooting: ScaleAgent `Degraded=True`, reason `NamespaceNotFound`
                    // An account impersonates a ServiceAccount (`spec.impersonateServiceAccount`)
                    // in a namespace that does not exist, so the operator cannot grant the
                    // impersonation there.
                    "namespace {namespace} of an AgentAccount's \
                     spec.impersonateServiceAccount does not exist: create it (and the \
                     ServiceAccount), or fix impersonateServiceAccount.namespace"
                ),
            });
            continue;
        }
        keep.insert((namespace.clone(), impersonation_name.clone()));
    }
    // The right to impersonate exactly the people the accounts admit (`callers:
    // impersonate`), cluster-wide as users and groups are.
    callers::reconcile(agent, client, agent_mode, accepted, applied, problems).await?;
    // Roles no longer wanted: namespaces the scope no longer lists (or all of them for
    // Cluster scope), and impersonation no account asks for any more.
    let roles_everywhere = Api::<Role>::all(client.clone());
    for role in list(&roles_everywhere, &selector).await? {
        let namespace = role.namespace().unwrap_or_default();
        if !keep.contains(&(namespace.clone(), role.name_any())) {
            let api = Api::<Role>::namespaced(client.clone(), &namespace);
            delete_if_exists(&api, &role.name_any()).await?;
        }
    }
    let bindings_everywhere = Api::<RoleBinding>::all(client.clone());
    for binding in list(&bindings_everywhere, &selector).await? {
        let namespace = binding.namespace().unwrap_or_default();
        if !keep.contains(&(namespace.clone(), binding.name_any())) {
            let api = Api::<RoleBinding>::namespaced(client.clone(), &namespace);
            delete_if_exists(&api, &binding.name_any()).await?;
        }
    }
    Ok(())
}

/// Deletes a cluster-scoped object only when it exists (a read, not a write, otherwise).
async fn delete_existing<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: Resource<DynamicType = ()> + serde::de::DeserializeOwned + Clone + std::fmt::Debug,
{
    if api
        .get_metadata_opt(name)
        .await
        .map_err(kube_err(format!("get {} {name}", K::kind(&()))))?
        .is_some()
    {
        delete_if_exists(api, name).await?;
    }
    Ok(())
}

fn note(applied: &mut Vec<String>, outcome: Outcome, what: &str) {
    if outcome == Outcome::Applied {
        applied.push(what.to_owned());
    }
}

/// The reconcile proper: dereference, plan the certificate, store it, apply the objects,
/// write the status, publish Events, and say when to look again.
async fn apply_agent(agent: &ScaleAgent, ctx: &Context) -> Result<Action> {
    let namespace = agent.namespace().unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now().as_second();

    // An image outside the allowed prefixes gets nothing: not even the ServiceAccount and
    // RBAC, which another pod could use.
    if let Some(problem) = policy::check_image(
        agent.spec.image_or_default(),
        &ctx.config.allowed_image_prefixes,
    ) {
        return refuse(agent, ctx, problem).await;
    }
    let mut problems = Vec::new();
    let mut applied = Vec::new();

    let all_accounts = ctx.watched_accounts().await?;
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &namespace);
    let accepted = accepted_accounts(agent, &all_accounts, &secrets, &ctx.config.grants).await?;

    let certificate = plan_certificate(agent, ctx, &secrets, now, &mut problems).await?;
    // Stored first: a certificate the hub issued for a one-time token cannot be had again.
    if let Some(secret) = &certificate.secret {
        note(&mut applied, apply(&secrets, secret).await?.1, "Secret");
    }
    let deployment = apply_objects(agent, ctx, &accepted, &mut problems, &mut applied).await?;

    let (new_status, wrote) = write_status(
        agent,
        ctx,
        &deployment,
        &certificate,
        &problems,
        accepted.len(),
    )
    .await?;
    record_metrics(agent, ctx, &certificate.state, &applied);
    publish_events(agent, ctx, &certificate, &applied, &new_status, wrote).await;
    let grace_ends = super::hub_status::reconcile(agent, ctx, Some(&deployment), &accepted).await?;
    Ok(next_visit(
        ctx,
        &key(agent),
        &problems,
        &certificate.state,
        now,
        grace_ends,
    ))
}

/// Dereference: the accounts that name this agent and that validation accepts (reading the
/// kubeconfig Secret of those that name one).
async fn accepted_accounts<'a>(
    agent: &ScaleAgent,
    all_accounts: &'a [AgentAccount],
    secrets: &Api<Secret>,
    grants: &policy::Grants,
) -> Result<Vec<&'a AgentAccount>> {
    let namespace = agent.namespace().unwrap_or_default();
    let mut accepted: Vec<&AgentAccount> = Vec::new();
    for account in all_accounts
        .iter()
        .filter(|a| validate::refers_to(a, agent) && a.meta().deletion_timestamp.is_none())
    {
        let kubeconfig = match &account.spec.credentials.kubeconfig_secret_ref {
            Some(r) => secrets
                .get_opt(&r.name)
                .await
                .map_err(kube_err(format!("get Secret {namespace}/{}", r.name)))?,
            None => None,
        };
        if validate::check(
            account,
            Some(agent),
            all_accounts,
            kubeconfig.as_ref(),
            grants,
        )
        .is_ok()
        {
            accepted.push(account);
        }
    }
    Ok(accepted)
}

/// Applies the agent's objects in dependency order (ServiceAccount, RBAC, ConfigMap,
/// Deployment) and returns the live Deployment, which the status reads.
async fn apply_objects(
    agent: &ScaleAgent,
    ctx: &Context,
    accepted: &[&AgentAccount],
    problems: &mut Vec<Problem>,
    applied: &mut Vec<String>,
) -> Result<Deployment> {
    let client = &ctx.client;
    let namespace = agent.namespace().unwrap_or_default();
    let service_accounts = Api::<ServiceAccount>::namespaced(client.clone(), &namespace);
    note(
        applied,
        apply(&service_accounts, &desired::service_account(agent)?)
            .await?
            .1,
        "ServiceAccount",
    );
    reconcile_rbac(agent, ctx, accepted, problems, applied).await?;
    let config = desired::agent_config(agent, accepted);
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), &namespace);
    note(
        applied,
        apply(&config_maps, &desired::config_map(agent, &config)?)
            .await?
            .1,
        "ConfigMap",
    );
    let deployments = Api::<Deployment>::namespaced(client.clone(), &namespace);
    let kubeconfig_secrets = desired::kubeconfig_secrets(accepted);
    let (deployment, outcome) = apply(
        &deployments,
        &desired::deployment(agent, &kubeconfig_secrets)?,
    )
    .await?;
    note(applied, outcome, "Deployment");
    reconcile_disruption_budget(agent, ctx, applied).await?;
    Ok(deployment)
}

/// Applies the agent pods' PodDisruptionBudget (`spec.podDisruptionBudget`), or deletes the
/// one this ScaleAgent owns once the field is gone (a read, not a write, when there is none;
/// a budget of the same name someone else made is left alone).
async fn reconcile_disruption_budget(
    agent: &ScaleAgent,
    ctx: &Context,
    applied: &mut Vec<String>,
) -> Result<()> {
    let namespace = agent.namespace().unwrap_or_default();
    let api = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), &namespace);
    if let Some(budget) = desired::pod::pod_disruption_budget(agent)? {
        note(
            applied,
            apply(&api, &budget).await?.1,
            "PodDisruptionBudget",
        );
        return Ok(());
    }
    let name = desired::pod::pod_disruption_budget_name(agent);
    let live = api.get_metadata_opt(&name).await.map_err(kube_err(format!(
        "get PodDisruptionBudget {namespace}/{name}"
    )))?;
    let owned = live.is_some_and(|live| {
        live.owner_references()
            .iter()
            .any(|owner| Some(&owner.uid) == agent.metadata.uid.as_ref())
    });
    if owned {
        delete_if_exists(&api, &name).await?;
        applied.push("PodDisruptionBudget (deleted)".to_owned());
    }
    Ok(())
}

/// The status this reconcile observed, and whether writing it changed the object.
async fn write_status(
    agent: &ScaleAgent,
    ctx: &Context,
    deployment: &Deployment,
    certificate: &CertificatePlan,
    problems: &[Problem],
    accounts: usize,
) -> Result<(ScaleAgentStatus, bool)> {
    let observed = Observed {
        deployment: Some(deployment),
        certificate: certificate.state.clone(),
        problems: problems.to_vec(),
        accounts: i32::try_from(accounts).unwrap_or(i32::MAX),
    };
    let mut new_status = status::scale_agent_status(agent, &observed, Time(Timestamp::now()));
    if certificate.identity.is_some() {
        new_status.identity = certificate.identity.clone();
    }
    if certificate.token_version.is_some() {
        new_status.enrolment_token_version = certificate.token_version.clone();
    }
    let namespace = agent.namespace().unwrap_or_default();
    let api = Api::<ScaleAgent>::namespaced(ctx.client.clone(), &namespace);
    let wrote = status::patch_status(&api, agent, agent.status.as_ref(), &new_status).await?;
    Ok((new_status, wrote))
}

/// The certificate's expiry and renewal time, and a write when anything was applied.
fn record_metrics(
    agent: &ScaleAgent,
    ctx: &Context,
    certificate: &CertificateState,
    applied: &[String],
) {
    let certificate_times = match certificate {
        CertificateState::Valid {
            not_after,
            renew_at,
        } => Some((*not_after, *renew_at)),
        _ => None,
    };
    ctx.metrics.certificate(
        &agent.namespace().unwrap_or_default(),
        &agent.name_any(),
        certificate_times,
    );
    if !applied.is_empty() {
        ctx.metrics
            .writes
            .get_or_create(&crate::metrics::ControllerLabels {
                controller: CONTROLLER,
            })
            .inc();
    }
}

/// Events, on transitions only: a certificate issued, objects applied, and the conditions
/// that changed with a status written.
async fn publish_events(
    agent: &ScaleAgent,
    ctx: &Context,
    certificate: &CertificatePlan,
    applied: &[String],
    new_status: &ScaleAgentStatus,
    wrote: bool,
) {
    let reference = agent.object_ref(&());
    if let Some(reason) = certificate.issued
        && let CertificateState::Valid { not_after, .. } = &certificate.state
    {
        ctx.publish(
            &reference,
            EventType::Normal,
            "CertificateIssued",
            "IssueCertificate",
            format!(
                "issued client certificate for {} valid until {} ({reason})",
                certificate.identity.as_deref().unwrap_or_default(),
                status::rfc3339(*not_after)
            ),
        )
        .await;
    }
    if !applied.is_empty() {
        ctx.publish(
            &reference,
            EventType::Normal,
            "Applied",
            "Apply",
            format!("applied {}", applied.join(", ")),
        )
        .await;
    }
    if wrote {
        publish_condition_events(agent, ctx, &reference, new_status).await;
    }
}

/// A Warning when Degraded turns true or its message changes; Ready's changes (NotReady
/// only once a Ready condition was there before, so a new agent starting is no warning).
async fn publish_condition_events(
    agent: &ScaleAgent,
    ctx: &Context,
    reference: &ObjectReference,
    new_status: &ScaleAgentStatus,
) {
    let before = agent
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let changed = |type_: &str| {
        let old = status::condition(before, type_);
        let new = status::condition(&new_status.conditions, type_);
        match (old, new) {
            (Some(o), Some(n)) => o.status != n.status || o.message != n.message,
            (None, Some(_)) => true,
            _ => false,
        }
    };
    if let Some(degraded) = status::condition(&new_status.conditions, DEGRADED)
        && degraded.status == STATUS_TRUE
        && changed(DEGRADED)
    {
        ctx.publish(
            reference,
            EventType::Warning,
            &degraded.reason,
            "Reconcile",
            degraded.message.clone(),
        )
        .await;
    }
    if let Some(ready) = status::condition(&new_status.conditions, READY)
        && changed(READY)
        && (ready.status == STATUS_TRUE || before.iter().any(|c| c.type_ == READY))
    {
        let type_ = if ready.status == STATUS_TRUE {
            EventType::Normal
        } else {
            EventType::Warning
        };
        let reason = if ready.status == STATUS_TRUE {
            "Ready"
        } else {
            "NotReady"
        };
        ctx.publish(reference, type_, reason, "Reconcile", ready.message.clone())
            .await;
    }
}

/// Next visit: retry with backoff while degraded, else before the renewal is due; and no
/// later than `grace_ends` (the end of the grace period without a ready agent pod).
fn next_visit(
    ctx: &Context,
    key: &str,
    problems: &[Problem],
    certificate: &CertificateState,
    now: i64,
    grace_ends: Option<Duration>,
) -> Action {
    let sooner = |next: Duration| grace_ends.map_or(next, |grace| next.min(grace));
    if !problems.is_empty() {
        return Action::requeue(sooner(ctx.next_backoff(key)));
    }
    ctx.reset_backoff(key);
    let mut next = sooner(ctx.config.resync);
    if let CertificateState::Valid { renew_at, .. } = certificate {
        let until = Duration::from_secs(u64::try_from(renew_at.saturating_sub(now)).unwrap_or(0))
            + Duration::from_secs(1);
        next = next.min(until);
    }
    Action::requeue(next)
}

/// Reports `problem` in the status (and an Event when it is new) and applies nothing; the
/// object is looked at again when it changes, or at the next resync.
async fn refuse(agent: &ScaleAgent, ctx: &Context, problem: Problem) -> Result<Action> {
    let namespace = agent.namespace().unwrap_or_default();
    let new_status = status::refused_agent_status(agent, &problem, Time(Timestamp::now()));
    let api = Api::<ScaleAgent>::namespaced(ctx.client.clone(), &namespace);
    if status::patch_status(&api, agent, agent.status.as_ref(), &new_status).await? {
        tracing::warn!(reason = problem.reason, "refused");
        ctx.publish(
            &agent.object_ref(&()),
            EventType::Warning,
            problem.reason,
            "Refuse",
            problem.message,
        )
        .await;
    }
    Ok(Action::requeue(ctx.config.resync))
}

/// Deletes what owner references cannot clean up: the cluster-scoped RBAC and Roles in other
/// namespaces. Owned objects go with the garbage collector.
async fn cleanup(agent: &ScaleAgent, ctx: &Context) -> Result<Action> {
    let client = &ctx.client;
    let name = desired::rbac_name(agent);
    let selector = desired::rbac_selector(agent);
    let callers = desired::callers::callers_rbac_name(agent);
    // Looked at before deleted: the operator may delete only the ClusterRoles of the
    // ScaleAgents listed in its cluster grants, and a DELETE of any other name is refused
    // (403) before the API server would say it does not exist.
    for name in [&name, &callers] {
        delete_existing(&Api::<ClusterRoleBinding>::all(client.clone()), name).await?;
        delete_existing(&Api::<ClusterRole>::all(client.clone()), name).await?;
    }
    for role in list(&Api::<Role>::all(client.clone()), &selector).await? {
        let api = Api::<Role>::namespaced(client.clone(), &role.namespace().unwrap_or_default());
        delete_if_exists(&api, &role.name_any()).await?;
    }
    for binding in list(&Api::<RoleBinding>::all(client.clone()), &selector).await? {
        let api = Api::<RoleBinding>::namespaced(
            client.clone(),
            &binding.namespace().unwrap_or_default(),
        );
        delete_if_exists(&api, &binding.name_any()).await?;
    }
    ctx.reset_backoff(&key(agent));
    ctx.agent_present(&format!(
        "{}/{}",
        agent.namespace().unwrap_or_default(),
        agent.name_any()
    ));
    ctx.metrics.certificate(
        &agent.namespace().unwrap_or_default(),
        &agent.name_any(),
        None,
    );
    tracing::info!("cleaned up");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::{ApiServer, context, status_body};

    /// Adding the finalizer loses a race (409 or 422 from the JSON patch's test): the
    /// reconcile is retried within a second and not counted as a failure.
    #[tokio::test]
    async fn a_conflict_adding_the_finalizer_is_retried_at_once_and_not_counted() {
        let mut agent = crate::desired::tests::agent("prod");
        agent.metadata.finalizers = None;
        let server = ApiServer::default().expect(
            "PATCH",
            "/apis/scaleagent.dev/v1alpha1/namespaces/ns/scaleagents/prod",
            409,
            status_body(409, "Conflict", "the object has been modified"),
        );
        let ctx = context(&server, &[]);
        let error = reconcile(Arc::new(agent.clone()), ctx.clone())
            .await
            .expect_err("the finalizer patch conflicted");
        server.verify();
        let guarded: Arc<DeserializeGuard<ScaleAgent>> =
            Arc::new(serde_json::from_value(serde_json::to_value(&agent).unwrap()).unwrap());
        assert_eq!(
            error_policy(guarded, &error, ctx.clone()),
            Action::requeue(Duration::from_secs(1))
        );
        let metrics = ctx.metrics.render();
        assert!(!metrics.contains("reconcile_failures_total{"), "{metrics}");
    }
}
