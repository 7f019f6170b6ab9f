//! # gmem-adsm: an ADSM/GMAC runtime over gmem
//!
//! The seed paper is Gelado et al., *An Asymmetric Distributed Shared Memory Model for
//! Heterogeneous Parallel Systems* (ASPLOS 2010): the CPU and an accelerator that
//! cannot take page faults share one address space; the CPU side faults, the
//! accelerator side is made valid at kernel calls (release consistency: shared objects
//! are released to the accelerator at `call` and acquired back at `sync`).
//!
//! | module | what it owns |
//! |---|---|
//! | [`machine`] | the simulated machine: host CPU, a discrete GPU that cannot fault, one space |
//! | [`model`] | the time model (parameters, calibration) and the CPU / DMA / GPU timelines |
//! | [`dma`] | transfers between an object's host frames and its device-private frames, through the GPU's copy engine |
//! | [`runtime`] | the ADSM runtime: `alloc`, `free`, `call`, `sync`, `safe_alloc`, `safe`; batch / lazy / rolling |
//! | [`explicit`] | the baseline: two allocations, explicit copies |
//! | [`program`] | the interface both offer to a workload, and what a run measured |
//! | [`workloads`] | the six workloads of `gmem-harness reproduce adsm`, each verified against a CPU-only reference |
//!
//! **What is reconstructed.** The paper's text available to us stops in §4.2: the API,
//! release consistency, the one-pointer allocation and `adsmSafeAlloc`/`adsmSafe` are
//! from the text; the three coherence protocols are only named there. Their rules here
//! (batch copies every object both ways; lazy's invalid / read-only / dirty states kept
//! by page protection; rolling's fixed-size blocks, bounded FIFO of dirty blocks with
//! eager background flushes, on-demand fetch) follow the published paper's description
//! as we recall it, and the time model and its parameters are ours (see [`model`]).

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

pub mod dma;
pub mod explicit;
pub mod machine;
pub mod model;
pub mod program;
pub mod runtime;
pub mod workloads;

pub use explicit::Explicit;
pub use machine::{AdsmError, Machine, MachineConfig};
pub use model::{Breakdown, TimeModel, Timeline};
pub use program::{Buf, Measured, Program};
pub use runtime::{Adsm, Protocol};
