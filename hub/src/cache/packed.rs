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

use std::{cell::RefCell, fmt, sync::Arc};

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

/// An object's JSON, packed. Empty when the object has no JSON (kept truncated). Equal
/// JSON packs to equal bytes (zstd is deterministic for one level and version), so
/// comparing packed objects compares their JSON.
#[derive(Clone, PartialEq, Eq)]
pub struct PackedJson(Arc<[u8]>);

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
            Some(packed) => PackedJson(Arc::from(packed)),
            // Only when zstd cannot allocate its context: keep the JSON as a raw frame.
            None => PackedJson(Arc::from(raw_frame(json))),
        }
    }

    /// Takes bytes [`PackedJson::packed`] gave (from the store), checking that they unpack.
    pub fn from_packed(bytes: &[u8]) -> Result<PackedJson, Corrupt> {
        let packed = PackedJson(Arc::from(bytes));
        packed.unpack()?;
        Ok(packed)
    }

    /// The packed bytes (what the store keeps).
    pub fn packed(&self) -> &[u8] {
        &self.0
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
        let size = match zstd::zstd_safe::get_frame_content_size(&self.0) {
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
                .decompress(&self.0, size)
                .map_err(|e| Corrupt(e.to_string()))?;
            if json.len() != size {
                return Err(Corrupt(format!("{} of {size} bytes", json.len())));
            }
            Ok(json)
        })
    }
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
            let frame = PackedJson(Arc::from(raw_frame(&data)));
            assert_eq!(frame.unpack().unwrap(), data, "{size} bytes");
        }
    }
}
