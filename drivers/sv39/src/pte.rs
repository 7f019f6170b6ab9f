//! The Sv39 page-table-entry format and virtual-address layout.
//!
//! ## Theory
//! Sv39 translates 39-bit virtual addresses through three levels of 4 KiB tables of
//! 512 eight-byte entries. Bits 38..30 of the address index the root (level 2), bits
//! 29..21 level 1 and bits 20..12 level 0; bits 63..39 must all equal bit 38 (the
//! address is *canonical*, i.e. sign-extended), which splits the space into a lower
//! half `[0, 2^38)` and an upper half `[2^64 - 2^38, 2^64)`.
//!
//! An entry ([`Pte`]) holds a physical page number in bits 53..10 and flags in bits
//! 7..0 ([`PteFlags`]): `V` valid, `R`/`W`/`X` permissions, `U` user, `G` global,
//! `A` accessed, `D` dirty. A valid entry with `R = W = X = 0` points to the next-level
//! table; any other valid entry is a leaf, at level 0 a 4 KiB page, at level 1 a 2 MiB
//! page and at level 2 a 1 GiB page (the physical address of a large leaf must be
//! aligned to its size). `W` without `R` is reserved, as are bits 63..54 (used by the
//! Svpbmt / Svnapot extensions, which this driver does not use): [`Pte::decode`] reports
//! such entries as [`PteKind::Reserved`].
//!
//! The driver sets `A` on every leaf and `D` on every writable leaf when it installs
//! them, so the hart never needs to update them (hardware that does not update A/D
//! would otherwise raise a page fault the core cannot explain).

use bitflags::bitflags;
use gmem_core::{PhysAddr, Prot, VirtAddr, PAGE_SIZE};

bitflags! {
    /// The flag bits 7..0 of an Sv39 entry.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct PteFlags: u64 {
        /// Valid.
        const V = 1 << 0;
        /// Readable.
        const R = 1 << 1;
        /// Writable.
        const W = 1 << 2;
        /// Executable.
        const X = 1 << 3;
        /// Accessible in U-mode (and, in S-mode, only with `sstatus.SUM`).
        const U = 1 << 4;
        /// Global: present in every address space (not flushed by ASID).
        const G = 1 << 5;
        /// Accessed.
        const A = 1 << 6;
        /// Dirty.
        const D = 1 << 7;
    }
}

/// Number of levels of an Sv39 walk.
pub const LEVELS: usize = 3;
/// Entries per table.
pub const ENTRIES: usize = 512;
/// Bits of a canonical virtual address that are translated.
pub const VA_BITS: u32 = 39;
/// Bits of a physical address an entry can hold (PPN of 44 bits + 12).
pub const PA_BITS: u32 = 56;

const PPN_SHIFT: u32 = 10;
const PPN_MASK: u64 = (1 << 44) - 1;
const RESERVED_MASK: u64 = !((1 << 54) - 1);
const FLAG_MASK: u64 = 0xff;

/// The bytes one entry at `level` maps: 4 KiB, 2 MiB, 1 GiB.
pub const fn level_size(level: usize) -> u64 {
    PAGE_SIZE << (9 * level)
}

/// The index into the table at `level` of virtual address `va`.
pub const fn index(va: u64, level: usize) -> usize {
    ((va >> (12 + 9 * level)) & (ENTRIES as u64 - 1)) as usize
}

/// Whether `va` is canonical for Sv39 (bits 63..39 equal bit 38).
pub const fn is_canonical(va: u64) -> bool {
    (((va << (64 - VA_BITS)) as i64) >> (64 - VA_BITS)) as u64 == va
}

/// Whether `[va, va + len)` is a non-empty range of canonical addresses that does not
/// cross the hole between the two halves.
pub fn is_canonical_range(va: u64, len: u64) -> bool {
    if len == 0 {
        return false;
    }
    let Some(last) = va.checked_add(len - 1) else {
        return false;
    };
    is_canonical(va) && is_canonical(last) && (va >> 63) == (last >> 63)
}

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PteKind {
    /// `V = 0`: nothing is mapped (the other bits are ignored by the hardware).
    Invalid,
    /// A pointer to the next-level table.
    Table(PhysAddr),
    /// A leaf mapping.
    Leaf {
        /// The physical address of the page (aligned to the leaf's size).
        pa: PhysAddr,
        /// The permissions it grants.
        prot: Prot,
        /// All flag bits as stored.
        flags: PteFlags,
    },
    /// A valid entry with a reserved encoding (`W` without `R`, or bits 63..54 set).
    Reserved(u64),
}

/// One Sv39 page-table entry.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Pte(pub u64);

