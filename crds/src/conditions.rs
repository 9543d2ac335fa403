//! Condition types Scale Agent writes to `.status.conditions`, and a pure helper to update them
//! the way Kubernetes API conventions expect.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Everything the resource asks for is in place and working: for a `ScaleAgent`, the agent
/// Deployment is available and its certificate valid; for an `AgentAccount`, the account is
/// accepted and served by a ready agent.
pub const READY: &str = "Ready";
/// The operator is changing something (rolling out the agent, rotating a certificate) and has not
/// finished yet.
pub const PROGRESSING: &str = "Progressing";
/// Something is wrong that the operator cannot fix by itself; the message says what to change.
pub const DEGRADED: &str = "Degraded";
/// The agent's client certificate exists, is signed by the configured issuer and is not close to
/// expiry.
pub const CERTIFICATE_READY: &str = "CertificateReady";
/// An `AgentAccount` passed the checks that CEL rules cannot express (the `ScaleAgent` exists, the
/// account name is unique, the credentials fit the agent's mode) and is in the agent's config.
pub const ACCEPTED: &str = "Accepted";

/// Written by the agent, not the operator: the hub's verdict on an `AgentAccount` (or, on a
/// `ScaleAgent`, whether any replica reaches the hub). Reasons: [`REASON_STREAMING`],
/// [`REASON_REJECTED`], [`REASON_HUB_UNREACHABLE`], [`REASON_ACCOUNT_FAILING`], `Standby` (a replica the hub moved the
/// account's stream away from says so once; the streaming one speaks for the account) and
/// `Connected` on a ScaleAgent.
pub const CONNECTED: &str = "Connected";
/// A replica streams the account to the hub.
pub const REASON_STREAMING: &str = "Streaming";
/// The hub refused the account; the message is the hub's reason.
pub const REASON_REJECTED: &str = "Rejected";
/// The agent cannot reach the hub; the message is the last error.
pub const REASON_HUB_UNREACHABLE: &str = "HubUnreachable";
/// The agent cannot load the account's credentials or reach its API server (retried with
/// backoff); the message is the last error. The agent stays Ready for its other accounts.
pub const REASON_ACCOUNT_FAILING: &str = "AccountFailing";

/// The condition types the operator writes; every other condition belongs to the agent.
pub const OPERATOR_CONDITIONS: &[&str] =
    &[READY, PROGRESSING, DEGRADED, CERTIFICATE_READY, ACCEPTED];

/// `status` value of a condition that holds.
pub const STATUS_TRUE: &str = "True";
/// `status` value of a condition that does not hold.
pub const STATUS_FALSE: &str = "False";
/// `status` value of a condition the operator cannot determine (yet).
pub const STATUS_UNKNOWN: &str = "Unknown";

/// The condition string for a boolean, for building conditions without typos.
pub fn status_str(holds: bool) -> &'static str {
    if holds { STATUS_TRUE } else { STATUS_FALSE }
}

/// Builds a condition. `now` becomes `lastTransitionTime`; [`set_condition`] keeps the old time
/// when the status did not change.
pub fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        last_transition_time: now,
        message: message.into(),
        observed_generation,
        reason: reason.to_owned(),
        status: status.to_owned(),
        type_: type_.to_owned(),
    }
}

/// Inserts `condition`, or replaces the condition of the same type.
///
/// When the status is unchanged the existing `lastTransitionTime` is kept, because that field
/// records when the status last flipped, not when the operator last looked. Returns whether
/// anything (status, reason, message or observedGeneration) changed, so a caller can skip a
/// status write that would change nothing.
pub fn set_condition(conditions: &mut Vec<Condition>, mut condition: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(existing) => {
            if existing.status == condition.status {
                condition.last_transition_time = existing.last_transition_time.clone();
            }
            let changed = *existing != condition;
            *existing = condition;
            changed
        }
        None => {
            conditions.push(condition);
            true
        }
    }
}

/// The condition of the given type, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of the given type is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == STATUS_TRUE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    fn ready(status: &str, reason: &str, generation: i64, now: i64) -> Condition {
        new_condition(READY, status, reason, "msg", Some(generation), at(now))
    }

    #[test]
    fn inserts_new_condition() {
        let mut conditions = Vec::new();
        assert!(set_condition(
            &mut conditions,
            ready(STATUS_TRUE, "Available", 1, 100)
        ));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, at(100));
        assert!(is_true(&conditions, READY));
    }

    #[test]
    fn keeps_transition_time_when_status_unchanged() {
        let mut conditions = vec![ready(STATUS_TRUE, "Available", 1, 100)];
        let changed = set_condition(&mut conditions, ready(STATUS_TRUE, "Available", 2, 200));
        assert!(changed, "observedGeneration moved");
        assert_eq!(conditions[0].last_transition_time, at(100));
        assert_eq!(conditions[0].observed_generation, Some(2));
    }

    #[test]
    fn reports_no_change_for_identical_condition() {
        let mut conditions = vec![ready(STATUS_TRUE, "Available", 1, 100)];
        let changed = set_condition(&mut conditions, ready(STATUS_TRUE, "Available", 1, 500));
        assert!(!changed);
        assert_eq!(conditions[0].last_transition_time, at(100));
    }

    #[test]
    fn updates_reason_and_message_without_moving_transition_time() {
        let mut conditions = vec![ready(STATUS_FALSE, "Rollout", 1, 100)];
        let mut update = ready(STATUS_FALSE, "ImagePullBackOff", 1, 300);
        update.message = "image not found".into();
        assert!(set_condition(&mut conditions, update));
        assert_eq!(conditions[0].reason, "ImagePullBackOff");
        assert_eq!(conditions[0].message, "image not found");
        assert_eq!(conditions[0].last_transition_time, at(100));
    }

    #[test]
    fn moves_transition_time_when_status_flips() {
        let mut conditions = vec![ready(STATUS_FALSE, "Rollout", 1, 100)];
        assert!(set_condition(
            &mut conditions,
            ready(STATUS_TRUE, "Available", 1, 300)
        ));
        assert_eq!(conditions[0].last_transition_time, at(300));
        assert_eq!(conditions[0].status, STATUS_TRUE);
    }

    #[test]
    fn leaves_other_types_alone_and_keeps_order() {
        let mut conditions = vec![
            new_condition(PROGRESSING, STATUS_TRUE, "Rollout", "", None, at(1)),
            ready(STATUS_FALSE, "Rollout", 1, 1),
            new_condition(DEGRADED, STATUS_FALSE, "AsExpected", "", None, at(1)),
        ];
        set_condition(&mut conditions, ready(STATUS_TRUE, "Available", 1, 9));
        let types: Vec<_> = conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, [PROGRESSING, READY, DEGRADED]);
        assert_eq!(
            find_condition(&conditions, PROGRESSING).map(|c| c.last_transition_time.clone()),
            Some(at(1))
        );
        assert!(!is_true(&conditions, DEGRADED));
        assert!(!is_true(&conditions, CERTIFICATE_READY));
    }

    #[test]
    fn status_strings() {
        assert_eq!(status_str(true), "True");
        assert_eq!(status_str(false), "False");
    }
}
