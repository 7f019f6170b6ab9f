//! KPI: access counters (issue 35, item 6) — [`Gmem::as_set_access_counters`],
//! [`Gmem::as_access_counters`], [`Gmem::dev_report_accesses`].
//!
//! A page a device maps remotely (a GPU reading host memory over the bus) never
//! faults again, so the fault path never learns that it is hot. NVIDIA GPUs count
//! such accesses in hardware and notify the driver when a region's count reaches a
//! threshold; UVM then migrates the region to the accessing GPU
//! (`uvm_gpu_access_counters.c`). Here a driver reports counts (from its hardware
//! counters, or sampled) and the core does the rest: it sums them per (device,
//! region) in the space's [`AccessCounters`] engine ([`crate::policy::counters`]),
//! and migrates each region that reaches the threshold to the accessing device's
//! memory through the region migration path (`region_migrate` of the populated pages
//! of every region the hot range overlaps), then starts its counts again.
//!
//! [`AccessCounters`]: crate::policy::counters::AccessCounters

use crate::addr::{VaRange, VirtAddr, PAGE_SHIFT};
use crate::error::PopulateError;
use crate::gmem::Gmem;
use crate::handle::{DeviceId, Region, SpaceId};
use crate::kpi::region::MigrateScope;
use crate::policy::counters::{AccessCounterConfig, AccessReport, CounterError, CounterStats};
use alloc::vec::Vec;
use core::fmt;

/// Errors of [`Gmem::dev_report_accesses`] and [`Gmem::as_set_access_counters`].
/// Nothing is counted or moved after one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AccessError {
    /// The space handle is stale.
    UnknownSpace(SpaceId),
    /// A report names no live device.
    UnknownDevice(DeviceId),
    /// A report names a device not attached to the space.
    NotAttached(DeviceId),
    /// A report's address lies outside the space.
    Outside(VirtAddr),
    /// The space counts no accesses (see [`Gmem::as_set_access_counters`]).
    CountersOff(SpaceId),
    /// The engine refused the reports (a zero count).
    Counter(CounterError),
}

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownSpace(s) => write!(f, "unknown address space {s:?}"),
            Self::UnknownDevice(d) => write!(f, "unknown device {d:?}"),
            Self::NotAttached(d) => write!(f, "device {d:?} is not attached to the space"),
            Self::Outside(va) => write!(f, "address {va:?} lies outside the space"),
            Self::CountersOff(s) => write!(f, "address space {s:?} counts no accesses"),
            Self::Counter(e) => write!(f, "{e}"),
        }
    }
}

impl core::error::Error for AccessError {}

/// What one [`Gmem::dev_report_accesses`] call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessOutcome {
    /// Regions that reached the threshold with these reports.
    pub hot_regions: u64,
    /// Pages those regions' migrations moved to the accessing devices.
    pub pages_migrated: u64,
    /// Hot regions whose migration failed part-way (pages moved before the failure
    /// stay moved; the counts start again either way).
    pub failed: u64,
    /// The first migration failure, if any.
    pub first_error: Option<PopulateError>,
}

/// The access counters of a space: the configuration and what the engine counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessCounterState {
    /// The configuration counting runs with.
    pub config: AccessCounterConfig,
    /// Reports, accesses, hot regions and resets so far.
    pub stats: CounterStats,
}

