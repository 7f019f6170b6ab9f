//! The logical page table: per virtual page, where its data lives and who maps it.
//!
//! One table per address space. For each virtual page it records
//! - where the data lives: nowhere yet (the page is zero-filled on first fault), or
//!   frame `pfn` in the memory of device `mem` (an index into the space's list of
//!   memories, so an entry stays small);
//! - whether the page is wired (pinned: never migrated nor evicted) and whether its
//!   frame belongs to the caller (`region_map` of caller-given frames, never freed by the
//!   core);
//! - whether an asynchronous unmap of it is pending (nothing may touch it until the
//!   queue has drained);
//! - which of the space's page tables hold a physical mapping of it (a bit per table,
//!   so invalidations go exactly where they are needed);
//! - the remote-access hint: which attached device last took a remote mapping.
//!
//! The table is a two-level radix: a hash map from `vpn / 512` to a leaf of 512 entries
//! of 16 bytes each (8 KiB, one leaf per 2 MiB of virtual space that holds anything).
//! Lookup is one hash probe plus an index: O(1). Leaves are freed when their last entry
//! empties, so the table's size follows what is populated, not what is allocated.
//!
//! The leaves live in a slab (the hash map names a leaf by its slot) and the table
//! remembers the leaf its last update touched: a fault reads its page's entry, fills
//! it and sets its mapping bit, and consecutive faults mostly fall in one 2 MiB
//! block, so all three skip the hash probe (a key compare and an index instead).

use crate::addr::{Pfn, Vpn};
use alloc::boxed::Box;
use alloc::vec::Vec;
use hashbrown::HashMap;

/// Entries per leaf.
pub(crate) const LEAF_ENTRIES: usize = 512;
const LEAF_SHIFT: u32 = 9;

/// Value of [`PageEntry::mem`] for a page with no frame.
pub(crate) const NO_MEM: u8 = u8::MAX;

/// The page is wired: never migrated, never evicted.
pub(crate) const WIRED: u8 = 1 << 0;
/// The frame was given by the caller (`region_map`): the core never frees it.
pub(crate) const EXTERNAL: u8 = 1 << 1;
/// An asynchronous unmap of the page is queued and not yet invalidated.
pub(crate) const PENDING: u8 = 1 << 2;

/// One virtual page's logical mapping (16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct PageEntry {
    /// Frame number, valid when `mem != NO_MEM`.
    pub pfn: Pfn,
    /// Bit `t` set: page table `t` of the space maps this page.
    pub mapped: u32,
    /// Index of the memory (device) holding the frame in the space's memory list.
    pub mem: u8,
    /// [`WIRED`], [`EXTERNAL`], [`PENDING`].
    pub flags: u8,
    /// Attachment slot + 1 of the device that last mapped the page remotely; 0 = none.
    pub hint: u8,
    pub _reserved: u8,
}

impl PageEntry {
    /// The entry of a page that holds nothing.
    pub const EMPTY: PageEntry = PageEntry {
        pfn: Pfn(0),
        mapped: 0,
        mem: NO_MEM,
        flags: 0,
        hint: 0,
        _reserved: 0,
    };

    /// Whether a frame backs the page.
    pub fn is_populated(&self) -> bool {
        self.mem != NO_MEM
    }

    /// Whether the entry records nothing at all.
    #[inline]
    pub fn is_empty(&self) -> bool {
        // Without short-circuits (`&`, not `&&`): the four compares read adjacent
        // fields, so the compiler may fold them into fewer wide ones.
        (self.mem == NO_MEM) & (self.mapped == 0) & (self.flags == 0) & (self.hint == 0)
    }

