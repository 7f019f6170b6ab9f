//! MESC's contiguity bits (Li et al., "MESC: memory-subregion contiguity for GPU
//! address translation", §IV), for any format whose level-1 table pointers have spare
//! bits ([`MescFormat`]: x86-64 and the discrete GPU's format): the bits as the
//! engine's derived bits ([`derive()`]), Alg. 1's scan ([`scan`]), the three walk modes
//! of Fig. 6 ([`walk`]) and CoLT's coalescing ([`colt`]).
//!
//! ## The bits (§IV-A, Fig. 5)
//! Every 2 MiB of virtual space (one level-1 entry, the paper's L2PTE, pointing to a
//! table of 512 4 KiB leaves) is eight *subregions* of 64 pages. A subregion is
//! contiguous when its 64 entries are present 4 KiB leaves mapping consecutive frames
//! with identical permissions and attributes (the walker's own bits aside); the frame
//! is contiguous when all 512 are, as one run. The table pointer keeps one bit per
//! subregion and one for the frame in its spare bits (52..=59 and 60, ignored by the
//! walker in entries that point to tables, in both formats). The physical run need not
//! be aligned: only virtual subregions are.
//!
//! ## Upkeep (§IV-D)
//! The bits are derived bits of the engine ([`Codec::derive`], which a format
//! implements with [`derive()`]): every edit that changes leaves recomputes their table
//! pointer's bits in the same edit, before the edit returns (so before the core
//! invalidates anything), clearing a bit as soon as one entry breaks the run and
//! setting it only when all 64 (or 512) entries are present and consecutive. [`scan`]
//! is Alg. 1, the OS's full pass over a tree: it reads every entry, recomputes every
//! table pointer's bits, counts what it read and reports (and with `repair` rewrites)
//! every pointer whose stored bits differ — with the upkeep above there are none.
//!
//! ## Walks (§IV-B, Fig. 6)
//! [`walk`] walks to the level-1 entry as usual, then:
//! - frame bit set (a): read the frame's head leaf (entry 0); the translation is that
//!   frame number plus the page's offset in the 2 MiB; the coalesced translation covers
//!   all 512 pages;
//! - subregion bit clear (b): read the page's own leaf, a normal walk;
//! - subregion bit set (c): read the subregion's head leaf (the translation is done:
//!   head plus offset), then coalesce neighbouring contiguous subregions whose heads
//!   continue the run — from the memory-subregion cache ([`SubregionCache`], §IV-B
//!   Fig. 7) when it knows the frame, else by reading the head leaf of every other
//!   contiguous subregion of the frame (each read counted) and filling the cache.
//!
//! [`colt`] is the CoLT baseline's coalescing (§V-A): within the 128-byte line of 16
//! leaves the walk fetched anyway, the aligned group of up to 4 pages around the
//! requested one when they are consecutive — never a read past that line.
//!
//! What the paper's text leaves open and is rebuilt here: the spare-bit positions (the
//! paper says "unused bits"), the attribute comparison (permissions and caching bits,
//! not accessed/dirty), the MSC bitmap's meaning (bit `i`: subregions `i` and `i + 1`
//! are both contiguous and `head(i + 1) = head(i) + 64`, with permissions equal) and
//! that a coalesced range never crosses its 2 MiB frame.

use crate::{index, Codec, Entry, Leaf, TableMemory, ENTRIES};

/// Pages of a subregion.
pub const SUBREGION_PAGES: u64 = 64;
/// Subregions of a 2 MiB frame.
pub const SUBREGIONS: u64 = ENTRIES / SUBREGION_PAGES;
/// Where the subregion bits sit in a level-1 table pointer (bits 52..=59).
pub const SUBREGION_SHIFT: u32 = 52;
/// The frame-contiguous bit of a level-1 table pointer (bit 60).
pub const FRAME_BIT: u64 = 1 << 60;
/// Every MESC bit of a table pointer.
pub const MESC_MASK: u64 = (0xff << SUBREGION_SHIFT) | FRAME_BIT;

