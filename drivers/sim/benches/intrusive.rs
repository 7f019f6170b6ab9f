//! The design card's `intrusive-collections` (issue 30, item 5), measured where an object
//! lives on lists and moves between them under one lock: today's structure against the
//! same structure with non-atomic intrusive lists (`LinkedList` / `SinglyLinkedList` with
//! `Link`, nodes held by `UnsafeRef` or `Box`), on the same inputs, in the same run.
//!
//! Four candidates, each a model that keeps exactly the data and operations of the
//! structure it stands for and differs only in how the list is linked:
//! - `tlb_lru`: the per-set recency lists of [`gmem_sim::Tlb`] (LRU, 64 sets × 16 ways)
//!   — today slots linked by `u32` index (`newer`/`older` in the slot record, head and
//!   tail per set), against one `LinkedList` per set through a `Link` in each slot. The
//!   way search is the same plain scan in both (the real TLB's SIMD probe is left out, as
//!   it is the same in both designs); a hit moves its slot to the front, a miss in a full
//!   set reuses the tail, an invalidation unlinks.
//! - `frame_pool`: the page-table frame pool of the two kernels (`drivers/sv39/kernel`,
//!   `drivers/x86pt/kernel`; now `drivers/kernel-support`) — "today" is the pool they
//!   had: a bump pointer and a free list through each free frame's first word;
//!   "intrusive" is the one they have since this measurement, a `SinglyLinkedList` whose
//!   `Link` is written into the free frame. The 4 KiB zeroing of an allocation is left
//!   out (the same in both, and it would hide the list).
//! - `mapping_set`: the core's mapping-set membership (`MappingSet { regions:
//!   Vec<Region> }`, `leave_set` a `retain`) against a `LinkedList` through a `Link` in
//!   each region record (O(1) leave); sets of 8, 64 and 512 regions; each operation is a
//!   region of the set freed and a new one joining, with the whole set taken (an unmap
//!   of the set) every 256 operations.
//! - `release_batch`: the core's MMU queue (`MmuQueue::requests: Vec<Request>`, taken
//!   whole with `mem::take` at a drain every `batch_limit` = 64 requests) against a
//!   `LinkedList` of boxed requests; the request has the core's fields (a `Discard` of
//!   three vectors and a range, a callback).
//!
//! Before timing, each pair runs its inputs and the two answers (hits, victims,
//! addresses, order of members) must be equal, so both sides do the same work; the TLB
//! models must also answer as gmem-sim's real `Tlb` does on the same input (values, hits,
//! misses, evictions, invalidations). The figures: criterion's per-variant estimates,
//! then median ns per operation of 31 alternated batches (today, intrusive, today, ...)
//! and the ratio intrusive / today (below 1: the intrusive list is faster).
//!
//! `GMEM_INTRUSIVE_ONE=NAME/SIDE:BATCHES` runs one side alone and prints a checksum, for
//! an instruction count under cachegrind (`tlb_lru/real` is the real `Tlb`: build the
//! bench before and after a change to it and compare the two). README's dependency
//! notes hold the figures and what became of each candidate.

use criterion::{criterion_group, Criterion};
use intrusive_collections::{intrusive_adapter, LinkedListLink, UnsafeRef};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// A xorshift64* generator: the same inputs on both sides and in every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A running checksum that depends on order.
fn mix(h: u64, v: u64) -> u64 {
    (h ^ v).wrapping_mul(0x100_0000_01B3).rotate_left(5)
}

// ----- tlb_lru -------------------------------------------------------------------------

mod lru {
    use super::*;
    use intrusive_collections::LinkedList;
    use std::cell::Cell;

    pub const SETS: usize = 64;
    pub const WAYS: usize = 16;
    const NIL: u32 = u32::MAX;
    const INVALID: u64 = u64::MAX;

    /// One step of the input.
    #[derive(Clone, Copy)]
    pub enum Step {
        /// Look `tag` up for `asid`, filling it on a miss.
        Access { asid: u64, tag: u64 },
        /// Drop `tag` of `asid` if present.
        Invalidate { asid: u64, tag: u64 },
    }

