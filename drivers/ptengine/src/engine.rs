//! The engine: one radix tree of one codec in one table memory, edited under one
//! discipline (see the crate docs for the theory).

use crate::codec::{index, level_size, Codec, Entry, Leaf, Run, ENTRIES};
use crate::memory::{AtomicTableMemory, TableMemory};
use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt;
use gmem_core::{MmuError, PhysAddr, Prot, VirtAddr};
use spin::Mutex;

/// How edits synchronise with each other (the crate docs' section 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Discipline {
    /// The caller serialises every edit of a tree; emptied tables are unlinked and
    /// retired inside the edit that emptied them.
    Plain,
    /// Lock-free: missing tables are installed with a compare-exchange, leaves with
    /// swaps; nothing counts entries and no table page is reclaimed until destroy.
    Cas,
    /// Edits run in parallel as *readers* (CAS installs, atomic entry counts); an unmap
    /// reports the leaf tables it emptied, and the caller, as the *writer*, unlinks
    /// them with [`Engine::collapse`], which re-checks each count first.
    Rw,
}

/// Why an edit failed. The tree is left as the error says (see each method).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EditError {
    /// No table page was left.
    OutOfTableMemory,
    /// The format cannot express the request at `va` (address range, frame, permissions).
    Unsupported {
        /// The first address concerned.
        va: u64,
    },
    /// An entry address (or a table an entry points to) is outside the table memory:
    /// a corrupt tree.
    BadEntry {
        /// The physical address of the entry.
        pa: u64,
    },
    /// A map met an entry with a reserved encoding on its way.
    Reserved {
        /// The first address concerned.
        va: u64,
    },
}

impl EditError {
    /// The core's error for this one: `Unsupported` and `OutOfTableMemory` as they are,
    /// [`EditError::BadEntry`] as `Hardware(bad_entry)` and [`EditError::Reserved`] as
    /// `Hardware(reserved)` (each driver's own codes).
    pub fn to_mmu(self, bad_entry: u32, reserved: u32) -> MmuError {
        match self {
            EditError::OutOfTableMemory => MmuError::OutOfTableMemory,
            EditError::Unsupported { va } => MmuError::Unsupported {
                va: VirtAddr::new(va),
            },
            EditError::BadEntry { .. } => MmuError::Hardware(bad_entry),
            EditError::Reserved { .. } => MmuError::Hardware(reserved),
        }
    }
}

impl fmt::Display for EditError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EditError::OutOfTableMemory => write!(f, "no table page left"),
            EditError::Unsupported { va } => write!(f, "not expressible at {va:#x}"),
            EditError::BadEntry { pa } => write!(f, "entry {pa:#x} outside the table memory"),
            EditError::Reserved { va } => write!(f, "reserved entry on the path of {va:#x}"),
        }
    }
}

/// Why an engine could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The concurrent disciplines need a codec without large leaves and without
    /// derived bits (a split and a recomputation read and write many entries at once,
    /// which only a serialised edit can do).
    NeedsPlainCodec,
    /// The codec has no level, more than six, or large leaves at level 0 or above the
    /// top.
    BadGeometry,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NeedsPlainCodec => {
                write!(f, "large leaves and derived bits need the plain discipline")
            }
            ConfigError::BadGeometry => write!(f, "unsupported tree geometry"),
        }
    }
}

crate::counters! {
    /// Counters of the engine's edits.
    pub struct EditStats in Counters {
        /// Table pages allocated (roots and splits included, reserves not).
        tables_allocated,
        /// Tables linked below a parent entry (roots not included).
        tables_installed,
        /// Installs that lost a compare-exchange race (their page went back).
        cas_lost,
        /// Emptied tables unlinked and retired.
        tables_unlinked,
        /// Writer passes of [`Engine::collapse`].
        writer_reclaims,
        /// Writer passes that found the table refilled and unlinked nothing.
        reclaims_abandoned,
        /// 4 KiB leaves written by map.
        leaves_small,
        /// Large leaves written by map.
        leaves_large,
        /// Leaves (and reserved entries) cleared by unmap, any size.
        leaves_cleared,
        /// Leaves rewritten by protect, any size.
        leaves_protected,
        /// Large leaves split into a table of smaller ones.
        splits,
        /// Map calls that failed (their run was taken back).
        failed_maps,
        /// Table entries whose derived bits an edit changed.
        derived_updates,
    }
}

