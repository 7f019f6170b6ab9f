//! KPI: regions (`gm_region_*`) — map, unmap, deallocate, policy, protection, migration, wiring.
//!
//! Every call resolves its [`Region`] handle once, under the space lock
//! (`Gmem::with_region`), and passes the checked record on: the closures get a copy
//! of it with the region's page span and write changes back with
//! `SpaceState::put_region`.

use crate::addr::{PhysAddr, VaRange, VirtAddr, PAGE_SIZE};
use crate::error::{MapError, PolicyError, PopulateError, ProtectError, RegionError};
use crate::flags::{MapFlags, Prot};
use crate::gmem::Gmem;
use crate::handle::{DeviceId, MappingSetId, SpaceId};
use crate::mmu::Attrs;
use crate::space::queue::Callback;
use crate::space::Ctx;
use crate::space::{
    Placement, PlacementMode, PlacementTarget, Region, RegionInfo, RegionRec, ResolvedRegion,
    SpaceInner, SpaceState, TableEdits,
};
use crate::sync::Arc;
use alloc::vec::Vec;

/// What `region_map` maps: caller-given frames, how, and who hears when it is done
/// (`gm_region_map`'s arguments).
pub struct MapRequest<'a> {
    /// Permitted accesses (not empty).
    pub prot: Prot,
    /// One frame per page of the region, in `memory`'s physical address space, outside
    /// the memory the core manages for that device.
    pub frames: &'a [PhysAddr],
    /// The device whose physical address space the frames are in.
    pub memory: DeviceId,
    /// A mapping set the region joins.
    pub set: Option<MappingSetId>,
    /// [`MapFlags::ASYNC`] queues the page-table updates of devices that cannot fault.
    pub flags: MapFlags,
    /// Runs once the mapping is visible to every device that must hold it.
    pub callback: Option<Callback>,
}

impl<'a> MapRequest<'a> {
    /// Map `frames` of `memory` read-write, synchronously, in no set.
    pub fn new(frames: &'a [PhysAddr], memory: DeviceId) -> MapRequest<'a> {
        MapRequest {
            prot: Prot::RW,
            frames,
            memory,
            set: None,
            flags: MapFlags::empty(),
            callback: None,
        }
    }

    /// With protection `prot`.
    pub fn prot(mut self, prot: Prot) -> Self {
        self.prot = prot;
        self
    }

    /// Joining mapping set `set`.
    pub fn in_set(mut self, set: MappingSetId) -> Self {
        self.set = Some(set);
        self
    }

    /// With `flags` (e.g. [`MapFlags::ASYNC`]).
    pub fn flags(mut self, flags: MapFlags) -> Self {
        self.flags = flags;
        self
    }

    /// Calling `callback` when done.
    pub fn callback(mut self, callback: Callback) -> Self {
        self.callback = Some(callback);
        self
    }
}

/// Which pages `region_migrate` moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrateScope {
    /// Only pages that have a frame elsewhere.
    Populated,
    /// Those, and every page without a frame is allocated and zero-filled at the target
    /// (prefetch); a `region_map`ped region has no such pages.
    Prefetch,
}

