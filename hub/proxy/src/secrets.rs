//! Secret data stays in the cluster (issue 28, F3): unless an account opts in
//! (`allowSecretData: true` on its AgentAccount, carried in the account's registration),
//! the proxy answers requests on core Secrets only from the hub's cache, which holds them as
//! the agents stream them: metadata, `type`, no `data`, no annotation known to hold an
//! applied manifest. Everything else on Secrets is refused with 403 and a message saying
//! how to opt in: reads the cache cannot answer (a kind not synced, a table, protobuf, a
//! legacy `/watch/` path), and every write (its answer is the object, data included; a
//! `dryRun` PATCH would otherwise read any Secret).
//!
//! RBAC cannot tell a metadata-only read from a full one (`list secrets` is both), so the
//! check is here, on the path the API server will see: the path is percent-decoded and
//! read both literally and with `.`, `..` and empty segments resolved; when either names
//! Secrets, a path that is not canonical (such segments, or an encoded `/`) is refused with
//! 400 on a non-opted-in account. Other odd paths pass through untouched.

use std::sync::Arc;

use axum::{
    http::{HeaderMap, HeaderValue, Method, header},
    response::Response,
};

use crate::{Proxy, cached, headers, status::Status};

/// Key of the opt-in in an account's registration properties (the agent's account config).
pub const ALLOW_SECRET_DATA: &str = "allowSecretData";

/// Whether `account`'s registration opted in to Secret data through the proxy.
pub fn allows_secret_data(proxy: &Proxy, account: &str) -> bool {
    proxy
        .live
        .registry_read()
        .accounts
        .get(account)
        .is_some_and(|a| a.record.properties.get(ALLOW_SECRET_DATA) == Some(&true.into()))
}

/// The answer to a request on Secrets of an account that did not opt in (`Ok(None)`: not a
/// request on Secrets, or the account opted in; go on as usual).
pub(crate) async fn guard(
    proxy: &Arc<Proxy>,
    account: &str,
    api_path: &str,
    method: &Method,
    query: Option<&str>,
    request_headers: &HeaderMap,
) -> Result<Option<Response>, Status> {
    if allows_secret_data(proxy, account) {
        return Ok(None);
    }
    if !may_name_secrets(api_path) {
        return Ok(None);
    }
    let segments = scale_agent_proto::path::decoded_segments(api_path).map_err(|why| {
        // troubleshooting: proxy: HTTP 400
        // For an account that keeps Secret data in its cluster, a path naming Secrets must be
        // canonical (its segments UTF-8 once decoded), so that what the hub checks is what the API
        // server serves.
        Status::failure(
            400,
            "BadRequest",
            format!(
                "the path {api_path:?} is not in canonical form ({why}); account {account:?} \
                 keeps Secret data in its cluster, so the hub accepts only canonical paths \
                 for it: send the path as kubectl and client-go do"
            ),
        )
    })?;
    let refuse = |why: &str| {
        Status::forbidden(format!(
            // troubleshooting: proxy: HTTP 403
            // By default the proxy answers Secrets only from the cache, which holds no Secret data,
            // and refuses what would carry it. A cluster administrator opts an account in with
            // `allowSecretData: true` on its AgentAccount (Helm keeps releases in Secrets and needs
            // it).
            "account {account:?} keeps Secret data in its cluster: the hub serves Secrets \
             only as it caches them (metadata and type, no data), and {why}. To let Secret \
             reads and writes through the proxy for this account (Helm keeps its releases \
             in Secrets and needs it), a cluster administrator sets allowSecretData: true on \
             its AgentAccount"
        ))
    };
    if method != Method::GET || headers::is_upgrade(request_headers) {
        return Err(refuse(&format!(
            "a {method} of Secrets answers with their data, so it is refused"
        )));
    }
    let list = !matches!(
        segments.iter().map(String::as_str).collect::<Vec<_>>()[..],
        [_, _, "secrets", _] | [_, _, "namespaces", _, "secrets", _]
    );
    let mut asked = request_headers.clone();
    if let Some(accept) = servable_accept(request_headers, list) {
        asked.insert(header::ACCEPT, accept);
    }
    let answer = if crate::is_long_running(method, api_path, query) {
        cached::watch::watch_as_cached(proxy, account, api_path, query, &asked).await
    } else {
        cached::read_as_cached(
            &proxy.live,
            &proxy.state.cached_reads,
            account,
            api_path,
            query,
            &asked,
        )
        .await
    };
    let Some(mut response) = answer else {
        return Err(refuse(
            "the cache cannot answer this read (Secrets not synced for this account or \
             namespace, or a form or option the cache does not implement: tables, protobuf, \
             resourceVersion rules, legacy /watch/ paths); ask for JSON or \
             PartialObjectMetadata of a synced scope",
        ));
    };
    response.headers_mut().insert(
        "warning",
        HeaderValue::from_static(
            "299 - \"Secret data is not served through the Scale Agent hub for this account: \
             metadata only (allowSecretData on its AgentAccount lets it through)\"",
        ),
    );
    Ok(Some(response))
}

