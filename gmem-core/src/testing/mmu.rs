//! The test MMU: page tables of one format kept in a [`TableStore`] (shareable by two
//! MMUs of that format, as shared mode needs), a TLB of its own that caches
//! translations until the core invalidates them, and an optional ordered log of every
//! call ([`MmuEvent`]).
//!
//! The store keeps each table as leaf blocks of 512 PTEs with their accessed bits,
//! found by a hash of the block number (`table`): a map or unmap costs a hash probe per
//! 2 MiB block and an array write per page, not a tree walk, so a benchmark measures the
//! core rather than its test driver. Large leaves are recorded in an ordered map (a
//! partial unmap looks up the leaves around its range).

use crate::addr::{VaRange, VirtAddr, PAGE_SHIFT, PAGE_SIZE};
use crate::flags::{PageSizes, Prot};
use crate::handle::DeviceId;
use crate::mmu::{MapRun, Mmu, MmuError, PageTableFormat, PageTableRoot};
use crate::sync::{Arc, AtomicBool, AtomicU32, Mutex, Ordering, RwLock};
use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use hashbrown::HashMap;

use super::table::Table;

/// One recorded MMU call. `mmu` is the recording MMU's number; the other fields are
/// the call's arguments.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MmuEvent {
    /// `create_page_table` returned this root.
    Create { mmu: u32, root: PageTableRoot },
    /// `destroy_page_table`.
    Destroy { mmu: u32, root: PageTableRoot },
    /// `map`.
    Map {
        mmu: u32,
        root: PageTableRoot,
        run: MapRun,
    },
    /// `unmap`.
    Unmap {
        mmu: u32,
        root: PageTableRoot,
        range: VaRange,
    },
    /// `protect`.
    Protect {
        mmu: u32,
        root: PageTableRoot,
        range: VaRange,
        prot: Prot,
    },
    /// `invalidate` with its batch of ranges.
    Invalidate {
        mmu: u32,
        root: PageTableRoot,
        ranges: Vec<VaRange>,
    },
    /// `invalidate_all`.
    InvalidateAll { mmu: u32, root: PageTableRoot },
    /// `activate`.
    Activate {
        mmu: u32,
        root: Option<PageTableRoot>,
    },
}

/// A leaf translation: frame, protection, and the device whose memory holds the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pte {
    /// Frame number.
    pub pfn: u64,
    /// Permitted accesses.
    pub prot: Prot,
    /// Whose memory.
    pub memory: DeviceId,
    /// The region attributes the core gave the mapping.
    pub attrs: crate::mmu::Attrs,
}

/// Root → (vpn → PTE, accessed bit). Roots are numbered from 1 in creation order, so
/// a table is found by indexing with its number, as a real MMU finds its table from
/// the root pointer, not by a hash probe per map (a destroyed table leaves an empty
/// slot behind: a test makes few).
#[derive(Default)]
struct Tables {
    slots: Vec<Option<Table>>,
    live: usize,
}

impl Tables {
    fn slot(root: u64) -> Option<usize> {
        usize::try_from(root).ok()?.checked_sub(1)
    }

    fn get(&self, root: &u64) -> Option<&Table> {
        self.slots.get(Self::slot(*root)?)?.as_ref()
    }

    fn get_mut(&mut self, root: &u64) -> Option<&mut Table> {
        self.slots.get_mut(Self::slot(*root)?)?.as_mut()
    }

    fn contains_key(&self, root: &u64) -> bool {
        Self::slot(*root)
            .and_then(|i| self.slots.get(i))
            .is_some_and(Option::is_some)
    }

    fn len(&self) -> usize {
        self.live
    }

    /// Add the table of a root just made (the next number).
    fn insert(&mut self, root: u64, table: Table) {
        let i = Self::slot(root).expect("roots are numbered from 1");
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        if self.slots[i].replace(table).is_none() {
            self.live += 1;
        }
    }

    fn remove(&mut self, root: &u64) {
        if let Some(slot) = Self::slot(*root).and_then(|i| self.slots.get_mut(i)) {
            if slot.take().is_some() {
                self.live -= 1;
            }
        }
    }
}

