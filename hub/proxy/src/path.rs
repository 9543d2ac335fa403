//! Proxy paths must be canonical (issue 28, F21): a `.` or `..` segment, an empty segment
//! (`//`), or a segment holding a percent-encoded `/` or `.`, is refused with 400 before the
//! path is matched against the discovery documents, the cache or the Secret guard. The
//! Secret guard and the agent's tunnel scope read the segments with the same rule
//! (`scale_agent_proto::path::decoded_segments`).
//!
//! The hub reads the path literally, but something between the agent and the API server
//! (an HTTP library, a load balancer, the API server's own mux) may resolve it: then
//! `/openapi/v3/../../api/v1/namespaces/x/secrets` would be cached as an OpenAPI document
//! and served for five minutes, and a path the hub judges to be one thing would reach the
//! cluster as another. kubectl, client-go, Helm and Clouddriver never send such paths
//! (client-go escapes segments with `url.PathEscape`, which leaves `.` alone, and object
//! names cannot hold `/`), so refusing them costs no real client anything.

use crate::status::Status;

/// Why a segment of a proxy path is not canonical, if one is not.
fn non_canonical(segment: &str) -> Option<&'static str> {
    if segment.is_empty() {
        return Some(
            "an empty segment (`//`) is an empty name or namespace to the API server, which \
             does not clean paths: `namespaces//pods` lists every namespace's pods",
        );
    }
    if segment == "." || segment == ".." {
        return Some("a `.` or `..` segment would be resolved by whatever normalises the path");
    }
    let lower = segment.to_ascii_lowercase();
    if lower.contains("%2f") {
        return Some("a percent-encoded `/` would split the segment once decoded");
    }
    if lower.contains("%2e") {
        return Some("a percent-encoded `.` would make a `.` or `..` segment once decoded");
    }
    None
}

/// Refuses the proxy path `api_path` (the part after `/clusters/<account>`, still
/// percent-encoded) when one of its segments is not canonical; the 400 names the segment.
/// A leading and a trailing `/` are not empty segments.
pub fn check_canonical(account: &str, api_path: &str) -> Result<(), Status> {
    let inner = api_path.strip_prefix('/').unwrap_or(api_path);
    let inner = inner.strip_suffix('/').unwrap_or(inner);
    if inner.is_empty() {
        return Ok(());
    }
    let Some((segment, why)) = inner
        .split('/')
        .find_map(|segment| non_canonical(segment).map(|why| (segment, why)))
    else {
        return Ok(());
    };
    Err(Status::failure(
        400,
        "BadRequest",
        format!(
            // troubleshooting: proxy: HTTP 400
            // A `.` or `..` segment, or a percent-encoded `/` or `.`, would be resolved differently
            // by whatever normalises the path; kubectl and client-go never send one.
            "the path {api_path:?} of account {account:?} is not canonical: its segment \
             {segment:?} is refused ({why}); send the path as kubectl and client-go do, \
             without `.`, `..` or empty segments and without percent-encoded `/` or `.` \
             (curl: drop --path-as-is)"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_and_encoded_segments_are_refused_and_named() {
        let refused = [
            ("/openapi/v3/../../api/v1/namespaces/x/secrets", ".."),
            ("/api/./v1/pods", "."),
            ("/api/v1/namespaces/x/secrets%2Fdb", "secrets%2Fdb"),
            ("/api/v1/namespaces/x/%2e%2e/y", "%2e%2e"),
            ("/openapi/v3/%2E./api", "%2E."),
            ("/api/v1/..", ".."),
            ("/api/v1/namespaces//pods", ""),
            ("//api/v1/pods", ""),
        ];
        for (path, segment) in refused {
            let status = check_canonical("ro", path).expect_err(path);
            assert_eq!(status.code(), 400, "{path}");
            assert!(
                status.message().contains(&format!("{segment:?}")),
                "{path}: {}",
                status.message()
            );
        }
        let accepted = [
            "/",
            "/api/v1/namespaces/x/configmaps/a.b.c",
            "/apis/apps/v1/namespaces/x/deployments/web",
            "/openapi/v3/apis/apps/v1",
            "/api/v1/namespaces/x/pods/web-1/log",
            "/api/v1/namespaces/x/configmaps/name%20with%20space",
            "/api/v1/namespaces/x/configmaps/...",
            "/api/v1/namespaces/x/pods/",
            "",
        ];
        for path in accepted {
            assert!(check_canonical("ro", path).is_ok(), "{path}");
        }
    }
}
