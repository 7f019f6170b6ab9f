//! The asynchronous MMU queue of an address space.
//!
//! ## Theory
//! Unmapping is two steps of very different cost: clearing page-table entries (memory
//! writes by the CPU) and invalidating the TLBs of the devices that may cache them (an
//! IOTLB invalidation command, a GPU TLB shootdown: microseconds each). Strict unmap does
//! both at once. Asynchronous unmap clears the entries at once — new translations fault
//! immediately — and queues the invalidation, so that one invalidation per device covers
//! a whole batch of unmaps (Peleg et al., "Utilizing the IOMMU scalably", the `[18]` of
//! GMEM).
//!
//! The safety rule that makes deferral sound: **nothing an unmap released is reused
//! before its invalidation completed.** A queued unmap keeps its frames quarantined
//! (physical memory state *pending*), keeps its virtual range out of the arena and marks
//! its pages *pending* in the logical page table; any fault, map or unmap that touches
//! a pending page drains the queue first. Completion callbacks run after the batch's
//! invalidation, outside the space lock, so they may call the KPI again.
//!
//! Asynchronous maps are queued the same way: the logical mapping exists at once (a
//! faultable device that touches the page gets it through its fault), the page-table
//! updates for devices that cannot fault happen when the queue drains, and the callback
//! says when they are visible.
//!
//! The queue drains on `as_synchronize`, when it holds `batch_limit` requests, and
//! before any operation that touches a pending page.

use crate::lpt::{PageEntry, PENDING};
use crate::mmu::MmuError;
use crate::space::{Shootdown, SpaceInner, SpaceState, TableRun};
use crate::stats::Counters;
use crate::sync::{Arc, AtomicUsize, Ordering};
use crate::vmem::Arena;
use alloc::boxed::Box;
use alloc::vec::Vec;

/// A completion callback of an asynchronous request: it receives the request's outcome.
pub type Callback = Box<dyn FnOnce(Result<(), MmuError>) + Send>;

/// Requests a queue holds before it drains by itself.
pub const DEFAULT_BATCH_LIMIT: usize = 64;

/// What discarding pages left to do later.
pub(crate) struct Discard {
    pub runs: Vec<TableRun>,
    pub frames: Vec<(u8, u64)>,
    pub first: u64,
    pub pages: u64,
}

enum Op {
    Unmap {
        discard: Discard,
        va: Option<(u64, u64)>,
    },
    Map {
        first: u64,
        pages: u64,
    },
}

struct Request {
    op: Op,
    callback: Option<Callback>,
}

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
/// the invalidation redundant (drivers accept an invalidation of a root destroyed
/// meanwhile, see `Mmu::invalidate`).
#[must_use = "complete() the invalidation, or its frames and range stay quarantined"]
pub(crate) struct PendingInvalidation {
    space: Arc<SpaceInner>,
    shootdowns: Vec<Shootdown>,
    discard: Discard,
    va: Option<(u64, u64)>,
    callback: Option<Callback>,
}

impl PendingInvalidation {
    /// Invalidate (no lock held), then release what the unmap held back and make its
    /// callback ready.
    pub fn complete(self, stats: &Counters) {
        for s in &self.shootdowns {
            s.run(stats);
        }
        let mut st = self.space.lock();
        st.release_discarded(self.discard, self.va, &self.space.arena);
        st.queue.strict_in_flight -= 1;
        st.queue.complete_now(self.callback, Ok(()));
    }
}

/// The queue itself (lives inside the space state).
pub(crate) struct MmuQueue {
    requests: Vec<Request>,
    ready: Vec<(Callback, Result<(), MmuError>)>,
    pub batch_limit: usize,
    /// Callbacks handed to a thread to run and not finished yet: `as_synchronize` waits
    /// for them, so that when it returns every request queued before it has completed,
    /// callback included, whichever thread drained it.
    pub in_flight: Arc<AtomicUsize>,
    /// Strict unmaps whose invalidation runs outside the lock right now
    /// ([`PendingInvalidation`]): their pages are pending with no queued request.
    pub strict_in_flight: usize,
}

impl Default for MmuQueue {
    fn default() -> Self {
        MmuQueue {
            requests: Vec::new(),
            ready: Vec::new(),
            batch_limit: DEFAULT_BATCH_LIMIT,
            in_flight: Arc::new(AtomicUsize::new(0)),
            strict_in_flight: 0,
        }
    }
}

/// Callbacks ready to run once the space lock is dropped. Dropping the batch runs them,
/// in the order their requests completed; each counts as in flight until it has
/// returned (or unwound), and if one panics the rest are dropped unrun and no longer
/// counted.
pub(crate) struct Ready {
    pending: Unrun,
}

/// The callbacks of a [`Ready`] batch not started yet; dropping them unrun (after a
/// panic in an earlier one) takes them out of the in-flight count.
struct Unrun {
    callbacks: Vec<(Callback, Result<(), MmuError>)>,
    in_flight: Arc<AtomicUsize>,
}

