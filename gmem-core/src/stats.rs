//! Counters a caller can read: faults by kind, zeroing, migration traffic, evictions,
//! TLB invalidations.
//!
//! Counters over logs: every subsystem counts what it did, and a caller reads a
//! consistent-enough snapshot with [`crate::Gmem::stats`]. Counters are relaxed atomics:
//! each is exact, the snapshot as a whole is not a single instant.

use crate::sync::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Live counters (atomics), one set per [`crate::Gmem`].
        #[derive(Default)]
        pub(crate) struct Counters {
            $( pub $name: AtomicU64, )*
        }

        /// A snapshot of the counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Stats {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl Counters {
            pub fn snapshot(&self) -> Stats {
                Stats { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }
    };
}

counters! {
    /// Faults that allocated and zero-filled fresh memory.
    faults_zero_fill,
    /// Faults that migrated a page to the placement target.
    faults_migrate,
    /// Faults that mapped a frame living in another device's memory (remote access).
    faults_remote,
    /// Faults that mapped a frame already at its place (another table had it).
    faults_map_existing,
    /// Faults on a page already mapped in the faulter's table (a stale TLB entry).
    faults_spurious,
    /// Faults answered with an error.
    faults_failed,
    /// Pages zero-filled (bulk zeroing counts every page it prepared).
    pages_zeroed,
    /// Bytes copied from host memory to device memory.
    bytes_host_to_dev,
    /// Bytes copied from device memory to host memory.
    bytes_dev_to_host,
    /// Bytes copied between two device memories.
    bytes_dev_to_dev,
    /// Pages evicted from device memory to host memory (all policies).
    evictions,
    /// Evictions that took the oldest candidate by fault order (FIFO policy, or a CLOCK
    /// device whose MMU keeps no accessed bits).
    evictions_fifo,
    /// Evictions of a candidate the CLOCK scan found unreferenced.
    evictions_clock,
    /// Eviction candidates the CLOCK scan examined (accessed bits read and cleared).
    pages_scanned,
    /// Candidates found referenced and moved back to the active queue.
    second_chances,
    /// Calls to `Mmu::map`.
    mmu_maps,
    /// Calls to `Mmu::unmap`.
    mmu_unmaps,
    /// Calls to `Mmu::invalidate` / `invalidate_all` (TLB invalidations issued).
    invalidations,
    /// Unmap requests that shared an invalidation with an earlier request of their
    /// batch (invalidations saved by coalescing).
    invalidations_coalesced,
    /// Asynchronous requests queued.
    async_requests,
    /// Batches drained from asynchronous MMU queues.
    async_batches,
    /// Allocations a driver's preference (`FramePlacement::Prefer`, `PreferOrClass`)
    /// could not satisfy, served elsewhere (or in its fallback class).
    placement_fallbacks,
    /// Large leaves (2 MiB, 1 GiB, 64 KiB) the core asked drivers to install.
    large_maps,
    /// Blocks of a table that maps large leaves mapped by 4 KiB leaves because the
    /// run did not cover the whole block (a page faulted alone, a block not populated).
    large_fallback_partial,
    /// Blocks mapped by 4 KiB leaves because their frames were not aligned to the block.
    large_fallback_unaligned,
    /// Blocks mapped by 4 KiB leaves because they cross a region boundary.
    large_fallback_region,
    /// Large leaves split by an unmap or protect covering them in part (a partial
    /// unmap, protect, migration or eviction).
    large_splits,
    /// Blocks remapped large: by `region_promote`, or by a fault that found its block
    /// complete and replaced the faulter's 4 KiB leaves by one large leaf.
    promotions,
    /// Pages copied by `region_promote` to gather a block onto one aligned frame block.
    promotion_pages_moved,
    /// Superpage reservations broken under memory pressure (their free frames returned).
    reservations_broken,
}

impl Counters {
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
