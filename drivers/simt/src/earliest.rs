//! Which compute unit the engine advances next: the one with the earliest clock among
//! those that have a warp able to issue, the lowest-numbered on a tie.
//!
//! [`Earliest`] keeps the units' keys (a unit's clock, or [`IDLE`] when none of its
//! warps can issue), packed with the unit's index so that one compare orders them, in
//! one contiguous array, so the engine's scan for the earliest reads one word per unit
//! instead of each unit's whole state; a key changes by one store. A scan keeps the
//! few smallest keys, sorted, and a lower bound of the others: a changed key is moved
//! within them, or drops out, or joins them if below the bound, and only when none is
//! left does the next call scan again. The engine's usual change, the winner's clock
//! moving on, has its own path ([`Earliest::keep_first`]): the key stays first, or
//! moves back past the kept keys below it. (A tournament tree, which
//! replays one path per change, measured slower at the 16 units of the MESC geometry:
//! its data-dependent branches cost more than the scan.)

/// The key of a unit none of whose warps can issue.
pub(crate) const IDLE: u64 = u64::MAX;

/// How many of the smallest keys a scan keeps.
const KEPT: usize = 4;

/// Bits of a packed key that hold the index for `n` keys (at least one, so that no
/// packed key is `u64::MAX`, the filler of `best`).
fn index_bits(n: usize) -> u32 {
    (usize::BITS - n.saturating_sub(1).leading_zeros()).max(1)
}

/// Key `key` of index `i` packed with `shift` index bits (see [`Earliest`]'s `shift`).
#[inline]
fn pack(shift: u32, key: u64, i: usize) -> u64 {
    let top = IDLE >> shift;
    debug_assert!(
        key == IDLE || key < top,
        "clock {key} beyond the packed range"
    );
    key.min(top) << shift | i as u64
}

/// The earliest of a fixed number of keys, lowest index first on a tie.
pub(crate) struct Earliest {
    /// Each unit's key, packed (see `shift`), contiguous: the scan for the minimum
    /// reads a few cache lines and compares them as they are.
    keys: Vec<u64>,
    /// A packed key is `key << shift | index`, ordered as the pair: the lowest index
    /// first among equal keys. [`IDLE`] packs as the largest key, `u64::MAX >> shift`
    /// (no clock reaches it: it is 2^58 cycles or more below 64 units).
    shift: u32,
    /// The smallest packed keys, ascending (the first `len`): every packed key below
    /// `bound` is here, and no other.
    best: [u64; KEPT],
    len: usize,
    /// A lower bound of every packed key not in `best` (`u64::MAX`: there is none
    /// outside).
    bound: u64,
}

impl Earliest {
    /// `n` keys, all [`IDLE`].
    pub(crate) fn new(n: usize) -> Earliest {
        let shift = index_bits(n);
        Earliest {
            keys: (0..n).map(|i| pack(shift, IDLE, i)).collect(),
            shift,
            best: [u64::MAX; KEPT],
            len: 0,
            // Nothing is known: the first call scans.
            bound: 0,
        }
    }

    /// Set key `i` (`i` below the count given to [`Earliest::new`]).
    #[inline]
    pub(crate) fn set(&mut self, i: usize, key: u64) {
        let (old, new) = (self.keys[i], self.pack(key, i));
        if old == new {
            return;
        }
        self.keys[i] = new;
        // The usual change: the winner's clock moves on and it stays ahead.
        if old == self.best[0] && new < self.best[1].min(self.bound) {
            self.best[0] = new;
            return;
        }
        self.reorder(old, new);
    }

    /// [`Earliest::set`] beyond its usual case: packed key `old` became `new`.
    #[inline(never)]
    fn reorder(&mut self, old: u64, new: u64) {
        // Below `bound` exactly when kept: the old one leaves `best`, the new one
        // joins it if it is below `bound`. (The engine steps the winner, whose key
        // usually moves past a few others: it is re-placed without a scan, or drops
        // out and the runner-up wins; a scan only when `best` runs empty.)
        if old < self.bound {
            // Shift the ones after it down over it.
            let mut j = 0;
            while self.best[j] != old {
                j += 1;
            }
            while j + 1 < self.len {
                self.best[j] = self.best[j + 1];
                j += 1;
            }
            self.len -= 1;
            self.best[self.len] = u64::MAX;
        }
        if new < self.bound {
            if self.len == KEPT {
                // The largest kept one goes out; it becomes the bound.
                self.len -= 1;
                self.bound = self.best[self.len];
                if new >= self.bound {
                    return;
                }
            }
            // Insertion from the end.
            let mut j = self.len;
            while j > 0 && self.best[j - 1] > new {
                self.best[j] = self.best[j - 1];
                j -= 1;
            }
            self.best[j] = new;
            self.len += 1;
        }
    }

