//! One account's token reaches one account (issue 28, F8): the accounts of one agent share
//! its ServiceAccount (Agent mode), so the API server cannot tell `team-a`'s tunnelled
//! request from `team-b`'s. The agent does: before replaying a request for an account that
//! lists `namespaces` (or `omitNamespaces`), it checks the namespace the path names.
//!
//! Why here and not one ServiceAccount per AgentAccount: the watches, the cache and the
//! operations already run per account on one process and one credential; a credential per
//! account would multiply the agent's connections and the operator's RBAC objects, and a
//! kubeconfig account (Infrastructure mode) has one credential per cluster anyway. The check
//! is on the path the API server routes by, percent-decoded; a path that is not canonical
//! (`.`, `..`, empty or encoded-`/` segments) is refused for a scoped account, by the rule the
//! hub's proxy applies too (`scale_agent_proto::path`).
//!
//! For an account with `namespaces`, a request is allowed when it names one of them, or is
//! one of the few cluster-level requests that read no namespaced data: discovery and
//! OpenAPI, `/version`, CustomResourceDefinitions (Clouddriver reads them), and access
//! reviews of the agent's own rights. Everything else at cluster level (lists across all
//! namespaces, Namespaces, Nodes, ClusterRoles, ...) is refused. For an account with only
//! `omitNamespaces`, requests naming an omitted namespace are refused. Kinds (`kinds`,
//! `omitKinds`) are not checked here: RBAC bounds them (`deployKinds` for writes).

use scale_agent_crds::agent_config::AccountConfig;

/// Why `account` may not send `method path_and_query` through the tunnel; `None` when it
/// may.
pub fn refusal(account: &AccountConfig, method: &str, path_and_query: &str) -> Option<String> {
    if account.namespaces.is_empty() && account.omit_namespaces.is_empty() {
        return None;
    }
    let name = &account.name;
    let path = path_and_query
        .split_once('?')
        .map_or(path_and_query, |(p, _)| p);
    let segments = match scale_agent_proto::path::decoded_segments(path) {
        Ok(segments) => segments,
        Err(why) => {
            return Some(format!(
                "the path {path:?} is not in canonical form ({why}); account {name:?} is \
                 limited to some namespaces, so only canonical paths are replayed for it"
            ));
        }
    };
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    match namespace_of(&s) {
        Some(namespace) => {
            if !account.namespaces.is_empty() && !account.namespaces.iter().any(|n| n == namespace)
            {
                Some(format!(
                    // troubleshooting: proxy: HTTP 403 (from the agent)
                    // An account with `namespaces` reaches only those; the agent refuses a
                    // tunnelled request for another namespace, since sibling accounts share its
                    // ServiceAccount.
                    "account {name:?} serves namespaces {:?} only, and this request is for \
                     namespace {namespace:?}: use the account that serves it (its own \
                     kubeconfig), or ask for the namespace to be added to this account's \
                     AgentAccount",
                    account.namespaces
                ))
            } else if account.omit_namespaces.iter().any(|n| n == namespace) {
                Some(format!(
                    "account {name:?} leaves namespace {namespace:?} out (omitNamespaces): \
                     use the account that serves it"
                ))
            } else {
                None
            }
        }
        None if account.namespaces.is_empty() || harmless_cluster_request(method, &s) => None,
        None => Some(format!(
            // troubleshooting: proxy: HTTP 403 (from the agent)
            // A request across all namespaces, or on cluster-scoped objects, is refused for an
            // account limited to namespaces: name a namespace.
            "account {name:?} serves namespaces {:?} only: {method} {path} is a request across \
             all namespaces or on cluster-scoped objects, refused for it; name a namespace \
             (kubectl -n <namespace>)",
            account.namespaces
        )),
    }
}

/// The namespace a decoded path names, if it names one.
fn namespace_of<'a>(s: &[&'a str]) -> Option<&'a str> {
    let rest = match s {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return None,
    };
    let rest = match rest {
        ["watch", rest @ ..] => rest,
        rest => rest,
    };
    match rest {
        ["namespaces", namespace, ..] => Some(namespace),
        _ => None,
    }
}

/// Cluster-level requests that read no namespaced data.
fn harmless_cluster_request(method: &str, s: &[&str]) -> bool {
    let read = method == "GET" || method == "HEAD";
    match s {
        // Discovery and OpenAPI.
        [] | ["api"] | ["api", _] | ["apis"] | ["apis", _] | ["apis", _, _] => read,
        ["openapi", ..] | ["version"] => read,
        [
            "apis",
            "apiextensions.k8s.io",
            _,
            "customresourcedefinitions",
            ..,
        ] => read,
        [
            "apis",
            "authorization.k8s.io",
            _,
            "selfsubjectaccessreviews" | "selfsubjectrulesreviews",
        ] => method == "POST",
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team_a() -> AccountConfig {
        AccountConfig {
            name: "team-a".into(),
            namespaces: vec!["a".into()],
            ..Default::default()
        }
    }

    #[test]
    fn a_namespaced_account_reaches_its_namespaces_only() {
        let a = team_a();
        for (method, path) in [
            ("GET", "/api/v1/namespaces/a/pods"),
            ("GET", "/api/v1/namespaces/a/secrets/x?fieldSelector=a"),
            ("POST", "/apis/apps/v1/namespaces/a/deployments"),
            ("GET", "/api/v1/watch/namespaces/a/pods"),
            ("GET", "/api/v1/namespaces/a"),
            ("GET", "/api"),
            ("GET", "/apis/apps/v1"),
            ("GET", "/openapi/v3/apis/apps/v1"),
            ("GET", "/version"),
            (
                "GET",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            ),
            (
                "POST",
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            ),
        ] {
            assert_eq!(refusal(&a, method, path), None, "{method} {path}");
        }
        for (method, path) in [
            ("GET", "/api/v1/namespaces/b/secrets"),
            ("POST", "/apis/apps/v1/namespaces/b/deployments"),
            ("GET", "/api/v1/watch/namespaces/b/pods"),
            ("GET", "/api/v1/namespaces/%62/pods"),
            ("GET", "/api/v1/namespaces"),
            ("GET", "/api/v1/pods"),
            ("GET", "/api/v1/secrets?watch=1"),
            ("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles"),
            (
                "POST",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            ),
            ("GET", "/api/v1/namespaces/a/../b/pods"),
            ("GET", "/api/v1/namespaces/a%2Fb/pods"),
            ("GET", "/api/v1//namespaces/b/pods"),
        ] {
            let message = refusal(&a, method, path);
            assert!(message.is_some(), "{method} {path}");
        }
        let message = refusal(&a, "GET", "/api/v1/namespaces/b/pods").unwrap();
        assert!(
            message.contains("\"team-a\"") && message.contains("\"b\""),
            "{message}"
        );
    }

    #[test]
    fn omitted_namespaces_and_cluster_accounts() {
        let omit = AccountConfig {
            name: "most".into(),
            omit_namespaces: vec!["kube-system".into()],
            ..Default::default()
        };
        assert!(refusal(&omit, "GET", "/api/v1/namespaces/kube-system/secrets").is_some());
        assert_eq!(refusal(&omit, "GET", "/api/v1/namespaces/b/pods"), None);
        assert_eq!(refusal(&omit, "GET", "/api/v1/nodes"), None);
        let cluster = AccountConfig {
            name: "all".into(),
            ..Default::default()
        };
        assert_eq!(refusal(&cluster, "GET", "/api/v1/namespaces/x/../y"), None);
    }
}