impl core::fmt::Debug for Pte {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Pte({:#x}: {:?})", self.0, self.decode())
    }
}

/// Attributes of a leaf beyond its permissions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeafAttrs {
    /// Set `U` (the page belongs to U-mode).
    pub user: bool,
    /// Set `G` (the mapping is in every address space).
    pub global: bool,
}

impl Pte {
    /// The invalid entry.
    pub const INVALID: Pte = Pte(0);

    /// The flag bits of a leaf granting `prot`, or `None` for an empty `prot` (a valid
    /// entry without R, W and X would be a table pointer). Write implies read (W without
    /// R is reserved); `A` is always set and `D` with `W`.
    pub fn leaf_flags(prot: Prot, attrs: LeafAttrs) -> Option<PteFlags> {
        if prot.is_empty() {
            return None;
        }
        let mut f = PteFlags::V | PteFlags::A;
        if prot.intersects(Prot::READ | Prot::WRITE) {
            f |= PteFlags::R;
        }
        if prot.contains(Prot::WRITE) {
            f |= PteFlags::W | PteFlags::D;
        }
        if prot.contains(Prot::EXEC) {
            f |= PteFlags::X;
        }
        if attrs.user {
            f |= PteFlags::U;
        }
        if attrs.global {
            f |= PteFlags::G;
        }
        Some(f)
    }

    /// A leaf mapping `pa` with `prot`; `None` if `prot` is empty or `pa` is unaligned
    /// or beyond 56 bits.
    pub fn leaf(pa: PhysAddr, prot: Prot, attrs: LeafAttrs) -> Option<Pte> {
        let flags = Pte::leaf_flags(prot, attrs)?;
        Pte::with_ppn(pa, flags)
    }

    /// A pointer to the table at `pa`; `None` if `pa` is unaligned or beyond 56 bits.
    pub fn table(pa: PhysAddr) -> Option<Pte> {
        Pte::with_ppn(pa, PteFlags::V)
    }

    fn with_ppn(pa: PhysAddr, flags: PteFlags) -> Option<Pte> {
        let raw = pa.as_u64();
        if !pa.is_page_aligned() || raw >> PA_BITS != 0 {
            return None;
        }
        Some(Pte(((raw >> 12) << PPN_SHIFT) | flags.bits()))
    }

    /// The physical address in the entry's PPN field.
    pub const fn pa(self) -> PhysAddr {
        PhysAddr::new(((self.0 >> PPN_SHIFT) & PPN_MASK) << 12)
    }

    /// The flag bits.
    pub const fn flags(self) -> PteFlags {
        PteFlags::from_bits_truncate(self.0 & FLAG_MASK)
    }

    /// Whether `V` is set.
    pub const fn is_valid(self) -> bool {
        self.0 & PteFlags::V.bits() != 0
    }

    /// The same entry with its permission (and `A`/`D`) bits replaced to grant `prot`,
    /// keeping the PPN and the `U`/`G` bits; `None` for an empty `prot`.
    pub fn with_prot(self, prot: Prot) -> Option<Pte> {
        let f = self.flags();
        let attrs = LeafAttrs {
            user: f.contains(PteFlags::U),
            global: f.contains(PteFlags::G),
        };
        let flags = Pte::leaf_flags(prot, attrs)?;
        Some(Pte((self.0 & !FLAG_MASK) | flags.bits()))
    }

    /// Decode the entry.
    pub fn decode(self) -> PteKind {
        let f = self.flags();
        if !f.contains(PteFlags::V) {
            return PteKind::Invalid;
        }
        if self.0 & RESERVED_MASK != 0 || (f.contains(PteFlags::W) && !f.contains(PteFlags::R)) {
            return PteKind::Reserved(self.0);
        }
        if !f.intersects(PteFlags::R | PteFlags::W | PteFlags::X) {
            return PteKind::Table(self.pa());
        }
        let mut prot = Prot::empty();
        if f.contains(PteFlags::R) {
            prot |= Prot::READ;
        }
        if f.contains(PteFlags::W) {
            prot |= Prot::WRITE;
        }
        if f.contains(PteFlags::X) {
            prot |= Prot::EXEC;
        }
        PteKind::Leaf {
            pa: self.pa(),
            prot,
            flags: f,
        }
    }
}

/// The canonical virtual address whose low 39 bits are `low` (sign-extends bit 38).
pub const fn sign_extend(low: u64) -> VirtAddr {
    VirtAddr::new((((low << (64 - VA_BITS)) as i64) >> (64 - VA_BITS)) as u64)
}

/// The low 39 bits of `va` (its offset in the translated space).
pub const fn low_bits(va: u64) -> u64 {
    va & ((1 << VA_BITS) - 1)
}
