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
//! flight). The state's fields are private to this module and its children, one per
//! concern: `attach` (tables and attachments), `memories` (the memories page entries
//! name), `fault` (the fault path), `evict` (the eviction scan and its runs), `tables`
//! (edits of the device tables and the invalidations they owe), `queue` (the queue's
//! work: enqueue, drain, strict unmaps), `ops` (region operations shared by several
//! calls), `large` (large leaves: which runs get them, splits, promotion), `range`
//! (protection of a page range), `check` (the invariants). The KPI modules reach it
//! through methods.
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
use crate::flags::{AllocPolicy, PageSizes, Prot};
use crate::handle::{DeviceId, MappingSetId, Slots, SpaceId};
use crate::lpt::{LogicalPageTable, PageEntry, EXTERNAL, NO_MEM, PENDING, WIRED};
use crate::mmu::{Attrs, Mmu, MmuError, PageTableFormat, PageTableRoot};
use crate::space::queue::Ready;
use crate::space::queue::{Callback, Discard, MmuQueue, TableUnmap};
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

/// Maximum page tables and attachments per space (one bit each in a page entry).
pub const MAX_TABLES: usize = 32;

/// How a device's page table relates to the others of the space (`gm_mmu_mode_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmuMode {
    /// Use the same page table as an attached device of the same format; falls back to
    /// [`MmuMode::Coherent`] when there is none.
    Shared,
    /// A page table of its own, kept coherent by the core; filled by faults (or, for a
    /// device that cannot fault, with every wired page).
    Coherent,
    /// A page table of its own that mirrors every populated page eagerly, for devices
    /// that must see all memory without faulting.
    Replicate,
}

/// Whether `as_attach` also makes the space the device's active one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// Switch the device to the space, as [`crate::Gmem::dev_switch`] does.
    Switch,
    /// Leave the device active where it is (or nowhere).
    Leave,
}

/// Where a fault places a page that has no frame yet (`gm_region_placement_t`'s device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementTarget {
    /// The faulting device's local memory, or host memory when it has none.
    Faulting,
    /// This device's memory.
    Device(DeviceId),
    /// Host memory.
    Host,
}

/// What a fault does with a page that lives elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementMode {
    /// One mapping at a time: tear down every other mapping, migrate the page to the
    /// target, map it for the faulter.
    Unique,
    /// Map the frame where it is (remote access); a fault from a device that already
    /// maps the page remotely is the hint to migrate it.
    RemoteAccess,
}

/// A region's placement policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Where new pages go.
    pub target: PlacementTarget,
    /// Migration or remote access.
    pub mode: PlacementMode,
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            target: PlacementTarget::Faulting,
            mode: PlacementMode::Unique,
        }
    }
}

/// A public description of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// The handle.
    pub region: Region,
    /// The range.
    pub range: VaRange,
    /// Permitted accesses.
    pub prot: Prot,
    /// Placement policy.
    pub placement: Placement,
    /// Zero-fill block size in bytes (0 = the faulting device's largest page size up
    /// to 2 MiB).
    pub zero_fill_block: u64,
    /// Whether `region_map` gave it wired frames.
    pub mapped: bool,
    /// The driver's attributes of its pages (`region_set_attrs`; a range call may
    /// have given some pages others).
    pub attrs: Attrs,
}

/// A constrained region request (`gm_as_alloc`'s arguments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocRequest {
    /// Where to look first (0 = anywhere).
    pub hint: VirtAddr,
    /// Size in bytes, a multiple of 4 KiB.
    pub size: u64,
    /// Alignment (0 = page).
    pub align: u64,
    /// The region must not cross a multiple of this (0 = no constraint).
    pub nocross: u64,
    /// The last address the region may cover (`u64::MAX` = no limit).
    pub max: VirtAddr,
}

