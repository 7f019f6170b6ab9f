//! The baseline: an IOMMU driver before GMEM, with its own tree IOVA allocator and one
//! giant lock.
//!
//! This is the peer the GMEM-based driver is measured against (GMEM Table 3's
//! "FreeBSD" column; Linux's IOMMU drivers had the same shape before per-CPU IOVA
//! caches). It bypasses the core: the driver keeps the allocated IOVA ranges in a
//! balanced search tree ([`TreeIova`], a `BTreeMap` in place of the red-black tree) and
//! holds one lock ([`GiantLockDomain`]) around the allocator and the page-table edits,
//! including the strict invalidation of an unmap (the range goes back to the tree only
//! after the IOTLB forgot it). It runs on the same hardware as the GMEM driver: the
//! same [`IoTables`](crate::IoTables) (use [`crate::Discipline::Locked`], FreeBSD's
//! locked table code), the same IOTLB model and invalidation latency, the same
//! [`DmaPort`].
//!
//! ## The allocator
//! Linux's classic IOVA allocator: ranges are handed out top-down, below a cached
//! position (the start of the last allocation), by walking the allocated ranges
//! downwards until a gap fits; if none fits below the cached position the search
//! starts again from the top. Freeing at or above the cached position moves it up to
//! the next allocated range, so a freed gap is found first.

use crate::device::{DmaPort, Iommu, IommuError};
use gmem_core::{DeviceId, MapRun, Mmu, MmuError, PageSize, PageTableRoot, PhysAddr, Prot};
use gmem_core::{VaRange, VirtAddr, PAGE_SIZE};
use std::collections::BTreeMap;
use std::fmt;

/// Why the tree allocator refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IovaError {
    /// No gap of this many pages.
    NoSpace {
        /// Pages asked for.
        pages: u64,
    },
    /// No allocation starts at this address.
    NotAllocated {
        /// The address given.
        iova: u64,
    },
    /// The allocator's range is empty or not page aligned.
    BadRange {
        /// First address.
        start: u64,
        /// One past the last.
        end: u64,
    },
}

impl fmt::Display for IovaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IOVA allocator: {self:?}")
    }
}

/// Counters of a [`TreeIova`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeIovaStats {
    /// Successful allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Allocations that found no gap.
    pub failed: u64,
    /// Tree nodes visited by allocation searches.
    pub nodes_visited: u64,
    /// Searches restarted from the top of the range.
    pub restarts: u64,
}

/// A top-down tree IOVA allocator over `[start, end)`.
#[derive(Clone, Debug)]
pub struct TreeIova {
    start: u64,
    end: u64,
    /// Allocated ranges: start → end.
    ranges: BTreeMap<u64, u64>,
    cached_top: u64,
    stats: TreeIovaStats,
}

impl TreeIova {
    /// An allocator over `[start, end)` (page aligned, non-empty).
    ///
    /// # Errors
    /// [`IovaError::BadRange`] when `start >= end` or either is not page aligned.
    pub fn new(start: u64, end: u64) -> Result<TreeIova, IovaError> {
        if start >= end || start % PAGE_SIZE != 0 || end % PAGE_SIZE != 0 {
            return Err(IovaError::BadRange { start, end });
        }
        Ok(TreeIova {
            start,
            end,
            ranges: BTreeMap::new(),
            cached_top: end,
            stats: TreeIovaStats::default(),
        })
    }

    /// Live allocations.
    pub fn live(&self) -> usize {
        self.ranges.len()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> TreeIovaStats {
        self.stats
    }

    /// The highest gap of `size` bytes ending at or below `top`.
    fn search(&mut self, top: u64, size: u64) -> Option<u64> {
        let mut top = top;
        let mut visited = 0;
        let mut found = None;
        for (&s, &e) in self.ranges.range(..top).rev() {
            visited += 1;
            if e < top && top - e >= size {
                found = Some(top - size);
                break;
            }
            top = top.min(s);
        }
        self.stats.nodes_visited += visited;
        found.or_else(|| (top >= self.start + size).then(|| top - size))
    }

    /// Allocate `pages` pages; returns the first address.
    ///
    /// # Errors
    /// [`IovaError::NoSpace`] when `pages` is zero or larger than the whole range, or
    /// when no gap of `pages` pages is free (then counted in
    /// [`TreeIovaStats::failed`]). No range is allocated then; only the search
    /// counters move.
    pub fn alloc(&mut self, pages: u64) -> Result<u64, IovaError> {
        let no = IovaError::NoSpace { pages };
        let size = pages
            .checked_mul(PAGE_SIZE)
            .filter(|s| *s > 0 && *s <= self.end - self.start)
            .ok_or(no)?;
        let mut a = self.search(self.cached_top, size);
        if a.is_none() && self.cached_top != self.end {
            self.stats.restarts += 1;
            a = self.search(self.end, size);
        }
        let Some(a) = a else {
            self.stats.failed += 1;
            return Err(no);
        };
        self.ranges.insert(a, a + size);
        self.cached_top = a;
        self.stats.allocs += 1;
        Ok(a)
    }

    /// Free the allocation starting at `iova`; returns its size in pages.
    ///
    /// # Errors
    /// [`IovaError::NotAllocated`] when no live allocation starts at `iova` (a double
    /// free, or an address inside an allocation); nothing changes.
    pub fn free(&mut self, iova: u64) -> Result<u64, IovaError> {
        let end = self
            .ranges
            .remove(&iova)
            .ok_or(IovaError::NotAllocated { iova })?;
        if iova >= self.cached_top {
            self.cached_top = self
                .ranges
                .range(iova..)
                .next()
                .map_or(self.end, |(s, _)| *s);
        }
        self.stats.frees += 1;
        Ok((end - iova) / PAGE_SIZE)
    }
}

/// Why a baseline map or unmap failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegacyError {
    /// The allocator refused.
    Iova(IovaError),
    /// The table edit failed (the range went back to the allocator).
    Mmu(MmuError),
    /// A buffer of no frame.
    Empty,
}

