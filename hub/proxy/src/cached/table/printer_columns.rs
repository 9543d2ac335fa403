//! Custom resources' Tables from their CRD's `additionalPrinterColumns` (sans-IO), as
//! `apiextensions-apiserver`'s `tableconvertor` builds them: a Name column, then one column
//! per printer column of the served version (an Age column when it declares none), each
//! cell the first result of the column's JSONPath, typed by the column's type.
//!
//! The JSONPath subset evaluated here is what printer columns use in practice: `.field`,
//! `['field']`, `[N]` (negative from the end), `[*]` and filters `[?(@.a.b=="v")]` with
//! `==`/`!=` on a string, number or boolean. A column outside it (recursive descent,
//! unions, slices, functions) makes [`CrdColumns::from_crd`] answer `None`: the kind's
//! Tables are tunnelled, never guessed.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::{OwnedColumn, columns::CREATED_DOC, format};

/// One step of a parsed JSONPath.
#[derive(Clone, Debug, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    All,
    Filter {
        path: Vec<String>,
        equal: bool,
        literal: Value,
    },
}

/// A CRD column: its definition and its parsed JSONPath.
#[derive(Clone, Debug, PartialEq)]
struct PrinterColumn {
    kind: String,
    steps: Vec<Step>,
}

/// The Table columns of one served version of a CRD.
#[derive(Clone, Debug, PartialEq)]
pub struct CrdColumns {
    pub definitions: Vec<OwnedColumn>,
    columns: Vec<PrinterColumn>,
}

impl CrdColumns {
    /// The columns `crd` declares for `version`; `None` when the version is not in the CRD
    /// or a column's JSONPath is outside the subset evaluated here.
    pub fn from_crd(crd: &Value, version: &str) -> Option<CrdColumns> {
        let served = crd
            .pointer("/spec/versions")?
            .as_array()?
            .iter()
            .find(|v| v.get("name").and_then(Value::as_str) == Some(version))?;
        let declared = served
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let declared = if declared.is_empty() {
            vec![json!({
                "name": "Age", "type": "date", "description": CREATED_DOC,
                "jsonPath": ".metadata.creationTimestamp",
            })]
        } else {
            declared
        };
        let mut definitions = vec![OwnedColumn {
            name: "Name".into(),
            kind: "string".into(),
            format: "name".into(),
            priority: 0,
            description: super::columns::NAME_DOC.into(),
        }];
        let mut columns = Vec::with_capacity(declared.len());
        for c in &declared {
            let text = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default();
            let path = text("jsonPath");
            let steps = parse(path)?;
            let description = match text("description") {
                "" => format!("Custom resource definition column (in JSONPath format): {path}"),
                d => d.to_string(),
            };
            definitions.push(OwnedColumn {
                name: text("name").into(),
                kind: text("type").into(),
                format: text("format").into(),
                priority: c
                    .get("priority")
                    .and_then(Value::as_i64)
                    .unwrap_or_default(),
                description,
            });
            columns.push(PrinterColumn {
                kind: text("type").into(),
                steps,
            });
        }
        Some(CrdColumns {
            definitions,
            columns,
        })
    }

    /// The row's cells for the custom resource `o` at `now`.
    pub fn cells(&self, o: &Value, now: Timestamp) -> Vec<Value> {
        let mut cells = Vec::with_capacity(1 + self.columns.len());
        cells.push(json!(format::string(o.pointer("/metadata/name"))));
        for column in &self.columns {
            let found = evaluate(&column.steps, o);
            cells.push(match found.first() {
                None => Value::Null,
                Some(value) => cell(&column.kind, value, now),
            });
        }
        cells
    }
}

/// `cellForJSONValue`, and for string columns the JSONPath printer's text.
fn cell(kind: &str, value: &Value, now: Timestamp) -> Value {
    match (kind, value) {
        (_, Value::Null) => Value::Null,
        ("string", v) => Value::String(text(v)),
        ("integer", Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_f64().map(|f| f as i64))
            .map_or(Value::Null, Value::from),
        ("number", Value::Number(n)) => n.as_f64().map_or(Value::Null, Value::from),
        ("boolean", Value::Bool(b)) => Value::Bool(*b),
        ("date", Value::String(s)) => {
            if s.is_empty() || s == "null" {
                return json!("<unknown>");
            }
            match s.parse::<Timestamp>() {
                Ok(t) => json!(format::human_duration(now.duration_since(t))),
                Err(_) => json!("<invalid>"),
            }
        }
        _ => Value::Null,
    }
}

