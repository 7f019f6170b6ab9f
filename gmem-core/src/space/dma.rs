//! Short-lived DMA mappings (`dma_map` / `dma_unmap`): their records and their edits on
//! the space state.
//!
//! ## Theory
//! A DMA buffer of a device that cannot fault lives for one transfer: mapped, read or
//! written once by the device, unmapped. Linux's `iommu_dma_map_page` keeps exactly
//! what such a buffer needs — an IOVA from a per-CPU cache, the leaf entries, and on
//! unmap the invalidation (strict, or through the flush queue) — and nothing more. A
//! region (`as_alloc` + `region_map` + `region_dealloc`) carries much more: a record in
//! the region map, a logical-page-table entry per page, protection pieces, the fault
//! path's memo, the unlocked-edit protocol, a mapping set. Here a DMA mapping is a
//! *DMA record* and nothing else:
//! - **IOVA** from the space's arena, through its quantum caches (the caller allocates
//!   it before taking the space lock; the arena is concurrent), returned to the arena
//!   only after the unmap's invalidation.
//! - **A record in a slab** ([`DmaRecords`]): IOVA range, protection, the frames'
//!   memory and the frames, and the mask of page tables holding the mapping. A handle
//!   names a slot and its generation: a stale or double unmap finds another
//!   generation and is refused, changing nothing. A freed slot keeps its frame
//!   vector's capacity, so in the steady state a map allocates nothing on the heap.
//! - **No logical-page-table entries.** The record is the whole truth about its pages:
//!   no fault can reach them (they are in no region), no migration, eviction or
//!   compaction may touch them (the frames are the caller's), so the logical page
//!   table would only repeat the record at a cost per page. What the logical page
//!   table does for regions the record does here: [`SpaceState::dma_fill`] maps every
//!   record into a table made at a later attach, [`SpaceState::dma_table_gone`] takes
//!   a retiring table's bit off, `check_invariants` checks the records
//!   ([`SpaceState::check_dma`]) and `dev_destroy` counts their frames
//!   ([`SpaceState::dma_pages_in`]).
//! - **Every live table** of the space holds every record (a device cannot fault a
//!   DMA page in: there is no region to fault on).
//! - **One lock round trip per call.** A map edits the tables under the space lock (the
//!   edits are a few entries; the tables keep their interior pages as their discipline
//!   says). A strict unmap clears the entries under the lock and lists the devices to
//!   invalidate; the invalidations and the return of the IOVA run after the lock is
//!   released ([`DmaStrictUnmap`]). An asynchronous unmap goes through the space's
//!   queue like a region's, its IOVA released after the batch's invalidation.
//!
//! ## Invariants (checked by [`SpaceState::check_dma`])
//! Each live record lies inside the space, is allocated in the arena, overlaps no
//! region and no other record, names frames outside the memory the core manages for
//! its device, and is held by exactly the live tables.
//!
//! Other fields of the space state are reached only through the helpers at the top of
//! the `impl` block (`dma_tables`, `dma_table`, `dma_users`).

use super::{SpaceInner, SpaceState};
use crate::addr::{PageSize, Pfn, PhysAddr, VaRange, VirtAddr, Vpn, PAGE_SHIFT};
use crate::device::DeviceInner;
use crate::handle::DeviceId;
use crate::mmu::{Attrs, MapRun, Mmu, MmuError, PageTableRoot};
use crate::space::queue::{Callback, Discard};
use crate::space::violation::{fail, Violation};
use crate::space::TableRun;
use crate::stats::Counters;
use crate::sync::{Arc, AtomicUsize, Ordering};
use crate::vmem::Arena;
use alloc::vec::Vec;

/// One live DMA mapping.
pub(crate) struct DmaRec {
    /// First IOVA.
    pub start: u64,
    /// Pages mapped.
    pub pages: u64,
    /// The arena reservation (the IOVA range, with guard pages if the space has them).
    pub reserve_start: u64,
    pub reserve_len: u64,
    pub prot: crate::flags::Prot,
    /// The device whose physical address space the frames are in.
    pub memory: DeviceId,
    /// That device (`None` in a free slot), for the invariant check of its frames.
    pub memdev: Option<Arc<DeviceInner>>,
    /// One frame per page (capacity kept across reuse of the slot).
    pub frames: Vec<Pfn>,
    /// The page tables (bit `t` = the space's table `t`) holding the mapping.
    pub tables: u32,
}

