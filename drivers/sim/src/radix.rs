//! Radix page tables in simulated memory: the shared engine ([`gmem_ptengine`]) over a
//! [`SimMemory`], as a [`TableFormat`].
//!
//! ## Theory
//! Most MMU formats are the same tree: 4 KiB table pages of 512 eight-byte entries,
//! nine address bits per level, 4 KiB leaves at level 0 and optionally larger leaves
//! above. They differ in the entry encoding, which is a [`PteCodec`]
//! ([`gmem_ptengine::Codec`]); the walk, map, unmap, protect, split and reclamation are
//! [`gmem_ptengine::Engine`]'s, written once for every format (this crate's formats, the
//! IOMMU's atomic tables and the Sv39 driver on real hardware). What this module adds
//! is the simulated memory the tables live in and the device-side plumbing:
//!
//! - **Memory.** Table pages are frames of a [`FramePool`] in a [`SimMemory`]; entries
//!   are read and written with single 64-bit accesses, so the walk the devices do sees
//!   exactly what the edits left. Software keeps one piece of metadata per table page
//!   (how many entries are present), as an OS keeps page structures.
//! - **Discipline.** Plain: edits of one format's tables are serialised by a lock here
//!   (the core already serialises per table; several devices may edit different tables
//!   of the same format at once). Large leaves keep a split reserve, so unmap cannot
//!   fail.
//! - **Leaf sizes.** A map honours [`MapRun::page_size`]: leaves of that size where
//!   the run's alignment allows (the core asks for a large size only for aligned
//!   blocks) and never larger; a size the format does not map is `Unsupported`. A
//!   partial unmap or protect of a large leaf splits it from its reserve.
//! - **Reclamation.** An unmap that empties a table unlinks it and *retires* it through
//!   [`TableReclaim`]: it returns to the pool once every device walking this root has
//!   invalidated it (a page-walk cache may still point at it).
//! - **Walk.** From the deepest table the page-walk cache knows down to a leaf; a leaf
//!   that permits the access gets the codec's accessed/dirty bits if they change.
//!   Entries read and written are counted in the returned [`Walk`].
//! - **Failure.** A map that runs out of table frames takes back what it mapped of its
//!   run; a request the format cannot express is `MmuError::Unsupported`; a root the
//!   tables do not know is `MmuError::Hardware(HW_UNKNOWN_ROOT)`.

use crate::format::{Leaf, TableFormat, Walk, WalkerId};
use crate::frames::FramePool;
use crate::lock;
use crate::memory::{BoundsError, SimMemory};
use crate::reclaim::{ReclaimStats, TableReclaim};
use crate::tlb::Tlb;
use gmem_core::{
    FrameSource, MapRun, MmuError, PageSize, PageSizes, PageTableFormat, PageTableRoot, PhysAddr,
    Prot, VaRange, VirtAddr,
};
pub use gmem_ptengine::{
    index, level_shift, level_size, Codec as PteCodec, EditError, EditStats, Engine, Entry,
    TableMemory, ENTRIES,
};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// `MmuError::Hardware` code: the root is not a live table of these tables.
pub const HW_UNKNOWN_ROOT: u32 = 0x7a_01;
/// `MmuError::Hardware` code: a table entry points outside the memory (corrupt table).
pub const HW_BAD_ENTRY: u32 = 0x7a_02;

/// Counters of the table edits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// The engine's edit counters.
    pub edits: EditStats,
    /// Table frames in use (roots included, retired ones and split reserves included).
    pub tables_in_use: u64,
    /// Table-page reclamation.
    pub reclaim: ReclaimStats,
}

/// Table pages in a [`SimMemory`]: frames of a pool, present-entry counts, retirement.
pub struct SimTableMemory {
    memory: Arc<SimMemory>,
    reclaim: TableReclaim,
    counts: Mutex<HashMap<u64, u32>>,
}

impl TableMemory for SimTableMemory {
    fn read(&self, pa: u64) -> Option<u64> {
        self.memory.read_u64(PhysAddr::new(pa)).ok()
    }
    fn write(&self, pa: u64, raw: u64) -> Option<()> {
        self.memory.write_u64(PhysAddr::new(pa), raw).ok()
    }
    fn alloc(&self) -> Option<u64> {
        let f = self.reclaim.pool().alloc_frame()?.as_u64();
        lock(&self.counts).insert(f, 0);
        Some(f)
    }
    fn free(&self, table: u64) {
        lock(&self.counts).remove(&table);
        self.reclaim.pool().free_frame(PhysAddr::new(table));
    }
    fn retire(&self, root: u64, table: u64) {
        lock(&self.counts).remove(&table);
        self.reclaim
            .retire(PageTableRoot(root), PhysAddr::new(table));
    }
    fn count(&self, table: u64, delta: i32) -> Option<u32> {
        let mut c = lock(&self.counts);
        let n = c.entry(table).or_insert(0);
        *n = n.saturating_add_signed(delta);
        Some(*n)
    }
}

