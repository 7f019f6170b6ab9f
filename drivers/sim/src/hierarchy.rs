//! A device's translation caches: per-unit L1 TLBs, a shared L2 TLB, a page-walk cache.
//!
//! A GPU has one L1 TLB per compute unit and an L2 TLB shared by all of them (the IOMMU
//! TLB of an integrated GPU, the shared TLB of a discrete one); a CPU core has an L1
//! dTLB and a second-level STLB. A lookup by unit `u` tries `u`'s L1, then the L2 (an
//! L2 hit refills the L1), and a miss in both is a page walk whose upper levels may be
//! served by the page-walk cache. Leaves are tagged by page-table root, so the caches
//! are invalidated per root: a range list drops the overlapping leaves in every L1 and
//! the L2 and, as x86's `INVLPG` does, every walk-cache entry of that root.
//!
//! ## Pluggable organisations
//! [`TranslationCaches`] is what a device MMU ([`crate::SimMmu`]) and the offline
//! replayer ([`crate::replay()`]) need from a cache organisation; [`TlbHierarchy`] is the
//! baseline one. Another organisation (range or subregion entries in the shared level,
//! coalesced entries in the L1s) implements the same trait and plugs into
//! [`crate::SimMmu::with_caches`] and the replayer unchanged. Entries hold whole
//! [`Leaf`] values, so any format bits a leaf carries stay with its TLB entries.

use crate::format::{Leaf, Walk};
use crate::tlb::{Tlb, TlbConfig, TlbConfigError, TlbStats};

/// Geometry of a device's translation caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HierarchyConfig {
    /// Compute units (CPU cores, GPU CUs), each with an L1 TLB.
    pub units: usize,
    /// Each unit's L1 TLB.
    pub l1: TlbConfig,
    /// The shared L2 TLB, if the device has one.
    pub l2: Option<TlbConfig>,
    /// The page-walk cache (upper-level entries), if the device has one.
    pub walk_cache: Option<TlbConfig>,
}

/// Counters of a hierarchy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HierarchyStats {
    /// All L1 TLBs together.
    pub l1: TlbStats,
    /// The L2 TLB.
    pub l2: TlbStats,
    /// The page-walk cache.
    pub walk_cache: TlbStats,
    /// Page walks.
    pub walks: u64,
    /// Page-table entries read by walks.
    pub walk_reads: u64,
    /// Page-table entries written back by walks (accessed/dirty bits).
    pub walk_writes: u64,
    /// Walks that found no leaf.
    pub walk_faults: u64,
}

/// Which cache level served a translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// The unit's own L1 TLB.
    L1,
    /// The shared L2 (or IOMMU) TLB.
    L2,
}

/// A device's translation-cache organisation: what [`crate::SimMmu`] and the replayer
/// call. Every method is deterministic.
pub trait TranslationCaches: Send + 'static {
    /// Number of compute units (each with its own first level).
    fn units(&self) -> usize;
    /// Look `va` up for `unit` (modulo [`TranslationCaches::units`]); returns the leaf
    /// and the level that held it, refilling upper levels as the organisation does.
    fn lookup(&mut self, unit: usize, root: u64, va: u64) -> Option<(Leaf, Level)>;
    /// [`TranslationCaches::lookup`] when a check small enough to inline where the
    /// caches are asked answers it (a repeated hit in the unit's first level, say):
    /// `Some` with `lookup`'s answer, counted as `lookup` counts it; otherwise `None`
    /// with nothing changed, and the caller asks `lookup`. The default never answers.
    #[inline(always)]
    fn lookup_repeated(&mut self, unit: usize, root: u64, va: u64) -> Option<(Leaf, Level)> {
        let _ = (unit, root, va);
        None
    }
    /// Whether some level holds `va` for `unit` (no counter moves).
    fn holds(&self, unit: usize, root: u64, va: u64) -> bool;
    /// Cache a walked leaf for `unit`.
    fn fill(&mut self, unit: usize, root: u64, va: u64, leaf: Leaf);
    /// [`TranslationCaches::fill`] right after [`TranslationCaches::lookup`] of the
    /// same `(unit, root, va)` found nothing: an organisation may skip looking for an
    /// entry to overwrite. The default calls `fill`.
    fn fill_missed(&mut self, unit: usize, root: u64, va: u64, leaf: Leaf) {
        self.fill(unit, root, va, leaf)
    }
    /// Table entries the last [`TranslationCaches::fill`] read beyond the walk's own
    /// (MESC's head-leaf reads, §IV-B), reset by the call: the MMU adds them to the
    /// walk's reads so that a timing model charges them as walk reads. The default
    /// reads nothing beyond the walk.
    fn take_fill_reads(&mut self) -> u32 {
        0
    }
    /// Drop `unit`'s and the shared level's entries for `va` (the entry behind a fault).
    fn forget(&mut self, unit: usize, root: u64, va: u64);
    /// The page-walk cache a walk may use.
    fn walk_cache(&mut self) -> Option<&mut Tlb<u64>>;
    /// Account a walk.
    fn note_walk(&mut self, walk: &Walk);
    /// Drop every entry of `root` overlapping `ranges` (`(start, len)` bytes).
    fn invalidate(&mut self, root: u64, ranges: &[(u64, u64)]);
    /// Drop every entry of `root`.
    fn invalidate_root(&mut self, root: u64);
    /// Drop everything.
    fn flush(&mut self);
    /// A snapshot of the counters.
    fn stats(&self) -> HierarchyStats;
    /// Unit `unit`'s first-level counters.
    fn l1_stats(&self, unit: usize) -> Option<TlbStats>;
}

