//! The six translation designs of the MESC paper's evaluation (§VI-A) as pluggable
//! caches of a GPU: the integrated GPU walking the CPU's x86-64 tables (the paper's
//! setting), or the discrete GPU walking its own tables in video memory (the same bits
//! in its format's spare bits; its format has no 2 MiB leaves, so `thp` there is `base`).
//!
//! | design | per-unit L1 (32 entries, fully assoc.) | shared TLB (32 sets × 16 ways) | tables |
//! |---|---|---|---|
//! | `base` | 4 KiB entries | 4 KiB entries | 4 KiB leaves |
//! | `colt` | CoLT entries (≤ 4 pages) | 4 KiB entries | 4 KiB leaves |
//! | `full-colt` | CoLT entries | CoLT entries (set index shifted by 2) | 4 KiB leaves |
//! | `thp` | 4 KiB or 2 MiB entries | 4 KiB or 2 MiB entries | 2 MiB leaves where the core could back an aligned block |
//! | `mesc` | 4 KiB entries | subregion entries in ways 8–15 (set = VA bits 25..21), 4 KiB entries in all ways | 4 KiB leaves with MESC bits |
//! | `mesc+colt` | CoLT entries | as `mesc` | as `mesc` |
//!
//! All designs share the 8 KiB page-walk cache (64 × 16) of the baseline.
//!
//! ## How a walk coalesces
//! The hardware walk itself is the format's ([`gmem_sim::TableFormat::walk`]): its
//! reads (after the page-walk cache) are what every design pays. After it, in `fill`:
//! - **CoLT** (§V-A): the walk fetched the 128-byte line (16 leaves) holding the leaf;
//!   [`gmem_ptengine::mesc::colt`] coalesces the aligned group of up to 4 pages around the
//!   requested one when they continue each other. Only that line is looked at: no read
//!   is added and none goes past it.
//! - **MESC** (§IV-B, Fig. 6): the walk read the level-1 entry (the paper's L2PTE); if
//!   its frame bit or the page's subregion bit is set, [`gmem_ptengine::mesc::walk`] gives
//!   the coalesced range: mode (a) one run of 512 pages, mode (c) the page's subregion
//!   joined with its contiguous neighbours known from the memory-subregion cache (512
//!   entries, 64 sets × 8 ways) or, on a miss, from their head leaves — every such
//!   extra read is counted ([`DesignStats::extra_reads`]) and added to the walk reads.
//!   The walk's own reads are not counted twice: mode (a)/(c) read the head leaf where
//!   mode (b) reads the page's, one read either way.
//!
//! ## Lookup (§IV-C, Fig. 8)
//! MESC looks the subregion partition up first, then the regular entries; every
//! partition probed is counted for the energy model ([`DesignStats::l2_probes`]). A
//! shared-TLB hit on a subregion entry refills the unit's L1 with a 4 KiB entry (the
//! paper keeps the per-CU TLBs unchanged).
//!
//! ## What is rebuilt from an incomplete text
//! The paper does not say how dirty bits ride in coalesced entries: here each entry
//! keeps a per-page dirty bit, so a first store to a page through a clean entry walks
//! (and sets the table's dirty bit) as with 4 KiB entries. The walk that coalesces sets
//! the accessed/dirty bits of the requested page's own leaf (the format's walk), not of
//! the head leaf the paper's walker reads. CoLT's line is the GPU's 128-byte line of
//! Table I; its group (4) and the MSC's associativity (8 ways) are our choices.

use crate::caches::{DesignStats, GpuCaches, Run, Ways};
use gmem_ptengine::mesc::{self as bits, Contiguity, MescFormat, MescWalk, Mode, SubregionCache};
use gmem_ptengine::{index, Codec, Entry, TableMemory};
use gmem_sim::{
    HierarchyStats, Leaf, Level, RadixTables, Replacement, Tlb, TlbConfig, TlbStats,
    TranslationCaches, Walk,
};
use gmem_x86pt::{X86Codec, X86Config};
use std::sync::Arc;

