//! The two hardware touch points of the driver, behind one trait.
//!
//! Everything else in the crate is format logic that runs anywhere. [`Sv39Hardware`]
//! is what differs between a real hart and a host test:
//! - **page-table memory**: reading and writing one 64-bit entry at a physical address
//!   inside a page-table frame (a kernel reaches physical memory through an identity or
//!   offset mapping; a host test through a `Vec`-backed model);
//! - **the hart's translation control**: `sfence.vma` (one address or everything) and
//!   writing `satp`;
//! - **the other harts' TLBs**: which hart is running ([`Sv39Hardware::current_hart`])
//!   and a remote fence that returns once every named hart has fenced
//!   ([`Sv39Hardware::remote_sfence_vma`]; an SBI kernel uses the RFENCE extension,
//!   see `drivers/sv39/kernel/src/sbi.rs`).
//!
//! `DirectHart` (only on `riscv64`) is the real implementation: volatile accesses
//! through a fixed physical-to-virtual offset and inline assembly.

use gmem_core::{PhysAddr, VaRange, VirtAddr};

/// Access to page-table memory and to the hart's address-translation registers.
pub trait Sv39Hardware: Send + Sync {
    /// Read the 64-bit entry at `pa`.
    ///
    /// # Safety
    /// `pa` is 8-byte aligned and lies inside a frame the driver obtained from its
    /// [`gmem_core::FrameSource`] and has not given back.
    unsafe fn read_pte(&self, pa: PhysAddr) -> u64;

    /// Write the 64-bit entry at `pa` (a single aligned store, so the hart's page walker
    /// never sees half an entry).
    ///
    /// # Safety
    /// As for [`Sv39Hardware::read_pte`]; additionally the caller has made sure the new
    /// value does not remove a translation the running code itself depends on.
    unsafe fn write_pte(&self, pa: PhysAddr, pte: u64);

    /// `sfence.vma`: with `Some(va)` order earlier entry writes before later implicit
    /// reads of the leaf entries for `va` and drop cached leaf translations of `va`;
    /// with `None` do that for every address and every cached non-leaf entry too. Both
    /// apply to every ASID.
    fn sfence_vma(&self, va: Option<VirtAddr>);

    /// Write `satp` (mode, ASID, root PPN). The caller fences afterwards.
    ///
    /// # Safety
    /// `satp` is 0 (bare) or names a valid Sv39 root table, and the translation it
    /// selects maps the code, stack and data the hart is running on (e.g. through the
    /// driver's global mappings).
    unsafe fn write_satp(&self, satp: u64);

    /// The index of the hart running the caller, below 64 (the driver keeps one bit per
    /// hart for the harts that may cache its translations; a larger index is not
    /// tracked, so its TLB would never be shot down: a contract violation). A single-hart
    /// implementation answers 0.
    fn current_hart(&self) -> usize;

    /// `sfence.vma` on every hart whose bit is set in `harts` (bit `i`: hart `i`; the
    /// caller's own bit is never set, it fences itself with
    /// [`Sv39Hardware::sfence_vma`]): with `Some(range)` for the leaf translations of
    /// every page of `range`, with `None` for everything, non-leaf entries included.
    /// It returns only when every named hart has fenced (acknowledged it), so that no
    /// access through a stale translation is in flight there afterwards; the driver
    /// frees unlinked tables and the core reuses frames on the strength of that.
    /// Earlier entry writes of the caller are ordered before it (the driver issues a
    /// full memory fence first). A single-hart implementation is never given a hart.
    fn remote_sfence_vma(&self, harts: u64, range: Option<VaRange>);
}

#[cfg(target_arch = "riscv64")]
pub use self::riscv::DirectHart;

#[cfg(target_arch = "riscv64")]
mod riscv {
    use super::Sv39Hardware;
    use gmem_core::{PhysAddr, VaRange, VirtAddr};

    /// The real hart: page-table frames are reached at `pa + offset` (0 for a kernel
    /// whose global mappings identity-map its RAM), fences and `satp` by inline assembly.
    ///
    /// It drives **one** hart: it reports itself as hart 0 and has no way to reach
    /// another hart's TLB. A kernel that runs the driver's tables on several harts wraps
    /// it in a hardware of its own that answers [`Sv39Hardware::current_hart`] and
    /// [`Sv39Hardware::remote_sfence_vma`] (the SMP Sv39 kernel's `SmpHart` does, with
    /// SBI remote fences).
    #[derive(Clone, Copy, Debug)]
    pub struct DirectHart {
        offset: u64,
    }

    impl DirectHart {
        /// A hart whose page-table frames are visible at `pa + offset`.
        ///
        /// # Safety
        /// For every frame of the driver's frame source, `[pa + offset, pa + offset +
        /// 4096)` is mapped readable and writable in every translation the hart uses
        /// while the driver runs (before paging is on too, so `offset` is 0 unless the
        /// kernel runs translated from the start), and nothing else uses that memory
        /// while the frame belongs to the driver.
        pub const unsafe fn new(offset: u64) -> DirectHart {
            DirectHart { offset }
        }

        fn ptr(&self, pa: PhysAddr) -> *mut u64 {
            pa.as_u64().wrapping_add(self.offset) as *mut u64
        }
    }

    impl Sv39Hardware for DirectHart {
        unsafe fn read_pte(&self, pa: PhysAddr) -> u64 {
            // SAFETY: the caller guarantees `pa` is an aligned entry of a live
            // page-table frame; `new`'s contract makes it visible at `pa + offset`.
            unsafe { core::ptr::read_volatile(self.ptr(pa)) }
        }

        unsafe fn write_pte(&self, pa: PhysAddr, pte: u64) {
            // SAFETY: as in `read_pte`; a volatile aligned 64-bit store is one `sd`, so
            // the page walker sees the old or the new entry, never a mix.
            unsafe { core::ptr::write_volatile(self.ptr(pa), pte) }
        }

        fn sfence_vma(&self, va: Option<VirtAddr>) {
            match va {
                // SAFETY: `sfence.vma` only orders and drops cached translations; it
                // touches no memory and cannot break the running code.
                Some(va) => unsafe {
                    core::arch::asm!("sfence.vma {0}, zero", in(reg) va.as_u64(), options(nostack))
                },
                // SAFETY: as above, for every address.
                None => unsafe { core::arch::asm!("sfence.vma zero, zero", options(nostack)) },
            }
        }

        unsafe fn write_satp(&self, satp: u64) {
            // SAFETY: the caller guarantees the new translation maps the running code,
            // stack and data; the caller's `sfence.vma` follows.
            unsafe { core::arch::asm!("csrw satp, {0}", in(reg) satp, options(nostack)) }
        }

        fn current_hart(&self) -> usize {
            0
        }

        fn remote_sfence_vma(&self, _harts: u64, _range: Option<VaRange>) {
            // One hart: the driver only ever tracks hart 0, which is the caller.
        }
    }
}
