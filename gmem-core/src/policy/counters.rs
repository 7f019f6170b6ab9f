//! Access counters: hot remote-mapped memory, reported for migration.
//!
//! A page mapped remotely (a GPU reading host memory over the bus) never faults, so
//! the fault path never learns that it is hot. NVIDIA GPUs from Volta on count such
//! accesses in hardware, per region of a configurable granularity, and raise a
//! notification when a region's count reaches a threshold; UVM then migrates the
//! region to the accessing GPU and clears the counter
//! (`kernel-open/nvidia-uvm/uvm_gpu_access_counters.c`: granularity 2 MiB by default,
//! `UVM_PERF_ACCESS_COUNTER_GRANULARITY`; threshold 256,
//! `UVM_PERF_ACCESS_COUNTER_THRESHOLD_DEFAULT`, valid 1..=65535).
//!
//! Here a driver reports counts (from hardware counters, or sampled) per device and
//! address; the engine sums them per (device, region), reports a region once when
//! its sum reaches the threshold, and forgets every device's counts for a range once
//! the caller has migrated it.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt;

use crate::addr::{VirtAddr, Vpn, PAGE_SIZE};
use crate::handle::DeviceId;

/// Access-counter tuning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessCounterConfig {
    granularity: u64,
    threshold: u32,
}

/// Why a configuration or a report was rejected (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CounterError {
    /// The granularity is not one UVM's hardware supports: 64 KiB, 2 MiB, 16 MiB or
    /// 16 GiB (`uvm_perf_access_counter_granularity`).
    Granularity(u64),
    /// The threshold is outside `1..=65535`.
    Threshold(u32),
    /// Report `index` carries a zero count.
    ZeroCount {
        /// Its position in the reports.
        index: usize,
    },
}

impl fmt::Display for CounterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Granularity(g) => write!(f, "access-counter granularity {g:#x} is not supported"),
            Self::Threshold(t) => write!(f, "access-counter threshold {t} is not in 1..=65535"),
            Self::ZeroCount { index } => write!(f, "access-counter report {index} counts 0"),
        }
    }
}

impl core::error::Error for CounterError {}

/// The smallest device handle (handles order by slot, then generation).
const LOWEST_DEVICE: DeviceId = DeviceId {
    index: 0,
    generation: 0,
};

/// The granularities UVM's access counters support (bytes).
pub const GRANULARITIES: [u64; 4] = [64 << 10, 2 << 20, 16 << 20, 16 << 30];

impl Default for AccessCounterConfig {
    /// UVM's defaults: 2 MiB regions, threshold 256 (`uvm_gpu_access_counters.c`).
    fn default() -> Self {
        Self {
            granularity: 2 << 20,
            threshold: 256,
        }
    }
}

impl AccessCounterConfig {
    /// Regions of `granularity` bytes, reported at `threshold` accesses.
    ///
    /// # Errors
    /// [`CounterError::Granularity`] unless `granularity` is in [`GRANULARITIES`];
    /// [`CounterError::Threshold`] unless `1 <= threshold <= 65535`.
    pub fn new(granularity: u64, threshold: u32) -> Result<Self, CounterError> {
        if !GRANULARITIES.contains(&granularity) {
            return Err(CounterError::Granularity(granularity));
        }
        if !(1..=65535).contains(&threshold) {
            return Err(CounterError::Threshold(threshold));
        }
        Ok(Self {
            granularity,
            threshold,
        })
    }

    /// Region size in bytes.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// Accesses that make a region hot.
    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    fn region_pages(&self) -> u64 {
        self.granularity / PAGE_SIZE
    }
}

/// One report from a driver: `count` accesses by `device` to the region holding `va`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessReport {
    /// The accessing device.
    pub device: DeviceId,
    /// Any address in the region.
    pub va: VirtAddr,
    /// Accesses counted (non-zero).
    pub count: u32,
}

/// A region that reached the threshold: migrate it to `device`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HotRegion {
    /// The device accessing it.
    pub device: DeviceId,
    /// Its first page.
    pub first: Vpn,
    /// Its length in pages.
    pub pages: u64,
    /// Accesses counted when it was reported.
    pub count: u64,
}