    /// What a run answered.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Outcome {
        pub hits: u64,
        pub misses: u64,
        pub evictions: u64,
        pub invalidated: u64,
        /// Every victim's tag, in order.
        pub victims: u64,
    }

    /// 4096 steps: 80% of accesses to 768 hot pages, the rest to 16384; one in 64 an
    /// invalidation; asid 2 one access in ten.
    pub fn input(seed: u64) -> Vec<Step> {
        let mut r = Rng(seed);
        (0..4096)
            .map(|_| {
                let asid = if r.below(10) == 0 { 2 } else { 1 };
                let tag = if r.below(5) < 4 {
                    r.below(768)
                } else {
                    r.below(16384)
                };
                if r.below(64) == 0 {
                    Step::Invalidate { asid, tag }
                } else {
                    Step::Access { asid, tag }
                }
            })
            .collect()
    }

    #[derive(Clone, Copy)]
    struct Slot {
        key: u64,
        asid: u64,
        tag: u64,
        newer: u32,
        older: u32,
        value: Option<u64>,
    }

    /// Today's: slots linked by index through their records (gmem-sim's `Tlb`).
    pub struct Today {
        slots: Vec<Slot>,
        head: Vec<u32>,
        tail: Vec<u32>,
        filled: Vec<u32>,
        pub out: Outcome,
    }

    impl Today {
        pub fn new() -> Today {
            Today {
                slots: vec![
                    Slot {
                        key: INVALID,
                        asid: 0,
                        tag: 0,
                        newer: NIL,
                        older: NIL,
                        value: None,
                    };
                    SETS * WAYS
                ],
                head: vec![NIL; SETS],
                tail: vec![NIL; SETS],
                filled: vec![0; SETS],
                out: Outcome::default(),
            }
        }

        fn find(&self, set: usize, asid: u64, tag: u64) -> Option<usize> {
            let start = set * WAYS;
            self.slots[start..start + WAYS]
                .iter()
                .position(|s| s.key == tag && s.asid == asid)
                .map(|w| start + w)
        }

        fn unlink(&mut self, set: usize, i: usize) {
            let (n, o) = (self.slots[i].newer, self.slots[i].older);
            if n == NIL {
                self.head[set] = o;
            } else {
                self.slots[n as usize].older = o;
            }
            if o == NIL {
                self.tail[set] = n;
            } else {
                self.slots[o as usize].newer = n;
            }
        }

        /// Make linked slot `i`, not its set's most recent, the most recent (the real
        /// TLB's `raise`: `unlink` then `push_front` without the head cases).
        fn raise(&mut self, set: usize, i: usize) {
            let (n, o) = (self.slots[i].newer, self.slots[i].older);
            let h = self.head[set];
            self.slots[n as usize].older = o;
            if o == NIL {
                self.tail[set] = n;
            } else {
                self.slots[o as usize].newer = n;
            }
            let s = &mut self.slots[i];
            s.newer = NIL;
            s.older = h;
            self.slots[h as usize].newer = i as u32;
            self.head[set] = i as u32;
        }

        fn push_front(&mut self, set: usize, i: usize) {
            let h = self.head[set];
            self.slots[i].newer = NIL;
            self.slots[i].older = h;
            if h == NIL {
                self.tail[set] = i as u32;
            } else {
                self.slots[h as usize].newer = i as u32;
            }
            self.head[set] = i as u32;
        }

        pub fn run(&mut self, steps: &[Step]) -> u64 {
            let mut sum = 0u64;
            for &s in steps {
                match s {
                    Step::Access { asid, tag } => sum = sum.wrapping_add(self.access(asid, tag)),
                    Step::Invalidate { asid, tag } => self.invalidate(asid, tag),
                }
            }
            sum
        }

        fn access(&mut self, asid: u64, tag: u64) -> u64 {
            let set = tag as usize % SETS;
            if let Some(i) = self.find(set, asid, tag) {
                self.out.hits += 1;
                if self.slots[i].newer != NIL {
                    self.raise(set, i);
                }
                return self.slots[i].value.unwrap_or(0);
            }
            self.out.misses += 1;
            let i = if self.filled[set] < WAYS as u32 {
                let start = set * WAYS;
                let w = self.slots[start..start + WAYS]
                    .iter()
                    .position(|s| s.key == INVALID)
                    .expect("a free way");
                self.filled[set] += 1;
                self.push_front(set, start + w);
                start + w
            } else {
                let i = self.tail[set] as usize;
                self.out.evictions += 1;
                self.out.victims = mix(self.out.victims, self.slots[i].tag);
                self.raise(set, i);
                i
            };
            let s = &mut self.slots[i];
            (s.key, s.asid, s.tag, s.value) = (tag, asid, tag, Some(tag * 3));
            0
        }

        fn invalidate(&mut self, asid: u64, tag: u64) {
            let set = tag as usize % SETS;
            if let Some(i) = self.find(set, asid, tag) {
                self.unlink(set, i);
                self.filled[set] -= 1;
                self.slots[i].key = INVALID;
                self.slots[i].value = None;
                self.out.invalidated += 1;
            }
        }
    }

    /// The intrusive version: a `Link` in each slot, one list per set. The slot's
    /// fields are `Cell`s: the lists hold shared references to the slots.
    pub struct SlotL {
        key: Cell<u64>,
        asid: Cell<u64>,
        tag: Cell<u64>,
        value: Cell<Option<u64>>,
        link: LinkedListLink,
    }

    intrusive_adapter!(SlotAdapter = UnsafeRef<SlotL>: SlotL { link: LinkedListLink });

    pub struct Intrusive {
        lists: Vec<LinkedList<SlotAdapter>>,
        filled: Vec<u32>,
        /// Never reallocated while the lists point into it; dropped after them.
        slots: Box<[SlotL]>,
        pub out: Outcome,
    }

    impl Drop for Intrusive {
        fn drop(&mut self) {
            // The slots go with the struct: forget the lists without touching them.
            for l in &mut self.lists {
                l.fast_clear();
            }
        }
    }

    impl Intrusive {
        pub fn new() -> Intrusive {
            Intrusive {
                lists: (0..SETS)
                    .map(|_| LinkedList::new(SlotAdapter::new()))
                    .collect(),
                filled: vec![0; SETS],
                slots: (0..SETS * WAYS)
                    .map(|_| SlotL {
                        key: Cell::new(INVALID),
                        asid: Cell::new(0),
                        tag: Cell::new(0),
                        value: Cell::new(None),
                        link: LinkedListLink::new(),
                    })
                    .collect(),
                out: Outcome::default(),
            }
        }

        fn find(&self, set: usize, asid: u64, tag: u64) -> Option<usize> {
            let start = set * WAYS;
            self.slots[start..start + WAYS]
                .iter()
                .position(|s| s.key.get() == tag && s.asid.get() == asid)
                .map(|w| start + w)
        }

        /// Move linked slot `i` of `set` to the front of its list.
        fn raise(&mut self, set: usize, i: usize) {
            let s: *const SlotL = &self.slots[i];
            // SAFETY: slot `i` is valid, so it is on its set's list.
            let r = unsafe { self.lists[set].cursor_mut_from_ptr(s).remove() };
            self.lists[set].push_front(r.expect("a linked slot"));
        }

        /// Put unlinked slot `i` at the front of `set`'s list.
        fn push_front(&mut self, set: usize, i: usize) {
            // SAFETY: the slot lives in `self.slots`, which outlives the lists and
            // never moves; it is on no list.
            let r = unsafe { UnsafeRef::from_raw(&self.slots[i]) };
            self.lists[set].push_front(r);
        }

        pub fn run(&mut self, steps: &[Step]) -> u64 {
            let mut sum = 0u64;
            for &s in steps {
                match s {
                    Step::Access { asid, tag } => sum = sum.wrapping_add(self.access(asid, tag)),
                    Step::Invalidate { asid, tag } => self.invalidate(asid, tag),
                }
            }
            sum
        }

        fn access(&mut self, asid: u64, tag: u64) -> u64 {
            let set = tag as usize % SETS;
            if let Some(i) = self.find(set, asid, tag) {
                self.out.hits += 1;
                let front = self.lists[set].front().get().map(|f| f as *const SlotL);
                if front != Some(&self.slots[i] as *const SlotL) {
                    self.raise(set, i);
                }
                return self.slots[i].value.get().unwrap_or(0);
            }
            self.out.misses += 1;
            let slot: *const SlotL = if self.filled[set] < WAYS as u32 {
                let start = set * WAYS;
                let w = self.slots[start..start + WAYS]
                    .iter()
                    .position(|s| s.key.get() == INVALID)
                    .expect("a free way");
                self.filled[set] += 1;
                self.push_front(set, start + w);
                &self.slots[start + w]
            } else {
                let mut c = self.lists[set].back_mut();
                let victim = c.remove().expect("a full set has a tail");
                self.out.evictions += 1;
                self.out.victims = mix(self.out.victims, victim.tag.get());
                let p = UnsafeRef::into_raw(victim) as *const SlotL;
                // SAFETY: `p` was just unlinked from this list and is a slot of
                // `self.slots`.
                self.lists[set].push_front(unsafe { UnsafeRef::from_raw(p) });
                p
            };
            // SAFETY: `slot` points into `self.slots`, alive and not moved.
            let s = unsafe { &*slot };
            s.key.set(tag);
            s.asid.set(asid);
            s.tag.set(tag);
            s.value.set(Some(tag * 3));
            0
        }

        fn invalidate(&mut self, asid: u64, tag: u64) {
            let set = tag as usize % SETS;
            if let Some(i) = self.find(set, asid, tag) {
                let s: *const SlotL = &self.slots[i];
                // SAFETY: a valid slot is on its set's list.
                unsafe { self.lists[set].cursor_mut_from_ptr(s).remove() };
                self.filled[set] -= 1;
                self.slots[i].key.set(INVALID);
                self.slots[i].value.set(None);
                self.out.invalidated += 1;
            }
        }
    }
}

