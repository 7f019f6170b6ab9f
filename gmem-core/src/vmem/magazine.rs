//! Per-CPU magazines and the depot (Bonwick & Adams 2001, sections 3.1-3.3), for one
//! quantum-cache size class.
//!
//! A magazine is a stack of at most [`MAGAZINE_ROUNDS`] cached addresses ("rounds").
//! Each CPU owns a *loaded* and a *previous* magazine under its own lock, which only
//! that CPU takes in the common case, so an allocation or a free is a pop or a push
//! under an uncontended lock. Only when both of a CPU's magazines are empty (on alloc)
//! or full (on free) does it visit the depot, which trades a whole magazine at once
//! (an "exchange"): the depot lock is taken at most once per [`MAGAZINE_ROUNDS`]
//! operations in one direction, and the loaded/previous swap guarantees that a CPU
//! oscillating around a magazine boundary never thrashes the depot.
//!
//! A CPU's two magazines keep their rounds inline in its cache record, as one stack:
//! the previous magazine is always full or empty, so it is the stack's bottom `cap`
//! rounds when full, and the loaded magazine is the rest. The swap then moves and
//! flips nothing (a pop or a push simply crosses the boundary), and only an empty
//! stack (alloc) or a full one (free) leaves the hit path. The stack's height and the
//! counters sit in a header in front of the rounds, so a hit follows no pointer and
//! touches the header's line and the round's; the refill and trade paths are out of
//! line (`#[cold]`). The arena's shared hit path takes the record's lock with
//! `try_lock`: a record another thread holds (a stray CPU id, a reap, a stats
//! snapshot) sends the operation to the full path, which waits for the lock.
//! The depot stores magazines as vectors, and an exchange copies one magazine's rounds.
//! Through an exclusive borrow (`alloc_mut`, `free_mut`) a hit takes no lock at all.
//!
//! The previous magazine is always either full or empty. The depot keeps at most
//! [`DEPOT_MAX_FULL`] full magazines; a free that would exceed that hands the oldest
//! full magazine back to the caller, who returns its rounds to the arena (Linux's IOVA
//! rcache bounds its depot the same way; kmem instead trims the depot's working set
//! from a timer, which an embedded core does not have). Empty magazines are kept for
//! reuse until the next reap.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::sync::Mutex;

/// Rounds per magazine. 32 rounds (256 bytes of addresses) makes a depot visit at most
/// one operation in 32 in a steady stream of allocs or frees, while bounding what one
/// CPU can strand in one size class to two magazines (64 objects, 8 MiB of address
/// space for 32-page IOVA ranges). Linux's IOVA rcache uses 127 rounds per magazine;
/// kmem starts small and grows its magazines under depot contention. 32 sits between:
/// big enough to amortise the depot lock, small enough that per-CPU caches do not hide
/// much of a small device aperture.
pub(super) const MAGAZINE_ROUNDS: usize = 32;

/// Slots of a CPU's record: both of its magazines' rounds.
const SLOTS: usize = 2 * MAGAZINE_ROUNDS;
/// Masks a slot index into the record's `SLOTS` slots.
const SLOT_MASK: usize = SLOTS - 1;
const _: () = assert!(SLOTS.is_power_of_two());

/// Quanta a magazine of a large size class holds: a class of `k` quanta gets
/// `MAGAZINE_QUANTA / k` rounds (at most [`MAGAZINE_ROUNDS`], at least one), so sizes
/// up to 8 quanta keep 32-round magazines and a 128-quantum class keeps two rounds.
/// With a fixed round count a CPU's two magazines of a 128-page class would hold 8192
/// pages, and the depot 32 times that: on a space only a little larger than its live
/// set, the caches of the rarely used large classes then hold the whole slack, the
/// arena runs dry, and every cache is reaped and refilled (the `iova_churn`
/// fragmenting trace reaped 459 times in 26 M allocations, and those refills were
/// nearly all of its 63 k cache misses). kmem sizes its magazines per cache as well
/// (small for large objects); Linux's IOVA range caches stop at 32 pages.
pub(super) const MAGAZINE_QUANTA: u64 = 256;

