//! KPI: short-lived DMA mappings (`dma_map` / `dma_unmap`) — the bus_dma case made
//! cheap: one IOVA from the space's arena, one record, the leaf entries in every table
//! of the space, and on unmap the invalidation (strict, or batched through the space's
//! queue). The theory and the invariants are in `space::dma`.
//!
//! A DMA mapping is not a region: `region_*` calls and `as_lookup` over its range
//! answer as for unallocated addresses, and no device faults on it (every table of the
//! space holds it from the map on, including tables attached later). Detaching a
//! device takes the mappings out of the table it leaves (if that table goes); the
//! records stay until `dma_unmap` or `as_destroy`.

use crate::addr::{PhysAddr, VaRange, VirtAddr, PAGE_SHIFT, PAGE_SIZE};
use crate::flags::{AllocPolicy, MapFlags, Prot};
use crate::gmem::Gmem;
use crate::handle::{DeviceId, SpaceId};
use crate::mmu::MmuError;
use crate::space::dma::{DmaMapFail, DmaMapIn};
use crate::space::queue::Callback;
use core::fmt;

/// A live DMA mapping (returned by [`Gmem::dma_map`]): its space and IOVA range, and
/// a slot and generation the core checks, so that a stale or double
/// [`Gmem::dma_unmap`] is refused with [`DmaUnmapError::StaleMapping`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DmaMapping {
    /// The address space (IOVA space) it is in.
    pub space: SpaceId,
    /// First IOVA.
    pub start: VirtAddr,
    /// Length in bytes (4 KiB per frame).
    pub len: u64,
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl DmaMapping {
    /// The IOVA range.
    pub fn range(&self) -> VaRange {
        VaRange {
            start: self.start,
            len: self.len,
        }
    }
}

/// Errors of [`Gmem::dma_map`]. Nothing is mapped or allocated after one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DmaMapError {
    /// The space handle is stale (or the space was destroyed during the call).
    UnknownSpace(SpaceId),
    /// The memory device names no live device (or one being destroyed).
    UnknownDevice(DeviceId),
    /// Protection empty or outside read-write-execute.
    BadProt(Prot),
    /// No frame given, or more than the address space can hold.
    BadLength(usize),
    /// A frame is not page aligned, or lies in memory the core manages for the device.
    BadFrame(PhysAddr),
    /// No free IOVA range of that size in the space.
    NoSpace {
        /// Bytes asked for.
        size: u64,
    },
    /// A driver refused a table edit (nothing of the map remains).
    Mmu(MmuError),
    /// IOVA allocation failure injected for testing (`as_fail_every`, feature
    /// `test-util`).
    #[cfg(feature = "test-util")]
    Injected,
}

/// Errors of [`Gmem::dma_unmap`]. Nothing changes after one and the callback is
/// dropped unrun.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DmaUnmapError {
    /// The mapping's space is gone (its destruction unmapped it).
    UnknownSpace(SpaceId),
    /// The mapping was unmapped already (a double unmap) or never was one.
    StaleMapping(DmaMapping),
}

impl fmt::Display for DmaMapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DmaMapError::UnknownSpace(s) => write!(f, "unknown address space {s}"),
            DmaMapError::UnknownDevice(d) => write!(f, "memory device {d} is no live device"),
            DmaMapError::BadProt(p) => write!(f, "protection {p:?} out of range"),
            DmaMapError::BadLength(n) => write!(f, "{n} frames cannot be mapped"),
            DmaMapError::BadFrame(pa) => {
                write!(f, "frame {pa} unaligned or in memory the core manages")
            }
            DmaMapError::NoSpace { size } => write!(f, "no free IOVA range of {size:#x} bytes"),
            DmaMapError::Mmu(e) => write!(f, "page-table edit refused: {e:?}"),
            #[cfg(feature = "test-util")]
            DmaMapError::Injected => f.write_str("IOVA allocation failure injected for testing"),
        }
    }
}

impl fmt::Display for DmaUnmapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DmaUnmapError::UnknownSpace(s) => write!(f, "unknown address space {s}"),
            DmaUnmapError::StaleMapping(m) => {
                write!(f, "DMA mapping at {} is not live", m.start)
            }
        }
    }
}

impl core::error::Error for DmaMapError {}
impl core::error::Error for DmaUnmapError {}

