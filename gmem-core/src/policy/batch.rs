//! Fault batching: a batch of fault records, deduplicated by page and grouped by block.
//!
//! A GPU does not stop at its first translation miss: its fault buffer collects the
//! misses of many warps, and the driver fetches up to a batch of them at once
//! (`uvm_perf_fault_batch_count`, default 256, `uvm_gpu_replayable_faults.c`). Many
//! are duplicates: warps of one kernel touch the same page. UVM sorts the batch
//! (`preprocess_fault_batch`: by VA space, address, access type), merges the
//! duplicates (counted in `num_duplicate_faults`), services each VA block once
//! (`service_fault_batch_block`), and replays once per batch.
//!
//! [`FaultBatcher::batch`] does the data part of that: it takes the records the
//! driver fetched, checks them all, and answers one [`BlockFaults`] per (device,
//! 2 MiB block) in ascending order, each with its pages ascending and one merged
//! access per page (a read and a write to one page are one write fault). Records of
//! two devices on one page are not duplicates: each device needs its own mapping.

use alloc::vec::Vec;
use core::fmt;

use super::{block_of, PageIndex, PageMask};
use crate::addr::{VirtAddr, Vpn};
use crate::flags::Prot;
use crate::handle::DeviceId;

/// One entry of a device's fault buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultRecord {
    /// The faulting device.
    pub device: DeviceId,
    /// The faulting address (any offset inside the page).
    pub va: VirtAddr,
    /// The access that faulted (non-empty).
    pub access: Prot,
}

/// The faults of one device on one block, after deduplication.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockFaults {
    /// The device.
    pub device: DeviceId,
    /// The block's first page.
    pub block: Vpn,
    /// The faulted pages, ascending, each with the union of its accesses.
    pub pages: Vec<(PageIndex, Prot)>,
}

impl BlockFaults {
    /// The faulted pages as a mask (the prefetcher's input).
    pub fn mask(&self) -> PageMask {
        let mut m = PageMask::new();
        for &(p, _) in &self.pages {
            m.set(p as usize);
        }
        m
    }
}

/// A serviced batch: one entry per (device, block), ascending by device then block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultBatch {
    /// The groups.
    pub blocks: Vec<BlockFaults>,
    /// Records in the batch that repeated an earlier (device, page) of it.
    pub duplicates: u64,
}

/// Batching tuning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    max_records: usize,
}

impl Default for BatchConfig {
    /// 256 records per batch: `UVM_PERF_FAULT_BATCH_COUNT_DEFAULT` in
    /// `uvm_gpu_replayable_faults.c`.
    fn default() -> Self {
        Self { max_records: 256 }
    }
}

impl BatchConfig {
    /// At most `max_records` records per batch (UVM's minimum is 1,
    /// `UVM_PERF_FAULT_BATCH_COUNT_MIN`).
    ///
    /// # Errors
    /// [`BatchError::Config`] if `max_records` is 0.
    pub fn new(max_records: usize) -> Result<Self, BatchError> {
        if max_records == 0 {
            return Err(BatchError::Config);
        }
        Ok(Self { max_records })
    }

    /// The largest batch accepted.
    pub fn max_records(&self) -> usize {
        self.max_records
    }
}

/// Why a batch was rejected (the batcher's counters are unchanged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchError {
    /// A batch size of 0.
    Config,
    /// The batch holds no record.
    Empty,
    /// The batch holds more records than the configured maximum.
    TooLarge {
        /// Records given.
        records: usize,
        /// The maximum.
        max: usize,
    },
    /// Record `index` has an empty access.
    NoAccess {
        /// Its position in the batch.
        index: usize,
    },
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config => write!(f, "a batch must hold at least one record"),
            Self::Empty => write!(f, "empty fault batch"),
            Self::TooLarge { records, max } => {
                write!(f, "fault batch of {records} records exceeds {max}")
            }
            Self::NoAccess { index } => write!(f, "fault record {index} has no access"),
        }
    }
}

impl core::error::Error for BatchError {}

/// The batcher's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Fault records accepted, duplicates included.
    pub faults: u64,
    /// Batches accepted.
    pub batches: u64,
    /// Records that repeated a (device, page) earlier in their batch.
    pub duplicates: u64,
    /// (device, block) groups produced: the blocks serviced.
    pub blocks: u64,
}

/// Deduplicates and groups fault batches, and counts them.
#[derive(Clone, Debug, Default)]
pub struct FaultBatcher {
    config: BatchConfig,
    stats: BatchStats,
}

