//! Where the control-plane binaries live. The Kubernetes version is read from
//! `e2e/control-plane/kubernetes-version`, the one place it is written.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The pinned Kubernetes release, e.g. `v1.37.1`.
pub const KUBERNETES_VERSION: &str = str_trim(include_str!("../control-plane/kubernetes-version"));

/// Overrides the directory the binaries are taken from.
pub const BIN_DIR_ENV: &str = "SCALE_AGENT_CONTROL_PLANE_BIN";

const fn str_trim(s: &str) -> &str {
    s.trim_ascii()
}

/// The directory `e2e/control-plane/build.sh` fills: keep the two in step.
pub fn default_bin_dir() -> PathBuf {
    let cache_root = std::env::var_os("SCALE_AGENT_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("scale-agent"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("scale-agent"))
        })
        .unwrap_or_else(|| std::env::temp_dir().join("scale-agent-cache"));
    cache_root
        .join("control-plane")
        .join(KUBERNETES_VERSION)
        .join("bin")
}

/// Paths of the binaries of one control plane.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub dir: PathBuf,
}

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
        let binaries = Self { dir };
        let complete = [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kubectl",
        ]
        .iter()
        .all(|name| binaries.path(name).is_file());
        if complete {
            Ok(binaries)
        } else {
            Err(Error::BinariesMissing {
                version: KUBERNETES_VERSION,
                dir: binaries.dir,
            })
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn etcd(&self) -> PathBuf {
        self.path("etcd")
    }

    pub fn kube_apiserver(&self) -> PathBuf {
        self.path("kube-apiserver")
    }

    pub fn kube_controller_manager(&self) -> PathBuf {
        self.path("kube-controller-manager")
    }

    pub fn kubectl(&self) -> PathBuf {
        self.path("kubectl")
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
    }

    #[test]
    fn bin_dir_is_versioned() {
        assert!(default_bin_dir().ends_with(format!("control-plane/{KUBERNETES_VERSION}/bin")));
    }
}
