//! An object's JSON as the cache keeps it: one zstd frame per object, exactly sized.
//!
//! The hub holds every object of every account, and reads of them (the proxy's LISTs and
//! GETs, watches, the objects API) are few next to the objects kept, so the JSON is kept
//! compressed (in memory and in the store, whose page cache then holds compressed pages
//! too) and decompressed when read: about 2 µs per 1.5 KB object, small beside the parsing
//! every reader does. Each object is its own frame, so a read never decompresses more than
//! the objects it returns, and an object can be replaced without touching the others. The
//! packed bytes are shared: the copies of an object that a store commit or a read takes
//! out of the cache do not copy them.
//!
//! What selectors read is kept beside the frame, in the same allocation: the object's labels
//! and the few fields the cache evaluates field selectors on ([`FIELDS`]). A selective LIST
//! then unpacks only the objects it returns (most of a selective list's objects are left
//! out), which made it faster than before the JSON was packed instead of slower.

use std::{cell::RefCell, collections::BTreeMap, fmt, sync::Arc};

use serde::Deserialize;
use serde_json::{Map, Value};

/// zstd's level: 3 is its default; higher levels cost more time under the hub's state lock
/// (objects are packed as their batch is applied) for little on objects of a few KiB.
const LEVEL: i32 = 3;

/// The largest object unpacked (the hub's `--max-object-bytes` keeps objects far smaller;
/// a frame that claims more is corrupt).
const MAX_UNPACKED: u64 = 256 * 1024 * 1024;

thread_local! {
    // A context per thread: zstd's contexts are large to create and reusable.
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// Packed bytes that do not unpack (a corrupt store, or a bug).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corrupt(pub String);

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "packed object JSON does not unpack: {}", self.0)
    }
}

/// The fields, besides `metadata.name` and `metadata.namespace` (which the cache keeps
/// apart), that the cache evaluates field selectors on: their string values are kept beside
/// the packed JSON. `proxy::cached::selector` names the fields it accepts; one it accepts
/// but is not here is evaluated on the unpacked JSON, as before.
pub const FIELDS: &[&str] = &[
    "spec.nodeName",
    "status.phase",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "type",
];

/// An object's JSON, packed, with what its selectors read. Empty when the object has no
/// JSON (kept truncated). Equal JSON packs to equal bytes (zstd is deterministic for one
/// level and version, and the selectable part is derived from the JSON), so comparing
/// packed objects compares their JSON.
///
/// Layout of the shared bytes: nothing for no JSON; otherwise a LEB128 number `n`, then
/// (when `n > 0`) `n - 1` bytes of selectable entries, then the zstd frame. `n == 0` means
/// the selectable part is unknown (JSON whose labels or fields do not have the shapes the
/// API server gives them): its selectors are evaluated on the unpacked JSON. An entry is a
/// tag (`l` a label, `f` a field of [`FIELDS`]), then the key and the value, each as a
/// LEB128 length and UTF-8 bytes; labels and fields whose values are not strings are left
/// out, as selectors read them as absent.
#[derive(Clone, PartialEq, Eq)]
pub struct PackedJson(Arc<[u8]>);

/// What selectors read of a packed object, without unpacking it.
#[derive(Clone, Copy, Debug)]
pub struct Selectable<'a>(&'a [u8]);

impl<'a> Selectable<'a> {
    /// The entries: (tag, key, value).
    fn entries(self) -> impl Iterator<Item = (u8, &'a str, &'a str)> {
        let mut rest = self.0;
        std::iter::from_fn(move || {
            let (&tag, after) = rest.split_first()?;
            let (key, after) = read_str(after)?;
            let (value, after) = read_str(after)?;
            rest = after;
            Some((tag, key, value))
        })
    }

