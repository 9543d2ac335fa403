//! The control plane the demo runs on, and the Scale Agent CRDs installed into it.
//!
//! The control plane runs KWOK (`ControlPlaneOptions::with_kwok`): kube-scheduler binds pods
//! to KWOK's fake nodes and KWOK reports them Running and Ready, so Deployments become
//! Available and `kubectl rollout status` through the hub finishes. No container runs
//! anywhere: the agent pods' work is done by the local processes of [`super::agents`], and
//! the narration says so wherever a fake pod shows up.

use std::{io::Write, path::Path};

use kube::Client;

use super::support::{line, show_admin_kubectl};
use crate::{
    ControlPlane, ControlPlaneOptions, KUBERNETES_VERSION, KWOK_VERSION, crds, error::Result, kwok,
};

/// Starts the control plane in `run_dir` (replacing anything there) and narrates its
/// processes.
pub(super) async fn start_control_plane(
    run_dir: &Path,
    out: &mut dyn Write,
) -> Result<ControlPlane> {
    line(
        out,
        format!(
            "==> Starting a Kubernetes {KUBERNETES_VERSION} control plane in {}, with KWOK {KWOK_VERSION} as the kubelet of {} fake nodes",
            run_dir.display(),
            kwok::NODES.len()
        ),
    );
    let control_plane = ControlPlane::start(ControlPlaneOptions {
        run_dir: Some(run_dir.to_path_buf()),
        ..ControlPlaneOptions::default().with_kwok()
    })
    .await?;
    line(out, format!("    {}", control_plane.startup()));
    for (name, pid) in control_plane.pids() {
        line(out, format!("    {name:<24} pid {pid}"));
    }
    line(out, format!("    API server: {}", control_plane.server()));
    line(
        out,
        format!(
            "    KWOK fakes pods: the ones bound to {} are reported Running and Ready, but no container runs (the Scale Agent pods' work is done by local processes below)",
            kwok::NODES.join(" and ")
        ),
    );
    Ok(control_plane)
}

/// Installs the CRDs from `manifests/crds`, shows them with the real kubectl, and returns
/// the admin client.
pub(super) async fn install_crds(
    control_plane: &ControlPlane,
    out: &mut dyn Write,
) -> Result<Client> {
    line(
        out,
        "==> Installing the Scale Agent CRDs from manifests/crds".into(),
    );
    let client = control_plane.client().await?;
    let definitions = crds::read_crds(&crds::manifests_dir())?;
    for name in crds::install(&client, &definitions).await? {
        line(
            out,
            format!("    customresourcedefinition/{name} established"),
        );
    }
    line(
        out,
        "==> kubectl get crds (the real kubectl, built with the control plane)".into(),
    );
    show_admin_kubectl(control_plane, out, &["get", "crds"])?;
    Ok(client)
}

/// Stops the control plane's processes (in reverse start order) and removes its run
/// directory.
pub(super) fn stop_control_plane(control_plane: ControlPlane, out: &mut dyn Write) {
    let mut names: Vec<&str> = control_plane
        .pids()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    names.reverse();
    let names = match names.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => "the control plane".to_string(),
    };
    line(out, format!("==> Stopping {names}"));
    drop(control_plane);
    line(out, "    stopped; nothing left running.".into());
}
