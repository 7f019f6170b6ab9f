//! The allocated-segment hash: start address -> segment index, laid out for the cache.
//!
//! An open-addressing table with linear probing. Each slot holds the key and the value
//! together in 16 bytes (four slots per 64-byte line), so a lookup usually costs one
//! cache line where a general-purpose map with separate control bytes and buckets
//! costs two. The home slot is Fibonacci hashing of the address in quanta (addresses
//! are quantum multiples, so their low bits carry nothing); the table doubles before
//! it is 70% full, which keeps probe runs short; deletion shifts the following run
//! back (no tombstones), so lookups never slow down with churn.

use alloc::vec;
use alloc::vec::Vec;

use super::seglist::NIL;

/// One slot: an empty slot has `val == NIL`.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Slot {
    key: u64,
    val: u32,
}

const EMPTY: Slot = Slot { key: 0, val: NIL };
const MIN_SLOTS: usize = 16;

/// Start address of every allocated or cached segment -> its index in the table.
pub(super) struct AddrMap {
    slots: Vec<Slot>,
    /// `log2(quantum)`.
    shift: u32,
    /// `64 - log2(slots.len())`.
    hash_shift: u32,
    len: usize,
}

impl AddrMap {
    /// An empty map for addresses that are multiples of `quantum` (a power of two).
    pub fn new(quantum: u64) -> Self {
        Self {
            slots: vec![EMPTY; MIN_SLOTS],
            shift: quantum.trailing_zeros(),
            hash_shift: 64 - MIN_SLOTS.trailing_zeros(),
            len: 0,
        }
    }

    /// Number of entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        ((key >> self.shift).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.hash_shift) as usize
    }

    /// The slot holding `key`, if any.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let s = self.slots[i];
            if s.val == NIL {
                return None;
            }
            if s.key == key {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// Start loading the home slot of `key` into the cache (a hint).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        super::prefetch(&self.slots[self.home(key)]);
    }

    /// The value stored for `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u32> {
        self.find(key).map(|i| self.slots[i].val)
    }

    /// Store `key -> val` (`val != NIL`), replacing an existing entry.
    #[inline]
    pub fn insert(&mut self, key: u64, val: u32) {
        debug_assert_ne!(val, NIL);
        if (self.len + 1) * 10 > self.slots.len() * 7 {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let s = &mut self.slots[i];
            if s.val == NIL {
                *s = Slot { key, val };
                self.len += 1;
                return;
            }
            if s.key == key {
                s.val = val;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Remove `key`, returning its value.
    #[inline]
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        let mut i = self.find(key)?;
        let val = self.slots[i].val;
        let mask = self.mask();
        // Backward-shift deletion: pull each later entry of the run into the hole
        // unless its home lies cyclically after the hole (it would become unreachable).
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s.val == NIL {
                break;
            }
            let h = self.home(s.key);
            if (j.wrapping_sub(h) & mask) >= (j.wrapping_sub(i) & mask) {
                self.slots[i] = s;
                i = j;
            }
        }
        self.slots[i] = EMPTY;
        self.len -= 1;
        Some(val)
    }

    fn grow(&mut self) {
        let n = self.slots.len() * 2;
        let old = core::mem::replace(&mut self.slots, vec![EMPTY; n]);
        self.hash_shift = 64 - n.trailing_zeros();
        let mask = n - 1;
        for s in old.into_iter().filter(|s| s.val != NIL) {
            let mut i = self.home(s.key);
            while self.slots[i].val != NIL {
                i = (i + 1) & mask;
            }
            self.slots[i] = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_reference_map_through_inserts_removes_and_growth() {
        let mut m = AddrMap::new(0x1000);
        let mut r = alloc::collections::BTreeMap::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // A few thousand distinct keys, so removes often hit.
            let key = (x % 4096) << 12;
            if x & (1 << 40) == 0 {
                m.insert(key, step);
                r.insert(key, step);
            } else {
                assert_eq!(m.remove(key), r.remove(&key));
            }
            assert_eq!(m.len(), r.len());
        }
        for k in 0..4096u64 {
            assert_eq!(m.get(k << 12), r.get(&(k << 12)).copied());
        }
    }
}
