//! A fake agent on the generated gRPC client, over mutual TLS: the synthetic source of the
//! stream-ceiling measure and the many simulated agents.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Result, anyhow, bail};
use scale_agent_proto::v1::{
    self as pb, agent_hub_client::AgentHubClient, agent_message::Kind as Msg,
    hub_message::Kind as Out,
};
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// A connected fake agent that has been welcomed.
pub struct FakeAgent {
    /// The sender and the last sequence number, together so heartbeats keep the order.
    out: Arc<tokio::sync::Mutex<(mpsc::Sender<pb::AgentMessage>, u64)>>,
    seq: u64,
    acked: Arc<AtomicU64>,
    progress: Arc<Notify>,
    assignments: mpsc::Receiver<pb::AccountAssignment>,
    pub max_unacked: u64,
    /// The Welcome's session token: presented on a reconnect ([`Self::reconnect`]) so the
    /// hub takes the new stream over from this one while it still looks live.
    pub session_token: String,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Bytes of data in each ConfigMap of [`FakeAgent::snapshot`] (and of the soak's updates).
pub const CONFIGMAP_BYTES: usize = 64;

pub fn configmaps() -> pb::Kind {
    pb::Kind {
        group: String::new(),
        version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
        namespaced: true,
    }
}

impl FakeAgent {
    /// Connects to the hub with a client certificate, says Hello and waits for Welcome.
    pub async fn connect(
        hub: SocketAddr,
        ca_pem: &str,
        cert_pem: &str,
        key_pem: &str,
        replica: &str,
    ) -> Result<Self> {
        Self::reconnect(hub, ca_pem, cert_pem, key_pem, replica, String::new()).await
    }

    /// [`Self::connect`] as the same replica again, presenting the previous stream's
    /// `session_token`, as a real agent does when it reconnects.
    pub async fn reconnect(
        hub: SocketAddr,
        ca_pem: &str,
        cert_pem: &str,
        key_pem: &str,
        replica: &str,
        session_token: String,
    ) -> Result<Self> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca_pem))
            .identity(Identity::from_pem(cert_pem, key_pem))
            .domain_name("localhost");
        let channel = Endpoint::from_shared(format!("https://{hub}"))?
            .tls_config(tls)?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(30))
            .connect()
            .await?;
        let (tx, rx) = mpsc::channel(1024);
        // Hello goes first, before the call is even answered.
        let seq = 1;
        tx.send(pb::AgentMessage {
            seq,
            kind: Some(Msg::Hello(pb::Hello {
                replica: replica.into(),
                agent_version: "bench".into(),
                capabilities: vec![],
                session_token,
                heartbeat_period_seconds: 0,
            })),
        })
        .await
        .map_err(|_| anyhow!("stream closed"))?;
        let mut inbound = AgentHubClient::new(channel)
            .max_decoding_message_size(64 << 20)
            .session(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let welcome = match inbound.message().await? {
            Some(pb::HubMessage {
                kind: Some(Out::Welcome(w)),
            }) => w,
            other => bail!("expected Welcome, got {other:?}"),
        };
        let acked = Arc::new(AtomicU64::new(0));
        let progress = Arc::new(Notify::new());
        let (assign_tx, assignments) = mpsc::channel(16);
        let out = Arc::new(tokio::sync::Mutex::new((tx, seq)));
        let reader = {
            let acked = acked.clone();
            let progress = progress.clone();
            let out = out.clone();
            let period = Duration::from_secs(u64::from(welcome.heartbeat_period_seconds.max(1)));
            tokio::spawn(async move {
                let mut heartbeat =
                    tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                loop {
                    tokio::select! {
                        message = inbound.message() => {
                            let Ok(Some(message)) = message else {
                                progress.notify_waiters();
                                break;
                            };
                            match message.kind {
                                Some(Out::Ack(ack)) => {
                                    acked.fetch_max(ack.seq, Ordering::SeqCst);
                                    progress.notify_waiters();
                                }
                                Some(Out::Assignment(a)) => {
                                    let _ = assign_tx.send(a).await;
                                }
                                _ => {}
                            }
                        }
                        // Heartbeats share the numbering with everything else.
                        _ = heartbeat.tick() => {
                            let mut out = out.lock().await;
                            out.1 += 1;
                            let message = pb::AgentMessage {
                                seq: out.1,
                                kind: Some(Msg::Heartbeat(pb::Heartbeat { sent_at_unix_millis: 0 })),
                            };
                            if out.0.send(message).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            })
        };
        Ok(Self {
            out,
            seq,
            acked,
            progress,
            assignments,
            max_unacked: u64::from(welcome.max_unacked.max(1)),
            session_token: welcome.session_token.clone(),
            reader,
        })
    }

    /// Sends one message, waiting while `max_unacked` messages are unacknowledged.
    pub async fn send(&mut self, kind: Msg) -> Result<u64> {
        // Saturating: the reader's heartbeats take sequence numbers too, so the hub's ack can
        // pass the last number this side sent (a soak longer than a heartbeat period).
        while self.seq.saturating_sub(self.acked.load(Ordering::SeqCst)) >= self.max_unacked {
            let notified = self.progress.notified();
            if self.seq.saturating_sub(self.acked.load(Ordering::SeqCst)) < self.max_unacked {
                break;
            }
            if self.reader.is_finished() {
                bail!("the hub ended the stream");
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
        }
        let mut out = self.out.lock().await;
        out.1 += 1;
        self.seq = out.1;
        out.0
            .send(pb::AgentMessage {
                seq: out.1,
                kind: Some(kind),
            })
            .await
            .map_err(|_| anyhow!("the stream to the hub closed"))?;
        Ok(self.seq)
    }

    /// Waits until everything sent is acknowledged.
    pub async fn synced(&self, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.acked.load(Ordering::SeqCst) < self.seq {
            let notified = self.progress.notified();
            if self.acked.load(Ordering::SeqCst) >= self.seq {
                break;
            }
            if self.reader.is_finished() {
                bail!("the hub ended the stream");
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err()
                && tokio::time::Instant::now() >= deadline
            {
                bail!("not acknowledged within {timeout:?}");
            }
        }
        Ok(())
    }

    /// Registers `account` (its own cluster) and waits for a STREAMING assignment.
    pub async fn register(&mut self, account: &str, cluster_host: &str) -> Result<()> {
        self.register_streaming(account, cluster_host, Duration::from_secs(120))
            .await
            .map(drop)
    }

    /// Registers `account` and waits up to `timeout` for a STREAMING assignment, as an
    /// agent does: a STANDBY answer (another replica of the hub owns the account) keeps the
    /// stream open until this one is promoted. Reports the kind WATCHING and returns the
    /// assignment (its resume points say whether the agent may resume or must relist).
    pub async fn register_streaming(
        &mut self,
        account: &str,
        cluster_host: &str,
        timeout: Duration,
    ) -> Result<pb::AccountAssignment> {
        self.send(Msg::RegisterAccount(pb::RegisterAccount {
            account: account.into(),
            cluster: Some(pb::ClusterInfo {
                api_server_host: cluster_host.into(),
                ca_fingerprint: "00".repeat(32),
                kubernetes_version: "v1.37.1".into(),
            }),
            namespaces: vec![],
            properties_json: br#"{"kinds":["ConfigMap"]}"#.to_vec(),
        }))
        .await?;
        let deadline = tokio::time::Instant::now() + timeout;
        let assignment = loop {
            let assignment = tokio::time::timeout_at(deadline, self.assignments.recv())
                .await
                .map_err(|_| anyhow!("{account} not streaming within {timeout:?}"))?
                .ok_or_else(|| anyhow!("the hub ended the stream before assigning {account}"))?;
            match pb::account_assignment::Role::try_from(assignment.role) {
                Ok(pb::account_assignment::Role::Streaming) => break assignment,
                Ok(pb::account_assignment::Role::Standby) => continue,
                _ => bail!(
                    "{account}: assigned role {} ({})",
                    assignment.role,
                    assignment.reason
                ),
            }
        };
        self.send(Msg::KindStatus(pb::KindStatus {
            account: account.into(),
            kind: Some(configmaps()),
            state: pb::kind_status::State::Watching as i32,
            message: String::new(),
            namespaces: vec![],
        }))
        .await?;
        Ok(assignment)
    }

    /// Waits until the stream has ended (the hub went away or ended it).
    pub async fn ended(&self) {
        while !self.reader.is_finished() {
            let notified = self.progress.notified();
            if self.reader.is_finished() {
                break;
            }
            // The reader notifies when it ends; the timeout covers a notification missed
            // between the check and the wait.
            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
        }
    }

    /// A snapshot of `objects` small ConfigMaps; returns the JSON bytes of the objects sent.
    pub async fn snapshot(&mut self, account: &str, objects: usize, rv: u64) -> Result<usize> {
        self.send(Msg::SnapshotBegin(pb::SnapshotBegin {
            account: account.into(),
            kind: Some(configmaps()),
            watch_namespace: String::new(),
        }))
        .await?;
        let mut sent = 0;
        for i in 0..objects {
            let event = object_event(account, &format!("cm-{i}"), rv, CONFIGMAP_BYTES);
            sent += event.object_json.len();
            self.send(Msg::Object(event)).await?;
        }
        self.send(Msg::SnapshotEnd(pb::SnapshotEnd {
            account: account.into(),
            kind: Some(configmaps()),
            resource_version: rv.to_string(),
            object_count: objects as u64,
            watch_namespace: String::new(),
        }))
        .await?;
        Ok(sent)
    }
}

/// An APPLIED ConfigMap event with about `bytes` bytes of data.
pub fn object_event(account: &str, name: &str, rv: u64, bytes: usize) -> pb::ObjectEvent {
    let uid = format!("uid-{name}");
    let json = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid,
            "resourceVersion": rv.to_string(),
            "labels": { "app": "bench" },
        },
        "data": { "payload": crate::env::payload(rv as usize, bytes) },
    });
    pb::ObjectEvent {
        account: account.into(),
        kind: Some(configmaps()),
        r#type: pb::object_event::Type::Applied as i32,
        namespace: "default".into(),
        name: name.into(),
        uid,
        resource_version: rv.to_string(),
        object_json: serde_json::to_vec(&json).unwrap_or_default(),
        truncated: false,
        watch_namespace: String::new(),
    }
}
