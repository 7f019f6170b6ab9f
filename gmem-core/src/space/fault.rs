//! The fault path's implementation (the theory is in [`crate::fault`]): serving a
//! fault, zero-fill, migration, prefetch (eviction, which a fault may need, is in
//! `evict`).

use super::duplicate::{DupFault, DupStep};
use super::frames::{FrameAsk, Requester};
use super::segments::Piece;
use super::tables::BackedRun;
use super::{PlacementMode, PlacementTarget, SpaceInner, SpaceState, MAX_TABLES};
use crate::addr::{Pfn, VirtAddr, Vpn, PAGE_SHIFT, PAGE_SIZE};
use crate::device::{DeviceInner, FrameRun};
use crate::error::{FaultError, MoveError};
use crate::fault::{FaultKind, FaultResolution};
use crate::flags::DevCaps;
use crate::flags::Prot;
use crate::handle::DeviceId;
use crate::lpt::{PageEntry, PENDING};
use crate::mmu::MemError;
use crate::policy::thrashing::ThrashingHint;
use crate::space::Ctx;
use crate::stats::{Counters, SpaceCounters};
use crate::sync::Arc;

/// The longest run a migration moves in one call (2 MiB).
const MOVE_RUN_MAX: u64 = 512;

/// One fault on its way from lookup to mapping: what FreeBSD's `struct faultstate`
/// (`vm_fault.c`) and Linux's `struct vm_fault` carry. [`SpaceState::fault`] builds
/// it once the page's region, protection and placement are known, and hands it by
/// `&mut` to the stage that serves the fault (zero-fill, map in place, migrate and
/// map, spurious); a stage that gives the page a frame records the new entry in it.
pub(crate) struct FaultState<'f, 'c> {
    /// The instance's context: counters, host memory, the device registry.
    cx: &'f Ctx<'c>,
    /// The space faulted in.
    space: &'f SpaceInner,
    /// The faulting device.
    dev: &'c Arc<DeviceInner>,
    /// Its page table.
    t: usize,
    /// The faulting page.
    vpn: Vpn,
    /// The page's protection and attributes (its region's, or a range call's).
    piece: Piece,
    /// The page's logical page table entry as the path last read or wrote it.
    entry: PageEntry,
    /// The memory the page's frame belongs in, by the region's placement (a
    /// reference to the fault's [`TargetMemory`]: the state holds only values and
    /// references, so that the compiler keeps it in registers on the 4 KiB path).
    target: &'f Arc<DeviceInner>,
    /// The page's region: `[first, end)`.
    region: (Vpn, Vpn),
}

impl FaultState<'_, '_> {
    /// Who asks for the page's frames: the faulting device, with the page's attributes.
    #[inline(always)]
    fn asker(&self) -> Requester {
        Requester {
            device: Some(self.dev.id),
            attrs: self.piece.attrs,
        }
    }
}

