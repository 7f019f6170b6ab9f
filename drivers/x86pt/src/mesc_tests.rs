//! MESC on x86-64 tables in simulated memory: the stored bits equal a recomputation
//! after every edit (map, unmap, protect, remap of one page), Alg. 1's scan finds
//! nothing stale, and each walk mode gives the translation a plain walk gives, with
//! the coalesced range and the reads the paper's Fig. 6 describes.

use crate::mesc::{self, Contiguity, Mode, SubregionCache, SUBREGION_PAGES};
use crate::{X86Codec, X86Config};
use gmem_core::testing::TestSystem;
use gmem_core::{
    DeviceId, MapRun, PageSize, PageTableRoot, PhysAddr, Prot, VaRange, VirtAddr, PAGE_SIZE,
};
use gmem_sim::{RadixTables, SimMemory, TableFormat};
use std::collections::HashMap;
use std::sync::Arc;

type Tables = RadixTables<X86Codec>;

const POOL: u64 = 0x10_0000;
/// A 2 MiB-aligned virtual frame.
const VA: u64 = 0x4000_0000;

fn tables() -> Tables {
    let m = Arc::new(SimMemory::new("host", PhysAddr::new(0), 64 << 20).unwrap());
    let config = X86Config {
        mesc: true,
        granularity_bit: false,
        ..X86Config::default()
    };
    Tables::new(X86Codec { config }, m, PhysAddr::new(POOL), 256).unwrap()
}

fn dev() -> DeviceId {
    TestSystem::new(1).host().id
}

fn run(va: u64, pa: u64, pages: u64, prot: Prot, memory: DeviceId) -> MapRun {
    MapRun {
        va: VirtAddr::new(va),
        pa: PhysAddr::new(pa),
        len: pages * PAGE_SIZE,
        prot,
        page_size: PageSize::Size4K,
        memory,
        attrs: Default::default(),
    }
}

fn range(va: u64, pages: u64) -> VaRange {
    VaRange::new(VirtAddr::new(va), pages * PAGE_SIZE).unwrap()
}

/// The stored bits of `va`'s level-1 pointer, and what its leaves say they must be;
/// Alg. 1 finds nothing stale.
fn bits(t: &Tables, root: PageTableRoot) -> Contiguity {
    let report = mesc::scan(t.codec(), t.engine().memory(), root.0, false);
    assert_eq!(
        report.stale, 0,
        "stored bits differ from the leaves: {report:?}"
    );
    let w = walk_pointer(t, root);
    Contiguity::of(w)
}

/// The raw level-1 entry over `VA`.
fn walk_pointer(t: &Tables, root: PageTableRoot) -> u64 {
    let m = t.engine().memory();
    let mut table = root.0;
    for level in (1..4).rev() {
        let raw = gmem_ptengine::TableMemory::read(m, table + gmem_ptengine::index(VA, level) * 8)
            .unwrap();
        if level == 1 {
            return raw;
        }
        table = raw & crate::pte::ADDR_MASK;
    }
    unreachable!()
}

#[derive(Default)]
struct Msc(HashMap<u64, u8>);

impl SubregionCache for Msc {
    fn lookup(&mut self, frame_vpn: u64) -> Option<u8> {
        self.0.get(&frame_vpn).copied()
    }
    fn insert(&mut self, frame_vpn: u64, bitmap: u8) {
        self.0.insert(frame_vpn, bitmap);
    }
}

#[test]
fn bits_follow_every_edit_and_alg1_agrees() {
    let t = tables();
    let d = dev();
    let root = t.create().unwrap();
    let pa = 0x20_0000 + 0x7000; // physically unaligned: MESC does not need alignment
                                 // Subregions 0 and 1 contiguous, 2 half mapped.
    t.map(root, &run(VA, pa, 160, Prot::RW, d)).unwrap();
    assert_eq!(
        bits(&t, root),
        Contiguity {
            subregions: 0b11,
            frame: false
        }
    );
    // The rest of the frame, continuing the run: the whole frame is contiguous.
    t.map(
        root,
        &run(VA + 160 * PAGE_SIZE, pa + 160 * PAGE_SIZE, 352, Prot::RW, d),
    )
    .unwrap();
    assert_eq!(
        bits(&t, root),
        Contiguity {
            subregions: 0xff,
            frame: true
        }
    );
    // One page protected differently breaks its subregion and the frame.
    t.protect(root, range(VA + 70 * PAGE_SIZE, 1), Prot::READ)
        .unwrap();
    assert_eq!(
        bits(&t, root),
        Contiguity {
            subregions: 0xfd,
            frame: false
        }
    );
    t.protect(root, range(VA + 70 * PAGE_SIZE, 1), Prot::RW)
        .unwrap();
    assert_eq!(
        bits(&t, root),
        Contiguity {
            subregions: 0xff,
            frame: true
        }
    );
    // A page migrated elsewhere (unmap + map onto another frame).
    t.unmap(root, range(VA + 200 * PAGE_SIZE, 1));
    assert_eq!(
        bits(&t, root),
        Contiguity {
            subregions: 0xf7,
            frame: false
        }
    );
    t.map(root, &run(VA + 200 * PAGE_SIZE, 0x90_0000, 1, Prot::RW, d))
        .unwrap();
    assert_eq!(
        bits(&t, root),
        Contiguity {
            subregions: 0xf7,
            frame: false
        }
    );
    // Back on its frame: contiguous again.
    t.map(
        root,
        &run(VA + 200 * PAGE_SIZE, pa + 200 * PAGE_SIZE, 1, Prot::RW, d),
    )
    .unwrap();
    assert_eq!(
        bits(&t, root),
        Contiguity {
            subregions: 0xff,
            frame: true
        }
    );
    // Subregion 5 on a different run (contiguous inside, not with its neighbours).
    t.map(
        root,
        &run(VA + 320 * PAGE_SIZE, 0x100_0000, 64, Prot::RW, d),
    )
    .unwrap();
    assert_eq!(
        bits(&t, root),
        Contiguity {
            subregions: 0xff,
            frame: false
        }
    );
    let report = mesc::scan(t.codec(), t.engine().memory(), root.0, false);
    assert_eq!(
        (report.pointers, report.subregions, report.frames),
        (1, 8, 0)
    );
    assert_eq!(
        report.entries_read,
        3 * 512 + 512,
        "every entry of every table once"
    );
}

