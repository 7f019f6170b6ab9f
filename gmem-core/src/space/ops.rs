//! Space-state operations shared by several KPI calls: settling a region against the queue, wiring, unmapping a region, filling and detaching page tables.

use crate::addr::{PhysAddr, Vpn};
use crate::device::DeviceInner;
use crate::error::{MapError, MoveError};
use crate::flags::MapFlags;
use crate::flags::Prot;
use crate::handle::MappingSetId;
use crate::lpt::{PageEntry, EXTERNAL};
use crate::lpt::{PENDING, WIRED};
use crate::mmu::MmuError;
use crate::space::queue::Callback;
use crate::space::segments::Piece;
use crate::space::Ctx;
use crate::space::ResolvedRegion;
use crate::space::{
    PlacementTarget, Region, RegionRec, SpaceInner, SpaceState, TableEdits, UnlockedMap,
};
use crate::sync::Arc;
use alloc::vec::Vec;

/// What `region_map` maps, as the space sees it once the memory's device is looked
/// up: caller-given frames of `memdev`, with which protection, in which mapping set,
/// how (`flags`), and who hears when it is done.
pub(crate) struct MapFrames<'a> {
    /// The device whose physical address space the frames are in.
    pub memdev: &'a Arc<DeviceInner>,
    /// Permitted accesses.
    pub prot: Prot,
    /// One frame per page of the region.
    pub frames: &'a [PhysAddr],
    /// A mapping set the region joins.
    pub set: Option<MappingSetId>,
    /// [`MapFlags::ASYNC`] queues the page-table updates of devices that cannot fault.
    pub flags: MapFlags,
    /// Runs once the mapping is visible to every device that must hold it.
    pub callback: Option<Callback>,
}

impl SpaceState {
    /// Drain the queue if any page of a checked region has a request pending (an
    /// operation never races a queued invalidation).
    pub(crate) fn settle(&mut self, cx: &Ctx<'_>, space: &SpaceInner, c: &ResolvedRegion) {
        if self.store.any_pending(c.first, c.pages) {
            self.drain(cx.counters, &space.arena);
        }
    }

    /// Write back a checked region's record (after a change the caller made to a copy).
    pub(crate) fn put_region(&mut self, c: &ResolvedRegion, rec: RegionRec) {
        if let Some(r) = self.map.get_mut(c.region) {
            *r = rec;
        }
    }

    /// Remove a checked region's record, and the region from its mapping set.
    pub(crate) fn remove_region(&mut self, c: &ResolvedRegion) {
        self.map.remove(c);
        self.forget_advice(c.first, c.pages);
    }

    /// Pin (or unpin) a populated page: its entry's wired mark and its frame's queue.
    pub(crate) fn set_page_wired(&mut self, vpn: Vpn, wired: bool) {
        let e = self.store.lpt.update(vpn, |x| {
            if wired {
                x.flags |= WIRED;
            } else {
                x.flags &= !WIRED;
            }
            *x
        });
        self.store
            .memories
            .get(e.mem)
            .phys
            .lock()
            .set_wired(e.pfn, wired);
    }

    /// Populate and pin `[first, first + pages)`; see [`Gmem::region_wire`].
    pub(crate) fn wire_range(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        first: Vpn,
        pages: u64,
        target: PlacementTarget,
    ) -> Result<u64, MoveError> {
        if self.store.any_pending(first, pages) {
            self.drain(cx.counters, &space.arena);
        }
        let dest = self.target_of(cx, cx.host, target);
        // Wired pages are never duplicated (`duplicate`).
        self.drop_copies(cx.counters, first, pages);
        // A large leaf over the range's edge would cover wired and unwired pages.
        let broken = self.break_straddling_large(cx.counters, first, pages);
        let mut wired = Vec::new();
        let mut result = Ok(());
        for vpn in first.span(pages) {
            let e = self.store.lpt.get(vpn);
            if e.has(WIRED) {
                continue;
            }
            if !e.is_populated() {
                if let Err(err) = self.prepare_page(cx, space, vpn, &dest) {
                    result = Err(err);
                    break;
                }
            }
            self.set_page_wired(vpn, true);
            wired.push(vpn);
        }
        if result.is_ok() {
            let mask = self.xlat.wired_mask();
            result = self
                .mirror(cx.counters, first, pages, mask)
                .and_then(|()| self.remirror_broken(cx.counters, &broken))
                .map_err(MoveError::Mmu);
        }
        if let Err(err) = result {
            let mask = self.xlat.wired_mask() & !self.xlat.replica_mask();
            let touched: Vec<(Vpn, u32)> = wired
                .iter()
                .map(|v| (*v, self.store.lpt.get(*v).mapped & mask))
                .filter(|(_, m)| *m != 0)
                .collect();
            self.unmap_entries(cx.counters, &touched);
            for vpn in wired {
                self.set_page_wired(vpn, false);
            }
            return Err(err);
        }
        Ok(wired.len() as u64)
    }

    /// Unmap one region (strict or queued); the region must be live.
    pub(crate) fn unmap_region(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        c: &ResolvedRegion,
        flags: MapFlags,
        callback: Option<Callback>,
    ) {
        let (first, pages) = (c.first, c.pages);
        self.settle(cx, space, c);
        if flags.contains(MapFlags::ASYNC) {
            let d = self.discard_pages_deferred(cx.counters, first, pages, TableEdits::UnderLock);
            self.enqueue_unmap(cx.counters, &space.arena, d, None, callback);
        } else {
            self.discard_pages(cx.counters, first, pages);
            self.xlat.queue.complete_now(callback, Ok(()));
        }
        self.map.leave_set(c);
        self.put_region(
            c,
            RegionRec {
                mapped: false,
                set: None,
                ..c.rec
            },
        );
    }

