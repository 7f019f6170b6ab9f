//! A virtual machine: its guest-physical address space in the core, the guest CPU
//! device, the pass-through device, and memory that grows and shrinks.
//!
//! The device-independent part of the driver, following GMEM section 4.2 step by step:
//! - `as_create` makes the guest-physical space `[0, limit)`;
//! - the guest CPU is a faultable device whose MMU is the EPT walker; it is attached
//!   (coherent mode: an EPT table of its own) and active, and an EPT violation is a
//!   `dev_fault` the core serves before the access is retried ([`gmem_sim::Port`]);
//! - the pass-through device is a DMA device behind the IOMMU ([`gmem_iommu`]),
//!   attached to the *same* space, so its IOVAs are guest-physical addresses;
//! - memory is added as slots: `as_alloc` at an exact guest-physical address, then, if
//!   a pass-through device that cannot fault is attached, `region_wire` — every page
//!   gets a host frame now, pinned, and mapped at once in the IOMMU's table (the CPU
//!   side still maps on EPT violations);
//! - memory is removed with `region_dealloc`: the core unmaps the slot from the EPT
//!   *and* the IOMMU tables, invalidates both TLBs, and only then frees the frames. A
//!   DMA to a removed page is an IOMMU fault; nothing of the old frames is reachable.
//!
//! The driver keeps no table of its own of what the device may reach: the core's
//! logical page table is the one view both devices are kept coherent with.

use crate::ept::{ept_tlbs, EptCodec, EptMmu, EptTables};
use gmem_core::{
    Activation, AllocError, AllocPolicy, AllocRequest, AttachError, DevCaps, DeviceDesc,
    DeviceError, DeviceId, Gmem, MapFlags, MmuMode, PhysAddr, PopulateError, Prot, Region,
    RegionError, SpaceError, SpaceId, VirtAddr, PAGE_SIZE,
};
use gmem_iommu::{DmaDevice, DmaError, DmaFault, Iommu, IommuError};
use gmem_sim::{
    AccessError, BoundsError, HierarchyConfig, MemoryMap, Miss, Port, PortStats, SimMemory, SimMmu,
    TlbConfigError,
};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// What a VM is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmConfig {
    /// One past the highest guest-physical address.
    pub guest_phys_limit: u64,
    /// Host-physical frames for EPT tables (a range of host memory the core does not
    /// manage): first address and frame count.
    pub ept_pool: (PhysAddr, u64),
    /// Use 2 MiB EPT leaves where a run allows.
    pub large_pages: bool,
    /// The guest CPU's translation caches.
    pub tlbs: HierarchyConfig,
}

impl VmConfig {
    /// A VM with `vcpus` vCPUs and guest-physical addresses below 64 GiB, EPT tables in
    /// `ept_pool`.
    pub fn new(vcpus: usize, ept_pool: (PhysAddr, u64)) -> VmConfig {
        VmConfig {
            guest_phys_limit: 64 << 30,
            ept_pool,
            large_pages: false,
            tlbs: ept_tlbs(vcpus),
        }
    }
}

/// Why a VM operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvmError {
    /// The EPT table pool was rejected.
    Tables(BoundsError),
    /// The guest TLB geometry was rejected.
    Tlb(TlbConfigError),
    /// The core refused a device.
    Device(DeviceError),
    /// The core refused the guest-physical space.
    Space(SpaceError),
    /// The core refused an attachment.
    Attach(AttachError),
    /// The IOMMU refused the pass-through device.
    Iommu(IommuError),
    /// A pass-through device is already attached.
    PassthroughAttached,
    /// Guest-physical `[gpa, gpa + len)` is not free (or not page aligned / in range).
    SlotUnavailable {
        /// The address asked for.
        gpa: u64,
        /// The length asked for.
        len: u64,
        /// The core's answer.
        error: AllocError,
    },
    /// No memory slot starts at this address.
    NoSlot {
        /// The address given.
        gpa: u64,
    },
    /// Wiring a slot for the pass-through device failed (the slot was removed again).
    Wire(PopulateError),
    /// The core refused a region call.
    Region(RegionError),
}

impl fmt::Display for KvmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kvm: {self:?}")
    }
}

