//! Occupancy: how many thread blocks (and so warps) of a kernel a compute unit holds.
//!
//! The calculation is `gmem-regdem`'s (NVIDIA's occupancy rules for a Maxwell-class SM:
//! warp slots, block slots, the register file in per-warp allocation units split over
//! the warp schedulers, shared memory in allocation units). The engine sees it through
//! [`OccupancyModel`], so another calculator (another GPU generation, a fixed warp count
//! for a sweep) plugs in without touching the engine.

pub use gmem_regdem::{KernelResources, Limiter, Occupancy, OccupancyError, SmConfig};

/// Something that computes occupancy.
pub trait OccupancyModel {
    /// Blocks and warps of a kernel with `k` resident on one unit.
    ///
    /// # Errors
    /// An [`OccupancyError`] when not even one block fits (or the model is malformed).
    fn occupancy(&self, k: &KernelResources) -> Result<Occupancy, OccupancyError>;
}

impl OccupancyModel for SmConfig {
    fn occupancy(&self, k: &KernelResources) -> Result<Occupancy, OccupancyError> {
        gmem_regdem::occupancy(self, k)
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
    fn the_simt_kernels_resident_warps_follow_the_maxwell_rules() {
        let sm = SmConfig::maxwell();
        // The SIMT workloads: 256 threads, 32 or 24 registers: 64 warps (100%).
        for r in [24, 32] {
            let o = sm.occupancy(&k(256, r, 0)).unwrap();
            assert_eq!((o.blocks_per_sm, o.warps_per_sm), (8, 64));
        }
        // 64 registers halve it; 40 KiB of shared memory leaves 2 blocks.
        assert_eq!(sm.occupancy(&k(256, 64, 0)).unwrap().warps_per_sm, 32);
        let o = sm.occupancy(&k(128, 16, 40 << 10)).unwrap();
        assert_eq!((o.blocks_per_sm, o.limiter), (2, Limiter::SharedMemory));
        assert!(sm.occupancy(&k(0, 8, 0)).is_err());
        assert!(sm.occupancy(&k(64, 8, 1 << 20)).is_err());
    }
}