    /// The label's value; `None` when the object has no such label (or not a string).
    pub fn label(self, key: &str) -> Option<&'a str> {
        self.entries()
            .find(|(tag, k, _)| *tag == TAG_LABEL && *k == key)
            .map(|(_, _, v)| v)
    }

    /// The value of a field of [`FIELDS`] (`Some(None)` when the object has none, or not a
    /// string); `None` for a field not kept.
    pub fn field(self, dotted: &str) -> Option<Option<&'a str>> {
        if !FIELDS.contains(&dotted) {
            return None;
        }
        Some(
            self.entries()
                .find(|(tag, k, _)| *tag == TAG_FIELD && *k == dotted)
                .map(|(_, _, v)| v),
        )
    }
}

const TAG_LABEL: u8 = b'l';
const TAG_FIELD: u8 = b'f';

fn write_len(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A LEB128 number and the bytes after it.
fn read_len(bytes: &[u8]) -> Option<(usize, &[u8])> {
    let mut n = 0usize;
    for (i, &byte) in bytes.iter().enumerate().take(9) {
        n |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((n, &bytes[i + 1..]));
        }
    }
    None
}

fn read_str(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let (len, rest) = read_len(bytes)?;
    if len > rest.len() {
        return None;
    }
    let (s, rest) = rest.split_at(len);
    Some((std::str::from_utf8(s).ok()?, rest))
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    write_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// The members of an object that selectors read; every other member is skipped unparsed.
/// A member of another shape (`metadata` not an object, a repeated member) fails the parse,
/// and the object's selectors are then evaluated on its JSON, as before.
#[derive(Deserialize)]
struct SelectedMembers {
    #[serde(default)]
    metadata: Option<SelectedMetadata>,
    #[serde(default)]
    spec: Option<BTreeMap<String, Value>>,
    #[serde(default)]
    status: Option<BTreeMap<String, Value>>,
    #[serde(default, rename = "involvedObject")]
    involved_object: Option<BTreeMap<String, Value>>,
    #[serde(default)]
    reason: Option<Value>,
    #[serde(default, rename = "type")]
    type_: Option<Value>,
}

#[derive(Deserialize)]
struct SelectedMetadata {
    #[serde(default)]
    labels: Option<Map<String, Value>>,
}

/// The selectable entries of `json`, or `None` when they cannot be taken from it.
fn selectable_entries(json: &[u8]) -> Option<Vec<u8>> {
    // An object, not an array a derived struct would also accept.
    if json.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let members: SelectedMembers = serde_json::from_slice(json).ok()?;
    let mut out = Vec::new();
    if let Some(labels) = members.metadata.and_then(|m| m.labels) {
        for (key, value) in &labels {
            if let Some(value) = value.as_str() {
                out.push(TAG_LABEL);
                write_str(&mut out, key);
                write_str(&mut out, value);
            }
        }
    }
    let mut field = |name: &str, value: Option<&Value>| {
        if let Some(value) = value.and_then(Value::as_str) {
            out.push(TAG_FIELD);
            write_str(&mut out, name);
            write_str(&mut out, value);
        }
    };
    for dotted in FIELDS {
        let value = match dotted.split_once('.') {
            Some(("spec", f)) => members.spec.as_ref().and_then(|m| m.get(f)),
            Some(("status", f)) => members.status.as_ref().and_then(|m| m.get(f)),
            Some(("involvedObject", f)) => members.involved_object.as_ref().and_then(|m| m.get(f)),
            None if *dotted == "reason" => members.reason.as_ref(),
            None if *dotted == "type" => members.type_.as_ref(),
            _ => None,
        };
        field(dotted, value);
    }
    Some(out)
}

/// The shared bytes for `json` packed as `frame`.
fn layout(json: &[u8], frame: &[u8]) -> Arc<[u8]> {
    let entries = selectable_entries(json);
    let mut bytes = Vec::with_capacity(frame.len() + entries.as_ref().map_or(1, |e| e.len() + 2));
    match entries {
        Some(entries) => {
            write_len(&mut bytes, entries.len() + 1);
            bytes.extend_from_slice(&entries);
        }
        None => write_len(&mut bytes, 0),
    }
    bytes.extend_from_slice(frame);
    Arc::from(bytes)
}

impl Default for PackedJson {
    fn default() -> Self {
        PackedJson(Arc::from(&[][..]))
    }
}

impl PackedJson {
    /// Packs `json` (empty stays empty).
    pub fn pack(json: &[u8]) -> PackedJson {
        if json.is_empty() {
            return PackedJson::default();
        }
        let packed = COMPRESSOR.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = zstd::bulk::Compressor::new(LEVEL).ok();
            }
            cell.as_mut().and_then(|c| c.compress(json).ok())
        });
        match packed {
            // `compress` allocates zstd's bound; the Arc keeps the exact size.
            Some(packed) => PackedJson(layout(json, &packed)),
            // Only when zstd cannot allocate its context: keep the JSON as a raw frame.
            None => PackedJson(layout(json, &raw_frame(json))),
        }
    }

    /// Takes bytes [`PackedJson::packed`] gave (from the store), checking that they unpack.
    pub fn from_packed(bytes: &[u8]) -> Result<PackedJson, Corrupt> {
        if bytes.is_empty() {
            return Ok(PackedJson::default());
        }
        let json = unpack_frame(bytes)?;
        Ok(PackedJson(layout(&json, bytes)))
    }

    /// The selectable part and the frame.
    fn parts(&self) -> (Option<Selectable<'_>>, &[u8]) {
        match read_len(&self.0) {
            Some((0, frame)) => (None, frame),
            Some((n, rest)) if n - 1 <= rest.len() => {
                let (entries, frame) = rest.split_at(n - 1);
                (Some(Selectable(entries)), frame)
            }
            // Empty (no JSON); `PackedJson` builds no other layout.
            _ => (None, &[]),
        }
    }

    /// What selectors read of the object, without unpacking it; `None` when its selectors
    /// must be evaluated on its JSON (or it has none).
    pub fn selectable(&self) -> Option<Selectable<'_>> {
        self.parts().0
    }

    /// The packed bytes (what the store keeps): the zstd frame alone.
    pub fn packed(&self) -> &[u8] {
        self.parts().1
    }

    /// Bytes held in memory.
    pub fn packed_len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The JSON.
    pub fn unpack(&self) -> Result<Vec<u8>, Corrupt> {
        if self.0.is_empty() {
            return Ok(Vec::new());
        }
        unpack_frame(self.packed())
    }
}

