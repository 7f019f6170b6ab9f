//! Large leaves: when the core asks a driver for a 2 MiB (or 1 GiB, 64 KiB) leaf, what
//! it remembers of the leaves it asked for, splits, and promotion.
//!
//! ## When a leaf is large
//! [`SpaceState::map_run`] installs a physically contiguous run into one table. It
//! cuts the run into pieces: a block of `n` pages (a size the table's MMU reports in
//! [`crate::Mmu::page_sizes`], largest first) becomes one large leaf exactly when
//! - the virtual block is aligned to `n` pages and lies whole inside the run;
//! - the frame behind its first page is aligned to `n` frames (the run is contiguous
//!   in one memory, so the whole block is one aligned physical block);
//! - the block lies inside one region (the region's protection is uniform over it).
//!
//! Every other page is a 4 KiB piece. Each piece is one [`crate::MapRun`] with its
//! `page_size`; a table whose MMU reports larger sizes counts, for every block of its
//! smallest large size that a 4 KiB piece touches, one fallback and why
//! ([`crate::Stats`]): the run did not cover the block (`large_fallback_partial`), the
//! frames were not aligned (`large_fallback_unaligned`), or the block crosses a region
//! boundary (`large_fallback_region`).
//!
//! ## What the core remembers
//! `LargeLeaves`: per table, the first page and the size of every large leaf it asked
//! for. A later unmap or protect of a range that covers a leaf in part is a *split*:
//! the driver replaces the leaf by smaller ones that translate every page as before
//! (see [`crate::mmu`] for the driver's side), and the core forgets the leaf (the
//! block's pages are then mapped by 4 KiB leaves as far as the core is concerned) and
//! counts it (`large_splits`). An unmap covering a leaf whole just forgets it; a
//! protect covering it whole keeps it. `check_invariants` checks every record against
//! the logical page table: the block populated, mapped by that table, on aligned
//! contiguous frames of one memory, inside one region, and the size one the table
//! reports.
//!
//! ## Promotion
//! - *Opportunistic*: a fault that maps a page whose whole block (2 MiB at most) is
//!   populated on one aligned contiguous frame block — typically the fault that fills
//!   a reservation (`physmem` reserve) — maps the block with one large leaf, after
//!   removing the faulter's 4 KiB mappings of it (`promotions`).
//! - *Explicit* ([`crate::Gmem::region_promote`], khugepaged's collapse): every
//!   2 MiB block of a region whose pages are all populated (none wired or
//!   caller-given) is gathered onto one aligned frame block — its reservation's when
//!   it has one, a fresh aligned block otherwise — by copying the pages that are not
//!   there yet (`promotion_pages_moved`), and remapped large.

use super::segments::Piece;
use super::tables::BackedRun;
use super::{LargeLeaf, PlacementMode, SpaceInner, SpaceState, TableRun};
use crate::addr::{PageSize, Pfn, VaRange, VirtAddr, Vpn, PAGE_SHIFT};
use crate::device::DeviceInner;
use crate::error::MoveError;
use crate::handle::DeviceId;
use crate::lpt::{PageEntry, EXTERNAL, PENDING, WIRED};
use crate::mmu::{MapRun, MmuError};
use crate::physmem::{RunRequest, RESERVATION_PAGES};
use crate::space::violation::{fail, Violation};
use crate::space::Ctx;
use crate::stats::{Counters, SpaceCounters};
use crate::sync::Arc;
use alloc::vec::Vec;

/// Pages of the blocks explicit and opportunistic promotion make (2 MiB).
const PROMOTE_PAGES: u64 = RESERVATION_PAGES;

/// One span of a run: `pages` pages from `first` as leaves of `size`.
#[derive(Clone, Copy)]
struct LeafSpan {
    first: u64,
    pages: u64,
    size: PageSize,
}

/// Why a block was mapped by 4 KiB leaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fallback {
    Partial,
    Unaligned,
    Region,
}

