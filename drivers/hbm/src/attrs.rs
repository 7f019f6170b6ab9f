//! CODA's placement descriptor carried as the core's region attributes (§4.3.2).
//!
//! Before the host first touches an object, the runtime sets its region's attributes
//! from the descriptor ([`crate::placement`]: an affine index expression's
//! per-thread-block stride, or a profile of another input): whether the object is
//! localized (coarse grain) and the chunk of bytes each stack gets. A coarse page then
//! belongs to the stack of its chunk, `((va - base) / chunk) mod stacks` (the paper's
//! Eq. 3, rebuilt: its equations were images) — the affinity scheduler sends the thread
//! blocks of chunk `c` to stack `c mod stacks`, so data lands where its blocks run.
//! Irregular, shared and parameter objects stay fine grain.
//!
//! Encoding in [`gmem_core::Attrs`] (the core stores it per page and hands it to every
//! frame request): bit 0 the granularity bit; bits 1..=12 the chunk in pages (1..=4095);
//! bits 13..=24 the object's first page modulo the chunk; bits 25..=27 the object's
//! first chunk number modulo the stacks. The last two make the stack of a page
//! computable from its address alone, wherever the object starts.

use crate::decode::Granularity;
use gmem_core::{Attrs, PAGE_SIZE};

/// The largest chunk the encoding holds, in pages.
pub const MAX_CHUNK_PAGES: u64 = 4095;

/// A region's CODA descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CodaAttrs {
    /// Localized (coarse grain) or spread (fine grain).
    pub granularity: Granularity,
    /// Pages of one stack's chunk (coarse only; 0 for fine grain).
    pub chunk_pages: u16,
    /// The object's first page modulo `chunk_pages`.
    pub base_offset: u16,
    /// The object's first chunk number modulo the stacks.
    pub base_turn: u8,
}

impl CodaAttrs {
    /// A fine-grain object.
    pub const FINE: CodaAttrs = CodaAttrs {
        granularity: Granularity::Fine,
        chunk_pages: 0,
        base_offset: 0,
        base_turn: 0,
    };

    /// A coarse-grain object starting at `base` whose stacks get `chunk` bytes each
    /// (rounded up to whole pages, as the paper rounds; at most
    /// [`MAX_CHUNK_PAGES`] pages), among `stacks` stacks (at most 8).
    pub fn coarse(base: u64, chunk: u64, stacks: u32) -> CodaAttrs {
        let pages = chunk.div_ceil(PAGE_SIZE).clamp(1, MAX_CHUNK_PAGES);
        let first = base / PAGE_SIZE;
        CodaAttrs {
            granularity: Granularity::Coarse,
            chunk_pages: pages as u16,
            base_offset: (first % pages) as u16,
            base_turn: ((first / pages) % u64::from(stacks.clamp(1, 8))) as u8,
        }
    }

    /// The region attributes.
    pub fn encode(self) -> Attrs {
        if self.granularity == Granularity::Fine {
            return Attrs(0);
        }
        Attrs(
            1 | (u32::from(self.chunk_pages & 0xfff) << 1)
                | (u32::from(self.base_offset & 0xfff) << 13)
                | (u32::from(self.base_turn & 0x7) << 25),
        )
    }

    /// Read region attributes (anything but a coarse encoding with a chunk reads as
    /// fine grain).
    pub fn decode(attrs: Attrs) -> CodaAttrs {
        let chunk_pages = ((attrs.0 >> 1) & 0xfff) as u16;
        if attrs.0 & 1 == 0 || chunk_pages == 0 {
            return CodaAttrs::FINE;
        }
        CodaAttrs {
            granularity: Granularity::Coarse,
            chunk_pages,
            base_offset: ((attrs.0 >> 13) & 0xfff) as u16 % chunk_pages,
            base_turn: ((attrs.0 >> 25) & 0x7) as u8,
        }
    }

    /// The stack a coarse page at `va` belongs to (`None` for fine grain).
    pub fn stack_of(self, va: u64, stacks: u32) -> Option<u32> {
        if self.granularity != Granularity::Coarse || self.chunk_pages == 0 {
            return None;
        }
        let n = u64::from(stacks);
        let pages = u64::from(self.chunk_pages);
        // Chunks counted on the grid through the object's first page; the object's
        // first chunk is number `base_turn` (mod stacks) of that grid, and goes to
        // stack 0.
        let chunk = (va / PAGE_SIZE).wrapping_sub(u64::from(self.base_offset)) / pages;
        let turn = u64::from(self.base_turn) % n;
        Some(((chunk % n + n - turn) % n) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_object_start_gives_its_first_chunk_stack_0_and_round_robin_after() {
        for base_page in [0u64, 1, 5, 12, 1000, 4097] {
            for chunk_pages in [1u64, 3, 4, 7] {
                let base = base_page * PAGE_SIZE;
                let a = CodaAttrs::coarse(base, chunk_pages * PAGE_SIZE, 4);
                assert_eq!(CodaAttrs::decode(a.encode()), a);
                for p in 0..40 {
                    let want = ((p / chunk_pages) % 4) as u32;
                    assert_eq!(
                        a.stack_of(base + p * PAGE_SIZE + 17, 4),
                        Some(want),
                        "base page {base_page}, chunk {chunk_pages}, page {p}"
                    );
                }
            }
        }
        assert_eq!(CodaAttrs::decode(Attrs(0)), CodaAttrs::FINE);
        assert_eq!(CodaAttrs::FINE.stack_of(0, 4), None);
        // A partial page of chunk rounds up to a whole page (the paper's rounding).
        assert_eq!(CodaAttrs::coarse(0, 5000, 4).chunk_pages, 2);
    }
}
