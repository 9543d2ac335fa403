//! A STREAMING account: discovery, kind selection, then one watch per kind and watch
//! namespace, resuming where the hub says. Aborting the streamer task aborts its watches.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use scale_agent_crds::agent_config::AccountConfig;
use scale_agent_proto::v1::{self, agent_message};
use tokio::{
    sync::{Semaphore, mpsc},
    task::{AbortHandle, JoinSet},
};
use tracing::Instrument as _;

use crate::{
    account::{self, Prepared},
    backoff::Backoff,
    kinds,
    state::Shared,
    watch::{self, Outbound, WatchContext},
};

/// What a streamer needs.
pub struct StreamerContext {
    pub account: AccountConfig,
    pub prepared: Arc<Prepared>,
    pub generation: u64,
    pub tx: mpsc::Sender<Outbound>,
    pub shared: Arc<Shared>,
    pub total_budget: Arc<Semaphore>,
    pub budget_per_account: u32,
    pub max_object_bytes: u64,
    pub resume_points: Vec<v1::ResumePoint>,
    /// How often discovery is repeated to pick up new or removed kinds.
    pub rediscover: Duration,
}

/// Default period of rediscovery.
pub const REDISCOVER: Duration = Duration::from_secs(300);
/// How often the API server's aggregated discovery is checked for a change (a conditional
/// GET of `/api` and `/apis`: a 304 when nothing changed).
pub const DISCOVERY_POLL: Duration = Duration::from_secs(20);

/// The `Accept` of aggregated discovery (v2), with plain JSON as the fallback.
const AGGREGATED_ACCEPT: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";

/// What the API server last answered for `/api` and `/apis`: each document's ETag (or a hash
/// of the body when it sends none).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DiscoveryVersions {
    versions: BTreeMap<&'static str, String>,
}

impl DiscoveryVersions {
    /// Records `version` for `path`; true when it differs from a version recorded before
    /// (the first one is not a change).
    pub fn update(&mut self, path: &'static str, version: String) -> bool {
        match self.versions.insert(path, version.clone()) {
            Some(previous) => previous != version,
            None => false,
        }
    }

    fn etag(&self, path: &str) -> Option<&str> {
        self.versions
            .get(path)
            .map(String::as_str)
            .filter(|v| v.starts_with('"') || v.starts_with("W/"))
    }
}

/// Asks the API server whether its groups or kinds changed since the last call; true when
/// they did. Errors count as "unchanged": the periodic rediscovery catches up.
async fn discovery_changed(client: &kube::Client, versions: &mut DiscoveryVersions) -> bool {
    use http_body_util::BodyExt as _;
    let mut changed = false;
    for path in ["/api", "/apis"] {
        let mut request = http::Request::builder()
            .uri(path)
            .header(http::header::ACCEPT, AGGREGATED_ACCEPT);
        if let Some(etag) = versions.etag(path) {
            request = request.header(http::header::IF_NONE_MATCH, etag);
        }
        let Ok(request) = request.body(kube::client::Body::empty()) else {
            continue;
        };
        let Ok(response) = client.send(request).await else {
            continue;
        };
        match response.status() {
            http::StatusCode::NOT_MODIFIED => {}
            http::StatusCode::OK => {
                let etag = response
                    .headers()
                    .get(http::header::ETAG)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let version = match etag {
                    Some(etag) => etag,
                    None => match response.into_body().collect().await {
                        Ok(body) => account::fingerprint(&body.to_bytes()),
                        Err(_) => continue,
                    },
                };
                changed |= versions.update(path, version);
            }
            _ => {}
        }
    }
    changed
}

/// The kinds discovery offers, for telling whether they changed between two rounds.
fn kind_set(candidates: &[kinds::Candidate]) -> BTreeSet<(String, String, String)> {
    candidates
        .iter()
        .map(|c| {
            (
                c.kind.group.clone(),
                c.kind.version.clone(),
                c.kind.plural.clone(),
            )
        })
        .collect()
}

async fn send_discovery_changed(ctx: &StreamerContext) {
    let _ = ctx
        .tx
        .send(Outbound {
            account: ctx.account.name.clone(),
            generation: ctx.generation,
            message: agent_message::Kind::DiscoveryChanged(v1::DiscoveryChanged {
                account: ctx.account.name.clone(),
            }),
        })
        .await;
}

/// The hub's resume point for `kind` in `watch_namespace`, if it gave one.
pub fn resume_point(
    points: &[v1::ResumePoint],
    kind: &kinds::KindRef,
    watch_namespace: &str,
) -> Option<String> {
    points
        .iter()
        .find(|p| {
            p.watch_namespace == watch_namespace
                && p.kind.as_ref().is_some_and(|k| kind.same_resource(k))
                && !p.resource_version.is_empty()
        })
        .map(|p| p.resource_version.clone())
}