/// Rounds per magazine for a class of `quanta` quanta (see [`MAGAZINE_QUANTA`]).
pub(super) fn rounds_for(quanta: u64) -> usize {
    let r = MAGAZINE_QUANTA / quanta.max(1);
    (r as usize).clamp(1, MAGAZINE_ROUNDS)
}

/// Full magazines the depot keeps per size class before flushing the oldest to the
/// arena, until the arena first runs dry. Linux's IOVA range cache keeps 32
/// (`MAX_GLOBAL_MAGS`): a class whose population random-walks (frees of one size,
/// allocations of another) reaches the arena, and its lock, about `1 / bound` as
/// often, and every such visit moves a whole magazine through the segment layer under
/// that lock. Each reap on exhaustion halves the bound of every class (down to none):
/// the caches held space the arena needed, and kept at the old bound they would grow
/// back into it and force the next reap.
pub(super) const DEPOT_MAX_FULL: usize = 32;

/// Keeps a per-CPU lock on its own cache line.
#[repr(align(64))]
pub(super) struct Padded<T>(pub T);

/// The counters of a cache layer, summed over CPUs.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct CacheCounts {
    /// Objects held (in magazines and the depot, or in the stack).
    pub objects: u64,
    /// Allocations served from the cache.
    pub hits: u64,
    /// Allocations that found the cache empty.
    pub misses: u64,
    /// Magazines traded with the depot.
    pub exchanges: u64,
    /// Caller allocations through the cache (hits plus served misses).
    pub allocs: u64,
    /// Caller frees into the cache.
    pub frees: u64,
}

/// One CPU's pair of magazines and its counters, as one stack of rounds.
///
/// The previous magazine is always full or empty, so the pair is one stack of at most
/// `2 * cap` rounds: the previous magazine (when full) is its bottom `cap` rounds, the
/// loaded one the rest. The swap of section 3.1 then moves nothing and costs nothing:
/// an alloc that empties the loaded magazine and goes on into a full previous one
/// simply pops on, and a free past a full loaded magazine onto an empty previous one
/// simply pushes on, with exactly the rounds, order and counters of the two-magazine
/// algorithm (with `cap` rounds held, "previous full, loaded empty" and "previous
/// empty, loaded full" behave identically on every later alloc and free). Only an
/// empty stack (alloc) or a full one (free) visits the depot: an alloc loads a full
/// magazine as the new stack, a free trades the bottom magazine (the previous one) for
/// an empty one and shifts the top one (the full loaded one, which becomes the
/// previous) down.
///
/// Layout: everything a hit reads or writes besides the round itself (the fill level,
/// the bound, the hit and free counters) sits in a 40-byte header in front of the
/// rounds, so that with the lock word it shares one cache line and a hit touches two
/// lines of the class, the header and the round's (`repr(C)` keeps the order). A hit
/// is a compare of the fill level with the bound, one masked slot access and the
/// level's and a counter's update: no magazine index to load and no second array to
/// select. On the `iova_churn` fragmenting trace, whose 128 classes are each used
/// about one operation in a hundred, a record's lines are cold more often than not.
#[repr(C)]
pub(super) struct CpuCache {
    /// Rounds held by both magazines (the stack's height).
    len: u32,
    /// Rounds both magazines of this class hold together: twice its rounds per
    /// magazine (`cap`, at most [`MAGAZINE_ROUNDS`]).
    bound: u32,
    hits: u64,
    misses: u64,
    /// Served misses (the allocation after an import); allocations are this plus hits.
    filled: u64,
    frees: u64,
    /// The stack: `len` rounds, oldest first; the class uses `bound` of the slots.
    slots: [u64; SLOTS],
}

