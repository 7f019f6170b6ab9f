//! Protection and attributes of page ranges inside regions: what a range call splits
//! off.
//!
//! A region has one protection and one attribute value ([`crate::Attrs`], the driver's
//! opaque per-page value); `region_protect` and `region_set_attrs` give
//! part of it others, as Linux splits a VMA. The split pieces live here, beside the
//! regions rather than in them, so that a region record stays one small copyable value
//! and an unsplit space pays one emptiness check: a map from first page to `(pages,
//! piece)` of every range whose [`Piece`] differs from its region's. Pieces never
//! overlap and never span two regions; a piece set back to its region's values
//! disappears and touching equal pieces of one region merge (the split merges back);
//! deallocating a region drops its pieces.
//!
//! The fault path, the eager mirrors, zero-fill blocks and frame requests read a
//! page's values through [`Segments::at`]; [`crate::Prot::empty`] (no access) is a
//! protection like any other here: such a page is mapped by no table and every access
//! to it faults.

use crate::addr::Vpn;
use crate::flags::Prot;
use crate::mmu::Attrs;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;

/// What a page range may hold apart from its region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub prot: Prot,
    pub attrs: Attrs,
}

/// The split-off pieces of every region of one space.
#[derive(Default)]
pub(crate) struct Segments {
    /// First page → (pages, values).
    pieces: BTreeMap<u64, (u64, Piece)>,
}

impl Segments {
    /// The values of `vpn` in a region whose own are `region`.
    #[inline]
    pub fn at(&self, region: Piece, vpn: Vpn) -> Piece {
        if self.pieces.is_empty() {
            return region;
        }
        match self.pieces.range(..=vpn.0).next_back() {
            Some((&s, &(n, p))) if vpn.0 < s + n => p,
            _ => region,
        }
    }

    /// The values of every page of `[first, first + pages)` if they are the same for
    /// all of them, `None` otherwise.
    #[inline]
    pub fn uniform(&self, region: Piece, first: Vpn, pages: u64) -> Option<Piece> {
        if self.pieces.is_empty() {
            // An unsplit space (every fault's common case): the region's values.
            return Some(region);
        }
        self.uniform_split(region, first, pages)
    }

    /// [`Segments::uniform`] when some region has pieces.
    fn uniform_split(&self, region: Piece, first: Vpn, pages: u64) -> Option<Piece> {
        let p = self.at(region, first);
        let end = first.0 + pages;
        // A piece starting inside the range, or the piece covering `first` ending
        // before `end`, changes the values.
        let starts_inside = self.pieces.range(first.0 + 1..end).next().is_some();
        let covering_ends = match self.pieces.range(..=first.0).next_back() {
            Some((&s, &(n, _))) if first.0 < s + n => s + n < end,
            _ => false,
        };
        (!starts_inside && !covering_ends).then_some(p)
    }

    /// Apply `f` to the values of every page of `[first, first + pages)`, inside the
    /// region `within` (its first page and page count) whose own values are `region`:
    /// the range is cut out of the pieces around it, each of its parts (pieces, and
    /// gaps holding the region's values) gets `f`'s result, parts equal to the
    /// region's are dropped and touching equal pieces merge.
    pub fn update(
        &mut self,
        region: Piece,
        within: (Vpn, u64),
        first: Vpn,
        pages: u64,
        f: impl Fn(Piece) -> Piece,
    ) {
        // Nothing split and nothing to split (every `region_map` asks): no work.
        if self.pieces.is_empty() && f(region) == region {
            return;
        }
        let (a, end) = (first.0, first.0 + pages);
        // The parts of the range, in order, with their current values.
        let mut parts: Vec<(u64, u64, Piece)> = Vec::new();
        let mut at = a;
        for (s, n, p) in self.cut(a, end) {
            if s > at {
                parts.push((at, s - at, region));
            }
            parts.push((s, n, p));
            at = s + n;
        }
        if at < end {
            parts.push((at, end - at, region));
        }
        for (s, n, p) in parts {
            let new = f(p);
            if new != region {
                self.pieces.insert(s, (n, new));
            }
        }
        self.merge(within);
    }

    /// Drop every piece inside `[first, first + pages)`, cutting the ones that straddle
    /// its ends.
    pub fn clear(&mut self, first: Vpn, pages: u64) {
        if !self.pieces.is_empty() {
            self.cut(first.0, first.0 + pages);
        }
    }

