//! `GET /api/v1/accounts/{name}/objects`: an account's cached objects, selected by kind,
//! namespace and labels, in pages (`limit`, `continue`) read from the cache a chunk at a time
//! so that the state lock is held briefly however large the account.

use std::sync::Arc;

use axum::{
    Json,
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use serde_json::{Value, json};

use scale_agent_hub_cache::{CachedObject, KindCache, KindInfo, KindKey, selector::LabelSelector};
use scale_agent_hub_state::Live;

use super::{ApiState, error};

/// Query of the objects endpoint.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectQuery {
    /// Kind or plural, case-insensitive, optionally `group/`-qualified (`core/` for the
    /// core group).
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub label_selector: Option<String>,
    /// Most objects to look at for this page (0 or absent: all). The label selector is
    /// applied to them, so a page may hold fewer items than `limit` and still have a
    /// `continue` token.
    pub limit: Option<usize>,
    /// The `continue` token of the previous page.
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
}

/// Objects copied out of the state lock per critical section when no `limit` is given: a
/// read of a large account takes the lock many times, briefly, rather than once for long.
const OBJECTS_CHUNK: usize = 1000;
/// Most objects in one page, whatever `limit` asks: the rest comes with `continue`.
const MAX_OBJECTS_PAGE: usize = 10_000;

/// Where a page of objects ends: the kind and uid of its last object (objects are listed by
/// kind, then uid).
type Cursor = (KindKey, String);

fn encode_cursor((kind, uid): &Cursor) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(format!("{}\0{uid}", kind.storage_key()))
}

fn decode_cursor(token: &str) -> Option<Cursor> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (kind, uid) = text.split_once('\0')?;
    Some((KindKey::from_storage_key(kind)?, uid.to_string()))
}

/// One page of objects, selected by kind and namespace (labels are left for after the
/// lock): the kinds, (kind index, object) pairs, and whether objects remain after them.
struct Page {
    kinds: Vec<KindInfo>,
    objects: Vec<(usize, Arc<CachedObject>)>,
    next: Option<Cursor>,
}

/// Up to `max` objects after `after`, under the state lock: pointers only, so the lock is
/// held for a walk of at most `max` objects.
fn objects_page(
    live: &Live,
    name: &str,
    q: &ObjectQuery,
    after: Option<&Cursor>,
    max: usize,
) -> Result<Page, Box<Response>> {
    use std::ops::Bound;
    if !live.registry_read().accounts.contains_key(name) {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            format!("no account {name:?}"),
        )));
    }
    let slot = live.cache().account(name).unwrap_or_default();
    let cache = scale_agent_hub_cache::lock(&slot);
    let matching = |k: &KindCache| q.kind.as_deref().is_none_or(|query| kind_matches(query, k));
    if let Some(query) = &q.kind
        && !cache.kinds.values().any(matching)
    {
        let known: Vec<String> = cache.kinds.keys().map(ToString::to_string).collect();
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            format!(
                "account {name:?} has no cached kind matching {query:?}; cached kinds: [{}]",
                known.join(", ")
            ),
        )));
    }
    let mut page = Page {
        kinds: Vec::new(),
        objects: Vec::new(),
        next: None,
    };
    let start = after.map_or(Bound::Unbounded, |(kind, _)| Bound::Included(kind));
    for (key, k) in cache.kinds.range((start, Bound::Unbounded)) {
        if !matching(k) {
            continue;
        }
        let from = match after {
            Some((kind, uid)) if kind == key => Bound::Excluded(uid.as_str()),
            _ => Bound::Unbounded,
        };
        let mut index = None;
        for o in k.objects.range_by_uid(from) {
            if q.namespace.as_deref().is_some_and(|ns| ns != o.namespace) {
                continue;
            }
            if page.objects.len() == max {
                page.next = page
                    .objects
                    .last()
                    .map(|(i, o)| (page.kinds[*i].key(), o.uid.clone()));
                return Ok(page);
            }
            let i = *index.get_or_insert_with(|| {
                page.kinds.push(k.info.clone());
                page.kinds.len() - 1
            });
            page.objects.push((i, o.clone()));
        }
    }
    Ok(page)
}

/// Whether a kind matches the `kind` parameter.
pub fn kind_matches(query: &str, k: &KindCache) -> bool {
    let (group, name) = match query.split_once('/') {
        Some((g, n)) => (Some(g), n),
        None => (None, query),
    };
    let group_ok = group.is_none_or(|g| {
        g.eq_ignore_ascii_case(&k.info.group)
            || (g.eq_ignore_ascii_case("core") && k.info.group.is_empty())
    });
    group_ok
        && (name.eq_ignore_ascii_case(&k.info.kind) || name.eq_ignore_ascii_case(&k.info.plural))
}

