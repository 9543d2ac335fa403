//! Registration of accounts by one stream: who may register a name, the binding of a name to
//! an identity and a cluster, the role the registry assigns, and unregistering.

use std::time::{Instant, SystemTime};

use scale_agent_hub_model::store_op::StoreOp;
use scale_agent_proto::v1::{
    self as pb, account_assignment::Role as PbRole, hub_message::Kind as Out,
};

use super::{
    Control, Effects, Limits, Session, assignment, bounded_reason, streaming_assignment,
    validate_account_name,
};
use crate::registry::{AccountRecord, ClusterRecord, Registration, Role};

impl Session {
    /// The agent cannot serve an account at all: FAILED with its reason while no replica
    /// streams it. Only for a name this stream could register, so a stream cannot mark
    /// accounts of others FAILED.
    pub(super) fn on_unavailable(
        &mut self,
        st: &mut Control<'_>,
        limits: &Limits,
        unavailable: pb::AccountUnavailable,
        now: (Instant, SystemTime),
        fx: &mut Effects,
    ) {
        let name = unavailable.account;
        let may_register = validate_account_name(&name).is_ok()
            && self
                .grant
                .allows(&limits.allow, &self.identity, &name)
                .is_ok()
            && st.registry.check_binding(&self.identity, &name).is_ok();
        if !may_register {
            tracing::debug!(account = %name, "AccountUnavailable for an account this stream may not register; ignored");
            return;
        }
        let reason = bounded_reason(&unavailable.reason);
        tracing::warn!(account = %name, %reason, "the agent cannot serve the account");
        self.staging.retain(|(a, _, _), _| *a != name);
        fx.promotions
            .extend(st.registry.note_unavailable(self.id, &name, &reason, now));
        // Told the account's state like a registration (the agent shows the hub's view).
        fx.registered.push(name);
    }

    pub(super) fn on_unregister(
        &mut self,
        st: &mut Control<'_>,
        un: pb::UnregisterAccount,
        now: (Instant, SystemTime),
        fx: &mut Effects,
    ) {
        self.staging.retain(|(a, _, _), _| *a != un.account);
        if st.registry.role(self.id, &un.account).is_some() {
            self.unregistered.insert(un.account.clone());
        }
        fx.promotions
            .extend(st.registry.unregister(self.id, &un.account, now));
    }

    /// This stream served `account` and unregistered it (an agent draining), and the
    /// account is still bound to its identity: what it answers for the account is the
    /// account's.
    pub(super) fn served_before(
        &self,
        registry: &crate::registry::Registry,
        account: &str,
    ) -> bool {
        self.unregistered.contains(account)
            && registry.check_binding(&self.identity, account) == Ok(false)
    }

