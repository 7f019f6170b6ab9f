//! Devices: an MMU, a data mover, capabilities, registered memory, attachments.
//!
//! A device (`gm_dev_t`) is created from a [`DeviceDesc`]: the driver's [`Mmu`], its
//! [`DeviceMemory`] if it has local memory, its [`DevCaps`] and opaque driver data the
//! driver can fetch back with [`crate::Gmem::dev_data`]. The core keeps, per device, its
//! physical memory ([`crate::physmem`]) and which address spaces it is attached to and
//! active in. One device, the host CPU, is created with the [`crate::Gmem`] instance:
//! its memory is the swap space of every device memory.

use crate::addr::{Pfn, Vpn};
use crate::flags::{DevCaps, PageSizes};
use crate::handle::{DeviceId, SpaceId};
use crate::mmu::{DeviceMemory, Mmu};
use crate::physmem::{PhysMem, RunRequest};
use crate::space::SpaceInner;
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};
use alloc::string::String;
use alloc::sync::Weak;
use alloc::vec::Vec;
use core::any::Any;

/// Everything the core needs to create a device (`gm_dev_create`).
pub struct DeviceDesc {
    /// A name for statistics and errors.
    pub name: String,
    /// The MMU functions.
    pub mmu: Arc<dyn Mmu>,
    /// The data mover of the device's local memory; `None` for a device without memory
    /// of its own (an integrated GPU, an IOMMU-translated NIC).
    pub memory: Option<Arc<dyn DeviceMemory>>,
    /// Capabilities.
    pub caps: DevCaps,
    /// Opaque driver data, handed back by [`crate::Gmem::dev_data`].
    pub data: Option<Arc<dyn Any + Send + Sync>>,
}

/// Which spaces a device is attached to and where it is active.
///
/// Changed only under the lock of the space concerned (lock order: space state, then
/// binding), so a space's attachment list and its devices' bindings always agree. The
/// active space is held weakly: a space keeps its attached devices alive, a device does
/// not keep its space alive, so the two never form a reference cycle.
#[derive(Default)]
pub(crate) struct Binding {
    pub attached: Vec<SpaceId>,
    pub active: Option<Weak<SpaceInner>>,
    /// Set by `dev_destroy` once it has checked that nothing is attached: a concurrent
    /// `as_attach` that comes later sees it and refuses.
    pub destroyed: bool,
}

impl Binding {
    /// The space the device is active in, if it still exists.
    pub fn active_space(&self) -> Option<Arc<SpaceInner>> {
        self.active.as_ref().and_then(Weak::upgrade)
    }

    /// Whether the device is active in the space `id`.
    pub fn is_active_in(&self, id: SpaceId) -> bool {
        self.active_space().is_some_and(|s| s.id == id)
    }
}

pub(crate) struct DeviceInner {
    pub id: DeviceId,
    pub name: String,
    pub mmu: Arc<dyn Mmu>,
    pub memory: Option<Arc<dyn DeviceMemory>>,
    pub caps: DevCaps,
    pub page_sizes: PageSizes,
    pub data: Option<Arc<dyn Any + Send + Sync>>,
    pub phys: Mutex<PhysMem>,
    /// Frames registered so far (read without the physical-memory lock on the fault path).
    pub registered: AtomicU64,
    pub binding: Mutex<Binding>,
    /// The device's tree-prefetch configuration for batched faults, encoded by
    /// `kpi::batch` (0: prefetch off). An atomic, not a lock: read once per batch,
    /// before the space lock, and ranked below nothing.
    pub prefetch: AtomicU64,
}

/// Frames of one device's memory allocated for pages and not yet committed to them.
///
/// Dropping the run gives its frames back, so no error path between allocation and
/// commitment (zeroing, copying, mapping) can leak them; [`FrameRun::commit`] hands
/// them over to the pages for good. The run borrows its device (the caller holds it
/// for the whole operation): no reference-count round trip per allocation.
#[must_use = "commit the frames to their pages, or drop the run to free them"]
pub(crate) struct FrameRun<'a> {
    dev: &'a DeviceInner,
    pfn: Pfn,
    /// Frames still owned by the run (0 once committed).
    pages: u64,
}

impl FrameRun<'_> {
    /// The first frame.
    pub fn pfn(&self) -> Pfn {
        self.pfn
    }

    /// The frames now belong to the pages they were allocated for.
    pub fn commit(mut self) -> Pfn {
        self.pages = 0;
        self.pfn
    }
}

impl Drop for FrameRun<'_> {
    fn drop(&mut self) {
        if self.pages > 0 {
            let mut phys = self.dev.phys.lock();
            for k in 0..self.pages {
                phys.free(self.pfn.add(k));
            }
        }
    }
}

impl DeviceInner {
    /// Allocate the frames `req` asks for: aligned to `req.align` pages, within the
    /// driver's constraint, from page groups of its class when the memory has groups.
    pub fn alloc_frames(&self, req: RunRequest) -> Option<FrameRun<'_>> {
        let mut phys = self.phys.lock();
        let pfn = if phys.group_order().is_some() {
            phys.alloc_grouped(&req, false, self.memory.as_deref())
        } else {
            phys.alloc_run(req.pages, req.align, req.space, req.vpn, false, req.limit)
        }?;
        drop(phys);
        Some(FrameRun {
            dev: self,
            pfn,
            pages: req.pages,
        })
    }

    /// Allocate `pages` contiguous frames inside frames `[lo, hi)` for the pages of
    /// `space` from `vpn` (a compaction destination), from page groups of `class` when
    /// the memory has groups.
    pub fn alloc_frames_within(
        &self,
        lo: u64,
        hi: u64,
        pages: u64,
        class: Option<u32>,
        space: SpaceId,
        vpn: Vpn,
    ) -> Option<FrameRun<'_>> {
        let pfn = self
            .phys
            .lock()
            .alloc_within(lo, hi, pages, class, space, vpn)?;
        Some(FrameRun {
            dev: self,
            pfn,
            pages,
        })
    }

    /// Frames for the pages `req` asks for, contiguous, through the memory's superpage
    /// reservations (`PhysMem::alloc_pages`; `req.align` is not used): a single page
    /// gets the frame at its offset in its block's reservation. A memory managed in
    /// page groups has no reservations: the frames come from groups of `req`'s class.
    #[inline(always)]
    pub fn alloc_pages(&self, req: RunRequest) -> Option<FrameRun<'_>> {
        // One lock round trip on the common path (this runs once per 4 KiB fault).
        let pfn = {
            let mut phys = self.phys.lock();
            if phys.group_order().is_some() {
                drop(phys);
                return self.alloc_frames(RunRequest { align: 1, ..req });
            }
            phys.alloc_pages(req.pages, req.space, req.vpn, false, req.limit)?
        };
        Some(FrameRun {
            dev: self,
            pfn,
            pages: req.pages,
        })
    }

    pub fn faultable(&self) -> bool {
        self.caps.contains(DevCaps::FAULTABLE)
    }

    /// Whether the device has registered memory frames can be placed in.
    pub fn has_memory(&self) -> bool {
        self.memory.is_some() && self.registered.load(Ordering::Acquire) > 0
    }
}
