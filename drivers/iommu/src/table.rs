//! The IOMMU's page tables: x86-64 4-level tables in [`TableMemory`], edited under one
//! of three disciplines.
//!
//! ## Theory (GMEM section 5.5)
//! An IOMMU driver's page-table edits are pairwise disjoint: each map or unmap covers a
//! DMA buffer's own IOVA range, which the allocator gave to nobody else. Two requests
//! can only meet on the *intermediate* tables they share. The disciplines differ in how
//! they handle that meeting point:
//!
//! - [`Discipline::Locked`] — one lock per table (FreeBSD's giant-locked IOMMU page
//!   table): every map, unmap and protect holds it; a table page whose last entry an
//!   unmap cleared is unlinked and reclaimed at once.
//! - [`Discipline::Cas`] — lock-free (Linux's scheme): a missing intermediate table is
//!   allocated and installed with a compare-and-swap on the parent entry; the loser of
//!   a race frees its page and uses the winner's. Leaves are written with plain atomic
//!   stores (nobody else touches them). Nothing counts entries, so nothing can tell
//!   when a table page becomes empty: **table pages are never reclaimed** (until the
//!   table is destroyed) and table memory stays at its high-water mark.
//! - [`Discipline::Rw`] — GMEM's reclaimable low-contention table: map, unmap and
//!   protect hold the table's lock as *readers* (so they run in parallel) and install
//!   intermediate tables with CAS as above; every table page counts its present entries
//!   atomically. An unmap that brings a count to zero remembers the address, drops the
//!   read lock and takes the lock as the *writer*, re-checks the count (a mapper may
//!   have refilled the page meanwhile), unlinks the empty page and walks up unlinking
//!   parents that became empty. Because a writer excludes every reader, no mapper can
//!   be holding a pointer to a page being unlinked.
//!
//! The three are the shared page-table engine's disciplines ([`gmem_ptengine`]):
//! `Locked` is its plain discipline under the table lock, `Cas` and `Rw` its concurrent
//! ones; the walk, the edits and the collapse are the engine's, this module is the
//! locking around them. Unlinked pages are retired, not freed: the IOTLB's page-walk
//! cache may still point at them until the next invalidation (see [`crate::memory`]).
//!
//! The hardware walk ([`TableFormat::walk`]) never takes a lock: it loads each entry
//! once with acquire ordering, so it sees an entry before or after an edit, never half
//! of one. Intermediate entries are fully permissive; permissions live in the leaf.
//!
//! ## Superpages
//! By default only 4 KiB leaves are used (DMA buffers are small). Tables made with
//! [`IoTables::with_superpages`] (locked discipline only: the engine splits a large
//! leaf under its plain discipline, where no concurrent edit can meet the split) also
//! map 2 MiB leaves — VT-d's second-level 2 MiB pages, `CAP.SLLPS` bit 0 (Intel VT-d
//! specification, section 11.4.2) — and report them to the core in
//! [`TableFormat::page_sizes`]; the core then asks for one whenever a buffer's IOVA
//! block and frames are one aligned 2 MiB block (see `gmem_core::mmu`, *Large leaves*).
//! Each large leaf keeps a split reserve (one table page), so a partial unmap splits it
//! into 512 leaves without allocating and cannot fail. 1 GiB leaves are not offered:
//! the x86-64 codec here encodes large leaves at level 1 only.

use crate::memory::{TableMemory, TableMemoryError, TableMemoryStats};
use crate::sync::Ordering;
use gmem_core::{
    MapRun, MmuError, PageSizes, PageTableFormat, PageTableRoot, PhysAddr, Prot, VaRange, VirtAddr,
    PAGE_SIZE,
};
use gmem_ptengine::TableMemory as _;
use gmem_ptengine::{Discipline as EngineDiscipline, EditStats, Engine, Run};
use gmem_sim::radix::walk_cached;
use gmem_sim::{Leaf, TableFormat, Tlb, Walk, WalkerId};
use gmem_x86pt::X86Codec;

/// The format id of these tables: x86-64 entries in IOMMU table memory. Distinct from
/// `gmem_x86pt::X86_FORMAT` because the CPU's tables live in host memory and are
/// edited by other code, so the core must never share one table between the two.
pub const IOMMU_FORMAT: PageTableFormat = PageTableFormat(0x1_8664);

/// `MmuError::Hardware` code: the root is not a live table of these tables.
pub const HW_UNKNOWN_ROOT: u32 = 0x10_01;
/// `MmuError::Hardware` code: an entry points outside the table memory (corrupt table).
pub const HW_BAD_ENTRY: u32 = 0x10_02;

/// How page-table edits synchronise with each other (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Discipline {
    /// One lock per table around every edit; empty table pages reclaimed at once.
    Locked,
    /// Lock-free: CAS installs intermediate tables; table pages never reclaimed.
    Cas,
    /// Readers edit in parallel; a writer reclaims table pages whose count hit zero.
    Rw,
}