/// (root, first vpn) → pages of each large leaf, and the splits so far.
type LargeLeaves = (BTreeMap<(u64, u64), u64>, u64);

/// Page tables of one format: root → (vpn → PTE). Shared by MMUs that share tables.
///
/// Each PTE also has an accessed bit (kept in the table): a walk that fills a TLB
/// sets it, a new mapping starts with it clear, and
/// [`Mmu::test_and_clear_accessed`] reads and clears it.
#[derive(Default)]
///
/// Large leaves are kept as per-page PTEs (so every lookup is exact) plus a record of
/// each leaf: `(root, first vpn) → pages`. An unmap or protect that covers a leaf in
/// part splits it (the record goes, the pages stay as they were), as a driver must.
pub struct TableStore {
    /// Every table of the format. No lock of the core covers them, so `map` takes this
    /// lock even on the fault path: the store is shared by the MMUs of one format
    /// (so by several spaces, whose faults run at once), an MMU that declares
    /// [`Mmu::concurrent_edits`] is edited without the space lock, and
    /// [`TestMmu::translate`] walks the tables from access threads.
    tables: Mutex<(u64, Tables)>,
    dead_edits: Mutex<u64>,
    large: Mutex<LargeLeaves>,
    /// Edits of recording MMUs in flight, and how many began while another edit of
    /// an overlapping range of the same table was in flight.
    edits: Mutex<EditsInFlight>,
}

/// `(root, first vpn, pages)` of each edit in flight, and the overlaps seen so far.
#[derive(Default)]
struct EditsInFlight {
    running: Vec<(u64, u64, u64)>,
    overlaps: u64,
}

/// An edit of a table range in flight (see [`TableStore::overlapping_edits`]); it
/// ends when dropped.
struct EditInFlight<'a> {
    store: &'a TableStore,
    key: Option<(u64, u64, u64)>,
}

impl Drop for EditInFlight<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            let mut e = self.store.edits.lock();
            if let Some(i) = e.running.iter().position(|k| *k == key) {
                e.running.swap_remove(i);
            }
        }
    }
}

impl TableStore {
    /// A new empty store.
    pub fn new() -> Arc<TableStore> {
        Arc::new(TableStore::default())
    }

    /// The PTE of `vpn` in `root`.
    pub fn lookup(&self, root: PageTableRoot, vpn: u64) -> Option<Pte> {
        self.tables
            .lock()
            .1
            .get(&root.0)
            .and_then(|t| t.get(vpn))
            .copied()
    }

    /// A walk of `root` for `vpn`: its PTE, with the accessed bit set.
    fn walk(&self, root: PageTableRoot, vpn: u64) -> Option<Pte> {
        let mut t = self.tables.lock();
        let table = t.1.get_mut(&root.0)?;
        let p = table.get(vpn).copied()?;
        table.set_accessed(vpn);
        Some(p)
    }

    /// Every PTE of `root`.
    pub fn entries(&self, root: PageTableRoot) -> Vec<(u64, Pte)> {
        self.tables
            .lock()
            .1
            .get(&root.0)
            .map(Table::entries)
            .unwrap_or_default()
    }

    /// Whether the accessed bit of `vpn`'s PTE in `root` is set.
    pub fn accessed(&self, root: PageTableRoot, vpn: u64) -> bool {
        self.tables
            .lock()
            .1
            .get(&root.0)
            .is_some_and(|t| t.accessed(vpn))
    }

    /// Whether `root` names a live (created, not yet destroyed) table.
    pub fn is_live(&self, root: PageTableRoot) -> bool {
        self.tables.lock().1.contains_key(&root.0)
    }

    /// Number of live tables.
    pub fn tables(&self) -> usize {
        self.tables.lock().1.len()
    }

    /// `map`, `unmap` and `protect` calls of recording MMUs that began while another
    /// such call on an overlapping range of the same table had not returned (the core
    /// must never make one: it promises a driver whose tables take unlocked edits
    /// disjoint ranges, see [`Mmu::concurrent_edits`]).
    pub fn overlapping_edits(&self) -> u64 {
        self.edits.lock().overlaps
    }