impl CpuCache {
    /// Two empty magazines of `cap` rounds (clamped to 1..=[`MAGAZINE_ROUNDS`]).
    pub(super) fn new(cap: usize) -> Self {
        Self {
            len: 0,
            bound: 2 * cap.clamp(1, MAGAZINE_ROUNDS) as u32,
            hits: 0,
            misses: 0,
            filled: 0,
            frees: 0,
            slots: [0; SLOTS],
        }
    }

    /// Rounds per magazine.
    #[inline]
    fn cap(&self) -> usize {
        (self.bound / 2) as usize
    }

    /// Pop the top round (of the loaded magazine, or of a full previous one when the
    /// loaded one is empty); `None` when both magazines are empty.
    ///
    /// The height never exceeds `bound <= SLOTS` (a power of two), so the slot index is
    /// masked into range instead of bounds-checked: the mask changes nothing and saves
    /// the hit path a compare and a branch.
    #[inline(always)]
    fn pop(&mut self) -> Option<u64> {
        let n = self.len.checked_sub(1)?;
        let a = self.slots[n as usize & SLOT_MASK];
        self.len = n;
        Some(a)
    }

    /// Push a round (onto the loaded magazine, or onto an empty previous one when the
    /// loaded one is full); false (nothing changed) when both magazines are full. The
    /// slot index is masked into range as in [`Self::pop`] (`n < bound`).
    #[inline(always)]
    fn push(&mut self, addr: u64) -> bool {
        let n = self.len;
        if n >= self.bound {
            return false;
        }
        self.slots[n as usize & SLOT_MASK] = addr;
        self.len = n + 1;
        true
    }

    /// A cache hit on allocation: pop a round and count the hit; `None` (nothing
    /// changed, nothing counted) when both magazines are empty, which the caller then
    /// hands to [`MagazineLayer::alloc`].
    #[inline(always)]
    pub(super) fn hit_pop(&mut self) -> Option<u64> {
        let a = self.pop()?;
        self.hits += 1;
        Some(a)
    }

    /// The top round, left in place (only for the deliberately broken hit path that
    /// loom model `magazine_hits` must catch).
    #[cfg(gmem_loom_bug = "magazine_hit_split")]
    pub(super) fn peek(&self) -> Option<u64> {
        let n = self.len.checked_sub(1)?;
        Some(self.slots[n as usize & SLOT_MASK])
    }

    /// A cache hit on free: push a round and count the free; false (nothing changed,
    /// nothing counted) when both magazines are full, which the caller then hands to
    /// [`MagazineLayer::free`].
    #[inline(always)]
    pub(super) fn hit_push(&mut self, addr: u64) -> bool {
        let pushed = self.push(addr);
        self.frees += u64::from(pushed);
        pushed
    }

    /// Load the rounds of a full magazine from the depot into the (empty) stack.
    fn load(&mut self, from: &[u64]) {
        let n = from.len().min(self.cap());
        self.slots[..n].copy_from_slice(&from[..n]);
        self.len = n as u32;
    }

    /// Both magazines are full: take the previous one's rounds (the bottom `cap`)
    /// into `out`, and shift the loaded one's down, where it is the previous one.
    fn trade_previous(&mut self, out: &mut Vec<u64>) {
        let cap = self.cap();
        debug_assert_eq!(self.len as usize, 2 * cap, "both magazines are full");
        out.extend_from_slice(&self.slots[..cap]);
        self.slots.copy_within(cap..2 * cap, 0);
        self.len = cap as u32;
    }

    /// Move every round of both magazines into `out`, oldest first.
    fn drain_into(&mut self, out: &mut Vec<u64>) {
        out.extend_from_slice(&self.slots[..self.len as usize]);
        self.len = 0;
    }

    /// Rounds held by both magazines.
    fn held(&self) -> u64 {
        u64::from(self.len)
    }
}

/// Full and empty magazines shared by all CPUs.
struct Depot {
    full: VecDeque<Vec<u64>>,
    empty: Vec<Vec<u64>>,
    exchanges: u64,
    /// Full magazines kept before the oldest is flushed (see [`DEPOT_MAX_FULL`]).
    max_full: usize,
}

