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

use crate::addr::{Pfn, Vpn};
use alloc::boxed::Box;
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
/// The page has a protection of its own (`region_protect_range`), in the bits of
/// [`PROT_BITS`]; otherwise it has its region's.
pub(crate) const OWN_PROT: u8 = 1 << 3;
/// Where a page's own protection lives in [`PageEntry::flags`] (`Prot`'s three bits).
pub(crate) const PROT_SHIFT: u32 = 4;
/// The bits of a page's own protection, [`OWN_PROT`] included.
pub(crate) const PROT_BITS: u8 = OWN_PROT | (0b111 << PROT_SHIFT);

/// One virtual page's logical mapping (16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    pub fn is_empty(&self) -> bool {
        self.mem == NO_MEM && self.mapped == 0 && self.flags == 0 && self.hint == 0
    }

    /// Whether a flag is set.
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// The page's protection: its own (`region_protect_range`) or `region`'s.
    pub fn prot_or(&self, region: crate::flags::Prot) -> crate::flags::Prot {
        if self.has(OWN_PROT) {
            crate::flags::Prot::from_bits_truncate(self.flags >> PROT_SHIFT)
        } else {
            region
        }
    }

    /// Give the page a protection of its own (`Some`) or its region's (`None`).
    pub fn set_prot(&mut self, prot: Option<crate::flags::Prot>) {
        self.flags &= !PROT_BITS;
        if let Some(p) = prot {
            self.flags |= OWN_PROT | (p.bits() << PROT_SHIFT);
        }
    }
}

struct Leaf {
    entries: [PageEntry; LEAF_ENTRIES],
    used: u16,
}

/// The logical page table of one address space.
#[derive(Default)]
pub(crate) struct LogicalPageTable {
    leaves: HashMap<u64, Box<Leaf>>,
    populated: u64,
}

impl LogicalPageTable {
    /// The entry of `vpn` ([`PageEntry::EMPTY`] when nothing is recorded).
    #[inline]
    pub fn get(&self, vpn: Vpn) -> PageEntry {
        let vpn = vpn.0;
        match self.leaves.get(&(vpn >> LEAF_SHIFT)) {
            Some(leaf) => leaf.entries[(vpn as usize) & (LEAF_ENTRIES - 1)],
            None => PageEntry::EMPTY,
        }
    }

    /// Replace the entry of `vpn`.
    #[inline]
    pub fn set(&mut self, vpn: Vpn, entry: PageEntry) {
        self.update(vpn, |e| *e = entry);
    }

    /// Change the entry of `vpn` in place, keeping the leaf and population counts right.
    pub fn update<R>(&mut self, vpn: Vpn, f: impl FnOnce(&mut PageEntry) -> R) -> R {
        let vpn = vpn.0;
        let key = vpn >> LEAF_SHIFT;
        let idx = (vpn as usize) & (LEAF_ENTRIES - 1);
        let leaf = self.leaves.entry(key).or_insert_with(|| {
            Box::new(Leaf {
                entries: [PageEntry::EMPTY; LEAF_ENTRIES],
                used: 0,
            })
        });
        let before = leaf.entries[idx];
        let r = f(&mut leaf.entries[idx]);
        let after = leaf.entries[idx];
        match (before.is_empty(), after.is_empty()) {
            (true, false) => leaf.used += 1,
            (false, true) => leaf.used -= 1,
            _ => {}
        }
        match (before.is_populated(), after.is_populated()) {
            (false, true) => self.populated += 1,
            (true, false) => self.populated -= 1,
            _ => {}
        }
        if leaf.used == 0 {
            self.leaves.remove(&key);
        }
        r
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
            let leaf = self.leaves.get(&key);
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
        self.leaves.iter().flat_map(|(key, leaf)| {
            let base = key << LEAF_SHIFT;
            leaf.entries
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
