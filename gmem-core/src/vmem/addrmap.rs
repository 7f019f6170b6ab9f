//! The allocated-segment hash: start address -> segment index, laid out for the cache.
//!
//! An open-addressing table with linear probing. Each slot is 8 bytes (eight per
//! 64-byte line): the segment's index and a 32-bit tag, the start address in quanta
//! truncated to 32 bits. The full key is not stored: a tag match is confirmed against
//! the start address of the record the slot names ([`StartOf`]), which every caller
//! reads next anyway (a free checks the record's size and kind), so confirmation costs
//! no extra cache line on a hit, and a record is read on a miss only when the low 32
//! bits of its address in quanta match. Halving the slot (it was key + value in 16
//! bytes) halves the table: 16 MiB instead of 32 at a million entries, so more of it
//! stays in the last-level cache beside the records (issue 15, alloc9).
//!
//! The home slot is Fibonacci hashing of the tag (addresses are quantum multiples, so
//! their low bits carry nothing; addresses 2^32 quanta apart share a home, which costs
//! probe length, never correctness); the table doubles before it is 70% full, which
//! keeps probe runs short; deletion shifts the following run back (no tombstones), so
//! lookups never slow down with churn. Homes depend on the tag only, so growth and
//! deletion never read a record.

use alloc::vec;
use alloc::vec::Vec;

use super::seglist::{SegTable, NIL};

/// The start address of the record a slot names: how the map confirms a tag match
/// without storing the full key. The segment table is the one implementation outside
/// tests, so every caller passes `&self.table` instead of repeating a closure.
pub(super) trait StartOf {
    /// Start address of record `val` (a live record an entry names).
    fn start_of(&self, val: u32) -> u64;
}

impl StartOf for SegTable {
    #[inline]
    fn start_of(&self, val: u32) -> u64 {
        self.get(val).start
    }
}

/// One slot: an empty slot has `val == NIL`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Slot {
    /// The key in quanta, truncated to 32 bits.
    tag: u32,
    val: u32,
}

const _: () = assert!(core::mem::size_of::<Slot>() == 8);

const EMPTY: Slot = Slot { tag: 0, val: NIL };

