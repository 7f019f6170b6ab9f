//! KPI: mapping sets (`gm_mapping_set_*`) — regions unmapped together.

use crate::error::{SetError, SpaceError};
use crate::flags::MapFlags;
use crate::gmem::Gmem;
use crate::handle::{MappingSetId, SpaceId};
use crate::space::queue::Callback;

impl Gmem {
    /// Create an empty mapping set in a space.
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle.
    pub fn mapping_set_create(&self, space_id: SpaceId) -> Result<MappingSetId, SpaceError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        let set = space.lock().new_set();
        Ok(set)
    }

    /// Unmap every region of the set; `callback` runs once, when all are unmapped
    /// (`gm_mapping_set_unmap`). The set is empty afterwards.
    ///
    /// # Errors
    /// [`SetError`] for a stale space or set handle; nothing changes then and
    /// `callback` is dropped unrun.
    ///
    /// # Examples
    /// The buffers of one DMA transfer join a set as they are mapped and go together.
    /// ```
    /// # use gmem_core::testing::{TestSystem, HOST_BASE};
    /// # use gmem_core::*;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    ///
    /// let mut sys = TestSystem::new(16);
    /// let nic = sys.add_device(2, DevCaps::empty(), 0, 0);
    /// let nic_id = sys.devices[nic].id;
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(space, nic_id, MmuMode::Coherent, Activation::Switch)?;
    /// let set = gm.mapping_set_create(space)?;
    /// let mut bufs = Vec::new();
    /// for i in 0..3 {
    ///     let r = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE))?;
    ///     let frame = [PhysAddr::new(HOST_BASE + (100 + i) * PAGE_SIZE)];
    ///     gm.region_map(r, MapRequest::new(&frame, gm.host()).in_set(set))?;
    ///     bufs.push(r);
    /// }
    /// let calls = Arc::new(AtomicUsize::new(0));
    /// let seen = calls.clone();
    /// gm.mapping_set_unmap(space, set, MapFlags::empty(), Some(Box::new(move |_| {
    ///     seen.fetch_add(1, Ordering::SeqCst);
    /// })))?;
    /// assert_eq!(calls.load(Ordering::SeqCst), 1, "one callback for the set");
    /// for r in bufs {
    ///     assert!(sys.translate(nic, r.start, Prot::READ).is_err(), "unmapped");
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn mapping_set_unmap(
        &self,
        space_id: SpaceId,
        set: MappingSetId,
        flags: MapFlags,
        callback: Option<Callback>,
    ) -> Result<(), SetError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(SetError::UnknownSpace(space_id))?;
        let mut st = space.lock();
        {
            let regions = st.take_set(set).ok_or(SetError::UnknownSet(set))?;
            let n = regions.len();
            let mut callback = callback;
            for (i, region) in regions.into_iter().enumerate() {
                let cb = if i + 1 == n { callback.take() } else { None };
                // A region deallocated since it joined is no longer in the set; its
                // callback (if it was the last) still runs below.
                match st.checked(region) {
                    Some(c) => st.unmap_region(&self.context(), &space, &c, flags, cb),
                    None => st.complete_now(cb, Ok(())),
                }
            }
            st.complete_now(callback, Ok(()));
        }
        Ok(())
    }

    /// Destroy a mapping set (its regions stay mapped).
    ///
    /// # Errors
    /// [`SetError`] for a stale space or set handle.
    pub fn mapping_set_destroy(
        &self,
        space_id: SpaceId,
        set: MappingSetId,
    ) -> Result<(), SetError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(SetError::UnknownSpace(space_id))?;
        if space.lock().destroy_set(set) {
            Ok(())
        } else {
            Err(SetError::UnknownSet(set))
        }
    }
}