impl FaultBatcher {
    /// A batcher with `config`.
    pub fn new(config: BatchConfig) -> Self {
        Self {
            config,
            stats: BatchStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> BatchConfig {
        self.config
    }

    /// The counters so far.
    pub fn stats(&self) -> BatchStats {
        self.stats
    }

    /// Deduplicates `records` by (device, page), merges the accesses of duplicates,
    /// and groups them by (device, block), ascending.
    ///
    /// # Errors
    /// [`BatchError::Empty`], [`BatchError::TooLarge`] or [`BatchError::NoAccess`];
    /// the counters are then unchanged.
    pub fn batch(&mut self, records: &[FaultRecord]) -> Result<FaultBatch, BatchError> {
        if records.is_empty() {
            return Err(BatchError::Empty);
        }
        if records.len() > self.config.max_records {
            return Err(BatchError::TooLarge {
                records: records.len(),
                max: self.config.max_records,
            });
        }
        if let Some(index) = records.iter().position(|r| r.access.is_empty()) {
            return Err(BatchError::NoAccess { index });
        }
        let mut keyed: Vec<(DeviceId, u64, Prot)> = records
            .iter()
            .map(|r| (r.device, r.va.vpn().0, r.access))
            .collect();
        // Stable: ties keep fetch order (irrelevant once accesses merge, but cheap).
        keyed.sort_by_key(|&(d, vpn, _)| (d, vpn));
        let mut out = FaultBatch::default();
        let mut prev: Option<(DeviceId, u64)> = None;
        for (device, vpn, access) in keyed {
            if prev == Some((device, vpn)) {
                // A duplicate follows its page, the last one pushed.
                if let Some(last) = out.blocks.last_mut().and_then(|g| g.pages.last_mut()) {
                    last.1 |= access;
                }
                out.duplicates += 1;
                continue;
            }
            prev = Some((device, vpn));
            let (block, index) = block_of(Vpn(vpn));
            match out.blocks.last_mut() {
                Some(g) if g.device == device && g.block == block => g.pages.push((index, access)),
                _ => out.blocks.push(BlockFaults {
                    device,
                    block,
                    pages: alloc::vec![(index, access)],
                }),
            }
        }
        self.stats.faults += records.len() as u64;
        self.stats.batches += 1;
        self.stats.duplicates += out.duplicates;
        self.stats.blocks += out.blocks.len() as u64;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::BLOCK_SIZE;
    use alloc::collections::BTreeMap;

    fn dev(i: u32) -> DeviceId {
        DeviceId::from_raw(i, 0)
    }

    fn rec(d: u32, va: u64, access: Prot) -> FaultRecord {
        FaultRecord {
            device: dev(d),
            va: VirtAddr::new(va),
            access,
        }
    }

    #[test]
    fn duplicates_merge_their_accesses_and_are_counted() {
        let mut b = FaultBatcher::default();
        let out = b
            .batch(&[
                rec(1, 0x1000, Prot::READ),
                rec(1, 0x1fff, Prot::WRITE), // same page
                rec(1, 0x1010, Prot::READ),  // same page again
                rec(2, 0x1000, Prot::READ),  // another device: not a duplicate
            ])
            .unwrap();
        assert_eq!(out.duplicates, 2);
        assert_eq!(out.blocks.len(), 2);
        assert_eq!(out.blocks[0].pages, [(1, Prot::RW)]);
        assert_eq!(out.blocks[1].device, dev(2));
        let s = b.stats();
        assert_eq!((s.faults, s.batches, s.duplicates, s.blocks), (4, 1, 2, 2));
    }

    #[test]
    fn groups_are_by_block_ascending_with_pages_ascending() {
        let mut b = FaultBatcher::default();
        let base = 4 * BLOCK_SIZE;
        let out = b
            .batch(&[
                rec(1, base + BLOCK_SIZE + 0x3000, Prot::READ),
                rec(1, base + 0x5000, Prot::READ),
                rec(1, base + 0x2000, Prot::WRITE),
                rec(1, base + BLOCK_SIZE, Prot::READ),
            ])
            .unwrap();
        assert_eq!(out.blocks.len(), 2);
        assert_eq!(out.blocks[0].block, VirtAddr::new(base).vpn());
        assert_eq!(out.blocks[0].pages, [(2, Prot::WRITE), (5, Prot::READ)]);
        assert_eq!(out.blocks[1].pages, [(0, Prot::READ), (3, Prot::READ)]);
        assert_eq!(out.blocks[0].mask().iter().collect::<Vec<_>>(), [2, 5]);
    }

    #[test]
    fn the_batch_matches_a_map_model_on_pseudorandom_records() {
        let mut x = 0x1234_5678_9abc_def1u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut b = FaultBatcher::default();
        for _ in 0..100 {
            let n = 1 + (next() % 256) as usize;
            let recs: Vec<FaultRecord> = (0..n)
                .map(|_| {
                    let access = if next() % 3 == 0 {
                        Prot::WRITE
                    } else {
                        Prot::READ
                    };
                    rec(
                        (next() % 3) as u32,
                        (next() % (3 * BLOCK_SIZE)) & !0xfff,
                        access,
                    )
                })
                .collect();
            let mut model: BTreeMap<(DeviceId, u64), Prot> = BTreeMap::new();
            for r in &recs {
                *model.entry((r.device, r.va.vpn().0)).or_default() |= r.access;
            }
            let out = b.batch(&recs).unwrap();
            let flat: Vec<((DeviceId, u64), Prot)> = out
                .blocks
                .iter()
                .flat_map(|g| {
                    g.pages
                        .iter()
                        .map(move |&(p, a)| ((g.device, g.block.0 + p as u64), a))
                })
                .collect();
            assert_eq!(flat, model.into_iter().collect::<Vec<_>>());
            assert_eq!(out.duplicates as usize, n - flat.len());
        }
    }

    #[test]
    fn bad_batches_are_typed_errors_and_count_nothing() {
        let mut b = FaultBatcher::new(BatchConfig::new(2).unwrap());
        assert_eq!(BatchConfig::new(0), Err(BatchError::Config));
        assert_eq!(b.batch(&[]), Err(BatchError::Empty));
        let r = rec(1, 0, Prot::READ);
        assert_eq!(
            b.batch(&[r, r, r]),
            Err(BatchError::TooLarge { records: 3, max: 2 })
        );
        assert_eq!(
            b.batch(&[r, rec(1, 0, Prot::empty())]),
            Err(BatchError::NoAccess { index: 1 })
        );
        assert_eq!(b.stats(), BatchStats::default());
    }
}