impl SpaceState {
    /// The large sizes (pages, size) table `t` maps, largest first.
    fn large_sizes(&self, t: usize) -> Vec<(u64, PageSize)> {
        let Some(table) = self.xlat.tables[t].as_ref() else {
            return Vec::new();
        };
        let sizes = table.sizes;
        PageSize::ALL
            .iter()
            .rev()
            .filter(|s| **s != PageSize::Size4K && sizes.supports(**s))
            .map(|s| (s.base_pages(), *s))
            .collect()
    }

    /// Whether table `t` maps any leaf larger than 4 KiB (no allocation: the fault
    /// path asks this for every page).
    #[inline]
    pub(super) fn has_large(&self, t: usize) -> bool {
        self.xlat.tables[t]
            .as_ref()
            .is_some_and(|x| !(x.sizes - crate::flags::PageSizes::S4K).is_empty())
    }

    /// Whether `[first, first + pages)` lies inside one region.
    fn in_one_region(&self, first: u64, pages: u64) -> bool {
        self.region_at(first << PAGE_SHIFT)
            .is_some_and(|(s, r)| ((first + pages) << PAGE_SHIFT) <= s + r.len)
    }

    /// Cut a run into pieces (see the module documentation), with the fallbacks.
    fn plan(
        &self,
        t: usize,
        first: u64,
        pages: u64,
        pfn: Pfn,
    ) -> (Vec<LeafSpan>, Vec<(u64, Fallback)>) {
        let larges = self.large_sizes(t);
        let end = first + pages;
        let mut out: Vec<LeafSpan> = Vec::new();
        let push = |out: &mut Vec<LeafSpan>, v: u64, n: u64, size: PageSize| match out.last_mut() {
            Some(p) if p.size == size && p.first + p.pages == v => p.pages += n,
            _ => out.push(LeafSpan {
                first: v,
                pages: n,
                size,
            }),
        };
        let mut v = first;
        while v < end {
            let frame = pfn.0 + (v - first);
            let fit = larges.iter().find(|(n, _)| {
                v % n == 0
                    && frame % n == 0
                    && v + n <= end
                    && self.in_one_region(v, *n)
                    && self.same_flags(v, *n)
            });
            match fit {
                Some((n, size)) => {
                    push(&mut out, v, *n, *size);
                    v += n;
                }
                None => {
                    push(&mut out, v, 1, PageSize::Size4K);
                    v += 1;
                }
            }
        }
        let mut fallbacks: Vec<(u64, Fallback)> = Vec::new();
        if let Some(&(n, _)) = larges.last() {
            for p in out.iter().filter(|p| p.size == PageSize::Size4K) {
                let mut b = p.first & !(n - 1);
                while b < p.first + p.pages {
                    if fallbacks.last().map(|f| f.0) != Some(b) {
                        let why = if b < first || b + n > end {
                            Fallback::Partial
                        } else if !self.in_one_region(b, n) {
                            Fallback::Region
                        } else {
                            Fallback::Unaligned
                        };
                        fallbacks.push((b, why));
                    }
                    b += n;
                }
            }
        }
        (out, fallbacks)
    }

    /// Install the pages of `run` into table `t`, with large leaves where allowed; on failure nothing of the run stays mapped
    /// (pieces installed before the failing one are unmapped and invalidated). The
    /// caller records the mapping bits.
    ///
    /// The common case — a table of 4 KiB leaves only, one run, one driver call — is
    /// inlined into its callers (every 4 KiB fault comes here); a table with large
    /// leaves plans its pieces out of line.
    #[inline(always)]
    pub(crate) fn install_run(
        &mut self,
        stats: &Counters,
        t: usize,
        run: BackedRun,
        piece: Piece,
    ) -> Result<(), MmuError> {
        if self.has_large(t) {
            return self.install_pieces(stats, t, run, piece);
        }
        let memory = self.store.memories.get(run.mem).id;
        self.install_small(t, run.first, run.pages, run.pfn, memory, piece)
    }

