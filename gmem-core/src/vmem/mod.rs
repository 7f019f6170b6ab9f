//! # vmem: resource arenas for virtual ranges and physical frames
//!
//! The general-purpose resource allocator of Bonwick & Adams, "Magazines and Vmem"
//! (USENIX 2001), as illumos `vmem.c` implements it, in safe Rust. The same [`Arena`]
//! type hands out the virtual ranges of an address space, the IOVA ranges of an IOMMU
//! domain and the physical frames of each device's registered memory.
//!
//! ## Big theory statement
//!
//! **1. Vocabulary.** An *arena* manages a set of integers (addresses). The integers
//! come in *spans*: ranges the owner adds with [`Arena::add_span`]. Every allocation
//! is a *segment*: a range inside one span. The *quantum* (a power of two) is the unit
//! of everything: span bases and sizes, allocation sizes and addresses are multiples of
//! it. Spans are disjoint and never merge with each other, even when adjacent, so a
//! segment never straddles two spans (two device memories registered back to back are
//! still two memories).
//!
//! **2. Boundary tags.** Every span and every segment, free or allocated, is a record
//! (a *boundary tag*) in a slab (module `seglist`), named by a `u32` index. All of them are
//! on one circular doubly linked list in address order, where each span's *marker*
//! precedes the segments tiling that span. A segment's list neighbours are therefore
//! the segments physically adjacent to it, and a neighbour that is a marker means "span
//! boundary here": freeing a segment merges it with a free predecessor and a free
//! successor in O(1), and never across a marker. After every operation no two free
//! segments are adjacent.
//!
//! **3. The allocated-segment hash.** Allocated segments are found by start address in
//! a hash table (module `addrmap`: linear probing, a 32-bit tag of the address and the
//! index side by side in one 8-byte slot, the full address confirmed against the
//! record, so a lookup is usually one cache line), so a free is O(1): look the address up, check the size (a wrong size
//! or an address that is not allocated is a typed [`FreeError`] and changes nothing),
//! coalesce, and put the result on a freelist. The hash is what makes a free of the
//! arena path always validated, whatever `check_frees` says. On an arena of a million
//! live segments the slot and then the record it names are two dependent memory
//! accesses, each costing about two whole small-arena frees; a caller that knows its
//! next frees announces them ([`Arena::prefetch_free`], [`Arena::prefetch_frees`]),
//! and the arena prefetches both lines ahead of the free (the unmap queue's drain
//! does this for the ranges it releases after a TLB invalidation).
//!
//! **4. Segregated freelists, and why instant-fit is O(1) and still a good fit.**
//! Free segments are on 1920 freelists, *classes* (module `freelist`), counted in
//! quanta: a size below 64 quanta has a class of its own, and every power of two above
//! is split into 32 equal sub-ranges, one class each (the two-level segregated fit,
//! TLSF, of Masmano et al. 2004). Classes are ordered by size, so every segment of a
//! class is larger than every segment of a lower one. A two-level bitmap (a `u64` of
//! non-empty groups of 32 classes, a `u32` per group of non-empty classes) finds "the
//! lowest non-empty class at or above `c`" with two masks and two `trailing_zeros`.
//! For a request of `size` bytes, the *first sufficient* class is the size's own class
//! when `size` is that class's smallest size (always, below 64 quanta), else the next
//! class up: every segment there fits, so instant-fit takes the head of the lowest
//! non-empty class at or above it without looking at any other segment; removing the
//! head and inserting the remainder are O(1) list operations; so an allocation costs
//! the same with ten segments or ten million. Only when no class at or above it is
//! occupied does instant-fit fall back to searching the size's own class, whose
//! segments may or may not be large enough.
//!
//! *Why not power-of-two lists.* Bonwick & Adams (and illumos) keep one list per
//! power of two and round a request up to the next one, so a 3-page request takes
//! the most recently freed segment of the 4..7-page list and leaves a 1..4-page
//! remainder. On a churn of 1..32-page ranges that remainder is usually of a size no
//! later request rounds to, and the space shreds: 29 645 free segments at 64k live
//! ranges where a best fit keeps a handful, and every coalescing free then touches
//! cold records. With a class per size (and classes 1/32 of a power of two wide above
//! that), the lowest non-empty sufficient class is the best fit up to the width of a
//! class, so instant-fit splits a segment only when no exact hole exists and keeps
//! the free-segment count within a small factor of best fit's (the `iova_churn`
//! bench prints both, and a test bounds it), still in constant time. Linux's IOVA
//! allocator reaches the same end differently (its range caches serve the six
//! power-of-two sizes exactly, in front of an address-ordered tree); illumos leaves
//! the rounding in and relies on its quantum caches.
//!
//! The other policies ([`FitPolicy`]) search: *best-fit* scans classes from the
//! size's own upward and takes the smallest fitting segment of the first class that
//! has one; *first-fit* takes the fitting segment at the lowest address; *next-fit*
//! keeps a *rotor* in the address list just after its previous allocation and walks
//! forward from it, wrapping around once, so freed addresses are reused as late as
//! possible (good for IDs, and for IOVAs whose stale IOTLB entries must not be hit by
//! a new mapping).
//!
//! **5. The constrained allocator.** [`Arena::xalloc`] is the one constrained entry
//! point (`vmem_xalloc`): size, `align` and `phase` (the address is `phase` modulo
//! `align`), `nocross` (the allocation does not cross a multiple of it), and a window
//! `[min, max]` (`max` is the inclusive last byte, so a window reaching 2^64 needs no
//! 65-bit value). The constraint is validated first; a constraint no arena could ever
//! satisfy is [`AllocError::BadConstraint`] with a [`ConstraintProblem`]. The search
//! then visits free segments from the size's list upward in the order of the chosen
//! policy and, per segment, computes the lowest address inside it satisfying
//! everything (module `constraint`): clamp to the window, round up to the phase, and if
//! that crosses a `nocross` boundary round up to the boundary and to the phase again.
//! The chosen segment is split into up to three parts (free, allocated, free). In
//! debug builds the result is asserted against every constraint. Constrained
//! allocations never come from the quantum caches (their objects are not aligned or
//! placed on request).
//!
//! **6. Quantum caches.** Most requests are a few quanta. For sizes up to
//! `qcache_max` the arena keeps one object cache per size (module `qcache`) of segments
//! already carved out of the arena: an allocation pops one, a free pushes it back, and
//! the arena lock, the freelists and the hash are not touched. A cache that runs dry
//! imports a batch of segments under one arena lock; a cache that overflows returns
//! the excess. When the arena itself runs out of space, every cache is reaped (all
//! cached objects returned and coalesced) and the allocation retried once before it
//! fails with [`AllocError::NoSpace`]. Such a reap is counted ([`ArenaStats::reaps`])
//! and halves every depot's bound on full magazines: caches that held space the arena
//! needed would otherwise grow back into it and force the next reap. Cached segments are allocated as far as the
//! segment layer is concerned ([`ArenaStats::cached`] counts them apart from what
//! callers hold). With `check_frees`, each cache remembers the objects it handed out,
//! so a double free of a cached size is a typed error; without it, frees of cached
//! sizes are trusted (an address space checks its own region map before it frees).
//!
//! **7. Magazines and the depot.** With `magazines`, a cache is per-CPU
//! (module `magazine`): each CPU has a *loaded* and a *previous* magazine (stacks of up to
//! 32 objects; a class of `k > 8` quanta gets `256 / k` rounds, at least one, so what a
//! magazine holds is bounded in bytes as well) under its own lock, so the common
//! alloc/free is a pop/push under a lock no other CPU takes. An alloc pops the loaded magazine; if it is empty and the
//! previous is full, the two swap; if both are empty, the CPU trades its empty
//! magazine for a full one at the shared *depot*; if the depot has none, the CPU
//! imports a magazine's worth of objects from the arena. A free is the mirror image
//! (push; swap with an empty previous; trade the full previous for an empty magazine
//! at the depot). The swap makes a CPU that oscillates around a magazine boundary stay
//! local; the depot balances CPUs that mostly allocate against CPUs that mostly free.
//! A CPU's two magazines hold their rounds inline in its cache record and the swap
//! flips an index, so a hit is a lock, a pop or push in lines the CPU already owns,
//! and an unlock: no pointer is followed and no rounds move. The records of every
//! class sit in one CPU-major array reached from the caches' base pointer, with the
//! lock, fill levels and counters in one header line, so a hit touches two lines of
//! its class (header, round) and no per-class descriptor; the depots live apart. The depot keeps its
//! magazines as vectors and an exchange copies one magazine's rounds (at most once per
//! 32 operations in one direction). With magazines and trusted frees, `alloc` and
//! `free` are inlined into their caller as a *hit path* only: the class from one shift
//! and mask (and, for `alloc`, one compare against a gate that failure injection and
//! next fit close), the CPU's record from one multiply (none on CPU 0), then
//! `try_lock`, pop or push, count, unlock (one locked read-modify-write; the unlock is
//! a plain release store). Anything else (both magazines empty or full, a record
//! whose lock is held, injection, next fit, checked frees, a bad size) declines
//! without changing anything and takes the full path, out of line, which waits for
//! the lock. Since a CPU's two magazines are one stack in its record, the loaded /
//! previous swap is a hit too.
//!
//! An owner holding the arena exclusively (`&mut`, e.g. one thread driving one IOMMU
//! domain) may call [`Arena::alloc_mut`] and [`Arena::free_mut`]: the same caches and
//! counters, but a hit reaches the CPU's magazines through `Mutex::get_mut`, with no
//! atomic read-modify-write at all; anything other than a hit takes the locked path.
//!
//! **8. Locking.** The segment layer has one lock (the arena lock). Each per-CPU cache,
//! each depot, each stack cache and each outstanding set has its own. The order,
//! outermost first, is: arena lock, then a class's per-CPU locks in ascending CPU
//! order, then its depot lock; outstanding sets are leaves. Only [`Arena::stats`]
//! nests cache locks inside the arena lock (to take a snapshot in which `total ==
//! allocated + cached + free` holds exactly); every other path takes the arena lock
//! while holding no cache lock (imports, flushes and reaps move objects with the cache
//! locks dropped), so the reap on exhaustion cannot deadlock against itself. All locks
//! and atomics come from [`crate::sync`], so loom models exercise the real code.
//!
//! **9. Failure injection and counters.** With the `test-util` feature,
//! `Arena::set_fail_every` makes every n-th allocation attempt fail with
//! `AllocError::Injected` (illumos `vmem_mtbf`), to test callers' error paths. [`Arena::stats`] reports spans, bytes (total, allocated,
//! cached, free), operations, failures, cache hits and misses, depot exchanges and
//! segment counts.
//!
//! **10. Errors and overflow.** Every operation validates its input before it changes
//! anything; an error leaves the arena as it was. All address arithmetic is checked or
//! provably in range: segments are described by their start and size and bounds are
//! inclusive, so a span may end exactly at 2^64 and be allocated up to its last byte.