// Counted in every build, not only under `cfg(test)`: the proxy's tests (another crate) check
// which reads unpack objects; a thread-local increment beside a zstd decompression is noise.
thread_local! {
    static FRAMES_UNPACKED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Frames unpacked on this thread (tests: which reads unpack objects).
#[doc(hidden)]
pub fn frames_unpacked() -> usize {
    FRAMES_UNPACKED.with(std::cell::Cell::get)
}

/// The JSON of a zstd frame.
fn unpack_frame(frame: &[u8]) -> Result<Vec<u8>, Corrupt> {
    FRAMES_UNPACKED.with(|n| n.set(n.get() + 1));
    let size = match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(size)) if size <= MAX_UNPACKED => size as usize,
        Ok(Some(size)) => return Err(Corrupt(format!("{size} bytes claimed"))),
        Ok(None) => return Err(Corrupt("no content size".into())),
        Err(e) => return Err(Corrupt(format!("{e:?}"))),
    };
    DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(zstd::bulk::Decompressor::new().map_err(|e| Corrupt(e.to_string()))?);
        }
        let Some(decompressor) = cell.as_mut() else {
            return Err(Corrupt("no decompressor".into()));
        };
        let json = decompressor
            .decompress(frame, size)
            .map_err(|e| Corrupt(e.to_string()))?;
        if json.len() != size {
            return Err(Corrupt(format!("{} of {size} bytes", json.len())));
        }
        Ok(json)
    })
}

impl fmt::Debug for PackedJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PackedJson({} bytes packed)", self.0.len())
    }
}

impl From<&[u8]> for PackedJson {
    fn from(json: &[u8]) -> Self {
        PackedJson::pack(json)
    }
}

