//! The top-level members of an object's JSON, found by scanning its bytes (sans-IO): where
//! each member and its value lie, nothing parsed into values and nothing validated. Only for
//! JSON known to be a well-formed object (the cache parsed it when it packed it:
//! `PackedJson::selectable` is `Some`): a list item is the object less two members, or its
//! metadata alone, and finding those needs no parse of the rest. Unlike serde_json's
//! `RawValue` parse, the scan checks no number or string (the cache already did), and it
//! stops at the members it looks for: the agent's JSON has its keys sorted, so `apiVersion`
//! and `kind` come before `metadata`, `spec` and `status`. (Its saving is not measured yet.)

use std::ops::Range;

/// One top-level member.
#[derive(Debug, PartialEq, Eq)]
pub struct Member<'a> {
    /// The key as written between its quotes (escapes not decoded).
    pub key: &'a [u8],
    /// From the key's opening quote to the value's end.
    pub span: Range<usize>,
    pub value: Range<usize>,
}

/// JSON that is not an object of the shape scanned (the caller parses it instead).
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed;

/// The members of an object, in order, read one at a time.
pub struct Members<'a> {
    json: &'a [u8],
    /// Where the next member (or the closing brace) is looked for.
    at: usize,
    done: bool,
}

fn skip_whitespace(json: &[u8], mut at: usize) -> usize {
    while json.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

/// The end (after the closing quote) of the string whose opening quote is at `at`.
fn skip_string(json: &[u8], at: usize) -> Result<usize, Malformed> {
    let mut i = at + 1;
    loop {
        match json.get(i) {
            Some(b'"') => return Ok(i + 1),
            Some(b'\\') => i += 2,
            Some(_) => i += 1,
            None => return Err(Malformed),
        }
    }
}

/// The end of the value starting at `at`.
fn skip_value(json: &[u8], at: usize) -> Result<usize, Malformed> {
    match json.get(at) {
        None => Err(Malformed),
        Some(b'"') => skip_string(json, at),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match json.get(i) {
                    None => return Err(Malformed),
                    Some(b'"') => {
                        i = skip_string(json, i)?;
                        continue;
                    }
                    Some(b'{' | b'[') => depth += 1,
                    Some(b'}' | b']') => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(i + 1);
                        }
                    }
                    Some(_) => {}
                }
                i += 1;
            }
        }
        Some(_) => {
            // A number, true, false or null: up to the next delimiter.
            let mut i = at;
            while json
                .get(i)
                .is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace())
            {
                i += 1;
            }
            Ok(i)
        }
    }
}

impl<'a> Members<'a> {
    /// The members of `json`, which must be an object.
    pub fn of(json: &'a [u8]) -> Result<Self, Malformed> {
        let at = skip_whitespace(json, 0);
        if json.get(at) != Some(&b'{') {
            return Err(Malformed);
        }
        Ok(Members {
            json,
            at: at + 1,
            done: false,
        })
    }

    /// The next member, `None` after the last.
    pub fn next_member(&mut self) -> Result<Option<Member<'a>>, Malformed> {
        if self.done {
            return Ok(None);
        }
        let json = self.json;
        let start = skip_whitespace(json, self.at);
        match json.get(start) {
            Some(b'}') => {
                self.done = true;
                self.at = start;
                return Ok(None);
            }
            Some(b'"') => {}
            _ => return Err(Malformed),
        }
        let key_end = skip_string(json, start)?;
        let colon = skip_whitespace(json, key_end);
        if json.get(colon) != Some(&b':') {
            return Err(Malformed);
        }
        let value_start = skip_whitespace(json, colon + 1);
        let value_end = skip_value(json, value_start)?;
        let after = skip_whitespace(json, value_end);
        match json.get(after) {
            Some(b',') => self.at = after + 1,
            Some(b'}') => self.at = after,
            _ => return Err(Malformed),
        }
        Ok(Some(Member {
            key: &json[start + 1..key_end - 1],
            span: start..value_end,
            value: value_start..value_end,
        }))
    }

    /// Where the members not read yet start (after the last one read and its comma; at the
    /// closing brace after the last member).
    pub fn position(&self) -> usize {
        self.at
    }

    /// The members not read yet, as written (`"k":v,...`, without the closing brace; empty
    /// when none is left).
    pub fn rest(&self) -> Result<&'a [u8], Malformed> {
        let json = self.json;
        let start = skip_whitespace(json, self.at);
        let end = json
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .ok_or(Malformed)?;
        if json[end] != b'}' || end < start {
            return Err(Malformed);
        }
        let rest = &json[start..end];
        let trimmed = rest
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(0, |last| last + 1);
        Ok(&rest[..trimmed])
    }
}