impl Drop for Unrun {
    fn drop(&mut self) {
        let n = self.callbacks.len();
        if n > 0 {
            self.in_flight.fetch_sub(n, Ordering::Release);
        }
    }
}

/// Marks one callback finished when dropped, even by unwinding.
struct Finished<'a>(&'a AtomicUsize);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Ready {
    fn drop(&mut self) {
        self.pending.callbacks.reverse();
        while let Some((cb, r)) = self.pending.callbacks.pop() {
            let _finished = Finished(&self.pending.in_flight);
            cb(r);
        }
    }
}

impl MmuQueue {
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Take the callbacks whose requests completed (`None` when there are none); the
    /// caller drops the batch, which runs them, after releasing the space lock.
    pub fn take_ready(&mut self) -> Option<Ready> {
        if self.ready.is_empty() {
            return None;
        }
        let callbacks = core::mem::take(&mut self.ready);
        self.in_flight.fetch_add(callbacks.len(), Ordering::Acquire);
        Some(Ready {
            pending: Unrun {
                callbacks,
                in_flight: self.in_flight.clone(),
            },
        })
    }

    /// Run a callback as soon as the lock is dropped (a synchronous request's
    /// completion).
    pub fn complete_now(&mut self, cb: Option<Callback>, r: Result<(), MmuError>) {
        if let Some(cb) = cb {
            self.ready.push((cb, r));
        }
    }
}

impl SpaceState {
    /// Queue an unmap whose entries are already cleared (`discard` came from
    /// `discard_pages(.., defer = true)`); `va` is a reservation to release afterwards.
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
            self.queue.complete_now(callback, Ok(()));
            None
        };
        // Deliberately broken (loom model `faults` must catch it): the frames of the
        // unmap go back to their memories at once instead of staying quarantined
        // until the invalidation, so a fault can reuse a frame a TLB still maps.
        #[cfg(gmem_loom_bug = "frames_before_invalidation")]
        let discard = {
            for &(mem, pfn) in &discard.frames {
                self.memories.get(mem).phys.lock().free(pfn);
            }
            Discard {
                frames: Vec::new(),
                ..discard
            }
        };
        self.queue.requests.push(Request {
            op: Op::Unmap { discard, va },
            callback,
        });
        if self.queue.requests.len() >= self.queue.batch_limit {
            self.drain(stats, arena);
        }
    }

    /// Queue the page-table updates of a map whose logical entries exist (marked
    /// pending), for the tables that must hold wired pages when the queue drains.
    pub fn enqueue_map(
        &mut self,
        stats: &Counters,
        arena: &Arena,
        first: u64,
        pages: u64,
        callback: Option<Callback>,
    ) {
        Counters::add(&stats.async_requests, 1);
        self.queue.requests.push(Request {
            op: Op::Map { first, pages },
            callback,
        });
        if self.queue.requests.len() >= self.queue.batch_limit {
            self.drain(stats, arena);
        }
    }

    /// The requests on `[first, first + pages)` completed: clear their pending marks; a
    /// page left with nothing but the mark (an unmapped one) is forgotten.
    fn clear_pending(&mut self, first: u64, pages: u64) {
        let pending: Vec<u64> = self
            .lpt
            .entries_in(first, pages)
            .filter(|(_, e)| e.has(PENDING))
            .map(|(v, _)| v)
            .collect();
        for v in pending {
            self.lpt.update(v, |e| {
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
    fn release_discarded(&mut self, discard: Discard, va: Option<(u64, u64)>, arena: &Arena) {
        for (mem, pfn) in discard.frames {
            self.memories.get(mem).phys.lock().free(pfn);
        }
        self.clear_pending(discard.first, discard.pages);
        if let Some((start, len)) = va {
            let freed = arena.free(start, len);
            debug_assert!(freed.is_ok(), "deferred range release failed: {freed:?}");
        }
    }

    /// Turn a discard (from `discard_pages(.., defer = true)`) into a strict unmap whose
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
            self.release_discarded(discard, va, &space.arena);
            (
                Discard {
                    runs: Vec::new(),
                    frames: Vec::new(),
                    first: 0,
                    pages: 0,
                },
                None,
            )
        };
        if shootdowns.is_empty() {
            self.release_discarded(discard, va, &space.arena);
            self.queue.complete_now(callback, Ok(()));
            return None;
        }
        self.queue.strict_in_flight += 1;
        Some(PendingInvalidation {
            space: space.clone(),
            shootdowns,
            discard,
            va,
            callback,
        })
    }

    /// Complete every queued request: page-table updates of maps, one coalesced TLB
    /// invalidation per device for all unmaps, then release frames and ranges, then
    /// make the callbacks ready.
    pub fn drain(&mut self, stats: &Counters, arena: &Arena) {
        let requests = core::mem::take(&mut self.queue.requests);
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
                    let live = self.wired_mask();
                    results.push(self.mirror(stats, first, pages, live));
                }
            }
        }
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
                self.queue.ready.push((cb, result));
            }
        }
    }
}
