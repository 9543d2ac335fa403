//! Label and field selectors as the API server evaluates them (sans-IO).
//!
//! A selector the hub cannot evaluate exactly (a syntax error, a field it does not know for
//! the kind) is `None`: the request goes through the tunnel and the API server answers it,
//! errors included, instead of the cache answering it differently.

use std::collections::BTreeSet;

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelRequirement {
    /// `key`, `!key`.
    Exists(String, bool),
    /// `key=v`, `key==v`, `key!=v` (true: equal).
    Equals(String, String, bool),
    /// `key in (a,b)`, `key notin (a,b)` (true: in).
    In(String, BTreeSet<String>, bool),
    /// `key>n`, `key<n` (true: greater): the label must exist and parse as an integer.
    Compare(String, i64, bool),
}

/// A parsed label selector: every requirement must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelRequirement>);

/// Splits on commas outside parentheses.
fn split_top_level(s: &str) -> Option<Vec<&str>> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return None;
                }
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return None;
    }
    parts.push(&s[start..]);
    Some(parts)
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of up to 63
/// characters of alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn valid_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty()
            || p.len() > 253
            || !p
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'))
    {
        return false;
    }
    !name.is_empty() && valid_value(name)
}

/// A label value: empty, or up to 63 alphanumerics, `-`, `_`, `.`, alphanumeric at both ends.
fn valid_value(v: &str) -> bool {
    if v.is_empty() {
        return true;
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    v.len() <= 63
        && v.chars()
            .all(|c| alnum(c) || c == '-' || c == '_' || c == '.')
        && v.chars().next().is_some_and(alnum)
        && v.chars().last().is_some_and(alnum)
}

impl LabelSelector {
    /// Parses `labelSelector`; `None` when it is not valid (the API server then answers).
    pub fn parse(s: &str) -> Option<Self> {
        let mut requirements = Vec::new();
        if s.trim().is_empty() {
            return Some(LabelSelector(requirements));
        }
        for part in split_top_level(s)? {
            requirements.push(Self::requirement(part.trim())?);
        }
        Some(LabelSelector(requirements))
    }

    fn requirement(part: &str) -> Option<LabelRequirement> {
        if let Some(key) = part.strip_prefix('!') {
            let key = key.trim();
            return valid_key(key).then(|| LabelRequirement::Exists(key.to_string(), false));
        }
        // Set-based: `key in (...)`, `key notin (...)`.
        if let Some(open) = part.find('(') {
            let head = part[..open].trim_end();
            let (key, positive) = if let Some(k) = head.strip_suffix(" notin") {
                (k.trim(), false)
            } else if let Some(k) = head.strip_suffix(" in") {
                (k.trim(), true)
            } else {
                return None;
            };
            let body = part[open + 1..].strip_suffix(')')?;
            let values: BTreeSet<String> = body
                .split(',')
                .map(|v| v.trim().to_string())
                .collect::<BTreeSet<_>>();
            if !valid_key(key) || !values.iter().all(|v| valid_value(v)) {
                return None;
            }
            return Some(LabelRequirement::In(key.to_string(), values, positive));
        }
        for (op, positive) in [("!=", false), ("==", true), ("=", true)] {
            if let Some((key, value)) = part.split_once(op) {
                let (key, value) = (key.trim(), value.trim());
                return (valid_key(key) && valid_value(value)).then(|| {
                    LabelRequirement::Equals(key.to_string(), value.to_string(), positive)
                });
            }
        }
        for (op, greater) in [('>', true), ('<', false)] {
            if let Some((key, value)) = part.split_once(op) {
                let key = key.trim();
                let n: i64 = value.trim().parse().ok()?;
                return valid_key(key)
                    .then(|| LabelRequirement::Compare(key.to_string(), n, greater));
            }
        }
        valid_key(part).then(|| LabelRequirement::Exists(part.to_string(), true))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object with these labels is selected.
    pub fn matches(&self, labels: Option<&serde_json::Map<String, Value>>) -> bool {
        self.matches_by(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }

    /// Whether the labels `get` reads (a label's value, `None` when absent) are selected.
    pub fn matches_by<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            LabelRequirement::Exists(k, want) => get(k).is_some() == *want,
            LabelRequirement::Equals(k, v, true) => get(k) == Some(v.as_str()),
            LabelRequirement::Equals(k, v, false) => get(k) != Some(v.as_str()),
            LabelRequirement::In(k, vs, true) => get(k).is_some_and(|v| vs.contains(v)),
            LabelRequirement::In(k, vs, false) => get(k).is_none_or(|v| !vs.contains(v)),
            LabelRequirement::Compare(k, n, greater) => get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| if *greater { v > *n } else { v < *n }),
        })
    }
}

