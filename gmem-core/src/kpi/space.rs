//! KPI: address spaces (`gm_as_*`) — create, destroy, attach, allocate, look up, synchronize.

use crate::addr::{VaRange, VirtAddr, PAGE_SIZE};
use crate::error::{AllocError, AttachError, LookupError, SpaceError};
use crate::flags::AllocPolicy;
use crate::gmem::Gmem;
use crate::handle::{DeviceId, SpaceId};
use crate::kpi::region::info;
use crate::space::{Activation, AllocRequest, MmuMode, Region, RegionInfo, SpaceInner};
use crate::sync::Arc;
use crate::vmem::FitPolicy;
use crate::vmem::{self, Arena, ArenaConfig, Constraint};
use alloc::vec::Vec;

/// Largest region size served by an address space's quantum caches (`CACHED` policy).
pub const QCACHE_MAX: u64 = 32 * PAGE_SIZE;

/// The vmem fit policy an allocation policy names.
fn fit_of(policy: AllocPolicy) -> FitPolicy {
    if policy.contains(AllocPolicy::BEST_FIT) {
        FitPolicy::BestFit
    } else if policy.contains(AllocPolicy::FIRST_FIT) {
        FitPolicy::FirstFit
    } else if policy.contains(AllocPolicy::NEXT_FIT) {
        FitPolicy::NextFit
    } else {
        FitPolicy::InstantFit
    }
}

impl Gmem {
    // ----- address spaces ------------------------------------------------------------

