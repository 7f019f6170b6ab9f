//! The baseline: FreeBSD's IOMMU busdma path before GMEM, modeled piece by piece, each
//! piece named after the FreeBSD code it stands for.
//!
//! This is the peer the GMEM-based driver is measured against (GMEM Table 3's
//! "FreeBSD" column). It bypasses the core and runs on the same hardware as the GMEM
//! driver: the same [`IoTables`](crate::IoTables) (on [`crate::Discipline::Locked`],
//! FreeBSD's locked table code), the same IOTLB model and invalidation latency, the
//! same [`DmaPort`].
//!
//! ## The pieces
//! | FreeBSD | here |
//! |---|---|
//! | the guest address space, `sys/dev/iommu/iommu_gas.c`: map entries in a red-black tree augmented with the largest free gap, address-ordered first fit with guard pages, entries from a UMA zone | [`Gas`] (see [`crate::gas`]) |
//! | `IOMMU_DOMAIN_LOCK` (the domain mutex) around `iommu_gas_find_space` and `iommu_gas_free_space` | the domain lock around the [`Gas`] |
//! | `DMAR_DOMAIN_PGLOCK` (the page-table object's lock, one per domain) around `domain_map_buf_locked` / `domain_unmap_buf_locked` (`sys/x86/iommu/intel_idpgtbl.c`): the giant lock of the page table | the locked tables' own lock, one per table, held for each edit |
//! | `dmar_qi_invalidate_sync` (`sys/x86/iommu/intel_qi.c`): `DMAR_LOCK(unit)` held from emitting the invalidation descriptors through the spin on the wait descriptor | the unit lock held around the strict invalidation |
//! | `struct bus_dmamap_iommu`: `IOMMU_DMAMAP_LOCK` and the `map_entries` list; `iommu_bus_dmamap_load_something` counts `ctx->loads` and appends the loaded entries under the map lock; `iommu_bus_dmamap_unload` counts `ctx->unloads`, takes the entries under the map lock and unloads them (`iommu_domain_unload`: unmap, invalidate, `iommu_gas_free_space`, `iommu_gas_free_entry`) | [`BusDmaMap`], [`GiantLockDomain::load`], [`GiantLockDomain::unload`] |
//! | `iommu_bus_dmamap_load_buffer` / `_load_phys`: a `vm_page_t` array (`ma`) `malloc`ed per load and freed after it | the frame array copied into a fresh vector per load |
//!
//! What is left out: busdma tags' constraints beyond one page of alignment (a NIC's
//! receive tag has none), bounce buffers, the delayed-load task queue (a load here never
//! sleeps), `PHYS_TO_VM_PAGE` lookups, and the write-buffer flush of units without
//! coherent table walks. The unmap is **strict** (`dmar_qi_invalidate_sync`): the
//! entry goes back to the allocator only after the IOTLB forgot it, to compare with
//! GMEM's strict variants; current FreeBSD's busdma unload instead queues the
//! invalidation and frees the entry from the QI task (the asynchronous variants'
//! shape). Nothing here costs more than its FreeBSD counterpart: the tree is searched
//! along one path, entries and map lists are reused, and the locks are FreeBSD's three,
//! not one around everything (the previous baseline held one lock from the allocation
//! through the invalidation's wait).

use crate::device::{DmaPort, Iommu, IommuError};
use crate::gas::{Gas, GasEntry, GasStats, IovaError};
use gmem_core::{DeviceId, MapRun, Mmu, MmuError, PageSize, PageTableRoot, PhysAddr, Prot};
use gmem_core::{VaRange, VirtAddr, PAGE_SIZE};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a baseline load or unload failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegacyError {
    /// The allocator refused.
    Iova(IovaError),
    /// The table edit failed (the range went back to the allocator).
    Mmu(MmuError),
    /// A buffer of no frame.
    Empty,
    /// An unload of a map with nothing loaded.
    NotLoaded,
}

impl fmt::Display for LegacyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "baseline IOMMU: {self:?}")
    }
}

/// One loaded segment of a [`BusDmaMap`]: its GAS entry and IOVA range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Loaded {
    entry: GasEntry,
    start: u64,
    end: u64,
}

