//! The hub's allocator setting ([`scale_agent_hub::allocator::configure`]): a large block
//! allocated after a larger one was freed still gets a mapping of its own, so its pages go
//! back to the system when it is freed, whenever that is. glibc's default raises the
//! threshold to the size of the larger block instead (bench measure 5's two levels of hub
//! RSS per cached object). Its own test binary: the figures it reads are the process's.
#![cfg(all(target_os = "linux", target_env = "gnu"))]
#![allow(unsafe_code)] // mallinfo2, a call into glibc.

/// Bytes glibc holds in blocks mapped on their own.
fn mapped_bytes() -> usize {
    // SAFETY: mallinfo2 takes nothing and returns glibc's counters by value.
    unsafe { libc::mallinfo2() }.hblkhd
}

#[test]
fn large_blocks_keep_their_own_mappings_after_a_larger_one_was_freed() {
    assert!(
        scale_agent_hub::allocator::configure(),
        "glibc refused the setting"
    );
    // Freeing an 8 MiB block would raise glibc's threshold to 8 MiB.
    drop(std::hint::black_box(vec![1u8; 8 << 20]));
    let before = mapped_bytes();
    let block = std::hint::black_box(vec![1u8; 1 << 20]);
    let during = mapped_bytes();
    drop(block);
    let after = mapped_bytes();
    assert!(
        during >= before + (1 << 20),
        "a 1 MiB block is mapped on its own ({before} B mapped before it, {during} B with it)"
    );
    assert!(
        after < during,
        "and unmapped when freed ({after} B mapped after)"
    );
}
