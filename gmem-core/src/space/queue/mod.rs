//! The asynchronous MMU queue of an address space: its types here, its work on the
//! space state (enqueue, drain, release after invalidation, strict unmaps deferred
//! out of the lock) in `drain`.
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

mod drain;

use crate::addr::VaRange;
use crate::addr::{Pfn, Vpn};
use crate::handle::DeviceId;
use crate::mmu::{Mmu, MmuError, PageTableRoot};
use crate::stats::Counters;
use crate::sync::{Arc, AtomicUsize, Ordering};
use alloc::boxed::Box;
use alloc::vec::Vec;

/// A completion callback of an asynchronous request: it receives the request's outcome.
pub type Callback = Box<dyn FnOnce(Result<(), MmuError>) + Send>;

/// Requests a queue holds before it drains by itself.
pub const DEFAULT_BATCH_LIMIT: usize = 64;

/// What discarding pages left to do later: the runs whose invalidation is owed, the
/// quarantined frames, the pages marked pending.
#[must_use = "a discard's invalidation must be queued or completed before its frames and pages are released"]
pub(crate) struct Discard {
    pub runs: Vec<TableRun>,
    pub frames: Vec<(u8, Pfn)>,
    pub first: Vpn,
    pub pages: u64,
    /// Page-table unmaps still to make, outside the lock, before the invalidation
    /// (tables that take concurrent edits, a strict dealloc only; empty otherwise).
    pub unlocked: Vec<TableUnmap>,
}

/// One range of one table to unmap without the space lock.
pub(crate) struct TableUnmap {
    pub mmu: Arc<dyn Mmu>,
    /// The device `mmu` belongs to.
    pub owner: DeviceId,
    pub root: PageTableRoot,
    pub range: VaRange,
}

pub(crate) enum Op {
    Unmap {
        discard: Discard,
        va: Option<(u64, u64)>,
    },
    Map {
        first: Vpn,
        pages: u64,
    },
}

pub(crate) struct Request {
    pub op: Op,
    pub callback: Option<Callback>,
}

/// One device's TLB invalidation of ranges of one page table.
pub(crate) struct Shootdown {
    /// The device whose TLB it is.
    pub(crate) device: DeviceId,
    pub(crate) mmu: Arc<dyn Mmu>,
    pub(crate) root: PageTableRoot,
    pub(crate) ranges: Vec<VaRange>,
}

impl Shootdown {
    /// Invalidate and count it.
    pub fn run(&self, stats: &Counters) {
        self.mmu.invalidate(self.root, &self.ranges);
        Counters::add(&stats.invalidations, 1);
    }
}

/// One contiguous run of pages of one table, collected for unmapping.
#[derive(Clone, Copy)]
pub(crate) struct TableRun {
    pub table: usize,
    pub range: VaRange,
}

/// The queue itself (lives inside the space state).
pub(crate) struct MmuQueue {
    pub(crate) requests: Vec<Request>,
    pub(crate) ready: Vec<(Callback, Result<(), MmuError>)>,
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
    #[inline]
    pub fn take_ready(&mut self) -> Option<Ready> {
        if self.ready.is_empty() {
            return None;
        }
        self.take_ready_batch()
    }

    /// [`MmuQueue::take_ready`] with callbacks to hand over (out of line: every space
    /// lock's release asks, few have any).
    #[inline(never)]
    fn take_ready_batch(&mut self) -> Option<Ready> {
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