/// A busdma map (`struct bus_dmamap_iommu`): the entries of its current load under the
/// map's own lock. A driver creates one per ring slot once and loads and unloads it per
/// packet; the entry list keeps its capacity, so a load allocates no list.
#[derive(Debug, Default)]
pub struct BusDmaMap {
    entries: spin::Mutex<Vec<Loaded>>,
}

impl BusDmaMap {
    /// An empty map.
    pub fn new() -> BusDmaMap {
        BusDmaMap::default()
    }

    /// Whether something is loaded.
    pub fn is_loaded(&self) -> bool {
        !self.entries.lock().is_empty()
    }
}

/// Counters of a [`GiantLockDomain`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LegacyStats {
    /// The allocator's counters.
    pub gas: GasStats,
    /// Entries allocated now.
    pub live: usize,
    /// Loads (`ctx->loads`).
    pub loads: u64,
    /// Unloads (`ctx->unloads`).
    pub unloads: u64,
}

/// One device's domain in the baseline driver.
pub struct GiantLockDomain {
    /// `IOMMU_DOMAIN_LOCK`: the GAS.
    gas: spin::Mutex<Gas>,
    /// `DMAR_LOCK(unit)`: the invalidation queue, held through the wait.
    unit: spin::Mutex<()>,
    loads: AtomicU64,
    unloads: AtomicU64,
    port: DmaPort,
    root: PageTableRoot,
    memory: DeviceId,
}

impl GiantLockDomain {
    /// A domain over IOVAs `[start, end)` on `iommu`'s hardware; buffers are frames of
    /// device `memory`'s memory (the host's).
    ///
    /// # Errors
    /// - [`IommuError::Space`] with [`gmem_core::SpaceError::BadRange`]: `start`/`end`
    ///   not page aligned, or fewer than three pages between them.
    /// - [`IommuError::Tlb`]: the IOMMU's context caches were refused (see
    ///   [`Iommu::context`]).
    /// - [`IommuError::OutOfTableMemory`]: no free table frame for the domain's root.
    ///
    /// Nothing stays allocated on failure.
    pub fn new(
        iommu: &Iommu,
        start: VirtAddr,
        end: VirtAddr,
        memory: DeviceId,
    ) -> Result<GiantLockDomain, IommuError> {
        let gas = Gas::new(start.as_u64(), end.as_u64()).map_err(|_| {
            IommuError::Space(gmem_core::SpaceError::BadRange(
                gmem_core::AddrError::BadRange {
                    start: start.as_u64(),
                    len: end.as_u64().wrapping_sub(start.as_u64()),
                },
            ))
        })?;
        let mmu = iommu.context()?;
        let root = mmu
            .create_page_table()
            .map_err(|_| IommuError::OutOfTableMemory)?;
        mmu.activate(Some(root));
        Ok(GiantLockDomain {
            gas: spin::Mutex::new(gas),
            unit: spin::Mutex::new(()),
            loads: AtomicU64::new(0),
            unloads: AtomicU64::new(0),
            port: DmaPort::new(mmu, iommu.memory_map().clone()),
            root,
            memory,
        })
    }

