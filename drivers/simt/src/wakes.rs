//! When a unit's waiting warps become ready: a calendar of per-cycle slot masks.
//!
//! A unit with at most 64 warp slots keeps a ready mask; a warp that issues waits for a
//! latency and then rejoins it. [`Wakes`] holds those waits (except a wait that ends by
//! the unit's next clock, as a non-blocking load's: the engine leaves that warp in the
//! ready mask, where the next pick would find it either way). It answers the two
//! questions the engine asks, exactly as the binary heap of `(cycle, slot)` it replaces:
//! at a pick at cycle `now`, which waiting slots are due (their cycle is at most `now`;
//! they leave the calendar), and, when nothing is ready, the earliest cycle a waiting
//! slot becomes due. The order among due slots never mattered: they are OR-ed into the
//! ready mask.
//!
//! ## Layout
//! A ring of `RING` buckets, one slot mask per cycle, covers the cycles
//! `base..base + RING`; a bitmap of the non-empty buckets, and a word marking its
//! non-zero words, find the next one in two bitmap reads. A wait beyond the ring goes to a small heap (`far`)
//! and moves into the ring when `base` comes near it; one at a cycle already drained
//! (a walk-queue instruction that ran before its unit's clock) is due at once. `next`
//! caches the earliest cycle held, so a pick before it costs one compare, and a drain
//! takes that cycle's bucket without the bitmap search (it searches only for the
//! buckets after it).
//!
//! ## Why there are no stale entries
//! The heap skipped an entry whose slot's `ready_at` had changed since the push. The
//! engine changes a slot's `ready_at` only when the slot is not waiting here: a picked
//! slot is ready (it left the calendar when it became due), a slot leaving the walk
//! queue was parked, and a slot given a new block was dead. So every slot waits at
//! most once ([`Wakes::push`] asserts it in debug builds) and every entry is valid; the
//! `pending` mask records which slots wait and the engine asserts, where it writes
//! `ready_at` without a push, that the slot is not among them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Cycles the ring covers (a power of two, 64 words of 64 at most): more than the
/// common latencies, so that `far` is rare. A load queued behind a saturated DRAM link
/// waits 2,000 to 4,000 cycles (half of all waits in `live_speed stream`; one in 160
/// is longer).
const RING: u64 = 4096;

/// The waits of one unit's (at most 64) warp slots.
pub(crate) struct Wakes {
    /// Every cycle below `base` has been drained; the ring's buckets hold cycles in
    /// `base..base + RING`.
    base: u64,
    /// The earliest cycle held (`u64::MAX` when none).
    next: u64,
    /// Slots waiting (bit `i`): each is in exactly one of `due`, a bucket or `far`.
    pending: u64,
    /// Slots whose cycle was below `base` when pushed: due at the next drain.
    due: u64,
    /// Bucket `t % RING`: the slots waiting for cycle `t`.
    buckets: Box<[u64; RING as usize]>,
    /// Bit `b` of word `b / 64`: bucket `b` is not empty.
    occupied: [u64; (RING / 64) as usize],
    /// Bit `w`: word `w` of `occupied` is not zero (so 64 words at most).
    words: u64,
    /// Waits at `base + RING` or later, packed as `cycle << 6 | slot` (ordered as the
    /// pair).
    far: BinaryHeap<Reverse<u64>>,
}

impl Wakes {
    /// No waits, nothing drained.
    pub(crate) fn new() -> Wakes {
        Wakes {
            base: 0,
            next: u64::MAX,
            pending: 0,
            due: 0,
            buckets: Box::new([0; RING as usize]),
            occupied: [0; (RING / 64) as usize],
            words: 0,
            far: BinaryHeap::new(),
        }
    }

    /// `self` emptied for another launch, if no slot waits (then every bucket is
    /// empty: it holds only waiting slots) — the ring is not cleared again; else a new
    /// calendar.
    pub(crate) fn reused(mut self) -> Wakes {
        if self.pending != 0 {
            return Wakes::new();
        }
        self.base = 0;
        self.next = u64::MAX;
        self.due = 0;
        self.far.clear();
        debug_assert!(self.words == 0 && self.occupied.iter().all(|&w| w == 0));
        self
    }