/// The CPU's x86-64 tables in simulated host memory.
pub type X86Tables = RadixTables<X86Codec>;

/// The tables a design reads besides the hardware walk (CoLT's fetched line, MESC's
/// bits and head leaves): entries of a format with MESC bits in some table memory —
/// the CPU's x86-64 tables for the integrated GPU, the discrete GPU's own tables in
/// video memory, an IOMMU's own tables for a DMA device.
pub trait MescTables: Send + Sync + 'static {
    /// The format (whether it keeps the bits is its own option).
    type Format: MescFormat;
    /// The codec.
    fn codec(&self) -> &Self::Format;
    /// The memory the entries live in.
    fn entries(&self) -> &dyn TableMemory;
}

impl<C: MescFormat + Send + Sync + 'static> MescTables for RadixTables<C> {
    type Format = C;
    fn codec(&self) -> &C {
        RadixTables::codec(self)
    }
    fn entries(&self) -> &dyn TableMemory {
        self.engine().memory()
    }
}

/// What a design reads through [`MescTables`], whatever the format (object safe).
trait Reader: Send + Sync {
    fn levels(&self) -> u32;
    fn decode(&self, raw: u64, level: u32) -> Entry;
    fn entries(&self) -> &dyn TableMemory;
    fn colt(&self, line: &[u64; 16], index: usize, group: usize) -> (usize, usize);
    fn walk(&self, root: u64, va: u64, cache: Option<&mut dyn SubregionCache>) -> MescWalk;
}

impl<T: MescTables> Reader for T {
    fn levels(&self) -> u32 {
        self.codec().levels()
    }
    fn decode(&self, raw: u64, level: u32) -> Entry {
        self.codec().decode(raw, level)
    }
    fn entries(&self) -> &dyn TableMemory {
        MescTables::entries(self)
    }
    fn colt(&self, line: &[u64; 16], index: usize, group: usize) -> (usize, usize) {
        bits::colt::<T::Format>(line, index, group)
    }
    fn walk(&self, root: u64, va: u64, cache: Option<&mut dyn SubregionCache>) -> MescWalk {
        bits::walk(self.codec(), MescTables::entries(self), root, va, cache)
    }
}

/// One of the six designs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Design {
    /// 4 KiB pages, plain TLBs.
    Base,
    /// CoLT in the per-unit TLBs only.
    Colt,
    /// CoLT in the per-unit and the shared TLB.
    FullColt,
    /// 2 MiB leaves where the core could back an aligned block.
    Thp,
    /// MESC: subregion entries in the shared TLB, the memory-subregion cache.
    Mesc,
    /// MESC plus CoLT in the per-unit TLBs.
    MescColt,
}

impl Design {
    /// Every design, in the paper's order.
    pub const ALL: [Design; 6] = [
        Design::Base,
        Design::Colt,
        Design::FullColt,
        Design::Thp,
        Design::Mesc,
        Design::MescColt,
    ];

    /// The design's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Design::Base => "base",
            Design::Colt => "colt",
            Design::FullColt => "full-colt",
            Design::Thp => "thp",
            Design::Mesc => "mesc",
            Design::MescColt => "mesc+colt",
        }
    }

    /// The x86-64 format options the design's machine boots with.
    pub fn x86(self) -> X86Config {
        X86Config {
            user: true,
            large_pages: self == Design::Thp,
            mesc: self.mesc(),
            granularity_bit: false,
        }
    }

    /// Subregion entries and the memory-subregion cache.
    pub fn mesc(self) -> bool {
        matches!(self, Design::Mesc | Design::MescColt)
    }

    fn l1_colt(self) -> bool {
        matches!(self, Design::Colt | Design::FullColt | Design::MescColt)
    }

    fn l2_colt(self) -> bool {
        self == Design::FullColt
    }
}

