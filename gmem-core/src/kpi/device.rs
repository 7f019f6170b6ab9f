//! KPI: devices (`gm_dev_*`) — create, destroy, register memory, switch, detach, fault.
//!
//! ## Races this module closes
//! - `dev_switch` installs the binding and calls the driver's `activate` while it
//!   holds the space lock in which it read the table root, so a concurrent `dev_detach`
//!   (which destroys the table under the same lock) is either wholly before — the
//!   switch then finds the device not attached — or wholly after — the detach then
//!   deactivates the device before it destroys the table.
//! - `dev_destroy` marks the device destroyed under its binding lock in the same step
//!   that checks it is attached nowhere; `as_attach` records an attachment under the
//!   space lock and the binding lock and refuses a destroyed device. So of a racing
//!   attach and destroy exactly one wins.
//! - `dev_destroy` then retires the device's memory (no frame is handed out any more)
//!   in the same step that checks no frame is in use, and forgets the memory in every
//!   space only once no page of any space names it. The destroyed device is then
//!   referenced by nothing the core keeps, and freed.
//!
//! ## The entry protocol of a fault
//! A fault must hold its space's lock, and the space lock ranks above the binding
//! that names the space: a fault may not wait for the space while it holds the
//! binding. On the fast path it does not wait: under the binding lock it takes the
//! space lock with `try_lock` (which never waits, so the order does not bind it),
//! then drops the binding. No reference count is touched, so the fault costs two
//! atomic read-modify-writes (the two lock acquisitions) instead of four (the binding
//! lock, a `Weak` upgrade, the space lock, the drop of the upgraded `Arc`). If the
//! space lock is busy the fault falls back to the old protocol: upgrade the `Weak`
//! under the binding, drop the binding, wait for the space with a reference of its
//! own.
//!
//! Why the space stays alive on the fast path without a reference of the fault's own:
//! the registry holds every space until `as_destroy`, which first destroys the space
//! under its lock (detaching every device: each binding that names the space is
//! cleared, under the space lock and then the binding lock) and only then removes it
//! from the registry. The fault's `try_lock` succeeds inside its binding section while
//! the binding names the space. A destroy whose locked section came before that
//! `try_lock` would have cleared the binding before the fault's binding section (its
//! binding section is inside its space section), and no switch can name a destroyed
//! space again (a switch needs an attachment, which a dead space refuses). So every
//! destroy's locked section comes after the fault's, and the registry's reference,
//! dropped after that section, outlives the fault's use of the space. A detach is
//! ordered the same way: it changes the binding only under the space lock, so the
//! fault sees the device attached (and rechecks it, with the space alive, under the
//! space lock) or not active. A switch to another space changes nothing the fault
//! relies on (the old space is still attached and still in the registry). The loom
//! model `entry` races faults against a destroy and a detach; a loom build keeps the
//! spaces the registry lets go allocated and marked, and the fault asserts that the
//! space it holds is still registered. Its broken variant
//! `gmem_loom_bug="fault_unbinds_before_locking"` drops the binding before it locks
//! the space through the pointer, and the model sees the fault reach a destroyed,
//! unregistered space.
//!
//! Why the binding lock stays (one of the fault's atomics): a lock-free read of the
//! binding with a sequence count, checked again after the space `try_lock`, would
//! not be sound. Between the unlocked read of the space pointer and the `try_lock`,
//! nothing keeps the space alive: an `as_destroy` can clear the binding, bump the
//! count, release the space lock and let the registry free the space, so the
//! `try_lock` (and the check after it) would touch freed memory. The check comes
//! too late; only holding the binding across the `try_lock`, as above, orders every
//! destroy after the fault's use of the space.

use crate::addr::{PhysAddr, VirtAddr};
use crate::device::{DeviceDesc, DeviceInner};
use crate::error::{AttachError, DeviceError, FaultError, PopulateError};
use crate::fault::FaultResolution;
use crate::flags::{DevCaps, PageSizes, Prot};
use crate::gmem::{new_device, Gmem};
use crate::handle::{DeviceId, SpaceId};
use crate::physmem::FrameCounts;
use crate::space::{Locked, SpaceInner};
use crate::stats::Counters;
use crate::sync::{Arc, Ordering};
use alloc::string::String;
use alloc::sync::Weak;
use core::any::Any;

