//! The space's regions by start address, the fault path's memo of the last region
//! a fault found, and a region resolved for a call ([`ResolvedRegion`]).
//!
//! A fault needs, of its region, the start, the length and five small fields
//! ([`FaultRegion`]). Looking them up in the map is a tree search (about 30
//! instructions for a small tree, more for a large one) on every fault, although a
//! sweep's faults hit the same region page after page. The memo keeps a copy of the
//! last answer. It is exact because every change of the map goes through this
//! module's methods that take `&mut self` (the map is a private field), and each of
//! them forgets the memo first: a memo that exists is a copy of the record that is in
//! the map *now*, at its start. Regions never overlap, so if `va` lies inside the
//! memo's range, the memo's region is the one that holds `va`. There is no generation
//! counter to bump at call sites: the one place where the map can change is here.

use super::options::Placement;
use super::segments::Piece;
use crate::addr::{VaRange, Vpn, PAGE_SIZE};
use crate::error::RegionError;
use crate::flags::Prot;
use crate::handle::{MappingSetId, Region};
use crate::mmu::Attrs;
use alloc::collections::BTreeMap;

/// One region's record: a small copyable value (split-off pieces live in
/// [`Segments`], not here).
#[derive(Clone, Copy)]
pub(crate) struct RegionRec {
    pub id: u64,
    pub len: u64,
    pub reserve_start: u64,
    pub reserve_len: u64,
    pub prot: Prot,
    pub placement: Placement,
    pub zero_fill_block: u64,
    /// `region_map` gave frames: an absent page is "nowhere", not "zero-fill".
    pub explicit: bool,
    pub mapped: bool,
    pub set: Option<MappingSetId>,
    /// An unlocked edit of its pages is in flight (`unlocked`): KPI calls on it wait.
    pub busy: bool,
    /// The driver's attributes of its pages (split-off pieces aside).
    pub attrs: Attrs,
}

impl RegionRec {
    /// A fresh region's record: read-write, default placement and attributes, no
    /// frames given, not mapped, in no mapping set.
    pub fn new(id: u64, len: u64, reserve_start: u64, reserve_len: u64) -> RegionRec {
        RegionRec {
            id,
            len,
            reserve_start,
            reserve_len,
            prot: Prot::RW,
            placement: Placement::default(),
            zero_fill_block: 0,
            explicit: false,
            mapped: false,
            set: None,
            busy: false,
            attrs: Attrs::default(),
        }
    }

    /// The region's own protection and attributes (what its unsplit pages have).
    pub fn piece(&self) -> Piece {
        Piece {
            prot: self.prot,
            attrs: self.attrs,
        }
    }
}

/// What a fault reads of its region (a copy; see the module header for why it stays
/// exact).
#[derive(Clone, Copy)]
pub(crate) struct FaultRegion {
    pub start: u64,
    pub len: u64,
    /// The region's own protection and attributes ([`RegionRec::piece`]).
    pub piece: Piece,
    pub placement: Placement,
    pub zero_fill_block: u64,
    pub explicit: bool,
    /// An unlocked edit maps the region's pages right now ([`RegionRec::busy`]).
    pub busy: bool,
}

impl FaultRegion {
    fn of(start: u64, r: &RegionRec) -> FaultRegion {
        FaultRegion {
            start,
            len: r.len,
            piece: r.piece(),
            placement: r.placement,
            zero_fill_block: r.zero_fill_block,
            explicit: r.explicit,
            busy: r.busy,
        }
    }
}

/// Regions by start address (they never overlap), with the fault memo.
#[derive(Default)]
pub(crate) struct Regions {
    map: BTreeMap<u64, RegionRec>,
    /// A copy of the region the last fault found, forgotten by every change of `map`.
    memo: Option<FaultRegion>,
}

impl Regions {
    /// The region starting at `start`.
    pub fn get(&self, start: u64) -> Option<&RegionRec> {
        self.map.get(&start)
    }

    /// The region starting at `start`, to change (forgets the memo).
    pub fn get_mut(&mut self, start: u64) -> Option<&mut RegionRec> {
        self.memo = None;
        self.map.get_mut(&start)
    }

    /// Record a region starting at `start` (forgets the memo).
    pub fn insert(&mut self, start: u64, rec: RegionRec) {
        self.memo = None;
        self.map.insert(start, rec);
    }

    /// Remove the region starting at `start` (forgets the memo).
    pub fn remove(&mut self, start: u64) -> Option<RegionRec> {
        self.memo = None;
        self.map.remove(&start)
    }

    /// Remove every region (forgets the memo).
    pub fn clear(&mut self) {
        self.memo = None;
        self.map.clear();
    }