impl Discipline {
    /// Whether the discipline reclaims emptied table pages.
    pub fn reclaims(self) -> bool {
        self != Discipline::Cas
    }

    fn engine(self) -> EngineDiscipline {
        match self {
            Discipline::Locked => EngineDiscipline::Plain,
            Discipline::Cas => EngineDiscipline::Cas,
            Discipline::Rw => EngineDiscipline::Rw,
        }
    }
}

/// Counters of the table edits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoTableStats {
    /// The engine's edit counters.
    pub edits: EditStats,
    /// The table memory's frames and reclamation.
    pub memory: TableMemoryStats,
}

/// IOMMU page tables of one discipline.
pub struct IoTables {
    discipline: Discipline,
    engine: Engine<X86Codec, TableMemory>,
}

impl IoTables {
    /// Tables of `discipline` in a table memory of `frames` frames at `base`.
    ///
    /// # Errors
    /// The table memory's range is invalid.
    pub fn new(
        discipline: Discipline,
        base: PhysAddr,
        frames: u64,
    ) -> Result<IoTables, TableMemoryError> {
        // 4 KiB leaves only, no derived bits: every discipline accepts the codec.
        IoTables::with_codec(discipline, X86Codec::default(), base, frames)
    }

    /// Locked tables that map 2 MiB leaves where the core asks for them, each with a
    /// split reserve (see the module's *Superpages*).
    ///
    /// # Errors
    /// The table memory's range is invalid.
    pub fn with_superpages(base: PhysAddr, frames: u64) -> Result<IoTables, TableMemoryError> {
        let codec = X86Codec {
            config: gmem_x86pt::X86Config {
                large_pages: true,
                ..Default::default()
            },
        };
        let memory = TableMemory::new(base, frames)?;
        let engine = Engine::concurrent(codec, memory, EngineDiscipline::Plain)
            .map_err(|_| TableMemoryError::BadRange {
                base: base.as_u64(),
                frames,
            })?
            .with_split_reserve();
        Ok(IoTables {
            discipline: Discipline::Locked,
            engine,
        })
    }

    /// Whether the tables map 2 MiB leaves ([`IoTables::with_superpages`]).
    pub fn superpages(&self) -> bool {
        self.engine.codec().config.large_pages
    }

    /// Locked tables that keep MESC's contiguity bits ([`gmem_x86pt::mesc`]) in every
    /// level-1 table pointer, recomputed inside each edit of the leaves below (the
    /// engine's derived bits, which only its plain discipline keeps: a concurrent edit
    /// of a neighbouring leaf could race the recomputation).
    ///
    /// # Errors
    /// The table memory's range is invalid.
    pub fn with_mesc(base: PhysAddr, frames: u64) -> Result<IoTables, TableMemoryError> {
        let codec = X86Codec {
            config: gmem_x86pt::X86Config {
                mesc: true,
                ..Default::default()
            },
        };
        IoTables::with_codec(Discipline::Locked, codec, base, frames)
    }

    fn with_codec(
        discipline: Discipline,
        codec: X86Codec,
        base: PhysAddr,
        frames: u64,
    ) -> Result<IoTables, TableMemoryError> {
        let memory = TableMemory::new(base, frames)?;
        let engine = Engine::concurrent(codec, memory, discipline.engine()).map_err(|_| {
            TableMemoryError::BadRange {
                base: base.as_u64(),
                frames,
            }
        })?;
        Ok(IoTables { discipline, engine })
    }

    /// The discipline.
    pub fn discipline(&self) -> Discipline {
        self.discipline
    }

    /// The codec (its MESC option says whether the tables keep contiguity bits).
    pub fn codec(&self) -> &X86Codec {
        self.engine.codec()
    }

