//! `scale-agent`: see [`scale_agent::cli`].

/// Zeroes every freed block, so that buffers which held Secret data leave no copy in the
/// heap (see `scale_agent::wiping_alloc`).
#[global_allocator]
static ALLOCATOR: scale_agent::wiping_alloc::WipeOnFree = scale_agent::wiping_alloc::WipeOnFree;

fn main() -> anyhow::Result<()> {
    scale_agent::cli::main()
}
