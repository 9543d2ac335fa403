//! The store releases its file when `close` returns, even when a write's caller was
//! cancelled while the write ran on its blocking thread (what aborting the hub's
//! maintenance task at shutdown does): a hub started next on the same data directory must
//! open it. No agent is involved.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use scale_agent_hub::store::{Store, StoreOp};

#[tokio::test]
async fn close_waits_for_a_write_whose_caller_went_away() {
    let dir = std::env::temp_dir().join(format!("scale-agent-store-close-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut store = Store::open(&dir).unwrap();
    // Large enough that the write is still running when its caller is dropped.
    let ops: Vec<StoreOp> = (0..20_000)
        .map(|i| StoreOp::PutMeta {
            key: format!("key-{i:06}"),
            value: "v".repeat(100),
        })
        .collect();
    // A zero timeout polls the commit once (which starts the write) and then drops it.
    let cancelled = tokio::time::timeout(Duration::ZERO, store.commit(ops)).await;
    assert!(
        cancelled.is_err(),
        "the write finished at once: make it larger"
    );
    store.close().await.unwrap();
    let reopened = Store::open(&dir);
    assert!(reopened.is_ok(), "{:?}", reopened.err());
    drop(reopened);
    std::fs::remove_dir_all(&dir).unwrap();
}