/// The shared part of one size class's magazine layer: its depot and magazine size.
///
/// The per-CPU caches are not in here: the arena keeps every class's [`CpuCache`]s in
/// one CPU-major array (module `qcache`) and passes the caller's to each operation,
/// so a hit reaches its CPU's cache record through a pointer every class shares and
/// does not first load a per-class descriptor (one dependent cache line less; Bonwick
/// & Adams and illumos likewise index the per-CPU caches from the cache itself). The
/// operations taking a `&Mutex<CpuCache>` must always be given the same class's
/// caches (the arena's indexing guarantees it).
pub(super) struct MagazineLayer {
    depot: Mutex<Depot>,
    rounds: usize,
}

impl MagazineLayer {
    /// A layer whose magazines hold `rounds` rounds (1 to [`MAGAZINE_ROUNDS`]).
    pub fn new(rounds: usize) -> Self {
        let rounds = rounds.clamp(1, MAGAZINE_ROUNDS);
        Self {
            depot: Mutex::new(Depot {
                full: VecDeque::new(),
                empty: Vec::new(),
                exchanges: 0,
                max_full: DEPOT_MAX_FULL,
            }),
            rounds,
        }
    }

    /// Rounds per magazine (objects an import brings in).
    pub fn rounds(&self) -> usize {
        self.rounds
    }

    /// Pop a round from the CPU cache `cpu`: loaded, then previous, then a full
    /// magazine from the depot. `None` (a miss) when all are empty. Waits for the
    /// CPU's lock (the hit path only tries it).
    #[inline(always)]
    pub fn alloc(&self, cpu: &Mutex<CpuCache>) -> Option<u64> {
        let mut g = cpu.lock();
        let c = &mut *g;
        let addr = match c.pop() {
            Some(a) => a,
            None => self.alloc_refill(c)?,
        };
        c.hits += 1;
        Some(addr)
    }

    /// Both magazines are empty: trade the empty loaded magazine for a full one at the
    /// depot and pop from it. `None` (a miss, counted) when the depot has no full
    /// magazine either.
    #[cold]
    fn alloc_refill(&self, c: &mut CpuCache) -> Option<u64> {
        #[cfg(gmem_loom_bug = "magazine_depot_race")]
        {
            // Deliberately broken (loom model `magazines` must catch it): the full
            // magazine is read under one depot lock and removed under another, so two
            // CPUs can load copies of the same magazine.
            let peeked = self.depot.lock().full.back().cloned();
            if let Some(full) = peeked {
                let mut d = self.depot.lock();
                let mut taken = d.full.pop_back().unwrap_or_default();
                c.load(&full);
                taken.clear();
                d.empty.push(taken);
                d.exchanges += 1;
                drop(d);
                return c.pop();
            }
        }
        let mut d = self.depot.lock();
        match d.full.pop_back() {
            Some(mut full) => {
                // Both CPU magazines are empty: the full one is loaded and its
                // storage joins the depot's empties.
                c.load(&full);
                full.clear();
                d.empty.push(full);
                d.exchanges += 1;
                drop(d);
                c.pop()
            }
            None => {
                c.misses += 1;
                None
            }
        }
    }

    /// [`Self::alloc`] through an exclusive borrow: the loaded magazine is popped
    /// without taking the CPU's lock; anything else takes the locked path.
    #[inline(always)]
    pub fn alloc_mut(&self, cpu: &mut Mutex<CpuCache>) -> Option<u64> {
        let c = cpu.get_mut();
        if let Some(a) = c.pop() {
            c.hits += 1;
            return Some(a);
        }
        self.alloc_locked(cpu)
    }

    /// [`Self::alloc`] kept out of line, for the exclusive path's rare fallback.
    #[inline(never)]
    fn alloc_locked(&self, cpu: &Mutex<CpuCache>) -> Option<u64> {
        self.alloc(cpu)
    }

