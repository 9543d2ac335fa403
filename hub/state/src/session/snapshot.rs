//! Snapshots of one stream: objects staged between SnapshotBegin and SnapshotEnd within the
//! stream's staging limit, the kind's contents replaced at the end, and single object
//! events, each held to the object quota.

use std::collections::BTreeMap;

use scale_agent_hub_cache::{
    Applied, CachedObject, Event, KindInfo, KindKey, PackedJson, object_bytes,
};
use scale_agent_proto::v1::{
    self as pb, kind_status::State as PbKindState, object_event::Type as PbType,
};

use super::{
    Data, Effects, Limits, ProtocolError, Session, Staged, invalid, precondition, staged_size,
};

impl Session {
    /// Adds an object event to an open snapshot, within the staging limit of the stream's
    /// identity (all its streams together).
    pub(super) fn stage(
        &mut self,
        scope: (String, KindKey, String),
        object: CachedObject,
        deleted: bool,
        limits: &Limits,
    ) -> Result<(), ProtocolError> {
        let others: u64 = self.others_staged()
            + self
                .staging
                .iter()
                .filter(|(k, _)| **k != scope)
                .map(|(_, s)| s.bytes)
                .sum::<u64>();
        let Some(staged) = self.staging.get_mut(&scope) else {
            return Ok(());
        };
        staged.received += 1;
        let removed = staged
            .objects
            .remove(&object.uid)
            .map_or(0, |old| staged_size(&old));
        staged.bytes -= removed;
        if deleted {
            return Ok(());
        }
        let size = staged_size(&object);
        if others + staged.bytes + size > limits.max_staged_bytes {
            let (account, kind, namespace) = scope;
            return Err(ProtocolError::ResourceExhausted(format!(
                // troubleshooting: an agent's stream ended by the hub
                // The hub holds each kind's snapshot until it ends, so it can replace the kind's
                // contents at once; the open snapshots of all the streams of one agent identity
                // may hold at most `--max-staged-bytes` together. The stream whose object goes
                // past it ends with gRPC `RESOURCE_EXHAUSTED`.
                "the snapshots the streams of agent identity {:?} have open hold more than the \
                 hub's limit of {} bytes per identity (--max-staged-bytes), reached in the \
                 snapshot of account {account:?}, kind {kind}{}: raise --max-staged-bytes on \
                 the hub, or narrow the account's kinds or namespaces",
                self.identity,
                limits.max_staged_bytes,
                if namespace.is_empty() {
                    String::new()
                } else {
                    format!(", namespace {namespace:?}")
                }
            )));
        }
        staged.bytes += size;
        staged.objects.insert(object.uid.clone(), object);
        Ok(())
    }

    pub(super) fn on_snapshot_begin(
        &mut self,
        st: &Data<'_>,
        b: pb::SnapshotBegin,
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        self.require_streaming(st.registry, &b.account, "SnapshotBegin")?;
        let info = KindInfo::from_proto(b.kind.as_ref())
            .map_err(|e| invalid(format!("SnapshotBegin for account {:?}: {e}", b.account)))?;
        // A snapshot begun again (the agent retried its LIST) starts over.
        self.staging.insert(
            (b.account, info.key(), b.watch_namespace),
            Staged {
                info,
                objects: BTreeMap::new(),
                received: 0,
                bytes: 0,
            },
        );
        fx.relists += 1;
        Ok(())
    }

