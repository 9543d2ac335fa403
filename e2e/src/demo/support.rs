//! What every step of the demo uses: narration, waiting, server-side apply with the admin
//! client, and running the admin's kubectl.

use std::{
    io::Write,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use kube::{Api, Client};
use serde_json::{Value, json};

use super::{NAMESPACE, WAIT};
use crate::{
    ControlPlane, crds,
    error::{Error, Result, io_err},
    http::Call,
    process::ManagedProcess,
};

/// Writes one line of narration at once (the demo is watched as it runs).
pub(super) fn line(out: &mut dyn Write, text: String) {
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// Writes `text` line by line, each indented by `indent`, at most `max_lines` of them (the
/// rest counted in a last line).
pub(super) fn lines(out: &mut dyn Write, indent: &str, text: &str, max_lines: usize) {
    let all: Vec<&str> = text.lines().collect();
    for text in all.iter().take(max_lines) {
        line(out, format!("{indent}{text}"));
    }
    if all.len() > max_lines {
        line(
            out,
            format!("{indent}... ({} more lines)", all.len() - max_lines),
        );
    }
}

/// A JSON value as text: strings without their quotes.
pub(super) fn text(value: &Value) -> String {
    value
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| value.to_string())
}

/// The error of a command that ran but failed: what it was, its exit code and its output,
/// so the demo's "Failed:" line says everything.
pub(super) fn command_failed(what: &str, code: Option<i32>, stdout: &str, stderr: &str) -> Error {
    let code = code.map_or_else(|| "a signal".to_string(), |c| c.to_string());
    let output: Vec<&str> = [stdout.trim_end(), stderr.trim_end()]
        .into_iter()
        .filter(|o| !o.is_empty())
        .collect();
    Error::Io {
        action: format!("run {what}"),
        source: std::io::Error::other(format!("exit {code}\n{}", output.join("\n"))),
    }
}

/// Runs the admin's kubectl (the control plane's admin kubeconfig) with `args`, narrated as
/// `==> kubectl <args>` followed by its output.
pub(super) fn run_admin_kubectl(
    control_plane: &ControlPlane,
    out: &mut dyn Write,
    args: &[&str],
) -> Result<()> {
    line(out, format!("==> kubectl {}", args.join(" ")));
    show_admin_kubectl(control_plane, out, args)
}

/// Runs the admin's kubectl with `args` and writes its output (stdout, then stderr), each
/// line indented.
pub(super) fn show_admin_kubectl(
    control_plane: &ControlPlane,
    out: &mut dyn Write,
    args: &[&str],
) -> Result<()> {
    let kubectl = control_plane.binaries().kubectl();
    let output = Command::new(&kubectl)
        .arg(format!(
            "--kubeconfig={}",
            control_plane.kubeconfig_path().display()
        ))
        .args(args)
        .output()
        .map_err(io_err(format!("run {}", kubectl.display())))?;
    for text in String::from_utf8_lossy(&output.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&output.stderr).lines())
    {
        line(out, format!("    {text}"));
    }
    Ok(())
}

/// Writes `contents` to `path`.
pub(super) fn write_file(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).map_err(io_err(format!("write {}", path.display())))
}

pub(super) async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    apply_object(
        client,
        &json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name } }),
    )
    .await
}

/// A Secret `name` in [`NAMESPACE`] with `data` (key, text value).
pub(super) async fn create_secret(
    client: &Client,
    name: &str,
    data: &[(&str, &str)],
) -> Result<()> {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
        .collect();
    apply_object(
        client,
        &json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": name, "namespace": NAMESPACE },
            "stringData": data,
        }),
    )
    .await
}

/// Server-side applies one object (built-in kinds only) with the admin client.
pub(super) async fn apply_object(client: &Client, object: &Value) -> Result<()> {
    use kube::{
        api::{DynamicObject, Patch, PatchParams},
        core::{ApiResource, GroupVersionKind},
    };
    let (group, version) = match object["apiVersion"]
        .as_str()
        .unwrap_or("v1")
        .split_once('/')
    {
        Some((group, version)) => (group.to_owned(), version.to_owned()),
        None => (
            String::new(),
            object["apiVersion"].as_str().unwrap_or("v1").to_owned(),
        ),
    };
    let kind = object["kind"].as_str().unwrap_or_default();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(&group, &version, kind));
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        name,
        &PatchParams::apply(crds::FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await?;
    Ok(())
}

/// Sends `call` until it answers 200 ([`crate::process::wait_ready`]), failing early when `process` exits and
/// after [`WAIT`] with the end of its log.
pub(super) async fn wait_ready(process: &mut ManagedProcess, call: Call) -> Result<()> {
    let (component, log) = (process.name(), process.log().to_path_buf());
    crate::process::wait_ready(process, component, &log, WAIT, || {
        let call = call.clone();
        async move { call.send().await.is_ok_and(|r| r.status == 200) }
    })
    .await
}

/// Polls `check` until it returns `Some`, or fails after [`WAIT`] naming `what`.
pub(super) async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                secs: WAIT.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Returns on Ctrl-C or SIGTERM.
pub(super) async fn wait_for_shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_output_is_abridged_with_a_count() {
        let mut out = Vec::new();
        lines(&mut out, "  ", "a\nb\nc\nd", 2);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "  a\n  b\n  ... (2 more lines)\n"
        );
        let mut out = Vec::new();
        lines(&mut out, "", "a\nb", 2);
        assert_eq!(String::from_utf8_lossy(&out), "a\nb\n");
    }
}
