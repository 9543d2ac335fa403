//! The replicas' secret rotates without a restart (issue 28, F25): two replicas, each
//! reading its own copy of `--replica-secret-file` (two pods, whose mounted Secret the
//! kubelet updates at different times), keep forwarding an account's requests to its owner
//! while one has the new secret and the other the old, in either order; once the overlap
//! has passed, the retired secrets open nothing on the internal routes.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use common::*;
use scale_agent_hub::{
    RunningHub,
    owners::{OwnershipSource, directory::Directory, forward::ReplicaSecret},
};
use scale_agent_proto::v1::account_assignment::Role;

/// How long a replica still accepts (and offers) the previous secret in this test.
const OVERLAP: Duration = Duration::from_secs(3);
/// How often the replicas read their secret file in this test.
const RELOAD: Duration = Duration::from_millis(100);

struct Replica {
    hub: RunningHub,
    dir: PathBuf,
    http: Https,
    admin: String,
    secret_file: PathBuf,
}

async fn replica(pki: &Pki, directory: &Arc<Directory>, name: &str, secret: &str) -> Replica {
    let dir = data_dir(&format!("secret-rotation-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let secret_file = dir.join("replica-secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let port = free_port();
    let hub = start_hub(pki, &dir, |c| {
        serve_https(pki, c);
        c.listeners.http_addr = format!("127.0.0.1:{port}").parse().unwrap();
        c.listeners.tls_reload_interval = RELOAD;
        c.replicas.id = name.to_string();
        c.replicas.address = Some(format!("https://localhost:{port}"));
        c.replicas.secret = Some(ReplicaSecret::read(&secret_file).unwrap());
        c.replicas.secret_overlap = OVERLAP;
        c.replicas.ownership = OwnershipSource::Directory(directory.clone());
    })
    .await;
    let http = Https::for_hub(pki, &hub, Proto::H1);
    let admin = admin_token(&dir);
    Replica {
        hub,
        dir,
        http,
        admin,
        secret_file,
    }
}

fn rotate(file: &Path, secret: &str) {
    std::fs::write(file, format!("{secret}\n")).unwrap();
}

/// The account asked on `b`, which owns nothing: answered by its owner `a` through the
/// internal channel, or the forwarding's refusal.
async fn forwarded(b: &Replica) -> Reply {
    b.http.get("/api/v1/accounts/prod", Some(&b.admin)).await
}

async fn assert_forwarded(b: &Replica, when: &str) {
    let reply = forwarded(b).await;
    assert_eq!(reply.status, 200, "{when}: {}", reply.text());
    assert_eq!(
        reply.json()["streaming"]["replica"],
        "pod-x",
        "{when}: {}",
        reply.text()
    );
}

/// The status `replica`'s internal routes answer to `secret` as the bearer token.
async fn internal_status(replica: &Replica, secret: &str) -> u16 {
    replica
        .http
        .get("/internal/api/v1/agents", Some(secret))
        .await
        .status
}

#[tokio::test]
async fn replicas_keep_forwarding_through_a_secret_rotation_in_either_order() {
    let old = "old-replica-secret-0123456789abcdef";
    let new = "new-replica-secret-0123456789abcdef";
    let newer = "newer-replica-secret-0123456789abcdef";
    let pki = Pki::new();
    let directory = Directory::new();
    let a = replica(&pki, &directory, "hub-a", old).await;
    let b = replica(&pki, &directory, "hub-b", old).await;
    let mut x = tunnel_agent(&a.hub, &pki, "agent.test", "pod-x").await;
    let first = x.register("prod", "https://10.0.0.1:6443").await;
    if role(&first) != Role::Streaming {
        assert_eq!(role(&x.assignment().await), Role::Streaming);
    }
    assert_forwarded(&b, "before the rotation").await;
    assert_eq!(internal_status(&a, "not-the-secret").await, 401);

    // Rotation 1, the owner first: hub-b still sends the old secret, which hub-a accepts
    // for the overlap.
    rotate(&a.secret_file, new);
    wait_for("hub-a to read the new secret", async || {
        internal_status(&a, new).await == 200
    })
    .await;
    assert_eq!(internal_status(&a, old).await, 200, "old still accepted");
    assert_forwarded(&b, "hub-a rotated, hub-b not yet").await;
    rotate(&b.secret_file, new);
    wait_for("hub-b to read the new secret", async || {
        internal_status(&b, new).await == 200
    })
    .await;
    assert_forwarded(&b, "both rotated").await;

    // Rotation 2, the forwarding replica first: hub-b sends the newer secret and offers
    // the previous one beside it, which hub-a (not rotated yet) accepts.
    rotate(&b.secret_file, newer);
    wait_for("hub-b to read the newer secret", async || {
        internal_status(&b, newer).await == 200
    })
    .await;
    assert_eq!(
        internal_status(&a, newer).await,
        401,
        "hub-a has not seen it"
    );
    assert_forwarded(&b, "hub-b rotated again, hub-a not yet").await;
    rotate(&a.secret_file, newer);
    wait_for("hub-a to read the newer secret", async || {
        internal_status(&a, newer).await == 200
    })
    .await;
    assert_forwarded(&b, "both rotated again").await;

    // Past the overlap, the retired secrets open nothing; forwarding goes on.
    tokio::time::sleep(OVERLAP + Duration::from_millis(500)).await;
    for retired in [old, new] {
        assert_eq!(internal_status(&a, retired).await, 401);
        assert_eq!(internal_status(&b, retired).await, 401);
    }
    assert_forwarded(&b, "after the overlap").await;

    // A replica that never sees the rotation is cut off after the overlap: hub-a rotates
    // alone, hub-b keeps sending `newer`.
    let lone = "lone-replica-secret-0123456789abcdef";
    rotate(&a.secret_file, lone);
    wait_for("hub-a to read the lone secret", async || {
        internal_status(&a, lone).await == 200
    })
    .await;
    assert_forwarded(&b, "within the overlap").await;
    tokio::time::sleep(OVERLAP + Duration::from_millis(500)).await;
    let refused = forwarded(&b).await;
    assert_ne!(refused.status, 200, "{}", refused.text());
    assert!(
        refused.text().contains("replica-secret-file"),
        "{}: {}",
        refused.status,
        refused.text()
    );

    drop(x);
    for r in [a, b] {
        let _ = r.hub.shutdown().await;
        let _ = std::fs::remove_dir_all(&r.dir);
    }
}
