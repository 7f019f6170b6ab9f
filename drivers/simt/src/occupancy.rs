//! Occupancy: how many thread blocks (and so warps) of a kernel a compute unit holds.
//!
//! A block needs `threads_per_block` threads, `registers_per_thread` registers for each
//! of them (allocated per warp in units of the unit's register granularity) and
//! `shared_bytes_per_block` bytes of shared memory (in units of its allocation
//! granularity); the unit has limits on each and on resident blocks, warps and threads.
//! The smallest quotient wins and names the limiter. This is the CUDA occupancy
//! calculator's arithmetic.
//!
//! The calculation sits behind [`OccupancyModel`] so the engine does not care who
//! computes it: [`Calculator`] is this crate's; the `gmem-regdem` crate's calculator
//! (same inputs, same outputs) plugs in by implementing the trait for its `SmConfig`.

use std::fmt;

/// What a kernel's block needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelResources {
    /// Threads per block.
    pub threads_per_block: u32,
    /// Registers per thread.
    pub registers_per_thread: u32,
    /// Shared memory per block, bytes.
    pub shared_bytes_per_block: u32,
}

/// What bounded the occupancy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limiter {
    /// Resident blocks per unit.
    Blocks,
    /// Resident warps (or threads) per unit.
    Warps,
    /// The register file.
    Registers,
    /// Shared memory.
    SharedMemory,
}

/// Blocks and warps resident on one unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupancy {
    /// Blocks per unit.
    pub blocks_per_sm: u32,
    /// Warps per unit.
    pub warps_per_sm: u32,
    /// The binding limit.
    pub limiter: Limiter,
}

/// Why a kernel cannot run at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OccupancyError {
    /// Zero threads per block, or more than the unit allows.
    BadBlockSize(u32),
    /// More registers per thread than the unit allows.
    TooManyRegisters(u32),
    /// More shared memory per block than the unit has.
    TooMuchSharedMemory(u32),
}

impl fmt::Display for OccupancyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OccupancyError::BadBlockSize(n) => write!(f, "{n} threads per block"),
            OccupancyError::TooManyRegisters(n) => write!(f, "{n} registers per thread"),
            OccupancyError::TooMuchSharedMemory(n) => write!(f, "{n} shared bytes per block"),
        }
    }
}

/// Something that computes occupancy.
pub trait OccupancyModel {
    /// Blocks and warps of a kernel with `k` resident on one unit.
    ///
    /// # Errors
    /// An [`OccupancyError`] when not even one block fits.
    fn occupancy(&self, k: &KernelResources) -> Result<Occupancy, OccupancyError>;
}

/// A compute unit's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Calculator {
    /// Resident threads.
    pub max_threads: u32,
    /// Resident warps.
    pub max_warps: u32,
    /// Resident blocks.
    pub max_blocks: u32,
    /// Threads per block.
    pub max_threads_per_block: u32,
    /// 32-bit registers.
    pub registers: u32,
    /// Registers per thread.
    pub max_registers_per_thread: u32,
    /// Registers are allocated per warp in multiples of this.
    pub register_granularity: u32,
    /// Shared memory bytes.
    pub shared_bytes: u32,
    /// Shared memory is allocated in multiples of this.
    pub shared_granularity: u32,
}

impl Calculator {
    /// A Maxwell SM (compute capability 5.2): 2048 threads, 64 warps, 32 blocks,
    /// 64 Ki registers (256 per warp granule, 255 per thread), 96 KiB shared memory in
    /// 256-byte granules (NVIDIA's CUDA occupancy calculator, CC 5.2 column).
    pub const fn maxwell() -> Calculator {
        Calculator {
            max_threads: 2048,
            max_warps: 64,
            max_blocks: 32,
            max_threads_per_block: 1024,
            registers: 65536,
            max_registers_per_thread: 255,
            register_granularity: 256,
            shared_bytes: 98304,
            shared_granularity: 256,
        }
    }
}