impl Gmem {
    /// Map `frames` (4 KiB each, in `memory`'s physical address space, outside the
    /// memory the core manages for it) for DMA with `prot`, in every page table of
    /// `space`, at a fresh IOVA range from the space's arena (through its quantum
    /// caches with [`AllocPolicy::CACHED`]; guard pages around it with
    /// [`AllocPolicy::GUARDED`]). The mapping is in the tables when this returns. One
    /// lock round trip on the space; no heap allocation once the space has served a
    /// mapping of that size before. Leaves are 4 KiB.
    ///
    /// # Errors
    /// [`DmaMapError`]: a stale space or memory device, an empty or out-of-range
    /// protection, no frames, a bad frame, no IOVA range, or a driver's refusal.
    /// Every argument is checked before anything changes; after a driver's refusal the
    /// edits made are undone (and invalidated) and the IOVA is freed.
    ///
    /// # Examples
    /// A NIC behind an IOMMU: one receive buffer mapped, seen by the NIC, unmapped.
    /// ```
    /// # use gmem_core::testing::{TestSystem, HOST_BASE};
    /// # use gmem_core::*;
    /// let mut sys = TestSystem::new(16);
    /// let nic = sys.add_device(2, DevCaps::empty(), 0, 0);
    /// let nic_id = sys.devices[nic].id;
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::CACHED)?;
    /// gm.as_attach(space, nic_id, MmuMode::Coherent, Activation::Switch)?;
    /// // Host RAM past what the core manages (16 pages from HOST_BASE).
    /// let buf = PhysAddr::new(HOST_BASE + 100 * PAGE_SIZE);
    /// let m = gm.dma_map(space, &[buf], gm.host(), Prot::WRITE)?;
    /// let pte = sys.translate(nic, m.start, Prot::WRITE).unwrap();
    /// assert_eq!(pte.pfn, buf.pfn().0);
    /// // Not a region.
    /// assert!(gm.as_lookup(space, m.start).is_err());
    /// gm.check_invariants(space).unwrap();
    /// gm.dma_unmap(m, MapFlags::empty(), None)?;
    /// assert!(sys.translate(nic, m.start, Prot::WRITE).is_err());
    /// assert_eq!(gm.dma_unmap(m, MapFlags::empty(), None), Err(DmaUnmapError::StaleMapping(m)));
    /// // A frame the core manages is refused.
    /// let managed = PhysAddr::new(HOST_BASE);
    /// assert_eq!(gm.dma_map(space, &[managed], gm.host(), Prot::READ), Err(DmaMapError::BadFrame(managed)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dma_map(
        &self,
        space_id: SpaceId,
        frames: &[PhysAddr],
        memory: DeviceId,
        prot: Prot,
    ) -> Result<DmaMapping, DmaMapError> {
        let _critical = self.critical();
        if prot.is_empty() || !Prot::RWX.contains(prot) {
            return Err(DmaMapError::BadProt(prot));
        }
        let size = u64::try_from(frames.len())
            .ok()
            .filter(|&n| n != 0 && n < 1 << (64 - PAGE_SHIFT - 1))
            .ok_or(DmaMapError::BadLength(frames.len()))?
            << PAGE_SHIFT;
        let memdev = self
            .device(memory)
            .ok_or(DmaMapError::UnknownDevice(memory))?;
        {
            let phys = memdev.phys.lock();
            if phys.is_retired() {
                return Err(DmaMapError::UnknownDevice(memory));
            }
            if let Some(f) = frames
                .iter()
                .find(|f| !f.is_page_aligned() || phys.contains(f.pfn()))
            {
                return Err(DmaMapError::BadFrame(*f));
            }
        }
        let space = self
            .space(space_id)
            .ok_or(DmaMapError::UnknownSpace(space_id))?;
        let guard = if space.policy.contains(AllocPolicy::GUARDED) {
            PAGE_SIZE
        } else {
            0
        };
        let reserve_len = size + 2 * guard;
        let reserve_start = space.arena.alloc(reserve_len).map_err(|e| match e {
            #[cfg(feature = "test-util")]
            crate::vmem::AllocError::Injected => DmaMapError::Injected,
            _ => DmaMapError::NoSpace { size },
        })?;
        let start = reserve_start + guard;
        let mapped = space.lock().dma_map(
            &self.counters,
            DmaMapIn {
                start,
                reserve_start,
                reserve_len,
                frames,
                memdev,
                prot,
            },
        );
        match mapped {
            Ok((index, generation)) => Ok(DmaMapping {
                space: space_id,
                start: VirtAddr::new(start),
                len: size,
                index,
                generation,
            }),
            Err(fail) => {
                let freed = space.arena.free(reserve_start, reserve_len);
                debug_assert!(freed.is_ok(), "DMA IOVA release failed: {freed:?}");
                Err(match fail {
                    DmaMapFail::Dead => DmaMapError::UnknownSpace(space_id),
                    DmaMapFail::Mmu(e) => DmaMapError::Mmu(e),
                })
            }
        }
    }

    /// Unmap a DMA mapping and free its IOVA range. Strict (`flags` empty): the
    /// entries are cleared and every device's IOTLB invalidated before this returns
    /// (the invalidation runs after the space lock is released), and `callback` (if
    /// any) has run. Asynchronous ([`MapFlags::ASYNC`]): the entries are cleared now,
    /// the invalidation joins the space's queue (one per device for a batch), and
    /// `callback` runs after it — only then may the frames be reused by the device's
    /// owner, and only then is the IOVA range free again.
    ///
    /// # Errors
    /// [`DmaUnmapError`]: the space is gone, or the mapping is not live (a double
    /// unmap); nothing changes and `callback` is dropped unrun.
    ///
    /// # Examples
    /// ```
    /// # use gmem_core::testing::{TestSystem, HOST_BASE};
    /// # use gmem_core::*;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// let mut sys = TestSystem::new(16);
    /// let nic = sys.add_device(2, DevCaps::empty(), 0, 0);
    /// let nic_id = sys.devices[nic].id;
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(space, nic_id, MmuMode::Coherent, Activation::Switch)?;
    /// let frames = [PhysAddr::new(HOST_BASE + 100 * PAGE_SIZE), PhysAddr::new(HOST_BASE + 102 * PAGE_SIZE)];
    /// let m = gm.dma_map(space, &frames, gm.host(), Prot::RW)?;
    /// assert_eq!(m.len, 2 * PAGE_SIZE);
    /// let done = Arc::new(AtomicUsize::new(0));
    /// let seen = done.clone();
    /// let callback: Callback = Box::new(move |r| {
    ///     assert!(r.is_ok());
    ///     seen.fetch_add(1, Ordering::SeqCst);
    /// });
    /// gm.dma_unmap(m, MapFlags::ASYNC, Some(callback))?;
    /// // Cleared at once; invalidated (and the callback run) when the queue drains.
    /// assert!(sys.translate(nic, m.start, Prot::READ).is_err());
    /// assert_eq!((gm.as_pending(space)?, done.load(Ordering::SeqCst)), (1, 0));
    /// gm.as_synchronize(space)?;
    /// assert_eq!(done.load(Ordering::SeqCst), 1);
    /// gm.check_invariants(space).unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dma_unmap(
        &self,
        mapping: DmaMapping,
        flags: MapFlags,
        callback: Option<Callback>,
    ) -> Result<(), DmaUnmapError> {
        let _critical = self.critical();
        let space = self
            .space(mapping.space)
            .ok_or(DmaUnmapError::UnknownSpace(mapping.space))?;
        let pending = {
            let mut st = space.lock();
            if st.dma_range(mapping.index, mapping.generation) != Some(mapping.range()) {
                return Err(DmaUnmapError::StaleMapping(mapping));
            }
            st.dma_unmap(
                &self.counters,
                &space.arena,
                (mapping.index, mapping.generation),
                flags.contains(MapFlags::ASYNC),
                callback,
            )
            .map_err(|_| DmaUnmapError::StaleMapping(mapping))?
        };
        if let Some(p) = pending {
            p.complete(&self.counters, &space.arena);
        }
        Ok(())
    }

    /// Live DMA mappings of a space.
    ///
    /// # Errors
    /// [`DmaUnmapError::UnknownSpace`] for a stale space.
    pub fn dma_mappings(&self, space_id: SpaceId) -> Result<usize, DmaUnmapError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(DmaUnmapError::UnknownSpace(space_id))?;
        let n = space.lock().dma_live();
        Ok(n)
    }
}