    pub(super) fn register(
        &mut self,
        st: &mut Control<'_>,
        limits: &Limits,
        reg: pb::RegisterAccount,
        now: (Instant, SystemTime),
        fx: &mut Effects,
    ) {
        let name = reg.account.clone();
        self.unregistered.remove(&name);
        if let Err(reason) = validate_account_name(&name) {
            tracing::warn!(account = %name, %reason, "account rejected");
            fx.replies.push(assignment(&name, PbRole::Rejected, reason));
            return;
        }
        fx.registered.push(name.clone());
        // A refusal of a valid name is remembered: the account shows FAILED while nobody
        // streams it.
        let reject = |st: &mut Control<'_>, reason: String, fx: &mut Effects| {
            tracing::warn!(account = %name, %reason, "account rejected");
            st.registry.note_rejection(self.id, &name, &reason);
            fx.replies.push(assignment(&name, PbRole::Rejected, reason));
        };
        if let Err(reason) = self.grant.allows(&limits.allow, &self.identity, &name) {
            return reject(st, reason, fx);
        }
        let unbound = match st.registry.check_binding(&self.identity, &name) {
            Ok(unbound) => unbound,
            Err(reason) => return reject(st, reason, fx),
        };
        if unbound && let Err(reason) = self.within_account_cap(st, limits) {
            return reject(st, reason, fx);
        }
        let Some(cluster) = reg.cluster.filter(|c| !c.api_server_host.is_empty()) else {
            return reject(
                st,
                format!("account {name:?} registered without cluster info (api_server_host)"),
                fx,
            );
        };
        let properties = if reg.properties_json.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&reg.properties_json).unwrap_or(serde_json::Value::Null)
        };
        let record = AccountRecord {
            cluster: ClusterRecord {
                api_server_host: cluster.api_server_host,
                ca_fingerprint: cluster.ca_fingerprint,
                kubernetes_version: cluster.kubernetes_version,
            },
            namespaces: reg.namespaces,
            properties,
        };
        let (registration, persist) = st.registry.register(self.id, &name, record);
        // Only an account's owner writes it (the shared store fences the others' writes);
        // a replica that takes the account over writes its record then
        // ([`crate::owners::duty`]).
        let owned = st.registry.owns(&name);
        if let Some(record) = persist.filter(|_| owned) {
            fx.ops.push(StoreOp::PutAccount {
                account: name.clone(),
                record,
            });
        }
        match registration {
            Registration::Rejected(reason) => {
                // A stream that served the account and now claims another cluster for it
                // stops serving it.
                self.staging.retain(|(a, _, _), _| *a != name);
                fx.promotions
                    .extend(st.registry.unregister(self.id, &name, now));
                reject(st, reason, fx)
            }
            Registration::Assigned(role) => {
                if unbound {
                    self.bind(st, &name, now, fx);
                }
                self.answer_assignment(st, &name, role, fx);
            }
        }
    }

    /// Whether this stream's identity may have one more account bound to it
    /// (`--max-accounts-per-identity`, review F14). Counts the bindings this replica knows,
    /// which with replicas include the others' (read from the shared store).
    fn within_account_cap(&self, st: &Control<'_>, limits: &Limits) -> Result<(), String> {
        let max = limits.max_accounts_per_identity;
        if max == 0 {
            return Ok(());
        }
        let bound = st
            .registry
            .bindings
            .values()
            .filter(|b| b.identity == self.identity)
            .count() as u64;
        if bound < max {
            return Ok(());
        }
        Err(format!(
            "agent identity {:?} already has {bound} accounts bound to it, the most the hub \
             allows one identity (--max-accounts-per-identity {max}): release accounts it no \
             longer serves (`scale-agent-hub account delete <name>`), or raise \
             --max-accounts-per-identity on the hub",
            self.identity
        ))
    }

    /// Binds an account to this stream's identity (its first registration).
    pub(super) fn bind(
        &self,
        st: &mut Control<'_>,
        name: &str,
        now: (Instant, SystemTime),
        fx: &mut Effects,
    ) {
        let since = jiff::Timestamp::try_from(now.1)
            .map(|t| t.as_second())
            .unwrap_or_default();
        let binding = st.registry.bind(name, &self.identity, since);
        tracing::info!(account = %name, "account bound to the identity that first registered it");
        // An audit line too (issue 28, F15): a name bound for the first time is what an
        // alert on squatting watches for (target `audit`, as the API's and the proxy's).
        tracing::info!(
            target: "audit",
            who = %self.identity,
            token_kind = "agent",
            verb = "bind",
            object = %name,
            code = 200u16,
            "account bound"
        );
        if st.registry.owns(name) {
            fx.ops.push(StoreOp::PutBinding {
                account: name.to_string(),
                binding,
            });
        }
    }

    pub(super) fn answer_assignment(
        &self,
        st: &Control<'_>,
        name: &str,
        role: Role,
        fx: &mut Effects,
    ) {
        let name = name.to_string();
        match role {
            Role::Streaming => {
                let a = streaming_assignment(st.cache, &name);
                fx.resumes += a.resume_points.len() as u64;
                tracing::info!(account = %name, resume_points = a.resume_points.len(), "account assigned: STREAMING");
                fx.replies.push(pb::HubMessage {
                    kind: Some(Out::Assignment(a)),
                });
            }
            Role::Standby => {
                tracing::info!(account = %name, "account assigned: STANDBY");
                fx.replies
                    .push(assignment(&name, PbRole::Standby, String::new()));
            }
        }
    }
}
