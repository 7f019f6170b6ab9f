//! The [`Gmem`] instance and the KPI entry points.
//!
//! One `Gmem` per kernel. It owns the device table (with the predefined host CPU
//! device), the address-space table and the statistics. Every KPI function resolves its
//! handles (a stale handle is a typed error), takes the one space lock it needs, does its
//! work in [`crate::space`] / [`crate::fault`] / [`crate::queue`], drops the lock and
//! then runs the completion callbacks that became ready.

use crate::addr::{PhysAddr, VaRange, VirtAddr, PAGE_SIZE};
use crate::device::{Binding, DeviceDesc, DeviceInner};
use crate::error::{AllocError, AttachError, DeviceError, FaultError, RegionError, SpaceError};
use crate::fault::FaultResolution;
use crate::flags::{AllocPolicy, DevCaps, MapFlags, PageSizes, Prot};
use crate::handle::{DeviceId, MappingSetId, Slots, SpaceId};
use crate::lpt::{PageEntry, EXTERNAL, PENDING, WIRED};
use crate::physmem::{FrameCounts, PhysMem};
use crate::platform::Platform;
use crate::queue::Callback;
use crate::space::{
    AllocRequest, Attachment, MappingSet, MmuMode, PageTable, Placement, PlacementMode,
    PlacementTarget, Region, RegionInfo, RegionRec, SpaceInner, SpaceState, MAX_TABLES,
};
use crate::stats::{Counters, Stats};
use crate::sync::{Arc, Mutex, RwLock};
use crate::vmem::{self, Arena, ArenaConfig, Constraint, FitPolicy};
use alloc::vec::Vec;
use core::any::Any;

/// Largest region size served by an address space's quantum caches (`CACHED` policy).
pub const QCACHE_MAX: u64 = 32 * PAGE_SIZE;

/// One GMEM instance: the memory manager of a kernel.
pub struct Gmem {
    platform: Arc<dyn Platform>,
    pub(crate) counters: Counters,
    devices: RwLock<Slots<Arc<DeviceInner>>>,
    spaces: RwLock<Slots<Arc<SpaceInner>>>,
    pub(crate) host: Arc<DeviceInner>,
}

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

fn new_device(id: DeviceId, desc: DeviceDesc, extra: DevCaps) -> Result<DeviceInner, DeviceError> {
    let page_sizes = desc.mmu.page_sizes();
    if !page_sizes.contains(PageSizes::S4K) {
        return Err(DeviceError::No4KPages);
    }
    Ok(DeviceInner {
        id,
        name: desc.name,
        mmu: desc.mmu,
        memory: desc.memory,
        caps: desc.caps | extra,
        page_sizes,
        data: desc.data,
        phys: Mutex::new(PhysMem::new()),
        registered: crate::sync::AtomicU64::new(0),
        binding: Mutex::new(Binding::default()),
    })
}