    /// Whether a flag is set.
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

struct Leaf {
    entries: [PageEntry; LEAF_ENTRIES],
    used: u16,
}

/// The logical page table of one address space.
///
/// Invariant: `leaves` maps each key to a slot of `slab` that holds a leaf, no two keys
/// share a slot, the empty slots are exactly those in `free`, and `last`, unless its
/// key is `NO_KEY`, names a key of `leaves` with its slot.
pub(crate) struct LogicalPageTable {
    /// Leaf key (`vpn / 512`) → slot in `slab`.
    leaves: HashMap<u64, u32>,
    slab: Vec<Option<Box<Leaf>>>,
    /// Empty slots of `slab`.
    free: Vec<u32>,
    /// The leaf the last update touched, `(key, slot)`; `(NO_KEY, 0)` for none (a
    /// sentinel key, not an `Option`: the memo's check is then one compare).
    last: (u64, u32),
    populated: u64,
}

/// The key of no leaf: keys are `vpn / 512`, below 2^55.
const NO_KEY: u64 = u64::MAX;

impl Default for LogicalPageTable {
    fn default() -> Self {
        LogicalPageTable {
            leaves: HashMap::default(),
            slab: Vec::new(),
            free: Vec::new(),
            last: (NO_KEY, 0),
            populated: 0,
        }
    }
}

impl LogicalPageTable {
    /// The slot of the leaf of `key`, if it exists (the memo first, then one probe).
    #[inline]
    fn slot(&self, key: u64) -> Option<u32> {
        match self.last {
            (k, slot) if k == key => Some(slot),
            _ => self.leaves.get(&key).copied(),
        }
    }

    /// The leaf in `slot` (a slot the index or the memo named).
    #[inline]
    fn leaf(&self, slot: u32) -> &Leaf {
        self.slab[slot as usize]
            .as_deref()
            .expect("an indexed slot holds a leaf")
    }

    /// The leaf of `key`, if it exists.
    #[inline]
    fn leaf_of(&self, key: u64) -> Option<&Leaf> {
        self.slot(key).map(|s| self.leaf(s))
    }

    /// The entry of `vpn` ([`PageEntry::EMPTY`] when nothing is recorded).
    #[inline]
    pub fn get(&self, vpn: Vpn) -> PageEntry {
        let vpn = vpn.0;
        match self.leaf_of(vpn >> LEAF_SHIFT) {
            Some(leaf) => leaf.entries[(vpn as usize) & (LEAF_ENTRIES - 1)],
            None => PageEntry::EMPTY,
        }
    }

    /// Replace the entry of `vpn`.
    #[inline]
    pub fn set(&mut self, vpn: Vpn, entry: PageEntry) {
        self.update(vpn, |e| *e = entry);
    }

    /// Replace the entry of `vpn` with a populated `entry`: [`LogicalPageTable::set`]
    /// specialised for the fault's one write (a populated entry is never empty, so the
    /// leaf gains a use only if the old entry was empty, never loses one, and is never
    /// freed; the population grows unless the old entry was populated). Counts end
    /// exactly as `set` leaves them.
    #[inline(always)]
    pub fn set_populated(&mut self, vpn: Vpn, entry: PageEntry) {
        debug_assert!(
            entry.is_populated(),
            "set_populated of an unpopulated entry"
        );
        let key = vpn.0 >> LEAF_SHIFT;
        let idx = (vpn.0 as usize) & (LEAF_ENTRIES - 1);
        let slot = self.slot_mut(key);
        let leaf = self.leaf_mut(slot);
        let before = core::mem::replace(&mut leaf.entries[idx], entry);
        leaf.used += u16::from(before.is_empty());
        self.populated += u64::from(!before.is_populated());
    }

    /// Change the entry of `vpn` in place, keeping the leaf and population counts right.
    #[inline]
    pub fn update<R>(&mut self, vpn: Vpn, f: impl FnOnce(&mut PageEntry) -> R) -> R {
        let key = vpn.0 >> LEAF_SHIFT;
        let idx = (vpn.0 as usize) & (LEAF_ENTRIES - 1);
        let slot = self.slot_mut(key);
        let leaf = self.leaf_mut(slot);
        let before = leaf.entries[idx];
        let r = f(&mut leaf.entries[idx]);
        let after = leaf.entries[idx];
        let populated = Self::account_used(&mut leaf.used, before, after);
        let emptied = leaf.used == 0;
        self.populated = self.populated.wrapping_add_signed(populated);
        if emptied {
            self.free_leaf(key, slot);
        }
        r
    }

    /// Apply `f` to the entries of `first..first + pages` in order (`f` gets each page
    /// number and its entry): one table probe per leaf, not per page. Counts are kept
    /// as [`LogicalPageTable::update`] keeps them.
    #[inline]
    pub fn update_run(&mut self, first: Vpn, pages: u64, mut f: impl FnMut(Vpn, &mut PageEntry)) {
        if pages == 1 {
            // One page (every 4 KiB fault, twice): no run loop, no call.
            return self.update(first, |e| f(first, e));
        }
        self.update_pages(first, pages, f);
    }

