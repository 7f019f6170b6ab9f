//! `check_invariants`: the design's invariants (DESIGN.md's 1-5), checked on demand on
//! one space's state and the memories it uses; and [`Violation`], what a broken one is.
//!
//! Tests, fuzz targets and loom models call [`crate::Gmem::check_invariants`] after every
//! step. It checks, for one address space:
//! 1. every mapping bit of the logical page table names a live page table; every
//!    populated, non-wired page of a unique-policy region is mapped by at most one page
//!    table besides replicate-mode mirrors;
//! 2. every frame the table names is an in-use frame of its device whose reverse mapping
//!    points back at this page, and the space owns no other frame; every device's queues
//!    partition its registered frames;
//! 3. pages marked pending exist only while the queue holds requests;
//! 4. replicate tables map every populated page, and tables of devices that cannot fault
//!    map every wired page (once no request is pending);
//! 5. regions lie inside the space, do not overlap, and are allocated in its arena; a page
//!    outside every region holds nothing but a pending marker.

use super::{PlacementMode, SpaceInner, SpaceState};
use crate::addr::{Pfn, Vpn};
use crate::handle::SpaceId;
use crate::lpt::{EXTERNAL, PENDING, WIRED};
use crate::physmem::FrameState;
use alloc::vec::Vec;
use core::fmt;

/// A broken invariant: which one, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The invariant, in words.
    pub what: &'static str,
    /// The virtual page (or frame) concerned, if any.
    pub at: Option<u64>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some(at) => write!(f, "{} (at {at:#x})", self.what),
            None => write!(f, "{}", self.what),
        }
    }
}

pub(crate) fn fail<T>(what: &'static str, at: Option<u64>) -> Result<T, Violation> {
    Err(Violation { what, at })
}

