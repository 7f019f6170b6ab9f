//! Page-table edits made outside the space lock, for drivers whose tables take
//! concurrent edits of disjoint ranges ([`crate::mmu::Mmu::concurrent_edits`]: the
//! compare-and-swap and reader-writer IOMMU disciplines).
//!
//! Two edits leave the lock: the eager mapping of a `region_map`ped region (when every
//! table that must hold it says it can) and the unmapping of a strict
//! `region_dealloc` (whose invalidation already runs unlocked, see
//! `queue::PendingInvalidation`). What keeps them sound, owned here:
//! - **Disjoint ranges.** A region being mapped unlocked is marked *busy*: every KPI
//!   call on it waits (`Gmem::with_region`) until the edit has finished; a region being
//!   deallocated is already gone from the space, its pages pending. No two edits of the
//!   core ever overlap, as the contract promises the driver.
//! - **Live tables.** The count of unlocked edits in flight; while it is not zero a
//!   table its last user detaches from is *doomed* instead of destroyed: kept (with the
//!   MMU of the device that last used it) until the last edit has returned, then its
//!   user's whole TLB is invalidated for it and it is destroyed.
//! - **The right table.** Each table has a generation; an edit made on a table that
//!   was detached meanwhile (its slot perhaps reused by a new table) records no mapping
//!   bit: the edit is undone on the doomed table instead. A table attached meanwhile
//!   got the region's wired pages from `fill_table`, since the logical entries exist
//!   from the start.
//!
//! An unlocked map goes in three steps: [`SpaceState::begin_unlocked_map`] (under the
//! lock, after every check: logical entries written, region busy, the table runs
//! collected), [`UnlockedMap::edit`] (no lock: the driver's `map` calls) and
//! [`UnlockedMap::finish`] (under the lock again: mapping bits, or on a driver failure
//! the undo with the region restored exactly as before).

use super::segments::Piece;
use super::translation::Doomed;
use super::{RegionRec, SpaceState};
use crate::addr::Vpn;
use crate::addr::{VaRange, PAGE_SHIFT};
use crate::error::{MapError, RegionError};
use crate::flags::Prot;
use crate::handle::{DeviceId, MappingSetId};
use crate::mmu::{MapRun, Mmu, MmuError, PageTableRoot};
use crate::space::queue::Callback;
use crate::space::ResolvedRegion;
use crate::stats::Counters;
use crate::sync::Arc;
use alloc::vec::Vec;

/// The runs of one table an unlocked edit maps or unmaps.
pub(crate) struct TableEdit {
    pub table: usize,
    pub generation: u64,
    pub mmu: Arc<dyn Mmu>,
    pub root: PageTableRoot,
    pub runs: Vec<MapRun>,
}

/// An eager map whose page-table edits run without the space lock; see the module
/// header. Made by [`SpaceState::begin_unlocked_map`].
#[must_use = "an unlocked map must be edited and finished, or its region stays busy"]
pub(crate) struct UnlockedMap {
    checked: ResolvedRegion,
    set: Option<MappingSetId>,
    callback: Option<Callback>,
    edits: Vec<TableEdit>,
}

impl SpaceState {
    /// One more unlocked edit in flight (tables stay alive until it ends).
    pub(crate) fn begin_unlocked_edit(&mut self) {
        self.xlat.unlocked.begin();
    }

    /// An unlocked edit ended: the last one destroys the tables doomed meanwhile.
    pub(crate) fn end_unlocked_edit(&mut self, stats: &Counters) {
        for d in self.xlat.unlocked.end() {
            d.last_user.invalidate_all(d.root);
            Counters::add(&stats.invalidations, 1);
            d.mmu.destroy_page_table(d.root);
        }
    }

    /// Whether device `id` is named by work still running outside the lock: a doomed
    /// table (its driver's or its last user's) or a strict unmap's completion.
    pub(crate) fn refers_to_device(&self, id: DeviceId) -> bool {
        self.xlat.unlocked.refers_to(id) || self.dma_unmaps_in_flight()
    }