    /// [`LogicalPageTable::update_run`] of more than one page, leaf by leaf.
    fn update_pages(&mut self, first: Vpn, pages: u64, mut f: impl FnMut(Vpn, &mut PageEntry)) {
        let mut v = first.0;
        let end = first.0.saturating_add(pages);
        while v < end {
            let key = v >> LEAF_SHIFT;
            let lo = (v as usize) & (LEAF_ENTRIES - 1);
            let n = ((LEAF_ENTRIES - lo) as u64).min(end - v) as usize;
            let slot = self.slot_mut(key);
            let leaf = self.leaf_mut(slot);
            let mut populated = 0i64;
            for (i, e) in leaf.entries[lo..lo + n].iter_mut().enumerate() {
                let before = *e;
                f(Vpn(v + i as u64), e);
                let after = *e;
                populated += Self::account_used(&mut leaf.used, before, after);
            }
            let emptied = leaf.used == 0;
            self.populated = self.populated.wrapping_add_signed(populated);
            if emptied {
                self.free_leaf(key, slot);
            }
            v += n as u64;
        }
    }

    /// The slot of the leaf of `key`, created empty if absent (the memo, else one
    /// probe); the leaf becomes the memo's.
    #[inline(always)]
    fn slot_mut(&mut self, key: u64) -> u32 {
        let (k, slot) = self.last;
        if k == key {
            return slot;
        }
        let slot = match self.leaves.get(&key) {
            Some(&slot) => slot,
            None => self.insert_leaf(key),
        };
        self.last = (key, slot);
        slot
    }

    /// The leaf in `slot`, a slot `slot_mut` returned (the invariant: an indexed slot
    /// holds a leaf).
    #[inline(always)]
    fn leaf_mut(&mut self, slot: u32) -> &mut Leaf {
        self.slab[slot as usize]
            .as_deref_mut()
            .expect("an indexed slot holds a leaf")
    }

