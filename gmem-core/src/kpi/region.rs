//! KPI: regions (`gm_region_*`) — map, unmap, deallocate, policy, protection, migration, wiring.

use crate::addr::{PhysAddr, VaRange, VirtAddr, PAGE_SIZE};
use crate::error::{FaultError, RegionError};
use crate::flags::{MapFlags, Prot};
use crate::gmem::{Ctx, Gmem};
use crate::handle::{DeviceId, MappingSetId, SpaceId};
use crate::lpt::{PageEntry, EXTERNAL, PENDING, WIRED};
use crate::queue::Callback;
use crate::space::{
    Placement, PlacementMode, PlacementTarget, Region, RegionInfo, RegionRec, SpaceInner,
    SpaceState,
};
use alloc::vec::Vec;

impl Gmem {
    // ----- regions -------------------------------------------------------------------

    fn with_region<R>(
        &self,
        region: Region,
        f: impl FnOnce(&Ctx<'_>, &SpaceInner, &mut SpaceState) -> Result<R, RegionError>,
    ) -> Result<R, RegionError> {
        let space = self
            .space(region.space)
            .ok_or(RegionError::UnknownSpace(region.space))?;
        let mut st = space.lock();
        if st.region(region).is_none() {
            return Err(RegionError::StaleRegion(region));
        }
        f(&self.context(), &space, &mut st)
    }

    /// [`Gmem::with_region`] for the calls that move or prepare pages and so answer with
    /// a [`FaultError`]; `f` also gets the region's pages `(first, count)`.
    fn with_region_faulting<R>(
        &self,
        region: Region,
        f: impl FnOnce(&Ctx<'_>, &SpaceInner, &mut SpaceState, u64, u64) -> Result<R, FaultError>,
    ) -> Result<R, FaultError> {
        let space = self
            .space(region.space)
            .ok_or(FaultError::NotAllocated(region.start))?;
        let mut st = space.lock();
        let Some(rec) = st.region(region) else {
            return Err(FaultError::NotAllocated(region.start));
        };
        let (first, pages) = SpaceState::pages_of(region.start.as_u64(), rec.len);
        f(&self.context(), &space, &mut st, first, pages)
    }

    /// Describe a region.
    pub fn region_info(&self, region: Region) -> Result<RegionInfo, RegionError> {
        self.with_region(region, |_, _, st| {
            let r = st.region(region).expect("checked");
            Ok(info(region.space, region.start.as_u64(), r))
        })
    }

    /// Free a region, unmapping it first (`gm_region_dealloc`). With
    /// [`MapFlags::ASYNC`] the range returns to the arena only after the queued
    /// invalidation, and `callback` says when.
    pub fn region_dealloc(
        &self,
        region: Region,
        flags: MapFlags,
        callback: Option<Callback>,
    ) -> Result<(), RegionError> {
        self.with_region(region, |cx, space, st| {
            let start = region.start.as_u64();
            let (first, pages) = st.settle(cx, space, region);
            let rec = st.regions.remove(&start).expect("checked");
            if let Some(set) = rec.set {
                if let Some(s) = st.sets.get_mut(set.index, set.generation) {
                    s.regions.retain(|r| *r != region);
                }
            }
            if flags.contains(MapFlags::ASYNC) {
                let d = st.discard_pages(cx.counters, first, pages, true);
                st.enqueue_unmap(
                    cx.counters,
                    &space.arena,
                    d,
                    Some((rec.reserve_start, rec.reserve_len)),
                    callback,
                );
            } else {
                st.discard_pages(cx.counters, first, pages, false);
                let freed = space.arena.free(rec.reserve_start, rec.reserve_len);
                debug_assert!(freed.is_ok(), "region range release failed: {freed:?}");
                st.queue.complete_now(callback, Ok(()));
            }
            Ok(())
        })
    }

    /// Map the region onto caller-given frames of `memory`'s address space, wired
    /// (`gm_region_map`; the bus_dma case). Frames must lie outside the memory the core
    /// manages for that device (they stay the caller's). Devices that cannot fault and
    /// replicate-mode tables get the mapping eagerly; faultable devices get it on fault.
    #[allow(clippy::too_many_arguments)]
    pub fn region_map(
        &self,
        region: Region,
        prot: Prot,
        frames: &[PhysAddr],
        memory: DeviceId,
        set: Option<MappingSetId>,
        flags: MapFlags,
        callback: Option<Callback>,
    ) -> Result<(), RegionError> {
        let memdev = self
            .device(memory)
            .ok_or(RegionError::UnknownDevice(memory))?;
        self.with_region(region, |cx, space, st| {
            let start = region.start.as_u64();
            let (len, already) = {
                let r = st.region(region).expect("checked");
                (r.len, r.mapped)
            };
            let (first, pages) = SpaceState::pages_of(start, len);
            if prot.is_empty() {
                return Err(RegionError::BadProt(prot));
            }
            if frames.len() as u64 != pages {
                return Err(RegionError::FrameCount {
                    expected: pages,
                    given: frames.len() as u64,
                });
            }
            if let Some(s) = set {
                if st.sets.get(s.index, s.generation).is_none() {
                    return Err(RegionError::UnknownSet(s));
                }
            }
            {
                let phys = memdev.phys.lock();
                for f in frames {
                    if !f.is_page_aligned() || phys.contains(f.pfn().0) {
                        return Err(RegionError::BadFrame(*f));
                    }
                }
            }
            // A populated entry (a queued map's included) makes this a misuse, found
            // before anything changes; a queued unmap leaves no populated entry.
            if already
                || st
                    .lpt
                    .entries_in(first, pages)
                    .any(|(_, e)| e.is_populated())
            {
                return Err(RegionError::AlreadyMapped);
            }
            if st.any_pending(first, pages) {
                st.drain(cx.counters, &space.arena);
            }
            let asynchronous = flags.contains(MapFlags::ASYNC);
            let mem = st
                .mem_index(&memdev)
                .map_err(|_| RegionError::TooManyMemories(memory))?;
            let extra = if asynchronous { PENDING } else { 0 };
            for (k, f) in frames.iter().enumerate() {
                st.lpt.set(
                    first + k as u64,
                    PageEntry {
                        pfn: f.pfn().0,
                        mem,
                        flags: WIRED | EXTERNAL | extra,
                        ..PageEntry::EMPTY
                    },
                );
            }
            let old = {
                let r = st.region_mut(region).expect("checked");
                let old = (r.prot, r.explicit, r.set);
                r.prot = prot;
                r.explicit = true;
                r.mapped = true;
                r.set = set;
                old
            };
            let mask = st.wired_mask();
            if asynchronous {
                st.enqueue_map(cx.counters, &space.arena, first, pages, callback);
            } else if let Err(e) = st.mirror(cx.counters, first, pages, mask) {
                st.discard_pages(cx.counters, first, pages, false);
                let r = st.region_mut(region).expect("checked");
                (r.prot, r.explicit, r.set) = old;
                r.mapped = false;
                return Err(e.into());
            } else {
                st.queue.complete_now(callback, Ok(()));
            }
            if let Some(s) = set {
                st.sets
                    .get_mut(s.index, s.generation)
                    .expect("checked")
                    .regions
                    .push(region);
            }
            Ok(())
        })
    }

    /// Unmap the region (`gm_region_unmap`). A `region_map`ped region then holds nothing
    /// (faults on it fail with `NotMapped`) until mapped again; an anonymous region loses
    /// its pages (they are zero-filled again on the next fault).
    pub fn region_unmap(
        &self,
        region: Region,
        flags: MapFlags,
        callback: Option<Callback>,
    ) -> Result<(), RegionError> {
        self.with_region(region, |cx, space, st| {
            st.unmap_region(cx, space, region, flags, callback);
            Ok(())
        })
    }

    /// Set the placement policy of a region (`gm_region_set_policy`). Switching to the
    /// unique policy drops the mappings of pages that several tables map (remote
    /// access allowed it); they fault back in under the new policy.
    pub fn region_set_policy(
        &self,
        region: Region,
        placement: Placement,
    ) -> Result<(), RegionError> {
        if let PlacementTarget::Device(d) = placement.target {
            let dev = self.device(d).ok_or(RegionError::UnknownDevice(d))?;
            if !dev.has_memory() {
                return Err(RegionError::NoMemory(d));
            }
        }
        self.with_region(region, |cx, space, st| {
            let was = st.region(region).expect("checked").placement.mode;
            if placement.mode == PlacementMode::Unique && was != PlacementMode::Unique {
                // Remote access let several tables map one frame; unique allows one.
                // Drop every mapping of such pages (replicas stay): the next fault
                // places each page by the new policy.
                let (first, pages) = st.settle(cx, space, region);
                let replicas = st.replica_mask();
                let touched: Vec<(u64, u32)> = st
                    .lpt
                    .entries_in(first, pages)
                    .filter(|(_, e)| !e.has(WIRED) && (e.mapped & !replicas).count_ones() > 1)
                    .map(|(v, e)| (v, e.mapped & !replicas))
                    .collect();
                st.unmap_entries(cx.counters, &touched, false);
            }
            st.region_mut(region).expect("checked").placement = placement;
            Ok(())
        })
    }

    /// Set the preparation granularity of a region: one fault allocates, zeroes and maps
    /// a naturally aligned block of this many bytes (bulk zeroing). 0 = the faulting
    /// device's largest page size up to 2 MiB.
    pub fn region_set_granularity(&self, region: Region, bytes: u64) -> Result<(), RegionError> {
        if bytes != 0 && (!bytes.is_power_of_two() || !(PAGE_SIZE..=1 << 30).contains(&bytes)) {
            return Err(RegionError::BadGranularity(bytes));
        }
        self.with_region(region, |_, _, st| {
            st.region_mut(region).expect("checked").granularity = bytes;
            Ok(())
        })
    }

    /// Change the protection of a region; every page table that maps its pages is
    /// updated and the TLBs invalidated before this returns.
    pub fn region_protect(&self, region: Region, prot: Prot) -> Result<(), RegionError> {
        if prot.is_empty() {
            return Err(RegionError::BadProt(prot));
        }
        self.with_region(region, |cx, space, st| {
            let (first, pages) = st.settle(cx, space, region);
            let touched: Vec<(u64, u32)> = st
                .lpt
                .entries_in(first, pages)
                .filter(|(_, e)| e.mapped != 0)
                .map(|(v, e)| (v, e.mapped))
                .collect();
            let runs = crate::space::table_runs(&touched);
            let old = st.region(region).map_or(prot, |r| r.prot);
            st.protect_runs(cx.counters, &runs, prot, old)?;
            if let Some(r) = st.region_mut(region) {
                r.prot = prot;
            }
            Ok(())
        })
    }

    /// Move every page of the region that has a frame to `target`'s memory (and with
    /// `prefetch`, allocate and zero-fill the pages that have none there). Wired pages
    /// stay. Returns the number of pages moved or prepared.
    pub fn region_migrate(
        &self,
        region: Region,
        target: DeviceId,
        prefetch: bool,
    ) -> Result<u64, FaultError> {
        let dev = self
            .device(target)
            .ok_or(FaultError::UnknownDevice(target))?;
        let dest = if dev.has_memory() {
            dev
        } else {
            self.host.clone()
        };
        self.with_region_faulting(region, |cx, space, st, first, pages| {
            let prefetch = prefetch && !st.region(region).expect("checked").explicit;
            st.migrate_range(cx, space, first, pages, &dest, prefetch)
        })
    }

    /// Wire the region (the host VM's `mlock`, or a KVM guest whose pass-through device
    /// cannot fault): every page gets a frame — zero-filled at the region's placement
    /// target, host memory when that is "the faulting device" — and is pinned on its
    /// memory's wired queue (never migrated, never evicted), and mapped at once in the
    /// tables of every device that cannot fault. Returns the pages newly wired. On error
    /// no page of the region is left wired by this call.
    pub fn region_wire(&self, region: Region) -> Result<u64, FaultError> {
        self.with_region_faulting(region, |cx, space, st, first, pages| {
            let rec = st.region(region).expect("checked");
            let (placement, explicit) = (rec.placement.target, rec.explicit);
            if explicit {
                Ok(0)
            } else {
                st.wire_range(cx, space, first, pages, placement)
            }
        })
    }

    /// Undo [`Gmem::region_wire`]: the pages may migrate and be evicted again; every
    /// mapping of them except replicate-mode mirrors is removed (devices that cannot
    /// fault lose them; the others fault them back under the region's policy). Caller-given frames
    /// (`region_map`) stay wired.
    pub fn region_unwire(&self, region: Region) -> Result<(), RegionError> {
        self.with_region(region, |cx, space, st| {
            let (first, pages) = st.settle(cx, space, region);
            let wired: Vec<(u64, PageEntry)> = st
                .lpt
                .entries_in(first, pages)
                .filter(|(_, e)| e.has(WIRED) && !e.has(EXTERNAL))
                .collect();
            // Every mapping but the replicas goes: the next fault places the page by the
            // region's policy again (a wired page may be mapped by several tables).
            let mask = !st.replica_mask();
            let touched: Vec<(u64, u32)> = wired
                .iter()
                .filter(|(_, e)| e.mapped & mask != 0)
                .map(|(v, e)| (*v, e.mapped & mask))
                .collect();
            st.unmap_entries(cx.counters, &touched, false);
            for (v, _) in wired {
                st.set_page_wired(v, false);
            }
            Ok(())
        })
    }
}

/// The public description of region record `r` starting at `start`.
pub(crate) fn info(space: SpaceId, start: u64, r: &RegionRec) -> RegionInfo {
    RegionInfo {
        region: Region {
            space,
            start: VirtAddr::new(start),
            id: r.id,
        },
        range: VaRange {
            start: VirtAddr::new(start),
            len: r.len,
        },
        prot: r.prot,
        placement: r.placement,
        granularity: r.granularity,
        mapped: r.mapped,
    }
}
