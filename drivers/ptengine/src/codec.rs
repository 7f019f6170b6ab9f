//! What one MMU format is to the engine: the tree's geometry and the entry encoding.
//!
//! A [`Codec`] is plain bit manipulation: it never touches memory. The engine asks it
//! what an entry found at some level means ([`Codec::decode`]) and for the raw bits of
//! the entries it writes (a table pointer, a leaf, a leaf with other permissions, one
//! part of a split large leaf, a leaf the hardware marked accessed or dirty). Two
//! optional hooks carry format state the generic tree does not know about:
//! - **format bits** ([`Leaf::bits`]): opaque bits a leaf is written with
//!   ([`Run::bits`]) and a walk returns, so that a TLB entry keeps them (a per-page
//!   granularity or placement bit);
//! - **derived bits** ([`Codec::derived_levels`], [`Codec::derive`]): bits of an entry
//!   that points to a table, recomputed from that table's entries inside every edit
//!   that changes them (contiguity bits over the leaves below).

use gmem_core::{DeviceId, PageTableFormat, PhysAddr, Prot, VirtAddr};

/// Entries per table page (every supported format: 4 KiB tables of 8-byte entries,
/// nine index bits per level).
pub const ENTRIES: u64 = 512;

/// Bytes one entry of `level` maps (4 KiB at level 0, 2 MiB at 1, 1 GiB at 2).
pub const fn level_size(level: u32) -> u64 {
    1 << (12 + 9 * level)
}

/// `log2(level_size(level))`.
pub const fn level_shift(level: u32) -> u8 {
    (12 + 9 * level) as u8
}

/// Index of `va`'s entry in its table of `level`.
pub const fn index(va: u64, level: u32) -> u64 {
    (va >> (12 + 9 * level)) & (ENTRIES - 1)
}

/// A leaf translation as a walk found it (and a TLB caches it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leaf {
    /// First physical address of the page (aligned to its size).
    pub frame: PhysAddr,
    /// `log2` of the page size (12 for 4 KiB, 21 for 2 MiB).
    pub shift: u8,
    /// Permitted accesses.
    pub prot: Prot,
    /// The entry's dirty bit was set when the leaf was read (a store through a clean
    /// cached leaf walks again to set it, as x86 hardware does). Formats without dirty
    /// tracking report `true`.
    pub dirty: bool,
    /// The frame is in the device's own local memory (a GPU format's aperture bit);
    /// otherwise the physical address is resolved through the machine's memory map.
    pub local: bool,
    /// Format bits the codec keeps in the leaf beyond the above (opaque to the engine):
    /// what a TLB entry must remember of the leaf.
    pub bits: u64,
}

impl Leaf {
    /// The physical address of `va` under this leaf.
    pub fn translate(&self, va: VirtAddr) -> PhysAddr {
        let mask = (1u64 << self.shift) - 1;
        PhysAddr::new(self.frame.as_u64() | (va.as_u64() & mask))
    }
}

/// What an entry means at its level, as a codec decodes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Not valid: nothing below.
    NotPresent,
    /// A pointer to the next-level table.
    Table(PhysAddr),
    /// A leaf (its `shift` says its size).
    Leaf(Leaf),
    /// Valid, but with an encoding the format reserves (or a large leaf whose frame is
    /// misaligned): a walk stops without a translation; an unmap covering the whole
    /// entry clears it; a map into it is an error.
    Reserved,
}

/// A run of pages to map: `len` bytes from `va` onto `pa`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// First virtual address (4 KiB aligned).
    pub va: u64,
    /// First physical address (4 KiB aligned).
    pub pa: u64,
    /// Bytes (a multiple of 4 KiB, not 0).
    pub len: u64,
    /// Permissions of every leaf.
    pub prot: Prot,
    /// The device whose memory holds the frames (for an aperture bit), if the caller
    /// knows one.
    pub memory: Option<DeviceId>,
    /// Format bits for every leaf of the run ([`Leaf::bits`]).
    pub bits: u64,
}

impl Run {
    /// The run of the core's `MapRun`, without format bits.
    pub fn of(run: &gmem_core::MapRun) -> Run {
        Run {
            va: run.va.as_u64(),
            pa: run.pa.as_u64(),
            len: run.len,
            prot: run.prot,
            memory: Some(run.memory),
            bits: 0,
        }
    }
}

/// One format's tree and entry encoding.
pub trait Codec {
    /// The core's format id (equal ids share tables).
    fn format(&self) -> PageTableFormat;
    /// Levels of the tree: the root is level `levels() - 1` (at most 6).
    fn levels(&self) -> u32;
    /// Whether every address of `[va, va + len)` (`len > 0`) can be translated.
    fn va_ok(&self, va: u64, len: u64) -> bool;
    /// The address of the first byte an entry at the top level covers, from the
    /// zero-extended index arithmetic (sign-extends for formats that need it).
    fn extend(&self, va: u64) -> u64 {
        va
    }
    /// Levels above 0 where a map may place large leaves: bit `l` set for level `l`.
    /// A map puts the largest leaf that fits (aligned in both address spaces, covered
    /// whole by the run, on an empty or leaf slot).
    fn large_levels(&self) -> u32 {
        0
    }
    /// An entry pointing to the table at `table`; `None`: the format cannot reach it.
    fn table(&self, table: PhysAddr) -> Option<u64>;
    /// The format bits a run may ask for ([`Run::bits`]); a map asking for others is
    /// refused as `Unsupported` before anything is encoded. Default: none.
    fn format_bits(&self) -> u64 {
        0
    }
    /// A leaf at `level` mapping `frame`, part of `run` (its permissions, memory and
    /// format bits). `None`: not encodable.
    fn leaf(&self, frame: PhysAddr, level: u32, run: &Run) -> Option<u64>;
    /// Decode `raw` found at `level`.
    fn decode(&self, raw: u64, level: u32) -> Entry;
    /// `raw` (a leaf at `level`) with its permissions replaced by `prot`; `None`: the
    /// format cannot express `prot` (the leaf is left as it is).
    fn with_prot(&self, raw: u64, prot: Prot, level: u32) -> Option<u64>;
    /// The level-`level - 1` leaf equal to part `i` of the large leaf `raw` at `level`.
    fn split(&self, raw: u64, level: u32, i: u64) -> u64;
    /// `raw` (a leaf permitting `access`) after the hardware used it: accessed and dirty
    /// bits. The default: formats without them.
    fn used(&self, raw: u64, access: Prot) -> u64 {
        let _ = access;
        raw
    }
    /// The accessed bit of a leaf at `level` (the bit [`Codec::used`] sets on any
    /// permitted access), which [`crate::Engine::test_and_clear_accessed`] reads and
    /// clears; `None` for a format without one (the default).
    fn accessed_bit(&self, level: u32) -> Option<u64> {
        let _ = level;
        None
    }
    /// Levels whose table-pointing entries carry bits derived from the table below
    /// them: bit `l` set for entries at level `l` (`l > 0`). Default: none.
    fn derived_levels(&self) -> u32 {
        0
    }
    /// `entry` (a table pointer at `level`) with its derived bits recomputed from
    /// `below`, the 512 entries of the table it points to. Must depend only on bits
    /// that software edits (never on accessed/dirty bits the hardware sets), so that
    /// the stored bits always equal a recomputation. Default: `entry` unchanged.
    fn derive(&self, entry: u64, level: u32, below: &[u64; ENTRIES as usize]) -> u64 {
        let _ = (level, below);
        entry
    }
}
