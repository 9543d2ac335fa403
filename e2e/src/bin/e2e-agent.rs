//! The `scale-agent` command built inside this package, so end-to-end tests that run the
//! agent as a process always get a fresh binary through `CARGO_BIN_EXE_e2e-agent`.

/// Zeroes every freed block, so that buffers which held Secret data leave no copy in the
/// heap (see `scale_agent::wiping_alloc`).
#[global_allocator]
static ALLOCATOR: scale_agent::wiping_alloc::WipeOnFree = scale_agent::wiping_alloc::WipeOnFree;

fn main() -> anyhow::Result<()> {
    scale_agent::cli::main()
}
