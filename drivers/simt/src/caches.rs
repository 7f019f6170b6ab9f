//! Pluggable translation caches for the SIMT GPU: the trait a design implements and the
//! small set-associative array every design is built from.
//!
//! [`GpuCaches`] is a [`TranslationCaches`] organisation (what [`gmem_sim::SimMmu`]
//! drives) that also reports what is particular to it ([`DesignStats`]: subregion
//! hits, memory-subregion-cache traffic, the extra table reads a coalescing walk made,
//! the lookups a dynamic-energy model charges). [`Plugged`] boxes one so that
//! [`crate::machine::SimtMachine::integrated_with`] can build the integrated GPU over
//! any of them. [`Ways`] is the array: entries cover a run of `pages` pages from `vpn`
//! onto frames from `pfn`, and invalidation drops an entry by *range overlap* (a 4 KiB
//! invalidation drops any entry covering that page, however many pages it covers).

use gmem_sim::{HierarchyStats, Leaf, Level, Tlb, TlbStats, TranslationCaches, Walk};

/// Counters a design keeps beyond the hierarchy's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DesignStats {
    /// Shared-TLB hits served by a subregion entry (MESC's partition).
    pub subregion_hits: u64,
    /// Shared-TLB hits served by an entry covering more than one page (any kind).
    pub coalesced_hits: u64,
    /// Memory-subregion-cache lookups that hit.
    pub msc_hits: u64,
    /// Memory-subregion-cache lookups that missed.
    pub msc_misses: u64,
    /// Table entries read after the translation went back, to coalesce neighbouring
    /// subregions (§IV-B); included in the hierarchy's `walk_reads`.
    pub extra_reads: u64,
    /// Walks served by MESC's frame mode (a), normal mode (b), subregion mode (c).
    pub modes: [u64; 3],
    /// Shared-TLB probes (one per partition looked up): the energy model's count.
    pub l2_probes: u64,
    /// Per-unit TLB lookups.
    pub l1_probes: u64,
    /// Lines the memory-subregion cache holds now.
    pub msc_lines: u64,
}

/// A translation-cache organisation of the SIMT GPU.
pub trait GpuCaches: TranslationCaches {
    /// The design's own counters.
    fn design_stats(&self) -> DesignStats;
}

/// A boxed [`GpuCaches`]: what the integrated GPU's MMU holds when a design is plugged.
pub struct Plugged(pub Box<dyn GpuCaches>);

impl TranslationCaches for Plugged {
    fn units(&self) -> usize {
        self.0.units()
    }
    fn lookup(&mut self, unit: usize, root: u64, va: u64) -> Option<(Leaf, Level)> {
        self.0.lookup(unit, root, va)
    }
    fn holds(&self, unit: usize, root: u64, va: u64) -> bool {
        self.0.holds(unit, root, va)
    }
    fn fill(&mut self, unit: usize, root: u64, va: u64, leaf: Leaf) {
        self.0.fill(unit, root, va, leaf)
    }
    fn fill_missed(&mut self, unit: usize, root: u64, va: u64, leaf: Leaf) {
        self.0.fill_missed(unit, root, va, leaf)
    }
    fn take_fill_reads(&mut self) -> u32 {
        self.0.take_fill_reads()
    }
    fn forget(&mut self, unit: usize, root: u64, va: u64) {
        self.0.forget(unit, root, va)
    }
    fn walk_cache(&mut self) -> Option<&mut Tlb<u64>> {
        self.0.walk_cache()
    }
    fn note_walk(&mut self, walk: &Walk) {
        self.0.note_walk(walk)
    }
    fn invalidate(&mut self, root: u64, ranges: &[(u64, u64)]) {
        self.0.invalidate(root, ranges)
    }
    fn invalidate_root(&mut self, root: u64) {
        self.0.invalidate_root(root)
    }
    fn flush(&mut self) {
        self.0.flush()
    }
    fn stats(&self) -> HierarchyStats {
        self.0.stats()
    }
    fn l1_stats(&self, unit: usize) -> Option<TlbStats> {
        self.0.l1_stats(unit)
    }
}

impl GpuCaches for Plugged {
    fn design_stats(&self) -> DesignStats {
        self.0.design_stats()
    }
}

/// One cached translation covering `pages` pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// The page-table root it belongs to.
    pub root: u64,
    /// First virtual page (4 KiB page number).
    pub vpn: u64,
    /// Pages covered (1, up to 4 for CoLT, 64..=512 for subregions, 512 for a 2 MiB leaf).
    pub pages: u64,
    /// Frame number of the first page.
    pub pfn: u64,
    /// The leaf of the first page (permissions, format bits, page size); a run of
    /// 4 KiB pages serves `leaf` with the frame moved, a large leaf is served whole.
    pub leaf: Leaf,
    /// Per-page dirty bits (a store to a page whose bit is clear walks again, which
    /// sets the entry's dirty bit in the table, as for one page).
    pub dirty: [u64; 8],
}

