//! Radix page tables in simulated memory, generic over the entry encoding.
//!
//! ## Theory
//! Most MMU formats are the same tree: 4 KiB table pages of 512 eight-byte entries,
//! nine address bits per level, 4 KiB leaves at level 0 and optionally larger leaves one
//! level up. They differ in the entry encoding (which bit is present, where write
//! permission and the frame live, whether there is an aperture bit) and the address
//! width. [`RadixTables`] is that tree — the map, unmap, protect and walk every driver
//! would otherwise write again — and a [`PteCodec`] is one format's encoding: a driver
//! for such an MMU is its codec (Asterinas's `PageTableConfig` idea: one driver = one
//! config).
//!
//! - **Memory.** Tables are frames of a [`FramePool`] in a [`SimMemory`]; the
//!   [`PageTableRoot`] the core holds is the physical address of the top table. Entries
//!   are read and written with single 64-bit accesses, so the walk the devices do sees
//!   exactly what the edits left. Software keeps one piece of metadata per table page
//!   (how many entries are present), as an OS keeps page structures.
//! - **Leaves.** Runs get 4 KiB leaves; where the codec allows large leaves at level
//!   `L`, every piece of a run aligned to `level_size(L)` in both address spaces that
//!   lands on an empty slot gets one large leaf. A large leaf keeps a table frame in
//!   reserve so that a partial unmap or protect can split it without allocating — unmap
//!   cannot fail.
//! - **Reclamation.** An unmap that empties a table unlinks it and *retires* it through
//!   [`TableReclaim`]: it returns to the pool once every device walking this root has
//!   invalidated it (a page-walk cache may still point at it).
//! - **Walk.** From the deepest table the page-walk cache knows down to a leaf; a leaf
//!   that permits the access is written back with the codec's accessed/dirty bits if
//!   they change. Entries read and written are counted in the returned [`Walk`].
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
    DeviceId, FrameSource, MapRun, MmuError, PageSize, PageSizes, PageTableFormat, PageTableRoot,
    PhysAddr, Prot, VaRange, VirtAddr, PAGE_SIZE,
};
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Entries per table page.
pub const ENTRIES: u64 = 512;

/// `MmuError::Hardware` code: the root is not a live table of these tables.
pub const HW_UNKNOWN_ROOT: u32 = 0x7a_01;
/// `MmuError::Hardware` code: a table entry points outside the memory (corrupt table).
pub const HW_BAD_ENTRY: u32 = 0x7a_02;

/// Bytes one entry of `level` maps (4 KiB at level 0).
pub const fn level_size(level: u32) -> u64 {
    1 << (12 + 9 * level)
}

/// `log2(level_size(level))`.
pub const fn level_shift(level: u32) -> u8 {
    (12 + 9 * level) as u8
}

/// Index of `va`'s entry in its table of `level`.
pub const fn index(va: u64, level: u32) -> u64 {
    (va >> (12 + 9 * level)) & (ENTRIES - 1)
}

/// What an entry means at its level, as a codec decodes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Not valid.
    NotPresent,
    /// A pointer to the next-level table.
    Table(PhysAddr),
    /// A leaf (its `shift` says its size).
    Leaf(Leaf),
}

