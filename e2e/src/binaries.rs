//! Where the control-plane binaries live. The Kubernetes version is read from
//! `e2e/control-plane/kubernetes-version`, the one place it is written; the KWOK version and
//! the older kubectl clients likewise from `kwok-version` and `kubectl-client-versions`
//! beside it.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The pinned Kubernetes release, e.g. `v1.37.1`.
pub const KUBERNETES_VERSION: &str = str_trim(include_str!("../control-plane/kubernetes-version"));

/// The older Kubernetes release whose kube-apiserver, kube-controller-manager and
/// kube-scheduler `build.sh` builds beside the pinned one (e.g. `v1.32.13`, a target cluster
/// still in a major cloud's support window): see [`Binaries::with_older_api_server`].
pub const OLDER_KUBERNETES_VERSION: &str =
    str_trim(include_str!("../control-plane/older-kubernetes-version"));

/// The pinned KWOK release, e.g. `v0.8.0`.
pub const KWOK_VERSION: &str = str_trim(include_str!("../control-plane/kwok-version"));

/// The older kubectl releases built beside the pinned one (e.g. `v1.22.17`), one per line in
/// `e2e/control-plane/kubectl-client-versions`; see [`Binaries::kubectl_client`].
const KUBECTL_CLIENT_VERSIONS: &str = include_str!("../control-plane/kubectl-client-versions");

/// The older kubectl releases built beside the pinned one, oldest first: the clients
/// Spinnaker's Clouddriver ships, which Scale Agent's Kubernetes API proxy must serve.
pub fn kubectl_client_versions() -> Vec<&'static str> {
    KUBECTL_CLIENT_VERSIONS
        .split_whitespace()
        .filter(|v| v.starts_with("v1."))
        .collect()
}

/// Overrides the directory the binaries are taken from.
pub const BIN_DIR_ENV: &str = "SCALE_AGENT_CONTROL_PLANE_BIN";

const fn str_trim(s: &str) -> &str {
    s.trim_ascii()
}

/// The directory `e2e/control-plane/build.sh` fills: keep the two in step.
pub fn default_bin_dir() -> PathBuf {
    cache_root()
        .join("control-plane")
        .join(KUBERNETES_VERSION)
        .join("bin")
}

/// Where the project's scripts cache what they build or unpack (`e2e/control-plane/build.sh`,
/// `e2e/nginx/install.sh`): `$SCALE_AGENT_CACHE`, else `$XDG_CACHE_HOME/scale-agent`, else
/// `~/.cache/scale-agent`.
pub fn cache_root() -> PathBuf {
    std::env::var_os("SCALE_AGENT_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("scale-agent"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("scale-agent"))
        })
        .unwrap_or_else(|| std::env::temp_dir().join("scale-agent-cache"))
}

/// The program at `relative` under [`cache_root`], or `missing` (an error that says which
/// `make` target provides it) when it is not there.
pub fn cached_program(relative: &str, missing: fn(PathBuf) -> Error) -> Result<PathBuf> {
    let path = cache_root().join(relative);
    if path.is_file() {
        Ok(path)
    } else {
        Err(missing(path))
    }
}

/// Paths of the binaries of one control plane.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub dir: PathBuf,
    /// Where kube-apiserver, kube-controller-manager and kube-scheduler come from: [`Self::dir`],
    /// or the older release's directory ([`Self::with_older_api_server`]).
    server_dir: PathBuf,
    /// The release of the binaries in `server_dir`.
    server_version: &'static str,
}

/// The binaries every control plane needs; the rest (kube-scheduler, kwok, older kubectls,
/// helm) are checked by what uses them, so a cache built by an older `build.sh` still runs
/// the tests that need only these.
const CORE: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kubectl",
];

impl Binaries {
    /// Finds the binaries ([`BIN_DIR_ENV`], else the build cache), or says which command
    /// builds them.
    pub fn locate() -> Result<Self> {
        Self::locate_in(
            std::env::var_os(BIN_DIR_ENV)
                .map(PathBuf::from)
                .unwrap_or_else(default_bin_dir),
        )
    }

    /// Takes the binaries from `dir`, or says which command builds them.
    pub fn locate_in(dir: PathBuf) -> Result<Self> {
        let binaries = Self {
            server_dir: dir.clone(),
            dir,
            server_version: KUBERNETES_VERSION,
        };
        binaries.require(CORE)?;
        Ok(binaries)
    }

    /// Binaries in `dir`, not checked for (unit tests of command lines).
    #[cfg(test)]
    pub(crate) fn unchecked(dir: PathBuf) -> Self {
        Self {
            server_dir: dir.clone(),
            dir,
            server_version: KUBERNETES_VERSION,
        }
    }

    /// The same binaries, but kube-apiserver, kube-controller-manager and kube-scheduler of
    /// [`OLDER_KUBERNETES_VERSION`] (`build.sh` puts them in
    /// `control-plane/<that version>/bin` beside the pinned release's directory). etcd,
    /// kubectl and kwok stay the pinned build's.
    pub fn with_older_api_server(self) -> Result<Self> {
        let server_dir = self
            .dir
            .parent()
            .and_then(Path::parent)
            .map(|root| root.join(OLDER_KUBERNETES_VERSION).join("bin"))
            .unwrap_or_else(|| {
                cache_root()
                    .join("control-plane")
                    .join(OLDER_KUBERNETES_VERSION)
                    .join("bin")
            });
        let missing: Vec<&str> = [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ]
        .into_iter()
        .filter(|name| !server_dir.join(name).is_file())
        .collect();
        if !missing.is_empty() {
            return Err(Error::BinariesMissing {
                version: OLDER_KUBERNETES_VERSION,
                dir: server_dir,
                missing: missing.join(", "),
            });
        }
        Ok(Self {
            server_dir,
            server_version: OLDER_KUBERNETES_VERSION,
            ..self
        })
    }

