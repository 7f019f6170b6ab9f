//! The space's advice record (issue 35, item 5): per-page advice as
//! [`crate::policy::advice::AdviceMap`] keeps it — preferred location, accessed-by
//! set, read-mostly — edited by `region_advise` and forgotten with the pages' region.
//! The fault path follows it (`fault`): a preferred location is where a page is
//! populated and where it migrates to, and a page living there is mapped by other
//! processors where it is (no migration); a device in the accessed-by set maps a
//! page where it lives. A read-mostly page is read-duplicated (`duplicate`).

use super::{PlacementMode, ResolvedRegion, SpaceState};
use crate::addr::{VaRange, Vpn, PAGE_SHIFT};
use crate::handle::DeviceId;
use crate::policy::advice::{Advice, AdviceMap, AdviceOp};
use crate::stats::Counters;

/// A map over every page number an address can name, with no advice.
pub(super) fn empty() -> AdviceMap {
    AdviceMap::new(Vpn(0), Vpn(u64::MAX >> PAGE_SHIFT))
}

/// What a fault takes from a page's advice ([`SpaceState::fault_advice`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct FaultAdvice {
    /// The preferred location, if any.
    pub preferred: Option<DeviceId>,
    /// Whether the faulting device is in the accessed-by set.
    pub accessed_by_faulter: bool,
    /// Whether the page is advised read-mostly (read duplication, `duplicate`).
    pub read_mostly: bool,
}

impl SpaceState {
    /// Apply `op` to the pages `[first, first + pages)` (checked by the caller: inside
    /// one region of this space).
    pub(crate) fn advise(&mut self, first: Vpn, pages: u64, op: AdviceOp) {
        let range = VaRange {
            start: first.addr(),
            len: pages << PAGE_SHIFT,
        };
        self.policies.advised = true;
        // Inside the map's bounds by construction: nothing to refuse.
        let applied = self.advice.apply(range, op);
        debug_assert!(applied.is_ok(), "advice over a region's pages: {applied:?}");
    }

    /// The advice of page `vpn`.
    pub(crate) fn advice_at(&self, vpn: Vpn) -> Advice {
        self.advice.get(vpn).clone()
    }

    /// What a fault of device `dev` on page `vpn` takes from the page's advice: its
    /// preferred location and whether `dev` is advised to access it where it lives
    /// (a copy, no allocation; one flag test in a space that never had advice).
    #[inline]
    pub(crate) fn fault_advice(&self, vpn: Vpn, dev: DeviceId) -> FaultAdvice {
        if !self.policies.advised {
            return FaultAdvice::default();
        }
        let a = self.advice.get(vpn);
        FaultAdvice {
            preferred: a.preferred,
            accessed_by_faulter: a.accessed_by.contains(dev),
            read_mostly: a.read_mostly,
        }
    }

    /// Whether advice lets a unique page be mapped by several tables: it lives at its
    /// preferred location (other processors map it there), or devices are advised
    /// to access it where it lives.
    pub(crate) fn advice_shares(&self, vpn: Vpn, lives_in: DeviceId) -> bool {
        if !self.policies.advised {
            return false;
        }
        let a = self.advice.get(vpn);
        a.preferred == Some(lives_in) || !a.accessed_by.is_empty()
    }

    /// After an advice edit of `[first, first + pages)` of region `c`: the pages' read
    /// copies go, and a page of a
    /// unique-policy region that several tables map although its advice no longer
    /// lets them (its preferred location or accessed-by set changed) loses those
    /// mappings (replicate tables' aside): its next accesses fault and are served as
    /// the advice now says.
    pub(crate) fn unshare_unadvised(
        &mut self,
        stats: &Counters,
        c: &ResolvedRegion,
        first: Vpn,
        pages: u64,
    ) {
        // Copies were made under the old advice (`duplicate`): they go.
        self.drop_copies(stats, first, pages);
        if c.rec.placement.mode != PlacementMode::Unique {
            return;
        }
        let keep = self.xlat.replica_mask();
        for k in 0..pages {
            let v = first.add(k);
            let e = self.store.lpt.get(v);
            let several = (e.mapped & !keep).count_ones() > 1;
            if several
                && e.is_populated()
                && !SpaceState::is_wired(&e)
                && !self.is_pinned(v)
                && !self.advice_shares(v, self.memory_id(e.mem))
            {
                self.unmap_pages(stats, v, 1, !keep);
            }
        }
    }

    /// Forget the advice of `[first, first + pages)` (their region goes).
    pub(crate) fn forget_advice(&mut self, first: Vpn, pages: u64) {
        if pages > 0 {
            self.advise(first, pages, AdviceOp::Clear);
        }
    }
}
