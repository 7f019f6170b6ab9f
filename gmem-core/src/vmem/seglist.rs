//! The segment table: boundary tags in a slab, linked in address order.
//!
//! Every span marker and every segment (free, allocated to a caller, or imported by a
//! quantum cache) is one [`Seg`] in a `Vec`, named by its `u32` index; released slots
//! are recycled through a stack. Index [`SENTINEL`] is the head of a circular,
//! address-ordered, doubly linked list of all of them (`anext`/`aprev`): a span marker
//! precedes the segments that tile its span, so a segment's neighbours tell at once
//! whether they can coalesce with it (both free and not separated by a marker). The
//! `fnext`/`fprev` links are for the freelist a free segment is on
//! ([`super::freelist`]).
//!
//! Beside the records, one bit per slot says whether it holds a free segment. A free
//! asks it whether the freed segment's address neighbours can coalesce: the bitmap is
//! 1/256 of the records' size (160 KiB for a million records, in the L2 cache), where
//! the neighbours' records are random cache lines of a slab tens of MiB large.
//! Every change of kind goes through [`SegTable`] ([`SegTable::take`],
//! [`SegTable::set_kind`], [`SegTable::release`]), which keeps the bit in step.

use alloc::vec;
use alloc::vec::Vec;

/// "No segment" in a link.
pub(super) const NIL: u32 = u32::MAX;
/// Index of the list head; never released.
pub(super) const SENTINEL: u32 = 0;

/// What a table slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// The head of the address list.
    Sentinel,
    /// A span marker: `start`/`size` are the span's.
    Span,
    /// A free segment, on a freelist.
    Free,
    /// A segment allocated to a caller through the arena.
    Alloc,
    /// A segment imported by a quantum cache (held by a cache or handed out by it).
    Cached,
    /// A released slot waiting for reuse.
    Unused,
}

/// Tags stored in `fprev` of a record that is not a free segment (see [`Seg`]).
const TAG_SENTINEL: u32 = u32::MAX - 1;
const TAG_SPAN: u32 = u32::MAX - 2;
const TAG_ALLOC: u32 = u32::MAX - 3;
const TAG_CACHED: u32 = u32::MAX - 4;
const TAG_UNUSED: u32 = u32::MAX - 5;
/// Indices stay below this, clear of [`NIL`] and the tags.
const MAX_RECORDS: usize = (u32::MAX - 8) as usize;

/// One boundary tag: 32 bytes, aligned to 32, so a record never straddles two cache
/// lines and two records share one. The kind is not a field of its own: a free
/// segment's `fprev` is a freelist link ([`NIL`] or an index), and every other kind
/// stores a tag above every index there (`fprev` means nothing for it), which keeps
/// the record at four words.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub(super) struct Seg {
    /// First byte.
    pub start: u64,
    /// Length in bytes, non-zero for segments and span markers.
    pub size: u64,
    /// Next in address order.
    pub anext: u32,
    /// Previous in address order.
    pub aprev: u32,
    /// Next on the freelist (free segments only).
    pub fnext: u32,
    /// Previous on the freelist (free segments), or the kind's tag (any other kind).
    pub fprev: u32,
}

const _: () = assert!(core::mem::size_of::<Seg>() == 32);

impl Seg {
    /// A detached record.
    pub fn new(start: u64, size: u64, kind: Kind) -> Self {
        let mut s = Self {
            start,
            size,
            anext: NIL,
            aprev: NIL,
            fnext: NIL,
            fprev: NIL,
        };
        s.set_kind(kind);
        s
    }

    /// What the slot holds.
    #[inline]
    pub fn kind(&self) -> Kind {
        match self.fprev {
            TAG_SENTINEL => Kind::Sentinel,
            TAG_SPAN => Kind::Span,
            TAG_ALLOC => Kind::Alloc,
            TAG_CACHED => Kind::Cached,
            TAG_UNUSED => Kind::Unused,
            _ => Kind::Free,
        }
    }

    /// Make the record hold `kind` (private: a record in the table changes kind
    /// through [`SegTable::set_kind`], which keeps the free bitmap in step).
    #[inline]
    fn set_kind(&mut self, kind: Kind) {
        self.fprev = match kind {
            Kind::Sentinel => TAG_SENTINEL,
            Kind::Span => TAG_SPAN,
            Kind::Alloc => TAG_ALLOC,
            Kind::Cached => TAG_CACHED,
            Kind::Unused => TAG_UNUSED,
            Kind::Free => NIL,
        };
    }

    /// The last byte (inclusive); meaningful for segments and markers (size >= 1).
    #[inline]
    pub fn last(&self) -> u64 {
        self.start.wrapping_add(self.size.wrapping_sub(1))
    }

    /// True for free, allocated and cached segments (not markers, sentinel, unused).
    #[inline]
    pub fn is_segment(&self) -> bool {
        matches!(self.kind(), Kind::Free | Kind::Alloc | Kind::Cached)
    }
}

/// The slab of boundary tags and its address-ordered list.
pub(super) struct SegTable {
    segs: Vec<Seg>,
    unused: Vec<u32>,
    /// Bit `i % 64` of word `i / 64`: slot `i` holds a free segment.
    free_bits: Vec<u64>,
}

impl SegTable {
    /// A table holding only the sentinel (an empty circular list).
    pub fn new() -> Self {
        let mut head = Seg::new(0, 0, Kind::Sentinel);
        head.anext = SENTINEL;
        head.aprev = SENTINEL;
        Self {
            segs: vec![head],
            unused: Vec::new(),
            free_bits: vec![0],
        }
    }