    /// Begin an edit of `pages` pages from `first` in `root` (`track`: a recording
    /// MMU's; a benchmark's MMU skips the bookkeeping).
    fn begin_edit(
        &self,
        track: bool,
        root: PageTableRoot,
        first: u64,
        pages: u64,
    ) -> EditInFlight<'_> {
        if !track {
            return EditInFlight {
                store: self,
                key: None,
            };
        }
        let key = (root.0, first, pages);
        let mut e = self.edits.lock();
        if e.running
            .iter()
            .any(|&(r, f, n)| r == root.0 && f < first + pages && first < f + n)
        {
            e.overlaps += 1;
        }
        e.running.push(key);
        EditInFlight {
            store: self,
            key: Some(key),
        }
    }

    /// `map`, `unmap` and `protect` calls that named a table already destroyed (the
    /// core must never make one: a real driver would write freed memory).
    pub fn edits_of_destroyed(&self) -> u64 {
        *self.dead_edits.lock()
    }

    /// Count an edit of `root` if it was created and is gone.
    fn note_edit(&self, tables: &(u64, Tables), root: PageTableRoot) {
        if root.0 <= tables.0 && !tables.1.contains_key(&root.0) {
            *self.dead_edits.lock() += 1;
        }
    }

    /// The large leaves of `root`: (first vpn, pages), in address order.
    pub fn large_leaves(&self, root: PageTableRoot) -> Vec<(u64, u64)> {
        self.large
            .lock()
            .0
            .iter()
            .filter(|((r, _), _)| *r == root.0)
            .map(|((_, v), n)| (*v, *n))
            .collect()
    }

    /// Large leaves split so far (by a partial unmap or protect).
    pub fn splits(&self) -> u64 {
        self.large.lock().1
    }

    /// Forget the leaves of `root` in `[first, first + pages)`: whole ones silently,
    /// partly covered ones as splits (when `split_only`, whole ones stay).
    fn edit_large(&self, root: u64, first: u64, pages: u64, split_only: bool) {
        let mut l = self.large.lock();
        let lo = first.saturating_sub((1 << 18) - 1);
        let hit: Vec<(u64, u64)> =
            l.0.range((root, lo)..(root, first + pages))
                .filter(|((_, v), n)| v + *n > first)
                .map(|((_, v), n)| (*v, *n))
                .collect();
        for (v, n) in hit {
            let partial = v < first || v + n > first + pages;
            if partial || !split_only {
                l.0.remove(&(root, v));
            }
            if partial {
                l.1 += 1;
            }
        }
    }
}

/// A shared, ordered log of MMU events.
pub type EventLog = Arc<Mutex<Vec<MmuEvent>>>;

/// The MMU calls a [`Gate`] can hold open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateCall {
    /// [`Mmu::map`].
    Map,
    /// [`Mmu::unmap`].
    Unmap,
    /// [`Mmu::invalidate`].
    Invalidate,
}

/// What an armed gate does to the call it catches.
enum GateAction {
    /// Wait at the gate until it opens.
    Hold(Arc<Gate>),
    /// Run this inside the call (on the caller's thread, as an interrupt or a
    /// driver that calls back into the core would), then go on.
    Run(Box<dyn FnOnce() + Send>),
}

/// Holds one MMU call open, so that a test can make another call of the core run at a
/// precise point of the first (see [`TestMmu::hold_next`]): the held call has started
/// (its edit counts as in flight) and waits in the driver until [`Gate::open`].
pub struct Gate {
    held: AtomicBool,
    open: AtomicBool,
}

impl Gate {
    /// Whether the held call has arrived at the gate and is waiting there.
    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Let the held call go on (or, if it has not arrived yet, pass straight through).
    pub fn open(&self) {
        self.open.store(true, Ordering::Release);
    }

    fn wait(&self) {
        self.held.store(true, Ordering::Release);
        while !self.open.load(Ordering::Acquire) {
            crate::sync::spin_wait();
        }
    }
}

struct TlbState {
    root: Option<PageTableRoot>,
    entries: HashMap<(u64, u64), Pte>,
    hits: u64,
    misses: u64,
}