    /// The device's DMA path.
    pub fn port(&self) -> &DmaPort {
        &self.port
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> LegacyStats {
        let gas = self.gas.lock();
        LegacyStats {
            gas: gas.stats(),
            live: gas.live(),
            loads: self.loads.load(Ordering::Relaxed),
            unloads: self.unloads.load(Ordering::Relaxed),
        }
    }

    /// Check the allocator's tree ([`Gas::check`]); returns the allocated ranges.
    ///
    /// # Errors
    /// The first violation found.
    pub fn check(&self) -> Result<Vec<(u64, u64)>, String> {
        self.gas.lock().check()
    }

    /// Load `frames` (4 KiB each) into `map` for DMA with `prot`
    /// (`bus_dmamap_load` → `iommu_bus_dmamap_load_something`): one GAS entry for the
    /// whole buffer, its pages mapped, the entry appended to the map. Returns the IOVA.
    ///
    /// # Errors
    /// - [`LegacyError::Empty`]: `frames` is empty.
    /// - [`LegacyError::Iova`]: no free IOVA gap of `frames.len()` pages and its guard
    ///   pages ([`IovaError::NoSpace`]).
    /// - [`LegacyError::Mmu`]: a table edit failed: no table memory left
    ///   ([`MmuError::OutOfTableMemory`]), or a frame the x86-64 format cannot encode
    ///   ([`MmuError::Unsupported`]); the pages mapped before it are unmapped and the
    ///   entry goes back to the allocator (`iommu_domain_unload_entry`).
    ///
    /// Nothing changes on failure.
    pub fn load(
        &self,
        map: &BusDmaMap,
        frames: &[PhysAddr],
        prot: Prot,
    ) -> Result<VirtAddr, LegacyError> {
        if frames.is_empty() {
            return Err(LegacyError::Empty);
        }
        self.loads.fetch_add(1, Ordering::Relaxed);
        // iommu_bus_dmamap_load_buffer: the page array, allocated per load.
        let ma: Vec<PhysAddr> = frames.to_vec();
        let pages = ma.len() as u64;
        let (entry, iova) = self.gas.lock().alloc(pages).map_err(LegacyError::Iova)?;
        let mmu = self.port.mmu();
        // domain_map_buf: the pages in physically contiguous runs, each edit under the
        // table's lock.
        let mut k = 0;
        while k < ma.len() {
            let mut n = 1;
            while k + n < ma.len() && ma[k + n].as_u64() == ma[k].as_u64() + n as u64 * PAGE_SIZE {
                n += 1;
            }
            let run = MapRun {
                va: VirtAddr::new(iova + k as u64 * PAGE_SIZE),
                pa: ma[k],
                len: n as u64 * PAGE_SIZE,
                prot,
                page_size: PageSize::Size4K,
                memory: self.memory,
                attrs: Default::default(),
            };
            if let Err(e) = mmu.map(self.root, &run) {
                if let Ok(range) = VaRange::new(VirtAddr::new(iova), k as u64 * PAGE_SIZE) {
                    mmu.unmap(self.root, range);
                }
                let _ = self.gas.lock().free(entry);
                return Err(LegacyError::Mmu(e));
            }
            k += n;
        }
        map.entries.lock().push(Loaded {
            entry,
            start: iova,
            end: iova + pages * PAGE_SIZE,
        });
        Ok(VirtAddr::new(iova))
    }

    /// Unload `map` (`bus_dmamap_unload` → `iommu_domain_unload`), strictly: every
    /// entry unmapped, the IOTLB invalidated under the unit lock (the wait included),
    /// then the entries freed.
    ///
    /// # Errors
    /// [`LegacyError::NotLoaded`] when nothing is loaded in `map`; nothing changes.
    pub fn unload(&self, map: &BusDmaMap) -> Result<(), LegacyError> {
        let mut entries = std::mem::take(&mut *map.entries.lock());
        if entries.is_empty() {
            *map.entries.lock() = entries;
            return Err(LegacyError::NotLoaded);
        }
        self.unloads.fetch_add(1, Ordering::Relaxed);
        let mmu = self.port.mmu();
        for l in &entries {
            mmu.unmap(self.root, range_of(l));
        }
        {
            // One invalidation with one wait for the whole unload, as the wait
            // descriptor goes after the last entry's invalidation.
            let _unit = self.unit.lock();
            if let [one] = entries.as_slice() {
                mmu.invalidate(self.root, &[range_of(one)]);
            } else {
                let ranges: Vec<VaRange> = entries.iter().map(range_of).collect();
                mmu.invalidate(self.root, &ranges);
            }
        }
        {
            let mut gas = self.gas.lock();
            for l in &entries {
                // Loaded entries are live: only this map frees them.
                let _ = gas.free(l.entry);
            }
        }
        entries.clear();
        // Give the (empty) list back with its capacity, unless the map was loaded again
        // meanwhile.
        let mut slot = map.entries.lock();
        if slot.is_empty() {
            *slot = entries;
        }
        Ok(())
    }
}

fn range_of(l: &Loaded) -> VaRange {
    VaRange {
        start: VirtAddr::new(l.start),
        len: l.end - l.start,
    }
}

impl Drop for GiantLockDomain {
    fn drop(&mut self) {
        let mmu = self.port.mmu();
        mmu.activate(None);
        mmu.destroy_page_table(self.root);
    }
}
