//! Read duplication (issue 35, item 4; UVM's read duplication in `uvm_va_block.c`,
//! `cudaMemAdviseSetReadMostly`): a page advised read-mostly that a device reads from
//! another memory gets a read-only copy in the reader's memory, mapped read-only in
//! the reader's table, instead of migrating; a write collapses the copies before it
//! proceeds.
//!
//! Owned here: the copies' life cycle and the rules that keep their bytes coherent.
//! The copies themselves are recorded in the page store (`ReadCopies`).
//! - **Who gets a copy.** A read fault (no write access) on a populated page of a
//!   unique-policy region, advised read-mostly, not wired, caller-given or pinned by
//!   thrashing mitigation, in a space without replicate tables, by a device whose own
//!   memory (its local memory, or host memory) does not hold the page. The copy is a
//!   frame of that memory, wired (never evicted, migrated or compacted), owned by the
//!   page in the reverse map like every frame of the space. A memory with no free frame
//!   gets no copy: the fault then migrates the page as it would without the advice.
//! - **Read-only everywhere.** While a page has copies, every mapping of it is
//!   read-only: its copies, and the shared frame in the tables recorded in
//!   `Duplicated::read_only`. The first copy therefore unmaps every mapping of the
//!   shared frame (they were made writable); a reader whose memory holds the shared
//!   frame maps it again read-only. The logical page table's mapping bits describe the
//!   shared frame only, and must lie inside `read_only` (checked by `check`).
//! - **Collapse.** Anything that could change the page's bytes or its mappings drops
//!   the copies first ([`SpaceState::drop_copies`]): unmap every copy and every
//!   read-only mapping of the shared frame, invalidate the TLBs of the tables' users,
//!   then free the copy frames. Callers: a fault that writes (or any fault the rules
//!   above exclude), any mapping of the shared frame made by the rest of the core
//!   (`map_run`: a fault's large leaf, a mirror, a promotion), the discard of the
//!   pages (unmap, deallocation, space destruction), a protection or attribute change,
//!   wiring, an advice edit, and an attach or detach (every copy). Moving the shared
//!   frame (migration, eviction, compaction) keeps the copies: their bytes are the
//!   page's bytes, and the move leaves the shared frame unmapped.
//! - **Memory pressure.** A memory that has no frame for an allocation drops the copies
//!   it holds, oldest first and one at a time, before anything is evicted (`frames`):
//!   a copy costs no write-back. (Dropping all of them at once livelocked a warp
//!   whose gather needed them together: found by the harness's `readdup` rows.)

use super::page_store::ReadCopy;
use super::segments::Piece;
use super::{PlacementMode, SpaceState, TableRun};
use crate::addr::{VaRange, Vpn, PAGE_SIZE};
use crate::device::DeviceInner;
use crate::error::FaultError;
use crate::fault::{FaultKind, FaultResolution};
use crate::flags::{DevCaps, Prot};
use crate::handle::{DeviceId, SpaceId};
use crate::lpt::{EXTERNAL, PENDING, WIRED};
use crate::physmem::RunRequest;
use crate::space::Ctx;
use crate::stats::{Counters, SpaceCounters};
use crate::sync::Arc;
use alloc::vec::Vec;

/// A read fault the duplication path looks at (built by the fault path).
pub(super) struct DupFault<'a> {
    /// The space faulted in.
    pub space: SpaceId,
    /// The faulter's own memory (its local memory, or host memory).
    pub own: &'a Arc<DeviceInner>,
    /// The faulter's table.
    pub t: usize,
    /// The faulting page.
    pub vpn: Vpn,
    /// The page's protection and attributes.
    pub piece: Piece,
    /// The access that faulted.
    pub access: Prot,
    /// The page region's placement mode.
    pub mode: PlacementMode,
    /// Whether the page is advised read-mostly.
    pub read_mostly: bool,
}

/// What the duplication path did with a fault.
pub(super) enum DupStep {
    /// Served: a copy was made, or the shared frame mapped read-only.
    Served(FaultResolution),
    /// The faulter's table maps the page already (its copy, or the shared frame
    /// read-only): a stale TLB entry.
    Spurious,
    /// Not a duplication case (any copies the page had are gone): the fault path
    /// goes on with the page's entry as it now is.
    Continue,
}

