//! Freeing page-table pages only when no walker can still reach them.
//!
//! ## Theory
//! When an unmap empties a table page, software unlinks it from its parent at once, but
//! a device that was translating with that root may hold a pointer to it in its
//! page-walk cache until it is invalidated. If the page went back to the frame pool
//! immediately, a map elsewhere could reuse it as a different table and the stale
//! pointer would translate addresses to frames nobody meant to map. So an emptied page
//! is **retired**: it waits, tagged with the walkers that were active on its root at
//! that moment, and goes back to the pool when the last of them has invalidated that
//! root (or switched to another root, which flushes its caches). A retired page whose
//! root no walker was using is freed at once. Destroying a root frees whatever it still
//! has retired: the core invalidates every user before it destroys a table.
//!
//! This is the reader side of the GMEM paper's reclaimable page table (section 5.5)
//! applied to hardware walkers: the TLB invalidation is the grace period.

use crate::format::WalkerId;
use crate::frames::FramePool;
use crate::lock;
use gmem_core::{FrameSource, PageTableRoot, PhysAddr};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Counters of a [`TableReclaim`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReclaimStats {
    /// Table pages freed at once (no walker was using their root).
    pub freed_at_once: u64,
    /// Table pages freed after the walkers' invalidations.
    pub freed_after_invalidation: u64,
    /// Table pages retired and not yet freed.
    pub waiting: u64,
}

struct Retired {
    root: u64,
    frame: PhysAddr,
    waiting: Vec<WalkerId>,
}

#[derive(Default)]
struct Inner {
    next: u32,
    active: HashMap<WalkerId, u64>,
    retired: Vec<Retired>,
    stats: ReclaimStats,
}

/// Retired table pages of one format, and which walker translates with which root.
pub struct TableReclaim {
    pool: Arc<FramePool>,
    inner: Mutex<Inner>,
}

impl TableReclaim {
    /// Reclamation into `pool`.
    pub fn new(pool: Arc<FramePool>) -> TableReclaim {
        TableReclaim {
            pool,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The pool table pages come from and return to.
    pub fn pool(&self) -> &Arc<FramePool> {
        &self.pool
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ReclaimStats {
        let g = lock(&self.inner);
        ReclaimStats {
            waiting: g.retired.len() as u64,
            ..g.stats
        }
    }

    /// A new walker id.
    pub fn new_walker(&self) -> WalkerId {
        let mut g = lock(&self.inner);
        g.next += 1;
        WalkerId(g.next)
    }

    fn release(&self, g: &mut Inner) {
        let pool = &self.pool;
        let before = g.retired.len();
        g.retired.retain(|r| {
            let keep = !r.waiting.is_empty();
            if !keep {
                pool.free_frame(r.frame);
            }
            keep
        });
        g.stats.freed_after_invalidation += (before - g.retired.len()) as u64;
    }

    /// `walker` now translates with `root` (its caches were flushed by the switch).
    pub fn activated(&self, walker: WalkerId, root: Option<PageTableRoot>) {
        let mut g = lock(&self.inner);
        match root {
            Some(r) => g.active.insert(walker, r.0),
            None => g.active.remove(&walker),
        };
        for r in g.retired.iter_mut() {
            r.waiting.retain(|w| *w != walker);
        }
        self.release(&mut g);
    }

    /// `walker` dropped every cached entry of `root`.
    pub fn invalidated(&self, walker: WalkerId, root: PageTableRoot) {
        let mut g = lock(&self.inner);
        for r in g.retired.iter_mut().filter(|r| r.root == root.0) {
            r.waiting.retain(|w| *w != walker);
        }
        self.release(&mut g);
    }

    /// Table page `frame` of `root` was unlinked: free it once no walker can reach it.
    pub fn retire(&self, root: PageTableRoot, frame: PhysAddr) {
        let mut g = lock(&self.inner);
        let mut waiting: Vec<WalkerId> = g
            .active
            .iter()
            .filter(|(_, r)| **r == root.0)
            .map(|(w, _)| *w)
            .collect();
        if waiting.is_empty() {
            g.stats.freed_at_once += 1;
            drop(g);
            self.pool.free_frame(frame);
            return;
        }
        waiting.sort_unstable();
        g.retired.push(Retired {
            root: root.0,
            frame,
            waiting,
        });
    }

    /// `root` was destroyed: free everything it still has retired.
    pub fn destroyed(&self, root: PageTableRoot) {
        let mut g = lock(&self.inner);
        for r in g.retired.iter_mut().filter(|r| r.root == root.0) {
            r.waiting.clear();
        }
        self.release(&mut g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::SimMemory;
    use gmem_core::PAGE_SIZE;

    fn reclaim() -> TableReclaim {
        let m = Arc::new(SimMemory::new("h", PhysAddr::new(0), 16 * PAGE_SIZE).unwrap());
        TableReclaim::new(Arc::new(FramePool::new(m, PhysAddr::new(0), 16).unwrap()))
    }

    #[test]
    fn a_retired_page_waits_for_every_active_walker_of_its_root() {
        let r = reclaim();
        let (a, b, c) = (r.new_walker(), r.new_walker(), r.new_walker());
        let root = PageTableRoot(1);
        r.activated(a, Some(root));
        r.activated(b, Some(root));
        r.activated(c, Some(PageTableRoot(2)));
        let f = r.pool().alloc_frame().unwrap();
        r.retire(root, f);
        assert_eq!(r.pool().stats().in_use, 1);
        r.invalidated(a, root);
        r.invalidated(c, root); // not a user of the root: changes nothing
        r.invalidated(b, PageTableRoot(2)); // another root: changes nothing
        assert_eq!(r.stats().waiting, 1);
        r.invalidated(b, root);
        assert_eq!(r.pool().stats().in_use, 0);
        assert_eq!(r.stats().freed_after_invalidation, 1);
    }

    #[test]
    fn pages_of_an_unused_root_are_freed_at_once_and_a_switch_counts_as_invalidation() {
        let r = reclaim();
        let a = r.new_walker();
        let f = r.pool().alloc_frame().unwrap();
        r.retire(PageTableRoot(9), f);
        assert_eq!(r.stats().freed_at_once, 1);
        r.activated(a, Some(PageTableRoot(9)));
        let g = r.pool().alloc_frame().unwrap();
        r.retire(PageTableRoot(9), g);
        r.activated(a, None);
        assert_eq!(r.pool().stats().in_use, 0);
    }

    #[test]
    fn destroying_a_root_frees_what_it_had_retired() {
        let r = reclaim();
        let a = r.new_walker();
        r.activated(a, Some(PageTableRoot(3)));
        let f = r.pool().alloc_frame().unwrap();
        r.retire(PageTableRoot(3), f);
        r.destroyed(PageTableRoot(3));
        assert_eq!(r.stats().waiting, 0);
        assert_eq!(r.pool().stats().in_use, 0);
    }
}
