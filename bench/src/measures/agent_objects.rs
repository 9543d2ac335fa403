//! What a simulated agent streams, on the protocol: measure 10's small ConfigMaps (one kind),
//! or measure 12's mix of eight kinds ([`fleet_objects`]), which measure 11's rows stream too
//! with `--ha-objects` (three replicas holding the fleet). Snapshots, the relist after
//! a failover, and churned updates, for either.
//!
//! [`fleet_objects`]: super::fleet_objects

use anyhow::Result;
use scale_agent_proto::v1::{self as pb, agent_message::Kind as Msg};

use super::fleet_objects::{self, KINDS};
use crate::fake::{self, CONFIGMAP_BYTES, FakeAgent, configmaps};

/// The objects of one simulated agent's account.
#[derive(Clone, Copy, Debug)]
pub(crate) enum AgentObjects {
    /// This many ConfigMaps of [`CONFIGMAP_BYTES`] bytes of data (measures 10 and 11).
    ConfigMaps(usize),
    /// This many objects of measure 12's mix over this many namespaces, eight kinds.
    Mix { objects: usize, namespaces: usize },
}

/// Kind `k` of [`KINDS`] as the protocol names it.
pub(crate) fn proto_kind(k: usize) -> pb::Kind {
    let info = &KINDS[k];
    pb::Kind {
        group: info.group.into(),
        version: info.version.into(),
        kind: info.kind.into(),
        plural: info.plural.into(),
        namespaced: true,
    }
}

/// Object `i` of `account`'s mix as the agent streams it, with its `bench/stamp` annotation
/// `stamp`, at resourceVersion `rv`.
pub(crate) fn object_event(
    account: &str,
    i: usize,
    namespaces: usize,
    stamp: u64,
    rv: u64,
) -> pb::ObjectEvent {
    let slot = fleet_objects::slot(i, namespaces);
    let uid = format!("{account}-{i}");
    let body = fleet_objects::streamed(i, namespaces, stamp, &uid, rv);
    pb::ObjectEvent {
        account: account.into(),
        kind: Some(proto_kind(slot.kind)),
        r#type: pb::object_event::Type::Applied as i32,
        namespace: slot.namespace,
        name: slot.name,
        uid,
        resource_version: rv.to_string(),
        object_json: serde_json::to_vec(&body).unwrap_or_default(),
        truncated: false,
        watch_namespace: String::new(),
    }
}

/// Reports kind `k` of the mix WATCHING and sends its snapshot at `rv` (the objects `i` of
/// `0..objects` whose slot is of that kind); returns the JSON bytes of the objects sent.
pub(crate) async fn snapshot_kind(
    fake: &mut FakeAgent,
    account: &str,
    k: usize,
    objects: usize,
    namespaces: usize,
    rv: u64,
) -> Result<usize> {
    let kind = proto_kind(k);
    fake.send(Msg::KindStatus(watching(account, kind.clone())))
        .await?;
    fake.send(Msg::SnapshotBegin(pb::SnapshotBegin {
        account: account.into(),
        kind: Some(kind.clone()),
        watch_namespace: String::new(),
    }))
    .await?;
    let (mut count, mut sent) = (0u64, 0);
    for i in (0..objects).filter(|i| fleet_objects::slot(*i, namespaces).kind == k) {
        let event = object_event(account, i, namespaces, 0, rv);
        sent += event.object_json.len();
        fake.send(Msg::Object(event)).await?;
        count += 1;
    }
    fake.send(Msg::SnapshotEnd(pb::SnapshotEnd {
        account: account.into(),
        kind: Some(kind),
        resource_version: rv.to_string(),
        object_count: count,
        watch_namespace: String::new(),
    }))
    .await?;
    Ok(sent)
}

fn watching(account: &str, kind: pb::Kind) -> pb::KindStatus {
    pb::KindStatus {
        account: account.into(),
        kind: Some(kind),
        state: pb::kind_status::State::Watching as i32,
        message: String::new(),
        namespaces: vec![],
    }
}

fn same_kind(a: &pb::Kind, b: &pb::Kind) -> bool {
    a.group == b.group && a.plural == b.plural
}

impl AgentObjects {
    /// Objects in the account.
    pub(crate) fn count(&self) -> usize {
        match *self {
            AgentObjects::ConfigMaps(n) => n,
            AgentObjects::Mix { objects, .. } => objects,
        }
    }

