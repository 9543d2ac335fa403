//! Audit lines of the Kubernetes API proxy: one structured tracing event, target `audit`,
//! per write through the proxy (any method but GET, HEAD and OPTIONS, and exec/attach/
//! port-forward upgrades), with the fields of the REST API's operation lines
//! (the hub's `audit`): `who`, `token_kind` (`proxy`), `account`, `verb` (the Kubernetes
//! verb), `object` (`resource/namespace/name/subresource`, else the path), `code`,
//! `duration_ms`.

use std::time::Duration;

use axum::http::Method;

/// The tracing target of audit events (the proxy's and the REST API's).
pub const TARGET: &str = "audit";

/// Audits a write through the Kubernetes API proxy. `who` is the proxy token's name (`None`
/// when the request had no valid token).
pub fn proxy_write(
    who: Option<&str>,
    account: &str,
    method: &Method,
    api_path: &str,
    upgrade: bool,
    code: u16,
    duration: Duration,
) {
    let object = proxy_object(api_path);
    let verb = proxy_verb(method, object.as_ref(), upgrade);
    tracing::info!(
        target: TARGET,
        who = who.unwrap_or("-"),
        token_kind = "proxy",
        account,
        verb,
        object = %object.map(|o| o.to_string()).unwrap_or_else(|| api_path.to_string()),
        code,
        duration_ms = millis(duration),
        "proxied write"
    );
}

/// A duration as the audit lines' `duration_ms`.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What a Kubernetes API path addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyObject {
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl std::fmt::Display for ProxyObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts = [
            Some(self.resource.as_str()),
            self.namespace.as_deref(),
            self.name.as_deref(),
            self.subresource.as_deref(),
        ];
        let text: Vec<&str> = parts.into_iter().flatten().collect();
        f.write_str(&text.join("/"))
    }
}

/// The resource, namespace, name and subresource of `/api/v1/...` or `/apis/<g>/<v>/...`
/// (query ignored); `None` for any other path.
pub fn proxy_object(api_path: &str) -> Option<ProxyObject> {
    let path = api_path.split('?').next().unwrap_or("");
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", namespace, rest @ ..] if !rest.is_empty() => (Some(*namespace), rest),
        _ => (None, rest),
    };
    let owned = |s: Option<&&str>| s.map(|s| s.to_string());
    let resource = rest.first()?;
    Some(ProxyObject {
        resource: resource.to_string(),
        namespace: namespace.map(str::to_string),
        name: owned(rest.get(1)),
        subresource: owned(rest.get(2)),
    })
}

/// The Kubernetes verb of a proxied write.
fn proxy_verb(method: &Method, object: Option<&ProxyObject>, upgrade: bool) -> &'static str {
    let named = object.is_some_and(|o| o.name.is_some());
    if upgrade {
        return match object.and_then(|o| o.subresource.as_deref()) {
            Some("exec") => "exec",
            Some("attach") => "attach",
            Some("portforward") => "portforward",
            _ => "upgrade",
        };
    }
    match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    }
}

/// Whether a proxied request is audited: it can change the cluster.
pub fn is_proxy_write(method: &Method, upgrade: bool) -> bool {
    upgrade || !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_paths_name_their_object() {
        let o = |p: &str| proxy_object(p).map(|o| o.to_string());
        assert_eq!(
            o("/api/v1/namespaces/default/configmaps/x?fieldManager=kubectl").as_deref(),
            Some("configmaps/default/x")
        );
        assert_eq!(
            o("/api/v1/namespaces/default").as_deref(),
            Some("namespaces/default")
        );
        assert_eq!(
            o("/apis/apps/v1/namespaces/ns/deployments/web/scale").as_deref(),
            Some("deployments/ns/web/scale")
        );
        assert_eq!(
            o("/apis/rbac.authorization.k8s.io/v1/clusterroles").as_deref(),
            Some("clusterroles")
        );
        assert_eq!(o("/version"), None);
        let exec = proxy_object("/api/v1/namespaces/d/pods/web-0/exec?command=sh");
        assert_eq!(proxy_verb(&Method::POST, exec.as_ref(), true), "exec");
        assert_eq!(proxy_verb(&Method::POST, exec.as_ref(), false), "create");
        let collection = proxy_object("/api/v1/namespaces/d/pods");
        assert_eq!(
            proxy_verb(&Method::DELETE, collection.as_ref(), false),
            "deletecollection"
        );
        assert!(is_proxy_write(&Method::GET, true));
        assert!(!is_proxy_write(&Method::GET, false) && !is_proxy_write(&Method::HEAD, false));
        assert!(is_proxy_write(&Method::PATCH, false));
    }
}
