//! The address space's half of `check_invariants`: DESIGN.md's invariants 1-3 and 5
//! on one space's state and the memories it uses.

use super::{PlacementMode, SpaceInner, SpaceState};
use crate::addr::{Pfn, Vpn};
use crate::check::{fail, Violation};
use crate::handle::SpaceId;
use crate::lpt::{EXTERNAL, PENDING, WIRED};
use crate::physmem::FrameState;
use alloc::vec::Vec;

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
        let wired_tables = st.wired_mask();
        let queue_empty = st.queue.len() == 0;

        // 5. regions
        let mut prev_end = space.range.start.as_u64();
        for (start, r) in &st.regions {
            if *start < prev_end || r.len == 0 {
                return fail("regions overlap or are empty", Some(*start));
            }
            if r.reserve_start < space.range.start.as_u64()
                || r.reserve_start + (r.reserve_len - 1) > space.range.last().as_u64()
            {
                return fail("region outside its space", Some(*start));
            }
            if !space.arena.contains_allocated(r.reserve_start) {
                return fail("region not allocated in the arena", Some(*start));
            }
            prev_end = start + r.len;
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
            if queue_empty && !e.has(PENDING) {
                if replicas & !e.mapped != 0 {
                    return fail("replicate table misses a populated page", Some(vpn));
                }
                if e.has(WIRED) && wired_tables & !e.mapped != 0 {
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
        // Large leaves agree with the logical page table.
        st.check_large()?;
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
