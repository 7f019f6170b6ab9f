//! Power-of-two freelists with a bitmap of the non-empty ones.
//!
//! A free segment of `size` bytes is on list `floor(log2(size))`, so list `k` holds
//! sizes in `[2^k, 2^(k+1))`. Bit `k` of the bitmap is set exactly when list `k` is
//! non-empty, which lets instant-fit find "the lowest non-empty list at or above `k`"
//! with one mask and one `trailing_zeros` (see the theory statement, section 4).
//! Lists are LIFO: the most recently freed segment is reused first (warm in caches,
//! and the cheapest to insert and remove).

use super::seglist::{SegTable, NIL};

/// Number of freelists: one per bit of a `u64` size.
pub(super) const LISTS: usize = 64;

/// The freelist a free segment of `size` (> 0) bytes belongs to.
#[inline]
pub(super) fn list_of(size: u64) -> u32 {
    63 - size.leading_zeros()
}

/// The heads of the 64 freelists and their occupancy bitmap.
pub(super) struct FreeLists {
    heads: [u32; LISTS],
    bitmap: u64,
}

impl FreeLists {
    /// All lists empty.
    pub fn new() -> Self {
        Self {
            heads: [NIL; LISTS],
            bitmap: 0,
        }
    }

    /// Bit `k` set when list `k` is non-empty.
    #[inline]
    pub fn bitmap(&self) -> u64 {
        self.bitmap
    }

    /// The first segment of list `k`, or [`NIL`].
    #[inline]
    pub fn head(&self, k: u32) -> u32 {
        self.heads[k as usize]
    }

    /// Put the free segment `i` at the head of its list.
    #[inline]
    pub fn insert(&mut self, t: &mut SegTable, i: u32) {
        let k = list_of(t.get(i).size);
        let head = self.heads[k as usize];
        let s = t.get_mut(i);
        s.fprev = NIL;
        s.fnext = head;
        if head != NIL {
            t.get_mut(head).fprev = i;
        }
        self.heads[k as usize] = i;
        self.bitmap |= 1 << k;
    }

    /// Take the free segment `i` off its list (its size must be the one it was
    /// inserted with).
    #[inline]
    pub fn remove(&mut self, t: &mut SegTable, i: u32) {
        let k = list_of(t.get(i).size);
        let (fprev, fnext) = {
            let s = t.get(i);
            (s.fprev, s.fnext)
        };
        if fprev == NIL {
            self.heads[k as usize] = fnext;
            if fnext == NIL {
                self.bitmap &= !(1 << k);
            }
        } else {
            t.get_mut(fprev).fnext = fnext;
        }
        if fnext != NIL {
            t.get_mut(fnext).fprev = fprev;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::seglist::{Kind, Seg};
    use super::*;

    #[test]
    fn list_index_is_floor_log2_of_the_size() {
        assert_eq!(list_of(1), 0);
        assert_eq!(list_of(0x1000), 12);
        assert_eq!(list_of(0x1fff), 12);
        assert_eq!(list_of(u64::MAX), 63);
    }

    #[test]
    fn bitmap_tracks_non_empty_lists_through_inserts_and_removes() {
        let mut t = SegTable::new();
        let mut f = FreeLists::new();
        let a = t.take(Seg::new(0, 0x1000, Kind::Free));
        let b = t.take(Seg::new(0x1000, 0x1800, Kind::Free));
        let c = t.take(Seg::new(0x4000, 0x4000, Kind::Free));
        for i in [a, b, c] {
            f.insert(&mut t, i);
        }
        assert_eq!(f.bitmap(), (1 << 12) | (1 << 14));
        assert_eq!(f.head(12), b, "lists are LIFO");
        f.remove(&mut t, b);
        assert_eq!(f.head(12), a);
        f.remove(&mut t, a);
        assert_eq!(f.bitmap(), 1 << 14);
        f.remove(&mut t, c);
        assert_eq!(f.bitmap(), 0);
        assert_eq!(f.head(14), NIL);
    }
}
