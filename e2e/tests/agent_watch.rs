//! The agent against a real control plane and a fake hub: snapshot then deltas, Secrets
//! that never leave the cluster, resume without LIST, 410 Gone falling back to a snapshot,
//! RBAC-limited ServiceAccounts, and config hot reload.
//!
//! The agent runs in-process (`scale_agent::start`) with a kubeconfig holding a real
//! ServiceAccount token; the fake hub is a plaintext tonic server on 127.0.0.1 that
//! welcomes, assigns every account STREAMING (with configurable resume points), acks every
//! message and records everything the agent sends.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{ConfigMap, PodTemplate, Secret};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use scale_agent::convert::LAST_APPLIED;
use scale_agent::{AgentHandle, Options};
use scale_agent_e2e::{
    ControlPlane,
    fixtures::{self, start_plaintext_hub},
    http, wait,
};
use scale_agent_proto::v1::{
    AccountAssignment, Ack, AgentMessage, GetOp, Heartbeat, HubMessage, Kind, KindSelector,
    ObjectEvent, ObjectRef, Operation, ResumePoint, Welcome,
    account_assignment::Role as AssignmentRole,
    agent_hub_server::{AgentHub, AgentHubServer},
    agent_message, hub_message, kind_status, object_event,
};
use serde_json::json;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{
    Request, Response, Status, Streaming,
    transport::{Certificate, Identity, ServerTlsConfig, server::TcpIncoming},
};

const WAIT: Duration = Duration::from_secs(60);

fn init_logs() {
    scale_agent_e2e::fixtures::init_logs("scale_agent=debug");
}

// ---------------------------------------------------------------------------------------
// Fake hub

#[derive(Default)]
struct HubState {
    messages: Mutex<Vec<AgentMessage>>,
    /// Given to every STREAMING assignment.
    resume_points: Mutex<Vec<ResumePoint>>,
    /// Also give the resume points learned from what earlier streams sent, as a real hub.
    learn_resume_points: AtomicBool,
    /// Role per account; STREAMING when absent.
    roles: Mutex<HashMap<String, (AssignmentRole, String)>>,
    /// While set, nothing is acknowledged (a slow hub); `release` acks what was received.
    acks_paused: AtomicBool,
    release: Notify,
    /// Ends the current stream with UNAVAILABLE.
    disconnect: Notify,
    sessions: AtomicUsize,
    /// DER of the client certificate of each stream (TLS only).
    client_certificates: Mutex<Vec<Vec<u8>>>,
    /// Welcome.heartbeat_period_seconds; 5 when 0.
    heartbeat_seconds: AtomicU32,
    /// Welcome.max_object_bytes; 1 MiB when 0.
    max_object_bytes: AtomicU64,
    /// After Welcome, send nothing at all (no acks, no heartbeats): a dead hub.
    silent: AtomicBool,
    /// Operations to send on the current stream when `operate` is notified.
    operations: Mutex<Vec<Operation>>,
    operate: Notify,
}

fn kind_key(kind: Option<&Kind>, namespace: &str) -> (String, String, String) {
    let kind = kind.cloned().unwrap_or_default();
    (kind.group, kind.plural, namespace.to_string())
}

impl HubState {
    fn messages(&self) -> Vec<AgentMessage> {
        self.messages.lock().map(|m| m.clone()).unwrap_or_default()
    }

    fn kinds(&self) -> Vec<agent_message::Kind> {
        self.messages().into_iter().filter_map(|m| m.kind).collect()
    }

    /// Object events of `account` for `plural`.
    fn objects(&self, account: &str, plural: &str) -> Vec<ObjectEvent> {
        self.kinds()
            .into_iter()
            .filter_map(|k| match k {
                agent_message::Kind::Object(o)
                    if o.account == account
                        && o.kind.as_ref().is_some_and(|k| k.plural == plural) =>
                {
                    Some(o)
                }
                _ => None,
            })
            .collect()
    }

