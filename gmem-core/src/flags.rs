//! Composable flags of the KPI: protections, device capabilities, page-size sets and
//! address-space allocation policies.

use crate::addr::PageSize;
use bitflags::bitflags;

bitflags! {
    /// Permitted kinds of access to a virtual page (`gm_prot_t`). Also used to describe
    /// the access that caused a fault.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Prot: u8 {
        /// Loads.
        const READ = 1 << 0;
        /// Stores.
        const WRITE = 1 << 1;
        /// Instruction fetch.
        const EXEC = 1 << 2;
        /// Read and write.
        const RW = Self::READ.bits() | Self::WRITE.bits();
        /// Everything.
        const RWX = Self::RW.bits() | Self::EXEC.bits();
    }
}

bitflags! {
    /// What a device's MMU can do (`gm_dev_cap_t`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct DevCaps: u32 {
        /// The device recovers from a translation fault: the driver calls
        /// `dev_fault` and retries the access. Devices without it get every wired
        /// mapping of their spaces replicated eagerly and never fault.
        const FAULTABLE = 1 << 0;
        /// The device's memory is the host's (the CPU device): the swap space of every
        /// device memory.
        const HOST = 1 << 1;
        /// The device has local memory of its own (registered with
        /// `dev_register_physmem`).
        const LOCAL_MEMORY = 1 << 2;
    }
}

bitflags! {
    /// A set of page sizes, as an MMU reports the sizes it supports.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct PageSizes: u8 {
        /// 4 KiB.
        const S4K = 1 << 0;
        /// 64 KiB.
        const S64K = 1 << 1;
        /// 2 MiB.
        const S2M = 1 << 2;
        /// 1 GiB.
        const S1G = 1 << 3;
    }
}

impl PageSizes {
    /// The flag of one page size.
    pub const fn of(size: PageSize) -> PageSizes {
        match size {
            PageSize::Size4K => PageSizes::S4K,
            PageSize::Size64K => PageSizes::S64K,
            PageSize::Size2M => PageSizes::S2M,
            PageSize::Size1G => PageSizes::S1G,
        }
    }

    /// Whether `size` is in the set.
    pub const fn supports(self, size: PageSize) -> bool {
        self.contains(PageSizes::of(size))
    }

    /// The largest size in the set, 4 KiB when the set is empty.
    pub fn largest(self) -> PageSize {
        PageSize::ALL
            .iter()
            .rev()
            .copied()
            .find(|s| self.supports(*s))
            .unwrap_or(PageSize::Size4K)
    }
}

bitflags! {
    /// Virtual-address allocation policy of an address space (`gm_as_alloc_t`). At most
    /// one fit flag may be given; none means instant-fit.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct AllocPolicy: u32 {
        /// Constant-time good fit from power-of-two freelists (the default).
        const INSTANT_FIT = 1 << 0;
        /// Smallest free segment that fits.
        const BEST_FIT = 1 << 1;
        /// Lowest-addressed free segment that fits.
        const FIRST_FIT = 1 << 2;
        /// Round-robin from a rotor (favours not reusing recently freed ranges).
        const NEXT_FIT = 1 << 3;
        /// One unmapped page on each side of every region, to trap overruns.
        const GUARDED = 1 << 4;
        /// Quantum caches with per-CPU magazines: freed small ranges are kept ready
        /// for reuse without touching the arena.
        const CACHED = 1 << 5;
    }
}

impl AllocPolicy {
    /// The fit flags.
    pub const FITS: AllocPolicy = AllocPolicy::INSTANT_FIT
        .union(AllocPolicy::BEST_FIT)
        .union(AllocPolicy::FIRST_FIT)
        .union(AllocPolicy::NEXT_FIT);

    /// Whether at most one fit flag is set.
    pub fn is_valid(self) -> bool {
        self.intersection(AllocPolicy::FITS).bits().count_ones() <= 1
    }
}

bitflags! {
    /// Options of `region_map`, `region_unmap`, `region_dealloc` and
    /// `mapping_set_unmap`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct MapFlags: u32 {
        /// Queue the page-table work on the space's asynchronous MMU queue; completion
        /// is reported through the callback or `as_synchronize`.
        const ASYNC = 1 << 0;
    }
}