/// Geometry of the designs (the MESC paper's Table I unless said).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Compute units.
    pub units: usize,
    /// Entries of each unit's fully associative L1 TLB.
    pub l1_entries: usize,
    /// Shared TLB sets.
    pub l2_sets: usize,
    /// Shared TLB ways.
    pub l2_ways: usize,
    /// First way of the subregion partition (ways `subregion_from..l2_ways`).
    pub subregion_from: usize,
    /// Memory-subregion cache sets × ways.
    pub msc: (usize, usize),
    /// Page-walk cache.
    pub walk_cache: TlbConfig,
    /// CoLT's group (pages).
    pub colt_group: usize,
}

impl Geometry {
    /// Table I: 32-entry L1s, a 512-entry 16-way shared TLB with the subregion
    /// partition in ways 8–15, a 512-entry MSC, an 8 KiB page-walk cache.
    pub fn paper(units: usize) -> Geometry {
        Geometry {
            units,
            l1_entries: 32,
            l2_sets: 32,
            l2_ways: 16,
            subregion_from: 8,
            msc: (64, 8),
            walk_cache: TlbConfig::new(64, 16, Replacement::Lru),
            colt_group: 4,
        }
    }
}

/// The memory-subregion cache: per (root, 2 MiB virtual frame), the 7-bit map of which
/// neighbouring subregions continue each other.
#[derive(Clone, Debug)]
struct Msc {
    sets: usize,
    ways: usize,
    slots: Vec<Option<(u64, u64, u8, u64)>>,
    clock: u64,
}

impl Msc {
    fn new((sets, ways): (usize, usize)) -> Msc {
        let (sets, ways) = (sets.max(1), ways.max(1));
        Msc {
            sets,
            ways,
            slots: vec![None; sets * ways],
            clock: 0,
        }
    }
    fn set(&self, frame_vpn: u64) -> core::ops::Range<usize> {
        let s = ((frame_vpn >> 9) as usize % self.sets) * self.ways;
        s..s + self.ways
    }
    fn lookup(&mut self, root: u64, frame_vpn: u64) -> Option<u8> {
        self.clock += 1;
        let now = self.clock;
        let r = self.set(frame_vpn);
        self.slots[r].iter_mut().flatten().find_map(|e| {
            (e.0 == root && e.1 == frame_vpn).then(|| {
                e.3 = now;
                e.2
            })
        })
    }
    fn insert(&mut self, root: u64, frame_vpn: u64, bitmap: u8) {
        self.clock += 1;
        let now = self.clock;
        let r = self.set(frame_vpn);
        let slots = &mut self.slots[r];
        let i = slots
            .iter()
            .position(|e| e.is_some_and(|e| e.0 == root && e.1 == frame_vpn))
            .or_else(|| slots.iter().position(Option::is_none))
            .unwrap_or_else(|| {
                (0..slots.len())
                    .min_by_key(|&i| slots[i].map_or(0, |e| e.3))
                    .unwrap_or(0)
            });
        slots[i] = Some((root, frame_vpn, bitmap, now));
    }
    fn retain(&mut self, keep: impl Fn(u64, u64) -> bool) {
        for s in self.slots.iter_mut() {
            if s.is_some_and(|e| !keep(e.0, e.1)) {
                *s = None;
            }
        }
    }
}

/// The MSC seen by one walk of one root, counting hits and misses.
struct MscView<'a> {
    msc: &'a mut Msc,
    root: u64,
    stats: &'a mut DesignStats,
}

impl SubregionCache for MscView<'_> {
    fn lookup(&mut self, frame_vpn: u64) -> Option<u8> {
        let r = self.msc.lookup(self.root, frame_vpn);
        if r.is_some() {
            self.stats.msc_hits += 1;
        } else {
            self.stats.msc_misses += 1;
        }
        r
    }
    fn insert(&mut self, frame_vpn: u64, bitmap: u8) {
        self.msc.insert(self.root, frame_vpn, bitmap);
    }
}

/// One design's translation caches over the machine's x86-64 tables.
pub struct DesignCaches {
    design: Design,
    geo: Geometry,
    tables: Arc<dyn Reader>,
    l1: Vec<Ways>,
    l2: Ways,
    msc: Msc,
    pwc: Tlb<u64>,
    walk: HierarchyStats,
    ds: DesignStats,
    /// Extra reads of the last fill, not yet taken by the MMU
    /// ([`TranslationCaches::take_fill_reads`]).
    fill_reads: u32,
}

