//! The host CPU device: host memory, the core's predefined CPU device, loads and stores.
//!
//! The device-independent part of the driver: create host memory and the MMU, hand the
//! core the CPU's [`DeviceDesc`], register host memory (all of it but the page-table
//! pool) and put it in the machine's [`MemoryMap`], then serve loads and stores through
//! the CPU's [`Port`] (translate, fault, retry, move bytes).

use crate::mmu::{cpu_tlbs, CpuMmu};
use gmem_core::{
    DevCaps, DeviceDesc, DeviceError, DeviceId, Gmem, PhysAddr, SingleCpu, VirtAddr, PAGE_SIZE,
};
use gmem_sim::RadixTables;
use gmem_sim::{
    AccessError, BoundsError, HierarchyConfig, MapError, MemoryMap, MmuStats, Port, PortStats,
    SimMemory, SimMmu, TableStats, TlbConfigError,
};
use gmem_x86pt::{X86Codec, X86Config};

/// x86-64 tables in simulated host memory (the shared engine with the x86-64 codec).
pub type X86Tables = RadixTables<X86Codec>;
use std::fmt;
use std::sync::Arc;

/// What the host CPU is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostCpuConfig {
    /// First physical address of host memory.
    pub memory_base: PhysAddr,
    /// Bytes of host memory (page-table pool included).
    pub memory_bytes: u64,
    /// Frames at the start of host memory kept for page tables (of every x86-format
    /// device); the core manages the rest.
    pub table_frames: u64,
    /// The CPU's translation caches.
    pub tlbs: HierarchyConfig,
    /// The x86-64 format's options.
    pub x86: X86Config,
}

impl Default for HostCpuConfig {
    /// 256 MiB of host memory at 4 GiB (8 MiB of it for page tables), one core.
    fn default() -> Self {
        HostCpuConfig {
            memory_base: PhysAddr::new(1 << 32),
            memory_bytes: 256 << 20,
            table_frames: 2048,
            tlbs: cpu_tlbs(1),
            x86: X86Config {
                user: true,
                large_pages: false,
                mesc: false,
                granularity_bit: false,
            },
        }
    }
}

/// Why the host CPU could not be built or registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostCpuError {
    /// Host memory or the table pool was rejected.
    Memory(BoundsError),
    /// The table pool leaves no memory for the core.
    NoMemoryLeft,
    /// The TLB geometry was rejected.
    Tlb(TlbConfigError),
    /// The core refused the device or its memory.
    Device(DeviceError),
    /// The memory map refused host memory.
    Map(MapError),
    /// The CPU was already registered with an instance.
    AlreadyRegistered(DeviceId),
}

impl fmt::Display for HostCpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "host CPU: {self:?}")
    }
}

/// Counters of the host CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCpuStats {
    /// Loads, stores and faults.
    pub port: PortStats,
    /// TLBs, walks, invalidations.
    pub mmu: MmuStats,
    /// Table edits of the machine's x86 tables (all x86-format devices).
    pub tables: TableStats,
}

/// The simulated host CPU.
pub struct HostCpu {
    config: HostCpuConfig,
    memory: Arc<SimMemory>,
    tables: Arc<X86Tables>,
    mmu: Arc<CpuMmu>,
    port: Port,
}

