//! One rule for the Kubernetes API paths that cross the tunnel (issue 28, F21), for the hub's
//! proxy and the agent alike: a path is taken only in canonical form, the form kubectl,
//! client-go, Helm and Clouddriver send. Its segments are percent-decoded, and a `.` or `..`
//! segment, an empty segment (`//`), a segment that decodes to something holding `/` and one
//! that is not UTF-8 once decoded are refused.
//!
//! Why empty segments: the API server does not clean a path. Its request info and its router
//! (go-restful) split the path on `/` and keep an empty segment as an empty name or
//! namespace, so `/api/v1/namespaces//pods` is routed as a list of pods in namespace `""`,
//! which the API server reads as every namespace. A check that dropped the empty segment
//! would judge that path as something else than what the API server does with it.

/// The path's segments, percent-decoded (a leading and a trailing `/` aside; `/` alone has
/// none); an error saying why for a path that is not canonical.
pub fn decoded_segments(path: &str) -> Result<Vec<String>, &'static str> {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for raw in trimmed.split('/') {
        let segment = percent_encoding::percent_decode_str(raw)
            .decode_utf8()
            .map_err(|_| "a segment is not UTF-8 once decoded")?;
        if segment.is_empty() {
            return Err("an empty segment (`//`)");
        }
        if segment == "." || segment == ".." {
            return Err("a `.` or `..` segment");
        }
        if segment.contains('/') {
            return Err("an encoded `/`");
        }
        out.push(segment.into_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_paths_are_split_and_decoded() {
        assert_eq!(decoded_segments("/"), Ok(vec![]));
        assert_eq!(decoded_segments(""), Ok(vec![]));
        assert_eq!(
            decoded_segments("/api/v1/namespaces/a/configmaps/x%20y/"),
            Ok(["api", "v1", "namespaces", "a", "configmaps", "x y"]
                .map(String::from)
                .to_vec())
        );
        assert_eq!(
            decoded_segments("/api/v1/namespaces/%62/pods/a%2eb"),
            Ok(["api", "v1", "namespaces", "b", "pods", "a.b"]
                .map(String::from)
                .to_vec())
        );
        assert_eq!(
            decoded_segments("/x/100%"),
            Ok(["x", "100%"].map(String::from).to_vec())
        );
    }

    #[test]
    fn non_canonical_paths_are_refused_saying_why() {
        for (path, why) in [
            ("/api/v1//namespaces/b/pods", "an empty segment (`//`)"),
            ("/api/v1/namespaces//pods", "an empty segment (`//`)"),
            ("//api/v1/pods", "an empty segment (`//`)"),
            ("/api/v1/namespaces/a/../b/pods", "a `.` or `..` segment"),
            ("/api/./v1", "a `.` or `..` segment"),
            ("/api/v1/namespaces/%2e%2E/pods", "a `.` or `..` segment"),
            ("/api/v1/namespaces/a%2Fb/pods", "an encoded `/`"),
            (
                "/api/v1/namespaces/%ff/pods",
                "a segment is not UTF-8 once decoded",
            ),
        ] {
            assert_eq!(decoded_segments(path), Err(why), "{path}");
        }
    }
}