impl Gmem {
    /// A new instance whose host CPU device (`gm_dev_CPU`) is described by `host`. Its
    /// memory is registered with [`Gmem::dev_register_physmem`] like any device's.
    pub fn new(platform: Arc<dyn Platform>, host: DeviceDesc) -> Result<Gmem, DeviceError> {
        if !host.mmu.page_sizes().contains(PageSizes::S4K) {
            return Err(DeviceError::No4KPages);
        }
        let mut devices: Slots<Arc<DeviceInner>> = Slots::default();
        let mut desc = Some(host);
        let mut host = None;
        devices.insert_with(|index, generation| {
            let d = desc.take().expect("inserted once");
            let dev = Arc::new(
                new_device(
                    DeviceId { index, generation },
                    d,
                    DevCaps::HOST | DevCaps::FAULTABLE,
                )
                .expect("4 KiB pages checked above"),
            );
            host = Some(dev.clone());
            dev
        });
        let host = host.expect("host inserted");
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

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    pub(crate) fn device(&self, id: DeviceId) -> Option<Arc<DeviceInner>> {
        self.devices.read().get(id.index, id.generation).cloned()
    }

    pub(crate) fn space(&self, id: SpaceId) -> Option<Arc<SpaceInner>> {
        self.spaces.read().get(id.index, id.generation).cloned()
    }

    // ----- devices -------------------------------------------------------------------

    /// Create a device (`gm_dev_create`).
    pub fn dev_create(&self, desc: DeviceDesc) -> Result<DeviceId, DeviceError> {
        if !desc.mmu.page_sizes().contains(PageSizes::S4K) {
            return Err(DeviceError::No4KPages);
        }
        let mut devices = self.devices.write();
        let mut desc = Some(desc);
        let (index, generation) = devices.insert_with(|index, generation| {
            let d = desc.take().expect("inserted once");
            Arc::new(
                new_device(DeviceId { index, generation }, d, DevCaps::empty())
                    .expect("4 KiB pages checked above"),
            )
        });
        Ok(DeviceId { index, generation })
    }

    /// Destroy a device (`gm_dev_destroy`). It must be detached from every space and its
    /// memory must back no page.
    pub fn dev_destroy(&self, id: DeviceId) -> Result<(), DeviceError> {
        let dev = self.device(id).ok_or(DeviceError::UnknownDevice(id))?;
        if dev.caps.contains(DevCaps::HOST) {
            return Err(DeviceError::IsHost);
        }
        let spaces = dev.binding.lock().attached.len();
        if spaces > 0 {
            return Err(DeviceError::StillAttached { spaces });
        }
        let c = dev.phys.lock().counts();
        let used = c.active + c.inactive + c.wired + c.pending;
        if used > 0 {
            return Err(DeviceError::MemoryInUse { frames: used });
        }
        let mut devices = self.devices.write();
        devices
            .remove(id.index, id.generation)
            .ok_or(DeviceError::UnknownDevice(id))?;
        Ok(())
    }

    /// Register `[begin, end)` as local memory of the device
    /// (`gm_dev_register_physmem`).
    pub fn dev_register_physmem(
        &self,
        id: DeviceId,
        begin: PhysAddr,
        end: PhysAddr,
    ) -> Result<(), DeviceError> {
        let dev = self.device(id).ok_or(DeviceError::UnknownDevice(id))?;
        if dev.memory.is_none() {
            return Err(DeviceError::NoMemoryInterface(id));
        }
        let mut phys = dev.phys.lock();
        phys.register(begin, end).map_err(DeviceError::Register)?;
        dev.registered
            .store(phys.counts().registered, crate::sync::Ordering::Release);
        Ok(())
    }

    /// Frame counts of the device's memory by state.
    pub fn dev_frames(&self, id: DeviceId) -> Result<FrameCounts, DeviceError> {
        let dev = self.device(id).ok_or(DeviceError::UnknownDevice(id))?;
        let c = dev.phys.lock().counts();
        Ok(c)
    }

    /// The opaque driver data given at creation.
    pub fn dev_data(
        &self,
        id: DeviceId,
    ) -> Result<Option<Arc<dyn Any + Send + Sync>>, DeviceError> {
        Ok(self
            .device(id)
            .ok_or(DeviceError::UnknownDevice(id))?
            .data
            .clone())
    }

    /// The name the device was created with.
    pub fn dev_name(&self, id: DeviceId) -> Result<alloc::string::String, DeviceError> {
        Ok(self
            .device(id)
            .ok_or(DeviceError::UnknownDevice(id))?
            .name
            .clone())
    }

    /// The device's capabilities.
    pub fn dev_caps(&self, id: DeviceId) -> Result<DevCaps, DeviceError> {
        Ok(self.device(id).ok_or(DeviceError::UnknownDevice(id))?.caps)
    }

    /// The space the device is active in.
    pub fn dev_active(&self, id: DeviceId) -> Result<Option<SpaceId>, DeviceError> {
        let dev = self.device(id).ok_or(DeviceError::UnknownDevice(id))?;
        let active = dev.binding.lock().active.as_ref().map(|s| s.id);
        Ok(active)
    }

    /// Activate the device in `space`, deactivating it wherever it was active
    /// (`gm_dev_switch`).
    pub fn dev_switch(&self, id: DeviceId, space_id: SpaceId) -> Result<(), AttachError> {
        let dev = self.device(id).ok_or(AttachError::UnknownDevice(id))?;
        let space = self
            .space(space_id)
            .ok_or(AttachError::UnknownSpace(space_id))?;
        let root = {
            let st = space.state.lock();
            let slot = st.slot_of(id).ok_or(AttachError::NotAttached)?;
            let t = st.attached[slot].as_ref().expect("slot is live").table;
            st.tables[t].as_ref().expect("attached table is live").root
        };
        let mut b = dev.binding.lock();
        b.active = Some(space);
        dev.mmu.activate(Some(root));
        Ok(())
    }

    /// Detach the device from `space`, removing its page table (or its use of a shared
    /// one) and invalidating its TLB (`gm_dev_detach`).
    pub fn dev_detach(&self, id: DeviceId, space_id: SpaceId) -> Result<(), AttachError> {
        if self.device(id).is_none() {
            return Err(AttachError::UnknownDevice(id));
        }
        let space = self
            .space(space_id)
            .ok_or(AttachError::UnknownSpace(space_id))?;
        let ready = {
            let mut st = space.state.lock();
            let slot = st.slot_of(id).ok_or(AttachError::NotAttached)?;
            st.drain(&self.counters, &space.arena);
            st.detach_slot(&self.counters, slot, space_id);
            st.queue.take_ready()
        };
        ready.run();
        Ok(())
    }

    /// Serve a translation fault of a device (`gm_dev_fault`): on success the driver
    /// retries the access.
    ///
    /// This call allocates (logical page table leaves, the async queue, migration's
    /// bounce buffer live on the heap) and takes spin locks: a kernel must not call it
    /// from a context that holds its heap lock or that the heap's lock holder can be
    /// interrupted by.
    pub fn dev_fault(
        &self,
        id: DeviceId,
        va: VirtAddr,
        access: Prot,
    ) -> Result<FaultResolution, FaultError> {
        let r = self.fault_inner(id, va, access);
        if r.is_err() {
            Counters::add(&self.counters.faults_failed, 1);
        }
        r
    }

    fn fault_inner(
        &self,
        id: DeviceId,
        va: VirtAddr,
        access: Prot,
    ) -> Result<FaultResolution, FaultError> {
        let dev = self.device(id).ok_or(FaultError::UnknownDevice(id))?;
        if !dev.faultable() {
            return Err(FaultError::NotFaultable(id));
        }
        let space = dev
            .binding
            .lock()
            .active
            .clone()
            .ok_or(FaultError::NotActive(id))?;
        let mut st = space.state.lock();
        let slot = match st.slot_of(id) {
            Some(s) if st.alive => s,
            _ => return Err(FaultError::NotActive(id)),
        };
        let r = st.fault(self, &space, slot, va, access);
        let ready = st.queue.take_ready();
        drop(st);
        ready.run();
        r
    }

    // ----- address spaces ------------------------------------------------------------

    /// Create an address space over `[begin, end)` (`gm_as_create`).
    pub fn as_create(
        &self,
        begin: VirtAddr,
        end: VirtAddr,
        policy: AllocPolicy,
    ) -> Result<SpaceId, SpaceError> {
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
        let arena = Arena::new(config, Some(self.platform.clone()))
            .expect("page quantum and qcache_max are valid");
        arena.add_span(begin.as_u64(), len).map_err(|_| {
            SpaceError::BadRange(crate::addr::AddrError::BadRange {
                start: begin.as_u64(),
                len,
            })
        })?;
        let mut spaces = self.spaces.write();
        let (index, generation) = spaces.insert_with(|index, generation| {
            Arc::new(SpaceInner {
                id: SpaceId { index, generation },
                range,
                policy,
                arena,
                state: Mutex::new(SpaceState::new(self.host.clone())),
            })
        });
        Ok(SpaceId { index, generation })
    }

    /// Destroy an address space (`gm_as_destroy`): drain its queue, detach every device,
    /// free every frame and region.
    pub fn as_destroy(&self, id: SpaceId) -> Result<(), SpaceError> {
        let space = self.space(id).ok_or(SpaceError::UnknownSpace(id))?;
        let ready = {
            let mut st = space.state.lock();
            st.drain(&self.counters, &space.arena);
            for slot in 0..st.attached.len() {
                st.detach_slot(&self.counters, slot, id);
            }
            let entries: Vec<(u64, PageEntry)> = st.lpt.iter().collect();
            for (v, e) in entries {
                st.release_frame(&e, false);
                st.lpt.take(v);
            }
            let regions: Vec<(u64, u64)> = st
                .regions
                .values()
                .map(|r| (r.reserve_start, r.reserve_len))
                .collect();
            for (s, l) in regions {
                let _ = space.arena.free(s, l);
            }
            st.regions.clear();
            st.alive = false;
            st.queue.take_ready()
        };
        self.spaces.write().remove(id.index, id.generation);
        ready.run();
        Ok(())
    }

    /// Attach a device to a space (`gm_as_attach`). Returns the mode in effect: shared
    /// falls back to coherent when no attached table has the device's format.
    pub fn as_attach(
        &self,
        space_id: SpaceId,
        id: DeviceId,
        mode: MmuMode,
        activate: bool,
    ) -> Result<MmuMode, AttachError> {
        let space = self
            .space(space_id)
            .ok_or(AttachError::UnknownSpace(space_id))?;
        let dev = self.device(id).ok_or(AttachError::UnknownDevice(id))?;
        let effective = {
            let mut st = space.state.lock();
            if !st.alive {
                return Err(AttachError::UnknownSpace(space_id));
            }
            if st.slot_of(id).is_some() {
                return Err(AttachError::AlreadyAttached);
            }
            let slot = match st.attached.iter().position(|a| a.is_none()) {
                Some(s) => s,
                None if st.attached.len() < MAX_TABLES => {
                    st.attached.push(None);
                    st.attached.len() - 1
                }
                None => return Err(AttachError::TooManyAttachments),
            };
            let format = dev.mmu.format();
            let shared = (mode == MmuMode::Shared)
                .then(|| {
                    st.tables.iter().position(|t| {
                        t.as_ref()
                            .is_some_and(|t| t.mode != MmuMode::Replicate && t.format == format)
                    })
                })
                .flatten();
            let (t, effective) = match shared {
                Some(t) => (t, MmuMode::Shared),
                None => {
                    let t = match st.tables.iter().position(|t| t.is_none()) {
                        Some(t) => t,
                        None if st.tables.len() < MAX_TABLES => {
                            st.tables.push(None);
                            st.tables.len() - 1
                        }
                        None => return Err(AttachError::TooManyAttachments),
                    };
                    let root = dev.mmu.create_page_table().map_err(AttachError::Mmu)?;
                    st.tables[t] = Some(PageTable {
                        root,
                        mmu: dev.mmu.clone(),
                        format,
                        mode,
                        users: 0,
                        faultable: true,
                    });
                    (
                        t,
                        if mode == MmuMode::Shared {
                            MmuMode::Coherent
                        } else {
                            mode
                        },
                    )
                }
            };
            let table = st.tables[t].as_mut().expect("just set");
            table.users |= 1 << slot;
            table.faultable &= dev.faultable();
            st.attached[slot] = Some(Attachment {
                dev: dev.clone(),
                table: t,
            });
            if let Err(e) = st.fill_table(&self.counters, t) {
                st.detach_slot(&self.counters, slot, space_id);
                return Err(AttachError::Mmu(e));
            }
            effective
        };
        dev.binding.lock().attached.push(space_id);
        if activate {
            self.dev_switch(id, space_id)?;
        }
        Ok(effective)
    }

    /// Allocate a region (`gm_as_alloc`).
    pub fn as_alloc(&self, space_id: SpaceId, req: AllocRequest) -> Result<Region, AllocError> {
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
        let mut st = space.state.lock();
        if !st.alive {
            let _ = space.arena.free(res, reserve);
            return Err(AllocError::UnknownSpace(space_id));
        }
        let id = st.next_region_id;
        st.next_region_id += 1;
        let start = res + guard;
        st.regions.insert(
            start,
            RegionRec {
                id,
                len: req.size,
                reserve_start: res,
                reserve_len: reserve,
                prot: Prot::RW,
                placement: Placement::default(),
                granularity: 0,
                explicit: false,
                mapped: false,
                set: None,
            },
        );
        Ok(Region {
            space: space_id,
            start: VirtAddr::new(start),
            id,
        })
    }

    /// The region holding `va` (`gm_as_lookup`).
    pub fn as_lookup(&self, space_id: SpaceId, va: VirtAddr) -> Result<RegionInfo, RegionError> {
        let space = self
            .space(space_id)
            .ok_or(RegionError::UnknownSpace(space_id))?;
        let st = space.state.lock();
        let (start, r) = st
            .region_at(va.as_u64())
            .ok_or(RegionError::NotAllocated(va))?;
        Ok(info(space_id, start, r))
    }

    /// Every region of a space, in address order.
    pub fn as_regions(&self, space_id: SpaceId) -> Result<Vec<RegionInfo>, SpaceError> {
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        let st = space.state.lock();
        Ok(st
            .regions
            .iter()
            .map(|(s, r)| info(space_id, *s, r))
            .collect())
    }

    /// Wait for every queued asynchronous request of the space (`gm_as_synchronize`):
    /// when it returns, every request queued before the call has been invalidated, its
    /// frames and ranges released, and its callback run — also when another thread
    /// drained the request and is still running callbacks, which this call waits for.
    /// A completion callback must therefore not call `as_synchronize` on its own space
    /// (it would wait for itself); every other KPI call is allowed in a callback.
    pub fn as_synchronize(&self, space_id: SpaceId) -> Result<(), SpaceError> {
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        let (ready, in_flight) = {
            let mut st = space.state.lock();
            st.drain(&self.counters, &space.arena);
            (st.queue.take_ready(), st.queue.in_flight.clone())
        };
        ready.run();
        while in_flight.load(crate::sync::Ordering::Acquire) != 0 {
            crate::sync::spin_wait();
        }
        Ok(())
    }

    /// Requests the space's MMU queue holds before it drains by itself (at least 1).
    pub fn as_set_batch_limit(&self, space_id: SpaceId, limit: usize) -> Result<(), SpaceError> {
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        space.state.lock().queue.batch_limit = limit.max(1);
        Ok(())
    }

    /// Number of queued asynchronous requests.
    pub fn as_pending(&self, space_id: SpaceId) -> Result<usize, SpaceError> {
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        let n = space.state.lock().queue.len();
        Ok(n)
    }

    /// The vmem statistics of the space's virtual-range arena.
    pub fn as_arena_stats(&self, space_id: SpaceId) -> Result<vmem::ArenaStats, SpaceError> {
        Ok(self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?
            .arena
            .stats())
    }

    /// Failure injection for tests: every `n`-th region allocation of the space fails.
    pub fn as_fail_every(&self, space_id: SpaceId, n: u32) -> Result<(), SpaceError> {
        self.space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?
            .arena
            .set_fail_every(n);
        Ok(())
    }

    // ----- regions -------------------------------------------------------------------

    fn with_region<R>(
        &self,
        region: Region,
        f: impl FnOnce(&Gmem, &SpaceInner, &mut SpaceState) -> Result<R, RegionError>,
    ) -> Result<R, RegionError> {
        let space = self
            .space(region.space)
            .ok_or(RegionError::UnknownSpace(region.space))?;
        let (r, ready) = {
            let mut st = space.state.lock();
            if st.region(region).is_none() {
                return Err(RegionError::StaleRegion(region));
            }
            let r = f(self, &space, &mut st);
            (r, st.queue.take_ready())
        };
        ready.run();
        r
    }

    /// [`Gmem::with_region`] for the calls that move or prepare pages and so answer with
    /// a [`FaultError`]; `f` also gets the region's pages `(first, count)`.
    fn with_region_faulting<R>(
        &self,
        region: Region,
        f: impl FnOnce(&Gmem, &SpaceInner, &mut SpaceState, u64, u64) -> Result<R, FaultError>,
    ) -> Result<R, FaultError> {
        let space = self
            .space(region.space)
            .ok_or(FaultError::NotAllocated(region.start))?;
        let (r, ready) = {
            let mut st = space.state.lock();
            let Some(rec) = st.region(region) else {
                return Err(FaultError::NotAllocated(region.start));
            };
            let (first, pages) = SpaceState::pages_of(region.start.as_u64(), rec.len);
            let r = f(self, &space, &mut st, first, pages);
            (r, st.queue.take_ready())
        };
        ready.run();
        r
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
        self.with_region(region, |gm, space, st| {
            let start = region.start.as_u64();
            let (first, pages) = st.settle(gm, space, region);
            let rec = st.regions.remove(&start).expect("checked");
            if let Some(set) = rec.set {
                if let Some(s) = st.sets.get_mut(set.index, set.generation) {
                    s.regions.retain(|r| *r != region);
                }
            }
            if flags.contains(MapFlags::ASYNC) {
                let d = st.discard_pages(&gm.counters, first, pages, true);
                st.enqueue_unmap(
                    &gm.counters,
                    &space.arena,
                    d,
                    Some((rec.reserve_start, rec.reserve_len)),
                    callback,
                );
            } else {
                st.discard_pages(&gm.counters, first, pages, false);
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
        self.with_region(region, |gm, space, st| {
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
            if st.any_pending(first, pages) {
                st.drain(&gm.counters, &space.arena);
            }
            if already
                || st
                    .lpt
                    .entries_in(first, pages)
                    .any(|(_, e)| e.is_populated())
            {
                return Err(RegionError::AlreadyMapped);
            }
            let asynchronous = flags.contains(MapFlags::ASYNC);
            let mem = st.mem_index(&memdev);
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
                st.enqueue_map(&gm.counters, &space.arena, first, pages, callback);
            } else if let Err(e) = st.mirror(&gm.counters, first, pages, mask) {
                st.discard_pages(&gm.counters, first, pages, false);
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
        self.with_region(region, |gm, space, st| {
            st.unmap_region(gm, space, region, flags, callback);
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
        self.with_region(region, |gm, space, st| {
            let was = st.region(region).expect("checked").placement.mode;
            if placement.mode == PlacementMode::Unique && was != PlacementMode::Unique {
                // Remote access let several tables map one frame; unique allows one.
                // Drop every mapping of such pages (replicas stay): the next fault
                // places each page by the new policy.
                let (first, pages) = st.settle(gm, space, region);
                let replicas = st.replica_mask();
                let touched: Vec<(u64, u32)> = st
                    .lpt
                    .entries_in(first, pages)
                    .filter(|(_, e)| !e.has(WIRED) && (e.mapped & !replicas).count_ones() > 1)
                    .map(|(v, e)| (v, e.mapped & !replicas))
                    .collect();
                st.unmap_entries(&gm.counters, &touched, false);
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
        self.with_region(region, |gm, space, st| {
            let (first, pages) = st.settle(gm, space, region);
            let touched: Vec<(u64, u32)> = st
                .lpt
                .entries_in(first, pages)
                .filter(|(_, e)| e.mapped != 0)
                .map(|(v, e)| (v, e.mapped))
                .collect();
            let runs = crate::space::table_runs(&touched);
            for run in &runs {
                let table = st.tables[run.table]
                    .as_ref()
                    .expect("mapped tables are live");
                table.mmu.protect(table.root, run.range, prot)?;
            }
            st.invalidate(&gm.counters, &runs);
            st.region_mut(region).expect("checked").prot = prot;
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
        self.with_region_faulting(region, |gm, space, st, first, pages| {
            let prefetch = prefetch && !st.region(region).expect("checked").explicit;
            st.migrate_range(gm, space, first, pages, &dest, prefetch)
        })
    }

    /// Wire the region (the host VM's `mlock`, or a KVM guest whose pass-through device
    /// cannot fault): every page gets a frame — zero-filled at the region's placement
    /// target, host memory when that is "the faulting device" — and is pinned on its
    /// memory's wired queue (never migrated, never evicted), and mapped at once in the
    /// tables of every device that cannot fault. Returns the pages newly wired. On error
    /// no page of the region is left wired by this call.
    pub fn region_wire(&self, region: Region) -> Result<u64, FaultError> {
        self.with_region_faulting(region, |gm, space, st, first, pages| {
            let rec = st.region(region).expect("checked");
            let (placement, explicit) = (rec.placement.target, rec.explicit);
            if explicit {
                Ok(0)
            } else {
                st.wire_range(gm, space, first, pages, placement)
            }
        })
    }

    /// Undo [`Gmem::region_wire`]: the pages may migrate and be evicted again; every
    /// mapping of them except replicate-mode mirrors is removed (devices that cannot
    /// fault lose them; the others fault them back under the region's policy). Caller-given frames
    /// (`region_map`) stay wired.
    pub fn region_unwire(&self, region: Region) -> Result<(), RegionError> {
        self.with_region(region, |gm, space, st| {
            let (first, pages) = st.settle(gm, space, region);
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
            st.unmap_entries(&gm.counters, &touched, false);
            for (v, _) in wired {
                st.set_page_wired(v, false);
            }
            Ok(())
        })
    }

    // ----- mapping sets --------------------------------------------------------------

    /// Create an empty mapping set in a space.
    pub fn mapping_set_create(&self, space_id: SpaceId) -> Result<MappingSetId, SpaceError> {
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        let mut st = space.state.lock();
        let (index, generation) = st.sets.insert_with(|_, _| MappingSet {
            regions: Vec::new(),
        });
        Ok(MappingSetId { index, generation })
    }

    /// Unmap every region of the set; `callback` runs once, when all are unmapped
    /// (`gm_mapping_set_unmap`). The set is empty afterwards.
    pub fn mapping_set_unmap(
        &self,
        space_id: SpaceId,
        set: MappingSetId,
        flags: MapFlags,
        callback: Option<Callback>,
    ) -> Result<(), RegionError> {
        let space = self
            .space(space_id)
            .ok_or(RegionError::UnknownSpace(space_id))?;
        let ready = {
            let mut st = space.state.lock();
            let regions = match st.sets.get_mut(set.index, set.generation) {
                Some(s) => core::mem::take(&mut s.regions),
                None => return Err(RegionError::UnknownSet(set)),
            };
            let n = regions.len();
            let mut callback = callback;
            for (i, region) in regions.into_iter().enumerate() {
                let cb = if i + 1 == n { callback.take() } else { None };
                st.unmap_region(self, &space, region, flags, cb);
            }
            st.queue.complete_now(callback, Ok(()));
            st.queue.take_ready()
        };
        ready.run();
        Ok(())
    }

    /// Destroy a mapping set (its regions stay mapped).
    pub fn mapping_set_destroy(
        &self,
        space_id: SpaceId,
        set: MappingSetId,
    ) -> Result<(), RegionError> {
        let space = self
            .space(space_id)
            .ok_or(RegionError::UnknownSpace(space_id))?;
        let mut st = space.state.lock();
        let s = st
            .sets
            .remove(set.index, set.generation)
            .ok_or(RegionError::UnknownSet(set))?;
        for r in s.regions {
            if let Some(rec) = st.region_mut(r) {
                rec.set = None;
            }
        }
        Ok(())
    }
}

impl Drop for Gmem {
    /// Destroy every address space: devices and their active spaces refer to each other
    /// (a device knows where it is active, a space holds its attached devices), and
    /// destroying the spaces breaks those cycles so that everything is freed.
    fn drop(&mut self) {
        let spaces = self.spaces.read().keys();
        for (index, generation) in spaces {
            let _ = self.as_destroy(SpaceId { index, generation });
        }
    }
}

fn info(space: SpaceId, start: u64, r: &RegionRec) -> RegionInfo {
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

impl SpaceState {
    /// The pages of a live region, after draining the queue if any of them has a
    /// request pending (an operation never races a queued invalidation).
    pub(crate) fn settle(&mut self, gm: &Gmem, space: &SpaceInner, region: Region) -> (u64, u64) {
        let len = self
            .region(region)
            .expect("the caller checked the region")
            .len;
        let (first, pages) = SpaceState::pages_of(region.start.as_u64(), len);
        if self.any_pending(first, pages) {
            self.drain(&gm.counters, &space.arena);
        }
        (first, pages)
    }

    /// Pin (or unpin) a populated page: its entry's wired mark and its frame's queue.
    fn set_page_wired(&mut self, vpn: u64, wired: bool) {
        let e = self.lpt.update(vpn, |x| {
            if wired {
                x.flags |= WIRED;
            } else {
                x.flags &= !WIRED;
            }
            *x
        });
        self.memories[e.mem as usize]
            .phys
            .lock()
            .set_wired(e.pfn, wired);
    }

    /// Populate and pin `[first, first + pages)`; see [`Gmem::region_wire`].
    fn wire_range(
        &mut self,
        gm: &Gmem,
        space: &SpaceInner,
        first: u64,
        pages: u64,
        target: PlacementTarget,
    ) -> Result<u64, FaultError> {
        if self.any_pending(first, pages) {
            self.drain(&gm.counters, &space.arena);
        }
        let dest = self.target_of(gm, &gm.host, target);
        let mut wired = Vec::new();
        let mut result = Ok(());
        for vpn in first..first + pages {
            let e = self.lpt.get(vpn);
            if e.has(WIRED) {
                continue;
            }
            if !e.is_populated() {
                if let Err(err) = self.prepare_page(gm, space, vpn, &dest) {
                    result = Err(err);
                    break;
                }
            }
            self.set_page_wired(vpn, true);
            wired.push(vpn);
        }
        if result.is_ok() {
            let mask = self.wired_mask();
            result = self
                .mirror(&gm.counters, first, pages, mask)
                .map_err(FaultError::Mmu);
        }
        if let Err(err) = result {
            let mask = self.wired_mask() & !self.replica_mask();
            let touched: Vec<(u64, u32)> = wired
                .iter()
                .map(|v| (*v, self.lpt.get(*v).mapped & mask))
                .filter(|(_, m)| *m != 0)
                .collect();
            self.unmap_entries(&gm.counters, &touched, false);
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
        gm: &Gmem,
        space: &SpaceInner,
        region: Region,
        flags: MapFlags,
        callback: Option<Callback>,
    ) {
        if self.region(region).is_none() {
            self.queue.complete_now(callback, Ok(()));
            return;
        }
        let (first, pages) = self.settle(gm, space, region);
        if flags.contains(MapFlags::ASYNC) {
            let d = self.discard_pages(&gm.counters, first, pages, true);
            self.enqueue_unmap(&gm.counters, &space.arena, d, None, callback);
        } else {
            self.discard_pages(&gm.counters, first, pages, false);
            self.queue.complete_now(callback, Ok(()));
        }
        let r = self.region_mut(region).expect("still allocated");
        r.mapped = false;
        if let Some(set) = r.set.take() {
            if let Some(s) = self.sets.get_mut(set.index, set.generation) {
                s.regions.retain(|x| *x != region);
            }
        }
    }

    /// Fill a new table with what it must hold eagerly: every populated page for a
    /// replicate table, every wired page for a table whose users cannot fault.
    pub(crate) fn fill_table(
        &mut self,
        stats: &Counters,
        t: usize,
    ) -> Result<(), crate::mmu::MmuError> {
        let table = self.tables[t].as_ref().expect("live table");
        let all = table.mode == MmuMode::Replicate;
        if !all && table.faultable {
            return Ok(());
        }
        let mut vpns: Vec<u64> = self
            .lpt
            .iter()
            .filter(|(_, e)| e.is_populated() && (all || e.has(WIRED)) && !e.has(PENDING))
            .map(|(v, _)| v)
            .collect();
        vpns.sort_unstable();
        let mut i = 0;
        while i < vpns.len() {
            let mut n = 1;
            while i + n < vpns.len() && vpns[i + n] == vpns[i] + n as u64 {
                n += 1;
            }
            self.mirror(stats, vpns[i], n as u64, 1 << t)?;
            i += n;
        }
        Ok(())
    }

    /// Remove attachment `slot` of space `space`: the device is deactivated first if it
    /// is active here (so its MMU never points at a destroyed table), then its table
    /// loses a user; a table without users is emptied (unmap + invalidate) and
    /// destroyed, a shared one left behind gets the device's whole TLB invalidated.
    pub(crate) fn detach_slot(&mut self, stats: &Counters, slot: usize, space: SpaceId) {
        let Some(att) = self.attached[slot].as_ref() else {
            return;
        };
        let t = att.table;
        let dev = att.dev.clone();
        {
            let mut b = dev.binding.lock();
            if b.active.as_ref().is_some_and(|s| s.id == space) {
                b.active = None;
                dev.mmu.activate(None);
            }
            b.attached.retain(|s| *s != space);
        }
        let users = self.tables[t]
            .as_ref()
            .map_or(0, |tb| tb.users & !(1 << slot));
        if users == 0 {
            let mut touched: Vec<(u64, u32)> = self
                .lpt
                .iter()
                .filter(|(_, e)| e.mapped & (1 << t) != 0)
                .map(|(v, _)| (v, 1u32 << t))
                .collect();
            touched.sort_unstable();
            self.unmap_entries(stats, &touched, false);
            let table = self.tables[t].take().expect("live table");
            table.mmu.destroy_page_table(table.root);
        } else {
            let table = self.tables[t].as_mut().expect("live table");
            table.users = users;
            dev.mmu.invalidate_all(table.root);
            Counters::add(&stats.invalidations, 1);
        }
        self.attached[slot] = None;
        if let Some(table) = self.tables[t].as_mut() {
            let faultable = self
                .attached
                .iter()
                .flatten()
                .filter(|a| a.table == t)
                .all(|a| a.dev.faultable());
            table.faultable = faultable;
        }
        let hint = (slot + 1) as u8;
        let hinted: Vec<u64> = self
            .lpt
            .iter()
            .filter(|(_, e)| e.hint == hint)
            .map(|(v, _)| v)
            .collect();
        for v in hinted {
            self.lpt.update(v, |e| e.hint = 0);
        }
    }
}
