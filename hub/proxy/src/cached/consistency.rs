//! When the cache may answer a read (sans-IO): the kind is streamed and synced for the
//! scope, and its resume point satisfies the request's resourceVersion rules and the
//! account's own writes (read-your-writes).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use scale_agent_hub_cache::{KindCache, KindKey};

use super::request::{ReadOptions, RvMatch};

/// The resume point the cache holds for a read of `namespace` (all namespaces when `None`),
/// when the kind is fully synced there: the agent reports it WATCHING for that scope and a
/// snapshot finished for it. A cluster-wide read of an account that omits namespaces is
/// never synced (the agent leaves those namespaces out of its cluster-wide watch).
pub fn synced_resume_point<'a>(
    kind: &'a KindCache,
    namespace: Option<&str>,
    omit_namespaces: &[String],
) -> Option<&'a str> {
    synced_scope(kind, namespace, omit_namespaces).map(|(_, rv)| rv)
}

/// Like [`synced_resume_point`], with the watch scope whose resume point it is: the
/// namespace when the agent watches the kind in that namespace (an account with
/// `namespaces:`), "" for its cluster-wide watch. A read of one namespace maps to exactly
/// one scope, whose events (and only those) move that resume point.
pub fn synced_scope<'a>(
    kind: &'a KindCache,
    namespace: Option<&str>,
    omit_namespaces: &[String],
) -> Option<(&'a str, &'a str)> {
    let watching = |scope: &[String]| {
        kind.statuses
            .get(scope)
            .is_some_and(|s| s.state == "WATCHING")
    };
    let cluster_wide = || {
        kind.resume
            .get_key_value("")
            .map(|(k, v)| (k.as_str(), v.as_str()))
    };
    match namespace {
        None => {
            if !omit_namespaces.is_empty() || !watching(&[]) {
                return None;
            }
            cluster_wide()
        }
        Some(ns) => {
            let own = [ns.to_string()];
            if let Some((scope, rv)) = kind.resume.get_key_value(ns)
                && watching(&own)
            {
                return Some((scope.as_str(), rv.as_str()));
            }
            if omit_namespaces.iter().any(|o| o == ns) || !watching(&[]) {
                return None;
            }
            cluster_wide()
        }
    }
}

/// What to do with a read, given the cache's resume point for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Answer from the cache now.
    Serve,
    /// Answer from the cache once its resume point reaches this resourceVersion (wait
    /// briefly; tunnel if it does not).
    WaitFor(u64),
    /// Answer from the cache once it dropped an object deleted through the proxy (wait
    /// briefly; tunnel if it does not).
    WaitForDeletion,
    /// Only the API server can answer this.
    Tunnel,
}

/// The API server's resourceVersion rules for LIST and GET, against a cache at `resume`:
/// unset and "0" are served (unset is the cache's latest state, kept no older than the
/// account's own writes by [`Floors`]); NotOlderThan waits for the cache to reach the
/// version; Exact is served only when the cache is at exactly that version; a list with
/// `limit` and a version but no match is Exact (the API server's legacy rule).
pub fn resource_version_decision(options: &ReadOptions, resume: &str, list: bool) -> Decision {
    let Ok(resume) = resume.parse::<u64>() else {
        return Decision::Tunnel;
    };
    let Some(rv) = options.resource_version.as_deref() else {
        // A match without a version is an error the API server explains.
        return if options.resource_version_match.is_some() {
            Decision::Tunnel
        } else {
            Decision::Serve
        };
    };
    if !list && options.resource_version_match.is_some() {
        return Decision::Tunnel;
    }
    if rv == "0" {
        return match options.resource_version_match {
            None | Some(RvMatch::NotOlderThan) => Decision::Serve,
            Some(RvMatch::Exact) => Decision::Tunnel,
        };
    }
    let Ok(wanted) = rv.parse::<u64>() else {
        return Decision::Tunnel;
    };
    let exact = match options.resource_version_match {
        Some(RvMatch::Exact) => true,
        Some(RvMatch::NotOlderThan) => false,
        None => list && options.limit.is_some(),
    };
    if exact {
        if resume == wanted {
            Decision::Serve
        } else {
            Decision::Tunnel
        }
    } else if resume >= wanted {
        Decision::Serve
    } else {
        Decision::WaitFor(wanted)
    }
}

