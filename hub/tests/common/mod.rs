//! Test support shared by the hub's integration tests: the hub in-process on 127.0.0.1, fake
//! agents that speak the real gRPC protocol over mutual TLS, and helpers of the hub's REST
//! and admin APIs. What is not about the hub (certificates made at test time, the HTTPS
//! client, polling, the Clouddriver contract server) is in `scale-agent-testkit`, re-exported
//! here.

// Each test binary uses a part of this module.
#![allow(dead_code)]
// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::VecDeque,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

pub mod kubectl;

use bytes::Bytes;
use scale_agent_hub::{Config, GrpcSecurity, HttpSecurity, RunningHub, TlsMaterial};
use scale_agent_proto::v1::{
    self as pb, account_assignment::Role, agent_hub_client::AgentHubClient,
    agent_message::Kind as Msg, hub_message::Kind as Out, object_event::Type as EventType,
    tunnel_frame::Frame,
};
use scale_agent_testkit::http::Call;
// Each test binary uses a part of these too.
#[allow(unused_imports)]
pub use scale_agent_testkit::{
    contract,
    https::{BoxError, Https, Proto, Reply, ReqBody, empty, full, read_all, read_to_end},
    pki::{Pki, ca, leaf, leaf_with},
};
use serde_json::Value;
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{
    Status,
    transport::{Certificate, ClientTlsConfig, Endpoint, Identity},
};

/// How long any one step may take (the HTTPS client's timeout): generous, the machine is
/// shared and slow.
pub const WAIT: Duration = scale_agent_testkit::https::TIMEOUT;
/// How often [`wait_for`] asks.
const EVERY: Duration = Duration::from_millis(25);
/// Largest body chunk in one tunnel frame (item 7 of the stream contract).
pub const MAX_FRAME: usize = 64 * 1024;

// ---------------------------------------------------------------- hub

pub fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "scale-agent-hub-test-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

pub async fn start_hub(pki: &Pki, dir: &Path, tweak: impl FnOnce(&mut Config)) -> RunningHub {
    let mut config = Config::new(
        GrpcSecurity::MutualTls(TlsMaterial {
            cert_pem: pki.server_cert_pem.clone().into_bytes(),
            key_pem: pki.server_key_pem.clone().into_bytes(),
            client_ca_pem: Some(pki.ca_pem.clone().into_bytes()),
        }),
        dir,
    );
    config.listeners.grpc_addr = "127.0.0.1:0".parse().unwrap();
    config.listeners.http_addr = "127.0.0.1:0".parse().unwrap();
    // The test PKI's agent certificates are of the external CA (--client-ca), whose
    // identities register only what an --allow rule names (issue 28, F7): every name here,
    // as the tests expect; a test about the rules sets its own.
    config.agents.allow = vec![scale_agent_hub::identity::AllowRule::parse("*=*").unwrap()];
    tweak(&mut config);
    scale_agent_hub::start(config).await.unwrap()
}

/// The hub's HTTP listener with TLS (the serving certificate of `pki`), that CA in the
/// kubeconfigs, and an admin token file in the data directory.
pub fn serve_https(pki: &Pki, config: &mut Config) {
    config.listeners.http_security = HttpSecurity::Tls {
        cert_pem: pki.serving_cert_pem.clone().into_bytes(),
        key_pem: pki.serving_key_pem.clone().into_bytes(),
    };
    config.api.serving_ca_pem = Some(pki.serving_ca_pem.clone().into_bytes());
    config.api.admin_token_file = Some(config.store.data_dir.join("admin-token"));
}

/// The admin token a hub set up by [`serve_https`] created.
pub fn admin_token(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("admin-token"))
        .unwrap()
        .trim()
        .to_string()
}