// ----- frame_pool ----------------------------------------------------------------------

mod pool {
    use super::*;
    use intrusive_collections::singly_linked_list::Link;
    use intrusive_collections::SinglyLinkedList;

    pub const FRAMES: usize = 256;
    const PAGE: usize = 4096;

    /// A 4 KiB frame of the pool's range.
    #[repr(C, align(4096))]
    pub struct Frame {
        _bytes: [u8; PAGE],
    }

    /// The range: frames reached only through the base pointer once the pool exists.
    pub struct Range {
        _frames: Vec<Frame>,
        start: usize,
        end: usize,
    }

    impl Range {
        pub fn new() -> Range {
            let mut frames: Vec<Frame> = (0..FRAMES).map(|_| Frame { _bytes: [0; PAGE] }).collect();
            let start = frames.as_mut_ptr() as usize;
            Range {
                _frames: frames,
                start,
                end: start + FRAMES * PAGE,
            }
        }
    }

    /// One step: allocate a frame, or free the live frame at this position.
    #[derive(Clone, Copy)]
    pub enum Step {
        Alloc,
        Free(usize),
    }

    /// 4096 steps: up to 192 frames live, then allocations and frees (of a live frame
    /// drawn at random) half and half.
    pub fn input(seed: u64) -> Vec<Step> {
        let mut r = Rng(seed);
        let mut live = 0usize;
        (0..4096)
            .map(|_| {
                if live == 0 || (live < 192 && r.below(2) == 0) {
                    live += 1;
                    Step::Alloc
                } else {
                    let i = r.below(live as u64) as usize;
                    live -= 1;
                    Step::Free(i)
                }
            })
            .collect()
    }

