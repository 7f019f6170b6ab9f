//! The discrete GPU device: video memory, registration with the core, kernels.
//!
//! The device-independent part of the driver: build video memory and its copy engine,
//! create the device (`FAULTABLE | LOCAL_MEMORY`, or `LOCAL_MEMORY` alone for a GPU
//! configured as one that cannot fault; the copy engine as its data mover),
//! register video memory (all of it but the page-table pool) with the core and in the
//! machine's memory map, and run kernels, loads and stores through the GPU's [`Port`].
//! Oversubscription needs nothing here: when video memory is full the core evicts its
//! oldest pages to host memory through the same copy engine.

use crate::format::{GpuCodec, GpuTables};
use crate::mmu::dgpu_tlbs;
use gmem_core::{DevCaps, DeviceDesc, DeviceError, DeviceId, Gmem, PhysAddr, PAGE_SIZE};
use gmem_sim::{
    AccessError, BoundsError, DmaEngine, DmaStats, Grid, HierarchyConfig, LaunchError, LaunchStats,
    MapError, MemoryMap, MemoryStats, MmuStats, Port, PortStats, SimMemory, SimMmu, TableStats,
    TlbConfigError, TlbHierarchy, TranslationCaches, WorkItem,
};
use std::sync::Arc;

/// What a discrete GPU is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DgpuConfig {
    /// Instance number: makes the GPU's page-table format id unique.
    pub instance: u32,
    /// First physical address of video memory (its BAR in the machine's address map).
    pub vram_base: PhysAddr,
    /// Bytes of video memory (page-table pool included).
    pub vram_bytes: u64,
    /// Frames at the start of video memory kept for page tables.
    pub table_frames: u64,
    /// The GPU's translation caches (their unit count is its compute units).
    pub tlbs: HierarchyConfig,
    /// Whether the GPU can take page faults (`true`: the core serves its misses). A GPU
    /// that cannot fault (ADSM/GMAC's accelerators) is created without
    /// [`DevCaps::FAULTABLE`]: its table holds only what the core maps eagerly (wired
    /// pages, private frames), and a miss is an error, never a fault served.
    pub faultable: bool,
    /// Keep MESC's contiguity bits in the tables' level-1 pointers
    /// ([`GpuCodec::with_mesc`]).
    pub mesc: bool,
}

impl DgpuConfig {
    /// GPU `instance` with `vram_bytes` of video memory at `64 GiB × (instance + 1)`,
    /// 64 table frames and `cus` compute units.
    pub fn new(instance: u32, vram_bytes: u64, cus: usize) -> DgpuConfig {
        DgpuConfig {
            instance,
            vram_base: PhysAddr::new((instance as u64 + 1) << 36),
            vram_bytes,
            table_frames: 64,
            tlbs: dgpu_tlbs(cus),
            faultable: true,
            mesc: false,
        }
    }

    /// The same GPU, its tables keeping MESC's contiguity bits (see [`DgpuConfig::mesc`]).
    pub fn with_mesc(self) -> DgpuConfig {
        DgpuConfig { mesc: true, ..self }
    }

    /// The same GPU, configured as one that cannot fault (see [`DgpuConfig::faultable`]).
    pub fn cannot_fault(self) -> DgpuConfig {
        DgpuConfig {
            faultable: false,
            ..self
        }
    }
}

/// Why the GPU could not be built or created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DgpuError {
    /// Video memory or the table pool was rejected.
    Memory(BoundsError),
    /// The table pool leaves no video memory for the core.
    NoMemoryLeft,
    /// The TLB geometry was rejected.
    Tlb(TlbConfigError),
    /// The core refused the device or its memory.
    Device(DeviceError),
    /// The memory map refused video memory (overlap).
    Map(MapError),
    /// The GPU was already created in an instance.
    AlreadyCreated(DeviceId),
}