impl Run {
    /// A run for one walked leaf.
    pub fn single(root: u64, vpn: u64, leaf: Leaf) -> Run {
        let pages = 1u64 << (leaf.shift - 12);
        let base = vpn & !(pages - 1);
        let mut r = Run {
            root,
            vpn: base,
            pages,
            pfn: leaf.frame.as_u64() >> 12,
            leaf,
            dirty: [0; 8],
        };
        r.set_dirty(vpn, leaf.dirty);
        r
    }

    /// Whether the run covers `vpn` of `root`.
    pub fn covers(&self, root: u64, vpn: u64) -> bool {
        self.root == root && vpn >= self.vpn && vpn < self.vpn + self.pages
    }

    /// Whether the run overlaps bytes `[start, start + len)`.
    pub fn overlaps(&self, start: u64, len: u64) -> bool {
        let s = (self.vpn as u128) << 12;
        let e = s + ((self.pages as u128) << 12);
        s < start as u128 + len as u128 && (start as u128) < e
    }

    fn set_dirty(&mut self, vpn: u64, dirty: bool) {
        if self.leaf.shift > 12 {
            self.leaf.dirty |= dirty;
            return;
        }
        let k = vpn - self.vpn;
        if dirty {
            self.dirty[(k / 64) as usize] |= 1 << (k % 64);
        }
    }

    /// The leaf this run serves for `vpn` (which it covers).
    pub fn leaf_for(&self, vpn: u64) -> Leaf {
        if self.leaf.shift > 12 {
            return self.leaf;
        }
        let k = vpn - self.vpn;
        Leaf {
            frame: gmem_core::PhysAddr::new((self.pfn + k) << 12),
            dirty: self.dirty[(k / 64) as usize] & (1 << (k % 64)) != 0,
            ..self.leaf
        }
    }
}

/// A set-associative array of [`Run`]s with LRU replacement; a set may be restricted
/// to a range of its ways (MESC's partition).
#[derive(Clone, Debug)]
pub struct Ways {
    sets: usize,
    ways: usize,
    slots: Vec<Option<(Run, u64)>>,
    clock: u64,
    stats: TlbStats,
}

impl Ways {
    /// `sets × ways` empty slots (at least one of each).
    pub fn new(sets: usize, ways: usize) -> Ways {
        let (sets, ways) = (sets.max(1), ways.max(1));
        Ways {
            sets,
            ways,
            slots: vec![None; sets * ways],
            clock: 0,
            stats: TlbStats::default(),
        }
    }

    /// Number of sets.
    pub fn sets(&self) -> usize {
        self.sets
    }

    /// Ways per set.
    pub fn ways(&self) -> usize {
        self.ways
    }

    /// The counters (hits and misses are counted by the caller through
    /// [`Ways::count`]).
    pub fn stats(&self) -> TlbStats {
        self.stats
    }

    /// Count one lookup.
    pub fn count(&mut self, hit: bool) {
        if hit {
            self.stats.hits += 1;
        } else {
            self.stats.misses += 1;
        }
    }

    /// The slot in set `set`, ways `ways`, whose run covers `vpn` of `root` (LRU
    /// updated).
    pub fn find(
        &mut self,
        set: usize,
        ways: core::ops::Range<usize>,
        root: u64,
        vpn: u64,
    ) -> Option<&mut Run> {
        let base = (set % self.sets) * self.ways;
        self.clock += 1;
        let now = self.clock;
        let slot = ways.map(|w| base + w).find(|&i| {
            self.slots[i]
                .as_ref()
                .is_some_and(|(r, _)| r.covers(root, vpn))
        })?;
        let (r, stamp) = self.slots[slot].as_mut()?;
        *stamp = now;
        Some(r)
    }

    /// Whether some slot covers `vpn` (no LRU or counter change).
    pub fn holds(&self, root: u64, vpn: u64) -> bool {
        self.slots
            .iter()
            .flatten()
            .any(|(r, _)| r.covers(root, vpn))
    }

