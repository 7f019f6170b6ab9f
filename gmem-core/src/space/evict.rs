//! Eviction: the scan that picks a victim page when a fault finds its memory full
//! (FIFO or CLOCK over the inactive queue), and the run that goes with the victim.
//!
//! ## Runs
//! The eviction scan picks a victim page; moving it alone to
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

use super::frames::FrameAsk;
use super::frames::Requester;
use super::{SpaceInner, SpaceState, TableRun};
use crate::addr::{Pfn, VaRange, Vpn, PAGE_SIZE};
use crate::device::DeviceInner;
use crate::error::MoveError;
use crate::lpt::{PageEntry, PENDING};
use crate::physmem::{EvictionPolicy, FrameState};
use crate::space::Ctx;
use crate::stats::Counters;
use crate::sync::Arc;
use alloc::vec::Vec;

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
            let x = self.store.lpt.get(v);
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

/// Eviction candidates examined per attempt (oldest first; pages that cannot be
/// evicted now — wired, pending, or in a space whose lock is taken — are skipped).
const EVICT_BATCH: usize = 16;

/// What the eviction scan did with one candidate.
enum Scan {
    /// Moved to host memory.
    Evicted,
    /// Referenced since the last look: given a second chance.
    Referenced,
    /// Cannot be evicted now (wired, pending, the faulting page, a busy space).
    Skipped,
}

impl SpaceState {
    /// Evict one page of `dev`'s memory that can be evicted now (pages of other spaces
    /// only if their lock is free) to host memory. Returns whether one was.
    ///
    /// The scan walks the inactive queue from its head ([`crate::physmem`] ages the
    /// active queue into it). Under [`EvictionPolicy::Fifo`] the first evictable
    /// candidate goes. Under [`EvictionPolicy::Clock`] each candidate's accessed bits are
    /// read and cleared in the tables that map it: a referenced page gets a second
    /// chance (back to the active tail), the first unreferenced one goes. A sweep can
    /// give every page a second chance, but after it every bit it saw is clear, so the
    /// rounds are bounded by the evictable frames; a last round evicts FIFO (pages
    /// re-referenced faster than the scan clears them must not make the fault fail).
    pub(super) fn evict_from(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        dev: &Arc<DeviceInner>,
        keep_vpn: Vpn,
    ) -> Result<bool, MoveError> {
        let (policy, evictable) = {
            let p = dev.phys.lock();
            (p.policy(), p.evictable())
        };
        let rounds = match policy {
            EvictionPolicy::Fifo => 1,
            EvictionPolicy::Clock => evictable / EVICT_BATCH as u64 + 2,
        };
        for round in 0..rounds {
            let policy = if round + 1 == rounds {
                EvictionPolicy::Fifo
            } else {
                policy
            };
            let candidates = dev.phys.lock().eviction_candidates(EVICT_BATCH);
            let mut second_chances = false;
            for (pfn, owner) in candidates {
                let scan = if owner.space == space.id {
                    if owner.vpn == keep_vpn {
                        Scan::Skipped
                    } else {
                        self.scan_evict(cx, owner.vpn, dev, pfn, policy, Some(keep_vpn))?
                    }
                } else if let Some(other) = cx.space(owner.space) {
                    match other.try_lock() {
                        Some(mut st) => st.scan_evict(cx, owner.vpn, dev, pfn, policy, None)?,
                        None => Scan::Skipped,
                    }
                } else {
                    Scan::Skipped
                };
                match scan {
                    Scan::Evicted => return Ok(true),
                    Scan::Referenced => second_chances = true,
                    Scan::Skipped => {}
                }
            }
            if !second_chances {
                return Ok(false);
            }
        }
        Ok(false)
    }

