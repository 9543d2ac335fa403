//! Writes the hub's verdict into the cluster, where `kubectl`, Argo CD and pipelines see it:
//! a `Connected` condition and `status.hub` on each AgentAccount this agent serves, and a
//! `Connected` condition with `connected`/`connectedReplicas` on its ScaleAgent.
//!
//! Writes are server-side apply with the agent's own field manager
//! ([`scale_agent_crds::AGENT_FIELD_MANAGER`]), so the operator's conditions and the agent's
//! never fight. The agent may only `patch` these status subresources (the operator's Role
//! names them), so it never reads them: which replica writes what follows from what each
//! one knows.
//! - The STREAMING replica of an account writes `Streaming`; every replica writes `Rejected`
//!   (they all serve the same cluster, so the hub's verdict is the same). A STANDBY replica
//!   leaves the account to the streaming one, except once, `Standby`, where it wrote the
//!   last verdict itself: it streamed, or it lost the hub and wrote `HubUnreachable`, and
//!   the hub moved the stream to another replica meanwhile. Its `False` would otherwise
//!   stand until the streaming replica's next resync.
//! - A replica that loses the hub writes `HubUnreachable` once, only for the objects whose
//!   last verdict it wrote itself; the replica the hub promotes writes `Streaming` again.
//!   Authoritative verdicts are re-written every [`RESYNC`], which bounds how long a stale
//!   `HubUnreachable` or `Standby` (a race between two replicas) can stay.
//! - A replica that never reached the hub since it started writes `HubUnreachable` with its
//!   last error once a connection attempt failed (and again when the error changes), so a
//!   wrong hub address or CA shows in the cluster instead of an empty column. A replica that
//!   does reach the hub overwrites it within [`RESYNC`].
//!
//! Condition changes are written within a tick ([`TICK`]); counters (objects streamed, last
//! event) at most once per `--status-interval-seconds` per object.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use scale_agent_crds::{
    AGENT_FIELD_MANAGER, API_VERSION, AgentAccount, ScaleAgent,
    agent_config::AgentConfig,
    conditions::{
        CONNECTED, REASON_ACCOUNT_FAILING, REASON_HUB_UNREACHABLE, REASON_REJECTED,
        REASON_STREAMING, STATUS_FALSE, STATUS_TRUE,
    },
    v1alpha1::{AccountHubStatus, ForbiddenKind},
};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::state::{
    AccountView, AgentView, KindState, ROLE_REJECTED, ROLE_STANDBY, ROLE_STREAMING, Shared,
};

/// `status.hub.state` while the writing replica cannot reach the hub.
pub const HUB_STATE_UNKNOWN: &str = "Unknown";
/// How often the writer looks at the agent's state.
pub const TICK: Duration = Duration::from_secs(1);
/// Authoritative verdicts are written again this often even when unchanged.
pub const RESYNC: Duration = Duration::from_secs(30);
/// Reason of a ScaleAgent's `Connected=True`.
pub const REASON_CONNECTED: &str = "Connected";
/// Reason of an AgentAccount's `Connected=True` written by a replica the hub put on standby.
pub const REASON_STANDBY: &str = "Standby";

/// Whether this replica was ever welcomed by the hub (the identity is kept after a stream
/// ends).
fn ever_connected(view: &AgentView) -> bool {
    view.hub_connected || !view.hub_identity.is_empty()
}

/// `HubUnreachable` of a replica that never reached the hub, once an attempt failed.
fn never_connected_message(view: &AgentView) -> Option<String> {
    if ever_connected(view) {
        return None;
    }
    let error = view.hub_error.as_deref()?;
    Some(format!(
        "replica {} has not reached the hub at {} since it started: {error}",
        view.replica, view.hub
    ))
}

/// Which object a status is for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Object {
    ScaleAgent(String),
    AgentAccount(String),
}

/// What this replica may write about one object now.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
    /// The status fields besides the condition.
    pub fields: Value,
    /// A verdict this replica may repeat (it streams, was rejected, or is connected); a
    /// `HubUnreachable` is written once and then left to the replicas that reach the hub.
    pub authoritative: bool,
}

/// What this replica last wrote to one object.
#[derive(Clone, Debug)]
struct Written {
    desired: Desired,
    transition: String,
    at: Instant,
}

