//! `gmem-regdem`: register demotion (RegDem) into unused GPU shared memory.
//!
//! The seed paper (`papers/regdem.txt`) describes a binary translator that lowers a
//! kernel's register count below an occupancy cliff by moving ("demoting") some
//! registers into shared memory the kernel leaves unused, and a compile-time predictor
//! that picks the best of several code variants. The text stops at §4 Eq. 2 and has no
//! evaluation; what we rebuilt from prose is marked where it lives (Eq. 1's layout in
//! [`demote`], Eq. 2 in [`predict`], the tracker's lookahead in [`sched`]).
//!
//! Modules, in the order a kernel flows through them:
//! - [`mod@occupancy`]: the SM resource model of a Maxwell-class GPU and NVIDIA's occupancy
//!   rules (the step cliffs of §2). The SIMT GPU model takes its resident warps from here.
//! - [`ir`]: the SASS-like IR (blocks, counted loops, registers and aligned pairs, stall
//!   counts, read/write barriers and wait masks).
//! - [`lang`]: the kernel language (a builder with an unroll-friendly API), the register
//!   allocator, and [`sched`]: stall counts and barriers with the barrier tracker.
//! - [`kernels`]: the benchmarks with their CPU references.
//! - [`liveness`]: register liveness and the maximum-live bound.
//! - [`demote`]: the demotion pass (§3.2, §3.4.3), [`optimize`] (§3.4.2) and
//!   [`compact`] (§3.3, §3.4.1).
//! - [`predict`]: the stall-based predictor (§4).
//! - [`interp`] and [`sim`]: the ground truth — an interpreter for bit-identical outputs
//!   and a cycle-level SM simulator (poisoned reads, bank conflicts, latencies).
//! - [`variants`]: the candidate binaries and their evaluation.
//!
//! The crate is std-only and has no dependency on `gmem-core`: it manages the device's
//! on-chip memory at compile time, not its address spaces.

#![deny(missing_docs)]
#![warn(clippy::missing_errors_doc)]

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