struct DmaSlot {
    generation: u32,
    live: bool,
    rec: DmaRec,
}

/// The space's DMA records: a generational slab whose freed slots keep their frame
/// vectors, and the count of strict unmaps whose invalidation runs outside the lock.
#[derive(Default)]
pub(crate) struct DmaRecords {
    slots: Vec<DmaSlot>,
    free: Vec<u32>,
    live: usize,
    /// Strict unmaps between their clearing (under the lock) and the end of their
    /// unlocked invalidation: `dev_destroy` refuses while any runs.
    strict_in_flight: Arc<AtomicUsize>,
}

/// What a map asks of the space, once checked and given its IOVA.
pub(crate) struct DmaMapIn<'a> {
    pub start: u64,
    pub reserve_start: u64,
    pub reserve_len: u64,
    pub frames: &'a [PhysAddr],
    pub memdev: Arc<DeviceInner>,
    pub prot: crate::flags::Prot,
}

/// Why a map under the lock failed (the IOVA is the caller's to give back).
pub(crate) enum DmaMapFail {
    /// The space was destroyed.
    Dead,
    /// A driver refused an edit; nothing of the map is left in any table.
    Mmu(MmuError),
}

/// Invalidations a strict unmap owes: at most this many devices inline, the rest in
/// a vector (empty, so not allocated, in the common case).
const INLINE_SHOOTDOWNS: usize = 4;

/// One device TLB invalidation of one range, to run without the space lock.
struct DmaShootdown {
    mmu: Arc<dyn Mmu>,
    root: PageTableRoot,
}

/// A strict DMA unmap whose entries are cleared and whose invalidations and IOVA
/// release are still owed, to run after the space lock is released
/// ([`DmaStrictUnmap::complete`]).
#[must_use = "complete() the invalidation, or the IOVA stays reserved and dev_destroy refuses"]
pub(crate) struct DmaStrictUnmap {
    inline: [Option<DmaShootdown>; INLINE_SHOOTDOWNS],
    more: Vec<DmaShootdown>,
    range: VaRange,
    reserve: (u64, u64),
    in_flight: Arc<AtomicUsize>,
    callback: Option<Callback>,
}

impl DmaStrictUnmap {
    /// Invalidate every device's IOTLB for the range, then give the IOVA back to
    /// `arena` and run the callback (no lock held).
    pub(crate) fn complete(self, stats: &Counters, arena: &Arena) {
        let ranges = [self.range];
        // Deliberately broken (loom model `dma` must catch it): the IOVA goes back to
        // the arena before the invalidation, so a racing map may reuse it while an
        // IOTLB still translates it to the old frame.
        let early = cfg!(gmem_loom_bug = "dma_release_before_invalidation");
        if early {
            let _ = arena.free(self.reserve.0, self.reserve.1);
        }
        for s in self.inline.iter().flatten().chain(self.more.iter()) {
            s.mmu.invalidate(s.root, &ranges);
            Counters::add(&stats.invalidations, 1);
        }
        if !early {
            let freed = arena.free(self.reserve.0, self.reserve.1);
            debug_assert!(freed.is_ok(), "DMA IOVA release failed: {freed:?}");
        }
        self.in_flight.fetch_sub(1, Ordering::Release);
        if let Some(cb) = self.callback {
            cb(Ok(()));
        }
    }
}

/// The table indexes whose bits `mask` has, lowest first (a bit per set bit, not a
/// look at all 32: that loop was ~38% of `dma_map`'s own samples in a profile).
fn bits(mut mask: u32) -> impl Iterator<Item = usize> {
    core::iter::from_fn(move || {
        if mask == 0 {
            return None;
        }
        let t = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        Some(t)
    })
}

/// The physically contiguous runs of a frame list: `(first page index, pages)`.
fn runs(frames: &[Pfn]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    core::iter::from_fn(move || {
        if i >= frames.len() {
            return None;
        }
        let first = i;
        i += 1;
        while i < frames.len() && frames[i].0 == frames[first].0 + (i - first) as u64 {
            i += 1;
        }
        Some((first, i - first))
    })
}

impl DmaRec {
    fn range(&self) -> VaRange {
        VaRange {
            start: VirtAddr::new(self.start),
            len: self.pages << PAGE_SHIFT,
        }
    }

