//! x86-64 page tables in simulated memory: the edits (map, unmap, protect) and the
//! hardware walk.
//!
//! ## Theory
//! A table is a tree of 4 KiB frames from a [`FramePool`] in host memory; the
//! [`PageTableRoot`] the core holds is the physical address of the PML4. Entries are
//! read and written in the [`SimMemory`] with single 64-bit accesses, so the walk the
//! devices do is exactly what the edits left there. Software keeps, like an OS's page
//! structures, one piece of metadata per table page: how many of its entries are
//! present, so an unmap that empties a table can unlink it at once.
//!
//! - **Leaves.** Runs get 4 KiB leaves; with [`X86Config::large_pages`], every 2 MiB
//!   piece of a run that is 2 MiB aligned in both address spaces and lands on an empty
//!   PD slot gets one 2 MiB leaf instead. A large leaf keeps one table frame in reserve
//!   so that a later partial unmap or protect can split it into 512 4 KiB leaves
//!   without allocating — unmap cannot fail.
//! - **Reclamation.** An emptied table is unlinked from its parent and *retired* through
//!   [`TableReclaim`]: it goes back to the pool only once every device walking this root
//!   has invalidated it, because a page-walk cache may still point at it.
//! - **Walk.** Four levels from the deepest table the page-walk cache knows; a walk that
//!   finds a leaf permitting the access sets `A` (and `D` for a store) with one write.
//!   Reads and writes are counted in the returned [`Walk`].
//! - **Sharing.** One [`X86Tables`] serves every x86-format MMU of the machine (CPU,
//!   integrated GPU, IOMMU): in shared mode the core edits a table through its creator
//!   and the other devices walk the same frames, each with its own caches.

use crate::pte::{
    index, is_canonical, is_canonical_range, level_shift, level_size, Decoded, X86Flags, X86Pte,
    ENTRIES, LEVELS, PA_BITS,
};
use gmem_core::{
    FrameSource, MapRun, MmuError, PageSizes, PageTableFormat, PageTableRoot, PhysAddr, Prot,
    VaRange, VirtAddr, PAGE_SIZE,
};
use gmem_sim::{
    lock, BoundsError, FramePool, Leaf, ReclaimStats, SimMemory, TableFormat, TableReclaim, Tlb,
    Walk, WalkerId,
};
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The format id of x86-64 4-level tables (`"x86"` + 64): devices with it share tables.
pub const X86_FORMAT: PageTableFormat = PageTableFormat(0x8664);

/// `MmuError::Hardware` code: the root is not a live table of this format.
pub const HW_UNKNOWN_ROOT: u32 = 0x86_01;
/// `MmuError::Hardware` code: a table entry lies outside the memory (corrupt table).
pub const HW_BAD_ENTRY: u32 = 0x86_02;

/// Options of the format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct X86Config {
    /// Set `US` in leaves (user address spaces).
    pub user: bool,
    /// Use 2 MiB leaves where a run allows (and report 2 MiB pages to the core).
    pub large_pages: bool,
}

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        #[derive(Default)]
        struct Counters { $( $name: AtomicU64, )* }

        /// Counters of the table edits.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct X86Stats {
            $( $(#[$doc])* pub $name: u64, )*
            /// Table frames in use (roots included).
            pub tables_in_use: u64,
            /// Table-page reclamation.
            pub reclaim: ReclaimStats,
        }

        impl Counters {
            fn snapshot(&self, tables_in_use: u64, reclaim: ReclaimStats) -> X86Stats {
                X86Stats {
                    $( $name: self.$name.load(Ordering::Relaxed), )*
                    tables_in_use,
                    reclaim,
                }
            }
        }
    };
}