    fn has_object(&self, account: &str, plural: &str, name: &str, ty: object_event::Type) -> bool {
        self.objects(account, plural)
            .iter()
            .any(|o| o.name == name && o.r#type == ty as i32)
    }

    fn snapshot_ends(&self, account: &str, plural: &str) -> usize {
        self.kinds()
            .iter()
            .filter(|k| {
                matches!(k, agent_message::Kind::SnapshotEnd(end)
                    if end.account == account && end.kind.as_ref().is_some_and(|k| k.plural == plural))
            })
            .count()
    }

    fn snapshot_begins(&self, account: &str, plural: &str) -> usize {
        self.kinds()
            .iter()
            .filter(|k| {
                matches!(k, agent_message::Kind::SnapshotBegin(begin)
                    if begin.account == account && begin.kind.as_ref().is_some_and(|k| k.plural == plural))
            })
            .count()
    }

    fn kind_status(
        &self,
        account: &str,
        plural: &str,
        state: kind_status::State,
    ) -> Option<String> {
        self.kind_statuses(account, plural, state)
            .into_iter()
            .next()
    }

    fn kind_statuses(&self, account: &str, plural: &str, state: kind_status::State) -> Vec<String> {
        self.kinds()
            .into_iter()
            .filter_map(|k| match k {
                agent_message::Kind::KindStatus(status)
                    if status.account == account
                        && status.state == state as i32
                        && status.kind.as_ref().is_some_and(|k| k.plural == plural) =>
                {
                    Some(status.message)
                }
                _ => None,
            })
            .collect()
    }

    /// Messages about `account` of any kind (status, snapshot, object, bookmark).
    fn streamed_about(&self, account: &str) -> usize {
        self.kinds()
            .iter()
            .filter(|k| match k {
                agent_message::Kind::KindStatus(m) => m.account == account,
                agent_message::Kind::SnapshotBegin(m) => m.account == account,
                agent_message::Kind::Object(m) => m.account == account,
                agent_message::Kind::Bookmark(m) => m.account == account,
                _ => false,
            })
            .count()
    }

    /// Where each watch of `account` would resume, from what the agent sent: SnapshotEnd,
    /// Bookmarks, and events outside snapshots.
    fn learned_resume_points(&self, account: &str) -> Vec<ResumePoint> {
        let mut points: BTreeMap<(String, String, String), ResumePoint> = BTreeMap::new();
        let mut in_snapshot = std::collections::BTreeSet::new();
        let mut set = |kind: Option<&Kind>, namespace: &str, rv: &str| {
            points.insert(
                kind_key(kind, namespace),
                ResumePoint {
                    kind: kind.cloned(),
                    resource_version: rv.to_string(),
                    watch_namespace: namespace.to_string(),
                },
            );
        };
        for message in self.kinds() {
            match message {
                agent_message::Kind::SnapshotBegin(m) if m.account == account => {
                    in_snapshot.insert(kind_key(m.kind.as_ref(), &m.watch_namespace));
                }
                agent_message::Kind::SnapshotEnd(m) if m.account == account => {
                    in_snapshot.remove(&kind_key(m.kind.as_ref(), &m.watch_namespace));
                    set(m.kind.as_ref(), &m.watch_namespace, &m.resource_version);
                }
                agent_message::Kind::Object(m)
                    if m.account == account
                        && !in_snapshot
                            .contains(&kind_key(m.kind.as_ref(), &m.watch_namespace)) =>
                {
                    set(m.kind.as_ref(), &m.watch_namespace, &m.resource_version);
                }
                agent_message::Kind::Bookmark(m) if m.account == account => {
                    set(m.kind.as_ref(), &m.watch_namespace, &m.resource_version);
                }
                _ => {}
            }
        }
        points.into_values().collect()
    }

    fn assignment(&self, account: &str) -> AccountAssignment {
        let (role, reason) = self
            .roles
            .lock()
            .ok()
            .and_then(|roles| roles.get(account).cloned())
            .unwrap_or((AssignmentRole::Streaming, String::new()));
        let mut resume_points = self
            .resume_points
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default();
        if self.learn_resume_points.load(Ordering::SeqCst) {
            resume_points.extend(self.learned_resume_points(account));
        }
        AccountAssignment {
            account: account.to_string(),
            role: role as i32,
            reason,
            resume_points: if role == AssignmentRole::Streaming {
                resume_points
            } else {
                Vec::new()
            },
        }
    }
}

#[derive(Clone)]
struct FakeHub {
    state: Arc<HubState>,
}

#[tonic::async_trait]
impl AgentHub for FakeHub {
    type SessionStream = ReceiverStream<Result<HubMessage, Status>>;

    async fn enroll(
        &self,
        _request: Request<scale_agent_proto::v1::EnrollRequest>,
    ) -> Result<Response<scale_agent_proto::v1::EnrollResponse>, Status> {
        Err(Status::unimplemented("the fake hub does not enrol agents"))
    }