    /// [`SpaceState::install_run`] into table `t` when the caller knows the table has
    /// no large leaves (`!has_large(t)`): one driver call with 4 KiB leaves, counted.
    /// `memory` is the id of the memory holding the frames (the caller has it at hand:
    /// no lookup of the space's memory list).
    #[inline(always)]
    pub(crate) fn install_small(
        &mut self,
        t: usize,
        first: Vpn,
        pages: u64,
        pfn: Pfn,
        memory: DeviceId,
        piece: Piece,
    ) -> Result<(), MmuError> {
        let table = self.xlat.tables[t]
            .as_ref()
            .expect("mapping into a live table");
        let run = MapRun {
            va: first.addr(),
            pa: pfn.addr(),
            len: pages << PAGE_SHIFT,
            prot: piece.prot,
            page_size: PageSize::Size4K,
            memory,
            attrs: piece.attrs,
        };
        table.mmu.map(table.root, &run)?;
        SpaceCounters::add(&self.local().mmu_maps, 1);
        Ok(())
    }

    /// [`SpaceState::install_run`] into a table with large leaves: the run cut into
    /// pieces (`plan`), one driver call per piece.
    #[inline(never)]
    fn install_pieces(
        &mut self,
        stats: &Counters,
        t: usize,
        run: BackedRun,
        piece: Piece,
    ) -> Result<(), MmuError> {
        let BackedRun {
            first,
            pages,
            pfn,
            mem,
        } = run;
        let memory = self.store.memories.get(mem).id;
        let table = self.xlat.tables[t]
            .as_ref()
            .expect("mapping into a live table");
        let (mmu, root) = (table.mmu.clone(), table.root);
        let (pieces, fallbacks) = self.plan(t, first.0, pages, pfn);
        for (i, p) in pieces.iter().enumerate() {
            let run = MapRun {
                va: Vpn(p.first).addr(),
                pa: pfn.add(p.first - first.0).addr(),
                len: p.pages << PAGE_SHIFT,
                prot: piece.prot,
                page_size: p.size,
                memory,
                attrs: piece.attrs,
            };
            if let Err(e) = mmu.map(root, &run) {
                let done: Vec<TableRun> = pieces[..i]
                    .iter()
                    .map(|q| TableRun {
                        table: t,
                        range: VaRange {
                            start: Vpn(q.first).addr(),
                            len: q.pages << PAGE_SHIFT,
                        },
                    })
                    .collect();
                for r in &done {
                    mmu.unmap(root, r.range);
                    Counters::add(&stats.mmu_unmaps, 1);
                }
                self.invalidate(stats, &done);
                return Err(e);
            }
            SpaceCounters::add(&self.local().mmu_maps, 1);
        }
        for p in pieces.iter().filter(|p| p.size != PageSize::Size4K) {
            let n = p.size.base_pages();
            for k in 0..p.pages / n {
                self.xlat.large.insert(p.first + k * n, t, n);
            }
            Counters::add(&stats.large_maps, p.pages / n);
        }
        for (_, why) in fallbacks {
            let c = match why {
                Fallback::Partial => &stats.large_fallback_partial,
                Fallback::Unaligned => &stats.large_fallback_unaligned,
                Fallback::Region => &stats.large_fallback_region,
            };
            Counters::add(c, 1);
        }
        Ok(())
    }

    /// `runs` are being unmapped: forget the large leaves they touch, counting those
    /// they cover only in part as splits.
    pub(crate) fn large_unmapped(&mut self, stats: &Counters, runs: &[TableRun]) {
        if self.xlat.large.is_empty() {
            return;
        }
        for r in runs {
            let (first, pages) = (r.range.start.vpn().0, r.range.len >> PAGE_SHIFT);
            for (s, n) in self.xlat.large.overlapping(r.table, first, pages) {
                self.xlat.large.remove(s, r.table);
                if s < first || s + n > first + pages {
                    Counters::add(&stats.large_splits, 1);
                }
            }
        }
    }

    /// `runs` are being protected: forget (and count as splits) the large leaves they
    /// cover only in part. Returns those leaves as (table, first page, pages).
    pub(crate) fn large_protected(
        &mut self,
        stats: &Counters,
        runs: &[TableRun],
    ) -> Vec<(usize, u64, u64)> {
        let mut split = Vec::new();
        if self.xlat.large.is_empty() {
            return split;
        }
        for r in runs {
            let (first, pages) = (r.range.start.vpn().0, r.range.len >> PAGE_SHIFT);
            for (s, n) in self.xlat.large.overlapping(r.table, first, pages) {
                if s < first || s + n > first + pages {
                    self.xlat.large.remove(s, r.table);
                    Counters::add(&stats.large_splits, 1);
                    split.push((r.table, s, n));
                }
            }
        }
        split
    }