    /// Insert `run` in set `set` among `ways`: a slot holding the same run (same first
    /// page and length) is updated, otherwise an empty or the least recently used slot
    /// is taken.
    pub fn insert(&mut self, set: usize, ways: core::ops::Range<usize>, run: Run) {
        // A run of another length over the same pages would shadow this one (a clean
        // entry found first would walk on every store): drop it.
        let (lo, hi) = (run.vpn, run.vpn + run.pages);
        for s in self.slots.iter_mut() {
            if s.as_ref().is_some_and(|(r, _)| {
                r.root == run.root
                    && (r.vpn, r.pages) != (run.vpn, run.pages)
                    && r.vpn < hi
                    && lo < r.vpn + r.pages
            }) {
                *s = None;
            }
        }
        let base = (set % self.sets) * self.ways;
        self.clock += 1;
        let now = self.clock;
        let mut victim = None::<(usize, u64)>;
        for w in ways {
            match &mut self.slots[base + w] {
                Some((r, stamp))
                    if r.root == run.root && r.vpn == run.vpn && r.pages == run.pages =>
                {
                    let mut merged = run;
                    for (d, o) in merged.dirty.iter_mut().zip(r.dirty) {
                        *d |= o;
                    }
                    merged.leaf.dirty |= r.leaf.dirty && r.leaf.shift > 12;
                    *r = merged;
                    *stamp = now;
                    self.stats.fills += 1;
                    return;
                }
                // An empty slot (stamp 0) beats any occupied one; then the oldest.
                Some((_, stamp)) => {
                    if victim.map_or(true, |(_, s)| *stamp < s) {
                        victim = Some((base + w, *stamp));
                    }
                }
                None => {
                    if victim.map_or(true, |(_, s)| s != 0) {
                        victim = Some((base + w, 0));
                    }
                }
            }
        }
        if let Some((slot, stamp)) = victim {
            if stamp != 0 {
                self.stats.evictions += 1;
            }
            self.slots[slot] = Some((run, now));
            self.stats.fills += 1;
        }
    }

    /// Drop every run of `root` covering `vpn`.
    pub fn remove(&mut self, root: u64, vpn: u64) {
        self.retain(|r| !r.covers(root, vpn));
    }

    /// Drop every run of `root` overlapping one of `ranges` (`(start, len)` bytes).
    pub fn invalidate(&mut self, root: u64, ranges: &[(u64, u64)]) {
        self.stats.invalidations += 1;
        self.retain(|r| r.root != root || !ranges.iter().any(|&(s, l)| r.overlaps(s, l)));
    }

    /// Drop every run of `root`.
    pub fn invalidate_root(&mut self, root: u64) {
        self.stats.invalidations += 1;
        self.retain(|r| r.root != root);
    }

    /// Drop everything.
    pub fn flush(&mut self) {
        self.stats.invalidations += 1;
        self.retain(|_| false);
    }

    fn retain(&mut self, keep: impl Fn(&Run) -> bool) {
        for s in self.slots.iter_mut() {
            if s.as_ref().is_some_and(|(r, _)| !keep(r)) {
                *s = None;
                self.stats.invalidated += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gmem_core::{PhysAddr, Prot};

    fn leaf(pfn: u64) -> Leaf {
        Leaf {
            frame: PhysAddr::new(pfn << 12),
            shift: 12,
            prot: Prot::RW,
            dirty: false,
            local: false,
            bits: 0,
        }
    }

    fn run(vpn: u64, pages: u64, pfn: u64) -> Run {
        Run {
            root: 1,
            vpn,
            pages,
            pfn,
            leaf: leaf(pfn),
            dirty: [0; 8],
        }
    }

    #[test]
    fn a_4k_invalidation_drops_every_run_covering_the_page() {
        let mut w = Ways::new(4, 4);
        w.insert(0, 0..4, run(512, 512, 9000));
        w.insert(1, 0..4, run(2048, 1, 7));
        assert!(w.holds(1, 700));
        // One page inside the 512-page run, by its byte range.
        w.invalidate(1, &[(700 << 12, 4096)]);
        assert!(!w.holds(1, 700) && !w.holds(1, 512));
        assert!(w.holds(1, 2048), "an unrelated run survives");
        // A range that ends just before a run leaves it.
        w.insert(0, 0..4, run(512, 512, 9000));
        w.invalidate(1, &[(0, 512 << 12)]);
        assert!(w.holds(1, 512));
    }

    #[test]
    fn a_run_serves_each_page_its_own_frame_and_dirty_bit() {
        let mut r = run(64, 64, 1000);
        r.set_dirty(70, true);
        assert_eq!(r.leaf_for(70).frame.as_u64(), (1000 + 6) << 12);
        assert!(r.leaf_for(70).dirty && !r.leaf_for(71).dirty);
    }

    #[test]
    fn inserting_a_run_drops_runs_of_other_lengths_over_its_pages() {
        let mut w = Ways::new(1, 8);
        w.insert(0, 0..8, run(64, 1, 1000));
        w.insert(0, 0..8, run(64, 4, 1000));
        let found = w.find(0, 0..8, 1, 64).map(|r| r.pages);
        assert_eq!(found, Some(4));
        assert_eq!(w.slots.iter().flatten().count(), 1);
    }
}
