//! What a launch reports: its counters ([`RunStats`]) or why it failed ([`SimtError`]).

use crate::coalesce::CoalesceError;
#[cfg(doc)]
use crate::kernel::{Op, LOAD_REGS};
use crate::occupancy::OccupancyError;
use gmem_sim::AccessError;
use std::fmt;

/// Why a launch failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimtError {
    /// The kernel does not fit a unit.
    Occupancy(OccupancyError),
    /// A warp's lane addresses were rejected.
    Coalesce {
        /// The block.
        block: u64,
        /// The error.
        error: CoalesceError,
    },
    /// An access failed (fault not served, livelock, no memory, ...).
    Access {
        /// The block.
        block: u64,
        /// The error.
        error: AccessError,
    },
    /// A cost-model cache geometry was rejected.
    Geometry,
    /// The device has no compute unit.
    NoUnits,
    /// A warp loaded into a register it had already loaded since its last
    /// [`Op::Wait`], or into one beyond [`LOAD_REGS`], or exited with loads it never
    /// waited for (a program error; the warp's earlier instructions stay done).
    Register {
        /// The block.
        block: u64,
        /// The register (`None`: exited with loads outstanding).
        reg: Option<u8>,
    },
}

impl fmt::Display for SimtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimtError::Occupancy(e) => write!(f, "occupancy: {e}"),
            SimtError::Coalesce { block, error } => write!(f, "block {block}: {error:?}"),
            SimtError::Access { block, error } => write!(f, "block {block}: {error}"),
            SimtError::Geometry => write!(f, "bad data-cache geometry"),
            SimtError::NoUnits => write!(f, "the device has no compute unit"),
            SimtError::Register {
                block,
                reg: Some(r),
            } => write!(
                f,
                "block {block}: register {r} loaded twice or out of range"
            ),
            SimtError::Register { block, reg: None } => {
                write!(
                    f,
                    "block {block}: a warp exited with loads it did not wait for"
                )
            }
        }
    }
}

/// What a launch did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RunStats {
    /// Cycles until the last unit finished.
    pub cycles: u64,
    /// Thread blocks run.
    pub blocks: u64,
    /// Warps run.
    pub warps: u64,
    /// Resident warps per unit (the occupancy).
    pub warps_per_unit: u32,
    /// Warp instructions issued.
    pub instructions: u64,
    /// Of those, loads and stores.
    pub memory_instructions: u64,
    /// 128-byte transactions.
    pub transactions: u64,
    /// Translation requests (distinct pages per memory instruction).
    pub translations: u64,
    /// Requests served by the unit's L1 TLB.
    pub served_l1: u64,
    /// Requests served by the shared TLB.
    pub served_l2: u64,
    /// Requests that missed while a walk of their page was in flight (or missed at
    /// issue and found the page filled by another request's walk) and waited for it:
    /// neither a hit nor a walk of their own.
    pub merged: u64,
    /// Requests that walked.
    pub walks: u64,
    /// Table entries those walks read.
    pub walk_reads: u64,
    /// Transactions served by an L1 data cache.
    pub l1_data_hits: u64,
    /// Transactions served by the L2 data cache.
    pub l2_data_hits: u64,
    /// Transactions that went to DRAM.
    pub dram_transactions: u64,
    /// Cycles warps waited for translation (summed over memory instructions).
    pub translation_cycles: u64,
    /// Cycles warps waited for data (summed over memory instructions).
    pub data_cycles: u64,
}

impl RunStats {
    /// Add another launch's counters (cycles add: launches run one after another).
    pub fn plus(&mut self, o: &RunStats) {
        self.cycles += o.cycles;
        self.blocks += o.blocks;
        self.warps += o.warps;
        self.warps_per_unit = self.warps_per_unit.max(o.warps_per_unit);
        self.instructions += o.instructions;
        self.memory_instructions += o.memory_instructions;
        self.transactions += o.transactions;
        self.translations += o.translations;
        self.served_l1 += o.served_l1;
        self.served_l2 += o.served_l2;
        self.merged += o.merged;
        self.walks += o.walks;
        self.walk_reads += o.walk_reads;
        self.l1_data_hits += o.l1_data_hits;
        self.l2_data_hits += o.l2_data_hits;
        self.dram_transactions += o.dram_transactions;
        self.translation_cycles += o.translation_cycles;
        self.data_cycles += o.data_cycles;
    }
}