    /// Whether an unlocked `region_map` in flight edits page `v` of table `t` (the
    /// caller must leave it alone).
    #[inline]
    pub(crate) fn edited_unlocked(&self, t: usize, v: Vpn) -> bool {
        // Deliberately broken (loom model `unlocked` must catch it): a fill mirrors
        // the pages an unlocked map is writing into the same table.
        if cfg!(gmem_loom_bug = "fill_mirrors_busy_pages") {
            return false;
        }
        self.xlat.unlocked.edits(t, v)
    }

    /// Destroy a table whose last user (device `last_id`, MMU `last_user`) detached —
    /// or doom it while unlocked edits may still be editing it.
    pub(crate) fn retire_table(&mut self, t: usize, last_id: DeviceId, last_user: Arc<dyn Mmu>) {
        let table = self.xlat.tables[t].take().expect("live table");
        self.xlat.tables_changed();
        // An unlocked map in flight no longer edits this slot's table (it finds the
        // generation changed and undoes its runs on the doomed table): a table
        // attached in the slot later is filled like any other.
        self.xlat.unlocked.forget_table(t);
        // Deliberately broken (loom model `unlocked` must catch it): the table is
        // destroyed at once, under an edit that is still running without the lock.
        #[cfg(gmem_loom_bug = "destroy_table_during_unlocked_edit")]
        let destroy = true;
        #[cfg(not(gmem_loom_bug = "destroy_table_during_unlocked_edit"))]
        let destroy = self.xlat.unlocked.idle();
        if destroy {
            table.mmu.destroy_page_table(table.root);
        } else {
            self.xlat.unlocked.doom(Doomed {
                mmu: table.mmu,
                owner: table.owner,
                root: table.root,
                last_user,
                last_user_id: last_id,
            });
        }
    }

    /// Whether table slot `t` still holds the table of generation `generation`.
    fn same_table(&self, t: usize, generation: u64) -> bool {
        self.xlat
            .tables
            .get(t)
            .and_then(Option::as_ref)
            .is_some_and(|x| x.generation == generation)
    }

    /// The first step of an unlocked map, after `map_frames` checked everything and
    /// wrote the logical entries: mark the region busy (mapped, with `prot`) and
    /// collect, for every table in `mask`, the physically contiguous runs to map.
    pub(crate) fn begin_unlocked_map(
        &mut self,
        c: &ResolvedRegion,
        prot: Prot,
        mask: u32,
        set: Option<MappingSetId>,
        callback: Option<Callback>,
    ) -> UnlockedMap {
        let mut runs = Vec::new();
        let region = Piece {
            prot,
            attrs: c.rec.attrs,
        };
        let mut i = 0;
        while i < c.pages {
            let v0 = c.first.add(i);
            let e0 = self.store.lpt.get(v0);
            let attrs = self.map.piece(region, v0).attrs;
            let mut n = 1;
            while i + n < c.pages
                && self.store.lpt.get(v0.add(n)).pfn == e0.pfn.add(n)
                && self.map.piece(region, v0.add(n)).attrs == attrs
            {
                n += 1;
            }
            runs.push(MapRun {
                va: v0.addr(),
                pa: e0.pfn.addr(),
                len: n << PAGE_SHIFT,
                prot,
                page_size: crate::addr::PageSize::Size4K,
                memory: self.store.memories.get(e0.mem).id,
                attrs,
            });
            i += n;
        }
        let edits: Vec<TableEdit> = self
            .xlat
            .tables
            .iter()
            .enumerate()
            .filter(|(t, _)| mask & (1 << t) != 0)
            .filter_map(|(t, x)| {
                let x = x.as_ref()?;
                Some(TableEdit {
                    table: t,
                    generation: x.generation,
                    mmu: x.mmu.clone(),
                    root: x.root,
                    runs: runs.clone(),
                })
            })
            .collect();
        self.xlat.unlocked.start_map(
            c.rec.id,
            c.first,
            c.pages,
            edits.iter().fold(0, |m, e: &TableEdit| m | 1 << e.table),
        );
        self.put_region(
            c,
            RegionRec {
                prot,
                explicit: true,
                mapped: true,
                set,
                busy: true,
                ..c.rec
            },
        );
        self.begin_unlocked_edit();
        UnlockedMap {
            checked: *c,
            set,
            callback,
            edits,
        }
    }
}

