//! The SM resource model and the occupancy calculator.
//!
//! Occupancy is the number of warps an SM keeps resident, as a fraction of the most it can
//! hold. Four resources bound it, each as a number of thread blocks per SM:
//!
//! - **warp slots**: `max_threads / warp_size` warps, a block taking
//!   `ceil(threads / warp_size)` of them;
//! - **block slots**: `max_blocks` blocks;
//! - **registers**: allocated per warp, `registers_per_thread * warp_size` rounded up to
//!   `register_alloc_unit`; the register file is split into `register_sub_partitions`
//!   equal parts (one per warp scheduler) and a warp's registers come from one part, so
//!   the SM holds `sub_partitions * floor(registers / sub_partitions / per_warp)` warps;
//! - **shared memory**: per block, rounded up to `shared_alloc_unit`.
//!
//! The resident block count is the minimum of the four; because every division floors,
//! occupancy is a step function of the register count — the "occupancy cliffs" of the
//! paper's §2 (for 256-thread blocks on Maxwell: 32 registers give 100%, 33..40 give 75%,
//! 41..48 62.5%, 49..64 50%, ...). The rules are those of NVIDIA's CUDA Occupancy
//! Calculator for compute capability 5.x (the spreadsheet and `cuda_occupancy.h`, which
//! agree for 5.x with partitioned global caching off, the default); the tests check the
//! points listed on [`occupancy`].

/// An SM's on-chip resources and issue structure (a Maxwell-class GPU by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmConfig {
    /// 32-bit registers per SM.
    pub registers: u32,
    /// Resident threads per SM.
    pub max_threads: u32,
    /// Resident thread blocks per SM.
    pub max_blocks: u32,
    /// Shared memory per SM, bytes.
    pub shared_bytes: u32,
    /// Shared memory one block may use, bytes.
    pub max_shared_per_block: u32,
    /// Registers are allocated per warp in units of this many registers.
    pub register_alloc_unit: u32,
    /// The most registers one thread may address.
    pub max_registers_per_thread: u32,
    /// Threads per warp.
    pub warp_size: u32,
    /// The most threads one block may have.
    pub max_threads_per_block: u32,
    /// The most registers one block may be allocated.
    pub max_registers_per_block: u32,
    /// Shared memory is allocated per block in units of this many bytes.
    pub shared_alloc_unit: u32,
    /// Register-file sub-partitions (one per warp scheduler).
    pub register_sub_partitions: u32,
    /// Warp schedulers per SM (each issues one instruction per cycle).
    pub schedulers: u32,
    /// Shared-memory banks (4 bytes wide).
    pub shared_banks: u32,
    /// Register-file banks (register `Rn` is in bank `n % register_banks`).
    pub register_banks: u32,
    /// Scoreboard barriers per warp for variable-latency instructions.
    pub scoreboard_barriers: u32,
    /// FP32 lanes per SM.
    pub fp32_lanes: u32,
    /// FP64 lanes per SM.
    pub fp64_lanes: u32,
}

impl SmConfig {
    /// The paper's Maxwell-class SM (compute capability 5.2, e.g. GTX 980 / Titan X):
    /// 64 K registers, 2048 threads and 32 blocks per SM, 96 KiB shared memory per SM
    /// (48 KiB per block), registers allocated per warp in units of 256, 4 register
    /// sub-partitions and warp schedulers, 32 shared-memory banks, 4 register banks,
    /// 6 scoreboard barriers, 128 FP32 and 4 FP64 lanes.
    pub fn maxwell() -> SmConfig {
        SmConfig {
            registers: 65_536,
            max_threads: 2048,
            max_blocks: 32,
            shared_bytes: 96 * 1024,
            max_shared_per_block: 48 * 1024,
            register_alloc_unit: 256,
            max_registers_per_thread: 255,
            warp_size: 32,
            max_threads_per_block: 1024,
            max_registers_per_block: 65_536,
            shared_alloc_unit: 256,
            register_sub_partitions: 4,
            schedulers: 4,
            shared_banks: 32,
            register_banks: 4,
            scoreboard_barriers: 6,
            fp32_lanes: 128,
            fp64_lanes: 4,
        }
    }

    /// The most warps the SM keeps resident.
    pub fn max_warps(&self) -> u32 {
        self.max_threads / self.warp_size.max(1)
    }
}