/// How the JSONPath printer writes one result: strings as they are, numbers and booleans as
/// Go's `fmt.Fprint` does, objects and arrays as JSON (Go's encoder: keys sorted, `<`, `>`
/// and `&` escaped).
fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i.to_string(),
            (None, Some(f)) => go_float(f),
            _ => n.to_string(),
        },
        Value::Null => "null".into(),
        other => go_json(other),
    }
}

/// Go's `%v` of a float64: the shortest representation, exponent form below 1e-4 and from
/// 1e21 (`1e+21`, `1e-05`).
fn go_float(f: f64) -> String {
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e21).contains(&a) {
        let e = format!("{f:e}");
        let (mantissa, exponent) = e.split_once('e').unwrap_or((&e, "0"));
        let (sign, digits) = match exponent.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exponent),
        };
        format!("{mantissa}e{sign}{digits:0>2}")
    } else {
        f.to_string()
    }
}

fn go_json(value: &Value) -> String {
    // serde_json's Map is ordered by key (no preserve_order feature), like Go's encoder.
    serde_json::to_string(value)
        .unwrap_or_default()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// Parses a printer column's JSONPath into [`Step`]s; `None` outside the subset.
fn parse(path: &str) -> Option<Vec<Step>> {
    let mut steps = Vec::new();
    let mut rest = path.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            if after.starts_with('.') {
                return None; // recursive descent
            }
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let name = &after[..end];
            if name.is_empty() || name == "*" || name.contains(['(', ')', '@', '$', ' ']) {
                return None;
            }
            steps.push(Step::Field(name.to_string()));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = matching_bracket(after)?;
            let inner = after[..end].trim();
            rest = &after[end + 1..];
            steps.push(bracket(inner)?);
        } else {
            return None;
        }
    }
    Some(steps)
}

/// The index of the `]` closing a bracket, quotes respected.
fn matching_bracket(s: &str) -> Option<usize> {
    let mut quote = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, ']') => return Some(i),
            _ => {}
        }
    }
    None
}

fn unquote(s: &str) -> Option<&str> {
    let s = s.trim();
    s.strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .or_else(|| s.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
}

fn bracket(inner: &str) -> Option<Step> {
    if inner == "*" {
        return Some(Step::All);
    }
    if let Some(name) = unquote(inner) {
        return Some(Step::Field(name.to_string()));
    }
    if let Ok(i) = inner.parse::<i64>() {
        return Some(Step::Index(i));
    }
    let expr = inner.strip_prefix("?(")?.strip_suffix(')')?.trim();
    let (left, right, equal) = if let Some((l, r)) = expr.split_once("==") {
        (l, r, true)
    } else if let Some((l, r)) = expr.split_once("!=") {
        (l, r, false)
    } else {
        return None;
    };
    let path = left.trim().strip_prefix("@.")?;
    let path: Vec<String> = path.split('.').map(str::to_string).collect();
    if path
        .iter()
        .any(|p| p.is_empty() || p.contains(['[', ']', '(', ')']))
    {
        return None;
    }
    let right = right.trim();
    let literal = match unquote(right) {
        Some(s) => Value::String(s.to_string()),
        None => match right {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            n => serde_json::from_str::<serde_json::Number>(n)
                .ok()
                .map(Value::Number)?,
        },
    };
    Some(Step::Filter {
        path,
        equal,
        literal,
    })
}

/// The results of `steps` on `root`, in document order; missing keys give no result (the
/// API server allows missing keys).
fn evaluate<'a>(steps: &[Step], root: &'a Value) -> Vec<&'a Value> {
    let mut current = vec![root];
    for step in steps {
        let mut next = Vec::new();
        for value in current {
            match step {
                Step::Field(name) => {
                    if let Some(v) = value.get(name.as_str()) {
                        next.push(v);
                    }
                }
                Step::Index(i) => {
                    if let Some(a) = value.as_array() {
                        let len = a.len() as i64;
                        let at = if *i < 0 { len + i } else { *i };
                        if let Some(v) = usize::try_from(at).ok().and_then(|at| a.get(at)) {
                            next.push(v);
                        }
                    }
                }
                Step::All => match value {
                    Value::Array(a) => next.extend(a.iter()),
                    Value::Object(m) => next.extend(m.values()),
                    _ => {}
                },
                Step::Filter {
                    path,
                    equal,
                    literal,
                } => {
                    for item in value.as_array().into_iter().flatten() {
                        let mut at = Some(item);
                        for p in path {
                            at = at.and_then(|v| v.get(p.as_str()));
                        }
                        let Some(found) = at else { continue };
                        if numbers_or_values_equal(found, literal) == *equal {
                            next.push(item);
                        }
                    }
                }
            }
        }
        current = next;
    }
    current
}

