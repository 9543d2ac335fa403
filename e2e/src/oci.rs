//! Reading the OCI image layouts `images/image.sh` writes (`make images`), as a registry or
//! container runtime would: `index.json` names the manifest, the manifest names the config and
//! the layers, and every blob must hash to its digest and have its recorded size. The layer
//! is unpacked with `tar`, so a test can run the image's entrypoint in its root filesystem.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use crate::error::{Error, Result, io_err};

/// An image unpacked into a directory.
#[derive(Debug)]
pub struct UnpackedImage {
    /// The tag (`org.opencontainers.image.ref.name` in `index.json`), e.g. `v0.1.0`.
    pub tag: String,
    /// The image config's `config` object (`Entrypoint`, `User`, `Env`, `Labels`, ...).
    pub config: Value,
    /// The manifest's digest, `sha256:…`.
    pub manifest_digest: String,
    /// Sum of the compressed layer sizes, in bytes (what a registry stores and a node pulls).
    pub compressed_size: u64,
    /// The root filesystem.
    pub rootfs: PathBuf,
}

impl UnpackedImage {
    /// The entrypoint, e.g. `["/usr/local/bin/scale-agent-hub"]`.
    pub fn entrypoint(&self) -> Vec<String> {
        self.config["Entrypoint"]
            .as_array()
            .map(|args| {
                args.iter()
                    .filter_map(|a| a.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The `User` the image runs as (`uid:gid`), empty when it runs as root.
    pub fn user(&self) -> &str {
        self.config["User"].as_str().unwrap_or_default()
    }

    /// One OCI label, e.g. `org.opencontainers.image.version`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.config["Labels"][name].as_str()
    }
}

/// Verifies the single-image layout at `layout` and unpacks its layers into `into/rootfs`.
pub fn unpack(layout: &Path, into: &Path) -> Result<UnpackedImage> {
    let bad = |message: String| Error::Image {
        layout: layout.to_path_buf(),
        message,
    };
    let marker = read_json(&layout.join("oci-layout"))?;
    if marker["imageLayoutVersion"] != "1.0.0" {
        return Err(bad(format!("oci-layout is {marker}, not version 1.0.0")));
    }
    let index = read_json(&layout.join("index.json"))?;
    let [descriptor] = index["manifests"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    else {
        return Err(bad(format!("index.json must name one manifest: {index}")));
    };
    let tag = descriptor["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .ok_or_else(|| bad("the manifest in index.json has no ref.name (tag)".into()))?
        .to_string();
    let manifest_digest = descriptor["digest"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let manifest: Value = serde_json::from_slice(&read_blob(layout, descriptor)?)
        .map_err(|e| bad(format!("manifest is not JSON: {e}")))?;
    let config: Value = serde_json::from_slice(&read_blob(layout, &manifest["config"])?)
        .map_err(|e| bad(format!("config is not JSON: {e}")))?;
    if config["os"] != "linux" || config["architecture"] != "amd64" {
        return Err(bad(format!(
            "config is for {}/{}, not linux/amd64",
            config["os"], config["architecture"]
        )));
    }

    let rootfs = into.join("rootfs");
    if rootfs.exists() {
        fs::remove_dir_all(&rootfs).map_err(io_err(format!("remove {}", rootfs.display())))?;
    }
    fs::create_dir_all(&rootfs).map_err(io_err(format!("create {}", rootfs.display())))?;
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    if layers.is_empty() {
        return Err(bad("the manifest has no layers".into()));
    }
    let mut compressed_size = 0;
    for layer in &layers {
        let media_type = layer["mediaType"].as_str().unwrap_or_default();
        if media_type != "application/vnd.oci.image.layer.v1.tar+gzip" {
            return Err(bad(format!(
                "layer media type {media_type} is not a gzip'd tar"
            )));
        }
        let bytes = read_blob(layout, layer)?;
        compressed_size += bytes.len() as u64;
        let path = blob_path(layout, layer)?;
        let status = Command::new("tar")
            .arg("-xzf")
            .arg(&path)
            .arg("-C")
            .arg(&rootfs)
            .arg("--no-same-owner")
            .status()
            .map_err(io_err("run tar"))?;
        if !status.success() {
            return Err(bad(format!(
                "tar could not unpack {}: {status}",
                path.display()
            )));
        }
    }
    Ok(UnpackedImage {
        tag,
        config: config["config"].clone(),
        manifest_digest,
        compressed_size,
        rootfs,
    })
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = fs::read(path).map_err(io_err(format!("read {}", path.display())))?;
    serde_json::from_slice(&bytes).map_err(|e| Error::Image {
        layout: path.to_path_buf(),
        message: format!("not JSON: {e}"),
    })
}

fn blob_path(layout: &Path, descriptor: &Value) -> Result<PathBuf> {
    let digest = descriptor["digest"].as_str().unwrap_or_default();
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| Error::Image {
            layout: layout.to_path_buf(),
            message: format!("descriptor {descriptor} has no sha256 digest"),
        })?;
    Ok(layout.join("blobs").join("sha256").join(hex))
}

/// The blob a descriptor names, checked against its digest and size.
fn read_blob(layout: &Path, descriptor: &Value) -> Result<Vec<u8>> {
    let path = blob_path(layout, descriptor)?;
    let bytes = fs::read(&path).map_err(io_err(format!("read {}", path.display())))?;
    let actual = hex(ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref());
    let expected = descriptor["digest"].as_str().unwrap_or_default();
    let size = descriptor["size"].as_u64();
    if expected != format!("sha256:{actual}") || size != Some(bytes.len() as u64) {
        return Err(Error::Image {
            layout: layout.to_path_buf(),
            message: format!(
                "blob {} hashes to sha256:{actual} with {} bytes, but its descriptor says {expected} with {size:?}",
                path.display(),
                bytes.len()
            ),
        });
    }
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
