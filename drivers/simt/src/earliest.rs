//! Which compute unit the engine advances next: the one with the earliest clock among
//! those that have a warp able to issue, the lowest-numbered on a tie.
//!
//! [`Earliest`] keeps the units' keys (a unit's clock, or [`IDLE`] when none of its
//! warps can issue) in one contiguous array, so the engine's scan for the earliest
//! reads one word per unit instead of each unit's whole state; a key changes by one
//! store. The scan also notes the runner-up, so while only the winner's key moves and
//! it stays ahead of the runner-up, no scan is needed at all. (A tournament tree, which replays one path per change, measured slower at the
//! 16 units of the MESC geometry: its data-dependent branches cost more than the scan.)

/// The key of a unit none of whose warps can issue.
pub(crate) const IDLE: u64 = u64::MAX;

/// The earliest of a fixed number of keys, lowest index first on a tie.
pub(crate) struct Earliest {
    /// Each unit's key, contiguous: the scan for the minimum reads a few cache lines.
    keys: Vec<u64>,
    /// From the last scan, while no key but the winner's has changed since: the
    /// winner's index, and the key and index of the first minimum of the others (the
    /// runner-up; [`IDLE`] and `usize::MAX` when there is none).
    memo: Option<(usize, u64, usize)>,
}

impl Earliest {
    /// `n` keys, all [`IDLE`].
    pub(crate) fn new(n: usize) -> Earliest {
        Earliest {
            keys: vec![IDLE; n],
            memo: None,
        }
    }

    /// Set key `i` (`i` below the count given to [`Earliest::new`]).
    pub(crate) fn set(&mut self, i: usize, key: u64) {
        if self.keys[i] == key {
            return;
        }
        self.keys[i] = key;
        // The engine steps the winner, so usually only its key moves: it still wins
        // while it stays before the runner-up (whose key has not changed), and the
        // next call needs no scan. Any other change forgets the memo.
        if let Some((w, rk, ri)) = self.memo {
            if w != i || !(key < rk || (key == rk && i < ri)) {
                self.memo = None;
            }
        }
    }

    /// The index with the smallest key (the lowest such index), unless every key is
    /// [`IDLE`].
    pub(crate) fn first(&mut self) -> Option<usize> {
        let w = match self.memo {
            Some((w, _, _)) => w,
            None => {
                let (mut best, mut at) = (IDLE, 0);
                let (mut next, mut next_at) = (IDLE, usize::MAX);
                for (i, &k) in self.keys.iter().enumerate() {
                    // Strictly smaller: the first of equal keys stays.
                    if k < best {
                        (next, next_at) = (best, at);
                        (best, at) = (k, i);
                    } else if k < next {
                        (next, next_at) = (k, i);
                    }
                }
                if best == IDLE {
                    return None;
                }
                // Before any winner was seen `at` is 0 with key IDLE: a runner-up
                // taken from there is no unit.
                if next == IDLE {
                    next_at = usize::MAX;
                }
                self.memo = Some((at, next, next_at));
                at
            }
        };
        (self.keys[w] != IDLE).then_some(w)
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