    /// Record in the bitmap whether slot `i` (an existing slot: the bitmap has a
    /// word for every 64 slots) holds a free segment.
    #[inline]
    fn mark(&mut self, i: u32, free: bool) {
        let w = &mut self.free_bits[(i / 64) as usize];
        *w = (*w & !(1 << (i % 64))) | (u64::from(free) << (i % 64));
    }

    /// True when slot `i` holds a free segment (false for [`NIL`]); reads only the
    /// bitmap, not the record.
    #[inline]
    pub fn is_free(&self, i: u32) -> bool {
        self.free_bits
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Make record `i` hold `kind`. A record made free is off every freelist until
    /// [`super::freelist::FreeLists::insert`] links it.
    #[inline]
    pub fn set_kind(&mut self, i: u32, kind: Kind) {
        self.segs[i as usize].set_kind(kind);
        self.mark(i, kind == Kind::Free);
    }

    /// The record at `i`.
    #[inline]
    pub fn get(&self, i: u32) -> &Seg {
        &self.segs[i as usize]
    }

    /// The record at `i`, mutably.
    #[inline]
    pub fn get_mut(&mut self, i: u32) -> &mut Seg {
        &mut self.segs[i as usize]
    }

    /// Start loading record `i` into the cache (a hint; `i` may be [`NIL`]).
    #[inline]
    pub fn prefetch(&self, i: u32) {
        if let Some(s) = self.segs.get(i as usize) {
            super::prefetch(s);
        }
    }

    /// True when `n` more records can be taken (indices stay below the tags).
    #[inline]
    pub fn can_take(&self, n: usize) -> bool {
        let fresh = MAX_RECORDS.saturating_sub(self.segs.len());
        self.unused.len().saturating_add(fresh) >= n
    }

    /// Store `seg` in a free slot and return its index. The caller checked
    /// [`Self::can_take`].
    #[inline(always)]
    pub fn take(&mut self, seg: Seg) -> u32 {
        let i = match self.unused.pop() {
            Some(i) => {
                self.segs[i as usize] = seg;
                i
            }
            None => {
                let i = self.segs.len() as u32;
                self.segs.push(seg);
                if i % 64 == 0 {
                    self.free_bits.push(0);
                }
                i
            }
        };
        self.mark(i, seg.kind() == Kind::Free);
        i
    }

    /// Mark `i` unused and recycle it; it must be unlinked.
    #[inline]
    pub fn release(&mut self, i: u32) {
        self.set_kind(i, Kind::Unused);
        self.unused.push(i);
    }

    /// Link the detached record `i` into the address list just before `at`.
    #[inline]
    pub fn insert_before(&mut self, at: u32, i: u32) {
        let prev = self.get(at).aprev;
        self.link(prev, i, at);
    }

    /// Link the detached record `i` into the address list just after `at`.
    #[inline]
    pub fn insert_after(&mut self, at: u32, i: u32) {
        let next = self.get(at).anext;
        self.link(at, i, next);
    }

    #[inline]
    fn link(&mut self, prev: u32, i: u32, next: u32) {
        self.get_mut(i).aprev = prev;
        self.get_mut(i).anext = next;
        self.get_mut(prev).anext = i;
        self.get_mut(next).aprev = i;
    }

    /// Unlink `i` from the address list.
    #[inline]
    pub fn unlink(&mut self, i: u32) {
        let Seg { anext, aprev, .. } = *self.get(i);
        self.get_mut(aprev).anext = anext;
        self.get_mut(anext).aprev = aprev;
    }

    /// Number of slots in use, the sentinel included.
    #[cfg(test)]
    pub fn live(&self) -> usize {
        self.segs.len() - self.unused.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_link_in_order_and_released_slots_are_reused() {
        let mut t = SegTable::new();
        let a = t.take(Seg::new(0, 1, Kind::Free));
        t.insert_before(SENTINEL, a);
        let c = t.take(Seg::new(2, 1, Kind::Free));
        t.insert_after(a, c);
        let b = t.take(Seg::new(1, 1, Kind::Alloc));
        t.insert_before(c, b);
        let mut order = Vec::new();
        let mut i = t.get(SENTINEL).anext;
        while i != SENTINEL {
            order.push(t.get(i).start);
            i = t.get(i).anext;
        }
        assert_eq!(order, [0, 1, 2]);
        assert!(t.is_free(a) && !t.is_free(b) && t.is_free(c));
        assert!(!t.is_free(SENTINEL) && !t.is_free(NIL));
        t.set_kind(c, Kind::Alloc);
        assert!(!t.is_free(c));
        t.set_kind(b, Kind::Free);
        assert!(t.is_free(b));
        t.unlink(b);
        t.release(b);
        assert!(!t.is_free(b), "a released slot is not free");
        assert_eq!(t.get(a).anext, c);
        assert_eq!(t.get(c).aprev, a);
        assert_eq!(t.live(), 3);
        let d = t.take(Seg::new(5, 1, Kind::Free));
        assert_eq!(d, b, "a released slot is reused first");
        assert!(t.can_take(2));
    }

    #[test]
    fn last_byte_of_a_segment_at_the_top_does_not_overflow() {
        let s = Seg::new(u64::MAX - 0xfff, 0x1000, Kind::Free);
        assert_eq!(s.last(), u64::MAX);
    }
}