    pub(super) fn on_snapshot_end(
        &mut self,
        st: &mut Data<'_>,
        limits: &Limits,
        end: pb::SnapshotEnd,
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        self.require_streaming(st.registry, &end.account, "SnapshotEnd")?;
        let info = KindInfo::from_proto(end.kind.as_ref())
            .map_err(|e| invalid(format!("SnapshotEnd for account {:?}: {e}", end.account)))?;
        let key = (end.account.clone(), info.key(), end.watch_namespace.clone());
        let staged = self.staging.remove(&key).ok_or_else(|| {
            precondition(format!(
                "SnapshotEnd for account {:?}, kind {}, watch namespace {:?} without a \
                 SnapshotBegin",
                end.account,
                info.key(),
                end.watch_namespace
            ))
        })?;
        if staged.received != end.object_count {
            return Err(precondition(format!(
                "SnapshotEnd for account {:?}, kind {}: object_count {} but {} objects \
                 were received; the snapshot is discarded",
                end.account,
                info.key(),
                end.object_count,
                staged.received
            )));
        }
        if end.resource_version.is_empty() {
            return Err(invalid(format!(
                "SnapshotEnd for account {:?}, kind {} has no resource_version",
                end.account,
                info.key()
            )));
        }
        let key = staged.info.key();
        let replaced = st.cache.kinds.get(&key).map_or(0, |k| {
            k.objects
                .in_scope((!end.watch_namespace.is_empty()).then_some(&*end.watch_namespace))
                .count()
        });
        if !within_quota(
            st,
            limits,
            &end.account,
            &staged.info,
            staged.objects.len(),
            replaced,
            fx,
        ) {
            // Discarded whole: a snapshot is applied entirely or not at all.
            return Ok(());
        }
        let adding: u64 = staged.objects.values().map(object_bytes).sum();
        let freeing: u64 = st.cache.kinds.get(&key).map_or(0, |k| {
            k.objects
                .in_scope((!end.watch_namespace.is_empty()).then_some(&*end.watch_namespace))
                .map(|o| object_bytes(o))
                .sum()
        });
        if !within_cached_bytes(st, &end.account, &staged.info, adding, freeing, fx) {
            return Ok(());
        }
        let was_over = st
            .cache
            .kinds
            .get_mut(&key)
            .and_then(|k| k.over_quota.take())
            .is_some();
        st.cache.replace_scope(
            &end.account,
            &staged.info,
            &end.watch_namespace,
            staged.objects,
            &end.resource_version,
            &mut fx.ops,
        );
        st.cached_bytes.settle(st.cache);
        if was_over {
            tracing::info!(account = %end.account, kind = %key, "kind cached again: its relist fits the account's object quota");
            fx.kind_statuses.push(pb::KindStatus {
                account: end.account.clone(),
                kind: Some(staged.info.to_proto()),
                state: PbKindState::Watching as i32,
                message: "cached again: the kind's relist fits the hub's \
                          --max-objects-per-account and --max-cached-mib"
                    .into(),
                namespaces: Vec::new(),
            });
        }
        Ok(())
    }

    pub(super) fn object(
        &mut self,
        st: &mut Data<'_>,
        limits: &Limits,
        mut ev: pb::ObjectEvent,
        prepared: Option<Result<PreparedObject, ProtocolError>>,
        fx: &mut Effects,
    ) -> Result<(), ProtocolError> {
        self.require_streaming(st.registry, &ev.account, "ObjectEvent")?;
        let PreparedObject {
            info,
            deleted,
            object,
        } = match prepared {
            Some(prepared) => prepared?,
            None => prepare_object(&mut ev, limits)?,
        };
        let scope = (ev.account.clone(), info.key(), ev.watch_namespace.clone());
        if self.staging.contains_key(&scope) {
            return self.stage(scope, object, deleted, limits);
        }
        if st.cache.is_over_quota(&scope.1) {
            // Left out of the cache whole until a relist fits: deltas are dropped.
            fx.stale += 1;
            return Ok(());
        }
        if !deleted {
            let known = st
                .cache
                .kinds
                .get(&scope.1)
                .and_then(|k| k.objects.get(&object.uid))
                .map(|o| object_bytes(o));
            if limits.max_objects_per_account > 0
                && known.is_none()
                && !within_quota(st, limits, &ev.account, &info, 1, 0, fx)
            {
                return Ok(());
            }
            let (adding, freeing) = (object_bytes(&object), known.unwrap_or(0));
            if !within_cached_bytes(st, &ev.account, &info, adding, freeing, fx) {
                return Ok(());
            }
        }
        let applied = st.cache.apply_event(
            &ev.account,
            &info,
            Event {
                deleted,
                object,
                watch_namespace: ev.watch_namespace,
            },
            st.budget,
            &mut fx.ops,
        );
        st.cached_bytes.settle(st.cache);
        if applied == Applied::Stale {
            fx.stale += 1;
        }
        Ok(())
    }
}

