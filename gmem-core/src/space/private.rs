//! Device-private frames: a second frame for a virtual page, in one device's memory,
//! mapped only in that device's table (what ADSM/GMAC needs for accelerators that
//! cannot fault: one pointer, the CPU's table mapping host frames, the device's table
//! mapping the device's own copy at the same address; the runtime moves the bytes).
//!
//! Owned here: the private frames by (attachment slot, page), the rules that keep them
//! sound, and their life cycle.
//! - Only a device that cannot fault, with memory, attached with a table of its own
//!   (no sharer could see another's private frame) gets private frames.
//! - A private frame is wired in its memory (never evicted, migrated or compacted) and
//!   owned by the page in the reverse map, like any frame of the space.
//! - While a page has a private frame for a table, the eager mirror skips that table
//!   for that page: the table keeps the private mapping; the logical page table's
//!   mapping bits describe the shared frame only, so moving the shared frame never
//!   touches the private mapping.
//! - Freeing (the call, an unmap or deallocation of the pages, a detach, a space
//!   destruction) unmaps the private mappings and invalidates the device's TLB before
//!   the frames go back; the shared page is then mirrored into the table again if it
//!   must be.

use super::{SpaceInner, SpaceState, TableRun};
use crate::addr::{Pfn, VaRange, Vpn, PAGE_SIZE};
use crate::device::DeviceInner;
use crate::error::MoveError;
use crate::lpt::WIRED;
use crate::mmu::MapRun;
use crate::physmem::RunRequest;
use crate::space::Ctx;
use crate::space::ResolvedRegion;
use crate::stats::{Counters, SpaceCounters};
use crate::sync::Arc;
use alloc::vec::Vec;

/// Why a device cannot have private frames in a space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PrivateRefusal {
    /// Not attached to the space.
    NotAttached,
    /// It can fault (its faults would map the shared frame), or has no memory.
    Unsuitable,
    /// Its table has other users.
    SharedTable,
}

impl SpaceState {
    /// The attachment slot of `dev` if it may hold private frames here.
    pub(crate) fn private_slot(&self, dev: &DeviceInner) -> Result<usize, PrivateRefusal> {
        let slot = self.slot_of(dev.id).ok_or(PrivateRefusal::NotAttached)?;
        if dev.faultable() || !dev.has_memory() {
            return Err(PrivateRefusal::Unsuitable);
        }
        let t = self.xlat.attached[slot]
            .as_ref()
            .expect("slot of an attachment")
            .table;
        let users = self.xlat.tables[t].as_ref().map_or(0, |x| x.users);
        if users != 1 << slot {
            return Err(PrivateRefusal::SharedTable);
        }
        Ok(slot)
    }

    /// Whether table `t` maps page `vpn` to a private frame of one of its users.
    pub(crate) fn private_in_table(&self, t: usize, vpn: Vpn) -> bool {
        if self.store.private.is_empty() {
            return false;
        }
        self.xlat
            .attached
            .iter()
            .enumerate()
            .filter_map(|(s, a)| a.as_ref().filter(|a| a.table == t).map(|_| s))
            .any(|s| self.store.private.contains(s, vpn))
    }

    /// The device whose memory index is `mem`.
    pub(crate) fn memory_id(&self, mem: u8) -> crate::handle::DeviceId {
        self.store.memories.get(mem).id
    }

    /// The private frame of `vpn` for the device in `slot`.
    pub(crate) fn private_frame(&self, slot: usize, vpn: Vpn) -> Option<(u8, Pfn)> {
        self.store.private.get(slot, vpn)
    }