    /// Whether the `n`-page block from `b` is populated on aligned contiguous frames of
    /// one memory, none pending, all with the flags of its first page; the block's
    /// first entry if so.
    fn contiguous_block(&self, b: u64, n: u64) -> Option<PageEntry> {
        let e0 = self.store.lpt.get(Vpn(b));
        let last = self.store.lpt.get(Vpn(b + n - 1));
        if !e0.is_populated()
            || e0.pfn.0 % n != 0
            || !last.is_populated()
            || last.mem != e0.mem
            || last.pfn.0 != e0.pfn.0 + n - 1
        {
            return None;
        }
        let mut count = 0;
        for (v, e) in self.store.lpt.entries_in(Vpn(b), n) {
            if !e.is_populated()
                || e.mem != e0.mem
                || e.pfn.0 != e0.pfn.0 + (v.0 - b)
                || e.has(PENDING)
                || e.flags != e0.flags
            {
                return None;
            }
            count += 1;
        }
        (count == n).then_some(e0)
    }

    /// Map page `vpn` (populated, entry `e`) into table `t` for a fault: the whole
    /// block around it with one large leaf when the block qualifies (see the module
    /// documentation; the faulter's 4 KiB mappings of the block are removed first, a
    /// promotion), the page alone otherwise. Returns the pages mapped.
    pub(crate) fn map_for_fault(
        &mut self,
        stats: &Counters,
        t: usize,
        vpn: Vpn,
        e: PageEntry,
        piece: Piece,
    ) -> Result<u64, MmuError> {
        if let Some((b, n)) = self.fault_block(t, vpn) {
            let mine: Vec<(Vpn, u32)> = self
                .store
                .lpt
                .entries_in(Vpn(b), n)
                .filter(|(_, x)| x.mapped & (1 << t) != 0)
                .map(|(v, _)| (v, 1u32 << t))
                .collect();
            if !mine.is_empty() {
                self.unmap_entries(stats, &mine);
                Counters::add(&stats.promotions, 1);
            }
            let e0 = self.store.lpt.get(Vpn(b));
            match self.map_run(stats, t, BackedRun::from_entry(Vpn(b), n, &e0), piece) {
                Ok(()) => return Ok(n),
                Err(err) => {
                    // Put the faulter's pages back as they were (best effort: the
                    // error is the map's), then fail like a 4 KiB map would.
                    let pages: Vec<Vpn> = mine.iter().map(|(v, _)| *v).collect();
                    for v in pages {
                        let x = self.store.lpt.get(v);
                        let _ = self.map_run(stats, t, BackedRun::from_entry(v, 1, &x), piece);
                    }
                    return Err(err);
                }
            }
        }
        self.map_run(stats, t, BackedRun::from_entry(vpn, 1, &e), piece)?;
        Ok(1)
    }

    /// The block (first page, pages) a fault on `vpn` may map with one large leaf in
    /// table `t`, if any: the largest size of the table up to 2 MiB whose aligned block
    /// around `vpn` lies in one region, is populated on aligned contiguous frames of
    /// one memory, is not yet mapped large there, and — under the unique policy, for
    /// pages that are not wired — is mapped by no other table but replicas.
    fn fault_block(&self, t: usize, vpn: Vpn) -> Option<(u64, u64)> {
        if !self.has_large(t) {
            return None;
        }
        let unique = self
            .region_at(vpn.addr().as_u64())
            .is_some_and(|(_, r)| r.placement.mode == PlacementMode::Unique);
        let replicas = self.xlat.replica_mask();
        for (n, _) in self.large_sizes(t) {
            if n > PROMOTE_PAGES {
                continue;
            }
            let b = vpn.0 & !(n - 1);
            if !self.in_one_region(b, n)
                || self.xlat.large.contains(b, t)
                || !self.uniform_piece(b, n)
            {
                continue;
            }
            let Some(e0) = self.contiguous_block(b, n) else {
                continue;
            };
            if unique && !e0.has(WIRED) {
                let others = self
                    .store
                    .lpt
                    .entries_in(Vpn(b), n)
                    .any(|(_, x)| x.mapped & !(1 << t) & !replicas != 0);
                if others {
                    continue;
                }
            }
            return Some((b, n));
        }
        None
    }

