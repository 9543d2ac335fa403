//! What a proxied request asks for, when it is a read the cache may answer (sans-IO): the
//! resource path, the query parameters and the representation. Anything unusual is `None`
//! (tunnelled).

use percent_encoding::percent_decode_str;

/// A GET of a collection or of one object, by its REST path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub group: String,
    pub version: String,
    /// The resource (plural) name.
    pub resource: String,
    /// The namespace of a namespaced path (`.../namespaces/<ns>/<resource>`).
    pub namespace: Option<String>,
    /// The object's name for a GET of one object.
    pub name: Option<String>,
}

/// Parses `/api/v1/...` or `/apis/<group>/<version>/...` into a [`Target`]; `None` for
/// anything else (subresources, watch paths, percent-encoded names, discovery).
pub fn parse_path(path: &str) -> Option<Target> {
    if path.contains('%') {
        return None;
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if segments.iter().any(|s| s.is_empty()) {
        return None;
    }
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, resource, name) = match rest {
        // `/api/v1/namespaces` and `/api/v1/namespaces/<name>`: the Namespace kind itself.
        [resource] => (None, *resource, None),
        [resource, name] => (None, *resource, Some(*name)),
        ["namespaces", ns, resource] => (Some(*ns), *resource, None),
        ["namespaces", ns, resource, name] => (Some(*ns), *resource, Some(*name)),
        _ => return None,
    };
    if resource == "watch" || (resource == "namespaces" && namespace.is_some()) {
        return None;
    }
    Some(Target {
        group: group.to_string(),
        version: version.to_string(),
        resource: resource.to_string(),
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
    })
}

/// `resourceVersionMatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RvMatch {
    NotOlderThan,
    Exact,
}

/// The query parameters of a read the cache understands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadOptions {
    pub label_selector: String,
    pub field_selector: String,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<RvMatch>,
}

/// A query value: `+` is a space, then percent-decoding.
pub fn decode(s: &str) -> Option<String> {
    let spaced = s.replace('+', " ");
    percent_decode_str(&spaced)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

/// Parses the query of a LIST or GET; `None` for a watch or a parameter the cache does not
/// implement (the tunnel carries those).
pub fn parse_query(query: Option<&str>) -> Option<ReadOptions> {
    let mut options = ReadOptions::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(value)?;
        match key {
            "labelSelector" => options.label_selector = value,
            "fieldSelector" => options.field_selector = value,
            "limit" => {
                let n: i64 = value.parse().ok()?;
                // limit=0 (or negative) means no limit, as on the API server.
                options.limit = usize::try_from(n).ok().filter(|n| *n > 0);
            }
            "continue" => options.continue_token = Some(value).filter(|v| !v.is_empty()),
            "resourceVersion" => options.resource_version = Some(value).filter(|v| !v.is_empty()),
            "resourceVersionMatch" => {
                options.resource_version_match = match value.as_str() {
                    "" => None,
                    "NotOlderThan" => Some(RvMatch::NotOlderThan),
                    "Exact" => Some(RvMatch::Exact),
                    _ => return None,
                }
            }
            // The client's own deadline for the request (client-go adds it); no effect on
            // the answer.
            "timeout" | "timeoutSeconds" => {}
            "watch" if value == "false" || value == "0" => {}
            _ => return None,
        }
    }
    Some(options)
}

/// The representation a read asks for with its Accept header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// The objects as JSON.
    Full,
    /// `as=PartialObjectMetadata(List);g=meta.k8s.io;v=v1`: metadata only.
    Metadata,
}

