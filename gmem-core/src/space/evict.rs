//! Eviction by runs: how many pages after an eviction victim go with it.
//!
//! The eviction scan (in the `fault` module) picks a victim page; moving it alone to
//! host memory costs one unmap, one invalidation per device and one copy for 4 KiB.
//! Pages faulted in together (a zero-filled block, a migrated run) sit on consecutive
//! frames, age together and reach the inactive queue together, so the victim takes with
//! it the pages that follow it — in the same region, on the following frames of the
//! same memory, with the same flags, none wired — as long as each is itself a likely
//! victim: on the inactive queue and, under [`EvictionPolicy::Clock`], not referenced
//! since the scan last looked (a referenced one gets its second chance and ends the
//! run). The run (at most [`EVICT_RUN_MAX`] pages) then moves in one
//! [`crate::DeviceMemory::copy`] (`move_run`). Linux's reclaim batches in the same
//! spirit (`SWAP_CLUSTER_MAX`, 32 pages); the bound here is 16 pages (64 KiB) so that a
//! scan never evicts much more than the fault needs.

use super::SpaceState;
use crate::addr::Vpn;
use crate::device::DeviceInner;
use crate::physmem::{EvictionPolicy, FrameState};
use crate::stats::Counters;
use crate::sync::Arc;

/// The longest run one eviction moves (16 pages, 64 KiB).
pub(crate) const EVICT_RUN_MAX: u64 = 16;

impl SpaceState {
    /// The pages from `vpn` (an evictable page of `dev`) to evict as one run: at least
    /// 1 (see the module documentation); `keep` is never included.
    pub(super) fn evict_run_len(
        &self,
        stats: &Counters,
        vpn: Vpn,
        dev: &Arc<DeviceInner>,
        policy: EvictionPolicy,
        keep: Option<Vpn>,
    ) -> u64 {
        let Some((start, r)) = self.region_at(vpn.addr().as_u64()) else {
            return 1;
        };
        let region_end = (start + r.len) >> crate::addr::PAGE_SHIFT;
        let max = EVICT_RUN_MAX.min(region_end - vpn.0);
        let max = match keep {
            Some(k) if k > vpn => max.min(k.0 - vpn.0),
            _ => max,
        };
        let max = self.movable_run(vpn, max);
        let mut n = 1;
        while n < max {
            let v = vpn.add(n);
            let x = self.lpt.get(v);
            if dev.phys.lock().state(x.pfn) != Some(FrameState::Inactive) {
                break;
            }
            if policy == EvictionPolicy::Clock {
                if let Some(referenced) = self.page_referenced(stats, v, x.mapped) {
                    Counters::add(&stats.pages_scanned, 1);
                    if referenced {
                        dev.phys.lock().second_chance(x.pfn);
                        Counters::add(&stats.second_chances, 1);
                        break;
                    }
                }
            }
            n += 1;
        }
        n
    }
}
