//! Operations on a page range inside one region (`region_*_range`) and the evacuation
//! of a device's memory.
//!
//! A range operation acts on `[first, first + pages)` of a checked region: protection
//! (including no access, recorded as a split-off piece in `segments`; `protect_runs`,
//! the all-or-nothing protection change of table runs, lives here too), unmapping,
//! wiring and unwiring; migration reuses `migrate_range` directly. The protection of
//! every page stays readable in one place (`Segments::at`), so the fault path,
//! the eager mirrors and zero-fill blocks all follow a split at once.
//!
//! Evacuation moves every page a space keeps in one device's memory to host memory —
//! wired pages included (they are re-pinned and re-mirrored on their new frames) —
//! so that the device can be destroyed; caller-given frames are the caller's and stay.

use super::segments::Piece;
use super::{SpaceInner, SpaceState, TableEdits, TableRun};
use crate::addr::{VaRange, Vpn, PAGE_SHIFT};
use crate::device::DeviceInner;
use crate::error::MoveError;
use crate::flags::{MapFlags, Prot};
use crate::lpt::{PageEntry, EXTERNAL, WIRED};
use crate::mmu::{Attrs, MmuError};
use crate::space::queue::Callback;
use crate::space::Ctx;
use crate::space::ResolvedRegion;
use crate::stats::Counters;
use crate::sync::Arc;
use alloc::vec::Vec;

/// Pages `[first, first + pages)` inside one checked region: the part of it a range
/// call acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageSpan {
    /// The first page.
    pub first: Vpn,
    /// Pages spanned.
    pub pages: u64,
}

impl PageSpan {
    /// Every page of region `c`.
    pub(crate) fn whole(c: &ResolvedRegion) -> PageSpan {
        PageSpan {
            first: c.first,
            pages: c.pages,
        }
    }
}

impl SpaceState {
    /// The protection and attributes of page `vpn` (read-only and none outside every
    /// region).
    pub(crate) fn piece_at(&self, vpn: Vpn) -> Piece {
        match self.region_at(vpn.addr().as_u64()) {
            Some((_, r)) => self.map.piece(r.piece(), vpn),
            None => Piece {
                prot: Prot::READ,
                attrs: Attrs::default(),
            },
        }
    }

    /// The attributes of page `vpn`.
    pub(crate) fn attrs_at(&self, vpn: Vpn) -> Attrs {
        self.piece_at(vpn).attrs
    }

    /// Whether the `pages` pages from `vpn` lie in one region with one protection and
    /// one attribute value.
    pub(crate) fn same_attrs(&self, vpn: Vpn, pages: u64) -> bool {
        match self.region_at(vpn.addr().as_u64()) {
            Some((s, r)) => {
                vpn.add(pages).addr().as_u64() <= s + r.len
                    && self.map.uniform(r.piece(), vpn, pages).is_some()
            }
            None => false,
        }
    }

    /// Give `[first, first + pages)` of region `c` protection `prot`, all or nothing:
    /// mapped pages change protection in every table (no access: lose every mapping),
    /// pages that had no access get their eager mappings back, and the range is
    /// recorded as a piece of its own (or merged back into the region).
    ///
    /// # Errors
    /// The driver's [`MmuError`]; every table then holds the old protections again.
    pub(crate) fn protect_range(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        c: &ResolvedRegion,
        first: Vpn,
        pages: u64,
        prot: Prot,
    ) -> Result<(), MmuError> {
        self.settle(cx, space, c);
        let stats = cx.counters;
        // Copies are read-only mappings of the old protection (`duplicate`).
        self.drop_copies(stats, first, pages);
        // The mapped runs, cut where the old protection changes.
        let mut runs: Vec<TableRun> = Vec::new();
        let mut old: Vec<Prot> = Vec::new();
        let mut v = first;
        let end = first.add(pages);
        while v < end {
            let was = self.map.piece(c.rec.piece(), v).prot;
            let mut n = 1;
            while v.add(n) < end && self.map.piece(c.rec.piece(), v.add(n)).prot == was {
                n += 1;
            }
            let touched: Vec<(Vpn, u32)> = self
                .store
                .lpt
                .entries_in(v, n)
                .filter(|(_, e)| e.mapped != 0)
                .map(|(x, e)| (x, e.mapped))
                .collect();
            for r in super::table_runs(&touched) {
                runs.push(r);
                old.push(was);
            }
            v = v.add(n);
        }
        if prot.is_empty() {
            // No access: no table may map the pages (a format need not encode a
            // present leaf that allows nothing).
            let touched: Vec<(Vpn, u32)> = self
                .store
                .lpt
                .entries_in(first, pages)
                .filter(|(_, e)| e.mapped != 0)
                .map(|(x, e)| (x, e.mapped))
                .collect();
            self.unmap_entries(stats, &touched);
        } else {
            self.protect_runs(stats, &runs, prot, &old)?;
        }
        self.map
            .update_pieces(c.rec.piece(), (c.first, c.pages), first, pages, |p| Piece {
                prot,
                ..p
            });
        if !prot.is_empty() {
            // Pages that had no access: the tables that hold them eagerly get them back.
            self.remirror(stats, first, pages)?;
        }
        Ok(())
    }