    /// Today's pool: a bump pointer and a free list through each free frame's first word.
    pub struct Today {
        start: usize,
        next: usize,
        end: usize,
        free: usize,
        pub in_use: u64,
    }

    impl Today {
        pub fn new(r: &Range) -> Today {
            Today {
                start: r.start,
                next: r.start,
                end: r.end,
                free: 0,
                in_use: 0,
            }
        }

        fn alloc(&mut self) -> Option<usize> {
            let f = if self.free != 0 {
                let f = self.free;
                // SAFETY: `f` is a free frame of the range; its first word holds the next.
                self.free = unsafe { core::ptr::read(f as *const usize) };
                f
            } else if self.next < self.end {
                self.next += PAGE;
                self.next - PAGE
            } else {
                return None;
            };
            self.in_use += 1;
            Some(f)
        }

        fn free(&mut self, f: usize) {
            if f < self.start || f >= self.next || f % PAGE != 0 {
                return;
            }
            // SAFETY: `f` is a frame of the range given back; its first word links it.
            unsafe { core::ptr::write(f as *mut usize, self.free) };
            self.free = f;
            self.in_use -= 1;
        }

        pub fn run(&mut self, steps: &[Step], live: &mut Vec<usize>) -> u64 {
            let mut h = 0;
            for &s in steps {
                match s {
                    Step::Alloc => {
                        let f = self.alloc().expect("the range holds the live frames");
                        h = mix(h, (f - self.start) as u64);
                        live.push(f);
                    }
                    Step::Free(i) => self.free(live.swap_remove(i)),
                }
            }
            for f in live.drain(..) {
                self.free(f);
            }
            h
        }
    }

    /// What a free frame holds in the intrusive version: the list's link.
    pub struct FreeFrame {
        link: Link,
    }

    intrusive_adapter!(FreeAdapter = UnsafeRef<FreeFrame>: FreeFrame { link: Link });

    /// The intrusive pool: a bump pointer and a `SinglyLinkedList` of free frames.
    pub struct Intrusive {
        start: usize,
        next: usize,
        end: usize,
        free: SinglyLinkedList<FreeAdapter>,
        pub in_use: u64,
    }

    impl Drop for Intrusive {
        fn drop(&mut self) {
            // The frames belong to the range: forget them without touching them.
            self.free.fast_clear();
        }
    }

    impl Intrusive {
        pub fn new(r: &Range) -> Intrusive {
            Intrusive {
                start: r.start,
                next: r.start,
                end: r.end,
                free: SinglyLinkedList::new(FreeAdapter::new()),
                in_use: 0,
            }
        }

        fn alloc(&mut self) -> Option<usize> {
            let f = if let Some(f) = self.free.pop_front() {
                UnsafeRef::into_raw(f) as usize
            } else if self.next < self.end {
                self.next += PAGE;
                self.next - PAGE
            } else {
                return None;
            };
            self.in_use += 1;
            Some(f)
        }

        fn free(&mut self, f: usize) {
            if f < self.start || f >= self.next || f % PAGE != 0 {
                return;
            }
            let p = f as *mut FreeFrame;
            // SAFETY: `f` is a frame of the range given back: it becomes the pool's, an
            // unlinked `FreeFrame` is written at its start and linked.
            unsafe {
                core::ptr::write(p, FreeFrame { link: Link::new() });
                self.free.push_front(UnsafeRef::from_raw(p));
            }
            self.in_use -= 1;
        }

        pub fn run(&mut self, steps: &[Step], live: &mut Vec<usize>) -> u64 {
            let mut h = 0;
            for &s in steps {
                match s {
                    Step::Alloc => {
                        let f = self.alloc().expect("the range holds the live frames");
                        h = mix(h, (f - self.start) as u64);
                        live.push(f);
                    }
                    Step::Free(i) => self.free(live.swap_remove(i)),
                }
            }
            for f in live.drain(..) {
                self.free(f);
            }
            h
        }
    }
}

// ----- mapping_set ---------------------------------------------------------------------

mod sets {
    use super::*;
    use intrusive_collections::LinkedList;
    use std::cell::Cell;

    /// A region handle as the core's (`Region`: space, start, id).
    #[derive(Clone, Copy, PartialEq, Eq)]
    struct Handle {
        space: u32,
        start: u64,
        id: u64,
    }

    /// One step: the member at this position leaves (its region is freed) and a new
    /// region joins; or the whole set is taken (an unmap of the set) and its regions
    /// join again.
    #[derive(Clone, Copy)]
    pub enum Step {
        Replace(usize),
        TakeAll,
    }

    /// 4096 steps over a set of `n` members, a take every 256.
    pub fn input(seed: u64, n: usize) -> Vec<Step> {
        let mut r = Rng(seed);
        (0..4096)
            .map(|k| {
                if k % 256 == 255 {
                    Step::TakeAll
                } else {
                    Step::Replace(r.below(n as u64) as usize)
                }
            })
            .collect()
    }

    struct Rec {
        handle: Handle,
        set: Option<u32>,
    }

    /// Today's: the set holds its regions' handles; a region leaving is a `retain`.
    pub struct Today {
        recs: Vec<Rec>,
        set: Vec<Handle>,
        /// Record slots by member position (the caller's view of which region is which).
        order: Vec<usize>,
        next_id: u64,
    }