impl HostCpu {
    /// Build host memory, the machine's x86 tables and the CPU's MMU.
    ///
    /// # Errors
    /// - [`HostCpuError::Memory`] with [`BoundsError::BadRange`]: `memory_base` or
    ///   `memory_bytes` is not page aligned, `memory_bytes` is zero, the range
    ///   overflows, or `table_frames` is zero.
    /// - [`HostCpuError::NoMemoryLeft`]: the table pool takes all of host memory.
    /// - [`HostCpuError::Tlb`]: [`HostCpuConfig::tlbs`] has no core or a TLB with no
    ///   entry or more than 2^20 of them.
    ///
    /// Nothing outside the new value is touched, so a failure changes no state.
    pub fn new(config: HostCpuConfig) -> Result<HostCpu, HostCpuError> {
        let memory = Arc::new(
            SimMemory::new("host", config.memory_base, config.memory_bytes)
                .map_err(HostCpuError::Memory)?,
        );
        if config.table_frames.saturating_mul(PAGE_SIZE) >= config.memory_bytes {
            return Err(HostCpuError::NoMemoryLeft);
        }
        let codec = X86Codec { config: config.x86 };
        let tables = X86Tables::new(
            codec,
            memory.clone(),
            config.memory_base,
            config.table_frames,
        )
        .map_err(HostCpuError::Memory)?;
        let tables = Arc::new(tables);
        let mmu = Arc::new(SimMmu::new(tables.clone(), config.tlbs).map_err(HostCpuError::Tlb)?);
        let port = Port::new(mmu.clone(), MemoryMap::new(), None);
        Ok(HostCpu {
            config,
            memory,
            tables,
            mmu,
            port,
        })
    }

    /// What the core needs to create its predefined CPU device (`Gmem::new`).
    pub fn device_desc(&self) -> DeviceDesc {
        DeviceDesc {
            name: "cpu".into(),
            mmu: self.mmu.clone(),
            memory: Some(self.memory.clone()),
            caps: DevCaps::FAULTABLE,
            data: None,
        }
    }

    /// Bind to the instance created from [`HostCpu::device_desc`]: register host memory
    /// (but the table pool) with the core and in the memory map.
    ///
    /// # Errors
    /// - [`HostCpuError::AlreadyRegistered`]: this CPU was registered before (with
    ///   `gm` or another instance); nothing is changed.
    /// - [`HostCpuError::Map`]: the memory map already holds memory of `gm`'s host
    ///   device or memory overlapping host memory (the map is this CPU's own, so only
    ///   when a caller added such memory to [`HostCpu::memory_map`] before).
    /// - [`HostCpuError::Device`]: `gm` refused host memory:
    ///   [`DeviceError::NoMemoryInterface`] if `gm`'s host device was not created from
    ///   [`HostCpu::device_desc`] and has no data mover, [`DeviceError::Register`] if
    ///   it overlaps memory registered with that device before or holds more frames
    ///   than the core indexes per device.
    ///
    /// After a failure nothing is kept: the CPU is bound to `gm` only once every step
    /// succeeded (the map entry of a later failure is removed again), so it can be
    /// registered after the cause is gone. Of two calls racing on one CPU, the map
    /// entry decides: the loser gets [`HostCpuError::Map`].
    pub fn register(&self, gm: &Gmem) -> Result<DeviceId, HostCpuError> {
        if let Some(id) = self.port.id() {
            return Err(HostCpuError::AlreadyRegistered(id));
        }
        let id = gm.host();
        let map = self.port.memory_map();
        map.add(id, self.memory.clone())
            .map_err(HostCpuError::Map)?;
        let first = self.config.memory_base.as_u64() + self.config.table_frames * PAGE_SIZE;
        if let Err(e) = gm.dev_register_physmem(id, PhysAddr::new(first), self.memory.end()) {
            map.remove(id);
            return Err(HostCpuError::Device(e));
        }
        // The map entry made this the only `register` still running on this CPU, so
        // the port is free unless it was bound by hand through `port()`; then the
        // registered memory stays with `gm`'s host (the core cannot take it back).
        if let Err(other) = self.port.bind(id) {
            map.remove(id);
            return Err(HostCpuError::AlreadyRegistered(other));
        }
        Ok(id)
    }