impl DesignCaches {
    /// Caches of `design` with geometry `geo` reading `tables` (for CoLT's line and
    /// MESC's bits and head leaves).
    ///
    /// # Errors
    /// The page-walk cache geometry was rejected.
    pub fn new<T: MescTables>(
        design: Design,
        geo: Geometry,
        tables: Arc<T>,
    ) -> Result<DesignCaches, gmem_sim::TlbConfigError> {
        let tables: Arc<dyn Reader> = tables;
        Ok(DesignCaches {
            design,
            geo,
            tables,
            l1: (0..geo.units.max(1))
                .map(|_| Ways::new(1, geo.l1_entries))
                .collect(),
            l2: Ways::new(geo.l2_sets, geo.l2_ways),
            msc: Msc::new(geo.msc),
            pwc: Tlb::new(geo.walk_cache)?,
            walk: HierarchyStats::default(),
            ds: DesignStats::default(),
            fill_reads: 0,
        })
    }

    /// The design.
    pub fn design(&self) -> Design {
        self.design
    }

    fn unit(&self, unit: usize) -> usize {
        unit % self.l1.len()
    }

    fn reg_set(&self, vpn: u64) -> usize {
        let shift = if self.design.l2_colt() { 2 } else { 0 };
        (vpn >> shift) as usize
    }

    fn l1_insert(&mut self, u: usize, run: Run) {
        let ways = self.geo.l1_entries;
        self.l1[u].insert(0, 0..ways, run);
    }

    fn l2_find(&mut self, root: u64, vpn: u64) -> Option<Run> {
        let all = 0..self.geo.l2_ways;
        if self.design.mesc() {
            self.ds.l2_probes += 1;
            let part = self.geo.subregion_from..self.geo.l2_ways;
            if let Some(r) = self.l2.find((vpn >> 9) as usize, part, root, vpn) {
                return Some(*r);
            }
        }
        self.ds.l2_probes += 1;
        let set = self.reg_set(vpn);
        if let Some(r) = self.l2.find(set, all.clone(), root, vpn) {
            return Some(*r);
        }
        if self.design == Design::Thp {
            self.ds.l2_probes += 1;
            if let Some(r) = self.l2.find((vpn >> 9) as usize, all, root, vpn) {
                return Some(*r);
            }
        }
        None
    }

    /// The level-1 entry (table pointer) above `va` and the leaf table it points to;
    /// re-reads what the hardware walk just read (not counted again).
    fn locate(&self, root: u64, va: u64) -> Option<(u64, u64)> {
        let t = &self.tables;
        let memory = t.entries();
        let mut table = root;
        let mut level = t.levels() - 1;
        loop {
            let raw = memory.read(table + index(va, level) * 8)?;
            match t.decode(raw, level) {
                Entry::Table(t) if level == 1 => return Some((raw, t.as_u64())),
                Entry::Table(t) if level > 1 => {
                    table = t.as_u64();
                    level -= 1;
                }
                _ => return None,
            }
        }
    }

    /// CoLT's run for the walked `leaf` of `vpn` from the line of leaves at `table`.
    fn colt_run(&self, root: u64, vpn: u64, leaf: Leaf, table: u64) -> Run {
        let memory = self.tables.entries();
        let idx = (vpn % 512) as usize;
        let line_start = idx & !15;
        let mut line = [0u64; 16];
        for (k, e) in line.iter_mut().enumerate() {
            *e = memory
                .read(table + (line_start + k) as u64 * 8)
                .unwrap_or(0);
        }
        let (first, n) = self
            .tables
            .colt(&line, idx - line_start, self.geo.colt_group);
        if n <= 1 {
            return Run::single(root, vpn, leaf);
        }
        let Entry::Leaf(head) = self.tables.decode(line[first], 0) else {
            return Run::single(root, vpn, leaf);
        };
        let pfn = head.frame.as_u64() >> 12;
        let mut run = Run {
            root,
            vpn: vpn - (idx - line_start - first) as u64,
            pages: n as u64,
            pfn,
            leaf: Leaf {
                frame: gmem_core::PhysAddr::new(pfn << 12),
                dirty: false,
                ..leaf
            },
            dirty: [0; 8],
        };
        for k in 0..n {
            if matches!(self.tables.decode(line[first + k], 0), Entry::Leaf(l) if l.dirty) {
                run.dirty[0] |= 1 << k;
            }
        }
        if leaf.dirty {
            run.dirty[0] |= 1 << (idx - line_start - first);
        }
        run
    }