    /// [`Self::free`] through an exclusive borrow: a push into a loaded magazine with
    /// room takes no lock; anything else takes the locked path.
    #[inline(always)]
    pub fn free_mut(&self, cpu: &mut Mutex<CpuCache>, addr: u64) -> Option<Vec<u64>> {
        let c = cpu.get_mut();
        if c.push(addr) {
            c.frees += 1;
            return None;
        }
        self.free_locked(cpu, addr)
    }

    /// [`Self::free`] kept out of line, for the exclusive path's rare fallback.
    #[inline(never)]
    fn free_locked(&self, cpu: &Mutex<CpuCache>, addr: u64) -> Option<Vec<u64>> {
        self.free(cpu, addr)
    }

    /// Push a freed round into the CPU cache `cpu`. Returns a magazine the depot could
    /// not keep: its rounds must go back to the arena.
    #[inline(always)]
    pub fn free(&self, cpu: &Mutex<CpuCache>, addr: u64) -> Option<Vec<u64>> {
        let mut g = cpu.lock();
        let c = &mut *g;
        c.frees += 1;
        if c.push(addr) {
            return None;
        }
        self.put_full(c, addr)
    }

    /// Load the rounds of an import (after a miss that was then served) into the CPU
    /// cache `cpu`. Returns rounds that did not fit.
    pub fn fill(&self, cpu: &Mutex<CpuCache>, rounds: Vec<u64>) -> Option<Vec<u64>> {
        let mut g = cpu.lock();
        let c = &mut *g;
        c.filled += 1;
        let mut spill: Option<Vec<u64>> = None;
        for addr in rounds {
            if c.push(addr) {
                continue;
            }
            if let Some(m) = self.put_full(c, addr) {
                match &mut spill {
                    Some(s) => s.extend(m),
                    None => spill = Some(m),
                }
            }
        }
        spill
    }

    /// The free algorithm once both magazines are full: trade the previous magazine
    /// for an empty one at the depot (the full loaded one becomes the previous), push
    /// onto the new loaded one, and hand back the depot's oldest full magazine when
    /// the depot is over its bound.
    #[cold]
    fn put_full(&self, c: &mut CpuCache, addr: u64) -> Option<Vec<u64>> {
        let mut d = self.depot.lock();
        let mut full = d.empty.pop().unwrap_or_else(|| Vec::with_capacity(c.cap()));
        c.trade_previous(&mut full);
        d.full.push_back(full);
        d.exchanges += 1;
        let pushed = c.push(addr);
        debug_assert!(pushed, "the loaded magazine is empty after a trade");
        if d.full.len() > d.max_full {
            d.full.pop_front()
        } else {
            None
        }
    }

