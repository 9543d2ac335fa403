//! The discovery and OpenAPI documents the proxy keeps per account: `/api`, `/apis`,
//! `/api/<v>`, `/apis/<g>[/<v>]`, `/version`, `/openapi/v2`, `/openapi/v3[/...]`.
//!
//! Every kubectl command starts by reading discovery (two requests with aggregated
//! discovery, dozens without), and kubectl 1.22 downloads the 2-3 MB `/openapi/v2` on every
//! apply; Clouddriver runs kubectl for every step of every pipeline. Answering these from the
//! hub saves a round trip through the tunnel and the API server each time.
//!
//! Entries are keyed by the request's path and query, `Accept` (aggregated and legacy
//! discovery, JSON and protobuf OpenAPI are different documents of the same path) and
//! whether the client accepts gzip (the body is kept as the API server encoded it). They
//! are served while fresh ([`FRESH_FOR`]); after that a request revalidates the entry with
//! the API server's `ETag` (`If-None-Match`, a 304 keeps the entry), or fetches it again
//! when the document has none. An account's entries are dropped, and nothing is cached for
//! [`QUIET_AFTER_CHANGE`], when its agent reports that the cluster's kinds changed or a
//! CustomResourceDefinition or APIService is written through the proxy: a new CRD takes a
//! moment to appear in discovery, and a document cached in that moment would hide it.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderMap, Method};

/// How long an entry is served without asking the API server.
pub const FRESH_FOR: Duration = Duration::from_secs(300);
/// After a change of kinds, how long nothing is cached for the account.
pub const QUIET_AFTER_CHANGE: Duration = Duration::from_secs(30);
/// Largest document kept (a big cluster's `/openapi/v2` is tens of MB); larger ones are
/// passed through without caching.
pub const MAX_ENTRY_BYTES: usize = 64 * 1024 * 1024;
/// Most bytes kept per account; the oldest entries go first.
pub const MAX_ACCOUNT_BYTES: usize = 256 * 1024 * 1024;
/// Default of the most bytes kept for all accounts together (`--discovery-cache-mib`):
/// review F14, the per-account bound alone lets agents of many accounts (or one identity
/// with many) grow the hub by 256 MiB each.
pub const DEFAULT_TOTAL_BYTES: usize = 512 * 1024 * 1024;

/// Whether a request reads a discovery, version or OpenAPI document.
pub fn is_discovery(method: &Method, path: &str) -> bool {
    if method != Method::GET {
        return false;
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // `..` under `openapi/v3` must not make any path a discovery document (F21); the proxy
    // refuses such paths before this, this keeps the match safe on its own.
    if segments
        .iter()
        .any(|s| s.is_empty() || *s == "." || *s == ".." || s.contains('%'))
    {
        return false;
    }
    matches!(
        segments.as_slice(),
        ["api"]
            | ["api", _]
            | ["apis"]
            | ["apis", _]
            | ["apis", _, _]
            | ["version"]
            | ["openapi", "v2"]
            | ["openapi", "v3", ..]
    )
}

/// Whether a request writes the cluster's set of kinds (CRDs, aggregated APIs).
pub fn changes_kinds(method: &Method, path: &str) -> bool {
    if !matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) {
        return false;
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    matches!(
        segments.as_slice(),
        [
            "apis",
            "apiextensions.k8s.io",
            _,
            "customresourcedefinitions",
            ..
        ] | ["apis", "apiregistration.k8s.io", _, "apiservices", ..]
    )
}

/// What distinguishes two documents of one account.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Key {
    pub path_and_query: String,
    pub accept: String,
    pub gzip: bool,
}

impl Key {
    /// The key of a request.
    pub fn new(path_and_query: &str, headers: &HeaderMap) -> Self {
        let accept = headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(",");
        let gzip = headers
            .get_all(http::header::ACCEPT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.to_ascii_lowercase().contains("gzip"));
        Key {
            path_and_query: without_timeout(path_and_query),
            accept,
            gzip,
        }
    }
}

/// The path and query without `timeout` (client-go adds `?timeout=32s` to discovery; it
/// does not change the document, and other clients send none).
fn without_timeout(path_and_query: &str) -> String {
    let Some((path, query)) = path_and_query.split_once('?') else {
        return path_and_query.to_string();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty() && pair.split('=').next() != Some("timeout"))
        .collect();
    if kept.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", kept.join("&"))
    }
}

/// A cached document: the headers a client needs and the body as the API server sent it.
#[derive(Clone, Debug)]
pub struct Document {
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Bytes,
    pub etag: Option<String>,
}

/// Response headers kept with a document.
pub const KEPT_HEADERS: &[&str] = &[
    "content-type",
    "content-encoding",
    "etag",
    "cache-control",
    "expires",
    "last-modified",
    "vary",
];

