//! KPI: large pages and superpage reservations — `region_promote`, `as_large_leaves`,
//! `as_frames`, `dev_set_reservations`, `dev_reservations` — and `region_protect`
//! (protection of part of a region, which splits large leaves).
//!
//! The mechanism is in `space::large` (when a leaf is large, splits, promotion) and
//! `physmem::reserve` (reservations); these calls expose it.

use crate::addr::{PhysAddr, VaRange, VirtAddr, Vpn, PAGE_SHIFT};
use crate::error::{DeviceError, PopulateError, SpaceError};
use crate::gmem::Gmem;
use crate::handle::{DeviceId, SpaceId};
use crate::physmem::ReservationStats;
use crate::space::{LargeLeaf, Region, SpaceState};

impl Gmem {
    /// Promote the region's 2 MiB blocks (khugepaged's collapse): every naturally
    /// aligned 2 MiB block inside the region whose pages all have frames (none wired,
    /// caller-given or with a queued request) is gathered onto one aligned block of
    /// frames in the memory of its first page — the block's reservation there when it
    /// has one, a fresh aligned block otherwise — copying the pages not there yet, and
    /// remapped with large leaves in the tables that mapped it (all of them under remote
    /// access; under the unique policy only when a single table mapped it, the others
    /// fault it back) and in replicate tables. Blocks already contiguous and mapped
    /// large stay as they are. Returns the blocks promoted.
    ///
    /// # Errors
    /// [`PopulateError`]: a bad handle, no aligned free block in the memory
    /// (`OutOfMemory`: nothing of that block changed but its mappings, which fault back),
    /// or a driver or data-mover failure. Blocks promoted before the failure stay
    /// promoted; the failing block's pages are each whole and consistent.
    ///
    /// # Examples
    /// One store fault fills a 2 MiB block and maps it with one large leaf; a range
    /// protect splits it; once the protection is whole again, promotion maps it large
    /// again.
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// let sys = TestSystem::with_host_sizes(1024, PageSizes::S4K | PageSizes::S2M);
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)?;
    /// let r = gm.as_alloc(space, AllocRequest { align: 2 << 20, ..AllocRequest::new(2 << 20) })?;
    /// let served = gm.dev_fault(gm.host(), r.start, Prot::WRITE)?;
    /// assert_eq!((served.kind, served.pages), (FaultKind::ZeroFill, 512));
    /// let leaves = gm.as_large_leaves(space)?;
    /// assert_eq!((leaves.len(), leaves[0].size), (1, PageSize::Size2M));
    ///
    /// let one = VaRange::new(r.start, PAGE_SIZE)?;
    /// gm.region_protect(Pages::range(r.space, one), Prot::READ)?; // the leaf splits
    /// assert!(gm.as_large_leaves(space)?.is_empty());
    /// gm.region_protect(Pages::range(r.space, one), Prot::RW)?; // one protection again
    /// assert_eq!(gm.region_promote(r)?, 1);
    /// assert_eq!(gm.as_large_leaves(space)?.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn region_promote(&self, region: Region) -> Result<u64, PopulateError> {
        let _critical = self.critical();
        let space = self.space(region.space).ok_or(PopulateError::Region(
            crate::RegionError::UnknownSpace(region.space),
        ))?;
        let mut st = space.lock();
        let rec =
            *st.region(region)
                .ok_or(PopulateError::Region(crate::RegionError::StaleRegion(
                    region,
                )))?;
        if rec.explicit {
            return Ok(0);
        }
        let (first, pages) = SpaceState::pages_of(region.start.as_u64(), rec.len);
        Ok(st.promote_range(&self.context(), &space, first, pages)?)
    }

    /// The large leaves the core has asked the drivers of the space's page tables to
    /// hold, by table root, in address order per table.
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle.
    pub fn as_large_leaves(
        &self,
        space_id: SpaceId,
    ) -> Result<alloc::vec::Vec<LargeLeaf>, SpaceError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        let st = space.lock();
        Ok(st.large_leaves())
    }

    /// Call `f(va, memory, pa)` for every page of `range` that has a frame, in address
    /// order: the device whose memory holds the frame, and its physical address (what
    /// contiguity measurements read). `f` runs under the space's lock and must not call
    /// the KPI.
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle.
    pub fn as_frames(
        &self,
        space_id: SpaceId,
        range: VaRange,
        mut f: impl FnMut(VirtAddr, DeviceId, PhysAddr),
    ) -> Result<(), SpaceError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        let st = space.lock();
        st.frames_in(
            Vpn(range.start.as_u64() >> PAGE_SHIFT),
            range.len >> PAGE_SHIFT,
            &mut f,
        );
        Ok(())
    }

    /// Enable (the default) or disable superpage reservations in the device's memory:
    /// with them, the first single-page allocation in an aligned 2 MiB virtual block
    /// reserves an aligned 2 MiB physical block that serves the block's later pages
    /// (faults, migrations, evictions back). Disabling breaks every live reservation.
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`] for a stale handle.
    pub fn dev_set_reservations(&self, id: DeviceId, enabled: bool) -> Result<(), DeviceError> {
        let _critical = self.critical();
        let dev = self.device(id).ok_or(DeviceError::UnknownDevice(id))?;
        dev.phys.lock().set_reservations(enabled);
        Ok(())
    }

    /// The reservation counters of the device's memory.
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`] for a stale handle.
    pub fn dev_reservations(&self, id: DeviceId) -> Result<ReservationStats, DeviceError> {
        let _critical = self.critical();
        let dev = self.device(id).ok_or(DeviceError::UnknownDevice(id))?;
        let s = dev.phys.lock().reservation_stats();
        Ok(s)
    }
}
