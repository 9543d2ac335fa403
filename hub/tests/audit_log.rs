//! The audit file (`--audit-log-path`, issue 31): a request through the proxy is one JSON
//! line in the file, with the fields of the log's audit line and the request id the client
//! saw as `Audit-Id` and the agent was handed for the API server; the REST API's operations
//! land there too. The hub runs in this process on HTTPS with a fake agent speaking the real
//! protocol; the test installs the layer the binary installs for the flag
//! (`scale_agent_hub::audit_log::layer`), as the process's only subscriber.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use scale_agent_hub::audit_log::{AuditLogOptions, backup};
use serde_json::Value;
use tracing_subscriber::layer::SubscriberExt as _;

/// The file's lines, parsed (every one must be JSON).
fn lines_of(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[tokio::test]
async fn a_proxied_request_is_a_line_of_the_audit_file_with_its_audit_id() {
    let pki = Pki::new();
    let dir = data_dir("audit-log");
    std::fs::create_dir_all(&dir).unwrap();
    let options = AuditLogOptions {
        path: dir.join("audit.log"),
        // About five lines of some 400 bytes: this test's lines rotate the file once at
        // least, and the backups hold them all.
        max_bytes: 2048,
        max_backups: 3,
    };
    let subscriber = tracing_subscriber::registry()
        .with(scale_agent_hub::audit_log::layer(options.clone()).unwrap());
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H1);
    let admin = admin_token(&dir);
    let mut agent = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    agent.register("prod", "https://10.0.0.1:6443").await;
    let token = kubeconfig_token(&issue_kubeconfig(&http, &admin, "prod", "alice").await);

    let mut ids = Vec::new();
    for n in 0..6 {
        let path = format!("/clusters/prod/api/v1/namespaces/team-{n}/services");
        let (head, reply) = proxied_get(
            &http,
            &mut agent,
            &path,
            &token,
            br#"{"kind":"ServiceList","apiVersion":"v1","items":[]}"#,
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let audit_id = reply.header("audit-id").expect("an Audit-Id header");
        assert_eq!(head.audit_id, audit_id, "the agent is handed the same id");
        ids.push((n, audit_id));
    }

    // Every request is one line, written when its answer ended; the newest in the file,
    // the older ones in the rotated files.
    let all = || -> Vec<Value> {
        let mut all = Vec::new();
        for n in (1..=options.max_backups).rev() {
            all.extend(lines_of(&backup(&options.path, n)));
        }
        all.extend(lines_of(&options.path));
        all
    };
    wait_for("every request's audit line in the file", async || {
        let all = all();
        ids.iter()
            .all(|(_, id)| all.iter().any(|l| l["fields"]["request_id"] == id.as_str()))
    })
    .await;
    let all = all();
    for (n, id) in &ids {
        let line = all
            .iter()
            .find(|l| l["fields"]["request_id"] == id.as_str())
            .unwrap();
        assert_eq!(line["target"], "audit", "{line}");
        let fields = &line["fields"];
        assert_eq!(fields["message"], "proxied read", "{line}");
        assert_eq!(fields["who"], "alice", "{line}");
        assert_eq!(fields["token_kind"], "proxy", "{line}");
        assert_eq!(fields["person"], true, "{line}");
        assert_eq!(fields["account"], "prod", "{line}");
        assert_eq!(fields["verb"], "list", "{line}");
        assert_eq!(fields["object"], format!("services/team-{n}"), "{line}");
        assert_eq!(fields["code"], 200, "{line}");
        assert_eq!(fields["served"], "tunnel", "{line}");
        assert!(fields["bytes"].as_u64().is_some_and(|b| b > 0), "{line}");
        assert!(fields["duration_ms"].is_u64(), "{line}");
    }
    assert!(
        backup(&options.path, 1).exists(),
        "2 KiB holds fewer than six lines: rotated"
    );
    assert!(
        !backup(&options.path, options.max_backups + 1).exists(),
        "no more than max_backups old files"
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&options.path).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "audit lines name people");
    drop(agent);
    hub.shutdown().await.unwrap();
}
