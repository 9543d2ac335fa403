//! The proxy's discovery cache at the hub level: a discovery document reaches the agent
//! once, later requests are answered by the hub (per path and Accept, with ETag
//! revalidation by the client), and a change of the cluster's kinds (the agent's
//! DiscoveryChanged, or a CRD written through the proxy) sends the next request to the agent
//! again. The hub serves HTTPS; the agent is a fake speaking the real gRPC protocol over
//! mutual TLS.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use scale_agent_proto::v1::{self as pb, agent_message::Kind as Msg, tunnel_frame::Frame};

/// kubectl's Accept for aggregated discovery.
const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
const AGGREGATED_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// A GET with a token, an Accept and maybe an If-None-Match, whose answer is awaited later.
fn spawn_get(
    http: &Https,
    path: &str,
    token: &str,
    accept: &str,
    if_none_match: Option<&str>,
) -> tokio::task::JoinHandle<Reply> {
    let mut request = http
        .request("GET", path)
        .header("authorization", format!("Bearer {token}"))
        .header("accept", accept);
    if let Some(etag) = if_none_match {
        request = request.header("if-none-match", etag);
    }
    let request = request.body(empty()).unwrap();
    let http = http.clone();
    tokio::spawn(async move { http.call(request).await })
}

/// A request the agent must not see: answered by the hub alone.
async fn from_cache(
    http: &Https,
    a: &mut FakeAgent,
    path: &str,
    token: &str,
    accept: &str,
    if_none_match: Option<&str>,
) -> Reply {
    let reply = spawn_get(http, path, token, accept, if_none_match)
        .await
        .unwrap();
    let account = path
        .strip_prefix("/clusters/")
        .and_then(|rest| rest.split('/').next())
        .unwrap();
    a.assert_no_tunnel_frames(http, token, account).await;
    reply
}

/// A request the agent answers with `body` and `content_type` (and an ETag): returns the
/// request head the agent saw and the reply.
async fn from_agent(
    http: &Https,
    a: &mut FakeAgent,
    path: &str,
    token: &str,
    accept: &str,
    answer: (&str, &str, &[u8]),
) -> (pb::HttpRequestHead, Reply) {
    let call = spawn_get(http, path, token, accept, None);
    let (id, head) = a.request().await;
    let (content_type, etag, body) = answer;
    a.respond(
        id,
        200,
        &[("content-type", content_type), ("etag", etag)],
        body,
    )
    .await;
    (head, call.await.unwrap())
}

fn accept_of(head: &pb::HttpRequestHead) -> String {
    head.headers
        .iter()
        .find(|h| h.name == "accept")
        .map(|h| String::from_utf8(h.value.clone()).unwrap())
        .unwrap_or_default()
}