/// What a write through the proxy left the cache to catch up with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Floor {
    /// The write's resourceVersion: reads wait for the cache to reach it.
    Version(u64),
    /// A delete answered with a `Status` (no resourceVersion) naming the object's uid: reads
    /// wait for the cache to drop it.
    Gone(String),
    /// The write's answer said neither (an unreadable body): reads of the kind in that
    /// namespace are tunnelled until then.
    Until(Instant),
}

/// How long reads of a kind are tunnelled after a write whose answer had no
/// resourceVersion.
pub const BARRIER: Duration = Duration::from_secs(5);
/// Scopes with writes pending per hub at most; beyond it the oldest is forgotten (logged).
pub const MAX_FLOORS: usize = 10_000;

/// The writes pending in one account, kind and namespace.
#[derive(Debug)]
struct Pending {
    version: Option<u64>,
    gone: Vec<String>,
    until: Option<Instant>,
    at: Instant,
}

/// The writes of each account, kind and namespace ("" for cluster-scoped) that the cache
/// has not shown yet: read-your-writes for the proxy's own writes.
#[derive(Debug, Default)]
pub struct Floors {
    floors: HashMap<(String, KindKey, String), Pending>,
}

impl Floors {
    /// Remembers a write.
    pub fn record(
        &mut self,
        account: &str,
        kind: KindKey,
        namespace: &str,
        floor: Floor,
        now: Instant,
    ) {
        let key = (account.to_string(), kind, namespace.to_string());
        let pending = self.floors.entry(key).or_insert(Pending {
            version: None,
            gone: Vec::new(),
            until: None,
            at: now,
        });
        pending.at = now;
        match floor {
            Floor::Version(v) => pending.version = Some(pending.version.map_or(v, |o| o.max(v))),
            Floor::Gone(uid) => pending.gone.push(uid),
            Floor::Until(t) => pending.until = Some(pending.until.map_or(t, |o| o.max(t))),
        }
        if self.floors.len() > MAX_FLOORS
            && let Some(oldest) = self
                .floors
                .iter()
                .min_by_key(|(_, p)| p.at)
                .map(|(k, _)| k.clone())
        {
            tracing::warn!(account = %oldest.0, kind = %oldest.1, "too many writes waiting for the cache; forgetting the oldest");
            self.floors.remove(&oldest);
        }
    }

    /// What a read of `namespace` (all namespaces when `None`) must wait for, forgetting
    /// writes the cache has caught up with: `resume` is the read's resume point, `cached`
    /// says whether the cache still holds an object (by uid).
    pub fn decision(
        &mut self,
        account: &str,
        kind: &KindKey,
        namespace: Option<&str>,
        resume: &str,
        cached: impl Fn(&str) -> bool,
        now: Instant,
    ) -> Decision {
        let resume = resume.parse::<u64>().ok();
        let mut decision = Decision::Serve;
        self.floors.retain(|(a, k, ns), pending| {
            // A write without a namespace (cluster-scoped, or a cluster-wide
            // deletecollection) concerns every read of the kind.
            if a != account || k != kind || namespace.is_some_and(|n| n != ns && !ns.is_empty()) {
                return true;
            }
            if pending.until.is_some_and(|t| t <= now) {
                pending.until = None;
            }
            if pending.until.is_some() {
                decision = Decision::Tunnel;
            }
            if let Some(v) = pending.version {
                match resume {
                    Some(r) if r >= v => pending.version = None,
                    Some(_) => decision = stricter(decision, Decision::WaitFor(v)),
                    None => decision = Decision::Tunnel,
                }
            }
            pending.gone.retain(|uid| cached(uid));
            if !pending.gone.is_empty() {
                decision = stricter(decision, Decision::WaitForDeletion);
            }
            pending.until.is_some() || pending.version.is_some() || !pending.gone.is_empty()
        });
        decision
    }
}

