//! `gmem-regdem`: register demotion (RegDem) into unused GPU shared memory.
//!
//! The seed paper (`papers/regdem.txt`) describes a binary translator that lowers a
//! kernel's register count below an occupancy cliff by moving ("demoting") some
//! registers into shared memory the kernel leaves unused, and a compile-time predictor
//! that picks the best of several code variants. This crate rebuilds it on a model GPU:
//!
//! - [`mod@occupancy`]: the SM resource model of a Maxwell-class GPU and NVIDIA's occupancy
//!   rules (the step cliffs of §2). The SIMT GPU model takes its resident warps from here.
//!
//! The crate is std-only and has no dependency on `gmem-core`: it manages the device's
//! on-chip memory at compile time, not its address spaces.

pub mod compact;
pub mod demote;
pub mod interp;
pub mod ir;
pub mod kernels;
pub mod lang;
pub mod liveness;
pub mod occupancy;
pub mod optimize;
pub mod predict;
pub mod sched;
pub mod sim;
pub mod variants;

pub use occupancy::{occupancy, KernelResources, Limiter, Occupancy, OccupancyError, SmConfig};
