//! Secrets' LIST and WATCH, decoded without ever copying the Secret data that
//! client-side `kubectl apply` puts in their metadata.
//!
//! Secrets are requested as metadata only (`PartialObjectMetadata`), but a Secret made by
//! client-side `kubectl apply` carries its whole data, in clear, in the
//! [`LAST_APPLIED`](crate::convert::LAST_APPLIED) annotation (and other tools in others,
//! [`crate::convert::MANIFEST_ANNOTATIONS`]), and annotations are metadata. kube's typed decoding copies
//! that value into owned `String`s (and its watch line codec copies each event into a
//! `String`), which are freed without being wiped. Here instead:
//! - the response body is copied into one [`WipedBuffer`] this module owns, and each body
//!   chunk hyper hands over is zeroed when this is its only owner (see [`absorb`]);
//! - objects are decoded in place by visitors that skip the annotation's value, `data`,
//!   `stringData` and `managedFields` with [`IgnoredAny`] (serde_json scans a skipped
//!   string in the input slice, without copying it anywhere);
//! - the bytes of each decoded line (or list body) are zeroed at once;
//! - every request asks the API server to close the connection when it is done
//!   (`Connection: close`, so it never idles in the pool), and a watch ends right after an
//!   event that carried Secret data and is re-opened from that event's resourceVersion: the
//!   connection that carried the data closes, which frees hyper's read buffer and rustls'
//!   record buffer (zeroed on free by [`crate::wiping_alloc`]).

use std::fmt;

use bytes::Bytes;
use futures::{StreamExt as _, stream::BoxStream};
use http_body_util::BodyExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::{
    Client,
    api::{ListParams, WatchParams},
    client::Body,
    core::Status,
};
use serde::{
    Deserialize,
    de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor},
};
use serde_json::{Map, Value};
use zeroize::Zeroize as _;

use super::event::Event;
use crate::convert::holds_a_manifest;

/// Bytes of a response body, owned here so that they can be zeroed: each line is zeroed
/// where it lay once decoded, and the old allocation is zeroed when the buffer grows.
#[derive(Default)]
pub struct WipedBuffer {
    bytes: Vec<u8>,
    /// Where the bytes not yet decoded start.
    start: usize,
}

impl WipedBuffer {
    /// Appends `chunk`.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.start > 0 {
            self.compact();
        }
        if self.bytes.capacity() - self.bytes.len() < chunk.len() {
            // Grown by hand: Vec's own growth would free the old allocation unwiped.
            let needed = self.bytes.len() + chunk.len();
            let mut grown = Vec::with_capacity(needed.max(self.bytes.capacity() * 2));
            grown.extend_from_slice(&self.bytes);
            self.bytes.zeroize();
            self.bytes = grown;
        }
        self.bytes.extend_from_slice(chunk);
    }

    /// Moves the undecoded bytes to the front and zeroes what they leave behind.
    fn compact(&mut self) {
        let pending = self.bytes.len() - self.start;
        self.bytes.copy_within(self.start.., 0);
        self.bytes[pending..].zeroize();
        self.bytes.truncate(pending);
        self.start = 0;
    }

    /// Hands the next complete line (without its newline) to `decode` and zeroes it;
    /// `None` when no complete line is buffered.
    pub fn take_line<T>(&mut self, decode: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let newline = self.bytes[self.start..].iter().position(|&b| b == b'\n')?;
        let end = self.start + newline;
        let decoded = decode(&self.bytes[self.start..end]);
        self.bytes[self.start..=end].zeroize();
        self.start = end + 1;
        if self.start == self.bytes.len() {
            self.bytes.clear();
            self.start = 0;
        }
        Some(decoded)
    }

    /// Hands everything buffered to `decode`, then zeroes the buffer.
    pub fn take_all<T>(&mut self, decode: impl FnOnce(&[u8]) -> T) -> T {
        let decoded = decode(&self.bytes[self.start..]);
        self.bytes.zeroize();
        self.start = 0;
        decoded
    }

    /// How many bytes are buffered and not yet decoded.
    pub fn pending(&self) -> usize {
        self.bytes.len() - self.start
    }

    /// The buffer's bytes, decoded or not (for tests of the wiping).
    #[cfg(test)]
    fn allocation(&self) -> &[u8] {
        &self.bytes[..]
    }
}

impl Drop for WipedBuffer {
    fn drop(&mut self) {
        self.bytes.zeroize();
    }
}

