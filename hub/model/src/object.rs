//! Cached objects and the kinds they belong to: the vocabulary of the cache and the store.

use std::fmt;

use scale_agent_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::packed::PackedJson;

/// A kind as the cache keys it: group and kind (the version may change between agents).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KindKey {
    pub group: String,
    pub kind: String,
}

impl KindKey {
    /// `group/kind`, with an empty group for the core group: the form used in store keys.
    pub fn storage_key(&self) -> String {
        format!("{}/{}", self.group, self.kind)
    }

    /// Inverse of [`KindKey::storage_key`].
    pub fn from_storage_key(s: &str) -> Option<Self> {
        let (group, kind) = s.split_once('/')?;
        Some(KindKey {
            group: group.to_string(),
            kind: kind.to_string(),
        })
    }
}

impl fmt::Display for KindKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.kind)
        } else {
            write!(f, "{}/{}", self.group, self.kind)
        }
    }
}

/// What discovery says about a kind (the wire `Kind`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KindInfo {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
}

impl KindInfo {
    /// Validates a wire `Kind`.
    pub fn from_proto(kind: Option<&pb::Kind>) -> Result<Self, String> {
        let k = kind.ok_or("kind is missing")?;
        if k.kind.is_empty() || k.version.is_empty() {
            return Err(format!(
                "kind {:?} (group {:?}, version {:?}) needs both kind and version",
                k.kind, k.group, k.version
            ));
        }
        if k.kind.contains(['/', '\0']) || k.group.contains(['/', '\0']) {
            return Err(format!(
                "kind {:?} / group {:?} contains '/' or NUL",
                k.kind, k.group
            ));
        }
        Ok(KindInfo {
            group: k.group.clone(),
            version: k.version.clone(),
            kind: k.kind.clone(),
            plural: k.plural.clone(),
            namespaced: k.namespaced,
        })
    }

    pub fn key(&self) -> KindKey {
        KindKey {
            group: self.group.clone(),
            kind: self.kind.clone(),
        }
    }

    pub fn to_proto(&self) -> pb::Kind {
        pb::Kind {
            group: self.group.clone(),
            version: self.version.clone(),
            kind: self.kind.clone(),
            plural: self.plural.clone(),
            namespaced: self.namespaced,
        }
    }

    /// `apps/v1` or `v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// One cached object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedObject {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// The object's JSON, packed ([`PackedJson::unpack`] gives it); empty when truncated.
    pub json: PackedJson,
    pub truncated: bool,
}