    impl Today {
        pub fn new(n: usize) -> Today {
            let mut t = Today {
                recs: Vec::new(),
                set: Vec::new(),
                order: Vec::new(),
                next_id: 0,
            };
            for i in 0..n {
                t.recs.push(Rec {
                    handle: Handle {
                        space: 1,
                        start: 0,
                        id: 0,
                    },
                    set: None,
                });
                t.join(i);
                t.order.push(i);
            }
            t
        }

        fn join(&mut self, slot: usize) {
            self.next_id += 1;
            let h = Handle {
                space: 1,
                start: 0x1000 * self.next_id,
                id: self.next_id,
            };
            self.recs[slot] = Rec {
                handle: h,
                set: Some(0),
            };
            self.set.push(h);
        }

        pub fn run(&mut self, steps: &[Step]) -> u64 {
            let mut h = 0;
            for &s in steps {
                match s {
                    Step::Replace(pos) => {
                        let slot = self.order[pos];
                        let r = &mut self.recs[slot];
                        if r.set.take().is_some() {
                            let gone = r.handle;
                            self.set.retain(|x| *x != gone);
                        }
                        self.join(slot);
                    }
                    Step::TakeAll => {
                        for m in core::mem::take(&mut self.set) {
                            h = mix(h, m.id ^ m.start ^ u64::from(m.space));
                            self.set.push(m);
                        }
                    }
                }
            }
            h
        }
    }

    /// The intrusive version: a `Link` in each region record, the set a list of them.
    pub struct RecL {
        pub space: Cell<u32>,
        pub id: Cell<u64>,
        pub start: Cell<u64>,
        pub set: Cell<Option<u32>>,
        pub link: LinkedListLink,
    }

    intrusive_adapter!(RecAdapter = UnsafeRef<RecL>: RecL { link: LinkedListLink });

    pub struct Intrusive {
        set: LinkedList<RecAdapter>,
        /// Never reallocated while the set points into it; dropped after it.
        recs: Box<[RecL]>,
        order: Vec<usize>,
        next_id: u64,
    }

    impl Drop for Intrusive {
        fn drop(&mut self) {
            self.set.fast_clear();
        }
    }

    impl Intrusive {
        pub fn new(n: usize) -> Intrusive {
            let mut t = Intrusive {
                set: LinkedList::new(RecAdapter::new()),
                recs: (0..n)
                    .map(|_| RecL {
                        space: Cell::new(1),
                        id: Cell::new(0),
                        start: Cell::new(0),
                        set: Cell::new(None),
                        link: LinkedListLink::new(),
                    })
                    .collect(),
                order: (0..n).collect(),
                next_id: 0,
            };
            for i in 0..n {
                t.join(i);
            }
            t
        }

        fn join(&mut self, slot: usize) {
            self.next_id += 1;
            let r = &self.recs[slot];
            r.id.set(self.next_id);
            r.start.set(0x1000 * self.next_id);
            r.set.set(Some(0));
            // SAFETY: the record lives in `self.recs`, which outlives the list and never
            // moves; it is on no list (it just left or was never in one).
            self.set.push_back(unsafe { UnsafeRef::from_raw(r) });
        }

        pub fn run(&mut self, steps: &[Step]) -> u64 {
            let mut h = 0;
            for &s in steps {
                match s {
                    Step::Replace(pos) => {
                        let slot = self.order[pos];
                        let r: *const RecL = &self.recs[slot];
                        // SAFETY: `r` points into `self.recs` (alive, not moved).
                        if unsafe { (*r).set.take() }.is_some() {
                            // SAFETY: a record whose `set` is `Some` is on the set's list.
                            unsafe { self.set.cursor_mut_from_ptr(r).remove() };
                        }
                        self.join(slot);
                    }
                    Step::TakeAll => {
                        let mut taken = self.set.take();
                        while let Some(m) = taken.pop_front() {
                            h = mix(h, m.id.get() ^ m.start.get() ^ u64::from(m.space.get()));
                            self.set.push_back(m);
                        }
                    }
                }
            }
            h
        }
    }
}

// ----- mapping_set with boxed records --------------------------------------------------

/// The intrusive set over records at stable addresses as the core would have to keep
/// them: each region record boxed (allocated when the region joins, freed when it
/// leaves), the set's list owning the boxes, the caller holding a pointer per region.
mod boxed_sets {
    use super::sets::{RecL, Step};
    use super::*;
    use intrusive_collections::LinkedList;
    use std::cell::Cell;

    intrusive_adapter!(BoxAdapter = Box<RecL>: RecL { link: LinkedListLink });

    pub struct Boxed {
        set: LinkedList<BoxAdapter>,
        /// Each member position's record (owned by the set's list).
        order: Vec<*const RecL>,
        next_id: u64,
    }

    impl Boxed {
        pub fn new(n: usize) -> Boxed {
            let mut t = Boxed {
                set: LinkedList::new(BoxAdapter::new()),
                order: vec![core::ptr::null(); n],
                next_id: 0,
            };
            for i in 0..n {
                t.join(i);
            }
            t
        }

