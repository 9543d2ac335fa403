//! The agent's global allocator: the system allocator, but every block is zeroed before it
//! is freed (and before `realloc` lets go of it).
//!
//! Freed heap memory keeps its contents until it is reused, so without this every buffer
//! that ever held a response with Secret data (hyper's connection read buffer, rustls'
//! decrypted-record chunks, kube's and serde's scratch) would leave a copy behind in the
//! agent's heap for an unbounded time. Zeroing on free wipes them all, whichever crate
//! owned them. The cost is a `memset` of each freed block (and a copy on every `realloc`,
//! which may no longer grow in place).
#![allow(unsafe_code)] // A GlobalAlloc is unsafe by definition; each block is commented.

use std::alloc::{GlobalAlloc, Layout, System};

/// Zeroes every block before handing it back to [`System`]. Declare it in a binary with
/// `#[global_allocator]`.
pub struct WipeOnFree;

/// Zeroes `len` bytes at `ptr`, in a way the optimiser cannot drop as a dead store before
/// `free`.
///
/// # Safety
/// `ptr` must be valid for writes of `len` bytes.
unsafe fn wipe(ptr: *mut u8, len: usize) {
    // SAFETY: the caller guarantees `ptr` is valid for `len` bytes.
    unsafe { ptr.write_bytes(0, len) };
    // The pointer "escapes" into an opaque use, so the stores above must happen.
    std::hint::black_box(ptr);
}

// SAFETY: every method forwards to `System` with the layout it was given, and only
// reads/writes the block it is handed within that layout's size.
unsafe impl GlobalAlloc for WipeOnFree {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` is a live block of `layout.size()` bytes until `System.dealloc`.
        unsafe {
            wipe(ptr, layout.size());
            System.dealloc(ptr, layout);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // `System.realloc` may move the block and free the old one with its contents, so
        // move it here: allocate, copy, wipe and free the old block.
        // SAFETY: the caller guarantees `new_size`, rounded up to `layout.align()`, does
        // not overflow, so the layout is valid; `ptr` is live for `layout.size()` bytes and
        // the new block for `new_size` bytes, and they do not overlap.
        unsafe {
            let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
            let new = System.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_allocated_grown_shrunk_and_freed() {
        let allocator = WipeOnFree;
        let layout = Layout::from_size_align(64, 16).unwrap();
        // SAFETY: each pointer is used within the size it was allocated with.
        unsafe {
            let block = allocator.alloc(layout);
            assert!(!block.is_null());
            for i in 0..64 {
                block.add(i).write(i as u8);
            }
            let grown = allocator.realloc(block, layout, 4096);
            assert!(!grown.is_null());
            assert_eq!(grown as usize % 16, 0, "alignment kept");
            for i in 0..64 {
                assert_eq!(grown.add(i).read(), i as u8);
            }
            let grown_layout = Layout::from_size_align(4096, 16).unwrap();
            let shrunk = allocator.realloc(grown, grown_layout, 8);
            for i in 0..8 {
                assert_eq!(shrunk.add(i).read(), i as u8);
            }
            allocator.dealloc(shrunk, Layout::from_size_align(8, 16).unwrap());
            let zeroed = allocator.alloc_zeroed(layout);
            assert!((0..64).all(|i| zeroed.add(i).read() == 0));
            allocator.dealloc(zeroed, layout);
        }
    }
}
