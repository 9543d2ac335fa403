//! A full volume under the hub's data directory: a real tmpfs, mounted by the test (it runs
//! as root, as CI does), filled up while an agent streams. The hub must keep the stream,
//! hold its Acks (so the agent backs off), say so (`/readyz/store`, a metric), keep serving
//! reads, and, once space returns, commit everything by itself: after a restart nothing is
//! missing.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use common::*;
use scale_agent_proto::v1::{
    self as pb, agent_message::Kind as Msg, object_event::Type as EventType,
};

/// A tmpfs mounted for the test's lifetime.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs at {} was refused (this test needs root, as CI has): {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Fills the volume of `dir` with a file until the file system refuses more.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    for chunk in [1024 * 1024, 4096, 512] {
        let block = vec![0u8; chunk];
        while file.write_all(&block).is_ok() {}
    }
    path
}

/// A ConfigMap event with about 4 KB of data.
fn big_event(account: &str, name: &str, rv: u64) -> Msg {
    let Msg::Object(mut event) =
        cm_event(account, EventType::Applied, name, &rv.to_string(), "web")
    else {
        unreachable!()
    };
    let mut json: serde_json::Value = serde_json::from_slice(&event.object_json).unwrap();
    json["data"]["pad"] = serde_json::json!("x".repeat(4096));
    event.object_json = serde_json::to_vec(&json).unwrap();
    Msg::Object(event)
}

async fn store_status(api: &Api) -> (u16, String) {
    get(api, "/readyz/store").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_volume_holds_acks_keeps_reads_and_recovers_with_nothing_lost() {
    let pki = Pki::new();
    let dir = data_dir("full-volume");
    let tmpfs = Tmpfs::mount(&dir, "16m");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let api = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-1").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    a.snapshot("prod", &[("one", "5")], "10").await;
    a.synced().await;
    assert_eq!(store_status(&api).await.0, 200);

    let filler = fill(&tmpfs.0);
    let mut rv = 100;
    let mut names = vec!["one".to_string()];
    // Until a commit fails: the hub says so.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        for _ in 0..50 {
            rv += 1;
            let name = format!("cm-{rv}");
            a.send(big_event("prod", &name, rv)).await;
            names.push(name);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (code, body) = store_status(&api).await;
        if code == 503 {
            assert!(
                body.contains(&dir.display().to_string()),
                "the reason names the data directory: {body}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store never failed to commit on a full volume"
        );
    }
    let (_, metrics) = get(&api, "/metrics").await;
    assert!(
        metrics.contains("scale_agent_hub_store_failing 1"),
        "{metrics}"
    );
    // More events while the store fails: applied to the cache, their Acks held, the stream
    // kept.
    for _ in 0..20 {
        rv += 1;
        let name = format!("cm-{rv}");
        a.send(big_event("prod", &name, rv)).await;
        names.push(name);
    }
    a.send(Msg::Heartbeat(pb::Heartbeat {
        sent_at_unix_millis: 0,
    }))
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    a.pump_ready()
        .expect("the stream is kept while the store fails");
    assert!(
        a.acked < a.seq,
        "Acks are held while the store cannot commit (acked {}, sent {})",
        a.acked,
        a.seq
    );
    // Reads are served from memory meanwhile.
    let mut served = object_names(&hub, "prod/objects?kind=configmaps").await;
    served.sort();
    names.sort();
    assert_eq!(served, names);

    // Space returns: the hub commits by itself and acknowledges everything.
    std::fs::remove_file(&filler).unwrap();
    a.synced().await;
    wait_for("the store to report it commits again", async || {
        store_status(&api).await.0 == 200
    })
    .await;
    drop(a);
    hub.shutdown().await.unwrap();

    // Nothing was lost.
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let mut stored = object_names(&hub, "prod/objects?kind=configmaps").await;
    stored.sort();
    assert_eq!(stored.len(), names.len());
    assert_eq!(stored, names);
    hub.shutdown().await.unwrap();
    drop(tmpfs);
}
