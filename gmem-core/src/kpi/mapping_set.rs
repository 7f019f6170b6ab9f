//! KPI: mapping sets (`gm_mapping_set_*`) — regions unmapped together.

use crate::error::{SetError, SpaceError};
use crate::flags::MapFlags;
use crate::gmem::Gmem;
use crate::handle::{MappingSetId, SpaceId};
use crate::queue::Callback;

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
