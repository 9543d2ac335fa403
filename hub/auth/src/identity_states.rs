//! What admins decided about agent identities (issue 28, F4/F17): an identity disabled, or
//! certificates of it denied by serial. [`IdentityStates`] is this replica's copy (loaded at
//! start-up, changed by the admin API); replicas sharing a store read an identity's state
//! from the store at every stream authentication and renewal (the hub's gRPC service), so
//! this copy is what a single replica decides with and what a shared one falls back to
//! never: a failed lookup refuses.
//!
//! [`check`] is the one rule: a disabled identity is refused whatever it presents (a
//! certificate, a bearer token, an enrolment token), a denied certificate is refused where
//! it is presented, and the refusal says who to ask and what re-enables it.

use std::collections::BTreeMap;

use scale_agent_hub_model::{records::AgentIdentityState, store_op::StoreOp};

/// The identities this replica knows a decision about.
#[derive(Debug, Default)]
pub struct IdentityStates {
    by_identity: BTreeMap<String, AgentIdentityState>,
}

fn time(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| unix.to_string())
}

/// Whether `identity` (in state `state`), presenting the certificate of serial `serial` if
/// any, may authenticate, enrol or renew. The refusal says why and what undoes it.
pub fn check(
    state: Option<&AgentIdentityState>,
    identity: &str,
    serial: Option<&str>,
) -> Result<(), String> {
    let Some(state) = state else {
        return Ok(());
    };
    if let Some(disabled) = state.disabled {
        let reason = if state.reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", state.reason)
        };
        return Err(format!(
            // troubleshooting: stream, enrolment or renewal refused: gRPC `PERMISSION_DENIED`
            // The hub's admin disabled the identity (`scale-agent-hub agent disable`); a live
            // stream ends with this message. Only the admin can enable it again.
            "agent identity {identity:?} was disabled by the hub's admin at {}{reason}; it \
             opens no stream, enrols and renews nothing until the admin enables it again \
             (`scale-agent-hub agent enable {identity}`)",
            time(disabled)
        ));
    }
    if let Some(serial) = serial
        && state.denies_serial(serial)
    {
        return Err(format!(
            // troubleshooting: stream or renewal refused: gRPC `PERMISSION_DENIED`
            // The hub's admin denied this certificate (a lost or stolen key). The agent must enrol
            // again with a new one-time token to get a new certificate.
            "the certificate of serial {serial} (identity {identity:?}) was denied by the hub's \
             admin; enrol the agent again with a one-time token (`scale-agent-hub agent-token \
             create --identity {identity} --accounts <pattern> --ttl 1h --once`) to get a new \
             certificate"
        ));
    }
    Ok(())
}

impl IdentityStates {
    /// As stored.
    pub fn load(records: Vec<AgentIdentityState>) -> Self {
        IdentityStates {
            by_identity: records
                .into_iter()
                .map(|r| (r.identity.clone(), r))
                .collect(),
        }
    }

    /// The state of `identity`, if an admin decided anything about it.
    pub fn get(&self, identity: &str) -> Option<&AgentIdentityState> {
        self.by_identity.get(identity)
    }

    /// Puts the store's view of `identity` in place of this replica's (`None`: nothing
    /// decided).
    pub fn learn(&mut self, identity: &str, state: Option<AgentIdentityState>) {
        match state {
            Some(state) => {
                self.by_identity.insert(identity.to_string(), state);
            }
            None => {
                self.by_identity.remove(identity);
            }
        }
    }

    /// Every identity with a decision, by name.
    pub fn list(&self) -> Vec<AgentIdentityState> {
        self.by_identity.values().cloned().collect()
    }

    fn change(
        &mut self,
        identity: &str,
        now_unix: i64,
        apply: impl FnOnce(&mut AgentIdentityState),
    ) -> (AgentIdentityState, Vec<StoreOp>) {
        let state = self
            .by_identity
            .entry(identity.to_string())
            .or_insert_with(|| AgentIdentityState {
                identity: identity.to_string(),
                ..AgentIdentityState::default()
            });
        apply(state);
        state.updated = now_unix;
        let record = state.clone();
        let ops = vec![StoreOp::PutIdentityState {
            record: record.clone(),
        }];
        (record, ops)
    }

    /// Disables `identity` (again: the time and reason are the latest).
    pub fn disable(
        &mut self,
        identity: &str,
        reason: &str,
        now_unix: i64,
    ) -> (AgentIdentityState, Vec<StoreOp>) {
        self.change(identity, now_unix, |s| {
            s.disabled = Some(now_unix);
            s.reason = reason.to_string();
        })
    }

    /// Enables `identity` again (its denied certificates stay denied).
    pub fn enable(&mut self, identity: &str, now_unix: i64) -> (AgentIdentityState, Vec<StoreOp>) {
        self.change(identity, now_unix, |s| {
            s.disabled = None;
            s.reason.clear();
        })
    }

    /// Denies the certificate of `serial` (normalized) of `identity`.
    pub fn deny_serial(
        &mut self,
        identity: &str,
        serial: &str,
        now_unix: i64,
    ) -> (AgentIdentityState, Vec<StoreOp>) {
        self.change(identity, now_unix, |s| {
            if !s.denies_serial(serial) {
                s.denied_serials.push(serial.to_string());
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabled_identities_and_denied_serials_are_refused_with_what_undoes_it() {
        let mut states = IdentityStates::default();
        assert!(check(states.get("prod"), "prod", Some("ab")).is_ok());
        let (record, ops) = states.disable("prod", "node compromised", 1_000);
        assert_eq!(record.disabled, Some(1_000));
        assert!(matches!(&ops[..], [StoreOp::PutIdentityState { .. }]));
        let refused = check(states.get("prod"), "prod", None).unwrap_err();
        assert!(
            refused.contains("node compromised") && refused.contains("agent enable prod"),
            "{refused}"
        );
        states.enable("prod", 1_001);
        assert!(check(states.get("prod"), "prod", Some("ab")).is_ok());
        let serial = AgentIdentityState::normalize_serial("00:AB").unwrap();
        assert_eq!(serial, "ab");
        states.deny_serial("prod", &serial, 1_002);
        states.deny_serial("prod", &serial, 1_003);
        assert_eq!(states.get("prod").unwrap().denied_serials, vec!["ab"]);
        let refused = check(states.get("prod"), "prod", Some("ab")).unwrap_err();
        assert!(refused.contains("serial ab"), "{refused}");
        assert!(check(states.get("prod"), "prod", Some("cd")).is_ok());
        assert!(check(states.get("prod"), "prod", None).is_ok());
        assert_eq!(AgentIdentityState::normalize_serial("0x"), None);
        assert_eq!(AgentIdentityState::normalize_serial("zz"), None);
    }
}