        fn join(&mut self, pos: usize) {
            self.next_id += 1;
            let b = Box::new(RecL {
                space: Cell::new(1),
                id: Cell::new(self.next_id),
                start: Cell::new(0x1000 * self.next_id),
                set: Cell::new(Some(0)),
                link: LinkedListLink::new(),
            });
            self.order[pos] = &*b;
            self.set.push_back(b);
        }

        pub fn run(&mut self, steps: &[Step]) -> u64 {
            let mut h = 0;
            for &s in steps {
                match s {
                    Step::Replace(pos) => {
                        let r = self.order[pos];
                        // SAFETY: `r` is a record the set's list owns (joined, not yet
                        // left): alive.
                        if unsafe { (*r).set.take() }.is_some() {
                            // SAFETY: a record whose `set` is `Some` is on the list; its
                            // box is freed here and `order[pos]` replaced just below.
                            drop(unsafe { self.set.cursor_mut_from_ptr(r).remove() });
                        }
                        self.join(pos);
                    }
                    Step::TakeAll => {
                        let mut taken = self.set.take();
                        while let Some(m) = taken.pop_front() {
                            h = mix(h, m.id.get() ^ m.start.get() ^ u64::from(m.space.get()));
                            self.set.push_back(m);
                        }
                    }
                }
            }
            h
        }
    }
}

// ----- release_batch -------------------------------------------------------------------

mod batch {
    use super::*;
    use intrusive_collections::LinkedList;

    pub const BATCH_LIMIT: usize = 64;

    type Callback = Box<dyn FnOnce(Result<(), ()>) + Send>;

    /// The core's `Discard`: its three vectors (empty here: they are built the same way
    /// in both designs) and its range.
    pub struct Discard {
        runs: Vec<(u64, u64)>,
        frames: Vec<(u8, u64)>,
        first: u64,
        pages: u64,
        unlocked: Vec<u64>,
    }

    pub enum Op {
        Unmap {
            discard: Discard,
            va: Option<(u64, u64)>,
        },
        Map {
            first: u64,
            pages: u64,
        },
    }

    /// The core's `Request`.
    pub struct Request {
        op: Op,
        callback: Option<Callback>,
    }

    /// 4096 requests: nine unmaps in ten, one map.
    pub fn input(seed: u64) -> Vec<(bool, u64, u64)> {
        let mut r = Rng(seed);
        (0..4096)
            .map(|_| (r.below(10) != 0, r.below(1 << 20), 1 + r.below(16)))
            .collect()
    }

    fn request(unmap: bool, first: u64, pages: u64) -> Request {
        Request {
            op: if unmap {
                Op::Unmap {
                    discard: Discard {
                        runs: Vec::new(),
                        frames: Vec::new(),
                        first,
                        pages,
                        unlocked: Vec::new(),
                    },
                    va: Some((first << 12, pages << 12)),
                }
            } else {
                Op::Map { first, pages }
            },
            callback: None,
        }
    }

    /// What the drain's first pass reads (runs to invalidate, maps to mirror).
    fn scan(req: &Request, h: u64) -> u64 {
        match &req.op {
            Op::Unmap { discard, .. } => mix(h, discard.runs.len() as u64 + discard.first),
            Op::Map { first, pages } => mix(h, first + pages),
        }
    }

    /// What the drain's second pass releases.
    fn release(req: Request, h: u64) -> u64 {
        let mut h = h;
        if let Op::Unmap { discard, va } = req.op {
            h = mix(h, discard.pages + discard.frames.len() as u64);
            h = mix(h, discard.unlocked.len() as u64 + va.map_or(0, |v| v.1));
        }
        if let Some(cb) = req.callback {
            cb(Ok(()));
        }
        h
    }

    /// Today's queue: a vector taken whole at each drain.
    pub struct Today {
        requests: Vec<Request>,
        pub batches: u64,
    }

    impl Today {
        pub fn new() -> Today {
            Today {
                requests: Vec::new(),
                batches: 0,
            }
        }

        fn drain(&mut self, h: u64) -> u64 {
            let requests = core::mem::take(&mut self.requests);
            if requests.is_empty() {
                return h;
            }
            self.batches += 1;
            let mut h = requests.iter().fold(h, |h, r| scan(r, h));
            for r in requests {
                h = release(r, h);
            }
            h
        }

        pub fn run(&mut self, input: &[(bool, u64, u64)]) -> u64 {
            let mut h = 0;
            for &(unmap, first, pages) in input {
                self.requests.push(request(unmap, first, pages));
                if self.requests.len() >= BATCH_LIMIT {
                    h = self.drain(h);
                }
            }
            self.drain(h)
        }
    }

    /// A request on the intrusive queue.
    pub struct Node {
        link: LinkedListLink,
        req: Request,
    }

    intrusive_adapter!(NodeAdapter = Box<Node>: Node { link: LinkedListLink });

    /// The intrusive queue: a list of boxed requests, taken whole at each drain.
    pub struct Intrusive {
        requests: LinkedList<NodeAdapter>,
        len: usize,
        pub batches: u64,
    }

    impl Intrusive {
        pub fn new() -> Intrusive {
            Intrusive {
                requests: LinkedList::new(NodeAdapter::new()),
                len: 0,
                batches: 0,
            }
        }