/// Counters of a VM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmStats {
    /// Guest CPU accesses and EPT violations.
    pub guest: PortStats,
    /// Memory slots added.
    pub grows: u64,
    /// Memory slots removed.
    pub shrinks: u64,
    /// Bytes of guest memory now.
    pub guest_bytes: u64,
}

/// A virtual machine with an EPT guest CPU and optionally a pass-through device.
pub struct Vm {
    space: SpaceId,
    ept_tables: Arc<EptTables>,
    ept: Arc<EptMmu>,
    vcpu: DeviceId,
    port: Port,
    passthrough: Option<DmaDevice>,
    slots: BTreeMap<u64, Region>,
    grows: u64,
    shrinks: u64,
}

impl Vm {
    /// A VM in `gm` whose EPT tables live in `memory` (host memory) and whose guest
    /// accesses reach memory through `map`.
    ///
    /// # Errors
    /// - [`KvmError::Tables`]: the EPT pool is not page aligned, has no frame, or does
    ///   not lie inside `memory`.
    /// - [`KvmError::Tlb`]: [`VmConfig::tlbs`] has no vCPU, or a TLB with zero sets or
    ///   ways or more than 2^20 entries.
    /// - [`KvmError::Device`]: `gm` refused the guest CPU (only an MMU without 4 KiB
    ///   pages, which the EPT walker never is).
    /// - [`KvmError::Space`]: `gm` refused `[0, guest_phys_limit)` (zero or not page
    ///   aligned).
    /// - [`KvmError::Attach`]: `gm` could not attach the guest CPU (no EPT pool frame
    ///   for its root: [`AttachError::Mmu`]).
    ///
    /// What was created in `gm` before the failing step (the vCPU, the space) is
    /// destroyed again.
    pub fn new(
        gm: &Gmem,
        memory: Arc<SimMemory>,
        map: Arc<MemoryMap>,
        config: VmConfig,
    ) -> Result<Vm, KvmError> {
        let codec = EptCodec {
            large_pages: config.large_pages,
        };
        let (pool, frames) = config.ept_pool;
        let ept_tables =
            Arc::new(EptTables::new(codec, memory, pool, frames).map_err(KvmError::Tables)?);
        let ept = Arc::new(SimMmu::new(ept_tables.clone(), config.tlbs).map_err(KvmError::Tlb)?);
        let vcpu = gm
            .dev_create(DeviceDesc {
                name: "kvm-vcpu".into(),
                mmu: ept.clone(),
                memory: None,
                caps: DevCaps::FAULTABLE,
                data: None,
            })
            .map_err(KvmError::Device)?;
        let space = match gm.as_create(
            VirtAddr::new(0),
            VirtAddr::new(config.guest_phys_limit),
            AllocPolicy::FIRST_FIT,
        ) {
            Ok(s) => s,
            Err(e) => {
                let _ = gm.dev_destroy(vcpu);
                return Err(KvmError::Space(e));
            }
        };
        if let Err(e) = gm.as_attach(space, vcpu, MmuMode::Coherent, Activation::Switch) {
            let _ = gm.as_destroy(space);
            let _ = gm.dev_destroy(vcpu);
            return Err(KvmError::Attach(e));
        }
        let port = Port::new(ept.clone(), map, None);
        // A fresh port: nothing can be bound to it yet.
        let _ = port.bind(vcpu);
        Ok(Vm {
            space,
            ept_tables,
            ept,
            vcpu,
            port,
            passthrough: None,
            slots: BTreeMap::new(),
            grows: 0,
            shrinks: 0,
        })
    }

    /// The guest-physical address space.
    pub fn space(&self) -> SpaceId {
        self.space
    }

    /// The guest CPU device.
    pub fn vcpu(&self) -> DeviceId {
        self.vcpu
    }

    /// The guest CPU's MMU (EPT walker and caches).
    pub fn ept(&self) -> &Arc<EptMmu> {
        &self.ept
    }

    /// The EPT tables.
    pub fn ept_tables(&self) -> &Arc<EptTables> {
        &self.ept_tables
    }

    /// The pass-through device, if attached.
    pub fn passthrough(&self) -> Option<&DmaDevice> {
        self.passthrough.as_ref()
    }

    /// The memory slots: `(guest-physical address, bytes)`, in address order.
    pub fn slots(&self, gm: &Gmem) -> Vec<(u64, u64)> {
        self.slots
            .iter()
            .filter_map(|(g, r)| gm.region_info(*r).ok().map(|i| (*g, i.range.len)))
            .collect()
    }

