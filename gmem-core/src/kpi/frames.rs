//! KPI: a device's frames — fragmentation measured (`dev_free_extents`), controlled
//! (`dev_compact`), page groups (`dev_set_page_groups`, `dev_page_groups`,
//! `dev_group_class`, `dev_set_group_class`), and where a page lives
//! (`as_page_frame`).
//!
//! ## Compaction
//! `dev_compact(dev, order)` makes free aligned blocks of `2^order` frames by
//! migration, the way Linux's `compact_zone` does, with a different choice of blocks:
//! 1. scan every aligned block of the order (under the device's frame lock) and note
//!    its free, movable (active or inactive, with a reverse mapping) and pinned (wired
//!    or awaiting invalidation) frames;
//! 2. sort the blocks that are not free yet by (pinned?, frames in use): the sources
//!    are taken from the front (the cheapest blocks to empty, never a block with a
//!    pinned frame), the destinations from the back (the densest blocks; pinned blocks
//!    are good destinations, free blocks never are — filling one would undo the work);
//! 3. while the destinations still have room for a source's pages, move each page of
//!    the source out (per space, under that space's lock, through the core's migration
//!    path: unmap, invalidate, one copy per contiguous run, release, mirror; see
//!    [`crate::space`]'s `compact` module), then check that the block is free.
//!
//! Pages of a memory managed in page groups move only into groups of the class they
//! were allocated for. The report says how many pages moved and how many blocks were
//! made; a concurrent fault may take frames of a block being emptied, which then does
//! not count as made. Compaction takes no lock across blocks, so faults proceed
//! meanwhile.

use crate::addr::{PhysAddr, VirtAddr, PAGE_SHIFT};
use crate::error::LookupError;
use crate::error::MoveError;
use crate::gmem::Gmem;
use crate::handle::{DeviceId, SpaceId};
use crate::mmu::MemError;
use crate::physmem::{BlockUse, FreeExtents, GroupStats, MAX_GROUP_ORDER, MAX_ORDER};
use crate::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

/// Errors of `dev_free_extents`, `dev_compact` and the page-group calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameError {
    /// The handle names no live device.
    UnknownDevice(DeviceId),
    /// The device has no [`crate::DeviceMemory`], so no frames of its own.
    NoMemory(DeviceId),
    /// The order is above [`MAX_ORDER`] (compaction) or [`MAX_GROUP_ORDER`] (groups).
    BadOrder {
        /// The order asked for.
        order: u32,
    },
    /// Page groups can be set up or removed only while every frame is free.
    FramesInUse {
        /// Frames in use or awaiting invalidation.
        frames: u64,
    },
    /// The device's memory is not managed in page groups.
    NoGroups(DeviceId),
    /// The address is not a registered frame of the device.
    NotRegistered {
        /// The address.
        pa: PhysAddr,
    },
    /// The group holding the address has frames in use: it cannot change class.
    GroupInUse {
        /// The address.
        pa: PhysAddr,
        /// Frames of the group in use or awaiting invalidation.
        frames: u64,
    },
    /// Moving a page failed in the driver's data mover (the page stayed where it was).
    Memory(MemError),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::UnknownDevice(d) => write!(f, "unknown device {d:?}"),
            FrameError::NoMemory(d) => write!(f, "device {d:?} has no memory of its own"),
            FrameError::BadOrder { order } => write!(f, "order {order} is out of range"),
            FrameError::FramesInUse { frames } => {
                write!(
                    f,
                    "{frames} frames are in use: page groups need a free memory"
                )
            }
            FrameError::NoGroups(d) => write!(f, "device {d:?} has no page groups"),
            FrameError::NotRegistered { pa } => write!(f, "{pa} is not a registered frame"),
            FrameError::GroupInUse { pa, frames } => {
                write!(f, "the group of {pa} has {frames} frames in use")
            }
            FrameError::Memory(e) => write!(f, "data mover failed: {e}"),
        }
    }
}

impl core::error::Error for FrameError {}

/// What one `dev_compact` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// The order compacted for.
    pub order: u32,
    /// Source blocks whose pages compaction tried to move out.
    pub blocks_tried: u64,
    /// Of those, blocks free afterwards.
    pub blocks_made: u64,
    /// Pages moved.
    pub pages_moved: u64,
    /// Copies made (one per contiguous run moved).
    pub copies: u64,
    /// Free blocks of the order (or larger, in units of the order) before and after.
    pub free_blocks_before: u64,
    /// See `free_blocks_before`.
    pub free_blocks_after: u64,
}

impl Gmem {
    fn frames_of(&self, id: DeviceId) -> Result<Arc<crate::device::DeviceInner>, FrameError> {
        let dev = self.device(id).ok_or(FrameError::UnknownDevice(id))?;
        if dev.memory.is_none() {
            return Err(FrameError::NoMemory(id));
        }
        Ok(dev)
    }

