//! The region map (FreeBSD's `vm_map`, Linux's VMA tree): one owned part of a space's
//! state. It owns the regions by start address ([`Regions`], with the fault path's
//! memo), the pieces of regions whose protection or attributes a range call split off
//! ([`Segments`]), the mapping sets that group regions for one teardown, and the
//! region ids. Nothing else in the space touches those: every change goes through
//! this module's methods, so the invariants below hold by construction and
//! [`RegionMap::check`] verifies them for `check_invariants` (invariant 5):
//! - regions are non-empty, do not overlap, lie inside the space and are allocated in
//!   its arena; the fault memo is a copy of the region at its start;
//! - every split-off piece lies inside one region and differs from that region's own
//!   values (a piece set back to them merges away);
//! - a region names a mapping set only if it is a member of that live set, and every
//!   member of a set is a live region naming it.
//!
//! What a region's *pages* hold (frames, mappings) is the page store's and the
//! translation side's; the cross-part invariants (a page outside every region holds
//! nothing, a no-access page is mapped by no table) are checked in `check`.

use super::regions::{FaultRegion, RegionRec, Regions, ResolvedRegion};
use super::segments::{Piece, Segments};
use crate::addr::{VaRange, Vpn, PAGE_SHIFT};
use crate::handle::Region;
use crate::handle::{MappingSetId, Slots};
use crate::space::violation::{fail, Violation};
use crate::vmem::Arena;
use alloc::vec::Vec;

/// A mapping set: regions torn down together.
struct MappingSet {
    regions: Vec<Region>,
}

/// The region map of one space (see the module header).
pub(crate) struct RegionMap {
    regions: Regions,
    segments: Segments,
    sets: Slots<MappingSet>,
    /// The id the next region gets (ids tell a region from an earlier one at the same
    /// start, so a stale handle never resolves).
    next_id: u64,
}

impl Default for RegionMap {
    fn default() -> Self {
        RegionMap {
            regions: Regions::default(),
            segments: Segments::default(),
            sets: Slots::default(),
            next_id: 1,
        }
    }
}

impl RegionMap {
    /// Record a new region `[start, start + len)` reserved as `[reserve_start,
    /// reserve_start + reserve_len)` in the arena; its id.
    pub fn insert(&mut self, start: u64, len: u64, reserve_start: u64, reserve_len: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.regions
            .insert(start, RegionRec::new(id, len, reserve_start, reserve_len));
        id
    }

