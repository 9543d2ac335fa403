//! A watch's query as the API server reads it, and the lines of a watch's answer: which
//! `resourceVersion` / `resourceVersionMatch` / `sendInitialEvents` combinations the API
//! server accepts (`ValidateListOptions` in apimachinery's
//! `pkg/apis/meta/internalversion/validation`) and what each asks for (the watch cache's
//! rules in apiserver's `pkg/storage/cacher`):
//!
//! | sendInitialEvents | resourceVersionMatch | resourceVersion | answer |
//! |---|---|---|---|
//! | unset | unset | unset or `0` | ADDED for every object, then the changes |
//! | unset | unset | `N` | the changes after `N` (410 when `N` is too old) |
//! | unset | set | any | refused: `resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided` |
//! | set | not `NotOlderThan` | any | refused: `sendInitialEvents requires setting resourceVersionMatch to NotOlderThan` |
//! | `true` | `NotOlderThan` | unset, `0` or `N` | ADDED for every object at a version not older than `N`, then (with `allowWatchBookmarks`) a BOOKMARK annotated `k8s.io/initial-events-end: "true"`, then the changes |
//! | `false` | `NotOlderThan` | unset or `0` | the changes from now on, no initial events |
//! | `false` | `NotOlderThan` | `N` | the changes after `N`, as without the parameters |
//!
//! The refused combinations are tunnelled, so that the API server refuses them itself, with
//! its own status (`422 Invalid`, `ListOptions.meta.k8s.io "" is invalid: ...`) and message,
//! whatever its version's wording.

use std::time::Duration;

use bytes::Bytes;
use scale_agent_hub_cache::KindInfo;

use super::request;

/// The annotation of the bookmark that ends a streaming list's initial events
/// (`metav1.InitialEventsAnnotationKey`).
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";
/// The only `resourceVersionMatch` a watch accepts.
pub const NOT_OLDER_THAN: &str = "NotOlderThan";