    /// A snapshot of the counters.
    pub fn stats(&self, gm: &Gmem) -> VmStats {
        VmStats {
            guest: self.port.stats(),
            grows: self.grows,
            shrinks: self.shrinks,
            guest_bytes: self.slots(gm).iter().map(|(_, l)| l).sum(),
        }
    }

    /// Attach a pass-through DMA device behind `iommu` to the guest-physical space. It
    /// cannot fault, so every slot is wired (populated and mapped in its table now).
    ///
    /// # Errors
    /// - [`KvmError::PassthroughAttached`]: the VM has one already; nothing changes.
    /// - [`KvmError::Iommu`]: `iommu` could not make the device (see
    ///   [`Iommu::create_device`]); nothing changes.
    /// - [`KvmError::Attach`]: `gm` could not attach it to the guest-physical space
    ///   (e.g. no IOMMU table memory for its table); the device is destroyed again.
    /// - [`KvmError::Wire`]: wiring a slot failed (host memory exhausted, or an IOMMU
    ///   table edit failed). The slots wired before it are unwired again and the device
    ///   is detached and destroyed: the VM has no pass-through device, as before (the
    ///   guest pages wiring populated stay populated, with the bytes they had).
    pub fn attach_passthrough(
        &mut self,
        gm: &Gmem,
        iommu: &Iommu,
        name: &str,
    ) -> Result<DeviceId, KvmError> {
        if self.passthrough.is_some() {
            return Err(KvmError::PassthroughAttached);
        }
        let dev = iommu.create_device(gm, name).map_err(KvmError::Iommu)?;
        if let Err(e) = gm.as_attach(self.space, dev.id(), MmuMode::Coherent, Activation::Switch) {
            let _ = gm.dev_destroy(dev.id());
            return Err(KvmError::Attach(e));
        }
        let id = dev.id();
        let slots: Vec<Region> = self.slots.values().copied().collect();
        for (i, region) in slots.iter().enumerate() {
            if let Err(e) = gm.region_wire(*region) {
                // Undo: the slots wired so far are unwired, the device leaves the
                // space and is destroyed (its mappings go with its table).
                for r in &slots[..i] {
                    let _ = gm.region_unwire(*r);
                }
                let _ = gm.dev_detach(id, self.space);
                let _ = gm.dev_destroy(id);
                return Err(KvmError::Wire(e));
            }
        }
        self.passthrough = Some(dev);
        Ok(id)
    }

    /// Add `bytes` of guest memory at guest-physical `gpa` (`gm_as_alloc`), wired if a
    /// pass-through device is attached. On error nothing was added.
    ///
    /// # Errors
    /// - [`KvmError::SlotUnavailable`] with the core's [`AllocError`]: `gpa + bytes`
    ///   overflows, `bytes` is zero, `gpa` or `bytes` is not page aligned, or
    ///   `[gpa, gpa + bytes)` is not free below the guest-physical limit.
    /// - [`KvmError::Wire`]: a pass-through device is attached and wiring the slot
    ///   failed (host memory exhausted, or an IOMMU table edit failed); the slot is
    ///   removed again.
    pub fn grow(&mut self, gm: &Gmem, gpa: u64, bytes: u64) -> Result<Region, KvmError> {
        let unavailable = |error| KvmError::SlotUnavailable {
            gpa,
            len: bytes,
            error,
        };
        let last = gpa
            .checked_add(bytes)
            .and_then(|e| e.checked_sub(1))
            .ok_or(unavailable(AllocError::NoSpace { size: bytes }))?;
        let req = AllocRequest {
            hint: VirtAddr::new(gpa),
            max: VirtAddr::new(last),
            ..AllocRequest::new(bytes)
        };
        let region = gm.as_alloc(self.space, req).map_err(unavailable)?;
        if region.start.as_u64() != gpa {
            // Only possible with a zero hint: the request covers exactly `gpa..`.
            let _ = gm.region_dealloc(region, MapFlags::empty(), None);
            return Err(unavailable(AllocError::NoSpace { size: bytes }));
        }
        if self.passthrough.is_some() {
            if let Err(e) = gm.region_wire(region) {
                let _ = gm.region_dealloc(region, MapFlags::empty(), None);
                return Err(KvmError::Wire(e));
            }
        }
        self.slots.insert(gpa, region);
        self.grows += 1;
        Ok(region)
    }