    /// The device's free memory as a histogram of aligned free blocks by order, from
    /// which [`FreeExtents::unusable_index`] gives Gorman's unusable-free-space index.
    ///
    /// # Errors
    /// [`FrameError::UnknownDevice`], [`FrameError::NoMemory`] for a device without a
    /// data mover.
    pub fn dev_free_extents(&self, id: DeviceId) -> Result<FreeExtents, FrameError> {
        let _critical = self.critical();
        let dev = self.frames_of(id)?;
        let e = dev.phys.lock().free_extents();
        Ok(e)
    }

    /// Compact the device's memory for free aligned blocks of `2^order` frames by
    /// migrating pages within it (see the module documentation).
    ///
    /// # Errors
    /// [`FrameError::UnknownDevice`], [`FrameError::NoMemory`],
    /// [`FrameError::BadOrder`] above [`MAX_ORDER`] (nothing is moved then);
    /// [`FrameError::Memory`] when the data mover fails (the pages moved before stay
    /// moved, the page being moved stays where it was).
    pub fn dev_compact(&self, id: DeviceId, order: u32) -> Result<CompactReport, FrameError> {
        let _critical = self.critical();
        let dev = self.frames_of(id)?;
        if order > MAX_ORDER {
            return Err(FrameError::BadOrder { order });
        }
        let size = 1u64 << order;
        let blocks = |e: &FreeExtents| e.free_in_blocks_from(order) >> order;
        let (before, uses) = {
            let phys = dev.phys.lock();
            (phys.free_extents(), phys.block_uses(order))
        };
        let mut report = CompactReport {
            order,
            free_blocks_before: blocks(&before),
            ..CompactReport::default()
        };
        if order > 0 {
            let mut cands: Vec<BlockUse> = uses.into_iter().filter(|u| u.free < size).collect();
            cands.sort_by_key(|u| (u.pinned > 0, size - u.free, u.base.0));
            let cx = self.context();
            let mut room: u64 = cands.iter().skip(1).map(|u| u.free).sum();
            let mut j = cands.len();
            for i in 0..cands.len() {
                if i + 1 >= j {
                    break;
                }
                let src = cands[i];
                if src.pinned > 0 || src.movable > room {
                    break;
                }
                // The destinations are the denser blocks, densest first; drop the
                // densest ones that are full.
                while j > i + 1 && cands[j - 1].free == 0 {
                    j -= 1;
                }
                let dests: Vec<(u64, u64)> = cands[i + 1..j]
                    .iter()
                    .rev()
                    .filter(|u| u.free > 0)
                    .map(|u| (u.base.0, u.base.0 + size))
                    .collect();
                report.blocks_tried += 1;
                let (moved, copies) = self.compact_block(&cx, &dev, src, order, &dests)?;
                report.pages_moved += moved;
                report.copies += copies;
                room = room.saturating_sub(moved);
                if i + 1 < cands.len() {
                    room = room.saturating_sub(cands[i + 1].free);
                }
                if dev.phys.lock().block_is_free(src.base, order) {
                    report.blocks_made += 1;
                }
            }
        }
        report.free_blocks_after = blocks(&dev.phys.lock().free_extents());
        Ok(report)
    }

    /// Move every movable page of the block `src` out into `dests`; returns the pages
    /// moved and the copies made.
    fn compact_block(
        &self,
        cx: &crate::space::Ctx<'_>,
        dev: &Arc<crate::device::DeviceInner>,
        src: BlockUse,
        order: u32,
        dests: &[(u64, u64)],
    ) -> Result<(u64, u64), FrameError> {
        let (owners, group_order) = {
            let phys = dev.phys.lock();
            (phys.block_owners(src.base, order), phys.group_order())
        };
        let block_end = src.base.add(1 << order);
        let (mut moved, mut copies) = (0, 0);
        let mut next = src.base;
        for (pfn, owner) in owners {
            if pfn < next {
                continue;
            }
            let Some(space) = cx.space(owner.space) else {
                continue;
            };
            // A run never crosses a page group (its frames share one class).
            let end = match group_order {
                Some(g) => crate::addr::Pfn(((pfn.0 >> g) + 1) << g).min(block_end),
                None => block_end,
            };
            let class = dev.phys.lock().frame_class(pfn);
            let mut st = space.lock();
            let n = st
                .compact_out(
                    cx,
                    &space,
                    crate::space::CompactMove {
                        vpn: owner.vpn,
                        dev,
                        pfn,
                        end,
                        dests,
                        class,
                    },
                )
                .map_err(|e| match e {
                    MoveError::Memory(m) => FrameError::Memory(m),
                    // The destination is the same memory and every page table exists
                    // already: neither fails, but say so rather than panic.
                    MoveError::OutOfMemory(d) | MoveError::TooManyMemories(d) => {
                        FrameError::NoMemory(d)
                    }
                    MoveError::Mmu(_) => FrameError::Memory(MemError::Hardware(u32::MAX)),
                })?;
            drop(st);
            if n > 0 {
                moved += n;
                copies += 1;
            }
            next = pfn.add(n.max(1));
        }
        Ok((moved, copies))
    }

