//! # gmem-simt: a SIMT GPU model in which address translation matters
//!
//! Kernels launch as a grid of thread blocks; each compute unit holds as many warps as
//! the occupancy calculation allows; a warp's 32 lanes run in lockstep with an active
//! mask; warps issue round-robin (or by another [`dispatch::WarpScheduler`]); each memory
//! instruction's lane addresses are coalesced into 128-byte transactions and each
//! distinct page among them is one translation request through the device's MMU of
//! `gmem-sim` (per-unit L1 TLB, shared TLB, page-walk cache, a walk of the real table in
//! simulated memory, a fault served by gmem-core). A cost model turns a run into cycles.
//!
//! | module | owns |
//! |---|---|
//! | [`caches`] | the pluggable translation-cache trait ([`caches::GpuCaches`]) and the set-associative run array |
//! | [`coalesce`] | lane addresses → 128-byte transactions → distinct pages |
//! | [`occupancy`] | blocks and warps per unit ([`occupancy::OccupancyModel`]) |
//! | [`dispatch`] | block dispatch (greedy, round-robin, affinity) and warp schedulers |
//! | [`kernel`] | the kernel representation: warp programs yielding instructions |
//! | [`cost`] | the cost model and its calibration |
//! | [`engine`] | the SIMT engine |
//! | [`machine`] | host CPU + GPU + one gmem address space, the MESC geometry |
//! | [`mesc`] | the MESC paper's six designs (base, CoLT, full CoLT, THP, MESC, MESC+CoLT) as pluggable caches |
//! | [`workloads`] | Polybench, Rodinia-style and graph workloads, verified |
//!
//! The translation stream of a run can be recorded ([`machine::SimtMachine::start_recording`])
//! and replayed offline through any cache organisation with [`gmem_sim::replay()`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

mod access;
pub mod caches;
pub mod coalesce;
pub mod cost;
mod datacache;
pub mod dispatch;
mod earliest;
pub mod engine;
pub mod kernel;
pub mod machine;
pub mod mesc;
pub mod occupancy;
mod timing;
mod wakes;
pub mod workloads;
