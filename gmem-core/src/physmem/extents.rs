//! Fragmentation of one device's memory: free extents by order, the unusable-free-space
//! index, and the per-block usage that compaction plans from.
//!
//! ## Orders and blocks
//! An **order-`k` block** is `2^k` frames whose first frame number is a multiple of
//! `2^k` (so its physical address is aligned to `4 KiB << k`), lying wholly inside one
//! registered range. Orders run from 0 (4 KiB) to [`MAX_ORDER`] (1 GiB).
//!
//! ## The histogram
//! [`FreeExtents`] describes the free frames the way a buddy allocator's free lists
//! would: every maximal run of free frames (inside one registered range) is cut,
//! greedily from its start, into the largest aligned blocks that fit
//! (a run of frames `[5, 16)` is `5 | 6-7 | 8-15`: one block of order 0, one of
//! order 1, one of order 3), and the histogram counts those blocks by order. The free
//! frames of blocks of order `≥ k` are exactly the free frames an allocation of an
//! aligned `2^k`-frame run could use.
//!
//! ## The unusable-free-space index
//! Gorman and Whitcroft's index ("The What, The Why and The Where To of
//! Anti-Fragmentation", OLS 2006; Linux's `unusable_free_index`) at order `k` is
//! `(free - Σ_{j ≥ k} 2^j · blocks[j]) / free`: the share of free memory that cannot
//! serve an aligned `2^k`-frame request. 0 means every free frame lies in a free block
//! of order `≥ k`; close to 1 means free memory is scattered in smaller pieces. With no
//! free memory the index is 0 (Linux's convention: nothing is unusable).
//!
//! The computation walks the frame records (`O(frames)`), under the device's frame
//! lock; it is a measurement, not a fast-path operation.

use super::{FrameState, PhysMem};
use crate::addr::Pfn;

/// The largest order measured: `4 KiB << 18` = 1 GiB.
pub const MAX_ORDER: u32 = 18;

/// Free memory of a device cut into aligned blocks by order (see the module
/// documentation of `physmem::extents`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeExtents {
    /// `blocks[k]`: free aligned blocks of order `k` (4 KiB `<< k`) in the buddy-style
    /// decomposition of the free runs.
    pub blocks: [u64; MAX_ORDER as usize + 1],
    /// Free frames in all (equal to `Σ 2^k · blocks[k]`).
    pub free: u64,
    /// Registered frames.
    pub registered: u64,
}

impl FreeExtents {
    /// Free frames lying in free blocks of order `order` or larger (orders above
    /// [`MAX_ORDER`] count as [`MAX_ORDER`]).
    pub fn free_in_blocks_from(&self, order: u32) -> u64 {
        let order = order.min(MAX_ORDER) as usize;
        self.blocks[order..]
            .iter()
            .enumerate()
            .map(|(j, n)| n << (order + j))
            .sum()
    }

    /// Free frames that cannot serve an aligned request of `2^order` frames.
    pub fn unusable_frames(&self, order: u32) -> u64 {
        self.free - self.free_in_blocks_from(order)
    }

    /// The unusable-free-space index at `order` (Gorman): `unusable_frames / free`, in
    /// `[0, 1]`; 0 when nothing is free.
    pub fn unusable_index(&self, order: u32) -> f64 {
        if self.free == 0 {
            return 0.0;
        }
        self.unusable_frames(order) as f64 / self.free as f64
    }

    /// The largest order with a free block, if any frame is free.
    pub fn largest_order(&self) -> Option<u32> {
        (0..=MAX_ORDER).rev().find(|&k| self.blocks[k as usize] > 0)
    }
}

/// The use of one aligned block, as compaction sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockUse {
    /// The first frame.
    pub base: Pfn,
    /// Free frames.
    pub free: u64,
    /// Frames on the active or inactive queue with an owner (compaction may move them).
    pub movable: u64,
    /// Wired or pending frames (compaction leaves the block alone).
    pub pinned: u64,
}

