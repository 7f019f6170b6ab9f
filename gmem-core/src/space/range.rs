//! Protection of a page range inside a region (`region_protect_range`).
//!
//! A page may carry a protection of its own in its logical page-table entry
//! (`lpt::OWN_PROT`); faults, mirrors and promotions use it instead of the region's.
//! Changing the protection of a range that covers a large leaf in part splits the
//! leaf (`large`): the QEMU kernel shows it on a real Sv39 megapage.

use super::{table_runs, SpaceInner, SpaceState, TableRun};
use crate::addr::{Vpn, PAGE_SHIFT};
use crate::flags::Prot;
use crate::gmem::Ctx;
use crate::mmu::MmuError;
use alloc::vec::Vec;

impl SpaceState {
    /// Give pages `[first, first + pages)` (inside a region whose protection is
    /// `region_prot`) protection `prot`: every table that maps them is changed and
    /// invalidated, then the pages record it (as their own, or as none when it is the
    /// region's). On a driver failure the mappings of every range changed so far (and
    /// of large leaves split on the way) are dropped and invalidated — the pages keep
    /// their old protection in the logical page table; faultable users fault them
    /// back, tables that must hold them eagerly get them again — and the error is
    /// returned.
    pub(crate) fn protect_range(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        first: Vpn,
        pages: u64,
        prot: Prot,
        region_prot: Prot,
    ) -> Result<(), MmuError> {
        let stats = cx.counters;
        if self.any_pending(first, pages) {
            self.drain(stats, &space.arena);
        }
        let touched: Vec<(Vpn, u32)> = self
            .lpt
            .entries_in(first, pages)
            .filter(|(_, e)| e.mapped != 0)
            .map(|(v, e)| (v, e.mapped))
            .collect();
        let runs = table_runs(&touched);
        let split = self.large_protected(stats, &runs);
        for (i, run) in runs.iter().enumerate() {
            let Some(table) = self.tables[run.table].as_ref() else {
                continue;
            };
            let Err(err) = table.mmu.protect(table.root, run.range, prot) else {
                continue;
            };
            let mut drop: Vec<TableRun> = runs[..=i].to_vec();
            drop.extend(split.iter().map(|&(t, s, n)| TableRun {
                table: t,
                range: crate::addr::VaRange {
                    start: Vpn(s).addr(),
                    len: n << PAGE_SHIFT,
                },
            }));
            let eager = self.wired_mask();
            for r in drop {
                let (f, n) = (r.range.start.vpn(), r.range.len >> PAGE_SHIFT);
                self.unmap_pages(stats, f, n, 1 << r.table);
                // Best effort: the error returned is the driver's first.
                let _ = self.mirror(stats, f, n, eager & (1 << r.table));
            }
            return Err(err);
        }
        self.invalidate(stats, &runs);
        let own = (prot != region_prot).then_some(prot);
        for v in first.span(pages) {
            self.lpt.update(v, |e| e.set_prot(own));
        }
        Ok(())
    }
}
