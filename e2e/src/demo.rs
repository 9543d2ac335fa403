//! `make demo`: a local Scale Agent system on a real control plane, explained as it starts.
//!
//! Today it starts the control plane and installs the CRDs; later stages (operator, hub,
//! agents, operations) are added here as they land.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::Command,
};

use crate::{
    ControlPlane, ControlPlaneOptions, KUBERNETES_VERSION, crds,
    error::{Result, io_err},
};

/// What the demo does and where.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Where the demo keeps its cluster (certificates, kubeconfig, logs, etcd data).
    pub run_dir: PathBuf,
    /// Stop everything right after setting up, instead of waiting for Ctrl-C.
    pub once: bool,
}

/// The default place for the demo's cluster: tmpfs, so etcd writes to memory.
pub fn default_run_dir() -> PathBuf {
    if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm/scale-agent-demo")
    } else {
        std::env::temp_dir().join("scale-agent-demo")
    }
}

/// Runs the demo, narrating to `out`.
pub async fn run(options: DemoOptions, out: &mut impl Write) -> Result<()> {
    let say = |out: &mut dyn Write, line: String| {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    say(
        out,
        format!(
            "==> Starting a Kubernetes {KUBERNETES_VERSION} control plane in {}",
            options.run_dir.display()
        ),
    );
    let control_plane = ControlPlane::start(ControlPlaneOptions {
        run_dir: Some(options.run_dir.clone()),
        ..ControlPlaneOptions::default().with_controller_manager()
    })
    .await?;
    say(out, format!("    {}", control_plane.startup()));
    for (name, pid) in control_plane.pids() {
        say(out, format!("    {name:<24} pid {pid}"));
    }
    say(out, format!("    API server: {}", control_plane.server()));

    say(
        out,
        "==> Installing the Scale Agent CRDs from manifests/crds".into(),
    );
    let client = control_plane.client().await?;
    let definitions = crds::read_crds(&crds::manifests_dir())?;
    for name in crds::install(&client, &definitions).await? {
        say(
            out,
            format!("    customresourcedefinition/{name} established"),
        );
    }

    let kubectl = control_plane.binaries().kubectl();
    let kubeconfig = control_plane.kubeconfig_path();
    say(
        out,
        "==> kubectl get crds (the real kubectl, built with the control plane)".into(),
    );
    let listing = Command::new(&kubectl)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["get", "crds"])
        .output()
        .map_err(io_err(format!("run {}", kubectl.display())))?;
    for line in String::from_utf8_lossy(&listing.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&listing.stderr).lines())
    {
        say(out, format!("    {line}"));
    }

    say(out, "==> Ready. In another terminal:".into());
    say(
        out,
        format!("    export KUBECONFIG={}", kubeconfig.display()),
    );
    say(
        out,
        format!(
            "    export PATH={}:$PATH   # kubectl {KUBERNETES_VERSION}",
            control_plane.binaries().dir().display()
        ),
    );
    say(out, "    kubectl get crds".into());
    say(out, "    kubectl explain scaleagent.spec".into());
    say(
        out,
        format!("    logs: {}/*.log", control_plane.run_dir().display()),
    );

    if !options.once {
        say(out, "==> Press Ctrl-C to stop everything.".into());
        wait_for_shutdown_signal().await;
    }
    say(
        out,
        "==> Stopping kube-controller-manager, kube-apiserver and etcd".into(),
    );
    drop(control_plane);
    say(out, "    stopped; nothing left running.".into());
    Ok(())
}

async fn wait_for_shutdown_signal() {
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