/// A watch's parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchOptions {
    pub label_selector: String,
    pub field_selector: String,
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`, when not empty.
    pub resource_version_match: Option<String>,
    /// `sendInitialEvents`, when given.
    pub send_initial_events: Option<bool>,
    pub allow_bookmarks: bool,
    pub timeout: Option<Duration>,
}

/// Where a watch starts, and whether it begins with every object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start<'a> {
    /// ADDED for every object at the cache's resume point (not older than the version, if
    /// any), then the changes; `end_bookmark`: then the initial-events-end bookmark.
    Initial {
        not_older_than: Option<&'a str>,
        end_bookmark: bool,
    },
    /// The changes after the cache's resume point, without initial events.
    Now,
    /// The changes after this resourceVersion.
    After(&'a str),
}

impl WatchOptions {
    /// Whether the API server accepts these parameters for a watch (its
    /// `validateWatchOptions`); the refused ones are left to it to refuse.
    pub fn accepted(&self) -> bool {
        let not_older_than = self.resource_version_match.as_deref() == Some(NOT_OLDER_THAN);
        match (self.send_initial_events, &self.resource_version_match) {
            (None, None) => true,
            (None, Some(_)) => false,
            (Some(_), _) => not_older_than,
        }
    }

    /// Where an accepted watch starts ([`Self::accepted`]).
    pub fn start(&self) -> Start<'_> {
        let version = self.resource_version.as_deref();
        match (self.send_initial_events, version) {
            (Some(true), rv) => Start::Initial {
                not_older_than: rv.filter(|v| *v != "0"),
                end_bookmark: self.allow_bookmarks,
            },
            (Some(false), None | Some("0")) => Start::Now,
            (None, None | Some("0")) => Start::Initial {
                not_older_than: None,
                end_bookmark: false,
            },
            (_, Some(rv)) => Start::After(rv),
        }
    }
}

/// Go's `strconv.ParseBool`, which the API server decodes boolean query parameters with.
fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Parses a watch query; `None` when it is not a watch or has a parameter the cache does not
/// implement (`continue`, `limit`, ...) or cannot decode as the API server would.
pub fn parse_watch_query(query: Option<&str>) -> Option<WatchOptions> {
    let mut options = WatchOptions::default();
    let mut watch = false;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = request::decode(value)?;
        match key {
            "watch" => watch = value == "true" || value == "1",
            "labelSelector" => options.label_selector = value,
            "fieldSelector" => options.field_selector = value,
            "resourceVersion" => {
                options.resource_version = Some(value).filter(|v| !v.is_empty());
            }
            "resourceVersionMatch" => {
                options.resource_version_match = Some(value).filter(|v| !v.is_empty());
            }
            "sendInitialEvents" => options.send_initial_events = Some(parse_bool(&value)?),
            "allowWatchBookmarks" => options.allow_bookmarks = value == "true" || value == "1",
            "timeoutSeconds" => {
                options.timeout = Some(Duration::from_secs(value.parse().ok()?));
            }
            "timeout" => {}
            _ => return None,
        }
    }
    watch.then_some(options)
}

/// One watch event line.
pub fn event_line(event_type: &str, object: &[u8]) -> Bytes {
    let mut line = Vec::with_capacity(object.len() + 32);
    line.extend_from_slice(br#"{"type":""#);
    line.extend_from_slice(event_type.as_bytes());
    line.extend_from_slice(br#"","object":"#);
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

/// The ERROR event the API server sends for a watch it cannot continue.
pub fn gone_line(message: &str) -> Bytes {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": "Expired", "code": 410,
    });
    event_line("ERROR", status.to_string().as_bytes())
}

/// A BOOKMARK at `rv`.
pub fn bookmark_line(info: &KindInfo, rv: u64) -> Bytes {
    let object = serde_json::json!({
        "kind": info.kind, "apiVersion": info.api_version(),
        "metadata": { "resourceVersion": rv.to_string() },
    });
    event_line("BOOKMARK", object.to_string().as_bytes())
}

/// The BOOKMARK that ends a streaming list's initial events: every object up to `rv` has
/// been sent (clients such as client-go's reflector and kube-rs's watcher replace their
/// store with what they received when they read it).
pub fn initial_events_end_line(info: &KindInfo, rv: u64) -> Bytes {
    let object = serde_json::json!({
        "kind": info.kind, "apiVersion": info.api_version(),
        "metadata": {
            "resourceVersion": rv.to_string(),
            "annotations": { INITIAL_EVENTS_END: "true" },
        },
    });
    event_line("BOOKMARK", object.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn parsed(query: &str) -> WatchOptions {
        parse_watch_query(Some(query)).unwrap()
    }

    #[test]
    fn watch_queries() {
        let o = parsed(
            "watch=true&resourceVersion=10&allowWatchBookmarks=true&timeoutSeconds=30&labelSelector=app%3Dweb",
        );
        assert_eq!(o.resource_version.as_deref(), Some("10"));
        assert!(o.allow_bookmarks);
        assert_eq!(o.timeout, Some(Duration::from_secs(30)));
        assert_eq!(o.label_selector, "app=web");
        assert_eq!(parse_watch_query(Some("limit=5")), None, "not a watch");
        assert_eq!(
            parse_watch_query(Some("watch=1&continue=abc")),
            None,
            "not implemented"
        );
        assert_eq!(
            parse_watch_query(Some("watch=1&sendInitialEvents=yes")),
            None,
            "the API server's 400, not guessed"
        );
        let o = parsed("watch=1&sendInitialEvents=True&resourceVersionMatch=NotOlderThan");
        assert_eq!(o.send_initial_events, Some(true));
        assert_eq!(o.resource_version_match.as_deref(), Some(NOT_OLDER_THAN));
        assert_eq!(
            parsed("watch=1&resourceVersionMatch=").resource_version_match,
            None
        );
    }

    /// Every combination of the three parameters: accepted or refused as by the API
    /// server's `validateWatchOptions`, and where the accepted ones start.
    #[test]
    fn combinations_as_the_api_server_reads_them() {
        let end = |not_older_than, end_bookmark| Start::Initial {
            not_older_than,
            end_bookmark,
        };
        let cases: &[(&str, Option<Start<'static>>)] = &[
            ("", Some(end(None, false))),
            ("&resourceVersion=0", Some(end(None, false))),
            ("&resourceVersion=7", Some(Start::After("7"))),
            ("&resourceVersionMatch=NotOlderThan", None),
            ("&resourceVersionMatch=Exact&resourceVersion=7", None),
            ("&sendInitialEvents=true", None),
            ("&sendInitialEvents=false", None),
            ("&sendInitialEvents=true&resourceVersionMatch=Exact", None),
            (
                "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
                Some(end(None, false)),
            ),
            (
                "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
                Some(end(None, true)),
            ),
            (
                "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=0&allowWatchBookmarks=true",
                Some(end(None, true)),
            ),
            (
                "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=7&allowWatchBookmarks=true",
                Some(end(Some("7"), true)),
            ),
            (
                "&sendInitialEvents=false&resourceVersionMatch=NotOlderThan",
                Some(Start::Now),
            ),
            (
                "&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=0",
                Some(Start::Now),
            ),
            (
                "&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=7",
                Some(Start::After("7")),
            ),
        ];
        for (query, expected) in cases {
            let options = parsed(&format!("watch=true{query}"));
            let got = options.accepted().then(|| options.start());
            assert_eq!(&got, expected, "{query}");
        }
    }

    #[test]
    fn lines() {
        assert_eq!(
            event_line("ADDED", b"{}"),
            Bytes::from_static(b"{\"type\":\"ADDED\",\"object\":{}}\n")
        );
        let gone: Value = serde_json::from_slice(&gone_line("old")).unwrap();
        assert_eq!(gone["type"], "ERROR");
        assert_eq!(gone["object"]["code"], 410);
        let info = KindInfo {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        };
        let end: Value = serde_json::from_slice(&initial_events_end_line(&info, 12)).unwrap();
        assert_eq!(end["type"], "BOOKMARK");
        assert_eq!(end["object"]["kind"], "ConfigMap");
        assert_eq!(end["object"]["metadata"]["resourceVersion"], "12");
        assert_eq!(
            end["object"]["metadata"]["annotations"][INITIAL_EVENTS_END],
            "true"
        );
    }
}
