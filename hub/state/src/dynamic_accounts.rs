//! The in-memory book of dynamic accounts (Armory's dynamic accounts API, item 12 of the
//! stream contract): every account an admin added for an agent identity, and what that
//! identity's replicas reported about each. The hub's `dynamic_accounts` module serves the
//! HTTP routes and stores the records; [`push`] sends an identity its set.

use std::collections::BTreeMap;

use scale_agent_proto::v1 as pb;

use crate::{Control, Live};

pub use scale_agent_hub_model::dynamic_accounts::{
    AgentReport, DynamicAccountRecord, DynamicAccountSpec,
};

/// The dynamic accounts and what the agents reported about them (reports are not stored:
/// agents report again on their next stream).
#[derive(Debug, Default)]
pub struct DynamicAccounts {
    records: BTreeMap<String, DynamicAccountRecord>,
    /// account → replica label → report.
    reports: BTreeMap<String, BTreeMap<String, AgentReport>>,
}

impl DynamicAccounts {
    pub fn load(records: Vec<(String, DynamicAccountRecord)>) -> Self {
        Self {
            records: records.into_iter().collect(),
            reports: BTreeMap::new(),
        }
    }

    /// Replaces every record with the store's (replicas sharing a store: what was added,
    /// changed and removed through the others), keeping the reports of the accounts that
    /// remain. Returns the identities whose set changed (to be sent it again).
    pub fn replace(&mut self, records: Vec<(String, DynamicAccountRecord)>) -> Vec<String> {
        let records: BTreeMap<String, DynamicAccountRecord> = records.into_iter().collect();
        let mut changed: Vec<String> = Vec::new();
        for name in self.records.keys().chain(records.keys()) {
            let (before, after) = (self.records.get(name), records.get(name));
            if before != after {
                changed.extend(
                    before
                        .into_iter()
                        .chain(after)
                        .map(|r| r.spec.agent.clone()),
                );
            }
        }
        changed.sort();
        changed.dedup();
        self.reports.retain(|name, _| records.contains_key(name));
        self.records = records;
        changed
    }

    pub fn get(&self, name: &str) -> Option<&DynamicAccountRecord> {
        self.records.get(name)
    }

    pub fn list(&self) -> impl Iterator<Item = &DynamicAccountRecord> {
        self.records.values()
    }

    /// Adds or replaces an account; returns the record to store. A replaced account keeps
    /// its state (inactive or not) and source; a new one is active.
    pub fn put(&mut self, spec: DynamicAccountSpec, now_unix: i64) -> DynamicAccountRecord {
        let (inactive, source) = self
            .records
            .get(&spec.name)
            .map(|r| (r.inactive, r.source.clone()))
            .unwrap_or_default();
        self.put_as(spec, inactive, source, now_unix)
    }

    /// Adds or replaces an account with the given state and source (Armory's routes);
    /// returns the record to store.
    pub fn put_as(
        &mut self,
        spec: DynamicAccountSpec,
        inactive: bool,
        source: String,
        now_unix: i64,
    ) -> DynamicAccountRecord {
        let created = self.records.get(&spec.name).map_or(now_unix, |r| r.created);
        let record = DynamicAccountRecord {
            spec,
            created,
            updated: now_unix,
            inactive,
            source,
        };
        self.records
            .insert(record.spec.name.clone(), record.clone());
        record
    }

    pub fn remove(&mut self, name: &str) -> Option<DynamicAccountRecord> {
        self.reports.remove(name);
        self.records.remove(name)
    }

    /// Everything the streams of `identity` are sent: its active accounts.
    pub fn set_for(&self, identity: &str) -> pb::DynamicAccounts {
        pb::DynamicAccounts {
            accounts: self
                .records
                .values()
                .filter(|r| r.spec.agent == identity && !r.inactive)
                .map(|r| r.spec.to_proto())
                .collect(),
        }
    }

