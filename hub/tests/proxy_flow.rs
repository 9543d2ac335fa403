//! Flow control and isolation of tunnelled exchanges, the point of the tunnel's design: a
//! client that stops reading a 50 MiB answer stops its agent (credit only comes back as the
//! client reads) and nothing else, neither the agent's object stream nor other exchanges on
//! the same stream; an agent that sends beyond its credit is cut off (RESOURCE_EXHAUSTED), its
//! client's body breaks, and another replica of the account takes over. The hub
//! serves HTTPS (HTTP/2, as kubectl speaks it); the agent is a fake speaking the real gRPC
//! protocol over mutual TLS.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use common::*;
use http_body_util::BodyExt as _;
use ring::digest;
use scale_agent_proto::v1::{
    account_assignment::Role, object_event::Type as EventType, tunnel_frame::Frame,
};
use tokio::sync::{Notify, oneshot};

const MIB: u64 = 1024 * 1024;
/// The big answer.
const TOTAL: u64 = 50 * MIB;
/// Where the client stops reading.
const PAUSE_AT: u64 = MIB;
/// Bytes the hub may have passed on towards a client that stopped reading, which it rightly
/// credits back: the HTTP/2 stream window of hyper's client (2 MiB), hyper's server send
/// buffer (400 KiB) and a frame, rounded up generously.
const TRANSPORT_SLACK: u64 = 4 * MIB;

/// The agent's side of a response body: sends only what the hub's credit allows, and checks
/// every credit the hub returns against what the client has read.
struct Upload {
    exchange: u64,
    window: u64,
    granted: u64,
    sent: u64,
    block: Vec<u8>,
    digest: digest::Context,
    /// Bytes the client has read, as it reports them.
    client_read: Arc<AtomicU64>,
}

impl Upload {
    /// Chunk `i` of the body: its index, then a fixed pseudo-random block, so that a lost,
    /// repeated or reordered chunk changes the checksum.
    fn chunk(&self, i: u64) -> Vec<u8> {
        let mut chunk = self.block.clone();
        chunk[..8].copy_from_slice(&i.to_le_bytes());
        chunk
    }

    /// Takes the credit the hub returned so far.
    fn take_credit(&mut self, a: &mut FakeAgent) {
        a.pump_ready().unwrap();
        let exchange = self.exchange;
        let mut kept = std::collections::VecDeque::new();
        for frame in a.tunnel.drain(..) {
            match (&frame.frame, frame.exchange == exchange) {
                (Some(Frame::WindowUpdate(n)), true) => {
                    self.granted += u64::from(*n);
                    assert!(
                        self.granted <= self.sent,
                        "the hub returned credit for {} bytes of {} received",
                        self.granted,
                        self.sent
                    );
                    let read = self.client_read.load(Ordering::SeqCst);
                    assert!(
                        self.granted <= read + TRANSPORT_SLACK,
                        "the hub returned credit for {} bytes while its client had read {read}",
                        self.granted
                    );
                }
                (Some(Frame::Reset(r)), true) => panic!("the hub reset the download: {r:?}"),
                _ => kept.push_back(frame),
            }
        }
        a.tunnel = kept;
    }

    fn out_of_credit(&self) -> bool {
        self.window + self.granted - self.sent < MAX_FRAME as u64
    }

    /// Sends what the credit allows; true when the whole body is sent.
    async fn send_allowed(&mut self, a: &mut FakeAgent) -> bool {
        while self.sent < TOTAL && !self.out_of_credit() {
            let chunk = self.chunk(self.sent / MAX_FRAME as u64);
            self.digest.update(&chunk);
            self.sent += chunk.len() as u64;
            a.send_data(self.exchange, &chunk, self.sent == TOTAL).await;
        }
        self.sent == TOTAL
    }
}