/// Whether the path names core Secrets, read literally (percent-decoded, an encoded `/`
/// splitting its segment, empty segments dropped) or resolved the way a path cleaner would
/// (`.` dropped, `..` taking the segment before it): whichever of the two the API server
/// sees, a request on Secrets is caught.
fn may_name_secrets(api_path: &str) -> bool {
    let literal: Vec<String> = api_path
        .split('/')
        .flat_map(|raw| {
            percent_encoding::percent_decode_str(raw)
                .decode_utf8_lossy()
                .split('/')
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|s| !s.is_empty())
        .collect();
    let mut resolved: Vec<String> = Vec::new();
    for segment in &literal {
        match segment.as_str() {
            "." => {}
            ".." => {
                resolved.pop();
            }
            _ => resolved.push(segment.clone()),
        }
    }
    names_secrets(&literal) || names_secrets(&resolved)
}

/// Whether decoded path segments name core Secrets: the collection (all namespaces or one),
/// one Secret, anything below one, and the legacy `/watch/` forms.
fn names_secrets(segments: &[String]) -> bool {
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    let rest = match s.as_slice() {
        ["api", _version, "watch", rest @ ..] | ["api", _version, rest @ ..] => rest,
        _ => return false,
    };
    matches!(rest, ["secrets", ..] | ["namespaces", _, "secrets", ..])
}

/// The first media type of Accept the cache can answer (JSON, or the metadata-only form):
/// kubectl asks for a Table first and JSON last; the API server may answer any of them.
/// `None` when Accept is absent or names none of those.
fn servable_accept(request_headers: &HeaderMap, list: bool) -> Option<HeaderValue> {
    let accept = request_headers.get(header::ACCEPT)?.to_str().ok()?;
    accept
        .split(',')
        .map(str::trim)
        .find(|alternative| cached::request::parse_accept(Some(alternative), list).is_some())
        .and_then(|alternative| HeaderValue::from_str(alternative).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the guard takes `path`: `Ok` when canonical, `Err` (400) when not.
    fn secrets(path: &str) -> Result<bool, &'static str> {
        if !may_name_secrets(path) {
            return Ok(false);
        }
        scale_agent_proto::path::decoded_segments(path).map(|s| names_secrets(&s))
    }

    #[test]
    fn paths_naming_secrets_in_every_spelling() {
        for path in [
            "/api/v1/secrets",
            "/api/v1/namespaces/x/secrets",
            "/api/v1/namespaces/x/secrets/",
            "/api/v1/namespaces/x/secrets/db",
            "/api/v1/namespaces/x/secr%65ts/db",
            "/api/v1/watch/namespaces/x/secrets",
            "/api/v1/watch/secrets",
        ] {
            assert_eq!(secrets(path), Ok(true), "{path}");
        }
        for path in [
            "/api/v1/namespaces/x/configmaps",
            "/api/v1/namespaces/secrets",
            "/apis/apps/v1/namespaces/x/deployments/secrets",
            "/api/v1/namespaces/secrets/configmaps",
            "/api",
            "/",
            // Odd paths that cannot reach Secrets pass through untouched.
            "/api/v1/namespaces/team%2Fa/configmaps",
            "/api/v1/namespaces/x/configmaps/../pods",
        ] {
            assert_eq!(secrets(path), Ok(false), "{path}");
        }
        for path in [
            "/api/v1/namespaces/x/configmaps/../../x/secrets",
            "/api/v1/namespaces/x/pods/%2E%2E/secrets",
            "/api/v1//secrets",
            "/api/v1/namespaces/x%2Fsecrets",
            "/api/v1/./secrets",
        ] {
            assert!(secrets(path).is_err(), "{path}");
        }
    }

    #[test]
    fn kubectls_table_accept_falls_back_to_json() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
            ),
        );
        assert_eq!(
            servable_accept(&headers, true).unwrap(),
            HeaderValue::from_static("application/json")
        );
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/vnd.kubernetes.protobuf"),
        );
        assert_eq!(servable_accept(&headers, true), None);
    }
}