/// Counters of the GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DgpuStats {
    /// Loads, stores and faults.
    pub port: PortStats,
    /// TLBs, walks, invalidations.
    pub mmu: MmuStats,
    /// Page-table edits.
    pub tables: TableStats,
    /// Copy-engine traffic (the data mover: zero-fill, host→device, device→host).
    pub dma: DmaStats,
    /// Video memory.
    pub vram: MemoryStats,
}

/// A simulated faultable discrete GPU; its MMU's translation caches are `C` (by
/// default the TLB hierarchy of [`DgpuConfig::tlbs`]).
pub struct Dgpu<C: TranslationCaches = TlbHierarchy> {
    config: DgpuConfig,
    vram: Arc<SimMemory>,
    dma: Arc<DmaEngine>,
    tables: Arc<GpuTables>,
    mmu: Arc<SimMmu<GpuTables, C>>,
    port: Port,
}

impl Dgpu {
    /// Build the GPU's video memory, tables and MMU; `map` is the machine's memory map.
    ///
    /// # Errors
    /// - [`DgpuError::Memory`] with [`BoundsError::BadRange`]: `vram_base` or
    ///   `vram_bytes` is not page aligned, `vram_bytes` is zero, the range overflows,
    ///   or `table_frames` is zero.
    /// - [`DgpuError::NoMemoryLeft`]: the table pool takes all of video memory.
    /// - [`DgpuError::Tlb`]: [`DgpuConfig::tlbs`] has no compute unit or a TLB with no
    ///   entry or more than 2^20 of them.
    ///
    /// Nothing outside the new value is touched, so a failure changes no state.
    pub fn new(map: Arc<MemoryMap>, config: DgpuConfig) -> Result<Dgpu, DgpuError> {
        Dgpu::with_caches(map, config, |_| {
            TlbHierarchy::new(config.tlbs).map_err(DgpuError::Tlb)
        })
    }
}

impl<C: TranslationCaches> Dgpu<C> {
    /// [`Dgpu::new`] with the translation caches `caches` builds over the GPU's tables
    /// (a cache organisation under study; [`DgpuConfig::tlbs`] is not used).
    ///
    /// # Errors
    /// [`DgpuError::Memory`] or [`DgpuError::NoMemoryLeft`] as [`Dgpu::new`] (converted
    /// into `E`), or whatever error `caches` returned. Nothing outside the new value is
    /// touched, so a failure changes no state.
    pub fn with_caches<E: From<DgpuError>>(
        map: Arc<MemoryMap>,
        config: DgpuConfig,
        caches: impl FnOnce(&Arc<GpuTables>) -> Result<C, E>,
    ) -> Result<Dgpu<C>, E> {
        let vram = SimMemory::new("vram", config.vram_base, config.vram_bytes)
            .map_err(DgpuError::Memory)?;
        let vram = Arc::new(vram);
        if config.table_frames.saturating_mul(PAGE_SIZE) >= config.vram_bytes {
            return Err(DgpuError::NoMemoryLeft.into());
        }
        let codec = if config.mesc {
            GpuCodec::with_mesc(config.instance)
        } else {
            GpuCodec::new(config.instance)
        };
        let tables = GpuTables::new(codec, vram.clone(), config.vram_base, config.table_frames)
            .map_err(DgpuError::Memory)?;
        let tables = Arc::new(tables);
        let mmu = Arc::new(SimMmu::with_caches(tables.clone(), caches(&tables)?));
        let port = Port::new(mmu.clone(), map, Some(vram.clone()));
        Ok(Dgpu {
            config,
            dma: Arc::new(DmaEngine::new(vram.clone())),
            vram,
            tables,
            mmu,
            port,
        })
    }

