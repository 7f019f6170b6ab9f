//! The x86-64 page-table entry: flag bits, the frame address, and the address layout.
//!
//! ```text
//!  63  62..52  51..12             11..9  8  7   6  5  4   3   2  1  0
//!  NX  avail   frame address      avail  G  PS  D  A  PCD PWT US RW P
//! ```
//! A present entry above level 0 with `PS` clear points to the next table; with `PS`
//! set at level 1 it is a 2 MiB leaf (level 2: 1 GiB). Level-0 entries are 4 KiB
//! leaves. Permissions are the intersection along the walk; this format keeps every
//! non-leaf entry fully permissive (`P | RW | US`, no `NX`) and puts the permissions in
//! the leaf.
//!
//! x86 cannot express every [`Prot`]: a present entry is always readable, so a
//! protection is encoded as the closest one that permits *at least* it (`WRITE` alone
//! becomes read-write) and decoded as what the hardware really allows.

use bitflags::bitflags;
use gmem_core::{PhysAddr, Prot, VirtAddr};
pub use gmem_ptengine::{index, level_shift, level_size, ENTRIES};

bitflags! {
    /// The flag bits of an entry.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct X86Flags: u64 {
        /// Present.
        const P = 1 << 0;
        /// Writable.
        const RW = 1 << 1;
        /// User-accessible.
        const US = 1 << 2;
        /// Page-level write-through.
        const PWT = 1 << 3;
        /// Page-level cache disable.
        const PCD = 1 << 4;
        /// Accessed (set by the walker on use).
        const A = 1 << 5;
        /// Dirty (set by the walker on a store; leaves only).
        const D = 1 << 6;
        /// Page size: a leaf above level 0.
        const PS = 1 << 7;
        /// Global.
        const G = 1 << 8;
        /// No execute.
        const NX = 1 << 63;
    }
}

/// Bits 12..51: the frame address.
pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
/// Physical addresses are 52 bits wide.
pub const PA_BITS: u32 = 52;
/// Virtual addresses are 48 bits wide, sign-extended (4-level paging).
pub const VA_BITS: u32 = 48;
/// Levels: 3 = PML4, 2 = PDPT, 1 = PD, 0 = PT.
pub const LEVELS: u32 = 4;

/// Whether `va` is canonical: bits 63..47 all equal.
pub const fn is_canonical(va: u64) -> bool {
    let top = (va as i64) >> (VA_BITS - 1);
    top == 0 || top == -1
}

/// Whether every address of `[va, va + len)` is canonical (`len > 0`): both ends in
/// the same canonical half.
pub fn is_canonical_range(va: VirtAddr, len: u64) -> bool {
    match va.as_u64().checked_add(len.saturating_sub(1)) {
        Some(last) => {
            is_canonical(va.as_u64()) && is_canonical(last) && (va.as_u64() >> 63) == (last >> 63)
        }
        None => false,
    }
}

/// One 64-bit entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct X86Pte(pub u64);

/// What an entry means at its level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoded {
    /// `P` clear.
    NotPresent,
    /// A pointer to the next-level table.
    Table(PhysAddr),
    /// A leaf.
    Leaf {
        /// The frame (aligned to the leaf's size).
        frame: PhysAddr,
        /// `log2` of the leaf's size.
        shift: u8,
        /// What the hardware permits.
        prot: Prot,
        /// All flag bits.
        flags: X86Flags,
    },
}

impl X86Pte {
    /// Not present.
    pub const EMPTY: X86Pte = X86Pte(0);

    /// A pointer to the table at `table` (page aligned), fully permissive.
    pub fn table(table: PhysAddr) -> X86Pte {
        X86Pte((table.as_u64() & ADDR_MASK) | (X86Flags::P | X86Flags::RW | X86Flags::US).bits())
    }

    /// The flags a leaf with `prot` gets (`user`: set `US`).
    pub fn leaf_flags(prot: Prot, user: bool) -> X86Flags {
        let mut f = X86Flags::P;
        f.set(X86Flags::RW, prot.contains(Prot::WRITE));
        f.set(X86Flags::NX, !prot.contains(Prot::EXEC));
        f.set(X86Flags::US, user);
        f
    }

    /// A leaf mapping `frame` with `prot`; `large` makes it a `PS` leaf (level 1 or 2).
    /// `None` if `frame` is beyond 52 bits or not 4 KiB aligned.
    pub fn leaf(frame: PhysAddr, prot: Prot, user: bool, large: bool) -> Option<X86Pte> {
        if !frame.is_page_aligned() || frame.as_u64() >> PA_BITS != 0 {
            return None;
        }
        let mut f = X86Pte::leaf_flags(prot, user);
        f.set(X86Flags::PS, large);
        Some(X86Pte(frame.as_u64() | f.bits()))
    }

    /// The flag bits (unknown bits dropped).
    pub fn flags(self) -> X86Flags {
        X86Flags::from_bits_truncate(self.0)
    }

    /// Whether `P` is set.
    pub fn is_present(self) -> bool {
        self.0 & X86Flags::P.bits() != 0
    }

    /// The address bits 12..51.
    pub fn addr(self) -> PhysAddr {
        PhysAddr::new(self.0 & ADDR_MASK)
    }