/// What an unmap or protect did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Edited {
    /// 4 KiB pages cleared or rewritten.
    pub pages: u64,
    /// Under [`Discipline::Rw`]: one address inside each leaf table the unmap emptied,
    /// for the caller's [`Engine::collapse`] as the writer. Empty otherwise.
    pub emptied: Vec<u64>,
}

/// What one hardware walk found and what it cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Walked {
    /// The leaf, or `None` when some level was not present.
    pub leaf: Option<Leaf>,
    /// Entries read from memory.
    pub reads: u32,
    /// Entries written back (accessed/dirty bits).
    pub writes: u32,
}

#[derive(Clone, Copy)]
enum Op<'a> {
    /// The run, and the large-leaf levels allowed (a subset of the codec's).
    Map(&'a Run, u32),
    Unmap,
    Protect(Prot),
}

/// What one level of an edit did to its table.
#[derive(Clone, Copy, Default)]
struct Step {
    /// Some entry of the table (or below it) changed.
    changed: bool,
    /// The table is now empty (plain: counted or scanned; rw: a count reached zero).
    empty: bool,
}

type Result<T> = core::result::Result<T, EditError>;

/// A radix tree format `C` in table memory `M`.
pub struct Engine<C, M> {
    codec: C,
    memory: M,
    discipline: Discipline,
    split_reserve: bool,
    /// Entry address of a large leaf → the table page kept to split it.
    reserves: Mutex<BTreeMap<u64, u64>>,
    counters: Counters,
}

impl<C: Codec, M: TableMemory> Engine<C, M> {
    /// An engine editing under [`Discipline::Plain`].
    ///
    /// # Errors
    /// [`ConfigError::BadGeometry`] for a codec with no level or more than six, or
    /// large leaves at level 0 or beyond the top.
    pub fn new(codec: C, memory: M) -> core::result::Result<Self, ConfigError> {
        let levels = codec.levels();
        let beyond = u32::MAX.checked_shl(levels).unwrap_or(0);
        if levels == 0 || levels > 6 || codec.large_levels() & (1 | beyond) != 0 {
            return Err(ConfigError::BadGeometry);
        }
        Ok(Engine {
            codec,
            memory,
            discipline: Discipline::Plain,
            split_reserve: false,
            reserves: Mutex::new(BTreeMap::new()),
            counters: Counters::default(),
        })
    }

    /// Keep one table page in reserve for every large leaf, so that a partial unmap
    /// or protect splits it without allocating (an unmap then cannot fail); a large
    /// leaf that cannot get its reserve is mapped as smaller leaves.
    pub fn with_split_reserve(mut self) -> Self {
        self.split_reserve = true;
        self
    }

    /// Turn split reserves on for the large leaves mapped from now on (leaves mapped
    /// before keep none: e.g. global mappings a driver never edits).
    pub fn enable_split_reserve(&mut self) {
        self.split_reserve = true;
    }

    /// The codec.
    pub fn codec(&self) -> &C {
        &self.codec
    }

    /// The table memory.
    pub fn memory(&self) -> &M {
        &self.memory
    }