/// A watch's identity: group, plural, watch namespace ("" for cluster-wide).
pub type WatchKey = (String, String, String);

fn point_key(point: &v1::ResumePoint) -> WatchKey {
    let kind = point.kind.clone().unwrap_or_default();
    (kind.group, kind.plural, point.watch_namespace.clone())
}

/// The hub's resume points for watches this account no longer runs: each gets KindStatus
/// STOPPED so the hub can drop what it holds for them.
pub fn stopped_points<'a>(
    points: &'a [v1::ResumePoint],
    wanted: &BTreeMap<WatchKey, (kinds::KindRef, Option<String>)>,
) -> Vec<&'a v1::ResumePoint> {
    points
        .iter()
        .filter(|p| p.kind.is_some() && !wanted.contains_key(&point_key(p)))
        .collect()
}

/// The watches `account` wants among the discovered kinds.
pub fn wanted_watches(
    account: &AccountConfig,
    candidates: &[kinds::Candidate],
) -> BTreeMap<WatchKey, (kinds::KindRef, Option<String>)> {
    let mut wanted = BTreeMap::new();
    for kind in kinds::select_kinds(account, candidates) {
        for namespace in kinds::watch_namespaces(account, &kind) {
            let key = (
                kind.group.clone(),
                kind.plural.clone(),
                namespace.clone().unwrap_or_default(),
            );
            wanted.insert(key, (kind.clone(), namespace));
        }
    }
    wanted
}

/// KindStatus STOPPED for a watch that ended because the API server answered 404 for its
/// kind: the hub drops what it holds for it, as for a kind rediscovery found gone.
async fn send_kind_gone(ctx: &StreamerContext, kind: v1::Kind, watch_namespace: &str) {
    send_kind_status(
        ctx,
        kind,
        v1::kind_status::State::Stopped,
        "no longer watched: the API server no longer serves this kind (404); watched again \
         when discovery lists it"
            .into(),
        watch_namespace,
    )
    .await;
}

async fn send_stopped(ctx: &StreamerContext, kind: v1::Kind, watch_namespace: &str) {
    send_kind_status(
        ctx,
        kind,
        v1::kind_status::State::Stopped,
        "no longer watched: the account's kinds or namespaces changed".into(),
        watch_namespace,
    )
    .await;
}

async fn send_kind_status(
    ctx: &StreamerContext,
    kind: v1::Kind,
    state: v1::kind_status::State,
    message: String,
    watch_namespace: &str,
) {
    let status = v1::KindStatus {
        account: ctx.account.name.clone(),
        kind: Some(kind),
        state: state as i32,
        message,
        namespaces: if watch_namespace.is_empty() {
            Vec::new()
        } else {
            vec![watch_namespace.to_string()]
        },
    };
    let _ = ctx
        .tx
        .send(Outbound {
            account: ctx.account.name.clone(),
            generation: ctx.generation,
            message: agent_message::Kind::KindStatus(status),
        })
        .await;
}

/// The API server refused the account's credentials (401): the message of KindStatus
/// FAILING that the hub reads as such (stream contract, item 11: it starts with "401 ").
fn credentials_refused(error: &crate::error::Error) -> Option<String> {
    match error {
        crate::error::Error::Kube {
            source: kube::Error::Api(status),
            ..
        } if status.code == 401 => Some(format!(
            "401 {}: {} (discovering the API server's kinds)",
            status.reason, status.message
        )),
        _ => None,
    }
}

