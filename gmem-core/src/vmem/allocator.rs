//! The segment allocator: everything that runs under the arena lock.
//!
//! It owns the segment table ([`super::seglist`]), the freelists
//! ([`super::freelist`]), the hash of allocated segments and the sorted span table,
//! and implements adding spans, the four fit policies for plain and constrained
//! requests, splitting a free segment into up to three parts, and freeing with
//! coalescing. Callers (the [`super::Arena`]) validate their input and hold the lock.
//! Splitting an allocation into pieces and freeing a run of pieces as one are in
//! [`runs`].

use alloc::vec::Vec;

use super::addrmap::AddrMap;
use super::config::FitPolicy;
use super::constraint::Placement;
use super::error::{FreeError, SpanError};
use super::freelist::FreeLists;
use super::seglist::{Kind, Seg, SegTable, SENTINEL};
use super::FREE_AHEAD_CALLS as FREE_AHEAD;

mod runs;

/// One span, for overlap checks and ordered insertion.
#[derive(Clone, Copy, Debug)]
struct SpanRec {
    base: u64,
    last: u64,
    marker: u32,
}

/// Counters of the segment layer, read by [`super::Arena::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct SegmentCounts {
    pub spans: u64,
    pub total: u64,
    pub free: u64,
    pub segments: u64,
    pub free_segments: u64,
    pub allocs: u64,
    pub frees: u64,
}

/// The boundary-tag allocator of one arena.
pub(super) struct SegmentAllocator {
    quantum: u64,
    table: SegTable,
    lists: FreeLists,
    /// Start address -> index of every `Alloc` and `Cached` segment.
    hash: AddrMap,
    /// Sorted by base.
    spans: Vec<SpanRec>,
    /// Next-fit rotor: the node to resume at and, when that node is a segment, the
    /// address inside it to resume from.
    rotor: (u32, u64),
    total: u64,
    free_bytes: u64,
    free_segs: u64,
    /// The last [`FREE_AHEAD`] announced frees, a ring; `ahead_at` is the oldest.
    ahead: [u64; FREE_AHEAD],
    ahead_at: usize,
    /// Caller allocations and frees served here (not cache imports).
    pub allocs: u64,
    /// See `allocs`.
    pub frees: u64,
}

impl SegmentAllocator {
    /// An empty allocator for the given quantum (a power of two).
    pub fn new(quantum: u64) -> Self {
        Self {
            quantum,
            table: SegTable::new(),
            lists: FreeLists::new(quantum),
            hash: AddrMap::new(quantum),
            spans: Vec::new(),
            rotor: (SENTINEL, 0),
            ahead: [0; FREE_AHEAD],
            ahead_at: 0,
            total: 0,
            free_bytes: 0,
            free_segs: 0,
            allocs: 0,
            frees: 0,
        }
    }

    /// The counters.
    pub fn counts(&self) -> SegmentCounts {
        SegmentCounts {
            spans: self.spans.len() as u64,
            total: self.total,
            free: self.free_bytes,
            segments: self.free_segs + self.hash.len() as u64,
            free_segments: self.free_segs,
            allocs: self.allocs,
            frees: self.frees,
        }
    }

    /// Add `[base, base + size)` as a new span holding one free segment.
    pub fn add_span(&mut self, base: u64, size: u64) -> Result<(), SpanError> {
        if size == 0 {
            return Err(SpanError::Empty);
        }
        let q = self.quantum;
        if base & (q - 1) != 0 || size & (q - 1) != 0 {
            return Err(SpanError::Unaligned {
                base,
                size,
                quantum: q,
            });
        }
        let overflow = SpanError::Overflow { base, size };
        let last = base.checked_add(size - 1).ok_or(overflow)?;
        let total = self.total.checked_add(size).ok_or(overflow)?;
        let pos = self.spans.partition_point(|s| s.base < base);
        let after_prev = pos == 0 || self.spans[pos - 1].last < base;
        let before_next = self.spans.get(pos).map_or(true, |s| s.base > last);
        if !after_prev || !before_next {
            return Err(SpanError::Overlaps { base, size });
        }
        if !self.table.can_take(2) {
            return Err(overflow);
        }
        let before = self.spans.get(pos).map_or(SENTINEL, |s| s.marker);
        let marker = self.table.take(Seg::new(base, size, Kind::Span));
        self.table.insert_before(before, marker);
        let seg = self.table.take(Seg::new(base, size, Kind::Free));
        self.table.insert_before(before, seg);
        self.lists.insert(&mut self.table, seg);
        self.spans.insert(pos, SpanRec { base, last, marker });
        self.total = total;
        self.free_bytes += size;
        self.free_segs += 1;
        Ok(())
    }

