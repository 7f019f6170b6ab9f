//! Compaction's work inside one space: moving the pages of one aligned block of a
//! device's memory out into frames elsewhere in the same memory.
//!
//! `Gmem::dev_compact` (in `kpi/frames.rs`) chooses the blocks and the
//! destinations; this module moves the pages of one space. A page moves by the core's
//! own migration path, [`SpaceState::move_run`] — unmap from every table that maps it,
//! invalidate those TLBs, copy the bytes in one [`crate::DeviceMemory::copy`] per
//! physically contiguous run, release the old frames, mirror into replicate tables — so
//! no mapping, reverse map or TLB can keep naming the old frame. Only pages that
//! eviction could take move (populated, unwired, not awaiting an invalidation, on
//! exactly the frame the block scan saw); anything else leaves its block as it is.

use super::{SpaceInner, SpaceState};
use crate::addr::{Pfn, Vpn};
use crate::device::DeviceInner;
use crate::error::MoveError;
use crate::lpt::PENDING;
use crate::space::Ctx;
use crate::sync::Arc;

/// The longest run compaction moves in one copy (2 MiB).
const COMPACT_RUN_MAX: u64 = 512;

/// One move compaction asks of a space: page `vpn` — expected on frame `pfn` of
/// `dev` — and the pages after it on the following frames up to `end`, out into a run
/// of frames inside one of the frame windows `dests` (`[lo, hi)`, best first), from
/// page groups of `class` when the memory has groups.
pub(crate) struct CompactMove<'a> {
    /// The first page to move.
    pub vpn: Vpn,
    /// The memory compacted.
    pub dev: &'a Arc<DeviceInner>,
    /// The frame the page is expected on.
    pub pfn: Pfn,
    /// Where the block being emptied ends: no run goes past it.
    pub end: Pfn,
    /// The destination frame windows, best first.
    pub dests: &'a [(u64, u64)],
    /// The page group class of the frames moved, if the memory has groups.
    pub class: Option<u32>,
}

impl SpaceState {
    /// Make the move `mv` (see [`CompactMove`]). Returns the pages moved (0 when the
    /// page cannot move now or no destination has room).
    pub(crate) fn compact_out(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        mv: CompactMove<'_>,
    ) -> Result<u64, MoveError> {
        let CompactMove {
            vpn,
            dev,
            pfn,
            end,
            dests,
            class,
        } = mv;
        if self.store.lpt.get(vpn).has(PENDING) {
            self.drain(cx.counters, &space.arena);
        }
        let e = self.store.lpt.get(vpn);
        if !self.evictable(&e, dev, pfn) {
            return Ok(0);
        }
        let run = self.movable_run(vpn, (end.0 - pfn.0).min(COMPACT_RUN_MAX));
        for n in [run, 1] {
            for &(lo, hi) in dests {
                if let Some(new) = dev.alloc_frames_within(lo, hi, n, class, space.id, vpn) {
                    self.move_run(cx, vpn, n, dev, new)?;
                    return Ok(n);
                }
            }
            if run == 1 {
                break;
            }
        }
        Ok(0)
    }
}

impl SpaceState {
    /// Where page `vpn` lives: the memory's device and the frame (`None` for a page
    /// without a frame).
    pub(crate) fn frame_of(&self, vpn: Vpn) -> Option<(crate::handle::DeviceId, Pfn)> {
        let e = self.store.lpt.get(vpn);
        e.is_populated()
            .then(|| (self.store.memories.get(e.mem).id, e.pfn))
    }
}