    /// One candidate of the eviction scan: page `vpn` on frame `pfn` of `dev`.
    fn scan_evict(
        &mut self,
        cx: &Ctx<'_>,
        vpn: Vpn,
        dev: &Arc<DeviceInner>,
        pfn: Pfn,
        policy: EvictionPolicy,
        keep_vpn: Option<Vpn>,
    ) -> Result<Scan, MoveError> {
        let e = self.store.lpt.get(vpn);
        if !self.evictable(&e, dev, pfn) {
            return Ok(Scan::Skipped);
        }
        let by_clock = match policy {
            EvictionPolicy::Fifo => false,
            EvictionPolicy::Clock => match self.page_referenced(cx.counters, vpn, e.mapped) {
                None => false,
                Some(referenced) => {
                    Counters::add(&cx.counters.pages_scanned, 1);
                    if referenced {
                        dev.phys.lock().second_chance(pfn);
                        Counters::add(&cx.counters.second_chances, 1);
                        return Ok(Scan::Referenced);
                    }
                    true
                }
            },
        };
        let pages = self.evict_page(cx, vpn, dev, pfn, policy, keep_vpn)?;
        if pages == 0 {
            return Ok(Scan::Skipped);
        }
        let counter = match by_clock {
            true => &cx.counters.evictions_clock,
            false => &cx.counters.evictions_fifo,
        };
        Counters::add(counter, pages);
        Ok(Scan::Evicted)
    }

    /// Read and clear the accessed bit of page `vpn` in every table of `mapped`; the
    /// TLBs of every device using a table that reported it referenced are invalidated
    /// for the page (a cached translation would let the device use the page without
    /// setting the bit again). `None` when no table that maps the page keeps accessed
    /// bits; a page mapped nowhere is unreferenced (a use would have faulted).
    pub(super) fn page_referenced(&self, stats: &Counters, vpn: Vpn, mapped: u32) -> Option<bool> {
        let range = VaRange {
            start: vpn.addr(),
            len: PAGE_SIZE,
        };
        let mut supported = mapped == 0;
        let mut runs = Vec::new();
        for (t, table) in self.xlat.tables.iter().enumerate() {
            let Some(table) = table.as_ref().filter(|_| mapped & (1 << t) != 0) else {
                continue;
            };
            if let Some(referenced) = table.mmu.test_and_clear_accessed(table.root, range) {
                supported = true;
                if referenced {
                    runs.push(TableRun { table: t, range });
                }
            }
        }
        if !runs.is_empty() {
            self.invalidate(stats, &runs);
        }
        supported.then_some(!runs.is_empty())
    }

    /// Whether page entry `e` (expected on frame `pfn` of `dev`) can be evicted now.
    pub(super) fn evictable(&self, e: &PageEntry, dev: &Arc<DeviceInner>, pfn: Pfn) -> bool {
        e.is_populated()
            && e.pfn == pfn
            && self.store.memories.get(e.mem).id == dev.id
            && !e.has(PENDING)
            && !SpaceState::is_wired(e)
    }

    /// Move page `vpn` (frame `pfn` of `dev`) to host memory, with the cold pages on
    /// the frames after it as one run (see [`SpaceState::evict_run_len`]; never
    /// `keep`). Returns the pages evicted (0: the page cannot be evicted now).
    pub(crate) fn evict_page(
        &mut self,
        cx: &Ctx<'_>,
        vpn: Vpn,
        dev: &Arc<DeviceInner>,
        pfn: Pfn,
        policy: EvictionPolicy,
        keep: Option<Vpn>,
    ) -> Result<u64, MoveError> {
        let e = self.store.lpt.get(vpn);
        if !self.evictable(&e, dev, pfn) {
            return Ok(0);
        }
        let owner = dev.phys.lock().owner(pfn).map(|o| o.space);
        let Some(space_id) = owner else {
            return Ok(0);
        };
        let host = cx.host.clone();
        let run = self.evict_run_len(cx.counters, vpn, dev, policy, keep);
        // One run, one frame request: its pages must share their attributes.
        let run = if run > 1 && self.same_attrs(vpn, run) {
            run
        } else {
            1
        };
        let asker = Requester {
            device: None,
            attrs: self.attrs_at(vpn),
        };
        let mut moved = 0;
        for n in [run, 1] {
            // A run or nothing at once; a single page with host memory's oldest
            // reservations broken as needed (host memory evicts nothing).
            let ask = if n == 1 {
                FrameAsk::page(space_id, vpn, asker)
            } else {
                FrameAsk::run(space_id, vpn, n, 1, asker)
            };
            match self.frames(cx, None, &host, ask) {
                Ok(new) => {
                    self.move_run(cx, vpn, n, &host, new)?;
                    moved = n;
                    break;
                }
                Err(e) if n == 1 => return Err(e),
                Err(_) => {}
            }
        }
        Counters::add(&cx.counters.evictions, moved);
        Ok(moved)
    }
}
