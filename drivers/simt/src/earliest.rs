//! Which compute unit the engine advances next: the one with the earliest clock among
//! those that have a warp able to issue, the lowest-numbered on a tie.
//!
//! [`Earliest`] keeps the units' keys (a unit's clock, or [`IDLE`] when none of its
//! warps can issue) in one contiguous array, so the engine's scan for the earliest
//! reads one word per unit instead of each unit's whole state; a key changes by one
//! store. (A tournament tree, which replays one path per change, measured slower at the
//! 16 units of the MESC geometry: its data-dependent branches cost more than the scan.)

/// The key of a unit none of whose warps can issue.
pub(crate) const IDLE: u64 = u64::MAX;

/// The earliest of a fixed number of keys, lowest index first on a tie.
pub(crate) struct Earliest {
    /// Each unit's key, contiguous: the scan for the minimum reads a few cache lines.
    keys: Vec<u64>,
}

impl Earliest {
    /// `n` keys, all [`IDLE`].
    pub(crate) fn new(n: usize) -> Earliest {
        Earliest {
            keys: vec![IDLE; n],
        }
    }

    /// Set key `i` (`i` below the count given to [`Earliest::new`]).
    pub(crate) fn set(&mut self, i: usize, key: u64) {
        self.keys[i] = key;
    }

    /// The index with the smallest key (the lowest such index), unless every key is
    /// [`IDLE`].
    pub(crate) fn first(&self) -> Option<usize> {
        let (mut best, mut at) = (IDLE, 0);
        for (i, &k) in self.keys.iter().enumerate() {
            // Strictly smaller: the first of equal keys stays.
            if k < best {
                best = k;
                at = i;
            }
        }
        (best != IDLE).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The winner equals a scan's first minimum over pseudo-random updates, for unit
    /// counts that are and are not powers of two.
    #[test]
    fn the_winner_is_the_scans_first_minimum() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for n in [1usize, 2, 3, 5, 16, 17] {
            let mut e = Earliest::new(n);
            let mut keys = vec![IDLE; n];
            assert_eq!(e.first(), None);
            for _ in 0..5000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x % n as u64) as usize;
                // Few distinct keys, so ties are frequent; some units go idle.
                let k = if (x >> 20) % 7 == 0 {
                    IDLE
                } else {
                    (x >> 30) % 8
                };
                keys[i] = k;
                e.set(i, k);
                let want = keys
                    .iter()
                    .enumerate()
                    .filter(|&(_, &k)| k != IDLE)
                    .min_by_key(|&(_, &k)| k)
                    .map(|(i, _)| i);
                assert_eq!(e.first(), want, "n {n}");
            }
        }
    }
}