/// The tables of one format in one memory.
pub struct RadixTables<C: PteCodec> {
    engine: Engine<C, SimTableMemory>,
    /// Live roots; the lock also serialises the edits (the plain discipline).
    roots: Mutex<HashSet<u64>>,
}

impl<C: PteCodec + Send + Sync + 'static> RadixTables<C> {
    /// Tables encoded by `codec` in `memory`, their frames from
    /// `[pool_base, pool_base + pool_frames * 4 KiB)` (a range the core does not manage).
    ///
    /// # Errors
    /// The pool does not fit in `memory`, or (as `BoundsError` too) the codec's
    /// geometry is one the engine does not support.
    pub fn new(
        codec: C,
        memory: Arc<SimMemory>,
        pool_base: PhysAddr,
        pool_frames: u64,
    ) -> Result<RadixTables<C>, BoundsError> {
        let pool = Arc::new(FramePool::new(memory.clone(), pool_base, pool_frames)?);
        let tables = SimTableMemory {
            memory,
            reclaim: TableReclaim::new(pool),
            counts: Mutex::new(HashMap::new()),
        };
        let engine = Engine::new(codec, tables).map_err(|_| BoundsError::BadRange {
            base: pool_base.as_u64(),
            size: pool_frames,
        })?;
        Ok(RadixTables {
            engine: engine.with_split_reserve(),
            roots: Mutex::new(HashSet::new()),
        })
    }

    /// The codec.
    pub fn codec(&self) -> &C {
        self.engine.codec()
    }

    /// The engine (for checks such as [`Engine::check_derived`]).
    pub fn engine(&self) -> &Engine<C, SimTableMemory> {
        &self.engine
    }

    /// The memory the tables live in.
    pub fn memory(&self) -> &Arc<SimMemory> {
        &self.engine.memory().memory
    }

    /// The frame pool.
    pub fn pool(&self) -> &Arc<FramePool> {
        self.engine.memory().reclaim.pool()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> TableStats {
        TableStats {
            edits: self.engine.stats(),
            tables_in_use: self.pool().stats().in_use,
            reclaim: self.engine.memory().reclaim.stats(),
        }
    }

    /// [`TableFormat::map`] with format bits `bits` in every leaf of the run (what a
    /// codec keeps per page and a TLB entry keeps with the translation).
    ///
    /// # Errors
    /// As [`TableFormat::map`]; bits the codec does not define are `Unsupported`.
    pub fn map_with_bits(
        &self,
        root: PageTableRoot,
        run: &MapRun,
        bits: u64,
    ) -> Result<(), MmuError> {
        let roots = lock(&self.roots);
        if !roots.contains(&root.0) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        let r = gmem_ptengine::Run {
            bits,
            ..gmem_ptengine::Run::of(run)
        };
        // The core's `page_size` is honoured: leaves of that size (where the run's
        // alignment gives them, which the core guarantees) and none larger.
        let size = run.page_size.bytes();
        let unsupported = MmuError::Unsupported { va: run.va };
        if !self.page_sizes().supports(run.page_size)
            || run.va.as_u64() % size != 0
            || run.pa.as_u64() % size != 0
            || run.len % size != 0
        {
            return Err(unsupported);
        }
        let large = (1..self.engine.codec().levels())
            .filter(|l| level_size(*l) <= size)
            .fold(0u32, |m, l| m | 1 << l);
        self.engine
            .map_limited(root.0, &r, large)
            .map_err(|e| e.to_mmu(HW_BAD_ENTRY, HW_BAD_ENTRY))
    }

    /// Software lookup of `va` in `root`: no accessed/dirty side effects, nothing
    /// counted.
    pub fn lookup(&self, root: PageTableRoot, va: VirtAddr) -> Option<Leaf> {
        self.engine.lookup(root.0, va.as_u64())
    }

    /// Every leaf of `root` as `(first virtual address, leaf)`, in index order (for
    /// comparing with a model).
    pub fn leaves(&self, root: PageTableRoot) -> Vec<(VirtAddr, Leaf)> {
        let mut out = Vec::new();
        if lock(&self.roots).contains(&root.0) {
            self.engine
                .for_each_leaf(root.0, |va, l| out.push((VirtAddr::new(va), l)));
        }
        out
    }
}