    /// Resolve a region handle of this space into a checked region, if it is live.
    pub(crate) fn checked(&self, region: Region) -> Option<ResolvedRegion> {
        let rec = *self.region(region)?;
        let (first, pages) = SpaceState::pages_of(region.start.as_u64(), rec.len);
        Some(ResolvedRegion {
            region,
            rec,
            first,
            pages,
        })
    }

    /// `region_map` under the lock: see [`crate::Gmem::region_map`]. When every table
    /// that must take the pages eagerly can be edited unlocked (and the map is
    /// synchronous), the page-table edits are left to the caller as an
    /// [`UnlockedMap`] to run after releasing the lock; otherwise they are done here.
    pub(crate) fn map_frames(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        c: &ResolvedRegion,
        req: MapFrames<'_>,
    ) -> Result<Option<UnlockedMap>, MapError> {
        let MapFrames {
            memdev,
            prot,
            frames,
            set,
            flags,
            callback,
        } = req;
        let memory = memdev.id;
        let (first, pages) = (c.first, c.pages);
        if prot.is_empty() {
            return Err(MapError::BadProt(prot));
        }
        if frames.len() as u64 != pages {
            return Err(MapError::FrameCount {
                expected: pages,
                given: frames.len() as u64,
            });
        }
        if let Some(s) = set {
            if !self.map.has_set(s) {
                return Err(MapError::UnknownSet(s));
            }
        }
        {
            let phys = memdev.phys.lock();
            if phys.is_retired() {
                return Err(MapError::UnknownDevice(memory));
            }
            if let Some(f) = frames
                .iter()
                .find(|f| !f.is_page_aligned() || phys.contains(f.pfn()))
            {
                return Err(MapError::BadFrame(*f));
            }
        }
        // A populated entry (a queued map's included) makes this a misuse, found
        // before anything changes; a queued unmap leaves no populated entry.
        if c.rec.mapped
            || self
                .store
                .lpt
                .entries_in(first, pages)
                .any(|(_, e)| e.is_populated())
            || !self.private_in(first, pages).is_empty()
        {
            return Err(MapError::AlreadyMapped);
        }
        let mem = self
            .store
            .mem_index(memdev)
            .map_err(|_| MapError::TooManyMemories(memory))?;
        if self.store.any_pending(first, pages) {
            self.drain(cx.counters, &space.arena);
        }
        let asynchronous = flags.contains(MapFlags::ASYNC);
        let extra = if asynchronous { PENDING } else { 0 };
        let mask = self.xlat.wired_mask();
        let unlocked = !asynchronous && self.xlat.edits_unlocked(mask);
        for (k, f) in frames.iter().enumerate() {
            self.store.lpt.set(
                first + k as u64,
                PageEntry {
                    pfn: f.pfn(),
                    mem,
                    flags: WIRED | EXTERNAL | extra,
                    ..PageEntry::EMPTY
                },
            );
        }
        // The whole region gets the map's protection (its pages keep their attributes).
        let region = Piece {
            prot,
            attrs: c.rec.attrs,
        };
        self.map
            .update_pieces(region, (first, pages), first, pages, |p| Piece {
                prot,
                ..p
            });
        if unlocked {
            return Ok(Some(self.begin_unlocked_map(c, prot, mask, set, callback)));
        }
        self.put_region(
            c,
            RegionRec {
                prot,
                explicit: true,
                mapped: true,
                set,
                ..c.rec
            },
        );
        if asynchronous {
            self.enqueue_map(cx.counters, &space.arena, first, pages, callback);
        } else if let Err(e) = self.mirror(cx.counters, first, pages, mask) {
            self.discard_pages(cx.counters, first, pages);
            self.put_region(c, c.rec);
            return Err(e.into());
        } else {
            self.xlat.queue.complete_now(callback, Ok(()));
        }
        if let Some(s) = set {
            self.map.join_set(s, c.region);
        }
        Ok(None)
    }

    /// Switching a region to the unique policy: drop every mapping of the pages that
    /// several tables map (remote access allowed it; replicas stay); the next fault
    /// places each page by the new policy.
    pub(crate) fn drop_shared_mappings(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        c: &ResolvedRegion,
    ) {
        self.settle(cx, space, c);
        let replicas = self.xlat.replica_mask();
        let touched: Vec<(Vpn, u32)> = self
            .store
            .lpt
            .entries_in(c.first, c.pages)
            .filter(|(_, e)| !e.has(WIRED) && (e.mapped & !replicas).count_ones() > 1)
            .map(|(v, e)| (v, e.mapped & !replicas))
            .collect();
        self.unmap_entries(cx.counters, &touched);
    }

    /// `region_protect` under the lock: the whole region gets `prot` (its split-off
    /// pieces merge back), all or nothing (see `protect_range`).
    pub(crate) fn protect_region(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        c: &ResolvedRegion,
        prot: Prot,
    ) -> Result<(), MmuError> {
        self.protect_range(cx, space, c, c.first, c.pages, prot)?;
        let rec = RegionRec { prot, ..c.rec };
        self.put_region(c, rec);
        // Every page has `prot` now: pieces that differ from the region only by
        // attributes stay, the others merge back into it.
        self.map
            .update_pieces(rec.piece(), (c.first, c.pages), c.first, c.pages, |p| p);
        Ok(())
    }

    /// `region_unwire` under the lock: [`SpaceState::unwire_range`] of the whole region.
    pub(crate) fn unwire_region(&mut self, cx: &Ctx<'_>, space: &SpaceInner, c: &ResolvedRegion) {
        self.unwire_range(cx, space, c, c.first, c.pages);
    }
}
