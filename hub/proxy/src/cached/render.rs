//! The API server's JSON for cached objects (sans-IO): list items in etcd key order, the
//! list envelope, one object, metadata-only forms and NotFound.

use std::fmt;

use bytes::Bytes;
use scale_agent_hub_cache::{CachedObject, KindInfo};
use serde::{
    Deserialize, Deserializer,
    de::{MapAccess, Visitor},
};
use serde_json::{Map, Value, json, value::RawValue};

use super::{
    members::{self, Members as TopLevel},
    request::Form,
    selector::{FieldSelector, LabelSelector},
};

/// Whether a group is built into the API server (its list items carry no apiVersion/kind,
/// unlike custom resources'): the core group, groups without a dot, and `*.k8s.io`.
pub fn is_builtin_group(group: &str) -> bool {
    !group.contains('.') || group.ends_with(".k8s.io")
}

/// Why the cache cannot render a read.
#[derive(Debug, PartialEq, Eq)]
pub enum Unrenderable {
    /// An object in scope was kept without its JSON (larger than the hub's limit).
    Truncated,
    /// Cached JSON that is not an object.
    Corrupt,
}

/// The objects of a list, filtered by the selectors, in the API server's order (etcd keys:
/// `<namespace>/<name>`), each rendered as a list item in `form`.
pub fn list_items<O: std::borrow::Borrow<CachedObject>>(
    info: &KindInfo,
    objects: Vec<O>,
    labels: &LabelSelector,
    fields: &FieldSelector,
    form: Form,
) -> Result<Vec<Bytes>, Unrenderable> {
    let objects = in_list_order(objects)?;
    let mut items = Vec::with_capacity(objects.len());
    for object in &objects {
        if let Some(item) = list_item_of(info, object.borrow(), labels, fields, form)? {
            items.push(item);
        }
    }
    Ok(items)
}

/// The objects of a list in the API server's order (etcd keys: `<namespace>/<name>`, which
/// is not quite the cache's (namespace, name) order: `-` sorts before `/`); refused whole
/// when one is kept without its JSON (it cannot be rendered).
pub fn in_list_order<O: std::borrow::Borrow<CachedObject>>(
    mut objects: Vec<O>,
) -> Result<Vec<O>, Unrenderable> {
    if objects.iter().any(|o| o.borrow().truncated) {
        return Err(Unrenderable::Truncated);
    }
    let in_order = |a: &O, b: &O| etcd_key_cmp(a.borrow(), b.borrow());
    // The cache gives a namespace's objects in name order, which is etcd's: checked, not
    // sorted again (and never a key allocated per object).
    if !objects.is_sorted_by(|a, b| in_order(a, b) != std::cmp::Ordering::Greater) {
        objects.sort_by(in_order);
    }
    Ok(objects)
}

/// The order of the objects' etcd keys (`<namespace>/<name>`, `<name>` for a cluster-scoped
/// kind), without building the keys.
fn etcd_key_cmp(a: &CachedObject, b: &CachedObject) -> std::cmp::Ordering {
    if a.namespace == b.namespace {
        return a.name.cmp(&b.name);
    }
    fn key(o: &CachedObject) -> impl Iterator<Item = &u8> {
        let slash: &[u8] = if o.namespace.is_empty() { b"" } else { b"/" };
        let (namespace, name) = (o.namespace.as_bytes().iter(), o.name.as_bytes().iter());
        namespace.chain(slash.iter()).chain(name)
    }
    key(a).cmp(key(b))
}

/// One object as an item of a list of `info` in `form`, `None` when the selectors leave it
/// out.
pub fn list_item_of(
    info: &KindInfo,
    object: &CachedObject,
    labels: &LabelSelector,
    fields: &FieldSelector,
    form: Form,
) -> Result<Option<Bytes>, Unrenderable> {
    if object.truncated {
        return Err(Unrenderable::Truncated);
    }
    let (no_labels, no_fields) = (LabelSelector::default(), FieldSelector::default());
    let (labels, fields) = match preselect(object, labels, fields) {
        Some(false) => return Ok(None),
        // Selected without its JSON: rendered without reading its selectors again.
        Some(true) => (&no_labels, &no_fields),
        None => (labels, fields),
    };
    let json = object.json.unpack().map_err(|_| Unrenderable::Corrupt)?;
    let builtin = is_builtin_group(&info.group);
    // The cache parsed the JSON when it packed it (its selectable part is known): it is a
    // well-formed object, and the item is cut out of it by a scan, not a parse.
    if labels.is_empty() && fields.is_empty() && object.json.selectable().is_some() {
        return Ok(Some(list_item_scanned(json, builtin, form)?));
    }
    Ok(list_item(&json, builtin, labels, fields, form)?.map(Bytes::from))
}

