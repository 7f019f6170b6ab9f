//! Servicing one block of a fault batch (issue 35, items 1 and 2) under one hold of
//! the space lock: the block's faulted pages, then the pages the tree prefetcher adds.
//!
//! ## Theory
//! A device reporting its faults in batches ([`crate::Gmem::dev_fault_batch`]) has
//! them deduplicated and grouped by 2 MiB block ([`crate::policy::batch`]); the KPI
//! then takes the space lock once per block and calls [`SpaceState::serve_block`]:
//! 1. **the faults**: each faulted page goes through the single-fault path
//!    ([`SpaceState::fault`]), so a batched fault decides exactly as a lone one does
//!    (placement, protection, wiring, zero-fill blocks, eviction). The only
//!    difference: the stale-TLB invalidations of its spurious faults are collected
//!    (`Translation::deferred_spurious`) and issued as one call at the end of the block;
//! 2. **the prefetch** (when the device has a [`PrefetchConfig`]): per region of the
//!    block's successfully faulted pages, [`crate::policy::prefetch::plan`] gets the
//!    pages resident in the fault's target memory and the faulted pages, clipped to
//!    the region, and answers the extra pages to bring. Each contiguous run of them
//!    is moved (populated elsewhere) or zero-filled (never populated) through the one
//!    frame entry ([`SpaceState::frames`]) with one copy per physically contiguous
//!    piece, then mapped in the faulter's table, so the device does not fault on it.
//!
//! ## What prefetch never does
//! - **evict**: its frames are asked with `Pressure::Fail`; once the target memory is
//!   full the block's prefetch stops. Under oversubscription a prefetched page would
//!   otherwise push out a page the same batch just faulted in (assumption of this
//!   project, not UVM's rule: UVM may evict to make room for prefetched pages);
//! - touch pages outside the faulted page's region, pages of no access, wired or
//!   pending pages, pages of a region in `RemoteAccess` mode (those map remotely by
//!   policy) or of a busy region, or zero-fill a page of an explicitly mapped region.

use super::frames::Requester;
use super::frames::{FrameAsk, Pressure};
use super::{PlacementMode, SpaceInner, SpaceState};
use crate::addr::{Vpn, PAGE_SHIFT};
use crate::device::DeviceInner;
use crate::error::FaultError;
use crate::fault::FaultResolution;
use crate::lpt::{PageEntry, PENDING};
use crate::policy::batch::BlockFaults;
use crate::policy::prefetch::{plan, PrefetchConfig, PrefetchInput};
use crate::policy::{PageMask, BLOCK_PAGES};
use crate::space::Ctx;
use crate::stats::{Counters, SpaceCounters};
use crate::sync::Arc;
use alloc::vec::Vec;

/// What servicing one block did.
pub(crate) struct BlockServed {
    /// One outcome per page of the block's group, in its order.
    pub outcomes: Vec<Result<FaultResolution, FaultError>>,
    /// Pages the prefetcher brought to the faulter.
    pub prefetched: u64,
}