    /// Whether every page of the block of `n` pages from `b` has the same entry flags
    /// (wired or not, caller's frame or not): one large leaf covers pages of one state.
    fn same_flags(&self, b: u64, n: u64) -> bool {
        let f0 = self.store.lpt.get(Vpn(b)).flags;
        self.store
            .lpt
            .entries_in(Vpn(b), n)
            .all(|(_, e)| e.flags == f0)
    }

    /// Whether the block of `n` pages from `b` has one protection (not none) and one
    /// attribute value: a large leaf carries one of each.
    fn uniform_piece(&self, b: u64, n: u64) -> bool {
        match self.region_at(b << PAGE_SHIFT) {
            Some((_, r)) => self
                .map
                .uniform(r.piece(), Vpn(b), n)
                .is_some_and(|p| !p.prot.is_empty()),
            None => false,
        }
    }

    /// Gather every 2 MiB block of `[first, first + pages)` that is wholly populated
    /// (no page wired, caller-given or pending) onto one aligned frame block in the
    /// memory of its first page and remap it large. Returns the blocks promoted.
    pub(crate) fn promote_range(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        first: Vpn,
        pages: u64,
    ) -> Result<u64, MoveError> {
        if self.store.any_pending(first, pages) {
            self.drain(cx.counters, &space.arena);
        }
        let n = PROMOTE_PAGES;
        let mut b = (first.0 + n - 1) & !(n - 1);
        let mut done = 0;
        while b + n <= first.0 + pages {
            if self.promote_block(cx, space, b)? {
                done += 1;
            }
            b += n;
        }
        Ok(done)
    }

    /// [`SpaceState::promote_range`] of one block; whether it was promoted.
    fn promote_block(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        b: u64,
    ) -> Result<bool, MoveError> {
        let stats = cx.counters;
        let n = PROMOTE_PAGES;
        let entries: Vec<(Vpn, PageEntry)> = self.store.lpt.entries_in(Vpn(b), n).collect();
        if entries.len() as u64 != n
            || entries
                .iter()
                .any(|(_, e)| !e.is_populated() || e.has(WIRED | EXTERNAL | PENDING))
        {
            return Ok(false);
        }
        let mask = entries.iter().fold(0u32, |m, (_, e)| m | e.mapped);
        let replicas = self.xlat.replica_mask();
        // One protection and one attribute value over the block (a split region's
        // pieces may cut it).
        let piece = match self.region_at(b << PAGE_SHIFT) {
            Some((_, r)) if self.in_one_region(b, n) => {
                match self.map.uniform(r.piece(), Vpn(b), n) {
                    Some(p) if !p.prot.is_empty() => p,
                    _ => return Ok(false),
                }
            }
            _ => return Ok(false),
        };
        let contiguous = self.contiguous_block(b, n).is_some();
        let large_everywhere = (0..self.xlat.tables.len())
            .filter(|t| mask & (1 << t) != 0)
            .all(|t| {
                // A table with no leaf size up to the block's has nothing to gain.
                self.large_sizes(t).iter().all(|(m, _)| *m > n) || self.xlat.large.contains(b, t)
            });
        if contiguous && large_everywhere {
            return Ok(false);
        }
        let dev = self.store.memories.get(entries[0].1.mem).clone();
        self.unmap_pages(stats, Vpn(b), n, u32::MAX);
        let gathered = match contiguous {
            true => Ok(()),
            false => self.gather(cx, space, &dev, b, &entries),
        };
        if let Err(err) = gathered {
            // Each page is whole where it is: the replicate tables get the block back
            // (best effort: the error returned is the gather's), the others fault.
            let _ = self.mirror(stats, Vpn(b), n, replicas);
            return Err(err);
        }
        // Remap: replicate tables (and wired-eager ones, which hold no page here since
        // none is wired) through the mirror; faultable tables only when one of them
        // mapped the block (under the unique policy several may not share it).
        let others = mask & !replicas;
        let remap = if others.count_ones() <= 1 || !self.unique_at(b) {
            others
        } else {
            0
        };
        let e0 = self.store.lpt.get(Vpn(b));
        let mirrored = self.mirror(stats, Vpn(b), n, replicas);
        for t in 0..self.xlat.tables.len() {
            if remap & (1 << t) != 0 && self.xlat.tables[t].is_some() {
                // A failure leaves the block unmapped in that table: it faults back.
                self.map_run(stats, t, BackedRun::from_entry(Vpn(b), n, &e0), piece)?;
            }
        }
        mirrored?;
        Counters::add(&stats.promotions, 1);
        Ok(true)
    }

