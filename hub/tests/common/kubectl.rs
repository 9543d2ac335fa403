//! Real kubectl against the hub's proxy: the pinned release the control-plane harness built
//! (`~/.cache/scale-agent/control-plane/<version>/bin/kubectl`, `make control-plane`), or
//! `$KUBECTL`. Requests it sends that reach a fake agent are answered by the test while
//! kubectl waits.

use std::{
    path::{Path, PathBuf},
    process::Output,
};

use super::FakeAgent;

/// The kubectl binary: `$KUBECTL`, else the control-plane harness's.
pub fn kubectl_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("KUBECTL") {
        return PathBuf::from(path);
    }
    let cache = PathBuf::from(std::env::var_os("HOME").expect("HOME"))
        .join(".cache/scale-agent/control-plane");
    let found = std::fs::read_dir(&cache)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|version| version.path().join("bin/kubectl"))
        .find(|path| path.exists());
    found.unwrap_or_else(|| {
        panic!(
            "no kubectl: set KUBECTL or build the control plane (`make control-plane`, which \
             puts one under {})",
            cache.display()
        )
    })
}

/// Runs `kubectl --kubeconfig <kubeconfig> <args>` to the end (off the runtime's workers).
pub async fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    let mut command = std::process::Command::new(kubectl_binary());
    command
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .env_remove("KUBECONFIG");
    tokio::task::spawn_blocking(move || command.output().expect("running kubectl"))
        .await
        .unwrap()
}

/// `kubectl get --raw <path>`, whose one request `agent` answers 200 with `body`; returns
/// kubectl's standard output.
pub async fn kubectl_raw_answered(
    kubeconfig: &Path,
    agent: &mut FakeAgent,
    path: &str,
    body: &[u8],
) -> String {
    let run = {
        let (kubeconfig, path) = (kubeconfig.to_path_buf(), path.to_string());
        tokio::spawn(async move { kubectl(&kubeconfig, &["get", "--raw", &path]).await })
    };
    let (exchange, head) = agent.request().await;
    assert_eq!(head.path_and_query, path, "{head:?}");
    agent
        .respond(exchange, 200, &[("content-type", "application/json")], body)
        .await;
    let output = run.await.unwrap();
    assert!(
        output.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `kubectl get --raw <path>` that the hub refuses itself; returns kubectl's standard error.
pub async fn kubectl_raw_refused(kubeconfig: &Path, path: &str) -> String {
    let output = kubectl(kubeconfig, &["get", "--raw", path]).await;
    assert!(
        !output.status.success(),
        "kubectl succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A kubeconfig for `server` (a proxy URL) trusting `ca_pem`, whose user is `user` (the YAML
/// of a kubeconfig user: `{token: ...}` or `{exec: ...}`).
pub fn write_kubeconfig(path: &Path, server: &str, ca_pem: &str, user: &serde_json::Value) {
    use base64::Engine as _;
    let config = serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {
            "server": server,
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca_pem),
        }}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    });
    std::fs::write(path, serde_json::to_string(&config).unwrap()).unwrap();
}
