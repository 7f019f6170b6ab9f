//! The IOMMU unit and the DMA devices behind it: creation in the core, IOVA spaces,
//! bus_dma-style map and unmap, and DMA reads and writes.
//!
//! The device-independent part of the driver. An [`Iommu`] owns the tables (one
//! [`IoTables`] for every device behind it) and hands each device a context of its own
//! ([`IommuMmu`]: its IOTLB slice and walker). A [`DmaDevice`] is created in the core
//! as a device that cannot fault and gets its IOVA space from the core: an address
//! space per device, attached in coherent mode, so the core's vmem arena allocates the
//! IOVAs and the core's logical page table records the mappings — the driver has no
//! allocator of its own. A DMA access goes through [`DmaPort`]: each 4 KiB piece is
//! translated by the IOTLB (a walk on a miss); a miss is an IOMMU fault reported as a
//! typed [`DmaError::Fault`] (the device cannot retry), and the bytes move in the
//! memory the machine's [`MemoryMap`] says holds the physical address.

use crate::memory::TableMemoryError;
use crate::mmu::{iotlb, InvalidationLatency, IoCaches, IommuMmu, IommuMmuStats};
use crate::table::{Discipline, IoTableStats, IoTables};
use gmem_core::{
    Activation, AllocError, AllocPolicy, AllocRequest, AttachError, Callback, DevCaps, DeviceDesc,
    DeviceError, DeviceId, DmaMapError, DmaMapping, DmaUnmapError, Gmem, MapError, MapFlags,
    MapRequest, Mmu, MmuMode, PageSizes, PhysAddr, Prot, Region, RegionError, SpaceError, SpaceId,
    VirtAddr, PAGE_SIZE,
};
use gmem_sim::{
    BoundsError, MemoryMap, Miss, SimMemory, TlbConfigError, TranslationCaches, Translator,
};
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A 2 MiB leaf's size.
const LARGE: u64 = 2 << 20;

/// What an IOMMU is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IommuConfig {
    /// How table edits synchronise.
    pub discipline: Discipline,
    /// Physical address of the table memory (a range no other memory answers for).
    pub table_base: PhysAddr,
    /// Frames of table memory.
    pub table_frames: u64,
    /// The modeled IOTLB invalidation latency.
    pub latency: InvalidationLatency,
    /// DMA queues per device (each with an L1 in front of the shared IOTLB).
    pub queues: usize,
    /// Map 2 MiB leaves where a buffer's IOVA block and frames allow
    /// ([`IoTables::with_superpages`]; locked discipline only). Off by default; Table 3's
    /// variants keep it off.
    pub superpages: bool,
}

impl Default for IommuConfig {
    /// Reader-writer tables, 4 MiB of table memory at 960 GiB, 2 µs spun invalidations,
    /// one queue per device, 4 KiB leaves only.
    fn default() -> Self {
        IommuConfig {
            discipline: Discipline::Rw,
            table_base: PhysAddr::new(0xf0_0000_0000),
            table_frames: 1024,
            latency: InvalidationLatency::TYPICAL,
            queues: 1,
            superpages: false,
        }
    }
}

/// Why an IOMMU or a device behind it could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IommuError {
    /// The table memory was rejected.
    Tables(TableMemoryError),
    /// The IOTLB geometry was rejected.
    Tlb(TlbConfigError),
    /// The core refused the device.
    Device(DeviceError),
    /// The core refused the IOVA space.
    Space(SpaceError),
    /// The core refused the attachment.
    Attach(AttachError),
    /// No table memory left for a root.
    OutOfTableMemory,
    /// MESC's contiguity bits are kept by the locked discipline only.
    MescNeedsLocked(Discipline),
    /// Superpages are split by the locked discipline only.
    SuperpagesNeedLocked(Discipline),
}

impl fmt::Display for IommuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IOMMU: {self:?}")
    }
}

/// An IOMMU translation fault: what the device tried and why the IOMMU refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaFault {
    /// The I/O virtual address.
    pub va: VirtAddr,
    /// The access attempted.
    pub access: Prot,
    /// Why the translation failed (no domain, not present, not permitted).
    pub miss: Miss,
}

