//! The guest CPU's MMU: Intel's extended page tables (EPT) as a codec of the shared
//! page-table engine, and the guest's translation caches.
//!
//! ```text
//!  63..52   51..12          11..10  9  8  7   6    5..3    2  1  0
//!  ignored  frame address   ign.    D  A  PS  IPAT memtype X  W  R
//! ```
//! Four levels translate 48-bit guest-physical addresses (no sign extension: a
//! guest-physical address space starts at 0). An entry is present when any of `R`,
//! `W`, `X` is set; a level-1 or level-2 entry with `PS` is a 2 MiB or 1 GiB leaf;
//! non-leaf entries are fully permissive (`RWX`), leaves carry the permissions and the
//! write-back memory type. `W` without `R` is a misconfiguration in EPT, so a
//! write-only protection is encoded read-write. `A` and `D` are the accessed/dirty
//! flags the hardware sets when EPT A/D is enabled.
//!
//! EPT is the x86 tree with another entry layout, so its format id differs from the
//! CPU's and the core never shares a table between them. The tree, its edits and the
//! walk are the shared engine's ([`gmem_ptengine::Engine`], in host memory through
//! [`gmem_sim::RadixTables`]).

use gmem_core::{PageTableFormat, PhysAddr, Prot};
use gmem_ptengine::{level_shift, level_size, Codec, Entry, Run};
use gmem_sim::{HierarchyConfig, Leaf, RadixTables, Replacement, SimMmu, TlbConfig};

/// The format id of EPT tables.
pub const EPT_FORMAT: PageTableFormat = PageTableFormat(0xe97);

/// Readable.
pub const R: u64 = 1 << 0;
/// Writable.
pub const W: u64 = 1 << 1;
/// Executable.
pub const X: u64 = 1 << 2;
/// Memory type write-back (6) in bits 5..3.
pub const MEMTYPE_WB: u64 = 6 << 3;
/// A leaf above level 0.
pub const PS: u64 = 1 << 7;
/// Accessed.
pub const A: u64 = 1 << 8;
/// Dirty.
pub const D: u64 = 1 << 9;
/// Bits 12..51: the frame or next-table address.
pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
/// Guest-physical addresses are 48 bits wide.
pub const GPA_BITS: u32 = 48;

/// The EPT entry encoding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EptCodec {
    /// Use 2 MiB leaves where a run allows.
    pub large_pages: bool,
}

/// EPT tables in host memory.
pub type EptTables = RadixTables<EptCodec>;

/// The guest CPU's MMU (the EPT walker and its caches).
pub type EptMmu = SimMmu<EptTables>;

fn prot_bits(prot: Prot) -> u64 {
    let mut b = 0;
    if prot.intersects(Prot::READ | Prot::WRITE) {
        b |= R;
    }
    if prot.contains(Prot::WRITE) {
        b |= W;
    }
    if prot.contains(Prot::EXEC) {
        b |= X;
    }
    b
}

impl Codec for EptCodec {
    fn format(&self) -> PageTableFormat {
        EPT_FORMAT
    }
    fn levels(&self) -> u32 {
        4
    }
    fn va_ok(&self, va: u64, len: u64) -> bool {
        len > 0 && va.checked_add(len).is_some_and(|e| e <= 1 << GPA_BITS)
    }
    fn large_levels(&self) -> u32 {
        if self.large_pages {
            1 << 1
        } else {
            0
        }
    }
    fn table(&self, table: PhysAddr) -> Option<u64> {
        (table.as_u64() & !ADDR_MASK == 0).then(|| table.as_u64() | R | W | X)
    }
    fn leaf(&self, frame: PhysAddr, level: u32, run: &Run) -> Option<u64> {
        let f = frame.as_u64();
        if f & !ADDR_MASK != 0 || f % level_size(level) != 0 {
            return None;
        }
        let ps = if level > 0 { PS } else { 0 };
        Some(f | prot_bits(run.prot) | MEMTYPE_WB | ps)
    }
    fn decode(&self, raw: u64, level: u32) -> Entry {
        if raw & (R | W | X) == 0 {
            return Entry::NotPresent;
        }
        let large = raw & PS != 0 && (level == 1 || level == 2);
        if level > 0 && !large {
            return Entry::Table(PhysAddr::new(raw & ADDR_MASK));
        }
        let shift = level_shift(level);
        let mut prot = Prot::empty();
        prot.set(Prot::READ, raw & R != 0);
        prot.set(Prot::WRITE, raw & W != 0);
        prot.set(Prot::EXEC, raw & X != 0);
        Entry::Leaf(Leaf {
            frame: PhysAddr::new(raw & ADDR_MASK & !((1u64 << shift) - 1)),
            shift,
            prot,
            dirty: raw & D != 0,
            local: false,
            bits: 0,
        })
    }
    fn with_prot(&self, raw: u64, prot: Prot, _level: u32) -> Option<u64> {
        Some((raw & !(R | W | X)) | prot_bits(prot))
    }
    fn split(&self, raw: u64, level: u32, i: u64) -> u64 {
        let base = raw & ADDR_MASK & !(level_size(level) - 1);
        let mut flags = raw & !ADDR_MASK & !PS;
        if level > 1 {
            flags |= PS;
        }
        (base + i * level_size(level - 1)) | flags
    }
    fn accessed_bit(&self, _level: u32) -> Option<u64> {
        Some(A)
    }
    fn used(&self, raw: u64, access: Prot) -> u64 {
        if access.contains(Prot::WRITE) {
            raw | A | D
        } else {
            raw | A
        }
    }
}