    /// Set key `i` of the index [`Earliest::first`] returned (no key changed since) to
    /// `key`, and whether `i` is certainly still first: its new key is not [`IDLE`] and
    /// below every other. `false` may also mean that only a scan would tell; the next
    /// call of [`Earliest::first`] answers either way.
    #[inline]
    pub(crate) fn keep_first(&mut self, i: usize, key: u64) -> bool {
        debug_assert!(self.len > 0 && self.best[0] == self.keys[i]);
        let new = self.pack(key, i);
        self.keys[i] = new;
        if key != IDLE && new < self.best[1].min(self.bound) {
            self.best[0] = new;
            return true;
        }
        self.first_moved(new);
        false
    }

    /// [`Earliest::keep_first`] beyond its usual case: the first kept key became the
    /// packed key `new`, which is not below the second or the bound. (What
    /// [`Earliest::reorder`] does for this case, without searching for the old key:
    /// the kept keys below `new` move forward one place over it.)
    #[inline(never)]
    fn first_moved(&mut self, new: u64) {
        let mut j = 1;
        while j < self.len && self.best[j] < new {
            self.best[j - 1] = self.best[j];
            j += 1;
        }
        if new < self.bound {
            self.best[j - 1] = new;
        } else {
            // It drops out: the kept keys after it move forward too.
            while j < self.len {
                self.best[j - 1] = self.best[j];
                j += 1;
            }
            self.len -= 1;
            self.best[self.len] = u64::MAX;
        }
    }

    /// The index with the smallest key (the lowest such index), unless every key is
    /// [`IDLE`].
    #[inline]
    pub(crate) fn first(&mut self) -> Option<usize> {
        if self.len == 0 {
            self.scan();
        }
        let p = self.best[0];
        (p >> self.shift != IDLE >> self.shift).then_some((p & ((1 << self.shift) - 1)) as usize)
    }

    /// Key `key` of index `i` packed (see `shift`).
    #[inline]
    fn pack(&self, key: u64, i: usize) -> u64 {
        pack(self.shift, key, i)
    }

    /// Keep the `KEPT` smallest packed keys and bound the rest by the next one.
    #[inline(never)]
    fn scan(&mut self) {
        let mut top = [u64::MAX; KEPT + 1];
        for &p in &self.keys {
            if p < top[KEPT] {
                let mut j = KEPT;
                while j > 0 && top[j - 1] > p {
                    top[j] = top[j - 1];
                    j -= 1;
                }
                top[j] = p;
            }
        }
        self.best.copy_from_slice(&top[..KEPT]);
        self.len = self.keys.len().min(KEPT);
        self.bound = top[KEPT];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index of the first smallest key that is not [`IDLE`], by a plain scan.
    fn scan_first(keys: &[u64]) -> Option<usize> {
        keys.iter()
            .enumerate()
            .filter(|&(_, &k)| k != IDLE)
            .min_by_key(|&(_, &k)| k)
            .map(|(i, _)| i)
    }

    /// The winner equals a scan's first minimum over pseudo-random updates, for unit
    /// counts that are and are not powers of two (up to 65); and
    /// [`Earliest::keep_first`], after a winner's update (its new place found by
    /// `first_moved` when it is not kept first), says it is still first only when it is.
    #[test]
    fn the_winner_is_the_scans_first_minimum() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut kept = 0;
        for n in [1usize, 2, 3, 5, 16, 17, 64, 65] {
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
                let want = scan_first(&keys);
                assert_eq!(e.first(), want, "n {n}");
                // The winner steps on (as the engine's unit does), perhaps to idle.
                let Some(w) = want else { continue };
                let k = match (x >> 40) % 9 {
                    0 => IDLE,
                    d => keys[w] + d / 3,
                };
                keys[w] = k;
                let still = e.keep_first(w, k);
                let want = scan_first(&keys);
                if still {
                    assert_eq!(want, Some(w), "n {n}: kept first wrongly");
                    kept += 1;
                }
                assert_eq!(e.first(), want, "n {n} after keep_first");
            }
        }
        assert!(kept > 1000, "{kept} kept");
    }
}
