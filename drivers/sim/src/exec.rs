//! A kernel-execution engine: work-groups of work-items whose every load and store goes
//! through the device's MMU.
//!
//! A kernel is a closure over a [`WorkItem`] (its global index, its work-group, the
//! compute unit running it) that loads and stores through the device's [`Port`], so
//! each access is translated by the unit's L1 TLB, the shared L2, a page walk and, on a
//! miss, a fault served by the core — the way the GMEM paper's simulated devices run
//! VectorAdd and back-propagation. Work-group `g` runs on unit `g % units`; groups run
//! one after another and the items of a group in index order, so a launch is
//! deterministic (same TLB hits, same faults, same placement) from run to run.
//!
//! The first access that fails stops the launch with a [`LaunchError`] naming the
//! work-item; the stores done before it stay done, as on hardware.

use crate::port::{AccessError, Port, PortStats};
use gmem_core::{Gmem, VirtAddr};
use std::fmt;

/// The shape of a launch: `groups` work-groups of `group_size` work-items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Number of work-groups.
    pub groups: u64,
    /// Work-items per group.
    pub group_size: u64,
}

impl Grid {
    /// Enough groups of `group_size` items to cover `items` work-items (the last group
    /// may run past `items`; kernels check [`WorkItem::global`]).
    pub fn covering(items: u64, group_size: u64) -> Grid {
        let group_size = group_size.max(1);
        Grid {
            groups: items.div_ceil(group_size),
            group_size,
        }
    }

    /// Work-items in the whole grid.
    pub fn items(&self) -> u64 {
        self.groups.saturating_mul(self.group_size)
    }
}

/// One work-item of a running kernel.
pub struct WorkItem<'a> {
    port: &'a Port,
    gm: &'a Gmem,
    /// Index in the whole grid.
    pub global: u64,
    /// Work-group index.
    pub group: u64,
    /// Index inside the work-group.
    pub local: u64,
    /// Compute unit running the group.
    pub unit: usize,
}

impl WorkItem<'_> {
    /// Load `buf.len()` bytes at `va`.
    ///
    /// # Errors
    /// As [`Port::load`] / [`Port::store`] for this item's compute unit.
    pub fn load(&self, va: VirtAddr, buf: &mut [u8]) -> Result<(), AccessError> {
        self.port.load(self.gm, self.unit, va, buf)
    }
    /// Store `data` at `va`.
    ///
    /// # Errors
    /// As [`Port::load`] / [`Port::store`] for this item's compute unit.
    pub fn store(&self, va: VirtAddr, data: &[u8]) -> Result<(), AccessError> {
        self.port.store(self.gm, self.unit, va, data)
    }
    /// Load a `u32`.
    ///
    /// # Errors
    /// As [`Port::load`] / [`Port::store`] for this item's compute unit.
    pub fn load_u32(&self, va: VirtAddr) -> Result<u32, AccessError> {
        self.port.load_u32(self.gm, self.unit, va)
    }
    /// Store a `u32`.
    ///
    /// # Errors
    /// As [`Port::load`] / [`Port::store`] for this item's compute unit.
    pub fn store_u32(&self, va: VirtAddr, v: u32) -> Result<(), AccessError> {
        self.port.store_u32(self.gm, self.unit, va, v)
    }
    /// Load an `f32`.
    ///
    /// # Errors
    /// As [`Port::load`] / [`Port::store`] for this item's compute unit.
    pub fn load_f32(&self, va: VirtAddr) -> Result<f32, AccessError> {
        self.port.load_f32(self.gm, self.unit, va)
    }
    /// Store an `f32`.
    ///
    /// # Errors
    /// As [`Port::load`] / [`Port::store`] for this item's compute unit.
    pub fn store_f32(&self, va: VirtAddr, v: f32) -> Result<(), AccessError> {
        self.port.store_f32(self.gm, self.unit, va, v)
    }
    /// Load a `u64`.
    ///
    /// # Errors
    /// As [`Port::load`] / [`Port::store`] for this item's compute unit.
    pub fn load_u64(&self, va: VirtAddr) -> Result<u64, AccessError> {
        self.port.load_u64(self.gm, self.unit, va)
    }
    /// Store a `u64`.
    ///
    /// # Errors
    /// As [`Port::load`] / [`Port::store`] for this item's compute unit.
    pub fn store_u64(&self, va: VirtAddr, v: u64) -> Result<(), AccessError> {
        self.port.store_u64(self.gm, self.unit, va, v)
    }
}

/// What a launch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchStats {
    /// Work-groups run.
    pub groups: u64,
    /// Work-items run.
    pub items: u64,
    /// The port's counters moved by the launch (loads, stores, faults, ...).
    pub port: PortStats,
}

/// A launch stopped by a failed access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchError {
    /// The work-group of the failing item.
    pub group: u64,
    /// The failing item's global index.
    pub item: u64,
    /// What failed.
    pub error: AccessError,
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "work-item {} (group {}): {}",
            self.item, self.group, self.error
        )
    }
}

fn delta(a: PortStats, b: PortStats) -> PortStats {
    PortStats {
        loads: b.loads - a.loads,
        stores: b.stores - a.stores,
        bytes_loaded: b.bytes_loaded - a.bytes_loaded,
        bytes_stored: b.bytes_stored - a.bytes_stored,
        faults: b.faults - a.faults,
        protection_faults: b.protection_faults - a.protection_faults,
        failed_faults: b.failed_faults - a.failed_faults,
        zero_fills: b.zero_fills - a.zero_fills,
        migrations: b.migrations - a.migrations,
        remote: b.remote - a.remote,
        mapped_existing: b.mapped_existing - a.mapped_existing,
        spurious: b.spurious - a.spurious,
        duplicated: b.duplicated - a.duplicated,
        batches: b.batches - a.batches,
    }
}

impl Port {
    /// Run `kernel` once per work-item of `grid` on this device.
    ///
    /// # Errors
    /// [`LaunchError`] naming the first work-item whose kernel returned an
    /// [`AccessError`]; the launch stops there, and the items before it (and that
    /// item's accesses before the failing one) have run.
    pub fn launch<K>(
        &self,
        gm: &Gmem,
        grid: Grid,
        mut kernel: K,
    ) -> Result<LaunchStats, LaunchError>
    where
        K: FnMut(&WorkItem<'_>) -> Result<(), AccessError>,
    {
        let before = self.stats();
        let units = self.units().max(1);
        let mut items = 0;
        for group in 0..grid.groups {
            let unit = (group % units as u64) as usize;
            for local in 0..grid.group_size {
                let item = WorkItem {
                    port: self,
                    gm,
                    global: group * grid.group_size + local,
                    group,
                    local,
                    unit,
                };
                kernel(&item).map_err(|error| LaunchError {
                    group,
                    item: item.global,
                    error,
                })?;
                items += 1;
            }
        }
        Ok(LaunchStats {
            groups: grid.groups,
            items,
            port: delta(before, self.stats()),
        })
    }
}
