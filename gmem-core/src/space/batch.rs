//! Servicing one block of a fault batch (issue 35, items 1 and 2) under one hold of
//! the space lock: the tree prefetcher's plan with the faulted pages that migrate, then the rest.
//!
//! ## Theory
//! A device reporting its faults in batches ([`crate::Gmem::dev_fault_batch`]) has
//! them deduplicated and grouped by 2 MiB block ([`crate::policy::batch`]); the KPI
//! then takes the space lock once per block and calls [`SpaceState::serve_block`]:
//! 0. with prefetch on, the faulted pages never populated go first through the
//!    single-fault path (step 2), whose zero-fill may fill their whole aligned block;
//! 1. **the plan** (when the device has a [`PrefetchConfig`]), made once per block as
//!    UVM makes it: per region of the block's faulted pages,
//!    [`crate::policy::prefetch::plan`] gets the pages resident in the fault's target
//!    memory and the faulted pages, clipped to the region, and answers the extra pages
//!    to bring. Those, together with the faulted pages that would simply migrate
//!    (unique placement, populated elsewhere, not wired or pending, the access
//!    permitted), are brought in contiguous runs — moved (populated elsewhere) or
//!    zero-filled (never populated) through the one frame entry
//!    ([`SpaceState::frames`]), one copy per physically contiguous piece — and mapped
//!    in the faulter's table. A faulted page brought so is served (`Migrated`);
//! 2. **the faults** the plan did not serve each go through the single-fault path
//!    ([`SpaceState::fault`]), so they decide exactly as a lone fault does (placement,
//!    protection, wiring, zero-fill blocks, eviction). The only difference: the
//!    stale-TLB invalidations of the block's spurious faults are collected and issued
//!    as one call at the end of the block.
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
use crate::space::PageSpan;
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
        let mut outcomes: Vec<Option<Result<FaultResolution, FaultError>>> =
            alloc::vec![None; block.pages.len()];
        let mut prefetched = 0;
        if let Some(config) = prefetch {
            // Never-populated faulted pages first, through the single-fault path: its
            // zero-fill may fill their whole aligned block at once, which a plan that
            // zero-filled neighbours first would prevent.
            for (o, &(page, access)) in outcomes.iter_mut().zip(&block.pages) {
                let vpn = block.block.add(page as u64);
                if !self.store.lpt.get(vpn).is_populated() {
                    *o = Some(self.fault(cx, space, dev, faulter, vpn.addr(), access));
                }
            }
            prefetched = self.plan_block(cx, space, (dev, faulter.1), block, config, &mut outcomes);
            Counters::add(&cx.counters.pages_prefetched, prefetched);
        }
        // Every faulted page the plan did not bring, as a lone fault would be served.
        for (o, &(page, access)) in outcomes.iter_mut().zip(&block.pages) {
            if o.is_none() {
                let va = block.block.add(page as u64).addr();
                *o = Some(self.fault(cx, space, dev, faulter, va, access));
            }
        }
        if let Some(owed) = self.xlat.deferred_spurious.take() {
            if !owed.is_empty() {
                self.invalidate(cx.counters, &owed);
            }
        }
        BlockServed {
            outcomes: outcomes.into_iter().flatten().collect(),
            prefetched,
        }
    }

    /// The block's migration plan, as UVM makes one per block: per region of the
    /// block's faulted pages, [`plan`] over the pages resident in the fault's target
    /// memory and the faulted pages; then the plan's prefetch pages together with the
    /// faulted pages that would simply migrate (unique placement, populated elsewhere,
    /// not wired or pending, access permitted) are brought in contiguous runs
    /// ([`SpaceState::prefetch_run`]: one copy per physically contiguous piece, no
    /// eviction) and mapped in table `t`. A faulted page brought so is served
    /// (`outcomes`, `Migrated`); every other is left to the single-fault path. Returns
    /// the prefetched pages (faulted ones not counted).
    fn plan_block<'c>(
        &mut self,
        cx: &Ctx<'c>,
        space: &SpaceInner,
        (dev, t): (&'c Arc<DeviceInner>, usize),
        block: &BlockFaults,
        config: PrefetchConfig,
        outcomes: &mut [Option<Result<FaultResolution, FaultError>>],
    ) -> u64 {
        let base = block.block;
        let mut done = 0;
        let mut i = 0;
        while i < block.pages.len() {
            let va = base.add(block.pages[i].0 as u64).addr();
            let Some(fr) = self.map.for_fault(va.as_u64()) else {
                i += 1;
                continue;
            };
            let (rfirst, rpages) = SpaceState::pages_of(fr.start, fr.len);
            // The region's pages inside the block, as indices.
            let lo = rfirst.0.max(base.0) - base.0;
            let hi = (rfirst.0 + rpages).min(base.0 + BLOCK_PAGES as u64) - base.0;
            let (lo, hi) = (lo as usize, hi as usize);
            let group = i;
            while i < block.pages.len() && (block.pages[i].0 as usize) < hi {
                i += 1;
            }
            let pages = &block.pages[group..i];
            // Advice and thrashing detection steer single faults; a plan would
            // migrate past them, so their pages take the single-fault path.
            if fr.busy || fr.placement.mode != PlacementMode::Unique || self.policies_steer_faults()
            {
                continue;
            }
            let target = self.target_of(cx, dev, fr.placement.target);
            let Ok(tmem) = self.store.mem_index(&target) else {
                continue;
            };
            let entry = |st: &SpaceState, k: usize| st.store.lpt.get(base.add(k as u64));
            let resident = PageMask::from_fn(|k| {
                let e = entry(self, k);
                e.is_populated() && e.mem == tmem
            });
            let mut faulted = PageMask::new();
            let mut joined = PageMask::new();
            for &(p, access) in pages {
                let p = p as usize;
                faulted.set(p);
                let e = entry(self, p);
                let prot = self.map.piece(fr.piece, base.add(p as u64)).prot;
                if !prot.is_empty()
                    && prot.contains(access)
                    && e.is_populated()
                    && e.mem != tmem
                    && !e.has(PENDING)
                    && !SpaceState::is_wired(&e)
                {
                    joined.set(p);
                }
            }
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
            let mut full = false;
            for run in p.prefetch.or(&joined).runs() {
                let first = base.add(run.first as u64);
                let (n, out) = self.prefetch_run(
                    cx,
                    space,
                    (&target, t),
                    PageSpan {
                        first,
                        pages: run.len as u64,
                    },
                    (fr.piece, fr.explicit),
                );
                done += n;
                if out {
                    full = true;
                    break;
                }
            }
            // The joined faulted pages that arrived and are mapped for the faulter are
            // served: a migration each, as the single-fault path counts it.
            for (k, &(pg, _)) in pages.iter().enumerate() {
                let e = entry(self, pg as usize);
                if joined.test(pg as usize)
                    && e.is_populated()
                    && e.mem == tmem
                    && e.mapped & (1 << t) != 0
                {
                    done = done.saturating_sub(1);
                    SpaceCounters::add(&self.local().faults_migrate, 1);
                    outcomes[group + k] = Some(Ok(FaultResolution {
                        kind: crate::fault::FaultKind::Migrated,
                        pages: 1,
                    }));
                }
            }
            if full {
                break;
            }
        }
        done
    }

    /// Bring the pages `[first, first + pages)` of one region (its piece and whether
    /// it is explicitly mapped in `region`) to `target` without evicting anything, and
    /// map those that got there in table `t`. Returns the pages brought and whether
    /// the target memory ran out of frames.
    fn prefetch_run(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        (target, t): (&Arc<DeviceInner>, usize),
        PageSpan { first, pages }: PageSpan,
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
                self.prefetch_zero(cx, space, (target, tmem), v..end, asker)
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
    fn prefetch_zero(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        (target, tmem): (&Arc<DeviceInner>, u8),
        core::ops::Range { start: v, end }: core::ops::Range<Vpn>,
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