impl From<Vec<u8>> for PackedJson {
    fn from(json: Vec<u8>) -> Self {
        PackedJson::pack(&json)
    }
}

/// A zstd frame that stores `data` uncompressed (one raw block per 128 KiB), with its
/// content size: what [`PackedJson::pack`] keeps when zstd has no context to compress with.
fn raw_frame(data: &[u8]) -> Vec<u8> {
    const BLOCK: usize = 128 * 1024;
    let mut frame = Vec::with_capacity(data.len() + 16 + 3 * (data.len() / BLOCK + 1));
    frame.extend_from_slice(&0xFD2F_B528u32.to_le_bytes());
    // Frame header descriptor: an 8-byte content size, single segment (no window size).
    frame.push(0b1110_0000);
    frame.extend_from_slice(&(data.len() as u64).to_le_bytes());
    let mut chunks = data.chunks(BLOCK).peekable();
    if chunks.peek().is_none() {
        frame.extend_from_slice(&[1, 0, 0]);
    }
    while let Some(chunk) = chunks.next() {
        let last = u32::from(chunks.peek().is_none());
        // Block header: last flag, type 0 (raw), size.
        let header = last | ((chunk.len() as u32) << 3);
        frame.extend_from_slice(&header.to_le_bytes()[..3]);
        frame.extend_from_slice(chunk);
    }
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_compares_by_content() {
        let json = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"b"},"data":{"k":"vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv"}}"#;
        let packed = PackedJson::pack(json);
        assert!(packed.packed_len() < json.len());
        assert_eq!(packed.unpack().unwrap(), json);
        assert_eq!(packed, PackedJson::pack(json));
        assert_ne!(packed, PackedJson::pack(b"{}"));
        assert_eq!(PackedJson::from_packed(packed.packed()).unwrap(), packed);
        assert!(PackedJson::pack(b"").is_empty());
        assert_eq!(PackedJson::default().unpack().unwrap(), b"");
    }

    #[test]
    fn a_kubernetes_object_is_held_in_less_than_half_its_json() {
        let spec = r#"{"replicas":3,"selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web","tier":"frontend"}},"spec":{"containers":[{"name":"web","image":"registry.example.com/shop/web:1.42.3","ports":[{"containerPort":8080,"name":"http","protocol":"TCP"}],"resources":{"limits":{"cpu":"1","memory":"1Gi"},"requests":{"cpu":"250m","memory":"768Mi"}}}]}}}"#;
        let json = format!(
            r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"web","namespace":"shop","uid":"0b6f8c2e-58b2-4c0e-9d7e-2b8f4e1a7c90","resourceVersion":"5000123","generation":7,"creationTimestamp":"2026-11-20T08:14:02Z","labels":{{"app":"web"}},"annotations":{{"deployment.kubernetes.io/revision":"7","kubectl.kubernetes.io/last-applied-configuration":{}}}}},"spec":{spec},"status":{{"observedGeneration":7,"replicas":3,"updatedReplicas":3,"readyReplicas":3,"availableReplicas":3,"conditions":[{{"type":"Available","status":"True","lastUpdateTime":"2026-11-20T08:14:19Z","lastTransitionTime":"2026-11-20T08:14:19Z","reason":"MinimumReplicasAvailable","message":"Deployment has minimum availability."}},{{"type":"Progressing","status":"True","lastUpdateTime":"2026-11-20T08:14:19Z","lastTransitionTime":"2026-11-20T08:14:02Z","reason":"NewReplicaSetAvailable","message":"ReplicaSet \"web-7d4b9c8f5\" has successfully progressed."}}]}}}}"#,
            serde_json::to_string(&format!(
                r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"web","namespace":"shop"}},"spec":{spec}}}"#
            ))
            .unwrap()
        );
        serde_json::from_str::<serde_json::Value>(&json).unwrap();
        let packed = PackedJson::pack(json.as_bytes());
        assert!(
            packed.packed_len() * 2 < json.len(),
            "{} of {} bytes",
            packed.packed_len(),
            json.len()
        );
        // Copies share the bytes.
        let copy = packed.clone();
        assert!(std::ptr::eq(
            copy.packed().as_ptr(),
            packed.packed().as_ptr()
        ));
    }

    #[test]
    fn what_selectors_read_is_kept_beside_the_frame() {
        let json = br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"n","labels":{"app":"web","tier":"front","n":3}},"spec":{"nodeName":"node-1","containers":[]},"status":{"phase":"Running"},"type":7}"#;
        let packed = PackedJson::pack(json);
        let kept = packed.selectable().unwrap();
        assert_eq!(kept.label("app"), Some("web"));
        assert_eq!(kept.label("tier"), Some("front"));
        // Not a string: absent, as label selectors read it.
        assert_eq!(kept.label("n"), None);
        assert_eq!(kept.label("missing"), None);
        assert_eq!(kept.field("spec.nodeName"), Some(Some("node-1")));
        assert_eq!(kept.field("status.phase"), Some(Some("Running")));
        assert_eq!(kept.field("type"), Some(None));
        assert_eq!(kept.field("reason"), Some(None));
        assert_eq!(kept.field("spec.serviceAccountName"), None, "not kept");
        // The store keeps the zstd frame alone; loading it gives the same object.
        assert_eq!(zstd::decode_all(packed.packed()).unwrap(), json);
        let loaded = PackedJson::from_packed(packed.packed()).unwrap();
        assert_eq!(loaded, packed);
        assert_eq!(loaded.selectable().unwrap().label("app"), Some("web"));
        // An Event's fields.
        let event = PackedJson::pack(
            br#"{"kind":"Event","involvedObject":{"kind":"Pod","name":"p","uid":"u"},"reason":"Started","type":"Normal"}"#,
        );
        let kept = event.selectable().unwrap();
        assert_eq!(kept.field("involvedObject.name"), Some(Some("p")));
        assert_eq!(kept.field("involvedObject.namespace"), Some(None));
        assert_eq!(kept.field("reason"), Some(Some("Started")));
        assert_eq!(kept.field("type"), Some(Some("Normal")));
        assert_eq!(kept.label("app"), None);
        // Shapes the API server does not give: selectors read the JSON instead.
        for odd in [
            &br#"{"metadata":"x"}"#[..],
            br#"{"metadata":{"labels":{"a":"b"},"labels":{"a":"c"}}}"#,
            br#"{"metadata":{},"metadata":{}}"#,
            br#"{"spec":[1]}"#,
            br#"[{"metadata":{}}]"#,
            b"not json",
        ] {
            let packed = PackedJson::pack(odd);
            assert!(
                packed.selectable().is_none(),
                "{}",
                String::from_utf8_lossy(odd)
            );
            assert_eq!(packed.unpack().unwrap(), odd);
        }
        // Long keys and values (lengths of more than one LEB128 byte).
        let long = "v".repeat(70_000);
        let json = format!(r#"{{"metadata":{{"labels":{{"{long}":"{long}","k":"v"}}}}}}"#);
        let packed = PackedJson::pack(json.as_bytes());
        let kept = packed.selectable().unwrap();
        assert_eq!(kept.label(&long), Some(long.as_str()));
        assert_eq!(kept.label("k"), Some("v"));
        assert_eq!(packed.unpack().unwrap(), json.as_bytes());
    }

    #[test]
    fn corrupt_bytes_are_refused() {
        assert!(PackedJson::from_packed(b"{\"not\":\"packed\"}").is_err());
        let packed = PackedJson::pack(&[b'x'; 4000]);
        let mut cut = packed.packed().to_vec();
        cut.truncate(cut.len() - 1);
        assert!(PackedJson::from_packed(&cut).is_err());
    }

    #[test]
    fn raw_frames_unpack() {
        for size in [1, 100, 128 * 1024, 300 * 1024] {
            let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let frame = PackedJson(layout(&data, &raw_frame(&data)));
            assert_eq!(frame.unpack().unwrap(), data, "{size} bytes");
            assert!(frame.selectable().is_none(), "not JSON");
        }
    }
}