impl TranslationCaches for TlbHierarchy {
    fn units(&self) -> usize {
        TlbHierarchy::units(self)
    }
    fn lookup(&mut self, unit: usize, root: u64, va: u64) -> Option<(Leaf, Level)> {
        self.lookup_level(unit, root, va)
    }
    #[inline(always)]
    fn lookup_repeated(&mut self, unit: usize, root: u64, va: u64) -> Option<(Leaf, Level)> {
        TlbHierarchy::lookup_repeated(self, unit, root, va)
    }
    fn holds(&self, unit: usize, root: u64, va: u64) -> bool {
        TlbHierarchy::holds(self, unit, root, va)
    }
    fn fill(&mut self, unit: usize, root: u64, va: u64, leaf: Leaf) {
        TlbHierarchy::fill(self, unit, root, va, leaf)
    }
    fn fill_missed(&mut self, unit: usize, root: u64, va: u64, leaf: Leaf) {
        let u = self.unit(unit);
        self.l1[u].insert_missing(root, va, leaf.shift, leaf);
        if let Some(l2) = self.l2.as_mut() {
            l2.insert_missing(root, va, leaf.shift, leaf);
        }
    }
    fn forget(&mut self, unit: usize, root: u64, va: u64) {
        TlbHierarchy::forget(self, unit, root, va)
    }
    fn walk_cache(&mut self) -> Option<&mut Tlb<u64>> {
        TlbHierarchy::walk_cache(self)
    }
    fn note_walk(&mut self, walk: &Walk) {
        TlbHierarchy::note_walk(self, walk)
    }
    fn invalidate(&mut self, root: u64, ranges: &[(u64, u64)]) {
        TlbHierarchy::invalidate(self, root, ranges)
    }
    fn invalidate_root(&mut self, root: u64) {
        TlbHierarchy::invalidate_root(self, root)
    }
    fn flush(&mut self) {
        TlbHierarchy::flush(self)
    }
    fn stats(&self) -> HierarchyStats {
        TlbHierarchy::stats(self)
    }
    fn l1_stats(&self, unit: usize) -> Option<TlbStats> {
        TlbHierarchy::l1_stats(self, unit)
    }
}

/// The TLBs and page-walk cache of one device.
#[derive(Clone, Debug)]
pub struct TlbHierarchy {
    l1: Vec<Tlb<Leaf>>,
    l2: Option<Tlb<Leaf>>,
    walk_cache: Option<Tlb<u64>>,
    walks: WalkCounters,
}

/// A hierarchy's walk counters.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WalkCounters {
    walks: u64,
    reads: u64,
    writes: u64,
    faults: u64,
}

impl WalkCounters {
    /// Account a walk.
    #[inline]
    pub(crate) fn note(&mut self, walk: &Walk) {
        self.walks += 1;
        self.reads += u64::from(walk.reads);
        self.writes += u64::from(walk.writes);
        if walk.leaf.is_none() {
            self.faults += 1;
        }
    }
}

/// Every level of a hierarchy at once, for the split replayer
/// ([`crate::ReplayStream::replay_split`]): the L1s, the L2, the page-walk cache and
/// the walk counters.
pub(crate) type LevelsMut<'a> = (
    &'a mut [Tlb<Leaf>],
    Option<&'a mut Tlb<Leaf>>,
    Option<&'a mut Tlb<u64>>,
    &'a mut WalkCounters,
);