impl SpaceState {
    /// Check the invariants of this space (`space`, whose state this is).
    pub(crate) fn check(&self, space: &SpaceInner, id: SpaceId) -> Result<(), Violation> {
        let st = self;
        let live_tables: u32 = st
            .tables
            .iter()
            .enumerate()
            .filter(|(_, t)| t.is_some())
            .fold(0, |m, (i, _)| m | 1 << i);
        let replicas = st.replica_mask();
        if replicas != SpaceState::replicas_of(&st.tables) {
            return fail("the kept replica mask differs from the tables'", None);
        }
        let wired_tables = st.wired_mask();
        let queue_empty = st.queue.len() == 0;

        // 5. regions
        let mut prev_end = space.range.start.as_u64();
        if !st.regions.memo_is_exact() {
            return fail("the fault's region memo differs from its region", None);
        }
        for (start, r) in st.regions.iter() {
            if start < prev_end || r.len == 0 {
                return fail("regions overlap or are empty", Some(start));
            }
            if r.reserve_start < space.range.start.as_u64()
                || r.reserve_start + (r.reserve_len - 1) > space.range.last().as_u64()
            {
                return fail("region outside its space", Some(start));
            }
            if !space.arena.contains_allocated(r.reserve_start) {
                return fail("region not allocated in the arena", Some(start));
            }
            prev_end = start + r.len;
        }

        // Split-off pieces: each inside one region, with a protection of its own.
        for (first, pages, piece) in st.segments.iter() {
            match st.region_at(first.addr().as_u64()) {
                Some((s, r))
                    if (first.0 + pages) << crate::addr::PAGE_SHIFT <= s + r.len
                        && piece != r.piece() => {}
                _ => return fail("protection piece outside its region", Some(first.0)),
            }
        }

        let mut owned: Vec<(u8, Pfn)> = Vec::new();
        for (Vpn(vpn), e) in st.lpt.iter() {
            let va = vpn << crate::addr::PAGE_SHIFT;
            let region = st.region_at(va);
            if e.has(PENDING) && queue_empty && st.queue.strict_in_flight == 0 {
                return fail("page pending with an empty queue", Some(vpn));
            }
            if region.is_none() && !(e.has(PENDING) && !e.is_populated() && e.mapped == 0) {
                return fail("page outside every region holds something", Some(vpn));
            }
            if e.mapped & !live_tables != 0 {
                return fail("mapping bit of a dead page table", Some(vpn));
            }
            if e.mapped != 0
                && region.is_some_and(|(_, r)| st.segments.at(r.piece(), Vpn(vpn)).prot.is_empty())
            {
                return fail("a no-access page is mapped", Some(vpn));
            }
            if !e.is_populated() {
                if e.mapped != 0 {
                    return fail("unpopulated page is mapped", Some(vpn));
                }
                continue;
            }
            let Some(memory) = st.memories.try_get(e.mem) else {
                return fail("page names an unknown memory", Some(vpn));
            };
            if let Some((_, r)) = region {
                if r.placement.mode == PlacementMode::Unique
                    && !e.has(WIRED)
                    && (e.mapped & !replicas).count_ones() > 1
                {
                    return fail("unique page mapped by more than one page table", Some(vpn));
                }
            }
            // A region being mapped outside the lock has its logical entries before
            // its mapping bits.
            let busy = region.is_some_and(|(_, r)| r.busy);
            // A no-access page is mapped by no table.
            let no_access =
                region.is_some_and(|(_, r)| st.segments.at(r.piece(), Vpn(vpn)).prot.is_empty());
            if queue_empty && !e.has(PENDING) && !busy && !no_access {
                // A table holding a private frame of this page maps that instead.
                let private: u32 = (0..st.tables.len())
                    .filter(|&t| st.private_in_table(t, Vpn(vpn)))
                    .fold(0, |m, t| m | 1 << t);
                if replicas & !e.mapped & !private != 0 {
                    return fail("replicate table misses a populated page", Some(vpn));
                }
                if e.has(WIRED) && wired_tables & !e.mapped & !private != 0 {
                    return fail(
                        "table of a non-faultable device misses a wired page",
                        Some(vpn),
                    );
                }
            }
            if e.has(EXTERNAL) {
                if memory.phys.lock().contains(e.pfn) {
                    return fail("caller-given frame lies in managed memory", Some(vpn));
                }
                continue;
            }
            let phys = memory.phys.lock();
            match phys.state(e.pfn) {
                Some(FrameState::Active | FrameState::Inactive | FrameState::Wired) => {}
                _ => return fail("page's frame is not in use", Some(vpn)),
            }
            match phys.owner(e.pfn) {
                Some(o) if o.space == id && o.vpn == Vpn(vpn) => {}
                _ => return fail("frame's reverse mapping does not point back", Some(vpn)),
            }
            owned.push((e.mem, e.pfn));
        }
        // Private frames: of an attached device with a table of its own, for a page of a
        // region, wired, owned by the page; the table holds no shared mapping there.
        for (slot, vpn, mem, pfn) in st.private.iter() {
            let Some(att) = st.attached.get(slot).and_then(Option::as_ref) else {
                return fail("private frame of a detached slot", Some(vpn.0));
            };
            if st.tables[att.table].as_ref().map_or(0, |t| t.users) != 1 << slot {
                return fail("private frame in a shared table", Some(vpn.0));
            }
            if st.region_at(vpn.addr().as_u64()).is_none() {
                return fail("private frame outside every region", Some(vpn.0));
            }
            if st.lpt.get(vpn).mapped & (1 << att.table) != 0 {
                return fail(
                    "table maps both a private and the shared frame",
                    Some(vpn.0),
                );
            }
            let Some(memory) = st.memories.try_get(mem) else {
                return fail("private frame names an unknown memory", Some(vpn.0));
            };
            let phys = memory.phys.lock();
            if phys.state(pfn) != Some(FrameState::Wired) {
                return fail("private frame is not wired", Some(vpn.0));
            }
            match phys.owner(pfn) {
                Some(o) if o.space == id && o.vpn == vpn => {}
                _ => {
                    return fail(
                        "private frame's reverse mapping does not point back",
                        Some(vpn.0),
                    )
                }
            }
            owned.push((mem, pfn));
        }
        // Large leaves agree with the logical page table.
        st.check_large()?;
        // DMA records: inside the space and its arena, apart from regions and each
        // other, held by exactly the live tables.
        st.check_dma(space, live_tables)?;
        // 2. the space owns exactly the frames its table names; queues are sound.
        for (m, dev) in st.memories.iter() {
            let phys = dev.phys.lock();
            if let Err(what) = phys.check() {
                return fail(what, None);
            }
            let mine = phys
                .in_use()
                .filter(|(_, _, o)| o.is_some_and(|o| o.space == id))
                .count();
            let named = owned.iter().filter(|(mem, _)| *mem == m).count();
            if mine != named {
                return fail(
                    "space owns frames its logical page table does not name",
                    None,
                );
            }
        }
        Ok(())
    }
}
