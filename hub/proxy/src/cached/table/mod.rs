//! Tables (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`, what every plain
//! `kubectl get` and dashboards ask for) rendered from the cache, as the API server renders
//! them (sans-IO except [`printer`], which reads a CRD from the cache):
//! - [`negotiate`]: the Accept header (v1 and v1beta1, skipped versions) and `includeObject`;
//! - [`builtin`] with [`columns`]: the built-in kinds' printers, ported from Kubernetes,
//!   with the groups of [`admission`], [`flow_control`], [`networking`], [`certificates`]
//!   and [`dynamic_resources`] in modules of their own;
//! - [`printer_columns`]: custom resources' `additionalPrinterColumns` and their JSONPaths;
//! - the API server's default Table (Name, Created At) for the built-in kinds registered
//!   with it (Roles, ClusterRoles, LimitRanges, CSIStorageCapacities).
//!
//! A kind with none of these is tunnelled: a custom resource's columns are known only from
//! its CRD, which the hub sees only when the account's agent streams
//! `customresourcedefinitions` (name it in `kinds`, or use `*`; the default kinds do not
//! include it, nor custom resources). Without the CRD the answer would be a guess, so the
//! Table is tunnelled; caching printer columns from discovery is not an option, as
//! discovery does not carry them. The built-in kinds still tunnelled: Secrets (their Data
//! column counts keys the hub never holds), `autoscaling/v1` HorizontalPodAutoscalers, and
//! those whose printers the hub has not ported, none of which a Kubernetes 1.37 API server
//! serves by default: LeaseCandidates (`coordination.k8s.io/v1beta1`), StorageVersions
//! (`internal.apiserver.k8s.io/v1alpha1`), `resource.k8s.io/v1alpha3`'s
//! ResourcePoolStatusRequests, and the scheduling and eviction kinds of 1.37 (Workloads,
//! PodGroups, CompositePodGroups in `scheduling.k8s.io/v1beta1`/`v1alpha3`,
//! EvictionRequests in `lifecycle.k8s.io/v1alpha1`). ComponentStatuses cannot be watched,
//! so no agent caches them.
//!
//! Watches with `as=Table` ([`watch_events`]) are served from the cache too, their
//! bookmarks as Tables, those whose rows carry whole objects (`includeObject=Object`) and
//! allow bookmarks aside.

pub mod admission;
pub mod autoscaler;
pub mod builtin;
pub mod certificates;
pub mod columns;
pub mod control_plane;
pub mod dynamic_resources;
pub mod endpoints;
pub mod events;
pub mod flow_control;
pub mod format;
pub mod negotiate;
pub mod networking;
pub mod pod;
pub mod printer_columns;
pub mod storage;
pub mod watch_events;

use std::{borrow::Cow, sync::Arc};

use bytes::Bytes;
use jiff::Timestamp;
use scale_agent_hub_cache::{CachedObject, KindInfo};
use scale_agent_hub_state::Live;
use serde::Serialize;
use serde_json::{Map, Value, json};

pub use self::negotiate::{IncludeObject, Negotiated, TableVersion};
use self::{builtin::Builtin, flow_control::FlowControl, printer_columns::CrdColumns};
use super::{
    render::{self, Unrenderable},
    selector::{FieldSelector, LabelSelector},
};

/// A column definition as the API server's source declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub kind: &'static str,
    pub format: &'static str,
    pub priority: i64,
    pub description: &'static str,
}

/// A column definition as a Table carries it (`metav1.TableColumnDefinition`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OwnedColumn {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
}

impl From<&Column> for OwnedColumn {
    fn from(c: &Column) -> Self {
        OwnedColumn {
            name: c.name.into(),
            kind: c.kind.into(),
            format: c.format.into(),
            description: c.description.into(),
            priority: c.priority,
        }
    }
}

/// The representation a Table read asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableForm {
    pub version: TableVersion,
    pub include: IncludeObject,
}

/// How the rows of a kind are printed.
#[derive(Clone, Debug, PartialEq)]
pub enum Printer {
    Builtin(Builtin),
    Crd(Arc<CrdColumns>),
    /// `rest.NewDefaultTableConvertor`: Name and Created At (RFC 3339).
    Default,
}

impl Printer {
    /// Whether every Table it prints carries the column definitions, a watch's events after
    /// the first included: kube-aggregator's APIService convertor ignores `NoHeaders`.
    pub fn always_headed(&self) -> bool {
        matches!(self, Printer::Builtin(Builtin::ApiService))
    }

