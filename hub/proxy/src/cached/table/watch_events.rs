//! Watch events as Tables (`kubectl get -w`: `watch=true` with `as=Table`), as the API
//! server's `watchEmbeddedEncoder` writes them: each event's object is a Table of that one
//! object (its `metadata.resourceVersion` the object's), and only the first event carries
//! the column definitions; later ones have `"columnDefinitions":null` (the encoder sets
//! `NoHeaders` after its first object).
//!
//! The API server converts BOOKMARK objects to Tables too (a row printed from an object
//! with nothing but a resourceVersion), so the watch asks bookmarks are tunnelled, and so
//! are streaming lists (which end with one).

use bytes::Bytes;
use jiff::Timestamp;
use serde_json::Value;

use super::{TableContext, row, table_body};
use crate::cached::{render::Unrenderable, watch_query::event_line};

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
        let columns = (!self.columns_sent).then(|| self.context.printer.columns());
        let table = table_body(
            self.context.form.version,
            columns.as_deref(),
            super::format::string(value.pointer("/metadata/resourceVersion")),
            None,
            None,
            &[Bytes::from(row)],
        );
        self.columns_sent = true;
        Ok(event_line(event_type, &table))
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
}
