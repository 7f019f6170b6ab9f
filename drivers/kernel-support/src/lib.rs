//! # gmem-kernel-support: what the bare-metal gmem kernels share
//!
//! The two kernels that boot under QEMU, `drivers/sv39/kernel` (RISC-V) and
//! `drivers/x86pt/kernel` (x86-64 UEFI), each identity-map their RAM and hand the core
//! two things built on that: a pool of frames their MMU drivers build page tables in,
//! and direct access to the RAM the core backs regions with. Both live here, once.
//!
//! | module | owns |
//! |---|---|
//! | [`frame_pool`] | [`FramePool`]: 4 KiB page-table frames, a bump range and an intrusive free list; its boot self-check |
//! | [`direct_ram`] | [`DirectRam`]: the core's [`DeviceMemory`](gmem_core::DeviceMemory) over an identity-mapped range |
//!
//! Nothing here is target specific: on the host, the tests run both over heap buffers
//! (a buffer's address standing for a physical address, as identity mapping makes it).

#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod direct_ram;
pub mod frame_pool;

pub use direct_ram::DirectRam;
pub use frame_pool::FramePool;

#[cfg(test)]
mod tests {
    //! A page-aligned heap buffer standing for identity-mapped RAM.

    use gmem_core::PAGE_SIZE;
    use std::alloc::{alloc, dealloc, Layout};

    /// `frames` page-aligned 4 KiB frames on the heap, freed on drop.
    pub(crate) struct Buffer {
        ptr: *mut u8,
        layout: Layout,
    }

    impl Buffer {
        /// `frames` frames, every byte `byte`.
        pub(crate) fn filled(frames: u64, byte: u8) -> Buffer {
            let layout = Layout::from_size_align((frames * PAGE_SIZE) as usize, PAGE_SIZE as usize)
                .expect("a valid layout");
            // SAFETY: the layout has a nonzero size (callers ask for at least a frame).
            let ptr = unsafe { alloc(layout) };
            assert!(!ptr.is_null(), "out of memory");
            let b = Buffer { ptr, layout };
            b.fill(byte);
            b
        }

        /// The first byte's address.
        pub(crate) fn addr(&self) -> u64 {
            self.ptr as u64
        }

        /// Bytes in the buffer.
        pub(crate) fn len(&self) -> u64 {
            self.layout.size() as u64
        }

        /// Set every byte to `byte`.
        pub(crate) fn fill(&self, byte: u8) {
            // SAFETY: the buffer's own bytes; no reference into them is alive.
            unsafe { core::ptr::write_bytes(self.ptr, byte, self.layout.size()) };
        }

        /// A copy of the buffer's bytes.
        pub(crate) fn bytes(&self) -> std::vec::Vec<u8> {
            // SAFETY: the buffer's own initialised bytes, copied out at once.
            unsafe { core::slice::from_raw_parts(self.ptr, self.layout.size()) }.to_vec()
        }
    }

    impl Drop for Buffer {
        fn drop(&mut self) {
            // SAFETY: allocated in `filled` with this layout, freed once.
            unsafe { dealloc(self.ptr, self.layout) };
        }
    }
}