/// Why a DMA access failed. Pieces before the failing one were transferred, as on
/// hardware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaError {
    /// The IOMMU refused the translation (the device cannot fault and retry).
    Fault(DmaFault),
    /// A translation points at a physical address no memory answers for.
    NoMemory {
        /// The physical address.
        pa: PhysAddr,
    },
    /// The memory rejected the access.
    Bounds(BoundsError),
    /// A zero-length access or one that wraps the address space.
    BadAccess {
        /// The address.
        va: VirtAddr,
        /// The length.
        len: u64,
    },
}

impl fmt::Display for DmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DmaError::Fault(x) => {
                write!(f, "IOMMU fault: {:?} at {}: {:?}", x.access, x.va, x.miss)
            }
            DmaError::NoMemory { pa } => write!(f, "no memory at {pa}"),
            DmaError::Bounds(e) => write!(f, "{e}"),
            DmaError::BadAccess { va, len } => write!(f, "bad DMA {va}+{len:#x}"),
        }
    }
}

/// Why a bus_dma-style buffer mapping failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusDmaError {
    /// No IOVA range ([`DmaDevice::map_buffer_region`]).
    Alloc(AllocError),
    /// The mapping was refused ([`DmaDevice::map_buffer_region`]).
    Map(MapError),
    /// The core's DMA path refused the mapping ([`DmaDevice::map_buffer`]).
    Dma(DmaMapError),
}

impl fmt::Display for BusDmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bus_dma: {self:?}")
    }
}

/// An IOMMU: the tables every device behind it uses.
pub struct Iommu {
    config: IommuConfig,
    tables: Arc<IoTables>,
    map: Arc<MemoryMap>,
    caches: Option<CachesFn>,
}

/// Builds a context's translation caches: from the tables (which it may read, as MESC's
/// walker reads contiguity bits and head leaves) and the number of queues.
pub type CachesFn = Arc<
    dyn Fn(&Arc<IoTables>, usize) -> Result<Box<dyn TranslationCaches>, TlbConfigError>
        + Send
        + Sync,
>;

impl Iommu {
    /// An IOMMU whose devices reach memory through `map` (the machine's memory map).
    ///
    /// # Errors
    /// - [`IommuError::Tables`] with [`TableMemoryError::BadRange`]: `table_base` is not
    ///   page aligned, `table_frames` is zero or above [`crate::memory::MAX_FRAMES`], or
    ///   the range overflows.
    /// - [`IommuError::SuperpagesNeedLocked`]: `superpages` with another discipline than
    ///   [`Discipline::Locked`].
    pub fn new(config: IommuConfig, map: Arc<MemoryMap>) -> Result<Iommu, IommuError> {
        let tables = if config.superpages {
            if config.discipline != Discipline::Locked {
                return Err(IommuError::SuperpagesNeedLocked(config.discipline));
            }
            IoTables::with_superpages(config.table_base, config.table_frames)
        } else {
            IoTables::new(config.discipline, config.table_base, config.table_frames)
        }
        .map_err(IommuError::Tables)?;
        Ok(Iommu {
            config,
            tables: Arc::new(tables),
            map,
            caches: None,
        })
    }