    /// Give the pages `span` of region `c` the driver attributes `attrs` (the whole
    /// region, its own value included, with `whole`). Pages already mapped lose
    /// their mappings, which are made again with the new attributes: faultable devices
    /// fault them back, the tables that hold pages eagerly get them at once. Frames stay
    /// where they are (a driver that places frames by attributes sees the new value in
    /// the frame requests of later allocations and migrations).
    ///
    /// # Errors
    /// The driver's [`MmuError`] when an eager mapping cannot be made again (the
    /// attributes are set; a faultable user would fault the page back).
    pub(crate) fn set_attrs(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        c: &ResolvedRegion,
        span: PageSpan,
        attrs: Attrs,
        whole: bool,
    ) -> Result<(), MmuError> {
        let PageSpan { first, pages } = span;
        self.settle(cx, space, c);
        self.drop_copies(cx.counters, first, pages);
        let region = if whole {
            let rec = super::RegionRec { attrs, ..c.rec };
            self.put_region(c, rec);
            rec.piece()
        } else {
            c.rec.piece()
        };
        self.map
            .update_pieces(region, (c.first, c.pages), first, pages, |p| Piece {
                attrs,
                ..p
            });
        self.unmap_pages(cx.counters, first, pages, u32::MAX);
        self.remirror(cx.counters, first, pages)
    }

    /// Map `[first, first + pages)` into the tables that must hold it eagerly
    /// (replicas: every populated page; tables of devices that cannot fault: the wired
    /// ones) where it is missing.
    fn remirror(&mut self, stats: &Counters, first: Vpn, pages: u64) -> Result<(), MmuError> {
        let replicas = self.xlat.replica_mask();
        self.mirror(stats, first, pages, replicas)?;
        let wired_tables = self.xlat.wired_mask() & !replicas;
        if wired_tables == 0 {
            return Ok(());
        }
        let wired: Vec<Vpn> = self
            .store
            .lpt
            .entries_in(first, pages)
            .filter(|(_, e)| e.has(WIRED))
            .map(|(v, _)| v)
            .collect();
        let mut i = 0;
        while i < wired.len() {
            let mut n = 1;
            while i + n < wired.len() && wired[i + n] == wired[i].add(n as u64) {
                n += 1;
            }
            self.mirror(stats, wired[i], n as u64, wired_tables)?;
            i += n;
        }
        Ok(())
    }

    /// Remove the pages `span` (strictly, or queued with
    /// [`MapFlags::ASYNC`]): an anonymous region zero-fills them again on the next
    /// fault, a `region_map`ped one holds nothing there any more.
    pub(crate) fn unmap_range(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        c: &ResolvedRegion,
        span: PageSpan,
        flags: MapFlags,
        callback: Option<Callback>,
    ) {
        let PageSpan { first, pages } = span;
        self.settle(cx, space, c);
        if flags.contains(MapFlags::ASYNC) {
            let d = self.discard_pages_deferred(cx.counters, first, pages, TableEdits::UnderLock);
            self.enqueue_unmap(cx.counters, &space.arena, d, None, callback);
        } else {
            self.discard_pages(cx.counters, first, pages);
            self.xlat.queue.complete_now(callback, Ok(()));
        }
    }

    /// Unpin the wired pages of `[first, first + pages)` (caller-given frames stay) and
    /// drop every mapping of them but the replicas.
    pub(crate) fn unwire_range(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        c: &ResolvedRegion,
        first: Vpn,
        pages: u64,
    ) {
        self.settle(cx, space, c);
        let broken = self.break_straddling_large(cx.counters, first, pages);
        let wired: Vec<(Vpn, PageEntry)> = self
            .store
            .lpt
            .entries_in(first, pages)
            .filter(|(_, e)| e.has(WIRED) && !e.has(EXTERNAL))
            .collect();
        // Every mapping but the replicas goes: the next fault places the page by the
        // region's policy again (a wired page may be mapped by several tables).
        let mask = !self.xlat.replica_mask();
        let touched: Vec<(Vpn, u32)> = wired
            .iter()
            .filter(|(_, e)| e.mapped & mask != 0)
            .map(|(v, e)| (*v, e.mapped & mask))
            .collect();
        self.unmap_entries(cx.counters, &touched);
        for (v, _) in wired {
            self.set_page_wired(v, false);
        }
        // Best effort: the pages fault back into a replica that lost them.
        let _ = self.remirror_broken(cx.counters, &broken);
    }