/// A format MESC can keep its bits in: bits 52..=60 of its level-1 table pointers are
/// spare (ignored by its walker), and its 4 KiB leaves say where their frame is, whether
/// they are present, and which bits the walker itself sets.
pub trait MescFormat: Codec {
    /// The bits of a 4 KiB leaf holding the frame address.
    const LEAF_ADDR: u64;
    /// The bit that makes a level-0 entry a present leaf.
    const LEAF_PRESENT: u64;
    /// The bits the walker sets in a leaf it uses (accessed, dirty): not compared along
    /// a run.
    const WALKER_BITS: u64;
}

/// The bits of a leaf that must be equal along a contiguous run: everything but the
/// frame address and the walker's own bits.
const fn same_mask<C: MescFormat + ?Sized>() -> u64 {
    !(C::LEAF_ADDR | C::WALKER_BITS)
}

/// `entry` (a level-1 table pointer of a format with MESC bits) with the bits its 512
/// leaves `below` give: what a [`MescFormat`]'s [`Codec::derive`] returns at level 1.
pub fn derive<C: MescFormat + ?Sized>(entry: u64, below: &[u64; ENTRIES as usize]) -> u64 {
    Contiguity::compute::<C>(below).store(entry)
}

/// The contiguity bits of one 2 MiB frame, as a table pointer stores them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Contiguity {
    /// Bit `i`: subregion `i` is contiguous.
    pub subregions: u8,
    /// All 512 pages are one contiguous run.
    pub frame: bool,
}

impl Contiguity {
    /// The bits stored in table pointer `entry`.
    pub fn of(entry: u64) -> Contiguity {
        Contiguity {
            subregions: (entry >> SUBREGION_SHIFT) as u8,
            frame: entry & FRAME_BIT != 0,
        }
    }

    /// `entry` with these bits.
    pub fn store(self, entry: u64) -> u64 {
        let mut e = entry & !MESC_MASK;
        e |= u64::from(self.subregions) << SUBREGION_SHIFT;
        if self.frame {
            e |= FRAME_BIT;
        }
        e
    }

    /// Recompute from the 512 leaves of a level-0 table (Fig. 5's rule).
    pub fn compute<C: MescFormat + ?Sized>(below: &[u64; ENTRIES as usize]) -> Contiguity {
        let mut subregions = 0u8;
        for s in 0..SUBREGIONS as usize {
            let base = s * SUBREGION_PAGES as usize;
            if (1..SUBREGION_PAGES as usize)
                .all(|k| follows::<C>(below[base + k - 1], below[base + k]))
                && present_4k::<C>(below[base])
            {
                subregions |= 1 << s;
            }
        }
        let frame = subregions == 0xff
            && (1..SUBREGIONS as usize).all(|s| {
                let at = s * SUBREGION_PAGES as usize;
                follows::<C>(below[at - 1], below[at])
            });
        Contiguity { subregions, frame }
    }
}

/// A present 4 KiB leaf.
fn present_4k<C: MescFormat + ?Sized>(raw: u64) -> bool {
    raw & C::LEAF_PRESENT != 0
}

/// Whether leaf `next` continues leaf `prev`: both present, the next frame, the same
/// permissions and attributes.
fn follows<C: MescFormat + ?Sized>(prev: u64, next: u64) -> bool {
    let same = same_mask::<C>();
    present_4k::<C>(prev)
        && present_4k::<C>(next)
        && (prev & same) == (next & same)
        && (next & C::LEAF_ADDR) == (prev & C::LEAF_ADDR) + 4096
}

/// The memory-subregion cache (MSC) a walker may keep: per 2 MiB virtual frame, the
/// 7-bit map of which neighbouring subregions continue each other.
pub trait SubregionCache {
    /// The bitmap cached for the frame starting at virtual page `frame_vpn`.
    fn lookup(&mut self, frame_vpn: u64) -> Option<u8>;
    /// Remember `bitmap` for the frame.
    fn insert(&mut self, frame_vpn: u64, bitmap: u8);
}

/// A translation covering several pages: `pages` pages from `vpn` onto frames from
/// `pfn`, with the permissions of `leaf`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coalesced {
    /// First virtual page.
    pub vpn: u64,
    /// Its frame.
    pub pfn: u64,
    /// Pages covered.
    pub pages: u64,
}