mod addrmap;
mod allocator;
mod config;
mod constraint;
mod error;
mod freelist;
mod magazine;
mod qcache;
mod seglist;
mod stats;
#[cfg(test)]
mod tests;

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

pub use config::{ArenaConfig, FitPolicy};
pub use constraint::Constraint;
pub use error::{AllocError, ArenaError, ConstraintProblem, FreeError, SpanError};
pub use stats::ArenaStats;

use allocator::SegmentAllocator;
use constraint::Placement;
use qcache::{Class, QuantumCaches};
use seglist::Kind;

use crate::platform::Platform;
#[cfg(feature = "test-util")]
use crate::sync::AtomicU32;
use crate::sync::{AtomicU64, Mutex, Ordering};

/// Ask the CPU to start loading the cache line holding `r`, without waiting for it.
///
/// Used where the segment layer knows which cold record or hash slot the *next*
/// operation will read (the new head of a freelist, the hash slot of its address), so
/// that on a large arena the next operation finds it in cache instead of waiting on
/// memory. A hint only: on targets without the instruction it does nothing.
#[inline(always)]
fn prefetch<T>(r: &T) {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
    // SAFETY: `prefetcht0` reads nothing architecturally visible, cannot fault and
    // changes no state; `r` is a valid reference in any case. SSE is enabled (cfg).
    #[allow(unsafe_code, unused_unsafe)]
    unsafe {
        core::arch::x86_64::_mm_prefetch(
            (r as *const T).cast::<i8>(),
            core::arch::x86_64::_MM_HINT_T0,
        );
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
    let _ = r;
}

/// The most quantum-cache size classes an arena may have (`qcache_max / quantum`).
///
/// 128 lets an owner cache every size of a workload whose ranges reach 128 pages (the
/// `iova_churn` bench's fragmenting trace: with a 32-page limit, the tenth of its
/// operations above it went to the segment layer and cost more than the other nine
/// tenths together). A class costs two inline magazines per CPU and a depot, nothing
/// until it is used; an unused class holds no address space.
pub const MAX_QCACHE_CLASSES: u64 = 128;

/// How many announced frees ([`Arena::prefetch_free`]) a hint waits before its second
/// stage: the hash slot prefetched when a free is announced has this many
/// announcements' time to arrive before it is read to find the record to prefetch.
pub const FREE_AHEAD_CALLS: usize = 4;

/// Per-CPU structures are sized by the platform's CPU count, capped at this.
const MAX_CPUS: usize = 4096;

/// A vmem arena: a set of spans from which segments are allocated. `Send + Sync`;
/// every method takes `&self`.
pub struct Arena {
    config: ArenaConfig,
    segments: Mutex<SegmentAllocator>,
    caches: QuantumCaches,
    platform: Option<Arc<dyn Platform>>,
    ncpus: usize,
    #[cfg(feature = "test-util")]
    fail_every: AtomicU32,
    #[cfg(feature = "test-util")]
    attempts: AtomicU64,
    failures: AtomicU64,
    reaps: AtomicU64,
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("config", &self.config)
            .field("ncpus", &self.ncpus)
            .finish_non_exhaustive()
    }
}