    fn run(&self, first: usize, pages: usize) -> MapRun {
        MapRun {
            va: VirtAddr::new(self.start + ((first as u64) << PAGE_SHIFT)),
            pa: self.frames[first].addr(),
            len: (pages as u64) << PAGE_SHIFT,
            prot: self.prot,
            page_size: PageSize::Size4K,
            memory: self.memory,
            attrs: Attrs::default(),
        }
    }

    /// Map every run into one table; on a refusal unmap what this call mapped there.
    fn map_into(
        &self,
        stats: &Counters,
        mmu: &dyn Mmu,
        root: PageTableRoot,
    ) -> Result<(), MmuError> {
        for (first, pages) in runs(&self.frames) {
            if let Err(e) = mmu.map(root, &self.run(first, pages)) {
                mmu.unmap(root, self.range());
                Counters::add(&stats.mmu_unmaps, 1);
                return Err(e);
            }
            Counters::add(&stats.mmu_maps, 1);
        }
        Ok(())
    }
}

impl DmaRecords {
    fn get(&self, index: u32, generation: u32) -> Option<&DmaRec> {
        match self.slots.get(index as usize) {
            Some(s) if s.live && s.generation == generation => Some(&s.rec),
            _ => None,
        }
    }

    fn iter(&self) -> impl Iterator<Item = &DmaRec> {
        self.slots.iter().filter(|s| s.live).map(|s| &s.rec)
    }

    /// Live records.
    pub(crate) fn len(&self) -> usize {
        self.live
    }
}

impl SpaceState {
    // --- The other fields of the space state this module reads (re-point here). ---

    /// Mask of the live page tables.
    fn dma_tables(&self) -> u32 {
        self.xlat
            .tables
            .iter()
            .enumerate()
            .filter(|(_, t)| t.is_some())
            .fold(0, |m, (i, _)| m | 1 << i)
    }

    /// Table `t`'s MMU and root.
    fn dma_table(&self, t: usize) -> Option<(&Arc<dyn Mmu>, PageTableRoot)> {
        self.xlat
            .tables
            .get(t)
            .and_then(Option::as_ref)
            .map(|x| (&x.mmu, x.root))
    }

    /// Every attached device using a table in `mask`: its MMU and the table's root.
    fn dma_users(&self, mask: u32) -> impl Iterator<Item = (&Arc<dyn Mmu>, PageTableRoot)> {
        self.xlat.attached.iter().flatten().filter_map(move |a| {
            if mask & (1 << a.table) == 0 {
                return None;
            }
            let root = self.xlat.tables.get(a.table)?.as_ref()?.root;
            Some((&a.dev.mmu, root))
        })
    }

    // --- The DMA records' edits. ---

    /// Record a DMA mapping and map it into every live table (`dma_map` under the
    /// lock). Returns the handle's `(index, generation)`. On failure nothing of the map
    /// is left (a driver's refusal unmaps what was mapped and invalidates the devices
    /// that may have walked it) and the IOVA is the caller's to free.
    pub(crate) fn dma_map(
        &mut self,
        stats: &Counters,
        req: DmaMapIn<'_>,
    ) -> Result<(u32, u32), DmaMapFail> {
        if !self.alive {
            return Err(DmaMapFail::Dead);
        }
        let index = match self.dma.free.pop() {
            Some(i) => i,
            None => {
                self.dma.slots.push(DmaSlot {
                    generation: 0,
                    live: false,
                    rec: DmaRec {
                        start: 0,
                        pages: 0,
                        reserve_start: 0,
                        reserve_len: 0,
                        prot: crate::flags::Prot::empty(),
                        memory: req.memdev.id,
                        memdev: None,
                        frames: Vec::new(),
                        tables: 0,
                    },
                });
                (self.dma.slots.len() - 1) as u32
            }
        };
        let tables = self.dma_tables();
        let mut frames = core::mem::take(&mut self.dma.slots[index as usize].rec.frames);
        frames.clear();
        frames.extend(req.frames.iter().map(|f| f.pfn()));
        let rec = DmaRec {
            start: req.start,
            pages: req.frames.len() as u64,
            reserve_start: req.reserve_start,
            reserve_len: req.reserve_len,
            prot: req.prot,
            memory: req.memdev.id,
            memdev: Some(req.memdev),
            frames,
            tables: 0,
        };
        let mut done = 0u32;
        let mut result = Ok(());
        for t in bits(tables) {
            let (mmu, root) = self.dma_table(t).expect("a live table's bit");
            if let Err(e) = rec.map_into(stats, &**mmu, root) {
                result = Err(e);
                break;
            }
            done |= 1 << t;
        }
        if let Err(e) = result {
            let range = rec.range();
            for t in bits(done) {
                let (mmu, root) = self.dma_table(t).expect("a live table's bit");
                mmu.unmap(root, range);
                Counters::add(&stats.mmu_unmaps, 1);
            }
            for (mmu, root) in self.dma_users(done | tables) {
                mmu.invalidate(root, &[range]);
                Counters::add(&stats.invalidations, 1);
            }
            let slot = &mut self.dma.slots[index as usize];
            slot.rec.frames = rec.frames;
            slot.rec.memdev = None;
            self.dma.free.push(index);
            return Err(DmaMapFail::Mmu(e));
        }
        let slot = &mut self.dma.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.live = true;
        slot.rec = DmaRec { tables, ..rec };
        self.dma.live += 1;
        Ok((index, slot.generation))
    }

