//! The process's allocator (glibc's malloc on Linux) set for a hub: a large cache kept for a
//! long time, next to large short-lived buffers.
//!
//! glibc serves a block of at least its mmap threshold (128 KiB at start) with a mapping of
//! its own, unmapped when freed, but raises the threshold to the size of every such block
//! freed (up to 32 MiB). Once a hub had freed its first large buffer, the next large ones
//! (a snapshot's staged objects and messages, a commit's batch, a LIST's body) were carved
//! from the arenas among the cached objects, and their pages went back to the system only
//! when they were freed before the trim that follows a large commit ([`crate::commits`]):
//! bench measure 5's hub RSS per cached object fell on two levels about 3 MiB apart at
//! 10,000 objects (1,300 and 1,600 B), by which of two threads freed first. With the
//! threshold fixed, a large block is unmapped when it is freed, whenever that is.

/// Blocks of at least this many bytes get a mapping of their own: glibc's initial value,
/// kept for the process's life.
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// Fixes the allocator's mmap threshold at [`MMAP_THRESHOLD`]. Call it once at start-up,
/// before the runtime's threads start. Returns whether the allocator took the setting
/// (always false where the allocator is not glibc's).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // A call into glibc.
pub fn configure() -> bool {
    // SAFETY: mallopt takes two integers and changes glibc's own settings under its lock.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn configure() -> bool {
    false
}

/// Gives the allocator's free pages back to the system (after a large commit): the store's
/// writer calls it, so it lives in the store crate.
pub use scale_agent_hub_store::memory::release_free_memory;