    /// An IOMMU whose tables keep MESC's contiguity bits ([`IoTables::with_mesc`]) and
    /// whose contexts get the caches `caches` builds (subregion IOTLB entries, say).
    ///
    /// # Errors
    /// [`IommuError::MescNeedsLocked`] unless `config.discipline` is
    /// [`Discipline::Locked`]; [`IommuError::Tables`] for an invalid table memory
    /// range (as [`Iommu::new`]).
    pub fn with_mesc(
        config: IommuConfig,
        map: Arc<MemoryMap>,
        caches: CachesFn,
    ) -> Result<Iommu, IommuError> {
        if config.discipline != Discipline::Locked {
            return Err(IommuError::MescNeedsLocked(config.discipline));
        }
        let tables = IoTables::with_mesc(config.table_base, config.table_frames)
            .map_err(IommuError::Tables)?;
        Ok(Iommu {
            config,
            tables: Arc::new(tables),
            map,
            caches: Some(caches),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &IommuConfig {
        &self.config
    }

    /// The tables.
    pub fn tables(&self) -> &Arc<IoTables> {
        &self.tables
    }

    /// The table edits' counters.
    pub fn table_stats(&self) -> IoTableStats {
        self.tables.stats()
    }

    /// The machine's memory map.
    pub fn memory_map(&self) -> &Arc<MemoryMap> {
        &self.map
    }

    /// A fresh device context (IOTLB slice and walker).
    ///
    /// # Errors
    /// [`IommuError::Tlb`] with the error the caches function of [`Iommu::with_mesc`]
    /// returned. The default IOTLB geometry ([`crate::mmu::iotlb`], at least one queue)
    /// is always accepted, so an IOMMU from [`Iommu::new`] never fails here.
    pub fn context(&self) -> Result<Arc<IommuMmu>, IommuError> {
        if let Some(f) = &self.caches {
            let caches = IoCaches::Plugged(
                f(&self.tables, self.config.queues.max(1)).map_err(IommuError::Tlb)?,
            );
            return Ok(Arc::new(IommuMmu::with_caches(
                self.tables.clone(),
                caches,
                self.config.latency,
            )));
        }
        IommuMmu::new(
            self.tables.clone(),
            iotlb(self.config.queues.max(1)),
            self.config.latency,
        )
        .map(Arc::new)
        .map_err(IommuError::Tlb)
    }

    /// Create a DMA device behind this IOMMU in `gm` (it cannot fault).
    ///
    /// # Errors
    /// [`IommuError::Tlb`] as [`Iommu::context`]; [`IommuError::Device`] if `gm`
    /// refuses the device (only an MMU without 4 KiB pages,
    /// [`DeviceError::No4KPages`], which an x86-64 context never is). Nothing is
    /// created on failure.
    pub fn create_device(&self, gm: &Gmem, name: &str) -> Result<DmaDevice, IommuError> {
        let mmu = self.context()?;
        let id = gm
            .dev_create(DeviceDesc {
                name: name.into(),
                mmu: mmu.clone(),
                memory: None,
                caps: DevCaps::empty(),
                data: None,
            })
            .map_err(IommuError::Device)?;
        Ok(DmaDevice {
            id,
            port: DmaPort::new(mmu, self.map.clone()),
        })
    }
}

/// Counters of a DMA port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaStats {
    /// Read transfers (device reads memory).
    pub reads: u64,
    /// Write transfers (device writes memory).
    pub writes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// IOMMU faults.
    pub faults: u64,
    /// The context's caches and invalidations.
    pub mmu: IommuMmuStats,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    faults: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// A device's DMA path: IOMMU translation, then the bytes.
pub struct DmaPort {
    mmu: Arc<IommuMmu>,
    map: Arc<MemoryMap>,
    counters: Counters,
}

impl DmaPort {
    /// DMA through context `mmu` into the memories of `map`.
    pub fn new(mmu: Arc<IommuMmu>, map: Arc<MemoryMap>) -> DmaPort {
        DmaPort {
            mmu,
            map,
            counters: Counters::default(),
        }
    }

    /// The device's IOMMU context.
    pub fn mmu(&self) -> &Arc<IommuMmu> {
        &self.mmu
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DmaStats {
        let c = &self.counters;
        DmaStats {
            reads: c.reads.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            faults: c.faults.load(Ordering::Relaxed),
            mmu: self.mmu.stats(),
        }
    }

    fn pieces(
        &self,
        queue: usize,
        va: VirtAddr,
        len: usize,
        access: Prot,
        mut f: impl FnMut(&SimMemory, PhysAddr, Range<usize>) -> Result<(), BoundsError>,
    ) -> Result<(), DmaError> {
        if len == 0 || va.checked_add(len as u64 - 1).is_none() {
            return Err(DmaError::BadAccess {
                va,
                len: len as u64,
            });
        }
        let mut done = 0usize;
        while done < len {
            let a = VirtAddr::new(va.as_u64() + done as u64);
            let n = ((PAGE_SIZE - a.page_offset()) as usize).min(len - done);
            let leaf = self.mmu.translate(queue, a, access).map_err(|miss| {
                add(&self.counters.faults, 1);
                DmaError::Fault(DmaFault {
                    va: a,
                    access,
                    miss,
                })
            })?;
            let pa = leaf.translate(a);
            let (_, memory) = self.map.at(pa).ok_or(DmaError::NoMemory { pa })?;
            f(&memory, pa, done..done + n).map_err(DmaError::Bounds)?;
            done += n;
        }
        Ok(())
    }

    /// The device writes `data` at I/O virtual address `va` from queue `queue`.
    ///
    /// # Errors
    /// - [`DmaError::BadAccess`]: `data` is empty or the access wraps the address
    ///   space.
    /// - [`DmaError::Fault`]: the IOMMU refused a piece's translation (the context has
    ///   no active table, nothing is mapped there, or the mapping does not permit
    ///   writes); counted in [`DmaStats::faults`].
    /// - [`DmaError::NoMemory`]: a translation points where no memory of the map is.
    ///
    /// The pieces (4 KiB pages) before the failing one have been written, as on
    /// hardware.
    pub fn write(&self, queue: usize, va: VirtAddr, data: &[u8]) -> Result<(), DmaError> {
        add(&self.counters.writes, 1);
        self.pieces(queue, va, data.len(), Prot::WRITE, |m, pa, r| {
            m.write(pa, &data[r])
        })?;
        add(&self.counters.bytes_written, data.len() as u64);
        Ok(())
    }

    /// The device reads `buf.len()` bytes at `va` from queue `queue`.
    ///
    /// # Errors
    /// As [`DmaPort::write`], a fault being a refused read; the pieces before the
    /// failing one have been read into `buf`.
    pub fn read(&self, queue: usize, va: VirtAddr, buf: &mut [u8]) -> Result<(), DmaError> {
        add(&self.counters.reads, 1);
        let len = buf.len();
        self.pieces(queue, va, len, Prot::READ, |m, pa, r| {
            m.read(pa, &mut buf[r])
        })?;
        add(&self.counters.bytes_read, len as u64);
        Ok(())
    }
}

/// A DMA device behind the IOMMU, created in the core.
pub struct DmaDevice {
    id: DeviceId,
    port: DmaPort,
}

impl DmaDevice {
    /// The core's id of the device.
    pub fn id(&self) -> DeviceId {
        self.id
    }

    /// The DMA path.
    pub fn port(&self) -> &DmaPort {
        &self.port
    }

    /// The device's IOMMU context.
    pub fn mmu(&self) -> &Arc<IommuMmu> {
        self.port.mmu()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DmaStats {
        self.port.stats()
    }

    /// The device's IOVA space `[begin, end)` from the core, allocated with `policy`
    /// (e.g. `CACHED`: per-CPU magazines), the device attached and active in it.
    ///
    /// # Errors
    /// - [`IommuError::Space`]: `gm` refused the space (`[begin, end)` empty,
    ///   unaligned or overflowing, or a policy naming two fits).
    /// - [`IommuError::Attach`]: `gm` refused to attach or activate the device (it was
    ///   destroyed, [`AttachError::UnknownDevice`], or the table memory has no frame
    ///   for its table, [`AttachError::Mmu`]); the space is destroyed again.
    ///
    /// Nothing stays created on failure.
    pub fn create_space(
        &self,
        gm: &Gmem,
        begin: VirtAddr,
        end: VirtAddr,
        policy: AllocPolicy,
    ) -> Result<SpaceId, IommuError> {
        let space = gm
            .as_create(begin, end, policy)
            .map_err(IommuError::Space)?;
        if let Err(e) = gm.as_attach(space, self.id, MmuMode::Coherent, Activation::Switch) {
            let _ = gm.as_destroy(space);
            return Err(IommuError::Attach(e));
        }
        Ok(space)
    }

    /// Map a buffer made of `frames` (4 KiB each, memory of device `memory` the core
    /// does not manage) for DMA with `prot` through the core's DMA path
    /// ([`Gmem::dma_map`]): an IOVA range from the space's arena, a DMA record, the
    /// mapping installed in every table of the space (4 KiB leaves) before this
    /// returns — one lock round trip, no heap allocation in the steady state. On
    /// error nothing stays allocated.
    ///
    /// # Errors
    /// [`BusDmaError::Dma`] with the core's [`DmaMapError`]: a stale `space` or
    /// `memory`, an empty `prot` or `frames`, a frame not page aligned or inside
    /// memory the core manages, no free IOVA range, or a table edit that failed.
    pub fn map_buffer(
        &self,
        gm: &Gmem,
        space: SpaceId,
        frames: &[PhysAddr],
        memory: DeviceId,
        prot: Prot,
    ) -> Result<DmaMapping, BusDmaError> {
        gm.dma_map(space, frames, memory, prot)
            .map_err(BusDmaError::Dma)
    }

    /// Unmap a buffer of [`DmaDevice::map_buffer`] and free its IOVA range
    /// ([`Gmem::dma_unmap`]). Strict (`flags` empty): the IOTLB is invalidated before
    /// this returns. Asynchronous (`MapFlags::ASYNC`): the entries are cleared now,
    /// the invalidation is coalesced with the space's queued ones, and `callback` runs
    /// once it completed — only then may the buffer be reused.
    ///
    /// # Errors
    /// [`DmaUnmapError`] when `mapping` is not live: already unmapped (a double
    /// unmap) or its space destroyed. Nothing changes and `callback` is dropped unrun.
    pub fn unmap_buffer(
        &self,
        gm: &Gmem,
        mapping: DmaMapping,
        flags: MapFlags,
        callback: Option<Callback>,
    ) -> Result<(), DmaUnmapError> {
        gm.dma_unmap(mapping, flags, callback)
    }

    /// Map a buffer as a region (`as_alloc` + `region_map`): the general path, for a
    /// buffer whose pages are later unmapped or protected piecewise (`region_*` on a
    /// range), or that wants large leaves. An IOVA range from the space's arena, the
    /// mapping installed in the device's table before this returns. On error nothing
    /// stays allocated. With superpages ([`IommuConfig::superpages`]) a buffer of 2 MiB
    /// or more gets a 2 MiB-aligned IOVA range, so that each aligned 2 MiB block of
    /// contiguous frames becomes one leaf.
    ///
    /// # Errors
    /// - [`BusDmaError::Alloc`]: no IOVA range: a stale `space`, an empty `frames`
    ///   (size zero), or no free range of that size in the space's arena.
    /// - [`BusDmaError::Map`]: `gm` refused the mapping (an unknown `memory` device, an
    ///   empty `prot`, a frame not page aligned or inside memory the core manages, or
    ///   a table edit that failed); the IOVA range is freed again.
    pub fn map_buffer_region(
        &self,
        gm: &Gmem,
        space: SpaceId,
        frames: &[PhysAddr],
        memory: DeviceId,
        prot: Prot,
    ) -> Result<Region, BusDmaError> {
        let size = frames.len() as u64 * PAGE_SIZE;
        let mut request = AllocRequest::new(size);
        if size >= LARGE && self.mmu().page_sizes().contains(PageSizes::S2M) {
            request.align = LARGE;
        }
        let region = gm.as_alloc(space, request).map_err(BusDmaError::Alloc)?;
        if let Err(e) = gm.region_map(region, MapRequest::new(frames, memory).prot(prot)) {
            let _ = gm.region_dealloc(region, MapFlags::empty(), None);
            return Err(BusDmaError::Map(e));
        }
        Ok(region)
    }

    /// Unmap a buffer of [`DmaDevice::map_buffer_region`] (`region_dealloc`) and free
    /// its IOVA range. Strict (`flags` empty): the IOTLB is
    /// invalidated before this returns. Asynchronous (`MapFlags::ASYNC`): the entries are
    /// cleared now, the invalidation is coalesced with the space's queued ones, and
    /// `callback` runs once it completed — only then may the buffer be reused.
    ///
    /// # Errors
    /// [`RegionError`] when `region` does not resolve: already unmapped (a double
    /// unmap) or its space destroyed. Nothing changes and `callback` is dropped unrun.
    pub fn unmap_buffer_region(
        &self,
        gm: &Gmem,
        region: Region,
        flags: MapFlags,
        callback: Option<Callback>,
    ) -> Result<(), RegionError> {
        gm.region_dealloc(region, flags, callback)
    }

    /// The device writes `data` at `va` from queue `queue`.
    ///
    /// # Errors
    /// As [`DmaPort::write`].
    pub fn write(&self, queue: usize, va: VirtAddr, data: &[u8]) -> Result<(), DmaError> {
        self.port.write(queue, va, data)
    }

    /// The device reads `buf.len()` bytes at `va` from queue `queue`.
    ///
    /// # Errors
    /// As [`DmaPort::read`].
    pub fn read(&self, queue: usize, va: VirtAddr, buf: &mut [u8]) -> Result<(), DmaError> {
        self.port.read(queue, va, buf)
    }
}
