//! The Intel VT-d second-level page-table format as a [`Codec`] of the shared engine.
//!
//! ```text
//!  63..52   51..12         11    10..8  7    6..2   1  0
//!  ignored  frame address  SNP*  -      PS   -      W  R        (*reserved, legacy mode)
//! ```
//! The x86-64 family's tree — 4 KiB tables of 512 entries, nine index bits a level — with
//! the IOMMU's own entry bits: an entry is present when `R` or `W` is set, `PS` at level 1
//! makes a 2 MiB superpage (where the unit's `CAP.SLLPS` says so), and there are no
//! accessed, dirty, user or no-execute bits. A table pointer carries `R | W` (the walk
//! intersects permissions, so the leaf decides). Three levels translate a 39-bit I/O
//! virtual address (`AGAW` 39, context-entry `AW` 1), four a 48-bit one (`AW` 2).
//!
//! Bit 11 (`SNP`) is reserved in legacy-mode translation: a unit that finds it set
//! reports a reserved-field fault instead of translating. The codec never writes it; a
//! walk that finds it is [`Entry::Reserved`].

use crate::pte::level_size;
use alloc::vec::Vec;
use gmem_core::{PageTableFormat, PhysAddr, Prot, VaRange, PAGE_SIZE};
use gmem_ptengine::{level_shift, Codec, Entry, Leaf, Run};

/// The format id of VT-d second-level tables (`"VT"`).
pub const VTD_FORMAT: PageTableFormat = PageTableFormat(0x5654);

/// Read permission.
pub const VTD_R: u64 = 1 << 0;
/// Write permission.
pub const VTD_W: u64 = 1 << 1;
/// Superpage (a leaf above level 0).
pub const VTD_PS: u64 = 1 << 7;
/// Snoop: reserved in legacy-mode second-level entries.
pub const VTD_SNP: u64 = 1 << 11;
/// Bits 12..51: the frame or table address.
pub const VTD_ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;

/// The VT-d second-level encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VtdCodec {
    levels: u32,
    superpages: bool,
}

impl VtdCodec {
    /// Tables of `levels` levels (3: 39-bit, 4: 48-bit I/O virtual addresses), with 2 MiB
    /// superpages when `superpages`. `None` for another depth.
    pub const fn new(levels: u32, superpages: bool) -> Option<VtdCodec> {
        if levels == 3 || levels == 4 {
            Some(VtdCodec { levels, superpages })
        } else {
            None
        }
    }

    /// The I/O virtual address width the tables translate.
    pub const fn address_bits(&self) -> u32 {
        12 + 9 * self.levels
    }

    /// The context entry's address-width field (`AW`) for these tables.
    pub const fn context_aw(&self) -> u64 {
        (self.levels - 2) as u64
    }

    fn rw(prot: Prot) -> u64 {
        let mut bits = 0;
        if prot.contains(Prot::READ) || prot.contains(Prot::EXEC) {
            bits |= VTD_R;
        }
        if prot.contains(Prot::WRITE) {
            bits |= VTD_W;
        }
        bits
    }

    fn prot(raw: u64) -> Prot {
        let mut p = Prot::empty();
        p.set(Prot::READ, raw & VTD_R != 0);
        p.set(Prot::WRITE, raw & VTD_W != 0);
        p
    }
}