    /// Remove the pieces inside `[a, end)` (cutting those that straddle its ends) and
    /// return them, clipped to it, in order.
    fn cut(&mut self, a: u64, end: u64) -> Vec<(u64, u64, Piece)> {
        // A piece that starts before `a` and reaches into the range keeps its head, and
        // its tail if it also reaches past the end.
        let mut out = Vec::new();
        if let Some((&s, &(n, p))) = self.pieces.range(..a).next_back() {
            if s + n > a {
                self.pieces.insert(s, (a - s, p));
                if s + n > end {
                    self.pieces.insert(end, (s + n - end, p));
                }
                out.push((a, (s + n).min(end) - a, p));
            }
        }
        let inside: Vec<u64> = self.pieces.range(a..end).map(|(&s, _)| s).collect();
        for s in inside {
            let (n, p) = self.pieces.remove(&s).expect("listed");
            if s + n > end {
                self.pieces.insert(end, (s + n - end, p));
            }
            out.push((s, n.min(end - s), p));
        }
        out
    }

    /// Merge touching equal pieces inside the region `(first, pages)` (pieces of two
    /// regions never merge).
    fn merge(&mut self, (rfirst, rpages): (Vpn, u64)) {
        let mine: Vec<(u64, u64, Piece)> = self
            .pieces
            .range(rfirst.0..rfirst.0 + rpages)
            .map(|(&s, &(n, p))| (s, n, p))
            .collect();
        let mut open: Option<(u64, u64, Piece)> = None;
        for (s, n, p) in mine {
            match &mut open {
                Some((os, on, op)) if *os + *on == s && *op == p => {
                    *on += n;
                    self.pieces.remove(&s);
                    self.pieces.insert(*os, (*on, p));
                }
                _ => open = Some((s, n, p)),
            }
        }
    }

    /// Every piece, in address order: `(first, pages, values)`.
    pub fn iter(&self) -> impl Iterator<Item = (Vpn, u64, Piece)> + '_ {
        self.pieces.iter().map(|(&s, &(n, p))| (Vpn(s), n, p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(prot: Prot, attrs: u32) -> Piece {
        Piece {
            prot,
            attrs: Attrs(attrs),
        }
    }

    #[test]
    fn pieces_split_merge_and_read_back() {
        let mut s = Segments::default();
        let region = piece(Prot::RW, 0);
        let within = (Vpn(0), 100);
        let prot = |p: Prot| move |x: Piece| Piece { prot: p, ..x };
        s.update(region, within, Vpn(10), 10, prot(Prot::READ));
        assert_eq!(s.at(region, Vpn(9)), region);
        assert_eq!(s.at(region, Vpn(10)).prot, Prot::READ);
        assert_eq!(s.at(region, Vpn(19)).prot, Prot::READ);
        assert_eq!(s.at(region, Vpn(20)), region);
        assert_eq!(s.uniform(region, Vpn(10), 10), Some(piece(Prot::READ, 0)));
        assert_eq!(s.uniform(region, Vpn(5), 10), None);
        assert_eq!(s.uniform(region, Vpn(15), 10), None);
        assert_eq!(s.uniform(region, Vpn(0), 10), Some(region));
        // A hole in the middle, then attributes over part of it and beyond.
        s.update(region, within, Vpn(14), 2, prot(Prot::empty()));
        s.update(region, within, Vpn(15), 10, |x| Piece {
            attrs: Attrs(7),
            ..x
        });
        let v: Vec<_> = s.iter().collect();
        assert_eq!(
            v,
            [
                (Vpn(10), 4, piece(Prot::READ, 0)),
                (Vpn(14), 1, piece(Prot::empty(), 0)),
                (Vpn(15), 1, piece(Prot::empty(), 7)),
                (Vpn(16), 4, piece(Prot::READ, 7)),
                (Vpn(20), 5, piece(Prot::RW, 7)),
            ]
        );
        // Everything back to the region's values: no piece is left.
        s.update(region, within, Vpn(0), 100, |_| region);
        assert_eq!(s.iter().count(), 0);
        // Equal neighbours merge; touching pieces of two regions stay apart.
        s.update(region, within, Vpn(10), 5, prot(Prot::READ));
        s.update(region, within, Vpn(15), 5, prot(Prot::READ));
        s.update(region, (Vpn(100), 10), Vpn(100), 2, prot(Prot::READ));
        s.update(region, within, Vpn(98), 2, prot(Prot::READ));
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            [
                (Vpn(10), 10, piece(Prot::READ, 0)),
                (Vpn(98), 2, piece(Prot::READ, 0)),
                (Vpn(100), 2, piece(Prot::READ, 0))
            ]
        );
        s.clear(Vpn(12), 90);
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            [(Vpn(10), 2, piece(Prot::READ, 0))]
        );
    }
}
