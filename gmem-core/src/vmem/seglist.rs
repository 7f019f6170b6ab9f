//! The segment table: boundary tags in a slab, linked in address order, placed by
//! address.
//!
//! Every span marker and every segment (free, allocated to a caller, or imported by a
//! quantum cache) is one [`Seg`] in a `Vec`, two to a 64-byte line, named by its
//! `u32` index. The table is also a hash table keyed by start address: an address
//! names a *home line* ([`SegTable::home`], Fibonacci hashing of the address in quanta)
//! and an allocated segment's record is put there when one of its two slots is unused
//! ([`SegTable::take_home`]), so a free finds the record from the address alone, in
//! one cache line, instead of reading a hash slot and then the record it names
//! (issue 15, alloc13). The allocator keeps the records that did not fit at home in an
//! overflow map ([`super::addrmap`]). Records never move except when the allocator
//! moves one home, or when the table, kept at most half full so that most homes have
//! room, is rebuilt twice as large ([`SegTable::grow`]: every record re-placed, every
//! link renamed). Other records take any unused slot. Index [`SENTINEL`] is the head of a circular,
//! address-ordered, doubly linked list of all of them (`anext`/`aprev`): a span marker
//! precedes the segments that tile its span, so a segment's neighbours tell at once
//! whether they can coalesce with it (both free and not separated by a marker). The
//! `fnext`/`fprev` links are for the freelist a free segment is on
//! ([`super::freelist`]).
//!
//! Beside the records, one bit per slot says whether it is unused, and one whether it
//! holds a free segment. A free
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
/// Records in use stay at or below this: the table is at most half full, so its
/// slots, and every index, stay below 2^31, clear of [`NIL`] and the tags.
const MAX_RECORDS: usize = 1 << 30;

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

/// What an unused slot holds.
const UNUSED_SEG: Seg = Seg {
    start: 0,
    size: 0,
    anext: NIL,
    aprev: NIL,
    fnext: NIL,
    fprev: TAG_UNUSED,
};

/// Lines of a new table (so 16 records).
const MIN_LINES: usize = 8;

/// The slab of boundary tags and its address-ordered list.
pub(super) struct SegTable {
    /// The records, one more than [`Self::slots`]: record `i` is `segs[i + off]`,
    /// where `off` (0 or 1) makes records `2h` and `2h + 1` share a 64-byte line, the
    /// home line `h` (the buffer is only 32-aligned, and never reallocated).
    segs: Vec<Seg>,
    off: usize,
    /// Lines of two records: the number of homes.
    lines: usize,
    /// `log2(quantum)`: homes hash the start address in quanta.
    qshift: u32,
    /// `64 - log2(lines)`.
    home_shift: u32,
    /// Candidates for [`Self::take`]: every unused slot is here, and entries whose
    /// slot was since taken at its home ([`Self::take_home`]) are skipped when popped.
    unused: Vec<u32>,
    /// Bit `i % 64` of word `i / 64`: slot `i` is unused.
    unused_bits: Vec<u64>,
    /// Bit `i % 64` of word `i / 64`: slot `i` holds a free segment.
    free_bits: Vec<u64>,
    /// Slots in use, the sentinel included.
    live: usize,
}

/// Set or clear bit `i` of a bitmap.
#[inline]
fn put_bit(bits: &mut [u64], i: u32, on: bool) {
    let w = &mut bits[(i / 64) as usize];
    *w = (*w & !(1 << (i % 64))) | (u64::from(on) << (i % 64));
}

/// Bit `i` of a bitmap (false past its end).
#[inline]
fn bit(bits: &[u64], i: u32) -> bool {
    bits.get((i / 64) as usize)
        .is_some_and(|w| w & (1 << (i % 64)) != 0)
}

impl SegTable {
    /// A table holding only the sentinel (an empty circular list), for segments whose
    /// addresses are multiples of `quantum` (a power of two).
    pub fn new(quantum: u64) -> Self {
        let mut t = Self::empty(MIN_LINES, quantum.trailing_zeros());
        let mut head = Seg::new(0, 0, Kind::Sentinel);
        head.anext = SENTINEL;
        head.aprev = SENTINEL;
        t.put(SENTINEL, head);
        t
    }

    /// `lines` lines of unused slots.
    fn empty(lines: usize, qshift: u32) -> Self {
        let n = lines * 2;
        let segs = vec![UNUSED_SEG; n + 1];
        let off = usize::from(segs.as_ptr() as usize % 64 != 0);
        Self {
            segs,
            off,
            lines,
            qshift,
            home_shift: 64 - lines.trailing_zeros(),
            unused: (0..n as u32).rev().collect(),
            unused_bits: vec![u64::MAX; n.div_ceil(64)],
            free_bits: vec![0; n.div_ceil(64)],
            live: 0,
        }
    }