#[test]
fn each_walk_mode_translates_as_a_plain_walk_and_coalesces_what_it_may() {
    let t = tables();
    let d = dev();
    let root = t.create().unwrap();
    let pa = 0x40_0000 + 0x3000;
    let (codec, memory) = (t.codec(), t.engine().memory());
    let check = |w: &mesc::MescWalk, va: u64| {
        let plain = t.lookup(root, VirtAddr::new(va)).unwrap();
        assert_eq!(
            w.leaf.unwrap().translate(VirtAddr::new(va)),
            plain.translate(VirtAddr::new(va))
        );
        assert_eq!(w.leaf.unwrap().prot, plain.prot);
        if let Some(c) = w.coalesced {
            for k in [0, c.pages / 2, c.pages - 1] {
                let v = (c.vpn + k) << 12;
                assert_eq!(
                    t.lookup(root, VirtAddr::new(v)).unwrap().frame.as_u64() >> 12,
                    c.pfn + k
                );
            }
        }
    };
    // (a) the whole frame.
    t.map(root, &run(VA, pa, 512, Prot::RW, d)).unwrap();
    let va = VA + 300 * PAGE_SIZE + 5;
    let w = mesc::walk(codec, memory, root.0, va, None);
    assert_eq!(w.mode, Mode::Frame);
    assert_eq!(w.reads, 4, "three levels and the head leaf");
    assert_eq!(w.coalesced.unwrap().pages, 512);
    check(&w, va);
    // (b) and (c): break subregion 3 and move subregions 6-7 to another run.
    t.unmap(root, range(VA + (3 * 64 + 9) * PAGE_SIZE, 1));
    t.map(
        root,
        &run(VA + 6 * 64 * PAGE_SIZE, 0x200_0000, 128, Prot::RW, d),
    )
    .unwrap();
    let va = VA + 3 * 64 * PAGE_SIZE + 20 * PAGE_SIZE;
    let w = mesc::walk(codec, memory, root.0, va, None);
    assert_eq!((w.mode, w.coalesced), (Mode::Normal, None));
    check(&w, va);
    let mut msc = Msc::default();
    let va = VA + 64 * PAGE_SIZE + 7 * PAGE_SIZE;
    let w = mesc::walk(codec, memory, root.0, va, Some(&mut msc));
    assert_eq!(w.mode, Mode::Subregion);
    assert_eq!(w.msc_hit, Some(false));
    assert_eq!(w.reads, 4, "the subregion's head gives the translation");
    assert_eq!(
        w.extra_reads, 6,
        "the heads of the other contiguous subregions"
    );
    let c = w.coalesced.unwrap();
    assert_eq!(
        (c.vpn, c.pages),
        (VA >> 12, 3 * SUBREGION_PAGES),
        "subregions 0-2"
    );
    check(&w, va);
    // The cache knows the frame now: no extra reads, the same coalescing.
    let va = VA + 4 * 64 * PAGE_SIZE;
    let w = mesc::walk(codec, memory, root.0, va, Some(&mut msc));
    assert_eq!((w.msc_hit, w.extra_reads), (Some(true), 0));
    let c = w.coalesced.unwrap();
    assert_eq!(
        (c.vpn, c.pages),
        ((VA >> 12) + 4 * 64, 2 * SUBREGION_PAGES),
        "subregions 4-5; 6-7 continue another run"
    );
    check(&w, va);
    let va = VA + 7 * 64 * PAGE_SIZE;
    let w = mesc::walk(codec, memory, root.0, va, Some(&mut msc));
    let c = w.coalesced.unwrap();
    assert_eq!((c.vpn, c.pages), ((VA >> 12) + 6 * 64, 2 * SUBREGION_PAGES));
    check(&w, va);
}

#[test]
fn colt_coalesces_an_aligned_group_inside_the_fetched_line_only() {
    let t = tables();
    let d = dev();
    let root = t.create().unwrap();
    t.map(root, &run(VA, 0x30_0000, 6, Prot::RW, d)).unwrap();
    t.map(root, &run(VA + 6 * PAGE_SIZE, 0x50_0000, 10, Prot::RW, d))
        .unwrap();
    let m = t.engine().memory();
    let leaves = walk_pointer(&t, root) & crate::pte::ADDR_MASK;
    let mut line = [0u64; 16];
    for (k, e) in line.iter_mut().enumerate() {
        *e = gmem_ptengine::TableMemory::read(m, leaves + k as u64 * 8).unwrap();
    }
    assert_eq!(mesc::colt::<X86Codec>(&line, 2, 4), (0, 4));
    assert_eq!(
        mesc::colt::<X86Codec>(&line, 5, 4),
        (5, 1),
        "pages 4-7 span two runs"
    );
    assert_eq!(mesc::colt::<X86Codec>(&line, 9, 4), (8, 4));
    assert_eq!(mesc::colt::<X86Codec>(&line, 15, 4), (12, 4));
}