impl From<members::Malformed> for Unrenderable {
    fn from(_: members::Malformed) -> Self {
        Unrenderable::Corrupt
    }
}

/// The members a built-in kind's list items leave out.
const TYPE_MEMBERS: &[&[u8]] = &[b"apiVersion", b"kind"];

/// The head of a metadata-only item or object, before its metadata.
const METADATA_HEAD: &[u8] =
    br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#;

/// One object as a list item in `form`, from its JSON, a well-formed object: the JSON itself
/// for a custom resource; for a built-in kind, the JSON less `apiVersion` and `kind`, cut
/// in place when they lead the object (the agent's JSON has its keys sorted: they do, but
/// for kinds with members sorting before `kind`, such as a ConfigMap's `data`).
fn list_item_scanned(mut json: Vec<u8>, builtin: bool, form: Form) -> Result<Bytes, Unrenderable> {
    match form {
        Form::Full if !builtin => Ok(Bytes::from(json)),
        Form::Full => {
            let mut members = TopLevel::of(&json)?;
            let mut leading = 0;
            while leading < TYPE_MEMBERS.len() {
                match members.next_member()? {
                    Some(m) if TYPE_MEMBERS.contains(&m.key) => leading += 1,
                    _ => break,
                }
            }
            if leading == TYPE_MEMBERS.len() {
                // `{"apiVersion":..,"kind":..,"metadata":..}` → `{"metadata":..}`: the byte
                // before the rest (the comma, or the last value's end when nothing is
                // left) becomes the opening brace.
                let at = members.position();
                json[at - 1] = b'{';
                return Ok(Bytes::from(json).slice(at - 1..));
            }
            let mut item = Vec::with_capacity(json.len());
            members::write_without(&json, TYPE_MEMBERS, &mut item)?;
            Ok(Bytes::from(item))
        }
        Form::Metadata => Ok(Bytes::from(metadata_scanned(&json)?)),
    }
}

/// The metadata-only form of a well-formed object's JSON.
fn metadata_scanned(json: &[u8]) -> Result<Vec<u8>, Unrenderable> {
    let metadata = members::member_value(json, b"metadata")?.unwrap_or(b"{}");
    let mut item = Vec::with_capacity(METADATA_HEAD.len() + metadata.len() + 1);
    item.extend_from_slice(METADATA_HEAD);
    item.extend_from_slice(metadata);
    item.push(b'}');
    Ok(item)
}

/// Whether the selectors select `object`, from what the cache keeps beside its packed JSON
/// (its name, namespace, labels and [`scale_agent_hub_cache::packed::FIELDS`]); `None` when that
/// is not enough and the JSON must be read. Most objects of a selective LIST are left out,
/// and so are never unpacked.
pub fn preselect(
    object: &CachedObject,
    labels: &LabelSelector,
    fields: &FieldSelector,
) -> Option<bool> {
    if labels.is_empty() && fields.is_empty() {
        return Some(true);
    }
    let kept = object.json.selectable()?;
    if !labels.matches_by(|k| kept.label(k)) {
        return Some(false);
    }
    fields.matches_by(|path| match path {
        ["metadata", "name"] => Ok(Some(object.name.as_str())),
        ["metadata", "namespace"] => Ok(Some(object.namespace.as_str())),
        _ => kept.field(&path.join(".")).ok_or(()),
    })
}