impl Gmem {
    /// Resolve `region` under its space's lock and run `f` with the checked region.
    pub(crate) fn with_region<R, E: From<RegionError>>(
        &self,
        region: Region,
        f: impl FnOnce(&Ctx<'_>, &Arc<SpaceInner>, &mut SpaceState, ResolvedRegion) -> Result<R, E>,
    ) -> Result<R, E> {
        let space = self
            .space(region.space)
            .ok_or(RegionError::UnknownSpace(region.space))?;
        let mut st = space.lock();
        let mut rec = *st.region(region).ok_or(RegionError::StaleRegion(region))?;
        // A region whose pages are being mapped outside the lock (by another thread:
        // a caller race) is waited for, so that no two edits of its range overlap.
        while rec.busy {
            drop(st);
            crate::sync::spin_wait();
            st = space.lock();
            rec = *st.region(region).ok_or(RegionError::StaleRegion(region))?;
        }
        let (first, pages) = SpaceState::pages_of(region.start.as_u64(), rec.len);
        let checked = ResolvedRegion {
            region,
            rec,
            first,
            pages,
        };
        f(&self.context(), &space, &mut st, checked)
    }

    /// Describe a region.
    ///
    /// # Errors
    /// [`RegionError`] for a stale handle or a destroyed space.
    pub fn region_info(&self, region: Region) -> Result<RegionInfo, RegionError> {
        let _critical = self.critical();
        self.with_region(region, |_, _, _, c| {
            Ok(info(region.space, region.start.as_u64(), &c.rec))
        })
    }

    /// Free a region, unmapping it first (`gm_region_dealloc`). With
    /// [`MapFlags::ASYNC`] the range returns to the arena only after the queued
    /// invalidation, and `callback` says when.
    ///
    /// # Errors
    /// [`RegionError`] for a stale handle (a double free) or a destroyed space; nothing
    /// changes then and `callback` is dropped unrun.
    ///
    /// # Examples
    /// Strict: when the call returns, no TLB translates the region and its frames are
    /// free.
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// let sys = TestSystem::new(16);
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)?;
    /// let r = gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))?;
    /// sys.write(0, r.start, b"x").unwrap();
    /// assert!(sys.host().mmu.translate(r.start).is_some());
    /// gm.region_dealloc(r, MapFlags::empty(), None)?;
    /// assert_eq!(sys.host().mmu.translate(r.start), None);
    /// assert_eq!(gm.dev_frames(gm.host())?.free, 16);
    /// assert_eq!(gm.region_dealloc(r, MapFlags::empty(), None), Err(RegionError::StaleRegion(r)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    /// Asynchronous: the range and the frames wait in the space's queue for one
    /// batched invalidation; the callback says when they are released.
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// let sys = TestSystem::new(16);
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)?;
    /// let r = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE))?;
    /// sys.write(0, r.start, b"x").unwrap();
    /// let released = Arc::new(AtomicUsize::new(0));
    /// let seen = released.clone();
    /// let callback: Callback = Box::new(move |result| {
    ///     assert!(result.is_ok());
    ///     seen.fetch_add(1, Ordering::SeqCst);
    /// });
    /// gm.region_dealloc(r, MapFlags::ASYNC, Some(callback))?;
    /// // Gone from the space at once; the frame is quarantined until the invalidation.
    /// assert!(gm.as_lookup(space, r.start).is_err());
    /// assert_eq!(gm.dev_frames(gm.host())?.pending, 1);
    /// assert_eq!(released.load(Ordering::SeqCst), 0);
    /// gm.as_synchronize(space)?;
    /// assert_eq!(released.load(Ordering::SeqCst), 1);
    /// assert_eq!(gm.dev_frames(gm.host())?.free, 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn region_dealloc(
        &self,
        region: Region,
        flags: MapFlags,
        callback: Option<Callback>,
    ) -> Result<(), RegionError> {
        let _critical = self.critical();
        let pending = self.with_region(region, |cx, space, st, c| {
            st.settle(cx, space, &c);
            st.remove_region(&c);
            let va = Some((c.rec.reserve_start, c.rec.reserve_len));
            if flags.contains(MapFlags::ASYNC) {
                let d =
                    st.discard_pages_deferred(cx.counters, c.first, c.pages, TableEdits::UnderLock);
                st.enqueue_unmap(cx.counters, &space.arena, d, va, callback);
                Ok::<_, RegionError>(None)
            } else {
                // Tables that take concurrent edits are unmapped outside the lock too.
                let d = st.discard_pages_deferred(
                    cx.counters,
                    c.first,
                    c.pages,
                    TableEdits::Deferrable,
                );
                Ok(st.defer_invalidation(space, d, va, callback))
            }
        })?;
        // Strict: the invalidation completes before this returns, but without the
        // space lock, so other threads' calls on the space go on meanwhile.
        if let Some(p) = pending {
            p.complete(&self.counters);
        }
        Ok(())
    }

    /// Map the region onto caller-given frames, wired (`gm_region_map`; the bus_dma
    /// case). Frames must lie outside the memory the core manages for their device
    /// (they stay the caller's). Devices that cannot fault and replicate-mode tables get
    /// the mapping eagerly (at once, or when the queue drains with
    /// [`MapFlags::ASYNC`]); faultable devices get it on fault.
    ///
    /// # Errors
    /// [`MapError`]: a bad handle, device, protection, frame count or frame, a region
    /// already mapped or populated, an unknown set, or a driver failure. Every check
    /// comes before the first change (the queue is not even drained), and a driver
    /// failure removes what was mapped; the callback of a failed call is dropped unrun.
    ///
    /// # Examples
    /// A NIC behind an IOMMU cannot fault: the region's DMA mapping onto two buffer
    /// frames the kernel owns is installed in its table at once.
    /// ```
    /// # use gmem_core::testing::{TestSystem, HOST_BASE};
    /// # use gmem_core::*;
    /// let mut sys = TestSystem::new(16);
    /// let nic = sys.add_device(2, DevCaps::empty(), 0, 0);
    /// let nic_id = sys.devices[nic].id;
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(space, nic_id, MmuMode::Coherent, Activation::Switch)?;
    /// let ring = gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))?;
    /// // Host RAM past what the core manages (16 pages from HOST_BASE).
    /// let frames = [PhysAddr::new(HOST_BASE + 100 * PAGE_SIZE), PhysAddr::new(HOST_BASE + 101 * PAGE_SIZE)];
    /// gm.region_map(ring, MapRequest::new(&frames, gm.host()).prot(Prot::READ))?;
    /// let second = VirtAddr::new(ring.start.as_u64() + PAGE_SIZE);
    /// let pte = sys.translate(nic, second, Prot::READ).unwrap();
    /// assert_eq!((pte.pfn, pte.prot), (frames[1].pfn().0, Prot::READ));
    /// assert!(gm.region_info(ring)?.mapped);
    /// // One frame per page.
    /// let other = gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))?;
    /// let short = gm.region_map(other, MapRequest::new(&frames[..1], gm.host()));
    /// assert_eq!(short, Err(MapError::FrameCount { expected: 2, given: 1 }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn region_map(&self, region: Region, req: MapRequest<'_>) -> Result<(), MapError> {
        let _critical = self.critical();
        let MapRequest {
            prot,
            frames,
            memory,
            set,
            flags,
            callback,
        } = req;
        let memdev = self.device(memory).ok_or(MapError::UnknownDevice(memory))?;
        let space = self
            .space(region.space)
            .ok_or(RegionError::UnknownSpace(region.space))?;
        let unlocked = self.with_region(region, |cx, space, st, c| {
            let req = crate::space::MapFrames {
                memdev: &memdev,
                prot,
                frames,
                set,
                flags,
                callback,
            };
            st.map_frames(cx, space, &c, req)
        })?;
        let Some(edit) = unlocked else {
            return Ok(());
        };
        // The tables take concurrent edits of disjoint ranges: map without the lock,
        // so that other regions of the space are mapped and unmapped meanwhile.
        let edited = edit.edit(&self.counters);
        let mut st = space.lock();
        edit.finish(&mut st, &self.counters, edited)
    }

    /// `region_unmap` of one region (the whole of it)
    pub(crate) fn unmap_whole(
        &self,
        region: Region,
        flags: MapFlags,
        callback: Option<Callback>,
    ) -> Result<(), RegionError> {
        self.with_region(region, |cx, space, st, c| {
            st.unmap_region(cx, space, &c, flags, callback);
            Ok(())
        })
    }

    /// Set the placement policy of a region (`gm_region_set_policy`). Switching to the
    /// unique policy drops the mappings of pages that several tables map (remote
    /// access allowed it); they fault back in under the new policy.
    ///
    /// # Errors
    /// [`PolicyError`]: a bad handle, or a target device that is gone or has no memory.
    ///
    /// # Examples
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// let mut sys = TestSystem::new(16);
    /// let gpu = sys.add_device(2, DevCaps::FAULTABLE, 0x8000_0000, 32);
    /// let gpu = sys.devices[gpu].id;
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)?;
    /// let r = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE))?;
    /// // The CPU fills it, but the pages belong in the GPU's memory, read remotely.
    /// let placement = Placement { target: PlacementTarget::Device(gpu), mode: PlacementMode::RemoteAccess };
    /// gm.region_set_policy(r, placement)?;
    /// assert_eq!(gm.region_info(r)?.placement, placement);
    /// sys.write(0, r.start, b"weights").unwrap();
    /// assert_eq!(gm.as_page_frame(space, r.start)?.map(|(memory, _)| memory), Some(gpu));
    /// gm.region_dealloc(r, MapFlags::empty(), None)?;
    /// let stale = gm.region_set_policy(r, Placement::default());
    /// assert_eq!(stale, Err(PolicyError::Region(RegionError::StaleRegion(r))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn region_set_policy(
        &self,
        region: Region,
        placement: Placement,
    ) -> Result<(), PolicyError> {
        let _critical = self.critical();
        if let PlacementTarget::Device(d) = placement.target {
            let dev = self.device(d).ok_or(PolicyError::UnknownDevice(d))?;
            if !dev.has_memory() {
                return Err(PolicyError::NoMemory(d));
            }
        }
        self.with_region(region, |cx, space, st, c| {
            if placement.mode == PlacementMode::Unique && c.rec.placement.mode != placement.mode {
                st.drop_shared_mappings(cx, space, &c);
            }
            st.put_region(&c, RegionRec { placement, ..c.rec });
            Ok(())
        })
    }

    /// Set the zero-fill block size of a region: one fault allocates, zeroes and maps a
    /// naturally aligned block of this many bytes (bulk zeroing). 0 = the faulting
    /// device's largest page size up to 2 MiB.
    ///
    /// # Errors
    /// [`PolicyError::BadZeroFillBlock`] unless `bytes` is 0 or a power of two in
    /// 4 KiB..=1 GiB; [`PolicyError::Region`] for a bad handle.
    pub fn region_set_zero_fill_block(
        &self,
        region: Region,
        bytes: u64,
    ) -> Result<(), PolicyError> {
        let _critical = self.critical();
        if bytes != 0 && (!bytes.is_power_of_two() || !(PAGE_SIZE..=1 << 30).contains(&bytes)) {
            return Err(PolicyError::BadZeroFillBlock(bytes));
        }
        self.with_region(region, |_, _, st, c| {
            st.put_region(
                &c,
                RegionRec {
                    zero_fill_block: bytes,
                    ..c.rec
                },
            );
            Ok(())
        })
    }

    /// `region_protect` of one region (the whole of it)
    pub(crate) fn protect_whole(&self, region: Region, prot: Prot) -> Result<(), ProtectError> {
        if !Prot::RWX.contains(prot) {
            return Err(ProtectError::BadProt(prot));
        }
        self.with_region(region, |cx, space, st, c| {
            Ok(st.protect_region(cx, space, &c, prot)?)
        })
    }

    /// `region_protect_range` of `range`, inside one region
    pub(crate) fn protect_piece(
        &self,
        region: Region,
        range: VaRange,
        prot: Prot,
    ) -> Result<(), ProtectError> {
        if !Prot::RWX.contains(prot) {
            return Err(ProtectError::BadProt(prot));
        }
        self.with_region(region, |cx, space, st, c| {
            let (first, pages) = c.range(range)?;
            Ok(st.protect_range(cx, space, &c, first, pages, prot)?)
        })
    }

    /// `region_unmap_range` of `range`, inside one region
    pub(crate) fn unmap_piece(
        &self,
        region: Region,
        range: VaRange,
        flags: MapFlags,
        callback: Option<Callback>,
    ) -> Result<(), RegionError> {
        self.with_region(region, |cx, space, st, c| {
            let (first, pages) = c.range(range)?;
            st.unmap_range(
                cx,
                space,
                &c,
                crate::space::PageSpan { first, pages },
                flags,
                callback,
            );
            Ok(())
        })
    }

    /// `region_set_attrs` of one region (the whole of it)
    pub(crate) fn set_attrs_whole(&self, region: Region, attrs: Attrs) -> Result<(), ProtectError> {
        self.with_region(region, |cx, space, st, c| {
            Ok(st.set_attrs(
                cx,
                space,
                &c,
                crate::space::PageSpan::whole(&c),
                attrs,
                true,
            )?)
        })
    }

    /// `region_set_attrs_range` of `range`, inside one region
    pub(crate) fn set_attrs_piece(
        &self,
        region: Region,
        range: VaRange,
        attrs: Attrs,
    ) -> Result<(), ProtectError> {
        self.with_region(region, |cx, space, st, c| {
            let (first, pages) = c.range(range)?;
            Ok(st.set_attrs(
                cx,
                space,
                &c,
                crate::space::PageSpan { first, pages },
                attrs,
                false,
            )?)
        })
    }

    /// `region_migrate` of `range` (the whole region for `None`).
    pub(crate) fn migrate_pages(
        &self,
        region: Region,
        range: Option<VaRange>,
        target: DeviceId,
        scope: MigrateScope,
    ) -> Result<u64, PopulateError> {
        let dev = self
            .device(target)
            .ok_or(PopulateError::UnknownDevice(target))?;
        let dest = if dev.has_memory() {
            dev
        } else {
            self.host.clone()
        };
        self.with_region(region, |cx, space, st, c| {
            let (first, pages) = match range {
                Some(r) => c.range(r)?,
                None => (c.first, c.pages),
            };
            let prefetch = scope == MigrateScope::Prefetch && !c.rec.explicit;
            Ok(st.migrate_range(cx, space, first, pages, &dest, prefetch)?)
        })
    }

    /// Give every page of a region a *private frame* in `dev`'s memory: zeroed, wired,
    /// mapped at the same address in `dev`'s table only, while the other devices (the
    /// CPU) keep the page's shared frame — one pointer, two copies, for a device that
    /// cannot fault (ADSM/GMAC: its runtime moves the bytes between the copies, through
    /// [`Gmem::as_private_frame`]). Pages that have one keep it. The frames go when the
    /// pages are unmapped or deallocated, when the device detaches, or on
    /// [`Gmem::region_free_private`]. Returns the pages newly given one.
    ///
    /// # Errors
    /// [`PopulateError`]: a bad handle or device, [`PopulateError::NotAttached`],
    /// [`PopulateError::CannotHoldPrivate`], the device's memory full (nothing is
    /// evicted for a private frame) or a driver failure; no frame of this call is then
    /// left.
    pub fn region_alloc_private(
        &self,
        region: Region,
        dev: DeviceId,
    ) -> Result<u64, PopulateError> {
        let _critical = self.critical();
        let d = self.device(dev).ok_or(PopulateError::UnknownDevice(dev))?;
        self.with_region(region, |cx, space, st, c| {
            let slot = st.private_slot(&d).map_err(|r| match r {
                crate::space::PrivateRefusal::NotAttached => PopulateError::NotAttached(dev),
                _ => PopulateError::CannotHoldPrivate(dev),
            })?;
            Ok(st.alloc_private(cx, space, &c, crate::space::PageSpan::whole(&c), slot, &d)?)
        })
    }

    /// Take back the private frames `dev` has for a region's pages (see
    /// [`Gmem::region_alloc_private`]): unmapped, invalidated, freed; the device's table
    /// gets the shared frames again where it must hold them. Returns how many there
    /// were.
    ///
    /// # Errors
    /// [`PopulateError`]: a bad handle or device, [`PopulateError::NotAttached`].
    pub fn region_free_private(&self, region: Region, dev: DeviceId) -> Result<u64, PopulateError> {
        let _critical = self.critical();
        self.device(dev).ok_or(PopulateError::UnknownDevice(dev))?;
        self.with_region(region, |cx, _, st, c| {
            let slot = st.slot_of(dev).ok_or(PopulateError::NotAttached(dev))?;
            let which: Vec<_> = st
                .private_in(c.first, c.pages)
                .into_iter()
                .filter(|&(s, _)| s == slot)
                .collect();
            Ok(st.free_private(cx.counters, &which))
        })
    }

    /// `region_wire_range` of `range`, inside one region
    pub(crate) fn wire_piece(&self, region: Region, range: VaRange) -> Result<u64, PopulateError> {
        self.with_region(region, |cx, space, st, c| {
            let (first, pages) = c.range(range)?;
            if c.rec.explicit {
                return Ok(0);
            }
            let target = c.rec.placement.target;
            Ok(st.wire_range(cx, space, first, pages, target)?)
        })
    }

    /// `region_unwire_range` of `range`, inside one region
    pub(crate) fn unwire_piece(&self, region: Region, range: VaRange) -> Result<(), RegionError> {
        self.with_region(region, |cx, space, st, c| {
            let (first, pages) = c.range(range)?;
            st.unwire_range(cx, space, &c, first, pages);
            Ok(())
        })
    }

    /// `region_wire` of one region (the whole of it)
    pub(crate) fn wire_whole(&self, region: Region) -> Result<u64, PopulateError> {
        self.with_region(region, |cx, space, st, c| {
            if c.rec.explicit {
                return Ok(0);
            }
            let target = c.rec.placement.target;
            Ok(st.wire_range(cx, space, c.first, c.pages, target)?)
        })
    }

    /// `region_unwire` of one region (the whole of it)
    pub(crate) fn unwire_whole(&self, region: Region) -> Result<(), RegionError> {
        self.with_region(region, |cx, space, st, c| {
            st.unwire_region(cx, space, &c);
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
        zero_fill_block: r.zero_fill_block,
        mapped: r.mapped,
        attrs: r.attrs,
    }
}
