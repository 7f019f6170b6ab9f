//! The policy engines a space keeps beside its state (issue 35): the access counters
//! (item 6) and the thrashing detector (item 3), each off until a KPI call turns it
//! on (`as_set_access_counters`, `as_set_thrashing`), and the clock the thrashing
//! detector runs on.
//!
//! **Access counters.** Fed by the drivers' reports of accesses to remote-mapped
//! pages; the regions the engine reports hot are migrated by the KPI
//! (`kpi::access`) through the region migration path, and then reset here. A
//! detached device's counts are forgotten with its attachment.
//!
//! **Thrashing.** The fault path asks [`SpaceState::thrashing_hint`] before it
//! migrates a page under the unique policy and tells [`SpaceState::thrashing_migrated`]
//! after: a page that bounces between processors gets UVM's mitigations — *pin* (the
//! page stays where it is and the faulting processor maps it remotely: the one case
//! where a unique page has two mappings, which `check` allows for a pinned page) or
//! *throttle* (the faulting processor is answered [`crate::FaultError::Throttled`] and
//! retries later). A range unmapped or deallocated is forgotten. The engine's time is
//! the platform's clock ([`crate::Platform::now_ns`]) when it has one — then a
//! configuration is in nanoseconds, and UVM's defaults (`uvm_perf_thrashing.c`)
//! apply as they are — and otherwise the space's *migration clock*: one tick per
//! fault that reaches the thrashing question (a fault that would migrate a page),
//! and a configuration's lapse, nap and pin time are counted in those ticks.

use super::SpaceState;
use crate::addr::Vpn;
use crate::handle::DeviceId;
use crate::platform::Platform;
use crate::policy::counters::{
    AccessCounterConfig, AccessCounters, AccessReport, CounterError, CounterStats, HotRegion,
};
use crate::policy::thrashing::{Thrashing, ThrashingConfig, ThrashingHint, ThrashingStats};
use crate::stats::Counters;
use alloc::vec::Vec;

/// A space's policy engines (see the module header).
#[derive(Default)]
pub(crate) struct Policies {
    /// The access-counter engine, when counting is on.
    access: Option<AccessCounters>,
    /// The thrashing detector, when it is on.
    thrashing: Option<Thrashing>,
    /// The migration clock (ticks of the thrashing detector).
    clock: u64,
    /// Whether any advice was ever given in the space (`region_advise`): until then
    /// the fault path does not look advice up.
    pub(super) advised: bool,
}

impl SpaceState {
    /// Whether the batch path's block plan must leave pages to the single-fault path,
    /// which asks the policies a plan does not (advice, thrashing).
    #[inline]
    pub(crate) fn policies_steer_faults(&self) -> bool {
        self.policies.advised || self.policies.thrashing.is_some()
    }

    /// Turn the space's access counters on with `config` (counts start from zero) or
    /// off (`None`: counts dropped).
    pub(crate) fn set_access_counters(&mut self, config: Option<AccessCounterConfig>) {
        self.policies.access = config.map(AccessCounters::new);
    }

    /// The engine's statistics, if counting is on.
    pub(crate) fn access_stats(&self) -> Option<(AccessCounterConfig, CounterStats)> {
        self.policies
            .access
            .as_ref()
            .map(|a| (a.config(), a.stats()))
    }

    /// Add `reports` (checked by the caller: devices attached, addresses inside the
    /// space); the regions that became hot. `None` when counting is off.
    pub(crate) fn record_accesses(
        &mut self,
        reports: &[AccessReport],
    ) -> Option<Result<Vec<HotRegion>, CounterError>> {
        Some(self.policies.access.as_mut()?.record(reports))
    }

    /// `[first, first + pages)` was migrated (or its migration was tried): every
    /// device's counts there start again.
    pub(crate) fn accesses_migrated(&mut self, first: Vpn, pages: u64) {
        if let Some(a) = self.policies.access.as_mut() {
            a.migrated(first, pages);
        }
    }

    /// Device `dev` left the space: its counts go.
    pub(crate) fn forget_accesses_of(&mut self, dev: DeviceId) {
        if let Some(a) = self.policies.access.as_mut() {
            a.forget_device(dev);
        }
    }