/// The order of the largest aligned block starting at `pfn` that fits in `len` frames.
fn block_order(pfn: u64, len: u64) -> u32 {
    let align = if pfn == 0 { 63 } else { pfn.trailing_zeros() };
    let fit = 63 - len.leading_zeros();
    align.min(fit).min(MAX_ORDER)
}

impl PhysMem {
    /// The free frames as a histogram of aligned free blocks by order.
    pub fn free_extents(&self) -> FreeExtents {
        let mut out = FreeExtents {
            registered: self.frames.len() as u64,
            ..FreeExtents::default()
        };
        for r in &self.ranges {
            let mut k = 0;
            while k < r.pages {
                if self.frames[(r.first as u64 + k) as usize].state != FrameState::Free {
                    k += 1;
                    continue;
                }
                let start = k;
                while k < r.pages
                    && self.frames[(r.first as u64 + k) as usize].state == FrameState::Free
                {
                    k += 1;
                }
                let (mut pfn, end) = (r.base_pfn + start, r.base_pfn + k);
                out.free += end - pfn;
                while pfn < end {
                    let o = block_order(pfn, end - pfn);
                    out.blocks[o as usize] += 1;
                    pfn += 1 << o;
                }
            }
        }
        out
    }

    /// Every aligned block of `order` wholly inside a registered range, with its use.
    pub(crate) fn block_uses(&self, order: u32) -> alloc::vec::Vec<BlockUse> {
        let size = 1u64 << order;
        let mut out = alloc::vec::Vec::new();
        for r in &self.ranges {
            let end = r.base_pfn + r.pages;
            let mut base = r.base_pfn.next_multiple_of(size);
            while base + size <= end {
                let mut u = BlockUse {
                    base: Pfn(base),
                    free: 0,
                    movable: 0,
                    pinned: 0,
                };
                let first = (r.first as u64 + (base - r.base_pfn)) as usize;
                for m in &self.frames[first..first + size as usize] {
                    match m.state {
                        FrameState::Free => u.free += 1,
                        FrameState::Active | FrameState::Inactive if m.owner.is_some() => {
                            u.movable += 1
                        }
                        _ => u.pinned += 1,
                    }
                }
                out.push(u);
                base += size;
            }
        }
        out
    }

    /// Whether every frame of the order-`order` block at `base` is free.
    pub(crate) fn block_is_free(&self, base: Pfn, order: u32) -> bool {
        (0..1u64 << order).all(|k| self.state(base.add(k)) == Some(FrameState::Free))
    }

    /// The in-use frames of the order-`order` block at `base` with their owners, in
    /// frame order (frames without an owner are left out).
    pub(crate) fn block_owners(
        &self,
        base: Pfn,
        order: u32,
    ) -> alloc::vec::Vec<(Pfn, super::Owner)> {
        (0..1u64 << order)
            .filter_map(|k| {
                let pfn = base.add(k);
                self.owner(pfn).map(|o| (pfn, o))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_order_takes_the_largest_aligned_block_that_fits() {
        assert_eq!(block_order(5, 11), 0);
        assert_eq!(block_order(6, 10), 1);
        assert_eq!(block_order(8, 8), 3);
        assert_eq!(block_order(0, 1 << 30), MAX_ORDER);
        assert_eq!(block_order(1 << 20, 3), 1);
    }

    #[test]
    fn the_index_counts_free_frames_below_the_order() {
        let mut e = FreeExtents::default();
        e.blocks[0] = 3;
        e.blocks[2] = 1;
        e.free = 7;
        assert_eq!(e.free_in_blocks_from(1), 4);
        assert_eq!(e.unusable_frames(1), 3);
        assert!((e.unusable_index(1) - 3.0 / 7.0).abs() < 1e-12);
        assert_eq!(e.unusable_index(0), 0.0);
        assert_eq!(e.unusable_index(3), 1.0);
        assert_eq!(FreeExtents::default().unusable_index(4), 0.0);
        assert_eq!(e.largest_order(), Some(2));
    }
}
