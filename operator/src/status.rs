//! Status: pure computation from what the reconcile observed, and the status patch, written
//! only when something changed.

use k8s_openapi::{
    api::apps::v1::Deployment,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use scale_agent_crds::{
    AgentAccount, AgentAccountStatus, ScaleAgent, ScaleAgentStatus,
    conditions::{
        ACCEPTED, CERTIFICATE_READY, DEGRADED, PROGRESSING, READY, STATUS_FALSE, STATUS_TRUE,
        new_condition, set_condition,
    },
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::json;

use crate::{
    error::{Result, kube_err},
    validate::Rejection,
};

/// Something the user must change; shown in the `Degraded` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// `PascalCase` reason.
    pub reason: &'static str,
    /// What is wrong and what to do.
    pub message: String,
}

/// State of the client certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertificateState {
    /// `hub.tls.insecurePlaintext`: no certificate.
    NotRequired,
    /// A valid certificate is in the Secret.
    Valid {
        /// Expiry, Unix seconds.
        not_after: i64,
        /// Renewal time, Unix seconds.
        renew_at: i64,
    },
    /// No valid certificate can be issued; the message says why.
    Failed(String),
}

/// RFC 3339 text of a Unix time.
pub fn rfc3339(unix: i64) -> String {
    Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| unix.to_string())
}

/// What the ScaleAgent reconcile saw.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// The live agent Deployment.
    pub deployment: Option<&'a Deployment>,
    /// The certificate.
    pub certificate: CertificateState,
    /// Problems the user must fix.
    pub problems: Vec<Problem>,
    /// Accepted accounts.
    pub accounts: i32,
}