    /// What the account holds, for the rows' titles.
    pub(crate) fn describe(&self) -> String {
        match *self {
            AgentObjects::ConfigMaps(n) => format!("{n} ConfigMaps"),
            AgentObjects::Mix {
                objects,
                namespaces,
            } => format!("{objects} objects of measure 12's mix over {namespaces} namespaces"),
        }
    }

    /// The kinds the agent streams (every kind it sends a snapshot of).
    fn kinds(&self) -> Vec<pb::Kind> {
        match self {
            AgentObjects::ConfigMaps(_) => vec![configmaps()],
            AgentObjects::Mix { .. } => (0..KINDS.len()).map(proto_kind).collect(),
        }
    }

    /// Every kind's snapshot at `rv`, after the account's registration; returns the JSON
    /// bytes of the objects sent.
    pub(crate) async fn snapshot(
        &self,
        fake: &mut FakeAgent,
        account: &str,
        rv: u64,
    ) -> Result<usize> {
        match *self {
            AgentObjects::ConfigMaps(n) => fake.snapshot(account, n, rv).await,
            AgentObjects::Mix {
                objects,
                namespaces,
            } => {
                let mut sent = 0;
                for k in 0..KINDS.len() {
                    sent += snapshot_kind(fake, account, k, objects, namespaces, rv).await?;
                }
                Ok(sent)
            }
        }
    }

    /// After a STREAMING `assignment` of a reconnected agent: every kind with a resume point
    /// reported WATCHING again (the agent watches on from it), every kind without one listed
    /// again (a new snapshot at `rv`), as a real agent does. Returns the kinds relisted.
    pub(crate) async fn resume(
        &self,
        fake: &mut FakeAgent,
        account: &str,
        rv: u64,
        assignment: &pb::AccountAssignment,
    ) -> Result<usize> {
        let mut relisted = 0;
        for kind in self.kinds() {
            let resumed = assignment
                .resume_points
                .iter()
                .any(|p| p.kind.as_ref().is_some_and(|k| same_kind(k, &kind)));
            if resumed {
                fake.send(Msg::KindStatus(watching(account, kind))).await?;
                continue;
            }
            relisted += 1;
            match *self {
                AgentObjects::ConfigMaps(n) => {
                    fake.snapshot(account, n, rv).await?;
                }
                AgentObjects::Mix {
                    objects,
                    namespaces,
                } => {
                    let k = (0..KINDS.len())
                        .find(|k| same_kind(&proto_kind(*k), &kind))
                        .unwrap_or_default();
                    snapshot_kind(fake, account, k, objects, namespaces, rv).await?;
                }
            }
        }
        Ok(relisted)
    }

    /// Object `pick` (modulo the count) of `account` changed, at resourceVersion `rv` (the
    /// mix's stamped with `rv`).
    pub(crate) fn update(&self, account: &str, pick: usize, rv: u64) -> pb::ObjectEvent {
        match *self {
            AgentObjects::ConfigMaps(n) => fake::object_event(
                account,
                &format!("cm-{}", pick % n.max(1)),
                rv,
                CONFIGMAP_BYTES,
            ),
            AgentObjects::Mix {
                objects,
                namespaces,
            } => object_event(account, pick % objects.max(1), namespaces, rv, rv),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_streams_eight_kinds_and_its_updates_stay_in_the_account() {
        let mix = AgentObjects::Mix {
            objects: 100,
            namespaces: 4,
        };
        assert_eq!(mix.kinds().len(), 8);
        assert_eq!(AgentObjects::ConfigMaps(5).kinds(), vec![configmaps()]);
        // Object 103 is object 3: the same slot, a new stamp and resourceVersion.
        let event = mix.update("a", 103, 9);
        let slot = fleet_objects::slot(3, 4);
        assert_eq!((event.name, event.namespace), (slot.name, slot.namespace));
        assert_eq!(event.uid, "a-3");
        assert_eq!(event.resource_version, "9");
        let body: serde_json::Value = serde_json::from_slice(&event.object_json).unwrap();
        assert_eq!(body["metadata"]["annotations"]["bench/stamp"], "9");
        let cm = AgentObjects::ConfigMaps(5).update("a", 7, 3);
        assert_eq!(cm.name, "cm-2");
    }
}