    /// Allocate a segment for `p` with policy `fit`, marking it `kind` (`Alloc` or
    /// `Cached`). `None` when nothing fits; the state is then unchanged.
    pub fn alloc(&mut self, p: &Placement, fit: FitPolicy, kind: Kind) -> Option<u64> {
        if !self.table.can_take(2) {
            return None;
        }
        let (i, addr) = match fit {
            FitPolicy::InstantFit => self.find_instant(p),
            FitPolicy::BestFit => self.find_best(p),
            FitPolicy::FirstFit => self.find_first(p),
            FitPolicy::NextFit => self.find_next(p),
        }?;
        debug_assert!(p.satisfied_by(addr), "placement postcondition");
        self.carve(i, addr, p.size, kind);
        if fit == FitPolicy::NextFit {
            let after = self.table.get(i).anext;
            self.rotor = (after, addr.wrapping_add(p.size));
        }
        Some(addr)
    }

    /// Import up to `n` plain segments of `size` bytes for a quantum cache, appending
    /// their addresses to `out`; stops early when the arena is full.
    pub fn import(&mut self, size: u64, n: usize, out: &mut Vec<u64>) {
        let p = Placement::plain(size, self.quantum);
        for _ in 0..n {
            match self.alloc(&p, FitPolicy::InstantFit, Kind::Cached) {
                Some(a) => out.push(a),
                None => break,
            }
        }
    }

    /// Free a caller's allocation of `size` bytes at `addr`, validated against the
    /// hash. A cached segment with the right size is in a cache: freeing it again is
    /// a double free.
    pub fn free(&mut self, addr: u64, size: u64) -> Result<(), FreeError> {
        let Some((at, i)) = self.hash.lookup(addr, &self.table) else {
            return Err(FreeError::NotAllocated { addr });
        };
        let seg = *self.table.get(i);
        if seg.size != size {
            return Err(FreeError::SizeMismatch {
                addr,
                allocated: seg.size,
                given: size,
            });
        }
        if seg.kind() != Kind::Alloc {
            return Err(FreeError::NotAllocated { addr });
        }
        self.hash.remove_found(at);
        self.free_segment(i);
        self.frees += 1;
        Ok(())
    }

    /// A caller announces that it will free the segment at `addr` soon: a two-stage
    /// software pipeline over the announcements. The hash slot of `addr` is prefetched
    /// now; the announcement [`FREE_AHEAD`] calls older, whose slot has had that long
    /// to arrive, is looked up by tag alone and its record prefetched. A free of a
    /// random segment of a large arena otherwise waits on two dependent cache misses
    /// (slot, then record); announced far enough ahead it finds both in cache. Hints
    /// only: nothing changes, a wrong or stale address costs a wasted prefetch.
    #[inline]
    pub fn prefetch_free(&mut self, addr: u64) {
        self.hash.prefetch(addr);
        let older = core::mem::replace(&mut self.ahead[self.ahead_at], addr);
        self.ahead_at = (self.ahead_at + 1) % FREE_AHEAD;
        self.prefetch_record(older);
    }

    /// Announce a batch of frees at once (the ranges of a flush queue, say): every
    /// hash slot is prefetched first, then every slot is read by tag and its record
    /// prefetched, so the slots' misses overlap one another and the records' too.
    /// Hints only, as [`Self::prefetch_free`]; the announcement ring is untouched.
    pub fn prefetch_batch(&mut self, addrs: impl Iterator<Item = u64> + Clone) {
        for a in addrs.clone() {
            self.hash.prefetch(a);
        }
        for a in addrs {
            self.prefetch_record(a);
        }
    }

    /// The second stage of both announcements: the record the hash slot of `addr`
    /// names by tag (the slot expected in cache by now), prefetched.
    #[inline]
    fn prefetch_record(&self, addr: u64) {
        if let Some(i) = self.hash.candidate(addr) {
            self.table.prefetch(i);
        }
    }

