//! Protection of page ranges inside regions: what a range protect splits off.
//!
//! A region has one protection; `region_protect_range` gives part of it another, as
//! Linux splits a VMA. The split pieces live here, beside the regions rather than in
//! them, so that a region record stays one small copyable value and an unsplit space
//! pays one emptiness check: a map from first page to `(pages, protection)` of every
//! piece whose protection differs from its region's. Pieces never overlap; a piece set
//! back to its region's protection disappears (the split merges back), and
//! deallocating a region or protecting it whole drops its pieces.
//!
//! The fault path, the eager mirrors and zero-fill blocks read the protection of a page
//! through [`Segments::prot_at`]; [`Prot::empty`] (no access) is a protection like any
//! other here: such a page is mapped by no table and every access to it faults.

use crate::addr::Vpn;
use crate::flags::Prot;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;

/// The split-off pieces of every region of one space.
#[derive(Default)]
pub(crate) struct Segments {
    /// First page → (pages, protection).
    pieces: BTreeMap<u64, (u64, Prot)>,
}

impl Segments {
    /// The protection of `vpn` in a region whose own protection is `region`.
    #[inline]
    pub fn prot_at(&self, region: Prot, vpn: Vpn) -> Prot {
        if self.pieces.is_empty() {
            return region;
        }
        match self.pieces.range(..=vpn.0).next_back() {
            Some((&s, &(n, p))) if vpn.0 < s + n => p,
            _ => region,
        }
    }

    /// The protection of every page of `[first, first + pages)` if it is the same for
    /// all of them, `None` otherwise.
    pub fn uniform(&self, region: Prot, first: Vpn, pages: u64) -> Option<Prot> {
        let p = self.prot_at(region, first);
        if self.pieces.is_empty() {
            return Some(p);
        }
        let end = first.0 + pages;
        // A piece starting inside the range, or the piece covering `first` ending
        // before `end`, changes the protection.
        let starts_inside = self.pieces.range(first.0 + 1..end).next().is_some();
        let covering_ends = match self.pieces.range(..=first.0).next_back() {
            Some((&s, &(n, _))) if first.0 < s + n => s + n < end,
            _ => false,
        };
        (!starts_inside && !covering_ends).then_some(p)
    }

    /// Give `[first, first + pages)` protection `prot` inside the region `within`
    /// (its first page and page count) of protection `region`: pieces there are cut
    /// away, and a new piece is recorded unless `prot` is the region's own (merged
    /// with touching pieces of the same protection in the same region).
    pub fn set(&mut self, region: Prot, within: (Vpn, u64), first: Vpn, pages: u64, prot: Prot) {
        self.clear(first, pages);
        if prot != region {
            self.pieces.insert(first.0, (pages, prot));
            self.merge_around(first.0, within);
        }
    }

    /// Drop every piece inside `[first, first + pages)`, cutting the ones that straddle
    /// its ends.
    pub fn clear(&mut self, first: Vpn, pages: u64) {
        if self.pieces.is_empty() {
            return;
        }
        let (a, end) = (first.0, first.0 + pages);
        // A piece that starts before `a` and reaches into the range keeps its head, and
        // its tail if it also reaches past the end.
        if let Some((&s, &(n, p))) = self.pieces.range(..a).next_back() {
            if s + n > a {
                self.pieces.insert(s, (a - s, p));
                if s + n > end {
                    self.pieces.insert(end, (s + n - end, p));
                }
            }
        }
        let inside: Vec<u64> = self.pieces.range(a..end).map(|(&s, _)| s).collect();
        for s in inside {
            let (n, p) = self.pieces.remove(&s).expect("listed");
            if s + n > end {
                self.pieces.insert(end, (s + n - end, p));
            }
        }
    }

    /// Merge the piece at `start` with equal-protection neighbours that touch it
    /// inside the region `(first, pages)` (pieces of two regions never merge).
    fn merge_around(&mut self, start: u64, (rfirst, rpages): (Vpn, u64)) {
        let (mut s, (mut n, p)) = (start, self.pieces[&start]);
        if let Some((&ps, &(pn, pp))) = self.pieces.range(..s).next_back() {
            if ps + pn == s && pp == p && ps >= rfirst.0 {
                self.pieces.remove(&s);
                s = ps;
                n += pn;
                self.pieces.insert(s, (n, p));
            }
        }
        if let Some(&(nn, np)) = self.pieces.get(&(s + n)) {
            if np == p && s + n < rfirst.0 + rpages {
                self.pieces.remove(&(s + n));
                self.pieces.insert(s, (n + nn, p));
            }
        }
    }

    /// Every piece, in address order: `(first, pages, protection)`.
    pub fn iter(&self) -> impl Iterator<Item = (Vpn, u64, Prot)> + '_ {
        self.pieces.iter().map(|(&s, &(n, p))| (Vpn(s), n, p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_merge_and_read_back() {
        let mut s = Segments::default();
        let rw = Prot::RW;
        let region = (Vpn(0), 100);
        s.set(rw, region, Vpn(10), 10, Prot::READ);
        assert_eq!(s.prot_at(rw, Vpn(9)), rw);
        assert_eq!(s.prot_at(rw, Vpn(10)), Prot::READ);
        assert_eq!(s.prot_at(rw, Vpn(19)), Prot::READ);
        assert_eq!(s.prot_at(rw, Vpn(20)), rw);
        assert_eq!(s.uniform(rw, Vpn(10), 10), Some(Prot::READ));
        assert_eq!(s.uniform(rw, Vpn(5), 10), None);
        assert_eq!(s.uniform(rw, Vpn(15), 10), None);
        assert_eq!(s.uniform(rw, Vpn(0), 10), Some(rw));
        // A hole in the middle: three pieces' worth, two recorded.
        s.set(rw, region, Vpn(14), 2, Prot::empty());
        let v: Vec<_> = s.iter().collect();
        assert_eq!(
            v,
            [
                (Vpn(10), 4, Prot::READ),
                (Vpn(14), 2, Prot::empty()),
                (Vpn(16), 4, Prot::READ)
            ]
        );
        // Back to read: merges into one piece again.
        s.set(rw, region, Vpn(14), 2, Prot::READ);
        assert_eq!(s.iter().collect::<Vec<_>>(), [(Vpn(10), 10, Prot::READ)]);
        // Back to the region's protection in part: the piece is cut, none recorded.
        s.set(rw, region, Vpn(10), 5, rw);
        // Touching pieces of two regions stay apart.
        s.set(rw, (Vpn(20), 10), Vpn(20), 2, Prot::READ);
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            [(Vpn(15), 5, Prot::READ), (Vpn(20), 2, Prot::READ)]
        );
        s.clear(Vpn(20), 2);
        assert_eq!(s.iter().collect::<Vec<_>>(), [(Vpn(15), 5, Prot::READ)]);
        s.clear(Vpn(0), 100);
        assert_eq!(s.iter().count(), 0);
    }
}
