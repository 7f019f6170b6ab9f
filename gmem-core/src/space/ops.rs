//! Space-state operations shared by several KPI calls: settling a region against the queue, wiring, unmapping a region, filling and detaching page tables.

use crate::error::MoveError;
use crate::flags::MapFlags;
use crate::gmem::Ctx;
use crate::handle::SpaceId;
use crate::kpi::region::Checked;
use crate::lpt::{PENDING, WIRED};
use crate::queue::Callback;
use crate::space::{MmuMode, PlacementTarget, Region, RegionRec, SpaceInner, SpaceState};
use crate::stats::Counters;
use alloc::vec::Vec;

impl SpaceState {
    /// Drain the queue if any page of a checked region has a request pending (an
    /// operation never races a queued invalidation).
    pub(crate) fn settle(&mut self, cx: &Ctx<'_>, space: &SpaceInner, c: &Checked) {
        if self.any_pending(c.first, c.pages) {
            self.drain(cx.counters, &space.arena);
        }
    }

    /// Write back a checked region's record (after a change the caller made to a copy).
    pub(crate) fn put_region(&mut self, c: &Checked, rec: RegionRec) {
        if let Some(r) = self.region_mut(c.region) {
            *r = rec;
        }
    }

    /// Remove a checked region's record, and the region from its mapping set.
    pub(crate) fn remove_region(&mut self, c: &Checked) {
        self.regions.remove(&c.region.start.as_u64());
        self.leave_set(c);
    }

    /// Take a checked region out of its mapping set.
    fn leave_set(&mut self, c: &Checked) {
        if let Some(s) = c
            .rec
            .set
            .and_then(|s| self.sets.get_mut(s.index, s.generation))
        {
            s.regions.retain(|x| *x != c.region);
        }
    }

    /// Pin (or unpin) a populated page: its entry's wired mark and its frame's queue.
    pub(crate) fn set_page_wired(&mut self, vpn: u64, wired: bool) {
        let e = self.lpt.update(vpn, |x| {
            if wired {
                x.flags |= WIRED;
            } else {
                x.flags &= !WIRED;
            }
            *x
        });
        self.memories.get(e.mem).phys.lock().set_wired(e.pfn, wired);
    }

    /// Populate and pin `[first, first + pages)`; see [`Gmem::region_wire`].
    pub(crate) fn wire_range(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        first: u64,
        pages: u64,
        target: PlacementTarget,
    ) -> Result<u64, MoveError> {
        if self.any_pending(first, pages) {
            self.drain(cx.counters, &space.arena);
        }
        let dest = self.target_of(cx, cx.host, target);
        let mut wired = Vec::new();
        let mut result = Ok(());
        for vpn in first..first + pages {
            let e = self.lpt.get(vpn);
            if e.has(WIRED) {
                continue;
            }
            if !e.is_populated() {
                if let Err(err) = self.prepare_page(cx, space, vpn, &dest) {
                    result = Err(err);
                    break;
                }
            }
            self.set_page_wired(vpn, true);
            wired.push(vpn);
        }
        if result.is_ok() {
            let mask = self.wired_mask();
            result = self
                .mirror(cx.counters, first, pages, mask)
                .map_err(MoveError::Mmu);
        }
        if let Err(err) = result {
            let mask = self.wired_mask() & !self.replica_mask();
            let touched: Vec<(u64, u32)> = wired
                .iter()
                .map(|v| (*v, self.lpt.get(*v).mapped & mask))
                .filter(|(_, m)| *m != 0)
                .collect();
            self.unmap_entries(cx.counters, &touched, false);
            for vpn in wired {
                self.set_page_wired(vpn, false);
            }
            return Err(err);
        }
        Ok(wired.len() as u64)
    }

