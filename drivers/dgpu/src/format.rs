//! The discrete GPU's page-table format: three levels, 4 KiB pages, an aperture bit,
//! an accessed bit.
//!
//! ```text
//!  63..52   51..12           11..6  5         4  3  2  1         0
//!  ignored  frame address    zero   ACCESSED  X  W  R  APERTURE  VALID
//! ```
//! The walker sets **accessed** (with a compare-exchange) on a leaf it uses; the core's
//! CLOCK eviction reads and clears it. (Our model: the GMEM paper's GPU is a simulated
//! one, and real GPUs track use with access counters rather than PTE bits; an accessed
//! bit is the simplest hardware that gives the core a per-page reference signal.)
//! Three levels of 512-entry tables translate 39-bit virtual addresses (512 GiB);
//! entries at levels 2 and 1 point to tables, level-0 entries are 4 KiB leaves. A
//! leaf's **aperture** says which bus the frame is on: set, the GPU's own video memory;
//! clear, system memory (host DRAM or a peer's memory behind its BAR), resolved through
//! the machine's memory map. The driver picks it from `MapRun::memory`: the run is local
//! when the core placed it in this GPU's memory. Because the aperture is relative to the
//! GPU, two GPUs never share a table: each instance has its own format id.
//!
//! With MESC ([`GpuCodec::with_mesc`]) a level-1 table pointer also keeps the
//! contiguity bits of the 512 leaves below it in its ignored bits 52..=60, kept by the
//! engine as derived bits ([`gmem_ptengine::mesc`], the same computation as in x86-64
//! tables): bit `52 + i` says subregion `i` (64 pages) maps consecutive frames with the
//! same permissions and aperture, bit 60 says the whole 2 MiB does.
//!
//! The tables live in the GPU's video memory, from a frame pool the core does not
//! manage. The tree, its edits and the walk are the shared engine's
//! ([`gmem_ptengine::Engine`], in video memory through [`gmem_sim::RadixTables`]); this
//! module is the entry encoding.

use gmem_core::{DeviceId, PageTableFormat, PhysAddr, Prot};
use gmem_ptengine::mesc::{self, MescFormat};
use gmem_ptengine::{Codec, Entry, Leaf, Run};
use gmem_sim::RadixTables;
use std::sync::OnceLock;

/// Valid.
pub const VALID: u64 = 1 << 0;
/// Leaf in the GPU's video memory (clear: system memory).
pub const APERTURE_LOCAL: u64 = 1 << 1;
/// Readable.
pub const READ: u64 = 1 << 2;
/// Accessed: set by the walker on a leaf it used, cleared by the core's eviction scan.
pub const ACCESSED: u64 = 1 << 5;
/// Writable.
pub const WRITE: u64 = 1 << 3;
/// Executable (instruction fetch by shaders).
pub const EXEC: u64 = 1 << 4;
/// Bits 12..51: the frame or next-table address.
pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
/// Virtual addresses the format translates: `[0, 2^39)`.
pub const VA_BITS: u32 = 39;

/// The GPU format, for one GPU instance.
#[derive(Debug)]
pub struct GpuCodec {
    instance: u32,
    mesc: bool,
    me: OnceLock<DeviceId>,
}

/// A discrete GPU's tables in its video memory.
pub type GpuTables = RadixTables<GpuCodec>;

impl GpuCodec {
    /// The codec of GPU number `instance` (its format id is unique to it).
    pub fn new(instance: u32) -> GpuCodec {
        GpuCodec {
            instance,
            mesc: false,
            me: OnceLock::new(),
        }
    }

    /// The codec of GPU number `instance` keeping MESC's contiguity bits in its
    /// level-1 table pointers.
    pub fn with_mesc(instance: u32) -> GpuCodec {
        GpuCodec {
            mesc: true,
            ..GpuCodec::new(instance)
        }
    }

    /// Whether the tables keep MESC's contiguity bits.
    pub fn mesc(&self) -> bool {
        self.mesc
    }

    /// Learn the core's id of this GPU: runs placed in that device's memory get the
    /// local aperture.
    ///
    /// # Errors
    /// The id already learnt, when this codec was bound before (the first binding
    /// stays).
    pub fn bind(&self, me: DeviceId) -> Result<(), DeviceId> {
        self.me.set(me).map_err(|_| *self.me.get().expect("set"))
    }

    /// A leaf entry.
    pub fn encode_leaf(frame: PhysAddr, prot: Prot, local: bool) -> Option<u64> {
        if !frame.is_page_aligned() || frame.as_u64() & !ADDR_MASK != 0 {
            return None;
        }
        let mut raw = frame.as_u64() | VALID;
        if local {
            raw |= APERTURE_LOCAL;
        }
        Some(raw | prot_bits(prot))
    }
}

fn prot_bits(prot: Prot) -> u64 {
    let mut b = 0;
    if prot.contains(Prot::READ) {
        b |= READ;
    }
    if prot.contains(Prot::WRITE) {
        b |= WRITE;
    }
    if prot.contains(Prot::EXEC) {
        b |= EXEC;
    }
    b
}