    /// Records a replica's report; reports about accounts that are not (or no longer)
    /// dynamic accounts of that identity are ignored.
    pub fn report(&mut self, identity: &str, replica: &str, status: pb::DynamicAccountStatus) {
        let Some(record) = self.records.get(&status.account) else {
            return;
        };
        if record.spec.agent != identity {
            return;
        }
        let state = pb::dynamic_account_status::State::try_from(status.state)
            .unwrap_or(pb::dynamic_account_status::State::Unspecified)
            .as_str_name()
            .to_string();
        tracing::info!(account = %status.account, %replica, %state, message = %status.message, "dynamic account reported");
        self.reports.entry(status.account).or_default().insert(
            replica.to_string(),
            AgentReport {
                replica: replica.to_string(),
                state,
                message: status.message,
                time: scale_agent_runtime::now_rfc3339(),
            },
        );
    }

    /// Forgets the reports of a replica of `identity` whose stream ended.
    pub fn forget_replica(&mut self, identity: &str, replica: &str) {
        for (account, reports) in &mut self.reports {
            if self
                .records
                .get(account)
                .is_some_and(|r| r.spec.agent == identity)
            {
                reports.remove(replica);
            }
        }
    }

    /// What the replicas connected now reported about `name`.
    pub fn reports(&self, name: &str) -> Vec<AgentReport> {
        self.reports
            .get(name)
            .map(|r| r.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// Sends `identity`'s set to each of its streams.
pub fn push(live: &Live, identity: &str) {
    let set = live.dynamic_accounts().set_for(identity);
    let sessions = live.registry_read().replicas_of_identity(identity);
    for (session, _) in sessions {
        live.control(session, Control::DynamicAccounts(set.clone()));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use scale_agent_hub_model::dynamic_accounts::parse_spec;

    fn body(value: Value) -> Vec<u8> {
        serde_json::to_vec(&value).unwrap()
    }

    fn valid() -> Value {
        serde_json::json!({
            "name": "dyn-a",
            "agent": "prod-agent",
            "mode": "SpinnakerService",
            "kubeconfigSecret": {"namespace": "spinnaker", "name": "dyn-a-kubeconfig"},
            "kinds": ["ConfigMap"],
            "namespaces": ["team-a"],
        })
    }

    #[test]
    fn each_identity_gets_its_own_set_and_reports_stay_with_their_account() {
        let mut accounts = DynamicAccounts::default();
        let spec = parse_spec(&body(valid())).unwrap();
        let first = accounts.put(spec.clone(), 10);
        let mut other = spec.clone();
        other.name = "dyn-b".into();
        other.agent = "other-agent".into();
        accounts.put(other, 11);
        let again = accounts.put(spec, 20);
        assert_eq!((again.created, again.updated), (first.created, 20));
        let set = accounts.set_for("prod-agent");
        assert_eq!(set.accounts.len(), 1);
        assert_eq!(set.accounts[0].account, "dyn-a");
        let report = |account: &str| pb::DynamicAccountStatus {
            account: account.into(),
            state: pb::dynamic_account_status::State::Failed as i32,
            message: "secrets \"x\" is forbidden".into(),
        };
        accounts.report("prod-agent", "pod-1", report("dyn-a"));
        // Another identity cannot report on it; unknown accounts are ignored.
        accounts.report("other-agent", "pod-9", report("dyn-a"));
        accounts.report("prod-agent", "pod-1", report("nope"));
        let reports = accounts.reports("dyn-a");
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].state, "FAILED");
        accounts.forget_replica("other-agent", "pod-1");
        assert_eq!(
            accounts.reports("dyn-a").len(),
            1,
            "another identity's pod-1 left"
        );
        accounts.forget_replica("prod-agent", "pod-1");
        assert!(accounts.reports("dyn-a").is_empty());
        let mut spec_inactive = parse_spec(&body(valid())).unwrap();
        spec_inactive.name = "dyn-c".into();
        accounts.put_as(spec_inactive.clone(), true, "dynamic".into(), 30);
        assert_eq!(
            accounts.set_for("prod-agent").accounts.len(),
            1,
            "inactive: not sent"
        );
        let kept = accounts.put(spec_inactive, 31);
        assert!(
            kept.inactive && kept.source == "dynamic",
            "a replaced account keeps its state"
        );
        accounts.remove("dyn-c");
        assert!(accounts.remove("dyn-a").is_some());
        assert!(accounts.set_for("prod-agent").accounts.is_empty());
    }
}
