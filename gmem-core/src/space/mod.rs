//! Address spaces: regions, attached devices, page tables, coherence.
//!
//! An address space (`gm_as_t`) owns
//! - a vmem arena over `[begin, end)` that hands out regions (with the space's fit
//!   policy, guard pages and quantum caches as asked);
//! - the regions, by start address, each with its protection, placement policy and
//!   zero-fill block size;
//! - the logical page table (`lpt`);
//! - up to 32 page tables, each created by a driver and used by one device (coherent or
//!   replicate mode) or several devices of the same format (shared mode);
//! - the attachments (which device uses which table);
//! - the asynchronous MMU queue (`queue`).
//!
//! All of it sits behind one lock per space (`SpaceInner::lock`, whose guard runs the
//! callbacks that became ready after releasing it, so callbacks may call the KPI again —
//! all of it but `as_synchronize` on their own space, which waits for callbacks in
//! flight). The state ([`SpaceState`]) is three owned parts, each in its own module
//! with its invariants checked beside it: the region map (`region_map`: regions,
//! split-off pieces, mapping sets), the page store (`page_store`: the logical page
//! table, memories, private frames) and the translation side (`translation`: tables,
//! attachments, replicas, large leaves, the queue, unlocked edits). The operations
//! that span them are this module's children, one per concern: `attach` (tables and
//! attachments), `fault` (the fault path), `frames` (the one frame-allocation entry),
//! `evict` (the eviction scan and its runs), `tables` (edits of the device tables and
//! the invalidations they owe), `queue` (the queue's work: enqueue, drain, strict
//! unmaps), `ops` (region operations shared by several calls), `large` (large leaves:
//! which runs get them, splits, promotion), `range` (protection of a page range),
//! `unlocked` (edits outside the lock), `check` (the invariants that join the parts).
//! The KPI modules reach the state through methods.
//!
//! ## Coherence
//! The logical page table records which page tables map each page. Every change of
//! where a page lives goes through `SpaceState::unmap_pages`: remove the mappings from
//! every table that has them, invalidate the TLB of every device using those tables
//! (one call per device with the whole list of ranges), and only then release frames or
//! virtual ranges. Replicate-mode tables mirror every populated page, and tables of
//! devices that cannot fault get every wired page; both are refreshed whenever a page
//! moves (`SpaceState::mirror`).

use crate::addr::{Pfn, VaRange, VirtAddr, Vpn, PAGE_SHIFT};
use crate::device::DeviceInner;
use crate::flags::{AllocPolicy, Prot};
use crate::handle::{DeviceId, MappingSetId, SpaceId};
use crate::lpt::{PageEntry, EXTERNAL, PENDING, WIRED};
use crate::mmu::{Attrs, MmuError, PageTableRoot};
use crate::space::queue::Ready;
use crate::space::queue::{Callback, Discard, TableUnmap};
use crate::stats::{Counters, SpaceCounters};
use crate::sync::{Arc, Rank, SpinMutex, SpinMutexGuard};
use crate::vmem::Arena;
use alloc::vec::Vec;

/// Whether a deferred discard may leave its page-table unmaps to an unlocked
/// completion (see [`SpaceState::discard_pages_deferred`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TableEdits {
    /// Unmap under the lock (queued unmaps: the queue's drain invalidates).
    UnderLock,
    /// Leave the unmaps of tables that take concurrent edits to the strict unmap's
    /// unlocked completion.
    Deferrable,
}

pub(crate) struct SpaceInner {
    pub id: SpaceId,
    pub range: VaRange,
    pub policy: AllocPolicy,
    pub arena: Arena,
    /// The counters bumped under the lock (shared with the state, which bumps them;
    /// read here by `Gmem::stats` and folded by `as_destroy`, see [`crate::stats`]).
    pub counters: Arc<SpaceCounters>,
    state: SpinMutex<SpaceState>,
    /// Loom builds only: set when the registry lets the space go (see
    /// [`SpaceInner::unregistered`]).
    #[cfg(gmem_loom)]
    released: crate::sync::AtomicBool,
}

impl SpaceInner {
    pub fn new(
        id: SpaceId,
        range: VaRange,
        policy: AllocPolicy,
        arena: Arena,
        host: Arc<DeviceInner>,
    ) -> SpaceInner {
        let counters = Arc::new(SpaceCounters::default());
        SpaceInner {
            id,
            range,
            policy,
            arena,
            counters: counters.clone(),
            state: SpinMutex::ranked(SpaceState::new(host, counters), Rank::SpaceState),
            #[cfg(gmem_loom)]
            released: crate::sync::AtomicBool::new(false),
        }
    }