    /// Turn thrashing detection on with `config` (no page tracked yet) or off
    /// (`None`). Either way every pin ends: a pinned page's mappings go (but a
    /// replicate table's), so that the next access faults and finds one mapping at
    /// most, as the unique policy wants.
    pub(crate) fn set_thrashing(&mut self, stats: &Counters, config: Option<ThrashingConfig>) {
        let keep = self.xlat.replica_mask();
        for v in self.pinned_pages() {
            self.unmap_pages(stats, v, 1, !keep);
        }
        self.policies.thrashing = config.map(Thrashing::new);
    }

    /// The detector's configuration and statistics, if it is on.
    pub(crate) fn thrashing_stats(&self) -> Option<(ThrashingConfig, ThrashingStats)> {
        self.policies
            .thrashing
            .as_ref()
            .map(|t| (*t.config(), t.stats()))
    }

    /// Every pinned page of the space.
    pub(crate) fn pinned_pages(&self) -> Vec<Vpn> {
        self.policies
            .thrashing
            .as_ref()
            .map_or_else(Vec::new, |t| t.pinned_pages().collect())
    }

    /// Whether page `vpn` is pinned where it lives (it may then be mapped by more
    /// than one table under the unique policy).
    #[inline]
    pub(crate) fn is_pinned(&self, vpn: Vpn) -> bool {
        self.policies
            .thrashing
            .as_ref()
            .is_some_and(|t| t.pinned(vpn).is_some())
    }

    /// What to do about `requester`'s fault on page `vpn`, which lives in `resident`'s
    /// memory and would migrate, at `platform`'s time (a platform without a clock:
    /// one tick of the migration clock). `None` (service as usual) when detection is
    /// off; the clock is not read then.
    #[inline]
    pub(crate) fn thrashing_hint(
        &mut self,
        vpn: Vpn,
        requester: DeviceId,
        resident: DeviceId,
        platform: &dyn Platform,
    ) -> ThrashingHint {
        let Some(t) = self.policies.thrashing.as_mut() else {
            return ThrashingHint::None;
        };
        self.policies.clock = match platform.now_ns() {
            Some(now) => now.max(self.policies.clock),
            None => self.policies.clock + 1,
        };
        // The clock only moves forward, so the engine's time check never fails.
        t.hint(vpn, requester, Some(resident), self.policies.clock)
            .unwrap_or(ThrashingHint::None)
    }

    /// Page `vpn` migrated to `to`'s memory on a fault.
    #[inline]
    pub(crate) fn thrashing_migrated(&mut self, vpn: Vpn, to: DeviceId) {
        if let Some(t) = self.policies.thrashing.as_mut() {
            let _ = t.record_migration(vpn, to, self.policies.clock);
        }
    }

    /// End the pins whose time is up (UVM's unpin worker, `thrashing_unpin_pages`):
    /// each such page's mappings go (but a replicate table's), so that its next access
    /// faults and migrates as usual. Returns the pages unpinned.
    pub(crate) fn expire_pins(&mut self, stats: &Counters, now: Option<u64>) -> u64 {
        let Some(t) = self.policies.thrashing.as_mut() else {
            return 0;
        };
        if let Some(now) = now {
            self.policies.clock = now.max(self.policies.clock);
        }
        // The clock only moves forward, so the engine's time check never fails.
        let unpinned = t.expire(self.policies.clock).unwrap_or_default();
        let keep = self.xlat.replica_mask();
        #[cfg(not(gmem_loom_bug = "expire_pins_keeps_mappings"))] // loom-tests/tests/pin.rs
        for &v in &unpinned {
            self.unmap_pages(stats, v, 1, !keep);
        }
        unpinned.len() as u64
    }

    /// The pages `[first, first + pages)` were unmapped: the detector forgets them.
    #[inline]
    pub(crate) fn thrashing_forget(&mut self, first: Vpn, pages: u64) {
        if let Some(t) = self.policies.thrashing.as_mut() {
            t.forget(first, pages);
        }
    }
}