        fn drain(&mut self, h: u64) -> u64 {
            let mut requests = self.requests.take();
            self.len = 0;
            if requests.is_empty() {
                return h;
            }
            self.batches += 1;
            let mut h = requests.iter().fold(h, |h, n| scan(&n.req, h));
            while let Some(n) = requests.pop_front() {
                h = release(n.req, h);
            }
            h
        }

        pub fn run(&mut self, input: &[(bool, u64, u64)]) -> u64 {
            let mut h = 0;
            for &(unmap, first, pages) in input {
                self.requests.push_back(Box::new(Node {
                    link: LinkedListLink::new(),
                    req: request(unmap, first, pages),
                }));
                self.len += 1;
                if self.len >= BATCH_LIMIT {
                    h = self.drain(h);
                }
            }
            self.drain(h)
        }
    }
}

// ----- the runs ------------------------------------------------------------------------

/// Whether this is a measuring run (`cargo bench`) rather than `cargo test --benches`.
fn measuring() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Alternated batches of `ops` operations each: median ns per operation of today's and
/// the intrusive side, and the ratio intrusive / today.
fn alternated(
    name: &str,
    ops: usize,
    mut today: impl FnMut() -> u64,
    mut intrusive: impl FnMut() -> u64,
) {
    let samples = if measuring() { 31 } else { 3 };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let t = Instant::now();
        black_box(today());
        a.push(t.elapsed().as_nanos() as f64 / ops as f64);
        let t = Instant::now();
        black_box(intrusive());
        b.push(t.elapsed().as_nanos() as f64 / ops as f64);
    }
    let (a, b) = (median(&mut a), median(&mut b));
    println!(
        "{name:<18} today {a:>8.2} ns/op   intrusive {b:>8.2} ns/op   ratio intrusive/today {:>5.2}  ({samples} alternated batches of {ops})",
        b / a
    );
}

/// gmem-sim's own [`gmem_sim::Tlb`] with the model's geometry and policy.
fn real_tlb() -> gmem_sim::Tlb<u64> {
    use gmem_sim::{Replacement, Tlb, TlbConfig};
    Tlb::new(TlbConfig::new(lru::SETS, lru::WAYS, Replacement::Lru)).expect("a valid TLB")
}

/// The model's input on the real TLB (4 KiB pages: a tag is a page number): a lookup,
/// an insert on a miss, a removal for an invalidation. Returns the values looked up
/// (the models' sum) and accumulates the counters in the TLB.
fn run_real(t: &mut gmem_sim::Tlb<u64>, steps: &[lru::Step]) -> u64 {
    let mut sum = 0u64;
    for &s in steps {
        match s {
            lru::Step::Access { asid, tag } => match t.lookup(asid, tag << 12) {
                Some((_, v)) => sum = sum.wrapping_add(v),
                None => {
                    t.insert_missing(asid, tag << 12, 12, tag * 3);
                }
            },
            lru::Step::Invalidate { asid, tag } => {
                t.remove(asid, tag << 12);
            }
        }
    }
    sum
}

fn tlb_lru(c: &mut Criterion) {
    let input = lru::input(0x5EED);
    // The same answers on both sides.
    let (mut t, mut i) = (lru::Today::new(), lru::Intrusive::new());
    assert_eq!(t.run(&input), i.run(&input), "same values looked up");
    assert_eq!(t.out, i.out, "same hits, misses, victims");
    assert!(t.out.hits > 0 && t.out.evictions > 0 && t.out.invalidated > 0);
    // The models answer as the real TLB does, from cold.
    let (mut real, mut fresh) = (real_tlb(), lru::Today::new());
    assert_eq!(
        run_real(&mut real, &input),
        fresh.run(&input),
        "same values as gmem-sim's Tlb"
    );
    let r = real.stats();
    let o = fresh.out;
    assert_eq!(
        (r.hits, r.misses, r.evictions, r.invalidated),
        (o.hits, o.misses, o.evictions, o.invalidated),
        "the same counters as gmem-sim's Tlb"
    );
    let mut g = c.benchmark_group("tlb_lru");
    g.bench_function("today", |b| b.iter(|| t.run(black_box(&input))));
    g.bench_function("intrusive", |b| b.iter(|| i.run(black_box(&input))));
    g.finish();
    alternated("tlb_lru", input.len(), || t.run(&input), || i.run(&input));
}

fn frame_pool(c: &mut Criterion) {
    let input = pool::input(0xF4A3);
    let (rt, ri) = (pool::Range::new(), pool::Range::new());
    let (mut t, mut i) = (pool::Today::new(&rt), pool::Intrusive::new(&ri));
    let (mut lt, mut li) = (Vec::new(), Vec::new());
    // Three rounds: the second and third allocate from the free list, not the bump.
    for _ in 0..3 {
        assert_eq!(
            t.run(&input, &mut lt),
            i.run(&input, &mut li),
            "same frames handed out in the same order"
        );
        assert_eq!((t.in_use, i.in_use), (0, 0), "every frame given back");
    }
    let mut g = c.benchmark_group("frame_pool");
    g.bench_function("today", |b| b.iter(|| t.run(black_box(&input), &mut lt)));
    g.bench_function("intrusive", |b| {
        b.iter(|| i.run(black_box(&input), &mut li))
    });
    g.finish();
    alternated(
        "frame_pool",
        input.len(),
        || t.run(&input, &mut lt),
        || i.run(&input, &mut li),
    );
}

