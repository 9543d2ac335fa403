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
mod tests {
    use super::*;
    use crate::state::{HubAccountState, KindView, ROLE_STANDBY};

    fn kind(plural: &str, group: &str, ns: &str, state: KindState, sent: u64) -> KindView {
        KindView {
            group: group.into(),
            version: "v1".into(),
            kind: plural.into(),
            plural: plural.into(),
            watch_namespace: ns.into(),
            state,
            message: if state == KindState::Forbidden {
                "secrets is forbidden: User cannot list".into()
            } else {
                String::new()
            },
            resource_version: "1".into(),
            objects_sent: sent,
            lists: 1,
        }
    }

    fn view(connected: bool) -> AgentView {
        AgentView {
            replica: "pod-a".into(),
            hub: "hub:9091".into(),
            hub_connected: connected,
            // Welcomed once: it has the hub's word for its identity.
            hub_identity: "prod-agent".into(),
            hub_error: (!connected).then(|| "connection refused".into()),
            hub_replicas: if connected {
                vec!["pod-a".into(), "pod-b".into()]
            } else {
                vec![]
            },
            ..Default::default()
        }
    }

    fn account(role: &str) -> AccountView {
        let mut a = AccountView::new("prod");
        a.role = role.into();
        a.kinds = vec![
            kind("deployments", "apps", "web", KindState::Watching, 3),
            kind("deployments", "apps", "db", KindState::Watching, 2),
            kind("secrets", "", "db", KindState::Forbidden, 0),
        ];
        a.hub_state = Some(HubAccountState {
            state: "ACTIVE".into(),
            reason: "streamed by replica x/pod-a".into(),
            since_unix_millis: 1,
        });
        a
    }

    #[test]
    fn streaming_replica_speaks_for_the_account() {
        let d = account_desired(&view(true), &account(ROLE_STREAMING), None, Some("t")).unwrap();
        assert_eq!((d.status, d.reason), (STATUS_TRUE, REASON_STREAMING));
        assert!(d.authoritative);
        let hub = &d.fields["hub"];
        assert_eq!(hub["kindsWatched"], json!(["deployments.apps"]));
        assert_eq!(hub["kindsForbidden"][0]["kind"], "secrets");
        assert_eq!(hub["kindsForbidden"][0]["namespace"], "db");
        assert!(
            hub["kindsForbidden"][0]["message"]
                .as_str()
                .unwrap()
                .contains("forbidden")
        );
        assert_eq!(hub["objectsStreamed"], 5);
        assert_eq!(hub["state"], "ACTIVE");
        assert_eq!(hub["replica"], "pod-a");
        assert_eq!(hub["lastEventTime"], "t");
    }

    #[test]
    fn standby_writes_nothing_and_rejection_carries_the_hubs_reason() {
        assert!(account_desired(&view(true), &account(ROLE_STANDBY), None, None).is_none());
        let mut rejected = account(ROLE_REJECTED);
        rejected.rejection_reason = Some("account \"prod\" is bound to cluster https://a".into());
        let d = account_desired(&view(true), &rejected, None, None).unwrap();
        assert_eq!((d.status, d.reason), (STATUS_FALSE, REASON_REJECTED));
        assert!(d.message.contains("https://a"), "{}", d.message);
    }

    /// An account the agent cannot prepare (unreachable target cluster) is reported on its
    /// own AgentAccount, whatever the hub connection; once it is served again the streaming
    /// replica's verdict replaces it.
    #[test]
    fn a_failing_account_says_why_on_its_own_object() {
        let mut failing = AccountView::new("prod");
        failing.error = Some("cannot reach https://10.0.0.1:6443: connection refused".into());
        for connected in [true, false] {
            let d = account_desired(&view(connected), &failing, None, None).unwrap();
            assert_eq!((d.status, d.reason), (STATUS_FALSE, REASON_ACCOUNT_FAILING));
            assert!(d.message.contains("connection refused"), "{}", d.message);
            assert!(d.message.contains("pod-a"), "{}", d.message);
            assert!(d.authoritative);
        }
        let spoke = account_desired(&view(true), &failing, None, None).unwrap();
        let served =
            account_desired(&view(true), &account(ROLE_STREAMING), Some(&spoke), None).unwrap();
        assert_eq!(served.reason, REASON_STREAMING);
    }