    /// Slot `i` (below 64) waits until cycle `t` (below 2^58).
    #[inline]
    pub(crate) fn push(&mut self, t: u64, i: usize) {
        debug_assert!(i < 64 && t < 1 << 58);
        debug_assert!(!self.is_pending(i), "slot {i} waits twice");
        let bit = 1u64 << i;
        self.pending |= bit;
        self.next = self.next.min(t);
        if t < self.base {
            self.due |= bit;
        } else if t - self.base < RING {
            self.bucket_add(t, bit);
        } else {
            self.far.push(Reverse(t << 6 | i as u64));
        }
    }

    /// Whether slot `i` waits here.
    #[inline]
    pub(crate) fn is_pending(&self, i: usize) -> bool {
        self.pending & (1u64 << (i & 63)) != 0
    }

    /// The slots due at cycle `now` (their cycle is at most `now`); they stop waiting.
    /// `now` never decreases between calls.
    #[inline(always)]
    pub(crate) fn take_due(&mut self, now: u64) -> u64 {
        if now < self.next {
            return 0;
        }
        self.drain(now)
    }

    /// The earliest cycle a waiting slot is due, if any waits. After
    /// [`Wakes::take_due`] at `now`, it is later than `now`.
    #[inline]
    pub(crate) fn earliest(&self) -> Option<u64> {
        (self.pending != 0).then_some(self.next)
    }

    fn bucket_add(&mut self, t: u64, bit: u64) {
        let b = (t % RING) as usize;
        self.buckets[b] |= bit;
        self.occupied[b / 64] |= 1 << (b % 64);
        self.words |= 1 << (b / 64);
    }

    /// The first non-empty bucket at or after position `from`, in the ring's cyclic
    /// order: two bitmap words at most.
    fn first_from(&self, from: usize) -> Option<usize> {
        let (w0, sh) = (from / 64, from % 64);
        let here = self.occupied[w0] & (!0u64 << sh);
        if here != 0 {
            return Some(w0 * 64 + here.trailing_zeros() as usize);
        }
        let above = match w0 {
            63 => 0,
            _ => self.words & (!0u64 << (w0 + 1)),
        };
        // After the last word the ring wraps: the words before `w0`, then the bits of
        // `w0` before `from`.
        let w = if above != 0 {
            above.trailing_zeros() as usize
        } else {
            let below = self.words & ((1u64 << w0) - 1);
            if below != 0 {
                below.trailing_zeros() as usize
            } else {
                w0
            }
        };
        let m = self.occupied[w];
        (m != 0).then(|| w * 64 + m.trailing_zeros() as usize)
    }

    /// Empty bucket `p`, returning its slots.
    #[inline]
    fn take_bucket(&mut self, p: usize) -> u64 {
        let w = p / 64;
        self.occupied[w] &= !(1 << (p % 64));
        if self.occupied[w] == 0 {
            self.words &= !(1 << w);
        }
        std::mem::take(&mut self.buckets[p])
    }