#[tokio::test]
async fn discovery_is_cached_until_the_kinds_change() {
    let pki = Pki::new();
    let dir = data_dir("proxy-discovery");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    a.register("dev", "https://10.0.0.2:6443").await;
    let prod = token_for(&http, &admin, "prod").await;
    let dev = token_for(&http, &admin, "dev").await;

    // First aggregated /api: through the tunnel, kept.
    let aggregated_v1 = br#"{"kind":"APIGroupDiscoveryList","items":[{"versions":["v1"]}]}"#;
    let (head, first) = from_agent(
        &http,
        &mut a,
        "/clusters/prod/api",
        &prod,
        AGGREGATED,
        (AGGREGATED_TYPE, "\"agg-1\"", aggregated_v1),
    )
    .await;
    assert_eq!(head.path_and_query, "/api");
    assert_eq!(accept_of(&head), AGGREGATED);
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-scale-agent-cache").as_deref(), Some("miss"));
    assert_eq!(&first.body[..], aggregated_v1);

    // Second: from the cache, the same document.
    let second = from_cache(&http, &mut a, "/clusters/prod/api", &prod, AGGREGATED, None).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.header("x-scale-agent-cache").as_deref(), Some("hit"));
    assert_eq!(second.body, first.body);
    assert_eq!(
        second.header("content-type").as_deref(),
        Some(AGGREGATED_TYPE)
    );
    assert_eq!(second.header("etag").as_deref(), Some("\"agg-1\""));

    // Plain JSON is another document of the same path.
    let legacy = br#"{"kind":"APIVersions","versions":["v1"]}"#;
    let (head, reply) = from_agent(
        &http,
        &mut a,
        "/clusters/prod/api",
        &prod,
        "application/json",
        ("application/json", "\"legacy-1\"", legacy),
    )
    .await;
    assert_eq!(accept_of(&head), "application/json");
    assert_eq!(reply.header("x-scale-agent-cache").as_deref(), Some("miss"));
    let reply = from_cache(
        &http,
        &mut a,
        "/clusters/prod/api",
        &prod,
        "application/json",
        None,
    )
    .await;
    assert_eq!(reply.header("x-scale-agent-cache").as_deref(), Some("hit"));
    assert_eq!(&reply.body[..], legacy);
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("application/json")
    );

    // The client's own ETag: 304 from the cache.
    let reply = from_cache(
        &http,
        &mut a,
        "/clusters/prod/api",
        &prod,
        AGGREGATED,
        Some("\"agg-1\""),
    )
    .await;
    assert_eq!(reply.status, 304);
    assert!(reply.body.is_empty());
    assert_eq!(reply.header("etag").as_deref(), Some("\"agg-1\""));

    // The agent reports new kinds (a regular message, acknowledged once applied): the next
    // request reaches it again.
    a.send(Msg::DiscoveryChanged(pb::DiscoveryChanged {
        account: "prod".into(),
    }))
    .await;
    a.synced().await;
    let aggregated_v2 = br#"{"kind":"APIGroupDiscoveryList","items":[{"versions":["v1","v2"]}]}"#;
    let (head, reply) = from_agent(
        &http,
        &mut a,
        "/clusters/prod/api",
        &prod,
        AGGREGATED,
        (AGGREGATED_TYPE, "\"agg-2\"", aggregated_v2),
    )
    .await;
    assert_eq!(head.path_and_query, "/api");
    assert_eq!(reply.header("x-scale-agent-cache").as_deref(), Some("miss"));
    assert_eq!(&reply.body[..], aggregated_v2);

    // Another account's cache is its own: writing a CRD through the proxy drops it, once the
    // write succeeded.
    let groups = br#"{"kind":"APIGroupDiscoveryList","items":[]}"#;
    let (_, reply) = from_agent(
        &http,
        &mut a,
        "/clusters/dev/apis",
        &dev,
        AGGREGATED,
        (AGGREGATED_TYPE, "\"apis-1\"", groups),
    )
    .await;
    assert_eq!(reply.header("x-scale-agent-cache").as_deref(), Some("miss"));
    let crds = "/clusters/dev/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    let crd = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.example.com"}}"#;
    for (status, cached_after) in [(409, "hit"), (201, "miss")] {
        let call = {
            let (http, dev) = (http.clone(), dev.clone());
            tokio::spawn(async move { http.with_token("POST", crds, &dev, crd).await })
        };
        let (id, head) = a.request().await;
        assert_eq!(head.method, "POST");
        let mut body = Vec::new();
        loop {
            let Frame::Data(data) = a.frame_of(id).await else {
                panic!("expected the CRD")
            };
            body.extend_from_slice(&data.data);
            if data.end_of_body {
                break;
            }
        }
        assert_eq!(body, crd.as_bytes());
        a.respond(id, status, &[("content-type", "application/json")], b"{}")
            .await;
        assert_eq!(call.await.unwrap().status, u16::try_from(status).unwrap());
        let reply = if cached_after == "hit" {
            from_cache(&http, &mut a, "/clusters/dev/apis", &dev, AGGREGATED, None).await
        } else {
            let (_, reply) = from_agent(
                &http,
                &mut a,
                "/clusters/dev/apis",
                &dev,
                AGGREGATED,
                (AGGREGATED_TYPE, "\"apis-2\"", groups),
            )
            .await;
            reply
        };
        assert_eq!(
            reply.header("x-scale-agent-cache").as_deref(),
            Some(cached_after),
            "after a CRD POST answered {status}"
        );
    }
    a.assert_no_tunnel_frames(&http, &dev, "dev").await;

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Review F14: the documents of all accounts together stay within --discovery-cache-mib.
/// Two accounts' agents answer a 200 KiB OpenAPI document each under a 350 KiB hub-wide
/// limit (documents below half the tunnel window, so the hub sends the agent no window
/// credit the cache check would take for a request): the second one pushes the first out (the gauge stays under the limit, the
/// eviction is counted), the second is served from the cache, and the first account's
/// next request goes to its cluster again and is answered whole: nothing breaks, the hub's
/// memory is bounded.
#[tokio::test]
async fn all_accounts_documents_stay_within_the_hub_wide_discovery_limit() {
    let pki = Pki::new();
    let dir = data_dir("proxy-discovery-budget");
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.streams.discovery_cache_bytes = 350 * 1024;
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    a.register("dev", "https://10.0.0.2:6443").await;
    let prod = token_for(&http, &admin, "prod").await;
    let dev = token_for(&http, &admin, "dev").await;
    let document = |fill: u8| vec![fill; 200 * 1024];
    let json = "application/json";

    let (_, first) = from_agent(
        &http,
        &mut a,
        "/clusters/prod/openapi/v2",
        &prod,
        json,
        (json, "\"p-1\"", &document(b'p')),
    )
    .await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body.len(), 200 * 1024);
    let (_, second) = from_agent(
        &http,
        &mut a,
        "/clusters/dev/openapi/v2",
        &dev,
        json,
        (json, "\"d-1\"", &document(b'd')),
    )
    .await;
    assert_eq!(second.status, 200);
    // dev's document is kept: served by the hub alone.
    let cached = from_cache(&http, &mut a, "/clusters/dev/openapi/v2", &dev, json, None).await;
    assert_eq!(cached.header("x-scale-agent-cache").as_deref(), Some("hit"));
    assert_eq!(&cached.body[..], &document(b'd')[..]);
    // prod's went to stay within the limit: its next request reaches the cluster again.
    let (head, again) = from_agent(
        &http,
        &mut a,
        "/clusters/prod/openapi/v2",
        &prod,
        json,
        (json, "\"p-2\"", &document(b'p')),
    )
    .await;
    assert_eq!(head.path_and_query, "/openapi/v2");
    assert_eq!(again.status, 200);
    assert_eq!(again.header("x-scale-agent-cache").as_deref(), Some("miss"));
    assert_eq!(again.body.len(), 200 * 1024);

    let metrics = http.get("/metrics", Some(&admin)).await.text();
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("scale_agent_hub_discovery_cache_bytes"), 200 * 1024);
    assert_eq!(value("scale_agent_hub_discovery_cache_evicted_total"), 2);
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