fn numbers_or_values_equal(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(columns: Value) -> Value {
        json!({"spec": {"versions": [
            {"name": "v1alpha1"},
            {"name": "v1", "additionalPrinterColumns": columns},
        ]}})
    }

    #[test]
    fn columns_and_cells_of_a_crd() {
        let c = CrdColumns::from_crd(
            &crd(json!([
                {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
                {"name": "Size", "type": "number", "jsonPath": ".spec.size", "priority": 1},
                {"name": "On", "type": "boolean", "jsonPath": ".spec.on"},
                {"name": "Image", "type": "string", "jsonPath": ".spec.containers[0].image", "description": "The image"},
                {"name": "Labels", "type": "string", "jsonPath": ".metadata.labels"},
                {"name": "Tier", "type": "string", "jsonPath": ".metadata.labels['app.kubernetes.io/tier']"},
                {"name": "Missing", "type": "string", "jsonPath": ".spec.nothing"},
                {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                {"name": "Last", "type": "string", "jsonPath": ".spec.containers[-1].name"},
                {"name": "All", "type": "string", "jsonPath": ".spec.containers[*].name"},
                {"name": "Wrong", "type": "integer", "jsonPath": ".spec.on"},
            ])),
            "v1",
        )
        .unwrap();
        let names: Vec<_> = c.definitions.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names[..3], ["Name", "Replicas", "Ready"]);
        assert_eq!(c.definitions[3].priority, 1);
        assert_eq!(c.definitions[5].description, "The image");
        assert_eq!(
            c.definitions[1].description,
            "Custom resource definition column (in JSONPath format): .spec.replicas"
        );
        let now: Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let o = json!({
            "metadata": {"name": "w1", "creationTimestamp": "2026-01-01T00:00:00Z",
                         "labels": {"b": "<x>", "a": "1", "app.kubernetes.io/tier": "web"}},
            "spec": {"replicas": 3, "size": 1.5, "on": true,
                     "containers": [{"name": "a", "image": "nginx"}, {"name": "b"}]},
            "status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]},
        });
        assert_eq!(
            c.cells(&o, now),
            vec![
                json!("w1"),
                json!(3),
                json!("True"),
                json!(1.5),
                json!(true),
                json!("nginx"),
                json!(r#"{"a":"1","app.kubernetes.io/tier":"web","b":"\u003cx\u003e"}"#),
                json!("web"),
                Value::Null,
                json!("60m"),
                json!("b"),
                json!("a"),
                Value::Null,
            ]
        );
    }

    #[test]
    fn no_columns_means_age_and_unknown_paths_are_refused() {
        let c = CrdColumns::from_crd(&crd(json!([])), "v1").unwrap();
        let names: Vec<_> = c.definitions.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["Name", "Age"]);
        let c = CrdColumns::from_crd(&crd(json!([])), "v1alpha1").unwrap();
        assert_eq!(c.definitions.len(), 2);
        assert!(CrdColumns::from_crd(&crd(json!([])), "v2").is_none());
        for unsupported in ["..name", ".spec[1:2]", ".spec[?(@.a>1)]", "spec", ".a[0,1]"] {
            assert!(
                CrdColumns::from_crd(
                    &crd(json!([{"name": "X", "type": "string", "jsonPath": unsupported}])),
                    "v1"
                )
                .is_none(),
                "{unsupported}"
            );
        }
    }

    #[test]
    fn go_number_text() {
        assert_eq!(text(&json!(1.5)), "1.5");
        assert_eq!(text(&json!(7)), "7");
        assert_eq!(text(&json!(1e21)), "1e+21");
        assert_eq!(text(&json!(0.00001)), "1e-05");
        assert_eq!(text(&json!(false)), "false");
    }
}
