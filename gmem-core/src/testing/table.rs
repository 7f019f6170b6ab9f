//! One test page table: leaf blocks of [`LEAF_PAGES`] PTEs, each with its pages'
//! accessed bits, in a slab found by a hash of the block number.
//!
//! A real table's last level is an array of PTEs indexed by the low bits of the page
//! number; this keeps the same shape, so a map or unmap of a run costs one hash probe
//! per block and an array write per page (a 2 MiB large leaf fills one block), not a
//! hash insert per page. A block that becomes empty is dropped. The last block an edit
//! touched is remembered (block number and slab slot), as a real walker's cached
//! upper levels are: consecutive maps of one block, every 4 KiB fault of a sweep, skip
//! the probe.

use super::mmu::Pte;
use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use hashbrown::HashMap;

/// Pages of one leaf block (a 2 MiB block of 4 KiB pages).
pub(super) const LEAF_PAGES: u64 = 512;

/// The PTEs and accessed bits of one aligned block of [`LEAF_PAGES`] pages.
struct Leaf {
    /// [`LEAF_PAGES`] slots (a boxed slice: filled in place on the heap, not built on
    /// the stack and copied).
    ptes: Box<[Option<Pte>]>,
    accessed: [u64; LEAF_PAGES as usize / 64],
    used: u32,
}

impl Leaf {
    fn new() -> Leaf {
        Leaf {
            ptes: vec![None; LEAF_PAGES as usize].into_boxed_slice(),
            accessed: [0; LEAF_PAGES as usize / 64],
            used: 0,
        }
    }
}

/// The block number and the index in the block of page `vpn`.
fn split(vpn: u64) -> (u64, usize) {
    (vpn / LEAF_PAGES, (vpn % LEAF_PAGES) as usize)
}

/// One page table: page number → PTE, plus an accessed bit per PTE.
#[derive(Default)]
pub(super) struct Table {
    /// Block number → slot of its leaf in `slab`.
    leaves: HashMap<u64, u32>,
    /// The leaves; `None` in a slot listed in `free`.
    slab: Vec<Option<Leaf>>,
    free: Vec<u32>,
    /// The block and slot of the last leaf an edit found or made (a live leaf).
    last: Option<(u64, u32)>,
}

impl Table {
    fn leaf(&self, b: u64) -> Option<&Leaf> {
        let slot = *self.leaves.get(&b)?;
        self.slab[slot as usize].as_ref()
    }

    /// The slot of block `b`'s leaf, through the memo; the leaf becomes the memo's.
    #[inline]
    fn slot_of(&mut self, b: u64) -> Option<u32> {
        if let Some((lb, slot)) = self.last {
            if lb == b {
                return Some(slot);
            }
        }
        let slot = *self.leaves.get(&b)?;
        self.last = Some((b, slot));
        Some(slot)
    }

    fn leaf_mut(&mut self, b: u64) -> Option<&mut Leaf> {
        let slot = self.slot_of(b)?;
        self.slab[slot as usize].as_mut()
    }

    /// Block `b`'s leaf, made empty if absent: the memo's leaf inline (every 4 KiB
    /// fault of a sweep but the first of each block), the rest out of line.
    #[inline(always)]
    fn leaf_or_new(&mut self, b: u64) -> &mut Leaf {
        let slot = match self.last {
            Some((lb, slot)) if lb == b => slot,
            _ => self.slot_or_new(b),
        };
        self.slab[slot as usize]
            .as_mut()
            .expect("an indexed slot holds a leaf")
    }

    /// The slot of block `b`'s leaf, made empty if absent (the memo missed); the leaf
    /// becomes the memo's.
    #[inline(never)]
    fn slot_or_new(&mut self, b: u64) -> u32 {
        if let Some(s) = self.slot_of(b) {
            return s;
        }
        let s = match self.free.pop() {
            Some(s) => {
                self.slab[s as usize] = Some(Leaf::new());
                s
            }
            None => {
                self.slab.push(Some(Leaf::new()));
                (self.slab.len() - 1) as u32
            }
        };
        self.leaves.insert(b, s);
        self.last = Some((b, s));
        s
    }

    /// The PTE of `vpn`.
    pub fn get(&self, vpn: u64) -> Option<&Pte> {
        let (b, k) = split(vpn);
        self.leaf(b)?.ptes[k].as_ref()
    }

    /// The PTE of `vpn`, to change in place.
    pub fn get_mut(&mut self, vpn: u64) -> Option<&mut Pte> {
        let (b, k) = split(vpn);
        self.leaf_mut(b)?.ptes[k].as_mut()
    }

    /// Set the PTEs of `first..first + pages` to `pte(k)` for the `k`-th page, with
    /// their accessed bits clear (a new mapping has not been walked yet).
    #[inline(always)]
    pub fn insert_run(&mut self, first: u64, pages: u64, mut pte: impl FnMut(u64) -> Pte) {
        if pages == 1 {
            // One page (every 4 KiB fault's map): no run loop, inlined into the map.
            let (b, k) = split(first);
            let leaf = self.leaf_or_new(b);
            let slot = &mut leaf.ptes[k];
            leaf.used += u32::from(slot.is_none());
            *slot = Some(pte(0));
            leaf.accessed[k / 64] &= !(1 << (k % 64));
            return;
        }
        self.insert_many(first, pages, pte);
    }

    /// [`Table::insert_run`] of more than one page, out of line.
    #[inline(never)]
    fn insert_many(&mut self, first: u64, pages: u64, mut pte: impl FnMut(u64) -> Pte) {
        let mut v = first;
        while v < first + pages {
            let (b, k0) = split(v);
            let n = (LEAF_PAGES - k0 as u64).min(first + pages - v);
            let leaf = self.leaf_or_new(b);
            for k in k0..k0 + n as usize {
                let slot = &mut leaf.ptes[k];
                leaf.used += u32::from(slot.is_none());
                *slot = Some(pte(v - first + (k - k0) as u64));
                leaf.accessed[k / 64] &= !(1 << (k % 64));
            }
            v += n;
        }
    }