/// The hub's Clouddriver settings for the contract server at `url` (its Account Management
/// API): short timeouts and fast retries, so that a test does not wait on backoff.
pub fn contract_clouddriver(url: &str) -> scale_agent_hub::clouddriver::ClouddriverSettings {
    use scale_agent_hub::clouddriver::{Backoff, ClouddriverSettings};
    ClouddriverSettings {
        api_url: Some(url.to_string()),
        request_timeout: Duration::from_secs(5),
        backoff: Backoff {
            initial: Duration::from_millis(50),
            factor: 2,
            max: Duration::from_secs(1),
        },
        ..ClouddriverSettings::default()
    }
}

/// A port free right now, for a hub whose public URL must be known before it starts.
pub fn free_port() -> u16 {
    scale_agent_testkit::free_port().unwrap()
}

/// Polls `check` every 25 ms until it holds; panics after [`WAIT`].
pub async fn wait_for(what: &str, check: impl AsyncFnMut() -> bool) {
    scale_agent_testkit::wait::eventually(what, WAIT, EVERY, check).await;
}

// ---------------------------------------------------------------- plaintext HTTP

/// The REST API of a plaintext hub, and the token its requests carry.
#[derive(Clone, Debug)]
pub struct Api {
    pub addr: SocketAddr,
    /// Sent as `Authorization: Bearer`; `None` sends no header.
    pub token: Option<String>,
}

/// `hub`'s REST API with the admin token the hub wrote to its admin token file at start.
pub fn api(hub: &RunningHub) -> Api {
    let file = hub
        .admin_token_file()
        .expect("the tests' hubs have an admin token file");
    let token = std::fs::read_to_string(file).unwrap().trim().to_string();
    Api {
        addr: hub.http_addr,
        token: Some(token),
    }
}

impl Api {
    /// The same API with another token (or none).
    pub fn with_token(&self, token: Option<&str>) -> Api {
        Api {
            addr: self.addr,
            token: token.map(str::to_string),
        }
    }
}

/// One request to a plaintext hub's API: (status, body).
async fn call(api: &Api, method: &str, path: &str, json: Option<&Value>) -> (u16, String) {
    let mut call = Call::new(method, format!("http://{}{path}", api.addr)).timeout(WAIT);
    if let Some(token) = &api.token {
        call = call.bearer(token);
    }
    if let Some(value) = json {
        call = call.json(value);
    }
    let response = call.send().await.unwrap_or_else(|e| panic!("{e}"));
    (response.status, response.body)
}

/// Any method, with an optional JSON body: (status, body).
pub async fn request(api: &Api, method: &str, path: &str, json: Option<&Value>) -> (u16, String) {
    call(api, method, path, json).await
}

/// GET: (status, body).
pub async fn get(api: &Api, path: &str) -> (u16, String) {
    call(api, "GET", path, None).await
}