/// An MMU whose page tables and TLB live in ordinary memory, recording every call.
pub struct TestMmu {
    id: u32,
    format: PageTableFormat,
    sizes: PageSizes,
    store: Arc<TableStore>,
    log: EventLog,
    pub(super) record: bool,
    tlb: Mutex<TlbState>,
    fail_next_maps: AtomicU32,
    fail_next_protects: Mutex<u32>,
    concurrent: bool,
    /// Whether a gate is armed (read by every call; the gate itself is behind a lock).
    gate_armed: AtomicBool,
    gate: Mutex<Option<(GateCall, GateAction)>>,
    /// Held shared by every access from translation to the end of its memory access,
    /// and exclusively by invalidation: an invalidation completes only after the
    /// accesses that may have used a stale translation have finished, as a real TLB
    /// shootdown waits for outstanding accesses.
    pub(super) inflight: RwLock<()>,
}

impl TestMmu {
    /// A test MMU numbered `id` (used in its events), of `format`, keeping tables in
    /// `store` and recording into `log`.
    pub fn new(id: u32, format: u32, store: Arc<TableStore>, log: EventLog) -> TestMmu {
        TestMmu {
            id,
            format: PageTableFormat(format),
            sizes: PageSizes::S4K,
            store,
            log,
            record: true,
            tlb: Mutex::new(TlbState {
                root: None,
                entries: HashMap::new(),
                hits: 0,
                misses: 0,
            }),
            fail_next_maps: AtomicU32::new(0),
            fail_next_protects: Mutex::new(0),
            concurrent: false,
            gate_armed: AtomicBool::new(false),
            gate: Mutex::new(None),
            inflight: RwLock::new(()),
        }
    }

    /// Hold the next `call` of this MMU open at a gate until the returned
    /// [`Gate::open`] (one call; later ones pass).
    pub fn hold_next(&self, call: GateCall) -> Arc<Gate> {
        let gate = Arc::new(Gate {
            held: AtomicBool::new(false),
            open: AtomicBool::new(false),
        });
        *self.gate.lock() = Some((call, GateAction::Hold(gate.clone())));
        self.gate_armed.store(true, Ordering::Release);
        gate
    }

    /// Run `f` inside the next `call` of this MMU, on the thread making the call, with
    /// whatever locks the core holds around it (one call; later ones pass).
    pub fn run_in_next(&self, call: GateCall, f: Box<dyn FnOnce() + Send>) {
        *self.gate.lock() = Some((call, GateAction::Run(f)));
        self.gate_armed.store(true, Ordering::Release);
    }

    /// Wait at the gate if it is armed for `call`.
    #[inline]
    fn pass_gate(&self, call: GateCall) {
        if !self.gate_armed.load(Ordering::Relaxed) {
            return;
        }
        let action = {
            let mut g = self.gate.lock();
            match g.take() {
                Some((c, action)) if c == call => {
                    self.gate_armed.store(false, Ordering::Relaxed);
                    action
                }
                other => {
                    *g = other;
                    return;
                }
            }
        };
        match action {
            GateAction::Hold(gate) => gate.wait(),
            GateAction::Run(f) => f(),
        }
    }

    /// Report these page sizes instead of 4 KiB only.
    pub fn with_page_sizes(mut self, sizes: PageSizes) -> TestMmu {
        self.sizes = sizes;
        self
    }

    /// Declare that the tables take concurrent edits of disjoint ranges
    /// ([`Mmu::concurrent_edits`]; the store's lock makes that true).
    pub fn with_concurrent_edits(mut self) -> TestMmu {
        self.concurrent = true;
        self
    }

    /// Do not record events (benchmarks).
    pub fn without_log(mut self) -> TestMmu {
        self.record = false;
        self
    }

    /// Make the next `n` calls to `map` fail with `OutOfTableMemory`.
    pub fn fail_next_maps(&self, n: u32) {
        self.fail_next_maps.store(n, Ordering::Relaxed);
    }

    /// Make the next `n` `protect` calls fail with `OutOfTableMemory` after changing
    /// the first page of their range (a driver that fails half-way through a run).
    pub fn fail_next_protects(&self, n: u32) {
        *self.fail_next_protects.lock() = n;
    }

    /// The table store.
    pub fn store(&self) -> &Arc<TableStore> {
        &self.store
    }