impl Codec for VtdCodec {
    fn format(&self) -> PageTableFormat {
        VTD_FORMAT
    }
    fn levels(&self) -> u32 {
        self.levels
    }
    fn va_ok(&self, va: u64, len: u64) -> bool {
        len > 0
            && va
                .checked_add(len)
                .is_some_and(|end| end <= 1 << self.address_bits())
    }
    fn large_levels(&self) -> u32 {
        if self.superpages {
            1 << 1
        } else {
            0
        }
    }
    fn table(&self, table: PhysAddr) -> Option<u64> {
        (table.as_u64() & !VTD_ADDR_MASK == 0).then_some(table.as_u64() | VTD_R | VTD_W)
    }
    fn leaf(&self, frame: PhysAddr, level: u32, run: &Run) -> Option<u64> {
        let bits = Self::rw(run.prot);
        if frame.as_u64() & !VTD_ADDR_MASK != 0
            || frame.as_u64() % level_size(level) != 0
            || bits == 0
            || level > 1
        {
            return None;
        }
        let ps = if level > 0 { VTD_PS } else { 0 };
        Some(frame.as_u64() | bits | ps)
    }
    fn decode(&self, raw: u64, level: u32) -> Entry {
        if raw & (VTD_R | VTD_W) == 0 {
            return Entry::NotPresent;
        }
        if raw & VTD_SNP != 0 {
            return Entry::Reserved;
        }
        let large = raw & VTD_PS != 0;
        if level > 0 && !large {
            return Entry::Table(PhysAddr::new(raw & VTD_ADDR_MASK));
        }
        if level > 1 || (level == 1 && !self.superpages) {
            return Entry::Reserved;
        }
        let frame = raw & VTD_ADDR_MASK;
        if frame % level_size(level) != 0 {
            return Entry::Reserved;
        }
        Entry::Leaf(Leaf {
            frame: PhysAddr::new(frame),
            shift: level_shift(level),
            prot: Self::prot(raw),
            dirty: true,
            local: false,
            bits: 0,
        })
    }
    fn with_prot(&self, raw: u64, prot: Prot, _level: u32) -> Option<u64> {
        let bits = Self::rw(prot);
        (bits != 0).then_some((raw & !(VTD_R | VTD_W)) | bits)
    }
    fn split(&self, raw: u64, level: u32, i: u64) -> u64 {
        let base = raw & VTD_ADDR_MASK & !(level_size(level) - 1);
        let ps = if level > 1 { VTD_PS } else { 0 };
        (base + i * level_size(level - 1)) | (raw & (VTD_R | VTD_W)) | ps
    }
}

/// How many times its own size a span's single enclosing block may be.
pub const OVER_INVALIDATION: u64 = 4;