    /// Every region with its start, in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &RegionRec)> {
        self.map.iter().map(|(s, r)| (*s, r))
    }

    /// The regions overlapping `[start, end)`, with their starts, in address order.
    pub fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, &RegionRec)> {
        let first = self.at(start).map_or(start, |(s, _)| s);
        self.map.range(first..end).map(|(s, r)| (*s, r))
    }

    /// The region holding `va`, with its start.
    pub fn at(&self, va: u64) -> Option<(u64, &RegionRec)> {
        let (start, r) = self.map.range(..=va).next_back()?;
        (va - start < r.len).then_some((*start, r))
    }

    /// What a fault at `va` reads of its region: the memo if it holds `va`, else one
    /// search, whose answer becomes the memo.
    #[inline]
    pub fn for_fault(&mut self, va: u64) -> Option<FaultRegion> {
        if let Some(m) = self.memo {
            if va.wrapping_sub(m.start) < m.len {
                return Some(m);
            }
        }
        self.search_for_fault(va)
    }

    #[inline(never)]
    fn search_for_fault(&mut self, va: u64) -> Option<FaultRegion> {
        let (start, r) = self.at(va)?;
        let m = FaultRegion::of(start, r);
        self.memo = Some(m);
        Some(m)
    }

    /// Whether the memo, if any, is a copy of the region at its start (for
    /// `check_invariants`).
    pub fn memo_is_exact(&self) -> bool {
        let Some(m) = self.memo else {
            return true;
        };
        self.map.get(&m.start).is_some_and(|r| {
            let now = FaultRegion::of(m.start, r);
            now.len == m.len
                && now.piece == m.piece
                && now.placement == m.placement
                && now.zero_fill_block == m.zero_fill_block
                && now.explicit == m.explicit
                && now.busy == m.busy
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::Prot;

    fn rec(id: u64, len: u64) -> RegionRec {
        RegionRec::new(id, len, 0, len)
    }

    #[test]
    fn memo_answers_like_the_map_and_forgets_every_change() {
        let mut r = Regions::default();
        r.insert(0x1000, rec(1, 0x2000));
        r.insert(0x8000, rec(2, 0x1000));
        let f = r.for_fault(0x1800).expect("inside the first region");
        assert_eq!((f.start, f.len), (0x1000, 0x2000));
        // A hit of the memo and a miss that moves it give the map's answers.
        assert_eq!(r.for_fault(0x2fff).map(|f| f.start), Some(0x1000));
        assert!(r.for_fault(0x3000).is_none());
        assert_eq!(r.for_fault(0x8000).map(|f| f.start), Some(0x8000));
        assert!(r.for_fault(0x0fff).is_none());
        // A change through get_mut is seen by the next fault, not hidden by the memo.
        r.for_fault(0x8000).expect("memo on the second region");
        r.get_mut(0x8000).expect("present").prot = Prot::READ;
        r.get_mut(0x8000).expect("present").explicit = true;
        let f = r.for_fault(0x8000).expect("still there");
        assert!(f.explicit);
        assert_eq!(f.piece.prot, Prot::READ);
        assert!(r.memo_is_exact());
        // Removal, reinsertion with another length, and clear are seen too.
        r.remove(0x8000);
        assert!(r.for_fault(0x8000).is_none());
        r.insert(0x8000, rec(3, 0x3000));
        assert_eq!(r.for_fault(0x9000).map(|f| f.len), Some(0x3000));
        r.clear();
        assert!(r.for_fault(0x9000).is_none());
        assert!(r.memo_is_exact());
    }
}

/// A region resolved under its space's lock: the handle, a copy of its record and the
/// pages it spans.
#[derive(Clone, Copy)]
pub(crate) struct ResolvedRegion {
    pub region: Region,
    pub rec: RegionRec,
    /// First page number.
    pub first: Vpn,
    /// Pages spanned.
    pub pages: u64,
}

impl ResolvedRegion {
    /// The pages of `range`, which must be non-empty, page-aligned and inside the
    /// region.
    ///
    /// # Errors
    /// [`RegionError::BadRange`] otherwise.
    pub(crate) fn range(&self, range: VaRange) -> Result<(Vpn, u64), RegionError> {
        let start = self.region.start.as_u64();
        let ok = range.len > 0
            && range.start.as_u64() % PAGE_SIZE == 0
            && range.len % PAGE_SIZE == 0
            && range.start.as_u64() >= start
            && range
                .start
                .as_u64()
                .checked_add(range.len)
                .is_some_and(|end| end <= start + (self.pages << crate::addr::PAGE_SHIFT));
        if !ok {
            return Err(RegionError::BadRange(range));
        }
        Ok((range.start.vpn(), range.len >> crate::addr::PAGE_SHIFT))
    }
}