    /// The table memory.
    pub fn memory(&self) -> &TableMemory {
        self.engine.memory()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> IoTableStats {
        IoTableStats {
            edits: self.engine.stats(),
            memory: self.memory().stats(),
        }
    }

    /// Software lookup of `va` in `root` (nothing counted, nothing cached).
    pub fn lookup(&self, root: PageTableRoot, va: VirtAddr) -> Option<Leaf> {
        if !self.is_root(root) {
            return None;
        }
        self.engine.lookup(root.0, va.as_u64())
    }

    /// Intermediate tables installed so far (all roots).
    pub fn installs(&self) -> u64 {
        self.engine.stats().tables_installed
    }

    /// Whether a table page unlinked from `root` is still retired (some walker may
    /// cache a pointer to it).
    pub fn has_retired(&self, root: PageTableRoot) -> bool {
        self.memory().has_retired(root.0)
    }

    fn is_root(&self, root: PageTableRoot) -> bool {
        self.memory()
            .meta(root.0)
            .is_some_and(|m| root.0 % PAGE_SIZE == 0 && m.root.load(Ordering::Acquire))
    }

    /// Clear or rewrite `range` of `root` under the discipline's locking.
    fn edit(&self, root: PageTableRoot, range: VaRange, prot: Option<Prot>) {
        let (va, len) = (range.start.as_u64(), range.len);
        let Some(meta) = self.memory().meta(root.0) else {
            return;
        };
        let edit = || match prot {
            None => self.engine.unmap(root.0, va, len),
            Some(p) => self.engine.protect(root.0, va, len, p),
        };
        // Without large leaves an unmap or protect of a valid range cannot fail; with
        // them an unmap splits from the leaf's reserve and cannot fail either, and a
        // protect that finds no page for a split leaves the leaf whole (the core then
        // unmaps its block, `gmem_core::mmu`).
        match self.discipline {
            Discipline::Cas => {
                let _ = edit();
            }
            Discipline::Locked => {
                let _g = meta.lock.write();
                let _ = edit();
            }
            Discipline::Rw => {
                let emptied = {
                    let _g = meta.lock.read();
                    edit().map(|e| e.emptied).unwrap_or_default()
                };
                if !emptied.is_empty() {
                    let _g = meta.lock.write();
                    for va in emptied {
                        self.engine.collapse(root.0, va);
                    }
                }
            }
        }
    }
}

impl TableFormat for IoTables {
    fn format(&self) -> PageTableFormat {
        IOMMU_FORMAT
    }

    fn page_sizes(&self) -> PageSizes {
        if self.superpages() {
            PageSizes::S4K | PageSizes::S2M
        } else {
            PageSizes::S4K
        }
    }

    fn create(&self) -> Result<PageTableRoot, MmuError> {
        let t = self
            .engine
            .create_root()
            .map_err(|e| e.to_mmu(HW_BAD_ENTRY, HW_BAD_ENTRY))?;
        if let Some(m) = self.memory().meta(t) {
            m.root.store(true, Ordering::Release);
        }
        Ok(PageTableRoot(t))
    }

    fn destroy(&self, root: PageTableRoot) {
        let Some(meta) = self.memory().meta(root.0) else {
            return;
        };
        if root.0 % PAGE_SIZE != 0 {
            return;
        }
        let _g = meta.lock.write();
        if !meta.root.swap(false, Ordering::AcqRel) {
            return;
        }
        self.engine.free_tree(root.0, |_| false);
        self.memory().free(root.0);
        self.memory().destroyed(root.0);
    }

    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        if !self.is_root(root) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        let meta = self
            .memory()
            .meta(root.0)
            .ok_or(MmuError::Hardware(HW_UNKNOWN_ROOT))?;
        let r = Run::of(run);
        let result = match self.discipline {
            Discipline::Cas => self.engine.map(root.0, &r),
            Discipline::Locked => {
                let _g = meta.lock.write();
                self.engine.map(root.0, &r)
            }
            Discipline::Rw => {
                let g = meta.lock.read();
                let result = self.engine.map(root.0, &r);
                drop(g);
                if result.is_err() {
                    // The engine took the run back; the tables made for its first page
                    // may be empty now: reclaim them as the writer.
                    let _g = meta.lock.write();
                    self.engine.collapse(root.0, r.va);
                }
                result
            }
        };
        result.map_err(|e| e.to_mmu(HW_BAD_ENTRY, HW_BAD_ENTRY))
    }

    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        if range.len == 0 || !self.is_root(root) {
            return;
        }
        self.edit(root, range, None);
    }

    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        if !self.is_root(root) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        if range.len == 0 || !gmem_x86pt::pte::is_canonical_range(range.start, range.len) {
            return Err(MmuError::Unsupported { va: range.start });
        }
        self.edit(root, range, Some(prot));
        Ok(())
    }

    fn walk(
        &self,
        root: PageTableRoot,
        va: VirtAddr,
        access: Prot,
        cache: Option<&mut Tlb<u64>>,
    ) -> Walk {
        let _ = access;
        if !self.is_root(root) {
            return Walk::default();
        }
        // Second-level IOMMU tables here keep no accessed/dirty bits: the walk writes
        // nothing, and a cached leaf never needs a second walk for a store.
        let mut w = walk_cached(&self.engine, root, va, None, cache);
        if let Some(l) = w.leaf.as_mut() {
            l.dirty = true;
        }
        w
    }

    fn new_walker(&self) -> WalkerId {
        self.memory().new_walker()
    }

    fn walker_activated(&self, walker: WalkerId, root: Option<PageTableRoot>) {
        self.memory().activated(walker, root)
    }

    fn walker_invalidated(&self, walker: WalkerId, root: PageTableRoot) {
        self.memory().invalidated(walker, root)
    }
}