impl Default for SmConfig {
    fn default() -> SmConfig {
        SmConfig::maxwell()
    }
}

/// What one thread block of a kernel asks of the SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelResources {
    /// Threads per block.
    pub threads_per_block: u32,
    /// Registers per thread (the highest register number used plus one).
    pub registers_per_thread: u32,
    /// Shared memory per block, static plus dynamic, bytes.
    pub shared_bytes_per_block: u32,
}

/// The resource that bounds the resident block count (ties go to the first listed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limiter {
    /// Warp (thread) slots.
    Threads,
    /// Block slots.
    Blocks,
    /// The register file.
    Registers,
    /// Shared memory.
    SharedMemory,
}

/// The occupancy a kernel reaches on an SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupancy {
    /// Resident thread blocks per SM.
    pub blocks_per_sm: u32,
    /// Resident warps per SM.
    pub warps_per_sm: u32,
    /// The resource that bounds `blocks_per_sm`.
    pub limiter: Limiter,
    /// The most warps the SM could hold (the denominator of [`Occupancy::fraction`]).
    pub max_warps_per_sm: u32,
    /// Registers allocated to one block.
    pub registers_per_block: u32,
    /// Shared memory allocated to one block, bytes.
    pub shared_per_block: u32,
}

impl Occupancy {
    /// Resident warps as a fraction of the SM's warp slots (0..=1).
    pub fn fraction(&self) -> f64 {
        if self.max_warps_per_sm == 0 {
            0.0
        } else {
            f64::from(self.warps_per_sm) / f64::from(self.max_warps_per_sm)
        }
    }
}

/// Why a block cannot be resident on the SM at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OccupancyError {
    /// Zero threads, or more than the SM allows per block.
    BlockSize {
        /// The requested threads per block.
        threads: u32,
        /// The limit.
        max: u32,
    },
    /// More registers per thread than the ISA can address.
    RegistersPerThread {
        /// The requested registers per thread.
        registers: u32,
        /// The limit.
        max: u32,
    },
    /// The block's register allocation exceeds the per-block limit.
    RegistersPerBlock {
        /// Registers the block would be allocated.
        needed: u32,
        /// The limit.
        max: u32,
    },
    /// The block's shared memory exceeds the per-block limit.
    SharedPerBlock {
        /// Bytes the block would be allocated.
        needed: u32,
        /// The limit.
        max: u32,
    },
    /// The configuration itself is degenerate (a zero warp size or allocation unit).
    BadConfig,
}

impl std::fmt::Display for OccupancyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OccupancyError::BlockSize { threads, max } => {
                write!(f, "{threads} threads per block (allowed 1..={max})")
            }
            OccupancyError::RegistersPerThread { registers, max } => {
                write!(f, "{registers} registers per thread (at most {max})")
            }
            OccupancyError::RegistersPerBlock { needed, max } => {
                write!(f, "a block needs {needed} registers (at most {max})")
            }
            OccupancyError::SharedPerBlock { needed, max } => {
                write!(
                    f,
                    "a block needs {needed} bytes of shared memory (at most {max})"
                )
            }
            OccupancyError::BadConfig => write!(f, "degenerate SM configuration"),
        }
    }
}

impl std::error::Error for OccupancyError {}

fn round_up(x: u32, unit: u32) -> u32 {
    x.div_ceil(unit) * unit
}

