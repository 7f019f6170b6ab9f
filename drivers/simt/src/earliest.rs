//! Which compute unit the engine advances next: the one with the earliest clock among
//! those that have a warp able to issue, the lowest-numbered on a tie.
//!
//! [`Earliest`] is a tournament tree over the units' keys (a unit's clock, or
//! [`IDLE`] when none of its warps can issue): changing one key replays the matches on
//! its path to the root (log₂ of the unit count), and the winner is at the root, so the
//! engine does not scan every unit at every step.

/// The key of a unit none of whose warps can issue.
pub(crate) const IDLE: u64 = u64::MAX;

/// The earliest of a fixed number of keys, lowest index first on a tie.
pub(crate) struct Earliest {
    /// Leaves at `[size, 2·size)` (padding leaves hold [`IDLE`]); node `i` holds the
    /// winner of nodes `2i` and `2i + 1` as `(key, index)`.
    tree: Vec<(u64, usize)>,
    size: usize,
}

impl Earliest {
    /// `n` keys, all [`IDLE`].
    pub(crate) fn new(n: usize) -> Earliest {
        let size = n.max(1).next_power_of_two();
        let mut tree = vec![(IDLE, usize::MAX); 2 * size];
        for (i, leaf) in tree[size..size + n].iter_mut().enumerate() {
            *leaf = (IDLE, i);
        }
        let mut e = Earliest { tree, size };
        for i in (1..size).rev() {
            e.tree[i] = e.tree[2 * i].min(e.tree[2 * i + 1]);
        }
        e
    }

    /// Set key `i` (`i` below the count given to [`Earliest::new`]).
    pub(crate) fn set(&mut self, i: usize, key: u64) {
        let mut n = self.size + i;
        if self.tree[n].0 == key {
            return;
        }
        self.tree[n].0 = key;
        while n > 1 {
            n /= 2;
            let w = self.tree[2 * n].min(self.tree[2 * n + 1]);
            if self.tree[n] == w {
                break;
            }
            self.tree[n] = w;
        }
    }

    /// The index with the smallest key (the lowest such index), unless every key is
    /// [`IDLE`].
    pub(crate) fn first(&self) -> Option<usize> {
        let (k, i) = self.tree[1];
        (k != IDLE).then_some(i)
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