impl<C: PteCodec + Send + Sync + 'static> TableFormat for RadixTables<C> {
    fn format(&self) -> PageTableFormat {
        self.engine.codec().format()
    }

    fn page_sizes(&self) -> PageSizes {
        let large = self.engine.codec().large_levels();
        (1..self.engine.codec().levels())
            .filter(|l| large & (1 << l) != 0)
            .filter_map(|l| PageSize::from_bytes(level_size(l)))
            .fold(PageSizes::S4K, |s, p| s | PageSizes::of(p))
    }

    fn create(&self) -> Result<PageTableRoot, MmuError> {
        let mut roots = lock(&self.roots);
        let t = self
            .engine
            .create_root()
            .map_err(|e| e.to_mmu(HW_BAD_ENTRY, HW_BAD_ENTRY))?;
        roots.insert(t);
        Ok(PageTableRoot(t))
    }

    fn destroy(&self, root: PageTableRoot) {
        let mut roots = lock(&self.roots);
        if !roots.remove(&root.0) {
            return;
        }
        self.engine.free_tree(root.0, |_| false);
        self.engine.memory().free(root.0);
        drop(roots);
        self.engine.memory().reclaim.destroyed(root);
    }

    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        self.map_with_bits(root, run, 0)
    }

    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        let roots = lock(&self.roots);
        if roots.contains(&root.0) {
            // With split reserves an unmap of a valid range cannot fail.
            let _ = self.engine.unmap(root.0, range.start.as_u64(), range.len);
        }
    }

    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        let roots = lock(&self.roots);
        if !roots.contains(&root.0) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        self.engine
            .protect(root.0, range.start.as_u64(), range.len, prot)
            .map(|_| ())
            .map_err(|e| e.to_mmu(HW_BAD_ENTRY, HW_BAD_ENTRY))
    }

    fn test_and_clear_accessed(&self, root: PageTableRoot, range: VaRange) -> Option<bool> {
        let roots = lock(&self.roots);
        if !roots.contains(&root.0) {
            return self.engine.codec().accessed_bit(0).map(|_| false);
        }
        self.engine
            .test_and_clear_accessed(root.0, range.start.as_u64(), range.len)
    }

    fn walk(
        &self,
        root: PageTableRoot,
        va: VirtAddr,
        access: Prot,
        cache: Option<&mut Tlb<u64>>,
    ) -> Walk {
        walk_cached(&self.engine, root, va, Some(access), cache)
    }

    fn new_walker(&self) -> WalkerId {
        self.engine.memory().reclaim.new_walker()
    }

    fn walker_activated(&self, walker: WalkerId, root: Option<PageTableRoot>) {
        self.engine.memory().reclaim.activated(walker, root)
    }

    fn walker_invalidated(&self, walker: WalkerId, root: PageTableRoot) {
        self.engine.memory().reclaim.invalidated(walker, root)
    }
}

/// The hardware walk of any engine: from the deepest table the page-walk cache `cache`
/// (keyed by root, one page shift per level) knows, filling it on the way down.
pub fn walk_cached<C: PteCodec, M: TableMemory>(
    engine: &Engine<C, M>,
    root: PageTableRoot,
    va: VirtAddr,
    access: Option<Prot>,
    mut cache: Option<&mut Tlb<u64>>,
) -> Walk {
    let v = va.as_u64();
    if !engine.codec().va_ok(v, 1) {
        return Walk::default();
    }
    let top = engine.top();
    let (mut table, mut level, mut skipped) = (root.0, top, 0);
    if let Some(c) = cache.as_deref_mut() {
        // The deepest cached table first: the one below a level-1 entry, then 2, ...
        let (mut shifts, mut n) = ([0u8; 8], 0);
        for l in 1..=top.min(8) {
            shifts[n] = level_shift(l);
            n += 1;
        }
        if let Some((s, t)) = c.lookup_deepest(root.0, v, &shifts[..n]) {
            table = t;
            level = (s as u32 - 12) / 9 - 1;
            skipped = top - level;
        }
    }
    let w = engine.walk(table, level, v, access, |l, t| {
        if let Some(c) = cache.as_deref_mut() {
            // The walk descends from `level` down: every level up to 8 it reports was
            // probed above and missed (or lies below the hit), so no search is needed.
            if l <= 8 {
                c.insert_absent(root.0, v, level_shift(l), t);
            } else {
                c.insert(root.0, v, level_shift(l), t);
            }
        }
    });
    Walk {
        leaf: w.leaf,
        reads: w.reads,
        writes: w.writes,
        skipped,
    }
}