    /// The discipline.
    pub fn discipline(&self) -> Discipline {
        self.discipline
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> EditStats {
        self.counters.snapshot()
    }

    /// The top level (the root's).
    pub fn top(&self) -> u32 {
        self.codec.levels() - 1
    }

    fn read(&self, pa: u64) -> Result<u64> {
        self.memory.read(pa).ok_or(EditError::BadEntry { pa })
    }

    fn write(&self, pa: u64, raw: u64) -> Result<()> {
        self.memory.write(pa, raw).ok_or(EditError::BadEntry { pa })
    }

    fn swap(&self, pa: u64, raw: u64) -> Result<u64> {
        self.memory.swap(pa, raw).ok_or(EditError::BadEntry { pa })
    }

    fn counts(&self) -> bool {
        self.discipline != Discipline::Cas
    }

    fn count(&self, table: u64, delta: i32) -> Option<u32> {
        if self.counts() {
            self.memory.count(table, delta)
        } else {
            None
        }
    }

    fn alloc(&self) -> Result<u64> {
        let t = self.memory.alloc().ok_or(EditError::OutOfTableMemory)?;
        self.counters.tables_allocated.add(1);
        Ok(t)
    }

    /// A new empty root table.
    ///
    /// # Errors
    /// [`EditError::OutOfTableMemory`] when no page is left.
    pub fn create_root(&self) -> Result<u64> {
        self.alloc()
    }

    /// Whether `table` (at `level`) has no present entry: its count, or a scan.
    fn is_empty(&self, table: u64, level: u32) -> bool {
        match self.memory.count(table, 0) {
            Some(n) => n == 0,
            None => (0..ENTRIES).all(|i| {
                self.memory
                    .read(table + i * 8)
                    .is_some_and(|raw| self.codec.decode(raw, level) == Entry::NotPresent)
            }),
        }
    }

    // ----- edits ---------------------------------------------------------------------

    /// Map `run` into the tree of `root`: the largest leaf that fits at each place
    /// (see [`Codec::large_levels`]), 4 KiB leaves elsewhere, tables created on the
    /// way, leaves already there replaced.
    ///
    /// # Errors
    /// [`EditError::Unsupported`] for an empty, unaligned or untranslatable run or a
    /// leaf the codec cannot encode; [`EditError::OutOfTableMemory`];
    /// [`EditError::Reserved`] / [`EditError::BadEntry`] for a corrupt path. On error
    /// the whole range of the run is unmapped again (under [`Discipline::Rw`] the
    /// caller then collapses `run.va`'s path as the writer).
    pub fn map(&self, root: u64, run: &Run) -> Result<()> {
        self.map_limited(root, run, u32::MAX)
    }

    /// [`Engine::map`] with large leaves only at the levels of `large` (a mask of
    /// levels, like [`Codec::large_levels`], intersected with the codec's).
    ///
    /// # Errors
    /// As [`Engine::map`].
    pub fn map_limited(&self, root: u64, run: &Run, large: u32) -> Result<()> {
        let page = gmem_core::PAGE_SIZE;
        if run.len == 0
            || run.len % page != 0
            || run.va % page != 0
            || run.pa % page != 0
            || run.pa.checked_add(run.len).is_none()
            || run.bits & !self.codec.format_bits() != 0
            || !self.codec.va_ok(run.va, run.len)
        {
            return Err(EditError::Unsupported { va: run.va });
        }
        let last = run.va + (run.len - 1);
        let mut done = Edited::default();
        let r = self.edit(
            root,
            root,
            self.top(),
            run.va,
            last,
            Op::Map(run, large & self.codec.large_levels()),
            &mut done,
        );
        if let Err(e) = r {
            let _ = self.edit(root, root, self.top(), run.va, last, Op::Unmap, &mut done);
            self.counters.failed_maps.add(1);
            return Err(e);
        }
        Ok(())
    }

    /// Clear every leaf of `[va, va + len)` in the tree of `root`, splitting large
    /// leaves the range covers in part; under [`Discipline::Plain`] tables left empty
    /// are unlinked and retired ([`TableMemory::retire`]).
    ///
    /// # Errors
    /// [`EditError::Unsupported`] for an empty or untranslatable range (nothing
    /// changed); [`EditError::OutOfTableMemory`] when a split finds no page (without a
    /// split reserve), [`EditError::BadEntry`] for a corrupt tree: what came before the
    /// failing entry is unmapped.
    pub fn unmap(&self, root: u64, va: u64, len: u64) -> Result<Edited> {
        self.range_edit(root, va, len, Op::Unmap)
    }

    /// Rewrite the permissions of every leaf of `[va, va + len)`, splitting large
    /// leaves the range covers in part.
    ///
    /// # Errors
    /// As [`Engine::unmap`]; a leaf whose permissions the codec cannot express is left
    /// as it is (not an error).
    pub fn protect(&self, root: u64, va: u64, len: u64, prot: Prot) -> Result<Edited> {
        self.range_edit(root, va, len, Op::Protect(prot))
    }

    fn range_edit(&self, root: u64, va: u64, len: u64, op: Op) -> Result<Edited> {
        if len == 0 || !self.codec.va_ok(va, len) {
            return Err(EditError::Unsupported { va });
        }
        let mut done = Edited::default();
        self.edit(root, root, self.top(), va, va + (len - 1), op, &mut done)?;
        Ok(done)
    }

    /// Install a new table in the empty entry `epa` (which held `raw`) of `table` at
    /// `level`; a lost race yields the winner's table.
    fn install(&self, table: u64, epa: u64, raw: u64, level: u32) -> Result<u64> {
        let new = self.alloc()?;
        let Some(want) = self.codec.table(PhysAddr::new(new)) else {
            self.memory.free(new);
            return Err(EditError::BadEntry { pa: new });
        };
        let want = self.derived(want, level, new)?;
        let got = match self.discipline {
            Discipline::Plain => self.write(epa, want).map(|_| Ok(raw))?,
            Discipline::Cas | Discipline::Rw => self
                .memory
                .compare_exchange(epa, raw, want)
                .ok_or(EditError::BadEntry { pa: epa })?,
        };
        match got {
            Ok(_) => {
                self.counters.tables_installed.add(1);
                self.count(table, 1);
                Ok(new)
            }
            Err(current) => {
                self.memory.free(new);
                self.counters.cas_lost.add(1);
                match self.codec.decode(current, level) {
                    Entry::Table(t) => Ok(t.as_u64()),
                    _ => Err(EditError::BadEntry { pa: epa }),
                }
            }
        }
    }

    /// Replace the large leaf `raw` at `epa` (at `level`) by a table of the equivalent
    /// smaller leaves (from the leaf's reserve page if it has one).
    fn split(&self, epa: u64, raw: u64, level: u32) -> Result<u64> {
        let reserved = match self.split_reserve {
            true => self.reserves.lock().remove(&epa),
            false => None,
        };
        let t = match reserved {
            Some(t) => t,
            None => self.alloc()?,
        };
        for i in 0..ENTRIES {
            self.write(t + i * 8, self.codec.split(raw, level, i))?;
        }
        self.count(t, ENTRIES as i32);
        let Some(entry) = self.codec.table(PhysAddr::new(t)) else {
            self.memory.free(t);
            return Err(EditError::BadEntry { pa: t });
        };
        let entry = self.derived(entry, level, t)?;
        self.write(epa, entry)?;
        self.counters.splits.add(1);
        Ok(t)
    }

    /// `entry` (pointing to `child`, at `level`) with its derived bits recomputed.
    fn derived(&self, entry: u64, level: u32, child: u64) -> Result<u64> {
        if self.codec.derived_levels() & (1 << level) == 0 {
            return Ok(entry);
        }
        let mut below = [0u64; ENTRIES as usize];
        for (i, e) in below.iter_mut().enumerate() {
            *e = self.read(child + i as u64 * 8)?;
        }
        Ok(self.codec.derive(entry, level, &below))
    }

    /// Recompute the derived bits of the entry `epa` (at `level`, pointing to `child`).
    fn rederive(&self, epa: u64, level: u32, child: u64) -> Result<()> {
        if self.codec.derived_levels() & (1 << level) == 0 {
            return Ok(());
        }
        let raw = self.read(epa)?;
        let new = self.derived(raw, level, child)?;
        if new != raw {
            self.write(epa, new)?;
            self.counters.derived_updates.add(1);
        }
        Ok(())
    }

    /// Write a leaf for `va` at `epa` (level `level`) over `old`. `Ok(false)`: a large
    /// leaf could not get its split reserve (use smaller leaves).
    fn put_leaf(
        &self,
        table: u64,
        epa: u64,
        old: Entry,
        va: u64,
        level: u32,
        run: &Run,
    ) -> Result<bool> {
        let pa = run.pa + (va - run.va);
        let leaf = self
            .codec
            .leaf(PhysAddr::new(pa), level, run)
            .ok_or(EditError::Unsupported { va })?;
        if level > 0 && self.split_reserve && old == Entry::NotPresent {
            let Some(r) = self.memory.alloc() else {
                return Ok(false);
            };
            self.reserves.lock().insert(epa, r);
        }
        let prev = self.swap(epa, leaf)?;
        if self.codec.decode(prev, level) == Entry::NotPresent {
            self.count(table, 1);
        }
        if level > 0 {
            self.counters.leaves_large.add(1);
        } else {
            self.counters.leaves_small.add(1);
        }
        Ok(true)
    }

    /// Free the split reserve of the large leaf that was at `epa`, if it had one (the
    /// reserve lock is never taken without split reserves, so the concurrent
    /// disciplines never meet it).
    fn drop_reserve(&self, epa: u64) {
        if !self.split_reserve {
            return;
        }
        if let Some(r) = self.reserves.lock().remove(&epa) {
            self.memory.free(r);
        }
    }

    /// Clear the entry `epa` of `table` (a leaf or reserved entry at `level`).
    fn clear(&self, table: u64, epa: u64) -> Result<bool> {
        self.swap(epa, 0)?;
        self.drop_reserve(epa);
        self.counters.leaves_cleared.add(1);
        Ok(self.count(table, -1) == Some(0))
    }

    /// Apply `op` to `[va, last]` under `table` (at `level`) of the tree of `root`.
    #[allow(clippy::too_many_arguments)]
    fn edit(
        &self,
        root: u64,
        table: u64,
        level: u32,
        mut va: u64,
        last: u64,
        op: Op,
        done: &mut Edited,
    ) -> Result<Step> {
        let size = level_size(level);
        let mut step = Step::default();
        let mut hit_zero = false;
        loop {
            let slot_last = va | (size - 1);
            let end = slot_last.min(last);
            let whole = va & (size - 1) == 0 && end == slot_last;
            let epa = table + index(va, level) * 8;
            let raw = self.read(epa)?;
            let entry = self.codec.decode(raw, level);
            let child = match (op, entry) {
                (Op::Map(run, large), e) if !matches!(e, Entry::Table(_) | Entry::Reserved) => {
                    let fits = level == 0
                        || (large & (1 << level) != 0
                            && whole
                            && (run.pa + (va - run.va)) % size == 0);
                    if fits && self.put_leaf(table, epa, e, va, level, run)? {
                        step.changed = true;
                        None
                    } else if let Entry::Leaf(_) = e {
                        Some(self.split(epa, raw, level)?)
                    } else {
                        Some(self.install(table, epa, raw, level)?)
                    }
                }
                (Op::Map(..), Entry::Reserved) => return Err(EditError::Reserved { va }),
                (_, Entry::NotPresent) => None,
                (Op::Unmap, Entry::Leaf(_) | Entry::Reserved) if whole || level == 0 => {
                    hit_zero |= self.clear(table, epa)?;
                    done.pages += size >> 12;
                    step.changed = true;
                    None
                }
                (Op::Protect(p), Entry::Leaf(_)) if whole || level == 0 => {
                    if let Some(new) = self.codec.with_prot(raw, p, level) {
                        self.write(epa, new)?;
                        self.counters.leaves_protected.add(1);
                        done.pages += size >> 12;
                        step.changed = true;
                    }
                    None
                }
                (_, Entry::Reserved) => None,
                (_, Entry::Leaf(_)) => {
                    step.changed = true;
                    Some(self.split(epa, raw, level)?)
                }
                (_, Entry::Table(t)) if level > 0 => Some(t.as_u64()),
                (_, Entry::Table(_)) => None,
            };
            if let Some(child) = child {
                let below = self.edit(root, child, level - 1, va, end, op, done)?;
                if below.changed {
                    step.changed = true;
                    self.rederive(epa, level, child)?;
                }
                if below.empty && matches!(op, Op::Unmap) {
                    match self.discipline {
                        Discipline::Plain => {
                            self.write(epa, 0)?;
                            self.count(table, -1);
                            self.counters.tables_unlinked.add(1);
                            self.memory.retire(root, child);
                        }
                        Discipline::Rw => done.emptied.push(va),
                        Discipline::Cas => {}
                    }
                }
            }
            match end.checked_add(1) {
                Some(next) if end < last => va = next,
                _ => break,
            }
        }
        step.empty = matches!(op, Op::Unmap)
            && match self.discipline {
                Discipline::Plain => self.is_empty(table, level),
                Discipline::Rw => hit_zero && level == 0,
                Discipline::Cas => false,
            };
        Ok(step)
    }

    // ----- walks ---------------------------------------------------------------------

    /// The hardware walk of `va` from `table` at `level` (the root at the top level,
    /// or a table a page-walk cache remembered). `on_table(level, child)` is told every
    /// table the walk descends into through an entry of `level`. With `access`, a leaf
    /// that permits it gets the codec's accessed/dirty bits with a compare-exchange (as
    /// hardware updates them); `None` is a software lookup that changes nothing.
    pub fn walk(
        &self,
        mut table: u64,
        mut level: u32,
        va: u64,
        access: Option<Prot>,
        mut on_table: impl FnMut(u32, u64),
    ) -> Walked {
        let mut w = Walked::default();
        loop {
            let epa = table + index(va, level) * 8;
            let Some(raw) = self.memory.read(epa) else {
                return w;
            };
            w.reads += 1;
            match self.codec.decode(raw, level) {
                Entry::NotPresent | Entry::Reserved => return w,
                Entry::Table(_) if level == 0 => return w,
                Entry::Table(t) => {
                    table = t.as_u64();
                    on_table(level, table);
                    level -= 1;
                }
                Entry::Leaf(mut leaf) => {
                    if let Some(a) = access.filter(|a| leaf.prot.contains(*a)) {
                        let new = self.codec.used(raw, a);
                        if new != raw
                            && matches!(self.memory.compare_exchange(epa, raw, new), Some(Ok(_)))
                        {
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

    /// Read and clear the accessed bits of the leaves covering `[va, va + len)` in the
    /// tree of `root`: `Some(true)` when at least one was set, `Some(false)` when none
    /// was (or nothing is mapped there), `None` when the codec keeps no accessed bits.
    /// Each bit is cleared with a compare-exchange, so an accessed or dirty bit a walk
    /// sets concurrently is never lost (a walk that set it after the read is retried
    /// against). The caller invalidates the TLBs that may cache a leaf found accessed:
    /// until then the hardware may use it without setting the bit again.
    pub fn test_and_clear_accessed(&self, root: u64, va: u64, len: u64) -> Option<bool> {
        self.codec.accessed_bit(0)?;
        if len == 0 || !self.codec.va_ok(va, len) {
            return Some(false);
        }
        let end = va + len;
        let mut at = va;
        let mut any = false;
        while at < end {
            let mut table = root;
            let mut level = self.top();
            let step = loop {
                let epa = table + index(at, level) * 8;
                let Some(raw) = self.memory.read(epa) else {
                    break level_size(level);
                };
                match self.codec.decode(raw, level) {
                    Entry::Table(t) if level > 0 => {
                        table = t.as_u64();
                        level -= 1;
                    }
                    Entry::Leaf(_) => {
                        let mask = self.codec.accessed_bit(level).unwrap_or(0);
                        let mut cur = raw;
                        while cur & mask != 0 {
                            match self.memory.compare_exchange(epa, cur, cur & !mask) {
                                Some(Ok(_)) => {
                                    any = true;
                                    break;
                                }
                                Some(Err(now)) => cur = now,
                                None => break,
                            }
                        }
                        break level_size(level);
                    }
                    _ => break level_size(level),
                }
            };
            match (at & !(step - 1)).checked_add(step) {
                Some(next) => at = next,
                None => break,
            }
        }
        Some(any)
    }

    /// Software lookup of `va` in the tree of `root`: nothing written, nothing counted.
    pub fn lookup(&self, root: u64, va: u64) -> Option<Leaf> {
        if !self.codec.va_ok(va, 1) {
            return None;
        }
        self.walk(root, self.top(), va, None, |_, _| {}).leaf
    }

    /// Call `f(first virtual address, leaf)` for every leaf of the tree of `root`, in
    /// index order.
    pub fn for_each_leaf(&self, root: u64, mut f: impl FnMut(u64, Leaf)) {
        self.leaves_under(root, self.top(), 0, &mut f);
    }

    fn leaves_under(&self, table: u64, level: u32, base: u64, f: &mut impl FnMut(u64, Leaf)) {
        for i in 0..ENTRIES {
            let Some(raw) = self.memory.read(table + i * 8) else {
                continue;
            };
            let mut va = base + i * level_size(level);
            if level == self.top() {
                va = self.codec.extend(va);
            }
            match self.codec.decode(raw, level) {
                Entry::Table(t) if level > 0 => self.leaves_under(t.as_u64(), level - 1, va, f),
                Entry::Leaf(leaf) => f(va, leaf),
                _ => {}
            }
        }
    }

    /// Free every table page below `root` (not `root` itself) and the split reserves
    /// of its large leaves, skipping the root entries `i` for which `skip(i)` holds
    /// (subtrees shared with another tree). The tree must be unreachable by walkers.
    pub fn free_tree(&self, root: u64, skip: impl Fn(u64) -> bool) {
        let top = self.top();
        for i in (0..ENTRIES).filter(|i| !skip(*i)) {
            self.free_entry(root + i * 8, top);
        }
    }

    fn free_entry(&self, epa: u64, level: u32) {
        let Some(raw) = self.memory.read(epa) else {
            return;
        };
        match self.codec.decode(raw, level) {
            Entry::Table(t) if level > 0 => {
                let t = t.as_u64();
                if self.memory.read(t).is_some() {
                    for i in 0..ENTRIES {
                        self.free_entry(t + i * 8, level - 1);
                    }
                    self.memory.free(t);
                }
            }
            Entry::Leaf(_) if level > 0 => self.drop_reserve(epa),
            _ => {}
        }
    }

    /// Check that every derived bit of the tree of `root` equals a recomputation from
    /// the entries below it.
    ///
    /// # Errors
    /// The physical address of the first table entry whose stored bits differ (or
    /// which points outside the memory).
    pub fn check_derived(&self, root: u64) -> core::result::Result<(), u64> {
        self.check_under(root, self.top())
    }

    fn check_under(&self, table: u64, level: u32) -> core::result::Result<(), u64> {
        if level == 0 {
            return Ok(());
        }
        for i in 0..ENTRIES {
            let epa = table + i * 8;
            let raw = self.memory.read(epa).ok_or(epa)?;
            if let Entry::Table(t) = self.codec.decode(raw, level) {
                let t = t.as_u64();
                if self.derived(raw, level, t).map_err(|_| epa)? != raw {
                    return Err(epa);
                }
                self.check_under(t, level - 1)?;
            }
        }
        Ok(())
    }
}

impl<C: Codec, M: AtomicTableMemory> Engine<C, M> {
    /// An engine editing under a concurrent discipline (or [`Discipline::Plain`]).
    ///
    /// # Errors
    /// [`ConfigError::NeedsPlainCodec`] for [`Discipline::Cas`] or [`Discipline::Rw`]
    /// with a codec that has large leaves or derived bits; as [`Engine::new`].
    pub fn concurrent(
        codec: C,
        memory: M,
        discipline: Discipline,
    ) -> core::result::Result<Self, ConfigError> {
        let plain_only = codec.large_levels() != 0 || codec.derived_levels() != 0;
        if discipline != Discipline::Plain && plain_only {
            return Err(ConfigError::NeedsPlainCodec);
        }
        let mut e = Engine::new(codec, memory)?;
        e.discipline = discipline;
        Ok(e)
    }

    /// The writer's half of [`Discipline::Rw`] (the caller excludes every other editor
    /// of `root`): unlink, bottom up, the empty tables on `va`'s path, re-checking each
    /// count first (a mapper may have refilled a table since the unmap that emptied
    /// it). Returns whether anything was unlinked.
    pub fn collapse(&self, root: u64, va: u64) -> bool {
        self.counters.writer_reclaims.add(1);
        // path[i] = (parent table, its entry's level, child table)
        let mut path = [(0u64, 0u32, 0u64); 6];
        let mut n = 0;
        let mut table = root;
        for level in (1..=self.top()).rev() {
            let epa = table + index(va, level) * 8;
            let Some(raw) = self.memory.read(epa) else {
                break;
            };
            let Entry::Table(child) = self.codec.decode(raw, level) else {
                break;
            };
            path[n] = (table, level, child.as_u64());
            n += 1;
            table = child.as_u64();
        }
        let mut unlinked = false;
        for &(parent, level, child) in path[..n].iter().rev() {
            // The broken variant for the IOMMU's loom model (`iommu_rw_no_recheck`)
            // trusts the unmap's count instead of re-checking it here.
            let recheck = !cfg!(gmem_loom_bug = "iommu_rw_no_recheck");
            if recheck && self.memory.count(child, 0).is_some_and(|c| c != 0) {
                break;
            }
            if self
                .memory
                .write(parent + index(va, level) * 8, 0)
                .is_none()
            {
                break;
            }
            self.memory.count(parent, -1);
            self.counters.tables_unlinked.add(1);
            self.memory.retire(root, child);
            unlinked = true;
        }
        if !unlinked {
            self.counters.reclaims_abandoned.add(1);
        }
        unlinked
    }
}