    /// Where the page holding `va` of a space lives: the device whose memory holds its
    /// frame, and the frame's address (`None` for a page of a region that has no frame
    /// yet). Fragmentation tools and contiguity measurements read physical placement
    /// with it.
    ///
    /// # Errors
    /// [`LookupError`] for a stale space or an address no region holds.
    pub fn as_page_frame(
        &self,
        space_id: SpaceId,
        va: VirtAddr,
    ) -> Result<Option<(DeviceId, PhysAddr)>, LookupError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(LookupError::UnknownSpace(space_id))?;
        let st = space.lock();
        st.region_at(va.as_u64())
            .ok_or(LookupError::NotAllocated(va))?;
        Ok(st.frame_of(va.vpn()).map(|(d, pfn)| (d, pfn.addr())))
    }

    /// The private frame `dev` has for the page at `va` (see
    /// [`Gmem::region_alloc_private`]), as `(memory, physical address)`; `None` when it
    /// has none.
    ///
    /// # Errors
    /// [`LookupError`] for a destroyed space or an address outside every region.
    pub fn as_private_frame(
        &self,
        space_id: SpaceId,
        va: VirtAddr,
        dev: DeviceId,
    ) -> Result<Option<(DeviceId, PhysAddr)>, LookupError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(LookupError::UnknownSpace(space_id))?;
        let st = space.lock();
        st.region_at(va.as_u64())
            .ok_or(LookupError::NotAllocated(va))?;
        Ok(st
            .slot_of(dev)
            .and_then(|slot| st.private_frame(slot, va.vpn()))
            .map(|(mem, pfn)| (st.memory_id(mem), pfn.addr())))
    }

    /// Manage the device's frames in page groups of `2^order` frames (`Some(order)`),
    /// every group starting in class 0, or stop (`None`). See the rules in `physmem/groups.rs`.
    ///
    /// # Errors
    /// [`FrameError::UnknownDevice`], [`FrameError::NoMemory`],
    /// [`FrameError::BadOrder`] above [`MAX_GROUP_ORDER`], [`FrameError::FramesInUse`]
    /// unless every frame is free; nothing changes then.
    pub fn dev_set_page_groups(&self, id: DeviceId, order: Option<u32>) -> Result<(), FrameError> {
        let _critical = self.critical();
        let dev = self.frames_of(id)?;
        if let Some(o) = order.filter(|&o| o > MAX_GROUP_ORDER) {
            return Err(FrameError::BadOrder { order: o });
        }
        let mut phys = dev.phys.lock();
        let c = phys.counts();
        let used = c.registered - c.free;
        if used > 0 {
            return Err(FrameError::FramesInUse { frames: used });
        }
        phys.set_groups(order);
        Ok(())
    }

    /// Statistics of the device's page groups (`None` when it has none).
    ///
    /// # Errors
    /// [`FrameError::UnknownDevice`], [`FrameError::NoMemory`].
    pub fn dev_page_groups(&self, id: DeviceId) -> Result<Option<GroupStats>, FrameError> {
        let _critical = self.critical();
        let dev = self.frames_of(id)?;
        let s = dev.phys.lock().group_stats();
        Ok(s)
    }

    /// The class of the page group holding `pa` (`None` without groups or for an
    /// address that is not registered memory of the device).
    ///
    /// # Errors
    /// [`FrameError::UnknownDevice`], [`FrameError::NoMemory`].
    pub fn dev_group_class(&self, id: DeviceId, pa: PhysAddr) -> Result<Option<u32>, FrameError> {
        let _critical = self.critical();
        let dev = self.frames_of(id)?;
        let c = dev
            .phys
            .lock()
            .group_class(crate::addr::Pfn(pa.as_u64() >> PAGE_SHIFT));
        Ok(c)
    }

    /// Give the page group holding `pa` class `class` ahead of demand (the driver's
    /// [`crate::DeviceMemory::group_class_changed`] is told when the class changes).
    ///
    /// # Errors
    /// [`FrameError::UnknownDevice`], [`FrameError::NoMemory`],
    /// [`FrameError::NoGroups`], [`FrameError::NotRegistered`], and
    /// [`FrameError::GroupInUse`] when a frame of the group is in use; nothing changes
    /// then.
    pub fn dev_set_group_class(
        &self,
        id: DeviceId,
        pa: PhysAddr,
        class: u32,
    ) -> Result<(), FrameError> {
        let _critical = self.critical();
        let dev = self.frames_of(id)?;
        let mut phys = dev.phys.lock();
        if phys.group_order().is_none() {
            return Err(FrameError::NoGroups(id));
        }
        match phys.set_group_class(
            crate::addr::Pfn(pa.as_u64() >> PAGE_SHIFT),
            class,
            dev.memory.as_deref(),
        ) {
            None => Err(FrameError::NotRegistered { pa }),
            Some(0) => Ok(()),
            Some(frames) => Err(FrameError::GroupInUse { pa, frames }),
        }
    }
}