impl TlbHierarchy {
    /// Empty caches of the given geometry.
    ///
    /// # Errors
    /// [`TlbConfigError::NoUnits`] for zero compute units; [`TlbConfigError::Empty`] or
    /// [`TlbConfigError::TooLarge`] for a level with zero sets or ways or more than
    /// 2^20 entries.
    pub fn new(config: HierarchyConfig) -> Result<TlbHierarchy, TlbConfigError> {
        if config.units == 0 {
            return Err(TlbConfigError::NoUnits);
        }
        let l1 = (0..config.units)
            .map(|_| Tlb::new(config.l1))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TlbHierarchy {
            l1,
            l2: config.l2.map(Tlb::new).transpose()?,
            walk_cache: config.walk_cache.map(Tlb::new).transpose()?,
            walks: WalkCounters::default(),
        })
    }

    /// Number of units.
    pub fn units(&self) -> usize {
        self.l1.len()
    }

    /// The counters of unit `unit`'s L1 TLB.
    pub fn l1_stats(&self, unit: usize) -> Option<TlbStats> {
        self.l1.get(unit).map(Tlb::stats)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> HierarchyStats {
        HierarchyStats {
            l1: self
                .l1
                .iter()
                .fold(TlbStats::default(), |a, t| a.plus(t.stats())),
            l2: self.l2.as_ref().map(Tlb::stats).unwrap_or_default(),
            walk_cache: self.walk_cache.as_ref().map(Tlb::stats).unwrap_or_default(),
            walks: self.walks.walks,
            walk_reads: self.walks.reads,
            walk_writes: self.walks.writes,
            walk_faults: self.walks.faults,
        }
    }

    /// Every level at once (the split replayer's view).
    pub(crate) fn levels_mut(&mut self) -> LevelsMut<'_> {
        (
            &mut self.l1,
            self.l2.as_mut(),
            self.walk_cache.as_mut(),
            &mut self.walks,
        )
    }

    #[inline]
    fn unit(&self, unit: usize) -> usize {
        let n = self.l1.len();
        if unit < n {
            unit
        } else {
            unit % n
        }
    }

    /// Look `va` up for `unit` (taken modulo the number of units): its L1, then the L2.
    pub fn lookup(&mut self, unit: usize, root: u64, va: u64) -> Option<Leaf> {
        self.lookup_level(unit, root, va).map(|(leaf, _)| leaf)
    }

    /// [`TlbHierarchy::lookup`], also saying which level held the leaf.
    #[inline]
    pub fn lookup_level(&mut self, unit: usize, root: u64, va: u64) -> Option<(Leaf, Level)> {
        let u = self.unit(unit);
        if let Some(leaf) = self.l1[u].lookup_ref_recent(root, va) {
            return Some((*leaf, Level::L1));
        }
        self.lookup_l2(u, root, va)
    }

    /// [`TlbHierarchy::lookup_level`] when a repeated hit in the unit's L1 answers it
    /// (the same page as that L1's last lookup, in its set's most recent slot:
    /// consecutive accesses to one page; see [`Tlb::lookup_repeated`]), counted as that
    /// lookup counts it; otherwise `None` with nothing changed.
    #[inline(always)]
    pub fn lookup_repeated(&mut self, unit: usize, root: u64, va: u64) -> Option<(Leaf, Level)> {
        let u = self.unit(unit);
        self.l1[u]
            .lookup_repeated(root, va)
            .map(|leaf| (*leaf, Level::L1))
    }

    /// The L2 half of [`TlbHierarchy::lookup_level`] after unit `u`'s L1 missed `va`:
    /// a hit fills the L1. Kept out of line so that the L1 hit, the common case, runs
    /// in a small frame (no spills for the fill's registers).
    #[inline(never)]
    fn lookup_l2(&mut self, u: usize, root: u64, va: u64) -> Option<(Leaf, Level)> {
        let leaf = *self.l2.as_mut()?.lookup_ref(root, va)?;
        // The L1 lookup just missed `va` in every size.
        self.l1[u].insert_missing(root, va, leaf.shift, leaf);
        Some((leaf, Level::L2))
    }

    /// Whether `unit`'s L1 or the L2 holds a translation of `va` (no counter moves).
    pub fn holds(&self, unit: usize, root: u64, va: u64) -> bool {
        self.l1[self.unit(unit)].holds(root, va)
            || self.l2.as_ref().is_some_and(|l2| l2.holds(root, va))
    }

    /// Cache a walked leaf in `unit`'s L1 and in the L2.
    pub fn fill(&mut self, unit: usize, root: u64, va: u64, leaf: Leaf) {
        let u = self.unit(unit);
        self.l1[u].insert(root, va, leaf.shift, leaf);
        if let Some(l2) = self.l2.as_mut() {
            l2.insert(root, va, leaf.shift, leaf);
        }
    }

    /// Drop `unit`'s and the L2's translation of `va` (the hardware does this for the
    /// entry behind a fault).
    pub fn forget(&mut self, unit: usize, root: u64, va: u64) {
        let u = self.unit(unit);
        self.l1[u].remove(root, va);
        if let Some(l2) = self.l2.as_mut() {
            l2.remove(root, va);
        }
    }

    /// The page-walk cache, for a walk.
    pub fn walk_cache(&mut self) -> Option<&mut Tlb<u64>> {
        self.walk_cache.as_mut()
    }

    /// Account a walk.
    pub fn note_walk(&mut self, walk: &Walk) {
        self.walks.note(walk);
    }

    /// Drop every cached translation of `root` overlapping `ranges`, in every L1 and the
    /// L2, and every walk-cache entry of `root`.
    pub fn invalidate(&mut self, root: u64, ranges: &[(u64, u64)]) {
        for t in self.l1.iter_mut() {
            t.invalidate(root, ranges);
        }
        if let Some(l2) = self.l2.as_mut() {
            l2.invalidate(root, ranges);
        }
        if let Some(w) = self.walk_cache.as_mut() {
            w.flush_asid(root);
        }
    }

    /// Drop everything cached for `root`.
    pub fn invalidate_root(&mut self, root: u64) {
        for t in self.l1.iter_mut() {
            t.flush_asid(root);
        }
        if let Some(l2) = self.l2.as_mut() {
            l2.flush_asid(root);
        }
        if let Some(w) = self.walk_cache.as_mut() {
            w.flush_asid(root);
        }
    }

    /// Drop everything.
    pub fn flush(&mut self) {
        for t in self.l1.iter_mut() {
            t.flush();
        }
        if let Some(l2) = self.l2.as_mut() {
            l2.flush();
        }
        if let Some(w) = self.walk_cache.as_mut() {
            w.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tlb::Replacement;
    use gmem_core::{PhysAddr, Prot};

    fn leaf(frame: u64) -> Leaf {
        Leaf {
            frame: PhysAddr::new(frame),
            shift: 12,
            prot: Prot::RW,
            dirty: true,
            local: false,
            bits: 0,
        }
    }

    fn two_units() -> TlbHierarchy {
        TlbHierarchy::new(HierarchyConfig {
            units: 2,
            l1: TlbConfig::new(1, 2, Replacement::Lru),
            l2: Some(TlbConfig::new(4, 4, Replacement::Lru)),
            walk_cache: Some(TlbConfig::new(1, 4, Replacement::Lru)),
        })
        .unwrap()
    }

    #[test]
    fn an_l2_hit_serves_another_unit_and_refills_its_l1() {
        let mut h = two_units();
        assert_eq!(h.lookup(0, 1, 0x5000), None);
        h.fill(0, 1, 0x5000, leaf(0x9000));
        assert_eq!(h.lookup(1, 1, 0x5123), Some(leaf(0x9000)));
        assert_eq!(h.lookup(1, 1, 0x5123), Some(leaf(0x9000)));
        let s = h.stats();
        assert_eq!((s.l1.hits, s.l1.misses), (1, 2));
        assert_eq!((s.l2.hits, s.l2.misses), (1, 1));
        assert_eq!(h.l1_stats(1).unwrap().hits, 1);
    }

    #[test]
    fn invalidation_reaches_every_l1_the_l2_and_the_walk_cache_of_the_root() {
        let mut h = two_units();
        h.fill(0, 1, 0x5000, leaf(0x9000));
        h.fill(1, 1, 0x5000, leaf(0x9000));
        h.fill(1, 2, 0x5000, leaf(0xa000));
        h.walk_cache().unwrap().insert(1, 0, 21, 0x7000);
        h.invalidate(1, &[(0x5000, 0x1000)]);
        assert_eq!(h.lookup(0, 1, 0x5000), None);
        assert_eq!(h.lookup(1, 1, 0x5000), None);
        assert_eq!(h.lookup(1, 2, 0x5000), Some(leaf(0xa000)));
        assert!(h.walk_cache().unwrap().is_empty());
        h.forget(1, 2, 0x5000);
        assert_eq!(h.lookup(1, 2, 0x5000), None);
    }

    #[test]
    fn a_hierarchy_without_units_is_rejected() {
        let c = HierarchyConfig {
            units: 0,
            l1: TlbConfig::new(1, 1, Replacement::Lru),
            l2: None,
            walk_cache: None,
        };
        assert_eq!(TlbHierarchy::new(c).err(), Some(TlbConfigError::NoUnits));
    }
}