    /// Create an address space over `[begin, end)` (`gm_as_create`).
    ///
    /// # Errors
    /// [`SpaceError`] for an empty, unaligned or overflowing range, or a policy naming two
    /// fits.
    ///
    /// # Examples
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// let sys = TestSystem::new(16);
    /// let gm = &sys.gm;
    /// // [1 GiB, 2 GiB), every region with an unmapped guard page on each side.
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::GUARDED)?;
    /// assert!(gm.as_regions(space)?.is_empty());
    /// // An empty range is refused.
    /// let empty = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(1 << 30), AllocPolicy::empty());
    /// assert!(matches!(empty, Err(SpaceError::BadRange(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_create(
        &self,
        begin: VirtAddr,
        end: VirtAddr,
        policy: AllocPolicy,
    ) -> Result<SpaceId, SpaceError> {
        let _critical = self.critical();
        let len = end.as_u64().wrapping_sub(begin.as_u64());
        let range = if end <= begin {
            Err(crate::addr::AddrError::BadRange {
                start: begin.as_u64(),
                len: 0,
            })
        } else {
            VaRange::new(begin, len)
        }
        .map_err(SpaceError::BadRange)?;
        if !policy.is_valid() {
            return Err(SpaceError::BadPolicy(policy));
        }
        let cached = policy.contains(AllocPolicy::CACHED);
        let config = ArenaConfig {
            quantum: PAGE_SIZE,
            qcache_max: if cached { QCACHE_MAX } else { 0 },
            magazines: cached,
            check_frees: false,
            fit: fit_of(policy),
        };
        let arena = Arena::new(config, Some(self.platform().clone()))
            .expect("page quantum and qcache_max are valid");
        arena.add_span(begin.as_u64(), len).map_err(|_| {
            SpaceError::BadRange(crate::addr::AddrError::BadRange {
                start: begin.as_u64(),
                len,
            })
        })?;
        let mut spaces = self.spaces.write();
        let (index, generation) = spaces.insert_with(|index, generation| {
            Arc::new(SpaceInner::new(
                SpaceId { index, generation },
                range,
                policy,
                arena,
                self.host.clone(),
            ))
        });
        Ok(SpaceId { index, generation })
    }

    /// Destroy an address space (`gm_as_destroy`): drain its queue, detach every device,
    /// free every frame and region.
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle (a double destroy).
    pub fn as_destroy(&self, id: SpaceId) -> Result<(), SpaceError> {
        let _critical = self.critical();
        let space = self.space(id).ok_or(SpaceError::UnknownSpace(id))?;
        space.lock().destroy(&self.counters, &space.arena, id);
        // Fold the space's counters into the global ones and unregister it in one
        // hold of the registry's write lock, so that `stats` sees them in exactly one
        // place (see `crate::stats`). The space is dead: nothing counts in its block
        // any more, and the lock just released orders every earlier count before
        // this read. Only the destroyer that removes the space folds (a racing double
        // destroy does not).
        #[cfg(not(gmem_loom_bug = "stats_fold_after_unregister"))]
        {
            let mut spaces = self.spaces.write();
            if let Some(removed) = spaces.remove(id.index, id.generation) {
                space.counters.fold_into(&self.counters);
                SpaceInner::unregistered(removed);
            }
        }
        // Deliberately broken (loom model `stats` must catch it): the space leaves the
        // registry before its counts reach the global counters, so a snapshot in
        // between misses them.
        #[cfg(gmem_loom_bug = "stats_fold_after_unregister")]
        {
            let removed = self.spaces.write().remove(id.index, id.generation);
            if let Some(removed) = removed {
                space.counters.fold_into(&self.counters);
                SpaceInner::unregistered(removed);
            }
        }
        Ok(())
    }

    /// Attach a device to a space (`gm_as_attach`). Returns the mode in effect: shared
    /// falls back to coherent when no attached table has the device's format.
    ///
    /// # Errors
    /// [`AttachError`]: a stale space or device (or one being destroyed), a device already
    /// attached, 32 attachments or tables already, or a driver that cannot create or fill
    /// the table; nothing changes then.
    ///
    /// # Examples
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// let mut sys = TestSystem::new(16);
    /// let igpu = sys.add_device(1, DevCaps::FAULTABLE, 0, 0); // the host's table format
    /// let nic = sys.add_device(2, DevCaps::empty(), 0, 0); // a format of its own
    /// let (igpu, nic) = (sys.devices[igpu].id, sys.devices[nic].id);
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// // The CPU gets a table of its own and is switched to it (the driver's `activate`).
    /// assert_eq!(gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)?, MmuMode::Coherent);
    /// assert_eq!(gm.dev_active(gm.host())?, Some(space));
    /// // Same format: the integrated GPU shares the CPU's table.
    /// assert_eq!(gm.as_attach(space, igpu, MmuMode::Shared, Activation::Switch)?, MmuMode::Shared);
    /// // No table of its format: shared falls back to coherent; left inactive.
    /// assert_eq!(gm.as_attach(space, nic, MmuMode::Shared, Activation::Leave)?, MmuMode::Coherent);
    /// assert_eq!(gm.dev_active(nic)?, None);
    /// assert_eq!(gm.as_attach(space, nic, MmuMode::Coherent, Activation::Leave), Err(AttachError::AlreadyAttached));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_attach(
        &self,
        space_id: SpaceId,
        id: DeviceId,
        mode: MmuMode,
        activation: Activation,
    ) -> Result<MmuMode, AttachError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(AttachError::UnknownSpace(space_id))?;
        let dev = self.device(id).ok_or(AttachError::UnknownDevice(id))?;
        let effective = space.lock().attach(&self.counters, space_id, &dev, mode)?;
        // Deliberately broken (loom model `attach` must catch it): the binding is
        // recorded after the space lock is dropped, unchecked, so `dev_destroy` can pass
        // its `StillAttached` check in between.
        #[cfg(gmem_loom_bug = "attach_binds_after_unlock")]
        dev.binding.lock().attached.push(space_id);
        if activation == Activation::Switch {
            self.dev_switch(id, space_id)?;
        }
        Ok(effective)
    }

    /// Allocate a region (`gm_as_alloc`).
    ///
    /// # Errors
    /// [`AllocError`]: a stale space, an argument that is not a page multiple or power of
    /// two, contradictory constraints, no free range, or an injected failure; the arena is
    /// unchanged.
    ///
    /// # Examples
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// let sys = TestSystem::new(16);
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// let buf = gm.as_alloc(space, AllocRequest::new(16 * PAGE_SIZE))?;
    /// // 2 MiB aligned, for a large leaf.
    /// let big = gm.as_alloc(space, AllocRequest { align: 2 << 20, ..AllocRequest::new(2 << 20) })?;
    /// assert!(big.start.is_aligned(2 << 20));
    /// assert_eq!(gm.region_info(buf)?.range.len, 16 * PAGE_SIZE);
    /// // No frame is taken until a fault.
    /// assert_eq!(gm.dev_frames(gm.host())?.free, 16);
    /// // Sizes are whole pages.
    /// assert!(matches!(gm.as_alloc(space, AllocRequest::new(100)), Err(AllocError::BadArgument(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_alloc(&self, space_id: SpaceId, req: AllocRequest) -> Result<Region, AllocError> {
        let _critical = self.critical();
        use crate::addr::AddrError;
        let space = self
            .space(space_id)
            .ok_or(AllocError::UnknownSpace(space_id))?;
        let unaligned = |v: u64| {
            AllocError::BadArgument(AddrError::Unaligned {
                addr: v,
                align: PAGE_SIZE,
            })
        };
        if req.size == 0 || req.size % PAGE_SIZE != 0 {
            return Err(if req.size == 0 {
                AllocError::BadArgument(AddrError::BadRange { start: 0, len: 0 })
            } else {
                unaligned(req.size)
            });
        }
        if !req.hint.is_page_aligned() {
            return Err(unaligned(req.hint.as_u64()));
        }
        let pow2_or_zero = |v: u64| v == 0 || v.is_power_of_two();
        if !pow2_or_zero(req.align) || (req.align != 0 && req.align < PAGE_SIZE) {
            return Err(unaligned(req.align));
        }
        if !pow2_or_zero(req.nocross) || (req.nocross != 0 && req.nocross < PAGE_SIZE) {
            return Err(unaligned(req.nocross));
        }
        let guard = if space.policy.contains(AllocPolicy::GUARDED) {
            PAGE_SIZE
        } else {
            0
        };
        let reserve = req
            .size
            .checked_add(2 * guard)
            .ok_or(AllocError::NoSpace { size: req.size })?;
        let plain = req.align <= PAGE_SIZE
            && req.nocross == 0
            && req.max.as_u64() == u64::MAX
            && req.hint.as_u64() == 0;
        let map_err = |e: vmem::AllocError| match e {
            vmem::AllocError::BadConstraint { reason } => AllocError::BadConstraint(reason),
            #[cfg(feature = "test-util")]
            vmem::AllocError::Injected => AllocError::Injected,
            _ => AllocError::NoSpace { size: req.size },
        };
        let res = if plain {
            space.arena.alloc(reserve).map_err(map_err)?
        } else {
            let align = req.align.max(PAGE_SIZE);
            let mut c = Constraint::new(reserve);
            c.align = align;
            c.phase = (align - guard % align) % align;
            c.nocross = req.nocross;
            c.max = req.max.as_u64().saturating_add(guard);
            c.fit = fit_of(space.policy);
            let hinted = (req.hint.as_u64() != 0).then(|| {
                let mut h = c;
                h.min = req.hint.as_u64().saturating_sub(guard);
                space.arena.xalloc(&h)
            });
            match hinted {
                Some(Ok(a)) => a,
                Some(Err(vmem::AllocError::BadConstraint { reason })) => {
                    return Err(AllocError::BadConstraint(reason))
                }
                _ => space.arena.xalloc(&c).map_err(map_err)?,
            }
        };
        let start = res + guard;
        let Some(id) = space.lock().insert_region(start, req.size, res, reserve) else {
            let _ = space.arena.free(res, reserve);
            return Err(AllocError::UnknownSpace(space_id));
        };
        Ok(Region {
            space: space_id,
            start: VirtAddr::new(start),
            id,
        })
    }

    /// The region holding `va` (`gm_as_lookup`).
    ///
    /// # Errors
    /// [`LookupError`] for a stale space or an address no region holds.
    ///
    /// # Examples
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// let sys = TestSystem::new(16);
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// let r = gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))?;
    /// // Any address inside the region names it (a fault handler's first question).
    /// let inside = VirtAddr::new(r.start.as_u64() + 3 * PAGE_SIZE + 8);
    /// let info = gm.as_lookup(space, inside)?;
    /// assert_eq!(info.region, r);
    /// assert_eq!(info.prot, Prot::RW);
    /// let past = VirtAddr::new(r.start.as_u64() + 4 * PAGE_SIZE);
    /// assert_eq!(gm.as_lookup(space, past), Err(LookupError::NotAllocated(past)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_lookup(&self, space_id: SpaceId, va: VirtAddr) -> Result<RegionInfo, LookupError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(LookupError::UnknownSpace(space_id))?;
        let st = space.lock();
        let (start, r) = st
            .region_at(va.as_u64())
            .ok_or(LookupError::NotAllocated(va))?;
        Ok(info(space_id, start, r))
    }

    /// Every region of a space, in address order.
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle.
    pub fn as_regions(&self, space_id: SpaceId) -> Result<Vec<RegionInfo>, SpaceError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        let st = space.lock();
        Ok(st.regions().map(|(s, r)| info(space_id, s, r)).collect())
    }

    /// Wait for every queued asynchronous request of the space (`gm_as_synchronize`):
    /// when it returns, every request queued before the call has been invalidated, its
    /// frames and ranges released, and its callback run — also when another thread
    /// drained the request and is still running callbacks, which this call waits for.
    /// A completion callback must therefore not call `as_synchronize` on its own space
    /// (it would wait for itself); every other KPI call is allowed in a callback.
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle.
    ///
    /// # Examples
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    ///
    /// let sys = TestSystem::new(16);
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)?;
    /// let r = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE))?;
    /// sys.write(0, r.start, b"data").unwrap();
    /// let done = Arc::new(AtomicBool::new(false));
    /// let flag = done.clone();
    /// gm.region_unmap(r, MapFlags::ASYNC, Some(Box::new(move |result| {
    ///     assert_eq!(result, Ok(()));
    ///     flag.store(true, Ordering::SeqCst);
    /// })))?;
    /// assert_eq!((gm.as_pending(space)?, done.load(Ordering::SeqCst)), (1, false));
    /// gm.as_synchronize(space)?; // invalidates, frees the frame, runs the callback
    /// assert_eq!((gm.as_pending(space)?, done.load(Ordering::SeqCst)), (0, true));
    /// assert_eq!(gm.dev_frames(gm.host())?.free, 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_synchronize(&self, space_id: SpaceId) -> Result<(), SpaceError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        let in_flight = {
            let mut st = space.lock();
            st.drain(&self.counters, &space.arena);
            st.callbacks_in_flight()
        };
        while in_flight.load(crate::sync::Ordering::Acquire) != 0 {
            crate::sync::spin_wait();
        }
        Ok(())
    }

    /// Requests the space's MMU queue holds before it drains by itself (at least 1).
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle.
    pub fn as_set_batch_limit(&self, space_id: SpaceId, limit: usize) -> Result<(), SpaceError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        space.lock().set_batch_limit(limit);
        Ok(())
    }

    /// Number of queued asynchronous requests.
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle.
    pub fn as_pending(&self, space_id: SpaceId) -> Result<usize, SpaceError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        let n = space.lock().queued();
        Ok(n)
    }

    /// The vmem statistics of the space's virtual-range arena.
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle.
    pub fn as_arena_stats(&self, space_id: SpaceId) -> Result<vmem::ArenaStats, SpaceError> {
        let _critical = self.critical();
        Ok(self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?
            .arena
            .stats())
    }

    /// Failure injection for tests: every `n`-th region allocation of the space fails.
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle.
    #[cfg(feature = "test-util")]
    pub fn as_fail_every(&self, space_id: SpaceId, n: u32) -> Result<(), SpaceError> {
        let _critical = self.critical();
        self.space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?
            .arena
            .set_fail_every(n);
        Ok(())
    }
}