impl Gmem {
    /// Create a device (`gm_dev_create`).
    ///
    /// # Errors
    /// [`DeviceError::No4KPages`] if the MMU does not map 4 KiB pages.
    pub fn dev_create(&self, desc: DeviceDesc) -> Result<DeviceId, DeviceError> {
        let _critical = self.critical();
        if !desc.mmu.page_sizes().contains(PageSizes::S4K) {
            return Err(DeviceError::No4KPages);
        }
        let mut devices = self.devices.write();
        let (index, generation) = devices.insert_with(move |index, generation| {
            Arc::new(new_device(
                DeviceId { index, generation },
                desc,
                DevCaps::empty(),
            ))
        });
        Ok(DeviceId { index, generation })
    }

    /// Destroy a device (`gm_dev_destroy`). It must be detached from every space and its
    /// memory must back no page (neither managed frames nor caller-given frames of
    /// `region_map`). On success nothing the core keeps refers to the device any more.
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`] for a stale handle, [`DeviceError::IsHost`] for the
    /// host, [`DeviceError::StillAttached`] and [`DeviceError::MemoryInUse`] when it is
    /// still in use, [`DeviceError::EditsInFlight`] while a call running in another
    /// thread may still reach its MMU; the device is then unchanged.
    pub fn dev_destroy(&self, id: DeviceId) -> Result<(), DeviceError> {
        let _critical = self.critical();
        let dev = self.device(id).ok_or(DeviceError::UnknownDevice(id))?;
        if dev.caps.contains(DevCaps::HOST) {
            return Err(DeviceError::IsHost);
        }
        {
            let mut b = dev.binding.lock();
            if b.destroyed {
                return Err(DeviceError::UnknownDevice(id));
            }
            if !b.attached.is_empty() {
                return Err(DeviceError::StillAttached {
                    spaces: b.attached.len(),
                });
            }
            b.destroyed = true;
        }
        // Work that left a space's lock may still call the device's MMU: a table it
        // detached from, doomed until an unlocked edit ends, or a strict dealloc's
        // unmap and invalidation. No new such work can name it now (it is attached
        // nowhere and `destroyed` refuses attaches), so one look at every space
        // settles it.
        let spaces = self.spaces.read().values();
        if spaces.iter().any(|s| s.lock().refers_to_device(id)) {
            dev.binding.lock().destroyed = false;
            return Err(DeviceError::EditsInFlight);
        }
        let undo = |dev: &DeviceInner| {
            let registered = {
                let mut phys = dev.phys.lock();
                phys.retire(false);
                phys.counts().registered
            };
            dev.registered.store(registered, Ordering::Release);
            dev.binding.lock().destroyed = false;
        };
        {
            let mut phys = dev.phys.lock();
            let used = phys.retire(true);
            if used > 0 {
                drop(phys);
                undo(&dev);
                return Err(DeviceError::MemoryInUse { frames: used });
            }
            dev.registered.store(0, Ordering::Release);
        }
        // Caller-given frames (`region_map`) are not on the device's queues: look for
        // pages naming the memory in every space before forgetting it anywhere.
        let mut external = 0;
        for space in &spaces {
            external += space.lock().pages_in_memory(id);
        }
        if external > 0 {
            undo(&dev);
            return Err(DeviceError::MemoryInUse { frames: external });
        }
        for space in &spaces {
            space.lock().forget_memory(id);
        }
        self.devices
            .write()
            .remove(id.index, id.generation)
            .ok_or(DeviceError::UnknownDevice(id))?;
        Ok(())
    }

    /// Move every page that any address space keeps in the device's memory to host
    /// memory (wired pages too: they stay wired and mapped for devices that cannot
    /// fault), so that the device can then be destroyed (`dev_destroy` refuses while
    /// its memory backs pages). Caller-given frames (`region_map`) are the caller's
    /// and stay. Faults after the call may place pages on the device again: detach it
    /// (or change the regions' placement) first to keep it empty. Returns the pages
    /// moved.
    ///
    /// # Errors
    /// [`PopulateError::UnknownDevice`], [`PopulateError::IsHost`], or a move that
    /// failed ([`PopulateError::Move`] when host memory is full even after
    /// eviction, a driver or data-mover failure); pages moved before stay moved.
    pub fn dev_evacuate(&self, id: DeviceId) -> Result<u64, PopulateError> {
        let _critical = self.critical();
        let dev = self.device(id).ok_or(PopulateError::UnknownDevice(id))?;
        if dev.caps.contains(DevCaps::HOST) {
            return Err(PopulateError::IsHost);
        }
        if !dev.has_memory() {
            return Ok(0);
        }
        let spaces = self.spaces.read().values();
        let mut moved = 0;
        for space in &spaces {
            let mut st = space.lock();
            if !st.is_alive() {
                continue;
            }
            moved += st.evacuate(&self.context(), space, &dev, &self.host)?;
        }
        Ok(moved)
    }

    /// Register `[begin, end)` as local memory of the device
    /// (`gm_dev_register_physmem`).
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`], [`DeviceError::NoMemoryInterface`] for a device
    /// created without a data mover, [`DeviceError::Register`] for a bad or overlapping
    /// range.
    pub fn dev_register_physmem(
        &self,
        id: DeviceId,
        begin: PhysAddr,
        end: PhysAddr,
    ) -> Result<(), DeviceError> {
        let _critical = self.critical();
        let dev = self.device(id).ok_or(DeviceError::UnknownDevice(id))?;
        if dev.memory.is_none() {
            return Err(DeviceError::NoMemoryInterface(id));
        }
        let mut phys = dev.phys.lock();
        if phys.is_retired() {
            return Err(DeviceError::UnknownDevice(id));
        }
        phys.register(begin, end).map_err(DeviceError::Register)?;
        dev.registered
            .store(phys.counts().registered, Ordering::Release);
        Ok(())
    }

    /// Frame counts of the device's memory by state.
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`] for a stale handle.
    pub fn dev_frames(&self, id: DeviceId) -> Result<FrameCounts, DeviceError> {
        let _critical = self.critical();
        let dev = self.device(id).ok_or(DeviceError::UnknownDevice(id))?;
        let c = dev.phys.lock().counts();
        Ok(c)
    }

    /// Choose how the core picks the page of the device's full memory to evict
    /// ([`crate::EvictionPolicy::Clock`] by default; a device whose MMU keeps no accessed bits
    /// is aged FIFO whatever the policy).
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`] for a stale handle.
    pub fn dev_set_eviction_policy(
        &self,
        id: DeviceId,
        policy: crate::physmem::EvictionPolicy,
    ) -> Result<(), DeviceError> {
        let _critical = self.critical();
        let dev = self.device(id).ok_or(DeviceError::UnknownDevice(id))?;
        dev.phys.lock().set_policy(policy);
        Ok(())
    }

    /// The opaque driver data given at creation.
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`] for a stale handle.
    pub fn dev_data(
        &self,
        id: DeviceId,
    ) -> Result<Option<Arc<dyn Any + Send + Sync>>, DeviceError> {
        let _critical = self.critical();
        Ok(self
            .device(id)
            .ok_or(DeviceError::UnknownDevice(id))?
            .data
            .clone())
    }

    /// The name the device was created with.
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`] for a stale handle.
    pub fn dev_name(&self, id: DeviceId) -> Result<String, DeviceError> {
        let _critical = self.critical();
        Ok(self
            .device(id)
            .ok_or(DeviceError::UnknownDevice(id))?
            .name
            .clone())
    }

    /// The device's capabilities.
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`] for a stale handle.
    pub fn dev_caps(&self, id: DeviceId) -> Result<DevCaps, DeviceError> {
        let _critical = self.critical();
        Ok(self.device(id).ok_or(DeviceError::UnknownDevice(id))?.caps)
    }

    /// The space the device is active in.
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`] for a stale handle.
    pub fn dev_active(&self, id: DeviceId) -> Result<Option<SpaceId>, DeviceError> {
        let _critical = self.critical();
        let dev = self.device(id).ok_or(DeviceError::UnknownDevice(id))?;
        let active = dev.binding.lock().active_space().map(|s| s.id);
        Ok(active)
    }

    /// Activate the device in `space`, deactivating it wherever it was active
    /// (`gm_dev_switch`). The binding and the driver's `activate` happen under the
    /// space's lock, so the table cannot be destroyed in between.
    ///
    /// # Errors
    /// [`AttachError::UnknownDevice`], [`AttachError::UnknownSpace`], or
    /// [`AttachError::NotAttached`] when the device is not attached to the space.
    pub fn dev_switch(&self, id: DeviceId, space_id: SpaceId) -> Result<(), AttachError> {
        let _critical = self.critical();
        let dev = self.device(id).ok_or(AttachError::UnknownDevice(id))?;
        let space = self
            .space(space_id)
            .ok_or(AttachError::UnknownSpace(space_id))?;
        let st = space.lock();
        let root = st.root_of(id).ok_or(AttachError::NotAttached)?;
        // Deliberately broken (loom model `attach` must catch it): the lock is dropped
        // before the device is bound and activated, so a detach in between destroys
        // the table the device is then activated on.
        #[cfg(gmem_loom_bug = "switch_activates_after_unlock")]
        drop(st);
        let mut b = dev.binding.lock();
        b.active = Some(Arc::downgrade(&space));
        dev.mmu.activate(Some(root));
        drop(b);
        #[cfg(not(gmem_loom_bug = "switch_activates_after_unlock"))]
        drop(st);
        Ok(())
    }

    /// Detach the device from `space`, removing its page table (or its use of a shared
    /// one) and invalidating its TLB (`gm_dev_detach`).
    ///
    /// # Errors
    /// [`AttachError::UnknownDevice`], [`AttachError::UnknownSpace`],
    /// [`AttachError::NotAttached`].
    pub fn dev_detach(&self, id: DeviceId, space_id: SpaceId) -> Result<(), AttachError> {
        let _critical = self.critical();
        if self.device(id).is_none() {
            return Err(AttachError::UnknownDevice(id));
        }
        let space = self
            .space(space_id)
            .ok_or(AttachError::UnknownSpace(space_id))?;
        let mut st = space.lock();
        let slot = st.slot_of(id).ok_or(AttachError::NotAttached)?;
        st.drain(&self.counters, &space.arena);
        st.detach_slot(&self.counters, slot, space_id);
        Ok(())
    }

    /// Serve a translation fault of a device (`gm_dev_fault`): on success the driver
    /// retries the access.
    ///
    /// This call allocates (logical page table leaves, the async queue, migration's
    /// bounce buffer live on the heap) and takes spin locks: a kernel must not call it
    /// from a context that holds its heap lock or that the heap's lock holder can be
    /// interrupted by.
    ///
    /// # Errors
    /// See [`FaultError`]: a stale or non-faultable device, no active space, an address
    /// no region holds or that was unmapped, a protection violation, memory exhausted
    /// even after eviction, or a driver failure. A failed fault leaves the logical state
    /// as it was.
    pub fn dev_fault(
        &self,
        id: DeviceId,
        va: VirtAddr,
        access: Prot,
    ) -> Result<FaultResolution, FaultError> {
        let _critical = self.critical();
        self.counted(self.fault_inner(id, va, access), false)
    }

    /// [`Gmem::dev_fault`] for a context that must never wait for a lock: a page-fault
    /// or interrupt handler that may have interrupted a core call on its own CPU, or a
    /// driver callback that re-enters the core (the core calls drivers with the space
    /// lock held). It takes the registry, the device's binding and the space's lock
    /// with `try_read`/`try_lock` only and answers [`FaultError::Busy`] at once when
    /// one is held. Once it holds the space lock it serves the fault as `dev_fault`
    /// does, waiting only for a device's frame lock and the registries' leaf locks,
    /// which the core holds across no driver callback but
    /// [`crate::DeviceMemory::group_class_changed`] (which therefore may call nothing).
    ///
    /// What `Busy` means depends on who holds the lock. Another CPU (or thread): return
    /// and let the access retry — a device replays it, a CPU takes the fault again.
    /// The context the handler interrupted on this CPU (it was inside a core call, as
    /// [`crate::Platform::enter_critical`]'s nesting tells): the retry would fault again
    /// forever, so that is a kernel bug (a driver callback touched memory the core
    /// serves) to report, not to retry.
    ///
    /// # Errors
    /// [`FaultError::Busy`] when a lock it needs is held (nothing changed: retry), and
    /// everything [`Gmem::dev_fault`] answers.
    pub fn dev_try_fault(
        &self,
        id: DeviceId,
        va: VirtAddr,
        access: Prot,
    ) -> Result<FaultResolution, FaultError> {
        let _critical = self.critical();
        self.counted(self.try_fault_inner(id, va, access), true)
    }

    /// Serve a fault of device `id` at `va` in the named address space `space`, whether
    /// or not the device is active there: the explicit fault context a kernel with
    /// one CPU device for all its harts wants (each hart faults in the space of the
    /// process it runs; no [`Gmem::dev_switch`] per context switch). The device must be
    /// attached to `space`; the page is mapped in the device's table of that space.
    /// Waits for the space's lock like [`Gmem::dev_fault`]; from a context that may
    /// have interrupted a core call on its own CPU use [`Gmem::dev_try_fault_in`].
    ///
    /// # Errors
    /// As [`Gmem::dev_fault`], with [`FaultError::UnknownSpace`] for a stale space
    /// handle and [`FaultError::NotAttached`] for a device not attached to it (in
    /// place of `NotActive`).
    ///
    /// # Examples
    /// One CPU device attached to two spaces, active in neither; each fault names its
    /// space and is served in that space's table.
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// let sys = TestSystem::new(16);
    /// let gm = &sys.gm;
    /// let cpu = gm.host();
    /// let a = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// let b = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(a, cpu, MmuMode::Coherent, Activation::Leave)?;
    /// gm.as_attach(b, cpu, MmuMode::Coherent, Activation::Leave)?;
    /// let ra = gm.as_alloc(a, AllocRequest::new(PAGE_SIZE))?;
    /// let rb = gm.as_alloc(b, AllocRequest::new(PAGE_SIZE))?;
    /// assert_eq!(ra.start, rb.start); // the same address in two processes
    /// assert_eq!(gm.dev_fault(cpu, ra.start, Prot::WRITE), Err(FaultError::NotActive(cpu)));
    /// gm.dev_fault_in(cpu, a, ra.start, Prot::WRITE)?;
    /// gm.dev_fault_in(cpu, b, rb.start, Prot::WRITE)?;
    /// let (frame_a, frame_b) = (gm.as_page_frame(a, ra.start)?, gm.as_page_frame(b, rb.start)?);
    /// assert!(frame_a.is_some() && frame_b.is_some() && frame_a != frame_b);
    /// gm.as_destroy(b)?;
    /// assert_eq!(gm.dev_fault_in(cpu, b, rb.start, Prot::READ), Err(FaultError::UnknownSpace(b)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dev_fault_in(
        &self,
        id: DeviceId,
        space: SpaceId,
        va: VirtAddr,
        access: Prot,
    ) -> Result<FaultResolution, FaultError> {
        let _critical = self.critical();
        self.counted(self.fault_in_inner(id, space, va, access, false), false)
    }

    /// [`Gmem::dev_fault_in`] for a fault handler or a driver callback that may have
    /// interrupted a core call on its own CPU: it takes every lock with `try_lock` and
    /// answers [`FaultError::Busy`] at once where [`Gmem::dev_fault_in`] would wait
    /// (see [`Gmem::dev_try_fault`]).
    ///
    /// # Errors
    /// As [`Gmem::dev_fault_in`], and [`FaultError::Busy`]: retry the access later.
    pub fn dev_try_fault_in(
        &self,
        id: DeviceId,
        space: SpaceId,
        va: VirtAddr,
        access: Prot,
    ) -> Result<FaultResolution, FaultError> {
        let _critical = self.critical();
        self.counted(self.fault_in_inner(id, space, va, access, true), true)
    }

    /// The fault of `dev_fault_in` (waiting) or `dev_try_fault_in` (`try_only`). The
    /// space is held by a reference of the fault's own (no binding names it).
    fn fault_in_inner(
        &self,
        id: DeviceId,
        space_id: SpaceId,
        va: VirtAddr,
        access: Prot,
        try_only: bool,
    ) -> Result<FaultResolution, FaultError> {
        let busy = FaultError::Busy(va);
        let dev = self.faulting_device(id, va, try_only)?;
        let dev = &*dev;
        let spaces = if try_only {
            self.spaces.try_read().ok_or(busy)?
        } else {
            self.spaces.read()
        };
        let space = spaces
            .get(space_id.index, space_id.generation)
            .cloned()
            .ok_or(FaultError::UnknownSpace(space_id))?;
        drop(spaces);
        let mut st = if try_only {
            space.try_lock().ok_or(busy)?
        } else {
            space.lock()
        };
        if !st.is_alive() {
            return Err(FaultError::UnknownSpace(space_id));
        }
        let attachment = st.attachment_of(id).ok_or(FaultError::NotAttached(id))?;
        st.fault(&self.context(), &space, dev, attachment, va, access)
    }

    /// Count a fault that failed (`faults_failed`); a `Busy` answer of a try entry
    /// (`try_only`) is not a failure: the access is retried.
    #[inline(always)]
    fn counted(
        &self,
        r: Result<FaultResolution, FaultError>,
        try_only: bool,
    ) -> Result<FaultResolution, FaultError> {
        if matches!(r, Err(e) if !(try_only && matches!(e, FaultError::Busy(_)))) {
            Counters::add(&self.counters.faults_failed, 1);
        }
        r
    }

    /// The faulting device `id`, checked faultable. The host device lives as long as
    /// the instance (`Gmem` holds it, `dev_destroy` refuses it): a host fault borrows
    /// it, without the registry's read lock and the reference-count round trip a lookup
    /// costs (4 atomic read-modify-writes). With `try_only` the registry is taken with
    /// `try_read` (`Busy` if held).
    #[inline(always)]
    fn faulting_device(
        &self,
        id: DeviceId,
        va: VirtAddr,
        try_only: bool,
    ) -> Result<FaultingDevice<'_>, FaultError> {
        let dev = if id == self.host.id {
            FaultingDevice::Host(&self.host)
        } else {
            let devices = if try_only {
                self.devices.try_read().ok_or(FaultError::Busy(va))?
            } else {
                self.devices.read()
            };
            let dev = devices
                .get(id.index, id.generation)
                .cloned()
                .ok_or(FaultError::UnknownDevice(id))?;
            FaultingDevice::Other(dev)
        };
        if !dev.faultable() {
            return Err(FaultError::NotFaultable(id));
        }
        Ok(dev)
    }

    fn try_fault_inner(
        &self,
        id: DeviceId,
        va: VirtAddr,
        access: Prot,
    ) -> Result<FaultResolution, FaultError> {
        let busy = FaultError::Busy(va);
        let dev = self.faulting_device(id, va, true)?;
        let dev = &*dev;
        let binding = dev.binding.try_lock().ok_or(busy)?;
        let active = binding.active.as_ref().ok_or(FaultError::NotActive(id))?;
        let raw = Weak::as_ptr(active);
        // SAFETY: as on `dev_fault`'s fast path ("The entry protocol" in this module's
        // header): `raw` points into the allocation `active` keeps, the space is alive
        // while the binding we hold names it, and it is used only while this thread
        // holds the space lock taken below, which outlives the registry's reference.
        #[allow(unsafe_code)]
        let space: &SpaceInner = unsafe { &*raw };
        // Deliberately broken (loom model `reentry` must catch it): wait for the space
        // as `dev_fault`'s slow path does (the binding dropped first), which a context
        // that holds it never gets.
        #[cfg(gmem_loom_bug = "try_fault_waits_for_the_space")]
        let mut st = {
            drop(binding);
            space.lock()
        };
        #[cfg(not(gmem_loom_bug = "try_fault_waits_for_the_space"))]
        let mut st = {
            let st = space.try_lock().ok_or(busy)?;
            drop(binding);
            st
        };
        #[cfg(gmem_loom)]
        assert!(
            space.registered(),
            "a fault holds a space the registry has let go (freed in a real build)"
        );
        self.fault_locked(space, &mut st, dev, id, va, access)
    }

    fn fault_inner(
        &self,
        id: DeviceId,
        va: VirtAddr,
        access: Prot,
    ) -> Result<FaultResolution, FaultError> {
        let dev = self.faulting_device(id, va, false)?;
        let dev = &*dev;
        let binding = dev.binding.lock();
        let active = binding.active.as_ref().ok_or(FaultError::NotActive(id))?;
        // The fast path (see "The entry protocol" in this module's header): the space
        // lock taken with `try_lock` while the binding still names the space, and no
        // reference count touched.
        #[cfg(not(gmem_loom_bug = "fault_unbinds_before_locking"))]
        {
            let raw = Weak::as_ptr(active);
            // SAFETY: `raw` points into the allocation `active` keeps (a `Weak` keeps
            // its allocation), and the space in it is alive: the binding names it, so
            // it is not destroyed (`as_destroy` clears every binding to the space under
            // the binding lock we hold), and the registry's reference to it goes only
            // after a destroy. The reference is used only while this thread holds the
            // space lock taken below, and that outlives the registry's reference too
            // (the header's argument).
            #[allow(unsafe_code)]
            let space: &SpaceInner = unsafe { &*raw };
            if let Some(mut st) = space.try_lock() {
                drop(binding);
                // A loom build keeps unregistered spaces (instead of freeing them) and
                // marks them, so that a model sees a fault reach one.
                #[cfg(gmem_loom)]
                assert!(
                    space.registered(),
                    "a fault holds a space the registry has let go (freed in a real build)"
                );
                return self.fault_locked(space, &mut st, dev, id, va, access);
            }
        }
        // Deliberately broken (loom model `entry` must catch it): the space is reached
        // through the pointer after the binding is dropped, with no reference of its
        // own, so a destroy can run to its end in between.
        #[cfg(gmem_loom_bug = "fault_unbinds_before_locking")]
        {
            let raw = Weak::as_ptr(active);
            drop(binding);
            // SAFETY: none; this is the bug the model catches. A loom build keeps
            // unregistered spaces allocated, so the model's check runs before any use.
            #[allow(unsafe_code)]
            let space: &SpaceInner = unsafe { &*raw };
            let mut st = space.lock();
            assert!(
                space.registered(),
                "a fault holds a space the registry has let go (freed in a real build)"
            );
            return self.fault_locked(space, &mut st, dev, id, va, access);
        }
        // The slow path, when the space lock is busy: a reference of our own keeps the
        // space alive while we wait for its lock without holding the binding (the
        // space lock ranks above the binding).
        #[allow(unreachable_code)]
        let space = Weak::upgrade(active).ok_or(FaultError::NotActive(id))?;
        drop(binding);
        let mut st = space.lock();
        self.fault_locked(&space, &mut st, dev, id, va, access)
    }

    /// The fault of device `id` (`dev`) at `va` once its space's lock `st` is held
    /// (by any of the entry's paths): `NotActive` if the device was detached or the
    /// space destroyed before the lock was taken.
    #[inline(always)]
    fn fault_locked(
        &self,
        space: &SpaceInner,
        st: &mut Locked<'_>,
        dev: &Arc<DeviceInner>,
        id: DeviceId,
        va: VirtAddr,
        access: Prot,
    ) -> Result<FaultResolution, FaultError> {
        match st.attachment_of(id) {
            Some((slot, table)) if st.is_alive() => {
                st.fault(&self.context(), space, dev, (slot, table), va, access)
            }
            _ => Err(FaultError::NotActive(id)),
        }
    }
}

/// The device a fault names: the host borrowed from the instance, any other device by
/// a reference of the fault's own.
enum FaultingDevice<'a> {
    Host(&'a Arc<DeviceInner>),
    Other(Arc<DeviceInner>),
}

impl core::ops::Deref for FaultingDevice<'_> {
    type Target = Arc<DeviceInner>;
    #[inline(always)]
    fn deref(&self) -> &Arc<DeviceInner> {
        match self {
            FaultingDevice::Host(d) => d,
            FaultingDevice::Other(d) => d,
        }
    }
}