impl Arena {
    /// An empty arena. `platform` picks the per-CPU magazines (`None`: one CPU).
    ///
    /// # Errors
    /// [`ArenaError`] for a quantum that is not a power of two or a cache limit that is not
    /// a multiple of it.
    pub fn new(
        config: ArenaConfig,
        platform: Option<Arc<dyn Platform>>,
    ) -> Result<Arena, ArenaError> {
        let quantum = config.quantum;
        if !quantum.is_power_of_two() {
            return Err(ArenaError::BadQuantum { quantum });
        }
        let qcache_max = config.qcache_max;
        if qcache_max % quantum != 0 || qcache_max / quantum > MAX_QCACHE_CLASSES {
            return Err(ArenaError::BadQcacheMax { qcache_max });
        }
        let ncpus = platform
            .as_ref()
            .map_or(1, |p| p.cpu_count().clamp(1, MAX_CPUS));
        let caches = QuantumCaches::new(
            quantum,
            qcache_max,
            config.magazines,
            config.check_frees,
            if config.magazines { ncpus } else { 1 },
        );
        // Next-fit allocations bypass the caches (see `alloc_fit`): no alloc hit path.
        caches.set_alloc_hits(config.fit != FitPolicy::NextFit);
        Ok(Arena {
            config,
            segments: Mutex::new(SegmentAllocator::new(quantum)),
            caches,
            platform,
            ncpus,
            #[cfg(feature = "test-util")]
            fail_every: AtomicU32::new(0),
            #[cfg(feature = "test-util")]
            attempts: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            reaps: AtomicU64::new(0),
        })
    }

