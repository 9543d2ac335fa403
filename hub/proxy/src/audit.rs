//! Audit lines of the Kubernetes API proxy: one structured tracing event, target `audit`,
//! per request through the proxy, written when its answer ends (a watch's when it closes):
//! writes always (any method but GET, HEAD and OPTIONS, and exec/attach/port-forward
//! upgrades, message `proxied write`), reads as `--proxy-audit-reads` says ([`AuditReads`],
//! message `proxied read`). Fields, those of the REST API's operation lines (the hub's
//! `audit`) and more:
//!
//! - `who` (the token's name, or the signed-in user; `-` without a valid token),
//!   `token_kind` (`proxy`), `person` (a person rather than Clouddriver's machine token);
//! - `account`, `verb` (the Kubernetes verb), `object`
//!   (`resource/namespace/name/subresource`, else the path), `path` (as sent, query
//!   included);
//! - `code`, `bytes` (of the response body passed to the client), `duration_ms` (until the
//!   body ended), `served` (`tunnel`: the API server through an agent; `cache`; `owner`:
//!   another replica; `hub`: the hub's own refusal);
//! - `request_id`: also the `Audit-ID` the agent sends the API server, so the target
//!   cluster's audit log names the same request (and the `Audit-Id` response header).
//! - `sampled` (reads under `sample:N`): this line stands for N reads.

use std::{
    pin::Pin,
    str::FromStr,
    sync::atomic::{AtomicU64, Ordering},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::{body::Body, http::Method};
use bytes::Bytes;
use http_body::{Frame, SizeHint};

/// The tracing target of audit events (the proxy's and the REST API's).
pub const TARGET: &str = "audit";

/// Which proxied reads get an audit line (`--proxy-audit-reads`); writes always do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AuditReads {
    /// Every read.
    #[default]
    All,
    /// No read.
    WritesOnly,
    /// One read in N (per replica, counted across accounts), its line saying `sampled=N`.
    Sample(u64),
}

impl FromStr for AuditReads {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "all" => Ok(AuditReads::All),
            "writes-only" => Ok(AuditReads::WritesOnly),
            _ => match text.strip_prefix("sample:").map(str::parse::<u64>) {
                Some(Ok(n)) if n >= 1 => Ok(AuditReads::Sample(n)),
                _ => Err(format!(
                    "{text:?} is not a read audit policy: use all, writes-only or sample:N \
                     (N a whole number from 1: one read line in N)"
                )),
            },
        }
    }
}

impl std::fmt::Display for AuditReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuditReads::All => f.write_str("all"),
            AuditReads::WritesOnly => f.write_str("writes-only"),
            AuditReads::Sample(n) => write!(f, "sample:{n}"),
        }
    }
}

impl AuditReads {
    /// Whether this read gets a line, and the `sampled` it says (`1` but under `sample:N`).
    /// `reads` counts the reads seen, for sampling.
    pub fn read_line(self, reads: &AtomicU64) -> Option<u64> {
        match self {
            AuditReads::All => Some(1),
            AuditReads::WritesOnly => None,
            AuditReads::Sample(n) => reads
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(n)
                .then_some(n),
        }
    }
}