    /// A new empty leaf for `key` in a free slot (out of line: it runs once per 2 MiB
    /// of virtual space that gets an entry).
    #[cold]
    #[inline(never)]
    fn insert_leaf(&mut self, key: u64) -> u32 {
        let leaf = Self::new_leaf();
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slab[slot as usize] = Some(leaf);
                slot
            }
            None => {
                self.slab.push(Some(leaf));
                (self.slab.len() - 1) as u32
            }
        };
        self.leaves.insert(key, slot);
        slot
    }

    /// Free the (empty) leaf of `key` in `slot`, and forget it in the memo.
    fn free_leaf(&mut self, key: u64, slot: u32) {
        self.leaves.remove(&key);
        self.slab[slot as usize] = None;
        self.free.push(slot);
        if self.last.0 == key {
            self.last = (NO_KEY, 0);
        }
    }

    /// An empty leaf (out of line: an 8 KiB leaf's initialisation must not be inlined
    /// into every update; it runs once per 2 MiB of virtual space that gets an entry).
    #[cold]
    #[inline(never)]
    fn new_leaf() -> Box<Leaf> {
        Box::new(Leaf {
            entries: [PageEntry::EMPTY; LEAF_ENTRIES],
            used: 0,
        })
    }

    /// Count an entry's change in its leaf's `used`; returns the change of populated
    /// pages.
    #[inline]
    fn account_used(used: &mut u16, before: PageEntry, after: PageEntry) -> i64 {
        match (before.is_empty(), after.is_empty()) {
            (true, false) => *used += 1,
            (false, true) => *used -= 1,
            _ => {}
        }
        i64::from(after.is_populated()) - i64::from(before.is_populated())
    }

    /// Clear the entry of `vpn`, returning what it held.
    pub fn take(&mut self, vpn: Vpn) -> PageEntry {
        self.update(vpn, |e| core::mem::replace(e, PageEntry::EMPTY))
    }

    /// Every non-empty entry with `first <= vpn < first + pages`, in address order.
    pub fn entries_in(
        &self,
        first: Vpn,
        pages: u64,
    ) -> impl Iterator<Item = (Vpn, PageEntry)> + '_ {
        let first = first.0;
        let end = first.saturating_add(pages);
        let first_leaf = first >> LEAF_SHIFT;
        let last_leaf = if pages == 0 {
            first_leaf
        } else {
            (end - 1) >> LEAF_SHIFT
        };
        let leaf_count = if pages == 0 {
            0
        } else {
            last_leaf - first_leaf + 1
        };
        // Walk leaves by key when the range is small relative to the table, otherwise
        // walk the table's leaves and sort what falls in range.
        (0..leaf_count).flat_map(move |k| {
            let key = first_leaf + k;
            let leaf = self.leaf_of(key);
            let lo = if k == 0 {
                (first as usize) & (LEAF_ENTRIES - 1)
            } else {
                0
            };
            let hi = if key == last_leaf {
                ((end - 1) as usize & (LEAF_ENTRIES - 1)) + 1
            } else {
                LEAF_ENTRIES
            };
            let base = key << LEAF_SHIFT;
            leaf.into_iter().flat_map(move |l| {
                (lo..hi).filter_map(move |i| {
                    let e = l.entries[i];
                    (!e.is_empty()).then_some((Vpn(base + i as u64), e))
                })
            })
        })
    }

    /// Number of pages backed by a frame.
    #[cfg(test)]
    pub fn populated(&self) -> u64 {
        self.populated
    }

    /// Number of leaves (for memory accounting).
    #[cfg(test)]
    pub fn leaves(&self) -> usize {
        self.leaves.len()
    }

    /// Every non-empty entry of the table, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (Vpn, PageEntry)> + '_ {
        self.leaves.iter().flat_map(|(key, &slot)| {
            let base = key << LEAF_SHIFT;
            self.leaf(slot)
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| !e.is_empty())
                .map(move |(i, e)| (Vpn(base + i as u64), *e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(pfn: u64) -> PageEntry {
        PageEntry {
            pfn: Pfn(pfn),
            mem: 0,
            ..PageEntry::EMPTY
        }
    }

    #[test]
    fn entry_is_sixteen_bytes() {
        assert_eq!(core::mem::size_of::<PageEntry>(), 16);
    }

    #[test]
    fn set_get_take_track_population_and_free_empty_leaves() {
        let mut t = LogicalPageTable::default();
        assert_eq!(t.get(Vpn(7)), PageEntry::EMPTY);
        t.set(Vpn(7), frame(70));
        t.set(Vpn(513), frame(99));
        assert_eq!(t.get(Vpn(7)).pfn, Pfn(70));
        assert_eq!(t.populated(), 2);
        assert_eq!(t.leaves(), 2);
        assert_eq!(t.take(Vpn(7)).pfn, Pfn(70));
        assert_eq!(t.leaves(), 1);
        assert_eq!(t.populated(), 1);
        // An entry that records only a mapping bit is kept but not populated.
        t.update(Vpn(9), |e| e.mapped = 1);
        assert_eq!(t.populated(), 1);
        assert_eq!(t.leaves(), 2);
        t.update(Vpn(9), |e| e.mapped = 0);
        assert_eq!(t.leaves(), 1);
    }

    #[test]
    fn a_freed_leaf_leaves_the_memo_and_its_slot_serves_another_block() {
        let mut t = LogicalPageTable::default();
        t.set(Vpn(1), frame(10));
        t.set(Vpn(1030), frame(20));
        // The memo names the leaf of 1030; emptying it frees the leaf and the memo.
        t.take(Vpn(1030));
        assert_eq!(t.leaves(), 1);
        assert_eq!(t.get(Vpn(1030)), PageEntry::EMPTY);
        // A new block takes the freed slot: the old block still reads empty and the
        // first block is untouched.
        t.set(Vpn(4000), frame(40));
        assert_eq!(t.slab.len(), 2, "the freed slot was reused");
        assert_eq!(t.get(Vpn(1030)), PageEntry::EMPTY);
        assert_eq!(t.get(Vpn(4000)).pfn, Pfn(40));
        assert_eq!(t.get(Vpn(1)).pfn, Pfn(10));
        // Emptying the memo's leaf through a run, then reading through the index.
        t.update_run(Vpn(4000), 1, |_, e| *e = PageEntry::EMPTY);
        assert_eq!(t.get(Vpn(4000)), PageEntry::EMPTY);
        assert_eq!(
            t.iter().map(|(v, _)| v.0).collect::<alloc::vec::Vec<_>>(),
            [1]
        );
        assert_eq!(t.populated(), 1);
    }

    #[test]
    fn update_run_crosses_leaves_and_keeps_counts_like_update() {
        let mut t = LogicalPageTable::default();
        let mut seen = alloc::vec::Vec::new();
        t.update_run(Vpn(500), 30, |v, e| {
            seen.push(v.0);
            *e = frame(v.0 * 2);
        });
        assert_eq!(seen, (500..530).collect::<alloc::vec::Vec<_>>());
        assert_eq!(t.populated(), 30);
        assert_eq!(t.leaves(), 2);
        assert_eq!(t.get(Vpn(511)).pfn, Pfn(1022));
        assert_eq!(t.get(Vpn(529)).pfn, Pfn(1058));
        assert_eq!(t.get(Vpn(530)), PageEntry::EMPTY);
        // A bit set over part of the run: population unchanged.
        t.update_run(Vpn(510), 4, |_, e| e.mapped |= 2);
        assert_eq!(t.populated(), 30);
        assert_eq!(t.get(Vpn(512)).mapped, 2);
        // Emptying the second leaf's pages frees it; the first keeps its 12.
        t.update_run(Vpn(512), 18, |_, e| *e = PageEntry::EMPTY);
        assert_eq!(t.leaves(), 1);
        assert_eq!(t.populated(), 12);
        assert_eq!(t.entries_in(Vpn(0), 1024).count(), 12);
        t.update_run(Vpn(0), 0, |_, _| panic!("an empty run visits nothing"));
    }

    /// The `used` count of the leaf holding `vpn` (0 when there is none).
    fn used_at(t: &LogicalPageTable, vpn: u64) -> u16 {
        t.leaf_of(vpn >> LEAF_SHIFT).map_or(0, |l| l.used)
    }

    #[test]
    fn set_populated_counts_exactly_as_set_over_every_kind_of_old_entry() {
        let olds = [
            PageEntry::EMPTY,
            PageEntry {
                mapped: 1,
                ..PageEntry::EMPTY
            },
            PageEntry {
                hint: 2,
                ..PageEntry::EMPTY
            },
            PageEntry {
                flags: PENDING,
                ..PageEntry::EMPTY
            },
            frame(5),
        ];
        let new = PageEntry {
            mapped: 1,
            ..frame(9)
        };
        for old in olds {
            let (mut a, mut b) = (LogicalPageTable::default(), LogicalPageTable::default());
            for t in [&mut a, &mut b] {
                t.set(Vpn(2), frame(2));
                t.set(Vpn(700), frame(7));
                t.set(Vpn(3), old);
            }
            a.set(Vpn(3), new);
            // The memo names the other leaf, then the same one: both paths.
            b.set_populated(Vpn(3), new);
            assert_eq!(a.get(Vpn(3)), b.get(Vpn(3)));
            assert_eq!(a.populated(), b.populated(), "old {old:?}");
            assert_eq!(used_at(&a, 3), used_at(&b, 3), "old {old:?}");
            assert_eq!(a.leaves(), b.leaves());
            a.set(Vpn(4), new);
            b.set_populated(Vpn(4), new);
            assert_eq!(a.populated(), b.populated());
            assert_eq!(used_at(&a, 4), used_at(&b, 4));
        }
        // Into a block with no leaf yet: the leaf is made, with one use.
        let mut t = LogicalPageTable::default();
        t.set_populated(Vpn(9000), frame(1));
        assert_eq!((t.leaves(), t.populated(), used_at(&t, 9000)), (1, 1, 1));
        assert_eq!(t.take(Vpn(9000)).pfn, Pfn(1));
        assert_eq!((t.leaves(), t.populated()), (0, 0));
    }

    #[test]
    fn entries_in_walks_only_the_range_in_order() {
        let mut t = LogicalPageTable::default();
        for vpn in [3u64, 511, 512, 1030, 5000] {
            t.set(Vpn(vpn), frame(vpn));
        }
        let got: alloc::vec::Vec<u64> = t.entries_in(Vpn(4), 1027).map(|(v, _)| v.0).collect();
        assert_eq!(got, [511, 512, 1030]);
        assert_eq!(t.entries_in(Vpn(0), 0).count(), 0);
        assert_eq!(t.entries_in(Vpn(u64::MAX - 1), 2).count(), 0);
    }
}