    /// Remove the PTEs (and accessed bits) of `first..first + pages`.
    pub fn remove_run(&mut self, first: u64, pages: u64) {
        let mut v = first;
        while v < first + pages {
            let (b, k0) = split(v);
            let n = (LEAF_PAGES - k0 as u64).min(first + pages - v);
            if let Some(leaf) = self.leaf_mut(b) {
                for k in k0..k0 + n as usize {
                    leaf.used -= u32::from(leaf.ptes[k].take().is_some());
                    leaf.accessed[k / 64] &= !(1 << (k % 64));
                }
                if leaf.used == 0 {
                    let slot = self.leaves.remove(&b).expect("a found leaf is indexed");
                    self.slab[slot as usize] = None;
                    self.free.push(slot);
                    self.last = None;
                }
            }
            v += n;
        }
    }

    /// Whether the accessed bit of `vpn` is set.
    pub fn accessed(&self, vpn: u64) -> bool {
        let (b, k) = split(vpn);
        self.leaf(b)
            .is_some_and(|l| l.accessed[k / 64] & (1 << (k % 64)) != 0)
    }

    /// Set the accessed bit of `vpn` (a walk found its PTE); nothing if it has none.
    pub fn set_accessed(&mut self, vpn: u64) {
        let (b, k) = split(vpn);
        if let Some(l) = self.leaf_mut(b) {
            if l.ptes[k].is_some() {
                l.accessed[k / 64] |= 1 << (k % 64);
            }
        }
    }

    /// Clear the accessed bits of `first..first + pages`; returns whether any was set.
    /// One probe per leaf block, as [`Table::insert_run`] does, not one per page.
    pub fn take_accessed(&mut self, first: u64, pages: u64) -> bool {
        let mut any = false;
        let end = first.saturating_add(pages);
        let mut v = first;
        while v < end {
            let (b, k0) = split(v);
            let n = (LEAF_PAGES - k0 as u64).min(end - v);
            if let Some(l) = self.leaf_mut(b) {
                for k in k0..k0 + n as usize {
                    any |= l.accessed[k / 64] & (1 << (k % 64)) != 0;
                    l.accessed[k / 64] &= !(1 << (k % 64));
                }
            }
            v += n;
        }
        any
    }

    /// Every PTE, in page order.
    pub fn entries(&self) -> Vec<(u64, Pte)> {
        let mut blocks: Vec<u64> = self.leaves.keys().copied().collect();
        blocks.sort_unstable();
        let mut out = Vec::new();
        for b in blocks {
            let leaf = self.leaf(b).expect("an indexed block has a leaf");
            for (k, p) in leaf.ptes.iter().enumerate() {
                if let Some(p) = p {
                    out.push((b * LEAF_PAGES + k as u64, *p));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::Prot;
    use crate::handle::DeviceId;

    fn pte(pfn: u64) -> Pte {
        Pte {
            pfn,
            prot: Prot::READ,
            memory: DeviceId {
                index: 0,
                generation: 1,
            },
            attrs: crate::mmu::Attrs::default(),
        }
    }

    #[test]
    fn take_accessed_clears_only_its_range_across_blocks() {
        let mut t = Table::default();
        t.insert_run(500, 30, |k| pte(1000 + k));
        for v in [505, 511, 512, 525] {
            t.set_accessed(v);
        }
        // A page with no PTE never gets an accessed bit.
        t.set_accessed(600);
        assert!(!t.accessed(600));
        // [506, 520) holds 511 and 512, one on each side of the block boundary.
        assert!(t.take_accessed(506, 14));
        assert!(!t.accessed(511) && !t.accessed(512));
        assert!(
            t.accessed(505) && t.accessed(525),
            "outside the range: kept"
        );
        assert!(!t.take_accessed(506, 14), "cleared by the first call");
        // A range over blocks that hold no leaf answers false.
        assert!(!t.take_accessed(2048, 1024));
        assert!(t.take_accessed(0, 1 << 20));
        assert!(!t.accessed(505) && !t.accessed(525));
        assert_eq!(t.get(512).map(|p| p.pfn), Some(1012));
    }

    #[test]
    fn an_emptied_leaf_leaves_no_stale_memo_and_its_slot_is_reused() {
        let mut t = Table::default();
        t.insert_run(0, 2, |k| pte(10 + k));
        t.insert_run(512, 1, |k| pte(20 + k));
        // The memo names block 1; emptying block 0 then block 1 frees both slots.
        t.remove_run(0, 2);
        assert!(t.get(0).is_none() && t.get(1).is_none());
        assert_eq!(t.get(512).map(|p| p.pfn), Some(20));
        t.remove_run(512, 1);
        assert!(t.get(512).is_none());
        // Block 7 takes a freed slot; the old blocks stay empty.
        t.insert_run(7 * 512 + 3, 1, |k| pte(30 + k));
        assert_eq!(t.get(7 * 512 + 3).map(|p| p.pfn), Some(30));
        assert!(t.get(0).is_none() && t.get(512).is_none());
        assert_eq!(t.slab.iter().filter(|l| l.is_some()).count(), 1);
        assert_eq!(t.entries().len(), 1);
        // Refilling block 0 after its leaf was dropped makes a fresh leaf.
        t.insert_run(5, 1, |k| pte(40 + k));
        assert_eq!(t.get(5).map(|p| p.pfn), Some(40));
        assert_eq!(t.get(7 * 512 + 3).map(|p| p.pfn), Some(30));
    }
}