impl Gmem {
    /// Turn access counting on for space `space_id` with `config` (the counts start
    /// from zero), or off with `None` (the counts are dropped). Off by default.
    ///
    /// # Errors
    /// [`AccessError::UnknownSpace`] for a stale handle.
    ///
    /// # Examples
    /// ```
    /// # use gmem_core::*;
    /// # use gmem_core::policy::counters::AccessCounterConfig;
    /// # let sys = gmem_core::testing::TestSystem::new(16);
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// assert_eq!(gm.as_access_counters(space)?, None);
    /// // UVM's granularity (2 MiB) with a threshold of 64 accesses.
    /// gm.as_set_access_counters(space, Some(AccessCounterConfig::new(2 << 20, 64)?))?;
    /// assert_eq!(gm.as_access_counters(space)?.map(|s| s.config.threshold()), Some(64));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_set_access_counters(
        &self,
        space_id: SpaceId,
        config: Option<AccessCounterConfig>,
    ) -> Result<(), AccessError> {
        self.with_live_space(space_id, AccessError::UnknownSpace, |st| {
            st.set_access_counters(config)
        })
    }

    /// The access counters of space `space_id` (`None`: counting is off).
    ///
    /// # Errors
    /// [`AccessError::UnknownSpace`] for a stale handle.
    pub fn as_access_counters(
        &self,
        space_id: SpaceId,
    ) -> Result<Option<AccessCounterState>, AccessError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(AccessError::UnknownSpace(space_id))?;
        let st = space.lock();
        Ok(st
            .access_stats()
            .map(|(config, stats)| AccessCounterState { config, stats }))
    }

    /// Report access counts of devices to remote-mapped memory of space `space_id`
    /// (each [`AccessReport`]: the device, any address of the counted region, the
    /// count). Every region whose count reaches the threshold with these reports is
    /// migrated to the accessing device's memory (host memory for a device without
    /// one): the populated pages of every region it overlaps, as
    /// [`Gmem::region_migrate`] with [`MigrateScope::Populated`] moves them (wired
    /// pages stay); then its counts start again.
    ///
    /// # Errors
    /// Checked for the whole batch before anything is counted: [`AccessError`] for a
    /// stale space, a dead or unattached device, an address outside the space,
    /// counting off, or a zero count. Migration failures are not errors of the call:
    /// they are in the [`AccessOutcome`].
    ///
    /// # Examples
    /// A GPU maps a host page remotely; its counted accesses pull the page over.
    /// ```
    /// # use gmem_core::*;
    /// # use gmem_core::policy::counters::{AccessCounterConfig, AccessReport};
    /// let mut sys = gmem_core::testing::TestSystem::new(16);
    /// let gpu = sys.add_device(2, DevCaps::FAULTABLE, 0x8000_0000, 32);
    /// let gpu_id = sys.devices[gpu].id;
    /// let gm = &sys.gm;
    /// let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)?;
    /// gm.as_attach(space, gpu_id, MmuMode::Coherent, Activation::Switch)?;
    /// let r = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE))?;
    /// gm.region_set_policy(r, Placement { target: PlacementTarget::Faulting, mode: PlacementMode::RemoteAccess })?;
    /// sys.write(0, r.start, b"table").unwrap();
    /// assert_eq!(sys.read(gpu, r.start, 5).unwrap(), b"table"); // mapped remotely
    /// assert_eq!(gm.as_page_frame(space, r.start)?.map(|(m, _)| m), Some(gm.host()));
    /// gm.as_set_access_counters(space, Some(AccessCounterConfig::new(64 << 10, 100)?))?;
    /// let report = AccessReport { device: gpu_id, va: r.start, count: 60 };
    /// assert_eq!(gm.dev_report_accesses(space, &[report])?.hot_regions, 0);
    /// let done = gm.dev_report_accesses(space, &[report])?; // 120 >= 100
    /// assert_eq!((done.hot_regions, done.pages_migrated), (1, 1));
    /// assert_eq!(gm.as_page_frame(space, r.start)?.map(|(m, _)| m), Some(gpu_id));
    /// assert_eq!(sys.read(gpu, r.start, 5).unwrap(), b"table");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dev_report_accesses(
        &self,
        space_id: SpaceId,
        reports: &[AccessReport],
    ) -> Result<AccessOutcome, AccessError> {
        let _critical = self.critical();
        let space = self
            .space(space_id)
            .ok_or(AccessError::UnknownSpace(space_id))?;
        // Under the lock: check the whole batch, count, and list the pieces of the
        // hot regions (each region a hot range overlaps, clipped to it).
        let (hot, pieces) = {
            let mut st = space.lock();
            if !st.is_alive() {
                return Err(AccessError::UnknownSpace(space_id));
            }
            for r in reports {
                if self.device(r.device).is_none() {
                    return Err(AccessError::UnknownDevice(r.device));
                }
                if st.slot_of(r.device).is_none() {
                    return Err(AccessError::NotAttached(r.device));
                }
                if !space.range.contains(r.va) {
                    return Err(AccessError::Outside(r.va));
                }
            }
            let hot = st
                .record_accesses(reports)
                .ok_or(AccessError::CountersOff(space_id))?
                .map_err(AccessError::Counter)?;
            let mut pieces: Vec<(usize, Region, VaRange)> = Vec::new();
            for (i, h) in hot.iter().enumerate() {
                let lo = h.first.0 << PAGE_SHIFT;
                let hi = lo.saturating_add(h.pages << PAGE_SHIFT);
                for (s, rec) in st.regions_overlapping(lo, hi) {
                    let (a, b) = (s.max(lo), (s + rec.len).min(hi));
                    let region = Region {
                        space: space_id,
                        start: VirtAddr::new(s),
                        id: rec.id,
                    };
                    let range = VaRange {
                        start: VirtAddr::new(a),
                        len: b - a,
                    };
                    pieces.push((i, region, range));
                }
            }
            (hot, pieces)
        };
        // Without the lock: each piece migrates as `region_migrate` does (it takes the
        // lock itself, and waits out a region busy with an unlocked edit).
        let mut outcome = AccessOutcome {
            hot_regions: hot.len() as u64,
            ..AccessOutcome::default()
        };
        let mut failed = alloc::vec![false; hot.len()];
        for (i, region, range) in pieces {
            match self.migrate_pages(region, Some(range), hot[i].device, MigrateScope::Populated) {
                Ok(n) => outcome.pages_migrated += n,
                // Deallocated since it was counted: nothing of it to move.
                Err(PopulateError::Region(_)) => {}
                Err(e) => {
                    failed[i] = true;
                    outcome.first_error.get_or_insert(e);
                }
            }
        }
        outcome.failed = failed.iter().filter(|f| **f).count() as u64;
        let mut st = space.lock();
        for h in &hot {
            st.accesses_migrated(h.first, h.pages);
        }
        Ok(outcome)
    }
}
