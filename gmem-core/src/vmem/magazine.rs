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
//! A CPU's two magazines keep their rounds inline in its cache record (`mags[cur]` is
//! the loaded one, `mags[cur ^ 1]` the previous one, and the swap flips `cur`), so a
//! hit follows no pointer; the refill and trade paths are out of line (`#[cold]`).
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

/// A magazine held by a CPU: its rounds inline, so a pop or a push touches the CPU's
/// own cache lines and follows no pointer.
struct Mag {
    len: usize,
    rounds: [u64; MAGAZINE_ROUNDS],
}

// A magazine of the class holds at most `cap <= MAGAZINE_ROUNDS` rounds; the inline
// array is sized for the largest.

impl Mag {
    const EMPTY: Mag = Mag {
        len: 0,
        rounds: [0; MAGAZINE_ROUNDS],
    };

    #[inline]
    fn pop(&mut self) -> Option<u64> {
        let n = self.len.checked_sub(1)?;
        let a = *self.rounds.get(n)?;
        self.len = n;
        Some(a)
    }

    /// Push `addr`; false (nothing changed) when the magazine holds `cap` rounds.
    #[inline]
    fn push(&mut self, addr: u64, cap: usize) -> bool {
        if self.len >= cap {
            return false;
        }
        match self.rounds.get_mut(self.len) {
            Some(slot) => {
                *slot = addr;
                self.len += 1;
                true
            }
            None => false,
        }
    }

    #[inline]
    fn rounds(&self) -> &[u64] {
        &self.rounds[..self.len]
    }

    /// Load the rounds of a full magazine from the depot (at most `MAGAZINE_ROUNDS`).
    fn load(&mut self, from: &[u64]) {
        let n = from.len().min(MAGAZINE_ROUNDS);
        self.rounds[..n].copy_from_slice(&from[..n]);
        self.len = n;
    }
}

/// One CPU's pair of magazines and its counters. The *loaded* magazine is
/// `mags[cur]`, the *previous* one `mags[cur ^ 1]`: the swap of section 3.1 flips
/// `cur` instead of moving rounds.
struct CpuCache {
    cur: usize,
    /// Rounds per magazine of this class.
    cap: usize,
    hits: u64,
    misses: u64,
    allocs: u64,
    frees: u64,
    mags: [Mag; 2],
}

impl CpuCache {
    #[inline]
    fn loaded(&mut self) -> &mut Mag {
        &mut self.mags[self.cur & 1]
    }

    #[inline]
    fn previous(&mut self) -> &mut Mag {
        &mut self.mags[(self.cur & 1) ^ 1]
    }

    #[inline]
    fn swap(&mut self) {
        self.cur ^= 1;
    }

    /// Push onto the loaded magazine; false when it is full.
    #[inline]
    fn push(&mut self, addr: u64) -> bool {
        let cap = self.cap;
        self.loaded().push(addr, cap)
    }

