//! Dynamic accounts (Armory's dynamic accounts API, item 12 of the stream contract): an
//! admin adds, updates and removes accounts of an agent identity through the hub's API; the
//! hub keeps them in its store and sends the identity's whole set to each of its streams
//! when the stream starts and whenever the set changes. The agent reads each account's
//! kubeconfig from a Secret in its own cluster (Infrastructure and SpinnakerService modes),
//! so no kubeconfig ever passes through the hub, and reports how each account fares.
//!
//! Routes (role admin, see [`router`]): `GET`/`POST /api/v1/dynamic-accounts`,
//! `GET`/`PUT`/`DELETE /api/v1/dynamic-accounts/{name}`.

use std::{collections::BTreeMap, sync::Arc};

use axum::{
    Json, Router,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use scale_agent_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::{Control, Hub, store::StoreOp};

pub use scale_agent_hub_model::dynamic_accounts::{
    AgentReport, DEFAULT_SECRET_KEY, DynamicAccountRecord, DynamicAccountSpec, DynamicMode,
    SecretKeyRef, parse_spec,
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

    /// Adds or replaces an account; returns the record to store.
    pub fn put(&mut self, spec: DynamicAccountSpec, now_unix: i64) -> DynamicAccountRecord {
        let created = self.records.get(&spec.name).map_or(now_unix, |r| r.created);
        let record = DynamicAccountRecord {
            spec,
            created,
            updated: now_unix,
        };
        self.records
            .insert(record.spec.name.clone(), record.clone());
        record
    }

    pub fn remove(&mut self, name: &str) -> Option<DynamicAccountRecord> {
        self.reports.remove(name);
        self.records.remove(name)
    }

    /// Everything the streams of `identity` are sent.
    pub fn set_for(&self, identity: &str) -> pb::DynamicAccounts {
        pb::DynamicAccounts {
            accounts: self
                .records
                .values()
                .filter(|r| r.spec.agent == identity)
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

    fn reports(&self, name: &str) -> Vec<AgentReport> {
        self.reports
            .get(name)
            .map(|r| r.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// A dynamic account as the API shows it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DynamicAccountView {
    #[serde(flatten)]
    pub spec: DynamicAccountSpec,
    pub created: String,
    pub updated: String,
    /// Replicas of the agent connected now (they have been sent the account).
    pub connected_replicas: Vec<String>,
    /// What each connected replica reported.
    pub agent_status: Vec<AgentReport>,
    /// The hub's state of the account (`ACTIVE`, `INACTIVE`, `FAILED`, `ORPHANED`), once an
    /// agent registered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_reason: Option<String>,
}

fn time(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn view(hub: &Hub, record: &DynamicAccountRecord) -> DynamicAccountView {
    let name = &record.spec.name;
    let (connected_replicas, state) = {
        let st = hub.state();
        let replicas = st
            .registry
            .replicas_of_identity(&record.spec.agent)
            .into_iter()
            .map(|(_, replica)| replica)
            .collect();
        (replicas, st.registry.states.get(name).cloned())
    };
    DynamicAccountView {
        spec: record.spec.clone(),
        created: time(record.created),
        updated: time(record.updated),
        connected_replicas,
        agent_status: hub.dynamic_accounts().reports(name),
        state: state.as_ref().map(|s| s.state.as_str().to_string()),
        state_reason: state.map(|s| s.reason),
    }
}

/// The routes (role admin: the router's layer).
pub(crate) fn router() -> Router<Arc<Hub>> {
    Router::new()
        .route(
            "/api/v1/dynamic-accounts",
            get(list_accounts).post(create_account),
        )
        .route(
            "/api/v1/dynamic-accounts/{name}",
            get(get_account).put(update_account).delete(delete_account),
        )
}

async fn list_accounts(State(hub): State<Arc<Hub>>) -> Response {
    let records: Vec<DynamicAccountRecord> = hub.dynamic_accounts().list().cloned().collect();
    let views: Vec<DynamicAccountView> = records.iter().map(|r| view(&hub, r)).collect();
    Json(views).into_response()
}

async fn get_account(State(hub): State<Arc<Hub>>, Path(name): Path<String>) -> Response {
    let record = hub.dynamic_accounts().get(&name).cloned();
    match record {
        Some(record) => Json(view(&hub, &record)).into_response(),
        None => not_found(&name),
    }
}

fn not_found(name: &str) -> Response {
    crate::http::error(
        StatusCode::NOT_FOUND,
        format!(
            "no dynamic account {name:?}: add it with POST /api/v1/dynamic-accounts (GET \
             /api/v1/dynamic-accounts lists them)"
        ),
    )
}

async fn create_account(State(hub): State<Arc<Hub>>, body: axum::body::Bytes) -> Response {
    let spec = match parse_spec(&body) {
        Ok(spec) => spec,
        Err(message) => return crate::http::error(StatusCode::BAD_REQUEST, message),
    };
    if hub.dynamic_accounts().get(&spec.name).is_some() {
        return crate::http::error(
            StatusCode::CONFLICT,
            format!(
                "dynamic account {:?} exists: change it with PUT /api/v1/dynamic-accounts/{}, \
                 or DELETE it first",
                spec.name, spec.name
            ),
        );
    }
    save(&hub, spec, StatusCode::CREATED).await
}

async fn update_account(
    State(hub): State<Arc<Hub>>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let spec = match parse_spec(&body) {
        Ok(spec) => spec,
        Err(message) => return crate::http::error(StatusCode::BAD_REQUEST, message),
    };
    if spec.name != name {
        return crate::http::error(
            StatusCode::BAD_REQUEST,
            format!(
                "the body names account {:?} but the path {name:?}: an account is renamed by \
                 deleting it and adding the new name",
                spec.name
            ),
        );
    }
    let previous = hub.dynamic_accounts().get(&name).cloned();
    let Some(previous) = previous else {
        return not_found(&name);
    };
    let moved_from = (previous.spec.agent != spec.agent).then_some(previous.spec.agent);
    let response = save(&hub, spec, StatusCode::OK).await;
    if let Some(identity) = moved_from {
        push(&hub, &identity);
    }
    response
}

/// Checks the binding, stores the account, tells the agent.
async fn save(hub: &Arc<Hub>, spec: DynamicAccountSpec, status: StatusCode) -> Response {
    if let Err(reason) = hub.state().registry.check_binding(&spec.agent, &spec.name) {
        return crate::http::error(
            StatusCode::CONFLICT,
            format!(
                "account {:?} cannot be served by agent {:?}: {reason}",
                spec.name, spec.agent
            ),
        );
    }
    let mut store = hub.store.lock().await;
    let record = hub
        .dynamic_accounts()
        .put(spec, jiff::Timestamp::now().as_second());
    let stored = store
        .commit(vec![StoreOp::PutDynamicAccount {
            record: record.clone(),
        }])
        .await;
    drop(store);
    if let Err(e) = stored {
        return crate::http::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the dynamic account could not be stored: {}",
                crate::error::Chain(&e)
            ),
        );
    }
    tracing::info!(account = %record.spec.name, agent = %record.spec.agent, mode = ?record.spec.mode, "dynamic account saved");
    push(hub, &record.spec.agent);
    (status, Json(view(hub, &record))).into_response()
}

async fn delete_account(State(hub): State<Arc<Hub>>, Path(name): Path<String>) -> Response {
    let mut store = hub.store.lock().await;
    let removed = hub.dynamic_accounts().remove(&name);
    let Some(record) = removed else {
        return not_found(&name);
    };
    let stored = store
        .commit(vec![StoreOp::DeleteDynamicAccount {
            account: name.clone(),
        }])
        .await;
    drop(store);
    if let Err(e) = stored {
        return crate::http::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the dynamic account is removed in memory but could not be stored: {}",
                crate::error::Chain(&e)
            ),
        );
    }
    tracing::info!(account = %name, agent = %record.spec.agent, "dynamic account removed");
    push(&hub, &record.spec.agent);
    (StatusCode::OK, Json(view(&hub, &record))).into_response()
}

/// Sends `identity`'s set to each of its streams.
pub(crate) fn push(hub: &Hub, identity: &str) {
    let set = hub.dynamic_accounts().set_for(identity);
    let sessions = hub.state().registry.replicas_of_identity(identity);
    for (session, _) in sessions {
        hub.control(session, Control::DynamicAccounts(set.clone()));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

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
    fn a_valid_body_becomes_what_the_agent_is_sent() {
        let spec = parse_spec(&body(valid())).unwrap();
        assert_eq!(spec.mode, DynamicMode::SpinnakerService);
        let proto = spec.to_proto();
        assert_eq!(proto.account, "dyn-a");
        let secret = proto.kubeconfig_secret.unwrap();
        assert_eq!(
            (
                secret.namespace.as_str(),
                secret.name.as_str(),
                secret.key.as_str()
            ),
            ("spinnaker", "dyn-a-kubeconfig", "")
        );
        let settings: Value = serde_json::from_slice(&proto.settings_json).unwrap();
        assert_eq!(settings["kinds"], serde_json::json!(["ConfigMap"]));
        assert_eq!(settings["namespaces"], serde_json::json!(["team-a"]));
        let mut default_mode = valid();
        default_mode.as_object_mut().unwrap().remove("mode");
        assert_eq!(
            parse_spec(&body(default_mode)).unwrap().mode,
            DynamicMode::Infrastructure
        );
    }

    #[test]
    fn refusals_say_what_to_send_instead() {
        let with = |field: &str, value: Value| {
            let mut v = valid();
            v[field] = value;
            parse_spec(&body(v)).unwrap_err()
        };
        let err = with("kubeconfigContents", serde_json::json!("apiVersion: v1"));
        assert!(err.contains("kubeconfigSecret"), "{err}");
        assert!(err.contains("never carries kubeconfigs"), "{err}");
        let err = with("serviceAccount", serde_json::json!(true));
        assert!(err.contains("AgentAccount"), "{err}");
        let err = with("mode", serde_json::json!("Agent"));
        assert!(err.contains("mode Agent"), "{err}");
        let err = with("kindz", serde_json::json!(["Pod"]));
        assert!(err.contains("unknown field `kindz`"), "{err}");
        let err = with("agent", serde_json::json!(" "));
        assert!(err.contains("agent identity"), "{err}");
        let err = with("name", serde_json::json!("Not A Name"));
        assert!(err.contains("Not A Name"), "{err}");
        let err = with("kubeconfigSecret", serde_json::json!({"name": "Bad_Name"}));
        assert!(err.contains("lowercase DNS names"), "{err}");
        let err = with("omitKinds", serde_json::json!(["Secret"]));
        assert!(err.contains("not both"), "{err}");
        let err = parse_spec(b"[1]").unwrap_err();
        assert!(err.contains("kubeconfigSecret"), "{err}");
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
        assert!(accounts.remove("dyn-a").is_some());
        assert!(accounts.set_for("prod-agent").accounts.is_empty());
    }
}