/// The REST API's `labelSelector`, parsed as the proxy parses it (the API server's rules): the
/// error says what was refused.
fn label_selector(text: &str) -> Result<LabelSelector, String> {
    LabelSelector::parse(text).ok_or_else(|| {
        format!(
            "invalid label selector {text:?}: write it as the API server takes it (`app=web`, \
             `tier!=db`, `env in (prod,staging)`, `!legacy`)"
        )
    })
}

fn object_value(kind: &KindInfo, o: &CachedObject) -> Value {
    if o.truncated {
        return json!({
            "apiVersion": kind.api_version(),
            "kind": kind.kind,
            "metadata": {
                "name": o.name,
                "namespace": o.namespace,
                "uid": o.uid,
                "resourceVersion": o.resource_version,
                "annotations": { "scaleagent.dev/truncated": "true" },
            },
        });
    }
    o.json
        .unpack()
        .ok()
        .and_then(|json| serde_json::from_slice(&json).ok())
        .unwrap_or(Value::Null)
}

pub(super) async fn objects(
    State(api): State<Arc<ApiState>>,
    Path(name): Path<String>,
    Query(q): Query<ObjectQuery>,
) -> Response {
    let selector = match q.label_selector.as_deref().map(label_selector).transpose() {
        Ok(s) => s.unwrap_or_default(),
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let mut after = match q.continue_token.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(token) => match decode_cursor(token) {
            Some(cursor) => Some(cursor),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "invalid continue token {token:?}: pass the `continue` value of the \
                         previous page as it was returned, or start again without it"
                    ),
                );
            }
        },
    };
    let limit = q.limit.filter(|l| *l > 0);
    let mut items: Vec<Value> = Vec::new();
    let next = loop {
        let max = limit.map_or(OBJECTS_CHUNK, |l| l.min(MAX_OBJECTS_PAGE));
        let page = match objects_page(&api.live, &name, &q, after.as_ref(), max) {
            Ok(page) => page,
            Err(response) => return *response,
        };
        // Parsed and filtered out of the lock.
        items.extend(
            page.objects
                .iter()
                .map(|(i, o)| object_value(&page.kinds[*i], o))
                .filter(|value| {
                    let labels = value.pointer("/metadata/labels").and_then(Value::as_object);
                    selector.matches(labels)
                }),
        );
        match (page.next, limit) {
            (None, _) => break None,
            (Some(next), Some(_)) => break Some(next),
            (Some(next), None) => after = Some(next),
        }
    };
    let mut body = json!({ "account": name, "items": items });
    if let Some(next) = next {
        body["continue"] = json!(encode_cursor(&next));
    }
    Json(body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors() {
        let labels: serde_json::Map<String, Value> =
            serde_json::from_str(r#"{"app":"web","tier":"front","env":"prod"}"#).unwrap();
        let ok = |s: &str| label_selector(s).unwrap().matches(Some(&labels));
        assert!(ok("app=web"));
        assert!(ok("app==web,tier!=back,env"));
        assert!(!ok("app=db"));
        assert!(ok("!missing"));
        assert!(!ok("!app"));
        assert!(ok("env in (prod, staging),app notin (db)"));
        assert!(!ok("env notin (prod)"));
        assert!(ok(""));
        assert!(label_selector("a b").is_err());
        assert!(label_selector("=x").is_err());
    }

    #[test]
    fn kinds() {
        let k = KindCache {
            info: KindInfo {
                group: "apps".into(),
                version: "v1".into(),
                kind: "Deployment".into(),
                plural: "deployments".into(),
                namespaced: true,
            },
            objects: Default::default(),
            resume: Default::default(),
            statuses: Default::default(),
            histories: Default::default(),
            written_through: Default::default(),
            over_quota: None,
        };
        for q in [
            "Deployment",
            "deployments",
            "DEPLOYMENT",
            "apps/deployments",
            "Apps/Deployment",
        ] {
            assert!(kind_matches(q, &k), "{q}");
        }
        assert!(!kind_matches("core/deployments", &k));
        assert!(!kind_matches("pods", &k));
        let mut pod = k.clone();
        pod.info.group = String::new();
        pod.info.kind = "Pod".into();
        pod.info.plural = "pods".into();
        assert!(kind_matches("core/pods", &pod));
        assert!(kind_matches("pod", &pod));
    }
}