impl SpaceState {
    /// The duplication step of a fault on a populated page that is advised read-mostly
    /// or has copies (see the module header).
    ///
    /// # Errors
    /// The driver's error mapping the copy (the copy is freed; the shared frame's
    /// mappings, if the copy was the first, are gone and fault back in).
    pub(super) fn read_duplicate(
        &mut self,
        cx: &Ctx<'_>,
        f: DupFault<'_>,
    ) -> Result<DupStep, FaultError> {
        let stats = cx.counters;
        let (t, vpn, own) = (f.t, f.vpn, f.own);
        let has = self.store.copies.get(vpn).is_some();
        let e = self.store.lpt.get(vpn);
        let ro = Piece {
            prot: f.piece.prot - Prot::WRITE,
            ..f.piece
        };
        let eligible = f.read_mostly
            && f.mode == PlacementMode::Unique
            && !f.access.contains(Prot::WRITE)
            && !ro.prot.is_empty()
            && e.is_populated()
            && !e.has(WIRED)
            && !e.has(EXTERNAL)
            && !e.has(PENDING)
            && self.xlat.replica_mask() == 0
            && !self.is_pinned(vpn);
        if !eligible {
            if has {
                self.drop_copies(stats, vpn, 1);
            }
            return Ok(DupStep::Continue);
        }
        let here = self.store.memories.get(e.mem).clone();
        let mine = e.mapped & (1 << t) != 0;
        let copy_here = self.store.copies.in_table(t, vpn).is_some();
        if here.id == own.id {
            // The faulter's memory holds the shared frame: with copies elsewhere it
            // maps it read-only; without, nothing is duplicated.
            if !has {
                return Ok(DupStep::Continue);
            }
            if mine || copy_here {
                return Ok(DupStep::Spurious);
            }
            self.install_small(t, vpn, 1, e.pfn, here.id, ro)?;
            self.store.lpt.update(vpn, |x| x.mapped |= 1 << t);
            self.store.copies.entry(vpn).read_only |= 1 << t;
            here.phys.lock().touch(e.pfn);
            SpaceCounters::add(&self.local().faults_map_existing, 1);
            return Ok(DupStep::Served(FaultResolution {
                kind: FaultKind::MappedExisting,
                pages: 1,
            }));
        }
        if copy_here || (has && mine) {
            return Ok(DupStep::Spurious);
        }
        if mine {
            // The table maps the shared frame, writable (no copies yet): the
            // ordinary path decides.
            return Ok(DupStep::Continue);
        }
        // A copy in the faulter's memory, if a frame is free there (no eviction for
        // a copy).
        let fallback = |st: &mut SpaceState| {
            if has {
                st.drop_copies(stats, vpn, 1);
            }
            Ok(DupStep::Continue)
        };
        let Ok(mem) = self.store.mem_index(own) else {
            return fallback(self);
        };
        let Some(run) = own.alloc_frames(RunRequest::page(f.space, vpn, None, 0)) else {
            return fallback(self);
        };
        if !has {
            // The first copy: every mapping of the shared frame goes, and the TLBs
            // forget them, *before* the bytes are copied — a writer holding a writable
            // translation could otherwise store after the copy (the loom model
            // `readdup` found that order). Readers map it again read-only; a writer
            // collapses the copies first.
            self.unmap_pages(stats, vpn, 1, u32::MAX);
        }
        if super::fault::copy_run(&here, e.pfn, own, run.pfn(), 1).is_err() {
            drop(run);
            return fallback(self);
        }
        self.install_small(t, vpn, 1, run.pfn(), own.id, ro)?;
        let pfn = run.commit();
        own.phys.lock().set_wired(pfn, true);
        self.store.copies.push(
            vpn,
            ReadCopy {
                table: t as u8,
                mem,
                pfn,
            },
        );
        let counter = match (
            here.caps.contains(DevCaps::HOST),
            own.caps.contains(DevCaps::HOST),
        ) {
            (true, false) => &stats.bytes_host_to_dev,
            (false, true) => &stats.bytes_dev_to_host,
            _ => &stats.bytes_dev_to_dev,
        };
        Counters::add(counter, PAGE_SIZE);
        Counters::add(&stats.read_duplications, 1);
        Ok(DupStep::Served(FaultResolution {
            kind: FaultKind::Duplicated,
            pages: 1,
        }))
    }

    /// Collapse the copies of the pages `[first, first + pages)`: unmap every copy and
    /// every read-only mapping of their shared frames, invalidate the TLBs, free the
    /// copies. Returns how many copies there were.
    pub(crate) fn drop_copies(&mut self, stats: &Counters, first: Vpn, pages: u64) -> u64 {
        let which = self.store.copies.in_range(first, pages);
        self.drop_copies_of(stats, &which)
    }

