//! A space's device page tables as the core edits them: installing runs of pages
//! (with large leaves where allowed), mirroring wired pages into tables of devices
//! that cannot fault, clearing entries, and the TLB invalidations (shootdowns) those
//! edits owe.

use super::*;

/// Table runs whose entries were cleared and whose TLB invalidation is still owed.
#[must_use = "cleared entries must be invalidated before anything they mapped is reused"]
pub(super) struct OwedInvalidation(pub(super) Vec<TableRun>);

/// Pages `[first, first + pages)` on the consecutive frames from `pfn` of the
/// space's memory `mem`: what one install into a table maps.
#[derive(Clone, Copy)]
pub(crate) struct BackedRun {
    /// The first page.
    pub first: Vpn,
    /// Pages in the run.
    pub pages: u64,
    /// The first page's frame.
    pub pfn: Pfn,
    /// The frames' memory (an index of the space's memory list).
    pub mem: u8,
}

impl BackedRun {
    /// `pages` pages from `first`, the first on `e`'s frame (the others on the frames
    /// after it, in the same memory).
    #[inline(always)]
    pub(crate) fn from_entry(first: Vpn, pages: u64, e: &PageEntry) -> BackedRun {
        BackedRun {
            first,
            pages,
            pfn: e.pfn,
            mem: e.mem,
        }
    }
}

impl SpaceState {
    /// Install a contiguous run of pages on their frames into table `t` — with large
    /// leaves where the block, its frames and its region allow (`large`) — then
    /// record the mapping bits.
    pub fn map_run(
        &mut self,
        stats: &Counters,
        t: usize,
        run: BackedRun,
        piece: segments::Piece,
    ) -> Result<(), MmuError> {
        // A mapping of a duplicated page's shared frame made by anything but the
        // duplication path collapses its copies first (`duplicate`).
        if self.any_copies(run.first, run.pages) {
            self.drop_copies(stats, run.first, run.pages);
        }
        self.install_run(stats, t, run, piece)?;
        self.store
            .lpt
            .update_run(run.first, run.pages, |_, e| e.mapped |= 1 << t);
        Ok(())
    }

    /// Map populated pages of `[first, first+pages)` into every table in `mask` that does
    /// not have them yet, in physically contiguous runs.
    #[inline]
    pub fn mirror(
        &mut self,
        stats: &Counters,
        first: Vpn,
        pages: u64,
        mask: u32,
    ) -> Result<(), MmuError> {
        if mask == 0 {
            // No replicating table (every fault of a space without one): no call.
            return Ok(());
        }
        self.mirror_into(stats, first, pages, mask)
    }

    /// [`SpaceState::mirror`] for a non-empty `mask`.
    fn mirror_into(
        &mut self,
        stats: &Counters,
        first: Vpn,
        pages: u64,
        mask: u32,
    ) -> Result<(), MmuError> {
        let entries: Vec<(Vpn, PageEntry)> = self
            .store
            .lpt
            .entries_in(first, pages)
            .filter(|(_, e)| e.is_populated())
            .collect();
        for t in 0..self.xlat.tables.len() {
            if mask & (1 << t) == 0 || self.xlat.tables[t].is_none() {
                continue;
            }
            let mut i = 0;
            while i < entries.len() {
                let (v0, e0) = entries[i];
                // A page an unlocked `region_map` is writing into this table right
                // now is that edit's (its finish records the mapping bit).
                if e0.mapped & (1 << t) != 0
                    || self.private_in_table(t, v0)
                    || self.edited_unlocked(t, v0)
                {
                    i += 1;
                    continue;
                }
                let (region, region_end) = self
                    .region_at(v0.addr().as_u64())
                    .map(|(start, r)| (r.piece(), start + r.len))
                    .unwrap_or((
                        segments::Piece {
                            prot: Prot::READ,
                            attrs: Attrs::default(),
                        },
                        v0.addr().as_u64() + (1 << PAGE_SHIFT),
                    ));
                let piece = self.map.piece(region, v0);
                let mut n = 1;
                while i + (n as usize) < entries.len() {
                    let (v, e) = entries[i + n as usize];
                    // A run ends with its region: the next region has its own
                    // protection and attributes, even when its frames follow on.
                    if v != v0 + n
                        || v.addr().as_u64() >= region_end
                        || e.mem != e0.mem
                        || e.pfn != e0.pfn + n
                        || e.mapped & (1 << t) != 0
                        || self.private_in_table(t, v)
                        || self.edited_unlocked(t, v)
                        || self.map.piece(region, v) != piece
                    {
                        break;
                    }
                    n += 1;
                }
                // A no-access page is mapped by no table.
                if !piece.prot.is_empty() {
                    self.map_run(stats, t, BackedRun::from_entry(v0, n, &e0), piece)?;
                }
                i += n as usize;
            }
        }
        Ok(())
    }

