//! The queue's work on the space state (the theory is in the parent module): enqueue,
//! drain, release after invalidation, strict unmaps deferred out of the lock.

use crate::addr::Vpn;
use crate::handle::DeviceId;
use crate::lpt::{PageEntry, PENDING};
use crate::mmu::MmuError;
use crate::space::{SpaceInner, SpaceState, TableRun};
use crate::stats::Counters;
use crate::sync::Arc;
use crate::vmem::Arena;
use alloc::vec::Vec;

use super::{Callback, Discard, Op, Request, Shootdown};

/// A strict unmap whose page-table entries are cleared and whose TLB invalidation is
/// still to be done, by the caller, *outside* the space lock (so that one thread's
/// invalidation wait — microseconds on an IOMMU — does not hold up the other users of
/// the space).
///
/// Until [`PendingInvalidation::complete`] the unmap keeps everything it released out
/// of reach, exactly as a queued asynchronous unmap does: its frames stay quarantined,
/// its pages stay marked pending, its virtual range stays reserved in the arena. Only
/// `region_dealloc` defers this way: the region is gone, so no fault, map or unmap can
/// touch its pages meanwhile, and a concurrent detach or space destruction only makes
/// the invalidation redundant: the detach of a table's last user invalidates the whole
/// table (`invalidate_all`) before destroying it, so a driver may skip the late
/// invalidation of a root it no longer knows (see `Mmu::invalidate`). The devices
/// the completion will call are listed in the space until it ends, and
/// `dev_destroy` refuses them meanwhile.
#[must_use = "complete() the invalidation, or its frames and range stay quarantined"]
pub(crate) struct PendingInvalidation {
    pub(crate) space: Arc<SpaceInner>,
    pub(crate) shootdowns: Vec<Shootdown>,
    /// What the completion releases under the lock again.
    pub(crate) release: StrictRelease,
}

/// What a strict unmap holds back until its unlocked invalidation has run
/// ([`PendingInvalidation`]), handed back to the space under its lock.
pub(crate) struct StrictRelease {
    pub(crate) discard: Discard,
    pub(crate) va: Option<(u64, u64)>,
    pub(crate) callback: Option<Callback>,
    /// The space's attach epoch when the shootdowns were listed.
    pub(crate) epoch: u64,
    /// Every device the unmaps and shootdowns name (listed in the space's
    /// `strict_refs` until the completion: `dev_destroy` refuses meanwhile).
    pub(crate) devices: Vec<DeviceId>,
}

impl PendingInvalidation {
    /// Unmap what is still mapped (tables that take concurrent edits) and invalidate,
    /// no lock held; then release what the unmap held back and make its callback ready.
    pub fn complete(self, stats: &Counters) {
        for u in &self.release.discard.unlocked {
            u.mmu.unmap(u.root, u.range);
            Counters::add(&stats.mmu_unmaps, 1);
        }
        for s in &self.shootdowns {
            s.run(stats);
        }
        let space = self.space;
        space
            .lock()
            .finish_strict(stats, &space.arena, self.release);
    }
}

impl SpaceState {
    /// Queue an unmap whose entries are already cleared (`discard` came from
    /// `discard_pages_deferred`); `va` is a reservation to release afterwards.
    pub fn enqueue_unmap(
        &mut self,
        stats: &Counters,
        arena: &Arena,
        discard: Discard,
        va: Option<(u64, u64)>,
        callback: Option<Callback>,
    ) {
        Counters::add(&stats.async_requests, 1);
        // Deliberately broken (loom model `queue` must catch it): the completion
        // callback is made ready at once, before the batch's TLB invalidation.
        #[cfg(gmem_loom_bug = "callback_before_invalidation")]
        let callback = {
            self.xlat.queue.complete_now(callback, Ok(()));
            None
        };
        // Deliberately broken (loom model `faults` must catch it): the frames of the
        // unmap go back to their memories at once instead of staying quarantined
        // until the invalidation, so a fault can reuse a frame a TLB still maps.
        #[cfg(gmem_loom_bug = "frames_before_invalidation")]
        let discard = {
            for &(mem, pfn) in &discard.frames {
                self.store.memories.get(mem).phys.lock().free(pfn);
            }
            Discard {
                frames: Vec::new(),
                ..discard
            }
        };
        self.xlat.queue.requests.push(Request {
            op: Op::Unmap { discard, va },
            callback,
        });
        if self.xlat.queue.requests.len() >= self.xlat.queue.batch_limit {
            self.drain(stats, arena);
        }
    }