impl AllocRequest {
    /// `size` bytes anywhere.
    pub const fn new(size: u64) -> AllocRequest {
        AllocRequest {
            hint: VirtAddr::new(0),
            size,
            align: 0,
            nocross: 0,
            max: VirtAddr::new(u64::MAX),
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) struct RegionRec {
    pub id: u64,
    pub len: u64,
    pub reserve_start: u64,
    pub reserve_len: u64,
    pub prot: Prot,
    pub placement: Placement,
    pub zero_fill_block: u64,
    /// `region_map` gave frames: an absent page is "nowhere", not "zero-fill".
    pub explicit: bool,
    pub mapped: bool,
    pub set: Option<MappingSetId>,
    /// An unlocked edit of its pages is in flight (`unlocked`): KPI calls on it wait.
    pub busy: bool,
    /// The driver's attributes of its pages (split-off pieces aside).
    pub attrs: Attrs,
}

impl RegionRec {
    /// A fresh region's record: read-write, default placement and attributes, no
    /// frames given, not mapped, in no mapping set.
    pub fn new(id: u64, len: u64, reserve_start: u64, reserve_len: u64) -> RegionRec {
        RegionRec {
            id,
            len,
            reserve_start,
            reserve_len,
            prot: Prot::RW,
            placement: Placement::default(),
            zero_fill_block: 0,
            explicit: false,
            mapped: false,
            set: None,
            busy: false,
            attrs: Attrs::default(),
        }
    }

    /// The region's own protection and attributes (what its unsplit pages have).
    pub fn piece(&self) -> segments::Piece {
        segments::Piece {
            prot: self.prot,
            attrs: self.attrs,
        }
    }
}

pub(crate) struct PageTable {
    pub root: PageTableRoot,
    pub mmu: Arc<dyn Mmu>,
    pub format: PageTableFormat,
    /// The leaf sizes `mmu` maps: the creating device's, asked once when it registered
    /// (a capability that never changes, see [`Mmu::page_sizes`]). The fault path
    /// reads it for every page without a call through the trait object.
    pub sizes: PageSizes,
    pub mode: MmuMode,
    /// Attachment slots using this table.
    pub users: u32,
    /// Whether any user can fault (tables of non-faultable users get wired pages eagerly).
    pub faultable: bool,
    /// The device whose `mmu` this is (the creator, or the user that took the table
    /// over when its creator detached from a shared table).
    pub owner: DeviceId,
    /// Distinguishes this table from earlier and later ones in the same slot.
    pub generation: u64,
}

pub(crate) struct Attachment {
    pub dev: Arc<DeviceInner>,
    pub table: usize,
}

pub(crate) struct MappingSet {
    pub regions: Vec<Region>,
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
        if let Some(ready) = self.state.queue.take_ready() {
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

///
/// Its fields are private to this module and its children (`attach`, `fault`,
/// `queue`, `ops`, `check`), each of which owns one concern; the KPI modules in
/// [`crate::kpi`] reach the state only through methods.
pub(crate) struct SpaceState {
    /// Cleared by `as_destroy`; a dead space refuses every call.
    alive: bool,
    /// Regions by start address, with the fault path's memo (`regions`).
    regions: regions::Regions,
    /// The logical page table: where each page lives and which tables map it.
    lpt: LogicalPageTable,
    /// Page tables by index (a page entry's mapping bit `t` names `tables[t]`).
    tables: Vec<Option<PageTable>>,
    /// Mask of the tables in [`MmuMode::Replicate`] mode, kept by
    /// [`SpaceState::tables_changed`] (every fault asks it; the tables change only at
    /// attach and when a table retires).
    replicas: u32,
    /// Attachment slots (which device uses which table).
    attached: Vec<Option<Attachment>>,
    /// Memories frames of this space live in; an entry's `mem` indexes this list.
    memories: Memories,
    /// The asynchronous MMU queue.
    queue: MmuQueue,
    /// Mapping sets.
    sets: Slots<MappingSet>,
    /// Pieces of regions whose protection a range protect changed.
    segments: segments::Segments,
    /// Device-private frames (`private`).
    private: private::PrivateFrames,
    /// The large leaves the core asked the drivers for (`large`).
    large: large::LargeLeaves,
    next_region_id: u64,
    /// Generation of the next page table created.
    next_table_generation: u64,
    /// Bumped by every attach: a strict unmap finishing its unlocked invalidation
    /// sees whether a device joined a table meanwhile.
    attach_epoch: u64,
    /// Page-table edits running without the lock right now (`unlocked`).
    unlocked_edits: u32,
    /// Tables detached while such edits ran, destroyed when the last one ends.
    doomed: Vec<unlocked::Doomed>,
    /// The pages and tables each unlocked `region_map` in flight is editing: no other
    /// edit of the core touches them until it has finished (`unlocked`).
    in_flight_maps: Vec<unlocked::InFlightMap>,
    /// The devices named by strict unmaps whose unlocked completion runs right now
    /// (each once per pending unmap): `dev_destroy` refuses while one is listed.
    strict_refs: Vec<DeviceId>,
    /// The space's counter block (`SpaceInner::counters`), bumped through
    /// [`SpaceState::local`].
    tally: Arc<SpaceCounters>,
    /// While a fault batch is serviced (`batch`): the stale-TLB invalidations its
    /// spurious faults owe, issued once at the end of the batch's block.
    deferred_spurious: Option<Vec<TableRun>>,
}

impl SpaceState {
    fn new(host: Arc<DeviceInner>, tally: Arc<SpaceCounters>) -> SpaceState {
        SpaceState {
            alive: true,
            regions: regions::Regions::default(),
            lpt: LogicalPageTable::default(),
            tables: Vec::new(),
            replicas: 0,
            attached: Vec::new(),
            memories: Memories::new(host),
            queue: MmuQueue::default(),
            sets: Slots::default(),
            segments: segments::Segments::default(),
            private: private::PrivateFrames::default(),
            large: large::LargeLeaves::default(),
            next_region_id: 1,
            next_table_generation: 0,
            attach_epoch: 0,
            unlocked_edits: 0,
            doomed: Vec::new(),
            in_flight_maps: Vec::new(),
            strict_refs: Vec::new(),
            tally,
            deferred_spurious: None,
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
        let id = self.next_region_id;
        self.next_region_id += 1;
        self.regions
            .insert(start, RegionRec::new(id, len, reserve_start, reserve_len));
        Some(id)
    }

    /// Every region with its start, in address order.
    pub fn regions(&self) -> impl Iterator<Item = (u64, &RegionRec)> {
        self.regions.iter()
    }

    /// The regions overlapping `[start, end)`, with their starts, in address order.
    pub fn regions_overlapping(
        &self,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = (u64, &RegionRec)> {
        self.regions.overlapping(start, end)
    }

    /// Requests the queue holds before it drains by itself (at least 1).
    pub fn set_batch_limit(&mut self, limit: usize) {
        self.queue.batch_limit = limit.max(1);
    }

    /// Queued asynchronous requests.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The counter of callbacks handed to threads and not finished (`as_synchronize`
    /// waits for it to reach 0).
    pub fn callbacks_in_flight(&self) -> Arc<crate::sync::AtomicUsize> {
        self.queue.in_flight.clone()
    }

    /// Run `callback` with `result` once the lock is released.
    pub fn complete_now(&mut self, callback: Option<Callback>, result: Result<(), MmuError>) {
        self.queue.complete_now(callback, result);
    }

    /// Forget the memory of device `id` (destroyed; no page names it).
    pub fn forget_memory(&mut self, id: DeviceId) {
        self.memories.forget(id);
    }

    /// Create an empty mapping set.
    pub fn new_set(&mut self) -> MappingSetId {
        let (index, generation) = self.sets.insert_with(|_, _| MappingSet {
            regions: Vec::new(),
        });
        MappingSetId { index, generation }
    }

    /// Empty a mapping set, returning its regions (`None` for a stale handle).
    pub fn take_set(&mut self, set: MappingSetId) -> Option<Vec<Region>> {
        let s = self.sets.get_mut(set.index, set.generation)?;
        Some(core::mem::take(&mut s.regions))
    }

    /// Destroy a mapping set; its regions stay mapped and belong to no set. `false` for
    /// a stale handle.
    pub fn destroy_set(&mut self, set: MappingSetId) -> bool {
        let Some(s) = self.sets.remove(set.index, set.generation) else {
            return false;
        };
        for r in s.regions {
            if let Some(rec) = self.region_mut(r) {
                rec.set = None;
            }
        }
        true
    }

    /// The region holding `va`, with its start.
    pub fn region_at(&self, va: u64) -> Option<(u64, &RegionRec)> {
        self.regions.at(va)
    }

    /// The region a handle names, if it is still allocated.
    pub fn region(&self, region: Region) -> Option<&RegionRec> {
        self.regions
            .get(region.start.as_u64())
            .filter(|r| r.id == region.id)
    }

    pub fn region_mut(&mut self, region: Region) -> Option<&mut RegionRec> {
        self.regions
            .get_mut(region.start.as_u64())
            .filter(|r| r.id == region.id)
    }

    /// The attachment slot of a device.
    pub fn slot_of(&self, dev: DeviceId) -> Option<usize> {
        self.attached
            .iter()
            .position(|a| a.as_ref().is_some_and(|a| a.dev.id == dev))
    }

    /// The attachment slot of a device and the index of the table it uses, found
    /// together (the fault path needs both: one search, no second look at the slot).
    #[inline]
    pub(crate) fn attachment_of(&self, dev: DeviceId) -> Option<(usize, usize)> {
        self.attached
            .iter()
            .enumerate()
            .find_map(|(slot, a)| match a {
                Some(a) if a.dev.id == dev => Some((slot, a.table)),
                _ => None,
            })
    }

    /// The root of the page table device `dev` uses, if it is attached.
    pub fn root_of(&self, dev: DeviceId) -> Option<PageTableRoot> {
        let (_, t) = self.attachment_of(dev)?;
        Some(self.tables.get(t)?.as_ref()?.root)
    }

    /// How many pages of the space have their frame in device `dev`'s memory.
    pub fn pages_in_memory(&self, dev: DeviceId) -> u64 {
        let Some(m) = self.memories.position(dev) else {
            return 0;
        };
        self.lpt
            .iter()
            .filter(|(_, e)| e.is_populated() && e.mem == m)
            .count() as u64
    }

    /// Index of `dev` in the memory list, adding it if needed.
    #[inline]
    pub fn mem_index(&mut self, dev: &Arc<DeviceInner>) -> Result<u8, TooManyMemories> {
        self.memories.index_of(dev)
    }

    /// Mask of tables that must hold every populated page (replicate mode).
    #[inline]
    pub fn replica_mask(&self) -> u32 {
        self.replicas
    }

    /// The replicate tables' mask, from the tables themselves.
    fn replicas_of(tables: &[Option<PageTable>]) -> u32 {
        tables
            .iter()
            .enumerate()
            .filter(|(_, t)| t.as_ref().is_some_and(|t| t.mode == MmuMode::Replicate))
            .fold(0, |m, (i, _)| m | 1 << i)
    }

    /// Recompute what is kept about the set of tables: the one call after every
    /// change of `tables` (a table made at attach, a table retired), so that
    /// [`SpaceState::replica_mask`] stays exact (`check_invariants` compares it).
    pub(crate) fn tables_changed(&mut self) {
        self.replicas = SpaceState::replicas_of(&self.tables);
    }

    /// Mask of tables that must hold every wired page (users cannot fault).
    pub fn wired_mask(&self) -> u32 {
        self.tables
            .iter()
            .enumerate()
            .filter(|(_, t)| t.as_ref().is_some_and(|t| !t.faultable))
            .fold(0, |m, (i, _)| m | 1 << i)
            | self.replica_mask()
    }

    /// Give a frame back to its memory (or quarantine it until its invalidation).
    pub fn release_frame(&self, e: &PageEntry, pending: bool) {
        if e.mem == NO_MEM || e.has(EXTERNAL) {
            return;
        }
        let mut phys = self.memories.get(e.mem).phys.lock();
        if pending {
            phys.quarantine(e.pfn)
        } else {
            phys.free(e.pfn)
        }
    }

    /// Whether any page of `[first, first+pages)` has a queued unmap or map.
    pub fn any_pending(&self, first: Vpn, pages: u64) -> bool {
        self.lpt
            .entries_in(first, pages)
            .any(|(_, e)| e.has(PENDING))
    }

    /// Remove every page of `[first, first+pages)` now: unmap everywhere, invalidate,
    /// release frames (the caller releases the range).
    pub fn discard_pages(&mut self, stats: &Counters, first: Vpn, pages: u64) {
        let private = self.private_in(first, pages);
        self.free_private(stats, &private);
        self.unmap_pages(stats, first, pages, u32::MAX);
        let entries: Vec<(Vpn, PageEntry)> = self.lpt.entries_in(first, pages).collect();
        for (v, e) in entries {
            self.release_frame(&e, false);
            self.lpt.take(v);
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
        let private = self.private_in(first, pages);
        self.free_private(stats, &private);
        let touched: Vec<(Vpn, u32)> = self
            .lpt
            .entries_in(first, pages)
            .filter(|(_, e)| e.mapped != 0)
            .map(|(v, e)| (v, e.mapped))
            .collect();
        let all = touched.iter().fold(0, |m, (_, bits)| m | bits);
        let mut unlocked = Vec::new();
        let owed = if edits == TableEdits::Deferrable && self.edits_unlocked(all) {
            let runs = table_runs(&touched);
            self.large_unmapped(stats, &runs);
            for &(v, bits) in &touched {
                self.lpt.update(v, |e| e.mapped &= !bits);
            }
            for run in &runs {
                let table = self.tables[run.table]
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
        let entries: Vec<(Vpn, PageEntry)> = self.lpt.entries_in(first, pages).collect();
        let mut frames = Vec::new();
        for (v, e) in entries {
            // A frame of ours waits, quarantined, for the deferred invalidation; the
            // page stays marked pending until then.
            let quarantine = e.is_populated() && !e.has(EXTERNAL);
            self.release_frame(&e, quarantine);
            if quarantine {
                frames.push((e.mem, e.pfn));
            }
            self.lpt.set(
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

mod attach;
mod batch;
mod large;
mod memories;
mod range;
pub(crate) use range::PageSpan;
mod regions;

pub use large::LargeLeaf;

pub use memories::MAX_MEMORIES;
pub(crate) use memories::{Memories, TooManyMemories};
pub(crate) mod check;
mod context;
pub use crate::handle::Region;
pub(crate) use context::Ctx;
pub(crate) use regions::Checked;
mod compact;
pub(crate) use compact::CompactMove;
mod evict;
mod fault;
mod frames;
mod ops;
pub(crate) use ops::MapFrames;
mod tables;
use tables::OwedInvalidation;
pub(crate) use tables::{table_runs, Shootdown, TableRun};
mod private;
pub(crate) use private::PrivateRefusal;
pub(crate) mod queue;
pub(crate) mod segments;
mod unlocked;

pub(crate) use unlocked::UnlockedMap;