    /// The configuration the arena was created with.
    pub fn config(&self) -> &ArenaConfig {
        &self.config
    }

    /// Add the span `[base, base + size)`. It may end exactly at 2^64; it must not
    /// overlap an existing span; it never coalesces with its neighbours.
    ///
    /// # Errors
    /// [`SpanError`] for an unaligned, empty, overflowing or overlapping span.
    pub fn add_span(&self, base: u64, size: u64) -> Result<(), SpanError> {
        self.segments.lock().add_span(base, size)
    }

    /// Allocate `size` bytes with the configured fit policy, through the quantum caches
    /// when `size <= qcache_max` (see [`Arena::alloc_fit`]).
    ///
    /// # Errors
    /// [`AllocError`] for a size of 0 or above the arena, no free segment, or an injected
    /// failure.
    #[inline(always)]
    pub fn alloc(&self, size: u64) -> Result<u64, AllocError> {
        if let Some(addr) = self.alloc_hit(size) {
            return Ok(addr);
        }
        self.alloc_slow(size)
    }

    /// The hit path of [`Arena::alloc`], inlined into the caller: a size the per-CPU
    /// magazines serve while the alloc hit path is on (no failure injection, a policy
    /// the caches serve: one compare, see `QuantumCaches::hit_class_alloc`), the CPU's
    /// record free to lock, and a round in its magazines. Everything else (`None`,
    /// nothing changed) takes [`Arena::alloc_fit`], out of line, which checks and
    /// counts as before.
    #[inline(always)]
    fn alloc_hit(&self, size: u64) -> Option<u64> {
        let k = self.caches.hit_class_alloc(size)?;
        self.caches.hit_alloc(self.cpu(), k)
    }

