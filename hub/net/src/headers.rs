//! Which headers cross the tunnel. The caller's credentials and identity claims never do
//! (the agent replays the request as its own identity), nor do hop-by-hop headers, which
//! belong to one connection, nor the hub's own headers (`x-scale-agent-*`) either way: the
//! hub sets those on its answers, and an agent must not be able to say that an answer came
//! from the hub's cache or another replica (issue 28, F20).
//!
//! Request headers are a deny-list, not an allow-list: kubectl, client-go, Helm and
//! Clouddriver send many headers the API server acts on (`Accept`, `Content-Type`,
//! `Content-Encoding`, `If-None-Match`, `X-Stream-Protocol-Version`, `Sec-WebSocket-*`,
//! `Kubectl-Command`, `Kubectl-Session`, `Audit-Id`, ...) and new releases add more; an
//! allow-list would silently break each new one (port-forward's protocol negotiation is a
//! header). What gives a request authority at the API server is a short, documented family
//! ([`claims_identity`]), and that is what is dropped.

use http::{HeaderMap, HeaderName, HeaderValue, header};
use scale_agent_proto::{
    tunnel::{HOP_BY_HOP, claims_identity},
    v1 as pb,
};

/// Prefix of the headers the hub itself sets (`x-scale-agent-cache`, `-cache-age`,
/// `-replica`, the replicas' `-caller-*` and `-forwarded-*`): never taken from an agent's
/// answer nor sent to one.
pub const HUB_HEADER_PREFIX: &str = "x-scale-agent-";

/// Whether a request header may be forwarded to the agent.
fn forward_request_header(name: &HeaderName) -> bool {
    let name = name.as_str();
    !(HOP_BY_HOP.contains(&name) || claims_identity(name) || name.starts_with(HUB_HEADER_PREFIX))
}

/// Headers named in `Connection` are hop-by-hop too.
fn connection_listed(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The request headers to send to the agent.
pub fn request_headers(headers: &HeaderMap) -> Vec<pb::HttpHeader> {
    let listed = connection_listed(headers);
    headers
        .iter()
        .filter(|(name, _)| {
            forward_request_header(name) && !listed.iter().any(|l| l == name.as_str())
        })
        .map(|(name, value)| pb::HttpHeader {
            name: name.as_str().to_string(),
            value: value.as_bytes().to_vec(),
        })
        .collect()
}

/// The response headers to hand to the client, from the agent's answer. Invalid names or
/// values (which no API server sends) are dropped rather than failing the response.
pub fn response_headers(headers: &[pb::HttpHeader]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for h in headers {
        let Ok(name) = HeaderName::from_bytes(h.name.as_bytes()) else {
            continue;
        };
        if HOP_BY_HOP.contains(&name.as_str()) || name.as_str().starts_with(HUB_HEADER_PREFIX) {
            continue;
        }
        if let Ok(value) = HeaderValue::from_bytes(&h.value) {
            map.append(name, value);
        }
    }
    map
}

/// The headers that ask the API server for the same upgrade the client asked for
/// (`Connection: Upgrade`, `Upgrade: SPDY/3.1` or `websocket`), which
/// [`request_headers`] leaves out as hop-by-hop.
pub fn upgrade_headers(headers: &HeaderMap) -> Vec<pb::HttpHeader> {
    let mut out = vec![pb::HttpHeader {
        name: "connection".into(),
        value: b"Upgrade".to_vec(),
    }];
    out.extend(
        headers
            .get_all(header::UPGRADE)
            .iter()
            .map(|value| pb::HttpHeader {
                name: "upgrade".into(),
                value: value.as_bytes().to_vec(),
            }),
    );
    out
}

/// The headers of a 101 answer: as [`response_headers`], plus `Connection` and `Upgrade`,
/// which the client needs to accept the switch.
pub fn switching_headers(headers: &[pb::HttpHeader]) -> HeaderMap {
    let mut map = response_headers(headers);
    for h in headers {
        let name = h.name.to_ascii_lowercase();
        if (name == "connection" || name == "upgrade")
            && let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(&h.value),
            )
        {
            map.append(name, value);
        }
    }
    map
}

