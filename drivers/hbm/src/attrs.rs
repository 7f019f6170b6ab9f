//! CODA's placement descriptor carried as the core's region attributes (§4.3.2).
//!
//! Before the host first touches an object, the runtime sets its region's attributes
//! from the descriptor (an affine index expression's per-thread-block stride, or a
//! profile of another input): whether the object is localized (coarse grain) and the
//! chunk each thread block touches. A coarse page then belongs to the stack of its
//! chunk, `(va / chunk) mod stacks` — the affinity scheduler sends thread block `b`
//! to stack `b mod stacks`, so chunk `b` of an object aligned to `chunk × stacks` lands
//! where its block runs. Irregular, shared and parameter objects stay fine grain.
//!
//! Encoding in [`gmem_core::Attrs`]: bit 0 the granularity bit, bits 1..=6 `log2` of
//! the chunk in bytes (at least 4 KiB for a coarse object).

use crate::decode::Granularity;
use gmem_core::{Attrs, PAGE_SIZE};

/// A region's CODA descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CodaAttrs {
    /// Localized (coarse grain) or spread (fine grain).
    pub granularity: Granularity,
    /// `log2` of the bytes one thread block touches contiguously (coarse only).
    pub chunk_shift: u8,
}

impl CodaAttrs {
    /// A fine-grain object.
    pub const FINE: CodaAttrs = CodaAttrs {
        granularity: Granularity::Fine,
        chunk_shift: 0,
    };

    /// A coarse-grain object whose thread blocks touch `chunk` bytes each (rounded
    /// up to a power of two of at least 4 KiB).
    pub fn coarse(chunk: u64) -> CodaAttrs {
        let chunk = chunk.max(PAGE_SIZE).next_power_of_two();
        CodaAttrs {
            granularity: Granularity::Coarse,
            chunk_shift: chunk.trailing_zeros() as u8,
        }
    }

    /// The region attributes.
    pub fn encode(self) -> Attrs {
        let coarse = u32::from(self.granularity == Granularity::Coarse);
        Attrs(coarse | (u32::from(self.chunk_shift & 0x3f) << 1))
    }

    /// Read region attributes (anything else than this encoding reads as fine grain).
    pub fn decode(attrs: Attrs) -> CodaAttrs {
        let shift = ((attrs.0 >> 1) & 0x3f) as u8;
        if attrs.0 & 1 == 1 && u64::from(shift) >= u64::from(PAGE_SIZE.trailing_zeros()) {
            CodaAttrs {
                granularity: Granularity::Coarse,
                chunk_shift: shift,
            }
        } else {
            CodaAttrs::FINE
        }
    }

    /// The stack a coarse page at `va` belongs to (`None` for fine grain).
    pub fn stack_of(self, va: u64, stacks: u32) -> Option<u32> {
        (self.granularity == Granularity::Coarse)
            .then(|| ((va >> self.chunk_shift) % u64::from(stacks)) as u32)
    }
}