/// An ObjectEvent checked, and its JSON validated and packed: the work on an object that
/// needs no state, done before any lock is taken ([`prepare`]).
#[derive(Debug)]
pub struct PreparedObject {
    info: KindInfo,
    deleted: bool,
    object: CachedObject,
}

/// Prepares an ObjectEvent outside any lock: its checks, the validation of its JSON and
/// its packing (zstd). The event keeps its account, kind and watch namespace, for
/// [`Session::handle_data`] to take the right lock and check the stream's role first;
/// `None` for any other message.
pub fn prepare(
    msg: &mut pb::AgentMessage,
    limits: &Limits,
) -> Option<Result<PreparedObject, ProtocolError>> {
    match &mut msg.kind {
        Some(pb::agent_message::Kind::Object(ev)) => Some(prepare_object(ev, limits)),
        _ => None,
    }
}

fn prepare_object(
    ev: &mut pb::ObjectEvent,
    limits: &Limits,
) -> Result<PreparedObject, ProtocolError> {
    let info = KindInfo::from_proto(ev.kind.as_ref())
        .map_err(|e| invalid(format!("ObjectEvent for account {:?}: {e}", ev.account)))?;
    let deleted = match PbType::try_from(ev.r#type) {
        Ok(PbType::Applied) => false,
        Ok(PbType::Deleted) => true,
        _ => {
            return Err(invalid(format!(
                "ObjectEvent for {}/{} in account {:?} has type {}; expected APPLIED or DELETED",
                info.key(),
                ev.name,
                ev.account,
                ev.r#type
            )));
        }
    };
    if ev.uid.is_empty() || ev.name.is_empty() || ev.resource_version.is_empty() {
        return Err(invalid(format!(
            "ObjectEvent for kind {} in account {:?} needs name, uid and resource_version \
                 (got name {:?}, uid {:?}, resource_version {:?})",
            info.key(),
            ev.account,
            ev.name,
            ev.uid,
            ev.resource_version
        )));
    }
    let mut truncated = ev.truncated;
    let mut json = std::mem::take(&mut ev.object_json);
    if json.len() as u64 > limits.max_object_bytes {
        tracing::warn!(account = %ev.account, kind = %info.key(), name = %ev.name, bytes = json.len(), "object larger than max_object_bytes; keeping its metadata only");
        truncated = true;
    }
    if truncated {
        json = Vec::new();
    } else if !deleted && serde_json::from_slice::<AnyJsonObject>(&json).is_err() {
        return Err(invalid(format!(
            "ObjectEvent for {} {:?} in account {:?}: object_json is not a JSON object",
            info.key(),
            ev.name,
            ev.account
        )));
    }
    let object = CachedObject {
        namespace: std::mem::take(&mut ev.namespace),
        name: std::mem::take(&mut ev.name),
        uid: std::mem::take(&mut ev.uid),
        resource_version: std::mem::take(&mut ev.resource_version),
        json: PackedJson::pack(&json),
        truncated,
    };
    Ok(PreparedObject {
        info,
        deleted,
        object,
    })
}

/// Whether `adding` objects may enter `info`'s cache of `account` in place of `replacing`
/// of its objects within `--max-objects-per-account`. Past it, the kind is left out of the
/// cache whole ([`Cache::exceed_quota`]) and the agent is told (KindStatus OVER_QUOTA).
fn within_quota(
    st: &mut Data<'_>,
    limits: &Limits,
    account: &str,
    info: &KindInfo,
    adding: usize,
    replacing: usize,
    fx: &mut Effects,
) -> bool {
    let max = limits.max_objects_per_account;
    if max == 0 {
        return true;
    }
    let count = st.cache.object_count();
    let after = count.saturating_sub(replacing) + adding;
    if after as u64 <= max {
        return true;
    }
    let reason = format!(
        "account {account:?} would hold {after} objects with kind {}, more than the hub's \
         --max-objects-per-account of {max}: the kind is not cached (the proxy reads it from \
         the cluster) until a relist of it fits; raise the limit on the hub, or narrow the \
         account's kinds or namespaces",
        info.key()
    );
    if let Some(dropped) = leave_kind_out(st, account, info, reason, fx) {
        tracing::warn!(%account, kind = %info.key(), objects = after, limit = max, dropped, "account over its object quota; kind left out of the cache");
    }
    false
}