    /// The registry's reference to a destroyed space, just removed from it. A normal
    /// build drops it (the space is freed once no other reference is left). A loom
    /// build marks the space and keeps it allocated instead, so that a model can see a
    /// fault reach a space that a real build would have freed (the fault's entry
    /// protocol, `kpi::device`, relies on the registry's reference) without touching
    /// freed memory.
    pub fn unregistered(space: Arc<SpaceInner>) {
        #[cfg(gmem_loom)]
        {
            space.released.store(true, crate::sync::Ordering::Release);
            core::mem::forget(space);
        }
        #[cfg(not(gmem_loom))]
        drop(space);
    }

    /// Loom builds only: whether the registry still holds the space.
    #[cfg(gmem_loom)]
    pub fn registered(&self) -> bool {
        !self.released.load(crate::sync::Ordering::Acquire)
    }

    /// Lock the space's state for one operation. Dropping the guard releases the lock
    /// and then runs the completion callbacks that became ready meanwhile, so that no
    /// callback runs under the lock (callbacks may call the KPI again).
    pub fn lock(&self) -> Locked<'_> {
        Locked {
            state: self.state.lock(),
            after: None,
        }
    }

    /// [`SpaceInner::lock`] if the lock is free (cross-space eviction).
    pub fn try_lock(&self) -> Option<Locked<'_>> {
        Some(Locked {
            state: self.state.try_lock()?,
            after: None,
        })
    }
}

/// The lock of one space's state, held for one operation; see [`SpaceInner::lock`].
pub(crate) struct Locked<'a> {
    // Field order is drop order: the lock is released first, then the callbacks run.
    state: SpinMutexGuard<'a, SpaceState>,
    after: Option<Ready>,
}

impl Drop for Locked<'_> {
    #[inline]
    fn drop(&mut self) {
        // `after` is `None` until here: written only when there is a batch (most
        // releases have none and skip the store).
        if let Some(ready) = self.state.xlat.queue.take_ready() {
            self.after = Some(ready);
        }
    }
}

impl core::ops::Deref for Locked<'_> {
    type Target = SpaceState;
    fn deref(&self) -> &SpaceState {
        &self.state
    }
}

impl core::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut SpaceState {
        &mut self.state
    }
}

/// One space's state, behind its lock: three owned parts and the flags that span them.
///
/// - `map` ([`RegionMap`], module `region_map`): the regions, their split-off pieces
///   and the mapping sets — FreeBSD's `vm_map`;
/// - `store` ([`PageStore`], module `page_store`): the logical page table, the
///   memories its entries name and the device-private frames — the `vm_object` side;
/// - `xlat` ([`Translation`], module `translation`): the page tables, attachments,
///   replicas, large leaves, the queue and the unlocked edits — the `pmap` side.
///
/// Each part owns its invariants and checks them itself (`check`); what joins two
/// parts (a page outside every region holds nothing; a mapping bit names a live
/// table; replicate tables hold every populated page) is the state's, in `check`.
/// The operations that move pages (fault, migration, eviction, unmap) span all three
/// and live in this module's children, one per concern. The KPI modules in
/// [`crate::kpi`] reach the state only through its methods.
pub(crate) struct SpaceState {
    /// Cleared by `as_destroy`; a dead space refuses every call.
    alive: bool,
    /// The region map.
    map: RegionMap,
    /// The page store.
    store: PageStore,
    /// The translation side.
    xlat: Translation,
    /// The space's counter block (`SpaceInner::counters`), bumped through
    /// [`SpaceState::local`].
    tally: Arc<SpaceCounters>,
    /// Short-lived DMA mappings (`dma`).
    dma: dma::DmaRecords,
    /// The policy engines: access counters, thrashing detection (`policies`).
    policies: policies::Policies,
    /// Per-page advice (`advice`, `region_advise`).
    advice: crate::policy::advice::AdviceMap,
}

impl SpaceState {
    fn new(host: Arc<DeviceInner>, tally: Arc<SpaceCounters>) -> SpaceState {
        SpaceState {
            alive: true,
            map: RegionMap::default(),
            store: PageStore::new(host),
            xlat: Translation::default(),
            tally,
            dma: dma::DmaRecords::default(),
            policies: policies::Policies::default(),
            advice: advice::empty(),
        }
    }

