//! Watch events as Tables (`kubectl get -w`: `watch=true` with `as=Table`), as the API
//! server's `watchEmbeddedEncoder` writes them: each event's object is a Table of that one
//! object (its `metadata.resourceVersion` the object's), and only the first event carries
//! the column definitions; later ones have `"columnDefinitions":null` (the encoder sets
//! `NoHeaders` after its first object), but for APIServices, whose convertor
//! (kube-aggregator's) writes them whatever `NoHeaders` says.
//!
//! BOOKMARK events are Tables too: the watch cache's bookmark object is an empty object of
//! the kind carrying only its resourceVersion (and, for the bookmark that ends a streaming
//! list's initial events, the `k8s.io/initial-events-end` annotation), and the encoder
//! converts it like any other object (`doTransformObject` in apiserver's
//! `pkg/endpoints/handlers/response.go`): a Table of one row printed from that empty
//! object, its `metadata.resourceVersion` the bookmark's, the column definitions if it is
//! the watch's first event. The row's object follows `includeObject`, except that `asTable`
//! turns the initial-events-end bookmark into its `PartialObjectMetadata` for `None` too,
//! so that clients still find the annotation. With `includeObject=Object` the row would
//! carry the empty object as its Go type serializes it (`"spec":{"containers":null}`, ...),
//! which differs by kind: such watches are tunnelled ([`bookmarks_served`]).

use bytes::Bytes;
use jiff::Timestamp;
use serde_json::{Value, json};

use super::{IncludeObject, TableContext, TableForm, row, table_body};
use crate::cached::{
    render::Unrenderable,
    watch_query::{INITIAL_EVENTS_END, event_line},
};

/// Whether the hub writes the Table bookmarks of a watch in `form`: all but those whose rows
/// carry the whole (empty) object.
pub fn bookmarks_served(form: TableForm) -> bool {
    form.include != IncludeObject::Object
}

/// The Table encoding of one watch: whether the column definitions went out yet.
pub struct TableEvents {
    context: TableContext,
    columns_sent: bool,
}

impl TableEvents {
    pub fn new(context: TableContext) -> TableEvents {
        TableEvents {
            context,
            columns_sent: false,
        }
    }

    /// The watch line of an event whose object is `json`, its object as a Table.
    pub fn line(
        &mut self,
        event_type: &str,
        json: &[u8],
        now: Timestamp,
    ) -> Result<Bytes, Unrenderable> {
        let value: Value = serde_json::from_slice(json).map_err(|_| Unrenderable::Corrupt)?;
        let row = row(&self.context, &value, now)?;
        Ok(event_line(event_type, &self.table_of(&value, row)))
    }

    /// The BOOKMARK line at `rv`: a Table of the row printed from the empty object the API
    /// server's watch cache sends, annotated when it ends a streaming list's initial events.
    pub fn bookmark(
        &mut self,
        rv: u64,
        initial_events_end: bool,
        now: Timestamp,
    ) -> Result<Bytes, Unrenderable> {
        let mut metadata = json!({ "resourceVersion": rv.to_string() });
        if initial_events_end {
            metadata["annotations"] = json!({ INITIAL_EVENTS_END: "true" });
        }
        let empty = json!({ "metadata": metadata });
        let row = if initial_events_end && self.context.form.include == IncludeObject::None {
            let mut context = self.context.clone();
            context.form.include = IncludeObject::Metadata;
            row(&context, &empty, now)?
        } else {
            row(&self.context, &empty, now)?
        };
        Ok(event_line("BOOKMARK", &self.table_of(&empty, row)))
    }

