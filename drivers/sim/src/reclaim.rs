//! Freeing page-table pages of a simulated memory only when no walker can still reach
//! them: the shared rule ([`gmem_ptengine::Retirement`], whose module states it) over a
//! [`FramePool`].

use crate::format::WalkerId;
use crate::frames::FramePool;
use gmem_core::{FrameSource, PageTableRoot, PhysAddr};
use gmem_ptengine::Retirement;
use std::sync::Arc;

/// Counters of a [`TableReclaim`].
pub use gmem_ptengine::RetireStats as ReclaimStats;

/// Retired table pages of one format, and which walker translates with which root.
pub struct TableReclaim {
    pool: Arc<FramePool>,
    books: Retirement,
}

impl TableReclaim {
    /// Reclamation into `pool`.
    pub fn new(pool: Arc<FramePool>) -> TableReclaim {
        TableReclaim {
            pool,
            books: Retirement::new(),
        }
    }

    /// The pool table pages come from and return to.
    pub fn pool(&self) -> &Arc<FramePool> {
        &self.pool
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ReclaimStats {
        self.books.stats()
    }

    /// A new walker id.
    pub fn new_walker(&self) -> WalkerId {
        self.books.new_walker()
    }

    fn free(&self) -> impl FnMut(u64) + '_ {
        |page| self.pool.free_frame(PhysAddr::new(page))
    }

    /// `walker` now translates with `root` (its caches were flushed by the switch).
    pub fn activated(&self, walker: WalkerId, root: Option<PageTableRoot>) {
        self.books.activated(walker, root.map(|r| r.0), self.free())
    }

    /// `walker` dropped every cached entry of `root`.
    pub fn invalidated(&self, walker: WalkerId, root: PageTableRoot) {
        self.books.invalidated(walker, root.0, self.free())
    }

    /// Table page `frame` of `root` was unlinked: free it once no walker can reach it.
    pub fn retire(&self, root: PageTableRoot, frame: PhysAddr) {
        self.books.retire(root.0, frame.as_u64(), self.free())
    }

    /// `root` was destroyed: free everything it still has retired.
    pub fn destroyed(&self, root: PageTableRoot) {
        self.books.destroyed(root.0, self.free())
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