    /// [`Arena::alloc`] after its hit path declined.
    #[inline(never)]
    fn alloc_slow(&self, size: u64) -> Result<u64, AllocError> {
        self.alloc_fit(size, self.config.fit)
    }

    /// Allocate `size` bytes with policy `fit`. Sizes up to `qcache_max` come from the
    /// quantum caches unless `fit` is [`FitPolicy::NextFit`] (as in illumos: a next-fit
    /// caller wants late reuse, which a LIFO cache would defeat).
    ///
    /// # Errors
    /// [`AllocError`] as for [`Arena::alloc`].
    #[inline]
    pub fn alloc_fit(&self, size: u64, fit: FitPolicy) -> Result<u64, AllocError> {
        let r = self.alloc_unchecked_count(size, fit);
        if r.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    #[inline]
    fn alloc_unchecked_count(&self, size: u64, fit: FitPolicy) -> Result<u64, AllocError> {
        Placement::check_size(size, self.config.quantum)?;
        self.inject()?;
        if fit != FitPolicy::NextFit {
            if let Some(class) = self.caches.class_of(size) {
                return self.cache_alloc(class);
            }
        }
        self.arena_alloc(&Placement::plain(size, self.config.quantum), fit)
    }

    /// [`Arena::alloc`] for an exclusive owner: the same policy, caches, counters and
    /// failure injection, but a quantum-cache hit pops the CPU's loaded magazine
    /// without taking its lock (the `&mut` borrow proves no other thread can reach
    /// the arena), so the common case touches no atomic read-modify-write. A miss, or
    /// a size the caches do not serve, takes the locked path of [`Arena::alloc`]. For
    /// an arena one thread owns (one IOMMU domain under its owner's lock, a
    /// single-threaded simulator); an arena shared through an `Arc` uses
    /// [`Arena::alloc`].
    ///
    /// # Errors
    /// As [`Arena::alloc`].
    #[inline(always)]
    pub fn alloc_mut(&mut self, size: u64) -> Result<u64, AllocError> {
        if let Some(k) = self.caches.hit_class_alloc(size) {
            let cpu = self.cpu();
            if let Some(addr) = self.caches.hit_alloc_mut(cpu, k) {
                return Ok(addr);
            }
        }
        self.alloc_mut_slow(size)
    }

    /// [`Arena::alloc_mut`] after its hit path declined.
    #[inline(never)]
    fn alloc_mut_slow(&mut self, size: u64) -> Result<u64, AllocError> {
        let fit = self.config.fit;
        if fit != FitPolicy::NextFit && Placement::check_size(size, self.config.quantum).is_ok() {
            let cpu = self.cpu();
            #[cfg(feature = "test-util")]
            let injecting = self.fail_every.load(Ordering::Relaxed) != 0;
            #[cfg(not(feature = "test-util"))]
            let injecting = false;
            if let (Some(mut class), false) = (self.caches.class_of_mut(size), injecting) {
                if let Some(addr) = class.alloc_mut(cpu) {
                    class.shared().track(addr);
                    return Ok(addr);
                }
                // The miss is counted; import as `cache_alloc` does after one.
                if let Some(class) = self.caches.class_of(size) {
                    let r = self.cache_import(class, cpu);
                    if r.is_err() {
                        self.failures.fetch_add(1, Ordering::Relaxed);
                    }
                    return r;
                }
            }
        }
        self.alloc_fit(size, fit)
    }

    /// [`Arena::free`] for an exclusive owner: a free of a cached size pushes onto the
    /// CPU's loaded magazine without taking its lock when it has room; everything else
    /// is [`Arena::free`].
    ///
    /// # Errors
    /// As [`Arena::free`]; nothing changes on error.
    #[inline(always)]
    pub fn free_mut(&mut self, addr: u64, size: u64) -> Result<(), FreeError> {
        if let Some(k) = self.caches.hit_class_free(addr, size) {
            let cpu = self.cpu();
            if self.caches.hit_free_mut(cpu, k, addr) {
                return Ok(());
            }
        }
        self.free_mut_slow(addr, size)
    }

    /// [`Arena::free_mut`] after its hit path declined.
    #[inline(never)]
    fn free_mut_slow(&mut self, addr: u64, size: u64) -> Result<(), FreeError> {
        let q = self.config.quantum;
        if size == 0 || (addr | size) & (q - 1) != 0 {
            return Err(FreeError::Unaligned { addr, size });
        }
        let cpu = self.cpu();
        if let Some(mut class) = self.caches.class_of_mut(size) {
            if class.shared().untrack(addr) {
                if let Some(flush) = class.free_mut(cpu, addr) {
                    self.release(&flush);
                }
                return Ok(());
            }
        }
        self.segments.get_mut().free(addr, size)
    }

    /// Allocate under a constraint (`vmem_xalloc`). Never served from the caches. The
    /// result satisfies every part of `c` (asserted in debug builds).
    ///
    /// # Errors
    /// [`AllocError::BadConstraint`] for contradictory constraints, [`AllocError::NoSpace`]
    /// when no segment satisfies them, `AllocError::Injected` for an injected failure (feature `test-util`);
    /// the arena is unchanged.
    pub fn xalloc(&self, c: &Constraint) -> Result<u64, AllocError> {
        let r = Placement::from_constraint(c, self.config.quantum).and_then(|p| {
            self.inject()?;
            let addr = self.arena_alloc(&p, c.fit)?;
            debug_assert!(p.satisfied_by(addr), "xalloc postcondition at {addr:#x}");
            Ok(addr)
        });
        if r.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Split an allocation of `size` bytes at `addr` (from [`Arena::xalloc`] or an
    /// uncached [`Arena::alloc`]) into allocations of `piece` bytes each, freed one by
    /// one afterwards. Used by physical memory: a 2 MiB run of frames allocated for bulk
    /// zeroing is released page by page as pages migrate or are evicted.
    ///
    /// # Errors
    /// [`FreeError`] when `[addr, addr + size)` is not one allocated segment or `piece`
    /// does not divide it into quantum multiples; nothing changes then.
    pub fn split(&self, addr: u64, size: u64, piece: u64) -> Result<(), FreeError> {
        let q = self.config.quantum;
        if size == 0 || (addr | size) & (q - 1) != 0 {
            return Err(FreeError::Unaligned { addr, size });
        }
        self.segments.lock().split(addr, size, piece)
    }

    /// Free `size` bytes at `addr`, allocated by [`Arena::alloc`], [`Arena::alloc_fit`]
    /// or [`Arena::xalloc`]. A free of a cached size goes to its quantum cache after
    /// validation (or trusted, without `check_frees`); any other free is validated
    /// through the allocated-segment hash. On error nothing changes.
    ///
    /// # Errors
    /// [`FreeError`] when `[addr, addr + size)` is not exactly an allocated segment (a
    /// double free, a wrong size); nothing changes then.
    #[inline(always)]
    pub fn free(&self, addr: u64, size: u64) -> Result<(), FreeError> {
        if let Some(k) = self.caches.hit_class_free(addr, size) {
            if self.caches.hit_free(self.cpu(), k, addr) {
                return Ok(());
            }
        }
        self.free_slow(addr, size)
    }

    /// [`Arena::free`] after its hit path declined: validation, the full magazine
    /// algorithm, or the segment layer.
    #[inline(never)]
    fn free_slow(&self, addr: u64, size: u64) -> Result<(), FreeError> {
        let q = self.config.quantum;
        if size == 0 || (addr | size) & (q - 1) != 0 {
            return Err(FreeError::Unaligned { addr, size });
        }
        if let Some(class) = self.caches.class_of(size) {
            if class.untrack(addr) {
                if let Some(flush) = class.free(self.cpu(), addr) {
                    self.release(&flush);
                }
                return Ok(());
            }
        }
        self.segments.lock().free(addr, size)
    }

    /// Announce a free of `size` bytes at `addr` that the caller will make soon, so
    /// that the free finds its segment's hash slot and record in cache.
    ///
    /// On an arena of many live segments a free of a random one waits on two
    /// dependent cache misses: the allocated-segment hash slot (found from the
    /// address), then the record it names. A caller that knows its next frees (a queue
    /// of unmaps, an IOMMU flush queue, a munmap of many ranges) announces each one,
    /// in the order it will free them, a few frees ahead: the arena prefetches the
    /// slot at once and, [`FREE_AHEAD_CALLS`] announcements later, reads the slot (by
    /// then in cache) and prefetches the record. Announce about twice that many frees
    /// ahead. A hint only: it changes nothing, and a wrong, stale or duplicate
    /// announcement costs a wasted prefetch, never an error. A size a quantum cache
    /// serves is ignored (its free will not reach the segment layer). The rest takes
    /// the arena lock briefly, and only when it is free: a hint never waits for
    /// another CPU (a dropped announcement only leaves its free unprefetched).
    pub fn prefetch_free(&self, addr: u64, size: u64) {
        if self.caches.class_of(size).is_some() {
            return;
        }
        if let Some(mut segments) = self.segments.try_lock() {
            segments.prefetch_free(addr);
        }
    }

    /// Announce a batch of frees the caller will make soon, all at once: the ranges
    /// of an unmap queue about to be released after its TLB invalidation, say.
    /// Every hash slot is prefetched, then every record, so the misses of the batch
    /// overlap one another and the invalidation. Hints only, as
    /// [`Arena::prefetch_free`] (sizes a quantum cache serves are skipped, the lock is
    /// only tried); the iterator is walked twice.
    pub fn prefetch_frees<I>(&self, frees: I)
    where
        I: IntoIterator<Item = (u64, u64)>,
        I::IntoIter: Clone,
    {
        let addrs = frees
            .into_iter()
            .filter(|&(_, size)| self.caches.class_of(size).is_none())
            .map(|(addr, _)| addr);
        if let Some(mut segments) = self.segments.try_lock() {
            segments.prefetch_batch(addrs);
        }
    }

    /// Free `size / piece` adjacent allocations of `piece` bytes each from `addr` (the
    /// pieces of an [`Arena::split`] run, released together) in one step: each piece is
    /// validated as [`Arena::free`] would, then they coalesce once. A piece size served
    /// by a quantum cache is freed piece by piece through it, in address order.
    ///
    /// # Errors
    /// [`FreeError`] when some piece is not exactly an allocated segment of `piece`
    /// bytes; nothing changes then (for a cached piece size: the pieces before it
    /// were freed).
    pub fn free_run(&self, addr: u64, size: u64, piece: u64) -> Result<(), FreeError> {
        let q = self.config.quantum;
        if size == 0 || piece == 0 || (addr | size | piece) & (q - 1) != 0 || size % piece != 0 {
            return Err(FreeError::Unaligned { addr, size });
        }
        if self.caches.class_of(piece).is_some() {
            for k in 0..size / piece {
                self.free(addr + k * piece, piece)?;
            }
            return Ok(());
        }
        self.segments.lock().free_run(addr, size, piece)
    }

    /// Return every cached object (magazines, depots, stacks) to the arena, where it
    /// coalesces with its free neighbours.
    pub fn reap(&self) {
        self.reap_count();
    }

    /// A consistent snapshot of the counters.
    pub fn stats(&self) -> ArenaStats {
        let seg = self.segments.lock();
        let s = seg.counts();
        let mut st = ArenaStats {
            spans: s.spans,
            total: s.total,
            free: s.free,
            segments: s.segments,
            free_segments: s.free_segments,
            allocs: s.allocs,
            frees: s.frees,
            failures: self.failures.load(Ordering::Relaxed),
            reaps: self.reaps.load(Ordering::Relaxed),
            ..ArenaStats::default()
        };
        for class in self.caches.classes() {
            let n = class.counts();
            st.cached = st
                .cached
                .saturating_add(n.objects.saturating_mul(class.size()));
            st.cache_hits += n.hits;
            st.cache_misses += n.misses;
            st.depot_exchanges += n.exchanges;
            st.allocs += n.allocs;
            st.frees += n.frees;
        }
        drop(seg);
        st.allocated = st.total.saturating_sub(st.free).saturating_sub(st.cached);
        st
    }

    /// Failure injection (illumos `vmem_mtbf`): from now on every `n`-th allocation
    /// attempt (alloc, alloc_fit, xalloc with valid input) fails with
    /// `AllocError::Injected`; `0` turns injection off. Only with the `test-util` feature.
    #[cfg(feature = "test-util")]
    pub fn set_fail_every(&self, n: u32) {
        self.attempts.store(0, Ordering::Relaxed);
        self.fail_every.store(n, Ordering::SeqCst);
        // The alloc hit path does not count attempts: it is off while injecting. The
        // gate follows the last value stored, whatever concurrent calls interleave:
        // each caller re-reads the value after setting the gate from it, and sets it
        // again if another call changed the value in between.
        let next_fit = self.config.fit == FitPolicy::NextFit;
        let mut seen = n;
        loop {
            self.caches.set_alloc_hits(seen == 0 && !next_fit);
            let now = self.fail_every.load(Ordering::SeqCst);
            if now == seen {
                break;
            }
            seen = now;
        }
    }

    /// True when `addr` lies inside a segment handed out, to a caller or to a quantum
    /// cache. For invariant checks: it walks the segments of the containing span.
    pub fn contains_allocated(&self, addr: u64) -> bool {
        self.segments.lock().contains_allocated(addr)
    }

    /// The CPU whose magazines serve the caller.
    #[inline(always)]
    fn cpu(&self) -> usize {
        if self.ncpus <= 1 {
            return 0;
        }
        match &self.platform {
            Some(p) => {
                let c = p.current_cpu();
                // The platform promises `c < ncpus`; divide only if it does not.
                if c < self.ncpus {
                    c
                } else {
                    c % self.ncpus
                }
            }
            _ => 0,
        }
    }

    #[inline]
    #[cfg(feature = "test-util")]
    fn inject(&self) -> Result<(), AllocError> {
        let n = self.fail_every.load(Ordering::Relaxed);
        if n == 0 {
            return Ok(());
        }
        let k = self
            .attempts
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1);
        if k % u64::from(n) == 0 {
            Err(AllocError::Injected)
        } else {
            Ok(())
        }
    }

    /// Without `test-util` nothing can turn injection on.
    #[inline(always)]
    #[cfg(not(feature = "test-util"))]
    fn inject(&self) -> Result<(), AllocError> {
        Ok(())
    }

    /// Allocate from the segment layer; on failure reap the caches and retry once.
    fn arena_alloc(&self, p: &Placement, fit: FitPolicy) -> Result<u64, AllocError> {
        loop {
            {
                let mut seg = self.segments.lock();
                if let Some(addr) = seg.alloc(p, fit, Kind::Alloc) {
                    seg.allocs += 1;
                    return Ok(addr);
                }
            }
            if self.reap_on_exhaustion() == 0 {
                return Err(AllocError::NoSpace { size: p.size });
            }
        }
    }

    /// Allocate from a quantum cache; on a miss import a batch (reaping and retrying
    /// once if the arena is full).
    #[inline]
    fn cache_alloc(&self, class: Class<'_>) -> Result<u64, AllocError> {
        let cpu = self.cpu();
        if let Some(addr) = class.alloc(cpu) {
            class.track(addr);
            return Ok(addr);
        }
        self.cache_import(class, cpu)
    }

    /// After a cache miss on `cpu`: import a batch into `class` and hand out one of
    /// it (reaping and retrying once if the arena is full).
    fn cache_import(&self, class: Class<'_>, cpu: usize) -> Result<u64, AllocError> {
        let mut batch = Vec::with_capacity(class.import_count());
        loop {
            self.segments
                .lock()
                .import(class.size(), class.import_count(), &mut batch);
            if !batch.is_empty() || self.reap_on_exhaustion() == 0 {
                break;
            }
        }
        let Some(addr) = batch.pop() else {
            return Err(AllocError::NoSpace { size: class.size() });
        };
        if let Some(spill) = class.fill(cpu, batch) {
            self.release(&spill);
        }
        class.track(addr);
        Ok(addr)
    }

    /// Give cached objects back to the segment layer.
    fn release(&self, objs: &[u64]) {
        if objs.is_empty() {
            return;
        }
        let mut seg = self.segments.lock();
        for &a in objs {
            let known = seg.release_cached(a);
            debug_assert!(known || !self.config.check_frees, "unknown cached {a:#x}");
        }
    }

    /// The reap of an allocation that found the segment layer full: counted in
    /// [`ArenaStats::reaps`] when it returned anything.
    fn reap_on_exhaustion(&self) -> usize {
        let n = self.reap_caches(true);
        if n != 0 {
            self.reaps.fetch_add(1, Ordering::Relaxed);
        }
        n
    }

    /// Reap every cache; returns the number of objects returned.
    fn reap_count(&self) -> usize {
        self.reap_caches(false)
    }

    /// Reap every cache (with `shrink`, halving every depot's bound: the arena ran
    /// dry); returns the number of objects returned.
    fn reap_caches(&self, shrink: bool) -> usize {
        if self.caches.is_empty() {
            return 0;
        }
        let mut objs = Vec::new();
        for class in self.caches.classes() {
            class.drain(&mut objs, shrink);
        }
        self.release(&objs);
        objs.len()
    }

    /// Check the segment layer's structural invariants (tests only).
    #[cfg(test)]
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        self.segments.lock().check()
    }
}
