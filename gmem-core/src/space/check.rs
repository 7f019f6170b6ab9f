//! `check_invariants`: the design's invariants (DESIGN.md's 1-5), checked on demand on
//! one space's state and the memories it uses (a broken one is a [`Violation`]).
//! Each owned part of the state checks its own (`RegionMap::check`,
//! `Translation::check`, `PageStore::check_frames`); this module runs them and then
//! checks what joins the parts.
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
//!    outside every region holds nothing but a pending marker;
//! 6. read copies (`duplicate`) belong to populated, unwired, read-mostly pages of
//!    unique-policy regions in a space without replicate tables, one per live table,
//!    in tables that do not map the shared frame, and every mapping of the shared frame
//!    is one the duplication path made read-only.

use super::violation::{fail, Violation};
use super::{PlacementMode, SpaceInner, SpaceState};
use crate::addr::Vpn;
use crate::handle::SpaceId;
use crate::lpt::{EXTERNAL, PENDING, WIRED};

impl SpaceState {
    /// Check the invariants of this space (`space`, whose state this is): each part's
    /// own, then those that join parts.
    pub(crate) fn check(&self, space: &SpaceInner, id: SpaceId) -> Result<(), Violation> {
        let st = self;
        // Each part's own invariants (5 is the region map's, 2 the page store's).
        st.map.check(space.range, &space.arena)?;
        st.xlat.check()?;
        st.store.check_frames(id)?;

        // What joins them: pages against regions and tables (1, 3, 4, 5).
        let live_tables = st.xlat.live_mask();
        let replicas = st.xlat.replica_mask();
        let wired_tables = st.xlat.wired_mask();
        let queue_empty = st.xlat.queue.len() == 0;
        for (Vpn(vpn), e) in st.store.lpt.iter() {
            let va = vpn << crate::addr::PAGE_SHIFT;
            let region = st.map.at(va);
            if e.has(PENDING) && queue_empty && st.xlat.queue.strict_in_flight == 0 {
                return fail("page pending with an empty queue", Some(vpn));
            }
            if region.is_none() && !(e.has(PENDING) && !e.is_populated() && e.mapped == 0) {
                return fail("page outside every region holds something", Some(vpn));
            }
            if e.mapped & !live_tables != 0 {
                return fail("mapping bit of a dead page table", Some(vpn));
            }
            // A no-access page is mapped by no table.
            let no_access =
                region.is_some_and(|(_, r)| st.map.piece(r.piece(), Vpn(vpn)).prot.is_empty());
            if e.mapped != 0 && no_access {
                return fail("a no-access page is mapped", Some(vpn));
            }
            if !e.is_populated() {
                if e.mapped != 0 {
                    return fail("unpopulated page is mapped", Some(vpn));
                }
                continue;
            }
            if let Some((_, r)) = region {
                if r.placement.mode == PlacementMode::Unique
                    && !e.has(WIRED)
                    && !st.is_pinned(Vpn(vpn))
                    && !st.advice_shares(Vpn(vpn), st.memory_id(e.mem))
                    && st.store.copies.get(Vpn(vpn)).is_none()
                    && (e.mapped & !replicas).count_ones() > 1
                {
                    return fail("unique page mapped by more than one page table", Some(vpn));
                }
            }
            // A region being mapped outside the lock has its logical entries before
            // its mapping bits.
            let busy = region.is_some_and(|(_, r)| r.busy);
            if queue_empty && !e.has(PENDING) && !busy && !no_access {
                // A table holding a private frame of this page maps that instead.
                let private: u32 = (0..st.xlat.tables.len())
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
        }
        // Private frames: of an attached device with a table of its own, for a page of a
        // region; the table holds no shared mapping there.
        for (slot, vpn, _, _) in st.store.private.iter() {
            let Some(att) = st.xlat.attached.get(slot).and_then(Option::as_ref) else {
                return fail("private frame of a detached slot", Some(vpn.0));
            };
            if st.xlat.tables[att.table].as_ref().map_or(0, |t| t.users) != 1 << slot {
                return fail("private frame in a shared table", Some(vpn.0));
            }
            if st.map.at(vpn.addr().as_u64()).is_none() {
                return fail("private frame outside every region", Some(vpn.0));
            }
            if st.store.lpt.get(vpn).mapped & (1 << att.table) != 0 {
                return fail(
                    "table maps both a private and the shared frame",
                    Some(vpn.0),
                );
            }
        }
        st.check_copies()?;
        // Large leaves agree with the logical page table.
        st.check_large()?;
        // DMA records: inside the space and its arena, apart from regions and each
        // other, held by exactly the live tables.
        st.check_dma(space, live_tables)
    }
}

impl SpaceState {
    /// Invariant 6: the read copies (see the module header and `duplicate`).
    fn check_copies(&self) -> Result<(), Violation> {
        if self.store.copies.is_empty() {
            return Ok(());
        }
        let live = self.xlat.live_mask();
        if self.xlat.replica_mask() != 0 {
            return fail("read copies in a space with a replicate table", None);
        }
        for (vpn, d) in self.store.copies.iter() {
            let e = self.store.lpt.get(vpn);
            let unique = self
                .map
                .at(vpn.addr().as_u64())
                .is_some_and(|(_, r)| r.placement.mode == PlacementMode::Unique);
            if !unique {
                return fail("read copy outside a unique-policy region", Some(vpn.0));
            }
            if !e.is_populated() || e.has(WIRED) || e.has(EXTERNAL) {
                return fail(
                    "read copy of an absent, wired or caller-given page",
                    Some(vpn.0),
                );
            }
            if !self.advice_at(vpn).read_mostly {
                return fail("read copy of a page not advised read-mostly", Some(vpn.0));
            }
            if d.copies.is_empty() {
                return fail("duplicated page without copies", Some(vpn.0));
            }
            if e.mapped & !d.read_only != 0 {
                return fail(
                    "duplicated page's shared frame mapped writable",
                    Some(vpn.0),
                );
            }
            let mut tables = 0u32;
            for c in &d.copies {
                let bit = 1u32 << c.table;
                if live & bit == 0 {
                    return fail("read copy in a dead table", Some(vpn.0));
                }
                if tables & bit != 0 {
                    return fail("two read copies in one table", Some(vpn.0));
                }
                if e.mapped & bit != 0 {
                    return fail(
                        "table maps both a read copy and the shared frame",
                        Some(vpn.0),
                    );
                }
                tables |= bit;
            }
        }
        Ok(())
    }
}