    /// Queue the page-table updates of a map whose logical entries exist (marked
    /// pending), for the tables that must hold wired pages when the queue drains.
    pub fn enqueue_map(
        &mut self,
        stats: &Counters,
        arena: &Arena,
        first: Vpn,
        pages: u64,
        callback: Option<Callback>,
    ) {
        Counters::add(&stats.async_requests, 1);
        self.xlat.queue.requests.push(Request {
            op: Op::Map { first, pages },
            callback,
        });
        if self.xlat.queue.requests.len() >= self.xlat.queue.batch_limit {
            self.drain(stats, arena);
        }
    }

    /// The requests on `[first, first + pages)` completed: clear their pending marks; a
    /// page left with nothing but the mark (an unmapped one) is forgotten.
    pub(crate) fn clear_pending(&mut self, first: Vpn, pages: u64) {
        let pending: Vec<Vpn> = self
            .store
            .lpt
            .entries_in(first, pages)
            .filter(|(_, e)| e.has(PENDING))
            .map(|(v, _)| v)
            .collect();
        for v in pending {
            self.store.lpt.update(v, |e| {
                e.flags &= !PENDING;
                if !e.is_populated() {
                    *e = PageEntry::EMPTY;
                }
            });
        }
    }

    /// The invalidation of a discard completed: its frames go back to their memories,
    /// its pages lose their pending marks, its virtual range (if any) returns to the
    /// arena.
    pub(crate) fn release_discarded(
        &mut self,
        discard: Discard,
        va: Option<(u64, u64)>,
        arena: &Arena,
    ) {
        for (mem, pfn) in discard.frames {
            self.store.memories.get(mem).phys.lock().free(pfn);
        }
        self.clear_pending(discard.first, discard.pages);
        if let Some((start, len)) = va {
            let freed = arena.free(start, len);
            debug_assert!(freed.is_ok(), "deferred range release failed: {freed:?}");
        }
    }

    /// Turn a discard (from `discard_pages_deferred`) into a strict unmap whose
    /// TLB invalidation runs outside the space lock: see [`PendingInvalidation`]. With
    /// nothing to invalidate it completes at once and `None` is returned.
    pub fn defer_invalidation(
        &mut self,
        space: &Arc<SpaceInner>,
        discard: Discard,
        va: Option<(u64, u64)>,
        callback: Option<Callback>,
    ) -> Option<PendingInvalidation> {
        let shootdowns = self.shootdowns(&discard.runs);
        // Deliberately broken (loom model `strict` must catch it): the frames and the
        // range are released under the lock, before the unlocked invalidation.
        #[cfg(gmem_loom_bug = "strict_release_before_invalidation")]
        let (discard, va) = {
            let mut discard = discard;
            let unlocked = core::mem::take(&mut discard.unlocked);
            self.release_discarded(discard, va, &space.arena);
            (
                Discard {
                    runs: Vec::new(),
                    frames: Vec::new(),
                    first: Vpn(0),
                    pages: 0,
                    unlocked,
                },
                None,
            )
        };
        if shootdowns.is_empty() {
            // No device uses the tables: nothing to invalidate, and the unmaps (if
            // any were left) are made here.
            for u in &discard.unlocked {
                u.mmu.unmap(u.root, u.range);
            }
            self.release_discarded(discard, va, &space.arena);
            self.xlat.queue.complete_now(callback, Ok(()));
            return None;
        }
        self.xlat.queue.strict_in_flight += 1;
        if !discard.unlocked.is_empty() {
            self.begin_unlocked_edit();
        }
        let devices: Vec<DeviceId> = shootdowns
            .iter()
            .map(|s| s.device)
            .chain(discard.unlocked.iter().map(|u| u.owner))
            .collect();
        self.xlat.unlocked.hold_devices(&devices);
        Some(PendingInvalidation {
            space: space.clone(),
            shootdowns,
            release: StrictRelease {
                discard,
                va,
                callback,
                epoch: self.xlat.attach_epoch(),
                devices,
            },
        })
    }

