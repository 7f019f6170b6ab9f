//! The fault path's implementation (the theory is in [`crate::fault`]): serving a
//! fault, zero-fill, migration, eviction, prefetch.

use super::{PlacementMode, PlacementTarget, SpaceInner, SpaceState, TableRun, MAX_TABLES};
use crate::addr::{Pfn, VaRange, VirtAddr, Vpn, PAGE_SHIFT, PAGE_SIZE};
use crate::device::{DeviceInner, FrameRun};
use crate::error::{FaultError, MoveError};
use crate::fault::{FaultKind, FaultResolution};
use crate::flags::{DevCaps, Prot};
use crate::gmem::Ctx;
use crate::lpt::{PageEntry, PENDING, PROT_BITS};
use crate::mmu::MemError;
use crate::physmem::{EvictionPolicy, RESERVATION_PAGES};
use crate::stats::Counters;
use crate::sync::Arc;
use alloc::vec::Vec;

/// Eviction candidates examined per attempt (oldest first; pages that cannot be
/// evicted now — wired, pending, or in a space whose lock is taken — are skipped).
const EVICT_BATCH: usize = 16;

/// The longest run a migration moves in one call (2 MiB).
const MOVE_RUN_MAX: u64 = 512;

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
    /// Serve a fault of the device in attachment `slot`.
    pub(crate) fn fault(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        slot: usize,
        va: VirtAddr,
        access: Prot,
    ) -> Result<FaultResolution, FaultError> {
        let stats = cx.counters;
        let (rstart, prot, placement, granularity, explicit, rlen) =
            match self.region_at(va.as_u64()) {
                Some((s, r)) => (s, r.prot, r.placement, r.granularity, r.explicit, r.len),
                None => return Err(FaultError::NotAllocated(va)),
            };
        // A page protected on its own (`region_protect_range`) has its own protection.
        let prot = self.lpt.get(va.vpn()).prot_or(prot);
        if !prot.contains(access) {
            return Err(FaultError::ProtectionViolation {
                va,
                access,
                allowed: prot,
            });
        }
        let vpn = va.vpn();
        if self.lpt.get(vpn).has(PENDING) {
            self.drain(stats, &space.arena);
        }
        let att = self.attached[slot]
            .as_ref()
            .expect("faulting device is attached");
        let dev = att.dev.clone();
        let t = att.table;
        let target = self.target_of(cx, &dev, placement.target);
        let e = self.lpt.get(vpn);

        if !e.is_populated() {
            if explicit {
                return Err(FaultError::NotMapped(va));
            }
            let g = if granularity != 0 {
                granularity >> PAGE_SHIFT
            } else {
                dev.page_sizes.largest().bytes().min(2 << 20) >> PAGE_SHIFT
            };
            let (rfirst, rpages) = SpaceState::pages_of(rstart, rlen);
            return Ok(self.zero_fill(
                cx,
                space,
                t,
                &target,
                vpn,
                g,
                rfirst,
                rfirst + rpages,
                prot,
            )?);
        }

        let here = self.memories.get(e.mem).clone();
        // A mapping is remote when the frame is not in the faulter's own memory (its
        // local memory, or host memory for a device without one).
        let remote = here.id != self.target_of(cx, &dev, PlacementTarget::Faulting).id;
        let mine = e.mapped & (1 << t) != 0;
        if SpaceState::is_wired(&e) {
            // Wired pages never move: map them where they are.
            return if mine {
                self.spurious(stats, t, vpn)
            } else {
                self.map_in_place(stats, t, vpn, e, prot, false, remote)
            };
        }
        let replicas = self.replica_mask();
        match placement.mode {
            PlacementMode::Unique => {
                let others = e.mapped & !(1 << t) & !replicas;
                if mine && others == 0 {
                    self.spurious(stats, t, vpn)
                } else if here.id == target.id {
                    self.unmap_pages(stats, vpn, 1, others);
                    self.map_in_place(stats, t, vpn, e, prot, mine, remote)
                } else {
                    self.migrate_and_map(cx, space, t, vpn, &target, prot)
                }
            }
            PlacementMode::RemoteAccess => {
                let hinted = e.hint as usize == slot + 1;
                if here.id == target.id {
                    if mine {
                        self.spurious(stats, t, vpn)
                    } else {
                        self.map_in_place(stats, t, vpn, e, prot, mine, remote)
                    }
                } else if mine && hinted {
                    let r = self.migrate_and_map(cx, space, t, vpn, &target, prot)?;
                    self.lpt.update(vpn, |e| e.hint = 0);
                    Ok(r)
                } else {
                    self.lpt.update(vpn, |e| e.hint = (slot + 1) as u8);
                    self.map_in_place(stats, t, vpn, e, prot, mine, true)
                }
            }
        }
    }

    /// Map the page's frame where it is into table `t` (if not there yet) and count it.
    #[allow(clippy::too_many_arguments)]
    fn map_in_place(
        &mut self,
        stats: &Counters,
        t: usize,
        vpn: Vpn,
        e: PageEntry,
        prot: Prot,
        mine: bool,
        remote: bool,
    ) -> Result<FaultResolution, FaultError> {
        if !mine {
            self.map_for_fault(stats, t, vpn, e, prot)?;
        }
        self.memories.get(e.mem).phys.lock().touch(e.pfn);
        let (counter, kind) = if remote {
            (&stats.faults_remote, FaultKind::Remote)
        } else {
            (&stats.faults_map_existing, FaultKind::MappedExisting)
        };
        Counters::add(counter, 1);
        Ok(FaultResolution { kind, pages: 1 })
    }

    /// Migrate the page to `target`, then map it into table `t` and count it.
    fn migrate_and_map(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        t: usize,
        vpn: Vpn,
        target: &Arc<DeviceInner>,
        prot: Prot,
    ) -> Result<FaultResolution, FaultError> {
        self.migrate_page(cx, space, vpn, target)?;
        let n = self.lpt.get(vpn);
        self.map_for_fault(cx.counters, t, vpn, n, prot)?;
        Counters::add(&cx.counters.faults_migrate, 1);
        Ok(FaultResolution {
            kind: FaultKind::Migrated,
            pages: 1,
        })
    }

    fn spurious(
        &mut self,
        stats: &Counters,
        t: usize,
        vpn: Vpn,
    ) -> Result<FaultResolution, FaultError> {
        let runs = [crate::space::TableRun {
            table: t,
            range: crate::addr::VaRange {
                start: vpn.addr(),
                len: PAGE_SIZE,
            },
        }];
        self.invalidate(stats, &runs);
        Counters::add(&stats.faults_spurious, 1);
        Ok(FaultResolution {
            kind: FaultKind::Spurious,
            pages: 0,
        })
    }

    /// The memory a placement target names for a faulting device.
    pub(crate) fn target_of(
        &self,
        cx: &Ctx<'_>,
        dev: &Arc<DeviceInner>,
        target: PlacementTarget,
    ) -> Arc<DeviceInner> {
        match target {
            PlacementTarget::Host => cx.host.clone(),
            PlacementTarget::Device(id) => match cx.device(id) {
                Some(d) if d.has_memory() => d,
                _ => cx.host.clone(),
            },
            PlacementTarget::Faulting => {
                if dev.has_memory() {
                    dev.clone()
                } else {
                    cx.host.clone()
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn zero_fill(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        t: usize,
        target: &Arc<DeviceInner>,
        vpn: Vpn,
        g: u64,
        rfirst: Vpn,
        rend: Vpn,
        prot: Prot,
    ) -> Result<FaultResolution, MoveError> {
        let stats = cx.counters;
        let g = g.max(1);
        let b0 = vpn.align_down(g);
        let whole =
            g > 1 && b0 >= rfirst && b0 + g <= rend && self.lpt.entries_in(b0, g).next().is_none();
        let mem = self
            .mem_index(target)
            .map_err(|_| MoveError::TooManyMemories(target.id))?;
        // A block inside one reservation-sized block goes through the reservations (a
        // 2 MiB block is one aligned run; a smaller one lands at its offset of its
        // 2 MiB block's reservation); a larger one is one aligned run.
        let block = whole
            .then(|| {
                let limit = frame_limit(target, b0, g);
                if g <= RESERVATION_PAGES {
                    target.alloc_pages(g, space.id, b0, limit)
                } else {
                    target.alloc_frames(g, g, space.id, b0, limit)
                }
            })
            .flatten();
        let (first, pages, run) = match block {
            Some(run) => (b0, g, run),
            None => (vpn, 1, self.alloc_frame(cx, space, target, vpn)?),
        };
        let pfn = run.pfn();
        let memory = target
            .memory
            .as_ref()
            .ok_or(MoveError::OutOfMemory(target.id))?;
        memory.zero(pfn.addr(), pages << PAGE_SHIFT)?;
        for k in 0..pages {
            // A page's own protection survives its population.
            let own = self.lpt.get(first + k).flags & PROT_BITS;
            self.lpt.set(
                first + k,
                PageEntry {
                    pfn: pfn + k,
                    mem,
                    flags: own,
                    ..PageEntry::EMPTY
                },
            );
        }
        let replicas = self.replica_mask();
        let mapped = if pages == 1 {
            // A single page may complete its block: map the block large then.
            let e = self.lpt.get(first);
            self.map_for_fault(stats, t, first, e, prot).map(|_| ())
        } else {
            self.map_run(stats, t, first, pages, pfn, mem, prot)
        };
        if let Err(e) = mapped.and_then(|()| self.mirror(stats, first, pages, replicas)) {
            self.unpopulate(stats, first, pages);
            return Err(e.into());
        }
        run.commit();
        Counters::add(&stats.pages_zeroed, pages);
        Counters::add(&stats.faults_zero_fill, 1);
        Ok(FaultResolution {
            kind: FaultKind::ZeroFill,
            pages,
        })
    }

    /// Undo the population of fresh pages `[first, first + pages)` whose frames are
    /// still an uncommitted [`FrameRun`]: unmap them from every table that got them
    /// (invalidating) and forget their entries; dropping the run then frees the frames.
    fn unpopulate(&mut self, stats: &Counters, first: Vpn, pages: u64) {
        self.unmap_pages(stats, first, pages, u32::MAX);
        for k in 0..pages {
            self.lpt.take(first + k);
        }
    }

    /// One frame in `target` for page `vpn`, evicting to host memory if `target` is a
    /// full device memory.
    pub(crate) fn alloc_frame(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        target: &Arc<DeviceInner>,
        vpn: Vpn,
    ) -> Result<FrameRun, MoveError> {
        let limit = frame_limit(target, vpn, 1);
        loop {
            if let Some(run) = target.alloc_pages(1, space.id, vpn, limit) {
                return Ok(run);
            }
            // Memory pressure: break the oldest reservation before evicting anything.
            if target.phys.lock().break_oldest_reservation() {
                Counters::add(&cx.counters.reservations_broken, 1);
                continue;
            }
            if target.caps.contains(DevCaps::HOST) || !self.evict_from(cx, space, target, vpn)? {
                return Err(MoveError::OutOfMemory(target.id));
            }
        }
    }

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
    fn evict_from(
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
                        self.scan_evict(cx, owner.vpn, dev, pfn, policy)?
                    }
                } else if let Some(other) = cx.space(owner.space) {
                    match other.try_lock() {
                        Some(mut st) => st.scan_evict(cx, owner.vpn, dev, pfn, policy)?,
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
    ) -> Result<Scan, MoveError> {
        let e = self.lpt.get(vpn);
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
        if !self.evict_page(cx, vpn, dev, pfn)? {
            return Ok(Scan::Skipped);
        }
        let counter = match by_clock {
            true => &cx.counters.evictions_clock,
            false => &cx.counters.evictions_fifo,
        };
        Counters::add(counter, 1);
        Ok(Scan::Evicted)
    }

    /// Read and clear the accessed bit of page `vpn` in every table of `mapped`; the
    /// TLBs of every device using a table that reported it referenced are invalidated
    /// for the page (a cached translation would let the device use the page without
    /// setting the bit again). `None` when no table that maps the page keeps accessed
    /// bits; a page mapped nowhere is unreferenced (a use would have faulted).
    fn page_referenced(&self, stats: &Counters, vpn: Vpn, mapped: u32) -> Option<bool> {
        let range = VaRange {
            start: vpn.addr(),
            len: PAGE_SIZE,
        };
        let mut supported = mapped == 0;
        let mut runs = Vec::new();
        for (t, table) in self.tables.iter().enumerate() {
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
    fn evictable(&self, e: &PageEntry, dev: &Arc<DeviceInner>, pfn: Pfn) -> bool {
        e.is_populated()
            && e.pfn == pfn
            && self.memories.get(e.mem).id == dev.id
            && !e.has(PENDING)
            && !SpaceState::is_wired(e)
    }

    /// Move page `vpn` (frame `pfn` of `dev`) to host memory.
    pub(crate) fn evict_page(
        &mut self,
        cx: &Ctx<'_>,
        vpn: Vpn,
        dev: &Arc<DeviceInner>,
        pfn: Pfn,
    ) -> Result<bool, MoveError> {
        let e = self.lpt.get(vpn);
        if !self.evictable(&e, dev, pfn) {
            return Ok(false);
        }
        let owner = dev.phys.lock().owner(pfn).map(|o| o.space);
        let Some(space_id) = owner else {
            return Ok(false);
        };
        let host = cx.host.clone();
        let limit = frame_limit(&host, vpn, 1);
        let new = loop {
            if let Some(new) = host.alloc_pages(1, space_id, vpn, limit) {
                break new;
            }
            if !host.phys.lock().break_oldest_reservation() {
                return Err(MoveError::OutOfMemory(host.id));
            }
            Counters::add(&cx.counters.reservations_broken, 1);
        };
        self.move_page(cx, vpn, &host, new)?;
        Counters::add(&cx.counters.evictions, 1);
        Ok(true)
    }

    /// Move page `vpn` to `target` (migration under unique or on the remote hint).
    fn migrate_page(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        vpn: Vpn,
        target: &Arc<DeviceInner>,
    ) -> Result<(), MoveError> {
        let new = self.alloc_frame(cx, space, target, vpn)?;
        self.move_page(cx, vpn, target, new)
    }

    /// Move one page: [`SpaceState::move_run`] of the page `vpn` into frame run `new`
    /// of `to` (committed once the bytes are there; on a failure before that it is
    /// freed and the page stays where it was).
    pub(crate) fn move_page(
        &mut self,
        cx: &Ctx<'_>,
        vpn: Vpn,
        to: &Arc<DeviceInner>,
        new: FrameRun,
    ) -> Result<(), MoveError> {
        self.move_run(cx, vpn, 1, to, new)
    }

    /// Move the `pages` pages from `first` — populated, in one memory, on the
    /// physically contiguous frames from the first page's, none wired or pending — to
    /// the frame run `new` of `to`: one unmap (and one invalidation per device), one
    /// [`crate::DeviceMemory::copy`], one mirror. On a copy failure nothing moved (the
    /// dropped mappings fault back in) and `new` is freed.
    fn move_run(
        &mut self,
        cx: &Ctx<'_>,
        first: Vpn,
        pages: u64,
        to: &Arc<DeviceInner>,
        new: FrameRun,
    ) -> Result<(), MoveError> {
        let stats = cx.counters;
        let e = self.lpt.get(first);
        let from = self.memories.get(e.mem).clone();
        let mem = self
            .mem_index(to)
            .map_err(|_| MoveError::TooManyMemories(to.id))?;
        self.unmap_pages(stats, first, pages, u32::MAX);
        copy_run(&from, e.pfn, to, new.pfn(), pages)?;
        let new = new.commit();
        for k in 0..pages {
            let v = first.add(k);
            let old = self.lpt.get(v);
            self.release_frame(&old, false);
            self.lpt.update(v, |x| {
                x.mem = mem;
                x.pfn = new.add(k);
            });
        }
        let counter = match (
            from.caps.contains(DevCaps::HOST),
            to.caps.contains(DevCaps::HOST),
        ) {
            (true, false) => &stats.bytes_host_to_dev,
            (false, true) => &stats.bytes_dev_to_host,
            _ => &stats.bytes_dev_to_dev,
        };
        Counters::add(counter, pages * PAGE_SIZE);
        let replicas = self.replica_mask();
        self.mirror(stats, first, pages, replicas)?;
        Ok(())
    }

    /// Pages from `vpn` (at most `max`) that [`SpaceState::move_run`] can move as one
    /// run: populated, not wired, in the memory of `vpn`'s entry, on consecutive frames.
    fn movable_run(&self, vpn: Vpn, max: u64) -> u64 {
        let e = self.lpt.get(vpn);
        let mut n = 1;
        while n < max {
            let x = self.lpt.get(vpn.add(n));
            if !x.is_populated()
                || x.mem != e.mem
                || x.pfn != e.pfn.add(n)
                || x.flags != e.flags
                || SpaceState::is_wired(&x)
            {
                break;
            }
            n += 1;
        }
        n
    }

    /// Give page `vpn` a zero-filled frame in `target` (no mapping; the next fault or a
    /// mirror maps it).
    pub(crate) fn prepare_page(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        vpn: Vpn,
        target: &Arc<DeviceInner>,
    ) -> Result<(), MoveError> {
        let mem = self
            .mem_index(target)
            .map_err(|_| MoveError::TooManyMemories(target.id))?;
        let run = self.alloc_frame(cx, space, target, vpn)?;
        let pfn = run.pfn();
        let memory = target
            .memory
            .as_ref()
            .ok_or(MoveError::OutOfMemory(target.id))?;
        memory.zero(pfn.addr(), PAGE_SIZE)?;
        let own = self.lpt.get(vpn).flags & PROT_BITS;
        self.lpt.set(
            vpn,
            PageEntry {
                pfn,
                mem,
                flags: own,
                ..PageEntry::EMPTY
            },
        );
        let replicas = self.replica_mask();
        if let Err(e) = self.mirror(cx.counters, vpn, 1, replicas) {
            self.unpopulate(cx.counters, vpn, 1);
            return Err(e.into());
        }
        run.commit();
        Counters::add(&cx.counters.pages_zeroed, 1);
        Ok(())
    }

    /// Migrate (or prefetch) every page of `[first, first+pages)` to `target`: pages with
    /// frames elsewhere move, pages without frames are allocated and zero-filled there
    /// (no mapping is installed; the next fault maps). Wired pages stay. Returns pages
    /// moved or prepared.
    pub(crate) fn migrate_range(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        first: Vpn,
        pages: u64,
        target: &Arc<DeviceInner>,
        prefetch: bool,
    ) -> Result<u64, MoveError> {
        if self.any_pending(first, pages) {
            self.drain(cx.counters, &space.arena);
        }
        let mut done = 0;
        let end = first.add(pages);
        let mut vpn = first;
        while vpn < end {
            let e = self.lpt.get(vpn);
            if e.is_populated() {
                if SpaceState::is_wired(&e) || self.memories.get(e.mem).id == target.id {
                    vpn = vpn.add(1);
                    continue;
                }
                // A physically contiguous run moves in one call when the target has a
                // free run as long; otherwise page by page (evicting as needed).
                // Runs stop at 2 MiB block boundaries, so that a run lands in its
                // block's reservation.
                let to_block = MOVE_RUN_MAX - (vpn.0 & (MOVE_RUN_MAX - 1));
                let n = self.movable_run(vpn, (end.0 - vpn.0).min(to_block));
                if n > 1 {
                    let limit = frame_limit(target, vpn, n);
                    if let Some(run) = target.alloc_pages(n, space.id, vpn, limit) {
                        self.move_run(cx, vpn, n, target, run)?;
                        done += n;
                        vpn = vpn.add(n);
                        continue;
                    }
                }
                self.migrate_page(cx, space, vpn, target)?;
                done += 1;
            } else if prefetch {
                self.prepare_page(cx, space, vpn, target)?;
                done += 1;
            }
            vpn = vpn.add(1);
        }
        Ok(done)
    }
}

const _: () = assert!(MAX_TABLES <= 32);

/// The driver's constraint on frames of `dev` backing `pages` pages from `vpn`.
fn frame_limit(dev: &DeviceInner, vpn: Vpn, pages: u64) -> Option<crate::mmu::FrameConstraint> {
    dev.memory
        .as_ref()
        .and_then(|m| m.frame_constraint(vpn.addr(), pages))
}

/// Copy `pages` frames from `src` in `from`'s memory to `dst` in `to`'s, in one
/// [`crate::DeviceMemory::copy`] call.
pub(super) fn copy_run(
    from: &DeviceInner,
    src: Pfn,
    to: &DeviceInner,
    dst: Pfn,
    pages: u64,
) -> Result<(), MemError> {
    let src_mem = from
        .memory
        .as_ref()
        .ok_or(MemError::OutOfRange { pa: src.addr() })?;
    let dst_mem = to
        .memory
        .as_ref()
        .ok_or(MemError::OutOfRange { pa: dst.addr() })?;
    src_mem.copy(
        src.addr(),
        dst_mem.as_ref(),
        dst.addr(),
        pages << PAGE_SHIFT,
    )
}