    /// Drop the oldest copy held in the memory of device `dev` (memory pressure
    /// there): that copy alone, or — when it is its page's last — the page's whole
    /// duplication (the read-only mappings of the shared frame go with it, so that a
    /// writer faults and maps the page writable again). Returns whether one was there.
    pub(crate) fn drop_oldest_copy_in(&mut self, stats: &Counters, dev: DeviceId) -> bool {
        let Some(mem) = self.store.memories.position(dev) else {
            return false;
        };
        let Some((vpn, t, copies)) = self.store.copies.oldest_in(mem) else {
            return false;
        };
        if copies <= 1 {
            return self.drop_copies_of(stats, &[vpn]) > 0;
        }
        let Some(c) = self.store.copies.remove_one(vpn, t) else {
            return false;
        };
        let runs: Vec<TableRun> = self.unmap_copy(stats, vpn, &c).into_iter().collect();
        self.invalidate(stats, &runs);
        self.free_copy(&c);
        Counters::add(&stats.read_copies_dropped, 1);
        true
    }

    /// Unmap copy `c` of page `vpn` from its table; the run whose TLB invalidation is
    /// owed (none if the table is gone).
    fn unmap_copy(&self, stats: &Counters, vpn: Vpn, c: &ReadCopy) -> Option<TableRun> {
        let range = VaRange {
            start: vpn.addr(),
            len: PAGE_SIZE,
        };
        let table = self.xlat.tables[usize::from(c.table)].as_ref()?;
        table.mmu.unmap(table.root, range);
        Counters::add(&stats.mmu_unmaps, 1);
        // (Deliberately broken under `gmem_loom_bug = "collapse_skips_copy_invalidation"`:
        // the loom model `readdup` must catch the stale copy a reader's TLB keeps.)
        if cfg!(gmem_loom_bug = "collapse_skips_copy_invalidation") {
            return None;
        }
        Some(TableRun {
            table: usize::from(c.table),
            range,
        })
    }

    /// Give copy `c`'s frame back (its mapping gone and invalidated).
    fn free_copy(&self, c: &ReadCopy) {
        let mut phys = self.store.memories.get(c.mem).phys.lock();
        phys.set_wired(c.pfn, false);
        phys.free(c.pfn);
    }

    /// Collapse every copy held in the memory of device `dev` (it is evacuated).
    pub(crate) fn drop_copies_in_memory(&mut self, stats: &Counters, dev: DeviceId) -> u64 {
        let Some(mem) = self.store.memories.position(dev) else {
            return 0;
        };
        let which = self.store.copies.in_memory(mem);
        self.drop_copies_of(stats, &which)
    }

    /// Collapse every copy of the space (an attach or detach changes who reads what).
    pub(crate) fn drop_all_copies(&mut self, stats: &Counters) -> u64 {
        if self.store.copies.is_empty() {
            return 0;
        }
        let which = self.store.copies.all();
        self.drop_copies_of(stats, &which)
    }

    /// Whether any page of `[first, first + pages)` has copies.
    #[inline]
    pub(crate) fn any_copies(&self, first: Vpn, pages: u64) -> bool {
        self.store.copies.any_in(first, pages)
    }

    /// Collapse the copies of the pages `which`.
    fn drop_copies_of(&mut self, stats: &Counters, which: &[Vpn]) -> u64 {
        if which.is_empty() {
            return 0;
        }
        let mut runs: Vec<TableRun> = Vec::new();
        let mut freed: Vec<ReadCopy> = Vec::new();
        let mut shared: Vec<(Vpn, u32)> = Vec::new();
        for &v in which {
            let Some(d) = self.store.copies.remove(v) else {
                continue;
            };
            for c in d.copies {
                runs.extend(self.unmap_copy(stats, v, &c));
                freed.push(c);
            }
            let bits = self.store.lpt.get(v).mapped & d.read_only;
            if bits != 0 {
                shared.push((v, bits));
            }
        }
        let owed = self.clear_entries(stats, &shared);
        runs.extend(owed.0);
        // Nothing goes back before the TLBs forgot it.
        self.invalidate(stats, &runs);
        for c in &freed {
            self.free_copy(c);
        }
        Counters::add(&stats.read_copies_dropped, freed.len() as u64);
        freed.len() as u64
    }
}
