//! # gmem-hbm: CODA's near-data-processing machine
//!
//! The memory system of Kim et al., "Toward standardized near-data processing with
//! unrestricted data placement for GPUs" (CODA, SC'17), §4-5: several HBM stacks, each
//! with near-data SMs, reached by the host over its links and by each other over slow
//! stack-to-stack links. Memory holds real bytes: one byte array per stack, behind the
//! *dual-mode address decode* of §4.2, so that a placement or decode mistake corrupts
//! data and fails verification.
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | the machine: stacks, SMs per stack, bytes per stack, the fine-grain chunk, bandwidths (printed by experiments) |
//! | [`decode`](mod@decode) | the dual-mode decode: a fine-grain page interleaves chunks across the stacks, a coarse-grain page lives in one stack; a *page group* of one frame per stack is the unit both modes tile alike |
//! | [`attrs`] | CODA's placement descriptor as the core's region attributes: the granularity bit and the chunk each thread block touches, hence each coarse page's stack |
//! | [`mmu`] | [`HbmTables`]: the table host and SMs share, x86-64 leaves carrying each frame's granularity bit (so TLB entries keep it) |
//! | [`placement`] | the fine/coarse decision and each stack's chunk from an affine index expression (standing in for the paper's compiler pass) or a profile of another input |
//! | [`memory`] | [`HbmMemory`]: the stacks' bytes as the core's `DeviceMemory` (zero, read, write, copy by the group's mode), the page-group classes the core announces, the frame requests that put a coarse page in its stack, and the access path of the SMs and the host (routed by the granularity bit of the translation that served them) with traffic accounting |
//! | [`machine`] | [`HbmMachine`]: the whole system as one gmem instance — stacks, one shared table walked by one MMU whose units are the SMs and the host, one space; loads and stores routed by the bit; page migration between stacks |
//! | [`dcache`] | the SMs' data caches: per-SM L1, per-stack L2 beside the SMs, 128-byte lines whose granularity bit routes their write-backs; they filter traffic accounting, the bytes always move through memory |
//! | [`cost`] | the cost model pricing counted traffic and work: bandwidth bounds, a per-SM issue/latency bound (near-data kernels), host-side windows |
//! | [`exec`] | the block-sequential executor: round-robin, affinity or host schedules; Fig. 3's pages-by-blocks record; first-touch migration; profiles |
//! | [`workloads`], [`graphs`], [`hotspot2d`], [`gaussian`] | the verified workloads and their descriptors |
//! | [`coda`] | the six configurations of the experiment and CODA's placement plan |
//!
//! How it meets the core: the device's memory is managed in page groups of
//! `2^log2(stacks)` frames ([`gmem_core::Gmem::dev_set_page_groups`]); a frame request's
//! class is the pages' granularity bit (from their region attributes), so a group is
//! always wholly fine or wholly coarse and changes mode only when all its frames are
//! free — exactly the rule §4.2 states ("each block of N contiguous pages must uniformly
//! be configured as FGP or CGP").
//!
//! Rebuilt from an incomplete paper text (its Tables 1-2 and Eqs. 1-3 were images): the
//! fine-grain chunk is a parameter (128 bytes by default, as the issue asks; the paper's
//! example interleaves on bits 11:10, 1 KiB), the chunk-to-stack rule of a coarse object
//! (`chunk index mod stacks`, with objects aligned to `chunk × stacks`), and the
//! bandwidth defaults (256 GB/s local, 128 GB/s host, 16 GB/s stack to stack, §5's
//! prose).

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

extern crate alloc;

pub mod attrs;
pub mod coda;
#[cfg(test)]
mod coda_tests;
pub mod config;
pub mod cost;
pub mod dcache;
pub mod decode;
pub mod exec;
pub mod gaussian;
pub mod graphs;
pub mod hotspot2d;
pub mod machine;
pub mod memory;
pub mod mmu;
pub mod placement;
#[cfg(test)]
mod tests;
pub mod workloads;

pub use attrs::CodaAttrs;
pub use config::{CacheModel, HbmConfig, SmModel};
pub use decode::{decode, Granularity, Location};
pub use machine::{HbmMachine, MachineError};
pub use memory::{HbmMemory, Requester, Traffic};
pub use mmu::{granularity_of, HbmTables, HBM_FORMAT};