/// Translation caches for `vcpus` virtual CPUs: a 64-entry 4-way L1 per vCPU, a shared
/// 1024-entry 8-way second level (combined guest-physical mappings) and a 32-entry
/// paging-structure cache, all LRU.
pub fn ept_tlbs(vcpus: usize) -> HierarchyConfig {
    HierarchyConfig {
        units: vcpus,
        l1: TlbConfig::new(16, 4, Replacement::Lru),
        l2: Some(TlbConfig::new(128, 8, Replacement::Lru)),
        walk_cache: Some(TlbConfig::new(1, 32, Replacement::Lru)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gmem_core::DeviceId;

    fn run(prot: Prot) -> Run {
        let memory = Some(DeviceId::from_raw(0, 1));
        Run {
            va: 0,
            pa: 0,
            len: 0x1000,
            prot,
            memory,
            bits: 0,
        }
    }

    #[test]
    fn leaves_encode_and_decode_permissions_size_and_memory_type() {
        let c = EptCodec::default();
        let raw = c
            .leaf(PhysAddr::new(0x1234_5000), 0, &run(Prot::RW))
            .unwrap();
        assert_eq!(raw, 0x1234_5000 | R | W | MEMTYPE_WB);
        assert_eq!(
            c.decode(raw, 0),
            Entry::Leaf(Leaf {
                frame: PhysAddr::new(0x1234_5000),
                shift: 12,
                prot: Prot::RW,
                dirty: false,
                local: false,
                bits: 0,
            })
        );
        let big = c
            .leaf(PhysAddr::new(0x20_0000), 1, &run(Prot::RWX))
            .unwrap();
        assert!(matches!(c.decode(big, 1), Entry::Leaf(l) if l.shift == 21 && l.prot == Prot::RWX));
        assert_eq!(c.leaf(PhysAddr::new(0x21_0000), 1, &run(Prot::RW)), None);
        assert_eq!(c.leaf(PhysAddr::new(1 << 52), 0, &run(Prot::RW)), None);
    }

    #[test]
    fn write_only_is_read_write_and_an_entry_without_rwx_is_not_present() {
        let c = EptCodec::default();
        let raw = c.leaf(PhysAddr::new(0x1000), 0, &run(Prot::WRITE)).unwrap();
        assert_eq!(raw & (R | W | X), R | W);
        assert_eq!(c.decode(0x1000 | MEMTYPE_WB, 0), Entry::NotPresent);
        let t = c.table(PhysAddr::new(0x7000)).unwrap();
        assert_eq!(c.decode(t, 2), Entry::Table(PhysAddr::new(0x7000)));
        // PS at the top level is reserved: still a table pointer.
        assert_eq!(c.decode(t | PS, 3), Entry::Table(PhysAddr::new(0x7000)));
    }

    #[test]
    fn protect_split_and_access_bits_keep_the_frame() {
        let c = EptCodec::default();
        let raw = c.leaf(PhysAddr::new(0x40_0000), 1, &run(Prot::RW)).unwrap();
        let ro = c
            .with_prot(c.used(raw, Prot::WRITE), Prot::READ, 1)
            .unwrap();
        assert_eq!(ro & ADDR_MASK, 0x40_0000);
        assert_eq!(ro & (R | W | X | A | D | PS), R | A | D | PS);
        let part = c.split(raw, 1, 3);
        assert_eq!(part & ADDR_MASK, 0x40_3000);
        assert_eq!(part & PS, 0);
        assert!(matches!(c.decode(part, 0), Entry::Leaf(l) if l.shift == 12));
        assert!(c.va_ok((1 << 48) - 0x1000, 0x1000));
        assert!(!c.va_ok((1 << 48) - 0x1000, 0x2000));
    }
}