impl SpaceState {
    /// Serve a fault of `dev` at `va` for `access`; `dev` is the device in attachment
    /// `slot` of `faulter = (slot, t)`, which uses table `t` (both from
    /// [`SpaceState::attachment_of`]; the caller's reference keeps `dev` alive for the
    /// whole fault, so the path borrows it instead of cloning the attachment's).
    pub(crate) fn fault<'c>(
        &mut self,
        cx: &Ctx<'c>,
        space: &SpaceInner,
        dev: &'c Arc<DeviceInner>,
        faulter: (usize, usize),
        va: VirtAddr,
        access: Prot,
    ) -> Result<FaultResolution, FaultError> {
        let (slot, t) = faulter;
        let stats = cx.counters;
        let Some(fr) = self.map.for_fault(va.as_u64()) else {
            return Err(FaultError::NotAllocated(va));
        };
        // An unlocked `region_map` is writing the region's pages into tables right
        // now: mapping them here too would edit a range that edit is editing (the
        // `Mmu::concurrent_edits` promise). The device retries once it has finished.
        // (Deliberately broken under `gmem_loom_bug = "fault_maps_busy_region"`: the
        // loom model `unlocked` must catch the overlapping edit.)
        #[cfg(not(gmem_loom_bug = "fault_maps_busy_region"))]
        if fr.busy {
            return Err(FaultError::Busy(va));
        }
        let (rstart, region, placement, fill_block, explicit, rlen) = (
            fr.start,
            fr.piece,
            fr.placement,
            fr.zero_fill_block,
            fr.explicit,
            fr.len,
        );
        // The page's own protection and attributes: its region's, or a range call's.
        let piece = self.map.piece(region, va.vpn());
        let prot = piece.prot;
        // A page of no access is never mapped (see `mmu.rs`, *Empty protection*), even
        // for a fault that names no access (`contains(empty)` is always true).
        if prot.is_empty() || !prot.contains(access) {
            return Err(FaultError::ProtectionViolation {
                va,
                access,
                allowed: prot,
            });
        }
        let vpn = va.vpn();
        let mut e = self.store.lpt.get(vpn);
        if e.has(PENDING) {
            self.drain(stats, &space.arena);
            e = self.store.lpt.get(vpn);
        }
        debug_assert!(
            self.xlat.attached[slot]
                .as_ref()
                .is_some_and(|a| Arc::ptr_eq(&a.dev, dev) && a.table == t),
            "slot {slot} is not the faulter's, or table {t} not its table"
        );
        let dev_sizes = dev.page_sizes;
        let (rfirst, rpages) = SpaceState::pages_of(rstart, rlen);
        // Advice (`region_advise`) overrides the region's placement target with the
        // page's preferred location.
        let advice = self.fault_advice(vpn, dev.id);
        let target = match advice.preferred {
            Some(p) => self.target_of(cx, dev, PlacementTarget::Device(p)),
            None => self.target_of(cx, dev, placement.target),
        };
        let mut fs = FaultState {
            cx,
            space,
            dev,
            t,
            vpn,
            piece,
            entry: e,
            target: &target,
            region: (rfirst, rfirst + rpages),
        };

        if !e.is_populated() {
            if explicit {
                return Err(FaultError::NotMapped(va));
            }
            let g = if fill_block != 0 {
                fill_block >> PAGE_SHIFT
            } else {
                dev_sizes.largest().bytes().min(2 << 20) >> PAGE_SHIFT
            };
            // A block is mapped with one protection: split regions fall back to pages
            // (a single page is uniform: no question to ask).
            let g = if g > 1 && self.map.uniform(region, vpn.align_down(g), g).is_none() {
                1
            } else {
                g
            };
            return Ok(self.zero_fill(&mut fs, g)?);
        }

        // Read duplication (`duplicate`): a read-mostly page read from elsewhere gets
        // a read-only copy; a page with copies loses them before anything else.
        if advice.read_mostly
            || (!self.store.copies.is_empty() && self.store.copies.get(vpn).is_some())
        {
            let f = DupFault {
                space: space.id,
                own: own_memory(cx, dev),
                t,
                vpn,
                piece,
                access,
                mode: placement.mode,
                read_mostly: advice.read_mostly,
            };
            match self.read_duplicate(cx, f)? {
                DupStep::Served(r) => return Ok(r),
                DupStep::Spurious => return self.spurious(&mut fs),
                DupStep::Continue => {
                    e = self.store.lpt.get(vpn);
                    fs.entry = e;
                }
            }
        }
        let here = self.store.memories.get(e.mem).clone();
        // A mapping is remote when the frame is not in the faulter's own memory (its
        // local memory, or host memory for a device without one).
        let own = own_memory(cx, dev).id;
        let remote = here.id != own;
        let mine = e.mapped & (1 << t) != 0;
        if SpaceState::is_wired(&e) {
            // Wired pages never move: map them where they are.
            return if mine {
                self.spurious(&mut fs)
            } else {
                self.map_in_place(&mut fs, false, remote)
            };
        }
        let replicas = self.xlat.replica_mask();
        match placement.mode {
            PlacementMode::Unique => {
                let others = e.mapped & !(1 << t) & !replicas;
                if mine && others == 0 {
                    self.spurious(&mut fs)
                } else if here.id == fs.target.id {
                    // A page pinned here (`policies`), or at its preferred location
                    // (advice), keeps its other mappings.
                    let shared = advice.preferred == Some(here.id);
                    if !shared && !self.is_pinned(vpn) {
                        self.unmap_pages(stats, vpn, 1, others);
                    }
                    self.map_in_place(&mut fs, mine, remote)
                } else if advice.accessed_by_faulter {
                    // Advised to access it where it lives (accessed-by): map it there,
                    // no migration.
                    self.map_in_place(&mut fs, mine, remote)
                } else {
                    match self.thrashing_hint(vpn, dev.id, here.id, cx.platform) {
                        ThrashingHint::None => {
                            let r = self.migrate_and_map(&mut fs)?;
                            self.thrashing_migrated(vpn, fs.target.id);
                            Ok(r)
                        }
                        // Thrashing, pinned where it lives: the faulter maps it
                        // there, remotely; the other mappings stay.
                        ThrashingHint::Pin { residency } if residency == here.id => {
                            self.map_in_place(&mut fs, mine, remote)
                        }
                        // Pinned elsewhere (to the do-not-throttle faulter): it
                        // moves once more, and the pin holds it there.
                        ThrashingHint::Pin { .. } => self.migrate_and_map(&mut fs),
                        ThrashingHint::Throttle { .. } => Err(FaultError::Throttled(va)),
                    }
                }
            }
            PlacementMode::RemoteAccess => {
                let hinted = e.hint as usize == slot + 1;
                if here.id == fs.target.id {
                    if mine {
                        self.spurious(&mut fs)
                    } else {
                        self.map_in_place(&mut fs, mine, remote)
                    }
                } else if mine && hinted {
                    let r = self.migrate_and_map(&mut fs)?;
                    self.store.lpt.update(vpn, |e| e.hint = 0);
                    Ok(r)
                } else {
                    self.store.lpt.update(vpn, |e| e.hint = (slot + 1) as u8);
                    self.map_in_place(&mut fs, mine, true)
                }
            }
        }
    }

    /// Map the page's frame where it is into the faulter's table (unless `mine`: it is
    /// there already) and count the fault (`remote`: the frame is not in the
    /// faulter's own memory).
    #[inline(always)]
    fn map_in_place(
        &mut self,
        fs: &mut FaultState<'_, '_>,
        mine: bool,
        remote: bool,
    ) -> Result<FaultResolution, FaultError> {
        let e = fs.entry;
        if !mine {
            self.map_for_fault(fs.cx.counters, fs.t, fs.vpn, e, fs.piece)?;
        }
        self.store.memories.get(e.mem).phys.lock().touch(e.pfn);
        let local = self.local();
        let (counter, kind) = if remote {
            (&local.faults_remote, FaultKind::Remote)
        } else {
            (&local.faults_map_existing, FaultKind::MappedExisting)
        };
        SpaceCounters::add(counter, 1);
        Ok(FaultResolution { kind, pages: 1 })
    }

    /// Migrate the page to the fault's target memory, then map it into the faulter's
    /// table and count it.
    #[inline(always)]
    fn migrate_and_map(
        &mut self,
        fs: &mut FaultState<'_, '_>,
    ) -> Result<FaultResolution, FaultError> {
        let (cx, space, vpn) = (fs.cx, fs.space, fs.vpn);
        self.migrate_page(cx, space, vpn, fs.target, fs.asker())?;
        fs.entry = self.store.lpt.get(vpn);
        self.map_for_fault(cx.counters, fs.t, vpn, fs.entry, fs.piece)?;
        SpaceCounters::add(&self.local().faults_migrate, 1);
        Ok(FaultResolution {
            kind: FaultKind::Migrated,
            pages: 1,
        })
    }

    /// The page is mapped in the faulter's table already: a stale TLB entry faulted.
    /// Invalidate it and count it.
    #[inline(always)]
    fn spurious(&mut self, fs: &mut FaultState<'_, '_>) -> Result<FaultResolution, FaultError> {
        let runs = [crate::space::TableRun {
            table: fs.t,
            range: crate::addr::VaRange {
                start: fs.vpn.addr(),
                len: PAGE_SIZE,
            },
        }];
        // A batch being serviced issues its stale-TLB invalidations once (`batch`).
        match self.xlat.deferred_spurious.as_mut() {
            Some(owed) => owed.extend_from_slice(&runs),
            None => self.invalidate(fs.cx.counters, &runs),
        }
        SpaceCounters::add(&self.local().faults_spurious, 1);
        Ok(FaultResolution {
            kind: FaultKind::Spurious,
            pages: 0,
        })
    }

    /// The memory a placement target names for a faulting device (host memory is
    /// borrowed from the context and the faulter's own from the caller: no
    /// reference-count round trip for either).
    #[inline(always)]
    pub(crate) fn target_of<'c>(
        &self,
        cx: &Ctx<'c>,
        dev: &'c Arc<DeviceInner>,
        target: PlacementTarget,
    ) -> TargetMemory<'c> {
        match target {
            PlacementTarget::Host => TargetMemory::Borrowed(cx.host),
            PlacementTarget::Device(id) => named_target(cx, id),
            PlacementTarget::Faulting => TargetMemory::Borrowed(own_memory(cx, dev)),
        }
    }

    /// Give the unpopulated faulting page a zeroed frame in the fault's target memory
    /// and map it — with the whole aligned block of `g` pages around it when the block
    /// lies in the page's region, none of its pages is populated and a frame block is
    /// free — and count it.
    #[inline(always)]
    fn zero_fill(
        &mut self,
        fs: &mut FaultState<'_, '_>,
        g: u64,
    ) -> Result<FaultResolution, MoveError> {
        let (cx, space, t, vpn, piece) = (fs.cx, fs.space, fs.t, fs.vpn, fs.piece);
        let (rfirst, rend) = fs.region;
        let target = fs.target;
        let asker = fs.asker();
        let stats = cx.counters;
        let g = g.max(1);
        let b0 = vpn.align_down(g);
        let whole = g > 1
            && b0 >= rfirst
            && b0 + g <= rend
            && self.store.lpt.entries_in(b0, g).next().is_none();
        let mem = self
            .store
            .mem_index(target)
            .map_err(|_| MoveError::TooManyMemories(target.id))?;
        // A block inside one reservation-sized block goes through the reservations (a
        // 2 MiB block is one aligned run; a smaller one lands at its offset of its
        // 2 MiB block's reservation); a larger one is one aligned run.
        let block = if whole {
            let ask = FrameAsk::run(space.id, b0, g, g, asker);
            self.frames(cx, Some(space), target, ask).ok()
        } else {
            None
        };
        // The pages first, then the run bound once (no tuple holding the run: its
        // moves cost a copy each on the 4 KiB path).
        let (first, pages) = if block.is_some() { (b0, g) } else { (vpn, 1) };
        let run = match block {
            Some(run) => run,
            None => self.frames(
                cx,
                Some(space),
                target,
                FrameAsk::page(space.id, vpn, asker),
            )?,
        };
        let pfn = run.pfn();
        let memory = target
            .memory
            .as_ref()
            .ok_or(MoveError::OutOfMemory(target.id))?;
        memory.zero(pfn.addr(), pages << PAGE_SHIFT)?;
        let fresh = |k: u64| PageEntry {
            pfn: pfn + k,
            mem,
            ..PageEntry::EMPTY
        };
        let replicas = self.xlat.replica_mask();
        if pages == 1 && !self.has_large(t) {
            // The 4 KiB fault of a table without large leaves (no block to complete):
            // map first, then write the entry once, populated and mapped. A failed map
            // left nothing to undo (the entry was never written; dropping the run frees
            // the frame). Everything else sees the same state as below: both happen
            // under the space lock, and the mirror reads the written entry.
            self.install_small(t, first, 1, pfn, target.id, piece)?;
            fs.entry = PageEntry {
                mapped: 1 << t,
                ..fresh(0)
            };
            self.store.lpt.set_populated(first, fs.entry);
            if let Err(e) = self.mirror(stats, first, 1, replicas) {
                self.unpopulate(stats, first, 1);
                return Err(e.into());
            }
            return Ok(self.zero_filled(run, 1));
        }
        self.store
            .lpt
            .update_run(first, pages, |v, e| *e = fresh(v.0 - first.0));
        let mapped = if pages == 1 {
            // A single page may complete its block: map the block large then.
            self.map_for_fault(stats, t, first, fresh(0), piece)
                .map(|_| ())
        } else {
            self.map_run(
                stats,
                t,
                BackedRun {
                    first,
                    pages,
                    pfn,
                    mem,
                },
                piece,
            )
        };
        if let Err(e) = mapped.and_then(|()| self.mirror(stats, first, pages, replicas)) {
            self.unpopulate(stats, first, pages);
            return Err(e.into());
        }
        fs.entry = self.store.lpt.get(vpn);
        Ok(self.zero_filled(run, pages))
    }

    /// Commit a zero-fill's frames to their pages, count it, and say so.
    #[inline]
    fn zero_filled(&mut self, run: FrameRun<'_>, pages: u64) -> FaultResolution {
        run.commit();
        let local = self.local();
        SpaceCounters::add(&local.pages_zeroed, pages);
        SpaceCounters::add(&local.faults_zero_fill, 1);
        FaultResolution {
            kind: FaultKind::ZeroFill,
            pages,
        }
    }

    /// Undo the population of fresh pages `[first, first + pages)` whose frames are
    /// still an uncommitted [`FrameRun`]: unmap them from every table that got them
    /// (invalidating) and forget their entries; dropping the run then frees the frames.
    fn unpopulate(&mut self, stats: &Counters, first: Vpn, pages: u64) {
        self.unmap_pages(stats, first, pages, u32::MAX);
        self.store
            .lpt
            .update_run(first, pages, |_, e| *e = PageEntry::EMPTY);
    }

    /// Move page `vpn` to `target` (migration under unique or on the remote hint).
    fn migrate_page(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        vpn: Vpn,
        target: &Arc<DeviceInner>,
        asker: Requester,
    ) -> Result<(), MoveError> {
        let new = self.frames(
            cx,
            Some(space),
            target,
            FrameAsk::page(space.id, vpn, asker),
        )?;
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
        new: FrameRun<'_>,
    ) -> Result<(), MoveError> {
        self.move_run(cx, vpn, 1, to, new)
    }

    /// Move the `pages` pages from `first` — populated, in one memory, on the
    /// physically contiguous frames from the first page's, none wired or pending — to
    /// the frame run `new` of `to`: one unmap (and one invalidation per device), one
    /// [`crate::DeviceMemory::copy`], one mirror. On a copy failure nothing moved (the
    /// dropped mappings fault back in) and `new` is freed.
    pub(super) fn move_run(
        &mut self,
        cx: &Ctx<'_>,
        first: Vpn,
        pages: u64,
        to: &Arc<DeviceInner>,
        new: FrameRun<'_>,
    ) -> Result<(), MoveError> {
        let stats = cx.counters;
        let e = self.store.lpt.get(first);
        let from = self.store.memories.get(e.mem).clone();
        let mem = self
            .store
            .mem_index(to)
            .map_err(|_| MoveError::TooManyMemories(to.id))?;
        self.unmap_pages(stats, first, pages, u32::MAX);
        copy_run(&from, e.pfn, to, new.pfn(), pages)?;
        let new = new.commit();
        if pages > 1 && e.mem != crate::lpt::NO_MEM && !e.has(crate::lpt::EXTERNAL) {
            // The run's frames are consecutive in one memory: one release.
            from.phys.lock().free_run(e.pfn, pages);
        } else {
            for k in 0..pages {
                let old = self.store.lpt.get(first.add(k));
                self.store.release_frame(&old, false);
            }
        }
        for k in 0..pages {
            let v = first.add(k);
            self.store.lpt.update(v, |x| {
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
        let replicas = self.xlat.replica_mask();
        self.mirror(stats, first, pages, replicas)?;
        Ok(())
    }

    /// Pages from `vpn` (at most `max`) that [`SpaceState::move_run`] can move as one
    /// run: populated, not wired, in the memory of `vpn`'s entry, on consecutive frames.
    pub(super) fn movable_run(&self, vpn: Vpn, max: u64) -> u64 {
        let e = self.store.lpt.get(vpn);
        let mut n = 1;
        while n < max {
            let x = self.store.lpt.get(vpn.add(n));
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
            .store
            .mem_index(target)
            .map_err(|_| MoveError::TooManyMemories(target.id))?;
        let asker = Requester {
            device: None,
            attrs: self.attrs_at(vpn),
        };
        let run = self.frames(
            cx,
            Some(space),
            target,
            FrameAsk::page(space.id, vpn, asker),
        )?;
        let pfn = run.pfn();
        let memory = target
            .memory
            .as_ref()
            .ok_or(MoveError::OutOfMemory(target.id))?;
        memory.zero(pfn.addr(), PAGE_SIZE)?;
        self.store.lpt.set_populated(
            vpn,
            PageEntry {
                pfn,
                mem,
                ..PageEntry::EMPTY
            },
        );
        let replicas = self.xlat.replica_mask();
        if let Err(e) = self.mirror(cx.counters, vpn, 1, replicas) {
            self.unpopulate(cx.counters, vpn, 1);
            return Err(e.into());
        }
        run.commit();
        SpaceCounters::add(&self.local().pages_zeroed, 1);
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
        if self.store.any_pending(first, pages) {
            self.drain(cx.counters, &space.arena);
        }
        let mut done = 0;
        let end = first.add(pages);
        let mut vpn = first;
        while vpn < end {
            let e = self.store.lpt.get(vpn);
            if e.is_populated() {
                if SpaceState::is_wired(&e) || self.store.memories.get(e.mem).id == target.id {
                    vpn = vpn.add(1);
                    continue;
                }
                // A physically contiguous run moves in one call when the target has a
                // free run as long; otherwise page by page (evicting as needed).
                // Runs stop at 2 MiB block boundaries, so that a run lands in its
                // block's reservation; one run, one frame request: its pages must share
                // their attributes.
                let asker = Requester {
                    device: None,
                    attrs: self.attrs_at(vpn),
                };
                let to_block = MOVE_RUN_MAX - (vpn.0 & (MOVE_RUN_MAX - 1));
                let n = self.movable_run(vpn, (end.0 - vpn.0).min(to_block));
                let n = if n > 1 && self.same_attrs(vpn, n) {
                    n
                } else {
                    1
                };
                if n > 1 {
                    let ask = FrameAsk::run(space.id, vpn, n, 1, asker);
                    if let Ok(run) = self.frames(cx, Some(space), target, ask) {
                        self.move_run(cx, vpn, n, target, run)?;
                        done += n;
                        vpn = vpn.add(n);
                        continue;
                    }
                }
                self.migrate_page(cx, space, vpn, target, asker)?;
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

/// The memory a placement target names ([`SpaceState::target_of`]): host memory or
/// the faulting device's own, borrowed from whoever keeps it alive (the context, the
/// caller of the fault), or another device's, held by a reference of its own.
pub(crate) enum TargetMemory<'c> {
    Borrowed(&'c Arc<DeviceInner>),
    Device(Arc<DeviceInner>),
}

impl core::ops::Deref for TargetMemory<'_> {
    type Target = Arc<DeviceInner>;
    fn deref(&self) -> &Arc<DeviceInner> {
        match self {
            TargetMemory::Borrowed(b) => b,
            TargetMemory::Device(d) => d,
        }
    }
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

/// [`SpaceState::target_of`] for a named device (a registry lookup, out of line): its
/// memory if it has some and is not the host, host memory otherwise.
#[inline(never)]
fn named_target<'c>(cx: &Ctx<'c>, id: DeviceId) -> TargetMemory<'c> {
    match cx.device(id) {
        Some(d) if d.has_memory() && !Arc::ptr_eq(&d, cx.host) => TargetMemory::Device(d),
        _ => TargetMemory::Borrowed(cx.host),
    }
}

/// The memory that is `dev`'s own: its local memory, or host memory for a device
/// without one (no reference-count traffic: the fault path asks this per fault).
#[inline]
fn own_memory<'c>(cx: &Ctx<'c>, dev: &'c Arc<DeviceInner>) -> &'c Arc<DeviceInner> {
    if dev.has_memory() {
        dev
    } else {
        cx.host
    }
}