    /// Take every round (both magazines of each of the class's CPU caches `cpus`, and
    /// the depot's full magazines) into `out`, and drop the depot's empty magazines.
    /// With `shrink` (a reap because the arena ran dry) the depot's bound on full
    /// magazines halves.
    pub fn drain<'a>(
        &self,
        cpus: impl Iterator<Item = &'a Mutex<CpuCache>>,
        out: &mut Vec<u64>,
        shrink: bool,
    ) {
        for c in cpus {
            c.lock().drain_into(out);
        }
        let mut d = self.depot.lock();
        for m in d.full.drain(..) {
            out.extend(m);
        }
        d.empty.clear();
        if shrink {
            d.max_full /= 2;
        }
    }

    /// A consistent count over the class's CPU caches `cpus` (in ascending CPU order):
    /// every CPU lock and then the depot lock are held together, so no magazine is
    /// seen twice or missed while it moves.
    pub fn counts<'a>(&self, cpus: impl Iterator<Item = &'a Mutex<CpuCache>>) -> CacheCounts {
        let guards: Vec<_> = cpus.map(|c| c.lock()).collect();
        let d = self.depot.lock();
        let mut n = CacheCounts {
            exchanges: d.exchanges,
            ..CacheCounts::default()
        };
        n.objects = d.full.iter().map(|m| m.len() as u64).sum();
        for c in &guards {
            n.objects += c.held();
            n.hits += c.hits;
            n.misses += c.misses;
            n.allocs += c.hits + c.filled;
            n.frees += c.frees;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One class's layer with its own CPU caches, driven by CPU id as the arena does.
    struct MagazineLayerTest {
        layer: MagazineLayer,
        cpus: Vec<Padded<Mutex<CpuCache>>>,
    }

    impl MagazineLayerTest {
        fn new(ncpus: usize, rounds: usize) -> Self {
            let layer = MagazineLayer::new(rounds);
            let cpus = (0..ncpus)
                .map(|_| Padded(Mutex::new(CpuCache::new(layer.rounds()))))
                .collect();
            Self { layer, cpus }
        }
        fn rounds(&self) -> usize {
            self.layer.rounds()
        }
        fn alloc(&self, cpu: usize) -> Option<u64> {
            self.layer.alloc(&self.cpus[cpu].0)
        }
        fn free(&self, cpu: usize, addr: u64) -> Option<Vec<u64>> {
            self.layer.free(&self.cpus[cpu].0, addr)
        }
        fn fill(&self, cpu: usize, rounds: Vec<u64>) -> Option<Vec<u64>> {
            self.layer.fill(&self.cpus[cpu].0, rounds)
        }
        fn drain(&self, out: &mut Vec<u64>, shrink: bool) {
            self.layer
                .drain(self.cpus.iter().map(|c| &c.0), out, shrink);
        }
        fn counts(&self) -> CacheCounts {
            self.layer.counts(self.cpus.iter().map(|c| &c.0))
        }
    }

    const M: usize = MAGAZINE_ROUNDS;

    #[test]
    fn a_miss_on_an_empty_layer_then_hits_after_frees_in_lifo_order() {
        let l = MagazineLayerTest::new(2, M);
        assert_eq!(l.alloc(0), None);
        assert!(l.free(0, 1).is_none());
        assert!(l.free(0, 2).is_none());
        assert_eq!(l.alloc(0), Some(2));
        assert_eq!(l.alloc(0), Some(1));
        let n = l.counts();
        assert_eq!((n.hits, n.misses, n.objects, n.exchanges), (2, 1, 0, 0));
    }

    #[test]
    fn two_full_magazines_are_kept_per_cpu_before_the_depot_is_used() {
        let l = MagazineLayerTest::new(1, M);
        for a in 0..(2 * M) as u64 {
            assert!(l.free(0, a).is_none());
        }
        assert_eq!(l.counts().exchanges, 0);
        assert!(l.free(0, 1000).is_none());
        let n = l.counts();
        assert_eq!((n.exchanges, n.objects), (1, 2 * M as u64 + 1));
    }

    #[test]
    fn a_cpu_gets_a_full_magazine_from_the_depot_that_another_cpu_filled() {
        let l = MagazineLayerTest::new(2, M);
        for a in 0..(2 * M + 1) as u64 {
            l.free(0, a);
        }
        // CPU 1 has nothing of its own: its first alloc trades with the depot.
        assert!(l.alloc(1).is_some());
        let n = l.counts();
        assert_eq!((n.exchanges, n.misses), (2, 0));
        for _ in 1..M {
            assert!(l.alloc(1).is_some());
        }
        assert_eq!(l.alloc(1), None, "depot is empty again");
    }

    #[test]
    fn the_depot_flushes_its_oldest_full_magazine_beyond_its_bound() {
        let l = MagazineLayerTest::new(1, M);
        let mut flushed = Vec::new();
        let n = (2 + DEPOT_MAX_FULL) * M + 1;
        for a in 0..n as u64 {
            if let Some(m) = l.free(0, a) {
                flushed.extend(m);
            }
        }
        assert_eq!(flushed, (0..M as u64).collect::<Vec<_>>());
        assert_eq!(l.counts().objects as usize, n - M);
    }

    #[test]
    fn drain_takes_every_round_and_leaves_the_layer_empty() {
        let l = MagazineLayerTest::new(3, M);
        for a in 0..200u64 {
            l.free((a % 3) as usize, a);
        }
        let mut out = Vec::new();
        l.drain(&mut out, false);
        out.sort_unstable();
        assert_eq!(out, (0..200).collect::<Vec<_>>());
        assert_eq!(l.counts().objects, 0);
        assert_eq!(l.alloc(0), None);
    }

    #[test]
    fn rounds_scale_down_with_the_class_size_from_32_to_one() {
        assert_eq!(rounds_for(1), M);
        assert_eq!(rounds_for(8), M);
        assert_eq!(rounds_for(16), 16);
        assert_eq!(rounds_for(128), 2);
        assert_eq!(rounds_for(MAGAZINE_QUANTA), 1);
        assert_eq!(rounds_for(4 * MAGAZINE_QUANTA), 1);
    }

    #[test]
    fn a_two_round_class_trades_with_the_depot_after_four_frees() {
        let l = MagazineLayerTest::new(1, 2);
        assert_eq!(l.rounds(), 2);
        for a in 0..4u64 {
            assert!(l.free(0, a).is_none());
        }
        assert_eq!(l.counts().exchanges, 0, "loaded and previous hold two each");
        assert!(l.free(0, 4).is_none());
        let n = l.counts();
        assert_eq!((n.exchanges, n.objects), (1, 5));
        // LIFO through the CPU's magazines, then the depot's.
        let got: Vec<u64> = (0..5).filter_map(|_| l.alloc(0)).collect();
        assert_eq!(got, [4, 3, 2, 1, 0]);
        assert_eq!(l.alloc(0), None);
    }

    #[test]
    fn a_shrinking_drain_halves_the_depot_bound() {
        let l = MagazineLayerTest::new(1, M);
        let mut out = Vec::new();
        l.drain(&mut out, true);
        let mut flushed = Vec::new();
        let n = (2 + DEPOT_MAX_FULL / 2) * M + 1;
        for a in 0..n as u64 {
            if let Some(m) = l.free(0, a) {
                flushed.extend(m);
            }
        }
        assert_eq!(flushed, (0..M as u64).collect::<Vec<_>>());
        // A plain drain (a caller's reap) leaves the bound alone.
        l.drain(&mut out, false);
        let mut again = Vec::new();
        for a in 0..n as u64 {
            if let Some(m) = l.free(0, a) {
                again.extend(m);
            }
        }
        assert_eq!(again.len(), M);
    }

    #[test]
    fn crossing_between_the_two_magazines_is_lifo_and_never_visits_the_depot() {
        let l = MagazineLayerTest::new(1, 2);
        // Around the boundary of the loaded and previous magazines (two rounds each),
        // back and forth: the stack stays on the CPU.
        for a in 0..3u64 {
            assert!(l.free(0, a).is_none());
        }
        assert_eq!(l.alloc(0), Some(2));
        assert_eq!(l.alloc(0), Some(1));
        assert!(l.free(0, 7).is_none());
        assert!(l.free(0, 8).is_none());
        assert!(l.free(0, 9).is_none());
        assert_eq!(l.counts().exchanges, 0, "four rounds fit the two magazines");
        // A fifth round trades the oldest magazine (0 and 7) to the depot.
        assert!(l.free(0, 10).is_none());
        let got: Vec<u64> = (0..5).filter_map(|_| l.alloc(0)).collect();
        assert_eq!(got, [10, 9, 8, 7, 0]);
        let n = l.counts();
        assert_eq!((n.exchanges, n.objects, n.misses), (2, 0, 0));
    }

    #[test]
    fn fill_loads_an_import_and_spills_what_does_not_fit() {
        let l = MagazineLayerTest::new(1, M);
        assert!(l.fill(0, (0..M as u64).collect()).is_none());
        assert_eq!(l.counts().objects, M as u64);
        assert_eq!(l.counts().allocs, 1);
    }
}