fn mapping_set(c: &mut Criterion) {
    let mut g = c.benchmark_group("mapping_set");
    let mut lines = Vec::new();
    for n in [8usize, 64, 512] {
        let input = sets::input(0x5E7 + n as u64, n);
        let (mut t, mut i) = (sets::Today::new(n), sets::Intrusive::new(n));
        assert_eq!(
            t.run(&input),
            i.run(&input),
            "same members in the same order"
        );
        let mut fresh = sets::Today::new(n);
        assert_eq!(
            fresh.run(&input),
            boxed_sets::Boxed::new(n).run(&input),
            "boxed records: same members in the same order"
        );
        g.bench_function(format!("today/{n}"), |b| {
            b.iter(|| t.run(black_box(&input)))
        });
        g.bench_function(format!("intrusive/{n}"), |b| {
            b.iter(|| i.run(black_box(&input)))
        });
        lines.push((n, input, t, i));
    }
    g.finish();
    for (n, input, mut t, mut i) in lines {
        alternated(
            &format!("mapping_set/{n}"),
            input.len(),
            || t.run(&input),
            || i.run(&input),
        );
        let mut b = boxed_sets::Boxed::new(n);
        alternated(
            &format!("mapping_set+box/{n}"),
            input.len(),
            || t.run(&input),
            || b.run(&input),
        );
    }
}

fn release_batch(c: &mut Criterion) {
    let input = batch::input(0xBA7C);
    let (mut t, mut i) = (batch::Today::new(), batch::Intrusive::new());
    assert_eq!(
        t.run(&input),
        i.run(&input),
        "same requests released in order"
    );
    assert_eq!(t.batches, i.batches);
    assert_eq!(t.batches, (input.len() / batch::BATCH_LIMIT) as u64);
    let mut g = c.benchmark_group("release_batch");
    g.bench_function("today", |b| b.iter(|| t.run(black_box(&input))));
    g.bench_function("intrusive", |b| b.iter(|| i.run(black_box(&input))));
    g.finish();
    alternated(
        "release_batch",
        input.len(),
        || t.run(&input),
        || i.run(&input),
    );
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

/// Run one side `batches` times on its input and nothing else (for an instruction
/// count: `GMEM_INTRUSIVE_ONE=tlb_lru/today:110` under `valgrind --tool=cachegrind`,
/// minus the same with `:10`, over 100 batches of 4096 operations).
fn one(spec: &str) {
    let (name, batches) = spec.split_once(':').expect("NAME/SIDE:BATCHES");
    let batches: usize = batches.parse().expect("a batch count");
    let mut h = 0u64;
    match name {
        "tlb_lru/today" => {
            let (input, mut t) = (lru::input(0x5EED), lru::Today::new());
            (0..batches).for_each(|_| h = mix(h, t.run(black_box(&input))));
        }
        "tlb_lru/real" => {
            let input = lru::input(0x5EED);
            let mut t = real_tlb();
            (0..batches).for_each(|_| h = mix(h, run_real(&mut t, black_box(&input))));
        }
        "tlb_lru/intrusive" => {
            let (input, mut t) = (lru::input(0x5EED), lru::Intrusive::new());
            (0..batches).for_each(|_| h = mix(h, t.run(black_box(&input))));
        }
        "frame_pool/today" | "frame_pool/intrusive" => {
            let (input, r, mut live) = (pool::input(0xF4A3), pool::Range::new(), Vec::new());
            if name.ends_with("today") {
                let mut t = pool::Today::new(&r);
                (0..batches).for_each(|_| h = mix(h, t.run(black_box(&input), &mut live)));
            } else {
                let mut t = pool::Intrusive::new(&r);
                (0..batches).for_each(|_| h = mix(h, t.run(black_box(&input), &mut live)));
            }
        }
        "release_batch/today" => {
            let (input, mut t) = (batch::input(0xBA7C), batch::Today::new());
            (0..batches).for_each(|_| h = mix(h, t.run(black_box(&input))));
        }
        "release_batch/intrusive" => {
            let (input, mut t) = (batch::input(0xBA7C), batch::Intrusive::new());
            (0..batches).for_each(|_| h = mix(h, t.run(black_box(&input))));
        }
        other => {
            let (side, n) = other
                .strip_prefix("mapping_set/")
                .and_then(|r| r.split_once('/'))
                .expect("a known NAME/SIDE");
            let n: usize = n.parse().expect("a set size");
            let input = sets::input(0x5E7 + n as u64, n);
            if side == "today" {
                let mut t = sets::Today::new(n);
                (0..batches).for_each(|_| h = mix(h, t.run(black_box(&input))));
            } else if side == "boxed" {
                let mut t = boxed_sets::Boxed::new(n);
                (0..batches).for_each(|_| h = mix(h, t.run(black_box(&input))));
            } else {
                let mut t = sets::Intrusive::new(n);
                (0..batches).for_each(|_| h = mix(h, t.run(black_box(&input))));
            }
        }
    }
    println!("{spec}: checksum {h:#x}");
}

criterion_group! {
    name = benches;
    config = config();
    targets = tlb_lru, frame_pool, mapping_set, release_batch
}

fn main() {
    if let Ok(spec) = std::env::var("GMEM_INTRUSIVE_ONE") {
        one(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