/// An object's top-level members, their values as they are in its JSON: a list item is
/// the object less two members (or its metadata alone), so nothing below the top level is
/// parsed into values and written again unless a selector needs it.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(6));
                while let Some(key) = map.next_key::<String>()? {
                    members.push((key, map.next_value::<&'de RawValue>()?));
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

/// What a label selector reads of an object: its labels, the rest skipped unparsed.
#[derive(Deserialize)]
struct Labelled {
    #[serde(default)]
    metadata: Option<Labels>,
}

#[derive(Deserialize)]
struct Labels {
    #[serde(default)]
    labels: Option<Map<String, Value>>,
}

/// One object as a list item in `form`, or `None` when the selectors leave it out.
fn list_item(
    json: &[u8],
    builtin: bool,
    labels: &LabelSelector,
    fields: &FieldSelector,
    form: Form,
) -> Result<Option<Vec<u8>>, Unrenderable> {
    if !labels.is_empty() {
        // Most objects of a selective list are left out: read only their labels first.
        let of: Labelled = serde_json::from_slice(json).map_err(|_| Unrenderable::Corrupt)?;
        if !labels.matches(of.metadata.and_then(|m| m.labels).as_ref()) {
            return Ok(None);
        }
    }
    if !fields.is_empty() {
        let value: Value = serde_json::from_slice(json).map_err(|_| Unrenderable::Corrupt)?;
        if !fields.matches(&value) {
            return Ok(None);
        }
    }
    let members: Members = serde_json::from_slice(json).map_err(|_| Unrenderable::Corrupt)?;
    let metadata = members
        .0
        .iter()
        .find(|(k, _)| k == "metadata")
        .map(|(_, v)| *v);
    let mut item = Vec::with_capacity(json.len() + 64);
    let member = |item: &mut Vec<u8>, key: &str, value: &[u8]| {
        item.push(if item.is_empty() { b'{' } else { b',' });
        // A key is a JSON string; writing one cannot fail.
        let _ = serde_json::to_writer(&mut *item, key);
        item.push(b':');
        item.extend_from_slice(value);
    };
    match form {
        Form::Metadata => {
            member(&mut item, "kind", br#""PartialObjectMetadata""#);
            member(&mut item, "apiVersion", br#""meta.k8s.io/v1""#);
            member(
                &mut item,
                "metadata",
                metadata.map_or(&b"{}"[..], |m| m.get().as_bytes()),
            );
        }
        Form::Full => {
            for (key, value) in &members.0 {
                if builtin && (key == "apiVersion" || key == "kind") {
                    continue;
                }
                member(&mut item, key, value.get().as_bytes());
            }
        }
    }
    if item.is_empty() {
        item.push(b'{');
    }
    item.push(b'}');
    Ok(Some(item))
}

fn metadata_only(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| Value::Object(Map::new())),
    })
}

/// The (kind, apiVersion) of a list of `info` in `form`.
pub fn list_type(info: &KindInfo, form: Form) -> (String, String) {
    match form {
        Form::Full => (format!("{}List", info.kind), info.api_version()),
        Form::Metadata => (
            "PartialObjectMetadataList".to_string(),
            "meta.k8s.io/v1".to_string(),
        ),
    }
}

/// A list response body around rendered items.
pub fn list_body(
    (kind, api_version): &(String, String),
    resource_version: &str,
    continue_token: Option<&str>,
    remaining: Option<usize>,
    items: &[Bytes],
) -> Vec<u8> {
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), resource_version.into());
    if let Some(token) = continue_token {
        metadata.insert("continue".into(), token.into());
    }
    if let Some(n) = remaining {
        metadata.insert("remainingItemCount".into(), n.into());
    }
    let head = json!({"kind": kind, "apiVersion": api_version, "metadata": metadata});
    let mut body = serde_json::to_vec(&head).unwrap_or_default();
    // `{...}` → `{..., "items": [ ... ]}`
    body.pop();
    body.extend_from_slice(br#","items":["#);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(item);
    }
    body.extend_from_slice(b"]}");
    body
}

/// One object's response body in `form`.
pub fn object_body(object: &CachedObject, form: Form) -> Result<Vec<u8>, Unrenderable> {
    if object.truncated {
        return Err(Unrenderable::Truncated);
    }
    let json = object.json.unpack().map_err(|_| Unrenderable::Corrupt)?;
    match form {
        Form::Full => Ok(json),
        Form::Metadata if object.json.selectable().is_some() => metadata_scanned(&json),
        Form::Metadata => {
            let value: Value = serde_json::from_slice(&json).map_err(|_| Unrenderable::Corrupt)?;
            serde_json::to_vec(&metadata_only(&value)).map_err(|_| Unrenderable::Corrupt)
        }
    }
}

