//! What the fault path and the space operations need of the instance ([`Ctx`]): the
//! counters, the host device and read access to the registries — handed down by the
//! instance (`crate::gmem`), so that nothing in `space` reaches up for it.

use crate::device::DeviceInner;
use crate::handle::{DeviceId, Slots, SpaceId};
use crate::platform::Platform;
use crate::space::SpaceInner;
use crate::stats::Counters;
use crate::sync::{Arc, RwLock};

/// What the fault path and the space operations need of the instance: the counters,
/// the host device and read access to the registries (leaf locks, see
/// [`crate::sync`]).
pub(crate) struct Ctx<'a> {
    pub counters: &'a Counters,
    /// The platform (its clock, for the policies that measure time).
    pub platform: &'a dyn Platform,
    pub host: &'a Arc<DeviceInner>,
    devices: &'a RwLock<Slots<Arc<DeviceInner>>>,
    spaces: &'a RwLock<Slots<Arc<SpaceInner>>>,
}

impl<'a> Ctx<'a> {
    /// The context over an instance's counters, host device and registries.
    pub fn new(
        counters: &'a Counters,
        platform: &'a dyn Platform,
        host: &'a Arc<DeviceInner>,
        devices: &'a RwLock<Slots<Arc<DeviceInner>>>,
        spaces: &'a RwLock<Slots<Arc<SpaceInner>>>,
    ) -> Ctx<'a> {
        Ctx {
            counters,
            platform,
            host,
            devices,
            spaces,
        }
    }

    /// The live device `id`.
    pub fn device(&self, id: DeviceId) -> Option<Arc<DeviceInner>> {
        self.devices.read().get(id.index, id.generation).cloned()
    }

    /// The live space `id`.
    pub fn space(&self, id: SpaceId) -> Option<Arc<SpaceInner>> {
        self.spaces.read().get(id.index, id.generation).cloned()
    }
}
