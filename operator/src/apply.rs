//! Server-side apply that writes only when something changed.
//!
//! Every desired object carries an annotation with a hash of itself. An object is applied
//! only when the live one is missing, or when the desired object (hash annotation included)
//! is not contained in the live one. The hash catches fields the operator stopped setting;
//! the containment check catches someone else changing a field the operator owns.

use std::{
    fmt::Debug,
    hash::{DefaultHasher, Hash, Hasher},
};

use kube::{
    Api, Resource,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

use crate::error::{Error, Result, is_not_found, kube_err};

/// Annotation holding the hash of the desired object.
pub const HASH_ANNOTATION: &str = "scaleagent.dev/desired-hash";

/// What [`apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The live object already matched.
    Unchanged,
    /// The object was created or updated.
    Applied,
}

fn describe<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    let meta = obj.meta();
    match &meta.namespace {
        Some(ns) => format!(
            "{} {ns}/{}",
            K::kind(&()),
            meta.name.as_deref().unwrap_or("")
        ),
        None => format!("{} {}", K::kind(&()), meta.name.as_deref().unwrap_or("")),
    }
}

/// Serialises `desired` with its hash annotation.
pub fn with_hash<K: Resource<DynamicType = ()> + Serialize>(desired: &K) -> Result<Value> {
    let mut value = serde_json::to_value(desired).map_err(|source| Error::Serialize {
        what: describe(desired),
        source,
    })?;
    let mut hasher = DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    let hash = format!("{:016x}", hasher.finish());
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(HASH_ANNOTATION.into(), Value::String(hash));
        }
    }
    Ok(value)
}

/// Whether every field of `desired` is in `live` with the same value. Objects may have extra
/// keys (defaults the API server adds); arrays must have the same length, element by element;
/// an empty object or array in `desired` matches a missing one.
pub fn contained(desired: &Value, live: Option<&Value>) -> bool {
    match (desired, live) {
        (Value::Null, None | Some(Value::Null)) => true,
        (Value::Object(d), None) => d.values().all(|v| contained(v, None)),
        (Value::Array(d), None) => d.is_empty(),
        (Value::Object(d), Some(Value::Object(l))) => d.iter().all(|(k, v)| contained(v, l.get(k))),
        (Value::Array(d), Some(Value::Array(l))) => {
            d.len() == l.len() && d.iter().zip(l).all(|(d, l)| contained(d, Some(l)))
        }
        (d, Some(l)) => d == l,
        (_, None) => false,
    }
}

/// Applies `desired` with the operator's field manager unless the live object already
/// matches. Returns the live object and what was done.
pub async fn apply<K>(api: &Api<K>, desired: &K) -> Result<(K, Outcome)>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
{
    let what = describe(desired);
    let name = desired
        .meta()
        .name
        .clone()
        .ok_or(Error::MissingField("metadata.name"))?;
    let value = with_hash(desired)?;
    if let Some(live) = api
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("get {what}")))?
    {
        let live_value = serde_json::to_value(&live).map_err(|source| Error::Serialize {
            what: what.clone(),
            source,
        })?;
        if contained(&value, Some(&live_value)) {
            return Ok((live, Outcome::Unchanged));
        }
    }
    tracing::info!(object = %what, "applying");
    let params = PatchParams::apply(scale_agent_crds::FIELD_MANAGER).force();
    let applied = api
        .patch(&name, &params, &Patch::Apply(&value))
        .await
        .map_err(kube_err(format!("apply {what}")))?;
    Ok((applied, Outcome::Applied))
}

/// Deletes the named object if it exists. Returns whether a delete was sent.
pub async fn delete_if_exists<K>(api: &Api<K>, name: &str) -> Result<bool>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            tracing::info!(kind = %K::kind(&()), name, "deleted");
            Ok(true)
        }
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(kube_err(format!("delete {} {name}", K::kind(&())))(e)),
    }
}

/// Lists objects matching `selector` (across namespaces when `api` is `all`).
pub async fn list<K>(api: &Api<K>, selector: &str) -> Result<Vec<K>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
{
    Ok(api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(kube_err(format!("list {} with {selector}", K::kind(&()))))?
        .items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn containment_ignores_defaults_but_not_changes() {
        let desired = json!({"a": 1, "b": {"c": [ {"d": "x"} ]}, "e": {}, "f": []});
        let live = json!({"a": 1, "b": {"c": [ {"d": "x", "default": true} ], "z": 2}});
        assert!(contained(&desired, Some(&live)));
        let changed = json!({"a": 2, "b": {"c": [ {"d": "x"} ]}});
        assert!(!contained(&desired, Some(&changed)));
        let longer = json!({"a": 1, "b": {"c": [ {"d": "x"}, {"d": "y"} ]}});
        assert!(!contained(&desired, Some(&longer)));
    }

    #[test]
    fn hash_changes_with_content() {
        let a = k8s_openapi::api::core::v1::ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("a".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut b = a.clone();
        b.data = Some([("k".to_string(), "v".to_string())].into());
        let ha = with_hash(&a).unwrap()["metadata"]["annotations"][HASH_ANNOTATION].clone();
        let hb = with_hash(&b).unwrap()["metadata"]["annotations"][HASH_ANNOTATION].clone();
        assert_ne!(ha, hb);
        assert_eq!(
            ha,
            with_hash(&a).unwrap()["metadata"]["annotations"][HASH_ANNOTATION]
        );
    }
}