/// A new request id: a random UUID (version 4), the form the API server makes its own
/// audit ids in.
pub fn request_id() -> String {
    use ring::rand::SecureRandom as _;
    let mut b = [0u8; 16];
    // The system's random source failing leaves zeros: an id that still correlates
    // within its timestamp, rather than a failed request.
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex = |range: std::ops::Range<usize>| -> String {
        b[range].iter().map(|x| format!("{x:02x}")).collect()
    };
    format!(
        "{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// What one audit line says of a request, all but how its answer ended.
#[derive(Clone, Debug)]
pub struct ProxyRequest {
    pub request_id: String,
    /// The caller's name (`None`: no valid token).
    pub who: Option<String>,
    pub person: bool,
    pub account: String,
    pub method: Method,
    /// The API path and query as sent.
    pub path: String,
    pub upgrade: bool,
    /// `1`, or N for a sampled read's line.
    pub sampled: u64,
    pub started: Instant,
}

impl ProxyRequest {
    /// Writes the line, once the answer ended with `code` after `bytes` of body.
    pub fn log(&self, code: u16, bytes: u64, served: &str) {
        let object = proxy_object(&self.path);
        let verb = proxy_verb(&self.method, object.as_ref(), &self.path, self.upgrade);
        let object = object
            .map(|o| o.to_string())
            .unwrap_or_else(|| self.path.split('?').next().unwrap_or("").to_string());
        let message = if is_proxy_write(&self.method, self.upgrade) {
            "proxied write"
        } else {
            "proxied read"
        };
        tracing::info!(
            target: TARGET,
            who = self.who.as_deref().unwrap_or("-"),
            token_kind = "proxy",
            person = self.person,
            account = %self.account,
            verb,
            object = %object,
            path = %self.path,
            code,
            bytes,
            duration_ms = millis(self.started.elapsed()),
            served,
            request_id = %self.request_id,
            sampled = self.sampled,
            "{message}"
        );
    }
}

/// A response body that writes its request's audit line when it ends or is dropped (the
/// client went away), counting the bytes it passed.
pub struct AuditedBody {
    inner: Body,
    line: Option<(ProxyRequest, u16, &'static str)>,
    bytes: u64,
}

impl AuditedBody {
    pub fn new(inner: Body, request: ProxyRequest, code: u16, served: &'static str) -> Self {
        AuditedBody {
            inner,
            line: Some((request, code, served)),
            bytes: 0,
        }
    }

    fn finish(&mut self) {
        if let Some((request, code, served)) = self.line.take() {
            request.log(code, self.bytes, served);
        }
    }
}

impl http_body::Body for AuditedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes += data.len() as u64;
                }
            }
            Poll::Ready(None) => self.finish(),
            Poll::Ready(Some(Err(_))) | Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for AuditedBody {
    fn drop(&mut self) {
        self.finish();
    }
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

/// The Kubernetes verb of a proxied request (`path` with its query, for `watch`).
fn proxy_verb(
    method: &Method,
    object: Option<&ProxyObject>,
    path: &str,
    upgrade: bool,
) -> &'static str {
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
        Method::GET | Method::HEAD
            if crate::is_long_running(
                &Method::GET,
                path.split('?').next().unwrap_or(""),
                path.split_once('?').map(|(_, q)| q),
            ) && !path.contains("/log") =>
        {
            "watch"
        }
        Method::GET | Method::HEAD if object.is_none() => "get",
        Method::GET | Method::HEAD if named => "get",
        Method::GET | Method::HEAD => "list",
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
        assert_eq!(proxy_verb(&Method::POST, exec.as_ref(), "", true), "exec");
        assert_eq!(
            proxy_verb(&Method::POST, exec.as_ref(), "", false),
            "create"
        );
        let pods = "/api/v1/namespaces/d/pods";
        let collection = proxy_object(pods);
        assert_eq!(
            proxy_verb(&Method::DELETE, collection.as_ref(), pods, false),
            "deletecollection"
        );
        assert_eq!(
            proxy_verb(&Method::GET, collection.as_ref(), pods, false),
            "list"
        );
        let watch = format!("{pods}?watch=true&resourceVersion=5");
        assert_eq!(
            proxy_verb(&Method::GET, proxy_object(&watch).as_ref(), &watch, false),
            "watch"
        );
        let one = "/api/v1/namespaces/d/pods/web-0";
        assert_eq!(
            proxy_verb(&Method::GET, proxy_object(one).as_ref(), one, false),
            "get"
        );
        assert_eq!(proxy_verb(&Method::GET, None, "/version", false), "get");
        assert!(is_proxy_write(&Method::GET, true));
        assert!(!is_proxy_write(&Method::GET, false) && !is_proxy_write(&Method::HEAD, false));
        assert!(is_proxy_write(&Method::PATCH, false));
    }

    #[test]
    fn read_policies_parse_and_sample_one_in_n() {
        assert_eq!("all".parse(), Ok(AuditReads::All));
        assert_eq!("writes-only".parse(), Ok(AuditReads::WritesOnly));
        assert_eq!("sample:10".parse(), Ok(AuditReads::Sample(10)));
        for bad in ["sample:0", "sample:", "some", "sample:x"] {
            let err = bad.parse::<AuditReads>().unwrap_err();
            assert!(err.contains("writes-only"), "{err}");
        }
        assert_eq!(AuditReads::Sample(3).to_string(), "sample:3");
        let reads = AtomicU64::new(0);
        let lines: Vec<Option<u64>> = (0..6)
            .map(|_| AuditReads::Sample(3).read_line(&reads))
            .collect();
        assert_eq!(lines, [Some(3), None, None, Some(3), None, None]);
        assert_eq!(AuditReads::WritesOnly.read_line(&reads), None);
        assert_eq!(AuditReads::All.read_line(&reads), Some(1));
    }

    #[test]
    fn request_ids_are_random_uuids() {
        let (a, b) = (request_id(), request_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.as_bytes()[14], b'4', "{a}");
        assert!(a.chars().all(|c| c == '-' || c.is_ascii_hexdigit()), "{a}");
    }
}