    pub fn columns(&self) -> Vec<OwnedColumn> {
        match self {
            Printer::Builtin(b) => b.columns().iter().map(OwnedColumn::from).collect(),
            Printer::Crd(c) => c.definitions.clone(),
            Printer::Default => vec![
                OwnedColumn::from(&Column {
                    name: "Name",
                    kind: "string",
                    format: "name",
                    priority: 0,
                    description: columns::NAME_DOC,
                }),
                OwnedColumn::from(&Column {
                    name: "Created At",
                    kind: "date",
                    format: "",
                    priority: 0,
                    description: columns::CREATED_DOC,
                }),
            ],
        }
    }

    fn cells(&self, o: &Value, now: Timestamp) -> (Vec<Value>, Option<Value>) {
        match self {
            Printer::Builtin(b) => b.cells(o, now),
            Printer::Crd(c) => (c.cells(o, now), None),
            Printer::Default => {
                let created = format::rfc3339(o.pointer("/metadata/creationTimestamp"));
                (
                    vec![
                        json!(format::string(o.pointer("/metadata/name"))),
                        json!(created),
                    ],
                    None,
                )
            }
        }
    }
}

/// The printer of a kind the account's cache holds, or why its Tables are tunnelled.
/// Custom resources' printer columns come from their CRD in the same account's cache.
pub fn printer(live: &Live, account: &str, info: &KindInfo) -> Result<Printer, &'static str> {
    if render::is_builtin_group(&info.group) {
        if let Some(b) = Builtin::of(&info.group, &info.plural) {
            if b == Builtin::HorizontalPodAutoscaler && info.version != "v2" {
                return Err(
                    "HorizontalPodAutoscalers of another version than v2 (their metrics are annotations)",
                );
            }
            return Ok(Printer::Builtin(b));
        }
        return match (info.group.as_str(), info.plural.as_str()) {
            ("rbac.authorization.k8s.io", "roles" | "clusterroles")
            | ("", "limitranges")
            | ("storage.k8s.io", "csistoragecapacities") => Ok(Printer::Default),
            ("", "secrets") => Err("a Secret's Table counts its data, which the hub never holds"),
            _ => Err("a built-in kind whose printer the hub has not ported"),
        };
    }
    let crd_name = format!("{}.{}", info.plural, info.group);
    let crd = live
        .cache()
        .read(account, |a| {
            a.kinds
                .values()
                .find(|k| {
                    k.info.group == "apiextensions.k8s.io"
                        && k.info.plural == "customresourcedefinitions"
                })
                .and_then(|k| k.objects.by_name("", &crd_name).cloned())
        })
        .flatten()
        .ok_or("the kind's CRD is not in the account's cache (its printer columns are unknown)")?;
    if crd.truncated {
        return Err("the kind's CRD was kept without its JSON");
    }
    let json = crd
        .json
        .unpack()
        .map_err(|_| "the kind's CRD does not unpack")?;
    let crd: Value = serde_json::from_slice(&json).map_err(|_| "the kind's CRD is not JSON")?;
    CrdColumns::from_crd(&crd, &info.version)
        .map(|c| Printer::Crd(Arc::new(c)))
        .ok_or("a printer column's JSONPath outside the subset the hub evaluates")
}

/// What rendering the rows of a Table needs besides each object.
#[derive(Clone, Debug)]
pub struct TableContext {
    pub form: TableForm,
    pub printer: Printer,
}

impl TableContext {
    /// The rows of one page in the order the API server's list printer writes them: as
    /// listed, but FlowSchemas by matching precedence, then name (`printFlowSchemaList`
    /// sorts each page it prints with `FlowSchemaSequence`).
    pub fn page_order<'a>(&self, rows: &'a [Bytes]) -> Cow<'a, [Bytes]> {
        if !matches!(
            self.printer,
            Printer::Builtin(Builtin::FlowControl(FlowControl::FlowSchema))
        ) {
            return Cow::Borrowed(rows);
        }
        // The cells are the name and the precedence (an integer), as printed.
        let precedence_and_name = |row: &Bytes| {
            let row: Value = serde_json::from_slice(row).unwrap_or_default();
            let cell = |i: usize| row.pointer(&format!("/cells/{i}")).cloned();
            (
                cell(2).and_then(|c| c.as_i64()).unwrap_or_default(),
                cell(0)
                    .and_then(|c| c.as_str().map(str::to_string))
                    .unwrap_or_default(),
            )
        };
        let mut sorted = rows.to_vec();
        sorted.sort_by_cached_key(precedence_and_name);
        Cow::Owned(sorted)
    }
}

