//! A real node made ready for the chart, the way a platform team readies a bare cluster:
//! this build's images in the node's containerd, hostPath PersistentVolumes for the hub's
//! volume claims (the node has no storage provisioner), and the hub's serving certificate
//! with its CA as files (what cert-manager would write). Shared by the real-node tests
//! (`e2e/tests/real_node.rs`) and `make demo-node`, so the cluster a person follows the
//! guide on is the one the tests install the chart on.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, ensure};

use super::{NodeImage, RealNode, user::Cli};
use crate::pki::CertificateAuthority;

/// The product's images: repository, the product binary's name in the image, and the name
/// of this build's binary that is the same command (`e2e-hub` is `scale-agent-hub`).
pub const PRODUCT_IMAGES: [(&str, &str, &str); 3] = [
    (
        "ghcr.io/scale-agent/operator",
        "scale-agent-operator",
        "e2e-operator",
    ),
    ("ghcr.io/scale-agent/agent", "scale-agent", "e2e-agent"),
    ("ghcr.io/scale-agent/hub", "scale-agent-hub", "e2e-hub"),
];

/// The namespaces the hub's certificate has Service names for: the guide's hub namespace
/// and the operator's (a one-cluster install runs the hub there).
pub const HUB_NAMESPACES: [&str; 2] = ["spinnaker", "scale-agent-system"];

/// The hub's user and group in its image; a hostPath volume gets no fsGroup, so its
/// directory is given to them.
const HUB_DATA_UID: &str = "65532:65532";

/// How many hostPath volumes [`prepare`] makes: one per hub release a test or a person
/// installs on the node.
const VOLUMES: usize = 2;

/// The hub's serving certificate and the CA that signed it, as files named as the guide's
/// commands read them.
#[derive(Clone, Debug)]
pub struct HubTlsFiles {
    /// Where the files are (`hub.crt`, `hub.key`, `hub-ca.crt`).
    pub dir: PathBuf,
    /// The CA's certificate, PEM.
    pub ca_pem: String,
}

impl HubTlsFiles {
    pub fn cert(&self) -> PathBuf {
        self.dir.join("hub.crt")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.join("hub.key")
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("hub-ca.crt")
    }
}

/// A started node ready for the chart, and the user's kubectl and helm for it.
pub struct PreparedNode {
    pub node: RealNode,
    pub cli: Cli,
    pub hub_tls: HubTlsFiles,
}

/// Builds the images from `binary_of(e2e binary name)` under `dir`, starts the node with
/// them, and readies it for the chart (volumes, the hub's certificate files), all under
/// `dir`; `progress` is told each step.
pub async fn prepare(
    dir: &Path,
    binary_of: impl Fn(&str) -> Result<PathBuf>,
    progress: &mut dyn FnMut(&str),
) -> Result<PreparedNode> {
    let images = product_images(&dir.join("images"), binary_of)?;
    progress("images built from this build's binaries (images/image.sh layout)");
    let node = RealNode::start(&images).await?;
    progress("node Ready");
    let binaries = node.control_plane().binaries();
    let home = dir.join("home");
    std::fs::create_dir_all(&home).with_context(|| format!("create {}", home.display()))?;
    let cli = Cli {
        kubectl: binaries.kubectl(),
        helm: binaries.helm(),
        kubeconfig: node.control_plane().kubeconfig_path().to_path_buf(),
        home,
    };
    for index in 0..VOLUMES {
        hostpath_volume(&cli, &format!("scale-agent-hub-data-{index}"), dir)?;
    }
    let hub_tls = hub_tls_files(&dir.join("hub-tls"))?;
    progress("hostPath volumes for the hub and its certificate files made");
    Ok(PreparedNode { node, cli, hub_tls })
}

/// The images `make images` makes, from this build's binaries (`images/image.sh layout`,
/// the same script; a fast gzip, as the binaries are debug builds).
fn product_images(
    dir: &Path,
    binary_of: impl Fn(&str) -> Result<PathBuf>,
) -> Result<Vec<NodeImage>> {
    let script = crate::repo_root().join("images/image.sh");
    PRODUCT_IMAGES
        .iter()
        .map(|(repository, name, build_name)| {
            let binary = binary_of(build_name)?;
            let layout = dir.join(name);
            let output = Command::new(&script)
                .arg("layout")
                .arg(&binary)
                .arg(name)
                .arg(&layout)
                .env("SCALE_AGENT_IMAGE_GZIP_LEVEL", "1")
                .output()
                .with_context(|| format!("run {}", script.display()))?;
            ensure!(
                output.status.success(),
                "images/image.sh layout {}: {}{}",
                binary.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            Ok(NodeImage {
                repository: repository.to_string(),
                layout,
            })
        })
        .collect()
}

/// A 1 GiB hostPath PersistentVolume `name` with no class and no claim reserved: the first
/// claim without a class that asks for at most 1 GiB binds it, as the hub's does. Its
/// directory, under `dir`, is owned by the hub's user.
fn hostpath_volume(cli: &Cli, name: &str, dir: &Path) -> Result<()> {
    let path = dir.join(name);
    std::fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
    let chown = Command::new("chown")
        .arg(HUB_DATA_UID)
        .arg(&path)
        .status()
        .context("run chown")?;
    ensure!(chown.success(), "chown {HUB_DATA_UID} {}", path.display());
    cli.apply(&format!(
        "apiVersion: v1
kind: PersistentVolume
metadata:
  name: {name}
spec:
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  hostPath:
    path: {}
    type: Directory
",
        path.display()
    ))?;
    Ok(())
}

/// The hub's serving certificate for its Service's names in [`HUB_NAMESPACES`] (and the
/// bare `scale-agent-hub`, the `tls.serverName` agents use without cluster DNS), signed by a
/// new CA, written to `dir`.
fn hub_tls_files(dir: &Path) -> Result<HubTlsFiles> {
    let ca = CertificateAuthority::new("scale-agent-hub-ca")?;
    let mut names = vec!["scale-agent-hub".to_string()];
    for namespace in HUB_NAMESPACES {
        names.push(format!("scale-agent-hub.{namespace}"));
        names.push(format!("scale-agent-hub.{namespace}.svc"));
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let serving = ca.serving("scale-agent-hub", &names)?;
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let files = HubTlsFiles {
        dir: dir.to_path_buf(),
        ca_pem: ca.cert_pem.clone(),
    };
    for (path, pem) in [
        (files.cert(), &serving.cert_pem),
        (files.key(), &serving.key_pem),
        (files.ca(), &ca.cert_pem),
    ] {
        std::fs::write(&path, pem).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(files)
}
