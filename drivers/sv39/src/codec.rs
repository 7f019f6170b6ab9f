//! The Sv39 entry format as a [`Codec`] of the shared page-table engine.
//!
//! Three levels over canonical 39-bit addresses (sign-extended from bit 38), 4 KiB
//! leaves, 2 MiB and 1 GiB leaves at levels 1 and 2 (used for the kernel's global
//! mappings). A leaf's format bits ([`gmem_ptengine::Leaf::bits`], [`Run::bits`]) are
//! its flag bits 7..0: a map asks for `U` and `G` through them, a walk returns all of
//! `V/R/W/X/U/G/A/D`. Entries the hart would fault on are [`Entry::Reserved`]: a
//! reserved encoding ([`PteKind::Reserved`]), a table pointer at level 0, or a large
//! leaf whose frame is not aligned to its size.
//!
//! [`Run::bits`]: gmem_ptengine::Run::bits

use crate::driver::SV39_FORMAT;
use crate::pte::{is_canonical_range, sign_extend, LeafAttrs, Pte, PteFlags, PteKind, LEVELS};
use gmem_core::{PageTableFormat, PhysAddr, Prot};
use gmem_ptengine::{level_shift, level_size, Codec, Entry, Leaf, Run};

/// The Sv39 encoding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sv39Codec;

impl Codec for Sv39Codec {
    fn format(&self) -> PageTableFormat {
        SV39_FORMAT
    }
    fn levels(&self) -> u32 {
        LEVELS as u32
    }
    fn va_ok(&self, va: u64, len: u64) -> bool {
        is_canonical_range(va, len)
    }
    fn extend(&self, va: u64) -> u64 {
        sign_extend(va).as_u64()
    }
    fn large_levels(&self) -> u32 {
        0b110
    }
    fn table(&self, table: PhysAddr) -> Option<u64> {
        Pte::table(table).map(|p| p.0)
    }
    fn format_bits(&self) -> u64 {
        (PteFlags::U | PteFlags::G).bits()
    }
    fn leaf(&self, frame: PhysAddr, level: u32, run: &Run) -> Option<u64> {
        if frame.as_u64() % level_size(level) != 0 {
            return None;
        }
        let attrs = LeafAttrs {
            user: run.bits & PteFlags::U.bits() != 0,
            global: run.bits & PteFlags::G.bits() != 0,
        };
        Pte::leaf(frame, run.prot, attrs).map(|p| p.0)
    }
    fn decode(&self, raw: u64, level: u32) -> Entry {
        match Pte(raw).decode() {
            PteKind::Invalid => Entry::NotPresent,
            PteKind::Table(t) if level > 0 => Entry::Table(t),
            PteKind::Leaf { pa, prot, flags } if pa.as_u64() % level_size(level) == 0 => {
                Entry::Leaf(Leaf {
                    frame: pa,
                    shift: level_shift(level),
                    prot,
                    dirty: flags.contains(PteFlags::D),
                    local: false,
                    bits: flags.bits(),
                })
            }
            _ => Entry::Reserved,
        }
    }
    fn with_prot(&self, raw: u64, prot: Prot, _level: u32) -> Option<u64> {
        Pte(raw).with_prot(prot).map(|p| p.0)
    }
    fn split(&self, raw: u64, level: u32, i: u64) -> u64 {
        let pte = Pte(raw);
        let part = PhysAddr::new(pte.pa().as_u64() + i * level_size(level - 1));
        // Same flags, the part's PPN (the split of a valid leaf stays encodable).
        Pte::leaf(part, Prot::READ, LeafAttrs::default())
            .map_or(0, |p| (p.0 & !0xff) | pte.flags().bits())
    }
}