pub async fn get_json(api: &Api, path: &str) -> (u16, Value) {
    let (status, body) = get(api, path).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// POST a JSON body: (status, JSON body).
pub async fn post_json(api: &Api, path: &str, body: &Value) -> (u16, Value) {
    let (status, body) = call(api, "POST", path, Some(body)).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

pub async fn object_names(hub: &RunningHub, query: &str) -> Vec<String> {
    let (status, v) = get_json(&api(hub), &format!("/api/v1/accounts/{query}")).await;
    assert_eq!(status, 200, "{v}");
    names_of(&v)
}

/// [`object_names`] of a hub serving HTTPS ([`serve_https`]), with its admin token.
pub async fn object_names_https(http: &Https, dir: &Path, query: &str) -> Vec<String> {
    let reply = http
        .get(
            &format!("/api/v1/accounts/{query}"),
            Some(&admin_token(dir)),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    names_of(&reply.json())
}

/// Sorted `metadata.name` of the items of an object list.
pub fn names_of(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

// ---------------------------------------------------------------- HTTPS client

/// [`Https`] for a hub.
pub trait HubHttps {
    /// A client of `hub`'s HTTPS listener (set up by [`serve_https`]) at 127.0.0.1.
    fn for_hub(pki: &Pki, hub: &RunningHub, proto: Proto) -> Https;
}

impl HubHttps for Https {
    fn for_hub(pki: &Pki, hub: &RunningHub, proto: Proto) -> Https {
        Https::new(
            &pki.serving_ca_pem,
            format!("https://127.0.0.1:{}", hub.http_addr.port()),
            proto,
        )
    }
}

// ---------------------------------------------------------------- admin API

/// Issues a kubeconfig for `account` (token name `token_name`) with the admin token; returns
/// it parsed.
pub async fn issue_kubeconfig(http: &Https, admin: &str, account: &str, token_name: &str) -> Value {
    let reply = http
        .with_token(
            "POST",
            &format!("/api/v1/accounts/{account}/kubeconfig?tokenName={token_name}"),
            admin,
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    serde_saphyr::from_str(&reply.text()).unwrap()
}

/// The token of a kubeconfig's (only) user.
pub fn kubeconfig_token(kubeconfig: &Value) -> String {
    kubeconfig["users"][0]["user"]["token"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A fresh token for `account`.
pub async fn token_for(http: &Https, admin: &str, account: &str) -> String {
    kubeconfig_token(&issue_kubeconfig(http, admin, account, "tests").await)
}

// ---------------------------------------------------------------- fake agent

/// An agent speaking the real protocol on a real stream, driven by the test: it files what
/// the hub sends (a task reads the stream, so the hub never waits for the test to read) and
/// sends what the test tells it to.
pub struct FakeAgent {
    tx: mpsc::Sender<pb::AgentMessage>,
    inbox: mpsc::UnboundedReceiver<Result<Option<pb::HubMessage>, Status>>,
    reader: JoinHandle<()>,
    pub seq: u64,
    pub acked: u64,
    pub assignments: VecDeque<pb::AccountAssignment>,
    pub heartbeats: usize,
    pub operations: VecDeque<pb::Operation>,
    pub tunnel: VecDeque<pb::TunnelFrame>,
    pub renewals: VecDeque<pb::CertificateRenewal>,
    /// AccountState messages, oldest first.
    pub states: VecDeque<pb::AccountState>,
    /// The last AgentReplicas message.
    pub replicas: Option<pb::AgentReplicas>,
    /// The last DynamicAccounts the hub sent.
    pub dynamic_accounts: Option<pb::DynamicAccounts>,
    pub welcome: Option<pb::Welcome>,
    /// KindStatus messages from the hub (OVER_QUOTA and back), oldest first.
    pub kind_statuses: VecDeque<pb::KindStatus>,
    /// HubCapabilities, sent right after Welcome.
    pub capabilities: Vec<String>,
    /// Set once the stream ended: the status, or OK for a clean end.
    ended: Option<Status>,
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

pub async fn open_stream(
    hub: &RunningHub,
    pki_ca_pem: &str,
    client: Option<(String, String)>,
) -> Result<FakeAgent, Status> {
    open_stream_with_token(hub, pki_ca_pem, client, None).await
}

/// The hub's gRPC channel (TLS, trusting `pki_ca_pem` for the server), with a client
/// certificate when given.
pub async fn grpc_channel(
    hub: &RunningHub,
    pki_ca_pem: &str,
    client: Option<(String, String)>,
) -> Result<tonic::transport::Channel, Status> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pki_ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = client {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let endpoint = Endpoint::from_shared(format!("https://127.0.0.1:{}", hub.grpc_addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap();
    endpoint
        .connect()
        .await
        .map_err(|e| Status::unavailable(format!("connect: {e:?}")))
}

/// Opens a stream with a client certificate and/or an agent bearer token.
pub async fn open_stream_with_token(
    hub: &RunningHub,
    pki_ca_pem: &str,
    client: Option<(String, String)>,
    bearer: Option<&str>,
) -> Result<FakeAgent, Status> {
    let channel = grpc_channel(hub, pki_ca_pem, client).await?;
    let (tx, rx) = mpsc::channel(64);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token) = bearer {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let response = AgentHubClient::new(channel).session(request).await?;
    Ok(finish_open(tx, response))
}

fn finish_open(
    tx: mpsc::Sender<pb::AgentMessage>,
    response: tonic::Response<tonic::Streaming<pb::HubMessage>>,
) -> FakeAgent {
    let mut stream = response.into_inner();
    let (inbox_tx, inbox) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        loop {
            let message = stream.message().await;
            let last = !matches!(message, Ok(Some(_)));
            if inbox_tx.send(message).is_err() || last {
                return;
            }
        }
    });
    FakeAgent {
        tx,
        inbox,
        reader,
        seq: 0,
        acked: 0,
        assignments: VecDeque::new(),
        heartbeats: 0,
        operations: VecDeque::new(),
        tunnel: VecDeque::new(),
        renewals: VecDeque::new(),
        states: VecDeque::new(),
        replicas: None,
        dynamic_accounts: None,
        welcome: None,
        kind_statuses: VecDeque::new(),
        capabilities: Vec::new(),
        ended: None,
    }
}

/// Connects and says Hello without capabilities (an agent from before the proxy); returns
/// the agent after Welcome.
pub async fn agent(hub: &RunningHub, pki: &Pki, identity: &str, replica: &str) -> FakeAgent {
    agent_with(hub, pki, identity, replica, &[]).await
}

/// Connects and says Hello with the "http-tunnel" capability.
pub async fn tunnel_agent(hub: &RunningHub, pki: &Pki, identity: &str, replica: &str) -> FakeAgent {
    agent_with(hub, pki, identity, replica, &["http-tunnel"]).await
}

pub async fn agent_with(
    hub: &RunningHub,
    pki: &Pki,
    identity: &str,
    replica: &str,
    capabilities: &[&str],
) -> FakeAgent {
    let mut a = open_stream(hub, &pki.ca_pem, Some(pki.client(identity)))
        .await
        .unwrap();
    a.hello(replica, capabilities, "").await.unwrap();
    a
}

/// Connects and says Hello presenting the session token of an earlier stream.
pub async fn resume_agent(
    hub: &RunningHub,
    pki: &Pki,
    identity: &str,
    replica: &str,
    session_token: &str,
) -> Result<FakeAgent, Status> {
    let mut a = open_stream(hub, &pki.ca_pem, Some(pki.client(identity))).await?;
    a.hello(replica, &[], session_token).await?;
    Ok(a)
}

impl FakeAgent {
    /// Says Hello and waits for Welcome (Err: the status the hub ended the stream with).
    pub async fn hello(
        &mut self,
        replica: &str,
        capabilities: &[&str],
        session_token: &str,
    ) -> Result<(), Status> {
        self.hello_asking(replica, capabilities, session_token, 0)
            .await
    }

    /// Says Hello asking for a heartbeat period of `heartbeat_seconds` (0: none) and waits
    /// for Welcome.
    pub async fn hello_asking(
        &mut self,
        replica: &str,
        capabilities: &[&str],
        session_token: &str,
        heartbeat_seconds: u32,
    ) -> Result<(), Status> {
        self.send(Msg::Hello(pb::Hello {
            replica: replica.into(),
            agent_version: "test".into(),
            capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
            session_token: session_token.into(),
            heartbeat_period_seconds: heartbeat_seconds,
        }))
        .await;
        while self.welcome.is_none() {
            self.pump().await?;
        }
        Ok(())
    }

    /// The session token the hub handed out in Welcome.
    pub fn session_token(&self) -> String {
        self.welcome
            .as_ref()
            .map(|w| w.session_token.clone())
            .unwrap_or_default()
    }

    pub async fn send(&mut self, kind: Msg) -> u64 {
        self.seq += 1;
        self.send_raw(pb::AgentMessage {
            seq: self.seq,
            kind: Some(kind),
        })
        .await;
        self.seq
    }

    pub async fn send_raw(&mut self, msg: pb::AgentMessage) {
        self.tx.send(msg).await.unwrap();
    }

    /// Sends response data on an exchange; false when the hub has ended the stream.
    pub async fn try_send_data(&mut self, exchange: u64, data: &[u8]) -> bool {
        let frame = Frame::Data(pb::TunnelData {
            data: data.to_vec(),
            end_of_body: false,
        });
        self.tx
            .send(pb::AgentMessage {
                seq: 0,
                kind: Some(Msg::Tunnel(pb::TunnelFrame {
                    exchange,
                    frame: Some(frame),
                })),
            })
            .await
            .is_ok()
    }

    fn file(&mut self, message: Result<Option<pb::HubMessage>, Status>) -> Result<(), Status> {
        let msg = match message {
            Ok(Some(msg)) => msg,
            Ok(None) => {
                self.ended = Some(Status::ok("stream ended"));
                return Err(Status::ok("stream ended"));
            }
            Err(status) => {
                self.ended = Some(status.clone());
                return Err(status);
            }
        };
        match msg.kind {
            Some(Out::Welcome(w)) => self.welcome = Some(w),
            Some(Out::Assignment(a)) => self.assignments.push_back(a),
            Some(Out::Ack(ack)) => {
                assert!(ack.seq >= self.acked, "acks go backwards");
                self.acked = ack.seq;
            }
            Some(Out::Heartbeat(_)) => self.heartbeats += 1,
            Some(Out::Operation(op)) => self.operations.push_back(op),
            Some(Out::Tunnel(frame)) => self.tunnel.push_back(frame),
            Some(Out::CertificateRenewal(r)) => self.renewals.push_back(r),
            Some(Out::AccountState(s)) => self.states.push_back(s),
            Some(Out::AgentReplicas(r)) => self.replicas = Some(r),
            Some(Out::DynamicAccounts(d)) => self.dynamic_accounts = Some(d),
            Some(Out::KindStatus(s)) => self.kind_statuses.push_back(s),
            Some(Out::Capabilities(c)) => self.capabilities = c.capabilities,
            None => panic!("empty hub message"),
        }
        Ok(())
    }

    /// Reads one message and files it; Err when the stream ended.
    pub async fn pump(&mut self) -> Result<(), Status> {
        if let Some(status) = &self.ended {
            return Err(status.clone());
        }
        let message = tokio::time::timeout(WAIT, self.inbox.recv())
            .await
            .map_err(|_| Status::deadline_exceeded("test: nothing from the hub"))?
            .unwrap_or(Ok(None));
        self.file(message)
    }

    /// Files every message already received, without waiting.
    pub fn pump_ready(&mut self) -> Result<(), Status> {
        while let Ok(message) = self.inbox.try_recv() {
            self.file(message)?;
        }
        Ok(())
    }

    pub async fn assignment(&mut self) -> pb::AccountAssignment {
        loop {
            if let Some(a) = self.assignments.pop_front() {
                return a;
            }
            self.pump().await.unwrap();
        }
    }

    /// Waits until everything sent is acknowledged.
    pub async fn synced(&mut self) {
        while self.acked < self.seq {
            self.pump().await.unwrap();
        }
    }

    /// Waits for the stream to end with an error status.
    pub async fn error(&mut self) -> Status {
        loop {
            if let Err(status) = self.pump().await {
                return status;
            }
        }
    }

    /// Reads until an operation arrives.
    pub async fn operation(&mut self) -> pb::Operation {
        loop {
            if let Some(op) = self.operations.pop_front() {
                return op;
            }
            self.pump().await.unwrap();
        }
    }

    pub async fn register(&mut self, account: &str, host: &str) -> pb::AccountAssignment {
        self.register_with(account, host, br#"{"kinds":["ConfigMap"]}"#)
            .await
    }

    pub async fn register_with(
        &mut self,
        account: &str,
        host: &str,
        properties_json: &[u8],
    ) -> pb::AccountAssignment {
        self.send(Msg::RegisterAccount(pb::RegisterAccount {
            account: account.into(),
            cluster: Some(pb::ClusterInfo {
                api_server_host: host.into(),
                ca_fingerprint: "0a1b".into(),
                kubernetes_version: "v1.37.1".into(),
            }),
            namespaces: vec![],
            properties_json: properties_json.to_vec(),
        }))
        .await;
        let a = self.assignment().await;
        assert_eq!(a.account, account);
        a
    }

    pub async fn snapshot(&mut self, account: &str, objects: &[(&str, &str)], rv: &str) {
        self.send(Msg::SnapshotBegin(pb::SnapshotBegin {
            account: account.into(),
            kind: Some(configmaps()),
            watch_namespace: String::new(),
        }))
        .await;
        for (name, orv) in objects {
            self.send(cm_event(account, EventType::Applied, name, orv, "web"))
                .await;
        }
        self.send(Msg::SnapshotEnd(pb::SnapshotEnd {
            account: account.into(),
            kind: Some(configmaps()),
            resource_version: rv.into(),
            object_count: objects.len() as u64,
            watch_namespace: String::new(),
        }))
        .await;
    }

    // ------------------------------------------------------------ tunnel

    /// Sends a tunnel frame (seq 0: outside the sequence numbers).
    pub async fn send_frame(&mut self, exchange: u64, frame: Frame) {
        self.send_raw(pb::AgentMessage {
            seq: 0,
            kind: Some(Msg::Tunnel(pb::TunnelFrame {
                exchange,
                frame: Some(frame),
            })),
        })
        .await;
    }

    /// Takes the first tunnel frame `wanted` accepts out of those received, waiting for one;
    /// the others stay queued.
    pub async fn take_frame(
        &mut self,
        what: &str,
        wanted: impl Fn(&pb::TunnelFrame) -> bool,
    ) -> pb::TunnelFrame {
        loop {
            if let Some(i) = self.tunnel.iter().position(&wanted) {
                return self.tunnel.remove(i).unwrap();
            }
            if let Err(status) = self.pump().await {
                panic!("waiting for {what}: {status:?}; received {:?}", self.tunnel);
            }
        }
    }

    /// The next exchange the hub opens: its id and request head.
    pub async fn request(&mut self) -> (u64, pb::HttpRequestHead) {
        let frame = self
            .take_frame("a request head", |f| {
                matches!(f.frame, Some(Frame::Request(_)))
            })
            .await;
        let Some(Frame::Request(head)) = frame.frame else {
            unreachable!()
        };
        (frame.exchange, head)
    }

    /// The next frame of `exchange`.
    pub async fn frame_of(&mut self, exchange: u64) -> Frame {
        self.take_frame(&format!("a frame of exchange {exchange}"), |f| {
            f.exchange == exchange
        })
        .await
        .frame
        .unwrap()
    }

    /// The reset of `exchange`, skipping its other frames (window updates).
    pub async fn reset_of(&mut self, exchange: u64) -> String {
        loop {
            if let Frame::Reset(reset) = self.frame_of(exchange).await {
                return reset.reason;
            }
        }
    }

    /// Answers an exchange with a head.
    pub async fn respond_head(
        &mut self,
        exchange: u64,
        status: u32,
        headers: &[(&str, &str)],
        end_of_body: bool,
    ) {
        let headers = headers
            .iter()
            .map(|(name, value)| pb::HttpHeader {
                name: name.to_string(),
                value: value.as_bytes().to_vec(),
            })
            .collect();
        self.send_frame(
            exchange,
            Frame::Response(pb::HttpResponseHead {
                status,
                headers,
                end_of_body,
            }),
        )
        .await;
    }

    pub async fn send_data(&mut self, exchange: u64, data: &[u8], end_of_body: bool) {
        assert!(data.len() <= MAX_FRAME);
        self.send_frame(
            exchange,
            Frame::Data(pb::TunnelData {
                data: data.to_vec(),
                end_of_body,
            }),
        )
        .await;
    }

    /// Answers an exchange with a head and a small body (within the initial window).
    pub async fn respond(
        &mut self,
        exchange: u64,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) {
        if body.is_empty() {
            self.respond_head(exchange, status, headers, true).await;
            return;
        }
        self.respond_head(exchange, status, headers, false).await;
        let chunks: Vec<&[u8]> = body.chunks(MAX_FRAME).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            self.send_data(exchange, chunk, i + 1 == chunks.len()).await;
        }
    }

    /// Proves that the hub sent this agent no tunnel frame so far, beyond those already
    /// taken out of [`FakeAgent::tunnel`]. Tunnel frames do not share a queue with
    /// acknowledgements (an ack proves nothing about them), but the frames of one stream stay
    /// in order: a fresh probe request through the proxy for `account` (which this agent
    /// serves, as its only connected replica; a path no cache answers) must be the first
    /// frame received. The probe is answered 200, and the client must get that answer.
    pub async fn assert_no_tunnel_frames(&mut self, http: &Https, token: &str, account: &str) {
        static PROBES: AtomicU64 = AtomicU64::new(0);
        let n = PROBES.fetch_add(1, Ordering::Relaxed);
        let api_path = format!("/api/v1/namespaces/no-tunnel-probe-{n}");
        let mut call = {
            let (http, token) = (http.clone(), token.to_string());
            let path = format!("/clusters/{account}{api_path}");
            tokio::spawn(async move { http.get(&path, Some(&token)).await })
        };
        let first = loop {
            if let Some(frame) = self.tunnel.pop_front() {
                break frame;
            }
            tokio::select! {
                pumped = self.pump() => if let Err(status) = pumped {
                    panic!("waiting for the probe {api_path}: {status:?}")
                },
                reply = &mut call => panic!(
                    "the probe {api_path} was answered without reaching the agent: {:?}",
                    reply.map(|r| (r.status, r.text()))
                ),
            }
        };
        let probe = match &first.frame {
            Some(Frame::Request(head))
                if head.account == account && head.path_and_query == api_path =>
            {
                first.exchange
            }
            _ => panic!(
                "the agent received a tunnel frame before the probe {api_path}: {first:?}; \
                 then {:?}",
                self.tunnel
            ),
        };
        let answer = format!(r#"{{"kind":"Namespace","probe":{n}}}"#);
        self.respond(
            probe,
            200,
            &[("content-type", "application/json")],
            answer.as_bytes(),
        )
        .await;
        let reply = call.await.unwrap();
        assert_eq!(reply.status, 200, "the probe's answer: {}", reply.text());
        assert_eq!(reply.text(), answer, "the probe's answer");
    }
}

pub fn configmaps() -> pb::Kind {
    pb::Kind {
        group: String::new(),
        version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
        namespaced: true,
    }
}

pub fn cm_event(account: &str, t: EventType, name: &str, rv: &str, app: &str) -> Msg {
    Msg::Object(pb::ObjectEvent {
        account: account.into(),
        kind: Some(configmaps()),
        r#type: t as i32,
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: rv.into(),
        object_json: serde_json::to_vec(&serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": "default",
                "uid": format!("uid-{name}"),
                "resourceVersion": rv,
                "labels": { "app": app },
            },
            "data": { "rv": rv },
        }))
        .unwrap(),
        truncated: false,
        watch_namespace: String::new(),
    })
}

pub fn role(a: &pb::AccountAssignment) -> Role {
    Role::try_from(a.role).unwrap()
}

/// A GET through the proxy that `agent` answers with 200 and `body`: the request head the
/// agent received, and the client's answer.
pub async fn proxied_get(
    http: &Https,
    agent: &mut FakeAgent,
    path: &str,
    token: &str,
    body: &[u8],
) -> (pb::HttpRequestHead, Reply) {
    let call = {
        let (http, path, token) = (http.clone(), path.to_string(), token.to_string());
        tokio::spawn(async move { http.get(&path, Some(&token)).await })
    };
    let (exchange, head) = agent.request().await;
    agent
        .respond(exchange, 200, &[("content-type", "application/json")], body)
        .await;
    (head, call.await.unwrap())
}
