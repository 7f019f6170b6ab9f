//! MESC's contiguity bits in x86-64 tables (Li et al., "MESC: memory-subregion
//! contiguity for GPU address translation", §IV): x86-64 as a
//! [`MescFormat`] — bits 52..=60 of a level-1 table
//! pointer are ignored by the hardware, a present leaf has `P`, the walker sets `A`
//! and `D`. The bits, their upkeep, Alg. 1's scan, the walk modes and CoLT are the
//! shared engine's ([`gmem_ptengine::mesc`], re-exported here), kept in
//! x86-64 tables when [`X86Config::mesc`](crate::X86Config::mesc) is set.

pub use gmem_ptengine::mesc::*;

use crate::pte::{X86Flags, ADDR_MASK};
use crate::X86Codec;

impl MescFormat for X86Codec {
    const LEAF_ADDR: u64 = ADDR_MASK;
    const LEAF_PRESENT: u64 = X86Flags::P.bits();
    const WALKER_BITS: u64 = X86Flags::A.bits() | X86Flags::D.bits();
}