    fn unique_at(&self, b: u64) -> bool {
        self.region_at(b << PAGE_SHIFT)
            .is_some_and(|(_, r)| r.placement.mode == PlacementMode::Unique)
    }

    /// Move the pages of block `b` (`entries`, all populated, unmapped everywhere) onto
    /// one aligned frame block of `dev`: its reservation when the memory holds one for
    /// the block (pages already at their offset stay), a fresh aligned block otherwise.
    fn gather(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        dev: &Arc<DeviceInner>,
        b: u64,
        entries: &[(Vpn, PageEntry)],
    ) -> Result<(), MoveError> {
        let stats = cx.counters;
        let n = PROMOTE_PAGES;
        let mem = self
            .store
            .mem_index(dev)
            .map_err(|_| MoveError::TooManyMemories(dev.id))?;
        // Where the driver wants the block's frames (a preference is kept to, here:
        // promotion is optional) and their page-group class.
        let asker = super::frames::Requester {
            device: None,
            attrs: self.attrs_at(Vpn(b)),
        };
        let placed = super::frames::frame_placement(dev, space.id, Vpn(b), n, asker);
        let limit = match placed.placement {
            crate::mmu::FramePlacement::Any => None,
            crate::mmu::FramePlacement::Require(c) | crate::mmu::FramePlacement::Prefer(c) => {
                Some(c)
            }
            crate::mmu::FramePlacement::PreferOrClass { prefer, .. } => Some(prefer),
        };
        let class = placed.class;
        // A reservation of this block in `dev`: the frame a single page gets is at its
        // offset of the reservation's block.
        let reserved_base = dev
            .phys
            .lock()
            .reservation_of(space.id, Vpn(b))
            .map(|p| p.0);
        let fresh = match reserved_base {
            Some(_) => None,
            None => Some(
                dev.alloc_frames(RunRequest {
                    pages: n,
                    align: n,
                    space: space.id,
                    vpn: Vpn(b),
                    limit,
                    class,
                })
                .ok_or(MoveError::OutOfMemory(dev.id))?
                .commit(),
            ),
        };
        let base = reserved_base
            .or(fresh.map(|p| p.0))
            .expect("one of the two");
        let mut moved = 0;
        let mut result = Ok(());
        for (k, (v, e)) in entries.iter().enumerate() {
            let want = Pfn(base + k as u64);
            if e.mem == mem && e.pfn == want {
                continue;
            }
            if fresh.is_none() {
                // From the reservation: the page's own reserved frame.
                match dev.alloc_pages(RunRequest::page(space.id, *v, limit, class)) {
                    Some(run) if run.pfn() == want => {
                        let _ = run.commit();
                    }
                    _ => {
                        result = Err(MoveError::OutOfMemory(dev.id));
                        break;
                    }
                }
            }
            let from = self.store.memories.get(e.mem).clone();
            if let Err(err) = super::fault::copy_run(&from, e.pfn, dev, want, 1) {
                if fresh.is_none() {
                    dev.phys.lock().free(want);
                }
                result = Err(err.into());
                break;
            }
            self.store.release_frame(e, false);
            self.store.lpt.update(*v, |x| {
                x.mem = mem;
                x.pfn = want;
            });
            moved += 1;
        }
        if let Some(f) = fresh {
            // Frames of the fresh block no page moved to (a page already there, or
            // a failure) go back.
            let mut phys = dev.phys.lock();
            for k in 0..n {
                let v = Vpn(b + k);
                let x = self.store.lpt.get(v);
                if !(x.mem == mem && x.pfn == f.add(k)) {
                    phys.free(f.add(k));
                }
            }
        }
        Counters::add(&stats.promotion_pages_moved, moved);
        result
    }

