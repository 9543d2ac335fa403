//! `make demo-node`: a one-node cluster with a real kubelet, containerd and runc on this
//! machine, this build's images loaded into it, readied for the chart as
//! `real_node::install::prepare` readies it for the real-node test, and left running for a
//! person to follow the guide's "On a real cluster" page on (docs/src/getting-started/
//! real-cluster.md, from step 2). Nothing of Scale Agent is installed: that is the guide's
//! job. Ctrl-C stops the node and puts the machine's network tables back.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

use super::support::{line, wait_for_shutdown_signal};
use crate::{
    binaries::product_binary,
    real_node::{
        self, NODE_NAME,
        install::{self, HUB_NAMESPACES, PRODUCT_IMAGES, PreparedNode},
    },
};

/// The default place for the node's cluster (images, certificates, volumes, kubeconfig
/// link): tmpfs, as the demo's.
pub fn default_run_dir() -> PathBuf {
    if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm/scale-agent-demo-node")
    } else {
        std::env::temp_dir().join("scale-agent-demo-node")
    }
}

/// Starts the node in `run_dir` (anything there is replaced), says how to use it, and
/// waits for Ctrl-C unless `once`.
pub async fn run(run_dir: &Path, once: bool, out: &mut dyn Write) -> Result<()> {
    if let Some(reason) = real_node::unavailable() {
        bail!("make demo-node: {reason} (sudo make demo-node)");
    }
    if run_dir.exists() {
        std::fs::remove_dir_all(run_dir).with_context(|| format!("clear {}", run_dir.display()))?;
    }
    std::fs::create_dir_all(run_dir).with_context(|| format!("create {}", run_dir.display()))?;
    line(
        out,
        "==> Building this build's images and starting a real node (control plane, containerd, runc, kubelet, kube-proxy); about a minute".into(),
    );
    let PreparedNode { node, cli, hub_tls } =
        install::prepare(run_dir, |name| Ok(product_binary(name)?), &mut |what| {
            line(out, format!("    {what}"))
        })
        .await?;
    let bin = run_dir.join("bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("create {}", bin.display()))?;
    for (name, target) in [("kubectl", &cli.kubectl), ("helm", &cli.helm)] {
        std::os::unix::fs::symlink(target, bin.join(name))
            .with_context(|| format!("link {name} into {}", bin.display()))?;
    }
    let kubeconfig = run_dir.join("admin.kubeconfig");
    std::fs::copy(&cli.kubeconfig, &kubeconfig)
        .with_context(|| format!("copy the kubeconfig to {}", kubeconfig.display()))?;
    let repo = crate::repo_root();
    let repo = repo.canonicalize().unwrap_or_else(|_| repo.to_path_buf());
    let images: Vec<String> = PRODUCT_IMAGES
        .iter()
        .map(|(repository, _, _)| format!("{repository}:v{}", env!("CARGO_PKG_VERSION")))
        .collect();
    let text = format!(
        "==> Node {NODE_NAME} is Ready, with nothing of Scale Agent installed.

    In another terminal (as root, like this one):
      export KUBECONFIG={kubeconfig} PATH={bin}:$PATH
      cd {repo}
      kubectl get nodes

    What this node has, and what a real cluster would have instead:
    - the images, in the node's containerd (pods run them without pulling; skip the guide's
      step 1): {images}
    - two hostPath PersistentVolumes of 1Gi without a class, one for each hub volume claim
      (a real cluster: a storage provisioner)
    - the hub's serving certificate, its key and its CA, for the hub Service's names in
      namespaces {namespaces} and the bare name scale-agent-hub, as the guide's step 2 reads
      them: {cert}, {key}, {ca} (a real cluster: cert-manager)
    - no cluster DNS: a ScaleAgent dials the hub Service's ClusterIP
      (kubectl -n <hub namespace> get service scale-agent-hub) with
      spec.hub.tls.serverName: scale-agent-hub
    - no load balancer: reach the hub's HTTPS port with
      kubectl -n <hub namespace> port-forward service/scale-agent-hub 8443
    - one cluster: Spinnaker's cluster is also the target, so the guide's step 4 skips its
      helm install (the release of step 2 runs the operator)

    Then follow docs/src/getting-started/real-cluster.md from step 2, with the adaptations its
    section \"No cluster at hand: make demo-node\" lists (publicUrl, namespaces, full paths).",
        kubeconfig = kubeconfig.display(),
        bin = bin.display(),
        repo = repo.display(),
        images = images.join(", "),
        namespaces = HUB_NAMESPACES.join(" and "),
        cert = hub_tls.cert().display(),
        key = hub_tls.key().display(),
        ca = hub_tls.ca().display(),
    );
    for text in text.lines() {
        line(out, text.to_string());
    }
    if !once {
        line(
            out,
            "==> Press Ctrl-C to stop the node (its pods, kubelet, containerd) and put the machine's network back.".into(),
        );
        wait_for_shutdown_signal().await;
    }
    line(out, "==> Stopping the node".into());
    drop(node);
    Ok(())
}