impl OccupancyModel for Calculator {
    fn occupancy(&self, k: &KernelResources) -> Result<Occupancy, OccupancyError> {
        let t = k.threads_per_block;
        if t == 0 || t > self.max_threads_per_block {
            return Err(OccupancyError::BadBlockSize(t));
        }
        if k.registers_per_thread > self.max_registers_per_thread {
            return Err(OccupancyError::TooManyRegisters(k.registers_per_thread));
        }
        if k.shared_bytes_per_block > self.shared_bytes {
            return Err(OccupancyError::TooMuchSharedMemory(
                k.shared_bytes_per_block,
            ));
        }
        let warps = t.div_ceil(32);
        let by_blocks = self.max_blocks;
        let by_warps = (self.max_warps / warps).min(self.max_threads / (warps * 32));
        let rg = self.register_granularity.max(1);
        let regs_per_warp = (k.registers_per_thread * 32).div_ceil(rg) * rg;
        let by_regs = self
            .registers
            .checked_div(regs_per_warp)
            .map_or(u32::MAX, |w| w / warps);
        let sg = self.shared_granularity.max(1);
        let shared = k.shared_bytes_per_block.div_ceil(sg) * sg;
        let by_shared = self.shared_bytes.checked_div(shared).unwrap_or(u32::MAX);
        let (blocks, limiter) = [
            (by_blocks, Limiter::Blocks),
            (by_warps, Limiter::Warps),
            (by_regs, Limiter::Registers),
            (by_shared, Limiter::SharedMemory),
        ]
        .into_iter()
        .min_by_key(|&(n, _)| n)
        .expect("four limits");
        if blocks == 0 {
            return Err(match limiter {
                Limiter::Registers => OccupancyError::TooManyRegisters(k.registers_per_thread),
                Limiter::SharedMemory => {
                    OccupancyError::TooMuchSharedMemory(k.shared_bytes_per_block)
                }
                _ => OccupancyError::BadBlockSize(t),
            });
        }
        Ok(Occupancy {
            blocks_per_sm: blocks,
            warps_per_sm: blocks * warps,
            limiter,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(t: u32, r: u32, s: u32) -> KernelResources {
        KernelResources {
            threads_per_block: t,
            registers_per_thread: r,
            shared_bytes_per_block: s,
        }
    }

    #[test]
    fn each_limit_can_bind() {
        let c = Calculator::maxwell();
        // 256 threads, 32 regs: 8 blocks by warps (64 / 8), registers allow 8 too.
        let o = c.occupancy(&k(256, 32, 0)).unwrap();
        assert_eq!((o.blocks_per_sm, o.warps_per_sm), (8, 64));
        // 64 registers per thread: 65536 / (64*32) = 32 warps = 4 blocks of 8 warps.
        let o = c.occupancy(&k(256, 64, 0)).unwrap();
        assert_eq!(
            (o.blocks_per_sm, o.warps_per_sm, o.limiter),
            (4, 32, Limiter::Registers)
        );
        // 40 KiB of shared memory: 2 blocks.
        let o = c.occupancy(&k(128, 16, 40 << 10)).unwrap();
        assert_eq!((o.blocks_per_sm, o.limiter), (2, Limiter::SharedMemory));
        // Tiny blocks: the block limit.
        let o = c.occupancy(&k(32, 16, 0)).unwrap();
        assert_eq!(
            (o.blocks_per_sm, o.warps_per_sm, o.limiter),
            (32, 32, Limiter::Blocks)
        );
        // Register granularity: 33 registers round up to 36 per thread-warp granule.
        let o = c.occupancy(&k(1024, 33, 0)).unwrap();
        assert_eq!(o.blocks_per_sm, 1);
    }

    #[test]
    fn impossible_kernels_are_typed_errors() {
        let c = Calculator::maxwell();
        assert_eq!(
            c.occupancy(&k(0, 8, 0)),
            Err(OccupancyError::BadBlockSize(0))
        );
        assert_eq!(
            c.occupancy(&k(2048, 8, 0)),
            Err(OccupancyError::BadBlockSize(2048))
        );
        assert_eq!(
            c.occupancy(&k(64, 300, 0)),
            Err(OccupancyError::TooManyRegisters(300))
        );
        assert_eq!(
            c.occupancy(&k(64, 8, 200_000)),
            Err(OccupancyError::TooMuchSharedMemory(200_000))
        );
        assert_eq!(
            c.occupancy(&k(1024, 255, 0)),
            Err(OccupancyError::TooManyRegisters(255))
        );
    }
}