/// Writes `json`, an object, less its top-level members named in `drop` (each at most once,
/// as the API server's JSON has them), to `out`; the members after the last dropped one
/// are copied as they are, not scanned.
pub fn write_without(json: &[u8], drop: &[&[u8]], out: &mut Vec<u8>) -> Result<(), Malformed> {
    let mut members = Members::of(json)?;
    let start = out.len();
    out.push(b'{');
    let mut left = drop.len();
    let mut wrote = false;
    while left > 0 {
        let Some(member) = members.next_member()? else {
            break;
        };
        if member.key.contains(&b'\\') {
            // An escaped key may spell a dropped one: the caller parses the JSON instead.
            out.truncate(start);
            return Err(Malformed);
        }
        if drop.contains(&member.key) {
            left -= 1;
            continue;
        }
        if wrote {
            out.push(b',');
        }
        out.extend_from_slice(&json[member.span]);
        wrote = true;
    }
    let rest = members.rest()?;
    if !rest.is_empty() {
        if wrote {
            out.push(b',');
        }
        out.extend_from_slice(rest);
    }
    out.push(b'}');
    Ok(())
}

/// The value of the top-level member `key` of `json`, an object; `None` when it has none.
pub fn member_value<'a>(json: &'a [u8], key: &[u8]) -> Result<Option<&'a [u8]>, Malformed> {
    let mut members = Members::of(json)?;
    while let Some(member) = members.next_member()? {
        if member.key.contains(&b'\\') {
            return Err(Malformed);
        }
        if member.key == key {
            return Ok(Some(&json[member.value]));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn without(json: &str, drop: &[&[u8]]) -> Result<String, Malformed> {
        let mut out = b"prefix".to_vec();
        write_without(json.as_bytes(), drop, &mut out)?;
        Ok(String::from_utf8(out).unwrap().split_off(6))
    }

    const KIND: &[&[u8]] = &[b"apiVersion", b"kind"];

    #[test]
    fn drops_the_named_members_and_keeps_the_rest_as_written() {
        assert_eq!(
            without(
                r#"{"apiVersion":"v1","data":{"a":"}\"{"},"kind":"ConfigMap","metadata":{"name":"x"}}"#,
                KIND
            )
            .unwrap(),
            r#"{"data":{"a":"}\"{"},"metadata":{"name":"x"}}"#
        );
        assert_eq!(
            without(
                r#" { "kind" : "Pod" , "apiVersion":"v1" , "metadata" : {"n":[1, 2.5e3,true,null]} }  "#,
                KIND
            )
            .unwrap(),
            r#"{"metadata" : {"n":[1, 2.5e3,true,null]}}"#
        );
        assert_eq!(
            without(r#"{"apiVersion":"v1","kind":"X"}"#, KIND).unwrap(),
            "{}"
        );
        assert_eq!(without("{}", KIND).unwrap(), "{}");
        assert_eq!(
            without(r#"{"b":1,"a":[{"kind":"in"}]}"#, KIND).unwrap(),
            r#"{"b":1,"a":[{"kind":"in"}]}"#
        );
        assert_eq!(without("[1]", KIND), Err(Malformed));
        assert_eq!(without(r#"{"\u006bind":"X"}"#, KIND), Err(Malformed));
    }

    /// The scan gives what serde_json's parse gives, on objects of every shape.
    #[test]
    fn agrees_with_serde_json() {
        let objects = [
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b\"}"}},
                   "spec": {"containers": [{"image": "x", "args": ["[", "{", "\\"]}]}, "status": {"n": -1.5}}),
            json!({"kind": "Event", "count": 3, "apiVersion": "v1", "x": null, "y": false, "z": [[], {}]}),
            json!({"data": {"k": "é\n\t"}, "metadata": {}}),
            json!({}),
        ];
        for object in objects {
            for text in [
                serde_json::to_string(&object).unwrap(),
                serde_json::to_string_pretty(&object).unwrap(),
            ] {
                let mut expected = object.as_object().unwrap().clone();
                expected.remove("kind");
                expected.remove("apiVersion");
                let mut out = Vec::new();
                write_without(text.as_bytes(), KIND, &mut out).unwrap();
                let got: Value = serde_json::from_slice(&out).unwrap();
                assert_eq!(got, Value::Object(expected), "{text}");
                let metadata = member_value(text.as_bytes(), b"metadata")
                    .unwrap()
                    .map(|m| serde_json::from_slice::<Value>(m).unwrap());
                assert_eq!(metadata.as_ref(), object.get("metadata"), "{text}");
            }
        }
    }
}
