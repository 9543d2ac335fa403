//! Generating the Rust code in `src/gen/` from the `.proto` files, with protox (a protobuf
//! compiler in Rust) instead of protoc. Used by `make proto` and by the drift test.

use std::{io, path::Path};

/// The `.proto` files, relative to [`proto_root`].
pub const PROTO_FILES: &[&str] = &["scaleagent/v1/agent.proto"];

/// `proto/proto` in this checkout.
pub fn proto_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("proto")
}

/// Writes `scaleagent.v1.rs` into `out_dir`.
pub fn generate(out_dir: &Path) -> io::Result<()> {
    let descriptors = protox::compile(PROTO_FILES, [proto_root()])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .emit_rerun_if_changed(false)
        .out_dir(out_dir)
        .compile_fds(descriptors)
}