impl fmt::Display for LegacyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "baseline IOMMU: {self:?}")
    }
}

/// One device's domain in the baseline driver: allocator and table under one lock.
pub struct GiantLockDomain {
    lock: spin::Mutex<TreeIova>,
    port: DmaPort,
    root: PageTableRoot,
    memory: DeviceId,
}

impl GiantLockDomain {
    /// A domain over IOVAs `[start, end)` on `iommu`'s hardware; buffers are frames of
    /// device `memory`'s memory (the host's).
    ///
    /// # Errors
    /// - [`IommuError::Space`] with [`gmem_core::SpaceError::BadRange`]: `start >= end`
    ///   or either is not page aligned.
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
        let iova = TreeIova::new(start.as_u64(), end.as_u64()).map_err(|_| {
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
            lock: spin::Mutex::new(iova),
            port: DmaPort::new(mmu, iommu.memory_map().clone()),
            root,
            memory,
        })
    }

    /// The device's DMA path.
    pub fn port(&self) -> &DmaPort {
        &self.port
    }

    /// The allocator's counters.
    pub fn iova_stats(&self) -> TreeIovaStats {
        self.lock.lock().stats()
    }

    /// Map `frames` for DMA with `prot`; returns the IOVA.
    ///
    /// # Errors
    /// - [`LegacyError::Empty`]: `frames` is empty.
    /// - [`LegacyError::Iova`]: no free IOVA gap of `frames.len()` pages
    ///   ([`IovaError::NoSpace`]).
    /// - [`LegacyError::Mmu`]: a table edit failed: no table memory left
    ///   ([`MmuError::OutOfTableMemory`]), or a frame or IOVA the x86-64 format cannot
    ///   encode ([`MmuError::Unsupported`]);
    ///   the pages mapped before it are unmapped and the range goes back to the
    ///   allocator.
    pub fn map(&self, frames: &[PhysAddr], prot: Prot) -> Result<VirtAddr, LegacyError> {
        if frames.is_empty() {
            return Err(LegacyError::Empty);
        }
        let mmu = self.port.mmu();
        let mut tree = self.lock.lock();
        let iova = tree.alloc(frames.len() as u64).map_err(LegacyError::Iova)?;
        for (k, f) in frames.iter().enumerate() {
            let run = MapRun {
                va: VirtAddr::new(iova + k as u64 * PAGE_SIZE),
                pa: *f,
                len: PAGE_SIZE,
                prot,
                page_size: PageSize::Size4K,
                memory: self.memory,
                attrs: Default::default(),
            };
            if let Err(e) = mmu.map(self.root, &run) {
                if let Ok(range) = VaRange::new(VirtAddr::new(iova), k as u64 * PAGE_SIZE) {
                    mmu.unmap(self.root, range);
                }
                let _ = tree.free(iova);
                return Err(LegacyError::Mmu(e));
            }
        }
        Ok(VirtAddr::new(iova))
    }

    /// Unmap the buffer at `iova`, invalidate the IOTLB, and free the range (strict).
    ///
    /// # Errors
    /// [`LegacyError::Iova`] with [`IovaError::NotAllocated`] when no buffer mapped by
    /// [`GiantLockDomain::map`] starts at `iova`; nothing changes.
    pub fn unmap(&self, iova: VirtAddr) -> Result<(), LegacyError> {
        let mmu = self.port.mmu();
        let mut tree = self.lock.lock();
        let pages = tree.free(iova.as_u64()).map_err(LegacyError::Iova)?;
        let range = VaRange {
            start: iova,
            len: pages * PAGE_SIZE,
        };
        mmu.unmap(self.root, range);
        mmu.invalidate(self.root, &[range]);
        Ok(())
    }
}

impl Drop for GiantLockDomain {
    fn drop(&mut self) {
        let mmu = self.port.mmu();
        mmu.activate(None);
        mmu.destroy_page_table(self.root);
    }
}