    /// Give back an object a quantum cache held (imported, or freed into the cache by
    /// a trusted caller). Returns false, changing nothing, if `addr` is not allocated.
    pub fn release_cached(&mut self, addr: u64) -> bool {
        match self.hash.lookup(addr, &self.table) {
            Some((at, i)) => {
                self.hash.remove_found(at);
                self.free_segment(i);
                true
            }
            None => false,
        }
    }

    /// True when `addr` lies inside an allocated or cached segment. Costs a walk of
    /// the containing span's segments.
    pub fn contains_allocated(&self, addr: u64) -> bool {
        let pos = self.spans.partition_point(|s| s.base <= addr);
        let Some(span) = pos.checked_sub(1).map(|p| self.spans[p]) else {
            return false;
        };
        if addr > span.last {
            return false;
        }
        let mut i = self.table.get(span.marker).anext;
        loop {
            let s = self.table.get(i);
            if !s.is_segment() || s.start > addr {
                return false;
            }
            if addr <= s.last() {
                return matches!(s.kind(), Kind::Alloc | Kind::Cached);
            }
            i = s.anext;
        }
    }

    /// First fitting segment of freelist `k`, with the address to allocate at.
    #[inline]
    fn scan_first(&self, k: u32, p: &Placement) -> Option<(u32, u64)> {
        let mut i = self.lists.head(k);
        while i != super::seglist::NIL {
            let s = self.table.get(i);
            if let Some(a) = p.fit_in(s.start, s.size, 0) {
                return Some((i, a));
            }
            i = s.fnext;
        }
        None
    }

    /// Instant-fit (good fit): the head of the lowest non-empty class whose every
    /// segment is large enough, in O(1) for plain requests; a constrained request
    /// moves on to the next non-empty class when a head cannot hold it. Then the
    /// size's own class (whose segments may or may not be large enough) as a fallback.
    fn find_instant(&self, p: &Placement) -> Option<(u32, u64)> {
        let own = self.lists.class_of(p.size);
        let first = self.lists.first_sufficient(p.size);
        let mut c = first;
        while let Some(k) = self.lists.next_nonempty(c) {
            if let Some(hit) = self.scan_first(k, p) {
                return Some(hit);
            }
            c = k + 1;
        }
        if first != own {
            return self.scan_first(own, p);
        }
        None
    }

    /// Best-fit: the smallest fitting segment of the lowest class holding one (every
    /// segment of a higher class is larger).
    fn find_best(&self, p: &Placement) -> Option<(u32, u64)> {
        let mut c = self.lists.class_of(p.size);
        while let Some(k) = self.lists.next_nonempty(c) {
            let mut best: Option<(u32, u64, u64)> = None;
            let mut i = self.lists.head(k);
            while i != super::seglist::NIL {
                let s = self.table.get(i);
                if best.map_or(true, |(_, _, size)| s.size < size) {
                    if let Some(a) = p.fit_in(s.start, s.size, 0) {
                        best = Some((i, a, s.size));
                    }
                }
                i = s.fnext;
            }
            if let Some((i, a, _)) = best {
                return Some((i, a));
            }
            c = k + 1;
        }
        None
    }

    /// First-fit: the lowest fitting address over every free segment that could hold
    /// the size.
    fn find_first(&self, p: &Placement) -> Option<(u32, u64)> {
        let mut c = self.lists.class_of(p.size);
        let mut best: Option<(u32, u64)> = None;
        while let Some(k) = self.lists.next_nonempty(c) {
            let mut i = self.lists.head(k);
            while i != super::seglist::NIL {
                let s = self.table.get(i);
                if best.map_or(true, |(_, a)| s.start < a) {
                    if let Some(a) = p.fit_in(s.start, s.size, 0) {
                        if best.map_or(true, |(_, b)| a < b) {
                            best = Some((i, a));
                        }
                    }
                }
                i = s.fnext;
            }
            c = k + 1;
        }
        best
    }

