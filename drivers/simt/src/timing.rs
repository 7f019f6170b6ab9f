//! Translation timing of the SIMT engine: the page-table walkers every unit shares and
//! the pending-walk table.
//!
//! [`Walkers`] owns the device's `walkers` concurrent page walks (the IOMMU's
//! highly-threaded walker of the MESC paper's baseline, §II) as the times each walker
//! is next free, and the walks in flight as a map from page to the cycle its walk
//! ends. A walk takes the earliest free walker; requests that find every walker busy
//! wait for one (the paper's page walk buffer). A request for a page whose walk is in
//! flight does not walk again: it waits for that walk and is counted as a *merged
//! miss* (a pending-walk table, as MSHRs merge misses to one line).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes a page address with one multiply (the keys are page-aligned addresses, not
/// attacker-chosen; the default SipHash cost a quarter of a hit-heavy run).
#[derive(Default)]
pub(crate) struct PageHasher(u64);

impl Hasher for PageHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (x >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The shared walkers and the walks in flight.
#[derive(Debug)]
pub(crate) struct Walkers {
    /// When each walker is next free, earliest first.
    free: BinaryHeap<Reverse<u64>>,
    /// Page (its first byte) → cycle its latest walk ends.
    ends: HashMap<u64, u64, BuildHasherDefault<PageHasher>>,
    /// The latest end of any walk: no walk is in flight from then on.
    last: u64,
    /// `ends` is pruned of finished walks when it grows past this.
    prune_at: usize,
}

const PRUNE_FLOOR: usize = 4096;

impl Walkers {
    /// `n` walkers (at least one), all free at cycle 0.
    pub(crate) fn new(n: u64) -> Walkers {
        Walkers {
            free: (0..n.max(1)).map(|_| Reverse(0)).collect(),
            ends: HashMap::default(),
            last: 0,
            prune_at: PRUNE_FLOOR,
        }
    }

    /// The cycle the earliest walker is free.
    pub(crate) fn next_free(&self) -> u64 {
        self.free.peek().map_or(0, |r| r.0)
    }

    /// Walk `page` for `latency` cycles on the earliest free walker, not before `at`;
    /// returns the cycle the walk ends, which requests for `page` until then wait for.
    #[cfg(test)]
    pub(crate) fn walk(&mut self, page: u64, at: u64, latency: u64) -> u64 {
        self.walk_with(page, at, |start| start + latency)
    }

    /// [`Walkers::walk`] whose end `end_of(start)` depends on when it starts (its reads
    /// queue on the DRAM link from then).
    pub(crate) fn walk_with(&mut self, page: u64, at: u64, end_of: impl FnOnce(u64) -> u64) -> u64 {
        let Reverse(free) = self.free.pop().expect("at least one walker");
        let end = end_of(at.max(free));
        self.free.push(Reverse(end));
        let e = self.ends.entry(page).or_insert(end);
        *e = (*e).max(end);
        self.last = self.last.max(end);
        end
    }

    /// Forget walks that ended by cycle `horizon` (no request still to be classified
    /// was issued before it) once the table has grown; keeps lookups cheap.
    pub(crate) fn prune(&mut self, horizon: u64) {
        if self.ends.len() > self.prune_at {
            self.ends.retain(|_, &mut e| e > horizon);
            self.prune_at = (2 * self.ends.len()).max(PRUNE_FLOOR);
        }
    }

    /// The end of `page`'s walk if it is still in flight at cycle `t`.
    pub(crate) fn in_flight(&self, page: u64, t: u64) -> Option<u64> {
        if t >= self.last {
            return None;
        }
        self.ends.get(&page).copied().filter(|&e| e > t)
    }

    /// The end of `page`'s latest walk, if one is remembered.
    pub(crate) fn last_end(&self, page: u64) -> Option<u64> {
        self.ends.get(&page).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_beyond_the_walker_count_wait_for_a_free_walker() {
        let mut w = Walkers::new(2);
        assert_eq!(w.walk(0x1000, 10, 100), 110);
        assert_eq!(w.walk(0x2000, 10, 100), 110);
        // Both busy until 110: the third starts then.
        assert_eq!(w.next_free(), 110);
        assert_eq!(w.walk(0x3000, 20, 100), 210);
        assert_eq!(w.in_flight(0x3000, 150), Some(210));
        assert_eq!(w.in_flight(0x3000, 210), None, "ended");
        assert_eq!(w.in_flight(0x4000, 0), None, "never walked");
        assert_eq!(w.last_end(0x1000), Some(110));
    }

    #[test]
    fn pruning_keeps_the_walks_in_flight() {
        let mut w = Walkers::new(1);
        for p in 0..(PRUNE_FLOOR as u64 + 10) {
            w.walk(p << 12, 0, 1);
            w.prune(p);
        }
        let last = (PRUNE_FLOOR as u64 + 9) << 12;
        // One walker: the walks ran one after another, the last still in flight at the
        // time it was asked for.
        let end = w.last_end(last).expect("kept");
        assert_eq!(end, PRUNE_FLOOR as u64 + 10);
        assert!(w.ends.len() <= w.prune_at);
    }
}