    /// True when the previous magazine is full.
    #[inline]
    fn previous_full(&mut self) -> bool {
        let cap = self.cap;
        self.previous().len >= cap
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

/// The magazine layer of one size class.
pub(super) struct MagazineLayer {
    cpus: Vec<Padded<Mutex<CpuCache>>>,
    depot: Mutex<Depot>,
    rounds: usize,
}

impl MagazineLayer {
    /// Empty magazines of `rounds` rounds (1 to [`MAGAZINE_ROUNDS`]) for `ncpus` CPUs
    /// (at least one).
    pub fn new(ncpus: usize, rounds: usize) -> Self {
        let rounds = rounds.clamp(1, MAGAZINE_ROUNDS);
        let cpus = (0..ncpus.max(1))
            .map(|_| {
                Padded(Mutex::new(CpuCache {
                    cur: 0,
                    cap: rounds,
                    hits: 0,
                    misses: 0,
                    allocs: 0,
                    frees: 0,
                    mags: [Mag::EMPTY, Mag::EMPTY],
                }))
            })
            .collect();
        Self {
            cpus,
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

    #[inline]
    fn cpu(&self, cpu: usize) -> &Mutex<CpuCache> {
        // The arena passes `cpu < ncpus`; an out-of-range id shares CPU 0's magazines
        // (correct, only slower) instead of paying a division on every operation.
        &self.cpus.get(cpu).unwrap_or(&self.cpus[0]).0
    }

    /// Pop a round for CPU `cpu`: loaded, then previous, then a full magazine from the
    /// depot. `None` (a miss) when all are empty.
    #[inline]
    pub fn alloc(&self, cpu: usize) -> Option<u64> {
        let mut g = self.cpu(cpu).lock();
        let c = &mut *g;
        let addr = match c.loaded().pop() {
            Some(a) => a,
            None => self.alloc_refill(c)?,
        };
        c.hits += 1;
        c.allocs += 1;
        Some(addr)
    }

    /// The loaded magazine is empty: swap in a full previous one, or trade the empty
    /// loaded magazine for a full one at the depot; pop from the result. `None` (a
    /// miss, counted) when the depot has no full magazine either.
    #[cold]
    fn alloc_refill(&self, c: &mut CpuCache) -> Option<u64> {
        if c.previous().len != 0 {
            c.swap();
            return c.loaded().pop();
        }
        #[cfg(gmem_loom_bug = "magazine_depot_race")]
        {
            // Deliberately broken (loom model `magazines` must catch it): the full
            // magazine is read under one depot lock and removed under another, so two
            // CPUs can load copies of the same magazine.
            let peeked = self.depot.lock().full.back().cloned();
            if let Some(full) = peeked {
                let mut d = self.depot.lock();
                let mut taken = d.full.pop_back().unwrap_or_default();
                c.loaded().load(&full);
                taken.clear();
                d.empty.push(taken);
                d.exchanges += 1;
                drop(d);
                return c.loaded().pop();
            }
        }
        let mut d = self.depot.lock();
        match d.full.pop_back() {
            Some(mut full) => {
                // Both CPU magazines are empty: the full one is loaded and its
                // storage joins the depot's empties.
                c.loaded().load(&full);
                full.clear();
                d.empty.push(full);
                d.exchanges += 1;
                drop(d);
                c.loaded().pop()
            }
            None => {
                c.misses += 1;
                None
            }
        }
    }

    /// [`Self::alloc`] through an exclusive borrow: the loaded magazine is popped
    /// without taking the CPU's lock; anything else takes the locked path.
    #[inline]
    pub fn alloc_mut(&mut self, cpu: usize) -> Option<u64> {
        if let Some(c) = self.cpus.get_mut(cpu) {
            let c = c.0.get_mut();
            if let Some(a) = c.loaded().pop() {
                c.hits += 1;
                c.allocs += 1;
                return Some(a);
            }
        }
        self.alloc(cpu)
    }

    /// [`Self::free`] through an exclusive borrow: a push into a loaded magazine with
    /// room takes no lock; anything else takes the locked path.
    #[inline]
    pub fn free_mut(&mut self, cpu: usize, addr: u64) -> Option<Vec<u64>> {
        if let Some(c) = self.cpus.get_mut(cpu) {
            let c = c.0.get_mut();
            if c.push(addr) {
                c.frees += 1;
                return None;
            }
        }
        self.free(cpu, addr)
    }

    /// Push a freed round for CPU `cpu`. Returns a magazine the depot could not keep:
    /// its rounds must go back to the arena.
    #[inline]
    pub fn free(&self, cpu: usize, addr: u64) -> Option<Vec<u64>> {
        let mut g = self.cpu(cpu).lock();
        let c = &mut *g;
        c.frees += 1;
        if c.push(addr) {
            return None;
        }
        self.put_full(c, addr)
    }

    /// Load the rounds of an import (after a miss that was then served) for CPU
    /// `cpu`. Returns rounds that did not fit.
    pub fn fill(&self, cpu: usize, rounds: Vec<u64>) -> Option<Vec<u64>> {
        let mut g = self.cpu(cpu).lock();
        let c = &mut *g;
        c.allocs += 1;
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

    /// The free algorithm once the loaded magazine is full: swap in an empty previous
    /// one, or trade the full previous magazine for an empty one at the depot.
    #[cold]
    fn put_full(&self, c: &mut CpuCache, addr: u64) -> Option<Vec<u64>> {
        if c.previous().len == 0 {
            c.swap();
            c.push(addr);
            return None;
        }
        debug_assert!(c.previous_full(), "the previous magazine is full or empty");
        let mut d = self.depot.lock();
        let rounds = c.cap;
        let mut full = d.empty.pop().unwrap_or_else(|| Vec::with_capacity(rounds));
        // The full previous magazine goes to the depot; the (full) loaded one becomes
        // the previous, and the emptied one is loaded.
        full.extend_from_slice(c.previous().rounds());
        c.previous().len = 0;
        c.swap();
        d.full.push_back(full);
        d.exchanges += 1;
        c.push(addr);
        if d.full.len() > d.max_full {
            d.full.pop_front()
        } else {
            None
        }
    }

    /// Take every round (both magazines of every CPU and the depot's full magazines)
    /// into `out`, and drop the depot's empty magazines. With `shrink` (a reap because
    /// the arena ran dry) the depot's bound on full magazines halves.
    pub fn drain(&self, out: &mut Vec<u64>, shrink: bool) {
        for c in &self.cpus {
            let mut c = c.0.lock();
            for m in &mut c.mags {
                out.extend_from_slice(m.rounds());
                m.len = 0;
            }
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

    /// A consistent count: every CPU lock (ascending) and then the depot lock are held
    /// together, so no magazine is seen twice or missed while it moves.
    pub fn counts(&self) -> CacheCounts {
        let guards: Vec<_> = self.cpus.iter().map(|c| c.0.lock()).collect();
        let d = self.depot.lock();
        let mut n = CacheCounts {
            exchanges: d.exchanges,
            ..CacheCounts::default()
        };
        n.objects = d.full.iter().map(|m| m.len() as u64).sum();
        for c in &guards {
            n.objects += (c.mags[0].len + c.mags[1].len) as u64;
            n.hits += c.hits;
            n.misses += c.misses;
            n.allocs += c.allocs;
            n.frees += c.frees;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: usize = MAGAZINE_ROUNDS;

    #[test]
    fn a_miss_on_an_empty_layer_then_hits_after_frees_in_lifo_order() {
        let l = MagazineLayer::new(2, M);
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
        let l = MagazineLayer::new(1, M);
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
        let l = MagazineLayer::new(2, M);
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
        let l = MagazineLayer::new(1, M);
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
        let l = MagazineLayer::new(3, M);
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
        let l = MagazineLayer::new(1, 2);
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
        let l = MagazineLayer::new(1, M);
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
    fn fill_loads_an_import_and_spills_what_does_not_fit() {
        let l = MagazineLayer::new(1, M);
        assert!(l.fill(0, (0..M as u64).collect()).is_none());
        assert_eq!(l.counts().objects, M as u64);
        assert_eq!(l.counts().allocs, 1);
    }
}