    /// Give every page of `span` of region `c` a private frame in
    /// `dev`'s memory (attachment `slot`), zeroed and mapped in its table with the
    /// pages' protection and attributes. Returns the pages newly given one.
    ///
    /// # Errors
    /// [`MoveError`]: the memory is full (private frames are wired: nothing is evicted
    /// for them), or the driver failed; every frame this call gave is taken back.
    pub(crate) fn alloc_private(
        &mut self,
        cx: &Ctx<'_>,
        space: &SpaceInner,
        c: &ResolvedRegion,
        span: super::PageSpan,
        slot: usize,
        dev: &Arc<DeviceInner>,
    ) -> Result<u64, MoveError> {
        let super::PageSpan { first, pages } = span;
        self.settle(cx, space, c);
        let stats = cx.counters;
        let t = self.xlat.attached[slot]
            .as_ref()
            .expect("checked slot")
            .table;
        let mem = self
            .store
            .mem_index(dev)
            .map_err(|_| MoveError::TooManyMemories(dev.id))?;
        let memory = dev.memory.as_ref().ok_or(MoveError::OutOfMemory(dev.id))?;
        let mut given: Vec<Vpn> = Vec::new();
        let mut result = Ok(());
        for v in first.span(pages) {
            if self.store.private.contains(slot, v) {
                continue;
            }
            let Some(run) = dev.alloc_frames(RunRequest::page(space.id, v, None, 0)) else {
                result = Err(MoveError::OutOfMemory(dev.id));
                break;
            };
            if let Err(e) = memory.zero(run.pfn().addr(), PAGE_SIZE) {
                result = Err(e.into());
                break;
            }
            // The shared frame's mapping in this table (if any) gives way.
            let e = self.store.lpt.get(v);
            let had_shared = e.mapped & (1 << t) != 0;
            if had_shared {
                self.unmap_pages(stats, v, 1, 1 << t);
            }
            let piece = self.piece_at(v);
            let table = self.xlat.tables[t].as_ref().expect("live table");
            let map = MapRun {
                va: v.addr(),
                pa: run.pfn().addr(),
                len: PAGE_SIZE,
                prot: piece.prot,
                page_size: crate::addr::PageSize::Size4K,
                memory: dev.id,
                attrs: piece.attrs,
            };
            if !piece.prot.is_empty() {
                if let Err(e) = table.mmu.map(table.root, &map) {
                    if had_shared {
                        // Best effort: the error returned is the driver's.
                        let _ = self.mirror(stats, v, 1, 1 << t);
                    }
                    result = Err(MoveError::Mmu(e));
                    break;
                }
                SpaceCounters::add(&self.local().mmu_maps, 1);
            }
            let pfn = run.commit();
            dev.phys.lock().set_wired(pfn, true);
            self.store.private.insert(slot, v, mem, pfn);
            given.push(v);
        }
        if let Err(e) = result {
            let pages: Vec<(usize, Vpn)> = given.iter().map(|v| (slot, *v)).collect();
            self.free_private(stats, &pages);
            return Err(e);
        }
        Ok(given.len() as u64)
    }

    /// Free the private frames `(slot, page)` listed: unmap them, invalidate the
    /// devices' TLBs, give the frames back, and mirror the shared pages into the tables
    /// again where they must be. Returns how many there were.
    pub(crate) fn free_private(&mut self, stats: &Counters, which: &[(usize, Vpn)]) -> u64 {
        if which.is_empty() {
            return 0;
        }
        let mut runs: Vec<TableRun> = Vec::new();
        let mut freed: Vec<(usize, Vpn, u8, Pfn)> = Vec::new();
        for &(slot, v) in which {
            let Some((mem, pfn)) = self.store.private.remove(slot, v) else {
                continue;
            };
            if let Some(t) = self.xlat.attached[slot].as_ref().map(|a| a.table) {
                if let Some(table) = self.xlat.tables[t].as_ref() {
                    let range = VaRange {
                        start: v.addr(),
                        len: PAGE_SIZE,
                    };
                    table.mmu.unmap(table.root, range);
                    Counters::add(&stats.mmu_unmaps, 1);
                    runs.push(TableRun { table: t, range });
                }
            }
            freed.push((slot, v, mem, pfn));
        }
        // Nothing goes back before the TLBs forgot it.
        self.invalidate(stats, &runs);
        for &(_, _, mem, pfn) in &freed {
            let mut phys = self.store.memories.get(mem).phys.lock();
            phys.set_wired(pfn, false);
            phys.free(pfn);
        }
        let wired = self.xlat.wired_mask();
        for &(slot, v, _, _) in &freed {
            if let Some(t) = self.xlat.attached[slot].as_ref().map(|a| a.table) {
                if self.store.lpt.get(v).has(WIRED) && wired & (1 << t) != 0 {
                    // Best effort: the table had a mapping here a moment ago.
                    let _ = self.mirror(stats, v, 1, 1 << t);
                }
            }
        }
        freed.len() as u64
    }

    /// The private frames of the pages `[first, first + pages)`, of every slot.
    pub(crate) fn private_in(&self, first: Vpn, pages: u64) -> Vec<(usize, Vpn)> {
        self.store.private.in_range(first, pages)
    }

    /// The private frames of attachment `slot`.
    pub(crate) fn private_of_slot(&self, slot: usize) -> Vec<(usize, Vpn)> {
        self.store.private.of_slot(slot)
    }
}