/// One requirement of a field selector: `field=value`, `field==value` or `field!=value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The JSON path of the field in the object.
    pub path: Vec<&'static str>,
    pub value: String,
    pub equal: bool,
}

/// A parsed field selector: every requirement must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldRequirement>);

/// The JSON path of a field selector field the API server supports for the kind, where
/// the cache can evaluate it exactly; `None` sends the request through the tunnel.
fn field_path(group: &str, kind: &str, field: &str) -> Option<Vec<&'static str>> {
    let path: &[&'static str] = match field {
        "metadata.name" => &["metadata", "name"],
        "metadata.namespace" => &["metadata", "namespace"],
        _ => match (group, kind, field) {
            ("", "Event", "involvedObject.kind") => &["involvedObject", "kind"],
            ("", "Event", "involvedObject.namespace") => &["involvedObject", "namespace"],
            ("", "Event", "involvedObject.name") => &["involvedObject", "name"],
            ("", "Event", "involvedObject.uid") => &["involvedObject", "uid"],
            ("", "Event", "involvedObject.apiVersion") => &["involvedObject", "apiVersion"],
            ("", "Event", "involvedObject.resourceVersion") => {
                &["involvedObject", "resourceVersion"]
            }
            ("", "Event", "involvedObject.fieldPath") => &["involvedObject", "fieldPath"],
            ("", "Event", "reason") => &["reason"],
            ("", "Event", "type") => &["type"],
            ("", "Pod", "spec.nodeName") => &["spec", "nodeName"],
            ("", "Pod", "status.phase") => &["status", "phase"],
            _ => return None,
        },
    };
    Some(path.to_vec())
}