impl Codec for GpuCodec {
    fn format(&self) -> PageTableFormat {
        PageTableFormat(0x6470_0000 | (self.instance & 0xffff))
    }
    fn levels(&self) -> u32 {
        3
    }
    fn va_ok(&self, va: u64, len: u64) -> bool {
        len > 0 && matches!(va.checked_add(len), Some(end) if end <= 1 << VA_BITS)
    }
    fn table(&self, table: PhysAddr) -> Option<u64> {
        (table.as_u64() & !ADDR_MASK == 0).then(|| table.as_u64() | VALID)
    }
    fn leaf(&self, frame: PhysAddr, _: u32, run: &Run) -> Option<u64> {
        let local = run.memory.is_some_and(|m| self.me.get() == Some(&m));
        GpuCodec::encode_leaf(frame, run.prot, local)
    }
    fn decode(&self, raw: u64, level: u32) -> Entry {
        if raw & VALID == 0 {
            return Entry::NotPresent;
        }
        let addr = PhysAddr::new(raw & ADDR_MASK);
        if level > 0 {
            return Entry::Table(addr);
        }
        let mut prot = Prot::empty();
        prot.set(Prot::READ, raw & READ != 0);
        prot.set(Prot::WRITE, raw & WRITE != 0);
        prot.set(Prot::EXEC, raw & EXEC != 0);
        Entry::Leaf(Leaf {
            frame: addr,
            shift: 12,
            prot,
            dirty: true, // no dirty tracking: a store never walks again for it
            local: raw & APERTURE_LOCAL != 0,
            bits: 0,
        })
    }
    fn with_prot(&self, raw: u64, prot: Prot, _level: u32) -> Option<u64> {
        Some((raw & !(READ | WRITE | EXEC)) | prot_bits(prot))
    }
    fn split(&self, raw: u64, _level: u32, _i: u64) -> u64 {
        raw // no large leaves: never called
    }
    fn used(&self, raw: u64, _access: Prot) -> u64 {
        raw | ACCESSED
    }
    fn accessed_bit(&self, _level: u32) -> Option<u64> {
        Some(ACCESSED)
    }
    fn derived_levels(&self) -> u32 {
        if self.mesc {
            1 << 1
        } else {
            0
        }
    }
    fn derive(&self, entry: u64, level: u32, below: &[u64; 512]) -> u64 {
        if level == 1 && self.mesc {
            mesc::derive::<Self>(entry, below)
        } else {
            entry
        }
    }
}

/// The GPU format keeps MESC's bits in the ignored bits 52..=60 of its level-1 table
/// pointers; a present leaf has [`VALID`]; the walker sets only [`ACCESSED`].
impl MescFormat for GpuCodec {
    const LEAF_ADDR: u64 = ADDR_MASK;
    const LEAF_PRESENT: u64 = VALID;
    const WALKER_BITS: u64 = ACCESSED;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_carry_frame_permissions_and_aperture() {
        let c = GpuCodec::new(0);
        let raw = GpuCodec::encode_leaf(PhysAddr::new(0x40_0000_3000), Prot::RW, true).unwrap();
        assert_eq!(raw, 0x40_0000_3000 | VALID | APERTURE_LOCAL | READ | WRITE);
        assert_eq!(
            c.decode(raw, 0),
            Entry::Leaf(Leaf {
                frame: PhysAddr::new(0x40_0000_3000),
                shift: 12,
                prot: Prot::RW,
                dirty: true,
                local: true,
                bits: 0,
            })
        );
        let ro = c.with_prot(raw, Prot::READ, 0).unwrap();
        assert!(matches!(c.decode(ro, 0), Entry::Leaf(l) if l.prot == Prot::READ && l.local));
        let sys =
            GpuCodec::encode_leaf(PhysAddr::new(0x5000), Prot::READ | Prot::EXEC, false).unwrap();
        assert!(
            matches!(c.decode(sys, 0), Entry::Leaf(l) if !l.local && l.prot == Prot::READ | Prot::EXEC)
        );
    }

    #[test]
    fn upper_levels_are_tables_and_invalid_entries_are_absent() {
        let c = GpuCodec::new(0);
        let t = c.table(PhysAddr::new(0x7000)).unwrap();
        assert_eq!(c.decode(t, 2), Entry::Table(PhysAddr::new(0x7000)));
        assert_eq!(c.decode(t & !VALID, 1), Entry::NotPresent);
        assert_eq!(
            GpuCodec::encode_leaf(PhysAddr::new(0x1800), Prot::RW, false),
            None
        );
        assert_eq!(
            GpuCodec::encode_leaf(PhysAddr::new(1 << 52), Prot::RW, false),
            None
        );
    }

    #[test]
    fn the_format_covers_39_bits_and_is_unique_per_instance() {
        let (a, b) = (GpuCodec::new(1), GpuCodec::new(2));
        assert_ne!(a.format(), b.format());
        assert!(a.va_ok((1 << 39) - 0x1000, 0x1000));
        assert!(!a.va_ok((1 << 39) - 0x1000, 0x2000));
        assert!(!a.va_ok(u64::MAX - 0xfff, 0x1000));
    }
}
