//! The hardware touch points of [`crate::PagedMmu`], behind one trait.
//!
//! Everything else in the driver is format logic that runs anywhere. [`PagingHardware`]
//! is what differs between a real walker and a host test:
//! - **page-table memory**: reading and writing one 64-bit entry at a physical address
//!   inside a page-table frame (a kernel reaches physical memory through an identity
//!   mapping; a host test through a `Vec`-backed model);
//! - **the walker's translation caches and root**: invalidating cached translations of
//!   some pages or of everything, and pointing the walker at a root.
//!
//! Two walkers implement it in this repository: [`DirectCpu`] (x86-64 only) is the
//! CPU itself — volatile accesses to identity-mapped frames, `invlpg`, CR3 — and the
//! x86 kernel's VT-d domain (`drivers/x86pt/kernel/src/vtd.rs`) is one device context
//! of an Intel IOMMU: the same entries written with a cache-line flush, invalidations
//! as queued-invalidation descriptors, the root in a context entry.

use gmem_core::{PageTableRoot, PhysAddr, VaRange};

/// Access to page-table memory and to one walker's translation caches and root.
pub trait PagingHardware: Send + Sync {
    /// Read the 64-bit entry at `pa`.
    ///
    /// # Safety
    /// `pa` is 8-byte aligned and lies inside a frame the driver obtained from its
    /// [`gmem_core::FrameSource`] and has not given back.
    unsafe fn read_pte(&self, pa: PhysAddr) -> u64;

    /// Write the 64-bit entry at `pa` with one aligned store (the walker never sees half
    /// an entry), made visible to the walker.
    ///
    /// # Safety
    /// As for [`PagingHardware::read_pte`]; additionally the new value does not remove
    /// a translation the running code itself depends on.
    unsafe fn write_pte(&self, pa: PhysAddr, pte: u64);

    /// Drop the walker's cached translations of every page of `ranges` in table `root`,
    /// and every cached non-leaf entry; when this returns no access through a stale
    /// translation is in flight.
    fn invalidate(&self, root: PageTableRoot, ranges: &[VaRange]);

    /// Drop every cached translation and non-leaf entry of table `root`.
    fn invalidate_all(&self, root: PageTableRoot);

    /// Point the walker at `root` (or at nothing), dropping what it cached before.
    ///
    /// # Safety
    /// `root` is `None` or names a valid table of the driver, and for a CPU the
    /// translation it selects maps the code, stack and data the CPU is running on.
    unsafe fn activate(&self, root: Option<PageTableRoot>);
}

#[cfg(target_arch = "x86_64")]
pub use self::x86::DirectCpu;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::PagingHardware;
    use gmem_core::{PageTableRoot, PhysAddr, VaRange, PAGE_SIZE};

    /// The CPU running this code: page-table frames identity mapped, `invlpg` and CR3
    /// by inline assembly (no PCID: a CR3 write drops every non-global translation).
    #[derive(Debug)]
    pub struct DirectCpu {
        _private: (),
    }

    impl DirectCpu {
        /// The CPU.
        ///
        /// # Safety
        /// The code runs in ring 0 in long mode, and every frame of the driver's frame
        /// source is identity mapped readable and writable in every translation the CPU
        /// uses while the driver runs, and used by nothing else while the driver holds it.
        pub const unsafe fn new() -> DirectCpu {
            DirectCpu { _private: () }
        }

        fn cr3() -> u64 {
            let v: u64;
            // SAFETY: reading CR3 has no side effect (ring 0, `new`'s contract).
            unsafe { core::arch::asm!("mov {}, cr3", out(reg) v, options(nomem, nostack)) };
            v
        }
    }

    impl PagingHardware for DirectCpu {
        unsafe fn read_pte(&self, pa: PhysAddr) -> u64 {
            // SAFETY: the caller guarantees an aligned entry of a live table frame,
            // identity mapped (`new`'s contract).
            unsafe { core::ptr::read_volatile(pa.as_u64() as *const u64) }
        }

        unsafe fn write_pte(&self, pa: PhysAddr, pte: u64) {
            // SAFETY: as in `read_pte`; an aligned volatile 64-bit store is one `mov`,
            // so the walker sees the old or the new entry. The CPU's walker snoops its
            // own caches: nothing to flush.
            unsafe { core::ptr::write_volatile(pa.as_u64() as *mut u64, pte) }
        }

        fn invalidate(&self, _root: PageTableRoot, ranges: &[VaRange]) {
            // `invlpg` drops the page's translation (a large page's whole entry) and
            // every paging-structure-cache entry of the current PCID.
            for r in ranges {
                for k in 0..r.pages() {
                    let va = r.start.as_u64() + k * PAGE_SIZE;
                    // SAFETY: `invlpg` only drops cached translations; it touches no
                    // memory and cannot break the running code.
                    unsafe { core::arch::asm!("invlpg [{}]", in(reg) va, options(nostack)) };
                }
            }
        }

        fn invalidate_all(&self, _root: PageTableRoot) {
            let cr3 = Self::cr3();
            // SAFETY: writing CR3 back unchanged keeps the translation and drops every
            // non-global cached one.
            unsafe { core::arch::asm!("mov cr3, {}", in(reg) cr3, options(nostack)) };
        }

        unsafe fn activate(&self, root: Option<PageTableRoot>) {
            if let Some(r) = root {
                // SAFETY: the caller guarantees the table maps the running code, stack
                // and data; the CR3 write drops the old translations.
                unsafe { core::arch::asm!("mov cr3, {}", in(reg) r.0, options(nostack)) };
            }
        }
    }
}