impl UnlockedMap {
    /// The second step, without the space lock: the driver's `map` of every run into
    /// every table. On a failure everything this edit mapped is unmapped again before
    /// the error comes back (the invalidation follows in [`UnlockedMap::finish`]).
    ///
    /// # Errors
    /// The driver's [`MmuError`].
    pub(crate) fn edit(&self, stats: &Counters) -> Result<(), MmuError> {
        for (k, e) in self.edits.iter().enumerate() {
            for (j, run) in e.runs.iter().enumerate() {
                if let Err(err) = e.mmu.map(e.root, run) {
                    // Undo: every run of the tables before, the runs of this one up to
                    // the failed one (a driver leaves nothing of a failed run mapped,
                    // but unmapping it again is harmless).
                    for done in &self.edits[..k] {
                        for r in &done.runs {
                            done.mmu.unmap(done.root, r.range());
                        }
                    }
                    for r in &e.runs[..=j] {
                        e.mmu.unmap(e.root, r.range());
                    }
                    return Err(err);
                }
                Counters::add(&stats.mmu_maps, 1);
            }
        }
        Ok(())
    }

    /// The third step, under the lock again: record the mapping bits (a table detached
    /// meanwhile gets its runs unmapped instead), join the mapping set, make the
    /// callback ready. After a failed edit: invalidate what the edit had mapped,
    /// remove the logical entries, give the region back its record from before the
    /// call, and return the error (the callback is dropped unrun).
    ///
    /// # Errors
    /// [`MapError::Mmu`] when `edited` is the driver's error.
    pub(crate) fn finish(
        self,
        st: &mut SpaceState,
        stats: &Counters,
        edited: Result<(), MmuError>,
    ) -> Result<(), MapError> {
        let UnlockedMap {
            checked: c,
            set,
            callback,
            edits,
        } = self;
        st.xlat.unlocked.finish_map(c.rec.id);
        let alive = st.alive && st.region(c.region).is_some_and(|r| r.id == c.rec.id);
        let result = match edited {
            Ok(()) => {
                for e in &edits {
                    if alive && st.same_table(e.table, e.generation) {
                        for v in c.first.span(c.pages) {
                            st.store.lpt.update(v, |x| x.mapped |= 1 << e.table);
                        }
                    } else {
                        // Detached (or the space destroyed) meanwhile: the table is
                        // doomed, alive until this edit ends; leave it empty.
                        for r in &e.runs {
                            e.mmu.unmap(e.root, r.range());
                        }
                    }
                }
                if alive {
                    if let Some(s) = set {
                        st.map.join_set(s, c.region);
                    }
                    st.put_region(
                        &c,
                        RegionRec {
                            busy: false,
                            ..*st.region(c.region).expect("alive")
                        },
                    );
                    st.xlat.queue.complete_now(callback, Ok(()));
                    Ok(())
                } else {
                    // The space was destroyed during the call (a region cannot go
                    // while busy otherwise): no mapping exists, say so; the callback
                    // is dropped unrun, as on every error.
                    Err(MapError::Region(if st.alive {
                        RegionError::StaleRegion(c.region)
                    } else {
                        RegionError::UnknownSpace(c.region.space)
                    }))
                }
            }
            Err(err) => {
                // A device may have walked a run before it was unmapped again.
                let ranges: Vec<(usize, u64, VaRange)> = edits
                    .iter()
                    .flat_map(|e| {
                        e.runs
                            .iter()
                            .map(move |r| (e.table, e.generation, r.range()))
                    })
                    .collect();
                let live: Vec<super::TableRun> = ranges
                    .iter()
                    .filter(|(t, g, _)| st.same_table(*t, *g))
                    .map(|&(table, _, range)| super::TableRun { table, range })
                    .collect();
                st.invalidate(stats, &live);
                if alive {
                    // Mappings a fault or a table attached meanwhile made go too.
                    st.discard_pages(stats, c.first, c.pages);
                    st.put_region(&c, c.rec);
                }
                Err(MapError::Mmu(err))
            }
        };
        st.end_unlocked_edit(stats);
        result
    }
}