    /// The unlocked invalidation of a strict unmap completed: release what it held
    /// back and make its callback ready. A device attached since the invalidations
    /// were listed may have cached what the unlocked unmap removed: it is invalidated
    /// now, under the lock, before anything is released (a rare race).
    pub(crate) fn finish_strict(&mut self, stats: &Counters, arena: &Arena, done: StrictRelease) {
        let StrictRelease {
            discard,
            va,
            callback,
            epoch,
            devices,
        } = done;
        self.xlat.unlocked.release_devices(&devices);
        let unlocked = !discard.unlocked.is_empty();
        if unlocked && epoch != self.xlat.attach_epoch() {
            self.invalidate(stats, &discard.runs);
        }
        self.release_discarded(discard, va, arena);
        self.xlat.queue.strict_in_flight -= 1;
        if unlocked {
            self.end_unlocked_edit(stats);
        }
        self.xlat.queue.complete_now(callback, Ok(()));
    }

    /// Complete every queued request: page-table updates of maps, one coalesced TLB
    /// invalidation per device for all unmaps, then release frames and ranges, then
    /// make the callbacks ready.
    pub fn drain(&mut self, stats: &Counters, arena: &Arena) {
        let requests = core::mem::take(&mut self.xlat.queue.requests);
        if requests.is_empty() {
            return;
        }
        Counters::add(&stats.async_batches, 1);
        let mut runs: Vec<TableRun> = Vec::new();
        let mut unmaps = 0u64;
        let mut results: Vec<Result<(), MmuError>> = Vec::with_capacity(requests.len());
        for req in &requests {
            match &req.op {
                Op::Unmap { discard, .. } => {
                    runs.extend_from_slice(&discard.runs);
                    unmaps += 1;
                    results.push(Ok(()));
                }
                Op::Map { first, pages } => {
                    let (first, pages) = (*first, *pages);
                    self.clear_pending(first, pages);
                    // The tables that must hold wired pages now: one attached while
                    // the map was queued (its fill skipped the pending pages) is
                    // included, one detached since is not.
                    let live = self.xlat.wired_mask();
                    results.push(self.mirror(stats, first, pages, live));
                }
            }
        }
        // The batch's ranges return to the arena after the invalidation: announce
        // them now, so that their hash slots and records load while the TLBs are
        // invalidated instead of when each range is freed.
        arena.prefetch_frees(requests.iter().filter_map(|r| match r.op {
            Op::Unmap { va, .. } => va,
            Op::Map { .. } => None,
        }));
        // One invalidation per device for the whole batch.
        if !runs.is_empty() {
            let before = stats.invalidations.load(crate::sync::Ordering::Relaxed);
            self.invalidate(stats, &runs);
            let issued = stats.invalidations.load(crate::sync::Ordering::Relaxed) - before;
            if unmaps > 1 && issued > 0 {
                Counters::add(&stats.invalidations_coalesced, unmaps - 1);
            }
        }
        for (req, result) in requests.into_iter().zip(results) {
            if let Op::Unmap { discard, va } = req.op {
                self.release_discarded(discard, va, arena);
            }
            if let Some(cb) = req.callback {
                self.xlat.queue.ready.push((cb, result));
            }
        }
    }
}