counters! {
    /// Tables allocated (roots included).
    tables_allocated,
    /// Emptied tables unlinked by unmap.
    tables_unlinked,
    /// 4 KiB leaves written by map.
    leaves_4k,
    /// 2 MiB leaves written by map.
    leaves_2m,
    /// Leaves cleared by unmap (any size).
    leaves_cleared,
    /// Leaves rewritten by protect (any size).
    leaves_protected,
    /// 2 MiB leaves split into 4 KiB leaves.
    splits,
    /// Map calls that failed (nothing of their run stays mapped).
    failed_maps,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

#[derive(Default)]
struct State {
    roots: HashSet<u64>,
    /// Table page → present entries.
    live: HashMap<u64, u16>,
    /// PD entry address of a 2 MiB leaf → its reserved split frame.
    reserve: HashMap<u64, u64>,
}

/// The x86-64 tables of one memory.
pub struct X86Tables {
    memory: Arc<SimMemory>,
    reclaim: TableReclaim,
    config: X86Config,
    state: Mutex<State>,
    counters: Counters,
}

type EditResult<T> = Result<T, MmuError>;

/// What [`X86Tables::edit`] does to the leaves of a range of `root`.
#[derive(Clone, Copy)]
struct Edit {
    root: u64,
    /// `None`: clear them (unmap); `Some`: rewrite their permissions (protect).
    prot: Option<Prot>,
}

fn bad(_: BoundsError) -> MmuError {
    MmuError::Hardware(HW_BAD_ENTRY)
}

impl X86Tables {
    /// Tables in `memory`, their frames from `[pool_base, pool_base + pool_frames * 4 KiB)`
    /// (a range of `memory` the core does not manage).
    pub fn new(
        memory: Arc<SimMemory>,
        pool_base: PhysAddr,
        pool_frames: u64,
        config: X86Config,
    ) -> Result<X86Tables, BoundsError> {
        let pool = Arc::new(FramePool::new(memory.clone(), pool_base, pool_frames)?);
        Ok(X86Tables {
            memory,
            reclaim: TableReclaim::new(pool),
            config,
            state: Mutex::new(State::default()),
            counters: Counters::default(),
        })
    }

    /// The memory the tables live in.
    pub fn memory(&self) -> &Arc<SimMemory> {
        &self.memory
    }

    /// The configuration.
    pub fn config(&self) -> X86Config {
        self.config
    }

    /// The frame pool.
    pub fn pool(&self) -> &Arc<FramePool> {
        self.reclaim.pool()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> X86Stats {
        self.counters
            .snapshot(self.pool().stats().in_use, self.reclaim.stats())
    }

    fn read(&self, pa: PhysAddr) -> EditResult<X86Pte> {
        self.memory.read_u64(pa).map(X86Pte).map_err(bad)
    }

    fn write(&self, pa: PhysAddr, pte: X86Pte) -> EditResult<()> {
        self.memory.write_u64(pa, pte.0).map_err(bad)
    }

    fn entry_pa(table: u64, va: u64, level: u32) -> PhysAddr {
        PhysAddr::new(table + index(va, level) * 8)
    }

    fn alloc_table(&self, st: &mut State) -> EditResult<u64> {
        let f = self
            .pool()
            .alloc_frame()
            .ok_or(MmuError::OutOfTableMemory)?;
        st.live.insert(f.as_u64(), 0);
        add(&self.counters.tables_allocated, 1);
        Ok(f.as_u64())
    }

    fn bump(st: &mut State, table: u64, up: bool) {
        let n = st.live.entry(table).or_insert(0);
        *n = if up { *n + 1 } else { n.saturating_sub(1) };
    }

    /// The table below entry `epa` (at `level` > 0), created if absent; a 2 MiB leaf
    /// there is split first.
    fn child(&self, st: &mut State, table: u64, epa: PhysAddr, level: u32) -> EditResult<u64> {
        let e = self.read(epa)?;
        match e.decode(level) {
            Decoded::Table(t) => Ok(t.as_u64()),
            Decoded::NotPresent => {
                let t = self.alloc_table(st)?;
                self.write(epa, X86Pte::table(PhysAddr::new(t)))?;
                Self::bump(st, table, true);
                Ok(t)
            }
            Decoded::Leaf { .. } => self.split(st, epa, e),
        }
    }

    /// Replace the 2 MiB leaf `e` at `epa` by a table of 512 equivalent 4 KiB leaves,
    /// using the leaf's reserved frame.
    fn split(&self, st: &mut State, epa: PhysAddr, e: X86Pte) -> EditResult<u64> {
        let t = match st.reserve.remove(&epa.as_u64()) {
            Some(t) => {
                st.live.insert(t, 0);
                t
            }
            None => self.alloc_table(st)?,
        };
        let flags = e.flags() - X86Flags::PS;
        let base = e.addr().as_u64() & !(level_size(1) - 1);
        for i in 0..ENTRIES {
            let leaf = X86Pte((base + i * PAGE_SIZE) | flags.bits());
            self.write(PhysAddr::new(t + i * 8), leaf)?;
        }
        st.live.insert(t, ENTRIES as u16);
        self.write(epa, X86Pte::table(PhysAddr::new(t)))?;
        add(&self.counters.splits, 1);
        Ok(t)
    }

    fn map_4k(&self, st: &mut State, root: u64, va: u64, pa: u64, prot: Prot) -> EditResult<()> {
        let mut table = root;
        for level in (1..LEVELS).rev() {
            table = self.child(st, table, Self::entry_pa(table, va, level), level)?;
        }
        let epa = Self::entry_pa(table, va, 0);
        let leaf = X86Pte::leaf(PhysAddr::new(pa), prot, self.config.user, false).ok_or(
            MmuError::Unsupported {
                va: VirtAddr::new(va),
            },
        )?;
        if !self.read(epa)?.is_present() {
            Self::bump(st, table, true);
        }
        self.write(epa, leaf)?;
        add(&self.counters.leaves_4k, 1);
        Ok(())
    }

    /// A 2 MiB leaf at `va` if its PD slot is empty (or already a large leaf) and a
    /// reserve frame can be had; `Ok(false)`: map it with 4 KiB leaves instead.
    fn map_2m(&self, st: &mut State, root: u64, va: u64, pa: u64, prot: Prot) -> EditResult<bool> {
        let mut table = root;
        for level in (2..LEVELS).rev() {
            table = self.child(st, table, Self::entry_pa(table, va, level), level)?;
        }
        let epa = Self::entry_pa(table, va, 1);
        let old = self.read(epa)?;
        if matches!(old.decode(1), Decoded::Table(_)) {
            return Ok(false);
        }
        let leaf = X86Pte::leaf(PhysAddr::new(pa), prot, self.config.user, true).ok_or(
            MmuError::Unsupported {
                va: VirtAddr::new(va),
            },
        )?;
        if !old.is_present() {
            let Some(r) = self.pool().alloc_frame() else {
                return Ok(false);
            };
            st.reserve.insert(epa.as_u64(), r.as_u64());
            Self::bump(st, table, true);
        }
        self.write(epa, leaf)?;
        add(&self.counters.leaves_2m, 1);
        Ok(true)
    }

    fn map_run(&self, st: &mut State, root: u64, run: &MapRun) -> EditResult<u64> {
        let big = level_size(1);
        let mut done = 0;
        while done < run.len {
            let va = run.va.as_u64() + done;
            let pa = run.pa.as_u64() + done;
            if self.config.large_pages
                && va % big == 0
                && pa % big == 0
                && run.len - done >= big
                && self.map_2m(st, root, va, pa, run.prot)?
            {
                done += big;
                continue;
            }
            self.map_4k(st, root, va, pa, run.prot)?;
            done += PAGE_SIZE;
        }
        Ok(done)
    }

    /// Clear or rewrite the leaves of `span` under `table` (at `level`) as `op` says.
    /// Returns whether `table` is now empty.
    fn edit(
        &self,
        st: &mut State,
        op: Edit,
        table: u64,
        level: u32,
        span: Range<u64>,
    ) -> EditResult<bool> {
        let size = level_size(level);
        let mut va = span.start;
        while va < span.end {
            let next = ((va & !(size - 1)) + size).min(span.end);
            let epa = Self::entry_pa(table, va, level);
            let e = self.read(epa)?;
            let whole = va % size == 0 && next - va == size;
            let child = match e.decode(level) {
                Decoded::NotPresent => None,
                Decoded::Leaf { .. } if whole || level == 0 => {
                    match op.prot {
                        None => {
                            self.write(epa, X86Pte::EMPTY)?;
                            Self::bump(st, table, false);
                            if let Some(r) = st.reserve.remove(&epa.as_u64()) {
                                self.pool().free_frame(PhysAddr::new(r));
                            }
                            add(&self.counters.leaves_cleared, 1);
                        }
                        Some(p) => {
                            self.write(epa, e.with_prot(p))?;
                            add(&self.counters.leaves_protected, 1);
                        }
                    }
                    None
                }
                Decoded::Leaf { .. } => Some(self.split(st, epa, e)?),
                Decoded::Table(t) => Some(t.as_u64()),
            };
            if let Some(child) = child {
                let empty = self.edit(st, op, child, level - 1, va..next)?;
                if empty && op.prot.is_none() {
                    self.write(epa, X86Pte::EMPTY)?;
                    Self::bump(st, table, false);
                    st.live.remove(&child);
                    add(&self.counters.tables_unlinked, 1);
                    self.reclaim
                        .retire(PageTableRoot(op.root), PhysAddr::new(child));
                }
            }
            va = next;
        }
        Ok(st.live.get(&table).copied().unwrap_or(0) == 0)
    }

    /// Every table frame under `table` (at `level`), for destroy.
    fn collect(&self, table: u64, level: u32, out: &mut Vec<u64>, reserves: &mut Vec<u64>) {
        out.push(table);
        for i in 0..ENTRIES {
            let epa = PhysAddr::new(table + i * 8);
            let Ok(e) = self.read(epa) else { continue };
            match e.decode(level) {
                Decoded::Table(t) if level > 0 => {
                    self.collect(t.as_u64(), level - 1, out, reserves)
                }
                Decoded::Leaf { .. } if level > 0 => reserves.push(epa.as_u64()),
                _ => {}
            }
        }
    }

    fn check_range(&self, va: VirtAddr, len: u64) -> EditResult<()> {
        if !is_canonical_range(va, len) {
            return Err(MmuError::Unsupported { va });
        }
        Ok(())
    }

    /// Software lookup of `va` in `root` (no accessed/dirty side effects, nothing
    /// counted): the leaf and the level it was found at.
    pub fn lookup(&self, root: PageTableRoot, va: VirtAddr) -> Option<Leaf> {
        self.walk_inner(root, va, None, None).leaf
    }

    /// Every leaf of `root` as `(first virtual address, leaf)`, in address order (for
    /// comparing with a model).
    pub fn leaves(&self, root: PageTableRoot) -> Vec<(VirtAddr, Leaf)> {
        let mut out = Vec::new();
        self.leaves_under(root.0, LEVELS - 1, 0, &mut out);
        out
    }

    fn leaves_under(&self, table: u64, level: u32, base: u64, out: &mut Vec<(VirtAddr, Leaf)>) {
        for i in 0..ENTRIES {
            let Ok(e) = self.read(PhysAddr::new(table + i * 8)) else {
                continue;
            };
            let mut va = base + i * level_size(level);
            if level == LEVELS - 1 && va >> 47 != 0 {
                va |= 0xffff_0000_0000_0000; // sign extension of the upper half
            }
            match e.decode(level) {
                Decoded::NotPresent => {}
                Decoded::Table(t) => self.leaves_under(t.as_u64(), level - 1, va, out),
                Decoded::Leaf {
                    frame,
                    shift,
                    prot,
                    flags,
                } => out.push((
                    VirtAddr::new(va),
                    Leaf {
                        frame,
                        shift,
                        prot,
                        dirty: flags.contains(X86Flags::D),
                        local: false,
                    },
                )),
            }
        }
    }

    /// The walk; `access = None` is a software lookup that changes nothing.
    fn walk_inner(
        &self,
        root: PageTableRoot,
        va: VirtAddr,
        access: Option<Prot>,
        mut cache: Option<&mut Tlb<u64>>,
    ) -> Walk {
        let mut w = Walk::default();
        let v = va.as_u64();
        if !is_canonical(v) {
            return w;
        }
        let mut table = root.0;
        let mut level = LEVELS - 1;
        if let Some(c) = cache.as_deref_mut() {
            // The deepest cached table: PT (covers 2 MiB), PD (1 GiB), PDPT (512 GiB).
            let shifts = [level_shift(1), level_shift(2), level_shift(3)];
            if let Some((s, t)) = c.lookup_deepest(root.0, v, &shifts) {
                table = t;
                level = (s as u32 - 12) / 9 - 1;
                w.skipped = LEVELS - 1 - level;
            }
        }
        loop {
            let epa = Self::entry_pa(table, v, level);
            let Ok(e) = self.read(epa) else { return w };
            w.reads += 1;
            match e.decode(level) {
                Decoded::NotPresent => return w,
                Decoded::Table(t) => {
                    table = t.as_u64();
                    if let Some(c) = cache.as_deref_mut() {
                        c.insert(root.0, v, level_shift(level), table);
                    }
                    level -= 1;
                }
                Decoded::Leaf {
                    frame,
                    shift,
                    prot,
                    flags,
                } => {
                    let mut dirty = flags.contains(X86Flags::D);
                    if let Some(a) = access.filter(|a| prot.contains(*a)) {
                        let mut f = X86Flags::A;
                        if a.contains(Prot::WRITE) {
                            f |= X86Flags::D;
                            dirty = true;
                        }
                        if !flags.contains(f) && self.write(epa, X86Pte(e.0 | f.bits())).is_ok() {
                            w.writes += 1;
                        }
                    }
                    w.leaf = Some(Leaf {
                        frame,
                        shift,
                        prot,
                        dirty,
                        local: false,
                    });
                    return w;
                }
            }
        }
    }
}

impl TableFormat for X86Tables {
    fn format(&self) -> PageTableFormat {
        X86_FORMAT
    }

    fn page_sizes(&self) -> PageSizes {
        if self.config.large_pages {
            PageSizes::S4K | PageSizes::S2M
        } else {
            PageSizes::S4K
        }
    }

    fn create(&self) -> Result<PageTableRoot, MmuError> {
        let mut st = lock(&self.state);
        let t = self.alloc_table(&mut st)?;
        st.roots.insert(t);
        Ok(PageTableRoot(t))
    }

    fn destroy(&self, root: PageTableRoot) {
        let mut st = lock(&self.state);
        if !st.roots.remove(&root.0) {
            return;
        }
        let (mut tables, mut reserves) = (Vec::new(), Vec::new());
        self.collect(root.0, LEVELS - 1, &mut tables, &mut reserves);
        for t in tables {
            st.live.remove(&t);
            self.pool().free_frame(PhysAddr::new(t));
        }
        for r in reserves {
            if let Some(f) = st.reserve.remove(&r) {
                self.pool().free_frame(PhysAddr::new(f));
            }
        }
        drop(st);
        self.reclaim.destroyed(root);
    }

    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        let mut st = lock(&self.state);
        if !st.roots.contains(&root.0) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        self.check_range(run.va, run.len)?;
        let pa_end = run.pa.as_u64().checked_add(run.len);
        if !run.pa.is_page_aligned() || !matches!(pa_end, Some(e) if e <= 1 << PA_BITS) {
            return Err(MmuError::Unsupported { va: run.va });
        }
        let r = self.map_run(&mut st, root.0, run);
        if r.is_err() {
            // Take back whatever part of the run was mapped.
            let end = run.va.as_u64() + run.len;
            let op = Edit {
                root: root.0,
                prot: None,
            };
            let _ = self.edit(&mut st, op, root.0, LEVELS - 1, run.va.as_u64()..end);
            add(&self.counters.failed_maps, 1);
        }
        r.map(|_| ())
    }

    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        let mut st = lock(&self.state);
        if !st.roots.contains(&root.0) || !is_canonical_range(range.start, range.len) {
            return;
        }
        let start = range.start.as_u64();
        let op = Edit {
            root: root.0,
            prot: None,
        };
        let _ = self.edit(&mut st, op, root.0, LEVELS - 1, start..start + range.len);
    }

    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        let mut st = lock(&self.state);
        if !st.roots.contains(&root.0) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        self.check_range(range.start, range.len)?;
        let start = range.start.as_u64();
        let op = Edit {
            root: root.0,
            prot: Some(prot),
        };
        self.edit(&mut st, op, root.0, LEVELS - 1, start..start + range.len)
            .map(|_| ())
    }

    fn walk(
        &self,
        root: PageTableRoot,
        va: VirtAddr,
        access: Prot,
        cache: Option<&mut Tlb<u64>>,
    ) -> Walk {
        self.walk_inner(root, va, Some(access), cache)
    }

    fn new_walker(&self) -> WalkerId {
        self.reclaim.new_walker()
    }

    fn walker_activated(&self, walker: WalkerId, root: Option<PageTableRoot>) {
        self.reclaim.activated(walker, root)
    }

    fn walker_invalidated(&self, walker: WalkerId, root: PageTableRoot) {
        self.reclaim.invalidated(walker, root)
    }
}
