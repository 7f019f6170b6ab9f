//! The space's advice record (issue 35, item 5): per-page advice as
//! [`crate::policy::advice::AdviceMap`] keeps it — preferred location, accessed-by
//! set, read-mostly — edited by `region_advise` and forgotten with the pages' region.
//! Stored only: no fault-path decision reads it yet.

use super::SpaceState;
use crate::addr::{VaRange, Vpn, PAGE_SHIFT};
use crate::policy::advice::{Advice, AdviceMap, AdviceOp};

/// A map over every page number an address can name, with no advice.
pub(super) fn empty() -> AdviceMap {
    AdviceMap::new(Vpn(0), Vpn(u64::MAX >> PAGE_SHIFT))
}

impl SpaceState {
    /// Apply `op` to the pages `[first, first + pages)` (checked by the caller: inside
    /// one region of this space).
    pub(crate) fn advise(&mut self, first: Vpn, pages: u64, op: AdviceOp) {
        let range = VaRange {
            start: first.addr(),
            len: pages << PAGE_SHIFT,
        };
        // Inside the map's bounds by construction: nothing to refuse.
        let applied = self.advice.apply(range, op);
        debug_assert!(applied.is_ok(), "advice over a region's pages: {applied:?}");
    }

    /// The advice of page `vpn`.
    pub(crate) fn advice_at(&self, vpn: Vpn) -> Advice {
        self.advice.get(vpn).clone()
    }

    /// Forget the advice of `[first, first + pages)` (their region goes).
    pub(crate) fn forget_advice(&mut self, first: Vpn, pages: u64) {
        if pages > 0 {
            self.advise(first, pages, AdviceOp::Clear);
        }
    }
}
