//! Decoding Secrets' metadata never copies the last-applied annotation's value: the bytes
//! allocated while decoding a LIST or a watch event whose annotations hold megabytes of
//! Secret data stay far below the size of that data. A counting allocator (this test
//! binary's own) measures it, and a control decode into `serde_json::Value` shows it counts.
#![allow(unsafe_code)] // A GlobalAlloc is unsafe by definition.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
};

use scale_agent::{
    convert::LAST_APPLIED,
    watch::{Event, secrets as secret_watch},
};
use serde_json::{Value, json};

/// Counts the bytes allocated by the current thread while counting is on.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

fn count(size: usize) {
    // `try_with`: thread-local storage may be gone while a thread exits.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCATED.try_with(|total| total.set(total.get() + size));
        }
    });
}

// SAFETY: forwards to `System` with the caller's arguments; counting touches no memory of
// the blocks.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded as given.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as given.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: forwarded as given.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated by this thread while `f` runs.
fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    ALLOCATED.with(|total| total.set(0));
    COUNTING.with(|on| on.set(true));
    let out = f();
    COUNTING.with(|on| on.set(false));
    (out, ALLOCATED.with(Cell::get))
}

/// A metadata-only Secret whose last-applied annotation holds `size` bytes of data.
fn applied_secret(name: &str, size: usize) -> Value {
    let last_applied = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name },
        "stringData": { "blob": "s".repeat(size) },
    })
    .to_string();
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {
            "name": name, "namespace": "web", "uid": format!("uid-{name}"), "resourceVersion": "7",
            "labels": { "app": "db" },
            "annotations": { LAST_APPLIED: last_applied },
        },
    })
}

const DATA: usize = 1 << 20;
/// What decoding may allocate besides the data: the small metadata values.
const BUDGET: usize = 64 << 10;

#[test]
fn a_watch_event_is_decoded_without_copying_the_annotation() {
    let line = json!({ "type": "MODIFIED", "object": applied_secret("db", DATA) }).to_string();
    let (decoded, allocated) = allocated_by(|| secret_watch::decode_event(line.as_bytes()));
    let Some(Ok((Event::Applied(object), true))) = decoded else {
        panic!("an Applied event that held data")
    };
    assert_eq!(object["metadata"]["name"], "db");
    assert!(
        allocated < BUDGET,
        "{allocated} bytes allocated to decode an event with {DATA} bytes of Secret data"
    );
    // Control: the counter sees a decode that does copy the annotation.
    let (_, copied) = allocated_by(|| serde_json::from_slice::<Value>(line.as_bytes()));
    assert!(
        copied > DATA,
        "the control decode allocated only {copied} bytes"
    );
}

#[test]
fn a_list_is_decoded_without_copying_the_annotations() {
    let items: Vec<Value> = (0..8)
        .map(|i| applied_secret(&format!("s{i}"), DATA / 8))
        .collect();
    let body = json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": { "resourceVersion": "9" },
        "items": items,
    })
    .to_string();
    let (page, allocated) = allocated_by(|| secret_watch::decode_list(body.as_bytes()));
    let page = page.expect("a list");
    assert_eq!(page.items.len(), 8);
    assert!(page.held_data);
    assert!(
        allocated < BUDGET,
        "{allocated} bytes allocated to decode a list with {DATA} bytes of Secret data"
    );
}
