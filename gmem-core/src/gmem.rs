//! The [`Gmem`] instance: the device and address-space registries, the statistics, the
//! critical section around every call, and `check_invariants`.
//!
//! One `Gmem` per kernel. The KPI calls themselves live in [`crate::kpi`], one module
//! per object they act on.
//!
//! ## Ownership
//! The registries own devices and spaces. A space holds its attached devices (and the
//! memories its pages live in) strongly; a device holds the space it is active in
//! weakly, so the two never form a reference cycle: destroying a space frees it, and
//! destroying a device frees it once no space refers to it (`dev_destroy` makes sure
//! none does).

use crate::device::{Binding, DeviceDesc, DeviceInner};
use crate::error::DeviceError;
use crate::flags::{DevCaps, PageSizes};
use crate::handle::{DeviceId, Slots, SpaceId};
use crate::physmem::PhysMem;
use crate::platform::Platform;
use crate::space::violation::{fail, Violation};
use crate::space::{Ctx, SpaceInner};
use crate::stats::{Counters, Stats};
use crate::sync::{Arc, AtomicU64, Mutex, Rank, RwLock};

/// The embedder's critical section ([`Platform::enter_critical`]) held for one KPI
/// call: it is left when dropped, after every lock of the call is released and its
/// completion callbacks have run.
pub(crate) struct Critical<'a> {
    platform: &'a dyn Platform,
    saved: usize,
}

impl Drop for Critical<'_> {
    #[inline]
    fn drop(&mut self) {
        self.platform.exit_critical(self.saved);
    }
}

/// One GMEM instance: the memory manager of a kernel.
pub struct Gmem {
    platform: Arc<dyn Platform>,
    pub(crate) counters: Counters,
    pub(crate) devices: RwLock<Slots<Arc<DeviceInner>>>,
    pub(crate) spaces: RwLock<Slots<Arc<SpaceInner>>>,
    pub(crate) host: Arc<DeviceInner>,
}

/// A device record for `desc` (whose MMU the caller checked maps 4 KiB pages).
pub(crate) fn new_device(id: DeviceId, desc: DeviceDesc, extra: DevCaps) -> DeviceInner {
    let page_sizes = desc.mmu.page_sizes();
    DeviceInner {
        id,
        name: desc.name,
        mmu: desc.mmu,
        memory: desc.memory,
        caps: desc.caps | extra,
        page_sizes,
        data: desc.data,
        phys: Mutex::ranked(PhysMem::new(), Rank::PhysMem),
        registered: AtomicU64::new(0),
        binding: Mutex::ranked(Binding::default(), Rank::Binding),
        prefetch: AtomicU64::new(0),
    }
}

impl Gmem {
    /// A new instance whose host CPU device (`gm_dev_CPU`) is described by `host`. Its
    /// memory is registered with [`Gmem::dev_register_physmem`] like any device's.
    ///
    /// # Errors
    /// [`DeviceError::No4KPages`] if the host MMU does not map 4 KiB pages.
    pub fn new(platform: Arc<dyn Platform>, host: DeviceDesc) -> Result<Gmem, DeviceError> {
        if !host.mmu.page_sizes().contains(PageSizes::S4K) {
            return Err(DeviceError::No4KPages);
        }
        let mut devices: Slots<Arc<DeviceInner>> = Slots::default();
        let (index, generation) = devices.insert_with(move |index, generation| {
            Arc::new(new_device(
                DeviceId { index, generation },
                host,
                DevCaps::HOST | DevCaps::FAULTABLE,
            ))
        });
        let host = devices
            .get(index, generation)
            .cloned()
            .ok_or(DeviceError::UnknownDevice(DeviceId { index, generation }))?;
        Ok(Gmem {
            platform,
            counters: Counters::default(),
            devices: RwLock::new(devices),
            spaces: RwLock::new(Slots::default()),
            host,
        })
    }

    /// The host CPU device.
    pub fn host(&self) -> DeviceId {
        self.host.id
    }

    /// The platform the instance was created with.
    pub fn platform(&self) -> &Arc<dyn Platform> {
        &self.platform
    }

    /// A snapshot of the counters: the global ones plus every live space's.
    pub fn stats(&self) -> Stats {
        let _critical = self.critical();
        // Under the registry's read lock: `as_destroy` folds a space's counters into
        // the global ones and unregisters it under the write lock, so every space's
        // counts are summed exactly once (see `crate::stats`).
        let spaces = self.spaces.read();
        let mut s = self.counters.snapshot();
        spaces.for_each(|space| space.counters.add_to_snapshot(&mut s));
        s
    }

    pub(crate) fn device(&self, id: DeviceId) -> Option<Arc<DeviceInner>> {
        self.devices.read().get(id.index, id.generation).cloned()
    }

    pub(crate) fn space(&self, id: SpaceId) -> Option<Arc<SpaceInner>> {
        self.spaces.read().get(id.index, id.generation).cloned()
    }

    /// Enter the platform's critical section for one KPI call (the first statement of
    /// every public call that may take a lock; see [`Platform::enter_critical`]).
    #[inline]
    pub(crate) fn critical(&self) -> Critical<'_> {
        let platform = &*self.platform;
        Critical {
            saved: platform.enter_critical(),
            platform,
        }
    }

    /// Run `f` on the locked state of live space `id` inside the platform's critical
    /// section; `stale(id)` when the handle is stale or the space destroyed (the
    /// preamble of the KPI calls that edit one space's policies).
    pub(crate) fn with_live_space<R, E>(
        &self,
        id: SpaceId,
        stale: impl FnOnce(SpaceId) -> E,
        f: impl FnOnce(&mut crate::space::SpaceState) -> R,
    ) -> Result<R, E> {
        let _critical = self.critical();
        let Some(space) = self.space(id) else {
            return Err(stale(id));
        };
        let mut st = space.lock();
        if !st.is_alive() {
            return Err(stale(id));
        }
        Ok(f(&mut st))
    }

    /// The context handed to the fault path and the space operations.
    pub(crate) fn context(&self) -> Ctx<'_> {
        Ctx::new(
            &self.counters,
            &*self.platform,
            &self.host,
            &self.devices,
            &self.spaces,
        )
    }
}

impl Gmem {
    /// Check the invariants of one address space and of every memory it uses.
    ///
    /// # Errors
    /// The first [`Violation`] found, or one naming a stale space handle.
    pub fn check_invariants(&self, id: SpaceId) -> Result<(), Violation> {
        let _critical = self.critical();
        let Some(space) = self.space(id) else {
            return fail("unknown address space", None);
        };
        let st = space.lock();
        st.check(&space, id)
    }
}

impl Drop for Gmem {
    /// Destroy every address space, detaching every device (so drivers see their tables
    /// destroyed and their devices deactivated) and freeing every frame.
    fn drop(&mut self) {
        let spaces = self.spaces.read().keys();
        for (index, generation) in spaces {
            let _ = self.as_destroy(SpaceId { index, generation });
        }
    }
}