    /// Call `f(va, memory, pa)` for every populated page of `[first, first + pages)`.
    pub(crate) fn frames_in(
        &self,
        first: Vpn,
        pages: u64,
        f: &mut impl FnMut(VirtAddr, crate::handle::DeviceId, crate::addr::PhysAddr),
    ) {
        for (v, e) in self.store.lpt.entries_in(first, pages) {
            if e.is_populated() {
                f(v.addr(), self.store.memories.get(e.mem).id, e.pfn.addr());
            }
        }
    }

    /// Every large leaf of the space.
    pub(crate) fn large_leaves(&self) -> Vec<LargeLeaf> {
        self.xlat.large_leaves()
    }

    /// The large-leaf invariants (see the module documentation).
    /// Before a change of page state (wiring) over `[first, first + pages)` that a
    /// large leaf must not straddle: every large leaf covering the range only in part
    /// is unmapped from its table (faultable users fault the pages back with 4 KiB
    /// leaves), so that every large leaf keeps covering pages of one state. Returns the
    /// blocks broken, `(table, first page, pages)`: once the state changed, the caller
    /// gives replicate tables their pages back ([`SpaceState::remirror_broken`]).
    pub(crate) fn break_straddling_large(
        &mut self,
        stats: &Counters,
        first: Vpn,
        pages: u64,
    ) -> Vec<(usize, u64, u64)> {
        let end = first.0 + pages;
        let mut broken = Vec::new();
        for t in 0..self.xlat.tables.len() {
            for (s, n) in self.xlat.large.overlapping(t, first.0, pages) {
                if s < first.0 || s + n > end {
                    self.unmap_pages(stats, Vpn(s), n, 1 << t);
                    Counters::add(&stats.large_splits, 1);
                    broken.push((t, s, n));
                }
            }
        }
        broken
    }

    /// Give the replicate tables among `broken` their pages back (with leaves that
    /// fit the pages' states now).
    ///
    /// # Errors
    /// The driver's [`MmuError`].
    pub(crate) fn remirror_broken(
        &mut self,
        stats: &Counters,
        broken: &[(usize, u64, u64)],
    ) -> Result<(), MmuError> {
        let replicas = self.xlat.replica_mask();
        for &(t, s, n) in broken {
            if replicas & (1 << t) != 0 {
                self.mirror(stats, Vpn(s), n, 1 << t)?;
            }
        }
        Ok(())
    }

    pub(crate) fn check_large(&self) -> Result<(), Violation> {
        let mut last: [Option<u64>; super::MAX_TABLES] = [None; super::MAX_TABLES];
        for (s, t, n) in self.xlat.large.iter() {
            if self.xlat.tables.get(t).and_then(|x| x.as_ref()).is_none() {
                return fail("large leaf in a dead page table", Some(s));
            }
            if !self.large_sizes(t).iter().any(|(m, _)| *m == n) || s % n != 0 {
                return fail("large leaf of a size or alignment its table lacks", Some(s));
            }
            if last[t].is_some_and(|end| end > s) {
                return fail("large leaves overlap", Some(s));
            }
            last[t] = Some(s + n);
            if !self.in_one_region(s, n) {
                return fail("large leaf crosses a region boundary", Some(s));
            }
            let Some(_) = self.contiguous_block(s, n) else {
                return fail(
                    "large leaf over pages not on one aligned contiguous block",
                    Some(s),
                );
            };
            if self
                .store
                .lpt
                .entries_in(Vpn(s), n)
                .any(|(_, e)| e.mapped & (1 << t) == 0)
            {
                return fail("large leaf over a page its table does not map", Some(s));
            }
        }
        Ok(())
    }
}