    /// The IOVA range of live record `(index, generation)`, if it is one.
    pub(crate) fn dma_range(&self, index: u32, generation: u32) -> Option<VaRange> {
        self.dma.get(index, generation).map(DmaRec::range)
    }

    /// Take live record `(index, generation)` out and clear its entries from every
    /// table (`dma_unmap` under the lock). Strict: the invalidations and the IOVA's
    /// release are returned to run after the lock ([`DmaStrictUnmap`]); with no device
    /// to invalidate they happen here and `None` comes back. Asynchronous
    /// (`queued`): the invalidation and the release go to the space's queue, the
    /// callback with them. `Err(callback)` for a stale handle: nothing changed.
    pub(crate) fn dma_unmap(
        &mut self,
        stats: &Counters,
        arena: &Arena,
        (index, generation): (u32, u32),
        queued: bool,
        callback: Option<Callback>,
    ) -> Result<Option<DmaStrictUnmap>, Option<Callback>> {
        if self.dma.get(index, generation).is_none() {
            return Err(callback);
        }
        let slot = &mut self.dma.slots[index as usize];
        slot.live = false;
        slot.rec.memdev = None;
        self.dma.free.push(index);
        self.dma.live -= 1;
        let (range, tables, reserve) = {
            let r = &self.dma.slots[index as usize].rec;
            (r.range(), r.tables, (r.reserve_start, r.reserve_len))
        };
        for t in bits(tables) {
            if let Some((mmu, root)) = self.dma_table(t) {
                mmu.unmap(root, range);
                Counters::add(&stats.mmu_unmaps, 1);
            }
        }
        if queued {
            let runs = bits(tables)
                .map(|table| TableRun { table, range })
                .collect();
            let discard = Discard {
                runs,
                frames: Vec::new(),
                first: Vpn(range.start.as_u64() >> PAGE_SHIFT),
                pages: range.len >> PAGE_SHIFT,
                unlocked: Vec::new(),
            };
            self.enqueue_unmap(stats, arena, discard, Some(reserve), callback);
            return Ok(None);
        }
        let mut pending = DmaStrictUnmap {
            inline: [None, None, None, None],
            more: Vec::new(),
            range,
            reserve,
            in_flight: self.dma.strict_in_flight.clone(),
            callback,
        };
        let mut n = 0;
        for (mmu, root) in self.dma_users(tables) {
            let s = DmaShootdown {
                mmu: mmu.clone(),
                root,
            };
            if n < INLINE_SHOOTDOWNS {
                pending.inline[n] = Some(s);
            } else {
                pending.more.push(s);
            }
            n += 1;
        }
        if n == 0 {
            let freed = arena.free(reserve.0, reserve.1);
            debug_assert!(freed.is_ok(), "DMA IOVA release failed: {freed:?}");
            let callback = pending.callback.take();
            self.complete_now(callback, Ok(()));
            return Ok(None);
        }
        pending.in_flight.fetch_add(1, Ordering::Acquire);
        Ok(Some(pending))
    }

    /// Map every live record into table `t`, made (or joined) by an attach. On a
    /// refusal the records mapped so far keep their bit (the attach's undo,
    /// `detach_slot`, takes them off with [`SpaceState::dma_table_gone`]).
    ///
    /// # Errors
    /// The driver's [`MmuError`].
    pub(crate) fn dma_fill(&mut self, stats: &Counters, t: usize) -> Result<(), MmuError> {
        let Some((mmu, root)) = self.dma_table(t).map(|(m, r)| (m.clone(), r)) else {
            return Ok(());
        };
        for s in self.dma.slots.iter_mut().filter(|s| s.live) {
            if s.rec.tables & (1 << t) != 0 {
                continue;
            }
            s.rec.map_into(stats, &*mmu, root)?;
            s.rec.tables |= 1 << t;
        }
        Ok(())
    }