    /// Unmap one region (strict or queued); the region must be live.
    pub(crate) fn unmap_region(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        c: &Checked,
        flags: MapFlags,
        callback: Option<Callback>,
    ) {
        let (first, pages) = (c.first, c.pages);
        self.settle(cx, space, c);
        if flags.contains(MapFlags::ASYNC) {
            let d = self.discard_pages(cx.counters, first, pages, true);
            self.enqueue_unmap(cx.counters, &space.arena, d, None, callback);
        } else {
            self.discard_pages(cx.counters, first, pages, false);
            self.queue.complete_now(callback, Ok(()));
        }
        self.leave_set(c);
        self.put_region(
            c,
            RegionRec {
                mapped: false,
                set: None,
                ..c.rec
            },
        );
    }

    /// Resolve a region handle of this space into a checked region, if it is live.
    pub(crate) fn check(&self, region: Region) -> Option<Checked> {
        let rec = *self.region(region)?;
        let (first, pages) = SpaceState::pages_of(region.start.as_u64(), rec.len);
        Some(Checked {
            region,
            rec,
            first,
            pages,
        })
    }

    /// Fill a new table with what it must hold eagerly: every populated page for a
    /// replicate table, every wired page for a table whose users cannot fault.
    pub(crate) fn fill_table(
        &mut self,
        stats: &Counters,
        t: usize,
    ) -> Result<(), crate::mmu::MmuError> {
        let table = self.tables[t].as_ref().expect("live table");
        let all = table.mode == MmuMode::Replicate;
        if !all && table.faultable {
            return Ok(());
        }
        let mut vpns: Vec<u64> = self
            .lpt
            .iter()
            .filter(|(_, e)| e.is_populated() && (all || e.has(WIRED)) && !e.has(PENDING))
            .map(|(v, _)| v)
            .collect();
        vpns.sort_unstable();
        let mut i = 0;
        while i < vpns.len() {
            let mut n = 1;
            while i + n < vpns.len() && vpns[i + n] == vpns[i] + n as u64 {
                n += 1;
            }
            self.mirror(stats, vpns[i], n as u64, 1 << t)?;
            i += n;
        }
        Ok(())
    }

    /// Remove attachment `slot` of space `space`: the device is deactivated first if it
    /// is active here (so its MMU never points at a destroyed table), then its table
    /// loses a user; a table without users is emptied (unmap + invalidate) and
    /// destroyed, a shared one left behind gets the device's whole TLB invalidated.
    pub(crate) fn detach_slot(&mut self, stats: &Counters, slot: usize, space: SpaceId) {
        let Some(att) = self.attached[slot].as_ref() else {
            return;
        };
        let t = att.table;
        let dev = att.dev.clone();
        {
            let mut b = dev.binding.lock();
            if b.is_active_in(space) {
                b.active = None;
                dev.mmu.activate(None);
            }
            b.attached.retain(|s| *s != space);
        }
        let users = self.tables[t]
            .as_ref()
            .map_or(0, |tb| tb.users & !(1 << slot));
        if users == 0 {
            let mut touched: Vec<(u64, u32)> = self
                .lpt
                .iter()
                .filter(|(_, e)| e.mapped & (1 << t) != 0)
                .map(|(v, _)| (v, 1u32 << t))
                .collect();
            touched.sort_unstable();
            self.unmap_entries(stats, &touched, false);
            let table = self.tables[t].take().expect("live table");
            table.mmu.destroy_page_table(table.root);
        } else {
            let table = self.tables[t].as_mut().expect("live table");
            table.users = users;
            dev.mmu.invalidate_all(table.root);
            Counters::add(&stats.invalidations, 1);
        }
        self.attached[slot] = None;
        if let Some(table) = self.tables[t].as_mut() {
            let faultable = self
                .attached
                .iter()
                .flatten()
                .filter(|a| a.table == t)
                .all(|a| a.dev.faultable());
            table.faultable = faultable;
        }
        let hint = (slot + 1) as u8;
        let hinted: Vec<u64> = self
            .lpt
            .iter()
            .filter(|(_, e)| e.hint == hint)
            .map(|(v, _)| v)
            .collect();
        for v in hinted {
            self.lpt.update(v, |e| e.hint = 0);
        }
    }
}