    /// Create the device in `gm` and register its video memory.
    ///
    /// # Errors
    /// Each error leaves everything as it was: a device `gm` accepted is destroyed
    /// again, and the memory map forgets the video memory.
    /// - [`DgpuError::AlreadyCreated`]: this GPU was already created (in `gm` or in
    ///   another instance), or its tables' codec was bound to another device.
    /// - [`DgpuError::Device`]: `gm` refused the device (its MMU does not map 4 KiB
    ///   pages: [`DeviceError::No4KPages`]) or its video memory
    ///   ([`DeviceError::Register`], e.g. a range overlapping memory already
    ///   registered).
    /// - [`DgpuError::Map`]: the machine's memory map already holds memory overlapping
    ///   video memory ([`MapError::Overlaps`]) — which is also what the loser of two
    ///   `create` calls racing on one GPU gets: the map decides the race.
    pub fn create(&self, gm: &Gmem, name: &str) -> Result<DeviceId, DgpuError> {
        if let Some(id) = self.port.id() {
            return Err(DgpuError::AlreadyCreated(id));
        }
        let id = gm
            .dev_create(DeviceDesc {
                name: name.into(),
                mmu: self.mmu.clone(),
                memory: Some(self.dma.clone()),
                caps: if self.config.faultable {
                    DevCaps::FAULTABLE | DevCaps::LOCAL_MEMORY
                } else {
                    DevCaps::LOCAL_MEMORY
                },
                data: None,
            })
            .map_err(DgpuError::Device)?;
        // Every step that can fail comes before the GPU is bound, so each failure can
        // be undone: the map entry, then the device (its memory is all free).
        let undo = |mapped: bool| {
            if mapped {
                self.port.memory_map().remove(id);
            }
            let _ = gm.dev_destroy(id);
        };
        if let Err(e) = self.port.memory_map().add(id, self.vram.clone()) {
            undo(false);
            return Err(DgpuError::Map(e));
        }
        let first = self.config.vram_base.as_u64() + self.config.table_frames * PAGE_SIZE;
        if let Err(e) = gm.dev_register_physmem(id, PhysAddr::new(first), self.vram.end()) {
            undo(true);
            return Err(DgpuError::Device(e));
        }
        if let Err(other) = self.tables.codec().bind(id) {
            undo(true);
            return Err(DgpuError::AlreadyCreated(other));
        }
        // The map entry made this call the only `create` still running on this GPU,
        // so the port is free (unless bound by hand through `port()`, outside
        // `create`: then the codec keeps this id).
        if let Err(other) = self.port.bind(id) {
            undo(true);
            return Err(DgpuError::AlreadyCreated(other));
        }
        Ok(id)
    }

    /// The core's id of the GPU, once created.
    pub fn id(&self) -> Option<DeviceId> {
        self.port.id()
    }

    /// Video memory.
    pub fn vram(&self) -> &Arc<SimMemory> {
        &self.vram
    }

    /// The copy engine (the GPU's data mover).
    pub fn dma(&self) -> &Arc<DmaEngine> {
        &self.dma
    }

    /// The GPU's page tables.
    pub fn tables(&self) -> &Arc<GpuTables> {
        &self.tables
    }

    /// The GPU's MMU.
    pub fn mmu(&self) -> &Arc<SimMmu<GpuTables, C>> {
        &self.mmu
    }

    /// The GPU's memory port.
    pub fn port(&self) -> &Port {
        &self.port
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DgpuStats {
        DgpuStats {
            port: self.port.stats(),
            mmu: self.mmu.stats(),
            tables: self.tables.stats(),
            dma: self.dma.stats(),
            vram: self.vram.stats(),
        }
    }

    /// Run `kernel` over `grid`; work-group `g` runs on CU `g % compute units`.
    ///
    /// # Errors
    /// A [`LaunchError`] naming the first work-item whose `kernel` returned an
    /// [`AccessError`] (e.g. [`AccessError::NotCreated`] before [`Dgpu::create`], or a
    /// fault the core could not serve); the launch stops there, and the loads, stores
    /// and faults of the items before it have taken effect.
    pub fn launch<K>(&self, gm: &Gmem, grid: Grid, kernel: K) -> Result<LaunchStats, LaunchError>
    where
        K: FnMut(&WorkItem<'_>) -> Result<(), AccessError>,
    {
        self.port.launch(gm, grid, kernel)
    }
}