    /// Table `t` is about to be destroyed (its last user detaches): unmap every record
    /// from it and take its bit off (the detach invalidates the table's whole TLB).
    pub(crate) fn dma_table_gone(&mut self, stats: &Counters, t: usize) {
        let Some((mmu, root)) = self.dma_table(t).map(|(m, r)| (m.clone(), r)) else {
            return;
        };
        for s in self.dma.slots.iter_mut().filter(|s| s.live) {
            if s.rec.tables & (1 << t) != 0 {
                mmu.unmap(root, s.rec.range());
                Counters::add(&stats.mmu_unmaps, 1);
                s.rec.tables &= !(1 << t);
            }
        }
    }

    /// The space is being destroyed (every device detached): every record's IOVA goes
    /// back to the arena and the records go (their handles become stale).
    pub(crate) fn dma_destroy(&mut self, arena: &Arena) {
        for (i, s) in self.dma.slots.iter_mut().enumerate() {
            if s.live {
                debug_assert_eq!(s.rec.tables, 0, "tables are gone before the records");
                let _ = arena.free(s.rec.reserve_start, s.rec.reserve_len);
                s.live = false;
                s.rec.memdev = None;
                self.dma.free.push(i as u32);
            }
        }
        self.dma.live = 0;
    }

    /// Pages of live DMA records whose frames are in device `dev`'s memory.
    pub(crate) fn dma_pages_in(&self, dev: DeviceId) -> u64 {
        self.dma
            .iter()
            .filter(|r| r.memory == dev)
            .map(|r| r.pages)
            .sum()
    }

    /// Whether a strict DMA unmap's invalidation runs outside the lock right now.
    pub(crate) fn dma_unmaps_in_flight(&self) -> bool {
        self.dma.strict_in_flight.load(Ordering::Acquire) != 0
    }

    /// Live DMA records (for tests and counters).
    pub(crate) fn dma_live(&self) -> usize {
        self.dma.len()
    }

    /// The DMA records' invariants (see the module header).
    pub(crate) fn check_dma(&self, space: &SpaceInner, live_tables: u32) -> Result<(), Violation> {
        let mut spans: Vec<(u64, u64)> = Vec::with_capacity(self.dma.live);
        let mut live = 0;
        for r in self.dma.iter() {
            live += 1;
            let end = r.start + (r.pages << PAGE_SHIFT);
            if r.pages == 0 || r.frames.len() as u64 != r.pages {
                return fail("DMA record without one frame per page", Some(r.start));
            }
            if r.reserve_start > r.start
                || end > r.reserve_start + r.reserve_len
                || r.reserve_start < space.range.start.as_u64()
                || r.reserve_start + (r.reserve_len - 1) > space.range.last().as_u64()
            {
                return fail("DMA record outside its space", Some(r.start));
            }
            if !space.arena.contains_allocated(r.reserve_start) {
                return fail("DMA record not allocated in the arena", Some(r.start));
            }
            if self.regions_overlapping(r.start, end).next().is_some() {
                return fail("DMA record overlaps a region", Some(r.start));
            }
            if r.tables != live_tables {
                return fail(
                    "DMA record not held by exactly the live tables",
                    Some(r.start),
                );
            }
            let Some(memdev) = r.memdev.as_ref().filter(|d| d.id == r.memory) else {
                return fail("DMA record without its memory's device", Some(r.start));
            };
            {
                let phys = memdev.phys.lock();
                if r.frames.iter().any(|f| phys.contains(*f)) {
                    return fail("DMA frame lies in managed memory", Some(r.start));
                }
            }
            if self
                .store
                .lpt
                .entries_in(Vpn(r.start >> PAGE_SHIFT), r.pages)
                .next()
                .is_some()
            {
                return fail("logical page table entry in a DMA range", Some(r.start));
            }
            spans.push((r.start, end));
        }
        if live != self.dma.live {
            return fail("DMA record count differs from the live slots", None);
        }
        spans.sort_unstable();
        if spans.windows(2).any(|w| w[0].1 > w[1].0) {
            return fail("DMA records overlap", spans.first().map(|s| s.0));
        }
        Ok(())
    }
}