    /// The root the device translates with.
    pub fn active_root(&self) -> Option<PageTableRoot> {
        self.tlb.lock().root
    }

    /// TLB hits and misses so far.
    pub fn tlb_counts(&self) -> (u64, u64) {
        let t = self.tlb.lock();
        (t.hits, t.misses)
    }

    /// What the device would use to translate `va`: its TLB first, then a walk of the
    /// active table (filling the TLB). `None` when nothing translates it.
    pub fn translate(&self, va: VirtAddr) -> Option<Pte> {
        let mut tlb = self.tlb.lock();
        let root = tlb.root?;
        let key = (root.0, va.vpn().0);
        if let Some(p) = tlb.entries.get(&key).copied() {
            tlb.hits += 1;
            return Some(p);
        }
        tlb.misses += 1;
        // The walk sets the accessed bit.
        let p = self.store.walk(root, va.vpn().0)?;
        tlb.entries.insert(key, p);
        Some(p)
    }

    /// Drop the TLB's translation of `va` in the active table (a fault report does).
    pub(super) fn forget(&self, va: VirtAddr) {
        let mut tlb = self.tlb.lock();
        if let Some(root) = tlb.root {
            tlb.entries.remove(&(root.0, va.vpn().0));
        }
    }

    /// Whether the TLB holds an entry for `va` in `root` (stale or not).
    pub fn tlb_holds(&self, root: PageTableRoot, va: VirtAddr) -> bool {
        self.tlb.lock().entries.contains_key(&(root.0, va.vpn().0))
    }

    fn log(&self, e: MmuEvent) {
        if self.record {
            self.log.lock().push(e);
        }
    }
}