fn pseudo_random_block() -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..MAX_FRAME)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_download_stops_its_agent_and_nothing_else() {
    let pki = Pki::new();
    let dir = data_dir("flow-pause");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let token = token_for(&http, &admin_token(&dir), "prod").await;
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    a.snapshot("prod", &[("one", "1")], "1").await;
    a.synced().await;
    let window = u64::from(a.welcome.as_ref().unwrap().tunnel_window_bytes);

    // The client reads PAUSE_AT bytes, says so, and waits to be told to go on.
    let client_read = Arc::new(AtomicU64::new(0));
    let resume = Arc::new(Notify::new());
    let (paused_tx, mut paused) = oneshot::channel();
    let download = {
        let (http, token) = (http.clone(), token.clone());
        let (read, resume) = (client_read.clone(), resume.clone());
        tokio::spawn(async move {
            let request = http
                .request("GET", "/clusters/prod/api/v1/configmaps?limit=0")
                .header("authorization", format!("Bearer {token}"))
                .body(empty())
                .unwrap();
            let response = http.send(request).await;
            assert_eq!(response.status(), 200);
            let mut body = response.into_body();
            let mut sha = digest::Context::new(&digest::SHA256);
            let mut paused_tx = Some(paused_tx);
            while let Some(frame) = body.frame().await {
                let Ok(data) = frame.unwrap().into_data() else {
                    continue;
                };
                sha.update(&data);
                let n = read.fetch_add(data.len() as u64, Ordering::SeqCst) + data.len() as u64;
                if n >= PAUSE_AT
                    && let Some(tx) = paused_tx.take()
                {
                    tx.send(n).unwrap();
                    resume.notified().await;
                }
            }
            (read.load(Ordering::SeqCst), sha.finish())
        })
    };
    let (id, _) = a.request().await;
    a.respond_head(id, 200, &[("content-type", "application/json")], false)
        .await;
    let mut up = Upload {
        exchange: id,
        window,
        granted: 0,
        sent: 0,
        block: pseudo_random_block(),
        digest: digest::Context::new(&digest::SHA256),
        client_read: client_read.clone(),
    };

    // Until the client pauses, send what the credit allows.
    let read_at_pause = loop {
        up.take_credit(&mut a);
        up.send_allowed(&mut a).await;
        tokio::select! {
            pumped = a.pump() => pumped.unwrap(),
            n = &mut paused => break n.unwrap(),
        }
    };
    // Paused: credit dries up once the hub has passed on what the transport holds.
    loop {
        up.take_credit(&mut a);
        up.send_allowed(&mut a).await;
        match tokio::time::timeout(Duration::from_millis(500), a.pump()).await {
            Ok(pumped) => pumped.unwrap(),
            Err(_) if up.out_of_credit() => break,
            Err(_) => {}
        }
    }
    eprintln!(
        "paused at {read_at_pause} bytes read; the agent could send {} bytes",
        up.sent
    );
    assert!(
        up.sent <= window + read_at_pause + TRANSPORT_SLACK,
        "the agent could send {} bytes while the client had read {read_at_pause}",
        up.sent
    );

    // Meanwhile the object stream goes on: events are acknowledged and applied...
    let names: Vec<String> = (0..20).map(|i| format!("during-pause-{i:02}")).collect();
    for (i, name) in names.iter().enumerate() {
        a.send(cm_event(
            "prod",
            EventType::Applied,
            name,
            &(100 + i).to_string(),
            "web",
        ))
        .await;
    }
    a.synced().await;
    let listed = object_names_https(&http, &dir, "prod/objects?kind=configmaps").await;
    for name in &names {
        assert!(listed.contains(name), "{name} missing in {listed:?}");
    }

    // ...and another exchange on the same stream (and the same HTTP/2 connection) completes.
    let (head, reply) = proxied_get(
        &http,
        &mut a,
        "/clusters/prod/api/v1/namespaces/default",
        &token,
        br#"{"kind":"Namespace"}"#,
    )
    .await;
    assert_eq!(head.path_and_query, "/api/v1/namespaces/default");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["kind"], "Namespace");

    // Still paused, still blocked.
    up.take_credit(&mut a);
    assert_eq!(client_read.load(Ordering::SeqCst), read_at_pause);
    assert!(
        up.sent <= window + read_at_pause + TRANSPORT_SLACK && up.sent < TOTAL,
        "sent {} of {TOTAL} while the client was paused at {read_at_pause}",
        up.sent
    );

    // The client reads on: the rest arrives, intact.
    resume.notify_one();
    loop {
        up.take_credit(&mut a);
        if up.send_allowed(&mut a).await {
            break;
        }
        a.pump().await.unwrap();
    }
    let (read, client_sha) = tokio::time::timeout(Duration::from_secs(120), download)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read, TOTAL);
    assert_eq!(
        client_sha.as_ref(),
        up.digest.clone().finish().as_ref(),
        "the client's checksum"
    );
    // Credit for the tail the client read after the agent's last frame is of no use, but
    // harmless; nothing else may be left. All of it was queued before the client read that
    // tail, so before the head of a request made now, which the frames of the stream cannot
    // overtake: once that head is in, so is all the credit.
    let (_, reply) = proxied_get(
        &http,
        &mut a,
        "/clusters/prod/api/v1/namespaces/kube-system",
        &token,
        br#"{"kind":"Namespace"}"#,
    )
    .await;
    assert_eq!(reply.status, 200);
    a.tunnel
        .retain(|f| !(f.exchange == id && matches!(f.frame, Some(Frame::WindowUpdate(_)))));
    a.assert_no_tunnel_frames(&http, &token, "prod").await;

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_agent_beyond_its_window_is_cut_off_and_a_standby_takes_over() {
    let pki = Pki::new();
    let dir = data_dir("flow-greedy");
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.streams.heartbeat_period = Duration::from_secs(1);
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let token = token_for(&http, &admin_token(&dir), "prod").await;
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    a.snapshot("prod", &[("one", "1")], "1").await;
    a.synced().await;
    let mut b = tunnel_agent(&hub, &pki, "agent-a.test", "pod-2").await;
    assert_eq!(
        role(&b.register("prod", "https://10.0.0.1:6443").await),
        Role::Standby
    );

    // The client takes the head and reads nothing: only the transport holds what the hub
    // passes on, and the agent ignores the window.
    let send = {
        let (http, token) = (http.clone(), token.clone());
        tokio::spawn(async move {
            let request = http
                .request("GET", "/clusters/prod/api/v1/pods")
                .header("authorization", format!("Bearer {token}"))
                .body(empty())
                .unwrap();
            http.send(request).await
        })
    };
    // Round-robin: whichever replica got the exchange is the greedy one.
    let (greedy, other, id) = tokio::select! {
        (id, _) = a.request() => (&mut a, &mut b, id),
        (id, _) = b.request() => (&mut b, &mut a, id),
    };
    greedy.respond_head(id, 200, &[], false).await;
    let response = send.await.unwrap();
    assert_eq!(response.status(), 200);
    let chunk = vec![b'z'; MAX_FRAME];
    let mut sent = 0u64;
    let status = loop {
        if let Err(status) = greedy.pump_ready() {
            break status;
        }

        assert!(
            sent < TOTAL,
            "not cut off after {sent} bytes sent beyond any credit"
        );
        if !greedy.try_send_data(id, &chunk).await {
            break greedy.error().await;
        }
        sent += chunk.len() as u64;
        // Let the hub's answer come in now and then.
        if sent.is_multiple_of(8 * MIB) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("flow control"), "{status:?}");

    // The client of that exchange sees a broken body, not a complete one.
    let (bytes, error) = read_to_end(response.into_body()).await;
    assert!(
        error.is_some(),
        "the body ended cleanly after {} bytes",
        bytes.len()
    );
    assert!((bytes.len() as u64) < sent);

    // The other replica serves the account's next exchange, and its object stream goes on.
    let (_, reply) = proxied_get(&http, other, "/clusters/prod/version", &token, b"{}").await;
    assert_eq!(reply.status, 200);
    other
        .send(cm_event("prod", EventType::Applied, "after", "50", "web"))
        .await;
    other.synced().await;
    let listed = object_names_https(&http, &dir, "prod/objects?kind=configmaps").await;
    assert!(listed.contains(&"after".to_string()), "{listed:?}");

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
