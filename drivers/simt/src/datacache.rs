//! The data caches of the cost model: a set-associative, LRU array of 128-byte line
//! tags (no data: the bytes always move in simulated memory, the cache only decides
//! what a transaction costs).
//!
//! It decides hits exactly as the [`gmem_sim::Tlb`] with [`gmem_sim::Replacement::Lru`]
//! the engine used before (set = line number modulo the sets, the least recently
//! filled or used line of a full set evicted): each set keeps its lines most recent
//! first, so a hit moves one line to the front and a miss shifts the set by one to
//! fill its line there (the model fills every cache a transaction misses). It is
//! the engine's own because the engine only needs that (no asids, page sizes, values
//! or counters), at a fraction of a TLB's bookkeeping per transaction.

use crate::coalesce::TRANSACTION;

/// An empty way (no line number reaches it: a line number is an address over 128).
const EMPTY: u64 = u64::MAX;

/// Most lines a cache may hold (the [`gmem_sim::Tlb`] bound the engine used before).
const MAX_LINES: usize = 1 << 20;

/// A set-associative LRU cache of 128-byte lines.
#[derive(Clone, Debug)]
pub(crate) struct DataCache {
    /// `sets × ways` line numbers, each set's most recent first, [`EMPTY`] at its end.
    lines: Vec<u64>,
    sets: u64,
    ways: usize,
    /// Set index hashed from the line's higher bits ([`DataCache::hashed`]).
    hashed: bool,
}

impl DataCache {
    /// A cache of `sets` sets of `ways` lines; `None` for zero sets or ways or more
    /// than 2^20 lines.
    pub(crate) fn new(sets: usize, ways: usize) -> Option<DataCache> {
        if sets == 0 || ways == 0 || sets.checked_mul(ways)? > MAX_LINES {
            return None;
        }
        Some(DataCache {
            lines: vec![EMPTY; sets * ways],
            sets: sets as u64,
            ways,
            hashed: false,
        })
    }

    /// The same cache with its set index the XOR of the line number's low bits with
    /// the two next groups of as many bits (an XOR-folded index, as GPU caches hash
    /// their set index so that power-of-two strides do not pile into a few sets:
    /// GPGPU-Sim's hashed set-index functions, after Nugteren et al., "A detailed GPU
    /// cache model based on reuse distance theory", HPCA 2014, who measured Fermi's).
    /// Only for a power-of-two number of sets; otherwise the index stays a modulo.
    pub(crate) fn hashed(mut self) -> DataCache {
        self.hashed = self.sets.is_power_of_two() && self.sets > 1;
        self
    }

    fn set(&mut self, line: u64) -> &mut [u64] {
        let s = if self.hashed {
            let bits = self.sets.trailing_zeros();
            (line ^ (line >> bits) ^ (line >> (2 * bits))) & (self.sets - 1)
        } else if self.sets.is_power_of_two() {
            line & (self.sets - 1)
        } else {
            line % self.sets
        } as usize;
        let start = s * self.ways;
        &mut self.lines[start..start + self.ways]
    }

    /// Whether the line holding physical address `pa` is cached; either way it becomes
    /// the set's most recent line: a hit moves it to the front, a miss fills it there,
    /// evicting the least recent line of a full set. This is a lookup followed, on a
    /// miss, by a fill, with the set found once: the cost model fills every cache a
    /// transaction missed (the L1 for a load, the L2 always), so the two always came
    /// together.
    #[inline]
    pub(crate) fn touch(&mut self, pa: u64) -> bool {
        let line = pa / TRANSACTION;
        // One pass both finds the line and shifts the more recent lines down by one,
        // `line` going in front: each way takes the line before it until the way that
        // held `line` (a hit: it is overwritten, every line now one way later, the set
        // otherwise as it was) or an empty way (a miss on a set not full: empties are
        // only at the end, so the rest are empties and stay so), or off the end (a
        // miss on a full set: the least recent line drops). The same set as a search
        // followed by one shift of the ways before the found (or last) one.
        // Two ways a step, one loop test for both (a step of four, or the pair's two
        // ways through one helper, measured more), then an odd last way.
        let mut carry = line;
        let mut pairs = self.set(line).chunks_exact_mut(2);
        for pair in &mut pairs {
            let held = core::mem::replace(&mut pair[0], carry);
            if held == line {
                return true;
            }
            if held == EMPTY {
                return false;
            }
            let next = core::mem::replace(&mut pair[1], held);
            if next == line {
                return true;
            }
            if next == EMPTY {
                return false;
            }
            carry = next;
        }
        if let [way] = pairs.into_remainder() {
            // The last way: a hit, or a miss (an empty way filled, or the least recent
            // line dropped).
            return core::mem::replace(way, carry) == line;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gmem_sim::{Replacement, Tlb, TlbConfig};

    #[test]
    fn bad_geometries_are_refused() {
        assert!(DataCache::new(0, 4).is_none());
        assert!(DataCache::new(4, 0).is_none());
        assert!(DataCache::new(1 << 20, 2).is_none());
        assert!(DataCache::new(usize::MAX, 2).is_none());
        assert!(DataCache::new(1, 65).is_some());
        assert!(DataCache::new(64, 4).is_some());
    }

    /// The hashed index keeps a 4 KiB stride (ATAX's rows) from piling into few sets:
    /// 1024 lines 4 KiB apart thrash a 1024-set 16-way cache under a modulo index (32
    /// sets × 16 ways hold 512 of them) and fit under the hashed one.
    #[test]
    fn a_hashed_index_spreads_a_page_stride_that_a_modulo_index_thrashes() {
        let stride = 4096u64;
        let again = |mut c: DataCache| {
            for k in 0..1024 {
                c.touch(k * stride);
            }
            (0..1024).filter(|&k| c.touch(k * stride)).count()
        };
        let modulo = again(DataCache::new(1024, 16).unwrap());
        let hashed = again(DataCache::new(1024, 16).unwrap().hashed());
        assert_eq!(modulo, 0, "LRU over 512 ways cycling 1024 lines never hits");
        assert_eq!(hashed, 1024);
        // A non-power-of-two cache keeps its modulo index.
        assert!(!DataCache::new(3, 2).unwrap().hashed().hashed);
    }

    /// Hits and misses equal those of the LRU TLB it replaced (looked up, and filled
    /// on a miss), over a pseudo-random stream with reuse, for power-of-two and other
    /// set counts.
    #[test]
    fn hits_equal_the_lru_tlb_it_replaced() {
        for (sets, ways) in [(64usize, 4usize), (1, 1), (3, 2), (16, 16), (5, 7)] {
            let mut c = DataCache::new(sets, ways).unwrap();
            let mut t = Tlb::<()>::new(TlbConfig::new(sets, ways, Replacement::Lru)).unwrap();
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            let (mut hits, mut misses) = (0, 0);
            for _ in 0..20_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // A few hot lines and a wide cold range.
                let line = if x % 3 == 0 {
                    x % (2 * (sets * ways) as u64)
                } else {
                    x % 100_000
                };
                let pa = line * TRANSACTION + (x >> 50) % TRANSACTION;
                let want = t.lookup_at(0, pa, 7).is_some();
                assert_eq!(c.touch(pa), want, "{sets}x{ways}");
                if !want {
                    t.insert(0, pa, 7, ());
                    misses += 1;
                } else {
                    hits += 1;
                }
            }
            assert!(hits > 500 && misses > 500, "{hits} hits, {misses} misses");
        }
    }
}
