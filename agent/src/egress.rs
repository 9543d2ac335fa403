//! Egress through a forward proxy, as Armory's agent (Go's `net/http` and grpc-go) does:
//! `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY` (or their lower-case forms) from
//! the environment, with curl's `NO_PROXY` rules (host names and domain suffixes, IP
//! addresses and CIDR ranges, `*` for everything). The variables are read on every
//! connection, like the rest of the hub settings.
//!
//! - The hub: the gRPC connection is tunnelled with HTTP `CONNECT` through the proxy that
//!   `HTTPS_PROXY` names for the hub's host (grpc-go looks the proxy up as for an https URL,
//!   also for a plaintext hub). TLS to the hub runs inside the tunnel, end to end: the proxy
//!   sees neither the stream nor the client certificate. `clouddriver.noProxy: true` ignores
//!   the variables for the hub.
//! - API servers: each account's Kubernetes client goes through the proxy for its API
//!   server's URL unless `NO_PROXY` matches its host, `kubernetes.noProxy` or the account's
//!   `noProxy` is true, or its kubeconfig names a `proxy-url` of its own (which wins).

use std::time::Duration;

use http::Uri;
use hyper_util::client::{
    legacy::connect::{HttpConnector, proxy::Tunnel},
    proxy::matcher::{Intercept, Matcher},
};

use crate::error::{Error, Result};

/// How long the TCP connection to the proxy may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The proxy settings of the environment, read now.
pub fn from_env() -> Matcher {
    Matcher::from_env()
}

/// The proxy to tunnel the hub connection at `hub_url` through, if any: the one for an
/// https URL to the same host and port, as grpc-go chooses it.
pub fn for_hub(matcher: &Matcher, hub_url: &Uri) -> Option<Intercept> {
    let authority = hub_url.authority()?.clone();
    let https = Uri::builder()
        .scheme("https")
        .authority(authority)
        .path_and_query("/")
        .build()
        .ok()?;
    matcher.intercept(&https)
}

/// A connector that opens each connection as a `CONNECT` tunnel through `proxy` (with its
/// basic credentials when its URL has them). Only `http://` proxies are supported: the
/// tunnel itself is not encrypted, what runs in it is.
pub fn tunnel(proxy: &Intercept) -> Result<Tunnel<HttpConnector>> {
    if proxy.uri().scheme_str() != Some("http") {
        return Err(Error::InvalidConfig(format!(
            "the proxy for the hub ({}) must be an http:// URL (HTTPS_PROXY=http://proxy:3128); \
             the connection to the hub is TLS inside the proxy's CONNECT tunnel anyway, or set \
             clouddriver.noProxy: true to connect directly",
            proxy.uri()
        )));
    }
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let mut tunnel = Tunnel::new(proxy.uri().clone(), http);
    if let Some(auth) = proxy.basic_auth() {
        tunnel = tunnel.with_auth(auth.clone());
    }
    Ok(tunnel)
}

/// The first set variable of `names`, as given (credentials included).
fn first_env(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
}

/// The proxy URL (credentials included, as kube sends them in `Proxy-Authorization`) the
/// environment gives for `url`'s scheme.
fn env_proxy_url(url: &Uri) -> Option<Uri> {
    let specific: &[&str] = if url.scheme_str() == Some("http") {
        &["HTTP_PROXY", "http_proxy"]
    } else {
        &["HTTPS_PROXY", "https_proxy"]
    };
    let raw = first_env(specific).or_else(|| first_env(&["ALL_PROXY", "all_proxy"]))?;
    let raw = if raw.contains("://") {
        raw
    } else {
        // curl's reading: a proxy without a scheme is http.
        format!("http://{raw}")
    };
    raw.trim().parse().ok()
}

/// What kube made of the environment on its own (it reads `HTTPS_PROXY` when a kubeconfig
/// names no `proxy-url`, without matching `NO_PROXY` against the API server).
fn kube_default() -> Option<Uri> {
    let raw = first_env(&["HTTPS_PROXY", "https_proxy"])?;
    raw.parse().ok()
}

/// Sets the proxy of a Kubernetes client config: a kubeconfig's own `proxy-url` is kept;
/// otherwise the environment's proxy for the API server's URL, unless `no_proxy` (Armory's
/// `kubernetes.noProxy` or the account's `noProxy`) or `NO_PROXY` matches its host.
pub fn apply_to_kube(config: &mut kube::Config, no_proxy: bool, matcher: &Matcher) {
    let url = config.cluster_url.clone();
    if config.proxy_url.is_some() && config.proxy_url != kube_default() {
        return;
    }
    config.proxy_url = if no_proxy || matcher.intercept(&url).is_none() {
        None
    } else {
        env_proxy_url(&url)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(https: &str, no: &str) -> Matcher {
        Matcher::builder().https(https).no(no).build()
    }

    #[test]
    fn the_hub_goes_through_the_https_proxy_unless_no_proxy_matches() {
        let proxy = matcher("http://user:secret@proxy.corp:3128", "10.0.0.0/8,.internal");
        // A plaintext hub too: grpc-go looks the proxy up as for https.
        for hub in ["https://hub.example:9091", "http://hub.example:9091"] {
            let found = for_hub(&proxy, &hub.parse().unwrap()).unwrap();
            assert_eq!(found.uri(), "http://proxy.corp:3128/", "{hub}");
            assert!(found.basic_auth().is_some());
            assert!(tunnel(&found).is_ok());
        }
        for direct in [
            "https://10.1.2.3:9091",
            "https://hub.internal:9091",
            "http://x.hub.internal:9091",
        ] {
            assert!(
                for_hub(&proxy, &direct.parse().unwrap()).is_none(),
                "{direct}"
            );
        }
        assert!(for_hub(&matcher("", ""), &"https://hub:9091".parse().unwrap()).is_none());
        let https_proxy = matcher("https://proxy.corp:3129", "");
        let found = for_hub(&https_proxy, &"https://hub:9091".parse().unwrap()).unwrap();
        let refused = tunnel(&found)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("must be an http:// URL"), "{refused}");
    }

    #[test]
    fn kube_clients_keep_a_kubeconfig_proxy_and_honour_no_proxy() {
        let proxy = matcher("http://proxy.corp:3128", "127.0.0.1,.svc");
        let mut config = kube::Config::new("https://api.example:6443".parse().unwrap());
        // No HTTPS_PROXY in this test's environment: nothing to take from it.
        apply_to_kube(&mut config, false, &proxy);
        assert_eq!(config.proxy_url, None, "no variable, no proxy");
        // A kubeconfig's own proxy-url wins over everything.
        let own: Uri = "http://kubeconfig-proxy:8080".parse().unwrap();
        config.proxy_url = Some(own.clone());
        apply_to_kube(&mut config, true, &proxy);
        assert_eq!(config.proxy_url, Some(own));
        // NO_PROXY and noProxy clear what kube took from the environment.
        let mut direct = kube::Config::new("https://kubernetes.default.svc".parse().unwrap());
        apply_to_kube(&mut direct, false, &proxy);
        assert_eq!(direct.proxy_url, None);
    }
}
