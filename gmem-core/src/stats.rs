//! Counters a caller can read: faults by kind, zeroing, migration traffic, evictions,
//! TLB invalidations.
//!
//! Counters over logs: every subsystem counts what it did, and a caller reads a
//! consistent-enough snapshot with [`crate::Gmem::stats`]. Counters are relaxed atomics:
//! each is exact, the snapshot as a whole is not a single instant.
//!
//! ## Two homes for a counter
//! Most counters are global (`Counters`, one set per `Gmem`, bumped with an atomic
//! add). The counters the fault path bumps while it holds a space's lock live instead
//! in that space's block (`SpaceCounters`), bumped with a plain load and store: the
//! lock makes its holder the block's only writer, so no locked read-modify-write is
//! needed (on x86-64 a relaxed atomic load or store is a plain `mov`), and faults in
//! different spaces no longer share (and bounce) one global cache line. A block's
//! fields are atomics only so that `stats` may read them without the space lock.
//!
//! `Gmem::stats` returns the global counters plus every live space's block, summed
//! under the space registry's read lock. `as_destroy` folds a space's block into the
//! global counters and removes the space from the registry in one hold of the
//! registry's write lock: a snapshot therefore sees the space either registered with
//! its counts in its block, or gone with its counts in the global counters — never
//! both, never neither. The fold reads the block's final values: it runs after
//! `destroy` marked the space dead under its lock (whose release orders every earlier
//! bump before the fold's loads), and a dead space is never bumped again (the calls
//! that reach its state refuse it; the bump sites assert it in debug builds). The
//! loom model `stats` (in `loom-tests/`) checks this against a broken variant that
//! folds after releasing the registry.

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
    /// Fault batches `dev_fault_batch` accepted (issue 35, item 1).
    fault_batches,
    /// Fault records in those batches, duplicates included.
    fault_batch_records,
    /// Records that repeated a page earlier in their batch (merged, not serviced).
    fault_batch_duplicates,
    /// Pages the tree prefetcher brought to a faulting device with a batch's faults.
    pages_prefetched,
    /// Read-only copies of read-mostly pages made for reading devices (read
    /// duplication, issue 35 item 4; their bytes count in the `bytes_*` counters).
    read_duplications,
    /// Read-only copies dropped: by a write's collapse, an operation on their pages,
    /// or memory pressure in the memory holding them.
    read_copies_dropped,
}

impl Counters {
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

macro_rules! space_counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// One space's counters: those the fault path bumps under the space's lock (see
        /// the module documentation). Only the holder of the space lock writes them.
        #[derive(Default)]
        pub(crate) struct SpaceCounters {
            $( $(#[$doc])* pub $name: AtomicU64, )*
        }

        impl SpaceCounters {
            /// Add this block's counts to the snapshot `s`.
            pub fn add_to_snapshot(&self, s: &mut Stats) {
                $( s.$name = s.$name.wrapping_add(self.$name.load(Ordering::Relaxed)); )*
            }

            /// Add this block's counts to the global counters `global` (the space is
            /// being unregistered; see the module documentation).
            pub fn fold_into(&self, global: &Counters) {
                $( Counters::add(&global.$name, self.$name.load(Ordering::Relaxed)); )*
            }
        }
    };
}

space_counters! {
    /// [`Stats::faults_zero_fill`] of this space.
    faults_zero_fill,
    /// [`Stats::faults_migrate`] of this space.
    faults_migrate,
    /// [`Stats::faults_remote`] of this space.
    faults_remote,
    /// [`Stats::faults_map_existing`] of this space.
    faults_map_existing,
    /// [`Stats::faults_spurious`] of this space.
    faults_spurious,
    /// [`Stats::pages_zeroed`] of this space (the fault path's and `prepare_page`'s).
    pages_zeroed,
    /// [`Stats::mmu_maps`] issued under the space lock (an unlocked edit counts its
    /// maps globally).
    mmu_maps,
}

impl SpaceCounters {
    /// Add `n` to `counter` of a space's block. The caller holds the space's lock, so
    /// it is the block's only writer: a plain load and store, no locked add.
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
}