impl Mmu for TestMmu {
    fn format(&self) -> PageTableFormat {
        self.format
    }
    fn page_sizes(&self) -> PageSizes {
        self.sizes
    }
    fn create_page_table(&self) -> Result<PageTableRoot, MmuError> {
        let root = {
            let mut t = self.store.tables.lock();
            t.0 += 1;
            let root = t.0;
            t.1.insert(root, Table::default());
            PageTableRoot(root)
        };
        self.log(MmuEvent::Create { mmu: self.id, root });
        Ok(root)
    }
    fn destroy_page_table(&self, root: PageTableRoot) {
        self.store.tables.lock().1.remove(&root.0);
        self.store.large.lock().0.retain(|(r, _), _| *r != root.0);
        self.log(MmuEvent::Destroy { mmu: self.id, root });
    }
    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        let _edit = self
            .store
            .begin_edit(self.record, root, run.va.vpn().0, run.len >> PAGE_SHIFT);
        self.pass_gate(GateCall::Map);
        // One relaxed load when no failure is armed (every map in a benchmark).
        if self.fail_next_maps.load(Ordering::Relaxed) > 0
            && self
                .fail_next_maps
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| f.checked_sub(1))
                .is_ok()
        {
            return Err(MmuError::OutOfTableMemory);
        }
        let size = run.page_size.bytes();
        // Every page size is a power of two: the three alignment checks are one mask
        // test of their union.
        debug_assert!(size.is_power_of_two());
        if !self.sizes.supports(run.page_size)
            || (run.va.as_u64() | run.pa.as_u64() | run.len) & (size - 1) != 0
            || run.len == 0
        {
            return Err(MmuError::Unsupported { va: run.va });
        }
        {
            let mut t = self.store.tables.lock();
            let made = t.0;
            let Some(table) = t.1.get_mut(&root.0) else {
                // A root made and destroyed is a dead edit (one probe on the live path).
                if root.0 <= made {
                    *self.store.dead_edits.lock() += 1;
                }
                return Err(MmuError::Hardware(1));
            };
            if size > PAGE_SIZE {
                let n = size >> PAGE_SHIFT;
                let mut l = self.store.large.lock();
                for k in 0..run.len / size {
                    l.0.insert((root.0, run.va.vpn().0 + k * n), n);
                }
            }
            let pfn = run.pa.pfn().0;
            table.insert_run(run.va.vpn().0, run.len >> PAGE_SHIFT, |k| Pte {
                pfn: pfn + k,
                prot: run.prot,
                memory: run.memory,
                attrs: run.attrs,
            });
        }
        if self.record {
            self.log(MmuEvent::Map {
                mmu: self.id,
                root,
                run: *run,
            });
        }
        Ok(())
    }
    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        let _edit = self
            .store
            .begin_edit(self.record, root, range.first_vpn().0, range.pages());
        self.pass_gate(GateCall::Unmap);
        {
            let mut t = self.store.tables.lock();
            self.store.note_edit(&t, root);
            if let Some(table) = t.1.get_mut(&root.0) {
                let first = range.first_vpn().0;
                self.store.edit_large(root.0, first, range.pages(), false);
                table.remove_run(first, range.pages());
            }
        }
        self.log(MmuEvent::Unmap {
            mmu: self.id,
            root,
            range,
        });
    }
    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        let _edit = self
            .store
            .begin_edit(self.record, root, range.first_vpn().0, range.pages());
        let fail = {
            let mut f = self.fail_next_protects.lock();
            let fail = *f > 0;
            *f = f.saturating_sub(1);
            fail
        };
        {
            let mut t = self.store.tables.lock();
            self.store.note_edit(&t, root);
            if let Some(table) = t.1.get_mut(&root.0) {
                let first = range.first_vpn().0;
                // Split first (a reserve makes it infallible), then change.
                self.store.edit_large(root.0, first, range.pages(), true);
                let pages = if fail { 1 } else { range.pages() };
                for v in first..first + pages {
                    if let Some(p) = table.get_mut(v) {
                        p.prot = prot;
                    }
                }
            }
        }
        self.log(MmuEvent::Protect {
            mmu: self.id,
            root,
            range,
            prot,
        });
        if fail {
            return Err(MmuError::OutOfTableMemory);
        }
        Ok(())
    }
    fn invalidate(&self, root: PageTableRoot, ranges: &[VaRange]) {
        self.pass_gate(GateCall::Invalidate);
        let _drained = self.inflight.write();
        {
            let mut tlb = self.tlb.lock();
            for r in ranges {
                let first = r.first_vpn().0;
                if r.pages() as usize > tlb.entries.len() {
                    tlb.entries.retain(|(rt, v), _| {
                        !(*rt == root.0 && *v >= first && *v < first + r.pages())
                    });
                } else {
                    for v in first..first + r.pages() {
                        tlb.entries.remove(&(root.0, v));
                    }
                }
            }
        }
        self.log(MmuEvent::Invalidate {
            mmu: self.id,
            root,
            ranges: ranges.to_vec(),
        });
    }
    fn invalidate_all(&self, root: PageTableRoot) {
        let _drained = self.inflight.write();
        self.tlb.lock().entries.retain(|(r, _), _| *r != root.0);
        self.log(MmuEvent::InvalidateAll { mmu: self.id, root });
    }
    fn activate(&self, root: Option<PageTableRoot>) {
        self.tlb.lock().root = root;
        self.log(MmuEvent::Activate { mmu: self.id, root });
    }
    fn concurrent_edits(&self) -> bool {
        self.concurrent
    }
    fn test_and_clear_accessed(&self, root: PageTableRoot, range: VaRange) -> Option<bool> {
        let mut t = self.store.tables.lock();
        let any =
            t.1.get_mut(&root.0)
                .is_some_and(|table| table.take_accessed(range.first_vpn().0, range.pages()));
        Some(any)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_index_by_root_number_and_forget_destroyed_roots() {
        let mut t = Tables::default();
        assert!(t.get(&0).is_none() && t.get_mut(&1).is_none() && !t.contains_key(&0));
        t.insert(1, Table::default());
        t.insert(3, Table::default());
        assert_eq!(t.len(), 2);
        assert!(t.contains_key(&1) && !t.contains_key(&2) && t.contains_key(&3));
        assert!(t.get_mut(&3).is_some() && t.get(&2).is_none() && t.get(&4).is_none());
        t.remove(&3);
        t.remove(&3);
        t.remove(&9);
        assert_eq!(t.len(), 1);
        assert!(!t.contains_key(&3) && t.get(&3).is_none());
        assert!(t.get(&u64::MAX).is_none());
    }
}