/// Discovery, retried until it succeeds. When the first one of a stream finds the
/// credentials refused, the kinds the hub gave resume points for (the ones this stream was
/// to watch) are reported FAILING with the 401, once: before any watch runs, that is the
/// only way the hub learns that the account's credentials fail.
async fn discover(ctx: &StreamerContext, first: bool) -> Vec<kinds::Candidate> {
    let name = &ctx.account.name;
    let mut backoff = Backoff::for_retries();
    let mut reported = !first;
    loop {
        match account::discover(name, &ctx.prepared.client).await {
            Ok(candidates) => return candidates,
            Err(error) => {
                if let Some(message) = credentials_refused(&error).filter(|_| !reported) {
                    reported = true;
                    for point in &ctx.resume_points {
                        if let Some(kind) = point.kind.clone() {
                            send_kind_status(
                                ctx,
                                kind,
                                v1::kind_status::State::Failing,
                                message.clone(),
                                &point.watch_namespace,
                            )
                            .await;
                        }
                    }
                }
                let delay = backoff.next_delay();
                let error = crate::error::Chain(&error).to_string();
                tracing::warn!(%error, "discovery failed; retrying in {:.1} s", delay.as_secs_f64());
                ctx.shared.update_account(name, |a| a.error = Some(error));
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Runs until aborted (or until the session's channel closes). Discovery is repeated every
/// `rediscover`: kinds that appeared (a CRD installed) start with a snapshot, kinds that
/// went away stop (KindStatus STOPPED). A watch the API server answers 404 ends at once and
/// is reported STOPPED the same way; rediscovery starts it again if the kind comes back
/// (not in the round right after, whose discovery may still list it). Run it in a span naming the account (the runtime
/// does); each watch runs in a span inside it naming the kind and namespace.
pub async fn run(ctx: StreamerContext) {
    let name = ctx.account.name.clone();
    let watch_ctx = WatchContext {
        account: name.clone(),
        generation: ctx.generation,
        client: ctx.prepared.client.clone(),
        tx: ctx.tx.clone(),
        shared: ctx.shared.clone(),
        list_budget: crate::budget::Budget::for_account(
            ctx.total_budget.clone(),
            ctx.budget_per_account,
        ),
        max_object_bytes: ctx.max_object_bytes,
        omit_namespaces: Arc::new(
            ctx.account
                .omit_namespaces
                .iter()
                .cloned()
                .collect::<BTreeSet<_>>(),
        ),
        forbidden_retry: watch::FORBIDDEN_RETRY,
    };
    let mut tasks = JoinSet::new();
    let mut running: BTreeMap<WatchKey, (kinds::KindRef, AbortHandle)> = BTreeMap::new();
    // Watches that ended on a 404 since the last rediscovery: not started again by the next
    // round, whose discovery may be older than the kind's removal (the one after does).
    let mut ended_gone: BTreeSet<WatchKey> = BTreeSet::new();
    let mut first = true;
    let mut known_kinds = None;
    let mut versions = DiscoveryVersions::default();
    // Records the current versions, so the first poll has something to compare with.
    discovery_changed(&ctx.prepared.client, &mut versions).await;
    loop {
        let candidates = discover(&ctx, first).await;
        let kinds_now = kind_set(&candidates);
        if known_kinds
            .as_ref()
            .is_some_and(|known| *known != kinds_now)
        {
            tracing::info!("the cluster's kinds changed");
            send_discovery_changed(&ctx).await;
        }
        known_kinds = Some(kinds_now);
        let wanted = wanted_watches(&ctx.account, &candidates);
        if first {
            for point in stopped_points(&ctx.resume_points, &wanted) {
                if let Some(kind) = point.kind.clone() {
                    send_stopped(&ctx, kind, &point.watch_namespace).await;
                }
            }
        }
        let gone: Vec<WatchKey> = running
            .keys()
            .filter(|key| !wanted.contains_key(*key))
            .cloned()
            .collect();
        for key in gone {
            if let Some((kind, handle)) = running.remove(&key) {
                tracing::info!(kind = %kind.label(), namespace = %key.2, "kind no longer served; stopping its watch");
                handle.abort();
                ctx.shared.remove_kind(&name, &kind, &key.2);
                send_stopped(&ctx, kind.to_proto(), &key.2).await;
            }
        }
        let mut started = 0;
        for (key, (kind, namespace)) in wanted {
            if running.contains_key(&key) {
                continue;
            }
            if ended_gone.contains(&key) {
                tracing::debug!(kind = %kind.label(), namespace = %key.2, "discovery still lists a kind that answered 404; not restarted this round");
                continue;
            }
            ctx.shared.update_kind(&name, &kind, &key.2, |_| {});
            let resume = if first {
                resume_point(&ctx.resume_points, &kind, &key.2)
            } else {
                None
            };
            // Created here, so that it sits inside the account's span.
            let span = tracing::info_span!("watch", kind = %kind.label(), namespace = %key.2);
            let watch = watch::run(watch_ctx.clone(), kind.clone(), namespace, resume);
            let watch_key = key.clone();
            let handle = tasks.spawn(async move { (watch_key, watch.await) }.instrument(span));
            running.insert(key, (kind, handle));
            started += 1;
        }
        if first || started > 0 {
            tracing::info!(
                watches = running.len(),
                started,
                "kinds selected; watches running"
            );
        }
        ctx.shared.update_account(&name, |a| {
            a.kinds_started = true;
            a.error = None;
        });
        ended_gone.clear();
        first = false;
        let sleep = tokio::time::sleep(ctx.rediscover);
        tokio::pin!(sleep);
        let mut poll =
            tokio::time::interval_at(tokio::time::Instant::now() + DISCOVERY_POLL, DISCOVERY_POLL);
        loop {
            tokio::select! {
                _ = &mut sleep => break,
                Some(ended) = tasks.join_next() => {
                    if let Ok((key, watch::WatchEnd::KindGone)) = ended
                        && let Some((kind, _)) = running.remove(&key)
                    {
                        ctx.shared.remove_kind(&name, &kind, &key.2);
                        send_kind_gone(&ctx, kind.to_proto(), &key.2).await;
                        // The hub drops its cached discovery too, as when rediscovery
                        // finds the kinds changed.
                        send_discovery_changed(&ctx).await;
                        ended_gone.insert(key);
                    }
                }
                _ = poll.tick() => {
                    if discovery_changed(&ctx.prepared.client, &mut versions).await {
                        // The hub drops its cached discovery now; the kinds are compared
                        // (and reported again if need be) by the rediscovery that follows.
                        tracing::info!("the API server's discovery changed; rediscovering");
                        send_discovery_changed(&ctx).await;
                        known_kinds = None;
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_401_is_reported_as_credentials_refused() {
        let error = |code: u16| crate::error::Error::Kube {
            account: "a".into(),
            context: "discover".into(),
            source: kube::Error::Api(Box::new(kube::core::Status {
                code,
                reason: "Unauthorized".into(),
                message: "m".into(),
                ..Default::default()
            })),
        };
        assert_eq!(
            credentials_refused(&error(401)).as_deref(),
            Some("401 Unauthorized: m (discovering the API server's kinds)")
        );
        assert!(credentials_refused(&error(403)).is_none());
        assert!(credentials_refused(&error(500)).is_none());
    }

    #[test]
    fn discovery_versions_change_only_after_a_first_answer() {
        let mut v = DiscoveryVersions::default();
        assert!(
            !v.update("/apis", "\"a\"".into()),
            "the first answer is not a change"
        );
        assert_eq!(v.etag("/apis"), Some("\"a\""));
        assert!(!v.update("/apis", "\"a\"".into()));
        assert!(v.update("/apis", "\"b\"".into()));
        assert!(!v.update("/api", "0123abcd".into()));
        assert_eq!(v.etag("/api"), None, "a body hash is not sent as an ETag");
    }

    #[test]
    fn resume_points_match_group_plural_and_scope() {
        let kind = kinds::KindRef {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            plural: "deployments".into(),
            namespaced: true,
        };
        let point = |plural: &str, ns: &str, rv: &str| v1::ResumePoint {
            kind: Some(v1::Kind {
                group: "apps".into(),
                version: "v1beta2".into(),
                kind: "Deployment".into(),
                plural: plural.into(),
                namespaced: true,
            }),
            resource_version: rv.into(),
            watch_namespace: ns.into(),
        };
        let points = vec![
            point("deployments", "web", "5"),
            point("deployments", "", "7"),
            point("statefulsets", "", "9"),
        ];
        assert_eq!(resume_point(&points, &kind, "").as_deref(), Some("7"));
        assert_eq!(resume_point(&points, &kind, "web").as_deref(), Some("5"));
        assert_eq!(resume_point(&points, &kind, "db"), None);
        assert_eq!(
            resume_point(&[point("deployments", "", "")], &kind, ""),
            None
        );
    }

    #[test]
    fn resume_points_of_unwanted_watches_are_stopped() {
        let candidate = |group: &str, kind: &str, plural: &str| kinds::Candidate {
            kind: kinds::KindRef {
                group: group.into(),
                version: "v1".into(),
                kind: kind.into(),
                plural: plural.into(),
                namespaced: true,
            },
            verbs: vec!["list".into(), "watch".into()],
            preferred: true,
        };
        let candidates = vec![
            candidate("", "ConfigMap", "configmaps"),
            candidate("apps", "Deployment", "deployments"),
        ];
        let account = AccountConfig {
            namespaces: vec!["web".into()],
            kinds: vec!["ConfigMap".into()],
            ..Default::default()
        };
        let wanted = wanted_watches(&account, &candidates);
        assert_eq!(
            wanted.keys().cloned().collect::<Vec<_>>(),
            [(String::new(), "configmaps".to_string(), "web".to_string())]
        );
        let point = |group: &str, plural: &str, ns: &str| v1::ResumePoint {
            kind: Some(v1::Kind {
                group: group.into(),
                plural: plural.into(),
                ..Default::default()
            }),
            resource_version: "1".into(),
            watch_namespace: ns.into(),
        };
        let points = vec![
            point("", "configmaps", "web"),
            point("", "configmaps", "db"),
            point("apps", "deployments", "web"),
        ];
        let stopped: Vec<(String, String)> = stopped_points(&points, &wanted)
            .iter()
            .map(|p| {
                (
                    p.kind.clone().unwrap_or_default().plural,
                    p.watch_namespace.clone(),
                )
            })
            .collect();
        assert_eq!(
            stopped,
            [
                ("configmaps".to_string(), "db".to_string()),
                ("deployments".to_string(), "web".to_string())
            ]
        );
    }
}
