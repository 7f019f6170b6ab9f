//! Segregated freelists: exact lists for small sizes, 32 sub-lists per power of two
//! above, and a two-level bitmap of the non-empty ones.
//!
//! Sizes are counted in quanta (`u = size / quantum`). A free segment of `u` quanta is
//! on the *class*
//! - `u` itself when `u < 32` (classes 1..=31 hold exactly one size each), or
//! - `32 * (f - 4) + (u >> (f - 5)) % 32` where `f = floor(log2 u) >= 5`: the power of
//!   two `[2^f, 2^(f+1))` split into 32 equal sub-ranges of `2^(f-5)` quanta each
//!   (so sizes 32..=63 quanta also get one class each).
//!
//! Classes are numbered in increasing size: every segment of class `c + 1` is larger
//! than every segment of class `c`. The classes form 60 *groups* of 32; a `u64` has bit
//! `g` set when group `g` has a non-empty class, and a `u32` per group has bit `s` set
//! when class `32 g + s` is non-empty, so "the lowest non-empty class at or above `c`"
//! is two masks and two `trailing_zeros` (see the theory statement, section 4). This is
//! the two-level segregated fit of Masmano et al. (TLSF, ECRTS 2004) with quantum-sized
//! exact classes at the bottom. Lists are LIFO: the most recently freed segment is
//! reused first (warm in caches, and the cheapest to insert and remove).

use alloc::vec;
use alloc::vec::Vec;

use super::seglist::{SegTable, NIL};

/// Classes per group (second level).
const SUB: u32 = 32;
/// `log2(SUB)`.
const SUB_SHIFT: u32 = 5;
/// Groups: group 0 for sizes below 32 quanta, then one per power of two from 2^5 to
/// 2^63 quanta.
const GROUPS: u32 = 64 - SUB_SHIFT + 1;
/// Number of classes.
pub(super) const CLASSES: u32 = GROUPS * SUB;

/// The class of a free segment of `u` quanta (`u >= 1`).
#[inline]
pub(super) fn class_of_quanta(u: u64) -> u32 {
    if u < u64::from(SUB) {
        return u as u32;
    }
    let f = 63 - u.leading_zeros();
    let sub = ((u >> (f - SUB_SHIFT)) as u32) & (SUB - 1);
    (f - SUB_SHIFT + 1) * SUB + sub
}

/// The smallest size, in quanta, of class `c` (`1 <= c < CLASSES`).
#[inline]
pub(super) fn class_min_quanta(c: u32) -> u64 {
    let (g, s) = (c / SUB, c % SUB);
    if g == 0 {
        return u64::from(s);
    }
    let f = g + SUB_SHIFT - 1;
    u64::from(SUB + s) << (f - SUB_SHIFT)
}

/// The heads of the freelists and their two-level occupancy bitmap.
pub(super) struct FreeLists {
    /// `log2(quantum)`.
    shift: u32,
    heads: Vec<u32>,
    /// Bit `g`: group `g` has a non-empty class.
    groups: u64,
    /// Bit `s` of `subs[g]`: class `32 g + s` is non-empty.
    subs: [u32; GROUPS as usize],
}

impl FreeLists {
    /// All lists empty, for an arena of the given quantum (a power of two).
    pub fn new(quantum: u64) -> Self {
        Self {
            shift: quantum.trailing_zeros(),
            heads: vec![NIL; CLASSES as usize],
            groups: 0,
            subs: [0; GROUPS as usize],
        }
    }

    /// The class of a free segment of `size` bytes (a non-zero multiple of the
    /// quantum).
    #[inline]
    pub fn class_of(&self, size: u64) -> u32 {
        class_of_quanta(size >> self.shift)
    }

    /// The lowest class whose every segment holds `size` bytes: the size's own class
    /// when `size` is that class's smallest size, else the next one. May be
    /// [`CLASSES`] (no class qualifies).
    #[inline]
    pub fn first_sufficient(&self, size: u64) -> u32 {
        let u = size >> self.shift;
        let c = class_of_quanta(u);
        if class_min_quanta(c) == u {
            c
        } else {
            c + 1
        }
    }

    /// The lowest non-empty class at or above `c`, if any: O(1).
    #[inline]
    pub fn next_nonempty(&self, c: u32) -> Option<u32> {
        if c >= CLASSES {
            return None;
        }
        let (g, s) = (c / SUB, c % SUB);
        let here = self.subs[g as usize] & (u32::MAX << s);
        if here != 0 {
            return Some(g * SUB + here.trailing_zeros());
        }
        let above = if g + 1 < 64 {
            self.groups & (u64::MAX << (g + 1))
        } else {
            0
        };
        if above == 0 {
            return None;
        }
        let g = above.trailing_zeros();
        Some(g * SUB + self.subs[g as usize].trailing_zeros())
    }