/// How a MESC walk went (Fig. 6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// No translation (a level not present).
    #[default]
    Fault,
    /// A large leaf above level 0 (THP): no MESC involved.
    Large,
    /// (a) the frame bit: one read of the head leaf covers 512 pages.
    Frame,
    /// (b) a discontiguous subregion: the page's own leaf.
    Normal,
    /// (c) a contiguous subregion: its head leaf, then neighbours coalesced.
    Subregion,
}

/// What [`walk`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MescWalk {
    /// The translation of the requested page (a 4 KiB leaf, or the large leaf).
    pub leaf: Option<Leaf>,
    /// The coalesced translation the walk produced (frame or subregions).
    pub coalesced: Option<Coalesced>,
    /// Which mode served it.
    pub mode: Mode,
    /// Entries read to give the translation (up to and including the leaf).
    pub reads: u32,
    /// Further head leaves read to coalesce neighbouring subregions (after the
    /// translation went back, §IV-B).
    pub extra_reads: u32,
    /// `Some(hit)` when the subregion cache was consulted.
    pub msc_hit: Option<bool>,
}

/// Walk `va` in the tree of `root` (a format with MESC bits) the way MESC's walker does.
pub fn walk<C: MescFormat, M: TableMemory + ?Sized>(
    codec: &C,
    memory: &M,
    root: u64,
    va: u64,
    mut cache: Option<&mut dyn SubregionCache>,
) -> MescWalk {
    let mut w = MescWalk::default();
    let mut table = root;
    let mut level = codec.levels() - 1;
    let l1 = loop {
        let epa = table + index(va, level) * 8;
        let Some(raw) = memory.read(epa) else {
            return w;
        };
        w.reads += 1;
        match codec.decode(raw, level) {
            Entry::Table(t) if level == 1 => break (raw, t.as_u64()),
            Entry::Table(t) if level > 1 => {
                table = t.as_u64();
                level -= 1;
            }
            Entry::Leaf(leaf) => {
                w.leaf = Some(leaf);
                w.mode = Mode::Large;
                return w;
            }
            _ => return w,
        }
    };
    let (pointer, leaves) = l1;
    let bits = Contiguity::of(pointer);
    let vpn = va >> 12;
    let frame_vpn = vpn & !(ENTRIES - 1);
    let page = vpn - frame_vpn;
    let s = page / SUBREGION_PAGES;
    let read_leaf = |w: &mut MescWalk, i: u64| -> Option<(u64, Leaf)> {
        let raw = memory.read(leaves + i * 8)?;
        w.reads += 1;
        match codec.decode(raw, 0) {
            Entry::Leaf(l) => Some((raw, l)),
            _ => None,
        }
    };
    if bits.frame {
        // (a) The head leaf gives the whole frame.
        let Some((_, head)) = read_leaf(&mut w, 0) else {
            return w;
        };
        w.mode = Mode::Frame;
        w.leaf = Some(shifted(head, page));
        w.coalesced = Some(Coalesced {
            vpn: frame_vpn,
            pfn: head.frame.as_u64() >> 12,
            pages: ENTRIES,
        });
        return w;
    }
    if bits.subregions & (1 << s) == 0 {
        // (b) A normal walk.
        let Some((_, leaf)) = read_leaf(&mut w, page) else {
            return w;
        };
        w.mode = Mode::Normal;
        w.leaf = Some(leaf);
        return w;
    }
    // (c) The subregion's head gives the translation.
    let Some((head_raw, head)) = read_leaf(&mut w, s * SUBREGION_PAGES) else {
        return w;
    };
    w.mode = Mode::Subregion;
    w.leaf = Some(shifted(head, page - s * SUBREGION_PAGES));
    // Then neighbouring subregions that continue it.
    let bitmap = match cache.as_deref_mut().and_then(|c| c.lookup(frame_vpn)) {
        Some(b) => {
            w.msc_hit = Some(true);
            b
        }
        None => {
            let mut heads = [None::<u64>; SUBREGIONS as usize];
            heads[s as usize] = Some(head_raw);
            for j in 0..SUBREGIONS {
                if j == s || bits.subregions & (1 << j) == 0 {
                    continue;
                }
                if let Some(raw) = memory.read(leaves + j * SUBREGION_PAGES * 8) {
                    w.extra_reads += 1;
                    heads[j as usize] = Some(raw);
                }
            }
            let mut b = 0u8;
            for j in 0..SUBREGIONS as usize - 1 {
                if let (Some(a), Some(c)) = (heads[j], heads[j + 1]) {
                    let same = same_mask::<C>();
                    if (a & same) == (c & same)
                        && (c & C::LEAF_ADDR) == (a & C::LEAF_ADDR) + SUBREGION_PAGES * 4096
                    {
                        b |= 1 << j;
                    }
                }
            }
            if let Some(c) = cache {
                w.msc_hit = Some(false);
                c.insert(frame_vpn, b);
            }
            b
        }
    };
    let (mut lo, mut hi) = (s, s);
    while lo > 0 && bitmap & (1 << (lo - 1)) != 0 {
        lo -= 1;
    }
    while hi + 1 < SUBREGIONS && bitmap & (1 << hi) != 0 {
        hi += 1;
    }
    let head_pfn = head.frame.as_u64() >> 12;
    w.coalesced = Some(Coalesced {
        vpn: frame_vpn + lo * SUBREGION_PAGES,
        pfn: head_pfn - (s - lo) * SUBREGION_PAGES,
        pages: (hi - lo + 1) * SUBREGION_PAGES,
    });
    w
}