    /// MESC's coalesced run for `va` when its frame or subregion bit is set.
    fn mesc_run(&mut self, root: u64, va: u64, leaf: Leaf, pointer: u64) -> Option<Run> {
        let vpn = va >> 12;
        let c = Contiguity::of(pointer);
        let s = (vpn % 512) / 64;
        if !c.frame && c.subregions & (1 << s) == 0 {
            self.ds.modes[1] += 1;
            return None;
        }
        let tables = self.tables.clone();
        let mut view = MscView {
            msc: &mut self.msc,
            root,
            stats: &mut self.ds,
        };
        let w = tables.walk(root, va, Some(&mut view));
        self.ds.extra_reads += u64::from(w.extra_reads);
        self.walk.walk_reads += u64::from(w.extra_reads);
        self.fill_reads = w.extra_reads;
        match w.mode {
            Mode::Frame => self.ds.modes[0] += 1,
            Mode::Subregion => self.ds.modes[2] += 1,
            _ => self.ds.modes[1] += 1,
        }
        let co = w.coalesced?;
        // The bits are kept inside every edit, so the coalesced run agrees with the
        // walked leaf; if an edit raced this re-read, cache nothing coalesced.
        if w.leaf.map(|l| l.frame) != Some(leaf.frame) {
            return None;
        }
        let mut run = Run {
            root,
            vpn: co.vpn,
            pages: co.pages,
            pfn: co.pfn,
            leaf: Leaf {
                frame: gmem_core::PhysAddr::new(co.pfn << 12),
                dirty: false,
                ..leaf
            },
            dirty: [0; 8],
        };
        let k = vpn - co.vpn;
        if leaf.dirty {
            run.dirty[(k / 64) as usize] |= 1 << (k % 64);
        }
        Some(run)
    }
}

impl TranslationCaches for DesignCaches {
    fn units(&self) -> usize {
        self.l1.len()
    }

    fn lookup(&mut self, unit: usize, root: u64, va: u64) -> Option<(Leaf, Level)> {
        let u = self.unit(unit);
        let vpn = va >> 12;
        self.ds.l1_probes += 1;
        let ways = self.geo.l1_entries;
        if let Some(r) = self.l1[u].find(0, 0..ways, root, vpn) {
            let leaf = r.leaf_for(vpn);
            self.l1[u].count(true);
            return Some((leaf, Level::L1));
        }
        self.l1[u].count(false);
        let Some(run) = self.l2_find(root, vpn) else {
            self.l2.count(false);
            return None;
        };
        self.l2.count(true);
        let leaf = run.leaf_for(vpn);
        let subregion = run.leaf.shift == 12 && run.pages >= bits::SUBREGION_PAGES;
        if subregion {
            self.ds.subregion_hits += 1;
        }
        if run.pages > 1 {
            self.ds.coalesced_hits += 1;
        }
        // Per-unit TLBs keep 4 KiB (or CoLT, or 2 MiB leaf) entries, never subregions.
        let l1run = if subregion {
            Run::single(root, vpn, leaf)
        } else {
            run
        };
        self.l1_insert(u, l1run);
        Some((leaf, Level::L2))
    }

    fn holds(&self, unit: usize, root: u64, va: u64) -> bool {
        let vpn = va >> 12;
        self.l1[self.unit(unit)].holds(root, vpn) || self.l2.holds(root, vpn)
    }