    /// Remove the slot at `gpa` (`gm_region_dealloc`): when this returns neither the
    /// guest CPU nor the pass-through device translates any of its pages, and its host
    /// frames are free.
    ///
    /// # Errors
    /// - [`KvmError::NoSlot`]: no slot starts at `gpa`; nothing changes.
    /// - [`KvmError::Region`]: the core no longer knows the slot's region (its space
    ///   was destroyed behind the VM's back); the slot is kept.
    pub fn shrink(&mut self, gm: &Gmem, gpa: u64) -> Result<(), KvmError> {
        let region = *self.slots.get(&gpa).ok_or(KvmError::NoSlot { gpa })?;
        gm.region_dealloc(region, MapFlags::empty(), None)
            .map_err(KvmError::Region)?;
        self.slots.remove(&gpa);
        self.shrinks += 1;
        Ok(())
    }

    /// The guest (vCPU `vcpu`) reads `buf.len()` bytes at guest-physical `gpa`.
    ///
    /// # Errors
    /// - [`AccessError::BadAccess`]: `buf` is empty or the access wraps.
    /// - [`AccessError::Fault`]: the core could not serve an EPT violation (no slot
    ///   holds `gpa`, or out of host memory), with its [`gmem_core::FaultError`].
    /// - [`AccessError::Livelock`]: the violation kept recurring past the port's bound.
    /// - [`AccessError::NoMemory`]: an EPT leaf names a frame no memory of the map holds.
    ///
    /// The access goes page by page: when it fails, the pages before the failing one
    /// have been read into `buf`.
    pub fn guest_read(
        &self,
        gm: &Gmem,
        vcpu: usize,
        gpa: u64,
        buf: &mut [u8],
    ) -> Result<(), AccessError> {
        self.port.load(gm, vcpu, VirtAddr::new(gpa), buf)
    }

    /// The guest (vCPU `vcpu`) writes `data` at guest-physical `gpa`.
    ///
    /// # Errors
    /// As [`Vm::guest_read`]; when it fails, the pages before the failing one have been
    /// written.
    pub fn guest_write(
        &self,
        gm: &Gmem,
        vcpu: usize,
        gpa: u64,
        data: &[u8],
    ) -> Result<(), AccessError> {
        self.port.store(gm, vcpu, VirtAddr::new(gpa), data)
    }

    /// The pass-through device reads `buf.len()` bytes at guest-physical `gpa`.
    ///
    /// # Errors
    /// [`DmaError::Fault`] with [`Miss::Inactive`] when no pass-through device is
    /// attached; otherwise [`gmem_iommu::DmaPort::read`]'s errors (a gpa in no slot is
    /// a [`DmaError::Fault`] with [`Miss::NotPresent`]). The pages before a failing
    /// one have been read into `buf`.
    pub fn dma_read(&self, queue: usize, gpa: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        match &self.passthrough {
            Some(d) => d.read(queue, VirtAddr::new(gpa), buf),
            None => Err(no_device(gpa, Prot::READ)),
        }
    }

    /// The pass-through device writes `data` at guest-physical `gpa`.
    ///
    /// # Errors
    /// As [`Vm::dma_read`] (a write the mapping does not permit is a
    /// [`DmaError::Fault`] with [`Miss::Protection`]); the pages before a failing one
    /// have been written.
    pub fn dma_write(&self, queue: usize, gpa: u64, data: &[u8]) -> Result<(), DmaError> {
        match &self.passthrough {
            Some(d) => d.write(queue, VirtAddr::new(gpa), data),
            None => Err(no_device(gpa, Prot::WRITE)),
        }
    }

    /// Pages of guest memory now (all slots).
    pub fn pages(&self, gm: &Gmem) -> u64 {
        self.slots(gm).iter().map(|(_, l)| l / PAGE_SIZE).sum()
    }
}

/// Without a pass-through device nothing translates DMA: a fault with no domain.
fn no_device(gpa: u64, access: Prot) -> DmaError {
    DmaError::Fault(DmaFault {
        va: VirtAddr::new(gpa),
        access,
        miss: Miss::Inactive,
    })
}