/// The API server's NotFound for a GET of one object.
pub fn not_found_body(info: &KindInfo, name: &str) -> Vec<u8> {
    let qualified = if info.group.is_empty() {
        info.plural.clone()
    } else {
        format!("{}.{}", info.plural, info.group)
    };
    let mut details = Map::new();
    details.insert("name".into(), name.into());
    if !info.group.is_empty() {
        details.insert("group".into(), info.group.clone().into());
    }
    details.insert("kind".into(), info.plural.clone().into());
    serde_json::to_vec(&json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("{qualified} \"{name}\" not found"),
        "reason": "NotFound",
        "details": details,
        "code": 404,
    }))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(group: &str, kind: &str, plural: &str) -> KindInfo {
        KindInfo {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced: true,
        }
    }

    fn obj(ns: &str, name: &str, labels: Value) -> CachedObject {
        CachedObject {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("{ns}-{name}"),
            resource_version: "1".into(),
            json: serde_json::to_vec(&json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "data": {"k": "v"},
            }))
            .unwrap()
            .into(),
            truncated: false,
        }
    }

    fn parse(items: &[Bytes]) -> Vec<Value> {
        items
            .iter()
            .map(|i| serde_json::from_slice(i).unwrap())
            .collect()
    }

    #[test]
    fn items_in_etcd_key_order_filtered_and_without_type_for_builtins() {
        let objects = vec![
            obj("a", "z", json!({"app": "web"})),
            obj("a-b", "x", json!({"app": "web"})),
            obj("a", "y", json!({"app": "db"})),
        ];
        let labels = LabelSelector::parse("app=web").unwrap();
        let items = list_items(
            &info("", "ConfigMap", "configmaps"),
            objects.clone(),
            &labels,
            &FieldSelector::default(),
            Form::Full,
        )
        .unwrap();
        let items = parse(&items);
        let names: Vec<_> = items
            .iter()
            .map(|i| {
                format!(
                    "{}/{}",
                    i["metadata"]["namespace"].as_str().unwrap(),
                    i["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        // '-' sorts before '/' in etcd's keys.
        assert_eq!(names, ["a-b/x", "a/z"]);
        assert!(items[0].get("kind").is_none() && items[0].get("apiVersion").is_none());
        assert_eq!(items[0]["data"]["k"], "v");
        let custom = list_items(
            &info("example.com", "Widget", "widgets"),
            objects.clone(),
            &LabelSelector::default(),
            &FieldSelector::default(),
            Form::Full,
        )
        .unwrap();
        assert_eq!(
            parse(&custom)[0]["kind"],
            "ConfigMap",
            "custom resources keep their type"
        );
        let meta = list_items(
            &info("", "ConfigMap", "configmaps"),
            objects,
            &LabelSelector::default(),
            &FieldSelector::default(),
            Form::Metadata,
        )
        .unwrap();
        let meta = parse(&meta);
        assert_eq!(meta.len(), 3);
        assert_eq!(meta[0]["kind"], "PartialObjectMetadata");
        assert!(meta[0].get("data").is_none());
    }

    #[test]
    fn items_are_the_cached_json_less_the_type_with_field_selectors_too() {
        let mut o = obj("a", "b", json!({"app": "web"}));
        // Member order and nested JSON are kept as the agent sent them.
        o.json = br#"{"kind":"ConfigMap","metadata":{"namespace":"a","name":"b","labels":{"app":"web"}},"apiVersion":"v1","data":{"z":"1","a":"\u00e9"}}"#
            .to_vec()
            .into();
        let cm = info("", "ConfigMap", "configmaps");
        let render = |fields: &str, form| {
            list_items(
                &cm,
                vec![o.clone()],
                &LabelSelector::parse("app").unwrap(),
                &FieldSelector::parse(fields, "", "ConfigMap").unwrap(),
                form,
            )
            .unwrap()
        };
        assert_eq!(
            render("metadata.name=b", Form::Full),
            [Bytes::from_static(
                br#"{"metadata":{"namespace":"a","name":"b","labels":{"app":"web"}},"data":{"z":"1","a":"\u00e9"}}"#
            )]
        );
        assert!(render("metadata.name=c", Form::Full).is_empty());
        assert_eq!(
            render("", Form::Metadata),
            [Bytes::from_static(
                br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"namespace":"a","name":"b","labels":{"app":"web"}}}"#
            )]
        );
        o.json = b"[1]".to_vec().into();
        assert_eq!(
            list_items(
                &cm,
                vec![o],
                &LabelSelector::default(),
                &FieldSelector::default(),
                Form::Full
            ),
            Err(Unrenderable::Corrupt)
        );
    }

    #[test]
    fn a_selective_list_unpacks_only_the_objects_it_returns() {
        let objects: Vec<CachedObject> = (0..50)
            .map(|i| {
                obj(
                    "a",
                    &format!("o{i}"),
                    json!({"shard": (i % 10).to_string()}),
                )
            })
            .collect();
        let cm = info("", "ConfigMap", "configmaps");
        let before = scale_agent_hub_cache::packed::frames_unpacked();
        let items = list_items(
            &cm,
            objects.clone(),
            &LabelSelector::parse("shard=3").unwrap(),
            &FieldSelector::default(),
            Form::Full,
        )
        .unwrap();
        assert_eq!(items.len(), 5);
        assert_eq!(scale_agent_hub_cache::packed::frames_unpacked() - before, 5);
        let before = scale_agent_hub_cache::packed::frames_unpacked();
        let items = list_items(
            &cm,
            objects,
            &LabelSelector::parse("shard in (3,4)").unwrap(),
            &FieldSelector::parse("metadata.name=o13", "", "ConfigMap").unwrap(),
            Form::Full,
        )
        .unwrap();
        assert_eq!(parse(&items)[0]["metadata"]["name"], "o13");
        assert_eq!(scale_agent_hub_cache::packed::frames_unpacked() - before, 1);
    }

    /// What is kept beside the packed JSON selects exactly what the JSON does.
    #[test]
    fn selecting_without_the_json_agrees_with_the_json() {
        let pod = |name: &str, labels: Value, node: Value, phase: &str| CachedObject {
            namespace: "ns".into(),
            name: name.into(),
            uid: name.into(),
            resource_version: "1".into(),
            json: serde_json::to_vec(&json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ns", "labels": labels},
                "spec": {"nodeName": node}, "status": {"phase": phase},
            }))
            .unwrap()
            .into(),
            truncated: false,
        };
        let objects = vec![
            pod("a", json!({"app": "web", "v": "2"}), json!("n1"), "Running"),
            pod("b", json!({"app": "db"}), json!(null), "Pending"),
            pod("c", json!(null), json!(5), "Running"),
            pod("d", json!({"app": "web", "v": 7}), json!("n2"), "Failed"),
        ];
        let labels = [
            "",
            "app",
            "!app",
            "app=web",
            "app!=web",
            "app in (web,db)",
            "app notin (web)",
            "v",
            "v>1",
            "v<3",
            "app=web,v",
        ];
        let fields = [
            "",
            "metadata.name=a",
            "metadata.name!=a",
            "metadata.namespace=ns",
            "spec.nodeName=n1",
            "spec.nodeName=",
            "spec.nodeName!=n1",
            "status.phase=Running",
        ];
        for l in labels {
            for f in fields {
                let labels = LabelSelector::parse(l).unwrap();
                let fields = FieldSelector::parse(f, "", "Pod").unwrap();
                for o in &objects {
                    let json = o.json.unpack().unwrap();
                    let value: Value = serde_json::from_slice(&json).unwrap();
                    let by_json = labels
                        .matches(value.pointer("/metadata/labels").and_then(Value::as_object))
                        && fields.matches(&value);
                    assert_eq!(
                        preselect(o, &labels, &fields),
                        Some(by_json),
                        "{} with {l:?} and {f:?}",
                        o.name
                    );
                }
            }
        }
    }

    /// The comparison gives the order of the keys themselves, `-` before `/` included.
    #[test]
    fn etcd_key_order_without_the_keys() {
        let key = |o: &CachedObject| {
            if o.namespace.is_empty() {
                o.name.clone()
            } else {
                format!("{}/{}", o.namespace, o.name)
            }
        };
        let names = ["", "a", "a-b", "a/", "b", "a.b", "ab"];
        let objects: Vec<CachedObject> = names
            .iter()
            .flat_map(|ns| names.iter().map(move |n| obj(ns, n, json!({}))))
            .collect();
        for a in &objects {
            for b in &objects {
                assert_eq!(
                    etcd_key_cmp(a, b),
                    key(a).cmp(&key(b)),
                    "{}|{} vs {}|{}",
                    a.namespace,
                    a.name,
                    b.namespace,
                    b.name
                );
            }
        }
        let mut shuffled = objects.clone();
        shuffled.reverse();
        let sorted = in_list_order(shuffled).unwrap();
        let keys: Vec<String> = sorted.iter().map(key).collect();
        let mut expected = keys.clone();
        expected.sort();
        assert_eq!(keys, expected);
    }

    /// An item cut out of the JSON by a scan is the item the parse gives, for every kind of
    /// object the bench's fleet holds and for both forms.
    #[test]
    fn scanned_items_are_the_parsed_ones() {
        let objects = [
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
                   "spec": {"containers": [{"name": "c", "args": ["}", "\\\""]}]}, "status": {"phase": "Running"}}),
            json!({"apiVersion": "v1", "data": {"k": "v"}, "kind": "ConfigMap",
                   "metadata": {"name": "c", "namespace": "a"}}),
            json!({"action": "x", "apiVersion": "v1", "count": 2, "kind": "Event",
                   "metadata": {"name": "e", "namespace": "a"}, "reason": "r"}),
            json!({"apiVersion": "v1", "kind": "Namespace"}),
        ];
        for value in objects {
            let json = serde_json::to_vec(&value).unwrap();
            let packed = scale_agent_hub_cache::PackedJson::pack(&json);
            assert!(packed.selectable().is_some());
            for builtin in [true, false] {
                for form in [Form::Full, Form::Metadata] {
                    let parsed = list_item(
                        &json,
                        builtin,
                        &LabelSelector::default(),
                        &FieldSelector::default(),
                        form,
                    )
                    .unwrap()
                    .unwrap();
                    let scanned = list_item_scanned(json.clone(), builtin, form).unwrap();
                    assert_eq!(
                        serde_json::from_slice::<Value>(&scanned).unwrap(),
                        serde_json::from_slice::<Value>(&parsed).unwrap(),
                        "{value} builtin={builtin} {form:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn truncated_objects_cannot_be_served() {
        let mut o = obj("a", "b", json!({}));
        o.truncated = true;
        o.json = Default::default();
        assert_eq!(
            list_items(
                &info("", "ConfigMap", "configmaps"),
                vec![o.clone()],
                &LabelSelector::default(),
                &FieldSelector::default(),
                Form::Full
            ),
            Err(Unrenderable::Truncated)
        );
        assert_eq!(object_body(&o, Form::Full), Err(Unrenderable::Truncated));
    }

    #[test]
    fn envelopes() {
        let body = list_body(
            &list_type(&info("apps", "Deployment", "deployments"), Form::Full),
            "42",
            Some("t"),
            Some(3),
            &[Bytes::from_static(b"{\"a\":1}"), Bytes::from_static(b"{}")],
        );
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            json!({"kind": "DeploymentList", "apiVersion": "apps/v1",
                   "metadata": {"resourceVersion": "42", "continue": "t", "remainingItemCount": 3},
                   "items": [{"a": 1}, {}]})
        );
        let empty: Value = serde_json::from_slice(&list_body(
            &list_type(&info("", "ConfigMap", "configmaps"), Form::Metadata),
            "1",
            None,
            None,
            &[],
        ))
        .unwrap();
        assert_eq!(empty["kind"], "PartialObjectMetadataList");
        assert_eq!(empty["items"], json!([]));
        let nf: Value = serde_json::from_slice(&not_found_body(
            &info("apps", "Deployment", "deployments"),
            "web",
        ))
        .unwrap();
        assert_eq!(nf["message"], "deployments.apps \"web\" not found");
        assert_eq!(nf["code"], 404);
        assert_eq!(nf["details"]["group"], "apps");
    }
}
