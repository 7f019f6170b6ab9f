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
//! Unlinked pages are retired, not freed: the IOTLB's page-walk cache may still point
//! at them until the next invalidation (see [`crate::memory`]).
//!
//! The hardware walk ([`TableFormat::walk`]) never takes a lock: it loads each entry
//! once with acquire ordering, so it sees an entry before or after an edit, never half
//! of one. Intermediate entries are fully permissive; permissions live in the leaf.
//! Only 4 KiB leaves are used (DMA buffers are small; the IOVA allocator does not align
//! them for large pages).

use crate::memory::{TableMemory, TableMemoryError, TableMemoryStats};
use crate::sync::{AtomicU64, Ordering};
use gmem_core::{
    MapRun, MmuError, PageSizes, PageTableFormat, PageTableRoot, PhysAddr, Prot, VaRange, VirtAddr,
    PAGE_SIZE,
};
use gmem_sim::radix::{index, level_shift, level_size};
use gmem_sim::{Leaf, TableFormat, Tlb, Walk, WalkerId};
use gmem_x86pt::pte::{is_canonical_range, LEVELS};
use gmem_x86pt::{Decoded, X86Pte};
// Statistics only: they order nothing, so they are `std` atomics even in loom builds.
use std::sync::atomic::AtomicU64 as Counter;

/// The format id of these tables: x86-64 entries in IOMMU table memory. Distinct from
/// `gmem_x86pt::X86_FORMAT` because the CPU's tables live in host memory and are
/// edited by other code, so the core must never share one table between the two.
pub const IOMMU_FORMAT: PageTableFormat = PageTableFormat(0x1_8664);

/// `MmuError::Hardware` code: the root is not a live table of these tables.
pub const HW_UNKNOWN_ROOT: u32 = 0x10_01;
/// `MmuError::Hardware` code: an entry points outside the table memory (corrupt table).
pub const HW_BAD_ENTRY: u32 = 0x10_02;

const TOP: u32 = LEVELS - 1;
const LEAF_TABLE_SPAN: u64 = level_size(1);

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
}

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        #[derive(Default)]
        struct Counters { $( $name: Counter, )* }

        /// Counters of the table edits.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct IoTableStats {
            $( $(#[$doc])* pub $name: u64, )*
            /// The table memory's frames and reclamation.
            pub memory: TableMemoryStats,
        }

        impl Counters {
            fn snapshot(&self, memory: TableMemoryStats) -> IoTableStats {
                IoTableStats { $( $name: self.$name.load(Ordering::Relaxed), )* memory }
            }
        }
    };
}

counters! {
    /// Intermediate tables installed (roots not included).
    tables_installed,
    /// Intermediate-table installs that lost a CAS race (their page went back).
    cas_lost,
    /// Empty table pages unlinked for reclamation.
    tables_unlinked,
    /// Times the writer side of a table lock was taken to reclaim.
    writer_reclaims,
    /// Writer reclaims that found the page refilled and left it.
    reclaims_abandoned,
    /// Leaves written by map.
    leaves_set,
    /// Leaves cleared by unmap.
    leaves_cleared,
    /// Leaves rewritten by protect.
    leaves_protected,
    /// Map calls that failed (nothing of their run stays mapped).
    failed_maps,
}