    /// Move every page this space keeps in `dev`'s memory to `host`'s (see the module
    /// header). Returns the pages moved.
    ///
    /// # Errors
    /// [`MoveError`]: host memory exhausted, or a driver or data-mover failure. Pages
    /// moved before stay moved (each move is whole).
    pub(crate) fn evacuate(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        dev: &Arc<DeviceInner>,
        host: &Arc<DeviceInner>,
    ) -> Result<u64, MoveError> {
        let Some(mem) = self.store.memories.position(dev.id) else {
            return Ok(0);
        };
        self.drain(cx.counters, &space.arena);
        // Read copies held there go (`duplicate`): the memory backs nothing after.
        self.drop_copies_in_memory(cx.counters, dev.id);
        let pages: Vec<(Vpn, PageEntry)> = self
            .store
            .lpt
            .iter()
            .filter(|(_, e)| e.is_populated() && e.mem == mem && !e.has(EXTERNAL))
            .collect();
        let mut moved = 0;
        // Unwired pages in runs, as a migration moves them.
        let mut i = 0;
        while i < pages.len() {
            let (v0, e0) = pages[i];
            if e0.has(WIRED) {
                i += 1;
                continue;
            }
            let mut n = 1;
            while i + n < pages.len()
                && pages[i + n].0 == v0.add(n as u64)
                && !pages[i + n].1.has(WIRED)
            {
                n += 1;
            }
            moved += self.migrate_range(cx, space, v0, n as u64, host, false)?;
            i += n;
        }
        // Wired pages one by one: unpinned, moved, pinned and mirrored again.
        let wired_tables = self.xlat.wired_mask();
        for v in pages.iter().filter(|(_, e)| e.has(WIRED)).map(|(v, _)| *v) {
            self.set_page_wired(v, false);
            let moving = self.migrate_range(cx, space, v, 1, host, false);
            self.set_page_wired(v, true);
            moved += moving?;
            self.mirror(cx.counters, v, 1, wired_tables)
                .map_err(MoveError::Mmu)?;
        }
        Ok(moved)
    }

    /// Change the protection of `runs` to `prot` and invalidate them, all or nothing:
    /// if the driver fails on a run, the runs changed so far (and the failed one, which
    /// the driver may have changed in part) get their old protection back (`old[i]` for
    /// `runs[i]`) and are invalidated before the error is returned. A run the driver cannot restore either loses its mapping
    /// (unmap cannot fail; a faultable user faults it back with the region's
    /// protection) and, in a table that must hold it eagerly, is mapped again.
    pub fn protect_runs(
        &mut self,
        stats: &Counters,
        runs: &[TableRun],
        prot: Prot,
        old: &[Prot],
    ) -> Result<(), MmuError> {
        debug_assert_eq!(runs.len(), old.len());
        let split = self.large_protected(stats, runs);
        for (i, run) in runs.iter().enumerate() {
            let Some(table) = self.xlat.tables[run.table].as_ref() else {
                continue;
            };
            let Err(err) = table.mmu.protect(table.root, run.range, prot) else {
                continue;
            };
            // A large leaf the failed protect (or one it never reached) should have
            // split may still be whole in the driver's table: drop every such leaf
            // from its table (faultable users fault it back, eager tables get it again
            // below), so that the core's records hold.
            let mut lost_leaves: Vec<TableRun> = split
                .iter()
                .map(|&(t, s, n)| TableRun {
                    table: t,
                    range: VaRange {
                        start: Vpn(s).addr(),
                        len: n << PAGE_SHIFT,
                    },
                })
                .collect();
            let changed = &runs[..=i];
            let mut lost = Vec::new();
            for (r, &was) in changed.iter().zip(old) {
                if let Some(t) = self.xlat.tables[r.table].as_ref() {
                    if t.mmu.protect(t.root, r.range, was).is_err() {
                        lost.push(*r);
                    }
                }
            }
            self.invalidate(stats, changed);
            lost.append(&mut lost_leaves);
            for r in lost {
                let first = r.range.start.vpn();
                let pages = r.range.len >> PAGE_SHIFT;
                self.unmap_pages(stats, first, pages, 1 << r.table);
                let eager = self.xlat.wired_mask() & (1 << r.table);
                // Best effort: the error returned is the first one.
                let _ = self.mirror(stats, first, pages, eager);
            }
            return Err(err);
        }
        self.invalidate(stats, runs);
        Ok(())
    }
}