/// `plural` for the core group, else `plural.group`.
fn kind_label(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

/// The hub's view of one account, as this replica knows it.
pub fn account_hub_status(
    account: &AccountView,
    replica: &str,
    last_event: Option<&str>,
) -> AccountHubStatus {
    let mut watched: Vec<String> = account
        .kinds
        .iter()
        .filter(|k| k.state == KindState::Watching)
        .map(|k| kind_label(&k.group, &k.plural))
        .collect();
    watched.sort();
    watched.dedup();
    let forbidden = account
        .kinds
        .iter()
        .filter(|k| matches!(k.state, KindState::Forbidden | KindState::Failing))
        .map(|k| ForbiddenKind {
            kind: kind_label(&k.group, &k.plural),
            namespace: k.watch_namespace.clone(),
            state: if k.state == KindState::Forbidden {
                "Forbidden".into()
            } else {
                "Failing".into()
            },
            message: k.message.clone(),
        })
        .collect();
    AccountHubStatus {
        replica: replica.to_string(),
        state: account.hub_state.as_ref().map(|s| s.state.clone()),
        state_reason: account.hub_state.as_ref().map(|s| s.reason.clone()),
        kinds_watched: watched,
        kinds_forbidden: forbidden,
        objects_streamed: account
            .kinds
            .iter()
            .map(|k| i64::try_from(k.objects_sent).unwrap_or(i64::MAX))
            .sum(),
        last_event_time: last_event.map(str::to_string),
    }
}

/// What this replica may write about an account, given what it last wrote there itself
/// (`last`, `None` when nothing since it started).
pub fn account_desired(
    view: &AgentView,
    account: &AccountView,
    last: Option<&Desired>,
    last_event: Option<&str>,
) -> Option<Desired> {
    // Its last write was an authoritative verdict: it may say it lost the hub.
    let owned = last.is_some_and(|d| d.authoritative);
    // It wrote the account's verdict (any but Standby) and may have to take it back: a
    // replica demoted while it was away from the hub wrote HubUnreachable last, which
    // would otherwise stand (False) while another replica streams the account.
    let spoke = last.is_some_and(|d| d.reason != REASON_STANDBY);
    let hub = account_hub_status(account, &view.replica, last_event);
    let fields = |hub: &AccountHubStatus| json!({ "hub": hub });
    if account.role == ROLE_REJECTED {
        return Some(Desired {
            status: STATUS_FALSE,
            reason: REASON_REJECTED,
            message: account
                .rejection_reason
                .clone()
                .unwrap_or_else(|| "the hub rejected the account".into()),
            fields: fields(&hub),
            authoritative: true,
        });
    }
    if account.failing() {
        // Every replica serves the same cluster with the same credentials, so each may say
        // so; the hub never hears of the account meanwhile (it is not registered).
        return Some(Desired {
            status: STATUS_FALSE,
            reason: REASON_ACCOUNT_FAILING,
            message: format!(
                "replica {} cannot serve the account (retried with backoff; the agent's other \
                 accounts are served): {}",
                view.replica,
                account.error.as_deref().unwrap_or("no answer")
            ),
            fields: fields(&hub),
            authoritative: true,
        });
    }
    if view.hub_connected && account.role == ROLE_STREAMING {
        return Some(Desired {
            status: STATUS_TRUE,
            reason: REASON_STREAMING,
            message: format!("replica {} streams the account to the hub", view.replica),
            fields: fields(&hub),
            authoritative: true,
        });
    }
    if view.hub_connected && account.role == ROLE_STANDBY && spoke {
        return Some(Desired {
            status: STATUS_TRUE,
            reason: REASON_STANDBY,
            message: format!(
                "replica {} is connected and on standby for the account: the hub moved its \
                 stream to another replica, which reports it from now on",
                view.replica
            ),
            fields: fields(&hub),
            authoritative: false,
        });
    }
    if let Some(message) = never_connected_message(view) {
        return Some(Desired {
            status: STATUS_FALSE,
            reason: REASON_HUB_UNREACHABLE,
            fields: fields(&unknown_to_the_hub(hub, &message)),
            message,
            authoritative: false,
        });
    }
    if !view.hub_connected && owned {
        let message = format!(
            "replica {} lost the hub at {}: {}",
            view.replica,
            view.hub,
            view.hub_error.as_deref().unwrap_or("no answer")
        );
        return Some(Desired {
            status: STATUS_FALSE,
            reason: REASON_HUB_UNREACHABLE,
            fields: fields(&unknown_to_the_hub(hub, &message)),
            message,
            authoritative: false,
        });
    }
    None
}

/// `status.hub` of a replica that cannot reach the hub: the hub's last verdict (ACTIVE,
/// typically) no longer stands beside `Connected=False`, so the state says it is unknown,
/// and why; since when is the `Connected` condition's `lastTransitionTime`, written with it.
fn unknown_to_the_hub(hub: AccountHubStatus, why: &str) -> AccountHubStatus {
    AccountHubStatus {
        state: Some(HUB_STATE_UNKNOWN.into()),
        state_reason: Some(format!(
            "the hub's state of the account is unknown: {why} (the hub may still hold the \
             account, and will say ORPHANED after its grace period with no agent)"
        )),
        ..hub
    }
}

/// What this replica may write about its ScaleAgent; `owned`: its last write there said it
/// was connected.
pub fn scale_agent_desired(view: &AgentView, owned: Option<&Desired>) -> Option<Desired> {
    let replicas_fields = |replicas: &[String]| {
        json!({
            "connected": replicas.len(),
            "connectedReplicas": replicas,
        })
    };
    if view.hub_connected && !view.hub_replicas.is_empty() {
        return Some(Desired {
            status: STATUS_TRUE,
            reason: REASON_CONNECTED,
            message: format!(
                "{} replica(s) connected to the hub at {}: {}",
                view.hub_replicas.len(),
                view.hub,
                view.hub_replicas.join(", ")
            ),
            fields: replicas_fields(&view.hub_replicas),
            authoritative: true,
        });
    }
    if let Some(message) = never_connected_message(view) {
        return Some(Desired {
            status: STATUS_FALSE,
            reason: REASON_HUB_UNREACHABLE,
            message,
            fields: replicas_fields(&[]),
            authoritative: false,
        });
    }
    let last = owned.filter(|d| d.authoritative)?;
    if view.hub_connected {
        return None;
    }
    // This replica was counted; without it, who is left as far as it knows.
    let remaining: Vec<String> = last.fields["connectedReplicas"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|r| *r != view.replica)
        .map(str::to_string)
        .collect();
    if remaining.is_empty() {
        return Some(Desired {
            status: STATUS_FALSE,
            reason: REASON_HUB_UNREACHABLE,
            message: format!(
                "no replica reaches the hub at {}; replica {}: {}",
                view.hub,
                view.replica,
                view.hub_error.as_deref().unwrap_or("no answer")
            ),
            fields: replicas_fields(&remaining),
            authoritative: false,
        });
    }
    Some(Desired {
        status: STATUS_TRUE,
        reason: REASON_CONNECTED,
        message: format!(
            "{} replica(s) connected to the hub at {}: {} (replica {} lost it: {})",
            remaining.len(),
            view.hub,
            remaining.join(", "),
            view.replica,
            view.hub_error.as_deref().unwrap_or("no answer")
        ),
        fields: replicas_fields(&remaining),
        authoritative: false,
    })
}

/// Whether `desired` should be written given the last write: a new condition at once, other
/// changes after `interval`, an unchanged authoritative verdict after [`RESYNC`].
fn due(desired: &Desired, last: Option<&Written>, interval: Duration) -> bool {
    let Some(last) = last else {
        return true;
    };
    let d = &last.desired;
    if (d.status, d.reason, &d.message) != (desired.status, desired.reason, &desired.message) {
        return true;
    }
    let elapsed = last.at.elapsed();
    (d.fields != desired.fields && elapsed >= interval)
        || (desired.authoritative && elapsed >= RESYNC)
}

/// The apply patch of one status.
fn patch_body(kind: &str, desired: &Desired, transition: &str) -> Value {
    let mut status = desired.fields.clone();
    if let Value::Object(map) = &mut status {
        map.insert(
            "conditions".into(),
            json!([{
                "type": CONNECTED,
                "status": desired.status,
                "reason": desired.reason,
                "message": desired.message,
                "lastTransitionTime": transition,
            }]),
        );
    }
    json!({ "apiVersion": API_VERSION, "kind": kind, "status": status })
}

/// A client for the agent's own cluster: the pod's ServiceAccount, or `$KUBECONFIG` outside
/// a pod (as the accounts' `serviceAccount: true` does).
async fn own_cluster_client(no_proxy: bool) -> Result<Client, String> {
    let config = crate::account::own_cluster_config(no_proxy).await?;
    Client::try_from(config).map_err(|e| e.to_string())
}

/// The writer's memory between ticks.
#[derive(Default)]
struct Writer {
    written: BTreeMap<Object, Written>,
    /// Per account: objects streamed at the last tick, and when that last grew.
    events: BTreeMap<String, (i64, Option<String>)>,
    /// The last error per object, logged once.
    errors: BTreeMap<Object, String>,
}

impl Writer {
    async fn write(&mut self, client: &Client, namespace: &str, object: Object, desired: Desired) {
        let last = self.written.get(&object);
        let transition = match last {
            Some(w) if w.desired.status == desired.status => w.transition.clone(),
            _ => scale_agent_runtime::now_rfc3339(),
        };
        let params = PatchParams::apply(AGENT_FIELD_MANAGER).force();
        let result = match &object {
            Object::ScaleAgent(name) => {
                let body = patch_body("ScaleAgent", &desired, &transition);
                Api::<ScaleAgent>::namespaced(client.clone(), namespace)
                    .patch_status(name, &params, &Patch::Apply(&body))
                    .await
                    .map(|_| ())
            }
            Object::AgentAccount(name) => {
                let body = patch_body("AgentAccount", &desired, &transition);
                Api::<AgentAccount>::namespaced(client.clone(), namespace)
                    .patch_status(name, &params, &Patch::Apply(&body))
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Ok(()) => {
                tracing::debug!(?object, reason = desired.reason, "status written");
                self.errors.remove(&object);
                self.written.insert(
                    object,
                    Written {
                        desired,
                        transition,
                        at: Instant::now(),
                    },
                );
            }
            Err(error) => {
                let text = error.to_string();
                if self.errors.get(&object) != Some(&text) {
                    tracing::warn!(?object, %namespace, error = %text, "cannot write status (retried every second)");
                    self.errors.insert(object, text);
                }
            }
        }
    }

    /// One look at the agent's state; writes what is due.
    async fn tick(
        &mut self,
        client: &Client,
        config: &AgentConfig,
        view: &AgentView,
        interval: Duration,
    ) {
        let Some(target) = &config.status else {
            return;
        };
        let now = scale_agent_runtime::now_rfc3339();
        for account_config in &config.kubernetes.accounts {
            let Some(cr) = &account_config.agent_account else {
                continue;
            };
            let Some(account) = view.account(&account_config.name) else {
                continue;
            };
            let streamed: i64 = account
                .kinds
                .iter()
                .map(|k| i64::try_from(k.objects_sent).unwrap_or(i64::MAX))
                .sum();
            let entry = self
                .events
                .entry(account_config.name.clone())
                .or_insert((streamed, None));
            if streamed > entry.0 {
                entry.1 = Some(now.clone());
            }
            entry.0 = streamed;
            let last_event = entry.1.clone();
            let object = Object::AgentAccount(cr.clone());
            let last = self.written.get(&object);
            let Some(desired) = account_desired(
                view,
                account,
                last.map(|w| &w.desired),
                last_event.as_deref(),
            ) else {
                continue;
            };
            if due(&desired, last, interval) {
                self.write(client, &target.namespace, object, desired).await;
            }
        }
        let object = Object::ScaleAgent(target.scale_agent.clone());
        let last = self.written.get(&object);
        if let Some(desired) = scale_agent_desired(view, last.map(|w| &w.desired))
            && due(&desired, last, interval)
        {
            self.write(client, &target.namespace, object, desired).await;
        }
    }
}

/// Writes statuses until `shutdown` turns true. Does nothing while the config names no
/// status target (an agent not run by the operator).
pub async fn run(
    shared: Arc<Shared>,
    config_rx: watch::Receiver<Arc<AgentConfig>>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut writer = Writer::default();
    let mut client: Option<Client> = None;
    let mut client_error: Option<String> = None;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let config = config_rx.borrow().clone();
        if config.status.is_none() {
            continue;
        }
        if client.is_none() {
            match own_cluster_client(config.kubernetes.no_proxy).await {
                Ok(c) => client = Some(c),
                Err(e) => {
                    if client_error.as_ref() != Some(&e) {
                        tracing::warn!(error = %e, "cannot write status: no client for this cluster");
                        client_error = Some(e);
                    }
                    continue;
                }
            }
        }
        if let Some(client) = &client {
            writer.tick(client, &config, &shared.view(), interval).await;
        }
    }
}

#[cfg(test)]
mod tests;