/// The engine's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterStats {
    /// Reports accepted.
    pub reports: u64,
    /// Accesses summed over all reports.
    pub accesses: u64,
    /// Regions reported hot.
    pub hot: u64,
    /// (device, region) counters reset after a migration.
    pub resets: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    count: u64,
    reported: bool,
}

/// Per (device, region) access counts of one address space.
#[derive(Clone, Debug, Default)]
pub struct AccessCounters {
    config: AccessCounterConfig,
    /// Keyed by (region's first page, device): a range of pages covers every device.
    counts: BTreeMap<(u64, DeviceId), Entry>,
    stats: CounterStats,
}

impl AccessCounters {
    /// An engine with `config` and no counts.
    pub fn new(config: AccessCounterConfig) -> Self {
        Self {
            config,
            counts: BTreeMap::new(),
            stats: CounterStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> AccessCounterConfig {
        self.config
    }

    /// The counters so far.
    pub fn stats(&self) -> CounterStats {
        self.stats
    }

    /// The count of `device` on the region holding `va`.
    pub fn count(&self, device: DeviceId, va: VirtAddr) -> u64 {
        let first = self.region_of(va);
        self.counts.get(&(first, device)).map_or(0, |e| e.count)
    }

    fn region_of(&self, va: VirtAddr) -> u64 {
        va.vpn().0 & !(self.config.region_pages() - 1)
    }

    /// Adds `reports`; returns the regions that reached the threshold with them, each
    /// once until it is [`migrated`](Self::migrated).
    ///
    /// # Errors
    /// [`CounterError::ZeroCount`] if a report counts 0; nothing is added then.
    pub fn record(&mut self, reports: &[AccessReport]) -> Result<Vec<HotRegion>, CounterError> {
        if let Some(index) = reports.iter().position(|r| r.count == 0) {
            return Err(CounterError::ZeroCount { index });
        }
        let mut hot = Vec::new();
        let pages = self.config.region_pages();
        for r in reports {
            let first = self.region_of(r.va);
            let e = self.counts.entry((first, r.device)).or_default();
            e.count += u64::from(r.count);
            self.stats.reports += 1;
            self.stats.accesses += u64::from(r.count);
            if !e.reported && e.count >= u64::from(self.config.threshold) {
                e.reported = true;
                self.stats.hot += 1;
                hot.push(HotRegion {
                    device: r.device,
                    first: Vpn(first),
                    pages,
                    count: e.count,
                });
            }
        }
        Ok(hot)
    }

    /// The caller migrated `[first, first + pages)`: every device's counts on the
    /// regions overlapping it start again from zero. Returns the counters reset.
    pub fn migrated(&mut self, first: Vpn, pages: u64) -> usize {
        if pages == 0 {
            return 0;
        }
        let lo = first.0 & !(self.config.region_pages() - 1);
        let hi = first.0.saturating_add(pages);
        let keys: Vec<(u64, DeviceId)> = self
            .counts
            .range((lo, LOWEST_DEVICE)..)
            .take_while(|((r, _), _)| *r < hi)
            .map(|(k, _)| *k)
            .collect();
        for k in &keys {
            self.counts.remove(k);
        }
        self.stats.resets += keys.len() as u64;
        keys.len()
    }

    /// Forgets every count of `device` (it detached or went away).
    pub fn forget_device(&mut self, device: DeviceId) {
        self.counts.retain(|(_, d), _| *d != device);
    }

    /// (device, region) pairs with a count.
    pub fn tracked(&self) -> usize {
        self.counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;

    fn dev(i: u32) -> DeviceId {
        DeviceId::from_raw(i, 0)
    }

    fn rep(d: u32, va: u64, count: u32) -> AccessReport {
        AccessReport {
            device: dev(d),
            va: VirtAddr::new(va),
            count,
        }
    }

    const MB2: u64 = 2 << 20;

    #[test]
    fn a_region_is_reported_once_when_its_sum_reaches_the_threshold() {
        let mut c = AccessCounters::new(AccessCounterConfig::new(MB2, 100).unwrap());
        assert_eq!(c.record(&[rep(1, 0x1000, 60)]).unwrap(), []);
        // Another address in the same 2 MiB region adds to the same counter.
        let hot = c.record(&[rep(1, MB2 - 1, 40)]).unwrap();
        assert_eq!(
            hot,
            [HotRegion {
                device: dev(1),
                first: Vpn(0),
                pages: 512,
                count: 100
            }]
        );
        // Not again while it waits for its migration.
        assert_eq!(c.record(&[rep(1, 0, 500)]).unwrap(), []);
        assert_eq!(c.count(dev(1), VirtAddr::new(0)), 600);
        let s = c.stats();
        assert_eq!((s.reports, s.accesses, s.hot), (3, 600, 1));
    }

    #[test]
    fn devices_and_regions_count_apart() {
        let mut c = AccessCounters::new(AccessCounterConfig::new(64 << 10, 10).unwrap());
        let hot = c
            .record(&[
                rep(1, 0, 9),
                rep(2, 0, 9),
                rep(1, 64 << 10, 9),
                rep(2, 0, 1),
            ])
            .unwrap();
        assert_eq!(hot.len(), 1);
        assert_eq!((hot[0].device, hot[0].pages), (dev(2), 16));
        assert_eq!(c.tracked(), 3);
    }

    #[test]
    fn a_migration_resets_every_device_on_the_overlapping_regions_only() {
        let mut c = AccessCounters::new(AccessCounterConfig::new(MB2, 10).unwrap());
        c.record(&[
            rep(1, 0, 10),
            rep(2, 0x5000, 3),
            rep(1, MB2, 4),
            rep(1, 3 * MB2, 4),
        ])
        .unwrap();
        // Migrating one page of region 0 and the first page of region 1.
        assert_eq!(c.migrated(Vpn(511), 2), 3);
        assert_eq!(c.count(dev(1), VirtAddr::new(0)), 0);
        assert_eq!(c.count(dev(1), VirtAddr::new(3 * MB2)), 4);
        assert_eq!(c.stats().resets, 3);
        // After the reset the region can become hot again.
        assert_eq!(c.record(&[rep(1, 0, 10)]).unwrap().len(), 1);
        c.forget_device(dev(1));
        assert_eq!(c.tracked(), 0);
    }

    #[test]
    fn the_counts_match_a_map_model_on_pseudorandom_reports() {
        let mut x = 0xdead_beef_cafe_f00du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut c = AccessCounters::new(AccessCounterConfig::new(MB2, 300).unwrap());
        let mut model: BTreeMap<(u64, u32), (u64, bool)> = BTreeMap::new();
        for _ in 0..200 {
            let reps: Vec<AccessReport> = (0..1 + next() % 8)
                .map(|_| {
                    rep(
                        (next() % 3) as u32,
                        next() % (8 * MB2),
                        1 + (next() % 64) as u32,
                    )
                })
                .collect();
            let mut want = Vec::new();
            for r in &reps {
                let e = model
                    .entry((r.va.as_u64() / MB2, r.device.index()))
                    .or_default();
                e.0 += u64::from(r.count);
                if !e.1 && e.0 >= 300 {
                    e.1 = true;
                    want.push((r.device, r.va.as_u64() / MB2 * 512));
                }
            }
            let got: Vec<(DeviceId, u64)> = c
                .record(&reps)
                .unwrap()
                .iter()
                .map(|h| (h.device, h.first.0))
                .collect();
            assert_eq!(got, want);
            if next() % 5 == 0 {
                let region = next() % 8;
                c.migrated(Vpn(region * 512), 512);
                model.retain(|(r, _), _| *r != region);
            }
        }
        assert_eq!(c.tracked(), model.len());
    }

    #[test]
    fn bad_configs_and_zero_counts_are_typed_errors_that_change_nothing() {
        assert_eq!(
            AccessCounterConfig::new(4096, 256),
            Err(CounterError::Granularity(4096))
        );
        assert_eq!(
            AccessCounterConfig::new(MB2, 0),
            Err(CounterError::Threshold(0))
        );
        assert_eq!(
            AccessCounterConfig::new(MB2, 65536),
            Err(CounterError::Threshold(65536))
        );
        let mut c = AccessCounters::default();
        assert_eq!(
            c.record(&[rep(1, 0, 5), rep(1, 0, 0)]),
            Err(CounterError::ZeroCount { index: 1 })
        );
        assert_eq!((c.tracked(), c.stats()), (0, CounterStats::default()));
    }
}