/// The leaf of page `k` of a run whose first leaf is `head`.
fn shifted(head: Leaf, k: u64) -> Leaf {
    Leaf {
        frame: gmem_core::PhysAddr::new(head.frame.as_u64() + k * 4096),
        ..head
    }
}

/// CoLT's coalescing (§V-A): the leaves of the 128-byte line (16 entries) holding
/// `index`'s leaf, read by the walk anyway; the aligned group of `group` pages (at most
/// 4 in the paper's CoLT) around `index` when all of them continue each other. Returns
/// `(first index, pages)`, one page when the group is not contiguous.
pub fn colt<C: MescFormat + ?Sized>(
    line: &[u64; 16],
    index: usize,
    group: usize,
) -> (usize, usize) {
    let group = group.clamp(1, 16);
    let first = index & !(group - 1);
    let ok = (first + 1..first + group).all(|k| k < 16 && follows::<C>(line[k - 1], line[k]));
    if group > 1 && ok {
        (first, group)
    } else {
        (index, 1)
    }
}

/// What [`scan`] (Alg. 1) found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Entries read (every entry of every table).
    pub entries_read: u64,
    /// Level-1 table pointers examined.
    pub pointers: u64,
    /// Contiguous subregions found.
    pub subregions: u64,
    /// Contiguous 2 MiB frames found.
    pub frames: u64,
    /// Pointers whose stored bits differed from the recomputation (rewritten with
    /// `repair`).
    pub stale: u64,
}

/// Alg. 1: scan the whole tree of `root`, recompute the MESC bits of every level-1
/// table pointer from its leaves, count what was read, and report (with `repair`:
/// rewrite) the pointers whose stored bits were stale.
pub fn scan<C: MescFormat, M: TableMemory + ?Sized>(
    codec: &C,
    memory: &M,
    root: u64,
    repair: bool,
) -> ScanReport {
    let mut r = ScanReport::default();
    scan_table(codec, memory, root, codec.levels() - 1, repair, &mut r);
    r
}

fn scan_table<C: MescFormat, M: TableMemory + ?Sized>(
    codec: &C,
    memory: &M,
    table: u64,
    level: u32,
    repair: bool,
    r: &mut ScanReport,
) {
    for i in 0..ENTRIES {
        let epa = table + i * 8;
        let Some(raw) = memory.read(epa) else {
            continue;
        };
        r.entries_read += 1;
        let Entry::Table(t) = codec.decode(raw, level) else {
            continue;
        };
        if level > 1 {
            scan_table(codec, memory, t.as_u64(), level - 1, repair, r);
            continue;
        }
        let mut below = [0u64; ENTRIES as usize];
        for (k, e) in below.iter_mut().enumerate() {
            *e = memory.read(t.as_u64() + k as u64 * 8).unwrap_or(0);
            r.entries_read += 1;
        }
        let want = Contiguity::compute::<C>(&below);
        r.pointers += 1;
        r.subregions += u64::from(want.subregions.count_ones());
        r.frames += u64::from(want.frame);
        if Contiguity::of(raw) != want {
            r.stale += 1;
            if repair {
                memory.write(epa, want.store(raw));
            }
        }
    }
}