    /// The release of kube-apiserver, kube-controller-manager and kube-scheduler:
    /// [`KUBERNETES_VERSION`] or [`OLDER_KUBERNETES_VERSION`].
    pub fn server_version(&self) -> &'static str {
        self.server_version
    }

    /// Fails with [`Error::BinariesMissing`] (which says how to build them) unless every
    /// file in `names` is in [`Self::dir`].
    pub fn require(&self, names: &[&str]) -> Result<()> {
        let missing: Vec<&str> = names
            .iter()
            .copied()
            .filter(|name| !self.path(name).is_file())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Error::BinariesMissing {
                version: KUBERNETES_VERSION,
                dir: self.dir.clone(),
                missing: missing.join(", "),
            })
        }
    }

    /// The file `name` in [`Self::dir`].
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn etcd(&self) -> PathBuf {
        self.path("etcd")
    }

    pub fn kube_apiserver(&self) -> PathBuf {
        self.server_dir.join("kube-apiserver")
    }

    pub fn kube_controller_manager(&self) -> PathBuf {
        self.server_dir.join("kube-controller-manager")
    }

    /// The kube-scheduler of the API server's release (a symlink into a multi-call binary).
    pub fn kube_scheduler(&self) -> PathBuf {
        self.server_dir.join("kube-scheduler")
    }

    /// The kubectl of the pinned release.
    pub fn kubectl(&self) -> PathBuf {
        self.path("kubectl")
    }

    /// The kubectl of an older release, `kubectl-1.<minor>` (e.g. `kubectl_client(22)`), as
    /// Clouddriver's image names them; [`kubectl_client_versions`] lists the ones built.
    pub fn kubectl_client(&self, minor: u32) -> PathBuf {
        self.path(&format!("kubectl-1.{minor}"))
    }

    /// KWOK ([`KWOK_VERSION`]), which runs fake nodes and the pods bound to them.
    pub fn kwok(&self) -> PathBuf {
        self.path("kwok")
    }

    /// KWOK's default node and pod stages (the `kwok` binary has none built in), taken from
    /// the same module version by `build.sh`.
    pub fn kwok_stages(&self) -> PathBuf {
        self.dir.join("kwok-config").join("stages.yaml")
    }

    /// The CustomResourceDefinition of KWOK's namespaced `Logs` (kwok.x-k8s.io/v1alpha1),
    /// which points one pod's container logs at a file.
    pub fn kwok_logs_crd(&self) -> PathBuf {
        self.dir.join("kwok-config").join("logs-crd.yaml")
    }

    pub fn helm(&self) -> PathBuf {
        self.path("helm")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The path of one of this package's binaries (`e2e-agent`, `e2e-hub`, `e2e-operator`,
/// `scale-agent-demo`), found next to the running executable: in `target/<profile>/` for a
/// binary, one level up for a test in `target/<profile>/deps/`. Integration tests can use
/// `env!("CARGO_BIN_EXE_<name>")` instead; library code cannot.
pub fn product_binary(name: &str) -> Result<PathBuf> {
    let exe =
        std::env::current_exe().map_err(crate::error::io_err("find the running executable"))?;
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    [dir.join(name), dir.join("..").join(name)]
        .into_iter()
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| Error::ProductBinaryMissing {
            name: name.to_string(),
            dir,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_a_release() {
        let rest = KUBERNETES_VERSION
            .strip_prefix("v1.")
            .expect("starts with v1.");
        let parts: Vec<_> = rest.split('.').collect();
        assert_eq!(parts.len(), 2, "{KUBERNETES_VERSION}");
        assert!(
            parts.iter().all(|p| p.parse::<u32>().is_ok()),
            "{KUBERNETES_VERSION}"
        );
    }

    #[test]
    fn missing_binaries_name_the_command_that_builds_them() {
        let empty = std::env::temp_dir().join(format!("no-binaries-{}", std::process::id()));
        let message = Binaries::locate_in(empty).unwrap_err().to_string();
        assert!(message.contains("make control-plane"), "{message}");
        assert!(message.contains(KUBERNETES_VERSION), "{message}");
        assert!(
            message.contains("missing: etcd, kube-apiserver"),
            "{message}"
        );
    }

    #[test]
    fn pinned_kwok_and_kubectl_clients_are_releases() {
        assert!(KWOK_VERSION.starts_with("v0."), "{KWOK_VERSION}");
        let clients = kubectl_client_versions();
        assert!(clients.contains(&"v1.22.17"), "{clients:?}");
        assert!(clients.contains(&"v1.29.0"), "{clients:?}");
        let binaries = Binaries::unchecked(PathBuf::from("/bin-dir"));
        assert_eq!(
            binaries.kubectl_client(22),
            Path::new("/bin-dir/kubectl-1.22")
        );
    }

    #[test]
    fn bin_dir_is_versioned() {
        assert!(default_bin_dir().ends_with(format!("control-plane/{KUBERNETES_VERSION}/bin")));
    }
}