    /// Every region with its start, in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &RegionRec)> {
        self.regions.iter()
    }

    /// The regions overlapping `[start, end)`, with their starts, in address order.
    pub fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, &RegionRec)> {
        self.regions.overlapping(start, end)
    }

    /// The region holding `va`, with its start.
    #[inline]
    pub fn at(&self, va: u64) -> Option<(u64, &RegionRec)> {
        self.regions.at(va)
    }

    /// What the fault path reads of the region holding `va` (through the memo).
    #[inline]
    pub fn for_fault(&mut self, va: u64) -> Option<FaultRegion> {
        self.regions.for_fault(va)
    }

    /// The region a handle names, if it is still allocated.
    pub fn get(&self, region: Region) -> Option<&RegionRec> {
        self.regions
            .get(region.start.as_u64())
            .filter(|r| r.id == region.id)
    }

    /// [`RegionMap::get`], to change the record.
    pub fn get_mut(&mut self, region: Region) -> Option<&mut RegionRec> {
        self.regions
            .get_mut(region.start.as_u64())
            .filter(|r| r.id == region.id)
    }

    /// Remove a checked region: its record, its split-off pieces, its set membership.
    pub fn remove(&mut self, c: &ResolvedRegion) {
        self.regions.remove(c.region.start.as_u64());
        self.segments.clear(c.first, c.pages);
        self.leave_set(c);
    }

    /// Take a checked region out of its mapping set (the caller clears the record's
    /// `set` under the same lock).
    pub fn leave_set(&mut self, c: &ResolvedRegion) {
        if let Some(s) = c
            .rec
            .set
            .and_then(|s| self.sets.get_mut(s.index, s.generation))
        {
            s.regions.retain(|x| *x != c.region);
        }
    }

    /// Forget every region and piece (the space is destroyed), handing each region's
    /// reservation `(start, len)` to `free`. Mapping sets stay: their handles answer
    /// until destroyed, and name no live region any more.
    pub fn clear(&mut self, mut free: impl FnMut(u64, u64)) {
        for (_, r) in self.regions.iter() {
            free(r.reserve_start, r.reserve_len);
        }
        self.regions.clear();
        self.segments = Segments::default();
        for (index, generation) in self.sets.keys() {
            if let Some(s) = self.sets.get_mut(index, generation) {
                s.regions.clear();
            }
        }
    }

    /// The protection and attributes of `vpn` in a region whose own are `region`.
    #[inline]
    pub fn piece(&self, region: Piece, vpn: Vpn) -> Piece {
        self.segments.at(region, vpn)
    }

    /// The one piece every page of `[first, first+pages)` has, if they agree.
    pub fn uniform(&self, region: Piece, first: Vpn, pages: u64) -> Option<Piece> {
        self.segments.uniform(region, first, pages)
    }

    /// Give the pages `[first, first+pages)` of the region `bounds` (whose own values
    /// are `region`) the values `f` makes of their current ones (see
    /// [`Segments::update`]).
    pub fn update_pieces(
        &mut self,
        region: Piece,
        bounds: (Vpn, u64),
        first: Vpn,
        pages: u64,
        f: impl Fn(Piece) -> Piece,
    ) {
        self.segments.update(region, bounds, first, pages, f);
    }

    /// Create an empty mapping set.
    pub fn new_set(&mut self) -> MappingSetId {
        let (index, generation) = self.sets.insert_with(|_, _| MappingSet {
            regions: Vec::new(),
        });
        MappingSetId { index, generation }
    }

    /// Whether a mapping set handle is live.
    pub fn has_set(&self, set: MappingSetId) -> bool {
        self.sets.get(set.index, set.generation).is_some()
    }

    /// Make `region` (whose record already names `set`) a member of `set`; nothing for
    /// a stale set.
    pub fn join_set(&mut self, set: MappingSetId, region: Region) {
        if let Some(s) = self.sets.get_mut(set.index, set.generation) {
            s.regions.push(region);
        }
    }

    /// Empty a mapping set, returning its regions (`None` for a stale handle). The
    /// regions still name it until the caller deallocates them.
    pub fn take_set(&mut self, set: MappingSetId) -> Option<Vec<Region>> {
        let s = self.sets.get_mut(set.index, set.generation)?;
        Some(core::mem::take(&mut s.regions))
    }

    /// Destroy a mapping set; its regions stay and belong to no set. `false` for a
    /// stale handle.
    pub fn destroy_set(&mut self, set: MappingSetId) -> bool {
        let Some(s) = self.sets.remove(set.index, set.generation) else {
            return false;
        };
        for r in s.regions {
            if let Some(rec) = self.get_mut(r) {
                rec.set = None;
            }
        }
        true
    }

    /// Check the region map's own invariants (module header) for a space over `range`
    /// whose arena is `arena`.
    pub fn check(&self, range: VaRange, arena: &Arena) -> Result<(), Violation> {
        let mut prev_end = range.start.as_u64();
        if !self.regions.memo_is_exact() {
            return fail("the fault's region memo differs from its region", None);
        }
        for (start, r) in self.regions.iter() {
            if start < prev_end || r.len == 0 {
                return fail("regions overlap or are empty", Some(start));
            }
            if r.reserve_start < range.start.as_u64()
                || r.reserve_start + (r.reserve_len - 1) > range.last().as_u64()
            {
                return fail("region outside its space", Some(start));
            }
            if !arena.contains_allocated(r.reserve_start) {
                return fail("region not allocated in the arena", Some(start));
            }
            // A region an unlocked `region_map` is editing joins its set when the edit
            // ends.
            if let Some(s) = r.set.filter(|_| !r.busy) {
                let member = self
                    .sets
                    .get(s.index, s.generation)
                    .is_some_and(|set| set.regions.iter().any(|x| x.start.as_u64() == start));
                if !member {
                    return fail("region names a set it is not a member of", Some(start));
                }
            }
            prev_end = start + r.len;
        }
        // Split-off pieces: each inside one region, with values of its own.
        for (first, pages, piece) in self.segments.iter() {
            match self.at(first.addr().as_u64()) {
                Some((s, r))
                    if (first.0 + pages) << PAGE_SHIFT <= s + r.len && piece != r.piece() => {}
                _ => return fail("protection piece outside its region", Some(first.0)),
            }
        }
        // Set members: live regions naming their set.
        for (index, generation) in self.sets.keys() {
            let Some(set) = self.sets.get(index, generation) else {
                continue;
            };
            let id = MappingSetId { index, generation };
            for r in &set.regions {
                if self.get(*r).map(|rec| rec.set) != Some(Some(id)) {
                    return fail(
                        "mapping set member is not a live region naming the set",
                        Some(r.start.as_u64()),
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::VirtAddr;
    use crate::flags::Prot;
    use crate::vmem::ArenaConfig;

    const BASE: u64 = 0x1000_0000;

    fn space() -> (VaRange, Arena) {
        let arena = Arena::new(ArenaConfig::new(0x1000), None).unwrap();
        arena.add_span(BASE, 0x10_0000).unwrap();
        (VaRange::new(VirtAddr::new(BASE), 0x10_0000).unwrap(), arena)
    }

    /// A region map with one region of `pages` pages allocated in `arena`.
    fn with_region(arena: &Arena, map: &mut RegionMap, pages: u64) -> ResolvedRegion {
        let len = pages << PAGE_SHIFT;
        let start = arena.alloc(len).unwrap();
        let id = map.insert(start, len, start, len);
        let region = Region {
            space: crate::handle::SpaceId::from_raw(0, 0),
            start: VirtAddr::new(start),
            id,
        };
        ResolvedRegion {
            region,
            rec: *map.get(region).unwrap(),
            first: Vpn(start >> PAGE_SHIFT),
            pages,
        }
    }

    #[test]
    fn a_region_naming_a_set_must_be_its_member_and_members_must_name_it() {
        let (range, arena) = space();
        let mut map = RegionMap::default();
        let c = with_region(&arena, &mut map, 4);
        assert_eq!(map.check(range, &arena), Ok(()));
        let set = map.new_set();
        // Named but not joined: caught.
        map.get_mut(c.region).unwrap().set = Some(set);
        assert_eq!(
            map.check(range, &arena).unwrap_err().what,
            "region names a set it is not a member of"
        );
        // Busy (an unlocked map joins at its end): allowed.
        map.get_mut(c.region).unwrap().busy = true;
        assert_eq!(map.check(range, &arena), Ok(()));
        map.get_mut(c.region).unwrap().busy = false;
        map.join_set(set, c.region);
        assert_eq!(map.check(range, &arena), Ok(()));
        // A member that does not name the set: caught.
        map.get_mut(c.region).unwrap().set = None;
        assert_eq!(
            map.check(range, &arena).unwrap_err().what,
            "mapping set member is not a live region naming the set"
        );
        // Destroying the set clears the record; removal leaves the set.
        map.get_mut(c.region).unwrap().set = Some(set);
        assert!(map.destroy_set(set));
        assert_eq!(map.get(c.region).unwrap().set, None);
        let set = map.new_set();
        map.get_mut(c.region).unwrap().set = Some(set);
        map.join_set(set, c.region);
        let c = ResolvedRegion {
            rec: *map.get(c.region).unwrap(),
            ..c
        };
        map.remove(&c);
        assert_eq!(map.take_set(set), Some(Vec::new()));
        assert_eq!(map.check(range, &arena), Ok(()));
    }

    #[test]
    fn overlapping_unallocated_and_outside_regions_are_caught() {
        let (range, arena) = space();
        let mut map = RegionMap::default();
        let c = with_region(&arena, &mut map, 4);
        let start = c.region.start.as_u64();
        // A second record inside the first.
        map.insert(start + 0x1000, 0x1000, start + 0x1000, 0x1000);
        assert_eq!(
            map.check(range, &arena).unwrap_err().what,
            "regions overlap or are empty"
        );
        let mut map = RegionMap::default();
        let free = BASE + 0x8_0000;
        map.insert(free, 0x1000, free, 0x1000);
        assert_eq!(
            map.check(range, &arena).unwrap_err().what,
            "region not allocated in the arena"
        );
        let mut map = RegionMap::default();
        map.insert(BASE + 0x10_0000, 0x1000, BASE + 0x10_0000, 0x1000);
        assert_eq!(
            map.check(range, &arena).unwrap_err().what,
            "region outside its space"
        );
    }

    #[test]
    fn a_piece_outside_its_region_is_caught_and_a_piece_set_back_merges_away() {
        let (range, arena) = space();
        let mut map = RegionMap::default();
        let c = with_region(&arena, &mut map, 4);
        let own = c.rec.piece();
        let ro = |p: Piece| Piece {
            prot: Prot::READ,
            ..p
        };
        map.update_pieces(own, (c.first, c.pages), c.first.add(1), 2, ro);
        assert_eq!(map.piece(own, c.first.add(1)).prot, Prot::READ);
        assert_eq!(map.piece(own, c.first).prot, Prot::RW);
        assert_eq!(map.check(range, &arena), Ok(()));
        // The region goes but its piece stays (a removal that forgot the pieces).
        map.regions.remove(c.region.start.as_u64());
        assert_eq!(
            map.check(range, &arena).unwrap_err().what,
            "protection piece outside its region"
        );
        let mut map = RegionMap::default();
        let c = with_region(&arena, &mut map, 4);
        map.update_pieces(own, (c.first, c.pages), c.first, 4, ro);
        map.update_pieces(own, (c.first, c.pages), c.first, 4, |p| Piece {
            prot: Prot::RW,
            ..p
        });
        assert_eq!(map.uniform(own, c.first, 4), Some(own));
        assert_eq!(map.segments.iter().count(), 0, "set back: merged away");
    }
}
