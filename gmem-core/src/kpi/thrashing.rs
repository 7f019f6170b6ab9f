//! KPI: thrashing detection and mitigation (issue 35, item 3) —
//! [`Gmem::as_set_thrashing`], [`Gmem::as_expire_pins`], [`Gmem::as_thrashing`].
//!
//! A page that migrates back and forth between processors more than a threshold
//! number of times, each within a lapse of the last, *thrashes*
//! ([`crate::policy::thrashing`], UVM's `uvm_perf_thrashing.c`). With detection on,
//! a fault that would migrate such a page under the unique policy gets UVM's
//! mitigation instead: *pin* (the page stays where it lives and the faulting device
//! maps it there remotely, for the pin time) or *throttle* (the faulting device is
//! answered [`crate::FaultError::Throttled`] and retries; one processor per
//! throttling period gets the page). Times are the platform's clock in nanoseconds
//! ([`crate::Platform::now_ns`]) when it has one; otherwise they are counted in the
//! space's migration clock: one tick per fault that would migrate a page.

use crate::error::SpaceError;
use crate::gmem::Gmem;
use crate::handle::SpaceId;
use crate::policy::thrashing::{ThrashingConfig, ThrashingStats};

/// The thrashing detector of a space: its configuration and what it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThrashingState {
    /// The configuration (times in the platform clock's nanoseconds, or in ticks of
    /// the space's migration clock).
    pub config: ThrashingConfig,
    /// Migrations recorded, pages found thrashing, throttles, pins, unpins.
    pub stats: ThrashingStats,
}

impl Gmem {
    /// Turn thrashing detection on for space `space_id` with `config` (times in
    /// nanoseconds of the platform's clock, [`crate::Platform::now_ns`]; for a
    /// platform without one, in ticks of the space's migration clock: one per fault
    /// that would migrate a page), or off with `None`. Off by default. Either way every current pin ends: a
    /// pinned page's mappings are removed, and its next access faults as usual.
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle; nothing changes.
    ///
    /// # Examples
    /// A page that two devices write in turn: after three quick migrations it is
    /// pinned in the memory where it lives, and the other device maps it remotely.
    /// ```
    /// # use gmem_core::*;
    /// # use gmem_core::policy::thrashing::{Mitigation, ThrashingConfig};
    /// let mut sys = gmem_core::testing::TestSystem::new(16);
    /// let gpu = sys.add_device(2, DevCaps::FAULTABLE, 0x8000_0000, 32);
    /// let space = sys.space();
    /// sys.attach(space, gpu);
    /// let gm = &sys.gm;
    /// // Threshold 2 events, lapse 10 ticks, nap 1, pinned for 100 ticks.
    /// let config = ThrashingConfig::new(2, 10, 1, 100, Mitigation::Pin)?;
    /// gm.as_set_thrashing(space, Some(config))?;
    /// let r = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE))?;
    /// for round in 0..6u8 {
    ///     sys.write(if round % 2 == 0 { 0 } else { gpu }, r.start, &[round]).unwrap();
    /// }
    /// let state = gm.as_thrashing(space)?.expect("on");
    /// assert_eq!(state.stats.pins, 1);
    /// assert!(state.stats.migrations < 5, "pinned before the sixth write");
    /// assert_eq!(sys.read(0, r.start, 1).unwrap(), [5]);
    /// gm.check_invariants(space)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_set_thrashing(
        &self,
        space_id: SpaceId,
        config: Option<ThrashingConfig>,
    ) -> Result<(), SpaceError> {
        self.with_live_space(space_id, SpaceError::UnknownSpace, |st| {
            st.set_thrashing(&self.counters, config)
        })
    }

    /// End the pins of space `space_id` whose pin time is up, as UVM's unpin worker
    /// does (`thrashing_unpin_pages`): a driver calls it now and then (say once per
    /// fault batch). Each unpinned page's mappings are removed, so its next access
    /// faults and is served as usual. Returns the pages unpinned (0 with detection
    /// off).
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle.
    pub fn as_expire_pins(&self, space_id: SpaceId) -> Result<u64, SpaceError> {
        let now = self.platform().now_ns();
        self.with_live_space(space_id, SpaceError::UnknownSpace, |st| {
            st.expire_pins(&self.counters, now)
        })
    }

    /// The thrashing detector of space `space_id` (`None`: detection is off).
    ///
    /// # Errors
    /// [`SpaceError::UnknownSpace`] for a stale handle.
    pub fn as_thrashing(&self, space_id: SpaceId) -> Result<Option<ThrashingState>, SpaceError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(SpaceError::UnknownSpace(space_id))?;
        let st = space.lock();
        Ok(st
            .thrashing_stats()
            .map(|(config, stats)| ThrashingState { config, stats }))
    }
}