/// The stricter of two decisions.
pub fn stricter(a: Decision, b: Decision) -> Decision {
    use Decision::*;
    match (a, b) {
        (Tunnel, _) | (_, Tunnel) => Tunnel,
        (WaitFor(x), WaitFor(y)) => WaitFor(x.max(y)),
        (WaitFor(x), _) | (_, WaitFor(x)) => WaitFor(x),
        (WaitForDeletion, _) | (_, WaitForDeletion) => WaitForDeletion,
        (Serve, Serve) => Serve,
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use scale_agent_hub_cache::{KindInfo, KindState};

    fn kind(resume: &[(&str, &str)], statuses: &[(&[&str], &str)]) -> KindCache {
        KindCache {
            info: KindInfo {
                group: String::new(),
                version: "v1".into(),
                kind: "ConfigMap".into(),
                plural: "configmaps".into(),
                namespaced: true,
            },
            objects: Default::default(),
            resume: resume
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            statuses: statuses
                .iter()
                .map(|(scope, state)| {
                    let scope: Vec<String> = scope.iter().map(|s| s.to_string()).collect();
                    (
                        scope.clone(),
                        KindState {
                            state: state.to_string(),
                            message: String::new(),
                            namespaces: scope,
                        },
                    )
                })
                .collect(),
            histories: Default::default(),
            written_through: Default::default(),
            over_quota: None,
        }
    }

    #[test]
    fn synced_only_where_a_snapshot_finished_and_the_agent_watches() {
        let cluster = kind(&[("", "10")], &[(&[], "WATCHING")]);
        assert_eq!(synced_resume_point(&cluster, None, &[]), Some("10"));
        assert_eq!(synced_resume_point(&cluster, Some("a"), &[]), Some("10"));
        let omit = ["skip".to_string()];
        assert_eq!(synced_resume_point(&cluster, None, &omit), None);
        assert_eq!(synced_resume_point(&cluster, Some("skip"), &omit), None);
        assert_eq!(synced_resume_point(&cluster, Some("a"), &omit), Some("10"));
        // Listing: WATCHING is reported before the snapshot ends.
        let listing = kind(&[], &[(&[], "WATCHING")]);
        assert_eq!(synced_resume_point(&listing, None, &[]), None);
        let failing = kind(&[("", "10")], &[(&[], "FAILING")]);
        assert_eq!(synced_resume_point(&failing, Some("a"), &[]), None);
        // After a hub restart: resume points persisted, no status yet.
        let restarted = kind(&[("", "10")], &[]);
        assert_eq!(synced_resume_point(&restarted, None, &[]), None);
        let per_ns = kind(
            &[("a", "5"), ("b", "6")],
            &[(&["a"], "WATCHING"), (&["b"], "FORBIDDEN")],
        );
        assert_eq!(synced_resume_point(&per_ns, Some("a"), &[]), Some("5"));
        assert_eq!(synced_resume_point(&per_ns, Some("b"), &[]), None);
        assert_eq!(synced_resume_point(&per_ns, Some("c"), &[]), None);
        assert_eq!(synced_resume_point(&per_ns, None, &[]), None);
        assert_eq!(synced_scope(&per_ns, Some("a"), &[]), Some(("a", "5")));
        assert_eq!(synced_scope(&cluster, Some("a"), &[]), Some(("", "10")));
    }

    fn opts(rv: Option<&str>, m: Option<RvMatch>, limit: Option<usize>) -> ReadOptions {
        ReadOptions {
            resource_version: rv.map(Into::into),
            resource_version_match: m,
            limit,
            ..Default::default()
        }
    }

    #[test]
    fn resource_version_rules() {
        use Decision::*;
        let d = |o: ReadOptions, list| resource_version_decision(&o, "100", list);
        assert_eq!(d(opts(None, None, None), true), Serve);
        assert_eq!(d(opts(None, None, Some(500)), true), Serve);
        assert_eq!(d(opts(Some("0"), None, Some(500)), true), Serve);
        assert_eq!(d(opts(Some("90"), None, None), true), Serve);
        assert_eq!(d(opts(Some("120"), None, None), true), WaitFor(120));
        assert_eq!(
            d(opts(Some("90"), Some(RvMatch::NotOlderThan), None), true),
            Serve
        );
        assert_eq!(
            d(
                opts(Some("120"), Some(RvMatch::NotOlderThan), Some(5)),
                true
            ),
            WaitFor(120)
        );
        assert_eq!(
            d(opts(Some("100"), Some(RvMatch::Exact), None), true),
            Serve
        );
        assert_eq!(
            d(opts(Some("90"), Some(RvMatch::Exact), None), true),
            Tunnel
        );
        // Legacy: a version with limit and no match is Exact.
        assert_eq!(d(opts(Some("90"), None, Some(5)), true), Tunnel);
        assert_eq!(d(opts(Some("100"), None, Some(5)), true), Serve);
        assert_eq!(d(opts(None, Some(RvMatch::Exact), None), true), Tunnel);
        assert_eq!(d(opts(Some("0"), Some(RvMatch::Exact), None), true), Tunnel);
        assert_eq!(d(opts(Some("abc"), None, None), true), Tunnel);
        // GET: any version is NotOlderThan; a match is an error of the API server's.
        assert_eq!(d(opts(Some("120"), None, None), false), WaitFor(120));
        assert_eq!(
            d(opts(Some("90"), Some(RvMatch::NotOlderThan), None), false),
            Tunnel
        );
        assert_eq!(
            resource_version_decision(&opts(None, None, None), "x", true),
            Tunnel
        );
    }

    fn cm() -> KindKey {
        KindKey {
            group: String::new(),
            kind: "ConfigMap".into(),
        }
    }

    #[test]
    fn reads_wait_for_the_accounts_own_writes() {
        use Decision::*;
        let now = Instant::now();
        let none = |_: &str| false;
        let mut floors = Floors::default();
        floors.record("a", cm(), "x", Floor::Version(120), now);
        floors.record("a", cm(), "x", Floor::Version(110), now);
        floors.record("a", cm(), "y", Floor::Version(130), now);
        assert_eq!(floors.decision("b", &cm(), None, "100", none, now), Serve);
        assert_eq!(
            floors.decision("a", &cm(), Some("x"), "100", none, now),
            WaitFor(120)
        );
        assert_eq!(
            floors.decision("a", &cm(), None, "100", none, now),
            WaitFor(130)
        );
        assert_eq!(
            floors.decision("a", &cm(), Some("z"), "100", none, now),
            Serve
        );
        // Reached: forgotten.
        assert_eq!(
            floors.decision("a", &cm(), Some("x"), "120", none, now),
            Serve
        );
        assert_eq!(
            floors.decision("a", &cm(), None, "125", none, now),
            WaitFor(130)
        );
        assert_eq!(floors.decision("a", &cm(), None, "130", none, now), Serve);
        assert!(floors.floors.is_empty());
        // A delete answered by a Status: wait until the cache drops the uid.
        floors.record("a", cm(), "x", Floor::Gone("u1".into()), now);
        let held = |uid: &str| uid == "u1";
        assert_eq!(
            floors.decision("a", &cm(), Some("x"), "300", held, now),
            WaitForDeletion
        );
        assert_eq!(
            floors.decision("a", &cm(), Some("x"), "300", none, now),
            Serve
        );
        assert!(floors.floors.is_empty());
        // An unreadable answer: tunnel for a while, and the version after that.
        floors.record("a", cm(), "x", Floor::Until(now + BARRIER), now);
        floors.record("a", cm(), "x", Floor::Version(200), now);
        assert_eq!(
            floors.decision("a", &cm(), Some("x"), "150", none, now),
            Tunnel
        );
        assert_eq!(
            floors.decision("a", &cm(), Some("x"), "150", none, now + BARRIER),
            WaitFor(200)
        );
        assert_eq!(
            floors.decision("a", &cm(), Some("x"), "x", none, now + BARRIER),
            Tunnel
        );
        assert_eq!(stricter(WaitFor(3), WaitFor(5)), WaitFor(5));
        assert_eq!(stricter(Serve, WaitFor(5)), WaitFor(5));
        assert_eq!(stricter(WaitForDeletion, WaitFor(5)), WaitFor(5));
        assert_eq!(stricter(WaitForDeletion, Serve), WaitForDeletion);
        assert_eq!(stricter(Tunnel, WaitFor(5)), Tunnel);
    }
}