impl SpaceState {
    /// Serve the faults of `block` (one device's, on one 2 MiB block) for `dev`, the
    /// device in attachment `faulter = (slot, table)`, then prefetch around them under
    /// `prefetch` (module header). The caller holds the space lock across the call.
    pub(crate) fn serve_block<'c>(
        &mut self,
        cx: &Ctx<'c>,
        space: &SpaceInner,
        dev: &'c Arc<DeviceInner>,
        faulter: (usize, usize),
        block: &BlockFaults,
        prefetch: Option<PrefetchConfig>,
    ) -> BlockServed {
        self.xlat.deferred_spurious = Some(Vec::new());
        let mut outcomes = Vec::with_capacity(block.pages.len());
        for &(page, access) in &block.pages {
            let va = block.block.add(page as u64).addr();
            outcomes.push(self.fault(cx, space, dev, faulter, va, access));
        }
        if let Some(owed) = self.xlat.deferred_spurious.take() {
            if !owed.is_empty() {
                self.invalidate(cx.counters, &owed);
            }
        }
        let mut prefetched = 0;
        if let Some(config) = prefetch {
            let served: Vec<usize> = block
                .pages
                .iter()
                .zip(&outcomes)
                .filter(|(_, r)| r.is_ok())
                .map(|(&(p, _), _)| p as usize)
                .collect();
            prefetched =
                self.prefetch_block(cx, space, dev, faulter.1, block.block, &served, config);
            Counters::add(&cx.counters.pages_prefetched, prefetched);
        }
        BlockServed {
            outcomes,
            prefetched,
        }
    }

    /// The prefetch of one block: per region of the `served` faulted pages (indices
    /// in the block at `base`, ascending), the plan's extra pages brought to the
    /// fault's target memory and mapped in table `t`. Returns the pages brought.
    #[allow(clippy::too_many_arguments)]
    fn prefetch_block<'c>(
        &mut self,
        cx: &Ctx<'c>,
        space: &SpaceInner,
        dev: &'c Arc<DeviceInner>,
        t: usize,
        base: Vpn,
        served: &[usize],
        config: PrefetchConfig,
    ) -> u64 {
        let mut done = 0;
        let mut i = 0;
        while i < served.len() {
            let va = base.add(served[i] as u64).addr();
            let Some(fr) = self.map.for_fault(va.as_u64()) else {
                i += 1;
                continue;
            };
            let (rfirst, rpages) = SpaceState::pages_of(fr.start, fr.len);
            // The region's pages inside the block, as indices.
            let lo = rfirst.0.max(base.0) - base.0;
            let hi = (rfirst.0 + rpages).min(base.0 + BLOCK_PAGES as u64) - base.0;
            let (lo, hi) = (lo as usize, hi as usize);
            let mut faulted = PageMask::new();
            while i < served.len() && served[i] >= lo && served[i] < hi {
                faulted.set(served[i]);
                i += 1;
            }
            if fr.busy || fr.placement.mode != PlacementMode::Unique {
                continue;
            }
            let target = self.target_of(cx, dev, fr.placement.target);
            let Ok(tmem) = self.store.mem_index(&target) else {
                continue;
            };
            let resident = PageMask::from_fn(|k| {
                let e = self.store.lpt.get(base.add(k as u64));
                e.is_populated() && e.mem == tmem
            });
            let input = PrefetchInput {
                resident: &resident,
                faulted: &faulted,
                thrashing: None,
                region: (lo, hi),
                first_touch_at_preferred: false,
            };
            let Ok(p) = plan(&config, &input) else {
                continue;
            };
            for run in p.prefetch.runs() {
                let first = base.add(run.first as u64);
                let (n, full) = self.prefetch_run(
                    cx,
                    space,
                    &target,
                    t,
                    first,
                    run.len as u64,
                    (fr.piece, fr.explicit),
                );
                done += n;
                if full {
                    return done;
                }
            }
        }
        done
    }

    /// Bring the pages `[first, first + pages)` of one region (its piece and whether
    /// it is explicitly mapped in `region`) to `target` without evicting anything, and
    /// map those that got there in table `t`. Returns the pages brought and whether
    /// the target memory ran out of frames.
    #[allow(clippy::too_many_arguments)]
    fn prefetch_run(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        target: &Arc<DeviceInner>,
        t: usize,
        first: Vpn,
        pages: u64,
        region: (super::segments::Piece, bool),
    ) -> (u64, bool) {
        let stats = cx.counters;
        if self.store.any_pending(first, pages) {
            self.drain(stats, &space.arena);
        }
        let Ok(tmem) = self.store.mem_index(target) else {
            return (0, true);
        };
        let end = first.add(pages);
        let mut v = first;
        let mut brought = 0;
        let mut full = false;
        while v < end && !full {
            let e = self.store.lpt.get(v);
            let piece = self.map.piece(region.0, v);
            if piece.prot.is_empty()
                || e.has(PENDING)
                || SpaceState::is_wired(&e)
                || (e.is_populated() && e.mem == tmem)
            {
                v = v.add(1);
                continue;
            }
            let asker = Requester {
                device: None,
                attrs: self.attrs_at(v),
            };
            let n = if e.is_populated() {
                self.prefetch_move(cx, space, target, v, end, asker)
            } else if region.1 {
                Ok(0) // explicitly mapped: never zero-fill
            } else {
                self.prefetch_zero(cx, space, target, tmem, v, end, asker)
            };
            let n = match n {
                Ok(0) => {
                    v = v.add(1);
                    continue;
                }
                Ok(n) => n,
                Err(()) => {
                    full = true;
                    0
                }
            };
            for k in 0..n {
                let p = v.add(k);
                let x = self.store.lpt.get(p);
                if x.is_populated() && x.mem == tmem && x.mapped & (1 << t) == 0 {
                    let piece = self.map.piece(region.0, p);
                    // A failed map leaves the page unmapped: the device faults on it.
                    let _ = self.map_for_fault(stats, t, p, x, piece);
                }
            }
            brought += n;
            v = v.add(n.max(1));
        }
        (brought, full)
    }

    /// Move the populated pages from `v` (before `end`) that form one physically
    /// contiguous run to `target` with one copy; `Err` when no frame is free.
    fn prefetch_move(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        target: &Arc<DeviceInner>,
        v: Vpn,
        end: Vpn,
        asker: Requester,
    ) -> Result<u64, ()> {
        let n = self.movable_run(v, end.0 - v.0);
        let n = if n > 1 && self.same_attrs(v, n) { n } else { 1 };
        let mut ask = FrameAsk::run(space.id, v, n, 1, asker);
        let run = match self.frames(cx, Some(space), target, ask) {
            Ok(run) => Some((run, n)),
            Err(_) if n > 1 => {
                ask.pages = 1;
                self.frames(cx, Some(space), target, ask)
                    .ok()
                    .map(|r| (r, 1))
            }
            Err(_) => None,
        };
        let Some((run, n)) = run else {
            return Err(());
        };
        match self.move_run(cx, v, n, target, run) {
            Ok(()) => Ok(n),
            // Nothing moved (the page stays where it was): not prefetched.
            Err(_) => Ok(0),
        }
    }

    /// Zero-fill the never-populated pages from `v` (before `end`) in `target`
    /// (memory index `tmem`) with one frame run and one zeroing; `Err` when no frame
    /// is free.
    #[allow(clippy::too_many_arguments)]
    fn prefetch_zero(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        target: &Arc<DeviceInner>,
        tmem: u8,
        v: Vpn,
        end: Vpn,
        asker: Requester,
    ) -> Result<u64, ()> {
        let stats = cx.counters;
        let mut n = 1;
        while v.add(n) < end && !self.store.lpt.get(v.add(n)).is_populated() {
            n += 1;
        }
        let n = if n > 1 && self.same_attrs(v, n) { n } else { 1 };
        let mut ask = FrameAsk::run(space.id, v, n, 1, asker);
        debug_assert!(ask.pressure == Pressure::Fail);
        let got = match self.frames(cx, Some(space), target, ask) {
            Ok(run) => Some((run, n)),
            Err(_) if n > 1 => {
                ask.pages = 1;
                self.frames(cx, Some(space), target, ask)
                    .ok()
                    .map(|r| (r, 1))
            }
            Err(_) => None,
        };
        let Some((run, n)) = got else {
            return Err(());
        };
        let pfn = run.pfn();
        let Some(memory) = target.memory.as_ref() else {
            return Ok(0);
        };
        if memory.zero(pfn.addr(), n << PAGE_SHIFT).is_err() {
            return Ok(0); // dropping the run frees the frames
        }
        self.store.lpt.update_run(v, n, |p, e| {
            *e = PageEntry {
                pfn: pfn + (p.0 - v.0),
                mem: tmem,
                ..PageEntry::EMPTY
            }
        });
        let replicas = self.xlat.replica_mask();
        if self.mirror(stats, v, n, replicas).is_err() {
            self.unmap_pages(stats, v, n, u32::MAX);
            self.store
                .lpt
                .update_run(v, n, |_, e| *e = PageEntry::EMPTY);
            return Ok(0);
        }
        run.commit();
        SpaceCounters::add(&self.local().pages_zeroed, n);
        Ok(n)
    }
}