/// The page-table format of this crate's unit tests.
#[cfg(test)]
pub(crate) mod test_codec {
    use super::{Entry, PteCodec};
    use gmem_core::{PageTableFormat, PhysAddr, Prot};
    use gmem_ptengine::{Leaf, Run};

    /// Three levels of 4 KiB leaves: bit 0 valid, bits 1..3 R/W/X, bits 4..7 format
    /// bits, bit 9 dirty (set by a store through [`PteCodec::used`]).
    pub(crate) struct TestCodec;

    impl PteCodec for TestCodec {
        fn format(&self) -> PageTableFormat {
            PageTableFormat(0x7e57)
        }
        fn levels(&self) -> u32 {
            3
        }
        fn va_ok(&self, va: u64, len: u64) -> bool {
            len > 0 && va.checked_add(len).is_some_and(|e| e <= 1 << 39)
        }
        fn table(&self, table: PhysAddr) -> Option<u64> {
            Some(table.as_u64() | 1)
        }
        fn format_bits(&self) -> u64 {
            0xf
        }
        fn leaf(&self, frame: PhysAddr, _: u32, run: &Run) -> Option<u64> {
            Some(frame.as_u64() | 1 | u64::from(run.prot.bits()) << 1 | run.bits << 4)
        }
        fn decode(&self, raw: u64, level: u32) -> Entry {
            match (raw & 1, level) {
                (0, _) => Entry::NotPresent,
                (_, 1..) => Entry::Table(PhysAddr::new(raw & !0xfff)),
                _ => Entry::Leaf(Leaf {
                    frame: PhysAddr::new(raw & !0xfff),
                    shift: 12,
                    prot: Prot::from_bits_truncate(((raw >> 1) & 7) as u8),
                    dirty: raw & 1 << 9 != 0,
                    local: false,
                    bits: (raw >> 4) & 0xf,
                }),
            }
        }
        fn with_prot(&self, raw: u64, prot: Prot, _: u32) -> Option<u64> {
            Some((raw & !0xe) | u64::from(prot.bits()) << 1)
        }
        fn split(&self, raw: u64, _: u32, _: u64) -> u64 {
            raw
        }
        fn used(&self, raw: u64, access: Prot) -> u64 {
            if access.contains(Prot::WRITE) {
                raw | 1 << 9
            } else {
                raw
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_codec::TestCodec;
    use super::*;
    use crate::hierarchy::HierarchyConfig;
    use crate::mmu::{SimMmu, Translator};
    use crate::tlb::{Replacement, TlbConfig};
    use gmem_core::{DeviceId, Mmu, PageSize, PAGE_SIZE};

    #[test]
    fn format_bits_reach_the_walk_and_stay_in_the_tlb_entry() {
        let m = Arc::new(SimMemory::new("m", PhysAddr::new(0), 4 << 20).unwrap());
        let tables = Arc::new(RadixTables::new(TestCodec, m, PhysAddr::new(0), 16).unwrap());
        let l1 = TlbConfig::new(4, 4, Replacement::Lru);
        let config = HierarchyConfig {
            units: 1,
            l1,
            l2: None,
            walk_cache: None,
        };
        let mmu = SimMmu::new(tables.clone(), config).unwrap();
        let root = mmu.create_page_table().unwrap();
        let run = MapRun {
            va: VirtAddr::new(0x40_0000),
            pa: PhysAddr::new(0x20_0000),
            len: 2 * PAGE_SIZE,
            prot: Prot::RW,
            page_size: PageSize::Size4K,
            memory: DeviceId::from_raw(0, 1),
            attrs: Default::default(),
        };
        tables.map_with_bits(root, &run, 0b1010).unwrap();
        assert!(
            tables.map_with_bits(root, &run, 0x10).is_err(),
            "undefined bits"
        );
        mmu.activate(Some(root));
        let va = VirtAddr::new(0x40_1008);
        let walked = mmu.translate(0, va, Prot::READ).unwrap();
        let cached = mmu.translate(0, va, Prot::READ).unwrap();
        assert_eq!((walked.bits, cached.bits), (0b1010, 0b1010));
        assert_eq!(cached.translate(va), PhysAddr::new(0x20_1008));
        assert_eq!(mmu.stats().translations, 1, "the second came from the TLB");
    }
}