    fn fill(&mut self, unit: usize, root: u64, va: u64, leaf: Leaf) {
        self.fill_reads = 0;
        let u = self.unit(unit);
        let vpn = va >> 12;
        let all = 0..self.geo.l2_ways;
        if leaf.shift > 12 {
            let run = Run::single(root, vpn, leaf);
            self.l1_insert(u, run);
            self.l2.insert((vpn >> 9) as usize, all, run);
            return;
        }
        let d = self.design;
        let located = if d.l1_colt() || d.l2_colt() || d.mesc() {
            self.locate(root, va)
        } else {
            None
        };
        let single = Run::single(root, vpn, leaf);
        let colt = match located {
            Some((_, table)) if d.l1_colt() || d.l2_colt() => self.colt_run(root, vpn, leaf, table),
            _ => single,
        };
        let sub = match located {
            Some((pointer, _)) if d.mesc() => self.mesc_run(root, va, leaf, pointer),
            _ => None,
        };
        self.l1_insert(u, if d.l1_colt() { colt } else { single });
        match sub {
            Some(run) => {
                let part = self.geo.subregion_from..self.geo.l2_ways;
                self.l2.insert((run.vpn >> 9) as usize, part, run);
            }
            None => {
                let run = if d.l2_colt() { colt } else { single };
                let set = self.reg_set(run.vpn);
                self.l2.insert(set, all, run);
            }
        }
    }

    fn forget(&mut self, unit: usize, root: u64, va: u64) {
        let u = self.unit(unit);
        self.l1[u].remove(root, va >> 12);
        self.l2.remove(root, va >> 12);
    }

    fn walk_cache(&mut self) -> Option<&mut Tlb<u64>> {
        Some(&mut self.pwc)
    }

    fn take_fill_reads(&mut self) -> u32 {
        std::mem::take(&mut self.fill_reads)
    }

    fn note_walk(&mut self, walk: &Walk) {
        self.walk.walks += 1;
        self.walk.walk_reads += u64::from(walk.reads);
        self.walk.walk_writes += u64::from(walk.writes);
        if walk.leaf.is_none() {
            self.walk.walk_faults += 1;
        }
    }

    fn invalidate(&mut self, root: u64, ranges: &[(u64, u64)]) {
        for t in self.l1.iter_mut() {
            t.invalidate(root, ranges);
        }
        self.l2.invalidate(root, ranges);
        // A changed page may change its frame's subregion map: drop the frame's line.
        self.msc.retain(|r, frame_vpn| {
            let (s, e) = (
                u128::from(frame_vpn) << 12,
                u128::from(frame_vpn + 512) << 12,
            );
            r != root
                || !ranges.iter().any(|&(a, l)| {
                    let a = u128::from(a);
                    s < a + u128::from(l) && a < e
                })
        });
        self.pwc.flush_asid(root);
    }

    fn invalidate_root(&mut self, root: u64) {
        for t in self.l1.iter_mut() {
            t.invalidate_root(root);
        }
        self.l2.invalidate_root(root);
        self.msc.retain(|r, _| r != root);
        self.pwc.flush_asid(root);
    }

    fn flush(&mut self) {
        for t in self.l1.iter_mut() {
            t.flush();
        }
        self.l2.flush();
        self.msc.retain(|_, _| false);
        self.pwc.flush();
    }

    fn stats(&self) -> HierarchyStats {
        HierarchyStats {
            l1: self
                .l1
                .iter()
                .fold(TlbStats::default(), |a, t| a.plus(t.stats())),
            l2: self.l2.stats(),
            walk_cache: self.pwc.stats(),
            ..self.walk
        }
    }

    fn l1_stats(&self, unit: usize) -> Option<TlbStats> {
        self.l1.get(unit).map(Ways::stats)
    }
}

impl GpuCaches for DesignCaches {
    fn design_stats(&self) -> DesignStats {
        DesignStats {
            msc_lines: self.msc.slots.iter().flatten().count() as u64,
            ..self.ds
        }
    }
}