/// Where [`AddrMap::lookup`] found an entry: valid until the map next changes, for
/// [`AddrMap::remove_found`] to delete it without probing again.
#[derive(Clone, Copy, Debug)]
pub(super) struct Found(usize);
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
    fn tag(&self, key: u64) -> u32 {
        // Truncation intended: the tag is the low 32 bits of the key in quanta.
        (key >> self.shift) as u32
    }

    #[inline]
    fn home(&self, tag: u32) -> usize {
        (u64::from(tag).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.hash_shift) as usize
    }

    /// The first slot of `key`'s probe run whose tag is `key`'s and whose value
    /// `confirm` accepts, if any.
    #[inline]
    fn probe(&self, key: u64, confirm: impl Fn(u32) -> bool) -> Option<usize> {
        let mask = self.mask();
        let tag = self.tag(key);
        let mut i = self.home(tag);
        loop {
            let s = self.slots[i];
            if s.val == NIL {
                return None;
            }
            if s.tag == tag && confirm(s.val) {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// The slot holding `key`, if any; `starts` gives the start address of the record
    /// a slot names.
    #[inline]
    fn find(&self, key: u64, starts: &impl StartOf) -> Option<usize> {
        self.probe(key, |val| starts.start_of(val) == key)
    }

    /// Start loading the home slot of `key` into the cache (a hint).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        super::prefetch(&self.slots[self.home(self.tag(key))]);
    }

    /// The value of the first entry whose tag is `key`'s, unconfirmed: for a prefetch
    /// hint, which must not read the record it is about to ask for. Almost always
    /// `key`'s own entry; a tag collision (addresses 2^32 quanta apart) or a stale key
    /// names another live record, which is harmless for a hint.
    #[inline]
    pub fn candidate(&self, key: u64) -> Option<u32> {
        self.probe(key, |_| true).map(|i| self.slots[i].val)
    }

    /// The value stored for `key`; `starts` gives the start address of the record an
    /// entry names (every entry's record is live).
    #[inline]
    pub fn get(&self, key: u64, starts: &impl StartOf) -> Option<u32> {
        self.find(key, starts).map(|i| self.slots[i].val)
    }

    /// The value stored for `key` and where it is, for [`Self::remove_found`];
    /// `starts` as for [`Self::get`]. A free looks its segment up, validates it
    /// against the record, then removes it: one probe instead of two.
    #[inline]
    pub fn lookup(&self, key: u64, starts: &impl StartOf) -> Option<(Found, u32)> {
        self.find(key, starts)
            .map(|i| (Found(i), self.slots[i].val))
    }

    /// Store `key -> val` (`val != NIL`, and `starts.start_of(val) == key` already),
    /// replacing an existing entry.
    #[inline]
    pub fn insert(&mut self, key: u64, val: u32, starts: &impl StartOf) {
        debug_assert_ne!(val, NIL);
        if (self.len + 1) * 10 > self.slots.len() * 7 {
            self.grow();
        }
        let mask = self.mask();
        let tag = self.tag(key);
        let mut i = self.home(tag);
        loop {
            let s = self.slots[i];
            if s.val == NIL {
                self.slots[i] = Slot { tag, val };
                self.len += 1;
                return;
            }
            if s.tag == tag && starts.start_of(s.val) == key {
                self.slots[i].val = val;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Remove `key`, returning its value; `starts` as for [`Self::get`].
    #[inline]
    pub fn remove(&mut self, key: u64, starts: &impl StartOf) -> Option<u32> {
        let i = self.find(key, starts)?;
        let val = self.slots[i].val;
        self.remove_found(Found(i));
        Some(val)
    }

    /// Remove the entry [`Self::lookup`] found (the map unchanged since).
    #[inline]
    pub fn remove_found(&mut self, at: Found) {
        let Found(mut i) = at;
        debug_assert_ne!(self.slots[i].val, NIL, "a found slot holds an entry");
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
            let h = self.home(s.tag);
            if (j.wrapping_sub(h) & mask) >= (j.wrapping_sub(i) & mask) {
                self.slots[i] = s;
                i = j;
            }
        }
        self.slots[i] = EMPTY;
        self.len -= 1;
    }

    fn grow(&mut self) {
        let n = self.slots.len() * 2;
        let old = core::mem::replace(&mut self.slots, vec![EMPTY; n]);
        self.hash_shift = 64 - n.trailing_zeros();
        let mask = n - 1;
        for s in old.into_iter().filter(|s| s.val != NIL) {
            let mut i = self.home(s.tag);
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

    /// Start addresses indexed by value, as the segment table's records hold them.
    struct Starts(Vec<u64>);

    impl StartOf for Starts {
        fn start_of(&self, val: u32) -> u64 {
            self.0[val as usize]
        }
    }

    /// Values are indices into `starts`, the start address each names (as the
    /// segment table's records do); keys 2^32 quanta apart share a tag, so the
    /// confirmation against the record is exercised.
    #[test]
    fn matches_a_reference_map_through_inserts_removes_and_growth() {
        let mut m = AddrMap::new(0x1000);
        let mut r = alloc::collections::BTreeMap::new();
        let mut starts = Starts(Vec::new());
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let key_of = |k: u64| ((k % 2048) << 12) | ((k / 2048 % 2) << 44);
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // A few thousand distinct keys, so removes often hit; key k and k + 2048
            // lie 2^32 quanta apart and share a tag.
            let key = key_of(x % 4096);
            starts.0.push(key);
            if x & (1 << 40) == 0 {
                m.insert(key, step, &starts);
                r.insert(key, step);
            } else {
                assert_eq!(m.remove(key, &starts), r.remove(&key));
            }
            assert_eq!(m.len(), r.len());
        }
        for k in 0..4096u64 {
            let key = key_of(k);
            assert_eq!(m.get(key, &starts), r.get(&key).copied());
            // The unconfirmed candidate is the key's own value when the key is
            // present and alone with its tag; with the tag-sharing key also present
            // it is one of the two; with neither, there is none.
            let twin = key ^ (1 << 44);
            let mine = r.get(&key).copied();
            let theirs = r.get(&twin).copied();
            match (mine, theirs) {
                (None, None) => assert_eq!(m.candidate(key), None),
                (Some(v), None) => assert_eq!(m.candidate(key), Some(v)),
                (None, Some(v)) => assert_eq!(m.candidate(key), Some(v)),
                (Some(v), Some(w)) => {
                    assert!(matches!(m.candidate(key), Some(c) if c == v || c == w))
                }
            }
        }
    }
}