    /// The Table of one event's row, the column definitions in the watch's first only (in
    /// every one for the printers that ignore `NoHeaders`).
    fn table_of(&mut self, object: &Value, row: Vec<u8>) -> Vec<u8> {
        let headed = !self.columns_sent || self.context.printer.always_headed();
        let columns = headed.then(|| self.context.printer.columns());
        self.columns_sent = true;
        table_body(
            self.context.form.version,
            columns.as_deref(),
            super::format::string(object.pointer("/metadata/resourceVersion")),
            None,
            None,
            &[Bytes::from(row)],
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cached::table::{IncludeObject, Printer, TableForm, TableVersion, builtin::Builtin};

    #[test]
    fn the_first_event_carries_the_columns_and_later_ones_null() {
        let context = TableContext {
            form: TableForm {
                version: TableVersion::V1,
                include: IncludeObject::Metadata,
            },
            printer: Printer::Builtin(Builtin::ConfigMap),
        };
        let mut events = TableEvents::new(context);
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let cm = |rv: &str, keys: usize| {
            let data: serde_json::Map<String, Value> =
                (0..keys).map(|k| (format!("k{k}"), json!("v"))).collect();
            json!({"kind": "ConfigMap", "apiVersion": "v1",
                   "metadata": {"name": "a", "namespace": "ns", "resourceVersion": rv,
                                "creationTimestamp": "2026-01-01T11:55:00Z"},
                   "data": data})
            .to_string()
        };
        let parse = |line: Bytes| -> Value { serde_json::from_slice(&line).unwrap() };
        let first = parse(events.line("ADDED", cm("7", 1).as_bytes(), now).unwrap());
        assert_eq!(first["type"], "ADDED");
        let table = &first["object"];
        assert_eq!(table["kind"], "Table");
        assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(table["metadata"], json!({"resourceVersion": "7"}));
        assert_eq!(table["columnDefinitions"][1]["name"], "Data");
        assert_eq!(table["rows"][0]["cells"], json!(["a", 1, "5m"]));
        assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        let second = parse(events.line("MODIFIED", cm("9", 3).as_bytes(), now).unwrap());
        assert_eq!(second["type"], "MODIFIED");
        assert_eq!(second["object"]["columnDefinitions"], Value::Null);
        assert!(
            second["object"]
                .as_object()
                .unwrap()
                .contains_key("columnDefinitions"),
            "the field is there, null, as Go writes a nil slice without omitempty"
        );
        assert_eq!(second["object"]["metadata"]["resourceVersion"], "9");
        assert_eq!(second["object"]["rows"][0]["cells"][1], 3);
        assert_eq!(
            events.line("DELETED", b"not json", now),
            Err(Unrenderable::Corrupt)
        );
    }

    /// kube-aggregator's APIService convertor ignores `NoHeaders`: every event, bookmarks
    /// too, carries the column definitions.
    #[test]
    fn api_service_events_all_carry_the_columns() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let mut events = TableEvents::new(TableContext {
            form: TableForm {
                version: TableVersion::V1,
                include: IncludeObject::Metadata,
            },
            printer: Printer::Builtin(Builtin::ApiService),
        });
        let service = json!({"metadata": {"name": "v1.apps", "resourceVersion": "3"}}).to_string();
        let parse = |line: Bytes| -> Value { serde_json::from_slice(&line).unwrap() };
        for line in [
            events.line("ADDED", service.as_bytes(), now).unwrap(),
            events.line("MODIFIED", service.as_bytes(), now).unwrap(),
            events.bookmark(4, true, now).unwrap(),
        ] {
            let event = parse(line);
            assert_eq!(
                event["object"]["columnDefinitions"][1]["name"], "Service",
                "{event}"
            );
        }
        let bookmark = parse(events.bookmark(5, false, now).unwrap());
        assert_eq!(
            bookmark["object"]["rows"][0]["cells"],
            json!(["", "Local", "Unknown", "<unknown>"]),
            "as the API server printed it"
        );
    }

    fn events_of(include: IncludeObject) -> TableEvents {
        TableEvents::new(TableContext {
            form: TableForm {
                version: TableVersion::V1,
                include,
            },
            printer: Printer::Builtin(Builtin::ConfigMap),
        })
    }

    /// A bookmark is a Table whose one row is printed from an empty object (a ConfigMap's:
    /// no name, no data, no creation time), the column definitions in it when it is the
    /// watch's first event.
    #[test]
    fn bookmarks_are_tables_of_a_row_printed_from_an_empty_object() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let parse = |line: Bytes| -> Value { serde_json::from_slice(&line).unwrap() };
        let mut events = events_of(IncludeObject::Metadata);
        let first = parse(events.bookmark(42, false, now).unwrap());
        assert_eq!(first["type"], "BOOKMARK");
        let table = &first["object"];
        assert_eq!(table["kind"], "Table");
        assert_eq!(table["metadata"], json!({"resourceVersion": "42"}));
        assert_eq!(table["columnDefinitions"][0]["name"], "Name");
        assert_eq!(
            table["rows"],
            json!([{
                "cells": ["", 0, "<unknown>"],
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                           "metadata": {"resourceVersion": "42"}},
            }])
        );
        let end = parse(events.bookmark(43, true, now).unwrap());
        assert_eq!(
            end["object"]["columnDefinitions"],
            Value::Null,
            "not the first"
        );
        assert_eq!(
            end["object"]["rows"][0]["object"]["metadata"],
            json!({"resourceVersion": "43", "annotations": {INITIAL_EVENTS_END: "true"}})
        );
    }

    /// `includeObject=None` leaves the object out of a periodic bookmark's row, but not out
    /// of the initial-events-end bookmark's (`asTable` keeps its metadata for the
    /// annotation); `Object` is not served with bookmarks.
    #[test]
    fn include_object_of_bookmarks_as_as_table_decides() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let parse = |line: Bytes| -> Value { serde_json::from_slice(&line).unwrap() };
        let mut events = events_of(IncludeObject::None);
        let periodic = parse(events.bookmark(7, false, now).unwrap());
        assert_eq!(periodic["object"]["rows"][0]["object"], Value::Null);
        let end = parse(events.bookmark(8, true, now).unwrap());
        assert_eq!(
            end["object"]["rows"][0]["object"]["kind"],
            "PartialObjectMetadata"
        );
        assert_eq!(
            end["object"]["rows"][0]["object"]["metadata"]["annotations"][INITIAL_EVENTS_END],
            "true"
        );
        let form = |include| TableForm {
            version: TableVersion::V1,
            include,
        };
        assert!(bookmarks_served(form(IncludeObject::Metadata)));
        assert!(bookmarks_served(form(IncludeObject::None)));
        assert!(!bookmarks_served(form(IncludeObject::Object)));
    }
}