    /// Number of slots (used or not).
    #[inline]
    pub fn slots(&self) -> usize {
        self.lines * 2
    }

    /// The line whose two slots are the home of a segment starting at `start`.
    #[inline]
    pub fn home(&self, start: u64) -> u32 {
        ((start >> self.qshift).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.home_shift) as u32
    }

    /// True when record `i` lies in the home line of `start`.
    #[inline]
    pub fn at_home(&self, i: u32, start: u64) -> bool {
        i / 2 == self.home(start)
    }

    /// The allocated or cached segment starting at `start` if its record lies in its
    /// home line (one cache line, found from the address alone).
    #[inline]
    pub fn find_home(&self, start: u64) -> Option<u32> {
        let h = self.home(start);
        let line = &self.segs[2 * h as usize + self.off..][..2];
        (0..2u32)
            .find(|&k| {
                let s = &line[k as usize];
                s.start == start && matches!(s.fprev, TAG_ALLOC | TAG_CACHED)
            })
            .map(|k| 2 * h + k)
    }

    /// True when slot `i` holds a free segment (false for [`NIL`]); reads only the
    /// bitmap, not the record.
    #[inline]
    pub fn is_free(&self, i: u32) -> bool {
        bit(&self.free_bits, i)
    }

    /// Make record `i` hold `kind`. A record made free is off every freelist until
    /// [`super::freelist::FreeLists::insert`] links it.
    #[inline]
    pub fn set_kind(&mut self, i: u32, kind: Kind) {
        self.get_mut(i).set_kind(kind);
        put_bit(&mut self.free_bits, i, kind == Kind::Free);
    }

    /// The record at `i`.
    #[inline]
    pub fn get(&self, i: u32) -> &Seg {
        &self.segs[i as usize + self.off]
    }

    /// The record at `i`, mutably.
    #[inline]
    pub fn get_mut(&mut self, i: u32) -> &mut Seg {
        &mut self.segs[i as usize + self.off]
    }

    /// Start loading record `i` into the cache (a hint; `i` may be [`NIL`]).
    #[inline]
    pub fn prefetch(&self, i: u32) {
        if let Some(l) = self.segs.get(i as usize + self.off) {
            super::prefetch(l);
        }
    }

    /// Start loading the home line of `start` into the cache (a hint).
    #[inline]
    pub fn prefetch_home(&self, start: u64) {
        super::prefetch(&self.segs[2 * self.home(start) as usize + self.off]);
    }

    /// True when `n` more records can be taken (indices stay below the tags).
    #[inline]
    pub fn can_take(&self, n: usize) -> bool {
        MAX_RECORDS.saturating_sub(self.live) >= n
    }

    /// True when taking `n` more records would fill more than half of the slots: the
    /// caller then rebuilds the table twice as large or more ([`Self::grow`]) before
    /// it takes them, so that most homes have a free slot.
    #[inline]
    pub fn needs_growth(&self, n: usize) -> bool {
        self.live.saturating_add(n) > self.slots() / 2
    }

    /// Store `seg` in slot `i` (unused) and mark it used.
    #[inline]
    fn put(&mut self, i: u32, seg: Seg) {
        debug_assert!(bit(&self.unused_bits, i), "slot {i} is unused");
        *self.get_mut(i) = seg;
        put_bit(&mut self.unused_bits, i, false);
        put_bit(&mut self.free_bits, i, seg.kind() == Kind::Free);
        self.live += 1;
    }

    /// Store `seg` in any unused slot and return its index. The caller checked
    /// [`Self::can_take`] and grew the table as [`Self::needs_growth`] asked.
    #[inline(always)]
    pub fn take(&mut self, seg: Seg) -> u32 {
        loop {
            let i = self.unused.pop().expect("a grown table has unused slots");
            if bit(&self.unused_bits, i) {
                self.put(i, seg);
                return i;
            }
        }
    }

    /// Store `seg` in its home line if a slot there is unused (so a free finds it
    /// from its address alone), else anywhere; returns its index. As for
    /// [`Self::take`].
    #[inline]
    pub fn take_home(&mut self, seg: Seg) -> u32 {
        let h = self.home(seg.start);
        for i in [2 * h, 2 * h + 1] {
            if bit(&self.unused_bits, i) {
                self.put(i, seg);
                return i;
            }
        }
        self.take(seg)
    }

    /// True when slot `i` is unused (reads only the bitmap).
    #[inline]
    fn is_unused(&self, i: u32) -> bool {
        bit(&self.unused_bits, i)
    }

    /// True when the home line of `start` has an unused slot (reads only the bitmap).
    #[inline]
    pub fn home_has_room(&self, start: u64) -> bool {
        let h = self.home(start);
        self.is_unused(2 * h) || self.is_unused(2 * h + 1)
    }