/// The occupancy `k` reaches on `sm`, by the rules of NVIDIA's CUDA Occupancy Calculator.
///
/// Checked points (compute capability 5.2, `SmConfig::maxwell()`; threads / registers /
/// shared bytes → blocks, warps, limiter), each read off the calculator's rules and
/// asserted in this module's tests:
///
/// | threads | regs | smem | blocks | warps | occupancy | limiter |
/// |---|---|---|---|---|---|---|
/// | 256 | 32 | 0 | 8 | 64 | 100% | threads |
/// | 256 | 33 | 0 | 6 | 48 | 75% | registers |
/// | 256 | 40 | 0 | 6 | 48 | 75% | registers |
/// | 256 | 48 | 0 | 5 | 40 | 62.5% | registers |
/// | 256 | 64 | 0 | 4 | 32 | 50% | registers |
/// | 256 | 128 | 0 | 2 | 16 | 25% | registers |
/// | 256 | 255 | 0 | 1 | 8 | 12.5% | registers |
/// | 128 | 72 | 0 | 7 | 28 | 43.75% | registers |
/// | 96 | 40 | 0 | 16 | 48 | 75% | registers (per sub-partition: 12 warps) |
/// | 1024 | 64 | 0 | 1 | 32 | 50% | registers |
/// | 32 | 16 | 0 | 32 | 32 | 50% | blocks |
/// | 256 | 32 | 12288 | 8 | 64 | 100% | threads |
/// | 256 | 32 | 12289 | 7 | 56 | 87.5% | shared memory (12544 B allocated) |
/// | 256 | 32 | 49152 | 2 | 16 | 25% | shared memory |
///
/// # Errors
/// [`OccupancyError::BlockSize`] for 0 or more than 1024 threads,
/// [`OccupancyError::RegistersPerThread`] above 255 registers,
/// [`OccupancyError::RegistersPerBlock`] when the block's registers exceed 64 K (e.g.
/// 1024 threads × 65 registers), [`OccupancyError::SharedPerBlock`] above 48 KiB, and
/// [`OccupancyError::BadConfig`] for a configuration with a zero unit or warp size.
pub fn occupancy(sm: &SmConfig, k: &KernelResources) -> Result<Occupancy, OccupancyError> {
    if sm.warp_size == 0
        || sm.register_alloc_unit == 0
        || sm.shared_alloc_unit == 0
        || sm.register_sub_partitions == 0
    {
        return Err(OccupancyError::BadConfig);
    }
    if k.threads_per_block == 0 || k.threads_per_block > sm.max_threads_per_block {
        return Err(OccupancyError::BlockSize {
            threads: k.threads_per_block,
            max: sm.max_threads_per_block,
        });
    }
    if k.registers_per_thread > sm.max_registers_per_thread {
        return Err(OccupancyError::RegistersPerThread {
            registers: k.registers_per_thread,
            max: sm.max_registers_per_thread,
        });
    }
    let warps_per_block = k.threads_per_block.div_ceil(sm.warp_size);
    // Registers: per warp, rounded to the allocation unit.
    let regs_per_warp = round_up(
        k.registers_per_thread * sm.warp_size,
        sm.register_alloc_unit,
    );
    let regs_per_block = regs_per_warp * warps_per_block;
    // The hardware check assumes every sub-partition is allocated at once.
    let regs_assumed = regs_per_warp * round_up(warps_per_block, sm.register_sub_partitions);
    if regs_per_block.max(regs_assumed) > sm.max_registers_per_block {
        return Err(OccupancyError::RegistersPerBlock {
            needed: regs_per_block.max(regs_assumed),
            max: sm.max_registers_per_block,
        });
    }
    let smem = round_up(k.shared_bytes_per_block, sm.shared_alloc_unit);
    if smem > sm.max_shared_per_block {
        return Err(OccupancyError::SharedPerBlock {
            needed: smem,
            max: sm.max_shared_per_block,
        });
    }
    let by_threads = sm.max_warps() / warps_per_block;
    let by_blocks = sm.max_blocks;
    let per_part = sm.registers / sm.register_sub_partitions;
    let by_regs = per_part.checked_div(regs_per_warp).map_or(u32::MAX, |w| {
        w * sm.register_sub_partitions / warps_per_block
    });
    let by_smem = sm.shared_bytes.checked_div(smem).unwrap_or(u32::MAX);
    let mut blocks = by_threads;
    let mut limiter = Limiter::Threads;
    for (n, l) in [
        (by_blocks, Limiter::Blocks),
        (by_regs, Limiter::Registers),
        (by_smem, Limiter::SharedMemory),
    ] {
        if n < blocks {
            blocks = n;
            limiter = l;
        }
    }
    Ok(Occupancy {
        blocks_per_sm: blocks,
        warps_per_sm: blocks * warps_per_block,
        limiter,
        max_warps_per_sm: sm.max_warps(),
        registers_per_block: regs_per_block,
        shared_per_block: smem,
    })
}