/// One object as a Table row, `None` when the selectors leave it out.
pub fn row_of(
    context: &TableContext,
    object: &CachedObject,
    labels: &LabelSelector,
    fields: &FieldSelector,
    now: Timestamp,
) -> Result<Option<Bytes>, Unrenderable> {
    if object.truncated {
        return Err(Unrenderable::Truncated);
    }
    let (no_labels, no_fields) = (LabelSelector::default(), FieldSelector::default());
    let (labels, fields) = match render::preselect(object, labels, fields) {
        Some(false) => return Ok(None),
        Some(true) => (&no_labels, &no_fields),
        None => (labels, fields),
    };
    let json = object.json.unpack().map_err(|_| Unrenderable::Corrupt)?;
    let value: Value = serde_json::from_slice(&json).map_err(|_| Unrenderable::Corrupt)?;
    if !labels.matches(value.pointer("/metadata/labels").and_then(Value::as_object))
        || !fields.matches(&value)
    {
        return Ok(None);
    }
    row(context, &value, now).map(|r| Some(Bytes::from(r)))
}

/// A row's JSON (`metav1.TableRow`): cells, conditions, and the object as `includeObject`
/// asks (the API server writes `null` for None).
pub fn row(context: &TableContext, o: &Value, now: Timestamp) -> Result<Vec<u8>, Unrenderable> {
    if !o.is_object() {
        return Err(Unrenderable::Corrupt);
    }
    let (cells, conditions) = context.printer.cells(o, now);
    let mut row = Map::new();
    row.insert("cells".into(), Value::Array(cells));
    if let Some(conditions) = conditions {
        row.insert("conditions".into(), conditions);
    }
    let object = match context.form.include {
        IncludeObject::None => Value::Null,
        IncludeObject::Metadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": context.form.version.api_version(),
            "metadata": o.get("metadata").cloned().unwrap_or_else(|| json!({})),
        }),
        IncludeObject::Object => o.clone(),
    };
    row.insert("object".into(), object);
    serde_json::to_vec(&row).map_err(|_| Unrenderable::Corrupt)
}

/// A Table's body around rendered rows. Go's field order: kind, apiVersion, metadata,
/// columnDefinitions (`null` without: a watch's events after the first), rows.
pub fn table_body(
    version: TableVersion,
    columns: Option<&[OwnedColumn]>,
    resource_version: &str,
    continue_token: Option<&str>,
    remaining: Option<usize>,
    rows: &[Bytes],
) -> Vec<u8> {
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), resource_version.into());
    if let Some(token) = continue_token {
        metadata.insert("continue".into(), token.into());
    }
    if let Some(n) = remaining {
        metadata.insert("remainingItemCount".into(), n.into());
    }
    let mut body = Vec::with_capacity(1024 + rows.iter().map(Bytes::len).sum::<usize>());
    body.extend_from_slice(br#"{"kind":"Table","apiVersion":"#);
    let _ = serde_json::to_writer(&mut body, version.api_version());
    body.extend_from_slice(br#","metadata":"#);
    let _ = serde_json::to_writer(&mut body, &metadata);
    body.extend_from_slice(br#","columnDefinitions":"#);
    match columns {
        Some(columns) => {
            let _ = serde_json::to_writer(&mut body, columns);
        }
        None => body.extend_from_slice(b"null"),
    }
    body.extend_from_slice(br#","rows":["#);
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(r);
    }
    body.extend_from_slice(b"]}");
    body
}

/// The Table of one object (a GET by name): its resourceVersion, one row.
pub fn object_table(
    context: &TableContext,
    object: &CachedObject,
    now: Timestamp,
) -> Result<Vec<u8>, Unrenderable> {
    if object.truncated {
        return Err(Unrenderable::Truncated);
    }
    let json = object.json.unpack().map_err(|_| Unrenderable::Corrupt)?;
    let value: Value = serde_json::from_slice(&json).map_err(|_| Unrenderable::Corrupt)?;
    let row = row(context, &value, now)?;
    Ok(table_body(
        context.form.version,
        Some(&context.printer.columns()),
        format::string(value.pointer("/metadata/resourceVersion")),
        None,
        None,
        &[Bytes::from(row)],
    ))
}

#[cfg(test)]
mod cluster_kinds_tests;
#[cfg(test)]
mod group_kinds_tests;
#[cfg(test)]
mod tests;
