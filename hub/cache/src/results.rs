//! Operation results written through to the cache: the objects an operation wrote (or
//! deleted) enter the cache in the same batch as its result, before the waiter hears of it,
//! so a client that reads right after its write sees it (read-your-writes).

use std::sync::Arc;

use scale_agent_proto::v1 as pb;
use serde_json::Value;

use super::{AccountCache, Cache, CachedObject, KindKey, PackedJson, is_newer};
use scale_agent_hub_model::store_op::StoreOp;

/// Applies a result's objects and deletions to the cache, for kinds (and watch scopes) the
/// cache already holds: a kind the agent does not watch is left alone. Resume points are
/// not touched (the watch still delivers the echo, ignored as not newer).
pub fn apply_result_to_cache(
    cache: &mut Cache,
    result: &pb::OperationResult,
    ops: &mut Vec<StoreOp>,
) {
    if let Some(account) = cache.accounts.get_mut(&result.account) {
        apply_result_to_account(account, result, ops);
    }
}

/// [`apply_result_to_cache`] on the cache of the result's account.
pub fn apply_result_to_account(
    account: &mut AccountCache,
    result: &pb::OperationResult,
    ops: &mut Vec<StoreOp>,
) {
    for (json, kind) in result.objects_json.iter().zip(&result.object_kinds) {
        let key = KindKey {
            group: kind.group.clone(),
            kind: kind.kind.clone(),
        };
        let Some(k) = account.kinds.get_mut(&key) else {
            continue;
        };
        let Ok(value) = serde_json::from_slice::<Value>(json) else {
            continue;
        };
        let meta = |f: &str| {
            value
                .pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (namespace, name, uid, rv) = (
            meta("namespace"),
            meta("name"),
            meta("uid"),
            meta("resourceVersion"),
        );
        if uid.is_empty() || rv.is_empty() || name.is_empty() {
            continue;
        }
        let in_scope = k.resume.contains_key("") || k.resume.contains_key(&namespace);
        if !in_scope {
            continue;
        }
        if k.objects
            .get(&uid)
            .is_some_and(|o| !is_newer(&rv, &o.resource_version))
        {
            continue;
        }
        let existed = k.objects.contains_key(&uid);
        k.written_through.entry(uid.clone()).or_insert(existed);
        let object = Arc::new(CachedObject {
            namespace,
            name,
            uid: uid.clone(),
            resource_version: rv,
            json: PackedJson::pack(json),
            truncated: false,
        });
        ops.push(StoreOp::PutObject {
            account: result.account.clone(),
            kind: key,
            object: object.clone(),
        });
        k.objects.insert(object);
    }
    for (kind, uid) in result.deleted_kinds.iter().zip(&result.deleted_uids) {
        if uid.is_empty() {
            continue;
        }
        let key = KindKey {
            group: kind.group.clone(),
            kind: kind.kind.clone(),
        };
        if let Some(k) = account.kinds.get_mut(&key)
            && k.objects.remove(uid).is_some()
        {
            ops.push(StoreOp::DeleteObject {
                account: result.account.clone(),
                kind: key,
                uid: uid.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Event, KindInfo};

    #[test]
    fn results_update_watched_kinds_only() {
        let mut cache = Cache::default();
        let info = KindInfo {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        };
        let mut ops = Vec::new();
        cache.apply_event(
            "a",
            &info,
            Event {
                deleted: false,
                object: CachedObject {
                    namespace: "ns".into(),
                    name: "old".into(),
                    uid: "u1".into(),
                    resource_version: "5".into(),
                    json: b"{}".to_vec().into(),
                    truncated: false,
                },
                watch_namespace: String::new(),
            },
            &mut ops,
        );
        let result = pb::OperationResult {
            account: "a".into(),
            objects_json: vec![
                br#"{"metadata":{"name":"new","namespace":"ns","uid":"u2","resourceVersion":"9"}}"#
                    .to_vec(),
                br#"{"metadata":{"name":"d","namespace":"ns","uid":"u3","resourceVersion":"9"}}"#
                    .to_vec(),
            ],
            object_kinds: vec![
                info.to_proto(),
                pb::Kind {
                    kind: "Deployment".into(),
                    group: "apps".into(),
                    ..Default::default()
                },
            ],
            deleted: vec!["ConfigMap/ns/old".into()],
            deleted_kinds: vec![info.to_proto()],
            deleted_uids: vec!["u1".into()],
            ..Default::default()
        };
        let mut ops = Vec::new();
        apply_result_to_cache(&mut cache, &result, &mut ops);
        let objects = &cache.accounts["a"].kinds[&info.key()].objects;
        assert!(objects.contains_key("u2") && !objects.contains_key("u1"));
        assert_eq!(cache.object_count(), 1);
        assert_eq!(ops.len(), 2);
    }
}