    /// Mark `i` unused and recycle it; it must be unlinked.
    #[inline]
    pub fn release(&mut self, i: u32) {
        self.set_kind(i, Kind::Unused);
        put_bit(&mut self.unused_bits, i, true);
        self.live -= 1;
        if self.unused.len() >= 2 * self.slots() {
            // Drop the entries of slots taken at their home since they were pushed.
            let bits = &self.unused_bits;
            self.unused.retain(|&j| bit(bits, j));
        }
        self.unused.push(i);
    }

    /// Rebuild the table with room for `n` more records ([`Self::needs_growth`] false
    /// afterwards): every allocated or cached segment goes to its new home line when a
    /// slot there is unused, every other record anywhere, and every link is renamed.
    /// Returns the renaming, old index -> new index ([`NIL`] for unused slots), for
    /// the indices held outside the table (list heads, span markers, the rotor).
    pub fn grow(&mut self, n: usize) -> Vec<u32> {
        let mut lines = self.lines;
        while self.live.saturating_add(n) > lines {
            lines *= 2;
        }
        let mut new = Self::empty(lines, self.qshift);
        let old_slots = self.slots() as u32;
        let mut map = vec![NIL; old_slots as usize];
        map[SENTINEL as usize] = SENTINEL;
        put_bit(&mut new.unused_bits, SENTINEL, false);
        // Homes first, then everything else in the slots left.
        for j in 1..old_slots {
            let s = self.get(j);
            if matches!(s.kind(), Kind::Alloc | Kind::Cached) {
                let h = new.home(s.start);
                if let Some(k) = [2 * h, 2 * h + 1].into_iter().find(|&k| new.is_unused(k)) {
                    map[j as usize] = k;
                    put_bit(&mut new.unused_bits, k, false);
                }
            }
        }
        let mut next_unused = 0u32;
        for j in 1..old_slots {
            if map[j as usize] != NIL || self.get(j).kind() == Kind::Unused {
                continue;
            }
            while !new.is_unused(next_unused) {
                next_unused += 1;
            }
            map[j as usize] = next_unused;
            put_bit(&mut new.unused_bits, next_unused, false);
        }
        let rename = |x: u32| if x == NIL { NIL } else { map[x as usize] };
        for j in 0..old_slots {
            let k = map[j as usize];
            if k == NIL {
                continue;
            }
            let mut s = *self.get(j);
            s.anext = rename(s.anext);
            s.aprev = rename(s.aprev);
            if s.kind() == Kind::Free {
                s.fnext = rename(s.fnext);
                s.fprev = rename(s.fprev);
            } else {
                s.fnext = NIL;
            }
            *new.get_mut(k) = s;
            put_bit(&mut new.free_bits, k, s.kind() == Kind::Free);
        }
        new.live = self.live;
        let bits = &new.unused_bits;
        new.unused.retain(|&j| bit(bits, j));
        *self = new;
        map
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
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_link_in_order_and_released_slots_are_reused() {
        let mut t = SegTable::new(1);
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
    fn a_home_line_is_one_cache_line_and_a_grown_table_renames_every_link() {
        let mut t = SegTable::new(1);
        let mut prev = SENTINEL;
        for start in 0..40 {
            assert!(t.can_take(1));
            if t.needs_growth(1) {
                let map = t.grow(1);
                prev = map[prev as usize];
            }
            let i = t.take_home(Seg::new(start, 1, Kind::Alloc));
            t.insert_after(prev, i);
            prev = i;
        }
        assert_eq!(t.live(), 41);
        assert!(!t.needs_growth(0) && t.slots() >= 2 * 41);
        let mut at_home = 0;
        let mut i = t.get(SENTINEL).anext;
        for start in 0..40 {
            assert_eq!(t.get(i).start, start, "address order survives renaming");
            if t.at_home(i, start) {
                at_home += 1;
                assert_eq!(t.find_home(start), Some(i));
            } else {
                assert_eq!(t.find_home(start), None);
            }
            i = t.get(i).anext;
        }
        assert_eq!(i, SENTINEL);
        assert!(at_home >= 30, "{at_home} of 40 at home");
        for h in 0..t.slots() as u32 / 2 {
            let a = core::ptr::from_ref(t.get(2 * h)) as usize;
            let b = core::ptr::from_ref(t.get(2 * h + 1)) as usize;
            assert_eq!((a % 64, b - a), (0, 32), "line {h}");
        }
    }

    #[test]
    fn last_byte_of_a_segment_at_the_top_does_not_overflow() {
        let s = Seg::new(u64::MAX - 0xfff, 0x1000, Kind::Free);
        assert_eq!(s.last(), u64::MAX);
    }
}