/// Computes the ScaleAgent's status from the previous one and what was observed. Transition
/// times are kept for conditions whose status did not change.
pub fn scale_agent_status(
    agent: &ScaleAgent,
    observed: &Observed<'_>,
    now: Time,
) -> ScaleAgentStatus {
    let previous = agent
        .status
        .as_ref()
        .map(ScaleAgentStatus::operator_part)
        .unwrap_or_default();
    let generation = agent.metadata.generation;
    let desired = agent.spec.replicas;
    let name = agent.name_any();
    let namespace = agent.namespace().unwrap_or_default();
    let deployment_status = observed
        .deployment
        .and_then(|d| d.status.clone())
        .unwrap_or_default();
    let deployment_generation = observed.deployment.and_then(|d| d.metadata.generation);
    let replicas = deployment_status.replicas.unwrap_or(0);
    let ready = deployment_status.ready_replicas.unwrap_or(0);
    let available = deployment_status.available_replicas.unwrap_or(0);
    let updated = deployment_status.updated_replicas.unwrap_or(0);
    let rolled_out = observed.deployment.is_some()
        && deployment_status.observed_generation >= deployment_generation
        && updated >= desired
        && replicas == updated
        && available >= desired;

    let mut conditions = previous.conditions.clone();
    let mut set = |type_: &str, holds: bool, reason: &str, message: String| {
        let status = if holds { STATUS_TRUE } else { STATUS_FALSE };
        set_condition(
            &mut conditions,
            new_condition(type_, status, reason, message, generation, now.clone()),
        );
    };

    let (certificate_ok, certificate_expiry) = match &observed.certificate {
        CertificateState::NotRequired => {
            set(
                CERTIFICATE_READY,
                true,
                "NotRequired",
                "hub.tls.insecurePlaintext is set: the agent presents no client certificate".into(),
            );
            (true, None)
        }
        CertificateState::Valid {
            not_after,
            renew_at,
        } => {
            set(
                CERTIFICATE_READY,
                true,
                "Issued",
                format!(
                    "client certificate valid until {}; it is renewed from {}",
                    rfc3339(*not_after),
                    rfc3339(*renew_at)
                ),
            );
            (true, Some(rfc3339(*not_after)))
        }
        CertificateState::Failed(message) => {
            set(CERTIFICATE_READY, false, "IssuerNotReady", message.clone());
            (false, previous.certificate_expiry.clone())
        }
    };

    let degraded = !observed.problems.is_empty();
    match observed.problems.first() {
        Some(first) => {
            let message = observed
                .problems
                .iter()
                .map(|p| p.message.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            set(DEGRADED, true, first.reason, message);
        }
        None => set(DEGRADED, false, "AsExpected", String::new()),
    }

    if rolled_out {
        set(
            PROGRESSING,
            false,
            "RolloutComplete",
            format!("{available} of {desired} agent pods available"),
        );
    } else {
        set(
            PROGRESSING,
            true,
            "RollingOut",
            format!("{ready} of {desired} agent pods ready, {updated} up to date"),
        );
    }

    if degraded || !certificate_ok {
        set(
            READY,
            false,
            "Degraded",
            "the agent cannot run as configured: see the Degraded and CertificateReady conditions"
                .into(),
        );
    } else if available > 0 {
        set(
            READY,
            true,
            "Available",
            format!("{available} of {desired} agent pods available"),
        );
    } else {
        set(
            READY,
            false,
            "AgentsNotReady",
            format!(
                "0 of {desired} agent pods available: see `kubectl -n {namespace} describe pods \
                 -l app.kubernetes.io/instance={name}`"
            ),
        );
    }

    ScaleAgentStatus {
        conditions,
        observed_generation: generation,
        replicas,
        ready_replicas: ready,
        accounts: observed.accounts,
        // The agent's fields: left out, so the operator never owns (nor resets) them.
        connected: None,
        connected_replicas: Vec::new(),
        certificate_expiry,
        identity: previous.identity,
        enrolment_token_version: previous.enrolment_token_version,
    }
}

/// The status of a ScaleAgent the operator refuses to act on (`problem` says why and what
/// to change): `Degraded` and `Ready=False` carry the reason and message; nothing else in the
/// status changes, since nothing was applied.
pub fn refused_agent_status(agent: &ScaleAgent, problem: &Problem, now: Time) -> ScaleAgentStatus {
    let mut status = agent
        .status
        .as_ref()
        .map(ScaleAgentStatus::operator_part)
        .unwrap_or_default();
    let generation = agent.metadata.generation;
    for type_ in [DEGRADED, READY] {
        let holds = type_ == DEGRADED;
        let value = if holds { STATUS_TRUE } else { STATUS_FALSE };
        set_condition(
            &mut status.conditions,
            new_condition(
                type_,
                value,
                problem.reason,
                problem.message.clone(),
                generation,
                now.clone(),
            ),
        );
    }
    status.observed_generation = generation;
    status
}

/// Computes an AgentAccount's status. `agent_ready` is the Ready condition of its ScaleAgent
/// (when it exists).
pub fn agent_account_status(
    account: &AgentAccount,
    verdict: &Result<(), Rejection>,
    agent_ready: bool,
    now: Time,
) -> AgentAccountStatus {
    let previous = account
        .status
        .as_ref()
        .map(AgentAccountStatus::operator_part)
        .unwrap_or_default();
    let generation = account.metadata.generation;
    let mut conditions = previous.conditions.clone();
    let mut set = |type_: &str, holds: bool, reason: &str, message: String| {
        let status = if holds { STATUS_TRUE } else { STATUS_FALSE };
        set_condition(
            &mut conditions,
            new_condition(type_, status, reason, message, generation, now.clone()),
        );
    };
    let account_name = account.account_name().map(str::to_owned);
    let agent = &account.spec.agent_ref;
    match verdict {
        Ok(()) => {
            set(
                ACCEPTED,
                true,
                "Accepted",
                format!(
                    "in the config of ScaleAgent {agent} as Spinnaker account {}",
                    account_name.as_deref().unwrap_or_default()
                ),
            );
            if agent_ready {
                set(
                    READY,
                    true,
                    "AgentReady",
                    format!("ScaleAgent {agent} is ready"),
                );
            } else {
                set(
                    READY,
                    false,
                    "AgentNotReady",
                    format!("ScaleAgent {agent} is not ready: see its conditions"),
                );
            }
        }
        Err(rejection) => {
            set(ACCEPTED, false, rejection.reason, rejection.message.clone());
            set(
                READY,
                false,
                "NotAccepted",
                "the account is not accepted: see the Accepted condition".into(),
            );
        }
    }
    AgentAccountStatus {
        conditions,
        observed_generation: generation,
        accepted: verdict.is_ok(),
        account_name,
        hub: None,
    }
}

/// A status the operator shares with the agent: the operator writes and compares only its
/// own part, so it never takes over (with `force`) or resets the agent's `Connected`
/// condition and fields.
pub trait OperatorPart {
    fn operator_part(&self) -> Self;
}

impl OperatorPart for ScaleAgentStatus {
    fn operator_part(&self) -> Self {
        ScaleAgentStatus::operator_part(self)
    }
}

impl OperatorPart for AgentAccountStatus {
    fn operator_part(&self) -> Self {
        AgentAccountStatus::operator_part(self)
    }
}

/// Writes `status` with server-side apply, unless it equals the current one. Returns whether
/// it wrote.
pub async fn patch_status<K, S>(
    api: &Api<K>,
    obj: &K,
    current: Option<&S>,
    status: &S,
) -> Result<bool>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
    S: Serialize + PartialEq + OperatorPart,
{
    let status = &status.operator_part();
    if current.map(OperatorPart::operator_part).as_ref() == Some(status) {
        return Ok(false);
    }
    let name = obj.name_any();
    let patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    let params = PatchParams::apply(scale_agent_crds::FIELD_MANAGER).force();
    api.patch_status(&name, &params, &Patch::Apply(&patch))
        .await
        .map_err(kube_err(format!("patch status of {} {name}", K::kind(&()))))?;
    Ok(true)
}

/// Finds a condition.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::{account, agent};
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use scale_agent_crds::conditions::is_true;

    fn now() -> Time {
        Time(Timestamp::from_second(1_800_000_000).unwrap())
    }

    #[test]
    fn a_missing_issuer_is_degraded_with_a_hint() {
        let agent = agent("prod");
        let observed = Observed {
            deployment: None,
            certificate: CertificateState::Failed("issuer Secret agent-ca not found".into()),
            problems: vec![Problem {
                reason: "IssuerSecretNotFound",
                message: "issuer Secret agent-ca not found in namespace ns: create it".into(),
            }],
            accounts: 0,
        };
        let status = scale_agent_status(&agent, &observed, now());
        assert!(is_true(&status.conditions, DEGRADED));
        assert!(!is_true(&status.conditions, READY));
        assert!(!is_true(&status.conditions, CERTIFICATE_READY));
        let degraded = condition(&status.conditions, DEGRADED).unwrap();
        assert_eq!(degraded.reason, "IssuerSecretNotFound");
        assert_eq!(status.observed_generation, Some(1));
    }

    #[test]
    fn a_rolled_out_agent_is_ready_and_status_is_stable() {
        let mut agent = agent("prod");
        let mut deployment = Deployment::default();
        deployment.metadata.generation = Some(1);
        deployment.status = Some(DeploymentStatus {
            observed_generation: Some(1),
            replicas: Some(2),
            ready_replicas: Some(2),
            available_replicas: Some(2),
            updated_replicas: Some(2),
            ..Default::default()
        });
        let observed = Observed {
            deployment: Some(&deployment),
            certificate: CertificateState::Valid {
                not_after: 1_900_000_000,
                renew_at: 1_866_000_000,
            },
            problems: vec![],
            accounts: 2,
        };
        let status = scale_agent_status(&agent, &observed, now());
        assert!(is_true(&status.conditions, READY));
        assert!(!is_true(&status.conditions, PROGRESSING));
        assert!(is_true(&status.conditions, CERTIFICATE_READY));
        assert_eq!(
            status.certificate_expiry.as_deref(),
            Some("2030-03-17T17:46:40Z")
        );
        assert_eq!(
            (status.replicas, status.ready_replicas, status.accounts),
            (2, 2, 2)
        );
        agent.status = Some(status.clone());
        let later = Time(Timestamp::from_second(1_800_000_100).unwrap());
        assert_eq!(
            scale_agent_status(&agent, &observed, later),
            status,
            "no change, no write"
        );
    }

    #[test]
    fn account_status_mirrors_the_verdict() {
        let a = account("web", "prod");
        let status = agent_account_status(&a, &Ok(()), false, now());
        assert!(status.accepted);
        assert_eq!(status.account_name.as_deref(), Some("web"));
        assert!(is_true(&status.conditions, ACCEPTED));
        let rejected = agent_account_status(
            &a,
            &Err(Rejection {
                reason: "AgentNotFound",
                message: "ScaleAgent prod not found".into(),
            }),
            false,
            now(),
        );
        assert!(!rejected.accepted);
        assert_eq!(
            condition(&rejected.conditions, ACCEPTED).unwrap().reason,
            "AgentNotFound"
        );
    }
}
