//! `kubectl get -w` (a Table list, then a watch with `as=Table` from its resourceVersion)
//! through the proxy and directly at the same time: the same lines for the objects and for
//! a change made while both watch, and the API server's audit log shows that the proxied
//! list and watch never reached it.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use scale_agent_e2e::{kubectl::Kubectl, proxy_stack::audited_control_plane};
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use super::{KUBECTL_TIMEOUT, Setup, WAIT, args, ensure_ok};

/// A `kubectl get -w` running in the background, its output collected as it comes.
struct Watching {
    child: tokio::process::Child,
    stdout: Arc<Mutex<String>>,
}

impl Watching {
    fn start(
        binary: &Path,
        home: &Path,
        kubeconfig: &Path,
        command: &[String],
    ) -> anyhow::Result<Watching> {
        std::fs::create_dir_all(home)?;
        let mut child = tokio::process::Command::new(binary)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(command)
            .env("HOME", home)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = Arc::new(Mutex::new(String::new()));
        let pipe = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let collected = stdout.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(mut text) = collected.lock() {
                    text.push_str(&line);
                    text.push('\n');
                }
            }
        });
        Ok(Watching { child, stdout })
    }

    fn output(&self) -> String {
        self.stdout.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Waits until the output has `lines` lines.
    async fn wait_lines(&self, lines: usize, what: &str) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let output = self.output();
            if output.lines().count() >= lines {
                return Ok(output);
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{what}: {} of {lines} lines after {WAIT:?}:\n{output}",
                output.lines().count()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn stop(mut self) -> String {
        let _ = self.child.kill().await;
        self.output()
    }
}

/// The lines with their last column (AGE: each side prints it when its event arrives, and
/// ages under two minutes tick by the second) left out.
fn without_age(output: &str) -> Vec<String> {
    output
        .lines()
        .map(|line| {
            let mut fields: Vec<&str> = line.split_whitespace().collect();
            fields.pop();
            fields.join(" ")
        })
        .collect()
}

/// Watches (list, then watch) of the kubectl user as the API server's audit log has them,
/// after `skip` events: `(total, matching)`.
fn kubectl_watches(
    user: &str,
    resource: &str,
    skip: usize,
) -> anyhow::Result<(usize, Vec<String>)> {
    let events = audited_control_plane()?.audit_events()?;
    let total = events.len();
    let seen = events
        .into_iter()
        .skip(skip)
        .filter(|e| e.user.username == user && e.user_agent.starts_with("kubectl"))
        .filter(|e| matches!(e.verb.as_str(), "list" | "watch" | "get"))
        .filter(|e| {
            e.request_uri
                .split('?')
                .next()
                .unwrap_or_default()
                .ends_with(resource)
        })
        // A watch is recorded when it starts and again when it ends: one line per request.
        .map(|e| {
            format!(
                "{} {} ({}) {}",
                e.verb, e.request_uri, e.user_agent, e.audit_id
            )
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    Ok((total, seen))
}

/// `kubectl get configmaps -w` with `binary`, through the proxy and directly.
pub async fn kubectl_get_watch_equal(
    setup: &Setup,
    version: &str,
    binary: &Path,
) -> anyhow::Result<()> {
    let stack = &setup.stack;
    let ns = stack.namespace.as_str();
    let command = args(&["get", "configmaps", "-n", ns, "-l", &setup.label, "-w"]);
    let home = |side: &str| stack.dir.join(format!("home-watch-{side}-{version}"));
    // The header and the five seeded ConfigMaps.
    let initial_lines = 6;
    let (before, _) = kubectl_watches(&stack.user, "/configmaps", 0)?;
    let proxied = Watching::start(binary, &home("proxy"), &stack.proxied, &command)?;
    proxied
        .wait_lines(initial_lines, "the proxied watch's list")
        .await?;
    // Give the watch request itself time to be made (it follows the list at once).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mid, reached) = kubectl_watches(&stack.user, "/configmaps", before)?;
    anyhow::ensure!(
        reached.is_empty(),
        "kubectl {version}: the proxied `get -w` reached the API server:\n{}",
        reached.join("\n")
    );
    let direct = Watching::start(binary, &home("direct"), &stack.direct, &command)?;
    direct
        .wait_lines(initial_lines, "the direct watch's list")
        .await?;
    // The control: the same filter sees the direct list and watch.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, seen) = kubectl_watches(&stack.user, "/configmaps", mid)?;
        if seen.iter().any(|s| s.starts_with("watch ")) {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "kubectl {version}: the audit log never showed the direct watch: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A change while both watch: a ConfigMap gains two keys.
    let admin = Kubectl::new(
        stack_binaries_kubectl()?,
        stack.dir.join("home-admin-watch"),
    );
    let keys = json!({ "data": { format!("w{version}a"): "1", format!("w{version}b"): "2" } });
    ensure_ok(
        "change a ConfigMap",
        &admin
            .run(
                audited_control_plane()?.kubeconfig_path(),
                &args(&[
                    "patch",
                    "configmap",
                    "settings-1",
                    "-n",
                    ns,
                    "--type=merge",
                    "-p",
                    &keys.to_string(),
                ]),
                None,
                KUBECTL_TIMEOUT,
            )
            .await?,
    )?;
    proxied
        .wait_lines(initial_lines + 1, "the proxied watch's change")
        .await?;
    direct
        .wait_lines(initial_lines + 1, "the direct watch's change")
        .await?;
    let (proxied, direct) = (proxied.stop().await, direct.stop().await);
    let (_, reached) = kubectl_watches(&stack.user, "/configmaps", before)?;
    anyhow::ensure!(
        reached.iter().filter(|s| s.starts_with("watch ")).count() == 1,
        "kubectl {version}: one watch (the direct one) should have reached the API server:\n{}",
        reached.join("\n")
    );
    let changed = proxied
        .lines()
        .nth(initial_lines)
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(
        changed.starts_with("settings-1") && changed.split_whitespace().nth(1).is_some(),
        "kubectl {version}: the proxied watch's change line: {changed:?}\n{proxied}"
    );
    anyhow::ensure!(
        without_age(&proxied) == without_age(&direct),
        "kubectl {version} get -w: the proxy printed\n{proxied}\nthe API server\n{direct}"
    );
    Ok(())
}

fn stack_binaries_kubectl() -> anyhow::Result<PathBuf> {
    Ok(audited_control_plane()?.binaries().kubectl())
}