    #[test]
    fn a_demoted_replica_says_standby_once_and_then_leaves_it_to_the_streaming_one() {
        let streamed = account_desired(&view(true), &account(ROLE_STREAMING), None, None).unwrap();
        let standby = account(ROLE_STANDBY);
        let d = account_desired(&view(true), &standby, Some(&streamed), None).unwrap();
        assert_eq!((d.status, d.reason), (STATUS_TRUE, REASON_STANDBY));
        assert!(d.message.contains("pod-a"), "{}", d.message);
        assert!(d.message.contains("another replica"), "{}", d.message);
        assert!(
            !d.authoritative,
            "written once: the streaming replica speaks after"
        );
        // Its last write was Standby: nothing more.
        assert!(account_desired(&view(true), &standby, Some(&d), None).is_none());
        let body = patch_body("AgentAccount", &d, "t");
        assert_eq!(body["status"]["conditions"][0]["reason"], "Standby");
    }

    #[test]
    fn a_replica_demoted_while_away_takes_back_its_hub_unreachable() {
        // It streamed, lost the hub and said so; the hub promoted another replica meanwhile.
        let streamed = account_desired(&view(true), &account(ROLE_STREAMING), None, None).unwrap();
        let lost = account_desired(
            &view(false),
            &account(ROLE_STREAMING),
            Some(&streamed),
            None,
        )
        .unwrap();
        assert_eq!(lost.reason, REASON_HUB_UNREACHABLE);
        let standby = account(ROLE_STANDBY);
        let d = account_desired(&view(true), &standby, Some(&lost), None).unwrap();
        assert_eq!((d.status, d.reason), (STATUS_TRUE, REASON_STANDBY));
        assert!(account_desired(&view(true), &standby, Some(&d), None).is_none());
        // The same for a replica whose first connection failed and said so.
        let mut never = view(false);
        never.hub_identity.clear();
        let first = account_desired(&never, &standby, None, None).unwrap();
        assert_eq!(first.reason, REASON_HUB_UNREACHABLE);
        let d = account_desired(&view(true), &standby, Some(&first), None).unwrap();
        assert_eq!(d.reason, REASON_STANDBY);
    }

    #[test]
    fn a_replica_that_never_reached_the_hub_reports_its_last_error() {
        let mut never = view(false);
        never.hub_identity.clear();
        never.hub_error = None;
        let a = account(ROLE_STANDBY);
        // Still trying its first connection: nothing to say yet.
        assert!(account_desired(&never, &a, None, None).is_none());
        assert!(scale_agent_desired(&never, None).is_none());
        never.hub_error = Some("tls handshake: unknown issuer".into());
        let d = account_desired(&never, &a, None, None).unwrap();
        assert_eq!((d.status, d.reason), (STATUS_FALSE, REASON_HUB_UNREACHABLE));
        assert!(d.message.contains("unknown issuer"), "{}", d.message);
        assert!(d.message.contains("since it started"), "{}", d.message);
        assert!(d.message.contains("hub:9091"), "{}", d.message);
        assert!(!d.authoritative);
        let s = scale_agent_desired(&never, None).unwrap();
        assert_eq!((s.status, s.reason), (STATUS_FALSE, REASON_HUB_UNREACHABLE));
        assert_eq!(s.fields["connected"], 0);
        assert!(s.message.contains("unknown issuer"), "{}", s.message);
        // A new error is news; the same one is not written again.
        let last = Written {
            desired: d.clone(),
            transition: "t".into(),
            at: Instant::now(),
        };
        assert!(!due(&d, Some(&last), Duration::ZERO));
        never.hub_error = Some("connection refused".into());
        let newer = account_desired(&never, &a, None, None).unwrap();
        assert!(due(&newer, Some(&last), Duration::from_secs(10)));
        // Once welcomed, the usual rules apply (HubUnreachable only where it spoke last).
        never.hub_identity = "prod-agent".into();
        assert!(account_desired(&never, &a, None, None).is_none());
    }

