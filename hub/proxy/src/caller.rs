//! Who called, from authentication to the agent: the [`ProxyCaller`] the proxy
//! authenticated goes into the tunnel's request head (with the request id the audit line and
//! the target's audit log share), and, for an account another replica owns, across the
//! replicas' internal channel in headers only that channel's requests are trusted with.
//!
//! An account whose agent impersonates its callers (`callers: impersonate`, carried in its
//! registration) answers a person's reads from the target cluster, not the hub's cache: only
//! the target's RBAC knows what the person may see.

use axum::{
    extract::Request,
    http::{HeaderMap, HeaderValue},
};
use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use scale_agent_hub_model::auth::ProxyCaller;
use scale_agent_hub_replicas::owners::forward::Forwarded;
use scale_agent_proto::v1 as pb;

use crate::Proxy;

/// Between replicas: the caller's user (percent-encoded).
pub const CALLER_USER: &str = "x-scale-agent-caller-user";
/// Between replicas: one of the caller's groups (percent-encoded; repeated).
pub const CALLER_GROUP: &str = "x-scale-agent-caller-group";
/// Between replicas: `true` for a person.
pub const CALLER_PERSON: &str = "x-scale-agent-caller-person";
/// Between replicas: the request id of the replica the client reached.
pub const REQUEST_ID: &str = "x-scale-agent-request-id";

/// Key of an account's registration properties (its agent's account config) saying whom the
/// target cluster sees.
pub const CALLERS: &str = "callers";

/// Whether `account`'s agent replays a person's requests impersonating them.
pub fn impersonates_callers(proxy: &Proxy, account: &str) -> bool {
    proxy
        .live
        .registry_read()
        .accounts
        .get(account)
        .is_some_and(|a| a.record.properties.get(CALLERS) == Some(&"impersonate".into()))
}

/// The caller and request id another replica forwarded `request` with, when it carries the
/// [`Forwarded`] mark (the replicas' secret checked); the headers are removed either way, so
/// a client cannot claim them and the API server never sees them.
pub fn take_forwarded(request: &mut Request) -> (Option<ProxyCaller>, Option<String>) {
    let trusted = request.extensions().get::<Forwarded>().is_some();
    let headers = request.headers_mut();
    let decoded = |v: &HeaderValue| {
        v.to_str()
            .ok()
            .map(|s| percent_decode_str(s).decode_utf8_lossy().into_owned())
    };
    let user = headers.get(CALLER_USER).and_then(decoded);
    let groups: Vec<String> = headers
        .get_all(CALLER_GROUP)
        .iter()
        .filter_map(decoded)
        .collect();
    let person = headers
        .get(CALLER_PERSON)
        .is_some_and(|v| v.as_bytes() == b"true");
    let request_id = headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    remove(headers);
    if !trusted {
        return (None, None);
    }
    let caller = user.map(|user| ProxyCaller {
        user,
        groups,
        person,
    });
    (caller, request_id)
}

fn remove(headers: &mut HeaderMap) {
    for name in [CALLER_USER, CALLER_GROUP, CALLER_PERSON, REQUEST_ID] {
        headers.remove(name);
    }
}

/// Puts the caller and the request id on a request forwarded to the account's owner.
pub fn put_for_owner(request: &mut Request, caller: Option<&ProxyCaller>, request_id: &str) {
    let headers = request.headers_mut();
    remove(headers);
    let encoded =
        |s: &str| HeaderValue::from_str(&utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()).ok();
    if let Ok(value) = HeaderValue::from_str(request_id) {
        headers.insert(REQUEST_ID, value);
    }
    let Some(caller) = caller else {
        return;
    };
    if let Some(user) = encoded(&caller.user) {
        headers.insert(CALLER_USER, user);
    }
    for group in caller.groups.iter().filter_map(|g| encoded(g)) {
        headers.append(CALLER_GROUP, group);
    }
    headers.insert(
        CALLER_PERSON,
        HeaderValue::from_static(if caller.person { "true" } else { "false" }),
    );
}

/// The caller as the tunnel's request head carries it.
pub fn to_proto(caller: &ProxyCaller) -> pb::ProxyCaller {
    pb::ProxyCaller {
        user: caller.user.clone(),
        groups: caller.groups.clone(),
        person: caller.person,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> ProxyCaller {
        ProxyCaller {
            user: "alice@example.com".into(),
            groups: vec!["team a".into(), "ops".into()],
            person: true,
        }
    }

    #[test]
    fn the_caller_crosses_to_the_owner_only_on_the_replicas_channel() {
        let mut request = Request::new(axum::body::Body::empty());
        put_for_owner(&mut request, Some(&alice()), "id-1");
        let mut forwarded = Request::new(axum::body::Body::empty());
        *forwarded.headers_mut() = request.headers().clone();
        forwarded.extensions_mut().insert(Forwarded {
            from: "hub-0".into(),
        });
        assert_eq!(
            take_forwarded(&mut forwarded),
            (Some(alice()), Some("id-1".into()))
        );
        assert!(forwarded.headers().is_empty(), "the headers stop here");
        // A client sending the same headers straight to the proxy claims nothing.
        let mut claimed = Request::new(axum::body::Body::empty());
        *claimed.headers_mut() = request.headers().clone();
        assert_eq!(take_forwarded(&mut claimed), (None, None));
        assert!(claimed.headers().is_empty());
    }
}