/// The largest register count per thread that still reaches at least `warps` resident
/// warps (shared memory and block size fixed), or `None` when no register count does.
/// This finds the occupancy cliffs: every distinct value of this function over `warps`
/// is the right edge of a step.
pub fn max_registers_for_warps(sm: &SmConfig, k: &KernelResources, warps: u32) -> Option<u32> {
    (1..=sm.max_registers_per_thread).rev().find(|&r| {
        let kk = KernelResources {
            registers_per_thread: r,
            ..*k
        };
        matches!(occupancy(sm, &kk), Ok(o) if o.warps_per_sm >= warps)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(threads: u32, regs: u32, smem: u32) -> KernelResources {
        KernelResources {
            threads_per_block: threads,
            registers_per_thread: regs,
            shared_bytes_per_block: smem,
        }
    }

    #[test]
    fn agrees_with_nvidia_calculator_points_for_cc52() {
        let sm = SmConfig::maxwell();
        let points = [
            (256, 32, 0, 8, 64, Limiter::Threads),
            (256, 33, 0, 6, 48, Limiter::Registers),
            (256, 40, 0, 6, 48, Limiter::Registers),
            (256, 48, 0, 5, 40, Limiter::Registers),
            (256, 64, 0, 4, 32, Limiter::Registers),
            (256, 128, 0, 2, 16, Limiter::Registers),
            (256, 255, 0, 1, 8, Limiter::Registers),
            (128, 72, 0, 7, 28, Limiter::Registers),
            (96, 40, 0, 16, 48, Limiter::Registers),
            (1024, 64, 0, 1, 32, Limiter::Registers),
            (32, 16, 0, 32, 32, Limiter::Blocks),
            (256, 32, 12288, 8, 64, Limiter::Threads),
            (256, 32, 12289, 7, 56, Limiter::SharedMemory),
            (256, 32, 49152, 2, 16, Limiter::SharedMemory),
        ];
        for (t, r, s, blocks, warps, lim) in points {
            let o = occupancy(&sm, &k(t, r, s)).unwrap();
            assert_eq!(
                (o.blocks_per_sm, o.warps_per_sm, o.limiter),
                (blocks, warps, lim),
                "threads {t} regs {r} smem {s}"
            );
        }
        let o = occupancy(&sm, &k(256, 32, 12289)).unwrap();
        assert_eq!(o.shared_per_block, 12544);
        assert!((occupancy(&sm, &k(256, 48, 0)).unwrap().fraction() - 0.625).abs() < 1e-12);
    }

    #[test]
    fn step_cliffs_for_256_thread_blocks() {
        let sm = SmConfig::maxwell();
        let occ = |r| occupancy(&sm, &k(256, r, 0)).unwrap().warps_per_sm;
        // Flat within a step, a drop across each cliff.
        assert_eq!(occ(1), 64);
        assert_eq!(occ(32), 64);
        assert_eq!(occ(33), 48);
        assert_eq!(occ(41), 40);
        assert_eq!(occ(49), 32);
        assert_eq!(occ(64), 32);
        assert_eq!(occ(65), 24);
        let base = k(256, 0, 0);
        assert_eq!(max_registers_for_warps(&sm, &base, 64), Some(32));
        assert_eq!(max_registers_for_warps(&sm, &base, 48), Some(40));
        assert_eq!(max_registers_for_warps(&sm, &base, 40), Some(48));
        assert_eq!(max_registers_for_warps(&sm, &base, 32), Some(64));
        // Shared memory caps occupancy whatever the register count.
        assert_eq!(max_registers_for_warps(&sm, &k(256, 0, 40_000), 24), None);
    }

    #[test]
    fn blocks_that_cannot_fit_get_typed_errors() {
        let sm = SmConfig::maxwell();
        assert!(matches!(
            occupancy(&sm, &k(0, 32, 0)),
            Err(OccupancyError::BlockSize { .. })
        ));
        assert!(matches!(
            occupancy(&sm, &k(1025, 32, 0)),
            Err(OccupancyError::BlockSize { .. })
        ));
        assert!(matches!(
            occupancy(&sm, &k(256, 256, 0)),
            Err(OccupancyError::RegistersPerThread { .. })
        ));
        assert_eq!(
            occupancy(&sm, &k(1024, 65, 0)),
            Err(OccupancyError::RegistersPerBlock {
                needed: 73_728,
                max: 65_536
            })
        );
        assert_eq!(
            occupancy(&sm, &k(256, 32, 49_153)),
            Err(OccupancyError::SharedPerBlock {
                needed: 49_408,
                max: 49_152
            })
        );
        let bad = SmConfig {
            warp_size: 0,
            ..SmConfig::maxwell()
        };
        assert_eq!(
            occupancy(&bad, &k(256, 32, 0)),
            Err(OccupancyError::BadConfig)
        );
    }
}
