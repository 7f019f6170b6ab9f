//! Advice (issue 35, item 5): [`Gmem::region_advise`] and [`Gmem::region_advice`].
//!
//! The anchors are CUDA's `cudaMemAdvise` (preferred location, accessed-by,
//! read-mostly, and their unset twins) and the GMEM RFC's `hmadvise`: a hint over a
//! range of pages, kept per page as [`crate::policy::advice::AdviceMap`] runs in the
//! space's state and forgotten with the pages' region. The fault path follows it
//! (`space::advice`): a page is populated at its preferred location and migrates
//! there, a page living there is mapped by other processors where it is, and a
//! device in the accessed-by set maps a page where it lives instead of migrating it.
//! An edit that takes such sharing back removes the extra mappings. Read-mostly is
//! stored only (read duplication is not built).

use crate::addr::{VaRange, VirtAddr, PAGE_SIZE};
use crate::error::RegionError;
use crate::gmem::Gmem;
use crate::handle::{DeviceId, SpaceId};
use crate::kpi::pages::Pages;
use crate::policy::advice::{Advice, AdviceOp};
use core::fmt;

/// Why `region_advise` or `region_advice` refused (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdviseError {
    /// The pages: a bad range, a page no region holds, a stale handle or space.
    Region(RegionError),
    /// The advice names a device that does not exist.
    UnknownDevice(DeviceId),
}

impl fmt::Display for AdviseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdviseError::Region(e) => e.fmt(f),
            AdviseError::UnknownDevice(d) => write!(f, "advice names no live device {d}"),
        }
    }
}

impl core::error::Error for AdviseError {}

impl From<RegionError> for AdviseError {
    fn from(e: RegionError) -> Self {
        AdviseError::Region(e)
    }
}

impl Gmem {
    /// Record advice `op` over `pages` (`cudaMemAdvise`, the RFC's `hmadvise`): set or
    /// unset the preferred location, add or remove an accessed-by device, set or unset
    /// read-mostly, or clear all of it. Advice is per page and goes with its region.
    /// Faults follow it from the next one on (module header); read-mostly is stored
    /// only.
    ///
    /// # Errors
    /// [`AdviseError::UnknownDevice`] for a device handle that names no live device;
    /// [`AdviseError::Region`] for a bad range, a page no region holds, a stale region
    /// or space. Both are checked before anything changes; a range's later region
    /// deallocated meanwhile by another thread leaves the earlier ones advised.
    ///
    /// # Examples
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// # use gmem_core::policy::advice::AdviceOp;
    /// let sys = TestSystem::new(16);
    /// let gm = &sys.gm;
    /// let s = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// let r = gm.as_alloc(s, AllocRequest::new(4 * PAGE_SIZE))?;
    /// let page = |k: u64| VirtAddr::new(r.start.as_u64() + k * PAGE_SIZE);
    /// gm.region_advise(Pages::range(s, VaRange::new(page(1), 2 * PAGE_SIZE)?), AdviceOp::SetReadMostly)?;
    /// assert!(!gm.region_advice(s, page(0))?.read_mostly);
    /// assert!(gm.region_advice(s, page(2))?.read_mostly);
    /// gm.region_advise(r, AdviceOp::SetPreferred(gm.host()))?;
    /// assert_eq!(gm.region_advice(s, page(3))?.preferred, Some(gm.host()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn region_advise(&self, pages: impl Into<Pages>, op: AdviceOp) -> Result<(), AdviseError> {
        let _critical = self.critical();
        if let Some(d) = op.device() {
            if d != self.host.id && self.device(d).is_none() {
                return Err(AdviseError::UnknownDevice(d));
            }
        }
        for (region, piece) in self.pieces(pages.into())? {
            self.with_region(region, |cx, _, st, c| {
                let (first, n) = match piece {
                    None => (c.first, c.pages),
                    Some(range) => c.range(range)?,
                };
                st.advise(first, n, op);
                st.unshare_unadvised(cx.counters, &c, first, n);
                Ok::<(), AdviseError>(())
            })?;
        }
        Ok(())
    }

    /// The advice of the page holding `va` in `space` (the default when none was
    /// given).
    ///
    /// # Errors
    /// [`AdviseError::Region`]: a stale space, or no region holds `va`.
    pub fn region_advice(&self, space: SpaceId, va: VirtAddr) -> Result<Advice, AdviseError> {
        let _critical = self.critical();
        let page = VaRange {
            start: VirtAddr::new(va.as_u64() & !(PAGE_SIZE - 1)),
            len: PAGE_SIZE,
        };
        let mut out = Advice::default();
        for (region, _) in self.pieces(Pages::range(space, page))? {
            out = self.with_region(region, |_, _, st, _| {
                Ok::<Advice, AdviseError>(st.advice_at(va.vpn()))
            })?;
        }
        Ok(out)
    }
}