    #[test]
    fn a_replica_that_lost_the_hub_says_the_hub_state_is_unknown() {
        let streaming =
            account_desired(&view(true), &account(ROLE_STREAMING), None, Some("t")).unwrap();
        assert_eq!(streaming.fields["hub"]["state"], "ACTIVE");
        let lost = account_desired(
            &view(false),
            &account(ROLE_STREAMING),
            Some(&streaming),
            Some("t"),
        )
        .unwrap();
        assert_eq!(lost.reason, REASON_HUB_UNREACHABLE);
        let hub = &lost.fields["hub"];
        assert_eq!(hub["state"], HUB_STATE_UNKNOWN, "{hub}");
        let reason = hub["stateReason"].as_str().unwrap();
        assert!(reason.contains("lost the hub at hub:9091"), "{reason}");
        assert!(reason.contains("connection refused"), "{reason}");
        // What it knows of its own watches stays.
        assert_eq!(hub["kindsWatched"], json!(["deployments.apps"]));
    }

    #[test]
    fn hub_unreachable_only_from_the_replica_that_spoke_last() {
        let a = account(ROLE_STREAMING);
        assert!(account_desired(&view(false), &a, None, None).is_none());
        let streamed = account_desired(&view(true), &a, None, None).unwrap();
        let d = account_desired(&view(false), &a, Some(&streamed), None).unwrap();
        assert_eq!((d.status, d.reason), (STATUS_FALSE, REASON_HUB_UNREACHABLE));
        assert!(d.message.contains("connection refused"), "{}", d.message);
        assert!(!d.authoritative, "written once, then left to others");
        assert!(account_desired(&view(false), &a, Some(&d), None).is_none());
    }

    #[test]
    fn scale_agent_counts_the_replicas_the_hub_names() {
        let connected = scale_agent_desired(&view(true), None).unwrap();
        assert_eq!(connected.fields["connected"], 2);
        assert_eq!(connected.reason, REASON_CONNECTED);
        // Disconnected without having said anything: silent.
        assert!(scale_agent_desired(&view(false), None).is_none());
        // Having said it was connected: takes itself out.
        let left = scale_agent_desired(&view(false), Some(&connected)).unwrap();
        assert_eq!(left.fields["connected"], 1);
        assert_eq!(left.fields["connectedReplicas"], json!(["pod-b"]));
        assert_eq!(left.status, STATUS_TRUE);
        let mut alone = connected.clone();
        alone.fields = json!({"connected": 1, "connectedReplicas": ["pod-a"]});
        let gone = scale_agent_desired(&view(false), Some(&alone)).unwrap();
        assert_eq!(
            (gone.status, gone.reason),
            (STATUS_FALSE, REASON_HUB_UNREACHABLE)
        );
        assert_eq!(gone.fields["connected"], 0);
        // A HubUnreachable is not repeated.
        assert!(scale_agent_desired(&view(false), Some(&gone)).is_none());
    }

    #[test]
    fn writes_are_rate_limited() {
        let d = account_desired(&view(true), &account(ROLE_STREAMING), None, None).unwrap();
        assert!(due(&d, None, Duration::from_secs(10)));
        let last = Written {
            desired: d.clone(),
            transition: "t".into(),
            at: Instant::now(),
        };
        assert!(!due(&d, Some(&last), Duration::from_secs(10)));
        let mut more = d.clone();
        more.fields["hub"]["objectsStreamed"] = json!(6);
        assert!(
            !due(&more, Some(&last), Duration::from_secs(10)),
            "counters wait"
        );
        assert!(due(&more, Some(&last), Duration::ZERO));
        let mut other = d.clone();
        other.reason = REASON_HUB_UNREACHABLE;
        assert!(
            due(&other, Some(&last), Duration::from_secs(10)),
            "conditions do not"
        );
        let body = patch_body("AgentAccount", &d, "2026-01-01T00:00:00Z");
        assert_eq!(body["status"]["conditions"][0]["type"], CONNECTED);
        assert_eq!(
            body["status"]["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(body["status"]["hub"]["objectsStreamed"], 5);
    }
}