    #[inline]
    fn drain(&mut self, now: u64) -> u64 {
        let mut got = std::mem::take(&mut self.due);
        // The buckets in cycle order from `base`'s: take each one up to `now`; the
        // first one after it is the next wait. (A taken bucket is emptied, so the
        // cyclic search never comes back to one before `from`.)
        let start = (self.base % RING) as usize;
        let mut from = start;
        if self.next >= self.base && self.next - self.base < RING {
            // The earliest wait is in the ring (not in `due`, nor in `far`, which holds
            // only cycles from `base + RING` on), and due (`take_due` drains at or
            // after it): its bucket is taken without the search.
            let p = (self.next % RING) as usize;
            debug_assert!(self.next <= now && self.buckets[p] != 0);
            got |= self.take_bucket(p);
            from = (p + 1) % RING as usize;
        }
        let mut next = u64::MAX;
        while let Some(p) = self.first_from(from) {
            let t = self.base + ((p + RING as usize - start) % RING as usize) as u64;
            if t > now {
                next = t;
                break;
            }
            got |= self.take_bucket(p);
            from = (p + 1) % RING as usize;
        }
        // `take_due` drains only at or after the earliest wait, so `base <= now + 1`.
        self.base = now + 1;
        while let Some(&Reverse(k)) = self.far.peek() {
            let (t, bit) = (k >> 6, 1u64 << (k & 63));
            if t >= self.base + RING {
                break;
            }
            self.far.pop();
            if t <= now {
                got |= bit;
            } else {
                self.bucket_add(t, bit);
                next = next.min(t);
            }
        }
        self.next = if next == u64::MAX {
            self.far.peek().map_or(u64::MAX, |&Reverse(k)| k >> 6)
        } else {
            next
        };
        debug_assert_eq!(got & !self.pending, 0);
        self.pending &= !got;
        got
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The heap the calendar replaces, as the engine used it: `(cycle, slot)` words,
    /// an entry valid while its slot's `ready_at` still equals its cycle.
    struct Heap(BinaryHeap<Reverse<u64>>);

    impl Heap {
        fn due(&mut self, now: u64, ready_at: &[u64]) -> u64 {
            let mut got = 0;
            while let Some(&Reverse(k)) = self.0.peek() {
                let (t, i) = (k >> 6, (k & 63) as usize);
                if t > now {
                    break;
                }
                self.0.pop();
                if ready_at[i] == t {
                    got |= 1 << i;
                }
            }
            got
        }
        fn earliest(&mut self, ready_at: &[u64]) -> Option<u64> {
            while let Some(&Reverse(k)) = self.0.peek() {
                let (t, i) = (k >> 6, (k & 63) as usize);
                if ready_at[i] == t {
                    return Some(t);
                }
                self.0.pop();
            }
            None
        }
    }

    /// On random runs of the engine's protocol (a ready slot issues and waits a
    /// latency, or parks, or exits; a parked slot leaves the walk queue with a cycle
    /// that may be before the unit's clock; an exited slot takes a new warp; the clock
    /// jumps to the earliest wait when nothing is ready), the calendar gives the same
    /// due masks at every pick and the same earliest wait as the heap, over latencies
    /// inside and beyond the ring.
    #[test]
    fn the_calendar_answers_as_the_heap() {
        const PARKED: u64 = u64::MAX - 1;
        const DEAD: u64 = u64::MAX;
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for (slots, spread) in [(64usize, 700u64), (5, 3000), (64, 40), (33, 5000)] {
            let (mut cal, mut heap) = (Wakes::new(), Heap(BinaryHeap::new()));
            let mut ready_at = vec![0u64; slots];
            let mut ready: u64 = if slots == 64 { !0 } else { (1 << slots) - 1 };
            let mut now = 0u64;
            for _ in 0..40_000 {
                let (a, b) = (cal.take_due(now), heap.due(now, &ready_at));
                assert_eq!(a, b, "due at {now}");
                ready |= a;
                let parked: Vec<usize> = (0..slots).filter(|&i| ready_at[i] == PARKED).collect();
                if !parked.is_empty() && rnd(4) == 0 {
                    // A walk-queue instruction completes; its cycle may be in the past.
                    let i = parked[rnd(parked.len() as u64) as usize];
                    let t = (now + rnd(spread)).saturating_sub(spread / 4);
                    ready_at[i] = t;
                    cal.push(t, i);
                    heap.0.push(Reverse(t << 6 | i as u64));
                    continue;
                }
                if ready == 0 {
                    let (a, b) = (cal.earliest(), heap.earliest(&ready_at));
                    assert_eq!(a, b, "earliest at {now}");
                    match a {
                        Some(t) => now = t,
                        None => {
                            if parked.is_empty() {
                                // All dead: revive them.
                                for (i, r) in ready_at.iter_mut().enumerate() {
                                    *r = now;
                                    ready |= 1 << i;
                                }
                            }
                        }
                    }
                    continue;
                }
                let s = {
                    let bits: Vec<usize> = (0..64).filter(|&i| ready & (1 << i) != 0).collect();
                    bits[rnd(bits.len() as u64) as usize]
                };
                ready &= !(1 << s);
                match rnd(10) {
                    0 => ready_at[s] = PARKED,
                    1 => {
                        // Exit, and sometimes a new warp in the slot at once.
                        assert!(!cal.is_pending(s));
                        ready_at[s] = DEAD;
                        if rnd(2) == 0 {
                            ready_at[s] = now;
                            ready |= 1 << s;
                        }
                    }
                    _ => {
                        let t = now + 1 + rnd(spread);
                        ready_at[s] = t;
                        cal.push(t, s);
                        heap.0.push(Reverse(t << 6 | s as u64));
                    }
                }
                now += rnd(3);
            }
        }
    }
}
