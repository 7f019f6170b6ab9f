//! The dual-mode address decode (CODA §4.2, Fig. 5): which stack, and where in it, a
//! physical address lives — decided by the page's granularity bit, never by the
//! address alone.
//!
//! With `N` stacks and fine-grain chunk `C`:
//! - **fine grain** (the bit clear): consecutive `C`-byte chunks go to consecutive
//!   stacks; the stack is `(pa / C) mod N` (the paper's bits 11:10 for `C` = 1 KiB);
//! - **coarse grain** (the bit set): a whole 4 KiB page lives in one stack, the
//!   stack is `(pa / 4 KiB) mod N` (the lowest bits of the page number, bits 13:12).
//!
//! Inside the stack both keep the remaining bits in order. So page group `g` — the `N`
//! frames from `base + g × N × 4 KiB` — occupies bytes `[g × 4 KiB, (g + 1) × 4 KiB)` of
//! *every* stack in either mode: one fine-grain group spreads its four pages across that
//! window of all stacks, one coarse-grain group puts one page in each. Mixing modes
//! inside a group would make two pages share bytes, which is why a group is uniform.

use crate::config::HbmConfig;
use gmem_core::{PhysAddr, PAGE_SIZE};

/// A page's address mapping: the granularity bit of its PTE and TLB entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Granularity {
    /// Interleaved across the stacks (FGP).
    Fine,
    /// Localized in one stack (CGP).
    Coarse,
}

impl Granularity {
    /// The page-group class the core keeps for it (0 fine, 1 coarse).
    pub fn class(self) -> u32 {
        match self {
            Granularity::Fine => 0,
            Granularity::Coarse => 1,
        }
    }

    /// The mode of page-group class `class`.
    pub fn of_class(class: u32) -> Granularity {
        if class == 1 {
            Granularity::Coarse
        } else {
            Granularity::Fine
        }
    }
}

/// Where a byte lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    /// The stack.
    pub stack: u32,
    /// The byte's offset in the stack's array.
    pub offset: u64,
}

/// Decode `pa` under granularity `g`; `None` outside the stacks' memory.
pub fn decode(cfg: &HbmConfig, pa: PhysAddr, g: Granularity) -> Option<Location> {
    let a = pa.as_u64().checked_sub(cfg.base.as_u64())?;
    if a >= cfg.total_bytes() {
        return None;
    }
    let n = u64::from(cfg.stacks);
    let unit = match g {
        Granularity::Fine => cfg.fine_chunk,
        Granularity::Coarse => PAGE_SIZE,
    };
    let shift = unit.trailing_zeros();
    let nshift = n.trailing_zeros();
    let stack = ((a >> shift) & (n - 1)) as u32;
    let offset = ((a >> (shift + nshift)) << shift) | (a & (unit - 1));
    Some(Location { stack, offset })
}

/// How many bytes from `pa` stay in one stack under `g` (up to `len`): a decode holds
/// for a whole chunk (fine) or page (coarse).
pub fn contiguous_len(cfg: &HbmConfig, pa: PhysAddr, g: Granularity, len: u64) -> u64 {
    let unit = match g {
        Granularity::Fine => cfg.fine_chunk,
        Granularity::Coarse => PAGE_SIZE,
    };
    (unit - (pa.as_u64() & (unit - 1))).min(len)
}
