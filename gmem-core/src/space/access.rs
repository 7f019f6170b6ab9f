//! Access counters on a space's state (issue 35, item 6): the space keeps one
//! [`AccessCounters`] engine (off until `as_set_access_counters`), fed by the drivers'
//! reports of accesses to remote-mapped pages; the regions it reports hot are migrated
//! by the KPI (`kpi::access`) through the region migration path, and then reset here.
//! A detached device's counts are forgotten with its attachment.

use super::SpaceState;
use crate::addr::Vpn;
use crate::handle::DeviceId;
use crate::policy::counters::{
    AccessCounterConfig, AccessCounters, AccessReport, CounterError, CounterStats, HotRegion,
};
use alloc::vec::Vec;

impl SpaceState {
    /// Turn the space's access counters on with `config` (counts start from zero) or
    /// off (`None`: counts dropped).
    pub(crate) fn set_access_counters(&mut self, config: Option<AccessCounterConfig>) {
        self.access = config.map(AccessCounters::new);
    }

    /// The engine's statistics, if counting is on.
    pub(crate) fn access_stats(&self) -> Option<(AccessCounterConfig, CounterStats)> {
        self.access.as_ref().map(|a| (a.config(), a.stats()))
    }

    /// Add `reports` (checked by the caller: devices attached, addresses inside the
    /// space); the regions that became hot. `None` when counting is off.
    pub(crate) fn record_accesses(
        &mut self,
        reports: &[AccessReport],
    ) -> Option<Result<Vec<HotRegion>, CounterError>> {
        Some(self.access.as_mut()?.record(reports))
    }

    /// `[first, first + pages)` was migrated (or its migration was tried): every
    /// device's counts there start again.
    pub(crate) fn accesses_migrated(&mut self, first: Vpn, pages: u64) {
        if let Some(a) = self.access.as_mut() {
            a.migrated(first, pages);
        }
    }

    /// Device `dev` left the space: its counts go.
    pub(crate) fn forget_accesses_of(&mut self, dev: DeviceId) {
        if let Some(a) = self.access.as_mut() {
            a.forget_device(dev);
        }
    }
}
