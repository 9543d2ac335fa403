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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_then_deltas_and_secret_data_never_leaves() -> anyhow::Result<()> {
    let s = setup("deltas", &["configmaps", "secrets"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    create(
        &configmaps,
        json!({ "metadata": { "name": "before" }, "data": { "colour": "blue" } }),
    )
    .await?;
    let marker = format!("marker-{:016x}", rand::random::<u64>());
    let secret_data = json!({ "password": marker });
    let last_applied =
        json!({ "apiVersion": "v1", "kind": "Secret", "stringData": secret_data }).to_string();
    create(
        &Api::<Secret>::namespaced(admin.clone(), namespace),
        json!({
            "metadata": {
                "name": "db",
                // Every annotation known to carry an applied manifest, each holding the
                // data (review F16): none may reach the hub.
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": last_applied,
                    "kapp.k14s.io/original": last_applied,
                    "kapp.k14s.io/original-diff": last_applied,
                    "objectset.rio.cattle.io/applied": last_applied,
                },
            },
            "stringData": secret_data,
        }),
    )
    .await?;

    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("deltas");
    let config = s.write_config(hub_addr, &account, &["ConfigMap", "secrets"])?;
    let agent = start_agent(&config).await?;

    eventually("the ConfigMap snapshot", || {
        hub.snapshot_ends(&account, "configmaps") >= 1
            && hub.has_object(
                &account,
                "configmaps",
                "before",
                object_event::Type::Applied,
            )
    })
    .await?;
    eventually("the Secret's metadata", || {
        hub.has_object(&account, "secrets", "db", object_event::Type::Applied)
    })
    .await?;
    let before = hub
        .objects(&account, "configmaps")
        .into_iter()
        .find(|o| o.name == "before")
        .ok_or_else(|| anyhow::anyhow!("no event for 'before'"))?;
    let body: serde_json::Value = serde_json::from_slice(&before.object_json)?;
    assert_eq!(body["data"]["colour"], "blue");
    assert_eq!(body["kind"], "ConfigMap");
    assert!(
        body["metadata"]["managedFields"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(&before.watch_namespace, namespace);
    assert!(!before.uid.is_empty() && !before.resource_version.is_empty());

    // Deltas: create, update, delete.
    create(&configmaps, json!({ "metadata": { "name": "after" } })).await?;
    configmaps
        .patch(
            "before",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "colour": "green" } })),
        )
        .await?;
    configmaps.delete("after", &DeleteParams::default()).await?;
    eventually("create, update and delete deltas", || {
        let objects = hub.objects(&account, "configmaps");
        let updated = objects.iter().any(|o| {
            o.name == "before"
                && serde_json::from_slice::<serde_json::Value>(&o.object_json)
                    .is_ok_and(|v| v["data"]["colour"] == "green")
        });
        updated
            && hub.has_object(&account, "configmaps", "after", object_event::Type::Applied)
            && hub.has_object(&account, "configmaps", "after", object_event::Type::Deleted)
    })
    .await?;
    // One snapshot only: deltas are not relists.
    assert_eq!(hub.snapshot_ends(&account, "configmaps"), 1);
    assert_eq!(agent.metrics().lists_total(&account, "configmaps"), 1);

    // The Secret's data, in any form, is in nothing the agent sent.
    let secret_event = hub
        .objects(&account, "secrets")
        .into_iter()
        .find(|o| o.name == "db")
        .ok_or_else(|| anyhow::anyhow!("no event for the Secret"))?;
    let secret_body: serde_json::Value = serde_json::from_slice(&secret_event.object_json)?;
    assert_eq!(secret_body["kind"], "Secret");
    assert!(secret_body.get("data").is_none(), "{secret_body}");
    let annotations = secret_body["metadata"]["annotations"].to_string();
    for manifest in ["last-applied-configuration", "kapp.k14s.io", "cattle.io"] {
        assert!(!annotations.contains(manifest), "{annotations}");
    }
    // Every message as text: payloads decoded, everything else by its Debug form.
    let sent_text: String = hub
        .messages()
        .iter()
        .map(|m| match &m.kind {
            Some(agent_message::Kind::Object(o)) => {
                format!("{o:?} {}", String::from_utf8_lossy(&o.object_json))
            }
            Some(agent_message::Kind::RegisterAccount(r)) => {
                format!("{r:?} {}", String::from_utf8_lossy(&r.properties_json))
            }
            other => format!("{other:?}"),
        })
        .collect();
    use scale_agent_e2e::fixtures::base64 as b64;
    for needle in [marker.clone(), b64(marker.as_bytes())] {
        assert!(
            !sent_text.contains(&needle),
            "the Secret's data ({needle}) reached the hub"
        );
    }
    assert!(!sent_text.contains(
        "last-applied-configuration\":\"{\\\"apiVersion\\\":\\\"v1\\\",\\\"kind\\\":\\\"Secret"
    ));

    // Admin port: ready, metrics and the accounts view.
    eventually("readiness", || agent.view().synced()).await?;
    let ready = http_get(agent.admin_addr(), "/readyz").await?;
    assert_eq!(ready.status, 200, "{ready:?}");
    let metrics = http_get(agent.admin_addr(), "/metrics").await?.body;
    assert!(
        metrics.contains(&format!(
            "scale_agent_agent_lists_total{{account=\"{account}\",kind=\"configmaps\"}} 1"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("scale_agent_agent_bytes_sent_total"),
        "{metrics}"
    );
    let accounts = http_get(agent.admin_addr(), "/accounts").await?.body;
    let view: serde_json::Value = serde_json::from_str(&accounts)?;
    let view_account = &view["accounts"][0];
    assert_eq!(view_account["name"], account);
    assert_eq!(view_account["role"], "streaming");
    let kinds = view_account["kinds"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        kinds.iter().any(|k| k["plural"] == "configmaps"
            && k["state"] == "watching"
            && k["watchNamespace"] == namespace.as_str()
            && k["objectsSent"].as_u64() >= Some(4)),
        "{view}"
    );

    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// Base64 as the apiserver stores Secret data, without a dependency for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_point_means_no_list_and_changes_still_arrive() -> anyhow::Result<()> {
    let s = setup("resume", &["configmaps"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    create(&configmaps, json!({ "metadata": { "name": "old" } })).await?;
    let list = configmaps.list(&ListParams::default()).await?;
    let resume_from = list.metadata.resource_version.unwrap_or_default();
    assert!(!resume_from.is_empty());

    let hub = Arc::new(HubState::default());
    if let Ok(mut points) = hub.resume_points.lock() {
        points.push(resume_point(
            "ConfigMap",
            "configmaps",
            &resume_from,
            namespace,
        ));
        // A watch the account no longer has (its kinds changed): the agent says STOPPED.
        points.push(resume_point("Secret", "secrets", &resume_from, namespace));
    }
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("resume");
    let config = s.write_config(hub_addr, &account, &["configmaps"])?;
    let agent = start_agent(&config).await?;
    eventually("the resumed watch", || {
        hub.kind_status(&account, "configmaps", kind_status::State::Watching)
            .is_some()
    })
    .await?;
    create(&configmaps, json!({ "metadata": { "name": "new" } })).await?;
    eventually("the change made after the resume point", || {
        hub.has_object(&account, "configmaps", "new", object_event::Type::Applied)
    })
    .await?;
    assert_eq!(
        agent.metrics().lists_total(&account, "configmaps"),
        0,
        "resumed kinds must not LIST"
    );
    assert_eq!(
        agent.metrics().watch_resumes_total(&account, "configmaps"),
        1
    );
    assert_eq!(hub.snapshot_begins(&account, "configmaps"), 0);
    assert!(
        hub.kind_status(&account, "secrets", kind_status::State::Stopped)
            .is_some(),
        "a resume point for a kind no longer watched gets STOPPED"
    );
    assert_eq!(agent.metrics().lists_total(&account, "secrets"), 0);
    assert!(
        !hub.has_object(&account, "configmaps", "old", object_event::Type::Applied),
        "'old' predates the resume point and must not be resent"
    );
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_resume_point_gets_410_and_falls_back_to_a_snapshot() -> anyhow::Result<()> {
    let s = setup("gone", &["podtemplates"]).await?;
    let Setup {
        control_plane,
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let templates = Api::<PodTemplate>::namespaced(admin.clone(), namespace);
    let created = create(
        &templates,
        json!({
            "metadata": { "name": "web" },
            "template": { "spec": { "containers": [{ "name": "web", "image": "nginx" }] } },
        }),
    )
    .await?;
    let old_version = created.metadata.resource_version.unwrap_or_default();
    for revision in 0..3 {
        templates
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "metadata": { "labels": { "revision": revision.to_string() } } }),
                ),
            )
            .await?;
    }
    control_plane.compact_etcd().await?;

    let hub = Arc::new(HubState::default());
    if let Ok(mut points) = hub.resume_points.lock() {
        points.push(resume_point(
            "PodTemplate",
            "podtemplates",
            &old_version,
            namespace,
        ));
    }
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("gone");
    let config = s.write_config(hub_addr, &account, &["PodTemplate"])?;
    let agent = start_agent(&config).await?;
    eventually("a snapshot after 410 Gone", || {
        hub.snapshot_ends(&account, "podtemplates") >= 1
    })
    .await?;
    assert!(hub.has_object(&account, "podtemplates", "web", object_event::Type::Applied));
    assert_eq!(
        agent
            .metrics()
            .watch_resumes_total(&account, "podtemplates"),
        1
    );
    assert!(agent.metrics().watch_gone_total(&account, "podtemplates") >= 1);
    assert_eq!(agent.metrics().lists_total(&account, "podtemplates"), 1);
    let web = hub
        .objects(&account, "podtemplates")
        .into_iter()
        .rfind(|o| o.name == "web")
        .ok_or_else(|| anyhow::anyhow!("no event for 'web'"))?;
    let body: serde_json::Value = serde_json::from_slice(&web.object_json)?;
    assert_eq!(body["metadata"]["labels"]["revision"], "2");
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// Secrets have a WATCH of their own (decoded without the last-applied annotation): it
/// resumes from the hub's resume point without a LIST, and after an event that carried
/// Secret data (the watch then closes its connection and re-opens from that event) later
/// changes still arrive, still without a LIST, and nothing sent holds the data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_resume_and_reopen_after_data_without_listing() -> anyhow::Result<()> {
    let s = setup("secret-watch", &["secrets"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let secrets = Api::<Secret>::namespaced(admin.clone(), namespace);
    create(
        &secrets,
        json!({ "metadata": { "name": "web" }, "stringData": { "password": "first" } }),
    )
    .await?;
    let resume_from = secrets
        .list_metadata(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();

    let hub = Arc::new(HubState::default());
    if let Ok(mut points) = hub.resume_points.lock() {
        points.push(resume_point("Secret", "secrets", &resume_from, namespace));
    }
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("secret-watch");
    let config = s.write_config(hub_addr, &account, &["secrets"])?;
    let agent = start_agent(&config).await?;
    eventually("the resumed watch", || {
        hub.kind_status(&account, "secrets", kind_status::State::Watching)
            .is_some()
    })
    .await?;
    let labels_of = |name: &str| {
        hub.objects(&account, "secrets")
            .into_iter()
            .rfind(|o| o.name == name)
            .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.object_json).ok())
            .map(|body| body["metadata"]["labels"].clone())
    };

    // What client-side `kubectl apply` writes: the data, in clear, in the annotation.
    let marker = format!("applied-marker-{:032x}", rand::random::<u128>());
    let label = |key: &str| Patch::Merge(json!({ "metadata": { "labels": { key: "yes" } } }));
    secrets
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": {
                "labels": { "applied": "yes" },
                "annotations": { LAST_APPLIED: json!({ "stringData": { "password": marker } }).to_string() },
            } })),
        )
        .await?;
    eventually("the applied Secret", || {
        labels_of("web").is_some_and(|l| l["applied"] == "yes")
    })
    .await?;
    // The watch re-opened from that event: later changes arrive.
    secrets
        .patch("web", &PatchParams::default(), &label("after"))
        .await?;
    create(&secrets, json!({ "metadata": { "name": "later" } })).await?;
    eventually("the changes after the applied Secret", || {
        labels_of("web").is_some_and(|l| l["after"] == "yes")
            && hub.has_object(&account, "secrets", "later", object_event::Type::Applied)
    })
    .await?;
    let metrics = agent.metrics();
    assert_eq!(metrics.watch_resumes_total(&account, "secrets"), 1);
    assert_eq!(metrics.lists_total(&account, "secrets"), 0, "no LIST");
    assert_eq!(hub.snapshot_begins(&account, "secrets"), 0);
    assert!(
        !hub.has_object(&account, "secrets", "web", object_event::Type::Deleted),
        "re-opening must not make objects look deleted"
    );
    let events = hub.objects(&account, "secrets");
    assert!(events.len() >= 3, "{events:?}");
    for event in events {
        let body = String::from_utf8_lossy(&event.object_json);
        assert!(!body.contains(&marker), "{body}");
        assert!(!body.contains(LAST_APPLIED), "{body}");
    }
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_role_streams_its_namespace_reports_forbidden_and_reloads() -> anyhow::Result<()>
{
    let s = setup("rbac", &["configmaps"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        kubeconfig,
        ..
    } = &s;
    create(
        &Api::<ConfigMap>::namespaced(admin.clone(), namespace),
        json!({ "metadata": { "name": "visible" } }),
    )
    .await?;

    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let scoped = account_name("scoped");
    let wide = account_name("wide");
    let scoped_account = fixtures::account(&scoped, kubeconfig, namespace, &["ConfigMap"]);
    let wide_account = json!({
        "name": wide,
        "kubeconfigFile": kubeconfig.display().to_string(),
        "kinds": ["ConfigMap", "Namespace"],
    });
    let config = dir.join("scale-agent.yaml");
    write_config(&config, hub_addr, json!([scoped_account, wide_account]))?;
    let agent = start_agent(&config).await?;

    eventually("the namespace's snapshot", || {
        hub.has_object(
            &scoped,
            "configmaps",
            "visible",
            object_event::Type::Applied,
        ) && hub.snapshot_ends(&scoped, "configmaps") == 1
    })
    .await?;
    eventually("FORBIDDEN for the cluster-wide kinds", || {
        hub.kind_status(&wide, "configmaps", kind_status::State::Forbidden)
            .is_some()
            && hub
                .kind_status(&wide, "namespaces", kind_status::State::Forbidden)
                .is_some()
    })
    .await?;
    let message = hub
        .kind_status(&wide, "namespaces", kind_status::State::Forbidden)
        .unwrap_or_default();
    assert!(
        message.contains(&format!("system:serviceaccount:{namespace}:agent")),
        "the API server's message names the ServiceAccount: {message}"
    );
    let view = agent.view();
    let forbidden = view
        .kind(&wide, "namespaces", "")
        .map(|k| format!("{:?}", k.state))
        .unwrap_or_default();
    assert_eq!(forbidden, "Forbidden");
    eventually("synced with forbidden kinds", || agent.view().synced()).await?;

    // Forbidden kinds are not retried in a hot loop.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(agent.metrics().lists_total(&wide, "configmaps"), 1);
    assert_eq!(agent.metrics().lists_total(&wide, "namespaces"), 1);

    // An invalid file is refused and the running config stays.
    std::fs::write(&config, "kubernetes: [")?;
    eventually("the invalid config to be noticed", || {
        agent.metrics().config_errors.get() >= 1
    })
    .await?;
    assert!(agent.view().account(&wide).is_some());
    assert!(agent.view().hub_connected);

    // Hot reload: removing an account unregisters it, adding one registers it.
    let added = account_name("added");
    let added_account = fixtures::account(&added, kubeconfig, namespace, &["configmaps"]);
    write_config(&config, hub_addr, json!([scoped_account, added_account]))?;
    eventually("UnregisterAccount for the removed account", || {
        hub.kinds()
            .iter()
            .any(|k| matches!(k, agent_message::Kind::UnregisterAccount(u) if u.account == wide))
    })
    .await?;
    eventually("the added account's snapshot", || {
        hub.has_object(&added, "configmaps", "visible", object_event::Type::Applied)
    })
    .await?;
    assert!(agent.view().account(&wide).is_none());
    // The unchanged account kept streaming without a relist.
    assert_eq!(agent.metrics().lists_total(&scoped, "configmaps"), 1);

    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_stream_reconnects_and_resumes_without_relisting() -> anyhow::Result<()> {
    let s = setup("reconnect", &["configmaps"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    create(
        &configmaps,
        json!({ "metadata": { "name": "a" }, "data": { "v": "1" } }),
    )
    .await?;

    let hub = Arc::new(HubState::default());
    hub.learn_resume_points.store(true, Ordering::SeqCst);
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("reconnect");
    let config = s.write_config(hub_addr, &account, &["configmaps"])?;
    let agent = start_agent(&config).await?;
    eventually("the first snapshot", || {
        hub.snapshot_ends(&account, "configmaps") == 1
    })
    .await?;

    // The hub drops the stream; a change made meanwhile must still arrive, from a watch
    // resumed at the hub's resume point, without a second LIST.
    hub.disconnect.notify_one();
    configmaps
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "v": "2" } })),
        )
        .await?;
    eventually("a second stream", || {
        hub.sessions.load(Ordering::SeqCst) >= 2
    })
    .await?;
    eventually("the change made while disconnected", || {
        hub.objects(&account, "configmaps").iter().any(|o| {
            o.name == "a"
                && serde_json::from_slice::<serde_json::Value>(&o.object_json)
                    .is_ok_and(|v| v["data"]["v"] == "2")
        })
    })
    .await?;
    create(&configmaps, json!({ "metadata": { "name": "b" } })).await?;
    eventually("a change after the reconnect", || {
        hub.has_object(&account, "configmaps", "b", object_event::Type::Applied)
    })
    .await?;
    let metrics = agent.metrics();
    assert_eq!(metrics.lists_total(&account, "configmaps"), 1);
    assert_eq!(metrics.watch_resumes_total(&account, "configmaps"), 1);
    assert_eq!(hub.snapshot_begins(&account, "configmaps"), 1);
    assert!(metrics.reconnects.get() >= 1);
    // Sequence numbers restart at 1 on every stream.
    let hellos: Vec<u64> = hub
        .messages()
        .iter()
        .filter(|m| matches!(m.kind, Some(agent_message::Kind::Hello(_))))
        .map(|m| m.seq)
        .collect();
    assert_eq!(hellos, [1, 1]);
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_that_does_not_ack_stops_the_watches_at_max_unacked() -> anyhow::Result<()> {
    let s = setup("flow", &["configmaps"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    let count = 40;
    for i in 0..count {
        create(
            &configmaps,
            json!({ "metadata": { "name": format!("cm-{i}") } }),
        )
        .await?;
    }
    let hub = Arc::new(HubState::default());
    hub.acks_paused.store(true, Ordering::SeqCst);
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("flow");
    let config = s.write_config(hub_addr, &account, &["configmaps"])?;
    let agent = start_agent(&config).await?;
    let non_heartbeats = || {
        hub.messages()
            .iter()
            .filter(|m| !matches!(m.kind, Some(agent_message::Kind::Heartbeat(_))))
            .count()
    };
    eventually("the window to fill", || {
        non_heartbeats() >= MAX_UNACKED as usize
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let summary: Vec<String> = hub
        .messages()
        .iter()
        .map(|m| {
            let kind = format!("{:?}", m.kind);
            format!("{}:{}", m.seq, kind.chars().take(40).collect::<String>())
        })
        .collect();
    assert!(
        non_heartbeats() <= MAX_UNACKED as usize,
        "{} messages sent with {MAX_UNACKED} allowed unacknowledged: {summary:#?}",
        non_heartbeats()
    );
    assert_eq!(hub.snapshot_ends(&account, "configmaps"), 0);

    hub.acks_paused.store(false, Ordering::SeqCst);
    hub.release.notify_one();
    eventually("the whole snapshot once acks flow", || {
        hub.snapshot_ends(&account, "configmaps") == 1
    })
    .await?;
    let objects = hub.objects(&account, "configmaps").len();
    assert_eq!(objects, count, "every ConfigMap, once");
    // Sequence numbers have no gaps.
    let seqs: Vec<u64> = hub.messages().iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_and_standby_accounts_are_not_streamed() -> anyhow::Result<()> {
    let s = setup("roles", &["configmaps"]).await?;
    let Setup {
        control_plane,
        namespace,
        dir,
        kubeconfig,
        ..
    } = &s;
    let hub = Arc::new(HubState::default());
    let rejected = account_name("rejected");
    let standby = account_name("standby");
    if let Ok(mut roles) = hub.roles.lock() {
        roles.insert(
            rejected.clone(),
            (AssignmentRole::Rejected, "bound to another cluster".into()),
        );
        roles.insert(standby.clone(), (AssignmentRole::Standby, String::new()));
    }
    let hub_addr = start_hub(hub.clone()).await?;
    let config = dir.join("scale-agent.yaml");
    let watching_configmaps =
        |name: &str| fixtures::account(name, kubeconfig, namespace, &["configmaps"]);
    write_config(
        &config,
        hub_addr,
        json!([
            watching_configmaps(&rejected),
            watching_configmaps(&standby)
        ]),
    )?;
    let agent = start_agent(&config).await?;
    eventually("both assignments", || {
        let view = agent.view();
        view.account(&rejected)
            .is_some_and(|a| a.role == "rejected")
            && view.account(&standby).is_some_and(|a| a.role == "standby")
    })
    .await?;
    let view = agent.view();
    let register = hub.kinds().into_iter().find_map(|k| match k {
        agent_message::Kind::RegisterAccount(r) if r.account == rejected => Some(r),
        _ => None,
    });
    let register = register.ok_or_else(|| anyhow::anyhow!("no RegisterAccount"))?;
    let cluster = register.cluster.unwrap_or_default();
    assert_eq!(cluster.api_server_host, control_plane.server());
    assert_eq!(cluster.ca_fingerprint.len(), 64);
    assert_eq!(
        cluster.kubernetes_version,
        scale_agent_e2e::KUBERNETES_VERSION
    );
    assert_eq!(register.namespaces, [namespace.as_str()]);
    assert_eq!(
        view.account(&rejected)
            .and_then(|a| a.rejection_reason.clone())
            .as_deref(),
        Some("bound to another cluster")
    );
    assert!(
        view.ready() && view.synced(),
        "rejected and standby accounts do not block readiness"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(hub.streamed_about(&rejected), 0);
    assert_eq!(hub.streamed_about(&standby), 0);
    assert_eq!(agent.metrics().lists_total(&standby, "configmaps"), 0);
    let metrics = agent.metrics().encode();
    assert!(
        metrics.contains(&format!(
            "scale_agent_agent_account_rejected{{account=\"{rejected}\"}} 1"
        )),
        "{metrics}"
    );
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// A hub that does not announce the "account-unavailable" capability (an older hub, which
/// would end the stream on a message it cannot read) is never sent AccountUnavailable: an
/// account whose kubeconfig cannot be loaded stays in the agent's view only, and the stream,
/// with the good account on it, goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_hub_is_not_sent_account_unavailable() -> anyhow::Result<()> {
    let s = setup("older-hub", &["configmaps"]).await?;
    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let (good, broken) = (account_name("good"), account_name("broken"));
    let config = s.dir.join("scale-agent.yaml");
    write_config(
        &config,
        hub_addr,
        json!([
            fixtures::account(&good, &s.kubeconfig, &s.namespace, &["configmaps"]),
            fixtures::account(
                &broken,
                &s.dir.join("no-such-kubeconfig"),
                &s.namespace,
                &["configmaps"]
            ),
        ]),
    )?;
    let agent = start_agent(&config).await?;
    eventually("the good account streaming, the broken one failing", || {
        let view = agent.view();
        view.account(&good).is_some_and(|a| a.role == "streaming")
            && view.account(&broken).is_some_and(|a| a.error.is_some())
    })
    .await?;
    // A retry or two of the broken account.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kinds = hub.kinds();
    assert!(
        !kinds
            .iter()
            .any(|k| matches!(k, agent_message::Kind::AccountUnavailable(_))),
        "AccountUnavailable sent to a hub that does not read it"
    );
    let hellos = kinds
        .iter()
        .filter(|k| matches!(k, agent_message::Kind::Hello(_)))
        .count();
    assert_eq!(hellos, 1, "the stream was not replaced");
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&s.dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_certificates_reloaded_on_reconnect() -> anyhow::Result<()> {
    init_logs();
    let dir = temp_dir("mtls")?;
    let ca = scale_agent_e2e::pki::CertificateAuthority::new("hub-ca")?;
    let serving = ca.serving("hub", &["hub.test"])?;
    let write = |name: &str, text: &str| -> anyhow::Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        Ok(path)
    };
    let ca_path = write("ca.pem", &ca.cert_pem)?;
    let first = ca.client("agent-one", &[])?;
    let cert_path = write("tls.crt", &first.cert_pem)?;
    let key_path = write("tls.key", &first.key_pem)?;

    let hub = Arc::new(HubState::default());
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&serving.cert_pem, &serving.key_pem))
        .client_ca_root(Certificate::from_pem(&ca.cert_pem));
    let hub_addr = start_hub_with(hub.clone(), Some(tls)).await?;
    let config = dir.join("scale-agent.yaml");
    std::fs::write(
        &config,
        serde_json::to_string(&json!({
            "clouddriver": {
                "grpc": format!("localhost:{}", hub_addr.port()),
                "backoff": { "baseDelay": "200ms", "maxDelay": "2s" },
            },
        }))?,
    )?;
    let mut options = Options::for_config(&config);
    options.admin_addr = Some("127.0.0.1:0".parse()?);
    options.hub_ca = Some(ca_path);
    options.tls_cert = Some(cert_path.clone());
    options.tls_key = Some(key_path.clone());
    options.hub_server_name = Some("hub.test".into());
    let agent = scale_agent::start(options).await?;
    eventually("a TLS stream", || agent.view().hub_connected).await?;
    assert_eq!(agent.view().hub_identity, "fake-agent");

    // Rotate the client certificate on disk, then drop the stream: the next stream
    // presents the new certificate.
    let second = ca.client("agent-two", &[])?;
    std::fs::write(&cert_path, &second.cert_pem)?;
    std::fs::write(&key_path, &second.key_pem)?;
    hub.disconnect.notify_one();
    eventually("a second TLS stream", || {
        hub.client_certificates.lock().map(|c| c.len()).unwrap_or(0) >= 2
    })
    .await?;
    let seen = hub
        .client_certificates
        .lock()
        .map(|c| c.clone())
        .unwrap_or_default();
    assert_ne!(
        seen[0], seen[1],
        "the rotated certificate was not picked up"
    );
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A hub outage must not turn every agent in the fleet NotReady: `/readyz` says whether the
/// agent itself works (its account's credentials load and its API server answers), and the
/// hub connection shows on `/accounts` and in `scale_agent_agent_hub_connected`, before the
/// first connection and after the hub went away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_does_not_depend_on_the_hub() -> anyhow::Result<()> {
    let s = setup("readyz-no-hub", &["configmaps"]).await?;
    // Nothing listens here.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let account = account_name("no-hub");
    let config = s.write_config(nobody, &account, &["configmaps"])?;
    let agent = start_agent(&config).await?;
    eventually("the account's credentials loaded", || {
        agent.view().account(&account).is_some_and(|a| a.prepared)
    })
    .await?;
    let ready = http_get(agent.admin_addr(), "/readyz").await?;
    assert_eq!(ready.status, 200, "never reached the hub: {ready:?}");
    assert!(ready.body.contains("not connected to the hub"), "{ready:?}");
    let view = http_get(agent.admin_addr(), "/accounts")
        .await?
        .json_or_null();
    assert_eq!(view["hubConnected"], false, "{view}");
    assert_eq!(view["synced"], false, "{view}");
    assert!(
        agent
            .metrics_text()
            .contains("scale_agent_agent_hub_connected 0"),
        "{}",
        agent.metrics_text()
    );

    // The hub appears: synced, still ready.
    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    s.write_config(hub_addr, &account, &["configmaps"])?;
    eventually("synced with the hub", || agent.view().synced()).await?;
    assert_eq!(http_get(agent.admin_addr(), "/readyz").await?.body, "ready");
    assert!(
        agent
            .metrics_text()
            .contains("scale_agent_agent_hub_connected 1")
    );

    // The hub goes away (the config points elsewhere): disconnected, still ready.
    s.write_config(nobody, &account, &["configmaps"])?;
    eventually("disconnected", || !agent.view().hub_connected).await?;
    let ready = http_get(agent.admin_addr(), "/readyz").await?;
    assert_eq!(ready.status, 200, "the hub went away: {ready:?}");
    assert!(!agent.view().synced());

    // What does make it unready: an account whose credentials cannot load.
    let broken = s.dir.join("broken.yaml");
    write_config(
        &broken,
        nobody,
        json!([fixtures::account(
            &account,
            &s.dir.join("no-such-kubeconfig"),
            &s.namespace,
            &["configmaps"]
        )]),
    )?;
    std::fs::rename(&broken, &config)?;
    eventually("the broken account's error", || {
        agent
            .view()
            .account(&account)
            .is_some_and(|a| !a.prepared && a.error.is_some())
    })
    .await?;
    let ready = http_get(agent.admin_addr(), "/readyz").await?;
    assert_eq!(ready.status, 503, "{ready:?}");
    assert!(ready.body.contains(&account), "{ready:?}");
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&s.dir);
    Ok(())
}

/// One unreachable target cluster must not make an agent serving many accounts NotReady:
/// with one account's API server unreachable and another's working, `/readyz` answers 200
/// naming the failing account, the working one streams to the hub, and the failing one is
/// reported on `/accounts` (its error) and in `scale_agent_agent_account_ready`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_while_one_account_of_two_works() -> anyhow::Result<()> {
    let s = setup("readyz-one-of-two", &["configmaps"]).await?;
    // The same identity, but a server where nothing listens.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let unreachable = s.dir.join("unreachable-kubeconfig");
    let text = std::fs::read_to_string(&s.kubeconfig)?;
    let rewritten: String = text
        .lines()
        .map(|line| match line.split_once("server:") {
            Some((indent, _)) => format!("{indent}server: https://{nobody}"),
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_ne!(
        rewritten,
        text,
        "no server line in {}",
        s.kubeconfig.display()
    );
    std::fs::write(&unreachable, rewritten)?;

    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let good = account_name("works");
    let bad = account_name("unreachable");
    let config = s.dir.join("scale-agent.yaml");
    write_config(
        &config,
        hub_addr,
        json!([
            fixtures::account(&good, &s.kubeconfig, &s.namespace, &["configmaps"]),
            fixtures::account(&bad, &unreachable, &s.namespace, &["configmaps"]),
        ]),
    )?;
    let agent = start_agent(&config).await?;
    eventually("the working account streaming, the other failing", || {
        let view = agent.view();
        view.account(&good)
            .is_some_and(|a| a.role == "streaming" && a.kinds_started)
            && view.account(&bad).is_some_and(|a| a.failing())
    })
    .await?;

    let ready = http_get(agent.admin_addr(), "/readyz").await?;
    assert_eq!(ready.status, 200, "one account works: {ready:?}");
    assert!(
        ready.body.contains(&bad),
        "the failing account named: {ready:?}"
    );
    assert!(!ready.body.contains(&good), "{ready:?}");

    let view = http_get(agent.admin_addr(), "/accounts")
        .await?
        .json_or_null();
    let accounts = view["accounts"].as_array().cloned().unwrap_or_default();
    let bad_view = accounts
        .iter()
        .find(|a| a["name"] == bad.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(bad_view["prepared"], false, "{view}");
    assert_eq!(bad_view["role"], "pending", "{view}");
    assert!(
        bad_view["error"]
            .as_str()
            .is_some_and(|e| e.contains(&nobody.port().to_string())),
        "the error names the unreachable server: {view}"
    );
    let good_view = accounts
        .iter()
        .find(|a| a["name"] == good.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(good_view["prepared"], true, "{view}");
    assert_eq!(good_view["role"], "streaming", "{view}");

    let metrics = http_get(agent.admin_addr(), "/metrics").await?.body;
    assert!(
        metrics.contains(&format!(
            "scale_agent_agent_account_ready{{account=\"{bad}\"}} 0"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "scale_agent_agent_account_ready{{account=\"{good}\"}} 1"
        )),
        "{metrics}"
    );
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&s.dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_hub_is_dropped_after_two_heartbeat_periods() -> anyhow::Result<()> {
    init_logs();
    let dir = temp_dir("silent")?;
    let hub = Arc::new(HubState::default());
    hub.heartbeat_seconds.store(1, Ordering::SeqCst);
    hub.silent.store(true, Ordering::SeqCst);
    let hub_addr = start_hub(hub.clone()).await?;
    let config = dir.join("scale-agent.yaml");
    write_config(&config, hub_addr, json!([]))?;
    let started = Instant::now();
    let agent = start_agent(&config).await?;
    eventually("a reconnect after the hub went silent", || {
        hub.sessions.load(Ordering::SeqCst) >= 2
    })
    .await?;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "dropped before two periods: {:?}",
        started.elapsed()
    );
    assert!(agent.metrics().reconnects.get() >= 1);
    // The agent kept heartbeating while it waited.
    assert!(
        hub.kinds()
            .iter()
            .any(|k| matches!(k, agent_message::Kind::Heartbeat(_)))
    );
    let hello = hub.kinds().into_iter().find_map(|k| match k {
        agent_message::Kind::Hello(hello) => Some(hello),
        _ => None,
    });
    let hello = hello.ok_or_else(|| anyhow::anyhow!("no Hello"))?;
    assert_eq!(hello.replica, "e2e-0");
    // It asked for its keepAliveHeartbeatSeconds (5), and used the 1 s the hub granted.
    assert_eq!(hello.heartbeat_period_seconds, 5);
    assert_eq!(agent.view().heartbeat_period_seconds, 1);
    assert!(!hello.agent_version.is_empty());
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_objects_are_sent_truncated() -> anyhow::Result<()> {
    let s = setup("big", &["configmaps"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    create(
        &configmaps,
        json!({ "metadata": { "name": "big" }, "data": { "blob": "x".repeat(20_000) } }),
    )
    .await?;
    create(&configmaps, json!({ "metadata": { "name": "small" } })).await?;
    let hub = Arc::new(HubState::default());
    hub.max_object_bytes.store(10_000, Ordering::SeqCst);
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("big");
    let config = s.write_config(hub_addr, &account, &["configmaps"])?;
    let agent = start_agent(&config).await?;
    eventually("the snapshot", || {
        hub.snapshot_ends(&account, "configmaps") == 1
    })
    .await?;
    let objects = hub.objects(&account, "configmaps");
    let big = objects.iter().find(|o| o.name == "big");
    let big = big.ok_or_else(|| anyhow::anyhow!("no event for 'big'"))?;
    assert!(big.truncated);
    assert!(big.object_json.is_empty());
    assert!(!big.uid.is_empty() && !big.resource_version.is_empty());
    let small = objects.iter().find(|o| o.name == "small");
    assert!(small.is_some_and(|o| !o.truncated && !o.object_json.is_empty()));
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// An operation whose absolute deadline has already passed by the agent's clock (a hub
/// whose clock is a minute behind) but whose relative timeout leaves time: it runs. Before
/// `timeout_millis`, clock skew alone made it a 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_timeout_makes_operations_immune_to_clock_skew() -> anyhow::Result<()> {
    let s = setup("skew", &["configmaps"]).await?;
    let configmaps = Api::<ConfigMap>::namespaced(s.admin.clone(), &s.namespace);
    create(&configmaps, json!({ "metadata": { "name": "skewed" } })).await?;
    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("skew");
    let config = s.write_config(hub_addr, &account, &["configmaps"])?;
    let agent = start_agent(&config).await?;
    eventually("the snapshot", || {
        hub.snapshot_ends(&account, "configmaps") == 1
    })
    .await?;
    let minute_ago = k8s_openapi::jiff::Timestamp::now().as_millisecond() - 60_000;
    let get = |id: &str, timeout_millis: u64| Operation {
        id: id.into(),
        account: account.clone(),
        deadline_unix_millis: minute_ago,
        timeout_millis,
        op: Some(scale_agent_proto::v1::operation::Op::Get(GetOp {
            target: Some(ObjectRef {
                kind: Some(KindSelector {
                    kind: "ConfigMap".into(),
                    ..Default::default()
                }),
                namespace: s.namespace.clone(),
                name: "skewed".into(),
            }),
        })),
        ..Default::default()
    };
    if let Ok(mut operations) = hub.operations.lock() {
        operations.push(get("skewed", 30_000));
        // An older hub's operation (no relative timeout): the absolute deadline still rules,
        // and an operation with no time left is not started.
        operations.push(get("late", 0));
    }
    hub.operate.notify_one();
    let result = |id: &'static str| {
        hub.messages().into_iter().find_map(|m| match m.kind {
            Some(agent_message::Kind::OperationResult(r)) if r.id == id => Some(r),
            _ => None,
        })
    };
    eventually("both results", || {
        result("skewed").is_some() && result("late").is_some()
    })
    .await?;
    let skewed = result("skewed").ok_or_else(|| anyhow::anyhow!("no result"))?;
    let status = skewed.status.clone().unwrap_or_default();
    assert!(skewed.ok, "{status:?}");
    assert_eq!(status.code, 200);
    assert_eq!(skewed.objects_json.len(), 1);
    let late = result("late").ok_or_else(|| anyhow::anyhow!("no result"))?;
    let status = late.status.clone().unwrap_or_default();
    assert_eq!(status.code, 504, "{status:?}");
    assert!(
        !late.executed,
        "an operation with no time left is not started"
    );
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&s.dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_resource_installed_later_is_discovered() -> anyhow::Result<()> {
    let s = setup("crd", &["configmaps", "widgets.agenttest.scaleagent.dev"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        kubeconfig,
        ..
    } = &s;
    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("crd");
    let config = dir.join("scale-agent.yaml");
    write_config(
        &config,
        hub_addr,
        json!([{
            "name": account,
            "kubeconfigFile": kubeconfig.display().to_string(),
            "namespaces": [namespace],
            "kinds": ["configmaps"],
            "customResourceDefinitions": [{ "kind": "Widget.agenttest.scaleagent.dev" }],
        }]),
    )?;
    let mut options = Options::for_config(&config);
    options.admin_addr = Some("127.0.0.1:0".parse()?);
    options.rediscover_seconds = 1;
    let agent = scale_agent::start(options).await?;
    eventually("the ConfigMap snapshot", || {
        hub.snapshot_ends(&account, "configmaps") == 1
    })
    .await?;
    assert_eq!(hub.snapshot_ends(&account, "widgets"), 0);

    let crd =
        scale_agent_e2e::crds::schemaless_crd("agenttest.scaleagent.dev", "Widget", "widgets");
    scale_agent_e2e::crds::install(admin, &[crd]).await?;
    let widgets = Api::<kube::api::DynamicObject>::namespaced_with(
        admin.clone(),
        namespace,
        &kube::discovery::ApiResource {
            group: "agenttest.scaleagent.dev".into(),
            version: "v1".into(),
            api_version: "agenttest.scaleagent.dev/v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        },
    );
    let widget: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "agenttest.scaleagent.dev/v1",
        "kind": "Widget",
        "metadata": { "name": "gear" },
        "spec": { "teeth": 12 },
    }))?;
    widgets.create(&PostParams::default(), &widget).await?;
    eventually("the Widget, after rediscovery", || {
        hub.has_object(&account, "widgets", "gear", object_event::Type::Applied)
    })
    .await?;
    let gear = hub
        .objects(&account, "widgets")
        .into_iter()
        .find(|o| o.name == "gear");
    let gear = gear.ok_or_else(|| anyhow::anyhow!("no event for 'gear'"))?;
    let body: serde_json::Value = serde_json::from_slice(&gear.object_json)?;
    assert_eq!(body["apiVersion"], "agenttest.scaleagent.dev/v1");
    assert_eq!(body["spec"]["teeth"], 12);
    // The ConfigMap watch was not restarted by rediscovery.
    assert_eq!(agent.metrics().lists_total(&account, "configmaps"), 1);
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// The agent against the real hub (in-process, plaintext): it registers, streams, and after
/// an agent restart resumes from the hub's stored resume points without a LIST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_to_the_real_hub_and_resumes_after_an_agent_restart() -> anyhow::Result<()> {
    let s = setup("real-hub", &["configmaps", "secrets"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        kubeconfig: _,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    create(&configmaps, json!({ "metadata": { "name": "first" } })).await?;

    let hub = start_plaintext_hub(dir).await?;
    let account = account_name("real");
    let config = s.write_config(hub.grpc_addr, &account, &["configmaps", "secrets"])?;
    let agent = start_agent(&config).await?;
    eventually("synced with the real hub", || agent.view().synced()).await?;
    let listed = hub_lists(hub.http_addr, &account, "first").await?;
    assert!(listed.contains("\"first\""), "{listed}");
    assert_eq!(agent.metrics().lists_total(&account, "configmaps"), 1);
    // The agent asked for its keepAliveHeartbeatSeconds (5); the hub's own period is 2 s
    // and its bounds 1..300 s, so it granted the 5 s asked for.
    assert_eq!(agent.view().heartbeat_period_seconds, 5);
    agent.stop().await?;

    // Restart the agent: the hub holds resume points, so nothing is listed again.
    create(&configmaps, json!({ "metadata": { "name": "second" } })).await?;
    let agent = start_agent(&config).await?;
    eventually("synced after the restart", || agent.view().synced()).await?;
    let listed = hub_lists(hub.http_addr, &account, "second").await?;
    assert!(listed.contains("\"second\""), "{listed}");
    assert_eq!(agent.metrics().lists_total(&account, "configmaps"), 0);
    assert_eq!(
        agent.metrics().watch_resumes_total(&account, "configmaps"),
        1
    );
    assert_eq!(agent.metrics().lists_total(&account, "secrets"), 0);
    agent.stop().await?;
    hub.shutdown().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// Two replicas against the real hub: one streams, the other stands by; when the streaming
/// replica stops, the standby is promoted and resumes from the hub's resume points without
/// a LIST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_replica_takes_over_without_relisting() -> anyhow::Result<()> {
    let s = setup("ha", &["configmaps"]).await?;
    let Setup {
        admin,
        namespace,
        dir,
        kubeconfig: _,
        ..
    } = &s;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    create(&configmaps, json!({ "metadata": { "name": "one" } })).await?;

    let hub = start_plaintext_hub(dir).await?;
    let account = account_name("ha");
    let config = s.write_config(hub.grpc_addr, &account, &["configmaps"])?;
    let first = fixtures::start_agent_replica(&config, "replica-a").await?;
    eventually("the first replica streaming", || {
        first.view().synced()
            && first
                .view()
                .account(&account)
                .is_some_and(|a| a.role == "streaming")
    })
    .await?;
    let second = fixtures::start_agent_replica(&config, "replica-b").await?;
    eventually("the second replica on standby", || {
        second
            .view()
            .account(&account)
            .is_some_and(|a| a.role == "standby")
    })
    .await?;
    assert_eq!(second.metrics().lists_total(&account, "configmaps"), 0);

    first.stop().await?;
    create(&configmaps, json!({ "metadata": { "name": "two" } })).await?;
    eventually("the standby promoted", || {
        second
            .view()
            .account(&account)
            .is_some_and(|a| a.role == "streaming")
    })
    .await?;
    let listed = hub_lists(hub.http_addr, &account, "two").await?;
    assert!(listed.contains("\"two\""), "{listed}");
    assert_eq!(second.metrics().lists_total(&account, "configmaps"), 0);
    assert_eq!(
        second.metrics().watch_resumes_total(&account, "configmaps"),
        1
    );
    second.stop().await?;
    hub.shutdown().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// Config-file edge cases of a running agent (issue 17): unknown keys are reported with the
/// closest known key; a deleted file keeps the last good config (every account keeps
/// streaming) and says so once, on `/accounts` and in the config-errors metric, until the
/// file is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_keys_are_reported_and_a_deleted_config_file_keeps_the_last_good_config()
-> anyhow::Result<()> {
    let s = setup("cfgedge", &["configmaps"]).await?;
    let configmaps = Api::<ConfigMap>::namespaced(s.admin.clone(), &s.namespace);
    create(&configmaps, json!({ "metadata": { "name": "before" } })).await?;

    let hub = Arc::new(HubState::default());
    let hub_addr = start_hub(hub.clone()).await?;
    let account = account_name("cfgedge");
    let config = s.dir.join("scale-agent.yaml");
    let mut with_typos = fixtures::account(&account, &s.kubeconfig, &s.namespace, &["ConfigMap"]);
    with_typos["kindz"] = json!(["Secret"]);
    write_config(&config, hub_addr, json!([with_typos]))?;
    let mut document: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config)?)?;
    document["kubernets"] = json!({ "accounts": [] });
    let text = serde_json::to_string_pretty(&document)?;
    std::fs::write(&config, &text)?;

    let agent = start_agent(&config).await?;
    eventually("the snapshot", || {
        hub.has_object(
            &account,
            "configmaps",
            "before",
            object_event::Type::Applied,
        )
    })
    .await?;
    let mut unknown = agent.view().config.unknown_keys;
    unknown.sort();
    assert_eq!(
        unknown,
        [
            "kubernetes.accounts[0].kindz (did you mean `kinds`?)",
            "kubernets (did you mean `kubernetes`?)",
        ]
    );
    assert_eq!(agent.metrics().config_errors.get(), 2);
    let accounts = http_get(agent.admin_addr(), "/accounts").await?;
    assert!(
        accounts
            .body
            .contains("kubernets (did you mean `kubernetes`?)"),
        "{}",
        accounts.body
    );
    assert!(
        agent
            .metrics_text()
            .contains("scale_agent_agent_config_errors_total 2")
    );

    // The file goes away (a ConfigMap unmounted, a rename in progress): nothing changes but
    // the status.
    std::fs::remove_file(&config)?;
    eventually("the missing file to be noticed", || {
        agent.view().config.problem.is_some()
    })
    .await?;
    let problem = agent.view().config.problem.unwrap_or_default();
    assert!(problem.contains("does not exist"), "{problem}");
    assert!(problem.contains(&config.display().to_string()), "{problem}");
    assert!(
        problem.contains("keeping the last good config"),
        "{problem}"
    );
    create(
        &configmaps,
        json!({ "metadata": { "name": "while-missing" } }),
    )
    .await?;
    eventually("an object created while the file is missing", || {
        hub.has_object(
            &account,
            "configmaps",
            "while-missing",
            object_event::Type::Applied,
        )
    })
    .await?;
    // Several polls later: still one error for the one disappearance, the account and the
    // hub address untouched, nothing unregistered.
    tokio::time::sleep(scale_agent::CONFIG_POLL * 3).await;
    assert_eq!(agent.metrics().config_errors.get(), 3);
    let view = agent.view();
    assert!(view.account(&account).is_some());
    assert_eq!(view.hub, hub_addr.to_string());
    assert!(view.hub_connected);
    assert!(
        !hub.kinds()
            .iter()
            .any(|k| matches!(k, agent_message::Kind::UnregisterAccount(_))),
        "an account was unregistered while the config file was missing"
    );
    let accounts = http_get(agent.admin_addr(), "/accounts").await?;
    assert!(
        accounts.body.contains("does not exist"),
        "{}",
        accounts.body
    );

    // The same file back: the problem is gone, and nothing was reloaded.
    let reloads = agent.metrics().config_reloads.get();
    std::fs::write(&config, &text)?;
    eventually("the file to be back", || {
        agent.view().config.problem.is_none()
    })
    .await?;
    assert_eq!(agent.metrics().config_reloads.get(), reloads);
    // A corrected file: applied, and no unknown keys left to show.
    write_config(
        &config,
        hub_addr,
        json!([fixtures::account(
            &account,
            &s.kubeconfig,
            &s.namespace,
            &["ConfigMap"]
        )]),
    )?;
    eventually("the corrected file to be applied", || {
        agent.metrics().config_reloads.get() == reloads + 1
    })
    .await?;
    assert!(agent.view().config.unknown_keys.is_empty());
    assert_eq!(agent.metrics().config_errors.get(), 3);

    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&s.dir);
    Ok(())
}

/// A `--config` path that does not exist stops the agent process at start-up with a message
/// that says what to do, instead of running on defaults and failing to resolve the default hub.
#[test]
fn a_missing_config_file_given_with_config_stops_the_agent_at_start_up() -> anyhow::Result<()> {
    let missing = temp_dir("cfgmissing")?.join("no-such.yaml");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_e2e-agent"))
        .arg("--config")
        .arg(&missing)
        .arg("--admin-addr")
        .arg("127.0.0.1:0")
        .output()?;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "the config file {} does not exist: create it, or point --config (SCALE_AGENT_CONFIG) at the agent's config file",
            missing.display()
        )),
        "{stderr}"
    );
    Ok(())
}