/// The blocks a page-selective IOTLB invalidation of `ranges` takes: the ranges sorted
/// and merged (a batch of unmaps of neighbouring IOVAs becomes one span); a span whose
/// smallest enclosing naturally aligned power-of-two block is at most
/// [`OVER_INVALIDATION`] times its size and at most `2^max_order` pages is that one block
/// (invalidating a few pages more is harmless: the unit only drops cached entries),
/// any other span is cut exactly into aligned power-of-two blocks of at most
/// `2^max_order` pages. Each block is `(address, order)`: one descriptor with address
/// `address` and address mask `order`. Stops after `limit + 1` blocks (the caller then
/// invalidates the whole domain).
pub fn invalidation_blocks(ranges: &[VaRange], max_order: u32, limit: usize) -> Vec<(u64, u32)> {
    let mut spans: Vec<(u64, u64)> = ranges
        .iter()
        .map(|r| {
            let first = r.start.as_u64() / PAGE_SIZE;
            (first, first + r.pages())
        })
        .filter(|&(a, b)| b > a)
        .collect();
    spans.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (a, b) in spans {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    let mut blocks = Vec::new();
    for (mut page, end) in merged {
        if blocks.len() > limit {
            break;
        }
        let order = 64 - (page ^ (end - 1)).leading_zeros();
        if order <= max_order
            && (1u128 << order) <= u128::from(OVER_INVALIDATION) * u128::from(end - page)
        {
            blocks.push(((page >> order << order) * PAGE_SIZE, order));
            continue;
        }
        while page < end && blocks.len() <= limit {
            let mut order = 0;
            while order < max_order.min(63)
                && page & ((1 << (order + 1)) - 1) == 0
                && page + (1 << (order + 1)) <= end
            {
                order += 1;
            }
            blocks.push((page * PAGE_SIZE, order));
            page += 1 << order;
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use gmem_core::VirtAddr;

    fn range(page: u64, pages: u64) -> VaRange {
        VaRange::new(VirtAddr::new(page * PAGE_SIZE), pages * PAGE_SIZE).unwrap()
    }

    #[test]
    fn neighbouring_ranges_merge_into_aligned_power_of_two_blocks() {
        // 64 single pages from page 64, given out of order: one 64-page block.
        let ranges: std::vec::Vec<_> = (64..128).rev().map(|p| range(p, 1)).collect();
        assert_eq!(invalidation_blocks(&ranges, 18, 16), [(64 * PAGE_SIZE, 6)]);
        // Pages 3..9: inside the 16-page block at 0 (under 4 times 6 pages): one block.
        assert_eq!(invalidation_blocks(&[range(3, 6)], 18, 16), [(0, 4)]);
        // Pages 7..9 straddle a 16-page boundary: the enclosing block (0..16) is more
        // than 4 times 2 pages, so the span is cut exactly.
        assert_eq!(
            invalidation_blocks(&[range(7, 2)], 18, 16),
            [(7 * PAGE_SIZE, 0), (8 * PAGE_SIZE, 0)]
        );
        // The unit's largest mask caps the order; overlapping ranges count once.
        assert_eq!(
            invalidation_blocks(&[range(0, 8), range(4, 4)], 1, 16),
            [
                (0, 1),
                (2 * PAGE_SIZE, 1),
                (4 * PAGE_SIZE, 1),
                (6 * PAGE_SIZE, 1)
            ]
        );
    }

    #[test]
    fn scattered_ranges_stop_one_past_the_limit() {
        let ranges: std::vec::Vec<_> = (0..40).map(|k| range(2 * k + 1, 1)).collect();
        assert_eq!(invalidation_blocks(&ranges, 18, 16).len(), 17);
        assert!(invalidation_blocks(&[], 18, 16).is_empty());
    }

    fn run(prot: Prot) -> Run {
        Run {
            va: 0,
            pa: 0,
            len: 4096,
            prot,
            memory: None,
            bits: 0,
        }
    }

    #[test]
    fn leaves_carry_read_write_and_superpage_bits_and_decode_back() {
        let c = VtdCodec::new(3, true).unwrap();
        let raw = c
            .leaf(PhysAddr::new(0x1234_5000), 0, &run(Prot::RW))
            .unwrap();
        assert_eq!(raw, 0x1234_5000 | VTD_R | VTD_W);
        let big = c
            .leaf(PhysAddr::new(0x4020_0000), 1, &run(Prot::WRITE))
            .unwrap();
        assert_eq!(big, 0x4020_0000 | VTD_W | VTD_PS);
        match c.decode(big, 1) {
            Entry::Leaf(l) => {
                assert_eq!(
                    (l.frame.as_u64(), l.shift, l.prot),
                    (0x4020_0000, 21, Prot::WRITE)
                )
            }
            other => panic!("{other:?}"),
        }
        // A misaligned superpage frame is not encodable.
        assert_eq!(c.leaf(PhysAddr::new(0x4020_1000), 1, &run(Prot::RW)), None);
    }

    #[test]
    fn reserved_snoop_bit_and_superpages_the_unit_lacks_are_reserved() {
        let c = VtdCodec::new(3, false).unwrap();
        assert_eq!(c.decode(0x5000 | VTD_R | VTD_SNP, 0), Entry::Reserved);
        assert_eq!(c.decode(0x20_0000 | VTD_R | VTD_PS, 1), Entry::Reserved);
        assert_eq!(c.decode(0x20_0000, 1), Entry::NotPresent);
        assert_eq!(c.large_levels(), 0);
        assert_eq!(
            c.decode(c.table(PhysAddr::new(0x7000)).unwrap(), 2),
            Entry::Table(PhysAddr::new(0x7000))
        );
    }

    #[test]
    fn address_width_follows_the_levels() {
        let c3 = VtdCodec::new(3, true).unwrap();
        let c4 = VtdCodec::new(4, true).unwrap();
        assert!(VtdCodec::new(5, true).is_none());
        assert_eq!((c3.address_bits(), c3.context_aw()), (39, 1));
        assert_eq!((c4.address_bits(), c4.context_aw()), (48, 2));
        assert!(c3.va_ok((1 << 39) - 4096, 4096));
        assert!(!c3.va_ok((1 << 39) - 4096, 8192));
    }

    #[test]
    fn split_keeps_permissions_and_covers_the_superpage() {
        let c = VtdCodec::new(3, true).unwrap();
        let big = 0x4020_0000 | VTD_R | VTD_PS;
        assert_eq!(c.split(big, 1, 0), 0x4020_0000 | VTD_R);
        assert_eq!(c.split(big, 1, 511), (0x4020_0000 + 511 * 4096) | VTD_R);
        assert_eq!(c.with_prot(big, Prot::RW, 1), Some(big | VTD_W));
        assert_eq!(c.with_prot(big, Prot::empty(), 1), None);
    }
}