    /// The space's counter block, for a bump with [`SpaceCounters::add`] (the caller
    /// holds the lock: it is the only writer). A dead space's block has been folded
    /// into the global counters, so nothing may count in it any more.
    #[inline]
    pub(crate) fn local(&self) -> &SpaceCounters {
        debug_assert!(self.alive, "counting in a destroyed space's folded block");
        &self.tally
    }

    /// Whether the space is alive (not destroyed).
    pub fn is_alive(&self) -> bool {
        self.alive
    }

    /// Record a new region `[start, start + len)` reserved as `[reserve_start,
    /// reserve_start + reserve_len)` in the arena; `None` if the space is dead.
    pub fn insert_region(
        &mut self,
        start: u64,
        len: u64,
        reserve_start: u64,
        reserve_len: u64,
    ) -> Option<u64> {
        if !self.alive {
            return None;
        }
        Some(self.map.insert(start, len, reserve_start, reserve_len))
    }

    /// Every region with its start, in address order.
    pub fn regions(&self) -> impl Iterator<Item = (u64, &RegionRec)> {
        self.map.iter()
    }

    /// The regions overlapping `[start, end)`, with their starts, in address order.
    pub fn regions_overlapping(
        &self,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = (u64, &RegionRec)> {
        self.map.overlapping(start, end)
    }

    /// The region holding `va`, with its start.
    pub fn region_at(&self, va: u64) -> Option<(u64, &RegionRec)> {
        self.map.at(va)
    }

    /// The region a handle names, if it is still allocated.
    pub fn region(&self, region: Region) -> Option<&RegionRec> {
        self.map.get(region)
    }

    /// Requests the queue holds before it drains by itself (at least 1).
    pub fn set_batch_limit(&mut self, limit: usize) {
        self.xlat.queue.batch_limit = limit.max(1);
    }

    /// Queued asynchronous requests.
    pub fn queued(&self) -> usize {
        self.xlat.queue.len()
    }

    /// The counter of callbacks handed to threads and not finished (`as_synchronize`
    /// waits for it to reach 0).
    pub fn callbacks_in_flight(&self) -> Arc<crate::sync::AtomicUsize> {
        self.xlat.queue.in_flight.clone()
    }

    /// Run `callback` with `result` once the lock is released.
    pub fn complete_now(&mut self, callback: Option<Callback>, result: Result<(), MmuError>) {
        self.xlat.queue.complete_now(callback, result);
    }

    /// Forget the memory of device `id` (destroyed; no page names it).
    pub fn forget_memory(&mut self, id: DeviceId) {
        self.store.forget_memory(id);
    }

    /// How many pages of the space have their frame in device `dev`'s memory.
    pub fn pages_in_memory(&self, dev: DeviceId) -> u64 {
        self.store.pages_in_memory(dev) + self.dma_pages_in(dev)
    }

    /// Create an empty mapping set.
    pub fn new_set(&mut self) -> MappingSetId {
        self.map.new_set()
    }

    /// Empty a mapping set, returning its regions (`None` for a stale handle).
    pub fn take_set(&mut self, set: MappingSetId) -> Option<Vec<Region>> {
        self.map.take_set(set)
    }

    /// Destroy a mapping set; its regions stay mapped and belong to no set. `false` for
    /// a stale handle.
    pub fn destroy_set(&mut self, set: MappingSetId) -> bool {
        self.map.destroy_set(set)
    }

    /// The attachment slot of a device.
    pub fn slot_of(&self, dev: DeviceId) -> Option<usize> {
        self.xlat.slot_of(dev)
    }

    /// The attachment slot of a device and the index of the table it uses.
    #[inline]
    pub(crate) fn attachment_of(&self, dev: DeviceId) -> Option<(usize, usize)> {
        self.xlat.attachment_of(dev)
    }

    /// The root of the page table device `dev` uses, if it is attached.
    pub fn root_of(&self, dev: DeviceId) -> Option<PageTableRoot> {
        self.xlat.root_of(dev)
    }

    /// Remove every page of `[first, first+pages)` now: unmap everywhere, invalidate,
    /// release frames (the caller releases the range).
    pub fn discard_pages(&mut self, stats: &Counters, first: Vpn, pages: u64) {
        self.thrashing_forget(first, pages);
        self.drop_copies(stats, first, pages);
        let private = self.private_in(first, pages);
        self.free_private(stats, &private);
        self.unmap_pages(stats, first, pages, u32::MAX);
        let entries: Vec<(Vpn, PageEntry)> = self.store.lpt.entries_in(first, pages).collect();
        for (v, e) in entries {
            self.store.release_frame(&e, false);
            self.store.lpt.take(v);
        }
    }

    /// Remove every page of `[first, first+pages)` but owe the invalidation: the
    /// entries are cleared at once (new translations fault), the frames quarantined and
    /// the pages marked pending. The returned [`Discard`] must go to the queue
    /// (`enqueue_unmap`) or to a strict unmap completed outside the lock
    /// (`defer_invalidation`), which invalidate and then release. With
    /// [`TableEdits::Deferrable`] and tables that all take concurrent edits, the
    /// page-table unmaps are left in the discard too, for the unlocked completion of a
    /// strict unmap to make before its invalidation (an unlocked edit in flight).
    pub fn discard_pages_deferred(
        &mut self,
        stats: &Counters,
        first: Vpn,
        pages: u64,
        edits: TableEdits,
    ) -> Discard {
        self.thrashing_forget(first, pages);
        self.drop_copies(stats, first, pages);
        let private = self.private_in(first, pages);
        self.free_private(stats, &private);
        let touched: Vec<(Vpn, u32)> = self
            .store
            .lpt
            .entries_in(first, pages)
            .filter(|(_, e)| e.mapped != 0)
            .map(|(v, e)| (v, e.mapped))
            .collect();
        let all = touched.iter().fold(0, |m, (_, bits)| m | bits);
        let mut unlocked = Vec::new();
        let owed = if edits == TableEdits::Deferrable && self.xlat.edits_unlocked(all) {
            let runs = table_runs(&touched);
            self.large_unmapped(stats, &runs);
            for &(v, bits) in &touched {
                self.store.lpt.update(v, |e| e.mapped &= !bits);
            }
            for run in &runs {
                let table = self.xlat.tables[run.table]
                    .as_ref()
                    .expect("a mapping bit's table");
                unlocked.push(TableUnmap {
                    mmu: table.mmu.clone(),
                    owner: table.owner,
                    root: table.root,
                    range: run.range,
                });
            }
            OwedInvalidation(runs)
        } else {
            self.clear_entries(stats, &touched)
        };
        let entries: Vec<(Vpn, PageEntry)> = self.store.lpt.entries_in(first, pages).collect();
        let mut frames = Vec::new();
        for (v, e) in entries {
            // A frame of ours waits, quarantined, for the deferred invalidation; the
            // page stays marked pending until then.
            let quarantine = e.is_populated() && !e.has(EXTERNAL);
            self.store.release_frame(&e, quarantine);
            if quarantine {
                frames.push((e.mem, e.pfn));
            }
            self.store.lpt.set(
                v,
                PageEntry {
                    flags: PENDING,
                    ..PageEntry::EMPTY
                },
            );
        }
        Discard {
            runs: owed.0,
            frames,
            first,
            pages,
            unlocked,
        }
    }

    /// Pages a region covers: `(first vpn, count)`.
    pub fn pages_of(start: u64, len: u64) -> (Vpn, u64) {
        (Vpn(start >> PAGE_SHIFT), len >> PAGE_SHIFT)
    }

    /// Whether a page is wired.
    pub fn is_wired(e: &PageEntry) -> bool {
        e.has(WIRED)
    }
}

mod advice;
mod attach;
mod batch;
mod large;
mod memories;
mod range;
pub(crate) use range::PageSpan;
mod options;
mod region_map;
mod regions;
pub use options::{
    Activation, AllocRequest, MmuMode, Placement, PlacementMode, PlacementTarget, RegionInfo,
    MAX_TABLES,
};
pub(crate) use region_map::RegionMap;
pub(crate) use regions::RegionRec;
mod page_store;
use page_store::PageStore;
mod translation;
pub(crate) use translation::{Attachment, PageTable, Translation};

pub use translation::LargeLeaf;

pub use memories::MAX_MEMORIES;
mod check;
mod context;
pub(crate) mod violation;
pub use crate::handle::Region;
pub(crate) use context::Ctx;
pub(crate) use regions::ResolvedRegion;
mod compact;
pub(crate) use compact::CompactMove;
mod evict;
mod fault;
mod frames;
mod ops;
pub(crate) use ops::MapFrames;
mod tables;
pub(crate) use queue::{Shootdown, TableRun};
pub(crate) use tables::table_runs;
use tables::OwedInvalidation;
mod duplicate;
mod private;
pub(crate) use private::PrivateRefusal;
pub(crate) mod dma;
mod policies;
pub(crate) mod queue;
pub(crate) mod segments;
mod unlocked;

pub(crate) use unlocked::UnlockedMap;
