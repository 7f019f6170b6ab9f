//! The x86-64 entry encoding as a [`Codec`] of the shared page-table engine: what makes
//! the generic radix tree x86-64 tables.
//!
//! Four levels over 48-bit canonical addresses (the upper half sign-extended), `P` for
//! present, `RW`/`NX` for permissions, `US` on leaves of user tables, `PS` for 2 MiB
//! leaves at level 1 (with [`X86Config::large_pages`]), and the walker's `A` and `D`
//! bits. The tree, the edits and the walk are [`gmem_ptengine::Engine`]'s, over
//! whatever memory holds the tables (simulated host memory in gmem-sim, the IOMMU's
//! atomic table memory, or a kernel's physical memory).

use crate::pte::{is_canonical_range, level_size, Decoded, X86Flags, X86Pte, LEVELS};
use gmem_core::{PageTableFormat, PhysAddr, Prot};
use gmem_ptengine::{Codec, Entry, Leaf, Run};

/// The format id of x86-64 4-level tables (`"x86"` + 64): devices with it share tables.
pub const X86_FORMAT: PageTableFormat = PageTableFormat(0x8664);

/// Options of the format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct X86Config {
    /// Set `US` in leaves (user address spaces).
    pub user: bool,
    /// Use 2 MiB leaves where a run allows (and report 2 MiB pages to the core).
    pub large_pages: bool,
    /// Keep MESC's contiguity bits in level-1 table pointers ([`crate::mesc`]),
    /// recomputed inside every edit of the leaves below.
    pub mesc: bool,
    /// Leaves carry [`GRANULARITY_BIT`] as a format bit (CODA's per-page address
    /// mapping mode: a run asks for it in `Run::bits`, a walk returns it in
    /// `Leaf::bits`, so TLB entries keep it).
    pub granularity_bit: bool,
}

/// CODA's granularity bit in a leaf: bit 9, one of the bits x86-64 leaves leave to
/// software. Set: a coarse-grain page (one stack); clear: fine grain (interleaved).
pub const GRANULARITY_BIT: u64 = 1 << 9;

/// The x86-64 encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct X86Codec {
    /// The options.
    pub config: X86Config,
}

impl Codec for X86Codec {
    fn format(&self) -> PageTableFormat {
        X86_FORMAT
    }
    fn levels(&self) -> u32 {
        LEVELS
    }
    fn va_ok(&self, va: u64, len: u64) -> bool {
        is_canonical_range(gmem_core::VirtAddr::new(va), len)
    }
    fn extend(&self, va: u64) -> u64 {
        if va >> 47 & 1 == 1 {
            va | 0xffff_0000_0000_0000
        } else {
            va
        }
    }
    fn large_levels(&self) -> u32 {
        if self.config.large_pages {
            1 << 1
        } else {
            0
        }
    }
    fn table(&self, table: PhysAddr) -> Option<u64> {
        (table.as_u64() & !crate::pte::ADDR_MASK == 0).then(|| X86Pte::table(table).0)
    }
    fn format_bits(&self) -> u64 {
        if self.config.granularity_bit {
            GRANULARITY_BIT
        } else {
            0
        }
    }
    fn leaf(&self, frame: PhysAddr, level: u32, run: &Run) -> Option<u64> {
        X86Pte::leaf(frame, run.prot, self.config.user, level > 0)
            .map(|p| p.0 | (run.bits & self.format_bits()))
    }
    fn decode(&self, raw: u64, level: u32) -> Entry {
        match X86Pte(raw).decode(level) {
            Decoded::NotPresent => Entry::NotPresent,
            Decoded::Table(t) => Entry::Table(t),
            Decoded::Leaf {
                frame,
                shift,
                prot,
                flags,
            } => Entry::Leaf(Leaf {
                frame,
                shift,
                prot,
                dirty: flags.contains(X86Flags::D),
                local: false,
                bits: raw & self.format_bits(),
            }),
        }
    }
    fn with_prot(&self, raw: u64, prot: Prot, _level: u32) -> Option<u64> {
        Some(X86Pte(raw).with_prot(prot).0 | (raw & self.format_bits()))
    }
    fn split(&self, raw: u64, level: u32, i: u64) -> u64 {
        let pte = X86Pte(raw);
        let mut flags = pte.flags();
        flags.set(X86Flags::PS, level > 1);
        let base = pte.addr().as_u64() & !(level_size(level) - 1);
        (base + i * level_size(level - 1)) | flags.bits() | (raw & self.format_bits())
    }
    fn accessed_bit(&self, _level: u32) -> Option<u64> {
        Some(X86Flags::A.bits())
    }
    fn used(&self, raw: u64, access: Prot) -> u64 {
        let mut f = X86Flags::A;
        if access.contains(Prot::WRITE) {
            f |= X86Flags::D;
        }
        raw | f.bits()
    }
    fn derived_levels(&self) -> u32 {
        if self.config.mesc {
            1 << 1
        } else {
            0
        }
    }
    fn derive(&self, entry: u64, level: u32, below: &[u64; 512]) -> u64 {
        if level == 1 && self.config.mesc {
            gmem_ptengine::mesc::derive::<Self>(entry, below)
        } else {
            entry
        }
    }
}