/// How the body chunks of one response were disposed of.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChunkStats {
    /// Chunks this was the only owner of, zeroed after copying.
    pub zeroed: u64,
    /// Chunks still sharing their allocation (hyper splits body chunks off its connection
    /// read buffer), which cannot be zeroed from here; they are wiped when freed.
    pub shared: u64,
}

/// Copies a body chunk into `buffer`, then zeroes the chunk if this is its only owner.
pub fn absorb(buffer: &mut WipedBuffer, chunk: Bytes, stats: &mut ChunkStats) {
    buffer.push(&chunk);
    match chunk.try_into_mut() {
        Ok(mut owned) => {
            owned[..].zeroize();
            stats.zeroed += 1;
        }
        Err(_shared) => stats.shared += 1,
    }
}

/// An object decoded without its Secret data. `object` is the JSON object less `data`,
/// `stringData`, `metadata.managedFields` and the annotations that hold an applied manifest
/// ([`crate::convert::MANIFEST_ANNOTATIONS`]).
#[derive(Debug, Default)]
pub struct Scrubbed {
    pub object: Value,
    /// Whether a skipped part held Secret data (the annotation, `data` or `stringData`).
    pub held_data: bool,
}

impl<'de> Deserialize<'de> for Scrubbed {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let filtered = Level::Object.deserialize(deserializer)?;
        Ok(Scrubbed {
            object: filtered.map.map(Value::Object).unwrap_or(Value::Null),
            held_data: filtered.held_data,
        })
    }
}

/// Which JSON object a visitor is in; each skips its own keys.
#[derive(Clone, Copy, Debug)]
enum Level {
    Object,
    Metadata,
    Annotations,
}

/// A JSON object with some keys skipped (`map` is `None` for `null`).
#[derive(Default)]
struct Filtered {
    map: Option<Map<String, Value>>,
    held_data: bool,
}