    /// Next-fit: walk the address list from the rotor, wrapping around once; in the
    /// rotor's own segment start at the rotor address, and try the part before it last.
    fn find_next(&self, p: &Placement) -> Option<(u32, u64)> {
        let (start, bound) = self.rotor_start();
        let mut i = start;
        loop {
            let s = self.table.get(i);
            if s.kind() == Kind::Free {
                let lower = if i == start { bound } else { 0 };
                if let Some(a) = p.fit_in(s.start, s.size, lower) {
                    return Some((i, a));
                }
            }
            i = s.anext;
            if i == start {
                break;
            }
        }
        let s = self.table.get(start);
        if s.kind() == Kind::Free && bound > s.start {
            if let Some(a) = p.fit_in(s.start, s.size, 0) {
                return Some((start, a));
            }
        }
        None
    }

    /// The rotor, or the list head if it went stale (cannot happen while the carve and
    /// coalesce paths keep it up to date; kept as a cheap defence).
    fn rotor_start(&self) -> (u32, u64) {
        let (i, bound) = self.rotor;
        let s = self.table.get(i);
        let valid = match s.kind() {
            Kind::Sentinel | Kind::Span => true,
            Kind::Free | Kind::Alloc | Kind::Cached => s.start <= bound && bound <= s.last(),
            Kind::Unused => false,
        };
        if valid {
            (i, bound)
        } else {
            (SENTINEL, 0)
        }
    }

    /// Point the rotor at `to` if it was at `from` (which is changing identity).
    #[inline]
    fn retarget_rotor(&mut self, from: u32, to: u32) {
        if self.rotor.0 == from {
            self.rotor.0 = to;
        }
    }

    /// Instant-fit takes list heads, and lists are LIFO: `head`, just made the head of
    /// its list, is what the next allocation of its class will carve, and that
    /// allocation will enter `head`'s start in the hash and make `head`'s successor
    /// the head. On a large arena all three are cold. This software pipeline starts
    /// loading the hash slot and the successor's record now (`head`'s own record was
    /// prefetched when it became second in line), so that allocation finds them in
    /// cache instead of waiting on memory twice in a row.
    #[inline]
    fn warm_head(&self, head: u32) {
        if head == super::seglist::NIL {
            return;
        }
        let s = self.table.get(head);
        self.hash.prefetch(s.start);
        self.table.prefetch(s.fnext);
    }

    /// Split free segment `i` into [free left][allocated `size` at `addr`][free right];
    /// `i` keeps the allocated part.
    fn carve(&mut self, i: u32, addr: u64, size: u64, kind: Kind) {
        let next_head = self.lists.remove(&mut self.table, i);
        self.warm_head(next_head);
        let seg = *self.table.get(i);
        let seg_last = seg.last();
        let alloc_last = addr + (size - 1);
        let (rotor_node, rotor_bound) = self.rotor;
        if addr > seg.start {
            let left = self
                .table
                .take(Seg::new(seg.start, addr - seg.start, Kind::Free));
            self.table.insert_before(i, left);
            self.lists.insert(&mut self.table, left);
            self.free_segs += 1;
            if rotor_node == i && rotor_bound < addr {
                self.rotor.0 = left;
            }
        }
        if alloc_last < seg_last {
            let right =
                self.table
                    .take(Seg::new(alloc_last + 1, seg_last - alloc_last, Kind::Free));
            self.table.insert_after(i, right);
            self.lists.insert(&mut self.table, right);
            self.free_segs += 1;
            if rotor_node == i && rotor_bound > alloc_last {
                self.rotor.0 = right;
            }
        }
        let s = self.table.get_mut(i);
        s.start = addr;
        s.size = size;
        self.table.set_kind(i, kind);
        self.free_segs -= 1;
        self.free_bytes -= size;
        self.hash.insert(addr, i, &self.table);
    }