/// Whether the request asks for a connection upgrade (exec, attach, port-forward over SPDY
/// or WebSocket).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        || connection_listed(headers).iter().any(|v| v == "upgrade")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_hop_by_hop_headers_stay_behind() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer sat_x"));
        h.insert("impersonate-user", HeaderValue::from_static("admin"));
        h.insert("impersonate-extra-scopes", HeaderValue::from_static("x"));
        h.insert("cookie", HeaderValue::from_static("session=1"));
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-trace"),
        );
        h.insert("x-trace", HeaderValue::from_static("1"));
        h.insert("host", HeaderValue::from_static("hub:8443"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("accept", HeaderValue::from_static("application/json"));
        h.insert(
            "content-type",
            HeaderValue::from_static("application/apply-patch+yaml"),
        );
        h.insert("user-agent", HeaderValue::from_static("kubectl/v1.37.1"));
        h.insert("accept-encoding", HeaderValue::from_static("gzip"));
        for claim in [
            "x-remote-user",
            "x-remote-group",
            "x-remote-extra-scopes",
            "x-forwarded-for",
            "x-forwarded-proto",
            "x-forwarded-client-cert",
            "forwarded",
            "x-real-ip",
            "x-scale-agent-caller-user",
        ] {
            h.insert(
                HeaderName::from_static(claim),
                HeaderValue::from_static("system:admin"),
            );
        }
        let mut names: Vec<String> = request_headers(&h).into_iter().map(|h| h.name).collect();
        names.sort();
        assert_eq!(
            names,
            ["accept", "accept-encoding", "content-type", "user-agent"]
        );
    }

    #[test]
    fn response_headers_keep_what_clients_read() {
        let header = |name: &str, value: &[u8]| pb::HttpHeader {
            name: name.into(),
            value: value.to_vec(),
        };
        let map = response_headers(&[
            header("content-type", b"application/json"),
            header("warning", b"299 - \"deprecated\""),
            header("warning", b"299 - \"other\""),
            header("etag", b"\"abc\""),
            header("transfer-encoding", b"chunked"),
            header("connection", b"close"),
            header("bad name", b"x"),
            header("audit-id", b"\x01"),
            header("x-scale-agent-cache", b"hit"),
            header("X-Scale-Agent-Replica", b"hub-0"),
        ]);
        assert_eq!(map.get_all("warning").iter().count(), 2);
        assert!(map.contains_key("etag") && map.contains_key("content-type"));
        assert!(!map.contains_key("transfer-encoding") && !map.contains_key("connection"));
        assert_eq!(map.len(), 4);
    }

    #[test]
    fn upgrade_headers_ask_for_the_same_protocol_and_101s_keep_them() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Upgrade"));
        h.insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
        h.insert(
            "x-stream-protocol-version",
            HeaderValue::from_static("v4.channel.k8s.io"),
        );
        let forwarded: Vec<(String, Vec<u8>)> = request_headers(&h)
            .into_iter()
            .chain(upgrade_headers(&h))
            .map(|h| (h.name, h.value))
            .collect();
        assert!(forwarded.contains(&("upgrade".into(), b"SPDY/3.1".to_vec())));
        assert!(forwarded.contains(&("connection".into(), b"Upgrade".to_vec())));
        assert!(forwarded.contains(&(
            "x-stream-protocol-version".into(),
            b"v4.channel.k8s.io".to_vec()
        )));
        let answer = [
            pb::HttpHeader {
                name: "Connection".into(),
                value: b"Upgrade".to_vec(),
            },
            pb::HttpHeader {
                name: "Upgrade".into(),
                value: b"SPDY/3.1".to_vec(),
            },
            pb::HttpHeader {
                name: "X-Stream-Protocol-Version".into(),
                value: b"v4.channel.k8s.io".to_vec(),
            },
        ];
        let map = switching_headers(&answer);
        assert_eq!(map["upgrade"], "SPDY/3.1");
        assert_eq!(map["connection"], "Upgrade");
        assert_eq!(map["x-stream-protocol-version"], "v4.channel.k8s.io");
        assert_eq!(response_headers(&answer).len(), 1, "hop-by-hop otherwise");
    }

    #[test]
    fn upgrades_are_recognised() {
        let mut h = HeaderMap::new();
        assert!(!is_upgrade(&h));
        h.insert("connection", HeaderValue::from_static("Upgrade"));
        assert!(is_upgrade(&h));
        let mut h = HeaderMap::new();
        h.insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
        assert!(is_upgrade(&h));
    }
}