#[derive(Debug)]
struct Entry {
    document: Document,
    stored: Instant,
    last_used: Instant,
}

#[derive(Debug, Default)]
struct AccountDocuments {
    entries: HashMap<Key, Entry>,
    bytes: usize,
    quiet_until: Option<Instant>,
}

/// What the cache holds for a request.
#[derive(Debug)]
pub enum Lookup {
    /// Serve this.
    Fresh(Document),
    /// Ask the API server whether this is still current (it has an ETag).
    Revalidate(Document),
    /// Fetch it.
    Miss,
}

/// Counters of cache use (for metrics and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub hits: u64,
    pub revalidated: u64,
    pub misses: u64,
    /// Documents dropped to keep all accounts within the hub-wide limit.
    pub evicted: u64,
}

/// Per-account documents.
#[derive(Debug)]
pub struct DiscoveryCache {
    accounts: Mutex<HashMap<String, AccountDocuments>>,
    stats: Mutex<Stats>,
    max_entry_bytes: usize,
    max_account_bytes: usize,
    /// All accounts together (`usize::MAX`: no hub-wide limit).
    max_total_bytes: usize,
}

impl Default for DiscoveryCache {
    fn default() -> Self {
        Self::with_limits(MAX_ENTRY_BYTES, MAX_ACCOUNT_BYTES, DEFAULT_TOTAL_BYTES)
    }
}

impl DiscoveryCache {
    /// A cache keeping documents up to `max_entry_bytes`, up to `max_account_bytes` per
    /// account, and up to `max_total_bytes` for all accounts together (0: no hub-wide
    /// limit).
    pub fn with_limits(
        max_entry_bytes: usize,
        max_account_bytes: usize,
        max_total_bytes: usize,
    ) -> Self {
        DiscoveryCache {
            accounts: Mutex::default(),
            stats: Mutex::default(),
            max_entry_bytes,
            max_account_bytes,
            max_total_bytes: if max_total_bytes == 0 {
                usize::MAX
            } else {
                max_total_bytes
            },
        }
    }