    /// What the hardware permits through this leaf.
    pub fn prot(self) -> Prot {
        let f = self.flags();
        let mut p = Prot::READ;
        p.set(Prot::WRITE, f.contains(X86Flags::RW));
        p.set(Prot::EXEC, !f.contains(X86Flags::NX));
        p
    }

    /// The same entry with its permission bits (`RW`, `NX`) set for `prot`; frame,
    /// `PS`, `US`, `A` and `D` are kept.
    pub fn with_prot(self, prot: Prot) -> X86Pte {
        let mut f = self.flags();
        f.set(X86Flags::RW, prot.contains(Prot::WRITE));
        f.set(X86Flags::NX, !prot.contains(Prot::EXEC));
        X86Pte((self.0 & ADDR_MASK) | f.bits())
    }

    /// The entry's meaning at `level` (0 = PT). A `PS` bit at level 3 (reserved) or
    /// level 0 (PAT for 4 KiB leaves: ignored here) does not make a leaf bigger.
    pub fn decode(self, level: u32) -> Decoded {
        if !self.is_present() {
            return Decoded::NotPresent;
        }
        let large = self.flags().contains(X86Flags::PS) && (level == 1 || level == 2);
        if level > 0 && !large {
            return Decoded::Table(self.addr());
        }
        let shift = level_shift(level);
        // For large leaves bit 12 is PAT; the frame is the address aligned to the size.
        let frame = PhysAddr::new(self.addr().as_u64() & !((1u64 << shift) - 1));
        Decoded::Leaf {
            frame,
            shift,
            prot: self.prot(),
            flags: self.flags(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_encode_and_decode_frame_permissions_and_size() {
        let pte = X86Pte::leaf(PhysAddr::new(0x1234_5000), Prot::RW, true, false).unwrap();
        assert_eq!(pte.0, 0x8000_0000_1234_5000 | 0b111);
        assert_eq!(
            pte.decode(0),
            Decoded::Leaf {
                frame: PhysAddr::new(0x1234_5000),
                shift: 12,
                prot: Prot::RW,
                flags: X86Flags::P | X86Flags::RW | X86Flags::US | X86Flags::NX
            }
        );
        let ro = X86Pte::leaf(
            PhysAddr::new(0x20_0000),
            Prot::READ | Prot::EXEC,
            false,
            true,
        )
        .unwrap();
        assert_eq!(ro.0, 0x20_0000 | 0x81);
        assert!(
            matches!(ro.decode(1), Decoded::Leaf { shift: 21, prot, .. } if prot == Prot::READ | Prot::EXEC)
        );
        // The same bits at level 2 are a 1 GiB leaf; at level 3 PS is not a leaf.
        assert!(
            matches!(ro.decode(2), Decoded::Leaf { shift: 30, frame, .. } if frame.as_u64() == 0)
        );
        assert_eq!(ro.decode(3), Decoded::Table(PhysAddr::new(0x20_0000)));
    }

    #[test]
    fn write_only_is_encoded_as_read_write_and_decoded_as_what_the_hardware_allows() {
        let pte = X86Pte::leaf(PhysAddr::new(0x1000), Prot::WRITE, false, false).unwrap();
        assert_eq!(pte.prot(), Prot::RW);
    }

    #[test]
    fn tables_are_permissive_and_protect_keeps_frame_and_access_bits() {
        let t = X86Pte::table(PhysAddr::new(0x7000));
        assert_eq!(t.decode(2), Decoded::Table(PhysAddr::new(0x7000)));
        assert_eq!(t.flags(), X86Flags::P | X86Flags::RW | X86Flags::US);
        let leaf = X86Pte(
            X86Pte::leaf(PhysAddr::new(0x9000), Prot::RW, true, false)
                .unwrap()
                .0
                | (X86Flags::A | X86Flags::D).bits(),
        );
        let ro = leaf.with_prot(Prot::READ);
        assert_eq!(ro.addr(), PhysAddr::new(0x9000));
        assert_eq!(ro.prot(), Prot::READ);
        assert!(ro
            .flags()
            .contains(X86Flags::A | X86Flags::D | X86Flags::US | X86Flags::NX));
    }

    #[test]
    fn bad_frames_and_absent_entries() {
        assert_eq!(
            X86Pte::leaf(PhysAddr::new(0x1800), Prot::RW, false, false),
            None
        );
        assert_eq!(
            X86Pte::leaf(PhysAddr::new(1 << 52), Prot::RW, false, false),
            None
        );
        assert_eq!(X86Pte(0x1000 | 0b110).decode(0), Decoded::NotPresent);
    }

    #[test]
    fn address_layout_and_canonical_checks() {
        let va = 0x0000_7f12_3456_7000u64;
        assert_eq!(index(va, 3), 0xfe);
        assert_eq!(index(va, 2), 0x48);
        assert_eq!(index(va, 1), 0x1a2);
        assert_eq!(index(va, 0), 0x167);
        assert_eq!(level_size(1), 2 << 20);
        assert!(is_canonical(0x7fff_ffff_ffff) && is_canonical(0xffff_8000_0000_0000));
        assert!(!is_canonical(0x8000_0000_0000));
        assert!(!is_canonical_range(VirtAddr::new(0x7fff_ffff_f000), 0x2000));
        assert!(is_canonical_range(VirtAddr::new(0x7fff_ffff_e000), 0x2000));
    }
}