/// Leaves `info` out of `account`'s cache for `reason` ([`Cache::exceed_quota`]) and gives
/// its bytes back to the hub-wide budget; the first time, tells the agent (KindStatus
/// OVER_QUOTA) and returns how many objects were dropped, for the caller's log line.
fn leave_kind_out(
    st: &mut Data<'_>,
    account: &str,
    info: &KindInfo,
    reason: String,
    fx: &mut Effects,
) -> Option<usize> {
    let already = st.cache.is_over_quota(&info.key());
    let dropped = st
        .cache
        .exceed_quota(account, info, reason.clone(), &mut fx.ops);
    st.cached_bytes.settle(st.cache);
    if already {
        return None;
    }
    fx.kind_statuses.push(pb::KindStatus {
        account: account.to_string(),
        kind: Some(info.to_proto()),
        state: PbKindState::OverQuota as i32,
        message: reason,
        namespaces: Vec::new(),
    });
    Some(dropped)
}

/// Whether `adding` bytes of objects of `info` may enter `account`'s cache in place of
/// `freeing` bytes within the hub-wide `--max-cached-mib`. Past it the kind is left out of
/// the account's cache as past the object quota ([`within_quota`]): the agent is told
/// (KindStatus OVER_QUOTA), the proxy reads the kind from the cluster, and what every other
/// account and kind has cached stays, until a relist of the kind fits.
fn within_cached_bytes(
    st: &mut Data<'_>,
    account: &str,
    info: &KindInfo,
    adding: u64,
    freeing: u64,
    fx: &mut Effects,
) -> bool {
    if st.cached_bytes.fits(adding, freeing) {
        return true;
    }
    let limit_mib = st.cached_bytes.limit().unwrap_or(u64::MAX) / (1024 * 1024);
    let after = st.cached_bytes.after(adding, freeing);
    let reason = format!(
        // troubleshooting: a kind not cached: KindStatus `OVER_QUOTA` (`/api/v1/accounts`, the agent's log)
        // All accounts' cached objects together would take the hub past `--max-cached-mib`.
        // The kind's reads go to the cluster through the agent; other accounts and kinds keep
        // their cache. Raise `--max-cached-mib` (and the hub's memory with it), narrow the
        // largest accounts' kinds or namespaces, or remove accounts no longer used.
        "the hub's cache would hold {after} bytes of objects with kind {} of account \
         {account:?}, more than the hub-wide --max-cached-mib of {limit_mib} MiB (all \
         accounts together): the kind is not cached (the proxy reads it from the cluster) \
         until a relist of it fits; raise --max-cached-mib on the hub (with its memory), or \
         narrow the largest accounts' kinds or namespaces",
        info.key()
    );
    if let Some(dropped) = leave_kind_out(st, account, info, reason, fx) {
        tracing::warn!(%account, kind = %info.key(), bytes = after, limit_mib, dropped, "hub-wide cached bytes budget reached; kind left out of the account's cache");
    }
    false
}

/// Accepts any JSON object without building it: the cache keeps the bytes, so parsing each
/// event into a map only to drop it cost the hub about 8 % of its CPU at saturation.
pub(super) struct AnyJsonObject;

impl<'de> serde::Deserialize<'de> for AnyJsonObject {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = AnyJsonObject;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<AnyJsonObject, A::Error> {
                use serde::de::IgnoredAny;
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(AnyJsonObject)
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}