    /// Turn the allocated segment `i` (already out of the hash) free, coalescing with
    /// free neighbours of the same span, and put it on its freelist.
    ///
    /// Whether a neighbour is free comes from the table's free bitmap, not from the
    /// neighbour's record: on a large arena both neighbours of a random segment are
    /// cold, and almost always allocated, so reading their records only to learn that
    /// cost a cache miss per free for nothing. A free neighbour is read (and merged).
    fn free_segment(&mut self, i: u32) {
        let Seg {
            size,
            aprev: prev,
            anext: next,
            ..
        } = *self.table.get(i);
        self.free_bytes += size;
        self.table.set_kind(i, Kind::Free);
        if self.table.is_free(prev) {
            self.lists.remove(&mut self.table, prev);
            let p = *self.table.get(prev);
            let s = self.table.get_mut(i);
            s.start = p.start;
            // Both lie in one span: the sum is at most the span's size.
            s.size += p.size;
            self.table.unlink(prev);
            self.table.release(prev);
            self.free_segs -= 1;
            self.retarget_rotor(prev, i);
        }
        // Merging the predecessor left the successor link alone.
        if self.table.is_free(next) {
            self.lists.remove(&mut self.table, next);
            let n_size = self.table.get(next).size;
            self.table.get_mut(i).size += n_size;
            self.table.unlink(next);
            self.table.release(next);
            self.free_segs -= 1;
            self.retarget_rotor(next, i);
        }
        self.lists.insert(&mut self.table, i);
        self.free_segs += 1;
        // Lists are LIFO: an allocation of this class takes `i` next and enters its
        // start in the hash. When `i` absorbed its predecessor that slot is cold.
        self.hash.prefetch(self.table.get(i).start);
    }

    /// Check every structural invariant; the first violation found is returned.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), &'static str> {
        use super::seglist::NIL;
        let mut span_idx = 0;
        let mut i = self.table.get(SENTINEL).anext;
        let (mut free_bytes, mut free_segs, mut allocated) = (0u64, 0u64, 0u64);
        let mut on_lists = 0u64;
        while i != SENTINEL {
            let s = *self.table.get(i);
            if s.kind() != Kind::Span {
                return Err("segment outside a span");
            }
            let span = self.spans.get(span_idx).ok_or("more markers than spans")?;
            if span.marker != i || span.base != s.start || span.last != s.last() {
                return Err("span table disagrees with marker");
            }
            span_idx += 1;
            let mut expect = s.start;
            let mut prev_free = false;
            let mut j = s.anext;
            let mut end_reached = false;
            while self.table.get(j).is_segment() {
                let g = *self.table.get(j);
                if end_reached || g.start != expect || g.size == 0 || g.last() > s.last() {
                    return Err("segments do not tile their span");
                }
                if g.size & (self.quantum - 1) != 0 || g.start & (self.quantum - 1) != 0 {
                    return Err("unaligned segment");
                }
                if g.last() == s.last() {
                    end_reached = true;
                } else {
                    expect = g.last() + 1;
                }
                if self.table.is_free(j) != (g.kind() == Kind::Free) {
                    return Err("free bitmap disagrees with a segment's kind");
                }
                match g.kind() {
                    Kind::Free => {
                        if prev_free {
                            return Err("adjacent free segments not coalesced");
                        }
                        free_bytes += g.size;
                        free_segs += 1;
                    }
                    _ => {
                        if self.hash.get(g.start, &self.table) != Some(j) {
                            return Err("allocated segment missing from hash");
                        }
                        allocated += 1;
                    }
                }
                prev_free = g.kind() == Kind::Free;
                j = g.anext;
            }
            if !end_reached {
                return Err("span not fully tiled");
            }
            i = j;
        }
        if span_idx != self.spans.len() {
            return Err("fewer markers than spans");
        }
        for k in 0..super::freelist::CLASSES {
            let mut j = self.lists.head(k);
            if (j != NIL) != self.lists.occupied(k) {
                return Err("bitmap disagrees with lists");
            }
            if (j != NIL) != (self.lists.next_nonempty(k) == Some(k)) {
                return Err("two-level bitmap disagrees with lists");
            }
            let mut prev = NIL;
            while j != NIL {
                let g = self.table.get(j);
                if g.kind() != Kind::Free || self.lists.class_of(g.size) != k || g.fprev != prev {
                    return Err("freelist corrupt");
                }
                on_lists += 1;
                prev = j;
                j = g.fnext;
            }
        }
        if on_lists != free_segs || free_segs != self.free_segs {
            return Err("free segment count");
        }
        if free_bytes != self.free_bytes {
            return Err("free byte count");
        }
        if allocated != self.hash.len() as u64 {
            return Err("hash holds stale entries");
        }
        if self.rotor_start() != self.rotor {
            return Err("stale rotor");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