    /// Remove the mappings of `[first, first+pages)` from every table in `mask`: one
    /// `unmap` per contiguous run and table, then one `invalidate` per device of each
    /// table with all its runs.
    pub fn unmap_pages(&mut self, stats: &Counters, first: Vpn, pages: u64, mask: u32) {
        let touched: Vec<(Vpn, u32)> = self
            .store
            .lpt
            .entries_in(first, pages)
            .filter(|(_, e)| e.mapped & mask != 0)
            .map(|(v, e)| (v, e.mapped & mask))
            .collect();
        self.unmap_entries(stats, &touched);
    }

    /// [`SpaceState::unmap_pages`] for an address-ordered list of `(vpn, table bits)`.
    pub fn unmap_entries(&mut self, stats: &Counters, touched: &[(Vpn, u32)]) {
        let owed = self.clear_entries(stats, touched);
        self.invalidate(stats, &owed.0);
    }

    /// Remove the mappings `touched` names from their tables without invalidating:
    /// the runs whose invalidation is owed come back as a value that must be used.
    pub(super) fn clear_entries(
        &mut self,
        stats: &Counters,
        touched: &[(Vpn, u32)],
    ) -> OwedInvalidation {
        let runs = table_runs(touched);
        self.large_unmapped(stats, &runs);
        for &(v, bits) in touched {
            self.store.lpt.update(v, |e| e.mapped &= !bits);
        }
        for run in &runs {
            if let Some(table) = &self.xlat.tables[run.table] {
                table.mmu.unmap(table.root, run.range);
                Counters::add(&stats.mmu_unmaps, 1);
            }
        }
        OwedInvalidation(runs)
    }

    /// Invalidate, for each table touched by `runs`, the TLB of every device using it:
    /// one call per device with the table's whole list of ranges.
    pub fn invalidate(&self, stats: &Counters, runs: &[TableRun]) {
        for s in self.shootdowns(runs) {
            s.run(stats);
        }
    }

    /// The TLB invalidations `runs` need: for each table they touch, one per device
    /// using it, with the table's whole list of ranges.
    pub fn shootdowns(&self, runs: &[TableRun]) -> Vec<Shootdown> {
        let mut out = Vec::new();
        for (t, table) in self.xlat.tables.iter().enumerate() {
            let Some(table) = table else { continue };
            let ranges: Vec<VaRange> = runs
                .iter()
                .filter(|r| r.table == t)
                .map(|r| r.range)
                .collect();
            if ranges.is_empty() {
                continue;
            }
            for a in self.xlat.attached.iter().flatten().filter(|a| a.table == t) {
                out.push(Shootdown {
                    device: a.dev.id,
                    mmu: a.dev.mmu.clone(),
                    root: table.root,
                    ranges: ranges.clone(),
                });
            }
        }
        out
    }
}

/// Group an address-ordered list of `(vpn, table bits)` into contiguous runs per table.
pub(crate) fn table_runs(touched: &[(Vpn, u32)]) -> Vec<TableRun> {
    let mut runs: Vec<TableRun> = Vec::new();
    let mut open: [Option<(u64, u64)>; MAX_TABLES] = [None; MAX_TABLES];
    let close = |t: usize, s: u64, n: u64, runs: &mut Vec<TableRun>| {
        runs.push(TableRun {
            table: t,
            range: VaRange {
                start: VirtAddr::new(s << PAGE_SHIFT),
                len: n << PAGE_SHIFT,
            },
        });
    };
    // Only the tables this page maps or that have a run open need a look: a page
    // costs its set bits, not all 32 slots.
    let mut open_mask = 0u32;
    for &(Vpn(v), bits) in touched {
        let mut look = bits | open_mask;
        while look != 0 {
            let t = look.trailing_zeros() as usize;
            look &= look - 1;
            let has = bits & (1 << t) != 0;
            match &mut open[t] {
                Some((s, n)) if has && *s + *n == v => *n += 1,
                slot => {
                    if let Some((s, n)) = slot.take() {
                        close(t, s, n, &mut runs);
                        open_mask &= !(1 << t);
                    }
                    if has {
                        *slot = Some((v, 1));
                        open_mask |= 1 << t;
                    }
                }
            }
        }
    }
    for (t, slot) in open.iter_mut().enumerate() {
        if let Some((s, n)) = slot.take() {
            close(t, s, n, &mut runs);
        }
    }
    runs
}