    async fn session(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        if let Some(certs) = request.peer_certs()
            && let Some(first) = certs.first()
            && let Ok(mut seen) = self.state.client_certificates.lock()
        {
            seen.push(first.as_ref().to_vec());
        }
        self.state.sessions.fetch_add(1, Ordering::SeqCst);
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let state = self.state.clone();
        tokio::spawn(async move {
            let send = |kind: hub_message::Kind| {
                let tx = tx.clone();
                async move { tx.send(Ok(HubMessage { kind: Some(kind) })).await.is_ok() }
            };
            let mut received = 0;
            let heartbeat_seconds = match state.heartbeat_seconds.load(Ordering::SeqCst) {
                0 => 5,
                secs => secs,
            };
            let max_object_bytes = match state.max_object_bytes.load(Ordering::SeqCst) {
                0 => 1 << 20,
                bytes => bytes,
            };
            let silent = state.silent.load(Ordering::SeqCst);
            let period = Duration::from_secs(heartbeat_seconds.into());
            // Heartbeats start one period in, after Welcome.
            let mut heartbeat =
                tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            loop {
                tokio::select! {
                    message = inbound.message() => {
                        let Ok(Some(message)) = message else { break };
                        received = message.seq;
                        let reply = match &message.kind {
                            Some(agent_message::Kind::Hello(_)) => Some(hub_message::Kind::Welcome(Welcome {
                                identity: "fake-agent".into(),
                                heartbeat_period_seconds: heartbeat_seconds,
                                max_unacked: MAX_UNACKED,
                                max_object_bytes,
                                hub_version: "fake".into(),
                                tunnel_window_bytes: 0,
                                session_token: String::new(),
                                // Fields a newer hub adds (message and object limits, ...): a hub that does not send them.
                                ..Welcome::default()
                            })),
                            Some(agent_message::Kind::RegisterAccount(register)) => {
                                Some(hub_message::Kind::Assignment(state.assignment(&register.account)))
                            }
                            _ => None,
                        };
                        let hello = matches!(message.kind, Some(agent_message::Kind::Hello(_)));
                        if let Ok(mut messages) = state.messages.lock() {
                            messages.push(message);
                        }
                        if silent && !hello {
                            continue;
                        }
                        if let Some(reply) = reply && !send(reply).await {
                            break;
                        }
                        if !state.acks_paused.load(Ordering::SeqCst)
                            && !send(hub_message::Kind::Ack(Ack { seq: received })).await
                        {
                            break;
                        }
                    }
                    _ = state.release.notified() => {
                        if !send(hub_message::Kind::Ack(Ack { seq: received })).await {
                            break;
                        }
                    }
                    _ = state.operate.notified() => {
                        let operations = state
                            .operations
                            .lock()
                            .map(|mut ops| std::mem::take(&mut *ops))
                            .unwrap_or_default();
                        for operation in operations {
                            if !send(hub_message::Kind::Operation(operation)).await {
                                break;
                            }
                        }
                    }
                    _ = state.disconnect.notified() => {
                        let _ = tx.send(Err(Status::unavailable("the fake hub drops this stream"))).await;
                        break;
                    }
                    _ = heartbeat.tick(), if !silent => {
                        if !send(hub_message::Kind::Heartbeat(Heartbeat { sent_at_unix_millis: 0 })).await {
                            break;
                        }
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

const MAX_UNACKED: u32 = 16;

async fn start_hub(state: Arc<HubState>) -> anyhow::Result<SocketAddr> {
    start_hub_with(state, None).await
}

async fn start_hub_with(
    state: Arc<HubState>,
    tls: Option<ServerTlsConfig>,
) -> anyhow::Result<SocketAddr> {
    let incoming = TcpIncoming::bind("127.0.0.1:0".parse()?)?;
    let addr = incoming.local_addr()?;
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    tokio::spawn(
        builder
            .add_service(AgentHubServer::new(FakeHub { state }))
            .serve_with_incoming(incoming),
    );
    Ok(addr)
}

// ---------------------------------------------------------------------------------------
// Cluster and agent helpers

/// A ServiceAccount `agent` in `namespace` bound to a Role there with get/list/watch on
/// `resources` (`plural` for the core group, else `plural.group`); returns a kubeconfig file
/// with its token.
async fn namespaced_agent_identity(
    control_plane: &ControlPlane,
    admin: &Client,
    namespace: &str,
    resources: &[&str],
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    fixtures::service_account_identity(
        control_plane,
        admin,
        namespace,
        "agent",
        fixtures::Scope::Namespace,
        fixtures::read_rules(resources),
        dir.join("kubeconfig"),
    )
    .await
}

/// What most tests start from: the shared control plane, a fresh namespace `agent-<name>`,
/// a temporary directory and, in it, the kubeconfig of an agent identity that may get, list
/// and watch `resources` in the namespace (see [`namespaced_agent_identity`]).
struct Setup {
    control_plane: &'static ControlPlane,
    admin: Client,
    namespace: String,
    dir: PathBuf,
    kubeconfig: PathBuf,
}

async fn setup(name: &str, resources: &[&str]) -> anyhow::Result<Setup> {
    init_logs();
    let control_plane = ControlPlane::shared()?;
    let admin = control_plane.client().await?;
    let namespace = control_plane
        .namespace(&admin, &format!("agent-{name}"))
        .await?;
    let dir = temp_dir(name)?;
    let kubeconfig =
        namespaced_agent_identity(control_plane, &admin, &namespace, resources, &dir).await?;
    Ok(Setup {
        control_plane,
        admin,
        namespace,
        dir,
        kubeconfig,
    })
}

impl Setup {
    /// Writes the agent's config, `scale-agent.yaml` in the test's directory, for the hub at
    /// `hub` with the one account `account`: `kinds` in the namespace, as the identity.
    fn write_config(
        &self,
        hub: SocketAddr,
        account: &str,
        kinds: &[&str],
    ) -> anyhow::Result<PathBuf> {
        let config = self.dir.join("scale-agent.yaml");
        let accounts = json!([fixtures::account(
            account,
            &self.kubeconfig,
            &self.namespace,
            kinds
        )]);
        write_config(&config, hub, accounts)?;
        Ok(config)
    }
}

/// Creates the object `object` (JSON) through `api`.
async fn create<K>(api: &Api<K>, object: serde_json::Value) -> anyhow::Result<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    Ok(api
        .create(&PostParams::default(), &serde_json::from_value(object)?)
        .await?)
}

/// A resume point at `resource_version` for the core (`v1`) namespaced kind `kind`.
fn resume_point(kind: &str, plural: &str, resource_version: &str, namespace: &str) -> ResumePoint {
    ResumePoint {
        kind: Some(Kind {
            group: String::new(),
            version: "v1".into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced: true,
        }),
        resource_version: resource_version.into(),
        watch_namespace: namespace.into(),
    }
}

fn temp_dir(name: &str) -> anyhow::Result<PathBuf> {
    Ok(fixtures::temp_dir(&format!("scale-agent-e2e-{name}"))?)
}

/// The agent's config at `path`: the plaintext hub at `hub`, `accounts`, a 5 s heartbeat.
fn write_config(path: &Path, hub: SocketAddr, accounts: serde_json::Value) -> anyhow::Result<()> {
    fixtures::write_plaintext_agent_config(path, hub, accounts, 5)
}

async fn start_agent(config: &Path) -> anyhow::Result<AgentHandle> {
    fixtures::start_agent_replica(config, "e2e-0").await
}

/// [`wait::until_within`] for a check of what the fake hub has seen (no I/O): every 100 ms,
/// for [`WAIT`].
async fn eventually(what: &str, mut check: impl FnMut() -> bool) -> anyhow::Result<()> {
    let every = Duration::from_millis(100);
    wait::until_within(what, WAIT, every, || std::future::ready(Ok(check()))).await
}

/// GET `path` on the agent's admin port.
async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<http::Response> {
    Ok(http::get(addr, path).await?)
}

/// Polls the hub's objects of `account` (kind configmaps) every 100 ms, at most 100 times,
/// until they name `object`; returns the last listing.
async fn hub_lists(hub: SocketAddr, account: &str, object: &str) -> anyhow::Result<String> {
    let path = format!("/api/v1/accounts/{account}/objects?kind=configmaps");
    let needle = format!("\"{object}\"");
    let mut listed = String::new();
    for _ in 0..100 {
        listed = fixtures::hub_call("GET", hub, &path).send().await?.body;
        if listed.contains(&needle) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(listed)
}

fn account_name(prefix: &str) -> String {
    format!("{prefix}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

// ---------------------------------------------------------------------------------------
// Tests

#[path = "agent_watch/access.rs"]
mod access;
#[path = "agent_watch/config.rs"]
mod config;
#[path = "agent_watch/health.rs"]
mod health;
#[path = "agent_watch/real_hub.rs"]
mod real_hub;
#[path = "agent_watch/snapshot.rs"]
mod snapshot;
#[path = "agent_watch/stream.rs"]
mod stream;