/// The form of the first media type in Accept (the API server answers the first it can, and
/// can answer JSON and metadata-only JSON always); `None` for protobuf, Tables, YAML and
/// other representations, which are tunnelled.
pub fn parse_accept(accept: Option<&str>, list: bool) -> Option<Form> {
    let Some(accept) = accept.map(str::trim).filter(|a| !a.is_empty()) else {
        return Some(Form::Full);
    };
    let first = accept.split(',').next()?.trim();
    let mut params = first.split(';').map(str::trim);
    let media = params.next()?;
    let mut as_ = None;
    let (mut g, mut v) = (None, None);
    for p in params {
        match p.split_once('=') {
            Some(("as", value)) => as_ = Some(value),
            Some(("g", value)) => g = Some(value),
            Some(("v", value)) => v = Some(value),
            // Quality values and charsets do not change the representation.
            Some(("q", _)) | Some(("charset", _)) => {}
            _ => return None,
        }
    }
    if media != "application/json" && media != "*/*" && media != "application/*" {
        return None;
    }
    match as_ {
        None if g.is_none() && v.is_none() => Some(Form::Full),
        Some(kind) => {
            let wanted = if list {
                "PartialObjectMetadataList"
            } else {
                "PartialObjectMetadata"
            };
            (kind == wanted && g == Some("meta.k8s.io") && v == Some("v1"))
                .then_some(Form::Metadata)
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(g: &str, v: &str, r: &str, ns: Option<&str>, name: Option<&str>) -> Target {
        Target {
            group: g.into(),
            version: v.into(),
            resource: r.into(),
            namespace: ns.map(Into::into),
            name: name.map(Into::into),
        }
    }

    #[test]
    fn paths() {
        assert_eq!(
            parse_path("/api/v1/namespaces"),
            Some(target("", "v1", "namespaces", None, None))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/default"),
            Some(target("", "v1", "namespaces", None, Some("default")))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/default/configmaps"),
            Some(target("", "v1", "configmaps", Some("default"), None))
        );
        assert_eq!(
            parse_path("/apis/apps/v1/namespaces/x/deployments/web"),
            Some(target("apps", "v1", "deployments", Some("x"), Some("web")))
        );
        assert_eq!(
            parse_path("/apis/apps/v1/deployments"),
            Some(target("apps", "v1", "deployments", None, None))
        );
        for tunnelled in [
            "/apis/apps/v1/namespaces/x/deployments/web/scale",
            "/api/v1/namespaces/x/pods/p/log",
            "/api/v1/watch/pods",
            "/api/v1/namespaces/a%2Fb/pods",
            "/api",
            "/apis/apps/v1",
            "/version",
            "/api/v1/namespaces/x/namespaces",
        ] {
            assert_eq!(parse_path(tunnelled), None, "{tunnelled}");
        }
    }

    #[test]
    fn queries() {
        let o = parse_query(Some(
            "labelSelector=app%3Dweb%2Ctier+in+%28a%2Cb%29&limit=500&resourceVersion=0&timeout=32s",
        ))
        .unwrap();
        assert_eq!(o.label_selector, "app=web,tier in (a,b)");
        assert_eq!(o.limit, Some(500));
        assert_eq!(o.resource_version.as_deref(), Some("0"));
        assert_eq!(parse_query(Some("limit=0")).unwrap().limit, None);
        assert_eq!(
            parse_query(Some("resourceVersion=5&resourceVersionMatch=Exact"))
                .unwrap()
                .resource_version_match,
            Some(RvMatch::Exact)
        );
        for tunnelled in [
            "watch=true",
            "watch=1",
            "pretty=true",
            "resourceVersionMatch=Newest",
            "limit=x",
            "sendInitialEvents=true",
        ] {
            assert_eq!(parse_query(Some(tunnelled)), None, "{tunnelled}");
        }
    }

    #[test]
    fn accept() {
        assert_eq!(parse_accept(None, true), Some(Form::Full));
        assert_eq!(
            parse_accept(Some("application/json"), true),
            Some(Form::Full)
        );
        assert_eq!(
            parse_accept(Some("application/json, */*"), false),
            Some(Form::Full)
        );
        assert_eq!(
            parse_accept(
                Some(
                    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
                ),
                true
            ),
            Some(Form::Metadata)
        );
        assert_eq!(
            parse_accept(
                Some("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
                false
            ),
            Some(Form::Metadata)
        );
        for tunnelled in [
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
            "application/vnd.kubernetes.protobuf",
            "application/yaml",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1",
        ] {
            assert_eq!(parse_accept(Some(tunnelled), true), None, "{tunnelled}");
        }
    }
}