impl FieldSelector {
    /// Parses `fieldSelector` for a kind; `None` when it is invalid or names a field the
    /// cache cannot evaluate.
    pub fn parse(s: &str, group: &str, kind: &str) -> Option<Self> {
        let mut requirements = Vec::new();
        if s.is_empty() {
            return Some(FieldSelector(requirements));
        }
        // Nothing is trimmed: the API server reads spaces as part of the field (then
        // unknown, a 400) or of the value (`metadata.name=p ` selects nothing).
        for part in s.split(',') {
            let (field, value, equal) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, true)
            } else {
                return None;
            };
            // Escaped values (`\,`, `\=`) are rare; the API server handles them.
            if value.contains('\\') {
                return None;
            }
            requirements.push(FieldRequirement {
                path: field_path(group, kind, field)?,
                value: value.to_string(),
                equal,
            });
        }
        Some(FieldSelector(requirements))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `object` is selected; a missing field reads as "" (as the API server's
    /// field sets have it).
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|r| {
            let mut v = object;
            for key in &r.path {
                v = v.get(key).unwrap_or(&Value::Null);
            }
            let actual = v.as_str().unwrap_or_default();
            (actual == r.value) == r.equal
        })
    }

    /// Whether the object whose fields `get` reads (a field's value by its path, `None`
    /// when absent) is selected; `None` when `get` cannot read a field (`Err`).
    pub fn matches_by<'a>(
        &self,
        get: impl Fn(&[&'static str]) -> Result<Option<&'a str>, ()>,
    ) -> Option<bool> {
        for r in &self.0 {
            let actual = get(&r.path).ok()?.unwrap_or_default();
            if (actual == r.value) != r.equal {
                return Some(false);
            }
        }
        Some(true)
    }

    /// The one namespace an exact `metadata.namespace=` requirement limits the list to.
    pub fn namespace(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|r| r.equal && r.path == ["metadata", "namespace"])
            .map(|r| r.value.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn every_label_operator() {
        let l = labels(json!({"app": "web", "tier": "front", "n": "7"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(Some(&l));
        assert!(m(""));
        assert!(m("app=web"));
        assert!(m("app==web"));
        assert!(!m("app!=web"));
        assert!(m("app!=db"));
        assert!(m("missing!=x"), "!= matches objects without the label");
        assert!(m("app in (web, db)"));
        assert!(!m("app notin (web,db)"));
        assert!(
            m("missing notin (a)"),
            "notin matches objects without the label"
        );
        assert!(!m("missing in (a)"));
        assert!(m("tier"));
        assert!(!m("!tier"));
        assert!(m("!missing"));
        assert!(m("app=web,tier in (front),!missing"));
        assert!(!m("app=web,tier=back"));
        assert!(m("n>5"));
        assert!(!m("n<5"));
        assert!(!m("app>5"), "a non-numeric label never compares");
        assert!(!LabelSelector::parse("app=web").unwrap().matches(None));
        assert!(LabelSelector::parse("app!=web").unwrap().matches(None));
        assert!(LabelSelector::parse("example.com/team=a").is_some());
    }

    #[test]
    fn invalid_label_selectors_are_left_to_the_api_server() {
        for s in [
            "app in (a",
            "app=(",
            "=x",
            "app in a",
            "a b",
            "app=-x",
            "!",
            "/x=y",
        ] {
            assert_eq!(LabelSelector::parse(s), None, "{s}");
        }
    }

    #[test]
    fn field_selectors() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {}});
        let m = |s: &str| FieldSelector::parse(s, "", "Pod").unwrap().matches(&pod);
        assert!(m("metadata.name=p"));
        assert!(m("metadata.name==p,metadata.namespace=ns"));
        assert!(!m("metadata.name!=p"));
        assert!(m("spec.nodeName="), "a missing field reads as empty");
        assert!(!m("spec.nodeName=n1"));
        assert_eq!(
            FieldSelector::parse("metadata.namespace=ns", "", "Pod")
                .unwrap()
                .namespace(),
            Some("ns")
        );
        let event = json!({"involvedObject": {"kind": "Pod", "name": "p"}, "reason": "Started"});
        let e = |s: &str| {
            FieldSelector::parse(s, "", "Event")
                .unwrap()
                .matches(&event)
        };
        assert!(e(
            "involvedObject.kind=Pod,involvedObject.name=p,reason=Started"
        ));
        assert!(!e("involvedObject.uid=u"));
    }

    #[test]
    fn unknown_fields_are_left_to_the_api_server() {
        assert_eq!(
            FieldSelector::parse("spec.nodeName=n", "apps", "Deployment"),
            None
        );
        assert_eq!(
            FieldSelector::parse("involvedObject.kind=Pod", "", "Pod"),
            None
        );
        assert_eq!(FieldSelector::parse("metadata.name", "", "Pod"), None);
        assert_eq!(FieldSelector::parse(r"metadata.name=a\,b", "", "Pod"), None);
    }

    /// Found by `hub/tests/properties.rs`: the API server trims nothing in a field
    /// selector, so spaces around a field make it unknown (a 400) and spaces in a value
    /// are part of it; the cache trimmed both and answered differently.
    #[test]
    fn spaces_in_field_selectors_mean_what_they_mean_to_the_api_server() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}});
        assert_eq!(FieldSelector::parse("metadata.name = p", "", "Pod"), None);
        assert_eq!(FieldSelector::parse(" metadata.name=p", "", "Pod"), None);
        assert_eq!(FieldSelector::parse(" ", "", "Pod"), None);
        let trailing = FieldSelector::parse("metadata.name=p ", "", "Pod").unwrap();
        assert!(!trailing.matches(&pod), "the value is \"p \", not \"p\"");
    }
}