fn add(c: &Counter, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn present(raw: u64) -> bool {
    X86Pte(raw).is_present()
}

fn bad_entry() -> MmuError {
    MmuError::Hardware(HW_BAD_ENTRY)
}

/// IOMMU page tables of one discipline.
pub struct IoTables {
    discipline: Discipline,
    memory: TableMemory,
    counters: Counters,
}

impl IoTables {
    /// Tables of `discipline` in a table memory of `frames` frames at `base`.
    pub fn new(
        discipline: Discipline,
        base: PhysAddr,
        frames: u64,
    ) -> Result<IoTables, TableMemoryError> {
        Ok(IoTables {
            discipline,
            memory: TableMemory::new(base, frames)?,
            counters: Counters::default(),
        })
    }

    /// The discipline.
    pub fn discipline(&self) -> Discipline {
        self.discipline
    }

    /// The table memory.
    pub fn memory(&self) -> &TableMemory {
        &self.memory
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> IoTableStats {
        self.counters.snapshot(self.memory.stats())
    }

    /// Software lookup of `va` in `root` (nothing counted, nothing cached).
    pub fn lookup(&self, root: PageTableRoot, va: VirtAddr) -> Option<Leaf> {
        self.walk_inner(root, va, None).leaf
    }

    /// Intermediate tables installed so far (all roots).
    pub fn installs(&self) -> u64 {
        self.counters.tables_installed.load(Ordering::Relaxed)
    }

    /// Whether a table page unlinked from `root` is still retired (some walker may
    /// cache a pointer to it).
    pub fn has_retired(&self, root: PageTableRoot) -> bool {
        self.memory.has_retired(root.0)
    }

    fn is_root(&self, root: PageTableRoot) -> bool {
        self.memory
            .meta(root.0)
            .is_some_and(|m| root.0 % PAGE_SIZE == 0 && m.root.load(Ordering::Acquire))
    }

    fn entry(&self, table: u64, va: u64, level: u32) -> Result<&AtomicU64, MmuError> {
        self.memory
            .word(table + index(va, level) * 8)
            .ok_or_else(bad_entry)
    }

    /// The table below a present non-leaf entry.
    fn child(raw: u64, level: u32) -> Option<u64> {
        match X86Pte(raw).decode(level) {
            Decoded::Table(t) => Some(t.as_u64()),
            _ => None,
        }
    }

    fn bump(&self, table: u64, up: bool) {
        if let Some(m) = self.memory.meta(table) {
            if up {
                m.count.fetch_add(1, Ordering::AcqRel);
            } else {
                m.count.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// The leaf table (level 0) holding `va`'s entry, creating the missing tables on
    /// the way with CAS. `count`: maintain the entry counts.
    fn leaf_table_or_create(&self, root: u64, va: u64, count: bool) -> Result<u64, MmuError> {
        let mut table = root;
        for level in (1..=TOP).rev() {
            let e = self.entry(table, va, level)?;
            let mut raw = e.load(Ordering::Acquire);
            if !present(raw) {
                let new = self.memory.alloc().ok_or(MmuError::OutOfTableMemory)?;
                let want = X86Pte::table(PhysAddr::new(new)).0;
                match Self::install(e, raw, want) {
                    Ok(_) => {
                        raw = want;
                        add(&self.counters.tables_installed, 1);
                        if count {
                            self.bump(table, true);
                        }
                    }
                    Err(current) => {
                        self.memory.free(new);
                        add(&self.counters.cas_lost, 1);
                        raw = current;
                    }
                }
            }
            table = Self::child(raw, level).ok_or_else(bad_entry)?;
        }
        Ok(table)
    }

    /// Install `want` in `e` if it still holds `raw`; otherwise what it holds.
    #[cfg(not(gmem_loom_bug = "iommu_cas_plain_store"))]
    fn install(e: &AtomicU64, raw: u64, want: u64) -> Result<u64, u64> {
        e.compare_exchange(raw, want, Ordering::AcqRel, Ordering::Acquire)
    }

    /// Broken variant for the loom model: check, then store, as two steps. Two
    /// mappers can both see the entry empty and both install; the first table is
    /// overwritten and what was mapped through it is lost.
    #[cfg(gmem_loom_bug = "iommu_cas_plain_store")]
    fn install(e: &AtomicU64, raw: u64, want: u64) -> Result<u64, u64> {
        let current = e.load(Ordering::Acquire);
        if current != raw {
            return Err(current);
        }
        e.store(want, Ordering::Release);
        Ok(current)
    }

    /// The leaf table holding `va`'s entry, if every level above it is present.
    fn leaf_table(&self, root: u64, va: u64) -> Option<u64> {
        let mut table = root;
        for level in (1..=TOP).rev() {
            let raw = self.entry(table, va, level).ok()?.load(Ordering::Acquire);
            table = Self::child(raw, level)?;
        }
        Some(table)
    }

    fn map_pages(&self, root: u64, run: &MapRun, count: bool) -> Result<(), MmuError> {
        let unsupported = MmuError::Unsupported { va: run.va };
        let mut done = 0;
        while done < run.len {
            let va = run.va.as_u64() + done;
            let t = self.leaf_table_or_create(root, va, count)?;
            let end =
                ((va & !(LEAF_TABLE_SPAN - 1)) + LEAF_TABLE_SPAN).min(run.va.as_u64() + run.len);
            let mut added = 0;
            let mut v = va;
            while v < end {
                let pa = PhysAddr::new(run.pa.as_u64() + (v - run.va.as_u64()));
                let leaf = X86Pte::leaf(pa, run.prot, false, false).ok_or(unsupported)?;
                let old = self.entry(t, v, 0)?.swap(leaf.0, Ordering::AcqRel);
                if !present(old) {
                    added += 1;
                }
                v += PAGE_SIZE;
            }
            if count && added > 0 {
                if let Some(m) = self.memory.meta(t) {
                    m.count.fetch_add(added, Ordering::AcqRel);
                }
            }
            add(&self.counters.leaves_set, (end - va) / PAGE_SIZE);
            done = end - run.va.as_u64();
        }
        Ok(())
    }

    /// Clear (`prot = None`) or rewrite the leaves of `[start, end)`. Leaf tables whose
    /// count dropped to zero are pushed on `empty` (by one address inside them).
    fn edit_leaves(
        &self,
        root: u64,
        start: u64,
        end: u64,
        prot: Option<Prot>,
        count: bool,
        empty: &mut Vec<u64>,
    ) {
        let mut va = start;
        while va < end {
            let chunk_end = ((va & !(LEAF_TABLE_SPAN - 1)) + LEAF_TABLE_SPAN).min(end);
            if let Some(t) = self.leaf_table(root, va) {
                let mut n = 0u32;
                let mut v = va;
                while v < chunk_end {
                    if let Ok(e) = self.entry(t, v, 0) {
                        match prot {
                            None => {
                                if present(e.swap(0, Ordering::AcqRel)) {
                                    n += 1;
                                }
                            }
                            Some(p) => {
                                let raw = e.load(Ordering::Acquire);
                                if present(raw) {
                                    e.store(X86Pte(raw).with_prot(p).0, Ordering::Release);
                                    n += 1;
                                }
                            }
                        }
                    }
                    v += PAGE_SIZE;
                }
                if prot.is_none() {
                    add(&self.counters.leaves_cleared, n as u64);
                    if count && n > 0 {
                        let prev = self
                            .memory
                            .meta(t)
                            .map_or(0, |m| m.count.fetch_sub(n, Ordering::AcqRel));
                        if prev == n {
                            empty.push(va);
                        }
                    }
                } else {
                    add(&self.counters.leaves_protected, n as u64);
                }
            }
            va = chunk_end;
        }
    }

    /// Unlink, bottom up, the empty tables on `va`'s path (the caller excludes every
    /// other editor of `root`: the writer side of its lock).
    fn collapse(&self, root: u64, va: u64) {
        // path[i] = (parent table, its entry's level, child table)
        let mut path = [(0u64, 0u32, 0u64); LEVELS as usize];
        let mut n = 0;
        let mut table = root;
        for level in (1..=TOP).rev() {
            let Ok(e) = self.entry(table, va, level) else {
                break;
            };
            let Some(child) = Self::child(e.load(Ordering::Acquire), level) else {
                break;
            };
            path[n] = (table, level, child);
            n += 1;
            table = child;
        }
        let mut unlinked = false;
        for &(parent, level, child) in path[..n].iter().rev() {
            // The re-check: a mapper may have refilled the page between the unmap that
            // emptied it and this writer. The broken variant for the loom model
            // (`iommu_rw_no_recheck`) trusts the unmap's count instead.
            let recheck = !cfg!(gmem_loom_bug = "iommu_rw_no_recheck");
            if recheck
                && self
                    .memory
                    .meta(child)
                    .is_some_and(|m| m.count.load(Ordering::Acquire) != 0)
            {
                break;
            }
            if let Ok(e) = self.entry(parent, va, level) {
                e.store(0, Ordering::Release);
            }
            self.bump(parent, false);
            add(&self.counters.tables_unlinked, 1);
            self.memory.retire(root, child);
            unlinked = true;
        }
        if !unlinked {
            add(&self.counters.reclaims_abandoned, 1);
        }
    }

    /// Clear or rewrite `range` of `root` under the discipline's locking.
    fn edit(&self, root: PageTableRoot, range: VaRange, prot: Option<Prot>) {
        let (start, end) = (range.start.as_u64(), range.start.as_u64() + range.len);
        let Some(meta) = self.memory.meta(root.0) else {
            return;
        };
        let mut empty = Vec::new();
        match self.discipline {
            Discipline::Cas => self.edit_leaves(root.0, start, end, prot, false, &mut empty),
            Discipline::Locked => {
                let _g = meta.lock.write();
                self.edit_leaves(root.0, start, end, prot, true, &mut empty);
                for va in empty {
                    self.collapse(root.0, va);
                }
            }
            Discipline::Rw => {
                {
                    let _g = meta.lock.read();
                    self.edit_leaves(root.0, start, end, prot, true, &mut empty);
                }
                if !empty.is_empty() {
                    let _g = meta.lock.write();
                    add(&self.counters.writer_reclaims, 1);
                    for va in empty {
                        self.collapse(root.0, va);
                    }
                }
            }
        }
    }

    /// Every table frame under `table` (at `level`), for destroy.
    fn collect(&self, table: u64, level: u32, out: &mut Vec<u64>) {
        out.push(table);
        if level == 0 {
            return;
        }
        for i in 0..512u64 {
            let raw = self
                .memory
                .word(table + i * 8)
                .map_or(0, |w| w.load(Ordering::Acquire));
            if let Some(child) = Self::child(raw, level) {
                if self.memory.contains(PhysAddr::new(child)) {
                    self.collect(child, level - 1, out);
                }
            }
        }
    }

    fn walk_inner(
        &self,
        root: PageTableRoot,
        va: VirtAddr,
        mut cache: Option<&mut Tlb<u64>>,
    ) -> Walk {
        let mut w = Walk::default();
        let v = va.as_u64();
        if !is_canonical_range(va, 1) || !self.is_root(root) {
            return w;
        }
        let mut table = root.0;
        let mut level = TOP;
        if let Some(c) = cache.as_deref_mut() {
            let shifts = [level_shift(1), level_shift(2), level_shift(3)];
            if let Some((s, t)) = c.lookup_deepest(root.0, v, &shifts) {
                table = t;
                level = (s as u32 - 12) / 9 - 1;
                w.skipped = TOP - level;
            }
        }
        loop {
            let Some(e) = self.memory.word(table + index(v, level) * 8) else {
                return w;
            };
            let raw = e.load(Ordering::Acquire);
            w.reads += 1;
            match X86Pte(raw).decode(level) {
                Decoded::NotPresent => return w,
                Decoded::Table(t) if level > 0 => {
                    table = t.as_u64();
                    if let Some(c) = cache.as_deref_mut() {
                        c.insert(root.0, v, level_shift(level), table);
                    }
                    level -= 1;
                }
                Decoded::Table(_) => return w,
                Decoded::Leaf {
                    frame, shift, prot, ..
                } => {
                    // Second-level IOMMU tables here keep no accessed/dirty bits: a
                    // cached leaf never needs a second walk for a store.
                    w.leaf = Some(Leaf {
                        frame,
                        shift,
                        prot,
                        dirty: true,
                        local: false,
                    });
                    return w;
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
        PageSizes::S4K
    }

    fn create(&self) -> Result<PageTableRoot, MmuError> {
        let t = self.memory.alloc().ok_or(MmuError::OutOfTableMemory)?;
        if let Some(m) = self.memory.meta(t) {
            m.root.store(true, Ordering::Release);
        }
        Ok(PageTableRoot(t))
    }

    fn destroy(&self, root: PageTableRoot) {
        let Some(meta) = self.memory.meta(root.0) else {
            return;
        };
        if root.0 % PAGE_SIZE != 0 {
            return;
        }
        let _g = meta.lock.write();
        if !meta.root.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut frames = Vec::new();
        self.collect(root.0, TOP, &mut frames);
        for f in frames {
            self.memory.free(f);
        }
        self.memory.destroyed(root.0);
    }

    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        if !self.is_root(root) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        if run.len == 0 || run.len % PAGE_SIZE != 0 || !is_canonical_range(run.va, run.len) {
            return Err(MmuError::Unsupported { va: run.va });
        }
        let meta = self
            .memory
            .meta(root.0)
            .ok_or(MmuError::Hardware(HW_UNKNOWN_ROOT))?;
        let r = match self.discipline {
            Discipline::Cas => self.map_pages(root.0, run, false),
            Discipline::Locked => {
                let _g = meta.lock.write();
                self.map_pages(root.0, run, true)
            }
            Discipline::Rw => {
                let _g = meta.lock.read();
                self.map_pages(root.0, run, true)
            }
        };
        if r.is_err() {
            // Take back whatever part of the run was mapped, and any table left empty
            // on the path of its first page.
            self.edit(root, run.range(), None);
            if self.discipline.reclaims() {
                let _g = meta.lock.write();
                self.collapse(root.0, run.va.as_u64());
            }
            add(&self.counters.failed_maps, 1);
        }
        r
    }

    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        if range.len == 0 || !self.is_root(root) || !is_canonical_range(range.start, range.len) {
            return;
        }
        self.edit(root, range, None);
    }

    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        if !self.is_root(root) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        if range.len == 0 || !is_canonical_range(range.start, range.len) {
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
        self.walk_inner(root, va, cache)
    }

    fn new_walker(&self) -> WalkerId {
        self.memory.new_walker()
    }

    fn walker_activated(&self, walker: WalkerId, root: Option<PageTableRoot>) {
        self.memory.activated(walker, root)
    }

    fn walker_invalidated(&self, walker: WalkerId, root: PageTableRoot) {
        self.memory.invalidated(walker, root)
    }
}