    /// True when class `c` is non-empty.
    #[cfg(test)]
    pub fn occupied(&self, c: u32) -> bool {
        self.subs[(c / SUB) as usize] & (1 << (c % SUB)) != 0
    }

    /// The first segment of class `c`, or [`NIL`].
    #[inline]
    pub fn head(&self, c: u32) -> u32 {
        self.heads[c as usize]
    }

    /// Put the free segment `i` at the head of its list.
    #[inline]
    pub fn insert(&mut self, t: &mut SegTable, i: u32) {
        let c = self.class_of(t.get(i).size);
        let head = self.heads[c as usize];
        let s = t.get_mut(i);
        s.fprev = NIL;
        s.fnext = head;
        if head != NIL {
            t.get_mut(head).fprev = i;
        }
        self.heads[c as usize] = i;
        self.subs[(c / SUB) as usize] |= 1 << (c % SUB);
        self.groups |= 1 << (c / SUB);
    }

    /// Take the free segment `i` off its list (its size must be the one it was
    /// inserted with). Returns the list's new head when `i` was the head, else
    /// [`NIL`].
    #[inline]
    pub fn remove(&mut self, t: &mut SegTable, i: u32) -> u32 {
        let c = self.class_of(t.get(i).size);
        let (fprev, fnext) = {
            let s = t.get(i);
            (s.fprev, s.fnext)
        };
        if fnext != NIL {
            t.get_mut(fnext).fprev = fprev;
        }
        if fprev == NIL {
            self.heads[c as usize] = fnext;
            if fnext == NIL {
                let g = (c / SUB) as usize;
                self.subs[g] &= !(1 << (c % SUB));
                if self.subs[g] == 0 {
                    self.groups &= !(1 << g);
                }
            }
            fnext
        } else {
            t.get_mut(fprev).fnext = fnext;
            NIL
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::seglist::{Kind, Seg};
    use super::*;

    #[test]
    fn small_sizes_have_exact_classes_and_larger_ones_32_per_power_of_two() {
        for u in 1..64 {
            assert_eq!(class_of_quanta(u), u as u32);
            assert_eq!(class_min_quanta(u as u32), u);
        }
        assert_eq!(class_of_quanta(64), 64);
        assert_eq!(
            class_of_quanta(65),
            64,
            "64 and 65 share the 2-quanta class"
        );
        assert_eq!(class_of_quanta(66), 65);
        assert_eq!(class_of_quanta(u64::MAX), CLASSES - 1);
        // Classes are ordered by size and each class's minimum maps back to it.
        let mut prev = 0;
        for c in 1..CLASSES {
            let lo = class_min_quanta(c);
            assert!(lo > prev, "class {c}");
            assert_eq!(class_of_quanta(lo), c);
            assert_eq!(class_of_quanta(lo - 1), c - 1);
            prev = lo;
        }
    }

    #[test]
    fn first_sufficient_class_holds_only_segments_large_enough() {
        let f = FreeLists::new(0x1000);
        assert_eq!(f.first_sufficient(3 * 0x1000), 3);
        assert_eq!(f.first_sufficient(64 * 0x1000), 64);
        // 65 quanta lies inside class 64 (64..=65): only class 65 up is sufficient.
        assert_eq!(f.first_sufficient(65 * 0x1000), 65);
        assert_eq!(class_min_quanta(65), 66);
    }

    #[test]
    fn bitmaps_track_non_empty_classes_through_inserts_and_removes() {
        let mut t = SegTable::new();
        let mut f = FreeLists::new(0x1000);
        let a = t.take(Seg::new(0, 0x1000, Kind::Free));
        let b = t.take(Seg::new(0x1000, 0x1000, Kind::Free));
        let c = t.take(Seg::new(0x4000, 0x40_0000, Kind::Free));
        for i in [a, b, c] {
            f.insert(&mut t, i);
        }
        let big = f.class_of(0x40_0000);
        assert!(f.occupied(1) && f.occupied(big));
        assert_eq!(f.next_nonempty(0), Some(1));
        assert_eq!(f.next_nonempty(2), Some(big));
        assert_eq!(f.next_nonempty(big + 1), None);
        assert_eq!(f.head(1), b, "lists are LIFO");
        f.remove(&mut t, b);
        assert_eq!(f.head(1), a);
        f.remove(&mut t, a);
        assert_eq!(f.next_nonempty(0), Some(big));
        f.remove(&mut t, c);
        assert_eq!(f.next_nonempty(0), None);
        assert_eq!(f.head(big), NIL);
    }
}