    /// A new GMEM instance on a uniprocessor platform whose CPU device is this CPU.
    ///
    /// # Errors
    /// The errors of [`HostCpu::new`] for a bad `config`; [`HostCpuError::Device`]
    /// with [`DeviceError::No4KPages`] if the core refuses the CPU's MMU;
    /// [`HostCpu::register`]'s errors (with a fresh instance and map, only
    /// [`DeviceError::Register`] with more frames than the core indexes per device).
    pub fn boot(config: HostCpuConfig) -> Result<(Gmem, HostCpu), HostCpuError> {
        let cpu = HostCpu::new(config)?;
        let gm = Gmem::new(Arc::new(SingleCpu), cpu.device_desc()).map_err(HostCpuError::Device)?;
        cpu.register(&gm)?;
        Ok((gm, cpu))
    }

    /// The core's id of the CPU, once registered.
    pub fn id(&self) -> Option<DeviceId> {
        self.port.id()
    }

    /// Host memory.
    pub fn memory(&self) -> &Arc<SimMemory> {
        &self.memory
    }

    /// The machine's x86-64 tables (give them to every other x86-format device).
    pub fn tables(&self) -> &Arc<X86Tables> {
        &self.tables
    }

    /// The machine's memory map (give it to every other device).
    pub fn memory_map(&self) -> &Arc<MemoryMap> {
        self.port.memory_map()
    }

    /// The CPU's MMU.
    pub fn mmu(&self) -> &Arc<CpuMmu> {
        &self.mmu
    }

    /// The CPU's memory port (loads and stores by any core).
    pub fn port(&self) -> &Port {
        &self.port
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> HostCpuStats {
        HostCpuStats {
            port: self.port.stats(),
            mmu: self.mmu.stats(),
            tables: self.tables.stats(),
        }
    }

    /// Load `buf.len()` bytes at `va` on core 0.
    ///
    /// # Errors
    /// - [`AccessError::BadAccess`]: the access is empty or wraps the address space.
    /// - [`AccessError::NotCreated`]: before [`HostCpu::register`].
    /// - [`AccessError::Fault`]: the core could not serve a fault (address not
    ///   allocated, access not permitted, out of memory, ...), with its
    ///   [`gmem_core::FaultError`].
    /// - [`AccessError::Livelock`]: the core kept answering "retry" past the port's
    ///   fault bound.
    /// - [`AccessError::NoMemory`]: a leaf names a frame no memory of the map holds.
    ///
    /// The access goes page by page: when it fails, the pages before the failing one
    /// have been read into `buf`.
    pub fn load(&self, gm: &Gmem, va: VirtAddr, buf: &mut [u8]) -> Result<(), AccessError> {
        self.port.load(gm, 0, va, buf)
    }

    /// Store `data` at `va` on core 0.
    ///
    /// # Errors
    /// - [`AccessError::BadAccess`]: the access is empty or wraps the address space.
    /// - [`AccessError::NotCreated`]: before [`HostCpu::register`].
    /// - [`AccessError::Fault`]: the core could not serve a fault (address not
    ///   allocated, access not permitted, out of memory, ...), with its
    ///   [`gmem_core::FaultError`].
    /// - [`AccessError::Livelock`]: the core kept answering "retry" past the port's
    ///   fault bound.
    /// - [`AccessError::NoMemory`]: a leaf names a frame no memory of the map holds.
    ///
    /// The access goes page by page: when it fails, the pages before the failing one
    /// have been written.
    pub fn store(&self, gm: &Gmem, va: VirtAddr, data: &[u8]) -> Result<(), AccessError> {
        self.port.store(gm, 0, va, data)
    }

    /// Load a `u32` at `va` on core 0.
    ///
    /// # Errors
    /// As [`HostCpu::load`] (4 bytes).
    pub fn load_u32(&self, gm: &Gmem, va: VirtAddr) -> Result<u32, AccessError> {
        self.port.load_u32(gm, 0, va)
    }

    /// Store a `u32` at `va` on core 0.
    ///
    /// # Errors
    /// As [`HostCpu::store`] (4 bytes; across a page boundary the first page may be
    /// written when the second fails).
    pub fn store_u32(&self, gm: &Gmem, va: VirtAddr, v: u32) -> Result<(), AccessError> {
        self.port.store_u32(gm, 0, va, v)
    }
}