impl<'de> DeserializeSeed<'de> for Level {
    type Value = Filtered;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Filtered, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Level {
    type Value = Filtered;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a JSON object ({self:?})")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Filtered, E> {
        Ok(Filtered::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Filtered, A::Error> {
        let mut map = Map::new();
        let mut held_data = false;
        while let Some(key) = access.next_key::<String>()? {
            match (self, key.as_str()) {
                (Level::Object, "data" | "stringData") => {
                    access.next_value::<IgnoredAny>()?;
                    held_data = true;
                }
                (Level::Annotations, name) if holds_a_manifest(name) => {
                    access.next_value::<IgnoredAny>()?;
                    held_data = true;
                }
                (Level::Metadata, "managedFields") => {
                    access.next_value::<IgnoredAny>()?;
                }
                (Level::Object, "metadata") | (Level::Metadata, "annotations") => {
                    let inner = match self {
                        Level::Object => Level::Metadata,
                        _ => Level::Annotations,
                    };
                    let filtered = access.next_value_seed(inner)?;
                    held_data |= filtered.held_data;
                    if let Some(inner_map) = filtered.map {
                        map.insert(key, Value::Object(inner_map));
                    }
                }
                _ => {
                    let value = access.next_value::<Value>()?;
                    map.insert(key, value);
                }
            }
        }
        Ok(Filtered {
            map: Some(map),
            held_data,
        })
    }
}

/// A LIST answer: its items and list metadata.
#[derive(Debug, Default)]
pub struct ListPage {
    pub items: Vec<Value>,
    pub metadata: ListMeta,
    /// Whether any item held Secret data (skipped).
    pub held_data: bool,
}

#[derive(Deserialize)]
struct WireList {
    #[serde(default)]
    metadata: Option<ListMeta>,
    #[serde(default)]
    items: Option<Vec<Scrubbed>>,
}

/// Decodes a (metadata-only) LIST body, skipping Secret data.
pub fn decode_list(body: &[u8]) -> serde_json::Result<ListPage> {
    let list: WireList = serde_json::from_slice(body)?;
    let items = list.items.unwrap_or_default();
    Ok(ListPage {
        held_data: items.iter().any(|item| item.held_data),
        items: items.into_iter().map(|item| item.object).collect(),
        metadata: list.metadata.unwrap_or_default(),
    })
}

#[derive(Deserialize)]
struct WireEvent {
    #[serde(rename = "type")]
    event_type: String,
    object: Scrubbed,
}

/// Decodes one watch event line, skipping Secret data; also says whether it held any.
/// `None` for a blank line.
pub fn decode_event(line: &[u8]) -> Option<serde_json::Result<(Event, bool)>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    Some(serde_json::from_slice::<WireEvent>(line).and_then(|wire| {
        let held_data = wire.object.held_data;
        let object = wire.object.object;
        let event = match wire.event_type.as_str() {
            "ADDED" | "MODIFIED" => Event::Applied(object),
            "DELETED" => Event::Deleted(object),
            "BOOKMARK" => Event::Bookmark(crate::convert::resource_version(&object)),
            "ERROR" => Event::Error(Box::new(serde_json::from_value::<Status>(object)?)),
            other => {
                return Err(de::Error::custom(format!(
                    "unknown watch event type {other:?}"
                )));
            }
        };
        Ok((event, held_data))
    }))
}

/// A metadata-only request that closes its connection when done.
fn request(
    built: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> kube::Result<http::Request<Body>> {
    let mut request = built.map_err(kube::Error::BuildRequest)?;
    request.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    Ok(request.map(Body::from))
}

/// Sends `request`; a non-success answer becomes `kube::Error::Api` with the API server's
/// Status (an error answer carries no object, so no Secret data).
async fn send(client: &Client, request: http::Request<Body>) -> kube::Result<Body> {
    let response = client.send(request).await?;
    let code = response.status();
    if code.is_success() {
        return Ok(response.into_body());
    }
    let body = response.into_body().collect().await?.to_bytes();
    Err(kube::Error::Api(Box::new(error_status(code, &body))))
}

/// The Status of an error answer: the API server's own, or one made from the HTTP status
/// and the body's text when the body is not a Status.
fn error_status(code: http::StatusCode, body: &[u8]) -> Status {
    serde_json::from_slice::<Status>(body)
        .ok()
        .filter(|status| status.code != 0)
        .unwrap_or_else(|| Status {
            code: code.as_u16(),
            reason: code.canonical_reason().unwrap_or_default().to_string(),
            message: String::from_utf8_lossy(body).into_owned(),
            ..Default::default()
        })
}

/// LISTs Secrets' metadata at `url_path` (one page).
pub async fn list(client: &Client, url_path: &str, params: &ListParams) -> kube::Result<ListPage> {
    let request = request(kube::core::Request::new(url_path).list_metadata(params))?;
    let mut body = send(client, request).await?;
    let mut buffer = WipedBuffer::default();
    let mut stats = ChunkStats::default();
    while let Some(frame) = body.frame().await {
        if let Ok(chunk) = frame?.into_data() {
            absorb(&mut buffer, chunk, &mut stats);
        }
    }
    drop(body);
    let page = buffer
        .take_all(decode_list)
        .map_err(kube::Error::SerdeError)?;
    tracing::debug!(
        items = page.items.len(),
        held_data = page.held_data,
        chunks_zeroed = stats.zeroed,
        chunks_shared = stats.shared,
        "Secrets listed as metadata"
    );
    Ok(page)
}

/// An open WATCH of Secrets' metadata.
struct OpenWatch {
    body: Body,
    buffer: WipedBuffer,
    stats: ChunkStats,
}

impl OpenWatch {
    /// The next event, and whether the watch must end after it.
    async fn next(&mut self) -> Option<(kube::Result<Event>, bool)> {
        loop {
            match self.buffer.take_line(decode_event) {
                Some(None) => continue,
                Some(Some(Ok((event, held_data)))) => return Some((Ok(event), held_data)),
                Some(Some(Err(error))) => return Some((Err(kube::Error::SerdeError(error)), true)),
                None => {}
            }
            match self.body.frame().await? {
                Err(error) => return Some((Err(error), true)),
                Ok(frame) => {
                    if let Ok(chunk) = frame.into_data() {
                        absorb(&mut self.buffer, chunk, &mut self.stats);
                    }
                }
            }
        }
    }
}

/// WATCHes Secrets' metadata at `url_path` from `resource_version`. The stream ends after
/// an event that held Secret data (the caller re-opens from that event's resourceVersion),
/// so that the connection which carried the data is closed and its buffers freed.
pub async fn watch(
    client: &Client,
    url_path: &str,
    params: &WatchParams,
    resource_version: &str,
) -> kube::Result<BoxStream<'static, kube::Result<Event>>> {
    let request =
        request(kube::core::Request::new(url_path).watch_metadata(params, resource_version))?;
    let body = send(client, request).await?;
    let open = OpenWatch {
        body,
        buffer: WipedBuffer::default(),
        stats: ChunkStats::default(),
    };
    Ok(futures::stream::unfold(Some(open), |open| async move {
        let mut open = open?;
        let (event, last) = open.next().await?;
        if last {
            tracing::debug!(
                chunks_zeroed = open.stats.zeroed,
                chunks_shared = open.stats.shared,
                pending = open.buffer.pending(),
                "a Secret event held data (last-applied annotation): closing this watch's connection and re-opening from its resourceVersion"
            );
            // Dropping `open` drops the unfinished body: hyper closes the connection.
            return Some((event, None));
        }
        Some((event, Some(open)))
    })
    .boxed())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::convert::LAST_APPLIED;

    const MARKER: &str = "plain-marker-0123456789";

    fn applied_secret(rv: &str) -> Value {
        let last_applied = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "db", "namespace": "web" },
            "stringData": { "password": MARKER },
        })
        .to_string();
        json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {
                "name": "db", "namespace": "web", "uid": "u1", "resourceVersion": rv,
                "labels": { "app": "db" },
                "annotations": { LAST_APPLIED: last_applied, "team": "payments" },
                "managedFields": [{ "manager": "kubectl-client-side-apply" }],
            },
        })
    }

    #[test]
    fn the_last_applied_annotation_is_skipped_and_the_rest_kept() {
        let mut object = applied_secret("42");
        object["data"] = json!({ "password": MARKER });
        object["stringData"] = json!({ "password": MARKER });
        let text = serde_json::to_vec(&object).unwrap();
        let scrubbed: Scrubbed = serde_json::from_slice(&text).unwrap();
        assert!(scrubbed.held_data);
        let out = scrubbed.object.to_string();
        assert!(!out.contains(MARKER), "{out}");
        assert!(!out.contains("managedFields"), "{out}");
        assert!(!out.contains("last-applied"), "{out}");
        assert_eq!(scrubbed.object["metadata"]["name"], "db");
        assert_eq!(scrubbed.object["metadata"]["resourceVersion"], "42");
        assert_eq!(scrubbed.object["metadata"]["labels"]["app"], "db");
        assert_eq!(
            scrubbed.object["metadata"]["annotations"]["team"],
            "payments"
        );
        assert_eq!(scrubbed.object["kind"], "PartialObjectMetadata");
    }

    #[test]
    fn every_annotation_known_to_hold_a_manifest_is_skipped() {
        let mut object = applied_secret("43");
        for name in crate::convert::MANIFEST_ANNOTATIONS {
            object["metadata"]["annotations"][name] = json!(format!("{{\"data\":\"{MARKER}\"}}"));
        }
        let text = serde_json::to_vec(&object).unwrap();
        let scrubbed: Scrubbed = serde_json::from_slice(&text).unwrap();
        assert!(scrubbed.held_data);
        let out = scrubbed.object.to_string();
        assert!(!out.contains(MARKER), "{out}");
        assert!(
            !out.contains("kapp.k14s.io") && !out.contains("cattle.io"),
            "{out}"
        );
        assert_eq!(
            scrubbed.object["metadata"]["annotations"],
            json!({"team": "payments"})
        );
        // And the scrub of operation results and other paths drops them too.
        let mut other = object.clone();
        let secret = crate::kinds::KindRef {
            group: String::new(),
            version: "v1".into(),
            kind: "Secret".into(),
            plural: "secrets".into(),
            namespaced: true,
        };
        crate::convert::scrub(&secret, &mut other);
        let out = other.to_string();
        assert!(!out.contains(MARKER), "{out}");
    }

    #[test]
    fn a_secret_without_data_holds_none_and_null_metadata_parts_are_accepted() {
        let text = br#"{"metadata":{"name":"plain","annotations":null,"labels":null}}"#;
        let scrubbed: Scrubbed = serde_json::from_slice(text).unwrap();
        assert!(!scrubbed.held_data);
        assert_eq!(scrubbed.object["metadata"]["name"], "plain");
        assert!(scrubbed.object["metadata"].get("annotations").is_none());
        assert_eq!(scrubbed.object["metadata"]["labels"], Value::Null);
    }

    #[test]
    fn lists_decode_items_and_continue_tokens() {
        let body = json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": { "resourceVersion": "77", "continue": "next-page" },
            "items": [applied_secret("41"), { "metadata": { "name": "other" } }],
        })
        .to_string();
        let page = decode_list(body.as_bytes()).unwrap();
        assert!(page.held_data);
        assert_eq!(page.items.len(), 2);
        assert_eq!(page.metadata.resource_version.as_deref(), Some("77"));
        assert_eq!(page.metadata.continue_.as_deref(), Some("next-page"));
        assert!(!Value::Array(page.items).to_string().contains(MARKER));
        let empty = decode_list(br#"{"metadata":{"resourceVersion":"5"},"items":null}"#).unwrap();
        assert!(empty.items.is_empty() && !empty.held_data);
    }

    #[test]
    fn watch_events_of_each_type_decode() {
        let line = |t: &str, object: Value| json!({ "type": t, "object": object }).to_string();
        let Some(Ok((Event::Applied(object), true))) =
            decode_event(line("ADDED", applied_secret("50")).as_bytes())
        else {
            panic!("ADDED")
        };
        assert!(!object.to_string().contains(MARKER));
        assert!(matches!(
            decode_event(line("MODIFIED", json!({ "metadata": { "name": "a" } })).as_bytes()),
            Some(Ok((Event::Applied(_), false)))
        ));
        assert!(matches!(
            decode_event(line("DELETED", applied_secret("51")).as_bytes()),
            Some(Ok((Event::Deleted(_), true)))
        ));
        assert!(matches!(
            decode_event(line("BOOKMARK", json!({ "metadata": { "resourceVersion": "60" } })).as_bytes()),
            Some(Ok((Event::Bookmark(rv), false))) if rv == "60"
        ));
        let gone = json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version: 1 (60)", "reason": "Expired", "code": 410 });
        assert!(matches!(
            decode_event(line("ERROR", gone).as_bytes()),
            Some(Ok((Event::Error(status), false))) if status.code == 410 && status.reason == "Expired"
        ));
        assert!(decode_event(b"  \r").is_none());
        assert!(matches!(
            decode_event(line("SURPRISE", json!({})).as_bytes()),
            Some(Err(e)) if e.to_string().contains("SURPRISE")
        ));
        assert!(matches!(decode_event(b"{\"type\":"), Some(Err(_))));
    }

    #[test]
    fn error_answers_become_their_status() {
        let forbidden = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "secrets is forbidden: User \"system:serviceaccount:a:b\" cannot list resource \"secrets\"",
            "reason": "Forbidden", "code": 403 })
        .to_string();
        let status = error_status(http::StatusCode::FORBIDDEN, forbidden.as_bytes());
        assert_eq!(status.code, 403);
        assert_eq!(status.reason, "Forbidden");
        assert!(
            status.message.contains("cannot list resource"),
            "{status:?}"
        );
        let status = error_status(http::StatusCode::GONE, b"expired continue token");
        assert_eq!(status.code, 410);
        assert_eq!(status.reason, "Gone");
        assert_eq!(status.message, "expired continue token");
        let status = error_status(http::StatusCode::BAD_GATEWAY, b"{}");
        assert_eq!(status.code, 502);
    }

    #[test]
    fn decoded_lines_are_zeroed_where_they_lay() {
        let mut buffer = WipedBuffer::default();
        let first = format!("{{\"secret\":\"{MARKER}\"}}\n");
        // Split across chunks, as the network delivers it.
        buffer.push(&first.as_bytes()[..7]);
        assert!(buffer.take_line(|_| ()).is_none());
        buffer.push(&first.as_bytes()[7..]);
        buffer.push(b"{\"next\":");
        let line = buffer.take_line(|line| line.to_vec()).unwrap();
        assert_eq!(line, first.trim_end().as_bytes());
        assert_eq!(buffer.pending(), 8);
        // The first line's bytes are zeroed in place; only the pending part is non-zero.
        let held = buffer.allocation();
        assert!(held[..first.len()].iter().all(|&b| b == 0), "{held:?}");
        assert_eq!(&held[first.len()..], b"{\"next\":");
        // Growing moves the pending bytes to the front and zeroes the rest.
        buffer.push(&[b'x'; 4096]);
        buffer.push(b"}\n");
        assert_eq!(buffer.take_line(|line| line.len()), Some(8 + 4096 + 1));
        assert_eq!(buffer.pending(), 0);
        buffer.push(MARKER.as_bytes());
        let all = buffer.take_all(|bytes| bytes.to_vec());
        assert_eq!(all, MARKER.as_bytes());
        assert_eq!(buffer.pending(), 0);
        assert!(buffer.allocation().is_empty());
    }

    #[test]
    fn chunks_are_zeroed_when_unique_and_counted_when_shared() {
        let mut buffer = WipedBuffer::default();
        let mut stats = ChunkStats::default();
        absorb(
            &mut buffer,
            Bytes::from(MARKER.as_bytes().to_vec()),
            &mut stats,
        );
        let shared = Bytes::from(MARKER.as_bytes().to_vec());
        absorb(&mut buffer, shared.clone(), &mut stats);
        assert_eq!(
            stats,
            ChunkStats {
                zeroed: 1,
                shared: 1
            }
        );
        assert_eq!(buffer.pending(), 2 * MARKER.len());
        assert_eq!(&shared[..], MARKER.as_bytes());
    }
}
