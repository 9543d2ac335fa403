//! What crosses the Kubernetes API proxy's tunnel, and how exchanges end: request heads and
//! bodies as the agent receives them (credit respected), response heads and bodies as the
//! client receives them, cancellation from either side, the loss of an agent (watches end
//! cleanly, other bodies break, a GET moves to another replica, a POST is not resent), and
//! upgrades (exec, port-forward over SPDY or WebSocket: the 101 and the connection's bytes
//! both ways under the same flow control, the end from either side, a refusal as a normal
//! response). The hub serves HTTPS; the agents are fakes speaking the real gRPC protocol over
//! mutual TLS.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame as BodyFrame;
use hyper_util::rt::TokioIo;
use scale_agent_hub::RunningHub;
use scale_agent_proto::v1::{account_assignment::Role, tunnel_frame::Frame};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

struct Setup {
    pki: Pki,
    dir: std::path::PathBuf,
    hub: RunningHub,
    http: Https,
    h1: Https,
    admin: String,
}

async fn setup(name: &str) -> Setup {
    let pki = Pki::new();
    let dir = data_dir(name);
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let h1 = Https::for_hub(&pki, &hub, Proto::H1);
    let admin = admin_token(&dir);
    Setup {
        pki,
        dir,
        hub,
        http,
        h1,
        admin,
    }
}