    /// Bytes of the documents kept for all accounts.
    pub fn bytes(&self) -> usize {
        self.lock().values().map(|d| d.bytes).sum()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, AccountDocuments>> {
        self.accounts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut Stats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Cache use so far.
    pub fn stats(&self) -> Stats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What to do for a request of `account`.
    pub fn lookup(&self, account: &str, key: &Key, now: Instant) -> Lookup {
        let mut accounts = self.lock();
        let Some(documents) = accounts.get_mut(account) else {
            self.count(|s| s.misses += 1);
            return Lookup::Miss;
        };
        if documents.quiet_until.is_some_and(|t| now < t) {
            self.count(|s| s.misses += 1);
            return Lookup::Miss;
        }
        let Some(entry) = documents.entries.get_mut(key) else {
            self.count(|s| s.misses += 1);
            return Lookup::Miss;
        };
        entry.last_used = now;
        if now.saturating_duration_since(entry.stored) < FRESH_FOR {
            self.count(|s| s.hits += 1);
            Lookup::Fresh(entry.document.clone())
        } else if entry.document.etag.is_some() {
            self.count(|s| s.revalidated += 1);
            Lookup::Revalidate(entry.document.clone())
        } else {
            self.count(|s| s.misses += 1);
            Lookup::Miss
        }
    }

    /// Keeps a document the API server sent (status 200).
    pub fn store(&self, account: &str, key: Key, document: Document, now: Instant) {
        if document.body.len() > self.max_entry_bytes {
            return;
        }
        let mut accounts = self.lock();
        let documents = accounts.entry(account.to_string()).or_default();
        if documents.quiet_until.is_some_and(|t| now < t) {
            return;
        }
        if let Some(old) = documents.entries.remove(&key) {
            documents.bytes -= old.document.body.len();
        }
        documents.bytes += document.body.len();
        documents.entries.insert(
            key,
            Entry {
                document,
                stored: now,
                last_used: now,
            },
        );
        while documents.bytes > self.max_account_bytes {
            let Some(oldest) = documents
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(old) = documents.entries.remove(&oldest) {
                documents.bytes -= old.document.body.len();
            }
        }
        // Past the hub-wide limit, the documents used longest ago go, whichever account
        // holds them: an account re-fetches a dropped one from its cluster, the hub's
        // memory stays bounded however many accounts fill theirs.
        let mut total: usize = accounts.values().map(|d| d.bytes).sum();
        let mut evicted = 0;
        while total > self.max_total_bytes {
            let Some((account, key)) = accounts
                .iter()
                .flat_map(|(account, d)| d.entries.iter().map(move |(k, e)| (account, k, e)))
                .min_by_key(|(_, _, e)| e.last_used)
                .map(|(account, k, _)| (account.clone(), k.clone()))
            else {
                break;
            };
            if let Some(documents) = accounts.get_mut(&account)
                && let Some(old) = documents.entries.remove(&key)
            {
                documents.bytes -= old.document.body.len();
                total -= old.document.body.len();
                evicted += 1;
            }
        }
        if evicted > 0 {
            self.count(|s| s.evicted += evicted);
        }
    }

    /// The document kept for `key`, however old (while no agent can fetch a new one).
    pub fn last_known(&self, account: &str, key: &Key) -> Option<Document> {
        self.lock()
            .get(account)
            .and_then(|d| d.entries.get(key))
            .map(|e| e.document.clone())
    }

    /// The API server answered 304 to a revalidation: the entry is fresh again.
    pub fn revalidated(&self, account: &str, key: &Key, now: Instant) {
        if let Some(entry) = self
            .lock()
            .get_mut(account)
            .and_then(|d| d.entries.get_mut(key))
        {
            entry.stored = now;
        }
    }

    /// The account's kinds changed: drop its documents and cache nothing for a while.
    pub fn invalidate(&self, account: &str, now: Instant) {
        let mut accounts = self.lock();
        let documents = accounts.entry(account.to_string()).or_default();
        documents.entries.clear();
        documents.bytes = 0;
        documents.quiet_until = Some(now + QUIET_AFTER_CHANGE);
    }

    /// The account is gone.
    pub fn forget(&self, account: &str) {
        self.lock().remove(account);
    }

    /// Number of documents kept for `account`.
    pub fn len(&self, account: &str) -> usize {
        self.lock().get(account).map_or(0, |d| d.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn discovery_paths() {
        let yes = [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps",
            "/apis/apps/v1",
            "/version",
            "/openapi/v2",
            "/openapi/v3",
            "/openapi/v3/apis/apps/v1",
            "/openapi/v3/api/v1",
        ];
        for path in yes {
            assert!(is_discovery(&Method::GET, path), "{path}");
        }
        let no = [
            "/api/v1/namespaces",
            "/apis/apps/v1/deployments",
            "/apis/apps/v1/namespaces/x/deployments",
            "/healthz",
            "/openapi",
            "/api//v1",
            "/",
            "/openapi/v3/../../api/v1/namespaces/x/secrets",
            "/openapi/v3/./apis",
            "/openapi/v3/%2E%2E/api/v1/secrets",
        ];
        for path in no {
            assert!(!is_discovery(&Method::GET, path), "{path}");
        }
        assert!(!is_discovery(&Method::POST, "/api"));
    }

    #[test]
    fn keys_ignore_the_timeout_parameter_only() {
        let headers = HeaderMap::new();
        let key = |p: &str| Key::new(p, &headers).path_and_query;
        assert_eq!(key("/api?timeout=32s"), "/api");
        assert_eq!(key("/api"), "/api");
        assert_eq!(
            key("/openapi/v3/apis/apps/v1?hash=AB12&timeout=32s"),
            "/openapi/v3/apis/apps/v1?hash=AB12"
        );
    }

    #[test]
    fn writes_of_crds_and_apiservices_change_kinds() {
        let crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
        assert!(changes_kinds(&Method::POST, crds));
        assert!(changes_kinds(
            &Method::PATCH,
            &format!("{crds}/widgets.example.com")
        ));
        assert!(changes_kinds(
            &Method::DELETE,
            "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.metrics.k8s.io"
        ));
        assert!(!changes_kinds(&Method::GET, crds));
        assert!(!changes_kinds(
            &Method::POST,
            "/api/v1/namespaces/x/configmaps"
        ));
    }

    fn key(path: &str, accept: &str) -> Key {
        let mut headers = HeaderMap::new();
        headers.insert("accept", HeaderValue::from_str(accept).unwrap());
        headers.insert("accept-encoding", HeaderValue::from_static("gzip"));
        Key::new(path, &headers)
    }

    fn doc(body: &str, etag: Option<&str>) -> Document {
        Document {
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: Bytes::from(body.to_string()),
            etag: etag.map(str::to_string),
        }
    }

    #[test]
    fn fresh_then_revalidate_with_etag_or_refetch_without() {
        let cache = DiscoveryCache::default();
        let t0 = Instant::now();
        let aggregated = key(
            "/apis",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList, application/json",
        );
        let legacy = key("/apis", "application/json");
        assert!(matches!(cache.lookup("a", &aggregated, t0), Lookup::Miss));
        cache.store("a", aggregated.clone(), doc("agg", Some("\"e1\"")), t0);
        cache.store("a", legacy.clone(), doc("legacy", None), t0);
        match cache.lookup("a", &aggregated, t0 + Duration::from_secs(1)) {
            Lookup::Fresh(d) => assert_eq!(&d.body[..], b"agg"),
            other => panic!("{other:?}"),
        }
        match cache.lookup("a", &legacy, t0) {
            Lookup::Fresh(d) => assert_eq!(&d.body[..], b"legacy", "Accept tells them apart"),
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(cache.lookup("b", &legacy, t0), Lookup::Miss),
            "per account"
        );
        let later = t0 + FRESH_FOR + Duration::from_secs(1);
        assert!(
            matches!(cache.lookup("a", &aggregated, later), Lookup::Revalidate(d) if d.etag.as_deref() == Some("\"e1\""))
        );
        assert!(matches!(cache.lookup("a", &legacy, later), Lookup::Miss));
        assert!(cache.last_known("a", &legacy).is_some(), "stale, but kept");
        cache.revalidated("a", &aggregated, later);
        assert!(matches!(
            cache.lookup("a", &aggregated, later),
            Lookup::Fresh(_)
        ));
        assert_eq!(
            cache.stats(),
            Stats {
                hits: 3,
                revalidated: 1,
                misses: 3,
                evicted: 0
            }
        );
    }

    #[test]
    fn a_change_of_kinds_empties_the_account_and_keeps_it_uncached_for_a_while() {
        let cache = DiscoveryCache::default();
        let t0 = Instant::now();
        let k = key("/api", "application/json");
        cache.store("a", k.clone(), doc("x", None), t0);
        cache.store("b", k.clone(), doc("x", None), t0);
        cache.invalidate("a", t0);
        assert_eq!(cache.len("a"), 0);
        assert_eq!(cache.len("b"), 1, "other accounts keep theirs");
        cache.store(
            "a",
            k.clone(),
            doc("stale?", None),
            t0 + Duration::from_secs(1),
        );
        assert_eq!(
            cache.len("a"),
            0,
            "nothing is cached while the change settles"
        );
        let after = t0 + QUIET_AFTER_CHANGE + Duration::from_secs(1);
        assert!(matches!(cache.lookup("a", &k, after), Lookup::Miss));
        cache.store("a", k.clone(), doc("new", None), after);
        assert!(matches!(cache.lookup("a", &k, after), Lookup::Fresh(d) if &d.body[..] == b"new"));
        cache.forget("a");
        assert_eq!(cache.len("a"), 0);
    }

    #[test]
    fn oversized_documents_are_not_kept_and_accounts_are_bounded() {
        let (max_entry, max_account) = (100, 350);
        let cache = DiscoveryCache::with_limits(max_entry, max_account, 0);
        let t0 = Instant::now();
        let big = Document {
            headers: Vec::new(),
            body: Bytes::from(vec![0u8; max_entry + 1]),
            etag: None,
        };
        cache.store("a", key("/openapi/v2", "application/json"), big, t0);
        assert_eq!(cache.len("a"), 0);
        let chunk = max_entry;
        for i in 0..(max_account / chunk + 2) {
            let d = Document {
                headers: Vec::new(),
                body: Bytes::from(vec![0u8; chunk]),
                etag: None,
            };
            cache.store(
                "a",
                key(&format!("/openapi/v3/apis/g{i}/v1"), "application/json"),
                d,
                t0 + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(cache.len("a"), max_account / chunk);
        assert!(
            matches!(
                cache.lookup("a", &key("/openapi/v3/apis/g0/v1", "application/json"), t0),
                Lookup::Miss
            ),
            "the oldest went first"
        );
    }

    #[test]
    fn all_accounts_together_stay_within_the_hub_wide_limit() {
        let cache = DiscoveryCache::with_limits(100, 1000, 250);
        let t0 = Instant::now();
        let doc = || Document {
            headers: Vec::new(),
            body: Bytes::from(vec![0u8; 100]),
            etag: None,
        };
        let k = |i: usize| key(&format!("/openapi/v3/apis/g{i}/v1"), "application/json");
        cache.store("quiet", k(0), doc(), t0);
        cache.store("quiet", k(1), doc(), t0 + Duration::from_millis(1));
        // Another account's documents, used since: the least recently used go first,
        // whichever account holds them.
        for i in 0..3 {
            cache.store(
                "busy",
                k(i),
                doc(),
                t0 + Duration::from_millis(10 + i as u64),
            );
        }
        assert_eq!(cache.bytes(), 200);
        assert_eq!((cache.len("quiet"), cache.len("busy")), (0, 2));
        assert_eq!(cache.stats().evicted, 3);
        assert!(matches!(
            cache.lookup("busy", &k(2), t0 + Duration::from_millis(20)),
            Lookup::Fresh(_)
        ));
        // 0: no hub-wide limit (only the per-account one).
        let unbounded = DiscoveryCache::with_limits(100, 1000, 0);
        for account in ["a", "b", "c", "d"] {
            unbounded.store(account, k(0), doc(), t0);
        }
        assert_eq!(unbounded.bytes(), 400);
    }
}
