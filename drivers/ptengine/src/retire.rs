//! Table pages unlinked by an edit, freed only when no page walker can reach them.
//!
//! ## Theory
//! When an unmap empties a table page, the engine unlinks it from its parent at once,
//! but a walker (a device MMU) that was translating with that root may hold a pointer
//! to it in its page-walk cache until it is invalidated. If the page went back to the
//! allocator immediately, a map elsewhere could reuse it as a different table and the
//! stale pointer would translate addresses to frames nobody meant to map. So an emptied
//! page is **retired**: it waits, tagged with the walkers that were active on its root
//! at that moment, and is released when the last of them has invalidated that root (or
//! switched to another root, which flushes its caches). A page retired while no walker
//! uses its root is released at once. Destroying a root releases whatever it still has
//! retired: the core invalidates every user before it destroys a table.
//!
//! This is the reader side of the GMEM paper's reclaimable page table (section 5.5)
//! applied to hardware walkers: the TLB invalidation is the grace period. A
//! [`Retirement`] only keeps the books; every method hands the pages it releases to a
//! `free` callback, called after its own lock is dropped, so any table memory (a
//! simulated frame pool, the IOMMU's atomic frames) can use it.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use spin::Mutex;

/// A walker's identity (one per device MMU that walks a memory's tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WalkerId(pub u32);

/// Counters of a [`Retirement`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetireStats {
    /// Table pages released at once (no walker was using their root).
    pub freed_at_once: u64,
    /// Table pages released after the walkers' invalidations.
    pub freed_after_invalidation: u64,
    /// Table pages retired and not yet released.
    pub waiting: u64,
}

struct Retired {
    root: u64,
    page: u64,
    waiting: Vec<WalkerId>,
}

#[derive(Default)]
struct Books {
    next: u32,
    active: BTreeMap<WalkerId, u64>,
    retired: Vec<Retired>,
    stats: RetireStats,
}

impl Books {
    /// Take out the pages no walker waits for any more.
    fn release(&mut self) -> Vec<u64> {
        let mut out = Vec::new();
        self.retired.retain(|r| {
            let keep = !r.waiting.is_empty();
            if !keep {
                out.push(r.page);
            }
            keep
        });
        self.stats.freed_after_invalidation += out.len() as u64;
        out
    }
}

/// The retired table pages of one table memory, and which walker uses which root.
///
/// Its lock is a spin lock taken for a few list operations; in the IOMMU's loom models
/// it is never contended (only the writer that unlinks retires, and no walker runs).
#[derive(Default)]
pub struct Retirement {
    books: Mutex<Books>,
}

impl Retirement {
    /// Empty books.
    pub fn new() -> Retirement {
        Retirement::default()
    }

    /// A new walker id.
    pub fn new_walker(&self) -> WalkerId {
        let mut b = self.books.lock();
        b.next += 1;
        WalkerId(b.next)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> RetireStats {
        let b = self.books.lock();
        RetireStats {
            waiting: b.retired.len() as u64,
            ..b.stats
        }
    }

    /// Whether a page unlinked from `root` still waits for a walker's invalidation.
    pub fn has_retired(&self, root: u64) -> bool {
        self.books.lock().retired.iter().any(|r| r.root == root)
    }

    /// `walker` now translates with `root` (or nothing); its caches were flushed by the
    /// switch, so it no longer holds any retired page.
    pub fn activated(&self, walker: WalkerId, root: Option<u64>, free: impl FnMut(u64)) {
        let out = {
            let mut b = self.books.lock();
            match root {
                Some(r) => b.active.insert(walker, r),
                None => b.active.remove(&walker),
            };
            for r in b.retired.iter_mut() {
                r.waiting.retain(|w| *w != walker);
            }
            b.release()
        };
        out.into_iter().for_each(free);
    }

    /// `walker` dropped every cached entry of `root`.
    pub fn invalidated(&self, walker: WalkerId, root: u64, free: impl FnMut(u64)) {
        let out = {
            let mut b = self.books.lock();
            if b.retired.is_empty() {
                return;
            }
            for r in b.retired.iter_mut().filter(|r| r.root == root) {
                r.waiting.retain(|w| *w != walker);
            }
            b.release()
        };
        out.into_iter().for_each(free);
    }

    /// Table page `page` of `root` was unlinked: `free` it once no walker can reach it
    /// (at once if no walker uses `root`).
    pub fn retire(&self, root: u64, page: u64, mut free: impl FnMut(u64)) {
        let mut b = self.books.lock();
        let waiting: Vec<WalkerId> = b
            .active
            .iter()
            .filter(|(_, r)| **r == root)
            .map(|(w, _)| *w)
            .collect();
        if waiting.is_empty() {
            b.stats.freed_at_once += 1;
            drop(b);
            free(page);
            return;
        }
        b.retired.push(Retired {
            root,
            page,
            waiting,
        });
    }

    /// `root` was destroyed: release everything it still has retired.
    pub fn destroyed(&self, root: u64, free: impl FnMut(u64)) {
        let out = {
            let mut b = self.books.lock();
            for r in b.retired.iter_mut().filter(|r| r.root == root) {
                r.waiting.clear();
            }
            b.release()
        };
        out.into_iter().for_each(free);
    }
}