impl Setup {
    async fn stop(self) {
        self.hub.shutdown().await.unwrap();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn header_values(head: &scale_agent_proto::v1::HttpRequestHead, name: &str) -> Vec<String> {
    head.headers
        .iter()
        .filter(|h| h.name == name)
        .map(|h| String::from_utf8(h.value.clone()).unwrap())
        .collect()
}

/// A request body of `len` bytes, streamed in pieces of odd sizes (so HTTP/1.1 sends it
/// chunked and the hub sees frames that do not fall on 64 KiB boundaries).
fn streamed_body(len: usize) -> (ReqBody, Vec<u8>) {
    let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let pieces: Vec<Result<BodyFrame<Bytes>, BoxError>> = bytes
        .chunks(100_003)
        .map(|c| Ok(BodyFrame::data(Bytes::copy_from_slice(c))))
        .collect();
    let body = StreamBody::new(futures::stream::iter(pieces)).boxed();
    (body, bytes)
}

/// The head names who called (issue 31): the token's name, a person unless it is
/// Clouddriver's token, and the hub's request id, which the agent sends the API server as
/// Audit-ID; an answer without its own `audit-id` gets the hub's.
#[tokio::test]
async fn the_head_names_the_caller_and_the_request_id() {
    let s = setup("tunnel-caller").await;
    let mut a = tunnel_agent(&s.hub, &s.pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    for (token_name, person) in [("alice", true), ("clouddriver", false)] {
        let token =
            kubeconfig_token(&issue_kubeconfig(&s.http, &s.admin, "prod", token_name).await);
        let call = {
            let http = s.http.clone();
            tokio::spawn(async move {
                http.with_token(
                    "DELETE",
                    "/clusters/prod/api/v1/namespaces/default/configmaps/x",
                    &token,
                    Bytes::new(),
                )
                .await
            })
        };
        let (id, head) = a.request().await;
        let caller = head.caller.clone().expect("the hub names the caller");
        assert_eq!(
            (caller.user.as_str(), caller.person, caller.groups.len()),
            (token_name, person, 0)
        );
        assert_eq!(head.audit_id.len(), 36, "a UUID: {head:?}");
        a.respond_head(id, 204, &[], true).await;
        let reply = call.await.unwrap();
        assert_eq!(reply.status, 204);
        assert_eq!(
            reply.header("audit-id").as_deref(),
            Some(head.audit_id.as_str())
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn requests_and_answers_cross_the_tunnel_as_sent() {
    let s = setup("tunnel-semantics").await;
    let mut a = tunnel_agent(&s.hub, &s.pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    let token = token_for(&s.http, &s.admin, "prod").await;
    let window = a.welcome.as_ref().unwrap().tunnel_window_bytes as usize;
    assert_eq!(window, 1024 * 1024);

    // A POST with everything a proxy must not pass on, over HTTP/1.1 (hop-by-hop headers
    // exist only there), and a body three times the window.
    let path = "/api/v1/namespaces/team%3Aa/configmaps?fieldManager=kubectl-client-side-apply&labelSelector=app%3Dweb%2Ctier+in+%28x%29&limit=500";
    let (body, sent) = streamed_body(3 * window + 12_345);
    let request =
        s.h1.request("POST", &format!("/clusters/prod{path}"))
            .header("authorization", format!("Bearer {token}"))
            .header("cookie", "session=secret")
            .header("impersonate-user", "system:admin")
            .header("impersonate-group", "system:masters")
            .header("impersonate-extra-scopes", "all")
            .header("impersonate-uid", "0")
            .header("proxy-authorization", "Basic eDp5")
            .header("connection", "keep-alive, x-hop")
            .header("keep-alive", "timeout=5")
            .header("x-hop", "1")
            .header("te", "trailers")
            .header("accept", "application/json, */*")
            .header("content-type", "application/json")
            .header("user-agent", "kubectl/v1.37.1 (linux/amd64)")
            .header("x-custom", "kept")
            .body(body)
            .unwrap();
    let call = {
        let h1 = s.h1.clone();
        tokio::spawn(async move { h1.call(request).await })
    };
    let (id, head) = a.request().await;
    assert_eq!(head.account, "prod");
    assert_eq!(head.method, "POST");
    assert_eq!(head.path_and_query, path, "percent-encoding and query kept");
    assert!(!head.end_of_body, "a body follows");
    let mut names: Vec<&str> = head.headers.iter().map(|h| h.name.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(
        names,
        ["accept", "content-type", "user-agent", "x-custom"],
        "{head:?}"
    );
    assert_eq!(header_values(&head, "accept"), ["application/json, */*"]);
    assert_eq!(header_values(&head, "x-custom"), ["kept"]);

    // The body, granting credit slowly in pieces that are not whole frames.
    let (received, granted, ended) = receive_granting(&mut a, id, window, None).await;
    assert!(ended, "the body ended");
    assert!(received == sent, "the body arrived intact");
    assert!(granted > 0, "the body needed more than the first window");

    // The answer: status and headers (Warning several times) as the API server sent them.
    let answer = br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x"}}"#;
    a.respond(
        id,
        201,
        &[
            ("content-type", "application/json"),
            ("warning", "299 - \"first\""),
            ("warning", "299 - \"second\""),
            ("warning", "299 - \"third\""),
            ("audit-id", "6e1b3b3e-0000"),
            ("keep-alive", "timeout=99"),
        ],
        answer,
    )
    .await;
    let reply = call.await.unwrap();
    assert_eq!(reply.status, 201, "{}", reply.text());
    let warnings: Vec<&str> = reply
        .headers
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(
        warnings,
        ["299 - \"first\"", "299 - \"second\"", "299 - \"third\""]
    );
    assert_eq!(reply.header("audit-id").as_deref(), Some("6e1b3b3e-0000"));
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(reply.header("keep-alive"), None, "hop-by-hop");
    assert_eq!(&reply.body[..], answer);

    // A DELETE answered 204 with no body (end_of_body on the head), over HTTP/2.
    let call = {
        let http = s.http.clone();
        let token = token.clone();
        tokio::spawn(async move {
            http.with_token(
                "DELETE",
                "/clusters/prod/api/v1/namespaces/default/configmaps/x",
                &token,
                Bytes::new(),
            )
            .await
        })
    };
    let (id, head) = a.request().await;
    assert_eq!(head.method, "DELETE");
    assert!(head.end_of_body, "no request body");
    a.respond_head(id, 204, &[("audit-id", "2")], true).await;
    let reply = call.await.unwrap();
    assert_eq!(reply.status, 204);
    assert!(reply.body.is_empty());
    assert_eq!(reply.header("audit-id").as_deref(), Some("2"));
    a.assert_no_tunnel_frames(&s.http, &token, "prod").await;

    s.stop().await;
}

#[tokio::test]
async fn a_client_that_goes_away_resets_its_exchange() {
    let s = setup("tunnel-client-gone").await;
    let mut a = tunnel_agent(&s.hub, &s.pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    let token = token_for(&s.http, &s.admin, "prod").await;
    let window = a.welcome.as_ref().unwrap().tunnel_window_bytes as usize;

    // HTTP/1.1: the connection closes; HTTP/2: the stream is reset. Either ends the exchange.
    for client in [&s.h1, &s.http] {
        let request = client
            .request("GET", "/clusters/prod/api/v1/pods?limit=0")
            .header("authorization", format!("Bearer {token}"))
            .body(empty())
            .unwrap();
        let send = {
            let client = client.clone();
            tokio::spawn(async move { client.send(request).await })
        };
        let (id, _) = a.request().await;
        a.respond_head(id, 200, &[("content-type", "application/json")], false)
            .await;
        a.send_data(id, &[b'x'; 1000], false).await;
        let mut body = send.await.unwrap().into_body();
        let first = tokio::time::timeout(WAIT, body.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(first.is_data());
        drop(body);
        // The hub notices when it writes to a closed connection: keep the body coming
        // (within the credit) until the reset arrives.
        let mut sent = 1000;
        let reason = loop {
            a.pump_ready().unwrap();
            if let Some(i) = a
                .tunnel
                .iter()
                .position(|f| f.exchange == id && matches!(f.frame, Some(Frame::Reset(_))))
            {
                let Some(Frame::Reset(reset)) = a.tunnel.remove(i).unwrap().frame else {
                    unreachable!()
                };
                break reset.reason;
            }
            if sent + MAX_FRAME <= window {
                a.send_data(id, &[b'y'; MAX_FRAME], false).await;
                sent += MAX_FRAME;
            } else {
                a.pump().await.unwrap();
            }
        };
        assert!(reason.contains("client went away"), "{reason}");
        a.tunnel.retain(|f| f.exchange != id);
        // Frames of a reset exchange are ignored.
        a.send_data(id, b"late", true).await;
    }
    a.assert_no_tunnel_frames(&s.http, &token, "prod").await;

    s.stop().await;
}

#[tokio::test]
async fn an_agent_past_the_window_is_cut_off() {
    let s = setup("tunnel-over-window").await;
    let mut a = tunnel_agent(&s.hub, &s.pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    let token = token_for(&s.http, &s.admin, "prod").await;
    let window = a.welcome.as_ref().unwrap().tunnel_window_bytes as usize;
    // A client that does not read the body: no credit comes back.
    let request = s
        .http
        .request("GET", "/clusters/prod/api/v1/pods")
        .header("authorization", format!("Bearer {token}"))
        .body(empty())
        .unwrap();
    let send = {
        let client = s.http.clone();
        tokio::spawn(async move { client.send(request).await })
    };
    let (id, _) = a.request().await;
    a.respond_head(id, 200, &[("content-type", "application/json")], false)
        .await;
    // The client's HTTP/2 buffers take some of the body and credit comes back for it; an
    // agent that ignores the credit it has sends until it is past window + credit.
    let (mut sent, mut credited) = (0, 0);
    let status = loop {
        if let Err(status) = a.pump_ready() {
            break status;
        }
        for f in a.tunnel.drain(..) {
            if let (true, Some(Frame::WindowUpdate(c))) = (f.exchange == id, f.frame) {
                credited += c as usize;
            }
        }
        // The hub may hold back credit for bytes its client took (it returns credit in
        // batches), so the agent goes a few frames further before it waits.
        if sent <= window + credited + 4 * MAX_FRAME {
            if !a.try_send_data(id, &[b'x'; MAX_FRAME]).await {
                break a.error().await;
            }
            sent += MAX_FRAME;
        } else if let Err(status) = a.pump().await {
            break status;
        }
        assert!(sent < 64 << 20, "the hub never cut the agent off");
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains(&format!("past the window of {window} bytes")),
        "{status:?}"
    );
    assert!(
        status.message().contains("only within the credit"),
        "{status:?}"
    );
    // The client's response breaks rather than ending as if complete.
    let response = send.await.unwrap();
    let (bytes, error) = read_to_end(response.into_body()).await;
    assert!(
        error.is_some(),
        "the body must not end cleanly (got {} bytes)",
        bytes.len()
    );
    s.stop().await;
}

#[tokio::test]
async fn an_agent_reset_before_the_head_is_a_bad_gateway() {
    let s = setup("tunnel-agent-reset").await;
    let mut a = tunnel_agent(&s.hub, &s.pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    let token = token_for(&s.http, &s.admin, "prod").await;
    let call = {
        let (http, token) = (s.http.clone(), token.clone());
        tokio::spawn(async move { http.get("/clusters/prod/api/v1/nodes", Some(&token)).await })
    };
    let (id, _) = a.request().await;
    let reason = "dial tcp 10.0.0.1:6443: connect: connection refused";
    a.send_frame(
        id,
        Frame::Reset(scale_agent_proto::v1::TunnelReset {
            reason: reason.into(),
        }),
    )
    .await;
    let reply = call.await.unwrap();
    let message = reply.k8s_status(502, "InternalError");
    assert!(message.contains(reason), "{message}");
    assert!(message.contains("\"prod\""), "{message}");
    a.assert_no_tunnel_frames(&s.http, &token, "prod").await;
    s.stop().await;
}

#[tokio::test]
async fn a_lost_agent_ends_watches_cleanly_and_breaks_other_bodies() {
    let s = setup("tunnel-agent-lost").await;
    let mut a = tunnel_agent(&s.hub, &s.pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    let token = token_for(&s.http, &s.admin, "prod").await;

    // HTTP/1.1, where a clean end is the last chunk of the chunked encoding.
    let mut open = Vec::new();
    for path in [
        "/clusters/prod/api/v1/configmaps?watch=true&resourceVersion=5&allowWatchBookmarks=true",
        "/clusters/prod/api/v1/configmaps?limit=500",
    ] {
        let request =
            s.h1.request("GET", path)
                .header("authorization", format!("Bearer {token}"))
                .body(empty())
                .unwrap();
        let send = {
            let h1 = s.h1.clone();
            tokio::spawn(async move { h1.send(request).await })
        };
        let (id, head) = a.request().await;
        a.respond_head(id, 200, &[("content-type", "application/json")], false)
            .await;
        let data = format!("{{\"part of\":\"{}\"}}\n", head.path_and_query);
        a.send_data(id, data.as_bytes(), false).await;
        let response = send.await.unwrap();
        assert_eq!(response.status(), 200);
        open.push((response, data));
    }
    let (list, list_data) = open.pop().unwrap();
    let (watch, watch_data) = open.pop().unwrap();
    assert_eq!(
        watch.headers()["transfer-encoding"],
        "chunked",
        "the watch's end is the chunked encoding's"
    );

    drop(a);
    let (bytes, error) = read_to_end(watch.into_body()).await;
    assert!(error.is_none(), "the watch ended with {error:?}");
    assert_eq!(String::from_utf8(bytes).unwrap(), watch_data);
    let (bytes, error) = read_to_end(list.into_body()).await;
    assert!(error.is_some(), "a cut list must not look complete");
    assert_eq!(String::from_utf8(bytes).unwrap(), list_data);

    s.stop().await;
}

#[tokio::test]
async fn a_get_moves_to_another_replica_when_its_agent_leaves_but_a_post_does_not() {
    let s = setup("tunnel-retry").await;
    let mut a = tunnel_agent(&s.hub, &s.pki, "agent-a.test", "pod-1").await;
    assert_eq!(
        role(&a.register("prod", "https://10.0.0.1:6443").await),
        Role::Streaming
    );
    let mut b = tunnel_agent(&s.hub, &s.pki, "agent-a.test", "pod-2").await;
    assert_eq!(
        role(&b.register("prod", "https://10.0.0.1:6443").await),
        Role::Standby
    );
    let token = token_for(&s.http, &s.admin, "prod").await;
    let path = "/clusters/prod/api/v1/namespaces/default/pods/web-0";

    // Requests alternate between the replicas: until one lands on the streaming replica a,
    // b answers.
    let mut tries = 0;
    let (call, head) = loop {
        tries += 1;
        assert!(
            tries <= 3,
            "the requests never reached the streaming replica"
        );
        let call = {
            let (http, token) = (s.http.clone(), token.clone());
            tokio::spawn(async move { http.get(path, Some(&token)).await })
        };
        tokio::select! {
            (_, head) = a.request() => break (call, head),
            (id, _) = b.request() => {
                b.respond(id, 200, &[], b"{}").await;
                assert_eq!(call.await.unwrap().status, 200);
            }
        }
    };
    assert_eq!(head.path_and_query, "/api/v1/namespaces/default/pods/web-0");
    // a leaves before answering: the GET is sent again, to the standby.
    drop(a);
    let (id, again) = b.request().await;
    assert_eq!(again.method, "GET");
    assert_eq!(again.path_and_query, head.path_and_query);
    b.respond(
        id,
        200,
        &[("content-type", "application/json")],
        br#"{"from":"b"}"#,
    )
    .await;
    let reply = call.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["from"], "b");

    // A POST whose replica leaves before answering is not sent again: 503.
    let mut a = tunnel_agent(&s.hub, &s.pki, "agent-a.test", "pod-1").await;
    assert_eq!(
        role(&a.register("prod", "https://10.0.0.1:6443").await),
        Role::Standby
    );
    let call = {
        let (http, token) = (s.http.clone(), token.clone());
        tokio::spawn(async move {
            http.with_token(
                "POST",
                "/clusters/prod/api/v1/namespaces/default/configmaps",
                &token,
                r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x"}}"#,
            )
            .await
        })
    };
    let mut other = tokio::select! {
        _ = a.request() => { drop(a); b }
        _ = b.request() => { drop(b); a }
    };
    let message = call.await.unwrap().k8s_status(503, "ServiceUnavailable");
    assert!(
        message.contains("disconnected before answering"),
        "{message}"
    );
    // The survivor, now the only replica, never saw the POST.
    other.assert_no_tunnel_frames(&s.http, &token, "prod").await;

    s.stop().await;
}

/// Bytes of an upgraded connection, in a pattern that shows a lost, repeated or reordered
/// piece.
/// Receives the data frames of exchange `id` as a well-behaved agent: checks each frame's
/// size and that the hub never sends beyond `window` plus the credit granted, and grants
/// 200 000 bytes at a time (not whole frames) only when the hub has used up its credit.
/// Stops at the end of the body, or once `until` bytes arrived. Returns the bytes, the credit
/// granted, and whether the body ended.
async fn receive_granting(
    a: &mut FakeAgent,
    id: u64,
    window: usize,
    until: Option<usize>,
) -> (Vec<u8>, usize, bool) {
    let grant = 200_000;
    let (mut granted, mut received) = (0usize, Vec::new());
    while until.is_none_or(|n| received.len() < n) {
        let frame = if window + granted - received.len() < MAX_FRAME {
            // Not enough credit left for a whole frame: whatever the hub may still send
            // arrives now, then it must wait for us.
            match tokio::time::timeout(Duration::from_millis(50), a.frame_of(id)).await {
                Ok(frame) => frame,
                Err(_) => {
                    a.send_frame(id, Frame::WindowUpdate(grant as u32)).await;
                    granted += grant;
                    continue;
                }
            }
        } else {
            a.frame_of(id).await
        };
        let Frame::Data(data) = frame else {
            panic!("expected body data, got {frame:?}")
        };
        assert!(
            data.data.len() <= MAX_FRAME,
            "a frame of {}",
            data.data.len()
        );
        received.extend_from_slice(&data.data);
        assert!(
            received.len() <= window + granted,
            "the hub sent {} bytes with {} of credit",
            received.len(),
            window + granted
        );
        if data.end_of_body {
            return (received, granted, true);
        }
    }
    (received, granted, false)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i % 253) as u8).wrapping_add(seed))
        .collect()
}

/// Sends a client's upgrade request over HTTP/1.1 (h2 has no Upgrade); the response head is
/// awaited later.
fn spawn_upgrade(
    h1: &Https,
    method: &str,
    path: &str,
    token: &str,
    headers: &[(&str, &str)],
) -> tokio::task::JoinHandle<http::Response<hyper::body::Incoming>> {
    let mut request = h1
        .request(method, &format!("/clusters/prod{path}"))
        .header("authorization", format!("Bearer {token}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(empty()).unwrap();
    let h1 = h1.clone();
    tokio::spawn(async move { h1.send(request).await })
}

/// The names of a request head's headers, sorted, once each.
fn header_names(head: &scale_agent_proto::v1::HttpRequestHead) -> Vec<&str> {
    let mut names: Vec<&str> = head.headers.iter().map(|h| h.name.as_str()).collect();
    names.sort();
    names.dedup();
    names
}

#[tokio::test]
async fn upgrades_carry_the_connections_bytes_both_ways() {
    let s = setup("tunnel-upgrade").await;
    let mut a = tunnel_agent(&s.hub, &s.pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    let token = token_for(&s.http, &s.admin, "prod").await;
    let window = a.welcome.as_ref().unwrap().tunnel_window_bytes as usize;

    // kubectl exec over SPDY: the head reaches the agent with the upgrade it asks for, and
    // without the caller's credentials.
    let path =
        "/api/v1/namespaces/default/pods/web-0/exec?command=sh&stdin=true&stdout=true&stderr=true";
    let send = spawn_upgrade(
        &s.h1,
        "POST",
        path,
        &token,
        &[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v4.channel.k8s.io"),
            ("x-stream-protocol-version", "v3.channel.k8s.io"),
            ("user-agent", "kubectl/v1.29.0 (linux/amd64)"),
        ],
    );
    let (id, head) = a.request().await;
    assert_eq!(head.account, "prod");
    assert_eq!(head.method, "POST");
    assert_eq!(head.path_and_query, path);
    assert!(!head.end_of_body, "the connection's bytes follow the 101");
    assert_eq!(
        header_names(&head),
        [
            "connection",
            "upgrade",
            "user-agent",
            "x-stream-protocol-version"
        ],
        "{head:?}"
    );
    assert_eq!(header_values(&head, "connection"), ["Upgrade"]);
    assert_eq!(header_values(&head, "upgrade"), ["SPDY/3.1"]);
    assert_eq!(
        header_values(&head, "x-stream-protocol-version"),
        ["v4.channel.k8s.io", "v3.channel.k8s.io"]
    );

    // The API server switches protocols: so does the client, with the headers it needs.
    a.respond_head(
        id,
        101,
        &[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v4.channel.k8s.io"),
        ],
        false,
    )
    .await;
    let response = send.await.unwrap();
    assert_eq!(response.status(), 101);
    let header = |name: &str| response.headers()[name].to_str().unwrap().to_string();
    assert_eq!(header("connection"), "Upgrade");
    assert_eq!(header("upgrade"), "SPDY/3.1");
    assert_eq!(header("x-stream-protocol-version"), "v4.channel.k8s.io");
    let upgraded = tokio::time::timeout(WAIT, hyper::upgrade::on(response))
        .await
        .expect("the client's connection did not upgrade in time")
        .unwrap();
    let (mut from_hub, mut to_hub) = tokio::io::split(TokioIo::new(upgraded));

    // Client to agent: more than a window, within the agent's credit, granted slowly in
    // pieces that are not whole frames.
    let up = pattern(2 * window + 12_345, 0);
    let writer = {
        let up = up.clone();
        tokio::spawn(async move {
            to_hub.write_all(&up).await.unwrap();
            to_hub.flush().await.unwrap();
            to_hub
        })
    };
    let (received, granted, ended) = receive_granting(&mut a, id, window, Some(up.len())).await;
    assert!(!ended, "the client did not close its side");
    assert!(received == up, "the client's bytes arrived intact");
    assert!(granted > 0, "the bytes needed more than the first window");
    let to_hub = tokio::time::timeout(WAIT, writer).await.unwrap().unwrap();

    // Agent to client: more than a window, sent only as the hub returns credit, which it
    // does as it writes to the client.
    let down = pattern(2 * window + 777, 100);
    let reader = tokio::spawn(async move {
        let mut bytes = Vec::new();
        tokio::time::timeout(WAIT, from_hub.read_to_end(&mut bytes))
            .await
            .expect("the upgraded connection did not end in time")
            .unwrap();
        bytes
    });
    let (mut sent, mut credit, mut returned) = (0usize, window, 0usize);
    while sent < down.len() {
        a.pump_ready().unwrap();
        let mut kept = std::collections::VecDeque::new();
        for frame in a.tunnel.drain(..) {
            match (&frame.frame, frame.exchange == id) {
                (Some(Frame::WindowUpdate(n)), true) => {
                    credit += *n as usize;
                    returned += *n as usize;
                    assert!(
                        returned <= sent,
                        "the hub returned credit for {returned} bytes of {sent} sent"
                    );
                }
                (_, true) => panic!("expected credit only, got {frame:?}"),
                _ => kept.push_back(frame),
            }
        }
        a.tunnel = kept;
        let n = MAX_FRAME.min(down.len() - sent).min(credit);
        if n == 0 {
            a.pump().await.unwrap();
            continue;
        }
        a.send_data(id, &down[sent..sent + n], false).await;
        sent += n;
        credit -= n;
    }
    assert!(returned > 0, "the bytes needed more than the first window");

    // The API server's side ends: so does the client's connection, after every byte.
    a.send_data(id, &[], true).await;
    let bytes = reader.await.unwrap();
    assert_eq!(bytes.len(), down.len());
    assert!(bytes == down, "the agent's bytes arrived intact");
    // Nothing but credit followed for that exchange (no reset: it ended). The credit was
    // queued before the client's connection ended, so before the head of a request made
    // now, which the frames of the stream cannot overtake.
    let (_, reply) = proxied_get(
        &s.http,
        &mut a,
        "/clusters/prod/api/v1/namespaces/default/pods/web-0",
        &token,
        b"{}",
    )
    .await;
    assert_eq!(reply.status, 200);
    a.tunnel
        .retain(|f| !(f.exchange == id && matches!(f.frame, Some(Frame::WindowUpdate(_)))));
    a.assert_no_tunnel_frames(&s.http, &token, "prod").await;
    // The client's side stays open until now: only the agent ended the exchange.
    drop(to_hub);

    // An upgrade the API server refuses (exec over WebSocket, as kubectl >= 1.30 asks):
    // its answer reaches the client as a normal response.
    let path = "/api/v1/namespaces/default/pods/web-0/exec?command=date&stdout=true";
    let send = spawn_upgrade(
        &s.h1,
        "GET",
        path,
        &token,
        &[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-version", "13"),
            ("sec-websocket-protocol", "v5.channel.k8s.io"),
        ],
    );
    let (id, head) = a.request().await;
    assert_eq!(head.method, "GET");
    assert_eq!(head.path_and_query, path);
    assert!(!head.end_of_body);
    assert_eq!(
        header_names(&head),
        [
            "connection",
            "sec-websocket-key",
            "sec-websocket-protocol",
            "sec-websocket-version",
            "upgrade"
        ],
        "{head:?}"
    );
    assert_eq!(header_values(&head, "upgrade"), ["websocket"]);
    assert_eq!(
        header_values(&head, "sec-websocket-protocol"),
        ["v5.channel.k8s.io"]
    );
    let refusal = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"web-0\" is forbidden: User \"system:serviceaccount:scale-agent:demo-agent\" cannot create resource \"pods/exec\"","reason":"Forbidden","code":403}"#;
    a.respond(
        id,
        403,
        &[("content-type", "application/json"), ("audit-id", "403-1")],
        refusal,
    )
    .await;
    let reply = read_all(send.await.unwrap()).await;
    assert_eq!(reply.status, 403, "{}", reply.text());
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(reply.header("audit-id").as_deref(), Some("403-1"));
    assert_eq!(reply.header("upgrade"), None);
    assert_eq!(&reply.body[..], refusal);
    a.assert_no_tunnel_frames(&s.http, &token, "prod").await;

    s.stop().await;
}

#[tokio::test]
async fn a_client_that_leaves_an_upgraded_connection_resets_its_exchange() {
    let s = setup("tunnel-upgrade-client-gone").await;
    let mut a = tunnel_agent(&s.hub, &s.pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    let token = token_for(&s.http, &s.admin, "prod").await;
    let window = a.welcome.as_ref().unwrap().tunnel_window_bytes as usize;

    // port-forward over WebSocket.
    let send = spawn_upgrade(
        &s.h1,
        "GET",
        "/api/v1/namespaces/default/pods/web-0/portforward?ports=8080",
        &token,
        &[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-version", "13"),
            ("sec-websocket-protocol", "v4.channel.k8s.io"),
        ],
    );
    let (id, _) = a.request().await;
    a.respond_head(
        id,
        101,
        &[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
            ("sec-websocket-protocol", "v4.channel.k8s.io"),
        ],
        false,
    )
    .await;
    let response = send.await.unwrap();
    assert_eq!(response.status(), 101);
    assert_eq!(response.headers()["upgrade"], "websocket");
    assert_eq!(
        response.headers()["sec-websocket-accept"],
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
    let upgraded = tokio::time::timeout(WAIT, hyper::upgrade::on(response))
        .await
        .unwrap()
        .unwrap();
    let mut io = TokioIo::new(upgraded);
    io.write_all(b"\x82\x03abc").await.unwrap();
    io.flush().await.unwrap();
    let Frame::Data(data) = a.frame_of(id).await else {
        panic!("expected the client's bytes")
    };
    assert_eq!(data.data, b"\x82\x03abc");
    a.send_data(id, b"\x82\x03xyz", false).await;
    let mut got = [0u8; 5];
    tokio::time::timeout(WAIT, io.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got, b"\x82\x03xyz");

    // The client goes away. The hub notices at the latest when it writes to the closed
    // connection: keep the bytes coming (within the credit) until the reset arrives.
    drop(io);
    let mut sent = 5;
    let reason = loop {
        a.pump_ready().unwrap();
        let mut reset = None;
        let mut kept = std::collections::VecDeque::new();
        for frame in a.tunnel.drain(..) {
            match (&frame.frame, frame.exchange == id) {
                (Some(Frame::Reset(r)), true) => reset = Some(r.reason.clone()),
                // The client's end of stream (the hub may read it before it fails to
                // write), never after the reset.
                (Some(Frame::Data(d)), true) if d.data.is_empty() && d.end_of_body => {
                    assert!(reset.is_none(), "data after the reset");
                }
                (Some(Frame::WindowUpdate(_)), true) => {}
                (_, true) => panic!("unexpected {frame:?}"),
                _ => kept.push_back(frame),
            }
        }
        a.tunnel = kept;
        if let Some(reason) = reset {
            break reason;
        }
        if sent + MAX_FRAME <= window {
            a.send_data(id, &[b'y'; MAX_FRAME], false).await;
            sent += MAX_FRAME;
            tokio::time::sleep(Duration::from_millis(10)).await;
        } else {
            a.pump().await.unwrap();
        }
    };
    assert!(reason.contains("client went away"), "{reason}");
    // Frames of a reset exchange are ignored.
    a.send_data(id, b"late", true).await;
    a.assert_no_tunnel_frames(&s.http, &token, "prod").await;

    s.stop().await;
}