/// One format's entry encoding. Implementations are plain bit manipulation.
pub trait PteCodec: Send + Sync + 'static {
    /// The core's format id (equal ids share tables).
    fn format(&self) -> PageTableFormat;
    /// Levels of the tree: the root is level `levels() - 1`.
    fn levels(&self) -> u32;
    /// Whether every address of `[va, va + len)` (`len > 0`) can be translated.
    fn va_ok(&self, va: u64, len: u64) -> bool;
    /// The address of the first byte an entry at the top level covers, from the
    /// zero-extended index arithmetic (sign-extends for formats that need it).
    fn extend(&self, va: u64) -> u64 {
        va
    }
    /// The level whose entries may be large leaves (`None`: 4 KiB leaves only).
    fn large_level(&self) -> Option<u32>;
    /// An entry pointing to the table at `table`.
    fn table(&self, table: PhysAddr) -> u64;
    /// A leaf at `level` mapping `frame` with `prot`; `memory` is the device whose
    /// memory holds the frame (for an aperture bit). `None`: not encodable.
    fn leaf(&self, frame: PhysAddr, prot: Prot, level: u32, memory: DeviceId) -> Option<u64>;
    /// Decode `raw` found at `level`.
    fn decode(&self, raw: u64, level: u32) -> Entry;
    /// `raw` (a leaf) with its permissions replaced by `prot`.
    fn with_prot(&self, raw: u64, prot: Prot) -> u64;
    /// The level-`level - 1` leaf equal to part `i` of the large leaf `raw` at `level`.
    fn split(&self, raw: u64, level: u32, i: u64) -> u64;
    /// `raw` (a leaf permitting `access`) after the hardware used it: accessed and dirty
    /// bits. The default: formats without them.
    fn used(&self, raw: u64, access: Prot) -> u64 {
        let _ = access;
        raw
    }
}

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        #[derive(Default)]
        struct Counters { $( $name: AtomicU64, )* }

        /// Counters of the table edits.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct TableStats {
            $( $(#[$doc])* pub $name: u64, )*
            /// Table frames in use (roots included, retired ones included).
            pub tables_in_use: u64,
            /// Table-page reclamation.
            pub reclaim: ReclaimStats,
        }

        impl Counters {
            fn snapshot(&self, tables_in_use: u64, reclaim: ReclaimStats) -> TableStats {
                TableStats {
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
    leaves_small,
    /// Large leaves written by map.
    leaves_large,
    /// Leaves cleared by unmap (any size).
    leaves_cleared,
    /// Leaves rewritten by protect (any size).
    leaves_protected,
    /// Large leaves split.
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
    /// Entry address of a large leaf → its reserved split frame.
    reserve: HashMap<u64, u64>,
}

/// What [`RadixTables::edit`] does to the leaves of a range of `root`.
#[derive(Clone, Copy)]
struct Edit {
    root: u64,
    /// `None`: clear them (unmap); `Some`: rewrite their permissions (protect).
    prot: Option<Prot>,
}

type EditResult<T> = Result<T, MmuError>;

fn bad(_: BoundsError) -> MmuError {
    MmuError::Hardware(HW_BAD_ENTRY)
}

/// The tables of one format in one memory.
pub struct RadixTables<C: PteCodec> {
    codec: C,
    memory: Arc<SimMemory>,
    reclaim: TableReclaim,
    state: Mutex<State>,
    counters: Counters,
}

impl<C: PteCodec> RadixTables<C> {
    /// Tables encoded by `codec` in `memory`, their frames from
    /// `[pool_base, pool_base + pool_frames * 4 KiB)` (a range the core does not manage).
    pub fn new(
        codec: C,
        memory: Arc<SimMemory>,
        pool_base: PhysAddr,
        pool_frames: u64,
    ) -> Result<RadixTables<C>, BoundsError> {
        let pool = Arc::new(FramePool::new(memory.clone(), pool_base, pool_frames)?);
        Ok(RadixTables {
            codec,
            memory,
            reclaim: TableReclaim::new(pool),
            state: Mutex::new(State::default()),
            counters: Counters::default(),
        })
    }

    /// The codec.
    pub fn codec(&self) -> &C {
        &self.codec
    }

    /// The memory the tables live in.
    pub fn memory(&self) -> &Arc<SimMemory> {
        &self.memory
    }

    /// The frame pool.
    pub fn pool(&self) -> &Arc<FramePool> {
        self.reclaim.pool()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> TableStats {
        self.counters
            .snapshot(self.pool().stats().in_use, self.reclaim.stats())
    }

    fn top(&self) -> u32 {
        self.codec.levels() - 1
    }

    fn read(&self, pa: PhysAddr) -> EditResult<u64> {
        self.memory.read_u64(pa).map_err(bad)
    }

    fn write(&self, pa: PhysAddr, raw: u64) -> EditResult<()> {
        self.memory.write_u64(pa, raw).map_err(bad)
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

    /// The table below entry `epa` (at `level` > 0), created if absent; a large leaf
    /// there is split first.
    fn child(&self, st: &mut State, table: u64, epa: PhysAddr, level: u32) -> EditResult<u64> {
        let raw = self.read(epa)?;
        match self.codec.decode(raw, level) {
            Entry::Table(t) => Ok(t.as_u64()),
            Entry::NotPresent => {
                let t = self.alloc_table(st)?;
                self.write(epa, self.codec.table(PhysAddr::new(t)))?;
                Self::bump(st, table, true);
                Ok(t)
            }
            Entry::Leaf(_) => self.split(st, epa, raw, level),
        }
    }

    /// Replace the large leaf `raw` at `epa` (at `level`) by a table of equivalent
    /// smaller leaves, using the leaf's reserved frame.
    fn split(&self, st: &mut State, epa: PhysAddr, raw: u64, level: u32) -> EditResult<u64> {
        let t = match st.reserve.remove(&epa.as_u64()) {
            Some(t) => t,
            None => self.alloc_table(st)?,
        };
        for i in 0..ENTRIES {
            self.write(PhysAddr::new(t + i * 8), self.codec.split(raw, level, i))?;
        }
        st.live.insert(t, ENTRIES as u16);
        self.write(epa, self.codec.table(PhysAddr::new(t)))?;
        add(&self.counters.splits, 1);
        Ok(t)
    }

    /// One leaf at `level` for `va → pa`. `Ok(false)`: a large leaf does not fit here
    /// (a table already holds the slot, or no reserve frame): use smaller leaves.
    fn map_leaf(
        &self,
        st: &mut State,
        root: u64,
        va: u64,
        pa: u64,
        level: u32,
        run: &MapRun,
    ) -> EditResult<bool> {
        let mut table = root;
        for l in (level + 1..=self.top()).rev() {
            table = self.child(st, table, Self::entry_pa(table, va, l), l)?;
        }
        let epa = Self::entry_pa(table, va, level);
        let old = self.read(epa)?;
        let old = self.codec.decode(old, level);
        if level > 0 && matches!(old, Entry::Table(_)) {
            return Ok(false);
        }
        let unsupported = MmuError::Unsupported {
            va: VirtAddr::new(va),
        };
        let leaf = self
            .codec
            .leaf(PhysAddr::new(pa), run.prot, level, run.memory)
            .ok_or(unsupported)?;
        if old == Entry::NotPresent {
            if level > 0 {
                let Some(r) = self.pool().alloc_frame() else {
                    return Ok(false);
                };
                st.reserve.insert(epa.as_u64(), r.as_u64());
            }
            Self::bump(st, table, true);
        }
        self.write(epa, leaf)?;
        add(
            if level > 0 {
                &self.counters.leaves_large
            } else {
                &self.counters.leaves_small
            },
            1,
        );
        Ok(true)
    }

    fn map_run(&self, st: &mut State, root: u64, run: &MapRun) -> EditResult<()> {
        let large = self.codec.large_level();
        let mut done = 0;
        while done < run.len {
            let va = run.va.as_u64() + done;
            let pa = run.pa.as_u64() + done;
            if let Some(l) = large {
                let big = level_size(l);
                if va % big == 0
                    && pa % big == 0
                    && run.len - done >= big
                    && self.map_leaf(st, root, va, pa, l, run)?
                {
                    done += big;
                    continue;
                }
            }
            self.map_leaf(st, root, va, pa, 0, run)?;
            done += PAGE_SIZE;
        }
        Ok(())
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
            let raw = self.read(epa)?;
            let whole = va % size == 0 && next - va == size;
            let child = match self.codec.decode(raw, level) {
                Entry::NotPresent => None,
                Entry::Leaf(_) if whole || level == 0 => {
                    match op.prot {
                        None => {
                            self.write(epa, 0)?;
                            Self::bump(st, table, false);
                            if let Some(r) = st.reserve.remove(&epa.as_u64()) {
                                self.pool().free_frame(PhysAddr::new(r));
                            }
                            add(&self.counters.leaves_cleared, 1);
                        }
                        Some(p) => {
                            self.write(epa, self.codec.with_prot(raw, p))?;
                            add(&self.counters.leaves_protected, 1);
                        }
                    }
                    None
                }
                Entry::Leaf(_) => Some(self.split(st, epa, raw, level)?),
                Entry::Table(t) => Some(t.as_u64()),
            };
            if let Some(child) = child {
                let empty = self.edit(st, op, child, level - 1, va..next)?;
                if empty && op.prot.is_none() {
                    self.write(epa, 0)?;
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

    /// Every table frame under `table` (at `level`), and the entry addresses of its
    /// large leaves, for destroy.
    fn collect(&self, table: u64, level: u32, out: &mut Vec<u64>, larges: &mut Vec<u64>) {
        out.push(table);
        for i in 0..ENTRIES {
            let epa = PhysAddr::new(table + i * 8);
            let Ok(raw) = self.read(epa) else { continue };
            match self.codec.decode(raw, level) {
                Entry::Table(t) if level > 0 => self.collect(t.as_u64(), level - 1, out, larges),
                Entry::Leaf(_) if level > 0 => larges.push(epa.as_u64()),
                _ => {}
            }
        }
    }

    /// Software lookup of `va` in `root`: no accessed/dirty side effects, nothing
    /// counted.
    pub fn lookup(&self, root: PageTableRoot, va: VirtAddr) -> Option<Leaf> {
        self.walk_inner(root, va, None, None).leaf
    }

    /// Every leaf of `root` as `(first virtual address, leaf)`, in index order (for
    /// comparing with a model).
    pub fn leaves(&self, root: PageTableRoot) -> Vec<(VirtAddr, Leaf)> {
        let mut out = Vec::new();
        if lock(&self.state).roots.contains(&root.0) {
            self.leaves_under(root.0, self.top(), 0, &mut out);
        }
        out
    }

    fn leaves_under(&self, table: u64, level: u32, base: u64, out: &mut Vec<(VirtAddr, Leaf)>) {
        for i in 0..ENTRIES {
            let Ok(raw) = self.read(PhysAddr::new(table + i * 8)) else {
                continue;
            };
            let mut va = base + i * level_size(level);
            if level == self.top() {
                va = self.codec.extend(va);
            }
            match self.codec.decode(raw, level) {
                Entry::NotPresent => {}
                Entry::Table(t) if level > 0 => self.leaves_under(t.as_u64(), level - 1, va, out),
                Entry::Table(_) => {}
                Entry::Leaf(leaf) => out.push((VirtAddr::new(va), leaf)),
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
        if !self.codec.va_ok(v, 1) {
            return w;
        }
        let top = self.top();
        let mut table = root.0;
        let mut level = top;
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
                w.skipped = top - level;
            }
        }
        loop {
            let epa = Self::entry_pa(table, v, level);
            let Ok(raw) = self.read(epa) else { return w };
            w.reads += 1;
            match self.codec.decode(raw, level) {
                Entry::NotPresent => return w,
                Entry::Table(_) if level == 0 => return w,
                Entry::Table(t) => {
                    table = t.as_u64();
                    if let Some(c) = cache.as_deref_mut() {
                        c.insert(root.0, v, level_shift(level), table);
                    }
                    level -= 1;
                }
                Entry::Leaf(mut leaf) => {
                    if let Some(a) = access.filter(|a| leaf.prot.contains(*a)) {
                        let new = self.codec.used(raw, a);
                        if new != raw && self.write(epa, new).is_ok() {
                            w.writes += 1;
                            if let Entry::Leaf(l) = self.codec.decode(new, level) {
                                leaf = l;
                            }
                        }
                    }
                    w.leaf = Some(leaf);
                    return w;
                }
            }
        }
    }
}

impl<C: PteCodec> TableFormat for RadixTables<C> {
    fn format(&self) -> PageTableFormat {
        self.codec.format()
    }

    fn page_sizes(&self) -> PageSizes {
        let large = self
            .codec
            .large_level()
            .and_then(|l| PageSize::from_bytes(level_size(l)));
        match large {
            Some(s) => PageSizes::S4K | PageSizes::of(s),
            None => PageSizes::S4K,
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
        let (mut tables, mut larges) = (Vec::new(), Vec::new());
        self.collect(root.0, self.top(), &mut tables, &mut larges);
        for t in tables {
            st.live.remove(&t);
            self.pool().free_frame(PhysAddr::new(t));
        }
        for e in larges {
            if let Some(f) = st.reserve.remove(&e) {
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
        if run.len == 0 || !self.codec.va_ok(run.va.as_u64(), run.len) {
            return Err(MmuError::Unsupported { va: run.va });
        }
        let r = self.map_run(&mut st, root.0, run);
        if r.is_err() {
            // Take back whatever part of the run was mapped.
            let op = Edit {
                root: root.0,
                prot: None,
            };
            let span = run.va.as_u64()..run.va.as_u64() + run.len;
            let _ = self.edit(&mut st, op, root.0, self.top(), span);
            add(&self.counters.failed_maps, 1);
        }
        r
    }

    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        let mut st = lock(&self.state);
        let start = range.start.as_u64();
        if !st.roots.contains(&root.0) || !self.codec.va_ok(start, range.len) {
            return;
        }
        let op = Edit {
            root: root.0,
            prot: None,
        };
        let _ = self.edit(&mut st, op, root.0, self.top(), start..start + range.len);
    }

    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        let mut st = lock(&self.state);
        if !st.roots.contains(&root.0) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        let start = range.start.as_u64();
        if !self.codec.va_ok(start, range.len) {
            return Err(MmuError::Unsupported { va: range.start });
        }
        let op = Edit {
            root: root.0,
            prot: Some(prot),
        };
        self.edit(&mut st, op, root.0, self.top(), start..start + range.len)
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
